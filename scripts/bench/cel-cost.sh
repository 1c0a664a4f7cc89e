#!/usr/bin/env bash
# Instructions per evaluation of a CEL condition (policy/cel), counted by
# valgrind (cachegrind, no cache simulation) around the ignored unit test
# `cost_probe`: the count of N loops minus that of none, over N.
#   scripts/bench/cel-cost.sh BIN [two|ten]...
# BIN is antidote-core's unit-test executable built with optimisations:
#   cargo test --release -p antidote-core --lib --no-run
# (its path is printed as "Executable unittests src/lib.rs (...)").
# `two`: message.exit_time > message.enter_time; `ten`: the ten-clause
# worst case (cel/tests.rs, TEN). A `cel` rule judging a record whose
# fields are captured, as a JSON record's are: the reading of the record
# is not in it (judge-cost.sh json_cel measures a whole judged record).
set -euo pipefail
bin="$1"; shift
loops="${CEL_LOOPS:-100000}"
count() {  # count CASE LOOPS -> instructions of the whole run
  CEL_CASE="$1" CEL_LOOPS="$2" valgrind --tool=cachegrind --cache-sim=no \
    --cachegrind-out-file=/dev/null "$bin" --ignored --exact \
    policy::cel::tests::cost_probe --test-threads=1 2>&1 >/dev/null \
    | awk '/I *refs:/ {gsub(",", "", $NF); n = $NF} END {print n}'
}
for case in "${@:-two ten}"; do
  for c in $case; do
    i0=$(count "$c" 0)
    i1=$(count "$c" "$loops")
    echo "cel $c: $(( (i1 - i0) / loops )) instructions per evaluation ($loops evaluations)"
  done
done
