#!/usr/bin/env python3
"""Instructions per Fetch response through the whole exchange (issue 55,
"no loss of speed"): the broker's response frame in, the frame to write to
the client out, in one antidote process: `proxy::exchange::respond` and all
it calls (the answer split, the Fetch filter: decode, judge, diversions
submitted and awaited, splice, patch; metrics; the response frame built).

Counted by valgrind's callgrind with collection on only while the exchange
is on the stack (`--toggle-collect=antidote::proxy::exchange::respond*`;
the relay's own frame reading and socket writes are not: they are the same
bytes for every build), so the proxy's start, its request side and its
background tasks (DLT follower,
metrics, admin, the DLT writer's task: a diversion's cost here is its
submission and the wait) are left out; judging ahead on idle cores is off
(`limits.judge_ahead: false`) so all judging is on the pump's stack. Exact, not a time: builds compare to the
instruction, in the same run, whatever else the machine is doing.

Setup, once: benches/tools/bench_broker.rs as the upstream (EXCHANGE_RECORDS
records of the reference geofence JSON, one in EXCHANGE_POISON_EVERY poison,
one partition per topic, a fresh topic per run so every verdict cache starts
cold) and tansu as the DLT cluster; per BIN, EXCHANGE_ROUNDS runs
alternating between the BINs: antidote under callgrind with the reference
policy on `bench-*`, benches/tools/fetch_load.rs reading the topic through
it (Fetch v12, 1 MiB per partition), the Fetch requests it relayed read
from its metrics. Prints one line per run and the median per BIN; with
EXCHANGE_OUT, JSON lines too.

  CARGO_TARGET_DIR=/tmp/bench-target cargo build --release --locked \\
      --bin antidote --example bench_broker --example fetch_load
  python3 scripts/bench/exchange_cost.py /tmp/base-antidote /tmp/bench-target/release/antidote

BENCH_BROKER_BIN and BENCH_FETCH_BIN default to the examples beside the
first BIN (its ../examples/), TANSU to .tools/bin/tansu.
"""
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECORDS = int(os.environ.get("EXCHANGE_RECORDS", "60000"))
POISON_EVERY = int(os.environ.get("EXCHANGE_POISON_EVERY", "1000"))
ROUNDS = int(os.environ.get("EXCHANGE_ROUNDS", "3"))
BASE = int(os.environ.get("EXCHANGE_PORT", "29600"))
TANSU = os.environ.get("TANSU", os.path.join(ROOT, ".tools/bin/tansu"))
PROCS = []


def wait_port(port, proc, what, seconds=120):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{what} did not listen on {port}")


def start(args, log, port, what):
    p = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    PROCS.append(p)
    wait_port(port, p, what)
    return p


def policy(work):
    src = open(os.path.join(ROOT, "policies", "geofence.yaml")).read()
    out = re.sub(r'topics: \[[^\]]*\]', 'topics: ["bench-*"]', src, count=1)
    out = out.replace(": schemas/", f": {ROOT}/policies/schemas/")
    path = os.path.join(work, "policy.yaml")
    open(path, "w").write(out)
    return path


def proxy_config(work, run, bport, tport, pfile):
    boot, admin = BASE + 10, BASE + 11
    cfg = os.path.join(work, f"antidote-{run}.yaml")
    open(cfg, "w").write(
        f"admin:\n  listen: 127.0.0.1:{admin}\nlisten:\n  bootstrap: 127.0.0.1:{boot}\n"
        f"  advertised_host: 127.0.0.1\n  broker_port_base: {BASE + 100}\n"
        f"upstream:\n  bootstrap_servers: [127.0.0.1:{bport}]\n"
        f"dead_letter:\n  bootstrap_servers: [127.0.0.1:{tport}]\n"
        f"policies: [{pfile}]\n"
        # Judged on the pump's own stack: no helpers judging ahead on
        # other threads (one partition per response is never planned on
        # the blocking pool).
        "limits:\n  judge_ahead: false\n")
    return cfg, boot, admin


def fetch_requests(admin):
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=30).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("antidote_client_requests_total{") and 'api="Fetch"' in line)


def collected(out_file):
    """Instructions callgrind collected (the `totals:` line)."""
    for line in open(out_file):
        if line.startswith("totals:") or line.startswith("summary:"):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {out_file}")


def toggle(binary):
    """The function whose calls are counted: the exchange (`proxy::exchange::
    respond`), or, in builds before the exchanges had their module (8585ca1),
    the relay's `respond` that held them."""
    names = subprocess.run(["nm", "-C", binary], capture_output=True, text=True).stdout
    for f in ("antidote::proxy::exchange::respond", "antidote::proxy::relay::respond"):
        if f + "::{{closure}}" in names or f + "\n" in names:
            return f + "*"
    raise SystemExit(f"{binary}: no exchange to count")


def run_once(work, run, binary, topic, ports, fetch_bin):
    bport, tport, pfile = ports
    cfg, boot, admin = proxy_config(work, run, bport, tport, pfile)
    out_file = os.path.join(work, f"callgrind.{run}.out")
    env = dict(os.environ, ANTIDOTE_LOG="warn", TOKIO_WORKER_THREADS="1")
    p = subprocess.Popen(["valgrind", "--tool=callgrind", f"--toggle-collect={toggle(binary)}",
                          f"--callgrind-out-file={out_file}", binary, "run", "--config", cfg],
                         env=env, stdout=open(os.path.join(work, f"antidote-{run}.log"), "w"),
                         stderr=subprocess.STDOUT)
    try:
        wait_port(boot, p, f"antidote {run}", 300)
        expected = RECORDS - (RECORDS // POISON_EVERY if POISON_EVERY else 0)
        r = subprocess.run([fetch_bin, f"127.0.0.1:{boot}", topic, "1", str(expected)],
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise SystemExit(f"fetch_load: {r.stdout[-500:]} {r.stderr[-1500:]}")
        fetches = fetch_requests(admin)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
    return collected(out_file), fetches, json.loads(r.stdout.strip().splitlines()[-1])


def main():
    bins = sys.argv[1:]
    if not bins:
        raise SystemExit(__doc__)
    examples = os.path.join(os.path.dirname(os.path.abspath(bins[0])), "examples")
    broker_bin = os.environ.get("BENCH_BROKER_BIN", os.path.join(examples, "bench_broker"))
    fetch_bin = os.environ.get("BENCH_FETCH_BIN", os.path.join(examples, "fetch_load"))
    work = tempfile.mkdtemp(prefix="antidote-exchange-cost.")
    bport, tport = BASE, BASE + 1
    start([broker_bin, "--listen", f"127.0.0.1:{bport}", "--topics", str(ROUNDS * len(bins)),
           "--partitions", "1", "--records", str(RECORDS), "--poison-every", str(POISON_EVERY)],
          os.path.join(work, "bench-broker.log"), bport, "bench_broker")
    start([TANSU, "broker", "--listener-url", f"tcp://127.0.0.1:{tport}",
           "--advertised-listener-url", f"tcp://127.0.0.1:{tport}", "--storage-engine",
           "memory://tansu/"], os.path.join(work, "tansu.log"), tport, "tansu")
    ports = (bport, tport, policy(work))
    per_bin = {b: [] for b in bins}
    out = open(os.environ["EXCHANGE_OUT"], "w") if os.environ.get("EXCHANGE_OUT") else None
    topic = 0
    for rnd in range(ROUNDS):
        for i, b in enumerate(bins):
            instr, fetches, consumed = run_once(work, f"r{rnd}b{i}", b, f"bench-{topic}",
                                                ports, fetch_bin)
            topic += 1
            per_response = instr / max(fetches, 1)
            per_record = instr / max(consumed["records"], 1)
            per_bin[b].append((per_response, per_record))
            line = {"bin": b, "round": rnd, "instructions": instr, "fetch_responses": fetches,
                    "records": consumed["records"], "per_response": round(per_response),
                    "per_record": round(per_record, 1)}
            print(json.dumps(line), flush=True)
            if out:
                out.write(json.dumps(line) + "\n")
    for b, xs in per_bin.items():
        print(f"{b}: median {statistics.median(x[0] for x in xs):,.0f} instructions per Fetch "
              f"response, {statistics.median(x[1] for x in xs):,.1f} per record "
              f"({len(xs)} runs, {RECORDS} records, poison 1 in {POISON_EVERY})")


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in PROCS:
            p.terminate()
