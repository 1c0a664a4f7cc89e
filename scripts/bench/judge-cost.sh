#!/usr/bin/env bash
# Instructions per judged record for one case of benches/validate.rs, for one
# or more builds of that bench, counted by valgrind (cachegrind, no cache
# simulation): the count of judging N records minus that of judging none
# (the setup), over N. These VMs expose no hardware counters to `perf stat`,
# and their times swing by 30 % between runs; an instruction count does not,
# so two builds can be compared exactly. It is not a time: fewer
# instructions that wait on memory or mispredicted branches can be slower,
# so confirm a change with criterion or the end-to-end bench.
#   CARGO_TARGET_DIR=/work/bench-target cargo bench --bench validate --no-run
#   scripts/bench/judge-cost.sh json_schema /path/to/validate-A [/path/to/validate-B ...]
# Env: JUDGE_LOOPS (20000).
set -euo pipefail
name="$1"; shift
loops="${JUDGE_LOOPS:-20000}"
count() {  # count BIN LOOPS -> instructions of the whole run
  VALIDATE_ONLY="$name" VALIDATE_LOOPS="$2" valgrind --tool=cachegrind --cache-sim=no \
    --cachegrind-out-file=/dev/null "$1" --bench 2>&1 >/dev/null \
    | awk '/I *refs:/ {gsub(",", "", $NF); n = $NF} END {print n}'
}
for bin in "$@"; do
  i0=$(count "$bin" 0)
  i1=$(count "$bin" "$loops")
  echo "$name $bin: $(( (i1 - i0) / loops )) instructions per judged record ($loops records)"
done
