"""`antidote check --connect` against the suite's broker: it reports each
dead-letter topic whose configuration can break a promise (retention shorter
than its origin's, a cleanup policy other than delete) and stays quiet about
one configured as the proxy creates them (issue 32)."""

from __future__ import annotations

import uuid

from confluent_kafka.admin import AdminClient, NewTopic

import clients as c
from harness import free_port
from test_ops import POLICY, OpsAntidote, cli, ok


def _create(ep: c.Endpoint, name: str, config: dict) -> None:
    admin = AdminClient(ep.ck())
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(30)
    c.wait_topic_visible(ep, name, 1, 30)


def test_check_connect_reports_dlts_that_break_a_promise(workdir, broker, broker_endpoint):
    good = f"chk-good-{uuid.uuid4().hex[:8]}"
    bad = f"chk-bad-{uuid.uuid4().hex[:8]}"
    week = str(7 * 24 * 3600 * 1000)
    for t in (good, bad):
        _create(broker_endpoint, t, {"retention.ms": week})
    _create(broker_endpoint, f"{good}.dlt", {"retention.ms": "-1"})
    _create(broker_endpoint, f"{bad}.dlt", {"retention.ms": str(3600 * 1000),
                                            "cleanup.policy": "compact"})
    policy = workdir / f"{bad}.policy.yaml"
    policy.write_text(POLICY.format(topic="chk-*", max_lat=90))
    cfg = OpsAntidote(workdir, upstream=[broker.bootstrap], name=f"chk-{bad}",
                      policy_files=(str(policy),), admin_port=free_port())
    cfg.config_path.write_text(cfg.config_yaml())
    r = cli("check", "--config", str(cfg.config_path), "--connect")
    ok(r)
    warnings = [line for line in r.stderr.splitlines() if "dead-letter topic" in line]
    mine = [w for w in warnings if good in w or bad in w]
    assert any(f"{bad}.dlt: retention.ms 3600000 is shorter than {bad}'s {week}" in w
               for w in mine), r.stderr
    assert any(f"{bad}.dlt: cleanup.policy is compact" in w for w in mine), r.stderr
    assert not [w for w in mine if f"{good}.dlt" in w], r.stderr
