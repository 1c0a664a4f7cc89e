#!/usr/bin/env bash
# The whole test run: setup, debug build, Rust unit tests (built and run
# alongside the integration suite), integration suite, fuzz smoke.
#   scripts/test.sh                      # everything
#   scripts/test.sh -k direct            # extra arguments go to pytest
#   ANTIDOTE_BIN=/path/to/antidote scripts/test.sh
# Every stage runs even if an earlier one failed (so one run shows everything);
# the exit status is non-zero if any stage failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

declare -a RESULTS=()
FAILED=0
# Time budget of each stage in seconds (2 cores; the whole run must stay under
# 30 minutes). The summary shows each stage's time against its budget; a stage
# over budget is flagged OVER, which does not fail the run by itself.
declare -A BUDGET=(
  ["setup"]=120 ["module layers and file sizes"]=15 ["cargo build"]=420
  ["pytest (integration)"]=720 ["cargo test (unit)"]=120 ["pytest (serial)"]=240
  ["install cargo-fuzz"]=300 ["fuzz smoke"]=420 ["pytest (Kafka 4.1.2 smoke)"]=180
)
# (fuzz smoke: ~80 s of fuzzing; the rest is the fuzz targets' release
# build, started at nice 19 beside the integration suite and often not done
# when the stage starts: 365 s in the CI run of a736034.)
over() {  # over NAME SECONDS: " of Bs budget" or " of Bs budget: OVER"
  local b="${BUDGET[$1]:-}"
  [[ -z "$b" ]] && return
  if (( $2 > b )); then printf ' of %ss budget: OVER' "$b"; else printf ' of %ss budget' "$b"; fi
}
stage() {  # stage NAME CMD...: run, record pass/fail, never abort the script
  local name="$1"; shift
  local t0=$SECONDS
  printf '\n==== %s ====\n' "$name"
  if "$@"; then
    local t=$((SECONDS - t0))
    RESULTS+=("PASS  $name (${t}s$(over "$name" "$t"))")
  else
    local rc=$? t=$((SECONDS - t0))
    RESULTS+=("FAIL  $name (exit $rc, ${t}s$(over "$name" "$t"))")
    FAILED=1
  fi
}

# Setup failing means nothing else can run meaningfully.
printf '==== setup ====\n'
t0=$SECONDS
bash scripts/setup.sh
RESULTS+=("PASS  setup ($((SECONDS - t0))s$(over setup $((SECONDS - t0))))")

# Build cache. A CI run starts from a fresh clone, so its target/ is empty
# and the dependencies' build alone took most of a 9-minute stage. Under
# CI=true (or with ANTIDOTE_BUILD_CACHE set) cargo builds into a directory
# outside the clone that the next run on this machine finds again: the
# crates.io dependencies are reused, the workspace's own crates are rebuilt
# (a fresh clone's files are newer than any cached fingerprint), so nothing
# stale is ever used. Cargo locks the directory, so two runs at once wait
# for each other rather than mix. Over 20 GiB, the cache starts afresh.
if [[ -z "${CARGO_TARGET_DIR:-}" ]] && [[ -n "${ANTIDOTE_BUILD_CACHE:-}" || "${CI:-}" == true ]]; then
  CACHE="${ANTIDOTE_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/antidote-ci}"
  mkdir -p "$CACHE"
  if [[ "$(du -s --block-size=1G "$CACHE" 2>/dev/null | cut -f1)" -gt 20 ]]; then
    printf '[test] build cache %s is over 20 GiB: emptied\n' "$CACHE"
    rm -rf "${CACHE:?}"/*
  fi
  export CARGO_TARGET_DIR="$CACHE/target"
  FUZZ_TARGET_DIR="$CACHE/fuzz-target"
  # The fuzz crate is a workspace of its own, so the proxy's crates are path
  # dependencies outside it, hashed by their absolute path: every clone
  # builds them (and the fuzz targets) under new names, ~1.6 GB a run that
  # no later run can use. Remove the previous clones' copies first.
  # (In the main workspace the hashes are relative to its root: no growth.)
  FUZZ_OUT="$FUZZ_TARGET_DIR/x86_64-unknown-linux-gnu/release"
  if [[ -d "$FUZZ_OUT" ]]; then
    for name in antidote antidote_core antidote_fuzz kafka_protocol \
                $(grep -A1 '^\[\[bin\]\]' fuzz/Cargo.toml | sed -n 's/^name = "\(.*\)"/\1/p'); do
      rm -rf "$FUZZ_OUT"/deps/{,lib}"$name"-* "$FUZZ_OUT"/{.fingerprint,build}/"${name//_/-}"-*
    done
  fi
  printf '[test] cargo builds into %s\n' "$CARGO_TARGET_DIR"
fi
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

# Debug build only: release builds are too slow for shared 2-core machines.
stage "module layers and file sizes" bash -c 'python3 scripts/check-layers.py && python3 scripts/trace-count.py'
stage "cargo build" cargo build --locked --bin antidote

# The integration suite runs a copy of the binary (inside the clone), so
# that nothing cargo does meanwhile (below) can replace it under a running
# test.
if [[ -z "${ANTIDOTE_BIN:-}" && -x "$TARGET_DIR/debug/antidote" ]]; then
  mkdir -p target/it
  cp "$TARGET_DIR/debug/antidote" target/it/antidote
  export ANTIDOTE_BIN="$ROOT/target/it/antidote"
fi

# The unit tests' build (~5 min of the 2 cores, the run itself ~30 s) goes
# on at a low priority while the integration suite, which mostly waits on
# brokers and consumer groups, runs; its result is a stage of its own,
# collected before the serial tests (which must run alone).
UNIT_LOG="$(mktemp)"
(nice -n 15 cargo test --locked --workspace >"$UNIT_LOG" 2>&1) &
UNIT_PID=$!
unit_tests() {  # wait for the background unit tests; show their output
  local rc=0
  wait "$UNIT_PID" || rc=$?
  cat "$UNIT_LOG"
  rm -f "$UNIT_LOG"
  return $rc
}

# The fuzz targets' release build (~5 min on 2 cores) runs at the lowest
# priority while the integration suite, which mostly waits on brokers and
# consumer groups, runs; the fuzz stage then finds it built.
FUZZ_PREBUILD=""
if [[ "${ANTIDOTE_SKIP_FUZZ:-0}" != 1 ]] && command -v cargo-fuzz >/dev/null 2>&1; then
  FUZZ_PREBUILD="$(mktemp)"
  (RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$ROOT/fuzz/target}" nice -n 19 cargo fuzz build --fuzz-dir fuzz --sanitizer none \
     --debug-assertions --release >"$FUZZ_PREBUILD" 2>&1 || true) &
fi

# Integration suite. No -x: one run reports every failure. The outer timeout
# is a backstop; each test also has its own (tests/pytest.ini).
# Four workers (pytest-xdist), one test file per worker at a time: the tests
# mostly wait on brokers and group joins, so 2 cores serve 4 of them (the
# 441 tests on Kafka 4.4: 618 s with 3 workers, 522 s with 4). Each
# worker starts its own Apache Kafka broker (session fixtures are per worker;
# ANTIDOTE_TEST_BROKER=tansu runs them on tansu instead), every port
# is claimed once per run (harness.free_port) and every topic/group name is
# unique, so files do not share state. PYTEST_WORKERS=0 runs serially.
PYTEST_ARGS=(tests/ -p no:cacheprovider -o junit_family=xunit2)
if [[ "${PYTEST_WORKERS:-4}" != 0 ]]; then
  PYTEST_ARGS+=(-n "${PYTEST_WORKERS:-4}" --dist loadfile)
fi
if [[ $# -gt 0 ]]; then PYTEST_ARGS+=("$@"); fi
# Tests marked `serial` measure throughput ratios; they run afterwards, alone,
# so that the other workers' load is not part of what they measure.
# With extra arguments (-k ...), one of the two stages may select nothing
# (pytest's exit 5); the run passes only if the other one selected tests:
# extra arguments never turn "no tests selected" into a pass. A full run
# must select tests in both.
EXTRA_ARGS=$#
declare -A NOSEL=()
# Under CI (CI=true, or .ci/run), a skipped fault-injection or console test
# fails the run: those tests skip where their tools are missing, and a run
# that skipped them proves nothing about what they check.
STRICT=0
if [[ "${CI:-}" == true || "${ANTIDOTE_CI_ENTRY:-0}" == 1 ]]; then STRICT=1; fi
MUST_RUN_FILES="test_jepsen.py test_console.py"
# Each pytest stage's JUnit XML (read for skips; kept as a test artefact).
JUNIT_DIR="$ROOT/target/test-artifacts/junit"
mkdir -p "$JUNIT_DIR"
# The network-fault runs (test_jepsen.py) replay CI's two fixed seeds and
# one fresh seed per run, printed here so that a failure can be replayed
# with ANTIDOTE_JEPSEN_SEED=<seed>.
if [[ -z "${ANTIDOTE_JEPSEN_SEED:-}" && -z "${ANTIDOTE_JEPSEN_FRESH_SEED:-}" ]]; then
  ANTIDOTE_JEPSEN_FRESH_SEED=$(( (RANDOM << 15 | RANDOM) % 2147483646 + 1 ))
fi
export ANTIDOTE_JEPSEN_FRESH_SEED="${ANTIDOTE_JEPSEN_FRESH_SEED:-}"
[[ -n "$ANTIDOTE_JEPSEN_FRESH_SEED" ]] && \
  printf '[test] fresh Jepsen seed %s (replay: ANTIDOTE_JEPSEN_SEED=%s)\n' \
    "$ANTIDOTE_JEPSEN_FRESH_SEED" "$ANTIDOTE_JEPSEN_FRESH_SEED"
skipped_must_run() {  # skipped_must_run JUNIT.xml: names of skipped must-run tests
  python3 - "$1" $MUST_RUN_FILES <<'PY'
import sys, xml.etree.ElementTree as ET
path, files = sys.argv[1], sys.argv[2:]
try:
    root = ET.parse(path).getroot()
except (OSError, ET.ParseError) as e:
    print(f"cannot read {path}: {e}"); sys.exit(0)
for case in root.iter("testcase"):
    where = (case.get("file") or "") + " " + (case.get("classname") or "")
    if any(f.removesuffix(".py") in where for f in files) and case.find("skipped") is not None:
        print(f"{case.get('classname')}::{case.get('name')}: "
              f"{case.find('skipped').get('message', '')}")
PY
}
pytest_stage() {  # pytest_stage NAME MARKER-EXPRESSION ARGS...
  local rc=0 name="$1" xml="$JUNIT_DIR/$1.xml"
  timeout --signal=INT --kill-after=30 1500 \
    "$ROOT/.venv/bin/python" -m pytest -m "$2" --junitxml="$xml" "${@:3}" || rc=$?
  if [[ $rc == 5 && $EXTRA_ARGS -gt 0 ]]; then
    printf '[test] %s: no tests selected by the extra arguments\n' "$name"
    NOSEL[$name]=1
    rc=0
  fi
  if [[ $STRICT == 1 && -f "$xml" ]]; then
    local skipped
    skipped="$(skipped_must_run "$xml")"
    if [[ -n "$skipped" ]]; then
      printf '[test] under CI these tests must run, and were skipped:\n%s\n' "$skipped"
      [[ $rc == 0 ]] && rc=1
    fi
  fi
  return $rc
}
stage "pytest (integration)" pytest_stage integration "not serial" "${PYTEST_ARGS[@]}"
stage "cargo test (unit)" unit_tests
SERIAL_ARGS=(tests/ -p no:cacheprovider -o junit_family=xunit2)
if [[ $# -gt 0 ]]; then SERIAL_ARGS+=("$@"); fi
stage "pytest (serial)" pytest_stage serial serial "${SERIAL_ARGS[@]}"
if [[ -n "${NOSEL[integration]:-}" && -n "${NOSEL[serial]:-}" ]]; then
  RESULTS+=("FAIL  pytest: the extra arguments ($*) selected no test in either stage")
  FAILED=1
fi

# A short smoke run on the older Kafka the suite supported before 4.4
# (ANTIDOTE_KAFKA_VERSION runs everything on another version): the version
# table, the Java clients, id-only requests and the frameworks. Skipped under
# tansu, and with extra arguments on a developer's machine (a run of chosen
# tests); under CI it runs whatever the arguments, which do not apply to it.
SMOKE_KAFKA="${ANTIDOTE_SMOKE_KAFKA_VERSION:-4.1.2}"
smoke_stage() {
  local EXTRA_ARGS=0  # its files are fixed: selecting nothing is a failure
  ANTIDOTE_KAFKA_VERSION="$SMOKE_KAFKA" bash scripts/setup.sh || return 1
  ANTIDOTE_KAFKA_VERSION="$SMOKE_KAFKA" pytest_stage smoke "not serial" \
    tests/test_api_versions.py tests/test_java_clients.py tests/test_topic_ids.py \
    tests/test_frameworks.py -p no:cacheprovider -o junit_family=xunit2 \
    -n "${PYTEST_WORKERS:-4}" --dist loadfile
}
if [[ ($EXTRA_ARGS == 0 || $STRICT == 1) && "${ANTIDOTE_TEST_BROKER:-kafka}" == kafka \
      && "${PYTEST_WORKERS:-4}" != 0 ]]; then
  stage "pytest (Kafka $SMOKE_KAFKA smoke)" smoke_stage
fi

# Fuzz smoke: every cargo-fuzz target for a few seconds from its committed
# seeds (a longer campaign is documented in BENCHMARKS.md). Skip with
# ANTIDOTE_SKIP_FUZZ=1 for a quicker local run.
if [[ "${ANTIDOTE_SKIP_FUZZ:-0}" != 1 ]]; then
  wait  # for the prebuild, if one ran; fuzz-smoke.sh builds whatever is missing
  [[ -n "$FUZZ_PREBUILD" ]] && rm -f "$FUZZ_PREBUILD"
  if ! command -v cargo-fuzz >/dev/null 2>&1; then
    stage "install cargo-fuzz" cargo install cargo-fuzz --version 0.13.2 --locked
  fi
  stage "fuzz smoke" env FUZZ_SECONDS="${FUZZ_SECONDS:-8}" \
    CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$ROOT/fuzz/target}" \
    bash scripts/fuzz-smoke.sh
fi

printf '\n==== summary ====\n'
printf 'broker: %s\n' "${ANTIDOTE_TEST_BROKER:-kafka ${ANTIDOTE_KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' scripts/kafka/pom.xml)}}"
printf '%s\n' "${RESULTS[@]}"
printf 'total: %ss of 1800s\n' "$SECONDS"
exit "$FAILED"
