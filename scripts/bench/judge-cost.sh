#!/usr/bin/env bash
# Instructions per record, counted by valgrind (cachegrind, no cache
# simulation), for one or more builds of a bench: the count of N loops minus
# that of none (the setup), over the records judged.
#   judge-cost.sh json_schema BIN...   one record judged (benches/validate.rs,
#                                      any of its cases), N = JUDGE_LOOPS (20000)
#   judge-cost.sh --filter BIN...      the whole rewrite of a 4,000-record
#                                      partition (benches/filter.rs `threads`:
#                                      plan, decode, judge, splice), N = 8;
#                                      FILTER_FORMAT=json|avro|protobuf picks
#                                      the reference policy (default json);
#                                      FILTER_POISON_EVERY=N one poison record
#                                      in N (default 1000: one per batch; 0: none)
# BIN is the bench executable, printed by
#   CARGO_TARGET_DIR=/work/bench-target cargo bench --bench validate --no-run
# These VMs expose no hardware counters to `perf stat`, and their times
# swing by 30-50 % between runs; an instruction count does not move, so
# builds can be compared exactly. It is not a time (fewer instructions that
# wait on memory can be slower): confirm a change with criterion or the
# end-to-end bench.
set -euo pipefail
case="$1"; shift
if [[ "$case" == --filter ]]; then
  loops="${JUDGE_LOOPS:-8}"; records=$((loops * 4000))
  envs() { echo "FILTER_LOOPS=$1"; }
else
  loops="${JUDGE_LOOPS:-20000}"; records=$loops
  envs() { echo "VALIDATE_ONLY=$case VALIDATE_LOOPS=$1"; }
fi
count() {  # count BIN LOOPS -> instructions of the whole run
  env $(envs "$2") valgrind --tool=cachegrind --cache-sim=no \
    --cachegrind-out-file=/dev/null "$1" --bench 2>&1 >/dev/null \
    | awk '/I *refs:/ {gsub(",", "", $NF); n = $NF} END {print n}'
}
for bin in "$@"; do
  i0=$(count "$bin" 0)
  i1=$(count "$bin" "$loops")
  echo "$case ${FILTER_FORMAT:-json} poison-every=${FILTER_POISON_EVERY:-1000} $bin: $(( (i1 - i0) / records )) instructions per record ($records records)"
done
