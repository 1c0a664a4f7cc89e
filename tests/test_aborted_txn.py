"""Aborted transactions end to end. tansu 0.6 answers read_committed Fetches
with an empty aborted-transactions list (test_poison.py's transaction test
skips for that reason), so `AbortListFront`, a relay in front of tansu,
adds the list a Kafka broker would send: it caps Fetch at v11 in
ApiVersions answers and writes `[(producer id, first offset)]` of the
aborted transaction into every read_committed Fetch v11 response of the
topic. Everything else is tansu's own bytes (records, markers, offsets).

The proxy must pass the list through, divert only committed poison (an
aborted record is never delivered, so it is not judged into a DLT), and
clients reading through it must see exactly the committed valid records."""

from __future__ import annotations

import socket
import struct
import threading
import uuid

import confluent_kafka as ck
import pytest

import clients as c
import harness as h
import poison_support as ps


def _read_frame(s: socket.socket) -> bytes | None:
    try:
        head = h.recv_exact(s, 4)
        return head + h.recv_exact(s, struct.unpack(">i", head)[0])
    except (ConnectionError, OSError):
        return None


def _cap_fetch_in_api_versions(frame: bytes, version: int) -> bytes:
    """Set Fetch's max version to 11 in an ApiVersions response frame."""
    b = bytearray(frame)
    pos = 4 + 4 + 2                        # size, correlation id, error code
    if version >= 3:                       # compact array: uvarint length + 1
        n, shift = 0, 0
        while True:
            x = b[pos]
            pos += 1
            n |= (x & 0x7F) << shift
            shift += 7
            if not x & 0x80:
                break
        count, entry = n - 1, 7            # key, min, max, empty tagged fields
    else:
        count, entry = struct.unpack_from(">i", b, pos)[0], 6
        pos += 4
    for i in range(count):
        at = pos + i * entry
        key, lo, hi = struct.unpack_from(">hhh", b, at)
        if key == 1 and hi > 11:
            struct.pack_into(">h", b, at + 4, 11)
    return bytes(b)


def _fetch_v11_body(error: int, session: int, topics: dict) -> bytes:
    out = struct.pack(">ihi", 0, error, session) + struct.pack(">i", len(topics))
    for name, parts in topics.items():
        out += h.kstr(name) + struct.pack(">i", len(parts))
        for p in parts:
            out += struct.pack(">ihqqq", p.partition, p.error_code, p.high_watermark,
                               p.last_stable_offset, p.log_start_offset)
            if p.aborted is None:
                out += struct.pack(">i", -1)
            else:
                out += struct.pack(">i", len(p.aborted))
                out += b"".join(struct.pack(">qq", pid, first) for pid, first in p.aborted)
            out += struct.pack(">i", p.preferred_read_replica)
            out += struct.pack(">i", -1) if p.records is None else \
                struct.pack(">i", len(p.records)) + p.records
    return out


class AbortListFront:
    """Relays 127.0.0.1:port to tansu, adding aborted-transaction lists."""

    def __init__(self, port: int, target: int):
        self.target = target
        self.aborted: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self.injected = 0
        self.srv = socket.create_server((h.HOST, port))
        self.port = self.srv.getsockname()[1]
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                cl, _ = self.srv.accept()
                up = socket.create_connection((h.HOST, self.target), timeout=10)
            except OSError:
                return
            up.settimeout(None)
            pending: dict[int, tuple[int, int, int]] = {}
            threading.Thread(target=self._requests, args=(cl, up, pending), daemon=True).start()
            threading.Thread(target=self._responses, args=(up, cl, pending), daemon=True).start()

    def _requests(self, cl, up, pending) -> None:
        while (f := _read_frame(cl)) is not None:
            key, ver, corr = struct.unpack_from(">hhi", f, 4)
            iso = 0
            if key == 1 and ver == 11:
                cid = struct.unpack_from(">h", f, 12)[0]
                iso = f[14 + max(cid, 0) + 16]      # after replica, wait, min, max
            pending[corr] = (key, ver, iso)
            try:
                up.sendall(f)
            except OSError:
                break
        self._close(cl, up)

    def _responses(self, up, cl, pending) -> None:
        while (f := _read_frame(up)) is not None:
            corr = struct.unpack_from(">i", f, 4)[0]
            key, ver, iso = pending.pop(corr, (None, None, 0))
            if key == 18:
                f = _cap_fetch_in_api_versions(f, ver)
            elif key == 1 and ver == 11 and iso == 1:
                f = self._add_aborted(f)
            try:
                cl.sendall(f)
            except OSError:
                break
        self._close(cl, up)

    def _add_aborted(self, f: bytes) -> bytes:
        corr = f[4:8]
        error, topics = h.parse_fetch_v11(f[8:])
        session = struct.unpack_from(">i", f, 14)[0]
        for name, parts in topics.items():
            for p in parts:
                if (name, p.partition) in self.aborted:
                    p.aborted = self.aborted[(name, p.partition)]
                    self.injected += 1
        body = corr + _fetch_v11_body(error, session, topics)
        return struct.pack(">i", len(body)) + body

    @staticmethod
    def _close(*socks) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self.stopped.set()
        self.srv.close()


@pytest.fixture
def fronted(workdir, tmp_path):
    """tansu advertising the front's port, and a policy proxy behind the front."""
    port = h.free_port()
    t = h.Tansu(workdir, advertised_port=port).start()
    front = AbortListFront(port, t.port)
    pfile = ps.write_policies(tmp_path / "policies")
    proxy = ps.start_policy_proxy(workdir, upstream=[f"{h.HOST}:{port}"], policies=[pfile],
                                  name="antidote-aborted")
    yield t, front, proxy
    proxy.stop_and_check()
    front.stop()
    t.stop()


def _pid(batch: ps.BatchHeader) -> int:
    return struct.unpack_from(">q", batch.bytes, 43)[0]


def test_aborted_poison_is_neither_delivered_nor_diverted_committed_poison_is(fronted):
    t, front, proxy = fronted
    ep = c.Endpoint(f"{h.HOST}:{front.port}", "direct")
    topic = ps.unique_topic(ps.JSON_PREFIX, "aborted")
    c.ck_create_topic(ep, topic, 1)
    p = ck.Producer(ep.ck(**{"transactional.id": f"ab-{uuid.uuid4().hex[:8]}"}))
    p.init_transactions(30)
    txns = [(True, ["valid", "lat", "valid"]),     # committed poison: diverted
            (False, ["nan", "valid", "enum"]),     # aborted poison: never seen, never diverted
            (True, ["garbage", "valid"])]
    i = 0
    for commit, kinds in txns:
        p.begin_transaction()
        for k in kinds:
            r = ps.json_rec(k, i)
            p.produce(topic, key=r.key, value=r.value, headers=list(r.headers), partition=0,
                      timestamp=r.timestamp)
            i += 1
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)
    # The aborted transaction: the second data batch (control batches are markers).
    data = [b for b in ps.split_batches(ps.fetch_partition(t.port, topic).records)
            if not b.attributes & 0x20]
    assert len(data) == 3, data
    front.aborted[(topic, 0)] = [(_pid(data[1]), data[1].base_offset)]
    # Premise: through the front alone, read_committed readers skip the aborted records.
    committed_keys = [b"k-0-0", b"k-0-1", b"k-0-2", b"k-0-6", b"k-0-7"]
    direct = c.kp_consume_assign(ep, topic, [0], 5, timeout=30, isolation_level="read_committed")
    assert [r.key for r in direct] == committed_keys
    assert front.injected, "the front added no aborted list"

    expected = [r for r in direct if r.key not in {b"k-0-1", b"k-0-6"}]
    via = c.Endpoint(proxy.bootstrap, "proxy")
    last = expected[-1].offset
    until = lambda got: any(r.offset >= last for r in got)  # noqa: E731
    got = c.kp_consume_assign(via, topic, [0], len(expected), timeout=30,
                              isolation_level="read_committed", until=until)
    assert got == expected
    got = c.ck_consume_assign(via, topic, [0], len(expected), timeout=30,
                              **{"isolation.level": "read_committed"}, until=until)
    assert got == expected
    # Through the proxy, the aborted list arrives as the broker sent it.
    fp = ps.fetch_partition(proxy.broker_port(), topic, isolation_level=1)
    assert fp.aborted == front.aborted[(topic, 0)]
    dlt = ps.sorted_by_origin(ps.read_dlt(ep, f"{topic}.dlt"))
    assert [d.key for d in dlt] == [b"k-0-1", b"k-0-6"], "only committed poison is diverted"
