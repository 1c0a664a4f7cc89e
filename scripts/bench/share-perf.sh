#!/usr/bin/env bash
# Share path against Fetch path (issue 54, "Measured"): proxy CPU per record
# when Kafka's own ShareConsumerPerformance (a share group, ShareFetch) reads
# what Kafka's own ConsumerPerformance (a consumer group, Fetch) reads, on
# one Apache Kafka 4.4.0 broker (scripts/bench/kafka_broker.py, share groups
# on by default in 4.4). scripts/bench-e2e.sh does the work: it produces
# BENCH_RECORDS (1,000,000) geofence JSON records once (1 in 1,000 poison, 3
# partitions), then in each of BENCH_ROUNDS (5) rounds reads them all with
# ConsumerPerformance and then ShareConsumerPerformance, each on the paths
#   a   straight from the broker (the ratio's base),
#   b0  through antidote without policies,
#   c   through antidote with the reference policy (policies/geofence.yaml;
#       poison diverted, to DLTs of its own per round and consumer kind),
# a fresh proxy per read; proxy CPU is utime+stime of its process from
# /proc/<pid>/stat around the read. Records per response are held equal:
# both consumers read at most BENCH_FETCH_MAX_BYTES (1 MiB) per response
# (ConsumerPerformance: fetch.max.bytes and --fetch-size; the share consumer:
# --fetch-size, its ShareFetch MaxBytes) and poll BENCH_MAX_POLL_RECORDS
# (5,000; ShareFetch's MaxRecords and BatchSize); the report shows the
# records per Fetch and per ShareFetch request the proxy relayed, and the
# medians of each path, share ns/record over Fetch ns/record (goal: <= 1.2).
#
#   CARGO_TARGET_DIR=/tmp/bench-target cargo build --release --locked --bin antidote
#   BENCH_BIN=/tmp/bench-target/release/antidote scripts/bench/share-perf.sh
#
# Any bench-e2e.sh variable may be set (BENCH_ROUNDS, BENCH_RECORDS,
# BENCH_PATHS, BENCH_OUT, BENCH_COMMIT: the commit BENCH_BIN was built from).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export BENCH_BROKER=kafka
export BENCH_CONSUMERS="${BENCH_CONSUMERS:-perf share}"
export BENCH_PATHS="${BENCH_PATHS:-a b0 c}"
export BENCH_ROUNDS="${BENCH_ROUNDS:-5}"
export BENCH_RECORDS="${BENCH_RECORDS:-1000000}"
export BENCH_LAT_SECONDS=0
export BENCH_FETCH_MAX_BYTES="${BENCH_FETCH_MAX_BYTES:-1048576}"
export BENCH_MAX_POLL_RECORDS="${BENCH_MAX_POLL_RECORDS:-5000}"
export BENCH_SKIP_BUILD="${BENCH_SKIP_BUILD:-1}"
export BENCH_OUT="${BENCH_OUT:-$ROOT/target/bench-share/share-perf-$(date +%Y%m%d-%H%M%S).json}"
exec "$ROOT/scripts/bench-e2e.sh"
