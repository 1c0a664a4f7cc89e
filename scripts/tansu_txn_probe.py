#!/usr/bin/env python3
"""What tansu does with producer ids and transactions, against a tansu started
here on loopback (issue 13, step 3). Prints one line per probe, `OK` or `WRONG`,
and exits 1 if any probe finds tansu diverging from Kafka.

Run: .venv/bin/python scripts/tansu_txn_probe.py   (needs .tools/bin/tansu)

Probes:
  list-offsets-by-time
                      ListOffsets with a timestamp answers the first offset
                      whose timestamp is at or after it
  idempotent-pids     two InitProducerId without a transactional id get
                      different producer ids (Kafka: a fresh id each)
  concurrent-idempotent-pids
                      the same, three at once from three connections (tansu
                      handed id 1 to three antidote instances starting at
                      once; their DLT writes then fenced each other, error 90)
  txn-epoch-bump      two InitProducerId with the same transactional id get the
                      same producer id and a higher epoch the second time
  open-txn-hidden     records of a transaction not yet committed are not
                      visible to a read_committed reader
  zombie-fenced       producer A (transactional.id T) begins, writes, does not
                      commit; B inits T: A's commit must fail (fenced) and a
                      read_committed reader must not see A's records
  committed-visible   B's committed records are visible to read_committed
"""
from __future__ import annotations

import socket
import struct
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import harness as h  # noqa: E402
import confluent_kafka as ck  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402


def init_pid(port: int, txn_id, corr: int) -> tuple[int, int, int]:
    """InitProducerId v4 (flexible; tansu answers v0/v1 with error -1):
    (error, producer id, epoch)."""
    with socket.create_connection((h.HOST, port), timeout=10) as s:
        hdr = struct.pack(">hhi", 22, 4, corr) + h.kstr("probe") + b"\x00"
        tid = b"\x00" if txn_id is None else bytes([len(txn_id) + 1]) + txn_id.encode()
        body = tid + struct.pack(">iqh", 60000, -1, -1) + b"\x00"
        s.sendall(struct.pack(">i", len(hdr + body)) + hdr + body)
        n = struct.unpack(">i", h.recv_exact(s, 4))[0]
        r = h.recv_exact(s, n)
        _thr, err, pid, epoch = struct.unpack(">ihqh", r[5:21])  # corr id, no header tags
        return err, pid, epoch


def count_committed(bootstrap: str, topic: str, settle: float = 3.0) -> int:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "probe-" + uuid.uuid4().hex,
                     "isolation.level": "read_committed", "enable.auto.commit": False,
                     "log_level": 3})
    c.assign([ck.TopicPartition(topic, 0, 0)])
    n, deadline = 0, time.monotonic() + settle
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            n += 1
    c.close()
    return n


def probe_offsets_for_times(bs: str) -> int:
    """ListOffsets by timestamp (what `dlt replay` bounds its read of a
    target with): five records 1 s apart; 1 if tansu answers wrongly."""
    topic = "probe-times-" + uuid.uuid4().hex[:6]
    AdminClient({"bootstrap.servers": bs}).create_topics([NewTopic(topic, 1, 1)])
    time.sleep(1)
    p = ck.Producer({"bootstrap.servers": bs, "log_level": 3})
    t0 = 1_700_000_000_000
    for i in range(5):
        p.produce(topic, value=b"v", partition=0, timestamp=t0 + i * 1000)
        p.flush(10)
    c = ck.Consumer({"bootstrap.servers": bs, "group.id": "probe-" + uuid.uuid4().hex,
                     "log_level": 3})
    got = [c.offsets_for_times([ck.TopicPartition(topic, 0, t0 + ms)], timeout=10)[0].offset
           for ms in (0, 2500, 9000)]
    c.close()
    ok = got == [0, 3, -1]
    print(f"{'OK' if ok else 'WRONG'} list-offsets-by-time: for t0, t0+2.5s, t0+9s got {got} "
          "(want [0, 3, -1]; an answer at or below the true offset is still a safe lower bound)")
    return 0 if ok else 1


def main() -> int:
    import tempfile
    wrong = 0
    d = Path(tempfile.mkdtemp(prefix="tansu-probe-"))
    broker = h.Tansu(d).start()
    try:
        port, bs = broker.port, broker.bootstrap
        a, b = init_pid(port, None, 1), init_pid(port, None, 2)
        ok = a[0] == 0 and b[0] == 0 and a[1] != b[1]
        wrong += not ok
        print(f"{'OK' if ok else 'WRONG'} idempotent-pids: {a} then {b}")

        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(3) as pool:
            got = list(pool.map(lambda i: init_pid(port, None, 10 + i), range(3)))
        pids = [g[1] for g in got]
        ok = all(g[0] == 0 for g in got) and len(set(pids)) == 3
        wrong += not ok
        print(f"{'OK' if ok else 'WRONG'} concurrent-idempotent-pids: three InitProducerId at "
              f"once got producer ids {pids} (want three different ones)")

        a, b = init_pid(port, "", 20), init_pid(port, "", 21)
        print(f"NOTE empty-transactional-id: {a} then {b}: tansu takes \"\" as one shared "
              "transactional id (same producer id, next epoch; Kafka answers INVALID_REQUEST). "
              "kafka-protocol's InitProducerIdRequest::default() sends \"\", not null: this is "
              "how every antidote instance got producer id 1 and fenced the others (error 90)")

        wrong += probe_offsets_for_times(bs)

        t = "probe-txn-" + uuid.uuid4().hex[:6]
        a, b = init_pid(port, t, 3), init_pid(port, t, 4)
        ok = a[0] == 0 and b[0] == 0 and a[1] == b[1] and b[2] > a[2]
        wrong += not ok
        print(f"{'OK' if ok else 'WRONG'} txn-epoch-bump: {a} then {b}")

        topic = "probe-" + uuid.uuid4().hex[:6]
        AdminClient({"bootstrap.servers": bs}).create_topics([NewTopic(topic, 1, 1)])
        time.sleep(1)
        tid = "probe-fence-" + uuid.uuid4().hex[:6]
        conf = {"bootstrap.servers": bs, "transactional.id": tid, "log_level": 3,
                "transaction.timeout.ms": 60000}
        pa = ck.Producer(conf)
        pa.init_transactions(10)
        pa.begin_transaction()
        for i in range(3):
            pa.produce(topic, value=f"zombie-{i}".encode(), partition=0)
        pa.flush(10)
        seen = count_committed(bs, topic)
        ok = seen == 0
        wrong += not ok
        print(f"{'OK' if ok else 'WRONG'} open-txn-hidden: read_committed sees {seen} of an "
              "open transaction's 3 records (want 0)")
        pb = ck.Producer(conf)
        t0 = time.monotonic()
        pb.init_transactions(30)
        init_s = time.monotonic() - t0
        fenced = False
        try:
            pa.commit_transaction(10)
        except ck.KafkaException as e:
            fenced = True
            print(f"   A's commit after B's init: {e}")
        seen = count_committed(bs, topic)
        ok = fenced and seen == 0
        wrong += not ok
        print(f"{'OK' if ok else 'WRONG'} zombie-fenced: A commit failed={fenced}, "
              f"read_committed sees {seen} of A's 3 records (B's init took {init_s:.2f}s)")
        pb.begin_transaction()
        for i in range(2):
            pb.produce(topic, value=f"b-{i}".encode(), partition=0)
        pb.commit_transaction(10)
        seen = count_committed(bs, topic)
        ok = seen == 2
        wrong += not ok
        print(f"{'OK' if ok else 'WRONG'} committed-visible: read_committed sees {seen} "
              f"records (want 2: B's)")
    finally:
        broker.stop()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
