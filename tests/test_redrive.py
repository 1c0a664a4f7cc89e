"""Re-drive (`dead_letter.redrive`) against the suite's broker (Apache Kafka) with librdkafka.

Two Avro records with Confluent schema ids the policy does not know are
diverted as `unknown`. The schema of one is added to the policy (hot
reload): after the first delay the proxy writes it back by itself, and a
consumer through the proxy gets it exactly once (`x-replayed-from-dlt`,
`x-attempt: 1`). The other stays invalid: it is re-validated once after
each of the three delays and never again, `dlt inspect --json` shows its
attempts, and a proxy restart in the middle neither repeats nor forgets
an attempt (the attempts are markers in the DLT).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

import pytest

import poison_support as ps
from clients import Endpoint, Rec, ck_consume_assign, ck_create_topic, ck_produce
from test_ops import OpsAntidote, cli, ok, read_all
from test_reload_replay import wait_for_log

POLICY = """\
policies:
  - name: redrive-geo
    topics: ["{topic}"]
    value:
      format: avro
      wire: confluent
      schema_ids: {ids}
"""


@dataclass
class RedriveAntidote(OpsAntidote):
    def config_yaml(self) -> str:
        return super().config_yaml() + (
            "dead_letter:\n  redrive:\n    classes: [unknown]\n    delays: [2s, 4s, 6s]\n")


def policy_text(topic: str, ids: list[int]) -> str:
    m = ", ".join(f"{i}: {ps.AVSC}" for i in ids)
    return POLICY.format(topic=topic, ids="{" + m + "}")


def value(schema_id: int, i: int) -> bytes:
    return ps.confluent(schema_id, ps.avro_datum(ps.trigger(i)))


def attempts(proxy, dlt: str) -> dict[bytes, list[tuple[int, str]]]:
    out = ok(cli("dlt", "inspect", "--config", str(proxy.config_path), "--topic", dlt, "--json"))
    recs = [json.loads(ln) for ln in out.splitlines() if ln.strip()]
    return {r["key"]: [(a["attempt"], a["outcome"]) for a in r["redrive_attempts"]] for r in recs}


def wait_attempts(proxy, dlt: str, key: str, n: int, timeout: float = 25) -> list:
    deadline = time.monotonic() + timeout
    while True:
        got = attempts(proxy, dlt).get(key, [])
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


@pytest.fixture
def redrive(workdir, broker):
    topic = f"redrive-{uuid.uuid4().hex[:8]}"
    ck_create_topic(Endpoint(broker.bootstrap), topic, 1)
    policy = workdir / f"{topic}.yaml"
    policy.write_text(policy_text(topic, [1]))
    proxy = RedriveAntidote(workdir, upstream=[broker.bootstrap], policy_files=(str(policy),),
                            name=f"redrive-{topic}")
    proxy.start()
    try:
        yield proxy, topic, policy, broker
    finally:
        proxy.stop_and_check()


def test_unknown_records_are_redriven_once_each_delay_and_never_again(redrive):
    proxy, topic, policy, broker = redrive
    dlt = f"{topic}.dlt"
    ck_produce(Endpoint(broker.bootstrap), topic, [
        Rec(0, -1, b"v", value(1, 1), (), None),
        Rec(0, -1, b"fixed", value(2, 2), (), None),
        Rec(0, -1, b"never", value(3, 3), (), None),
    ])
    via = Endpoint(proxy.bootstrap, "proxy")
    got = ck_consume_assign(via, topic, [0], 1, timeout=30)
    assert [r.key for r in got] == [b"v"]
    # The schema of id 2 appears (a producer's deployment): add it.
    policy.write_text(policy_text(topic, [1, 2]))
    wait_for_log(proxy, "policies reloaded")
    # After the first delay the proxy writes `fixed` back by itself.
    got = ck_consume_assign(via, topic, [0], 10, timeout=20,
                            until=lambda rs: b"fixed" in [r.key for r in rs])
    assert [r.key for r in got] == [b"v", b"fixed"], got
    h = dict(got[1].headers)
    # Its DLT coordinate (after the writer's lease marker).
    [fixed_at] = [r.offset for r in ps.without_markers(read_all(broker.bootstrap, dlt))
                  if r.key == b"fixed"]
    assert h["x-replayed-from-dlt"] == f"{dlt}/0/{fixed_at}".encode() and h["x-attempt"] == b"1", h

    # `never` stays invalid: one attempt per delay. Restart after the first.
    assert wait_attempts(proxy, dlt, "never", 1) == [(1, "still-invalid")]
    proxy.stop_and_check()
    proxy.start()
    assert wait_attempts(proxy, dlt, "never", 3) == [
        (1, "still-invalid"), (2, "still-invalid"), (3, "still-invalid")]
    time.sleep(3)  # past the last delay: nothing more happens
    a = attempts(proxy, dlt)
    assert a["never"] == [(1, "still-invalid"), (2, "still-invalid"), (3, "still-invalid")], a
    assert a["fixed"] == [(1, "redriven")], a
    # Exactly one copy written back, in all.
    back = [r for r in read_all(broker.bootstrap, topic) if "x-replayed-from-dlt" in dict(r.headers)]
    assert [r.key for r in back] == [b"fixed"], back
