#!/usr/bin/env python3
"""Summarise a bench-e2e results.jsonl: throughput per round and the median
per path, ratios to direct, latency, proxy CPU/RSS, and the targets from
BENCHMARKS.md (met/missed)."""
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
runs = {}
for r in rows:
    if r.get("phase") == "path":
        runs.setdefault(r["path"], []).append(r)
machine = next((r["result"] for r in rows if r.get("phase") == "machine"), {})
produce = next((r["result"] for r in rows if r.get("phase") == "produce"), {})
dlts = [r for r in rows if r.get("phase") == "dlt"]


def consume(r):
    """One run's consumer result; c3 (three consumers at once) aggregated."""
    x = r.get("consume")
    if isinstance(x, list):
        recs = sum(y["records"] for y in x)
        secs = max(y["seconds"] for y in x)
        return {"records": recs, "seconds": secs, "records_per_s": recs / secs if secs else 0,
                "mb_per_s": sum(y["value_bytes"] for y in x) / secs / 1e6 if secs else 0,
                "consumer_cpu_s": sum(y["consumer_cpu_s"] for y in x),
                "steady_records_per_s": sum(y.get("steady_records_per_s", 0) for y in x),
                "poison_seen": sum(y.get("poison_seen", 0) for y in x)}
    return x or {}


def median(path, f):
    vals = [v for v in (f(r) for r in runs.get(path, [])) if v is not None]
    return statistics.median(vals) if vals else None


def rps(path):
    return median(path, lambda r: consume(r).get("steady_records_per_s"))


print(f"machine: {machine}")
print(f"produce: {produce}")
print()
print(f"{'path':5} {'round':>5} {'records':>9} {'sec':>7} {'rec/s':>9} {'steady/s':>9} {'MB/s':>7} "
      f"{'proxyCPU':>9} {'rewriteCPU':>10} {'brokerCPU':>9} {'consCPU':>8} {'VmHWM MB':>9}")
base = ["a", "b0", "b", "c", "c3", "d", "k", "a2"]
# Paths read by another consumer (BENCH_CONSUMERS: "perf", Kafka's
# ConsumerPerformance) are reported as "path.perf".
order = base + [f"{p}.{k}" for k in sorted({r.get("consumer") for rs in runs.values() for r in rs}
                                             - {None, "ck"}) for p in base]
for p in order:
    for r in runs.get(p, []):
        x = consume(r)
        hwm = r.get("proxy_vmhwm_kb")
        print(f"{p:5} {r.get('round', '-'):>5} {x.get('records', 0):>9} {x.get('seconds', 0):>7.2f} "
              f"{x.get('records_per_s', 0):>9.0f} {x.get('steady_records_per_s', 0):>9.0f} {x.get('mb_per_s', 0):>7.1f} "
              f"{str(r.get('proxy_cpu_s', '-')) if p.split('.')[0] not in ('a', 'a2') else '-':>9} "
              f"{str(r.get('rewrite_cpu_s', '-')):>10} {str(r.get('broker_cpu_s', '-')):>9} "
              f"{x.get('consumer_cpu_s', 0):>8.2f} {(hwm / 1024 if hwm else 0):>9.1f}")
print("rec/s: records / (last record - consumer start); steady/s: from the first batch received to the last"
      " (excludes connection set-up). c3: three consumers at once, summed.")
print()

def ns_per_record(path):
    """The proxy's CPU (process, /proc) per record delivered, median, ns."""
    return median(path, lambda r: 1e9 * r["proxy_cpu_s"] / consume(r)["records"]
                  if r.get("proxy_cpu_s") is not None and consume(r).get("records") else None)


# Baseline: direct reads (a, every round, and a2 at the end), median; per
# consumer (the "perf" paths against a.perf).
for family in [""] + sorted({p.split(".", 1)[1] for p in runs if "." in p}):
    sfx = f".{family}" if family else ""
    direct = [consume(r).get("steady_records_per_s") for p in (f"a{sfx}", f"a2{sfx}")
              for r in runs.get(p, [])]
    direct = [d for d in direct if d]
    ra_f = statistics.median(direct) if direct else None
    if not family:
        ra = ra_f
    print(f"medians{' (' + family + ')' if family else ''} (direct = median of {len(direct)} direct "
          f"reads: {ra_f and round(ra_f)} rec/s; spread {min(direct) if direct else '-'}-"
          f"{max(direct) if direct else '-'}):")
    print(f"  {'path':7} {'steady/s':>9} {'x a':>6} {'proxyCPU':>9} {'ns/rec':>7} {'rewriteCPU':>10}")
    for p in [x + sfx for x in base[1:-1]]:
        if p in runs:
            v = rps(p)
            ns = ns_per_record(p)
            print(f"  {p:7} {v:>9.0f} {v / ra_f if ra_f else float('nan'):>6.2f} "
                  f"{median(p, lambda r: r.get('proxy_cpu_s')) or 0:>9.2f} {ns or 0:>7.0f} "
                  f"{median(p, lambda r: r.get('rewrite_cpu_s')) or 0:>10.3f}")
print("ns/rec: the proxy process's CPU time (user + system, /proc) per record the consumer received")
print()
print("where the proxy's time goes (per run): Fetch responses inspected, mean wall ms each (from the response"
      " arriving to it being ready to send, DLT wait included), mean CPU ms each (decode, judge, splice, encode),"
      " DLT produce requests and their mean ms; share = inspected wall time / read time")
for p in ("b", "c", "c3", "b.perf", "c.perf", "b.share", "c.share"):
    for r in runs.get(p, []):
        n = r.get("rewrites")
        if not n:
            continue
        secs = consume(r).get("seconds") or 0
        dn = r.get("dlt_writes") or 0
        dlt_ms = f"{1000 * r['dlt_write_wall_s'] / dn:.1f}" if dn else "-"
        print(f"  {p:7} round {r.get('round')}: {n} responses, {1000 * r['rewrite_wall_s'] / n:.1f} ms wall, "
              f"{1000 * r['rewrite_cpu_s'] / n:.1f} ms CPU; {dn} DLT writes, {dlt_ms} ms; "
              f"share {r['rewrite_wall_s'] / secs if secs else 0:.2f}")
print()
# The share path (ShareConsumerPerformance, "path.share") against the Fetch
# path (ConsumerPerformance, "path.perf") of the same run: proxy CPU per
# record, records per request the proxy relayed (Fetch or ShareFetch).
share_checks = []
if any(p.endswith(".share") for p in runs):
    def per_request(path, field):
        return median(path, lambda r: consume(r)["records"] / r[field]
                      if r.get(field) and consume(r).get("records") else None)
    print("share path (ShareConsumerPerformance) against the Fetch path (ConsumerPerformance), medians:")
    print(f"  {'path':4} {'Fetch ns/rec':>12} {'share ns/rec':>12} {'share/Fetch':>11} "
          f"{'Fetch rec/req':>13} {'share rec/req':>13} {'Fetch steady/s':>14} {'share steady/s':>14} "
          f"{'share rewrite ns/rec':>20} {'Fetch rewrite ns/rec':>20} {'broker ns/rec F|S':>18}")
    for p in ("a", "b0", "b", "c"):
        f, sh = f"{p}.perf", f"{p}.share"
        if f not in runs or sh not in runs:
            continue
        nf, ns_ = ns_per_record(f), ns_per_record(sh)
        rw = lambda path: median(path, lambda r: 1e9 * r["rewrite_cpu_s"] / consume(r)["records"]
                                 if r.get("rewrite_cpu_s") is not None and consume(r).get("records") else None)
        br = lambda path: median(path, lambda r: 1e9 * r["broker_cpu_s"] / consume(r)["records"]
                                 if r.get("broker_cpu_s") is not None and consume(r).get("records") else None)
        fmt = lambda v, w, d=0: f"{v:>{w}.{d}f}" if v is not None else f"{'-':>{w}}"
        ratio = ns_ / nf if (ns_ is not None and nf) else None
        print(f"  {p:4} {fmt(nf if p != 'a' else None, 12)} {fmt(ns_ if p != 'a' else None, 12)} "
              f"{fmt(ratio if p != 'a' else None, 11, 2)} "
              f"{fmt(per_request(f, 'fetch_requests'), 13)} {fmt(per_request(sh, 'share_fetch_requests'), 13)} "
              f"{fmt(rps(f), 14)} {fmt(rps(sh), 14)} {fmt(rw(sh), 20)} {fmt(rw(f), 20)} "
              f"{fmt(br(f), 8)} | {fmt(br(sh), 7)}")
        if p != "a" and ratio is not None:
            # Also the ratio within each round (the two reads minutes apart at most).
            per_round = [1e9 * s_["proxy_cpu_s"] / consume(s_)["records"]
                         / (1e9 * f_["proxy_cpu_s"] / consume(f_)["records"])
                         for f_, s_ in zip(runs[f], runs[sh])
                         if f_.get("proxy_cpu_s") and consume(f_).get("records") and consume(s_).get("records")]
            share_checks.append((f"{p}: share path proxy CPU per record <= 1.2 x the Fetch path's (medians;"
                                 f" per round {', '.join(f'{x:.2f}' for x in per_round)})", ratio, ratio <= 1.2))
    print("  ns/rec: proxy process CPU (/proc utime+stime) per record the consumer received; rec/req: records"
          " received / Fetch (or ShareFetch) requests the proxy relayed; rewrite: antidote_fetch_rewrite_cpu_seconds_total"
          " (both paths); broker: the broker JVM's CPU per record")
    print()

failed = sorted({r.get("path") for r in rows if r.get("phase") == "consume" and r.get("failed")})
if failed:
    print(f"paths whose read failed (no figures): {', '.join(failed)}"
          " (d on Kafka 4.x: tansu's proxy cannot relay it)")
for d in dlts:
    res = d.get("result") or {}
    print(f"dead-letter topic{' (share)' if d.get('consumer') == 'share' else ''}, round {d.get('round', 1)}:"
          f" {res.get('records')} records (expected {res.get('expected')})")

print("latency (ms, round 1): path  e2e p50/p99 | direct p50/p99 (same records, same time) | added p99 | "
      "per-record path-direct p50/p99 | produce-ack p50/p99")
lat = {p: (runs[p][0].get("latency") or {}) for p in runs}
for p in ("a", "b0", "b", "c", "d"):
    l = lat.get(p) or {}
    if l:
        print(f"  {p:3} {l.get('p50_ms')}/{l.get('p99_ms')} | {l.get('direct_p50_ms')}/{l.get('direct_p99_ms')} | "
              f"{l.get('added_p99_ms')} | {l.get('paired_diff_p50_ms')}/{l.get('paired_diff_p99_ms')} | "
              f"{l.get('produce_ack_p50_ms')}/{l.get('produce_ack_p99_ms')}")
print("  (a is two direct consumers side by side: the method's own noise floor)")
print()

checks = []
rb, rc, rd = rps("b"), rps("c"), rps("d")
if ra and rb:
    checks.append(("b >= 0.95 x a (medians)", rb / ra, rb >= 0.95 * ra))
if rb and rd:
    checks.append(("b >= d (medians)", rb / rd, rb >= rd))
if ra and rc:
    checks.append(("c >= 0.80 x a (medians)", rc / ra, rc >= 0.80 * ra))
noise = (lat.get("a") or {}).get("added_p99_ms")
for p in ("b", "c", "d"):
    added = (lat.get(p) or {}).get("added_p99_ms")
    if added is not None:
        checks.append((f"{p}: added p99 <= 1 ms (p99 via {p} minus p99 of a direct consumer of the same records;"
                       f" two direct consumers differ by {noise})", added, added <= 1.0))
if "c" in runs and "c3" in runs:
    pairs = [(c, c3) for c, c3 in zip(runs["c"], runs["c3"])]
    r = [c3["rewrite_cpu_s"] / c["rewrite_cpu_s"] for c, c3 in pairs if c.get("rewrite_cpu_s")]
    if r:
        checks.append(("c3 validation CPU <= 1.3 x c (antidote_fetch_rewrite_cpu_seconds_total: decode, judge, "
                       f"splice, encode; median of {len(r)} rounds, each {', '.join(f'{x:.2f}' for x in r)})",
                       statistics.median(r), statistics.median(r) <= 1.3))
    raw = [c3["proxy_cpu_s"] / c["proxy_cpu_s"] for c, c3 in pairs if c.get("proxy_cpu_s")]
    if raw:
        checks.append(("c3 proxy CPU <= 1.3 x c (raw, includes relaying 3x bytes; median)",
                       statistics.median(raw), statistics.median(raw) <= 1.3))
    for c, c3 in pairs:
        e1, e3 = c.get("records_evaluated"), c3.get("records_evaluated")
        if e1:
            print(f"records run through the validator, round {c.get('round', 1)}: c {e1}, c3 {e3} "
                  f"({e3 / e1:.3f} x; the three groups read {3 * e1})")
for p in ("c", "c3"):
    if p in runs:
        seen = sum(consume(r).get("poison_seen") or 0 for r in runs[p])
        checks.append((f"{p}: no poison record reached a consumer (records seen with the poison marker,"
                       " all rounds)", seen, seen == 0))
checks += share_checks
print("targets:")
for name, val, ok in checks:
    print(f"  {'MET   ' if ok else 'MISSED'} {name}: {val:.3f}")
