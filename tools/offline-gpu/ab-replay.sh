#!/bin/sh
# ab-replay.sh BASE_BUILD NEW_BUILD OUT_DIR [TRACE...] - two builds of
# magpool-replay compared on the same traces, in alternation: each round
# runs every trace x mode on BASE then on NEW, one process each, so that
# both builds of a round meet the machine in the same state.  On the lent
# GPU machine (a 16-vCPU KVM guest) whole minutes run fast or slow for
# every process alike (docs/benchmarks.md, 2026-12-02, run 46): compare
# the builds round by round, not their overall means.
#
#   ROUNDS=N     rounds (default 6)
#   PIN_CPU=N    every replay on CPU N only (taskset; default: unpinned)
#   KIND=K       --kind (default device)
#   MODES="..."  modes (default "sync async")
#   PASSES=N     --passes (default 4); pass 1 (cold) is left out below
#
# TRACE default: tests/data/traces/*.trace.gz.  Writes OUT_DIR/ab.log
# (every REPLAY line, prefixed "BUILD ROUND") and prints, per trace x
# mode, each round's mean ns per event of the warm passes for BASE and
# NEW, then how many rounds NEW was faster in, and each build's
# footprints (ratio) seen.
set -u
[ $# -ge 3 ] || { sed -n '2,22p' "$0"; exit 2; }
BASE=$1 NEW=$2 OUT=$3
shift 3
[ $# -gt 0 ] || set -- "$(dirname "$0")"/../../tests/data/traces/*.trace.gz
P=${PIN_CPU:+taskset -c $PIN_CPU}
mkdir -p "$OUT"
r=1
while [ "$r" -le "${ROUNDS:-6}" ]; do
  for t in "$@"; do
    for m in ${MODES:-sync async}; do
      for b in base new; do
        d=$BASE
        [ "$b" = new ] && d=$NEW
        timeout 300 $P "$d/bench/magpool-replay" "$t" --kind "${KIND:-device}" --mode "$m" \
          --passes "${PASSES:-4}" 2>&1 | grep '^REPLAY' | sed "s/^/$b $r /"
      done
    done
  done
  r=$((r + 1))
done >"$OUT/ab.log"
# "base 1 REPLAY trace=T allocator=A mode=M pass=P ... ratio=R ns_per_event=N result=X"
awk '{
  for (i = 4; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
  if (v["pass"] == 1 || v["result"] != "completed") next
  k = v["trace"] " " v["mode"]; s[k, $2, $1] += v["ns_per_event"]; n[k, $2, $1]++
  keys[k] = 1; if ($2 > R) R = $2
  if (index(fp[k, $1], v["ratio"]) == 0) fp[k, $1] = fp[k, $1] " " v["ratio"]
}
END {
  for (k in keys) {
    line = ""; won = 0; both = 0
    for (r = 1; r <= R; r++) {
      if (n[k, r, "base"] == 0 || n[k, r, "new"] == 0) continue
      a = s[k, r, "base"] / n[k, r, "base"]; b = s[k, r, "new"] / n[k, r, "new"]
      line = line sprintf(" %.1f/%.1f", a, b); both++; won += b < a
    }
    printf "AB %s rounds=%d new_faster=%d ns(base/new):%s ratio_base:%s ratio_new:%s\n",
           k, both, won, line, fp[k, "base"], fp[k, "new"]
  }
}' "$OUT/ab.log" | sort
