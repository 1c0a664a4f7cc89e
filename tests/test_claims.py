"""README claims that had no test: DLTs with more than one partition (origin
partition P goes to DLT partition P mod partitions, read back into the
ledger from every partition), the `antidote_held_partitions` gauge, and
`limits.shutdown_grace` with a response in flight.

Each test starts its own proxy (and its own dead-letter broker where it
kills it); names are unique, so the module runs beside others (xdist)."""

from __future__ import annotations

import socket
import struct
import time
import urllib.request
import uuid
from dataclasses import dataclass

import pytest

import clients as c
import conftest
import fault_support as fs
import harness as h
import poison_support as ps


def uid() -> str:
    return uuid.uuid4().hex[:8]


@dataclass
class AdminAntidote(fs.PolicyAntidote):
    """fault_support's policy proxy with an admin listener."""
    admin_port: int = 0

    def config_yaml(self) -> str:
        return super().config_yaml() + f"admin:\n  listen: {h.HOST}:{self.admin_port}\n"


def start(workdir, **kw) -> AdminAntidote:
    p = AdminAntidote(workdir, **kw)
    conftest._PROXIES.append(p)
    return p.start()


def metric_lines(p: AdminAntidote, name: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{h.HOST}:{p.admin_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


def wait_log(p, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in h.read_log(p.log, limit=10**7):
        assert time.monotonic() < deadline, f"{text!r} not logged\n{h.read_log(p.log)}"
        time.sleep(0.1)


# ---------------------------------------------------------------------------
# A DLT with three partitions
# ---------------------------------------------------------------------------

def test_dlt_with_three_partitions_gets_origin_partition_p_mod_3_once_each_across_restart(
        workdir, broker, broker_endpoint, tmp_path):
    topic = f"claims-dlt3-{uid()}"
    c.ck_create_topic(broker_endpoint, topic, 4)
    kinds = {0: ["valid", "bad", "valid", "bad"], 1: ["bad", "valid"],
             2: ["valid", "valid", "bad"], 3: ["bad", "bad", "valid"]}
    recs = {p: [c.Rec(p, i, f"k{p}-{i}".encode(),
                      b"{not json" if k == "bad" else f'{{"p": {p}, "i": {i}}}'.encode(),
                      (), 1_700_000_000_000 + i)
                for i, k in enumerate(ks)] for p, ks in kinds.items()}
    c.ck_produce(broker_endpoint, topic, [r for p in recs for r in recs[p]], **{"linger.ms": 100})
    valid = [r for p in recs for r, k in zip(recs[p], kinds[p]) if k == "valid"]
    poison = sorted((p, i) for p, ks in kinds.items() for i, k in enumerate(ks) if k == "bad")
    policy = fs.write_json_policy(tmp_path / "p", [topic])
    kw = dict(upstream=[broker.bootstrap], policy_paths=[str(policy)],
              dead_letter={"partitions": 3}, name="antidote-dlt3")

    first = start(workdir, **kw)
    try:
        got = c.kp_consume_assign(c.Endpoint(first.bootstrap), topic, [0, 1, 2, 3], len(valid),
                                  timeout=30)
        assert c.by_partition_in_order(got) == c.by_partition_in_order(valid)
    finally:
        first.stop_and_check()
    dlt = f"{topic}.dlt"
    from confluent_kafka.admin import AdminClient
    md = AdminClient(broker_endpoint.ck()).list_topics(dlt, timeout=10)
    assert sorted(md.topics[dlt].partitions) == [0, 1, 2], "DLT not created with 3 partitions"

    def where() -> list[tuple[int, int, int]]:
        """(DLT partition, origin partition, origin offset), read to each HW."""
        out = []
        for d in ps.read_dlt(broker_endpoint, dlt, partitions=3):
            hd = ps.hdict(d)
            out.append((d.partition, int(hd["x-original-partition"]),
                        int(hd["x-original-offset"])))
        return out

    placed = where()
    assert sorted((op, oo) for _, op, oo in placed) == poison, "each poison record once"
    assert all(dp == op % 3 for dp, op, _ in placed), placed
    for dp in range(3):  # one origin partition's diversions stay in order
        mine = [(op, oo) for p, op, oo in placed if p == dp]
        for op in {op for op, _ in mine}:
            offs = [oo for o, oo in mine if o == op]
            assert offs == sorted(offs), (dp, op, offs)

    # A new proxy loads its ledger from all three DLT partitions: reading
    # everything again writes nothing again.
    second = start(workdir, **kw)
    try:
        got = c.ck_consume_assign(c.Endpoint(second.bootstrap), topic, [0, 1, 2, 3], len(valid),
                                  timeout=30)
        assert c.by_partition_in_order(got) == c.by_partition_in_order(valid)
    finally:
        second.stop_and_check()
    assert sorted(where()) == sorted(placed), "a restarted proxy wrote a poison record again"


# ---------------------------------------------------------------------------
# antidote_held_partitions
# ---------------------------------------------------------------------------

def test_held_partitions_gauge_is_1_while_the_dlt_cannot_be_written_and_0_after(
        workdir, broker, broker_endpoint, tmp_path):
    topic = f"claims-held-{uid()}"
    c.ck_create_topic(broker_endpoint, topic, 2)
    dlt_broker = h.Tansu(workdir).start()
    hole = None
    policy = fs.write_json_policy(tmp_path / "p", [topic])
    p = start(workdir, upstream=[broker.bootstrap], policy_paths=[str(policy)],
              dead_letter={"bootstrap_servers": [dlt_broker.bootstrap], "timeout": "1s"},
              admin_port=h.free_port(), name="antidote-held")
    try:
        wait_log(p, "ledger rebuilt")
        fs.kill_hard(dlt_broker.proc)
        fs.wait_port_closed(dlt_broker.port, 10)
        hole = fs.BlackHole(dlt_broker.port).start()
        recs = [c.Rec(0, i, f"k{i}".encode(), b"{not json" if i == 2 else b'{"ok": 1}')
                for i in range(4)] + [c.Rec(1, 0, b"c", b'{"ok": 2}')]
        c.ck_produce(broker_endpoint, topic, recs)
        series = f'antidote_held_partitions{{topic="{topic}",partition="0"}}'
        clean = f'antidote_held_partitions{{topic="{topic}",partition="1"}}'

        got = h.decode_uncompressed_batches(ps.fetch_partition(p.broker_port(), topic).records)
        assert [r.offset for r in got] == [0, 1], "partition 0 not held before its poison"
        gauge = metric_lines(p, "antidote_held_partitions")
        assert gauge.get(series) == 1, gauge
        assert ps.fetch_partition(p.broker_port(), topic, partition=1).records, "p1 withheld"
        assert gauge.get(clean, 0) == 0, gauge

        hole.stop()
        hole = None
        fs.restart_tansu_on_same_port(dlt_broker)
        deadline = time.monotonic() + 30
        offsets: list[int] = []
        while offsets != [0, 1, 3] and time.monotonic() < deadline:
            offsets = [r.offset for r in h.decode_uncompressed_batches(
                ps.fetch_partition(p.broker_port(), topic).records)]
            time.sleep(0.2)
        assert offsets == [0, 1, 3], "partition 0 did not resume once the DLT was back"
        gauge = metric_lines(p, "antidote_held_partitions")
        assert gauge.get(series, 0) == 0, gauge
        p.stop_and_check()
    finally:
        if hole is not None:
            hole.stop()
        dlt_broker.stop()
        if p.proc is not None and p.proc.poll() is None:
            h.stop_process(p.proc)


# ---------------------------------------------------------------------------
# limits.shutdown_grace with a response in flight
# ---------------------------------------------------------------------------

def _send_fetch(port: int, topic: str) -> socket.socket:
    s = socket.create_connection((h.HOST, port), timeout=30)
    s.sendall(h.request_frame(1, 11, 7, h.fetch_v11_body(topic, 0, 0)))
    return s


def _read_response(s: socket.socket) -> bytes:
    size = struct.unpack(">i", h.recv_exact(s, 4))[0]
    body = h.recv_exact(s, size)
    assert struct.unpack(">i", body[:4])[0] == 7
    return body[4:]


@pytest.mark.parametrize("grace,answered", [("10s", True), ("500ms", False)],
                         ids=["grace-outlasts-response", "grace-cut-short"])
def test_shutdown_waits_for_a_response_in_flight_up_to_shutdown_grace(
        grace, answered, workdir, broker, broker_endpoint, tmp_path):
    """The dead-letter cluster is a black hole from the start, so the ledger
    never loads and a Fetch of the policy topic is answered only after
    `dead_letter.timeout` (3 s), withheld. SIGTERM arrives 0.5 s into it:
    with a 10 s grace the client still gets its response and the proxy then
    exits 0; with 500 ms the proxy exits 0 within about a second and the
    client's connection closes unanswered."""
    topic = f"claims-grace-{uid()}"
    c.ck_create_topic(broker_endpoint, topic, 1)
    c.ck_produce(broker_endpoint, topic, [c.Rec(0, 0, b"k", b'{"ok": 1}')])
    hole = fs.BlackHole(h.free_port()).start()
    policy = fs.write_json_policy(tmp_path / "p", [topic])
    p = start(workdir, upstream=[broker.bootstrap], policy_paths=[str(policy)],
              dead_letter={"bootstrap_servers": [f"{h.HOST}:{hole.port}"], "timeout": "3s"},
              limits={"shutdown_grace": grace}, name=f"antidote-grace-{grace}")
    try:
        wait_log(p, "upstream metadata fetched; ready")
        s = _send_fetch(p.broker_port(), topic)
        time.sleep(0.5)
        t0 = time.monotonic()
        p.proc.send_signal(15)
        if answered:
            err, parts = h.parse_fetch_v11(_read_response(s))
            assert err == 0 and parts[topic][0].records == b"", "expected the withheld answer"
            code = p.proc.wait(15)
            assert code == 0, h.read_log(p.log)
            assert time.monotonic() - t0 >= 2.0, "exited before the response was due"
        else:
            code = p.proc.wait(15)
            took = time.monotonic() - t0
            assert code == 0, h.read_log(p.log)
            assert took < 2.0, f"shutdown took {took:.1f}s with a 500ms grace"
            with pytest.raises((ConnectionError, socket.timeout, OSError)):
                _read_response(s)
        s.close()
    finally:
        hole.stop()
        if p.proc is not None and p.proc.poll() is None:
            h.stop_process(p.proc)


# ---------------------------------------------------------------------------
# Concurrent diversions of the same record, joined by the ledger
# ---------------------------------------------------------------------------

class SlowRelay:
    """A TCP relay that holds every chunk going to `target` for `delay`
    seconds: a dead-letter cluster whose acknowledgements take that long,
    so two fetches of the same poison record overlap its write for sure."""

    def __init__(self, target: int, delay: float):
        import threading
        self.target, self.delay = target, delay
        self.srv = socket.create_server((h.HOST, 0))
        self.port = self.srv.getsockname()[1]
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading
        while not self.stopped.is_set():
            try:
                cl, _ = self.srv.accept()
            except OSError:
                return
            up = socket.create_connection((h.HOST, self.target))
            threading.Thread(target=self._pipe, args=(cl, up, self.delay), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, cl, 0), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, delay: float) -> None:
        try:
            while data := src.recv(65536):
                if delay:
                    time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self.stopped.set()
        self.srv.close()


def test_two_fetches_of_the_same_poison_at_once_write_it_to_the_dlt_once(
        workdir, broker, broker_endpoint, tmp_path):
    """Two connections fetch the same poison record at the same moment while
    the DLT takes 0.7 s per request: the second diversion must join the
    first one's write (README: the ledger joins concurrent diversions). The
    first diversion to a new DLT takes about ten requests (create the topic,
    find the lease's coordinator, InitProducerId, its expiration, the lease
    marker, the read to the end, the write): the fetches wait up to 40 s."""
    import threading
    topic = f"claims-join-{uid()}"
    c.ck_create_topic(broker_endpoint, topic, 1)
    c.ck_produce(broker_endpoint, topic, [c.Rec(0, i, f"k{i}".encode(),
                                                b"{not json" if i == 1 else b'{"ok": 1}')
                                          for i in range(3)])
    dlt_broker = h.Tansu(workdir).start()
    relay = SlowRelay(dlt_broker.port, 0.7)
    policy = fs.write_json_policy(tmp_path / "p", [topic])
    p = start(workdir, upstream=[broker.bootstrap], policy_paths=[str(policy)],
              dead_letter={"bootstrap_servers": [f"{h.HOST}:{relay.port}"], "timeout": "20s"},
              name="antidote-join")
    try:
        wait_log(p, "ledger rebuilt", timeout=60)
        results: list = [None, None]

        def fetch(i: int) -> None:
            results[i] = ps.fetch_partition(p.broker_port(), topic, timeout=40)

        threads = [threading.Thread(target=fetch, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for r in results:
            assert r is not None, "a fetch did not complete"
            assert [x.offset for x in h.decode_uncompressed_batches(r.records)] == [0, 2]
        dlt = ps.read_dlt(c.Endpoint(dlt_broker.bootstrap), f"{topic}.dlt")
        assert [ps.hdict(d)["x-original-offset"] for d in dlt] == [b"1"], \
            f"{len(dlt)} DLT records for one poison record"
        p.stop_and_check()
    finally:
        relay.stop()
        dlt_broker.stop()
        if p.proc is not None and p.proc.poll() is None:
            h.stop_process(p.proc)


# ---------------------------------------------------------------------------
# One Fetch response of 256 KiB or more: partitions judged in parallel
# ---------------------------------------------------------------------------

def _fetch_all_partitions_body(topic: str, partitions: int, max_bytes: int) -> bytes:
    """A Fetch v11 body for partitions 0..n-1 of `topic` from offset 0."""
    body = struct.pack(">iiiib", -1, 500, 1, max_bytes, 0) + struct.pack(">ii", 0, -1)
    body += struct.pack(">i", 1) + h.kstr(topic) + struct.pack(">i", partitions)
    for p in range(partitions):
        body += struct.pack(">iiqqi", p, -1, 0, -1, max_bytes)
    return body + struct.pack(">i", 0) + h.kstr("")


def test_a_response_over_256_kib_with_poison_in_every_partition_is_judged_exactly(
        workdir, broker, broker_endpoint, tmp_path):
    """Four partitions of ~120 KiB each in one Fetch response (over the
    256 KiB at which src/filter.rs plans partitions on blocking threads),
    poison at different offsets in each: every partition loses exactly its
    poison, and the DLT holds each poison record once."""
    topic = f"claims-par-{uid()}"
    parts, per = 4, 200
    c.ck_create_topic(broker_endpoint, topic, parts)
    pad = "x" * 560
    bad = {p: {7 + p * 11, 100 + p, per - 1 - p} for p in range(parts)}
    recs = [c.Rec(p, i, f"k{p}-{i}".encode(),
                  b"{not json" if i in bad[p] else f'{{"p": {p}, "i": {i}, "pad": "{pad}"}}'.encode(),
                  (), 1_700_000_000_000 + i)
            for p in range(parts) for i in range(per)]
    c.ck_produce(broker_endpoint, topic, recs, **{"linger.ms": 50})
    policy = fs.write_json_policy(tmp_path / "p", [topic])
    p = start(workdir, upstream=[broker.bootstrap], policy_paths=[str(policy)],
              name="antidote-par")
    try:
        body = _fetch_all_partitions_body(topic, parts, 4 << 20)
        with socket.create_connection((h.HOST, broker.port), timeout=10) as s:
            s.settimeout(10)
            _, direct = h.parse_fetch_v11(h.roundtrip(s, 1, 11, 3, body))
        size = sum(len(x.records or b"") for x in direct[topic])
        assert size >= 256 * 1024, f"premise: the response holds {size} bytes of records"
        assert all(x.high_watermark == per for x in direct[topic]), "premise: all records fetched"
        with socket.create_connection((h.HOST, p.broker_port()), timeout=30) as s:
            s.settimeout(30)
            err, via = h.parse_fetch_v11(h.roundtrip(s, 1, 11, 3, body))
        assert err == 0
        for part in sorted(via[topic], key=lambda x: x.partition):
            # A batch that lost its last record ends in a commit marker
            # (a control batch): not a record a client sees.
            data = b"".join(b.bytes for b in ps.split_batches(part.records)
                            if not b.attributes & 0x20)
            got = [r.offset for r in h.decode_uncompressed_batches(data)]
            want = [i for i in range(per) if i not in bad[part.partition]]
            assert got == want, f"partition {part.partition}: {sorted(set(want) ^ set(got))}"
        dlt = ps.read_dlt(broker_endpoint, f"{topic}.dlt")
        placed = sorted((int(ps.hdict(d)["x-original-partition"]),
                         int(ps.hdict(d)["x-original-offset"])) for d in dlt)
        assert placed == sorted((q, i) for q in range(parts) for i in bad[q])
        p.stop_and_check()
    finally:
        if p.proc is not None and p.proc.poll() is None:
            h.stop_process(p.proc)
