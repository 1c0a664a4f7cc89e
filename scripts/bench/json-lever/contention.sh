#!/usr/bin/env bash
# The judge case of jsonlever pinned to CPU 0, with CPU 1 idle, running a busy
# loop, or streaming memory: how much the machine itself moves a time per record.
BIN=${BIN:-/work/lever-target/release/jsonlever}
run() { ONLY="antidote judge" LOOPS=200 REPS=3 taskset -c 0 "$BIN" | grep "antidote judge" | sed "s/^/$1: /"; }
for round in 1 2 3; do
  run "idle      "
  taskset -c 1 bash -c 'while :; do :; done' & P=$!
  sleep 0.5; run "ALU spin  "; kill $P; wait $P 2>/dev/null
  taskset -c 1 dd if=/dev/zero of=/dev/null bs=4M count=100000000 2>/dev/null & P=$!
  sleep 0.5; run "mem stream"; kill $P; wait $P 2>/dev/null
done
