"""Dead-letter writes and the once-only ledger against the suite's broker (Apache Kafka) with real clients:
compressed DLT batches read back by kafka-python and librdkafka (and the
default, gzip, by kafkajs when it is installed), in DLTs
created with a `max.message.bytes` that fits; DLT records
that must not count (forged into another topic's DLT, or naming an earlier
incarnation of the topic by its id) are ignored after a restart; a policy
reload that adds a topic reads that topic's DLT into the ledger; `dlt inspect`
never prints a raw control character.

A batch refused as too large and retention moving a log start are shown on
Kafka in test_dlt_retention.py; one failed DLT partition of several, which
no real broker produces on demand, by the Rust unit tests in
src/dlt/writer/tests.rs against a mock broker."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import clients as c
import harness as h
import poison_support as ps
from test_reload_replay import wait_for_log

JS = Path(__file__).resolve().parent / "js"
KAFKAJS = shutil.which("node") is not None and (JS / "node_modules" / "kafkajs").exists()


@dataclass
class AdminPolicyProxy(ps.PolicyProxy):
    """The policy proxy with an admin listener (for /readyz)."""
    admin_port: int = 0

    def config_yaml(self) -> str:
        return super().config_yaml() + f"admin:\n  listen: {h.HOST}:{self.admin_port}\n"


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://{h.HOST}:{port}/readyz", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _ids(recs):
    return sorted((r.partition, r.offset) for r in recs)


def _dlt_codecs(broker_port: int, dlt: str) -> set[int]:
    p = ps.fetch_partition(broker_port, dlt, 0, 0)
    return {b.attributes & 7 for b in ps.split_batches(p.records)}


def _topic_config(ep, topic) -> dict:
    from confluent_kafka.admin import AdminClient, ConfigResource
    admin = AdminClient(ep.ck())  # kept alive until the futures resolve
    fs = admin.describe_configs([ConfigResource("topic", topic)])
    return {k: v.value for f in fs.values() for k, v in f.result(15).items()}


def _broker_port(broker) -> int:
    return int(broker.bootstrap.rsplit(":", 1)[1])


def _divert_two(workdir, broker, broker_endpoint, policy_file, name, dead_letter=None):
    topic = ps.unique_topic(ps.JSON_PREFIX, name)
    c.ck_create_topic(broker_endpoint, topic, 1)
    kinds = ["valid", "lat", "valid", "enum"]
    recs = [ps.json_rec(k, i) for i, k in enumerate(kinds)]
    c.ck_produce(broker_endpoint, topic, recs)
    proxy = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[policy_file],
                                  dead_letter=dead_letter, name=f"antidote-{name}")
    try:
        got = c.ck_consume_assign(c.Endpoint(proxy.bootstrap, "proxy"), topic, [0], 2, timeout=30)
        assert [r.offset for r in got] == [0, 2]
    finally:
        proxy.stop_and_check()
    return topic, [r for r, k in zip(recs, kinds) if k != "valid"]


def test_dlt_batches_are_gzip_by_default_and_lz4_when_configured_and_clients_read_them(
        workdir, broker, broker_endpoint, tmp_path):
    policy_file = ps.write_policies(tmp_path)
    for name, dead_letter, codec in [("gz", None, 1), ("lz4", {"compression": "lz4"}, 3)]:
        topic, poison = _divert_two(workdir, broker, broker_endpoint, policy_file, name, dead_letter)
        dlt = f"{topic}.dlt"
        assert _dlt_codecs(_broker_port(broker), dlt) == {codec}
        # Created by the proxy with a max.message.bytes that fits what it
        # frames (limits.max_frame_bytes, default 100 MiB). tansu stores the
        # config (DescribeConfigs shows it) but does not enforce it.
        assert _topic_config(broker_endpoint, dlt)["max.message.bytes"] == str(100 * 1024 * 1024)
        # kafka-python and librdkafka, straight from the broker.
        kp = ps.read_dlt(broker_endpoint, dlt)
        ck = ps.read_dlt_records(broker_endpoint, dlt, 2)
        for got in (kp, ck):
            assert [r.value for r in got] == [r.value for r in poison]
            for d, o in zip(ps.sorted_by_origin(got), poison):
                ps.check_dlt_record(d, o, topic, "pz-json", ps.JSON_RULE[
                    "lat" if o.offset == 1 else "enum"])
        if codec == 1 and KAFKAJS:
            # kafkajs reads gzip with no optional codec: why it is the default.
            hw = ps.high_watermark(_broker_port(broker), dlt)  # lease marker included
            out = subprocess.run(["node", "read_topic.js", broker.bootstrap, dlt, str(hw)], cwd=JS,
                                 capture_output=True, text=True, timeout=120,
                                 stdin=subprocess.DEVNULL)
            assert out.returncode == 0, out.stderr[-4000:]
            got = [json.loads(line) for line in out.stdout.splitlines()]
            got = [g for g in got if "x-antidote-marker" not in g["headers"]]
            assert [g["value"].encode() for g in got] == [r.value for r in poison]
            assert all("x-original-topic-id" in g["headers"] for g in got)


def test_dlt_records_forged_elsewhere_or_of_an_earlier_topic_incarnation_hide_nothing(
        workdir, broker, broker_endpoint, tmp_path):
    policy_file = ps.write_policies(tmp_path)
    victim = ps.unique_topic(ps.JSON_PREFIX, "victim")
    other = ps.unique_topic(ps.JSON_PREFIX, "other")
    for t in (victim, other, f"{victim}.dlt", f"{other}.dlt"):
        c.ck_create_topic(broker_endpoint, t, 1)
    valid = [ps.json_rec("valid", i) for i in range(10)]
    c.ck_produce(broker_endpoint, victim, valid)

    def dlt_rec(offset, topic_id=None):
        hs = [("x-original-topic", victim.encode()), ("x-original-partition", b"0"),
              ("x-original-offset", str(offset).encode()), ("x-error-class", b"poison")]
        if topic_id:
            hs.append(("x-original-topic-id", topic_id.encode()))
        return c.Rec(0, -1, b"k", b"{}", tuple(hs), 1_700_000_000_000)

    # Forged into another policy topic's DLT: must not count for `victim`.
    c.ck_produce(broker_endpoint, f"{other}.dlt", [dlt_rec(3)])
    # In victim's own DLT: one naming a topic id that is not victim's (an
    # earlier incarnation), and one genuine record (no id, as written before
    # the header existed), which must count: proof the ledger was read.
    c.ck_produce(broker_endpoint, f"{victim}.dlt",
                 [dlt_rec(5, str(uuid.uuid4())), dlt_rec(7)])
    proxy = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[policy_file],
                                  name="antidote-forged")
    try:
        ep = c.Endpoint(proxy.bootstrap, "proxy")
        want = [(0, o) for o in range(10) if o != 7]
        assert _ids(c.ck_consume_assign(ep, victim, [0], len(want), timeout=30)) == want
        assert _ids(c.kp_consume_assign(ep, victim, [0], len(want), timeout=30)) == want
        log = proxy.log.read_text(errors="replace")
        assert "DLT records ignored by the ledger" in log
    finally:
        proxy.stop_and_check()


RELOAD_POLICY = """policies:
  - name: reload-dlt
    topics: [{topics}]
    value:
      format: json
    rules:
      - coordinates: {{ lat: /lat, lon: /lon }}
"""


def test_a_reload_that_adds_a_topic_loads_its_dlt_into_the_ledger(workdir, broker, broker_endpoint,
                                                                  tmp_path):
    first, added = (f"rl-{tag}-{uuid.uuid4().hex[:8]}" for tag in ("a", "b"))
    for t in (first, added, f"{added}.dlt"):
        c.ck_create_topic(broker_endpoint, t, 1)
    recs = [c.Rec(0, i, f"k{i}".encode(), b'{"lat": 1, "lon": 2}', (), 1_700_000_000_000 + i)
            for i in range(5)]
    c.ck_produce(broker_endpoint, added, recs)
    # Offset 2 of `added` was diverted earlier (then the policy was fixed).
    c.ck_produce(broker_endpoint, f"{added}.dlt", [c.Rec(0, -1, b"k2", b'{"lat": 1, "lon": 2}', (
        ("x-original-topic", added.encode()), ("x-original-partition", b"0"),
        ("x-original-offset", b"2")), 1_700_000_000_002)])
    policy = tmp_path / "reload.yaml"
    policy.write_text(RELOAD_POLICY.format(topics=f'"{first}"'))
    proxy = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[policy],
                                  name="antidote-reload-dlt")
    try:
        ep = c.Endpoint(proxy.bootstrap, "proxy")
        # Not policed yet: every record passes.
        assert _ids(c.ck_consume_assign(ep, added, [0], 5, timeout=30)) == [(0, o) for o in range(5)]
        policy.write_text(RELOAD_POLICY.format(topics=f'"{first}", "{added}"'))
        wait_for_log(proxy, "policies reloaded")
        # Policed now: the ledger, read from added's DLT, keeps offset 2 out.
        got = c.kp_consume_assign(ep, added, [0], 4, timeout=30)
        assert _ids(got) == [(0, 0), (0, 1), (0, 3), (0, 4)]
        wait_for_log(proxy, f"dlt={added}.dlt")
    finally:
        proxy.stop_and_check()


def test_dlt_inspect_escapes_terminal_control_sequences(workdir, broker, broker_endpoint):
    from test_ops import POLICY, OpsAntidote, cli, ok
    topic = f"insp-{uuid.uuid4().hex[:8]}"
    dlt = f"{topic}.dlt"
    for t in (topic, dlt):
        c.ck_create_topic(broker_endpoint, t, 1)
    esc = b"\x1b]2;owned\x07\x1b[2J"
    c.ck_produce(broker_endpoint, dlt, [c.Rec(0, -1, b"k" + esc, b'{"lat": 95}' + esc, (
        ("note", b"n" + esc), ("x-original-topic", topic.encode()),
        ("x-original-partition", b"0"), ("x-original-offset", b"4"),
        ("x-error-class", b"poison"), ("x-error", b"/lat " + esc),
        ("x-error-rule", b"range:/lat")), 1_700_000_000_000)])
    policy = workdir / f"{topic}.policy.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    cfg = OpsAntidote(workdir, upstream=[broker.bootstrap], name=f"insp-{topic}",
                      policy_files=(str(policy),))
    cfg.config_path.write_text(cfg.config_yaml())
    for extra in ([], ["--json"], ["--summary"]):
        out = ok(cli("dlt", "inspect", "--config", str(cfg.config_path), "--topic", dlt, *extra))
        assert "\x1b" not in out and "\x07" not in out, repr(out)
        assert "\\u{1b}" in out, out


def test_a_policy_topic_is_withheld_until_its_dlt_is_loaded_other_topics_flow(
        workdir, broker, broker_endpoint, tmp_path):
    """The dead-letter cluster answers nothing at start (a black hole): the
    ledger cannot be loaded, so the policy topic's records are withheld,
    fetch after fetch, while a topic without a policy flows, and /readyz
    answers 503. Once the cluster is up the ledger loads, the records are
    delivered and /readyz answers 200."""
    import fault_support as fs
    policed, free = (f"hold-{tag}-{uuid.uuid4().hex[:8]}" for tag in ("p", "f"))
    for t in (policed, free):
        c.ck_create_topic(broker_endpoint, t, 1)
        c.ck_produce(broker_endpoint, t, [c.Rec(0, i, f"k{i}".encode(), f'{{"i": {i}}}'.encode())
                                          for i in range(3)])
    policy = fs.write_json_policy(tmp_path / "hold", [policed])
    dlt_port = h.free_port()
    hole = fs.BlackHole(dlt_port).start()
    import conftest
    admin = h.free_port()
    proxy = AdminPolicyProxy(workdir, upstream=[broker.bootstrap], policies=[policy],
                             dead_letter={"bootstrap_servers": [f"{h.HOST}:{dlt_port}"],
                                          "timeout": "1s"},
                             name="antidote-hold-unloaded", admin_port=admin)
    conftest._PROXIES.append(proxy)
    proxy.start()
    dlt = None
    try:
        port = proxy.broker_port()
        assert len(h.decode_uncompressed_batches(ps.fetch_partition(port, free).records)) == 3
        for _ in range(3):
            assert ps.fetch_partition(port, policed).records == b""
        assert _readyz(admin) == 503
        hole.stop()
        dlt = h.Tansu(workdir, port=dlt_port).start()
        deadline = time.monotonic() + 30
        got = []
        while not got and time.monotonic() < deadline:
            got = h.decode_uncompressed_batches(ps.fetch_partition(port, policed).records)
        assert [r.offset for r in got] == [0, 1, 2]
        assert _readyz(admin) == 200
    finally:
        proxy.stop_and_check()
        hole.stop()
        if dlt:
            dlt.stop()


class _GatedFetchRelay:
    """127.0.0.1:port -> `target`, relaying every request, but holding each
    Fetch response until `gate` is set: a DLT cluster that is slow to read.
    `held` counts Fetch responses waiting at the gate."""

    def __init__(self, port: int, target: int):
        import socket
        import threading
        self.target, self.port = target, port
        self.gate = threading.Event()
        self.held = 0
        self._lock = threading.Lock()
        self.srv = socket.create_server((h.HOST, port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading
        while True:
            try:
                cl, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(cl,), daemon=True).start()

    def _frame(self, s):
        head = h.recv_exact(s, 4)
        return head + h.recv_exact(s, int.from_bytes(head, "big", signed=True))

    def _serve(self, cl) -> None:
        import socket
        up = socket.create_connection((h.HOST, self.target), timeout=30)
        try:
            while True:
                req = self._frame(cl)
                up.sendall(req)
                resp = self._frame(up)
                if int.from_bytes(req[4:6], "big") == 1:        # Fetch
                    with self._lock:
                        self.held += 1
                    self.gate.wait(60)
                cl.sendall(resp)
        except (ConnectionError, OSError):
            pass
        finally:
            cl.close()
            up.close()

    def stop(self) -> None:
        self.gate.set()
        self.srv.close()


def test_readyz_answers_503_while_the_ledger_is_being_read_and_200_once_it_is(
        workdir, broker, broker_endpoint, tmp_path):
    """The DLT cluster answers, but reading the DLT back is slow (its Fetch
    answers wait at a gate): with upstream metadata fetched, /readyz says 503
    while the ledger's read is under way, and 200 once it completes."""
    import fault_support as fs
    policed = f"ready-{uuid.uuid4().hex[:8]}"
    c.ck_create_topic(broker_endpoint, policed, 1)
    c.ck_produce(broker_endpoint, policed, [c.Rec(0, 0, b"k", b'{"i": 0}')])
    relay_port = h.free_port()
    dlt_broker = h.Tansu(workdir, advertised_port=relay_port).start()
    relay = _GatedFetchRelay(relay_port, dlt_broker.port)
    relay.gate.set()                    # setting up: nothing held
    dlt_ep = c.Endpoint(f"{h.HOST}:{relay_port}")
    c.ck_create_topic(dlt_ep, f"{policed}.dlt", 1)
    c.ck_produce(dlt_ep, f"{policed}.dlt", [c.Rec(0, 0, b"k", b"not a diversion")])
    relay.gate.clear()
    relay.held = 0
    policy = fs.write_json_policy(tmp_path / "ready", [policed])
    import conftest
    admin = h.free_port()
    proxy = AdminPolicyProxy(workdir, upstream=[broker.bootstrap], policies=[policy],
                             dead_letter={"bootstrap_servers": [f"{h.HOST}:{relay_port}"],
                                          "timeout": "10s"},
                             name="antidote-ready-slow-ledger", admin_port=admin)
    conftest._PROXIES.append(proxy)
    proxy.start()
    try:
        wait_for_log(proxy, "upstream metadata fetched; ready")
        deadline = time.monotonic() + 15
        while relay.held == 0:
            assert time.monotonic() < deadline, "the ledger never read the DLT"
            time.sleep(0.05)
        # Upstream is ready; only the ledger is not.
        assert _readyz(admin) == 503
        relay.gate.set()
        deadline = time.monotonic() + 15
        while _readyz(admin) != 200:
            assert time.monotonic() < deadline, "/readyz never 200 after the ledger loaded"
            time.sleep(0.1)
        got = h.decode_uncompressed_batches(ps.fetch_partition(proxy.broker_port(), policed).records)
        assert [r.offset for r in got] == [0]
    finally:
        proxy.stop_and_check()
        relay.stop()
        dlt_broker.stop()
