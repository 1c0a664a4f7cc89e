"""Operations features against a real broker: the admin endpoints
(/metrics, /healthz, /readyz) and the `antidote dlt inspect` / `dlt replay`
commands, end to end.

One proxy with a policy is started for this module. A poison record is
produced straight to the broker, consumed through the proxy (so it is
diverted to `<topic>.dlt`), and then inspected and replayed with the CLI.

The tests share that one topic and run in file order: the inspect tests
expect the single diversion, the replay test then adds more.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka as ck
import pytest

from clients import (Endpoint, Rec, ck_consume_assign, ck_create_topic, ck_produce,
                     kp_consume_assign)
from harness import ANTIDOTE_BIN, HOST, Antidote, free_port, metric

# Valid while -90 <= lat <= 90 (the "broken" policy the proxy runs with) ...
POLICY = """\
policies:
  - name: ops-geo
    topics: ["{topic}"]
    value:
      format: json
    rules:
      - field: /lat
        min: -90
        max: {max_lat}
    on_invalid: divert
"""
# ... and the record that breaks it.
POISON = b'{"lat": 95, "id": "p1"}'


@dataclass
class OpsAntidote(Antidote):
    """The harness's proxy, with policy files and an admin listener."""
    policy_files: tuple = ()
    admin_port: int = 0
    extra_yaml: str = ""   # more top-level sections, as YAML text

    def config_yaml(self) -> str:
        text = super().config_yaml()
        policies = "policies:\n" + "".join(f"  - {p}\n" for p in self.policy_files)
        text = text.replace("policies: []\n", policies)
        if self.admin_port:
            text += f"admin:\n  listen: {HOST}:{self.admin_port}\n"
        return text + self.extra_yaml

    def wait_ready(self, timeout: float = 15) -> "OpsAntidote":
        """Until /readyz answers 200: metadata fetched, broker ports open,
        the DLTs read back into the ledger."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if http_get(self.admin_port, "/readyz")[0] == 200:
                return self
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: /readyz not 200 after {timeout} s")


@dataclass
class Setup:
    proxy: OpsAntidote
    topic: str
    dlt: str
    config: Path          # the proxy's own config (policy: lat <= 90)
    fixed_config: Path    # same cluster, fixed policy (lat <= 100)


def write_config(workdir: Path, base: OpsAntidote, name: str, policy: Path) -> Path:
    cfg = OpsAntidote(workdir, upstream=base.upstream, bootstrap_port=base.bootstrap_port,
                      port_base=base.port_base, policy_files=(str(policy),), name=name)
    path = workdir / f"{name}.yaml"
    path.write_text(cfg.config_yaml())
    return path


@pytest.fixture(scope="module")
def ops(workdir, broker) -> Setup:
    topic = f"ops-geo-{uuid.uuid4().hex[:8]}"
    ck_create_topic(Endpoint(broker.bootstrap), topic, 1)
    policy = workdir / f"{topic}.policy.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    fixed = workdir / f"{topic}.fixed.yaml"
    fixed.write_text(POLICY.format(topic=topic, max_lat=100))
    proxy = OpsAntidote(workdir, upstream=[broker.bootstrap], policy_files=(str(policy),),
                        admin_port=free_port(), name=f"ops-{topic}")
    # Written before the proxy starts: a new .yaml next to its policy would
    # make it reload (and forget its verdicts) mid-test.
    fixed_config = write_config(workdir, proxy, f"ops-fixed-{topic}", fixed)
    proxy.start()
    try:
        ep = Endpoint(broker.bootstrap)
        ck_produce(ep, topic, [
            Rec(0, -1, b"k1", b'{"lat": 10, "id": "v1"}', (("trace", b"t1"),), 1_700_000_000_001),
            Rec(0, -1, b"k2", POISON, (("trace", b"t2"), ("x-request-id", b"r2")), 1_700_000_000_002),
            Rec(0, -1, b"k3", b'{"lat": 20, "id": "v3"}', (), 1_700_000_000_003),
        ])
        got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 2, timeout=60)
        assert [r.key for r in got] == [b"k1", b"k3"], f"poison record was not removed: {got}"
        yield Setup(proxy, topic, f"{topic}.dlt", proxy.config_path, fixed_config)
    finally:
        proxy.stop_and_check()


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    p = subprocess.run([str(ANTIDOTE_BIN), *args], capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    return p


def ok(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p.stdout


def read_all(bootstrap: str, topic: str, timeout: float = 20) -> list[Rec]:
    """Every record of partition 0 of `topic`, read directly until its end."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"ops-{time.monotonic_ns()}",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "enable.partition.eof": True, "log_level": 3})
    got: list[Rec] = []
    try:
        c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == ck.KafkaError._PARTITION_EOF:
                    return got
                raise AssertionError(f"consumer error: {m.error()}")
            got.append(Rec(m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers() or ())))
    finally:
        c.close()
    raise AssertionError(f"no end of {topic} within {timeout}s; read {got}")


# ---------------------------------------------------------------------------
# Admin endpoints
# ---------------------------------------------------------------------------

def http_get(port: int, path: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_healthz_answers_while_the_proxy_runs(ops):
    assert http_get(ops.proxy.admin_port, "/healthz") == (200, "ok\n")


def test_readyz_turns_ready_once_upstream_metadata_is_fetched(ops):
    deadline = time.monotonic() + 15
    status = None
    while time.monotonic() < deadline:
        status, _ = http_get(ops.proxy.admin_port, "/readyz")
        if status == 200:
            return
        assert status == 503, status
        time.sleep(0.2)
    raise AssertionError(f"/readyz still {status} after 15 s")


def test_readyz_answers_503_while_a_broker_port_is_held_by_another_process(tmp_path, broker):
    """The per-broker port the proxy would tell clients about is taken (in CI
    once by another proxy's admin listener: the clients then spoke Kafka to
    an HTTP server). The proxy must not call itself ready while it cannot
    serve that broker, and must open the port once it is free."""
    import socket
    # Not the module's workdir: a new .yaml there reloads the `ops` proxy.
    proxy = OpsAntidote(tmp_path, upstream=[broker.bootstrap], admin_port=free_port(),
                        name="held-broker-port")
    holder = socket.socket()
    holder.bind((HOST, proxy.broker_port()))
    holder.listen(1)
    proxy.start()
    try:
        assert "cannot open the listener for broker" in proxy.log.read_text()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            assert http_get(proxy.admin_port, "/readyz")[0] == 503
            time.sleep(0.2)
        holder.close()
        # The bind is retried when a metadata response names the broker.
        topic = f"held-{uuid.uuid4().hex[:8]}"
        ck_create_topic(Endpoint(broker.bootstrap), topic, 1)
        ck_produce(Endpoint(broker.bootstrap), topic, [Rec(0, -1, b"k", b"v")])
        got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 1, timeout=30)
        assert [r.value for r in got] == [b"v"]
        assert http_get(proxy.admin_port, "/readyz")[0] == 200
        assert "serving broker" in proxy.log.read_text()
    finally:
        holder.close()
        proxy.stop_and_check()


def spliced_count(proxy) -> float:
    """Responses the proxy has spliced socket to socket so far."""
    _, text = http_get(proxy.admin_port, "/metrics")
    lines = [line for line in text.splitlines() if line.startswith(
        'antidote_response_relay_duration_seconds_count{response="spliced",until="sent"}')]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def test_large_forwarded_responses_are_spliced_and_arrive_byte_for_byte(tmp_path, broker):
    """With no policy, forwarded Fetch responses over 64 KiB go socket to
    socket (splice(2)). ~2.5 MB of records in two partitions, read through
    the proxy by librdkafka and kafka-python, must be exactly what was
    written, in order, and the proxy must stay up. kafka-python's Fetch
    (below v16) is forwarded, so spliced (the histogram counts it);
    librdkafka's v16+ responses may name brokers (NodeEndpoints, at their
    end) and are read whole to rewrite them, unless a second proxy with
    `limits.fetch_max_version: 15` keeps librdkafka at v15: then its
    responses are spliced too, and still arrive byte for byte."""
    import random
    rng = random.Random(15)
    topic = f"spliced-{uuid.uuid4().hex[:8]}"
    ck_create_topic(Endpoint(broker.bootstrap), topic, 2)
    recs = []
    for p in range(2):
        for i in range(1500):
            value = bytes(rng.getrandbits(8) for _ in range(rng.randrange(400, 1200)))
            headers = (("h", f"{i}".encode()), ("h", b"dup")) if i % 5 == 0 else ()
            recs.append(Rec(p, i, f"k{p}-{i}".encode(), value, headers,
                            1_700_000_000_000 + i))
    ck_produce(Endpoint(broker.bootstrap), topic, recs, timeout=60)
    proxy = OpsAntidote(tmp_path, upstream=[broker.bootstrap], admin_port=free_port(),
                        name="splice").start()
    capped = OpsAntidote(tmp_path, upstream=[broker.bootstrap], admin_port=free_port(),
                         name="splice-v15", extra_yaml="limits:\n  fetch_max_version: 15\n")
    try:
        ep = Endpoint(proxy.bootstrap, "proxy")
        spliced = []
        for read in (ck_consume_assign, kp_consume_assign):
            got = read(ep, topic, [0, 1], len(recs), timeout=60)
            by_partition = sorted(got, key=lambda r: (r.partition, r.offset))
            assert len(got) == len(recs), f"{read.__name__}: {len(got)} of {len(recs)}"
            assert by_partition == recs, f"{read.__name__}: records differ"
            spliced.append(spliced_count(proxy))
        assert spliced[0] == 0, f"librdkafka's v16+ responses were spliced: {spliced}"
        assert spliced[1] >= 1, f"kafka-python's responses were not spliced: {spliced}"
        capped.start()
        got = ck_consume_assign(Endpoint(capped.bootstrap, "proxy-v15"), topic, [0, 1],
                                len(recs), timeout=60)
        by_partition = sorted(got, key=lambda r: (r.partition, r.offset))
        assert len(got) == len(recs) and by_partition == recs, "librdkafka at v15: records differ"
        assert spliced_count(capped) >= 1, "librdkafka at v15 was not spliced"
        capped.assert_running()
        proxy.assert_running()
    finally:
        try:
            proxy.stop_and_check()
        finally:
            capped.stop_and_check()


def test_one_large_partition_is_judged_on_several_cores_with_the_outcome_of_one(
        tmp_path, broker):
    """A partition whose Fetch response holds ~1 MiB is judged by the
    connection's planner and, on the cores left idle, by helpers judging
    ahead from the middle (filter/parallel.rs). What the consumer gets
    must not depend on that: 5,000 records of ~330 bytes in 64 KiB batches
    on one partition, 5 poison among them, read through the proxy by
    kafka-python; every valid record arrives once, in order, the poison
    goes to the DLT, each record is validated exactly once
    (antidote_records_evaluated_total), and on a machine with two or more
    cores helpers did judge some of them."""
    import os
    topic = f"ahead-{uuid.uuid4().hex[:8]}"
    ck_create_topic(Endpoint(broker.bootstrap), topic, 1)
    policy = tmp_path / f"{topic}.policy.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    pad = "x" * 280
    poison = {i for i in range(5000) if i % 997 == 500}
    recs = [Rec(0, -1, f"k{i}".encode(),
                json.dumps({"lat": 95 if i in poison else i % 90, "id": i, "pad": pad}).encode(),
                (), 1_700_000_000_000 + i)
            for i in range(5000)]
    ck_produce(Endpoint(broker.bootstrap), topic, recs, timeout=60, **{"batch.size": 65536})
    proxy = OpsAntidote(tmp_path, upstream=[broker.bootstrap], policy_files=(str(policy),),
                        admin_port=free_port(), name=f"ahead-{topic}").start()
    try:
        want = [r.key for i, r in enumerate(recs) if i not in poison]
        got = kp_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], len(want),
                                timeout=90)
        assert [r.key for r in got] == want, f"{len(got)} records, first keys {got[:3]}"
        assert [r.offset for r in got] == [i for i in range(5000) if i not in poison]
        from poison_support import is_lease_marker
        dlt = [r for r in read_all(broker.bootstrap, f"{topic}.dlt") if not is_lease_marker(r)]
        assert sorted(r.key for r in dlt) == sorted(f"k{i}".encode() for i in poison), dlt
        _, text = http_get(proxy.admin_port, "/metrics")
        assert metric(text, "antidote_records_evaluated_total", policy="ops-geo") == 5000, text
        ahead = metric(text, "antidote_fetch_judged_ahead_records_total")
        if len(os.sched_getaffinity(0)) >= 2:
            assert 0 < ahead < 5000, f"judged ahead: {ahead}"
        else:
            assert ahead == 0, f"one core, yet judged ahead: {ahead}"
        proxy.assert_running()
    finally:
        proxy.stop_and_check()


def test_metrics_are_prometheus_text_and_count_the_diversion(ops):
    status, text = http_get(ops.proxy.admin_port, "/metrics")
    assert status == 200
    assert "# TYPE antidote_records_validated_total counter" in text
    assert "antidote_build_info{version=" in text
    diverted = [line for line in text.splitlines()
                if line.startswith("antidote_records_invalid_total{")
                and f'topic="{ops.topic}"' in line and 'action="diverted"' in line
                and 'class="poison"' in line]
    assert diverted and float(diverted[0].rsplit(" ", 1)[1]) >= 1, text
    validated = [line for line in text.splitlines()
                 if line.startswith("antidote_records_validated_total{") and ops.topic in line]
    assert validated and float(validated[0].rsplit(" ", 1)[1]) >= 3, text


def documented_metric_names() -> set[str]:
    """Every `antidote_*` name the README, the manual (docs/) and the shipped
    alert rules and dashboard use (what operators and their Prometheus
    depend on)."""
    import re
    root = Path(__file__).resolve().parent.parent
    texts = [root / "README.md", *sorted((root / "docs").rglob("*.md")),
             *sorted((root / "ops").iterdir())]
    return {m for f in texts for m in re.findall(r"\bantidote_[a-z0-9_]+", f.read_text())}


def test_every_documented_metric_name_is_served(ops):
    """A metric the README, docs/ or ops/ names must be on /metrics (declared by a
    `# TYPE` line; histograms by their _bucket/_sum/_count series), so a
    renamed or dropped metric fails here, not in someone's alerting."""
    status, text = http_get(ops.proxy.admin_port, "/metrics")
    assert status == 200
    served = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            served.add(name)
            if kind == "histogram":
                served |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    documented = documented_metric_names()
    assert len(documented) >= 14, documented
    assert documented <= served, f"documented but not served: {sorted(documented - served)}"


def test_more_readers_of_the_same_records_reuse_verdicts_and_spliced_batches(ops):
    """The fixture read the topic once. Two more readers (librdkafka and
    kafka-python, as other consumer groups would) get the same records; the
    validator does not run again (antidote_records_evaluated_total), the
    poison stays out (its batch is resent as spliced the first time), and
    each read still counts as judged and diverted."""
    _, before = http_get(ops.proxy.admin_port, "/metrics")
    evaluated = metric(before, "antidote_records_evaluated_total", policy="ops-geo")
    assert evaluated == 3, before
    ep = Endpoint(ops.proxy.bootstrap, "proxy")
    for read in (ck_consume_assign, kp_consume_assign):
        got = read(ep, ops.topic, [0], 2, timeout=30)
        assert [r.key for r in got] == [b"k1", b"k3"], f"{read.__name__}: {got}"
    _, after = http_get(ops.proxy.admin_port, "/metrics")
    assert metric(after, "antidote_records_evaluated_total", policy="ops-geo") == evaluated, after
    judged = metric(after, "antidote_records_validated_total", topic=ops.topic)
    assert judged >= metric(before, "antidote_records_validated_total", topic=ops.topic) + 6, after
    diverted = metric(after, "antidote_records_invalid_total", topic=ops.topic, action="diverted")
    assert diverted >= metric(before, "antidote_records_invalid_total", topic=ops.topic,
                              action="diverted") + 2, after
    assert metric(after, "antidote_fetch_rewrite_cpu_seconds_total") > 0, after
    # The fixture's first read diverted the poison: its response's hold is
    # split into the proxy's part and the wait for the DLT's acknowledgement.
    for part in ("proxy", "dlt"):
        assert metric(after, "antidote_fetch_diverting_hold_seconds_count", part=part) >= 1, after


# ---------------------------------------------------------------------------
# dlt inspect
# ---------------------------------------------------------------------------

def test_inspect_lists_the_diverted_record_as_a_table(ops):
    out = ok(cli("dlt", "inspect", "--config", str(ops.config), "--topic", ops.dlt))
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["DLT", "PART", "OFFSET", "ORIGIN"], out
    row = next(line for line in lines if f"{ops.topic}-0@1" in line)
    assert "poison" in row and "range:/lat" in row and "ops-geo" in row and "k2" in row, row
    assert lines[-1] == "(1 record)", out
    # Without --topic, every DLT of the configured policies is inspected.
    assert f"{ops.topic}-0@1" in ok(cli("dlt", "inspect", "--config", str(ops.config)))


def test_inspect_json_is_one_object_per_record(ops):
    out = ok(cli("dlt", "inspect", "--config", str(ops.config), "--topic", ops.dlt, "--json"))
    recs = [json.loads(line) for line in out.splitlines()]
    assert len(recs) == 1, out
    r = recs[0]
    assert (r["origin_topic"], r["origin_partition"], r["origin_offset"]) == (ops.topic, 0, 1)
    assert (r["class"], r["rule"], r["policy"], r["key"]) == ("poison", "range:/lat", "ops-geo", "k2")
    assert "90" in r["reason"] and r["failed_at"].endswith("Z")
    assert json.loads(r["value"]) == json.loads(POISON)
    # Filters: a class that is not there selects nothing.
    out = ok(cli("dlt", "inspect", "--config", str(ops.config), "--topic", ops.dlt, "--json",
                 "--class", "stale"))
    assert out == ""
    # Time filters apply to x-failed-at: diverted within the last hour, not before it.
    out = ok(cli("dlt", "inspect", "--config", str(ops.config), "--topic", ops.dlt, "--json",
                 "--since", "1h"))
    assert len(out.splitlines()) == 1, out
    out = ok(cli("dlt", "inspect", "--config", str(ops.config), "--topic", ops.dlt, "--json",
                 "--until", "1h"))
    assert out == ""


def test_inspect_summary_counts_by_class_rule_and_origin_partition(ops):
    out = ok(cli("dlt", "inspect", "--config", str(ops.config), "--topic", ops.dlt,
                 "--summary", "--json"))
    s = json.loads(out)
    assert s["total"] == 1
    assert s["by_class"] == {"poison": 1}
    assert s["by_rule"] == {"range:/lat": 1}
    assert s["by_origin_partition"] == {f"{ops.topic}-0": 1}
    text = ok(cli("dlt", "inspect", "--config", str(ops.config), "--topic", ops.dlt, "--summary"))
    assert text.startswith("1 record\n") and "range:/lat" in text, text


# ---------------------------------------------------------------------------
# dlt replay
# ---------------------------------------------------------------------------

def test_replay_revalidates_dry_runs_replays_once_and_counts_attempts(ops, broker):
    before = read_all(broker.bootstrap, ops.topic)
    assert len(before) == 3
    # The diverted record's DLT offset: 0, or 1 behind a lease marker (on
    # Kafka the DLT lease can start at an epoch above 0, which writes one).
    from poison_support import is_lease_marker
    [dlt_off] = [r.offset for r in read_all(broker.bootstrap, ops.dlt) if not is_lease_marker(r)]

    # The policy the proxy runs with still rejects the record: left alone.
    out = ok(cli("dlt", "replay", "--config", str(ops.config), "--topic", ops.dlt, "--execute"))
    assert "still invalid" in out and "range:/lat" in out, out
    assert len(read_all(broker.bootstrap, ops.topic)) == 3

    # Fixed policy, dry run: says what it would do, writes nothing.
    p = cli("dlt", "replay", "--config", str(ops.fixed_config), "--topic", ops.dlt)
    out = ok(p)
    assert f"would replay      {ops.dlt}/0/{dlt_off} -> {ops.topic}-0" in out, out
    assert "dry run" in p.stderr and "1 would be replayed" in p.stderr, p.stderr
    assert len(read_all(broker.bootstrap, ops.topic)) == 3

    # Fixed policy, --execute: the record appears once, with replay headers.
    p = cli("dlt", "replay", "--config", str(ops.fixed_config), "--topic", ops.dlt, "--execute",
            "--rate", "50")
    out = ok(p)
    after = read_all(broker.bootstrap, ops.topic)
    assert len(after) == 4, after
    # At the record's offset: 3, or 4 behind the ABORT marker that the
    # replay's target lease leaves on Kafka (a control batch takes an offset).
    assert after[3].offset in (3, 4)
    assert f"replayed          {ops.dlt}/0/{dlt_off} -> {ops.topic}-0@{after[3].offset}" in out, out
    new = after[3]
    assert (new.key, new.value) == (b"k2", POISON)
    assert list(new.headers) == [("trace", b"t2"), ("x-request-id", b"r2"),
                                 ("x-replayed-from-dlt", f"{ops.dlt}/0/{dlt_off}".encode()),
                                 ("x-attempt", b"1"),
                                 # the replay frame (issue 28): two replay headers
                                 ("x-antidote-context", b"2 2")], new.headers

    # Again: the DLT coordinate is found in the target, so no second copy.
    out = ok(cli("dlt", "replay", "--config", str(ops.fixed_config), "--topic", ops.dlt,
                 "--execute"))
    assert "already replayed" in out, out
    assert len(read_all(broker.bootstrap, ops.topic)) == 4

    # The replayed copy is still poison under the proxy's policy: consumed
    # through the proxy it is diverted again, carrying x-attempt: 1 ...
    got = ck_consume_assign(Endpoint(ops.proxy.bootstrap, "proxy"), ops.topic, [0], 2, timeout=60)
    assert [r.key for r in got] == [b"k1", b"k3"], got
    recs = dlt_json(ops)
    assert [(r["dlt_offset"], r["origin_offset"], r["attempt"]) for r in recs] == \
        [(dlt_off, 1, 0), (dlt_off + 1, new.offset, 1)]

    # ... so --max-attempts 1 refuses it, and by default it goes out as attempt 2.
    out = ok(cli("dlt", "replay", "--config", str(ops.fixed_config), "--topic", ops.dlt,
                 "--execute", "--max-attempts", "1"))
    assert f"{ops.dlt}/0/{dlt_off + 1}: already replayed 1 times" in out, out
    assert len(read_all(broker.bootstrap, ops.topic)) == 4
    out = ok(cli("dlt", "replay", "--config", str(ops.fixed_config), "--topic", ops.dlt,
                 "--execute", "--from-offset", "3"))
    after = read_all(broker.bootstrap, ops.topic)
    assert len(after) == 5, after
    first = after[3].offset
    assert f"replayed          {ops.dlt}/0/{dlt_off + 1} -> {ops.topic}-0@{after[4].offset} " \
        f"(origin {ops.topic}-0@{first}, attempt 2)" in out, out
    assert dict(after[4].headers)["x-attempt"] == b"2"
    assert dict(after[4].headers)["x-replayed-from-dlt"] == f"{ops.dlt}/0/{dlt_off + 1}".encode()


def dlt_json(ops: Setup, want: int = 2, timeout: float = 15) -> list[dict]:
    """The DLT's records via `dlt inspect --json`, once there are `want` of them."""
    deadline = time.monotonic() + timeout
    while True:
        out = ok(cli("dlt", "inspect", "--config", str(ops.config), "--topic", ops.dlt, "--json"))
        recs = [json.loads(line) for line in out.splitlines()]
        if len(recs) >= want or time.monotonic() > deadline:
            assert len(recs) == want, recs
            return recs
        time.sleep(0.3)


def run_on_a_terminal(*args: str, timeout: float = 60) -> tuple[int, bytes, bytes]:
    """Run antidote with stderr on a pseudo-terminal (120 columns); exit
    code, stdout and everything written to the terminal."""
    import fcntl
    import os
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    try:
        p = subprocess.run([str(ANTIDOTE_BIN), *args], stdout=subprocess.PIPE, stderr=slave,
                           stdin=subprocess.DEVNULL, timeout=timeout)
        os.close(slave)
        slave = -1
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not chunk:
                break
            seen += chunk
        return p.returncode, p.stdout, seen
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)


def test_replay_progress_is_redrawn_in_place_on_a_terminal(ops):
    """On a terminal the progress line is drawn by indicatif (cursor
    control, no stream of lines) and ends as the final count; off a
    terminal (every other test here) it is plain lines."""
    code, out, tty = run_on_a_terminal("dlt", "replay", "--config", str(ops.fixed_config),
                                       "--topic", ops.dlt)
    assert code == 0, (out, tty)
    assert b"\x1b[" in tty, tty
    assert b"replay: " in tty and b"considered" in tty, tty
    plain = cli("dlt", "replay", "--config", str(ops.fixed_config), "--topic", ops.dlt)
    assert "\x1b[" not in plain.stderr and "considered" in plain.stderr, plain.stderr


def test_replay_refuses_a_missing_dead_letter_topic(ops):
    p = cli("dlt", "replay", "--config", str(ops.config), "--topic", f"{ops.topic}.nope")
    assert p.returncode != 0 and "does not exist" in p.stderr, p


# ---------------------------------------------------------------------------
# The dlt commands over TLS (config upstream.tls), with a hand-made DLT record
# ---------------------------------------------------------------------------

def test_dlt_commands_speak_tls_to_the_cluster(workdir, certs):
    """The dlt commands against Kafka's own SSL listener (upstream.tls)."""
    from secure_kafka import SecureKafka
    kafka = SecureKafka(workdir, protocol="SSL", certs=certs).start()
    term_port = kafka.secure_port
    try:
        ep = Endpoint(kafka.secure_bootstrap, "direct", ca=str(certs.ca))
        topic = f"ops-tls-{uuid.uuid4().hex[:8]}"
        dlt = f"{topic}.dlt"
        ck_create_topic(ep, topic, 2)
        ck_create_topic(ep, dlt, 1)
        ck_produce(ep, dlt, [Rec(0, -1, b"k9", b'{"lat": 1}', (
            ("keep", b"me"),
            ("x-original-topic", topic.encode()), ("x-original-partition", b"1"),
            ("x-original-offset", b"17"), ("x-original-timestamp", b"1700000000000"),
            ("x-error-class", b"poison"), ("x-error", b"/lat: 95 is outside [-90, 90]"),
            ("x-error-rule", b"range:/lat"), ("x-policy", b"ops-geo"),
            ("x-failed-at", b"1700000000500")), 1_700_000_000_000)])
        policy = workdir / f"{topic}.policy.yaml"
        policy.write_text(POLICY.format(topic=topic, max_lat=90))
        cfg = OpsAntidote(workdir, upstream=[f"{HOST}:{term_port}"], name=f"ops-tls-{topic}",
                          upstream_tls={"ca": str(certs.ca)}, policy_files=(str(policy),))
        cfg.config_path.write_text(cfg.config_yaml())

        out = ok(cli("dlt", "inspect", "--config", str(cfg.config_path), "--json"))
        recs = [json.loads(line) for line in out.splitlines()]
        assert [(r["dlt_topic"], r["origin_partition"], r["origin_offset"], r["failed_at"])
                for r in recs] == [(dlt, 1, 17, "2023-11-14T22:13:20.500Z")], out

        ok(cli("dlt", "replay", "--config", str(cfg.config_path), "--topic", dlt, "--execute"))
        c = ck.Consumer(ep.ck(**{"group.id": f"ops-{time.monotonic_ns()}",
                                 "auto.offset.reset": "earliest", "enable.auto.commit": False}))
        try:
            c.assign([ck.TopicPartition(topic, 1, ck.OFFSET_BEGINNING)])
            deadline, m = time.monotonic() + 30, None
            while time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is not None and not m.error():
                    break
            assert m is not None and not m.error(), "replayed record not found in partition 1"
            assert (m.key(), m.value()) == (b"k9", b'{"lat": 1}')
            assert m.headers() == [("keep", b"me"), ("x-replayed-from-dlt", f"{dlt}/0/0".encode()),
                                   ("x-attempt", b"1"), ("x-antidote-context", b"2 2")]
        finally:
            c.close()
    finally:
        kafka.stop()
