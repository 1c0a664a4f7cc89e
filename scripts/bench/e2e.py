#!/usr/bin/env python3
"""Load generator and consumers for scripts/bench-e2e.sh (confluent-kafka).

  produce   BOOTSTRAP TOPIC N POISON_EVERY      one-shot bulk produce, prints JSON
  consume   BOOTSTRAP TOPIC PARTS EXPECTED GROUP  read from the beginning until EXPECTED
                                                records (or idle timeout), prints JSON
  consume-perf BOOTSTRAP TOPIC EXPECTED GROUP    read EXPECTED records with Apache Kafka's own
                                                ConsumerPerformance (Java, in a group), prints
                                                the same JSON as consume (no poison check)
  consume-share BOOTSTRAP TOPIC EXPECTED GROUP   the same with Kafka's ShareConsumerPerformance (a
                                                share group, its share.auto.offset.reset set to
                                                earliest first, straight at BENCH_ADMIN_BOOTSTRAP)
  create    BOOTSTRAP TOPIC PARTS               create a topic (Admin API; Kafka or tansu)
  latency   BOOTSTRAP PRODUCE_BOOTSTRAP TOPIC PARTS RATE SECONDS
                                                produce at RATE msg/s (child process, straight to
                                                the broker) while consuming via BOOTSTRAP; p50/p99
            and, at the same time, via PRODUCE_BOOTSTRAP directly (paired baseline): the
            same records, the same broker delays, so the difference is the path's own
"""
import json, os, sys, time, multiprocessing as mp

from confluent_kafka import Consumer, Producer, TopicPartition, OFFSET_BEGINNING, OFFSET_END

BASE_TS_MS = int(time.time() * 1000)
TRANSITIONS = ("ENTER", "EXIT", "DWELL")


POISON_MARK = b'"lat":91.500000'
# Binary formats (scripts/bench/deterministic.py with BENCH_FORMAT) mark
# poison by the bytes of latitude 91.5 instead.
if os.environ.get("BENCH_POISON_MARK_HEX"):
    POISON_MARK = bytes.fromhex(os.environ["BENCH_POISON_MARK_HEX"])


def value(i: int, poison: bool) -> bytes:
    lat = 91.5 if poison else 48.0 + (i % 1000) * 0.001234
    return ('{"device_id":"device-%08d-a1b2c3d4e5f6","geofence_id":"fence-%05d-warehouse-north",'
            '"lat":%.6f,"lon":%.6f,"transition":"%s","speed_mps":%.2f,"event_time_ms":%d,"accuracy_m":%.1f}'
            % (i % 100000, i % 5000, lat, 2.0 + (i % 777) * 0.00321, TRANSITIONS[i % 3],
               (i % 40) * 0.75, int(time.time() * 1000), 3.5 + i % 10)).encode()


def producer(bootstrap: str, **extra) -> Producer:
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_000_000,
            "acks": 1, "enable.idempotence": False,
            "compression.type": os.environ.get("BENCH_COMPRESSION", "none")}
    conf.update(extra)
    return Producer(conf)


def cmd_produce(bootstrap, topic, n, poison_every):
    n, poison_every = int(n), int(poison_every)
    p = producer(bootstrap)
    errors = []
    def cb(err, _msg):
        if err is not None:
            errors.append(str(err))
    t0 = time.time()
    nbytes = 0
    poison = 0
    for i in range(n):
        is_poison = poison_every > 0 and i % poison_every == poison_every // 2
        poison += is_poison
        v = value(i, is_poison)
        nbytes += len(v)
        while True:
            try:
                p.produce(topic, v, key=b"device-%08d" % (i % 100000), partition=i % 3,
                          headers=[("idempotency-key", b"k-%012d" % i)], on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10000 == 0:
            p.poll(0)
    left = p.flush(120)
    dt = time.time() - t0
    print(json.dumps({"produced": n, "poison": poison, "value_bytes": nbytes, "seconds": round(dt, 3),
                      "avg_value_bytes": round(nbytes / max(n, 1), 1),
                      "unflushed": left, "errors": errors[:5], "error_count": len(errors)}))
    return 0 if not errors and left == 0 else 1


def consumer(bootstrap, group, **extra):
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": int(os.environ.get("BENCH_FETCH_WAIT_MS", "10")),
            "enable.partition.eof": False,
            # librdkafka pauses fetching this long once 100,000 records are
            # queued (default 1 s): against a broker that serves faster than
            # Python drains, the read is then mostly that pause.
            "fetch.queue.backoff.ms": int(os.environ.get("BENCH_QUEUE_BACKOFF_MS", "1000"))}
    conf.update(extra)
    return Consumer(conf)


def cmd_consume(bootstrap, topic, parts, expected, group, idle_s="15", max_s="300", past_s="0"):
    """Read `expected` records; with `past_s` > 0 keep reading until nothing
    came for `past_s` seconds, so records beyond the expected count (a
    duplicate in a DLT) are counted and fail the check instead of being left
    unread. Exit 0 only for exactly `expected` records."""
    parts, expected, idle_s, max_s = int(parts), int(expected), float(idle_s), float(max_s)
    past_s = float(past_s)
    c = consumer(bootstrap, group)
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(parts)])
    t_start = time.time()
    t_first = t_last = None
    count = nbytes = 0
    first_batch = 0
    errors = poison_seen = 0
    last_progress = time.time()
    batch_n = int(os.environ.get("BENCH_CONSUME_BATCH", "10000"))
    while True:
        if count >= expected and (past_s <= 0 or time.time() - last_progress > past_s):
            break
        msgs = c.consume(num_messages=batch_n, timeout=0.5)
        now = time.time()
        if not msgs:
            if now - last_progress > idle_s or now - t_start > max_s:
                break
            continue
        for m in msgs:
            if m.error():
                errors += 1
                continue
            count += 1
            v = m.value() or b""
            nbytes += len(v)
            if POISON_MARK in v:
                poison_seen += 1
        if t_first is None:
            t_first = now
            first_batch = count
        t_last = now
        last_progress = now
    c.close()
    cpu = os.times()
    dt = (t_last or time.time()) - t_start
    steady = (t_last - t_first) if t_first is not None else 0
    print(json.dumps({"group": group, "records": count, "expected": expected, "value_bytes": nbytes,
                      "seconds": round(dt, 3), "first_record_after_s": round((t_first or t_start) - t_start, 3),
                      "records_per_s": round(count / dt) if dt > 0 else 0,
                      "mb_per_s": round(nbytes / dt / 1e6, 2) if dt > 0 else 0,
                      # From the first batch received to the last: excludes connection set-up.
                      "steady_records_per_s": round((count - first_batch) / steady) if steady > 0 else 0,
                      "steady_mb_per_s": round(nbytes * (count - first_batch) / max(count, 1) / steady / 1e6, 2) if steady > 0 else 0,
                      "consumer_cpu_s": round(cpu.user + cpu.system, 2), "errors": errors,
                      # Records carrying the poison marker that reached this consumer.
                      "poison_seen": poison_seen}))
    return 0 if count == expected else 1


def _latency_consumer(bootstrap, topic, parts, expected, ready, go, out):
    """Receive times (ns) by record sequence number, sent back through `out`."""
    c = consumer(bootstrap, "lat-%d" % os.getpid(),
                 **{"fetch.wait.max.ms": int(os.environ.get("BENCH_LAT_FETCH_WAIT_MS", "5"))})
    c.assign([TopicPartition(topic, p, OFFSET_END) for p in range(parts)])
    # Resolve the positions before anything is produced.
    t_end = time.time() + 10
    while time.time() < t_end:
        c.consume(num_messages=100, timeout=0.2)
        pos = c.position([TopicPartition(topic, p) for p in range(parts)])
        if all(tp.offset >= 0 for tp in pos):
            break
    ready.set()
    go.wait(30)
    got = {}
    last = time.time()
    while len(got) < expected and time.time() - last < 10:
        msgs = c.consume(num_messages=1, timeout=0.2)
        now_ns = time.time_ns()
        for m in msgs:
            if m.error():
                continue
            h = dict(m.headers() or [])
            if "bench-seq" in h:
                got[int(h["bench-seq"])] = (now_ns, int(h["bench-ts-ns"]))
            last = time.time()
    c.close()
    out.put(got)


def _paced_producer(bootstrap, topic, parts, rate, seconds, ready, acks_out):
    p = producer(bootstrap, **{"linger.ms": int(os.environ.get("BENCH_LAT_LINGER_MS", "1")), "batch.size": 65536})
    ready.wait(30)
    n = int(rate * seconds)
    acks = []
    def on_ack(err, _msg, sent_ns):
        if err is None:
            acks.append((time.time_ns() - sent_ns) / 1e6)
    t0 = time.perf_counter()
    for i in range(n):
        target = t0 + i / rate
        while True:
            d = target - time.perf_counter()
            if d <= 0:
                break
            if d > 0.001:
                p.poll(min(d - 0.0005, 0.005))
        sent = time.time_ns()
        p.produce(topic, value(i, False), partition=i % parts,
                  headers=[("idempotency-key", b"k-%012d" % i), ("bench-ts-ns", str(sent).encode()),
                           ("bench-seq", str(i).encode())],
                  on_delivery=lambda err, msg, sent=sent: on_ack(err, msg, sent))
        p.poll(0)
    p.flush(30)
    acks.sort()
    acks_out.put([acks[int(q * (len(acks) - 1))] for q in (0.5, 0.99)] if acks else [None, None])


def cmd_latency(bootstrap, produce_bootstrap, topic, parts, rate, seconds, warmup_s="1"):
    """Consume via `bootstrap` (the path under test) and, at the same time,
    straight from the broker (`produce_bootstrap`, the paired baseline);
    produce straight to the broker, so only the Fetch path differs."""
    parts, rate, seconds, warmup_s = int(parts), float(rate), float(seconds), float(warmup_s)
    expected = int(rate * seconds)
    go = mp.Event()
    procs, outs, readies = [], [], []
    for bs in (bootstrap, produce_bootstrap):
        ready, out = mp.Event(), mp.Queue()
        pr = mp.Process(target=_latency_consumer, args=(bs, topic, parts, expected, ready, go, out))
        pr.start()
        procs.append(pr); outs.append(out); readies.append(ready)
    for r in readies:
        r.wait(30)
    acks_q = mp.Queue()
    prod = mp.Process(target=_paced_producer, args=(produce_bootstrap, topic, parts, rate, seconds, go, acks_q))
    prod.start()
    go.set()
    got_path, got_direct = (o.get(timeout=seconds + 60) for o in outs)
    try:
        ack_p50, ack_p99 = acks_q.get(timeout=30)
    except Exception:
        ack_p50 = ack_p99 = None
    for pr in procs + [prod]:
        pr.join(30)
    skip = int(rate * warmup_s)  # the first second: connections and fetch sessions settle
    def pct(xs, q):
        return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None
    def e2e(got):
        return sorted((r - s) / 1e6 for seq, (r, s) in got.items() if seq >= skip)
    path, direct = e2e(got_path), e2e(got_direct)
    both = sorted((got_path[k][0] - got_direct[k][0]) / 1e6 for k in got_path.keys() & got_direct.keys() if k >= skip)
    print(json.dumps({"received": len(got_path), "expected": expected, "rate": rate, "warmup_skipped": skip,
                      "p50_ms": pct(path, 0.50), "p99_ms": pct(path, 0.99), "p999_ms": pct(path, 0.999),
                      "max_ms": round(path[-1], 3) if path else None,
                      # The direct consumer reading the same records at the same time.
                      "direct_received": len(got_direct),
                      "direct_p50_ms": pct(direct, 0.50), "direct_p99_ms": pct(direct, 0.99),
                      # Per record: received via the path minus received directly.
                      "paired_diff_p50_ms": pct(both, 0.50), "paired_diff_p99_ms": pct(both, 0.99),
                      "added_p99_ms": round(pct(path, 0.99) - pct(direct, 0.99), 3) if path and direct else None,
                      # produce() -> delivery report (broker ack), same clock: the producer's share.
                      "produce_ack_p50_ms": ack_p50 and round(ack_p50, 3), "produce_ack_p99_ms": ack_p99 and round(ack_p99, 3)}))
    return 0 if len(got_path) == expected else 1


def cmd_create(bootstrap, topic, parts):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, int(parts), 1)])[topic].result(60)
    return 0


def cmd_consume_perf(bootstrap, topic, expected, group):
    """Kafka's ConsumerPerformance (kafka-tools, from the suite's Kafka
    lib/): `fetch.nMsg.sec` is its rate without the group join, the
    `steady` figure here; its CPU is the JVM's, children's rusage."""
    import resource, subprocess
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
    import harness as h
    cmd = ["java", "-Xmx512m", "-XX:+UseG1GC", "-cp", h.kafka_classpath(),
           "org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", bootstrap,
           "--topic", topic, "--num-records", str(expected), "--group", group,
           "--timeout", "30000", "--hide-header",
           "--command-property", "auto.offset.reset=earliest", *_perf_sizes("fetch")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    dt = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = [l for l in r.stdout.splitlines() if l.count(",") >= 9]
    if r.returncode != 0 or not rows:
        print(json.dumps({"group": group, "records": 0, "expected": int(expected), "failed": True,
                          "stderr": r.stderr[-2000:], "stdout": r.stdout[-2000:]}))
        return 1
    f = [x.strip() for x in rows[-1].split(",")]
    # start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec,
    # rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
    count, mb = int(f[4]), float(f[2])
    fetch_s = float(f[7]) / 1000
    print(json.dumps({"group": group, "consumer": "ConsumerPerformance", "records": count,
                      "expected": int(expected), "value_bytes": int(mb * 1024 * 1024),
                      "seconds": round(dt, 3), "records_per_s": round(float(f[5])),
                      "mb_per_s": round(float(f[3]), 2),
                      "steady_records_per_s": round(float(f[9])),
                      "fetch_seconds": round(fetch_s, 3), "rebalance_ms": float(f[6]),
                      "consumer_cpu_s": round((after.ru_utime + after.ru_stime)
                                              - (before.ru_utime + before.ru_stime), 2),
                      "errors": 0, "poison_seen": None}))
    return 0 if count >= int(expected) else 1


def _perf_sizes(kind):
    """Equal response sizes for ConsumerPerformance and ShareConsumerPerformance
    (scripts/bench/share-perf.sh): with BENCH_FETCH_MAX_BYTES, both read at
    most that many bytes per response (Fetch: fetch.max.bytes, and
    --fetch-size, its per-partition limit; ShareFetch: --fetch-size, its
    MaxBytes); with BENCH_MAX_POLL_RECORDS, both poll that many records
    (ShareFetch: also the MaxRecords and BatchSize of each request). Unset:
    the tools' defaults, as before."""
    out = []
    if os.environ.get("BENCH_FETCH_MAX_BYTES"):
        b = os.environ["BENCH_FETCH_MAX_BYTES"]
        out += ["--fetch-size", b]
        if kind == "fetch":
            out += ["--command-property", f"fetch.max.bytes={b}"]
    if os.environ.get("BENCH_MAX_POLL_RECORDS"):
        out += ["--command-property", f"max.poll.records={os.environ['BENCH_MAX_POLL_RECORDS']}"]
    return out


def cmd_consume_share(bootstrap, topic, expected, group):
    """Kafka's ShareConsumerPerformance (kafka-tools) in a fresh share group
    whose share.auto.offset.reset is set to earliest first (Admin API,
    straight at BENCH_ADMIN_BOOTSTRAP, else `bootstrap`). Its own rate counts
    from before the group join (seconds, for a share group); `steady` counts
    from the first progress line (the first records) to the end, as
    ConsumerPerformance's fetch.nMsg.sec leaves out the join. Same JSON as
    consume-perf."""
    import resource, subprocess
    from datetime import datetime
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource, ResourceType)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
    import harness as h
    admin = AdminClient({"bootstrap.servers": os.environ.get("BENCH_ADMIN_BOOTSTRAP", bootstrap)})
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest",
                    incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(60)
    cmd = ["java", "-Xmx512m", "-XX:+UseG1GC", "-cp", h.kafka_classpath(),
           "org.apache.kafka.tools.ShareConsumerPerformance", "--bootstrap-server", bootstrap,
           "--topic", topic, "--num-records", str(expected), "--group", group,
           # The tool's --timeout also bounds the whole read (its executor waits
           # --timeout + 100 ms, then interrupts the consumer): 30 s cut off a
           # slow read of 1 M records at 769,211 on this VM.
           "--timeout", "180000", "--hide-header", "--show-detailed-stats",
           "--reporting-interval", "500", *_perf_sizes("share")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    dt = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = r.stdout.splitlines()
    final = [l for l in lines if l.count(",") == 6 and "share consumer" not in l]
    progress = [l for l in lines if l.endswith("for share consumer 1")]
    if r.returncode != 0 or not final:
        print(json.dumps({"group": group, "records": 0, "expected": int(expected), "failed": True,
                          "stderr": r.stderr[-2000:], "stdout": r.stdout[-2000:]}))
        return 1
    # start.time, end.time, data.consumed.in.MB, MB.sec, nMsg.sec, data.consumed.in.nMsg, fetch.time.ms
    f = [x.strip() for x in final[-1].split(",")]
    ms = lambda t: datetime.strptime(t, "%Y-%m-%d %H:%M:%S:%f").timestamp()
    count, mb, end = int(f[5]), float(f[2]), ms(f[1])
    steady = None
    if progress:
        # start, end, MB so far, interval MB/s, interval rec/s, records so far, interval ms
        p = [x.strip() for x in progress[0].split(",")]
        first_at, first_n = ms(p[1]), int(p[5])
        if end > first_at:
            steady = round((count - first_n) / (end - first_at))
    print(json.dumps({"group": group, "consumer": "ShareConsumerPerformance", "records": count,
                      "expected": int(expected), "value_bytes": int(mb * 1024 * 1024),
                      "seconds": round(dt, 3), "records_per_s": round(float(f[4])),
                      "mb_per_s": round(float(f[3]), 2),
                      "steady_records_per_s": steady or round(float(f[4])),
                      "fetch_seconds": round(float(f[6]) / 1000, 3),
                      "first_record_after_s": round(first_at - ms(f[0]), 3) if progress else None,
                      "timed_out": any(l.startswith("WARNING: Exiting before") for l in lines),
                      "consumer_cpu_s": round((after.ru_utime + after.ru_stime)
                                              - (before.ru_utime + before.ru_stime), 2),
                      "errors": 0, "poison_seen": None}))
    return 0 if count >= int(expected) else 1


if __name__ == "__main__":
    cmds = {"produce": cmd_produce, "consume": cmd_consume, "latency": cmd_latency,
            "create": cmd_create, "consume-perf": cmd_consume_perf,
            "consume-share": cmd_consume_share}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(cmds[sys.argv[1]](*sys.argv[2:]))
