#!/usr/bin/env bash
# Two (or more) antidote builds alternating on one path of the deterministic
# bench (default b0), N pairs, each run counted by perf tracepoints for the
# whole machine: splice, epoll_wait and setsockopt system calls. On these
# VMs a time per record moves with the moment, so builds are compared only
# within the same minutes.
#   N=5 BENCH_RECORDS=5000000 scripts/bench/ab-b0.sh BIN_A BIN_B
# Env: N (3), PATHS (b0), OUT (/tmp/ab-b0), BENCH_RECORDS, BENCH_FETCH_BIN and
# BENCH_BROKER_BIN (release examples fetch_load and bench_broker, built with
#   CARGO_TARGET_DIR=/work/bench-target cargo build --release --example bench_broker --example fetch_load).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/ab-b0}; mkdir -p "$OUT"
FETCH=${BENCH_FETCH_BIN:-/work/bench-target/release/examples/fetch_load}
BROKER=${BENCH_BROKER_BIN:-/work/bench-target/release/examples/bench_broker}
for i in $(seq 1 "${N:-3}"); do
  for b in "$@"; do
    name=$(basename "$b")
    perf stat -a -x, -e syscalls:sys_enter_splice -e syscalls:sys_enter_epoll_wait \
      -e syscalls:sys_enter_setsockopt -o "$OUT/perf-$name-$i.csv" -- \
      env BENCH_CONSUMER=fetch_load BENCH_FETCH_BIN="$FETCH" BENCH_PORT="${BENCH_PORT:-15100}" \
      BENCH_FORMAT=json BENCH_PATHS="${PATHS:-b0}" BENCH_ROUNDS=1 BENCH_BIN="$b" \
      BENCH_BROKER_BIN="$BROKER" .venv/bin/python scripts/bench/deterministic.py \
      > "$OUT/det-$name-$i.txt" 2>&1
    echo "== $name run $i"
    grep -E "round 1 " "$OUT/det-$name-$i.txt" | cut -c1-400
    grep -v "^#" "$OUT/perf-$name-$i.csv" | cut -d, -f1,3 | tr '\n' ' '; echo
  done
done
