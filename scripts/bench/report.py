#!/usr/bin/env python3
"""Summarise a bench-e2e results.jsonl: throughput, ratios to direct,
latency, proxy CPU/RSS, and the targets from BENCHMARKS.md (met/missed)."""
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
paths = {r["path"]: r for r in rows if r.get("phase") == "path"}
machine = next((r["result"] for r in rows if r.get("phase") == "machine"), {})
produce = next((r["result"] for r in rows if r.get("phase") == "produce"), {})
dlt = next((r["result"] for r in rows if r.get("phase") == "dlt"), None)

def c(p):
    x = paths.get(p, {}).get("consume")
    if isinstance(x, list):  # c3: three consumers at once; aggregate
        recs = sum(y["records"] for y in x)
        secs = max(y["seconds"] for y in x)
        return {"records": recs, "seconds": secs, "records_per_s": recs / secs if secs else 0,
                "mb_per_s": sum(y["value_bytes"] for y in x) / secs / 1e6 if secs else 0,
                "consumer_cpu_s": sum(y["consumer_cpu_s"] for y in x),
                "steady_records_per_s": sum(y.get("steady_records_per_s", 0) for y in x)}
    return x

print(f"machine: {machine}")
print(f"produce: {produce}")
print()
print(f"{'path':5} {'records':>9} {'sec':>7} {'rec/s':>9} {'steady/s':>9} {'MB/s':>7} {'x a':>6} {'proxyCPU':>9} {'brokerCPU':>9} "
      f"{'consCPU':>8} {'VmHWM MB':>9} {'p50 ms':>7} {'p99 ms':>7} {'p99+':>6}")
# Baseline: the better of the two direct reads (a before the proxies, a2 after).
a = max((c(p) for p in ("a", "a2") if c(p)), key=lambda x: x.get("steady_records_per_s", 0), default=None)
for p in ["a", "b0", "b", "c", "c3", "d", "a2"]:
    if p not in paths:
        continue
    x = c(p) or {}
    r = paths[p]
    lat = r.get("latency") or {}
    ratio = x.get("steady_records_per_s", 0) / a["steady_records_per_s"] if a and a.get("steady_records_per_s") else float("nan")
    hwm = r.get("proxy_vmhwm_kb")
    p99 = lat.get("p99_ms")
    added = lat.get("added_p99_ms")
    print(f"{p:5} {x.get('records', 0):>9} {x.get('seconds', 0):>7.2f} {x.get('records_per_s', 0):>9.0f} {x.get('steady_records_per_s', 0):>9.0f} "
          f"{x.get('mb_per_s', 0):>7.1f} {ratio:>6.2f} {str(r.get('proxy_cpu_s', '-')) if p != 'a' else '-':>9} "
          f"{str(r.get('broker_cpu_s', '-')):>9} {x.get('consumer_cpu_s', 0):>8.2f} "
          f"{(hwm / 1024 if hwm else 0):>9.1f} {str(lat.get('p50_ms', '-')):>7} {str(p99 if p99 is not None else '-'):>7} "
          f"{(f'{added:+.2f}' if added is not None else '-'):>6}")
print("rec/s: records / (last record - consumer start); steady/s: from the first batch received to the last"
      " (excludes connection set-up); 'x a' uses steady/s against the better of a and a2. c3: sum of three consumers.")
print()
if dlt:
    print(f"dead-letter topic: {dlt.get('records')} records (expected {dlt.get('expected')})")

def rps(p):
    x = c(p)
    return x.get("steady_records_per_s") if x else None

print("latency (ms): path  e2e p50/p99 | direct p50/p99 (same records, same time) | added p99 | per-record path-direct p50/p99 | produce-ack p50/p99")
for p in ("a", "b0", "b", "c", "d"):
    l = (paths.get(p, {}).get("latency") or {})
    if l:
        print(f"  {p:3} {l.get('p50_ms')}/{l.get('p99_ms')} | {l.get('direct_p50_ms')}/{l.get('direct_p99_ms')} | "
              f"{l.get('added_p99_ms')} | {l.get('paired_diff_p50_ms')}/{l.get('paired_diff_p99_ms')} | "
              f"{l.get('produce_ack_p50_ms')}/{l.get('produce_ack_p99_ms')}")
print("  (a is two direct consumers side by side: the method's own noise floor)")
print()
checks = []
ra, rb, rc, rd = (a or {}).get("steady_records_per_s"), rps("b"), rps("c"), rps("d")
if ra and rb:
    checks.append(("b >= 0.95 x a", rb / ra, rb >= 0.95 * ra))
if rb and rd:
    checks.append(("b >= d", rb / rd, rb >= rd))
if ra and rc:
    checks.append(("c >= 0.80 x a", rc / ra, rc >= 0.80 * ra))
for p in ("b", "c", "d"):
    added = (paths.get(p, {}).get("latency") or {}).get("added_p99_ms")
    if added is not None:
        checks.append((f"{p}: added p99 <= 1 ms (p99 via {p} minus p99 of a direct consumer of the same records)",
                       added, added <= 1.0))
if "c" in paths and "c3" in paths:
    c1, c3 = paths["c"]["proxy_cpu_s"], paths["c3"]["proxy_cpu_s"]
    checks.append(("c3 proxy CPU <= 1.3 x c (raw, includes relaying 3x bytes)", c3 / c1 if c1 else float("nan"),
                   c1 > 0 and c3 <= 1.3 * c1))
    r1, r3 = paths["c"].get("rewrite_cpu_s"), paths["c3"].get("rewrite_cpu_s")
    if r1 and r3 is not None:
        checks.append(("c3 validation CPU <= 1.3 x c (antidote_fetch_rewrite_cpu_seconds_total: decode, judge, splice, encode)",
                       r3 / r1, r3 <= 1.3 * r1))
    e1, e3 = paths["c"].get("records_evaluated"), paths["c3"].get("records_evaluated")
    if e1 and e3 is not None:
        print(f"records run through the validator: c {e1}, c3 {e3} ({e3 / e1:.3f} x; three groups read {3 * e1})")
    if "b" in paths:
        b1 = paths["b"]["proxy_cpu_s"]
        v1, v3 = c1 - b1, c3 - 3 * b1
        checks.append(("c3 validation CPU <= 1.3 x c (proxy CPU minus b's relay cost)",
                       v3 / v1 if v1 > 0 else float("nan"), v1 > 0 and v3 <= 1.3 * v1))
for p in ("c", "c3"):
    x = paths.get(p, {}).get("consume")
    if x:
        seen = sum(y.get("poison_seen", 0) for y in (x if isinstance(x, list) else [x]))
        checks.append((f"{p}: no poison record reached a consumer (records seen with the poison marker)",
                       seen, seen == 0))
print("targets:")
for name, val, ok in checks:
    print(f"  {'MET   ' if ok else 'MISSED'} {name}: {val:.3f}")
