#!/usr/bin/env bash
# Bounded fuzz smoke run: every cargo-fuzz target for FUZZ_SECONDS (default 20)
# on a scratch copy of its committed seed corpus. Fails on the first crash,
# leak, timeout or OOM that libFuzzer reports; prints executions per target.
#
#   scripts/fuzz-smoke.sh                 # all targets, 20 s each
#   FUZZ_SECONDS=5 scripts/fuzz-smoke.sh frame judge_json
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`). The toolchain here is
# stable, so RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z flags. Built with
# --sanitizer none (the code under test is safe Rust; the C in zstd is not
# instrumented by rustc's ASan anyway) and with debug assertions on.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECS="${FUZZ_SECONDS:-20}"
export RUSTC_BOOTSTRAP=1
command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz missing: cargo install cargo-fuzz" >&2; exit 2; }

# The targets are the [[bin]] entries of fuzz/Cargo.toml; cargo fuzz must list
# every one of them (a listing that fails or comes back short is an error,
# not a smoke run over nothing).
expected="$(grep -A1 '^\[\[bin\]\]' fuzz/Cargo.toml | sed -n 's/^name = "\(.*\)"$/\1/p' | sort)"
listed="$(cargo fuzz list --fuzz-dir fuzz | sort)"
if [[ -z "$expected" || "$listed" != "$expected" ]]; then
  printf '[fuzz-smoke] cargo fuzz list does not match fuzz/Cargo.toml\nlisted:\n%s\nexpected:\n%s\n' \
    "$listed" "$expected" >&2
  exit 2
fi
if [[ $# -gt 0 ]]; then targets=("$@"); else mapfile -t targets <<<"$expected"; fi
FLAGS=(--fuzz-dir fuzz --sanitizer none --debug-assertions --release)
echo "[fuzz-smoke] building ${#targets[@]} targets" >&2
cargo fuzz build "${FLAGS[@]}" >&2

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
status=0
printf '%-16s %12s %10s  %s\n' target execs exec/s result
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t" "fuzz/artifacts/$t"
  [[ -d "fuzz/corpus/$t" ]] && cp -r "fuzz/corpus/$t/." "$scratch/$t/"
  log="$scratch/$t.log"
  if cargo fuzz run "${FLAGS[@]}" "$t" "$scratch/$t" -- \
      -max_total_time="$SECS" -timeout=10 -rss_limit_mb=1536 -max_len=65536 \
      -print_final_stats=1 >"$log" 2>&1; then
    result=ok
  else
    result="CRASH (see fuzz/artifacts/$t/)"
    status=1
    grep -E "panicked|ERROR: libFuzzer|SUMMARY|Test unit written" "$log" | head -8 >&2 || true
  fi
  execs="$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)"
  rate="$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)"
  printf '%-16s %12s %10s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$result"
done
exit $status
