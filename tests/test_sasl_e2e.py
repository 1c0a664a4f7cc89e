"""SASL end to end through the proxy, against Apache Kafka's own
SASL_PLAINTEXT listener (`secure_kafka.SecureKafka`): PLAIN users from the
listener's JAAS line, SCRAM-SHA-256/512 users made and rotated through the
Admin API (AlterUserScramCredentials). This replaced a SASL-terminating
relay in front of tansu, which cannot authenticate (Kafka checks the
credentials now, and the SCRAM exchange is Kafka's own).

Clients authenticate through the proxy (SASL passthrough, their own
identity at the broker), and the proxy's own connections (metadata, the
dead-letter producer and ledger) authenticate with `upstream.sasl`: the
proxy knows only the SASL listener, so every diversion it writes shows that
it authenticated. With a dead-letter cluster of its own (a second broker
with other users), the DLT producer and ledger authenticate there with
`dead_letter.sasl`, and wrong DLT credentials hold rather than lose.
Refused authentications are read from the brokers' own logs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import confluent_kafka as ck
import pytest

import clients as c
import harness as h
import poison_support as ps
from secure_kafka import SecureKafka

USERS = {"alice": "alice-secret", "antidote": "proxy-secret"}


def sasl_kafka(workdir, users: dict, **kw) -> SecureKafka:
    """A broker whose client listener is SASL_PLAINTEXT; `users` may log in
    with PLAIN and (made through the Admin API) both SCRAM mechanisms."""
    b = SecureKafka(workdir, plain_users=users, **kw).start()
    for u, pw in users.items():
        b.set_scram(u, pw)
    return b


@dataclass
class SaslProxy(ps.PolicyProxy):
    sasl: dict | None = None
    admin_port: int = 0                                  # 0: no admin listener

    def config_yaml(self) -> str:
        text = super().config_yaml()
        lines = "".join(f"    {k}: {v}\n" for k, v in self.sasl.items())
        text = text.replace("\npolicies:", "\n  sasl:\n" + lines + "policies:", 1)
        if self.admin_port:
            text += f"admin:\n  listen: {h.HOST}:{self.admin_port}\n"
        return text


@pytest.fixture(scope="module")
def front(workdir):
    """The upstream cluster: users alice (clients) and antidote (the proxy)."""
    b = sasl_kafka(workdir, USERS)
    yield b
    b.stop()


def ck_sasl(ep: c.Endpoint, mech: str, user: str, pw: str) -> dict:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mech,
            "sasl.username": user, "sasl.password": pw}


def kp_sasl(mech: str, user: str, pw: str) -> dict:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mech,
            "sasl_plain_username": user, "sasl_plain_password": pw}


def create_topic(ep: c.Endpoint, topic: str, conf: dict) -> None:
    import time

    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient(ep.ck(**conf))
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    deadline = time.monotonic() + 30
    while topic not in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{topic} not visible"
        time.sleep(0.2)


@pytest.mark.parametrize("mech", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_clients_and_the_proxy_authenticate_through_it_and_poison_is_diverted(
        mech, front, workdir, tmp_path):
    direct = c.Endpoint(front.secure_bootstrap)
    admin_conf = ck_sasl(direct, mech, "alice", USERS["alice"])
    topic = ps.unique_topic(ps.JSON_PREFIX, "sasl")
    create_topic(direct, topic, admin_conf)
    recs = [ps.json_rec(k, i) for i, k in enumerate(["valid", "lat", "valid"])]
    c.ck_produce(direct, topic, recs, **admin_conf)
    pfile = ps.write_policies(tmp_path / "policies")
    refused_before = len(front.failed_authentications())
    proxy = SaslProxy(workdir, upstream=[front.secure_bootstrap], policies=[pfile],
                      name=f"antidote-sasl-{mech}",
                      sasl={"mechanism": mech, "username": "antidote",
                            "password": USERS["antidote"]})
    import conftest
    conftest._PROXIES.append(proxy)
    proxy.start()
    try:
        via = c.Endpoint(proxy.bootstrap, "proxy")
        got = c.ck_consume_assign(via, topic, [0], 2, timeout=30,
                                  **ck_sasl(via, mech, "alice", USERS["alice"]))
        assert got == [recs[0], recs[2]]
        got = c.kp_consume_assign(via, topic, [0], 2, timeout=30,
                                  **kp_sasl(mech, "alice", USERS["alice"]))
        assert got == [recs[0], recs[2]]
        # The DLT was written and read by the proxy's own producer, which
        # knows only the SASL listener: it authenticated as `antidote`.
        dlt = ps.read_dlt_records(direct, f"{topic}.dlt", 1, **admin_conf)
        assert [d.key for d in dlt] == [recs[1].key]
        assert len(front.failed_authentications()) == refused_before, \
            front.failed_authentications()[refused_before:]
        # A wrong password through the proxy is refused by the broker.
        bad = ck.Consumer(via.ck(**{"group.id": f"bad-{uuid.uuid4().hex[:6]}",
                                    **ck_sasl(via, mech, "alice", "wrong")}))
        try:
            with pytest.raises(ck.KafkaException):
                bad.list_topics(timeout=8)
            refused = front.failed_authentications()[refused_before:]
            # Kafka names the mechanism of a refused SCRAM exchange; a
            # refused PLAIN login is "Invalid username or password".
            said = "Invalid username or password" if mech == "PLAIN" else f"mechanism {mech}"
            assert any(said in line for line in refused), refused
        finally:
            bad.close()
        proxy.stop_and_check()
    finally:
        if proxy.proc is not None and proxy.proc.poll() is None:
            h.stop_process(proxy.proc)


# ---------------------------------------------------------------------------
# dead_letter.sasl: the DLT cluster (a second broker, with its own users)
# authenticates the proxy with credentials of its own.
# ---------------------------------------------------------------------------

DLT_USERS = {"dlt-writer": "dlt-secret"}
DLT_PASSWORD_ENV = "ANTIDOTE_TEST_DLT_PASSWORD"


@pytest.fixture
def dlt_front(workdir):
    """The DLT cluster: only dlt-writer. Authenticated connections must log
    in again every 2 s (KIP-368), so a rotated password takes effect on the
    proxy's open connections too."""
    b = sasl_kafka(workdir, DLT_USERS,
                   extra_properties={"connections.max.reauth.ms": 2000})
    yield b
    b.stop()


def _dlt_proxy(workdir, front, dlt_front, pfile, name, dlt_mech, admin_port=0):
    """A policy proxy: upstream.sasl PLAIN as `antidote` on `front`,
    dead_letter.sasl `dlt_mech` as `dlt-writer` on `dlt_front`, with the
    password from the environment."""
    import conftest
    dl_sasl = (f"{{ mechanism: {dlt_mech}, username: dlt-writer, "
               f"password_env: {DLT_PASSWORD_ENV} }}")
    proxy = SaslProxy(workdir, upstream=[front.secure_bootstrap], policies=[pfile], name=name,
                      sasl={"mechanism": "PLAIN", "username": "antidote",
                            "password": USERS["antidote"]},
                      dead_letter={"bootstrap_servers": [dlt_front.secure_bootstrap],
                                   "sasl": dl_sasl, "timeout": "2s", "compression": "none"},
                      admin_port=admin_port)
    conftest._PROXIES.append(proxy)
    return proxy.start()


def _poison_topic(front) -> tuple[str, list]:
    """A policy topic on the upstream cluster: valid, poison, valid."""
    direct = c.Endpoint(front.secure_bootstrap)
    conf = ck_sasl(direct, "PLAIN", "alice", USERS["alice"])
    topic = ps.unique_topic(ps.JSON_PREFIX, "dlsasl")
    create_topic(direct, topic, conf)
    recs = [ps.json_rec(k, i) for i, k in enumerate(["valid", "lat", "valid"])]
    c.ck_produce(direct, topic, recs, **conf)
    return topic, recs


def _dlt_keys(dlt_front, dlt: str) -> list:
    """Keys of the records in `dlt`, read from the DLT cluster's plaintext
    listener (the test's own), every record counted; [] while the DLT does
    not exist or is empty."""
    cons = ck.Consumer({"bootstrap.servers": dlt_front.plaintext, "log_level": 0,
                        "group.id": f"k-{uuid.uuid4().hex[:6]}"})
    try:
        md = cons.list_topics(dlt, timeout=10).topics.get(dlt)
        if md is None or md.error is not None:
            return []
        lo, hi = cons.get_watermark_offsets(ck.TopicPartition(dlt, 0), timeout=10)
    finally:
        cons.close()
    if hi <= lo:
        return []
    got = c.ck_consume_assign(c.Endpoint(dlt_front.plaintext), dlt, [0], 10**9, timeout=5,
                              until=lambda g: bool(g) and g[-1].offset >= hi - 1)
    return [r.key for r in ps.without_markers(got)]


def test_dead_letter_sasl_authenticates_the_dlt_cluster_with_its_own_credentials(
        front, dlt_front, workdir, tmp_path, monkeypatch):
    topic, recs = _poison_topic(front)
    monkeypatch.setenv(DLT_PASSWORD_ENV, DLT_USERS["dlt-writer"])
    pfile = ps.write_policies(tmp_path / "policies")
    refused = (len(front.failed_authentications()), len(dlt_front.failed_authentications()))
    proxy = _dlt_proxy(workdir, front, dlt_front, pfile, "antidote-dlt-sasl", "SCRAM-SHA-512")
    try:
        via = c.Endpoint(proxy.bootstrap, "proxy")
        got = c.ck_consume_assign(via, topic, [0], 2, timeout=30,
                                  **ck_sasl(via, "PLAIN", "alice", USERS["alice"]))
        assert got == [recs[0], recs[2]]
        # The poison is in the DLT on the other cluster, once; a reader with
        # the DLT cluster's credentials gets it through its SASL listener.
        dl = c.Endpoint(dlt_front.secure_bootstrap)
        read = ps.read_dlt_records(dl, f"{topic}.dlt", 1,
                                   **ck_sasl(dl, "PLAIN", "dlt-writer", DLT_USERS["dlt-writer"]))
        assert [r.key for r in read] == [recs[1].key]
        assert _dlt_keys(dlt_front, f"{topic}.dlt") == [recs[1].key]
        # Each cluster knows only its own users: the proxy logged in to each
        # with that cluster's credentials, and was never refused.
        assert front.failed_authentications()[refused[0]:] == []
        assert dlt_front.failed_authentications()[refused[1]:] == []
        proxy.stop_and_check()
    finally:
        if proxy.proc is not None and proxy.proc.poll() is None:
            h.stop_process(proxy.proc)


def _readyz(port: int) -> int:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://{h.HOST}:{port}/readyz", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _poll(consumer, seconds: float, until=None) -> list:
    """Offsets the consumer reads in `seconds` (or until `until(offsets)`)."""
    import time
    got, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline and not (until and until(got)):
        m = consumer.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == ck.KafkaError._PARTITION_EOF:
                continue
            raise AssertionError(f"consumer error: {m.error()}")
        got.append(m.offset())
    return got


def _wait(cond, seconds: float, what: str) -> None:
    import time
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_wrong_dead_letter_credentials_hold_the_partition_and_lose_nothing(
        front, dlt_front, workdir, tmp_path, monkeypatch):
    """The DLT cluster refuses the proxy's DLT password. At start the ledger
    cannot be read: the policy topic is withheld and /readyz answers 503.
    Once the password is right the ledger loads (200). The DLT cluster then
    refuses it again before the poison is written: the partition is held at
    the poison (the record before it delivered, nothing after), the DLT is
    empty. Fixed again, the poison reaches the DLT once and the consumer goes
    on past it."""
    topic, recs = _poison_topic(front)
    monkeypatch.setenv(DLT_PASSWORD_ENV, DLT_USERS["dlt-writer"])
    right, wrong = DLT_USERS["dlt-writer"], "rotated-elsewhere"

    def rotate(password: str) -> None:   # the operator's AlterUserScramCredentials
        dlt_front.set_scram("dlt-writer", password, mechanisms=("SCRAM-SHA-256",))

    rotate(wrong)
    pfile = ps.write_policies(tmp_path / "policies")
    admin = h.free_port()
    proxy = _dlt_proxy(workdir, front, dlt_front, pfile, "antidote-dlt-sasl-wrong",
                       "SCRAM-SHA-256", admin_port=admin)
    dlt = f"{topic}.dlt"
    via = c.Endpoint(proxy.bootstrap, "proxy")
    conf = ck_sasl(via, "PLAIN", "alice", USERS["alice"])

    def consumer():
        cons = ck.Consumer(via.ck(**{"group.id": f"g-{uuid.uuid4().hex[:6]}",
                                     "enable.auto.commit": False, **conf}))
        cons.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        return cons

    try:
        # 1. The ledger cannot be read: nothing of the topic, not ready.
        cons = consumer()
        try:
            assert _poll(cons, 6) == []
        finally:
            cons.close()
        assert any("SCRAM-SHA-256" in x for x in dlt_front.failed_authentications())
        assert _readyz(admin) == 503
        # 2. The password is right: the ledger loads.
        rotate(right)
        _wait(lambda: _readyz(admin) == 200, 30, "/readyz never 200 after the fix")
        # 3. Rotated again before the write (open connections must log in
        # again within 2 s): held at the poison.
        rotate(wrong)
        refused_before = len(dlt_front.failed_authentications())
        cons = consumer()
        try:
            assert _poll(cons, 8) == [0], "held at offset 1: only offset 0 delivered"
            assert len(dlt_front.failed_authentications()) > refused_before, \
                "the DLT write was never tried"
            assert _dlt_keys(dlt_front, dlt) == []
            # 4. Fixed: the same consumer goes on past the poison.
            rotate(right)
            assert _poll(cons, 30, until=lambda got: 2 in got) == [2]
        finally:
            cons.close()
        assert _dlt_keys(dlt_front, dlt) == [recs[1].key], "the poison, once"
        proxy.stop_and_check()
    finally:
        if proxy.proc is not None and proxy.proc.poll() is None:
            h.stop_process(proxy.proc)
