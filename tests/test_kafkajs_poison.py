"""kafkajs (pure JavaScript, the third independent client) reads what the
proxy rewrites: spliced batches, batches emptied of all their records, a
partition ending in poison (commit marker), the same spliced batches resent
from the cache to a second and third group reading at the same time, and a
partition held while its dead-letter cluster is a black hole.

librdkafka skips CRC checks and reads until bytes run out; kafkajs parses
every batch itself, so a rewrite bug librdkafka tolerates shows up here.
Never skipped under CI=true (scripts/setup.sh fails without kafkajs)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

import clients as c
import harness as h
import poison_support as ps
from test_faults import HoldScenario, POISON_OFFSET, restartable_broker  # noqa: F401
from test_poison import LAYOUT, layout_records, produce_batches

JS = Path(__file__).resolve().parent / "js"

pytestmark = pytest.mark.skipif(
    os.environ.get("CI") != "true"
    and (shutil.which("node") is None or not (JS / "node_modules" / "kafkajs").exists()),
    reason="kafkajs not installed (scripts/setup.sh)")


class JsStream:
    """`node stream.js` as a subprocess; its JSON lines are collected as they come."""

    def __init__(self, bootstrap: str, topic: str, n: int, timeout_ms: int = 90000):
        self.group = f"js-{uuid.uuid4().hex[:8]}"
        self.proc = subprocess.Popen(
            ["node", "stream.js", bootstrap, topic, self.group, str(n), str(timeout_ms)],
            cwd=JS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True)
        self.recs: list[tuple[int, int, bytes, bytes]] = []
        self.end = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            d = json.loads(line)
            if "end" in d:
                self.end = d["end"]
            else:
                self.recs.append((d["partition"], d["offset"], d["key"].encode(),
                                  base64.b64decode(d["value"])))

    def offsets(self, partition: int) -> list[int]:
        return [o for p, o, _, _ in list(self.recs) if p == partition]

    def wait(self, timeout: float = 120) -> list[tuple[int, int, bytes, bytes]]:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"kafkajs did not finish; read {self.recs}")
        self._reader.join(5)
        assert rc == 0, f"kafkajs exit {rc}: {self.proc.stderr.read()[-3000:]}; read {self.recs}"
        assert self.end == len(self.recs), (self.end, self.recs)
        return self.recs

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def pproxy(workdir, broker, tmp_path_factory):
    pfile = ps.write_policies(tmp_path_factory.mktemp("js-policies"))
    p = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[pfile],
                              name="antidote-js-poison")
    yield p
    p.stop_and_check()


# kafkajs 2.2 decodes gzip itself; snappy, lz4 and zstd need codec plugins.
@pytest.mark.parametrize("codec", ["none", "gzip"])
def test_kafkajs_groups_reading_at_once_get_exactly_the_valid_records_of_spliced_batches(
        codec, broker, broker_endpoint, pproxy):
    """LAYOUT: poison first, middle and last in one batch, a batch of only
    poison (emptied), and a partition that ends in poison. Two kafkajs groups
    read at the same time (concurrent diversions of the same records, joined
    by the ledger), then a third reads the spliced batches from the cache."""
    topic = ps.unique_topic(ps.JSON_PREFIX, "js-" + codec)
    c.ck_create_topic(broker_endpoint, topic, 1)
    batches = layout_records(LAYOUT)
    produce_batches(broker_endpoint, topic, batches, codec)
    kinds = [k for b in LAYOUT for k in b]
    flat = [r for b in batches for r in b]
    assert len(ps.split_batches(ps.fetch_partition(broker.port, topic).records)) == len(LAYOUT)
    valid = [(r.partition, r.offset, r.key, r.value) for r, k in zip(flat, kinds) if k == "valid"]
    poison = [r for r, k in zip(flat, kinds) if k != "valid"]

    both = [JsStream(pproxy.bootstrap, topic, len(valid)) for _ in range(2)]
    try:
        for s in both:
            assert s.wait() == valid, f"group {s.group}"
    finally:
        for s in both:
            s.kill()
    third = JsStream(pproxy.bootstrap, topic, len(valid))
    assert third.wait() == valid, "the resent (cached) spliced batches"

    dlt = ps.sorted_by_origin(ps.read_dlt(broker_endpoint, f"{topic}.dlt"))
    assert ps.origin_offsets(dlt) == [(0, r.offset) for r in poison], "each poison exactly once"
    pproxy.assert_running()


def test_kafkajs_partition_held_while_the_dlt_is_a_black_hole_then_resumes(
        workdir, restartable_broker):  # noqa: F811
    """test_faults.py's HoldScenario read by kafkajs: partition 0 stops just
    before its poison record while partition 1 flows; once the dead-letter
    cluster is back, partition 0 resumes past the poison, which never arrives."""
    s = HoldScenario(workdir, restartable_broker)
    stream = None
    try:
        stream = JsStream(s.proxy.bootstrap, s.topic, 19, timeout_ms=150000)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                len(stream.offsets(0)) >= POISON_OFFSET and len(stream.offsets(1)) >= 10):
            time.sleep(0.2)
        time.sleep(3)  # partition 0 stays held
        assert stream.offsets(0) == list(range(POISON_OFFSET)), stream.recs
        assert stream.offsets(1) == list(range(10)), stream.recs
        assert s.hole.accepted >= 1, "the proxy never tried the dead-letter cluster"
        s.dlt_back()
        recs = stream.wait(150)
        assert stream.offsets(0) == [i for i in range(10) if i != POISON_OFFSET]
        assert stream.offsets(1) == list(range(10))
        assert all(v != b"{not json" for _, _, _, v in recs), "the poison reached kafkajs"
        dlt = ps.read_dlt_records(s.dlt_ep, f"{s.topic}.dlt", 1)
        assert dlt[0].value == b"{not json"
        s.proxy.assert_running()
        s.proxy.stop_and_check()
    finally:
        if stream is not None:
            stream.kill()
        if s.proxy.proc is not None and s.proxy.proc.poll() is None:
            h.stop_process(s.proxy.proc)  # test_faults' cleanup fixture is not active here
        s.close()
