#!/usr/bin/env python3
"""The admin console's cost in proxy CPU per minute (issue 50).

Starts the suite's Kafka broker and two proxies in front of it with the
same policy and 100 of 1,000 records diverted: one without the console, one with
`admin.console: true`. Then, from /proc/PID/stat (utime + stime):

  1. both idle for DURATION seconds, no page open (the console's cost
     when nobody looks: it has no task of its own);
  2. the console's overview open in Debian's headless chromium for
     DURATION seconds (it refreshes every 5 s), the other proxy idle
     alongside as the baseline.

  3. REQUESTS overview requests, then REQUESTS/5 DLT pages (50 records,
     decoded), back to back from one client: the proxy's CPU per request.

Prints one line per phase and proxy: CPU seconds per minute, the
overview requests the page made, and the CPU per request. Usage:

  ANTIDOTE_BIN=target/release/antidote .venv/bin/python scripts/bench/console_cpu.py [DURATION [REQUESTS]]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import clients as c  # noqa: E402
from harness import ANTIDOTE_BIN, HOST, free_port, new_broker  # noqa: E402
from test_console import GEO, ConsoleAntidote  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def measure(pids: dict[str, int], seconds: float, during=None) -> tuple[dict, object]:
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    started = time.monotonic()
    extra = during() if during else time.sleep(seconds)
    took = time.monotonic() - started
    return {k: (cpu_seconds(p) - before[k], took) for k, p in pids.items()}, extra


def main() -> int:
    duration = float(sys.argv[1]) if len(sys.argv) > 1 else 60
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    work = Path(tempfile.mkdtemp(prefix="antidote-console-cpu-"))
    broker = new_broker(work).start()
    proxies = []
    try:
        ep = c.Endpoint(broker.bootstrap)
        topic = f"bench-console-{uuid.uuid4().hex[:8]}"
        c.ck_create_topic(ep, topic, 2)
        policy = work / "policy.yaml"
        policy.write_text(GEO.format(topic=topic, max_lat=90))
        recs = [c.Rec(i % 2, -1, b"k%d" % i,
                      json.dumps({"lat": 95 if i % 10 == 0 else 10, "i": i}).encode())
                for i in range(1000)]
        c.ck_produce(ep, topic, recs)
        plain = ConsoleAntidote(work, upstream=[broker.bootstrap], name="plain",
                                policy_files=(str(policy),), admin_port=free_port())
        console = ConsoleAntidote(work, upstream=[broker.bootstrap], name="console",
                                  policy_files=(str(policy),), admin_port=free_port())
        plain_yaml = plain.config_yaml
        plain.config_yaml = lambda: plain_yaml().replace("  console: true\n", "")  # type: ignore
        for p in (plain, console):
            proxies.append(p)
            p.start().wait_ready(30)
            got = c.ck_consume_assign(c.Endpoint(p.bootstrap, "proxy"), topic, [0, 1], 900, timeout=60)
            assert len(got) == 900, len(got)
        time.sleep(5)  # let start-up work settle
        pids = {"console off": plain.proc.pid, "console on": console.proc.pid}
        print(f"binary {ANTIDOTE_BIN}; {duration:.0f} s per phase; CPU seconds per minute "
              "(utime+stime from /proc/PID/stat)")
        idle, _ = measure(pids, duration)
        for k, (cpu, took) in idle.items():
            print(f"idle, no page open      {k:12} {cpu * 60 / took:.4f} s/min ({cpu:.2f} s in {took:.1f} s)")

        def browse():
            env = dict(os.environ, NODE_PATH=str(ROOT / "tests" / "js" / "node_modules"))
            p = subprocess.run(["node", str(ROOT / "scripts" / "bench" / "console_hold.js"),
                                f"http://{HOST}:{console.admin_port}", str(duration)],
                               capture_output=True, text=True, env=env, timeout=duration + 60)
            assert p.returncode == 0, p.stderr
            return json.loads(p.stdout)

        paged, seen = measure(pids, duration, browse)
        for k, (cpu, took) in paged.items():
            print(f"overview page open      {k:12} {cpu * 60 / took:.4f} s/min ({cpu:.2f} s in {took:.1f} s)"
                  + (f"; {seen['overview_requests']} overview requests" if k == "console on" else ""))
        one = {"console on": console.proc.pid}
        base = f"http://{HOST}:{console.admin_port}/console/api"
        for what, path, n in [("overview", "/overview", requests),
                              ("DLT page of 50, decoded", f"/records?topic={topic}.dlt&limit=50",
                               max(1, requests // 5))]:
            def get_all(path=path, n=n):
                for _ in range(n):
                    with urllib.request.urlopen(base + path, timeout=20) as r:
                        assert r.status == 200
                        r.read()
            used, _ = measure(one, 0, get_all)
            cpu, took = used["console on"]
            print(f"{n} {what} requests  console on   {cpu / n * 1000:.3f} ms CPU each "
                  f"({cpu:.2f} s in {took:.1f} s)")
    finally:
        for p in proxies:
            p.stop_and_check()
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
