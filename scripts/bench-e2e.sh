#!/usr/bin/env bash
# End-to-end benchmark on this machine (see BENCHMARKS.md):
#   start the broker (BENCH_BROKER: kafka, the suite's Apache Kafka, by
#   default; or tansu with memory storage); produce BENCH_RECORDS (~200-byte
#   geofence JSON, one in BENCH_POISON_EVERY poison) to a 3-partition topic
#   once; then consume all of it with each of BENCH_CONSUMERS (ck: a
#   librdkafka consumer, confluent-kafka; perf: Apache Kafka's own
#   ConsumerPerformance, reported as path.perf; share: Kafka's
#   ShareConsumerPerformance in a share group, reported as path.share, c
#   with DLTs of its own: scripts/bench/share-perf.sh) through
#     a   the broker directly
#     b0  antidote, no policies at all (interceptor off)
#     b   antidote, a policy on another topic only (Fetch decoded, forwarded)
#     c   antidote, the reference JSON policy on the topic (poison diverted)
#     c3  like c, three consumer groups at once (fresh proxy)
#     d   `tansu proxy` (a plain pass-through proxy, the peer; on Kafka 4.x it
#         cannot relay: Metadata fails to decode, so on Kafka d is recorded
#         as failed and does not fail the run)
#     k   Kroxylicious 0.12 (a Kafka-protocol proxy in Java, no filters): the
#         pass-through peer on Apache Kafka (scripts/bench/kroxylicious/)
#   For each path: records/s, MB/s, ratio to a, the proxy's CPU seconds and
#   peak RSS; then produce->consume latency at BENCH_LAT_RATE msg/s.
#
# The paths are read in BENCH_ROUNDS rounds (a b0 b c c3 d, a b0 b c c3 d,
# ...) so that drift on a shared machine hits every path alike; the report
# uses each path's median. Latency is measured in round 1 only. Path c diverts
# afresh each round (its DLT is named per round); c3 reads with round 1's DLT
# in place, as later consumer groups would.
#
# Env: BENCH_BROKER (kafka|tansu), BENCH_CONSUMERS ("ck perf"),
# BENCH_RECORDS (1000000), BENCH_POISON_EVERY (1000), BENCH_LAT_RATE
# (10000), BENCH_LAT_SECONDS (10), BENCH_ROUNDS (3), BENCH_PATHS ("a b0 b c c3 d"),
# BENCH_COMPRESSION (none|lz4|zstd|...), BENCH_PORT (base port, random),
# BENCH_SKIP_BUILD=1, BENCH_OUT (results JSON file), BENCH_COMMIT (the
# commit BENCH_BIN was built from, if not the work tree's),
# BENCH_FETCH_MAX_BYTES / BENCH_MAX_POLL_RECORDS (perf and share: see
# scripts/bench/e2e.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

N="${BENCH_RECORDS:-1000000}"
POISON_EVERY="${BENCH_POISON_EVERY:-1000}"
LAT_RATE="${BENCH_LAT_RATE:-10000}"
LAT_SECS="${BENCH_LAT_SECONDS:-10}"
BROKER="${BENCH_BROKER:-kafka}"
if [[ $BROKER == kafka ]]; then PATHS="${BENCH_PATHS:-a b0 b c c3 k d}"; else PATHS="${BENCH_PATHS:-a b0 b c c3 d}"; fi
CONSUMERS="${BENCH_CONSUMERS:-ck perf}"
ROUNDS="${BENCH_ROUNDS:-3}"
# Below Linux's ephemeral range (32768-60999), as deterministic.py.
BASE="${BENCH_PORT:-$((20000 + RANDOM % 12000))}"
TOPIC=geofence.triggers
PY="$ROOT/.venv/bin/python"
TANSU="$ROOT/.tools/bin/tansu"
BIN="${BENCH_BIN:-$ROOT/target/release/antidote}"
HELPER="$ROOT/scripts/bench/e2e.py"
WORK="$(mktemp -d /tmp/antidote-bench.XXXXXX)"
OUT="${BENCH_OUT:-$ROOT/target/bench-e2e/results-$(date +%Y%m%d-%H%M%S).json}"
mkdir -p "$(dirname "$OUT")"
RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
CLK_TCK="$(getconf CLK_TCK)"

log() { printf '[bench-e2e %s] %s\n' "$(date +%T)" "$*" >&2; }

PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [[ -n "${BENCH_KEEP_WORK:-}" ]] || rm -rf "$WORK"
}
trap cleanup EXIT

[[ -x "$TANSU" && -x "$PY" ]] && "$PY" -c 'import sys; sys.path.insert(0, "tests"); import harness; harness.kafka_classpath()' 2>/dev/null \
  || bash scripts/setup.sh
if [[ -z "${BENCH_SKIP_BUILD:-}" ]]; then
  log "cargo build --release"
  cargo build --release --bin antidote >&2
fi

wait_port() { # port seconds pid
  local end=$((SECONDS + $2))
  while ((SECONDS < end)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    kill -0 "$3" 2>/dev/null || { log "process $3 died"; return 1; }
    sleep 0.1
  done
  log "port $1 not open after $2 s"; return 1
}
cpu_s() { awk -v t="$CLK_TCK" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / t }' "/proc/$1/stat"; }
hwm_kb() { awk '/^VmHWM/ { print $2 }' "/proc/$1/status"; }
record() { echo "$1" >>"$RESULTS"; }

stop() { # pid
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# --- broker -----------------------------------------------------------------
BP=$BASE
if [[ $BROKER == kafka ]]; then
  "$PY" "$ROOT/scripts/bench/kafka_broker.py" "$BP" "$WORK/kafka" "${BENCH_KAFKA_HEAP:-1g}" \
    >"$WORK/kafka.json" 2>"$WORK/kafka.log" &
  WRAPPER_PID=$!; PIDS+=("$WRAPPER_PID")
  for _ in $(seq 1 1200); do [[ -s "$WORK/kafka.json" ]] && break; kill -0 "$WRAPPER_PID" || break; sleep 0.1; done
  [[ -s "$WORK/kafka.json" ]] || { log "kafka did not start: $(tail -20 "$WORK/kafka.log")"; exit 1; }
  BROKER_PID="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$WORK/kafka.json")"
  BROKER_NAME="kafka $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$WORK/kafka.json")"
  for t in "$TOPIC" latency.a latency.b0 latency.b latency.c latency.d; do
    "$PY" "$HELPER" create "127.0.0.1:$BP" "$t" 3
  done
else
  "$TANSU" broker --listener-url "tcp://127.0.0.1:$BP" --advertised-listener-url "tcp://127.0.0.1:$BP" \
    --storage-engine memory://tansu/ >"$WORK/tansu.log" 2>&1 &
  BROKER_PID=$!; PIDS+=("$BROKER_PID")
  BROKER_NAME="tansu"
  wait_port "$BP" 15 "$BROKER_PID"
  for t in "$TOPIC" latency.a latency.b0 latency.b latency.c latency.d; do
    "$TANSU" topic create "$t" --broker "tcp://127.0.0.1:$BP" --partitions 3 >>"$WORK/tansu-admin.log" 2>&1
  done
fi
log "$BROKER_NAME up on $BP (pid $BROKER_PID)"

# --- policies ---------------------------------------------------------------
# c: the reference policy, also covering the latency topics.
sed -e 's#topics: \["geofence.triggers"\]#topics: ["geofence.triggers", "latency.*"]#' \
    -e "s#schema: schemas/#schema: $ROOT/policies/schemas/#" policies/geofence.yaml >"$WORK/policy-c.yaml"
grep -q 'latency\.\*' "$WORK/policy-c.yaml" || { log "could not adapt policies/geofence.yaml"; exit 1; }
grep -q 'topic: "{topic}.dlt"' "$WORK/policy-c.yaml" || { log "policies/geofence.yaml has no {topic}.dlt"; exit 1; }
for r in $(seq 2 "$ROUNDS"); do
  sed -e "s#topic: \"{topic}.dlt\"#topic: \"{topic}.dlt-r$r\"#" "$WORK/policy-c.yaml" >"$WORK/policy-c-r$r.yaml"
done
# The share consumer's c diverts afresh too: DLTs of its own, one per round.
for r in $(seq 1 "$ROUNDS"); do
  sed -e "s#topic: \"{topic}.dlt\"#topic: \"{topic}.dlt-share-r$r\"#" "$WORK/policy-c.yaml" >"$WORK/policy-c-share-r$r.yaml"
done
policy_c() { # round [consumer]
  if [[ ${2:-} == share ]]; then echo "$WORK/policy-c-share-r$1.yaml"
  elif [[ $1 == 1 ]]; then echo "$WORK/policy-c.yaml"; else echo "$WORK/policy-c-r$1.yaml"; fi
}
dlt_c() { # round [consumer]
  if [[ ${2:-} == share ]]; then echo "$TOPIC.dlt-share-r$1"
  elif [[ $1 == 1 ]]; then echo "$TOPIC.dlt"; else echo "$TOPIC.dlt-r$1"; fi
}
# b: the same policy, but on a topic nobody reads.
sed -e 's#topics: \["geofence.triggers"\]#topics: ["some.other.topic"]#' \
    -e "s#schema: schemas/#schema: $ROOT/policies/schemas/#" policies/geofence.yaml >"$WORK/policy-b.yaml"

start_antidote() { # name index policyfile|"" -> sets PROXY_PID, PROXY_BOOT, PROXY_ADMIN
  local name=$1 idx=$2 pol=$3
  local boot=$((BASE + 10 + idx)) pbase=$((BASE + 200 + idx * 200))
  PROXY_ADMIN="127.0.0.1:$((BASE + 20 + idx))"
  {
    echo "admin:"; echo "  listen: $PROXY_ADMIN"
    echo "listen:"; echo "  bootstrap: 127.0.0.1:$boot"; echo "  advertised_host: 127.0.0.1"
    echo "  broker_port_base: $pbase"
    echo "upstream:"; echo "  bootstrap_servers:"; echo "    - 127.0.0.1:$BP"
    if [[ -n "$pol" ]]; then echo "policies:"; echo "  - $pol"; else echo "policies: []"; fi
  } >"$WORK/antidote-$name.yaml"
  ANTIDOTE_LOG="${BENCH_RUST_LOG:-warn}" "$BIN" run --config "$WORK/antidote-$name.yaml" >"$WORK/antidote-$name.log" 2>&1 &
  PROXY_PID=$!; PIDS+=("$PROXY_PID")
  wait_port "$boot" 15 "$PROXY_PID"
  PROXY_BOOT="127.0.0.1:$boot"
}
# Sum of the samples of one metric on the proxy's admin endpoint (0 if absent),
# of those whose line contains LABEL if given (e.g. 'api="ShareFetch"').
metric() { # admin name [label]
  "$PY" - "$1" "$2" "${3:-}" <<'PYEOF'
import sys, urllib.request
try:
    text = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode()
except Exception:
    print(0); sys.exit()
print(sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
          if l.startswith(sys.argv[2]) and l[len(sys.argv[2]):len(sys.argv[2]) + 1] in ("{", " ")
          and sys.argv[3] in l))
PYEOF
}
export BENCH_ADMIN_BOOTSTRAP="127.0.0.1:$BP"  # consume-share sets its group's config straight at the broker
KROX_VERSION="$(sed -n 's:.*<kroxylicious.version>\(.*\)</kroxylicious.version>.*:\1:p' scripts/bench/kroxylicious/pom.xml)"
KROX_LIB="$ROOT/.tools/kroxylicious-$KROX_VERSION/lib"
if [[ " $PATHS " == *" k "* && ! -f "$KROX_LIB/kroxylicious-runtime-$KROX_VERSION.jar" ]]; then
  log "fetching Kroxylicious $KROX_VERSION with Maven into $KROX_LIB"
  mvn -B -q -f scripts/bench/kroxylicious/pom.xml dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$KROX_LIB" >&2
fi
start_kroxylicious() {
  PROXY_ADMIN=""
  local port=$((BASE + 6))
  cat >"$WORK/kroxylicious.yaml" <<KEOF
virtualClusters:
  - name: peer
    targetCluster:
      bootstrapServers: 127.0.0.1:$BP
    gateways:
      - name: bench
        portIdentifiesNode:
          bootstrapAddress: 127.0.0.1:$port
KEOF
  java -Xms512m -Xmx512m -XX:+UseG1GC -cp "$KROX_LIB/*" "$ROOT/scripts/bench/kroxylicious/KroxyliciousPeer.java" \
    "$WORK/kroxylicious.yaml" >"$WORK/kroxylicious.log" 2>&1 &
  PROXY_PID=$!; PIDS+=("$PROXY_PID")
  wait_port "$port" 60 "$PROXY_PID"
  PROXY_BOOT="127.0.0.1:$port"
}
start_tansu_proxy() {
  PROXY_ADMIN=""
  local port=$((BASE + 5))
  "$TANSU" proxy --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
    --origin-url "tcp://127.0.0.1:$BP" >"$WORK/tansu-proxy.log" 2>&1 &
  PROXY_PID=$!; PIDS+=("$PROXY_PID")
  wait_port "$port" 15 "$PROXY_PID"
  PROXY_BOOT="127.0.0.1:$port"
}

# --- produce once -------------------------------------------------------------
log "producing $N records (poison 1/$POISON_EVERY) to $TOPIC"
prod="$("$PY" "$HELPER" produce "127.0.0.1:$BP" "$TOPIC" "$N" "$POISON_EVERY")"
log "produced: $prod"
record "{\"phase\":\"produce\",\"result\":$prod}"
POISON="$(echo "$prod" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["poison"])')"
CLEAN=$((N - POISON))

consume() { # path bootstrap expected group [ck|perf]
  local t0 r
  if [[ ${5:-ck} == perf ]]; then
    r="$("$PY" "$HELPER" consume-perf "$2" "$TOPIC" "$3" "$4")"
  elif [[ ${5:-ck} == share ]]; then
    r="$("$PY" "$HELPER" consume-share "$2" "$TOPIC" "$3" "$4")"
  else
    r="$("$PY" "$HELPER" consume "$2" "$TOPIC" 3 "$3" "$4")"
  fi || { log "consume via $1 FAILED: $r"; record "{\"phase\":\"consume\",\"path\":\"$1\",\"failed\":true,\"result\":${r:-null}}"; return 1; }
  echo "$r"
}

run_path() { # path round consumer
  local path=$1 round=$2 kind=${3:-ck} boot pid="" cpu0=0 cpu1 r lat expected=$N path_failed=0
  local label=$path
  [[ $kind == ck ]] || label="$path.$kind"
  PROXY_ADMIN=""
  case $path in
    a) boot="127.0.0.1:$BP"; pid=$BROKER_PID ;;
    b0) start_antidote b0 0 ""; boot=$PROXY_BOOT; pid=$PROXY_PID ;;
    b) start_antidote b 1 "$WORK/policy-b.yaml"; boot=$PROXY_BOOT; pid=$PROXY_PID ;;
    c) start_antidote c 2 "$(policy_c "$round" "$kind")"; boot=$PROXY_BOOT; pid=$PROXY_PID; expected=$CLEAN ;;
    c3) start_antidote c3 3 "$WORK/policy-c.yaml"; boot=$PROXY_BOOT; pid=$PROXY_PID; expected=$CLEAN ;;
    d) start_tansu_proxy; boot=$PROXY_BOOT; pid=$PROXY_PID ;;
    k) start_kroxylicious; boot=$PROXY_BOOT; pid=$PROXY_PID ;;
  esac
  local bcpu0; bcpu0="$(cpu_s "$BROKER_PID")"
  cpu0="$(cpu_s "$pid")"
  # Counters read before and after the read, from the proxy's /metrics.
  local counters=(antidote_fetch_rewrite_cpu_seconds_total antidote_records_evaluated_total
    antidote_fetch_rewrite_duration_seconds_sum antidote_fetch_rewrite_duration_seconds_count
    antidote_dlt_write_duration_seconds_sum antidote_dlt_write_duration_seconds_count
    'antidote_client_requests_total api="Fetch"' 'antidote_client_requests_total api="ShareFetch"'
    'antidote_client_requests_total api="ShareAcknowledge"')
  local -A m0=() m1=()
  local k
  for k in "${counters[@]}"; do m0[$k]=0; m1[$k]=0; done
  if [[ -n $PROXY_ADMIN ]]; then
    for k in "${counters[@]}"; do m0[$k]="$(metric "$PROXY_ADMIN" $k)"; done
  fi
  log "path $label (round $round): consuming via $boot (expect $expected)"
  if [[ $path == c3 && $kind != ck ]]; then
    stop "$pid"; return 0  # three groups at once: the librdkafka consumer only
  elif [[ $path == c3 ]]; then
    local f
    for g in 1 2 3; do
      "$PY" "$HELPER" consume "$boot" "$TOPIC" 3 "$expected" "bench-$path-r$round-g$g" >"$WORK/c3-$g.json" &
      f+=" $!"
    done
    local ok=1
    for p in $f; do wait "$p" || ok=0; done
    r="[$(cat "$WORK"/c3-{1,2,3}.json | paste -sd,)]"
    # A failed group read fails the bench (after its figures are recorded).
    [[ $ok == 1 ]] || { log "c3: a consumer did not get all records: $r"; path_failed=1; }
  else
    r="$(consume "$label" "$boot" "$expected" "bench-$label-r$round" "$kind")" || {
      stop "$pid"
      # tansu's proxy cannot relay Kafka 4.x: recorded (consume), not a failure of the run.
      [[ $path == d && $BROKER == kafka ]] && return 0
      return 1
    }
  fi
  cpu1="$(cpu_s "$pid")"
  local bcpu1; bcpu1="$(cpu_s "$BROKER_PID")"
  if [[ -n $PROXY_ADMIN ]]; then
    for k in "${counters[@]}"; do m1[$k]="$(metric "$PROXY_ADMIN" $k)"; done
  fi
  delta() { awk -v a="${m0[$1]}" -v b="${m1[$1]}" -v f="$2" 'BEGIN { printf f, b - a }'; }
  local rewrite_cpu evaluated rewrites rewrite_wall dlt_writes dlt_wall
  rewrite_cpu="$(delta antidote_fetch_rewrite_cpu_seconds_total %.3f)"
  evaluated="$(delta antidote_records_evaluated_total %d)"
  rewrites="$(delta antidote_fetch_rewrite_duration_seconds_count %d)"
  rewrite_wall="$(delta antidote_fetch_rewrite_duration_seconds_sum %.3f)"
  dlt_writes="$(delta antidote_dlt_write_duration_seconds_count %d)"
  dlt_wall="$(delta antidote_dlt_write_duration_seconds_sum %.3f)"
  local fetches share_fetches share_acks
  fetches="$(delta 'antidote_client_requests_total api="Fetch"' %d)"
  share_fetches="$(delta 'antidote_client_requests_total api="ShareFetch"' %d)"
  share_acks="$(delta 'antidote_client_requests_total api="ShareAcknowledge"' %d)"
  local proxy_cpu broker_cpu
  proxy_cpu="$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.2f", b - a }')"
  broker_cpu="$(awk -v a="$bcpu0" -v b="$bcpu1" 'BEGIN { printf "%.2f", b - a }')"
  log "path $label: $r proxy_cpu=$proxy_cpu broker_cpu=$broker_cpu rewrite_cpu=$rewrite_cpu evaluated=$evaluated"
  lat=null
  if [[ $path != c3 && $kind == ck && $round == 1 && "${LAT_SECS}" != 0 ]]; then
    log "path $path: latency at $LAT_RATE msg/s for $LAT_SECS s"
    lat="$("$PY" "$HELPER" latency "$boot" "127.0.0.1:$BP" "latency.$path" 3 "$LAT_RATE" "$LAT_SECS")" || log "latency via $path incomplete: $lat"
    log "path $path: latency $lat"
  fi
  local hwm=null total_cpu=null
  if [[ $path != a ]]; then hwm="$(hwm_kb "$pid")"; total_cpu="$(cpu_s "$pid")"; fi
  record "{\"phase\":\"path\",\"path\":\"$label\",\"consumer\":\"$kind\",\"round\":$round,\"consume\":$r,\"proxy_cpu_s\":$proxy_cpu,\"rewrite_cpu_s\":$rewrite_cpu,\"records_evaluated\":$evaluated,\"rewrites\":$rewrites,\"rewrite_wall_s\":$rewrite_wall,\"dlt_writes\":$dlt_writes,\"dlt_write_wall_s\":$dlt_wall,\"fetch_requests\":$fetches,\"share_fetch_requests\":$share_fetches,\"share_ack_requests\":$share_acks,\"broker_cpu_s\":$broker_cpu,\"latency\":${lat:-null},\"proxy_vmhwm_kb\":$hwm,\"proxy_total_cpu_s\":$total_cpu}"
  if [[ $path != a ]]; then stop "$pid"; fi
  return "$path_failed"
}

# A warm-up read (not reported): tansu's first read of fresh data is slower.
consume warmup "127.0.0.1:$BP" "$N" bench-warmup >/dev/null || true
# Direct first, then the proxies, then direct again (drift check).
fail=0
for round in $(seq 1 "$ROUNDS"); do
  for k in $CONSUMERS; do
    for p in $PATHS; do run_path "$p" "$round" "$k" || fail=1; done
  done
done
if [[ " $PATHS " == *" a "* ]]; then
  log "path a (again, drift check)"
  r="$(consume a2 "127.0.0.1:$BP" "$N" bench-a2)" && record "{\"phase\":\"path\",\"path\":\"a2\",\"consume\":$r}" || fail=1
fi
# The poison must be in the dead-letter topic, once each.
if [[ " $PATHS " == *" c "* ]]; then
  for kind in ck share; do  # ck and perf share their DLTs, share has its own
    if [[ $kind == ck ]]; then [[ " $CONSUMERS " == *" ck "* || " $CONSUMERS " == *" perf "* ]] || continue
    else [[ " $CONSUMERS " == *" share "* ]] || continue; fi
    for round in $(seq 1 "$ROUNDS"); do
      # Read 3 s past the expected count: a duplicate makes the count too high.
      r="$("$PY" "$HELPER" consume "127.0.0.1:$BP" "$(dlt_c "$round" "$kind")" 1 "$POISON" "bench-dlt-$kind-r$round" 5 300 3)" || { log "DLT check failed: $r"; fail=1; }
      record "{\"phase\":\"dlt\",\"round\":$round,\"consumer\":\"$kind\",\"result\":${r:-null}}"
    done
  done
fi

machine="{\"nproc\":$(nproc),\"cpu\":\"$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)\",\"mem_kb\":$(awk '/MemTotal/ { print $2 }' /proc/meminfo),\"loadavg\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"commit\":\"${BENCH_COMMIT:-$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml || echo -dirty)}\",\"broker\":\"$BROKER_NAME\",\"records\":$N,\"rounds\":$ROUNDS,\"poison_every\":$POISON_EVERY,\"compression\":\"${BENCH_COMPRESSION:-none}\"}"
record "{\"phase\":\"machine\",\"result\":$machine}"
"$PY" "$ROOT/scripts/bench/report.py" "$RESULTS" | tee "${OUT%.json}.txt"
cp "$RESULTS" "$OUT"
log "results: $OUT"
exit $fail
