"""Nobody can forge what antidote reads back from its DLTs (issue 28).

Against the suite's broker with librdkafka (and kafka-python for a second
reader): a producer of a policy topic that dresses a poison record in
antidote's own header names hides nothing, after a restart or in a second
instance; its forged class and attempt headers do not steer `dlt replay`,
which restores the original headers exactly; a direct writer of the DLT
hides nothing when signing keys are set, and its records are counted in
antidote_dlt_records_refused_total."""

from __future__ import annotations

import json
import time
import uuid

import clients as c
from harness import free_port
import poison_support as ps
from test_ops import POLICY, OpsAntidote, cli, http_get, metric, ok

KEY = "an-antidote-fleet-signing-key-0001"


def _ids(recs):
    return [r.offset for r in recs]


def _setup(workdir, broker_endpoint, tag, max_lat=90):
    topic = f"trust-{tag}-{uuid.uuid4().hex[:8]}"
    for t in (topic, f"{topic}.dlt"):
        c.ck_create_topic(broker_endpoint, t, 1)
    policy = workdir / f"{topic}.policy.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=max_lat))
    return topic, policy


def _proxy(workdir, broker, topic, policy, name, keys_file=None):
    extra = ""
    if keys_file:
        extra = f"dead_letter:\n  signing_keys:\n    - file: {keys_file}\n"
    p = OpsAntidote(workdir, upstream=[broker.bootstrap], name=name, policy_files=(str(policy),),
                    admin_port=free_port(), extra_yaml=extra)
    import conftest
    conftest._PROXIES.append(p)
    return p


def _valid(i):
    return json.dumps({"lat": 10 + i, "id": f"v{i}"}).encode()


POISON = b'{"lat": 95, "id": "p"}'


def _diversions(broker_endpoint, dlt):
    """Records of the DLT that carry antidote's frame and name an origin."""
    got = ps.read_dlt(broker_endpoint, dlt)
    return [r for r in got if r.headers and r.headers[-1][0] in
            ("x-antidote-context", "x-antidote-signature")
            and any(k == "x-original-offset" for k, _ in r.headers)]


def test_a_producer_forged_origin_hides_no_valid_record_after_a_restart_or_in_a_second_instance(
        workdir, broker, broker_endpoint):
    topic, policy = _setup(workdir, broker_endpoint, "origin")
    forged = (("x-original-topic", topic.encode()), ("x-original-partition", b"0"),
              ("x-original-offset", b"2"), ("x-error-class", b"stale"))
    recs = [c.Rec(0, -1, b"k%d" % i, _valid(i), (), 1_700_000_000_000 + i) for i in range(4)]
    recs.append(c.Rec(0, -1, b"k4", POISON, forged, 1_700_000_000_004))
    recs.append(c.Rec(0, -1, b"k5", _valid(5), (), 1_700_000_000_005))
    c.ck_produce(broker_endpoint, topic, recs)
    want = [0, 1, 2, 3, 5]

    first = _proxy(workdir, broker, topic, policy, f"trust-a-{topic}").start()
    try:
        got = c.ck_consume_assign(c.Endpoint(first.bootstrap, "proxy"), topic, [0], 5, timeout=60)
        assert _ids(got) == want
    finally:
        first.stop_and_check()
    (d,) = _diversions(broker_endpoint, f"{topic}.dlt")
    # The producer's headers first, untouched; antidote's context after them.
    assert d.headers[:4] == forged
    ctx = dict(d.headers[4:-1])
    assert ctx["x-original-offset"] == b"4" and ctx["x-error-class"] == b"poison"

    # A restart and a second instance beside it rebuild their ledgers from
    # the DLT: offset 2 is delivered by both, offset 4 is not written again.
    second = _proxy(workdir, broker, topic, policy, f"trust-b-{topic}").start()
    third = _proxy(workdir, broker, topic, policy, f"trust-c-{topic}").start()
    try:
        for p in (second, third):
            ep = c.Endpoint(p.bootstrap, "proxy")
            assert _ids(c.ck_consume_assign(ep, topic, [0], 5, timeout=60)) == want
            assert _ids(c.kp_consume_assign(ep, topic, [0], 5, timeout=60)) == want
    finally:
        second.stop_and_check()
        third.stop_and_check()
    assert len(_diversions(broker_endpoint, f"{topic}.dlt")) == 1


def test_forged_class_and_attempt_do_not_steer_replay_which_restores_the_original_headers_exactly(
        workdir, broker, broker_endpoint):
    topic, policy = _setup(workdir, broker_endpoint, "replay")
    originals = (("trace", b"a"), ("trace", None), ("x-attempt", b"99"),
                 ("x-error-class", b"stale"), ("x-replayed-from-dlt", b"elsewhere/0/1"),
                 ("trace", b"b"))
    c.ck_produce(broker_endpoint, topic, [
        c.Rec(0, -1, b"k0", _valid(0), (), 1_700_000_000_000),
        c.Rec(0, -1, b"k1", POISON, originals, 1_700_000_000_001)])
    proxy = _proxy(workdir, broker, topic, policy, f"trust-r-{topic}").start()
    try:
        ep = c.Endpoint(proxy.bootstrap, "proxy")
        assert _ids(c.ck_consume_assign(ep, topic, [0], 1, timeout=60)) == [0]
    finally:
        proxy.stop_and_check()
    dlt = f"{topic}.dlt"
    assert len(_diversions(broker_endpoint, dlt)) == 1
    cfg = proxy.config_path
    (j,) = [json.loads(line) for line in ok(cli(
        "dlt", "inspect", "--config", str(cfg), "--topic", dlt, "--json")).splitlines()
        if line.startswith("{")]
    assert (j["class"], j["attempt"]) == ("poison", 0), j

    # The cause is fixed: the policy accepts lat 95. Replay writes the
    # record back with its own headers exactly, then its frame.
    policy.write_text(POLICY.format(topic=topic, max_lat=100))
    out = ok(cli("dlt", "replay", "--config", str(cfg), "--topic", dlt, "--execute"))
    assert "1 replayed" in out or "replayed" in out, out
    back = c.ck_consume_assign(broker_endpoint, topic, [0], 3, timeout=30)
    assert len(back) == 3, back
    r = back[2]
    assert (r.key, r.value) == (b"k1", POISON)
    assert r.headers[:len(originals)] == originals
    ctx = r.headers[len(originals):]
    assert ctx == (("x-replayed-from-dlt", f"{dlt}/0/{j['dlt_offset']}".encode()),
                   ("x-attempt", b"1"), ("x-antidote-context", b"2 2")), ctx


def test_with_signing_keys_a_direct_dlt_writer_hides_nothing_and_is_counted(
        workdir, broker, broker_endpoint):
    topic, policy = _setup(workdir, broker_endpoint, "signed")
    keys = workdir / f"{topic}.key"
    keys.write_text(KEY + "\n")
    dlt = f"{topic}.dlt"

    def origin(o):
        return (("x-original-topic", topic.encode()), ("x-original-partition", b"0"),
                ("x-original-offset", str(o).encode()), ("x-error-class", b"poison"))
    c.ck_produce(broker_endpoint, dlt, [
        # Format 1 (no frame), as antidote wrote before issue 28.
        c.Rec(0, -1, b"k", b"{}", origin(1), 1_700_000_000_000),
        # A well-formed frame without a signature.
        c.Rec(0, -1, b"k", b"{}", origin(2) + (("x-antidote-context", b"2 4"),),
              1_700_000_000_000),
        # A frame with a signature made with another key.
        c.Rec(0, -1, b"k", b"{}", origin(3) + (("x-antidote-context", b"2 4"),
              ("x-antidote-signature", b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")),
              1_700_000_000_000),
    ])
    c.ck_produce(broker_endpoint, topic,
                 [c.Rec(0, -1, b"k%d" % i, _valid(i), (), 1_700_000_000_000 + i) for i in range(5)]
                 + [c.Rec(0, -1, b"k5", POISON, (), 1_700_000_000_005)])
    want = [0, 1, 2, 3, 4]
    for round_ in range(2):  # the second round is a restart: the ledger is rebuilt
        p = _proxy(workdir, broker, topic, policy, f"trust-s{round_}-{topic}", keys).start()
        try:
            p.wait_ready(60)
            ep = c.Endpoint(p.bootstrap, "proxy")
            assert _ids(c.ck_consume_assign(ep, topic, [0], 5, timeout=60)) == want
            text = http_get(p.admin_port, "/metrics")[1]
            name = "antidote_dlt_records_refused_total"
            assert metric(text, name, reader="ledger", reason="unsigned") >= 2, text
            assert metric(text, name, reader="ledger", reason="bad_signature") >= 1, text
        finally:
            p.stop_and_check()
    # The forged three and one diversion, written once, signed.
    all_ = ps.read_dlt(broker_endpoint, dlt)
    assert len(all_) == 4, all_
    (mine,) = [d for d in all_ if d.key == b"k5"]
    assert mine.headers[-1][0] == "x-antidote-signature"
    assert dict(mine.headers)["x-original-offset"] == b"5"
    # `dlt inspect` with the keys lists the signed record only.
    shown = [json.loads(line) for line in ok(cli(
        "dlt", "inspect", "--config", str(p.config_path), "--topic", dlt, "--json")).splitlines()
        if line.startswith("{")]
    assert [s["origin_offset"] for s in shown] == [5], shown


def test_without_keys_a_record_with_a_reserved_name_twice_is_refused(
        workdir, broker, broker_endpoint):
    """What the forgery of e068479 left in a DLT: the producer's origin
    first, antidote's after it. Neither is believed."""
    topic, policy = _setup(workdir, broker_endpoint, "dup")
    forged = (("x-original-topic", topic.encode()), ("x-original-partition", b"0"),
              ("x-original-offset", b"1"), ("x-original-topic", topic.encode()),
              ("x-original-partition", b"0"), ("x-original-offset", b"2"),
              ("x-error-class", b"poison"))
    c.ck_produce(broker_endpoint, f"{topic}.dlt", [c.Rec(0, -1, b"k", POISON, forged, 1)])
    c.ck_produce(broker_endpoint, topic,
                 [c.Rec(0, -1, b"k%d" % i, _valid(i), (), 1_700_000_000_000 + i) for i in range(3)])
    p = _proxy(workdir, broker, topic, policy, f"trust-d-{topic}").start()
    try:
        p.wait_ready(60)
        ep = c.Endpoint(p.bootstrap, "proxy")
        assert _ids(c.ck_consume_assign(ep, topic, [0], 3, timeout=60)) == [0, 1, 2]
        text = http_get(p.admin_port, "/metrics")[1]
        assert metric(text, "antidote_dlt_records_refused_total", reader="ledger",
                      reason="duplicate_reserved_header") >= 1, text
    finally:
        p.stop_and_check()


KEYS_POLICY = """\
policies:
  - name: trust-keys
    topics: ["{topic}"]
    value:
      format: json
    rules:
      - field: /lat
        min: -90
        max: {max_lat}
    ordering: per_key
"""


def test_with_keys_a_forged_release_of_a_blocked_key_releases_nothing_and_a_real_replay_does(
        workdir, broker, broker_endpoint):
    from test_keys import metric as keys_metric, rec, tags, through_proxy, wait_metric
    from test_reload_replay import replay_counts, wait_for_log
    topic = f"trust-key-{uuid.uuid4().hex[:8]}"
    dlt = f"{topic}.dlt"
    c.ck_create_topic(broker_endpoint, topic, 1)
    policy = workdir / f"{topic}.policy.yaml"
    policy.write_text(KEYS_POLICY.format(topic=topic, max_lat=90))
    keys = workdir / f"{topic}.key"
    keys.write_text(KEY + "\n")
    proxy = _proxy(workdir, broker, topic, policy, f"trust-k-{topic}", keys).start()
    try:
        c.ck_produce(broker_endpoint, topic, [rec(0, "A", "A1", lat=95), rec(0, "B", "B1")])
        assert through_proxy(proxy, topic, 0, "B1") == ["B1"]
        wait_metric(proxy, "antidote_blocked_keys", 1)
        # A producer forges a replay frame that releases A, and a writer of
        # the DLT forges a release marker for A.
        forged = c.Rec(0, -1, b"A", json.dumps({"lat": 1, "id": "AF"}).encode(), (
            ("x-replayed-from-dlt", f"{dlt}/0/1".encode()), ("x-attempt", b"1"),
            ("x-released-through", b"1000"), ("x-antidote-context", b"2 3")), 1_700_000_000_000)
        c.ck_produce(broker_endpoint, topic, [forged])
        c.ck_produce(broker_endpoint, dlt, [c.Rec(0, -1, b"A", None, (
            ("x-antidote-marker", b"release"), ("x-marker-topic", topic.encode()),
            ("x-marker-partition", b"0"), ("x-marker-through", b"1000"),
            ("x-antidote-context", b"2 4")), 1_700_000_000_000)])
        c.ck_produce(broker_endpoint, topic, [rec(0, "A", "A2"), rec(0, "C", "C1")])
        assert through_proxy(proxy, topic, 0, "C1") == ["B1", "C1"]
        time.sleep(1.5)  # past the blocked-key follower's round: the marker was read
        assert keys_metric(proxy, "antidote_blocked_keys") == 1
        # The fleet's own replay, signed, does release A once the cause is fixed.
        policy.write_text(KEYS_POLICY.format(topic=topic, max_lat=100))
        wait_for_log(proxy, "policies reloaded")
        r = cli("dlt", "replay", "--config", str(proxy.config_path), "--topic", dlt, "--key", "A",
                "--execute")
        out = ok(r) + r.stderr
        assert replay_counts(out)["replayed"] == 3, out
        c.ck_produce(broker_endpoint, topic, [rec(0, "A", "A3")])
        assert through_proxy(proxy, topic, 0, "A3") == ["B1", "C1", "A1", "AF", "A2", "A3"]
    finally:
        proxy.stop_and_check()
