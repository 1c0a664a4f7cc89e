#!/usr/bin/env bash
# Run it for real, on a fresh machine: start a local tansu broker, start
# antidote in front of it with the reference geofence policy, produce valid
# and poison records straight to the broker, consume them through antidote,
# and show what reached the consumer and what reached the dead-letter topic.
#
#   scripts/demo.sh
#
# Everything listens on 127.0.0.1 and is stopped when the script ends.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/setup.sh
cargo build --bin antidote

WORK="$(mktemp -d)"
BROKER_PORT="${BROKER_PORT:-39192}"
PROXY_PORT="${PROXY_PORT:-39292}"
PORT_BASE="${PORT_BASE:-39300}"
cleanup() {
  [[ -n "${PROXY_PID:-}" ]] && kill -TERM "$PROXY_PID" 2>/dev/null && wait "$PROXY_PID" 2>/dev/null || true
  [[ -n "${BROKER_PID:-}" ]] && kill "$BROKER_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== starting tansu on 127.0.0.1:$BROKER_PORT"
.tools/bin/tansu broker --listener-url "tcp://127.0.0.1:$BROKER_PORT" \
  --advertised-listener-url "tcp://127.0.0.1:$BROKER_PORT" \
  --storage-engine memory://tansu/ >"$WORK/tansu.log" 2>&1 &
BROKER_PID=$!

cat >"$WORK/antidote.yaml" <<YAML
listen:
  bootstrap: 127.0.0.1:$PROXY_PORT
  broker_port_base: $PORT_BASE
upstream:
  bootstrap_servers: [127.0.0.1:$BROKER_PORT]
policies: [$ROOT/policies/geofence.yaml]
YAML
echo "== starting antidote on 127.0.0.1:$PROXY_PORT (broker 111 at $((PORT_BASE + 111)))"
target/debug/antidote run --config "$WORK/antidote.yaml" 2>"$WORK/antidote.log" &
PROXY_PID=$!
sleep 1

.venv/bin/python scripts/demo_client.py "127.0.0.1:$BROKER_PORT" "127.0.0.1:$PROXY_PORT"
echo
echo "== antidote's log of diversions"
grep -E "record diverted" "$WORK/antidote.log" | sed 's/\x1b\[[0-9;]*m//g' || true
