#!/usr/bin/env python3
"""The deterministic end-to-end benchmark (issue 15): the proxy in front of
`benches/tools/bench_broker.rs`, a broker that serves generated record batches
from memory, so that the figures are the proxy's and not tansu's (whose own
read rate swings 0.17-1.18 M records/s between runs on these machines).

Paths, read in rounds (a b0 c d, a b0 c d, ...), each read of a fresh topic
(`bench-N`, the same bytes), so the proxy's verdict cache is always cold:
  a   the bench broker directly
  b0  antidote, no policies (pass-through)
  c   antidote, the reference JSON policy (policies/geofence.yaml) on
      `bench-*`; diversions go to a tansu broker (dead_letter.bootstrap_servers)
  d   `tansu proxy` in front of the bench broker (skipped when it fails)

For each read: records/s (BENCH_CONSUMER=e2e, the default: the librdkafka
consumer of scripts/bench/e2e.py, assign() on BENCH_PARTITIONS (3) partitions, capped at
0.3-0.6 M records/s by Python; BENCH_CONSUMER=fetch_load:
benches/tools/fetch_load.rs, which speaks Fetch itself on one thread), the proxy's whole-process CPU per record read
(/proc utime+stime), and for c the Fetch-rewrite CPU per judged record
(`antidote_fetch_rewrite_cpu_seconds_total` / `antidote_records_validated_total`),
the latency antidote added per response (p50 and p99 bucket bounds of
`antidote_response_relay_duration_seconds`, forwarded and rewritten, until
ready to write and until sent, spliced until sent);
the proxies' peak RSS at the end. Raw lines go to BENCH_OUT (JSON lines),
the summary to stdout.

  .venv/bin/python scripts/bench/deterministic.py
Env: BENCH_RECORDS (1000000), BENCH_ROUNDS (3), BENCH_PATHS ("a b0 c d"),
BENCH_FORMAT (json | avro | protobuf: record encoding and c's policy,
policies/geofence{,-avro,-protobuf}.yaml), BENCH_BIN (target/release/antidote), BENCH_BROKER_BIN
(target/release/examples/bench_broker), BENCH_OUT, BENCH_PORT (base port),
BENCH_WORKERS (the proxies' runtime worker threads; default one per core),
BENCH_CONSUMER (e2e | fetch_load), BENCH_FETCH_BIN (target/release/examples/fetch_load),
BENCH_PARTITIONS (3: partitions per topic, each read in every Fetch),
BENCH_POISON_EVERY (1000: one poison record in N; 0: none),
BENCH_JUDGE_DEADLINE (c's `limits.judge_deadline`, e.g. 1ms; unset: none),
BENCH_PIN (e.g. "1:0": the proxies on CPU 1, the brokers and the consumer
on CPU 0, with taskset; unset: no pinning).
Build first: cargo build --release --bin antidote --example bench_broker --example fetch_load
"""
import json, os, random, re, socket, statistics, struct, subprocess, sys, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = os.path.join(ROOT, ".venv/bin/python")
E2E = os.path.join(ROOT, "scripts/bench/e2e.py")
TANSU = os.path.join(ROOT, ".tools/bin/tansu")
N = int(os.environ.get("BENCH_RECORDS", "1000000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
PARTITIONS = os.environ.get("BENCH_PARTITIONS", "3")
PATHS = os.environ.get("BENCH_PATHS", "a b0 c d").split()
# json | avro | protobuf: the record encoding and the reference policy of c.
FORMAT = os.environ.get("BENCH_FORMAT", "json")
POLICY_FILE = {"json": "geofence.yaml", "avro": "geofence-avro.yaml",
               "protobuf": "geofence-protobuf.yaml"}[FORMAT]
BIN = os.environ.get("BENCH_BIN", os.path.join(ROOT, "target/release/antidote"))
BROKER_BIN = os.environ.get("BENCH_BROKER_BIN",
                            os.path.join(ROOT, "target/release/examples/bench_broker"))
# Below Linux's ephemeral range (32768-60999): a base drawn inside it could
# land on a port a client socket of the previous run still holds (seen: a
# proxy listener refused with "Address already in use", its run empty).
BASE = int(os.environ.get("BENCH_PORT", str(random.randint(20000, 32000))))
CONSUMER = os.environ.get("BENCH_CONSUMER", "e2e")
FETCH_BIN = os.environ.get("BENCH_FETCH_BIN", os.path.join(ROOT, "target/release/examples/fetch_load"))
CLK = os.sysconf("SC_CLK_TCK")
DEADLINE = os.environ.get("BENCH_JUDGE_DEADLINE")
POISON_EVERY = int(os.environ.get("BENCH_POISON_EVERY", "1000"))
# The bench broker's rule: record i is poison when i % every == every // 2.
POISON = N // POISON_EVERY + (N % POISON_EVERY > POISON_EVERY // 2) if POISON_EVERY else 0
PIN = os.environ.get("BENCH_PIN")


def pinned(args, proxy):
    """`args` under taskset when BENCH_PIN is set: proxies on the CPUs
    before the colon, everything else on those after it."""
    if not PIN:
        return args
    cpus = PIN.split(":")[0 if proxy else 1]
    return ["taskset", "-c", cpus] + args
PROCS = []


def log(msg):
    print(f"[bench-det {time.strftime('%T')}] {msg}", file=sys.stderr, flush=True)


def start(args, logfile, port=None, proxy=False):
    p = subprocess.Popen(pinned(args, proxy), stdout=open(logfile, "w"), stderr=subprocess.STDOUT)
    PROCS.append(p)
    if port is not None:
        deadline = time.time() + 60
        while time.time() < deadline:
            if p.poll() is not None:
                raise SystemExit(f"{args[0]} exited (see {logfile})")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return p
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"port {port} not open after 60 s (see {logfile})")
    return p


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def minflt(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def hwm_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    return 0.0


def metric(admin, name):
    text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=5).read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith(name) and l[len(name):len(name) + 1] in ("{", " "))


RELAY = "antidote_response_relay_duration_seconds"
# The parts of a rewritten response's wait: judging and splicing it, and the
# acknowledgement of its diverted records' DLT write.
# A diverting response's hold split into the proxy's part and the DLT wait
# (absent before 2026-12-04's builds).
PARTS = {"rewrite": ("antidote_fetch_rewrite_duration_seconds", ()),
         "dlt_write": ("antidote_dlt_write_duration_seconds", ("result",)),
         "hold": ("antidote_fetch_diverting_hold_seconds", ("part",))}


def histogram(admin, name, labels):
    """{label values joined by _: {le: cumulative count}} of one histogram."""
    text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=5).read().decode()
    out = {}
    for l in text.splitlines():
        if l.startswith(name + "_bucket{"):
            le = re.search(r'le="([^"]+)"', l).group(1)
            key = "_".join(re.search(fr'{k}="([^"]+)"', l).group(1) for k in labels)
            out.setdefault(key, {})[float(le)] = float(l.rsplit(" ", 1)[1])
    return out


def relay_buckets(admin):
    """{response_until: {le: cumulative count}} of the proxy's relay histogram."""
    return histogram(admin, RELAY, ("response", "until"))


def relay_quantile(before, after, q):
    """Upper bound (ms) of the bucket holding quantile q of the responses
    relayed between two scrapes, and their count."""
    les = sorted(after)
    if not les:
        return None, 0
    total = after[les[-1]] - before.get(les[-1], 0)
    if total <= 0:
        return None, 0
    for le in les:
        if after[le] - before.get(le, 0) >= q * total:
            return le * 1000, int(total)
    return None, int(total)


def antidote(work, name, idx, broker_port, dlt_port, policy):
    boot, admin = BASE + 10 + idx, f"127.0.0.1:{BASE + 20 + idx}"
    cfg = os.path.join(work, f"antidote-{name}.yaml")
    with open(cfg, "w") as f:
        f.write(f"admin:\n  listen: {admin}\nlisten:\n  bootstrap: 127.0.0.1:{boot}\n"
                f"  advertised_host: 127.0.0.1\n  broker_port_base: {BASE + 200 + idx * 200}\n"
                f"upstream:\n  bootstrap_servers: [127.0.0.1:{broker_port}]\n"
                f"dead_letter:\n  bootstrap_servers: [127.0.0.1:{dlt_port}]\n"
                + (f"policies: [{policy}]\n" if policy else "policies: []\n")
                + (f"limits:\n  judge_deadline: {DEADLINE}\n" if policy and DEADLINE else ""))
    env = dict(os.environ, ANTIDOTE_LOG=os.environ.get("BENCH_RUST_LOG", "warn"))
    if os.environ.get("BENCH_WORKERS"):
        env["TOKIO_WORKER_THREADS"] = os.environ["BENCH_WORKERS"]
    p = subprocess.Popen(pinned([BIN, "run", "--config", cfg], True), env=env,
                         stdout=open(os.path.join(work, f"antidote-{name}.log"), "w"),
                         stderr=subprocess.STDOUT)
    PROCS.append(p)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", boot), timeout=0.5).close()
            return p, f"127.0.0.1:{boot}", admin
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"antidote {name} did not listen")


def reference_policy(work):
    src = open(os.path.join(ROOT, "policies", POLICY_FILE)).read()
    out = re.sub(r'topics: \[[^\]]*\]', 'topics: ["bench-*"]', src, count=1)
    out = out.replace(": schemas/", f": {ROOT}/policies/schemas/")
    if 'topics: ["bench-*"]' not in out:
        raise SystemExit(f"could not adapt policies/{POLICY_FILE}")
    path = os.path.join(work, "policy-c.yaml")
    open(path, "w").write(out)
    return path


def consume(boot, topic, expected):
    env = dict(os.environ, BENCH_QUEUE_BACKOFF_MS="5")
    mark = struct.pack("<d", 91.5).hex() if FORMAT != "json" else None
    if mark:
        env["BENCH_POISON_MARK_HEX"] = mark
    if CONSUMER == "fetch_load":
        args = [FETCH_BIN, boot, topic, PARTITIONS, str(expected)] + ([mark] if mark else [])
    else:
        args = [PY, E2E, "consume", boot, topic, PARTITIONS, str(expected), f"det-{topic}", "15", "300"]
    r = subprocess.run(pinned(args, False), env=env, capture_output=True, text=True)
    if not r.stdout.strip():
        raise SystemExit(f"consumer failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    work = tempfile.mkdtemp(prefix="antidote-bench-det.")
    out_path = os.environ.get("BENCH_OUT", os.path.join(ROOT, "target/bench-det",
                                                         f"det-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"))
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    out = open(out_path, "w")
    bport, tport = BASE, BASE + 1
    topics = ROUNDS * len(PATHS) + 1
    broker = start([BROKER_BIN, "--listen", f"127.0.0.1:{bport}", "--topics", str(topics), "--records", str(N),
           "--format", FORMAT, "--partitions", PARTITIONS, "--poison-every", str(POISON_EVERY)],
          os.path.join(work, "bench-broker.log"), bport)
    start([TANSU, "broker", "--listener-url", f"tcp://127.0.0.1:{tport}",
           "--advertised-listener-url", f"tcp://127.0.0.1:{tport}", "--storage-engine", "memory://tansu/"],
          os.path.join(work, "tansu.log"), tport)
    proxies = {"a": (None, f"127.0.0.1:{bport}", None)}
    if "b0" in PATHS:
        proxies["b0"] = antidote(work, "b0", 0, bport, tport, None)
    if "c" in PATHS:
        proxies["c"] = antidote(work, "c", 1, bport, tport, reference_policy(work))
    if "d" in PATHS:
        dport = BASE + 5
        try:
            p = start([TANSU, "proxy", "--listener-url", f"tcp://127.0.0.1:{dport}",
                       "--advertised-listener-url", f"tcp://127.0.0.1:{dport}",
                       "--origin-url", f"tcp://127.0.0.1:{bport}"], os.path.join(work, "tansu-proxy.log"), dport,
                      proxy=True)
            proxies["d"] = (p, f"127.0.0.1:{dport}", None)
        except SystemExit as e:
            log(f"tansu proxy: {e}; path d skipped")
    # The checkout's commit; the proxy measured is BENCH_BIN ("bin"), which
    # may be a build of another commit.
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    rows, t = [], 0
    for rnd in range(1, ROUNDS + 1):
        for path in PATHS:
            if path not in proxies:
                continue
            proc, boot, admin = proxies[path]
            topic = f"bench-{t}"
            t += 1
            c0 = cpu_s(proc.pid) if proc else 0.0
            b0 = cpu_s(broker.pid)
            f0 = minflt(proc.pid) if proc else 0
            r0 = relay_buckets(admin) if admin else {}
            h0 = {p: histogram(admin, *PARTS[p]) for p in PARTS} if admin else {}
            m0 = (metric(admin, "antidote_fetch_rewrite_cpu_seconds_total"),
                  metric(admin, "antidote_records_validated_total"),
                  metric(admin, "antidote_fetch_judged_ahead_records_total"),
                  metric(admin, "antidote_fetch_deadline_cuts_total")) if admin else (0, 0, 0, 0)
            # The bench broker writes one poison record in POISON_EVERY.
            expected = N - POISON if path == "c" else N
            res = consume(boot, topic, expected)
            row = {"commit": commit, "bin": BIN, "round": rnd, "path": path, "topic": topic, **res}
            # The bench broker's CPU per record delivered: what reading the
            # records again after a cut (BENCH_JUDGE_DEADLINE) costs it.
            row["broker_ns_per_record"] = round((cpu_s(broker.pid) - b0) * 1e9 / max(res["records"], 1))
            if proc:
                row["proxy_cpu_s"] = round(cpu_s(proc.pid) - c0, 3)
                row["proxy_ns_per_record"] = round(row["proxy_cpu_s"] * 1e9 / max(res["records"], 1))
                # Page faults: freed buffers given back to the kernel and faulted in again.
                row["proxy_page_faults"] = minflt(proc.pid) - f0
            if admin:
                rw = metric(admin, "antidote_fetch_rewrite_cpu_seconds_total") - m0[0]
                judged = metric(admin, "antidote_records_validated_total") - m0[1]
                row["judged"] = int(judged)
                # Judged by helpers ahead of their partition's planner
                # (0 for builds before the counter existed).
                ahead = metric(admin, "antidote_fetch_judged_ahead_records_total") - m0[2]
                row["judged_ahead"] = int(ahead)
                row["deadline_cuts"] = int(metric(admin, "antidote_fetch_deadline_cuts_total") - m0[3])
                if judged:
                    row["rewrite_ns_per_judged"] = round(rw * 1e9 / judged)
                # Added latency per response: bucket bounds of p50 and p99.
                r1 = relay_buckets(admin)
                for resp, after in r1.items():
                    for q in (0.5, 0.99):
                        le, count = relay_quantile(r0.get(resp, {}), after, q)
                        if count:
                            row[f"relay_{resp}_p{round(q * 100)}_ms_le"] = le
                            row[f"relay_{resp}_responses"] = count
                for part, (name, labels) in PARTS.items():
                    for key, after in histogram(admin, name, labels).items():
                        label = f"{part}_{key}" if key else part
                        for q in (0.5, 0.99):
                            le, count = relay_quantile(h0[part].get(key, {}), after, q)
                            if count:
                                row[f"{label}_p{round(q * 100)}_ms_le"] = le
                                row[f"{label}_count"] = count
            row["ok"] = res["records"] == expected and (path != "c" or res["poison_seen"] == 0)
            out.write(json.dumps(row) + "\n")
            out.flush()
            rows.append(row)
            log(f"round {rnd} {path}: {res['records']} records, {res['steady_records_per_s']} rec/s steady, "
                f"proxy {row.get('proxy_ns_per_record', '-')} ns/record, "
                f"rewrite {row.get('rewrite_ns_per_judged', '-')} ns/judged "
                f"({row.get('judged_ahead', '-')} ahead, {row.get('deadline_cuts', '-')} cuts), "
                f"broker {row['broker_ns_per_record']} ns/record, "
                f"{row.get('proxy_page_faults', '-')} page faults, relay p50/p99 <= ms: "
                + ", ".join(f"{k} {row.get(f'relay_{k}_p50_ms_le', '-')}/"
                            f"{row.get(f'relay_{k}_p99_ms_le', '-')} ({row.get(f'relay_{k}_responses', 0)})"
                            for k in ("forwarded_ready", "forwarded_sent",
                                      "rewritten_ready", "rewritten_sent", "spliced_sent"))
                + "; rewrite p50/p99 <= ms: "
                + f"{row.get('rewrite_p50_ms_le', '-')}/{row.get('rewrite_p99_ms_le', '-')} "
                + f"({row.get('rewrite_count', 0)}), DLT write p50/p99 <= ms: "
                + f"{row.get('dlt_write_ok_p50_ms_le', '-')}/{row.get('dlt_write_ok_p99_ms_le', '-')} "
                + f"({row.get('dlt_write_ok_count', 0)}), diverting hold p50/p99 <= ms: proxy "
                + f"{row.get('hold_proxy_p50_ms_le', '-')}/{row.get('hold_proxy_p99_ms_le', '-')}, dlt "
                + f"{row.get('hold_dlt_p50_ms_le', '-')}/{row.get('hold_dlt_p99_ms_le', '-')} "
                + f"({row.get('hold_proxy_count', 0)})")
    for path, (proc, _, _) in proxies.items():
        if proc:
            out.write(json.dumps({"commit": commit, "bin": BIN, "path": path,
                                  "peak_rss_mb": round(hwm_mb(proc.pid), 1)}) + "\n")
    summary(rows, proxies)
    log(f"raw results: {out_path}")


def summary(rows, proxies):
    med = lambda xs: statistics.median(xs) if xs else 0
    a = med([r["steady_records_per_s"] for r in rows if r["path"] == "a"])
    print(f"{'path':5} {'rec/s (median steady)':>22} {'x a':>6} {'proxy ns/rec':>13} "
          f"{'rewrite ns/judged':>18} {'peak RSS MB':>12} reads ok")
    for path, (proc, _, _) in proxies.items():
        rs = [r for r in rows if r["path"] == path]
        rate = med([r["steady_records_per_s"] for r in rs])
        ns = med([r["proxy_ns_per_record"] for r in rs if "proxy_ns_per_record" in r])
        rw = med([r["rewrite_ns_per_judged"] for r in rs if "rewrite_ns_per_judged" in r])
        rss = hwm_mb(proc.pid) if proc else 0
        print(f"{path:5} {rate:>22,.0f} {rate / a if a else 0:>6.2f} {ns or '-':>13} {rw or '-':>18} "
              f"{rss or '-':>12} {sum(r['ok'] for r in rs)}/{len(rs)}")


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in PROCS:
            p.terminate()
        for p in PROCS:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
