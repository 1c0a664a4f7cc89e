"""SASL end to end through the proxy. tansu cannot authenticate, so
`SaslFront`, a small SASL-terminating relay in front of it, plays the
authenticating broker: it adds SaslHandshake (v0-1) and SaslAuthenticate
(v0-1) to tansu's ApiVersions answers, checks PLAIN and SCRAM-SHA-256/512
credentials itself (SCRAM per RFC 5802, 4096 iterations), refuses every
other request of a connection that has not authenticated (it closes it, as
Kafka does), and relays authenticated connections to tansu.

Clients authenticate through the proxy (SASL passthrough, their own
identity at the broker), and the proxy's own connections (metadata, the
dead-letter producer and ledger) authenticate with `upstream.sasl`. With a
dead-letter cluster of its own (a second tansu behind a second front with
other users), the DLT producer and ledger authenticate there with
`dead_letter.sasl`, and wrong DLT credentials hold rather than lose."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import socket
import struct
import threading
import uuid
from dataclasses import dataclass

import confluent_kafka as ck
import pytest

import clients as c
import harness as h
import poison_support as ps

USERS = {"alice": "alice-secret", "antidote": "proxy-secret"}
ITERATIONS = 4096
HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}


def _read_frame(s: socket.socket):
    try:
        head = h.recv_exact(s, 4)
        return head + h.recv_exact(s, struct.unpack(">i", head)[0])
    except (ConnectionError, OSError):
        return None


def _uvarint(b, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        x = b[pos]
        pos += 1
        n |= (x & 0x7F) << shift
        shift += 7
        if not x & 0x80:
            return n, pos


def _add_sasl_to_api_versions(frame: bytes, version: int) -> bytes:
    """SaslHandshake and SaslAuthenticate at versions 0-1 in the key list
    (added, or capped where tansu lists them: this front speaks v0-1 only)."""
    b = bytearray(frame[8:])                       # after size and correlation id
    pos = 2                                        # error code
    if version >= 3:
        n, end = _uvarint(b, pos)
        count, entry, extra = n - 1, 7, b"\x00"
        assert n + 2 < 128, "one-byte compact length expected"
        entries_at = end
    else:
        count, entry, extra = struct.unpack_from(">i", b, pos)[0], 6, b""
        entries_at = pos + 4
    keys = [struct.unpack_from(">h", b, entries_at + i * entry)[0] for i in range(count)]
    for i, k in enumerate(keys):                   # tansu lists them already: cap at v1
        if k in (17, 36):
            struct.pack_into(">hh", b, entries_at + i * entry + 2, 0, 1)
    add = b"".join(struct.pack(">hhh", k, 0, 1) + extra for k in (17, 36) if k not in keys)
    added = len(add) // entry
    tail = entries_at + count * entry
    body = bytes(b[:tail]) + add + bytes(b[tail:])
    body = bytearray(body)
    if version >= 3:
        body[pos] = count + added + 1
    else:
        struct.pack_into(">i", body, pos, count + added)
    out = frame[4:8] + bytes(body)
    return struct.pack(">i", len(out)) + out


def _response(corr: int, body: bytes) -> bytes:
    return struct.pack(">ii", len(body) + 4, corr) + body


def _kstr(s):
    return h.kstr(s)


class _Scram:
    def __init__(self, mech: str, users: dict):
        self.hash = HASHES[mech]
        self.users = users
        self.salt = os.urandom(16)
        self.first_bare = self.server_first = self.user = None

    def first(self, msg: str) -> str:
        self.first_bare = msg.split(",", 2)[2]                  # "n,,n=u,r=..." -> "n=u,r=..."
        attrs = dict(a.split("=", 1) for a in self.first_bare.split(","))
        self.user = attrs["n"]
        self.nonce = attrs["r"] + base64.b64encode(os.urandom(12)).decode()
        self.server_first = (f"r={self.nonce},s={base64.b64encode(self.salt).decode()},"
                             f"i={ITERATIONS}")
        return self.server_first

    def final(self, msg: str):
        """The server-final message, or None if the proof is wrong."""
        without_proof, proof = msg.rsplit(",p=", 1)
        password = self.users.get(self.user)
        if password is None or f"r={self.nonce}" not in without_proof:
            return None
        salted = hashlib.pbkdf2_hmac(self.hash().name, password.encode(), self.salt,
                                     ITERATIONS)
        client_key = hmac.new(salted, b"Client Key", self.hash).digest()
        stored = self.hash(client_key).digest()
        auth = f"{self.first_bare},{self.server_first},{without_proof}".encode()
        sig = hmac.new(stored, auth, self.hash).digest()
        want = bytes(a ^ b for a, b in zip(client_key, sig))
        if not hmac.compare_digest(want, base64.b64decode(proof)):
            return None
        server_key = hmac.new(salted, b"Server Key", self.hash).digest()
        return "v=" + base64.b64encode(hmac.new(server_key, auth, self.hash).digest()).decode()


class SaslFront:
    """127.0.0.1:port -> tansu, authenticating each connection first against
    `users` (user -> password; a test may change it while the front runs)."""

    def __init__(self, port: int, target: int, users: dict | None = None):
        self.target = target
        self.users = dict(USERS if users is None else users)
        self.srv = socket.create_server((h.HOST, port))
        self.port = port
        self.authenticated: list[tuple[str, str]] = []   # (mechanism, user)
        self.refused: list[str] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                cl, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(cl,), daemon=True).start()

    def _serve(self, cl: socket.socket) -> None:
        up = socket.create_connection((h.HOST, self.target), timeout=10)
        up.settimeout(None)
        mech, scram, user = None, None, None
        try:
            while (f := _read_frame(cl)) is not None:
                key, ver, corr = struct.unpack_from(">hhi", f, 4)
                cid = struct.unpack_from(">h", f, 12)[0]
                body = f[14 + max(cid, 0):]
                if key == 17:                                   # SaslHandshake
                    mech = struct.unpack_from(">h", body, 0)[0]
                    mech = body[2:2 + mech].decode()
                    ok = mech in ("PLAIN", *HASHES)
                    names = [b"PLAIN", b"SCRAM-SHA-256", b"SCRAM-SHA-512"]
                    cl.sendall(_response(corr, struct.pack(">h", 0 if ok else 33)
                                         + struct.pack(">i", len(names))
                                         + b"".join(struct.pack(">h", len(n)) + n for n in names)))
                    scram = _Scram(mech, self.users) if mech in HASHES else None
                    continue
                if key == 36:                                   # SaslAuthenticate v0-1
                    n = struct.unpack_from(">i", body, 0)[0]
                    token = body[4:4 + n].decode()
                    reply, err = "", 0
                    if mech == "PLAIN":
                        _authz, u, pw = token.split("\x00")
                        if self.users.get(u) == pw:
                            user = u
                        else:
                            err = 58                            # SASL_AUTHENTICATION_FAILED
                    elif scram is not None and scram.first_bare is None:
                        reply = scram.first(token)
                    elif scram is not None:
                        final = scram.final(token)
                        if final is None:
                            err = 58
                        else:
                            reply, user = final, scram.user
                    else:
                        err = 58
                    out = struct.pack(">h", err) + _kstr("bad credentials" if err else None)
                    out += struct.pack(">i", len(reply)) + reply.encode()
                    if ver >= 1:
                        out += struct.pack(">q", 0)
                    cl.sendall(_response(corr, out))
                    with self._lock:
                        if err:
                            self.refused.append(mech)
                        elif user:
                            self.authenticated.append((mech, user))
                    if err:
                        break
                    continue
                if key != 18 and user is None:
                    break                                       # not authenticated: close
                up.sendall(f)
                r = _read_frame(up)
                if r is None:
                    break
                if key == 18:
                    r = _add_sasl_to_api_versions(r, ver)
                cl.sendall(r)
        except OSError:
            pass
        finally:
            for s in (cl, up):
                try:
                    s.close()
                except OSError:
                    pass

    def stop(self) -> None:
        self.srv.close()


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


@pytest.fixture
def front(workdir):
    port = h.free_port()
    t = h.Tansu(workdir, advertised_port=port).start()
    f = SaslFront(port, t.port)
    yield f
    f.stop()
    t.stop()


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
    direct = c.Endpoint(f"{h.HOST}:{front.port}")
    admin_conf = ck_sasl(direct, mech, "alice", USERS["alice"])
    topic = ps.unique_topic(ps.JSON_PREFIX, "sasl")
    create_topic(direct, topic, admin_conf)
    recs = [ps.json_rec(k, i) for i, k in enumerate(["valid", "lat", "valid"])]
    c.ck_produce(direct, topic, recs, **admin_conf)
    pfile = ps.write_policies(tmp_path / "policies")
    proxy = SaslProxy(workdir, upstream=[f"{h.HOST}:{front.port}"], policies=[pfile],
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
        # The DLT was written and read by the proxy's own, authenticated producer.
        dlt = ps.read_dlt_records(direct, f"{topic}.dlt", 1, **admin_conf)
        assert [d.key for d in dlt] == [recs[1].key]
        who = set(front.authenticated)
        assert (mech, "antidote") in who, f"the proxy never authenticated: {who}"
        assert (mech, "alice") in who, who
        # A wrong password through the proxy is refused by the broker.
        bad = ck.Consumer(via.ck(**{"group.id": f"bad-{uuid.uuid4().hex[:6]}",
                                    **ck_sasl(via, mech, "alice", "wrong")}))
        try:
            with pytest.raises(ck.KafkaException) as e:
                bad.list_topics(timeout=8)
            assert mech in front.refused, (front.refused, str(e.value))
        finally:
            bad.close()
        proxy.stop_and_check()
    finally:
        if proxy.proc is not None and proxy.proc.poll() is None:
            h.stop_process(proxy.proc)


# ---------------------------------------------------------------------------
# dead_letter.sasl: the DLT cluster (a second tansu behind its own front, with
# its own users) authenticates the proxy with credentials of its own.
# ---------------------------------------------------------------------------

DLT_USERS = {"dlt-writer": "dlt-secret"}
DLT_PASSWORD_ENV = "ANTIDOTE_TEST_DLT_PASSWORD"


@pytest.fixture
def dlt_front(workdir):
    port = h.free_port()
    t = h.Tansu(workdir, advertised_port=port).start()
    f = SaslFront(port, t.port, users=DLT_USERS)
    f.tansu = t
    yield f
    f.stop()
    t.stop()


def _dlt_proxy(workdir, front, dlt_front, pfile, name, dlt_mech, admin_port=0):
    """A policy proxy: upstream.sasl PLAIN as `antidote` on `front`,
    dead_letter.sasl `dlt_mech` as `dlt-writer` on `dlt_front`, with the
    password from the environment."""
    import conftest
    dl_sasl = (f"{{ mechanism: {dlt_mech}, username: dlt-writer, "
               f"password_env: {DLT_PASSWORD_ENV} }}")
    proxy = SaslProxy(workdir, upstream=[f"{h.HOST}:{front.port}"], policies=[pfile], name=name,
                      sasl={"mechanism": "PLAIN", "username": "antidote",
                            "password": USERS["antidote"]},
                      dead_letter={"bootstrap_servers": [f"{h.HOST}:{dlt_front.port}"],
                                   "sasl": dl_sasl, "timeout": "2s", "compression": "none"},
                      admin_port=admin_port)
    conftest._PROXIES.append(proxy)
    return proxy.start()


def _poison_topic(front) -> tuple[str, list]:
    """A policy topic on the upstream cluster: valid, poison, valid."""
    direct = c.Endpoint(f"{h.HOST}:{front.port}")
    conf = ck_sasl(direct, "PLAIN", "alice", USERS["alice"])
    topic = ps.unique_topic(ps.JSON_PREFIX, "dlsasl")
    create_topic(direct, topic, conf)
    recs = [ps.json_rec(k, i) for i, k in enumerate(["valid", "lat", "valid"])]
    c.ck_produce(direct, topic, recs, **conf)
    return topic, recs


def _dlt_keys(dlt_front, dlt: str) -> list:
    """Keys of the records in `dlt`, read from the DLT cluster's tansu itself
    (no SASL there), every record counted; [] while the DLT does not exist."""
    try:
        p = ps.fetch_partition(dlt_front.tansu.port, dlt)
    except AssertionError:
        return []
    recs = h.decode_uncompressed_batches(p.records)
    return [r.key for r in recs if not ps.is_lease_marker(
        c.Rec(0, r.offset, r.key, r.value, tuple(r.headers), r.timestamp))]


def _users(front) -> set:
    return {u for _, u in front.authenticated}


def test_dead_letter_sasl_authenticates_the_dlt_cluster_with_its_own_credentials(
        front, dlt_front, workdir, tmp_path, monkeypatch):
    topic, recs = _poison_topic(front)
    monkeypatch.setenv(DLT_PASSWORD_ENV, DLT_USERS["dlt-writer"])
    pfile = ps.write_policies(tmp_path / "policies")
    proxy = _dlt_proxy(workdir, front, dlt_front, pfile, "antidote-dlt-sasl", "SCRAM-SHA-512")
    try:
        via = c.Endpoint(proxy.bootstrap, "proxy")
        got = c.ck_consume_assign(via, topic, [0], 2, timeout=30,
                                  **ck_sasl(via, "PLAIN", "alice", USERS["alice"]))
        assert got == [recs[0], recs[2]]
        # The poison is in the DLT on the other cluster, once; a reader with
        # the DLT cluster's credentials gets it through its front.
        assert _dlt_keys(dlt_front, f"{topic}.dlt") == [recs[1].key]
        dl = c.Endpoint(f"{h.HOST}:{dlt_front.port}")
        read = ps.read_dlt_records(dl, f"{topic}.dlt", 1,
                                   **ck_sasl(dl, "PLAIN", "dlt-writer", DLT_USERS["dlt-writer"]))
        assert [r.key for r in read] == [recs[1].key]
        # Each cluster saw only its own credentials from the proxy.
        assert ("SCRAM-SHA-512", "dlt-writer") in dlt_front.authenticated, dlt_front.authenticated
        assert "antidote" not in _users(dlt_front), dlt_front.authenticated
        assert ("PLAIN", "antidote") in front.authenticated, front.authenticated
        assert "dlt-writer" not in _users(front), front.authenticated
        assert dlt_front.refused == [] and front.refused == []
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
    dlt_front.users["dlt-writer"] = wrong
    pfile = ps.write_policies(tmp_path / "policies")
    admin = h.free_port()
    proxy = _dlt_proxy(workdir, front, dlt_front, pfile, "antidote-dlt-sasl-wrong", "PLAIN",
                       admin_port=admin)
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
        assert "PLAIN" in dlt_front.refused, dlt_front.refused
        assert _readyz(admin) == 503
        # 2. The password is right: the ledger loads.
        dlt_front.users["dlt-writer"] = right
        _wait(lambda: _readyz(admin) == 200, 30, "/readyz never 200 after the fix")
        # 3. Refused again before the write: held at the poison.
        dlt_front.users["dlt-writer"] = wrong
        refused_before = len(dlt_front.refused)
        cons = consumer()
        try:
            assert _poll(cons, 8) == [0], "held at offset 1: only offset 0 delivered"
            assert len(dlt_front.refused) > refused_before, "the DLT write was never tried"
            assert _dlt_keys(dlt_front, dlt) == []
            # 4. Fixed: the same consumer goes on past the poison.
            dlt_front.users["dlt-writer"] = right
            assert _poll(cons, 30, until=lambda got: 2 in got) == [2]
        finally:
            cons.close()
        assert _dlt_keys(dlt_front, dlt) == [recs[1].key], "the poison, once"
        proxy.stop_and_check()
    finally:
        if proxy.proc is not None and proxy.proc.poll() is None:
            h.stop_process(proxy.proc)
