"""Hot reload and the replay round trip, against a real broker.

A record is diverted under a strict policy; the policy file is fixed and the
running proxy reloads it; the record is replayed from its DLT with
`antidote dlt replay`; a consumer through the proxy then receives it exactly
once (the replayed copy: the original stays out, since it was diverted).
Also: a policy file that does not compile is rejected on reload with its
file:line:column, and the running policies stay in force; SIGHUP reloads.
"""

from __future__ import annotations

import signal
import time
import uuid

import pytest

from clients import Endpoint, Rec, ck_consume_assign, ck_create_topic, ck_produce
from test_ops import POLICY, OpsAntidote, cli, ok, read_all


def log_text(proxy) -> str:
    return proxy.log.read_text(errors="replace")


def wait_for_log(proxy, text: str, count: int = 1, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log_text(proxy).count(text) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not logged {count}x within {timeout}s\n{log_text(proxy)[-3000:]}")


@pytest.fixture
def strict(workdir, broker):
    topic = f"reload-{uuid.uuid4().hex[:8]}"
    ck_create_topic(Endpoint(broker.bootstrap), topic, 1)
    policy = workdir / f"{topic}.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    proxy = OpsAntidote(workdir, upstream=[broker.bootstrap], policy_files=(str(policy),),
                        name=f"reload-{topic}")
    proxy.start()
    try:
        yield proxy, topic, policy, broker
    finally:
        proxy.stop_and_check()


def test_a_fixed_policy_and_a_replay_deliver_the_record_exactly_once(strict):
    proxy, topic, policy, broker = strict
    direct = Endpoint(broker.bootstrap)
    ck_produce(direct, topic, [
        Rec(0, -1, b"a", b'{"lat": 10}', (), 1_700_000_000_001),
        Rec(0, -1, b"b", b'{"lat": 95}', (("trace", b"t"),), 1_700_000_000_002),
        Rec(0, -1, b"c", b'{"lat": 20}', (), 1_700_000_000_003),
    ])
    got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 2, timeout=60)
    assert [r.key for r in got] == [b"a", b"c"]
    assert [r.key for r in read_all(broker.bootstrap, f"{topic}.dlt")] == [b"b"]

    # Fix the policy (lat up to 100): the running proxy reloads it by itself.
    policy.write_text(POLICY.format(topic=topic, max_lat=100))
    wait_for_log(proxy, "policies reloaded")

    out = ok(cli("dlt", "replay", "--config", str(proxy.config_path),
                 "--topic", f"{topic}.dlt", "--execute"))
    assert "1" in out, out
    # Through the proxy, from the start: the original (diverted) record stays
    # out, the replayed copy comes in once, after the others.
    got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 3, timeout=60)
    assert [r.key for r in got] == [b"a", b"c", b"b"], got
    replayed = dict(got[2].headers)
    assert replayed["x-replayed-from-dlt"] == f"{topic}.dlt/0/0".encode()
    assert replayed["x-attempt"] == b"1" and replayed["trace"] == b"t"
    # Replaying again adds nothing.
    ok(cli("dlt", "replay", "--config", str(proxy.config_path), "--topic", f"{topic}.dlt", "--execute"))
    assert [r.key for r in read_all(broker.bootstrap, topic)] == [b"a", b"b", b"c", b"b"]


def test_a_policy_that_does_not_compile_is_rejected_and_the_old_one_stays(strict):
    proxy, topic, policy, broker = strict
    policy.write_text(POLICY.format(topic=topic, max_lat=90) + "    bogus_key: 1\n")
    wait_for_log(proxy, "policy reload rejected")
    assert f"{policy}:" in log_text(proxy) and "bogus_key" in log_text(proxy)
    ck_produce(Endpoint(broker.bootstrap), topic, [Rec(0, -1, b"p", b'{"lat": 95}', (), 1_700_000_000_001),
                                                   Rec(0, -1, b"v", b'{"lat": 5}', (), 1_700_000_000_002)])
    got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 1, timeout=60)
    assert [r.key for r in got] == [b"v"], "the running policy should still divert lat 95"


def test_sighup_reloads_the_policies(strict):
    proxy, topic, policy, broker = strict
    proxy.proc.send_signal(signal.SIGHUP)
    wait_for_log(proxy, "policies reloaded")
    assert "SIGHUP" in log_text(proxy)
    proxy.assert_running()
