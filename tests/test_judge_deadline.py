"""The judging deadline (`limits.judge_deadline`) against Apache Kafka.

Past the deadline a Fetch response's policy partitions end before their
next batch still to judge (never before their first), the rest is judged
in the background into the verdict cache, and the client fetches it again
(src/intercept/fetch/parallel.rs `judge_behind`). With a deadline of 0 every
response is cut after the first batch of each partition that needs judging,
so every client here reads a partition through a cut response each time
its fetch reaches batches not judged yet.

Each client (librdkafka, kafka-python, the Java consumer) reads its own
topic of 3 partitions x 1,500 JSON records (~470 KB each) in ~16 KiB
batches, poison among them (in a partition's first batch too), through one
proxy, fetching at most 64 KiB per partition: each response ends in batches
the previous one did not hold, so nearly every response is cut. Each must get
exactly the valid records, in order, once, and reach the end of every
partition; the poison must be in the DLT once; every record must be
validated exactly once (background verdicts are used, never judged again);
and responses must have been cut and judged behind.
"""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest

import clients as c
import harness as h
import poison_support as ps
from test_java_clients import java_classes, records, run_java  # noqa: F401 (fixture)
from test_ops import OpsAntidote, http_get

pytestmark = h.needs_kafka

PARTITIONS = 3
PER_PARTITION = 1500
PAD = "x" * 280
FETCH_BYTES = 64 * 1024

POLICY = """\
policies:
""" + "".join(f"""\
  - name: deadline-{client}
    topics: ["deadline-{client}-*"]
    value: {{ format: json }}
    rules:
      - field: /lat
        min: -90
        max: 90
    on_invalid: divert
""" for client in ("ck", "kp", "java"))


def is_poison(i: int) -> bool:
    return i % 211 == 3


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, broker):
    d = tmp_path_factory.mktemp("deadline")
    (d / "deadline.yaml").write_text(POLICY)
    p = OpsAntidote(d, upstream=[broker.bootstrap], policy_files=(str(d / "deadline.yaml"),),
                    admin_port=h.free_port(), name="antidote-deadline",
                    extra_yaml="limits:\n  judge_deadline: 0ms\n")
    import conftest
    conftest._PROXIES.append(p)
    p.start().wait_ready()
    yield p
    p.stop_and_check()


def produce(broker_endpoint, client: str) -> tuple[str, list[c.Rec]]:
    """A new topic of the client's policy; its records with the offsets they
    landed at, in the log's order. That is the order a client must read
    them in; it is the order they were sent in only if no producer batch
    was retried past a later one (CI at e755cc1 read a partition's keys
    49-97 before 0-48, in offset order: the producer's doing)."""
    topic = f"deadline-{client}-{uuid.uuid4().hex[:8]}"
    c.ck_create_topic(broker_endpoint, topic, PARTITIONS)
    recs = [c.Rec(p, -1, f"k{p}-{i}".encode(),
                  json.dumps({"lat": 95 if is_poison(i) else i % 90, "id": i,
                              "pad": PAD}).encode(), (), 1_700_000_000_000 + i)
            for p in range(PARTITIONS) for i in range(PER_PARTITION)]
    landed = c.ck_produce(broker_endpoint, topic, recs, timeout=60,
                          **{"batch.size": 16384, "linger.ms": 50})
    placed = [dataclasses.replace(r, partition=p, offset=o) for r, (p, o) in zip(recs, landed)]
    return topic, sorted(placed, key=lambda r: (r.partition, r.offset))


def consume(client: str, proxy, topic: str, n: int, classes) -> list[tuple[int, int, bytes]]:
    """(partition, offset, key) of what `client` reads through the proxy."""
    ep = c.Endpoint(proxy.bootstrap, "proxy")
    parts = list(range(PARTITIONS))
    if client == "ck":
        got = c.ck_consume_assign(ep, topic, parts, n, timeout=90,
                                  **{"max.partition.fetch.bytes": FETCH_BYTES})
    elif client == "kp":
        got = c.kp_consume_assign(ep, topic, parts, n, timeout=90,
                                  max_partition_fetch_bytes=FETCH_BYTES)
    else:
        out = run_java(classes, "JavaConsumer", "assign", proxy.bootstrap, topic,
                       str(PARTITIONS), f"java-{uuid.uuid4().hex[:8]}", "90000",
                       "read_uncommitted", str(FETCH_BYTES))
        [ends] = [x for x in out if "end" in x]
        assert ends["position"] == ends["end"], ends
        return [(p, o, k) for p, o, k, _ in records(out)]
    return [(r.partition, r.offset, r.key) for r in got]


def ascending_runs(offsets: list[int]) -> list[tuple[int, int]]:
    """`offsets` as (first, last) runs of rising offsets: one run for a
    partition read in order, whatever the gaps (poison) in it."""
    runs: list[tuple[int, int]] = []
    for o in offsets:
        if runs and o > runs[-1][1]:
            runs[-1] = (runs[-1][0], o)
        else:
            runs.append((o, o))
    return runs


@pytest.mark.parametrize("client", ["ck", "kp", "java"])
def test_responses_cut_at_the_deadline_deliver_every_valid_record_once_in_order(
        client, proxy, broker_endpoint, java_classes):  # noqa: F811
    topic, recs = produce(broker_endpoint, client)
    _, before = http_get(proxy.admin_port, "/metrics")
    valid = [r for r in recs if not is_poison(int(json.loads(r.value)["id"]))]
    poison = [r for r in recs if is_poison(int(json.loads(r.value)["id"]))]
    got = consume(client, proxy, topic, len(valid), java_classes)
    by_part = {p: [(o, k) for q, o, k in got if q == p] for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        want_keys = [r.key for r in valid if r.partition == p]
        assert [k for _, k in by_part[p]] == want_keys, \
            f"partition {p}: {len(by_part[p])} of {len(want_keys)} records, " \
            f"{len(by_part[p]) - len(set(by_part[p]))} repeated; offsets read in runs " \
            f"{ascending_runs([o for o, _ in by_part[p]])}"
        offsets = [o for o, _ in by_part[p]]
        assert offsets == [r.offset for r in valid if r.partition == p]
    dlt = ps.read_dlt(broker_endpoint, f"{topic}.dlt")
    assert sorted(r.key for r in dlt) == sorted(r.key for r in poison)
    _, text = http_get(proxy.admin_port, "/metrics")
    # Every record validated once: what was judged behind a cut was used by
    # the next fetch, never judged again.
    assert h.metric(text, "antidote_records_evaluated_total",
                    policy=f"deadline-{client}") == len(recs), text
    def grew(name):
        return h.metric(text, name) - h.metric(before, name)
    # ~470 KB per partition, 64 KiB per fetch: at least 6 cut responses each.
    cuts = grew("antidote_fetch_deadline_cuts_total")
    assert cuts >= 6 * PARTITIONS, f"{cuts} cuts"
    assert grew("antidote_fetch_judged_ahead_records_total") > 0, text
    proxy.assert_running()
