"""The DLT console (`admin.console`, /console on the admin listener) in
Debian's headless Chromium, driven by playwright-core (tests/js/console.js),
against a real proxy on Apache Kafka with poison diverted.

One proxy (console read-only, record contents allowed) fronts a topic whose
poison was diverted (out-of-range values and a record that is not JSON) and
a topic whose circuit breaker tripped (a partition held, reason `breaker`).
Its policy is then fixed by a hot reload, so a replay preview has records
to write back and records still invalid. One browser session reads the
overview, pages through the DLT, previews a replay and posts both actions
from the page; the tests compare what it showed with what the test
produced (the records, their keys, values and partitions, the reasons the
policy gives them), with `/metrics` and `dlt replay`'s dry run, and check
that nothing changed in Kafka. A second proxy (actions on, contents withheld) refuses actions
that fail its CSRF checks, replays for real with the page's button, and
closes the breaker. A third proxy's DLT holds hostile contents (`<img
src=x onerror=...>`, `<svg onload=...>`) in a key, a header value, a
reason and the decoded value, read in a browser session of the test's own
with a dialog listener and a CSP violation listener: every one is shown
as text, no element is made of it, nothing runs. Every console response
carries the Content-Security-Policy operations.md names. Screenshots:
target/test-artifacts/console/."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import clients as c
import poison_support as ps
from harness import HOST, free_port
from test_ops import OpsAntidote, cli, http_get, ok
from test_reload_replay import wait_for_log

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "tests" / "js"
SHOTS = ROOT / "target" / "test-artifacts" / "console"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

pytestmark = pytest.mark.skipif(
    os.environ.get("CI") != "true" and os.environ.get("ANTIDOTE_CI_ENTRY") != "1"
    and (shutil.which("node") is None or not Path(CHROMIUM).exists()
         or not (JS / "node_modules" / "playwright-core").exists()),
    reason="chromium or playwright-core not installed (scripts/setup.sh)")

GEO = """\
policies:
  - name: con-geo
    topics: ["{topic}"]
    value:
      format: json
    rules:
      - field: /lat
        min: -90
        max: {max_lat}
    on_invalid: divert
"""
KEYS = """\
policies:
  - name: con-keys
    topics: ["{topic}"]
    value:
      format: json
    rules:
      - field: /lat
        min: -90
        max: 90
    ordering: per_key
"""
BRK = """\
policies:
  - name: con-brk
    topics: ["{topic}"]
    value:
      format: json
    rules:
      - field: /lat
        min: -90
        max: 90
    breaker: {{ max_ratio: 0.05, over: 1000, min_diverted: 3 }}
"""


# The console token of the proxy with actions on (admin.console_token_file).
TOKEN = "test-console-token-0123456789"


@dataclass
class ConsoleAntidote(OpsAntidote):
    """A proxy with the console on its admin listener."""
    actions: bool = False
    contents: bool = True

    def config_yaml(self) -> str:
        text = super().config_yaml()
        admin = f"admin:\n  listen: {HOST}:{self.admin_port}\n"
        assert admin in text
        token = ""
        if self.actions:
            path = self.workdir / f"{self.name}.console-token"
            path.write_text(TOKEN + "\n")
            token = f"  console_token_file: {path}\n"
        text = text.replace(admin, admin + "  console: true\n"
                            + f"  console_actions: {str(self.actions).lower()}\n" + token)
        return text + f"logging:\n  record_contents: {str(self.contents).lower()}\n"


@dataclass
class Setup:
    proxy: ConsoleAntidote
    broker: str
    topic: str
    dlt: str
    brk: str
    keyed: str
    policies: tuple
    config: Path


def _rec(p: int, i: int, value: bytes, key: bytes | None = None) -> c.Rec:
    return c.Rec(p, -1, key or b"k%d" % i, value, (("trace", b"t%d" % i),), 1_700_000_000_000 + i)


def _ok(i: int, lat: int) -> c.Rec:
    return _rec(i % 2, i, json.dumps({"lat": lat, "id": i}).encode())


# What the test writes to the geofence topic, in order: the ground truth the
# console's pages are checked against. Invalid under the first policy (lat
# up to 90): k2, k4 and k8 (their lat) and k5 (not JSON).
PRODUCED = (
    _ok(0, 10), _ok(1, 20), _rec(0, 2, b'{"lat": 95, "id": 2}'), _ok(3, 30),
    _rec(1, 4, b'{"lat": 97.5, "id": 4}'), _rec(0, 5, b"not json <script>alert(1)</script>"),
    _ok(6, 40), _ok(7, 50), _rec(1, 8, b'{"lat": 250, "id": 8}'), _ok(9, 60),
)
INVALID_LAT = {b"k2": "95", b"k4": "97.5", b"k8": "250"}   # key -> lat as written
NOT_JSON = b"k5"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@pytest.fixture(scope="module")
def setup(workdir, broker) -> Setup:
    tag = uuid.uuid4().hex[:8]
    topic, brk, keyed = f"con-geo-{tag}", f"con-brk-{tag}", f"con-key-{tag}"
    ep = c.Endpoint(broker.bootstrap)
    c.ck_create_topic(ep, topic, 2)
    # Two DLT partitions: the browser's pages cross from one to the next.
    c.ck_create_topic(ep, f"{topic}.dlt", 2)
    c.ck_create_topic(ep, brk, 1)
    c.ck_create_topic(ep, keyed, 1)
    geo_policy, brk_policy = workdir / f"{topic}.yaml", workdir / f"{brk}.yaml"
    keys_policy = workdir / f"{keyed}.yaml"
    geo_policy.write_text(GEO.format(topic=topic, max_lat=90))
    brk_policy.write_text(BRK.format(topic=brk))
    keys_policy.write_text(KEYS.format(topic=keyed))
    policies = (str(geo_policy), str(brk_policy), str(keys_policy))
    proxy = ConsoleAntidote(workdir, upstream=[broker.bootstrap], name=f"console-{tag}",
                            policy_files=policies, admin_port=free_port())
    import conftest
    conftest._PROXIES.append(proxy)
    proxy.start().wait_ready(30)
    c.ck_produce(ep, topic, list(PRODUCED))
    got = c.ck_consume_assign(c.Endpoint(proxy.bootstrap, "proxy"), topic, [0, 1], 6, timeout=60)
    assert len(got) == 6, got
    # Fixed: lat up to 100. Records at 95 and 97.5 replay; 250 and the
    # one that is not JSON stay invalid. (A reload closes breakers: first.)
    geo_policy.write_text(GEO.format(topic=topic, max_lat=100))
    wait_for_log(proxy, "policies reloaded")
    # The breaker's topic: one valid record, then poison only: two are
    # diverted, the third trips the breaker and holds the partition.
    c.ck_produce(ep, brk, [_rec(0, 0, b'{"lat": 1}')]
                 + [_rec(0, i, b'{"lat": 200}') for i in range(1, 8)])
    c.ck_consume_assign(c.Endpoint(proxy.bootstrap, "proxy"), brk, [0], 1, timeout=60)
    _wait(lambda: _series(_metrics(proxy), "antidote_breaker_open", topic=brk) == 1, "breaker open")
    # Per-key ordering: key A's first record is poison, so A2 is parked
    # behind it and key A is blocked; B flows.
    c.ck_produce(ep, keyed, [_rec(0, 1, b'{"lat": 99}', b"A"), _rec(0, 2, b'{"lat": 1}', b"B"),
                             _rec(0, 3, b'{"lat": 2}', b"A")])
    got = c.ck_consume_assign(c.Endpoint(proxy.bootstrap, "proxy"), keyed, [0], 1, timeout=60)
    assert [r.key for r in got] == [b"B"], got
    _wait(lambda: _series(_metrics(proxy), "antidote_blocked_keys") == 1, "key A blocked")
    yield Setup(proxy, broker.bootstrap, topic, f"{topic}.dlt", brk, keyed, policies,
                proxy.config_path)
    proxy.stop_and_check()


def _wait(cond, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s")


def _metrics(proxy) -> str:
    status, text = http_get(proxy.admin_port, "/metrics")
    assert status == 200
    return text


def _series(text: str, name: str, **labels: str) -> float:
    """The sum of `name` over the series whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def _ends(bootstrap: str, topics: list[tuple[str, int]]) -> dict:
    port = int(bootstrap.rsplit(":", 1)[1])
    return {(t, p): ps.high_watermark(port, t, p) for t, n in topics for p in range(n)}


def _browse(admin_port: int, prefix: str, dlt: str, then: str = "post") -> dict:
    p = subprocess.run(["node", "console.js", f"http://{HOST}:{admin_port}", str(SHOTS), prefix, dlt,
                        then],
                       cwd=JS, capture_output=True, text=True, timeout=150, stdin=subprocess.DEVNULL,
                       env={**os.environ, "CONSOLE_TOKEN": TOKEN})
    assert p.returncode == 0, f"console.js exit {p.returncode}\n{p.stderr[-4000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def _call(port: int, path: str, body: bytes | None = None, headers: dict | None = None):
    req = urllib.request.Request(f"http://{HOST}:{port}{path}", data=body, headers=headers or {},
                                 method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def session(setup) -> dict:
    """One browser session on the read-only console, with Kafka's ends
    before and after it."""
    s = setup
    topics = [(s.topic, 2), (s.dlt, 2), (s.brk, 1), (f"{s.brk}.dlt", 1), (s.keyed, 1),
              (f"{s.keyed}.dlt", 1)]
    # The proxy's own writes (the breaker's open marker after the two
    # diversions) are done first, and nothing moves for 2 s.
    _wait(lambda: _ends(s.broker, topics)[(f"{s.brk}.dlt", 0)] >= 3, "the open marker")
    ends = [_ends(s.broker, topics)]
    while len(ends) < 3 or ends[-1] != ends[-3]:
        time.sleep(1)
        ends.append(_ends(s.broker, topics))
        assert len(ends) < 30, ends
    before = ends[-1]
    out = _browse(s.proxy.admin_port, "readonly", s.dlt)
    out["ends"] = (before, _ends(s.broker, topics))
    return out


def test_overview_shows_the_counts_the_metrics_show(setup, session):
    text = _metrics(setup.proxy)
    shown = {(r["topic"], r["class"]): r["count"] for r in session["diverted"]}
    for (topic, cls), n in shown.items():
        assert n == _series(text, "antidote_records_invalid_total", topic=topic, **{"class": cls},
                            action="diverted"), (topic, cls, n)
    # What the test produced: four invalid records on the geofence topic,
    # read once by one reader, so diverted four times, no more.
    assert shown[(setup.topic, "poison")] == len(INVALID_LAT) + 1, shown
    # The breaker's topic: two diversions before it tripped; a held
    # partition fetched again counts its diversions again.
    assert shown[(setup.brk, "poison")] >= 2
    # The last hour's chart holds the same diversions.
    legend = {(r["topic"], r["class"]): r["total"] for r in session["legend"]}
    assert legend == shown, (legend, shown)
    assert session["chart_bars"] >= 1
    assert {"topic": setup.brk, "partition": 0, "reason": "breaker"} in session["held"]
    assert {"topic": setup.brk, "partition": 0} in session["breakers"]
    # One key blocked: A, whose first record the test wrote as poison.
    assert session["blocked_count"] == 1
    assert session["blocked"] == [{"topic": setup.keyed, "partition": 0, "key": "A"}]
    assert "read-only" in session["status"]
    # The two actions posted on purpose answer 403; nothing else failed.
    errors = [e for e in session["console_errors"] if "status of 403" not in e]
    assert not errors, session["console_errors"]


def test_browser_lists_and_decodes_the_dlt_records(setup, session):
    """The records the page lists are the invalid records the test wrote:
    key, value bytes, header, partition (origin partition mod the DLT's two)
    and order within a partition, class and the reason the policy gives
    each (from the value the test wrote, not from `dlt inspect`)."""
    invalid = [r for r in PRODUCED if r.key in INVALID_LAT or r.key == NOT_JSON]
    shown = session["records"]
    assert sorted(r["key"] for r in shown) == sorted(r.key.decode() for r in invalid), shown
    by_key = {r["key"]: r for r in shown}
    for want in invalid:
        got = by_key[want.key.decode()]
        topic, partition, offset = got["coordinate"].rsplit("/", 2)
        assert (topic, int(partition)) == (setup.dlt, want.partition % 2), got
        assert got["value"] == want.value.decode(), (got, want)
        assert got["class"] == "poison", got
        if want.key in INVALID_LAT:
            lat = INVALID_LAT[want.key]
            # The policy when it was diverted: lat from -90 to 90.
            assert (got["rule"], got["reason"]) == \
                ("range:/lat", f"/lat: {lat} is outside [-90, 90]"), got
            assert f'"lat": {lat}' in got["decoded"], got
        else:
            assert got["rule"] == "decode", got
            assert got["reason"].startswith("value is not valid JSON"), got
    # Within a DLT partition, the order the test wrote them in.
    for part in ("0", "1"):
        keys = [r["key"] for r in shown if r["coordinate"].rsplit("/", 2)[1] == part]
        assert keys == [r.key.decode() for r in invalid if str(r.partition % 2) == part], shown
        offs = [int(r["coordinate"].rsplit("/", 1)[1]) for r in shown
                if r["coordinate"].rsplit("/", 2)[1] == part]
        assert offs == sorted(offs), shown
    # Not JSON: the decoder's error, and the markup shown as text.
    assert "not decoded" in by_key["k5"]["decoded"], by_key["k5"]
    assert by_key["k5"]["value"] == "not json <script>alert(1)</script>"
    # Three per page over two DLT partitions: the browser paged across them.
    assert session["requests"].count("GET /console/api/records") == 2, session["requests"]
    assert {r["coordinate"].rsplit("/", 2)[1] for r in session["records"]} == {"0", "1"}


def test_every_console_response_carries_the_content_security_policy(setup):
    """operations.md: every console response carries the CSP, X-Frame-Options
    DENY and nosniff; the page, its script and the API alike, errors too."""
    port = setup.proxy.admin_port
    for path in ("/console", "/console/console.js", "/console/console.css",
                 "/console/api/overview", f"/console/api/records?topic={setup.dlt}",
                 "/console/api/records", "/console/api/nothing"):
        req = urllib.request.Request(f"http://{HOST}:{port}{path}")
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                status, headers = r.status, r.headers
        except urllib.error.HTTPError as e:
            status, headers = e.code, e.headers
        assert headers.get("content-security-policy") == CSP, (path, status, dict(headers))
        assert headers.get("x-frame-options") == "DENY", (path, dict(headers))
        assert headers.get("x-content-type-options") == "nosniff", (path, dict(headers))


def test_preview_matches_dlt_replay_dry_run(setup, session):
    p = cli("dlt", "replay", "-c", str(setup.config), "--topic", setup.dlt)
    lines = ok(p).splitlines()
    assert [o["line"] for o in session["preview"]] == lines
    kinds = sorted(o["kind"] for o in session["preview"])
    assert kinds == ["still_invalid", "still_invalid", "would_replay", "would_replay"], kinds
    assert all(o["verdict"] == "valid" for o in session["preview"] if o["kind"] == "would_replay")
    assert "nothing written" in session["preview_summary"]


def test_with_actions_off_no_request_changes_anything(setup, session):
    before, after = session["ends"]
    assert before == after, (before, after)
    assert session["actions"]["execute"]["status"] == 403, session["actions"]
    assert session["actions"]["close"]["status"] == 403, session["actions"]
    assert "console_actions" in session["actions"]["execute"]["body"]["error"]
    assert not session["execute_visible"]
    assert not [r for r in session["requests"] if r.startswith("BLOCKED")], session["requests"]
    assert _call(setup.proxy.admin_port, "/console/api/replay/job") == (200, {"job": None})
    # The breaker still holds: nothing closed it.
    assert _series(_metrics(setup.proxy), "antidote_breaker_open", topic=setup.brk) == 1


@pytest.mark.parametrize("path, status, message", [
    ("/console/api/records", 400, "`topic` is required"),
    ("/console/api/records?topic=a/b", 400, "not a topic name"),
    ("/console/api/records?topic={dlt}&limit=0", 400, "`limit` must be an integer from 1 to 200"),
    ("/console/api/records?topic={dlt}&limit=201", 400, "from 1 to 200"),
    ("/console/api/records?topic={dlt}&partition=0", 400, "go together"),
    ("/console/api/records?topic={dlt}&partition=0&offset=99999", 400, "past its end"),
    ("/console/api/records?topic={dlt}&partition=7&offset=0", 400, "has no partition 7"),
    ("/console/api/records?topic={dlt}&since=yesterday", 400, "`since`"),
    ("/console/api/records?topic={dlt}&class=evil", 400, "`class` must be one of"),
    ("/console/api/records?topic={dlt}&nope=1", 400, "unknown parameter `nope`"),
    ("/console/api/records?topic={dlt}&rule=" + "x" * 300, 400, "longer than 256"),
    ("/console/api/records?topic=no-such-dlt-here", 400, "does not exist"),
    ("/console/api/replay/preview?topic={dlt}&limit=5000", 400, "from 1 to 1000"),
    ("/console/api/replay/preview?topic={dlt}&include_stale=maybe", 400, "true or false"),
    ("/console/api/overview?x=1", 400, "unknown parameter"),
    ("/console/api/nothing", 404, "not found"),
    ("/console/api/replay/execute", 405, "only POST"),
])
def test_bad_input_gets_a_400_with_a_message(setup, path, status, message):
    got, body = _call(setup.proxy.admin_port, path.format(dlt=setup.dlt))
    assert (got, message in body["error"]) == (status, True), (got, body)


def test_a_page_naming_another_host_is_refused_dns_rebinding(setup):
    """A hostile page whose own name was rebound to the admin address sends
    its own name as Host: refused, the page and the API alike; an IP
    address or an allowed name (admin.console_hosts: localhost) is served."""
    port = setup.proxy.admin_port
    for path in ("/console", "/console/api/overview"):
        got, body = _call(port, path, headers={"host": f"evil.example:{port}"})
        assert got == 403 and "admin.console_hosts" in body["error"], (path, got, body)
    assert _call(port, "/console/api/overview", headers={"host": f"localhost:{port}"})[0] == 200
    assert _call(port, "/console/api/overview")[0] == 200  # Host: 127.0.0.1:port


def test_actions_replay_and_close_the_breaker_with_contents_withheld(workdir, setup, session):
    s = setup
    proxy = ConsoleAntidote(workdir, upstream=[s.broker], name=f"console-act-{s.topic}",
                            policy_files=s.policies, admin_port=free_port(),
                            actions=True, contents=False)
    import conftest
    conftest._PROXIES.append(proxy)
    proxy.start().wait_ready(30)
    try:
        port = proxy.admin_port
        # The credential: no token, or a wrong one, is refused before anything else.
        body = json.dumps({"topic": s.dlt, "rate": 20}).encode()
        page = {"content-type": "application/json", "x-antidote-console": "1"}
        for auth in ({}, {"authorization": "Bearer " + TOKEN[:-1] + "x"}, {"authorization": TOKEN}):
            got, answer = _call(port, "/console/api/replay/execute", body, {**page, **auth})
            assert got == 401 and "console token" in answer["error"], (auth, got, answer)
        # The CSRF defences: the page's header, a JSON body, this Origin.
        js = {"content-type": "application/json", "authorization": "Bearer " + TOKEN}
        assert _call(port, "/console/api/replay/execute", body, js)[0] == 403
        assert _call(port, "/console/api/replay/execute", body,
                     {**js, "x-antidote-console": "1", "origin": "http://evil.example"})[0] == 403
        assert _call(port, "/console/api/replay/execute", body,
                     {**js, "x-antidote-console": "1", "sec-fetch-site": "cross-site"})[0] == 403
        assert _call(port, "/console/api/replay/execute", body,
                     {"content-type": "text/plain", "x-antidote-console": "1",
                      "authorization": "Bearer " + TOKEN})[0] == 415
        assert _call(port, "/console/api/replay/execute", b"x" * 20000,
                     {**js, "x-antidote-console": "1"})[0] == 413
        assert _call(port, "/console/api/replay/execute", b'{"topic": "a", "rate": 0}',
                     {**js, "x-antidote-console": "1"})[0] == 400
        assert _call(port, "/console/api/replay/job") == (200, {"job": None})
        before = _count(s.broker, s.topic)
        # The page: contents withheld; then the previewed replay run with its button.
        shown = _browse(port, "actions", s.dlt, then="execute")
        assert shown["records"] and all(r["withheld"] and r["value"] is None
                                        for r in shown["records"]), shown
        assert all(r["key"].endswith("bytes, hidden)") for r in shown["records"]), shown["records"]
        assert shown["blocked"] == [{"topic": s.keyed, "partition": 0, "key": "(1 bytes, hidden)"}]
        assert shown["execute_visible"]
        assert "2 replayed" in shown["job_text"] and "2 still invalid" in shown["job_text"], shown
        assert sorted(shown["job_outcomes"]) == ["replayed", "replayed", "still_invalid", "still_invalid"]
        status, page = _call(port, f"/console/api/records?topic={s.dlt}")
        assert status == 200 and all(r["value"] is None and r["reason"] is None and "decoded" not in r
                                     for r in page["records"]), page
        job = _call(port, "/console/api/replay/job")[1]["job"]
        assert job and not job["running"] and job["error"] is None, job
        assert (job["report"]["replayed"], job["report"]["still_invalid"]) == (2, 2), job
        assert all("withheld" in o["line"] for o in job["outcomes"] if o["kind"] == "still_invalid")
        assert _count(s.broker, s.topic) - before == 2
        # The same replay again writes nothing more (the command's fencing).
        out = ok(cli("dlt", "replay", "-c", str(s.config), "--topic", s.dlt))
        assert out.count("already replayed") == 2, out
        # Close the breaker: both proxies read the marker back.
        status, closed = _call(port, "/console/api/breaker/close",
                               json.dumps({"topic": s.brk, "partition": 0}).encode(),
                               {**js, "x-antidote-console": "1"})
        assert (status, closed["result"]) == (200, "closed"), closed
        _wait(lambda: _series(_metrics(s.proxy), "antidote_breaker_open", topic=s.brk) == 0,
              "the read-only proxy saw the close marker")
    finally:
        proxy.stop_and_check()


def _count(bootstrap: str, topic: str) -> int:
    return len(_partition(bootstrap, topic, 0)) + len(_partition(bootstrap, topic, 1))


def _partition(bootstrap: str, topic: str, partition: int) -> list:
    import confluent_kafka as ck
    cons = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"con-{time.monotonic_ns()}",
                        "enable.auto.commit": False, "enable.partition.eof": True, "log_level": 3})
    got = []
    try:
        cons.assign([ck.TopicPartition(topic, partition, ck.OFFSET_BEGINNING)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == ck.KafkaError._PARTITION_EOF:
                    break
                continue
            got.append(m)
    finally:
        cons.close()
    return got


# ---------------------------------------------------------------------------
# Hostile contents: shown as text everywhere, nothing made of them, nothing run
# ---------------------------------------------------------------------------

XSS_POLICY = """\
policies:
  - name: con-xss
    topics: ["{topic}"]
    value:
      format: json
    rules:
      - field: /name
        one_of: [ann, bob]
    ordering: per_key
"""
# Each payload names where it was put, so a dialog or an element made of one
# says which view let it through.
XSS_KEY = "<img src=x onerror=alert('xss-key')>"
XSS_HEADER = "<svg/onload=alert('xss-header')>"
XSS_REASON = "<svg onload=alert('xss-reason')>"            # the /name value: quoted by the reason
XSS_DECODED = "<img src=x onerror=alert('xss-decoded')>"  # another member: in the decoded value
XSS_SESSION = r"""
"use strict";
// The test's own browser session (tests/test_console.py writes and runs it):
// the overview, the DLT browser with every row opened and the replay
// preview of one DLT, listening for dialogs, CSP violations and errors.
const fs = require("fs"), os = require("os"), path = require("path");
const { chromium } = require("playwright-core");
const [base, dlt, shots] = process.argv.slice(2);
(async () => {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "antidote-xss-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium", headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: { width: 1280, height: 900 } });
  const out = { dialogs: [], console: [], page_errors: [], blocked: [], text: {} };
  try {
    await context.addInitScript(() => {
      window.__csp = [];
      document.addEventListener("securitypolicyviolation",
        (e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI} ${e.sample}`));
    });
    await context.route("**/*", (route) => {
      const u = new URL(route.request().url());
      if (u.origin === new URL(base).origin) return route.continue();
      out.blocked.push(u.href);
      return route.abort();
    });
    const page = await context.newPage();
    page.on("dialog", (d) => { out.dialogs.push(`${d.type()}: ${d.message()}`); d.dismiss(); });
    page.on("console", (m) => out.console.push(`${m.type()}: ${m.text()}`));
    page.on("pageerror", (e) => out.page_errors.push(String(e)));
    await page.goto(base + "/console", { waitUntil: "domcontentloaded" });
    await page.waitForFunction(() => document.querySelector("#status").textContent.includes("updated"), null, { timeout: 20000 });
    await page.waitForSelector("#blocked tbody tr[data-topic]", { timeout: 20000 });
    out.text.overview = await page.innerText("body");
    await page.click('button[data-tab="browser"]');
    await page.waitForSelector(`#browse-form select[name=topic] option[value="${dlt}"]`, { state: "attached", timeout: 20000 });
    await page.selectOption("#browse-form select[name=topic]", dlt);
    await page.click("#browse-form button[type=submit]");
    await page.waitForFunction(() => !document.querySelector("#browse-info").textContent.startsWith("reading"));
    for (const row of await page.$$("#records tbody tr.rec")) await row.click();
    out.rows = await page.$$eval("#records tbody tr.rec", (r) => r.length);
    out.text.browser = await page.innerText("body");
    await page.screenshot({ path: path.join(shots, "hostile-browser.png"), fullPage: true });
    await page.click('button[data-tab="replay"]');
    await page.waitForSelector(`#replay-form select[name=topic] option[value="${dlt}"]`, { state: "attached", timeout: 20000 });
    await page.selectOption("#replay-form select[name=topic]", dlt);
    await page.click("#replay-form button[type=submit]");
    await page.waitForFunction(() => !document.querySelector("#replay-summary").textContent.startsWith("previewing"), null, { timeout: 30000 });
    out.text.replay = await page.innerText("body");
    await page.waitForTimeout(1000);  // an image's onerror, had one been made, has fired
    out.csp = await page.evaluate(() => window.__csp);
    // Elements made of the contents: any with an event handler attribute,
    // any image, any svg outside the page's own chart.
    out.made = await page.evaluate(() => [...document.querySelectorAll("*")]
      .filter((e) => [...e.attributes].some((a) => a.name.startsWith("on")) || e.tagName === "IMG"
        || (e.tagName.toLowerCase() === "svg" && !e.closest("#chart")))
      .map((e) => e.outerHTML.slice(0, 200)));
  } finally {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
  process.stdout.write(JSON.stringify(out) + "\n");
})().catch((e) => { process.stderr.write(String(e && e.stack || e) + "\n"); process.exit(1); });
"""


def test_hostile_contents_are_shown_as_text_and_nothing_runs(workdir, broker, tmp_path):
    """Markup in a key, a header value, a reason (the policy quotes the
    value it refused) and the decoded value of a DLT record, and the same
    key blocked (the overview lists it): the page shows each as text, makes
    no element of it, opens no dialog and violates no CSP directive."""
    tag = uuid.uuid4().hex[:8]
    topic = f"con-xss-{tag}"
    ep = c.Endpoint(broker.bootstrap)
    c.ck_create_topic(ep, topic, 1)
    c.ck_create_topic(ep, f"{topic}.dlt", 1)
    policy = workdir / f"{topic}.yaml"
    policy.write_text(XSS_POLICY.format(topic=topic))
    proxy = ConsoleAntidote(workdir, upstream=[broker.bootstrap], name=f"console-xss-{tag}",
                            policy_files=(str(policy),), admin_port=free_port())
    import conftest
    conftest._PROXIES.append(proxy)
    proxy.start().wait_ready(30)
    try:
        key = XSS_KEY.encode()
        bad = json.dumps({"name": XSS_REASON, "note": XSS_DECODED}).encode()
        c.ck_produce(ep, topic, [
            c.Rec(0, -1, key, bad, (("h", XSS_HEADER.encode()),), 1_700_000_000_000),
            c.Rec(0, -1, key, b'{"name": "ann"}', (("h", b"plain"),), 1_700_000_000_001),
            c.Rec(0, -1, b"other", b'{"name": "bob"}', (), 1_700_000_000_002)])
        got = c.ck_consume_assign(c.Endpoint(proxy.bootstrap, "proxy"), topic, [0], 1, timeout=60)
        assert [r.key for r in got] == [b"other"], got
        _wait(lambda: _series(_metrics(proxy), "antidote_blocked_keys") == 1, "the key blocked")
        script = tmp_path / "xss-session.js"
        script.write_text(XSS_SESSION)
        p = subprocess.run(["node", str(script), f"http://{HOST}:{proxy.admin_port}",
                            f"{topic}.dlt", str(SHOTS)],
                           cwd=JS, capture_output=True, text=True, timeout=150,
                           stdin=subprocess.DEVNULL,
                           env={**os.environ, "NODE_PATH": str(JS / "node_modules")})
        assert p.returncode == 0, f"xss-session.js exit {p.returncode}\n{p.stderr[-4000:]}"
        out = json.loads(p.stdout.strip().splitlines()[-1])
    finally:
        proxy.stop_and_check()
    assert out["dialogs"] == [], out["dialogs"]
    assert out["made"] == [], out["made"]
    assert out["csp"] == [], out["csp"]
    assert out["page_errors"] == [] and out["blocked"] == [], out
    assert not [m for m in out["console"] if "Content Security Policy" in m], out["console"]
    assert out["rows"] == 2, out
    # Each shown as the text it is: the key in the overview's blocked list
    # and in the browser; the header value, the reason and the decoded
    # value in the opened rows. The preview holds both records back (the
    # key's parked record goes with the poison one, which is still invalid).
    assert XSS_KEY in out["text"]["overview"], out["text"]["overview"]
    for what in (XSS_KEY, XSS_HEADER, XSS_REASON, XSS_DECODED):
        assert what in out["text"]["browser"], (what, out["text"]["browser"])
    assert out["text"]["replay"].count(f"{topic}.dlt/0/0: still-invalid") == 2, out["text"]["replay"]
