#!/usr/bin/env python3
"""limits.fetch_max_version against tansu: librdkafka consumers of a topic no
policy covers, through antidote as it is (librdkafka uses Fetch v16+, whose
responses are read whole to rewrite NodeEndpoints) and through antidote with
`limits.fetch_max_version: 15` (responses spliced socket to socket). The two
proxies alternate; each read is BENCH_RECORDS ~200-byte records from three
partitions with scripts/bench/e2e.py's consumer. Prints and returns, per read:
records/s, the proxy's whole-process CPU per record (ns, from /proc in clock
ticks) and how many responses it spliced.

  BENCH_BIN=/work/bench-target/release/antidote BENCH_RECORDS=1000000 BENCH_ROUNDS=3 \\
    .venv/bin/python scripts/bench/fetch_cap.py
"""
import json, os, socket, subprocess, sys, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
TANSU = os.path.join(ROOT, ".tools/bin/tansu")
E2E = os.path.join(ROOT, "scripts/bench/e2e.py")
BIN = os.environ.get("BENCH_BIN", os.path.join(ROOT, "target/release/antidote"))
N = int(os.environ.get("BENCH_RECORDS", "1000000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
BASE = int(os.environ.get("BENCH_PORT", "15300"))
CLK = os.sysconf("SC_CLK_TCK")
SPLICED = 'antidote_response_relay_duration_seconds_count{response="spliced",until="sent"}'


def wait_port(port, proc, secs=15):
    end = time.time() + secs
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"process {proc.args[0]} exited")
            time.sleep(0.1)
    raise SystemExit(f"port {port} not open")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def spliced(admin):
    text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=5).read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(SPLICED))


def main():
    work = tempfile.mkdtemp(prefix="fetch-cap-")
    procs = []
    try:
        bp = BASE
        tansu = subprocess.Popen([TANSU, "broker", "--listener-url", f"tcp://127.0.0.1:{bp}",
                                  "--advertised-listener-url", f"tcp://127.0.0.1:{bp}",
                                  "--storage-engine", "memory://tansu/"],
                                 stdout=open(f"{work}/tansu.log", "wb"), stderr=subprocess.STDOUT)
        procs.append(tansu)
        wait_port(bp, tansu)
        topic = "cap.bench"
        subprocess.run([TANSU, "topic", "create", topic, "--broker", f"tcp://127.0.0.1:{bp}",
                        "--partitions", "3"], check=True, capture_output=True)
        out = subprocess.run([PY, E2E, "produce", f"127.0.0.1:{bp}", topic, str(N), "0"],
                             check=True, capture_output=True, text=True).stdout
        print("produced:", out.strip().splitlines()[-1], flush=True)
        proxies = {}
        for i, (name, extra) in enumerate([("uncapped", ""),
                                           ("fetch_max_version=15", "limits:\n  fetch_max_version: 15\n")]):
            boot, admin = bp + 10 + i, f"127.0.0.1:{bp + 20 + i}"
            cfg = (f"admin:\n  listen: {admin}\nlisten:\n  bootstrap: 127.0.0.1:{boot}\n"
                   f"  advertised_host: 127.0.0.1\n  broker_port_base: {bp + 200 + 200 * i}\n"
                   f"upstream:\n  bootstrap_servers:\n    - 127.0.0.1:{bp}\npolicies: []\n{extra}")
            path = f"{work}/{i}.yaml"
            open(path, "w").write(cfg)
            p = subprocess.Popen([BIN, "run", "--config", path], stdout=open(f"{work}/{i}.log", "wb"),
                                 stderr=subprocess.STDOUT, env={**os.environ, "ANTIDOTE_LOG": "warn"})
            procs.append(p)
            wait_port(boot, p)
            proxies[name] = (p, f"127.0.0.1:{boot}", admin)
        rows = []
        for r in range(1, ROUNDS + 1):
            for name, (p, boot, admin) in proxies.items():
                c0, s0 = cpu_s(p.pid), spliced(admin)
                res = json.loads(subprocess.run(
                    [PY, E2E, "consume", boot, topic, "3", str(N), f"cap-{r}-{name}"],
                    capture_output=True, text=True).stdout.strip().splitlines()[-1])
                row = {"round": r, "proxy": name, "records": res["records"],
                       "steady_records_per_s": res.get("steady_records_per_s"),
                       "proxy_ns_per_record": round((cpu_s(p.pid) - c0) * 1e9 / max(res["records"], 1)),
                       "spliced_responses": int(spliced(admin) - s0)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        return rows
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
