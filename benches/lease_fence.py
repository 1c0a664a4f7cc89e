"""What fencing costs on Apache Kafka, per DLT write and per lease (issue 32).

Measures, against one Kafka broker (started here from the suite's harness
unless --bootstrap names a running one), N times each:

  idempotent_write     one record, acks=all, idempotent producer, waited for:
                       a DLT write under a held lease today (librdkafka).
  transactional_write  begin_transaction, one record, commit_transaction:
                       a DLT write in a real transaction (librdkafka), the
                       design that would fence at the coordinator on every
                       write and needs no lease marker.
  lease_init           InitProducerId with a transactional id (raw
                       protocol): today's lease before its marker write
                       (the marker costs one idempotent_write more).
  lease_abort_fence    InitProducerId, AddPartitionsToTxn, EndTxn(abort),
                       DescribeTransactions until CompleteAbort (raw
                       protocol): a lease that leaves an ABORT control batch
                       of its epoch in the partition instead of a marker
                       record (what `dlt replay` does now).

Prints one line per measure (ms: mean, p50, p90, p99, max) and, with
--raw FILE, writes every sample as JSON lines. --check-fencing only checks
that a transaction is fenced by a newer InitProducerId of its id (no marker
record needed) and that its record stays unread under read_committed.

    .venv/bin/python benches/lease_fence.py -n 200 --raw benches/results/x.jsonl
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import confluent_kafka as ck  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

import harness as h  # noqa: E402


def uvarint(n: int) -> bytes:
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7


class Raw:
    """One connection to the broker (single broker: it is the coordinator)."""

    def __init__(self, host: str, port: int):
        self.s = socket.create_connection((host, port), timeout=10)
        self.corr = 0

    def call(self, key: int, version: int, body: bytes) -> bytes:
        self.corr += 1
        return h.roundtrip(self.s, key, version, self.corr, body)

    def call_flexible(self, key: int, version: int, body: bytes) -> bytes:
        """Request header v2, response header v1 (tagged fields skipped)."""
        self.corr += 1
        header = struct.pack(">hhi", key, version, self.corr) + h.kstr("lease-bench") + b"\x00"
        payload = header + body
        self.s.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", h.recv_exact(self.s, 4))[0]
        resp = h.recv_exact(self.s, size)
        assert struct.unpack(">i", resp[:4])[0] == self.corr
        _, pos = read_uvarint(resp, 4)  # no tagged fields expected: 0
        return resp[pos:]

    def init_producer_id(self, tid: str) -> tuple[int, int]:
        while True:
            r = self.call(22, 1, h.kstr(tid) + struct.pack(">i", 60_000))
            _, err, pid, epoch = struct.unpack(">ihqh", r[:16])
            if err == 51:  # CONCURRENT_TRANSACTIONS
                time.sleep(0.005)
                continue
            assert err == 0, f"InitProducerId error {err}"
            return pid, epoch

    def add_partition(self, tid: str, pid: int, epoch: int, topic: str, p: int) -> None:
        body = (h.kstr(tid) + struct.pack(">qh", pid, epoch) + struct.pack(">i", 1)
                + h.kstr(topic) + struct.pack(">ii", 1, p))
        r = self.call(24, 1, body)
        # throttle, [name, [partition, error]]
        pos = 4 + 4
        n = struct.unpack_from(">h", r, pos)[0]
        pos += 2 + n + 4
        _, err = struct.unpack_from(">ih", r, pos)
        assert err == 0, f"AddPartitionsToTxn error {err}"

    def end_txn(self, tid: str, pid: int, epoch: int, commit: bool) -> None:
        r = self.call(26, 1, h.kstr(tid) + struct.pack(">qhb", pid, epoch, int(commit)))
        err = struct.unpack_from(">h", r, 4)[0]
        assert err == 0, f"EndTxn error {err}"

    def describe(self, tid: str) -> tuple[str, int]:
        b = tid.encode()
        body = uvarint(2) + uvarint(len(b) + 1) + b + b"\x00"
        r = self.call_flexible(65, 0, body)
        pos = 4
        _, pos = read_uvarint(r, pos)  # states: 1 + 1
        err = struct.unpack_from(">h", r, pos)[0]
        pos += 2
        assert err == 0, f"DescribeTransactions error {err}"
        n, pos = read_uvarint(r, pos)
        pos += n - 1  # transactional id
        n, pos = read_uvarint(r, pos)
        state = r[pos:pos + n - 1].decode()
        pos += n - 1 + 4 + 8 + 8  # timeout, start time, producer id
        epoch = struct.unpack_from(">h", r, pos)[0]
        return state, epoch


def check_transactional_fencing(bootstrap: str, topic: str) -> str:
    """Does a real transaction fence without a marker record? Producer 1
    opens a transaction and writes; producer 2 (same transactional id)
    runs init_transactions; producer 1's commit must fail and its record
    must not be readable by a read_committed consumer."""
    tid = f"lease-bench-zombie-{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": bootstrap, "transactional.id": tid, "acks": "all"}
    p1 = ck.Producer(conf)
    p1.init_transactions(30)
    p1.begin_transaction()
    p1.produce(topic, b"zombie", key=b"zombie")
    p1.flush(30)
    p2 = ck.Producer(conf)
    p2.init_transactions(30)
    try:
        p1.commit_transaction(30)
        outcome = "producer 1 committed after producer 2's InitProducerId: NOT fenced"
    except ck.KafkaException as e:
        err = e.args[0]
        outcome = (f"producer 1's commit refused: {err.name()} (fatal={err.fatal()}, "
                   f"abortable={err.txn_requires_abort()})")
    seen = {}
    for level in ("read_committed", "read_uncommitted"):
        c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"zombie-{tid}-{level}",
                         "isolation.level": level, "auto.offset.reset": "earliest",
                         "enable.partition.eof": True})
        c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        n, deadline = 0, time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == ck.KafkaError._PARTITION_EOF:
                    break
                continue
            n += m.key() == b"zombie"
        c.close()
        seen[level] = n
    return f"{outcome}; the fenced transaction's record is read {seen}"


def stats(xs: list[float]) -> str:
    s = sorted(xs)

    def q(p):
        return s[min(len(s) - 1, int(p * len(s)))]
    return (f"mean {statistics.fmean(s):7.2f}  p50 {q(0.5):7.2f}  p90 {q(0.9):7.2f}  "
            f"p99 {q(0.99):7.2f}  max {s[-1]:7.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--bootstrap", help="host:port of a running single Kafka broker")
    ap.add_argument("--raw", help="write every sample (ms) here as JSON lines")
    ap.add_argument("--check-fencing", action="store_true",
                    help="only check that a transaction is fenced by a newer InitProducerId")
    args = ap.parse_args()
    broker = None
    if args.bootstrap:
        bootstrap = args.bootstrap
    else:
        import tempfile
        broker = h.KafkaBroker(Path(tempfile.mkdtemp(prefix="lease-bench-"))).start()
        bootstrap = broker.bootstrap
    host, port = bootstrap.rsplit(":", 1)
    try:
        h.ensure_transaction_coordinator(bootstrap)
        topic = f"lease-bench-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        if args.check_fencing:
            print("transactional fencing:", check_transactional_fencing(bootstrap, topic))
            return
        samples: dict[str, list[float]] = {}

        idem = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                            "acks": "all", "linger.ms": 0})
        idem.produce(topic, b"warm-up")
        idem.flush(30)
        xs = []
        for i in range(args.n):
            t = time.perf_counter()
            idem.produce(topic, b"x" * 200, key=b"k%d" % i)
            assert idem.flush(30) == 0
            xs.append((time.perf_counter() - t) * 1000)
        samples["idempotent_write"] = xs

        txn = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                           "transactional.id": f"lease-bench-{uuid.uuid4().hex[:8]}"})
        txn.init_transactions(30)
        xs = []
        for i in range(args.n + 1):
            t = time.perf_counter()
            txn.begin_transaction()
            txn.produce(topic, b"x" * 200, key=b"t%d" % i)
            txn.commit_transaction(30)
            if i:  # the first adds the partition's first-time costs
                xs.append((time.perf_counter() - t) * 1000)
        samples["transactional_write"] = xs

        raw = Raw(host, int(port))
        tid = f"lease-bench-raw-{uuid.uuid4().hex[:8]}"
        raw.init_producer_id(tid)
        xs = []
        for _ in range(args.n):
            t = time.perf_counter()
            raw.init_producer_id(tid)
            xs.append((time.perf_counter() - t) * 1000)
        samples["lease_init"] = xs

        xs, polls = [], []
        for _ in range(args.n):
            t = time.perf_counter()
            pid, epoch = raw.init_producer_id(tid)
            raw.add_partition(tid, pid, epoch, topic, 0)
            raw.end_txn(tid, pid, epoch, commit=False)
            n = 0
            while True:
                n += 1
                state, e = raw.describe(tid)
                assert e == epoch, (e, epoch)
                if state == "CompleteAbort":
                    break
                time.sleep(0.002)
            xs.append((time.perf_counter() - t) * 1000)
            polls.append(n)
        samples["lease_abort_fence"] = xs

        for name, xs in samples.items():
            print(f"{name:20s} n={len(xs):4d}  ms: {stats(xs)}")
        print(f"lease_abort_fence: DescribeTransactions asked {statistics.fmean(polls):.2f} "
              f"times on average (max {max(polls)})")
        if args.raw:
            with open(args.raw, "w") as f:
                for name, xs in samples.items():
                    for x in xs:
                        f.write(json.dumps({"measure": name, "ms": round(x, 4)}) + "\n")
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
