"""The diversion circuit breaker (`breaker:` of a policy, issue 33) against
the suite's broker with librdkafka.

A partition that turns 100 % invalid half-way trips the breaker near its
threshold: a few records are diverted, then the partition holds at the
next one while another partition flows; the same stream without a breaker
diverts everything. A reload with a fixed policy releases every held
record once, in order, and what was diverted stays diverted. Sporadic
poison (0.1 %) never trips a 5 % breaker."""

from __future__ import annotations

import json
import time
import uuid

import clients as c
import poison_support as ps
from harness import free_port
from test_ops import OpsAntidote, http_get, metric
from test_reload_replay import wait_for_log

POLICY = """\
policies:
  - name: brk
    topics: ["{topic}"]
    value:
      format: json
    rules:
      - field: /lat
        min: -90
        max: {max_lat}
{breaker}"""
BREAKER = "    breaker: {{ max_ratio: 0.05, over: 1000, min_diverted: {min_diverted} }}\n"


def _rec(p: int, i: int, lat: float) -> c.Rec:
    return c.Rec(p, -1, b"k%d" % i, json.dumps({"lat": lat, "i": i}).encode(), (),
                 1_700_000_000_000 + i)


def _setup(workdir, broker, broker_endpoint, tag, min_diverted=20, breaker=True):
    topic = f"brk-{tag}-{uuid.uuid4().hex[:8]}"
    c.ck_create_topic(broker_endpoint, topic, 2)
    c.ck_create_topic(broker_endpoint, f"{topic}.dlt", 1)
    policy = workdir / f"{topic}.policy.yaml"
    text = POLICY.format(topic=topic, max_lat=90,
                         breaker=BREAKER.format(min_diverted=min_diverted) if breaker else "")
    policy.write_text(text)
    proxy = OpsAntidote(workdir, upstream=[broker.bootstrap], name=f"brk-{topic}",
                        policy_files=(str(policy),), admin_port=free_port())
    import conftest
    conftest._PROXIES.append(proxy)
    return topic, policy, proxy.start()


def _offsets(recs):
    return [r.offset for r in recs]


def _diverted(ep, dlt):
    """Origin offsets of the diversions in `dlt` (markers left out)."""
    recs = ps.read_dlt(ep, dlt, settle=0.5)
    return sorted(int(ps.hdict(r)["x-original-offset"]) for r in recs
                  if "x-original-offset" in ps.hdict(r))


def test_a_stream_turning_invalid_trips_the_breaker_holds_and_a_fixed_policy_releases_it(
        workdir, broker, broker_endpoint):
    topic, policy, proxy = _setup(workdir, broker, broker_endpoint, "trip")
    try:
        c.ck_produce(broker_endpoint, topic,
                     [_rec(0, i, 10) for i in range(500)] + [_rec(0, i, 95) for i in range(500, 1000)]
                     + [_rec(1, i, 10) for i in range(200)])
        ep = c.Endpoint(proxy.bootstrap, "proxy")
        # Partition 1 flows whole; partition 0 delivers its 500 valid records.
        assert _offsets(c.ck_consume_assign(ep, topic, [1], 200, timeout=60)) == list(range(200))
        got = c.ck_consume_assign(ep, topic, [0], 500, timeout=60)
        assert _offsets(got) == list(range(500))
        time.sleep(2)  # the consumer keeps fetching at the held record
        diverted = _diverted(broker_endpoint, f"{topic}.dlt")
        # Trips at the n-th poison record where n >= 20 and n / (500 + n) > 5 %:
        # n = 27, so 26 are diverted, offsets 500-525, and 526 is held.
        assert diverted == list(range(500, 526)), diverted
        text = http_get(proxy.admin_port, "/metrics")[1]
        assert metric(text, "antidote_breaker_open", topic=topic, partition="0") == 1, text
        assert metric(text, "antidote_breaker_trips_total", topic=topic) == 1, text
        assert metric(text, "antidote_breaker_open", topic=topic, partition="1") == 0
        assert "diversion circuit breaker open" in proxy.log.read_text()
        # The policy was too strict: fixed, every held record is released
        # once, in order; the diverted ones stay in the DLT.
        policy.write_text(POLICY.format(topic=topic, max_lat=100, breaker=BREAKER.format(
            min_diverted=20)))
        wait_for_log(proxy, "policies reloaded")
        got = c.ck_consume_assign(ep, topic, [0], 974, timeout=60)
        assert _offsets(got) == list(range(500)) + list(range(526, 1000))
        assert _diverted(broker_endpoint, f"{topic}.dlt") == list(range(500, 526))
    finally:
        proxy.stop_and_check()


def test_without_a_breaker_the_same_stream_is_diverted_whole(workdir, broker, broker_endpoint):
    topic, _, proxy = _setup(workdir, broker, broker_endpoint, "off", breaker=False)
    try:
        c.ck_produce(broker_endpoint, topic,
                     [_rec(0, i, 10) for i in range(500)] + [_rec(0, i, 95) for i in range(500, 1000)]
                     + [_rec(0, 1000, 10)])
        ep = c.Endpoint(proxy.bootstrap, "proxy")
        got = c.ck_consume_assign(ep, topic, [0], 501, timeout=60)
        assert _offsets(got) == list(range(500)) + [1000]
        assert _diverted(broker_endpoint, f"{topic}.dlt") == list(range(500, 1000))
    finally:
        proxy.stop_and_check()


def test_sporadic_poison_never_trips_a_five_per_cent_breaker(workdir, broker, broker_endpoint):
    topic, _, proxy = _setup(workdir, broker, broker_endpoint, "rare", min_diverted=50)
    try:
        recs = [_rec(0, i, 95 if i % 1000 == 999 else 10) for i in range(3000)]
        c.ck_produce(broker_endpoint, topic, recs)
        ep = c.Endpoint(proxy.bootstrap, "proxy")
        got = c.ck_consume_assign(ep, topic, [0], 2997, timeout=60)
        assert _offsets(got) == [i for i in range(3000) if i % 1000 != 999]
        assert _diverted(broker_endpoint, f"{topic}.dlt") == [999, 1999, 2999]
        text = http_get(proxy.admin_port, "/metrics")[1]
        assert metric(text, "antidote_breaker_trips_total", topic=topic) == 0
    finally:
        proxy.stop_and_check()


def test_two_instances_agree_through_the_marker_and_divert_through_reopens_after_it(
        workdir, broker, broker_endpoint):
    from test_ops import cli, ok
    topic, policy, a = _setup(workdir, broker, broker_endpoint, "fleet")
    # Its config in a directory of its own: a new .yaml beside A's policy
    # file would be a reload for A.
    (workdir / f"b-{topic}").mkdir()
    b = OpsAntidote(workdir / f"b-{topic}", upstream=[broker.bootstrap], name=f"brk-b-{topic}",
                    policy_files=(str(policy),), admin_port=free_port())
    import conftest
    conftest._PROXIES.append(b)
    b.start()
    dlt = f"{topic}.dlt"

    def diverted():
        return _diverted(broker_endpoint, dlt)
    try:
        c.ck_produce(broker_endpoint, topic,
                     [_rec(0, i, 10) for i in range(500)] + [_rec(0, i, 95) for i in range(500, 1000)])
        got = c.ck_consume_assign(c.Endpoint(a.bootstrap, "proxy"), topic, [0], 500, timeout=60)
        assert _offsets(got) == list(range(500))
        time.sleep(2)  # A's follower writes the open marker; B's reads it
        assert diverted() == list(range(500, 526))
        # B holds at the same record: on its own it would divert 526-551.
        got = c.ck_consume_assign(c.Endpoint(b.bootstrap, "proxy"), topic, [0], 500, timeout=60)
        assert _offsets(got) == list(range(500))
        time.sleep(1)
        assert diverted() == list(range(500, 526))
        text = http_get(b.admin_port, "/metrics")[1]
        assert metric(text, "antidote_breaker_open", topic=topic, partition="0") == 1, text
        # The producer was at fault: accept the diversions through 700.
        out = ok(cli("breaker", "close", "--config", str(a.config_path), "--topic", topic,
                     "--partition", "0", "--divert-through", "700"))
        assert "diversions accepted through offset 700" in out, out
        time.sleep(1.5)  # both followers read the close marker
        got = c.ck_consume_assign(c.Endpoint(a.bootstrap, "proxy"), topic, [0], 500, timeout=60)
        assert _offsets(got) == list(range(500))
        time.sleep(2)
        # Re-armed after 700: it trips again at the 20th new poison record.
        assert diverted() == list(range(500, 720))
        text = http_get(a.admin_port, "/metrics")[1]
        assert metric(text, "antidote_breaker_open", topic=topic, partition="0") == 1, text
        # `dlt inspect --summary` lists the trips and the close, in order.
        out = ok(cli("dlt", "inspect", "--config", str(a.config_path), "--topic", dlt,
                     "--summary"))
        events = [line.split() for line in out.splitlines() if line.startswith(f"{topic}-0")]
        assert [(e[1], e[-1]) for e in events] == [("tripped", "526"), ("closed", "700"),
                                                   ("tripped", "720")], out
    finally:
        a.stop_and_check()
        b.stop_and_check()
