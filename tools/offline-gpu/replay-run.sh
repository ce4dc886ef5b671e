#!/bin/sh
# replay-run.sh BUILD_DIR OUT_DIR - the footprint and speed runs of
# docs/benchmarks.md on a GPU machine: every shared trace replayed on
# magpool and its peers, sync and async, then magpool capped at
# cudaMalloc's footprint + 2 %.  Needs a build with CUDA
# (tools/offline-gpu/device-run.sh makes one).  TRACE_DIR: the traces to
# replay (default tests/data/traces; record-workloads.py records more).
# Each trace x allocator x mode runs in a process of its own, as a
# program would start: in one process (--allocator all), after the other
# allocators had run, magpool's cold passes read up to 1.8x slower
# (docs/benchmarks.md, 2026-12-02).  ROUNDS=N (default 1) runs each N
# times, the allocators in turn.  PIN_CPU=N: every replay, each
# allocator's alike, runs on CPU N only (taskset): on a many-CPU virtual
# machine a process that migrates between CPUs runs allocator code up to
# 1.6x slower.
set -u
B=${1:-build-dev}
OUT=${2:-out}
T=${TRACE_DIR:-$(dirname "$0")/../../tests/data/traces}
R=$B/bench/magpool-replay
P=${PIN_CPU:+taskset -c $PIN_CPU}
mkdir -p "$OUT"
round=1
while [ "$round" -le "${ROUNDS:-1}" ]; do
  for t in "$T"/*.trace.gz; do
    for m in sync async; do
      for a in magpool cudaMallocAsync cudaMalloc cub; do
        timeout 240 $P "$R" "$t" --kind device --mode "$m" --allocator "$a" --stats
      done
    done
  done
  round=$((round + 1))
done >"$OUT/replay.log" 2>&1
# The cap runs: cudaMalloc's peak reserved (sync, pass 1) + 2 %, per trace
# (%.0f: some awks print %d of a number past 2^31 as 2147483647).
grep '^REPLAY' "$OUT/replay.log" | grep 'allocator=cudaMalloc mode=sync pass=1 ' |
  grep 'result=completed' | sort -u -t' ' -k2,2 |
  sed 's/.*trace=\([^ ]*\).*peak_reserved=\([0-9]*\).*/\1 \2/' |
  while read -r name peak; do
    cap=$(awk -v p="$peak" 'BEGIN { printf "%.0f", p * 1.02 }')
    for m in sync async; do
      timeout 120 $P "$R" "$T/$name.trace.gz" --kind device --mode "$m" --cap "$cap"
    done
  done >"$OUT/replay-cap.log" 2>&1
grep -hE "^(REPLAY|STATS)" "$OUT/replay.log" "$OUT/replay-cap.log"
