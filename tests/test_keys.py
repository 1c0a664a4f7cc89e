"""Per-key ordering (`ordering: per_key`) against the suite's broker (Apache Kafka) with librdkafka (and
kafka-python for the spliced partition).

A partition holding A1 (poison), B1, A2, C1, A3 delivers B1 and C1 only, and
the DLT holds A1, A2, A3 in order (poison, then blocked with `x-blocked-by`);
keys of another partition are unaffected. A proxy restart keeps A blocked
(A4, produced after it, is diverted too: the blocked keys are read back from
the DLT). `dlt replay` of A before the policy is fixed replays nothing (a
key's records go together or not at all); after the fix it writes A1..A4
back in order and releases A, so A5 is delivered. `dlt discard` releases a
key without replaying it.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from clients import (Endpoint, Rec, ck_consume_assign, ck_create_topic, ck_produce,
                     kp_consume_assign)
from harness import HOST, free_port
from test_ops import OpsAntidote, cli, ok, read_all
from test_reload_replay import replay_counts, wait_for_log

POLICY = """\
policies:
  - name: keys-geo
    topics: ["{topic}"]
    value:
      format: json
    rules:
      - field: /lat
        min: -90
        max: {max_lat}
    ordering: per_key
"""


def rec(partition: int, key: str, tag: str, lat: float = 10) -> Rec:
    return Rec(partition, -1, key.encode(), json.dumps({"lat": lat, "id": tag}).encode(), (),
               1_700_000_000_000)


def tags(recs) -> list[str]:
    return [json.loads(r.value)["id"] for r in recs]


def wait_dlt(bootstrap: str, dlt: str, n: int, timeout: float = 20) -> list[Rec]:
    deadline = time.monotonic() + timeout
    while True:
        got = [r for r in read_all(bootstrap, dlt) if "x-antidote-marker" not in dict(r.headers)]
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def metric(proxy, name: str) -> float:
    import urllib.request
    with urllib.request.urlopen(f"http://{HOST}:{proxy.admin_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + " ")
               or ln.startswith(name + "{"))


def wait_metric(proxy, name: str, want: float, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while metric(proxy, name) != want:
        assert time.monotonic() < deadline, f"{name} != {want}: {metric(proxy, name)}"
        time.sleep(0.2)


def through_proxy(proxy, topic: str, partition: int, last_tag: str) -> list[str]:
    """Tags delivered through the proxy from the start, up to `last_tag`."""
    got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [partition], 10_000,
                            timeout=40, until=lambda rs: last_tag in tags(rs))
    return tags(got)


@pytest.fixture
def keyed(workdir, broker):
    topic = f"keys-{uuid.uuid4().hex[:8]}"
    ck_create_topic(Endpoint(broker.bootstrap), topic, 2)
    policy = workdir / f"{topic}.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    proxy = OpsAntidote(workdir, upstream=[broker.bootstrap], policy_files=(str(policy),),
                        name=f"keys-{topic}", admin_port=free_port())
    proxy.start()
    try:
        yield proxy, topic, policy, broker
    finally:
        proxy.stop_and_check()


def test_a_diverted_record_blocks_its_key_across_restarts_until_replayed(keyed):
    proxy, topic, policy, broker = keyed
    direct = Endpoint(broker.bootstrap)
    dlt = f"{topic}.dlt"
    ck_produce(direct, topic, [rec(0, "A", "A1", lat=95), rec(0, "B", "B1"), rec(0, "A", "A2"),
                               rec(0, "C", "C1"), rec(0, "A", "A3"),
                               rec(1, "A", "A-p1"), rec(1, "D", "D1")])
    assert through_proxy(proxy, topic, 0, "C1") == ["B1", "C1"]
    # kafka-python (which checks CRCs and batch lengths) reads the same.
    kp = kp_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 2, timeout=30)
    assert tags(kp) == ["B1", "C1"]
    # Another partition: key A flows there.
    assert through_proxy(proxy, topic, 1, "D1") == ["A-p1", "D1"]
    parked = wait_dlt(broker.bootstrap, dlt, 3)
    assert tags(parked) == ["A1", "A2", "A3"], parked
    h = [dict(r.headers) for r in parked]
    assert [x["x-error-class"] for x in h] == [b"poison", b"blocked", b"blocked"]
    assert [x["x-error-rule"] for x in h][1:] == [b"key", b"key"]
    assert "x-blocked-by" not in h[0]
    assert [x["x-blocked-by"] for x in h[1:]] == [b"0", b"0"]

    # Restart: A stays blocked (read back from the DLT), so A4 is parked too.
    proxy.stop_and_check()
    proxy.start()
    ck_produce(direct, topic, [rec(0, "A", "A4"), rec(0, "E", "E1")])
    assert through_proxy(proxy, topic, 0, "E1") == ["B1", "C1", "E1"]
    parked = wait_dlt(broker.bootstrap, dlt, 4)
    assert tags(parked) == ["A1", "A2", "A3", "A4"]
    assert dict(parked[3].headers)["x-blocked-by"] == b"0"

    # Replay before the fix: A1 is still invalid, so nothing of A is replayed.
    args = ("dlt", "replay", "--config", str(proxy.config_path), "--topic", dlt, "--key", "A",
            "--execute")
    r = cli(*args)
    out = ok(r) + r.stderr
    assert replay_counts(out)["replayed"] == 0 and out.count("held back") == 4, out

    # Fix the policy; replay A: A1..A4 come back in order, and A is released.
    policy.write_text(POLICY.format(topic=topic, max_lat=100))
    wait_for_log(proxy, "policies reloaded")
    r = cli(*args)
    out = ok(r) + r.stderr
    assert replay_counts(out)["replayed"] == 4, out
    assert "released          key A" in out, out
    ck_produce(direct, topic, [rec(0, "A", "A5")])
    assert through_proxy(proxy, topic, 0, "A5") == ["B1", "C1", "E1", "A1", "A2", "A3", "A4", "A5"]
    # Still released after a restart (the release marker is in the DLT).
    proxy.stop_and_check()
    proxy.start()
    ck_produce(direct, topic, [rec(0, "A", "A6")])
    assert through_proxy(proxy, topic, 0, "A6")[-2:] == ["A5", "A6"]


def test_discard_releases_a_key_without_replaying_it(keyed):
    proxy, topic, policy, broker = keyed
    direct = Endpoint(broker.bootstrap)
    dlt = f"{topic}.dlt"
    ck_produce(direct, topic, [rec(0, "K", "K1", lat=95), rec(0, "K", "K2"), rec(0, "B", "B1")])
    assert through_proxy(proxy, topic, 0, "B1") == ["B1"]
    assert tags(wait_dlt(broker.bootstrap, dlt, 2)) == ["K1", "K2"]
    wait_metric(proxy, "antidote_blocked_keys", 1)
    assert metric(proxy, "antidote_blocked_key_oldest_age_seconds") > 0
    base = ("dlt", "discard", "--config", str(proxy.config_path), "--topic", dlt, "--key", "K")
    assert "would discard     key K" in ok(cli(*base))
    assert "discarded         key K" in ok(cli(*base, "--execute"))
    # The proxy reads the marker from the DLT and releases K.
    wait_metric(proxy, "antidote_blocked_keys", 0)
    ck_produce(direct, topic, [rec(0, "K", "K3")])
    assert through_proxy(proxy, topic, 0, "K3") == ["B1", "K3"]
    # Nothing of K was written back.
    assert tags(read_all(broker.bootstrap, topic)) == ["K1", "K2", "B1", "K3"]
