#!/bin/sh
# tests/replay/replay_test.sh - ctest driver for magpool-replay.
#
#   replay_test.sh smoke     REPLAY_BIN TRACE_DIR
#   replay_test.sh footprint REPLAY_BIN TRACE_DIR
#   replay_test.sh cap       REPLAY_BIN TRACE_DIR
#   replay_test.sh first     REPLAY_BIN TRACE_DIR
#   replay_test.sh threads   REPLAY_BIN TRACE_DIR
#
# smoke: tiny.trace (50 events, 2 streams, written by hand) on a HOST pool,
#   sync and async, 2 passes: every REPLAY line matches the output
#   contract, every pass completes with peak_live = 537813 (the peak worked
#   out by hand in the trace's comments) and peak_reserved >= peak_live;
#   the same trace gzipped gives the same peak_live; a cap below the peak
#   ends each pass with oom@K at or before event 12 (the 256 KiB request
#   that cannot fit beside what is live); with --stats, one STATS line per
#   pass in its format, and the default 64 MiB pool, which holds the trace,
#   neither grows nor maps a chunk; with --lag 5 (streams held behind the
#   replay) every pass still completes with the same peak_live, and --lag
#   with sync mode is refused (exit 2); on a GPU, --lag 5 on CUDA streams
#   (gate kernels) completes for magpool, cudaMallocAsync and cub with
#   that peak_live (skipped with no GPU); with --evict 64K
#   (each call timed alone) every pass completes with that peak_live and
#   a time above 0; a bad argument (--evict 3X or over 16G included) exits
#   2.
# footprint: the recorded traces on a HOST pool, sync and async, 2
#   passes: every pass completes and its ratio is within the trace's
#   bound (gpt2_train_small 1.10, resnet50_train 1.05,
#   multistream_serve 1.03; gpt2_parity_magpool 1.042, what PyTorch's own
#   allocator reserved for that run on the GPU).
# cap: gpt2_generate on a HOST pool, sync and async, 2 passes, with
#   --cap at what cudaMalloc reserved for it on the H200 + 2 %: every pass
#   completes (a capped pool maps a chunk each, so that every empty chunk
#   can move: docs/design.md); moe_train_varlen, recorded after magpool
#   was tuned, the same at its cap (5,960,105,984 B on the H200 + 2 %), and
#   t5_beam_generate at its (597,688,320 B + 2 %: a capped pool packs its
#   tree blocks into the fullest chunks, region.c), and vit_train_varbatch
#   at its (2,317,352,960 B + 2 %: a capped pool's blocks of 8 KiB-2 MiB
#   are extent blocks, src/extent.c), bert_varlen_train,
#   llama_train_varlen and gpt2_serve_threads (5 streams), recorded after
#   all of that, at theirs (8,613,003,264 B, 9,493,807,104 B and
#   6,830,424,064 B on the H200, + 2 %), and a generated trace of 4,000 live
#   136 KiB blocks at its (559,939,584 B + 2 %: 4 KiB granules, where the
#   blocks' power of two would take 1.88 times their bytes).
# first: with MAGPOOL_CONF=chunk_groups=0,thread_cache_bytes=0,
#   stream_cache_bytes=0 (footprint first, README), every recorded trace
#   on a HOST pool, sync and async, 2 passes: every pass completes within
#   the footprint bound above (the shared traces, gpt2_parity_magpool) or
#   within what cudaMalloc reserved for it on the H200 + 2 % (the others:
#   the caps of `cap`).
# threads: --threads (a thread per trace stream) on a HOST pool, sync and
#   async, 2 passes: with --window 0 (the trace's order, one event at a
#   time) every pass of tiny.trace completes with peak_live = 537813, and
#   every pass of multistream_serve (5 streams, frees waiting for their
#   allocations on other threads) completes with the single-threaded
#   replay's peak_live and a ratio within 1.05 (its single-threaded bound
#   is asserted by `footprint`; threads change the caches' traffic); with
#   the default window every pass of tiny.trace completes; a cap below its
#   peak ends each pass with oom@K at or before event 12; --window without
#   --threads, and --threads with --lag, --csv or --evict, exit 2; on a GPU, every
#   allocator completes tiny.trace with threads, sync and async
#   (cudaMalloc: sync only), with peak_reserved >= peak_live.
# Nothing here asserts a timing.
set -u
mode=$1 bin=$2 dir=$3
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}

re='^REPLAY trace=[^ ]+ allocator=(magpool|cudaMallocAsync|cudaMalloc|cub) mode=(sync|async) pass=[0-9]+ peak_live=[0-9]+ peak_reserved=[0-9]+ ratio=[0-9]+\.[0-9]{3} ns_per_event=[0-9]+\.[0-9] result=(completed|oom@[0-9]+)$'

# run ARGS...: runs the replay, echoes its output, leaves it in $out.
run() {
  out=$("$bin" "$@" 2>&1)
  rc=$?
  printf '%s\n' "$out"
  [ "$rc" -eq 0 ] || fail "exit status $rc: $*"
}

# check_lines EXPECTED_COUNT: the REPLAY lines of $out all match the
# contract, and there are EXPECTED_COUNT of them.
check_lines() {
  n=$(printf '%s\n' "$out" | grep -c '^REPLAY ')
  [ "$n" -eq "$1" ] || fail "$n REPLAY lines, expected $1"
  bad=$(printf '%s\n' "$out" | grep '^REPLAY ' | grep -Evc "$re")
  [ "$bad" -eq 0 ] || fail "$bad REPLAY lines do not match the contract"
  printf '%s\n' "$out" | grep -q '^SUMMARY trace=' || fail "no SUMMARY line"
}

field() { # field NAME LINE
  printf '%s\n' "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"
}

case $mode in
smoke)
  tmp=$(mktemp -d) || exit 1
  trap 'rm -rf "$tmp"' EXIT
  gzip -c "$dir/tiny.trace" > "$tmp/tinygz.trace.gz"
  for m in sync async; do
    for t in "$dir/tiny.trace" "$tmp/tinygz.trace.gz"; do
      run "$t" --kind host --mode "$m" --passes 2
      check_lines 2
      printf '%s\n' "$out" | grep '^REPLAY ' | while read -r line; do
        [ "$(field result "$line")" = completed ] || echo "FAIL: not completed: $line"
        [ "$(field peak_live "$line")" = 537813 ] || echo "FAIL: peak_live: $line"
        [ "$(field peak_reserved "$line")" -ge 537813 ] || echo "FAIL: peak_reserved: $line"
      done | grep FAIL && fail "tiny, $m"
    done
    printf '%s\n' "$out" | grep -q '^REPLAY trace=tinygz ' || fail "trace name of a .trace.gz"
    run "$dir/tiny.trace" --kind host --mode "$m" --pool-size 64K --cap 256K
    check_lines 2
    for k in $(printf '%s\n' "$out" | sed -n 's/^REPLAY .* result=oom@\([0-9]*\)$/\1/p'); do
      [ "$k" -le 12 ] || fail "oom at event $k, after event 12"
    done
    [ "$(printf '%s\n' "$out" | grep -c '^REPLAY .* result=oom@')" -eq 2 ] || fail "cap: no oom in a pass"
  done
  sre='^STATS trace=tiny allocator=magpool mode=(sync|async) pass=[12] grows=[0-9]+ chunk_maps=[0-9]+ chunk_unmaps=[0-9]+ chunk_moves=[0-9]+ stream_batches=[0-9]+ pending_at_peak=[0-9]+$'
  for m in sync async; do
    run "$dir/tiny.trace" --kind host --mode "$m" --stats
    check_lines 2
    [ "$(printf '%s\n' "$out" | grep -Ec "$sre")" -eq 2 ] || fail "--stats: not 2 STATS lines, $m"
    printf '%s\n' "$out" | grep '^STATS ' | while read -r line; do
      [ "$(field grows "$line")" = 0 ] && [ "$(field chunk_maps "$line")" = 0 ] ||
        echo "FAIL: a 64 MiB pool grew or mapped for tiny: $line"
    done | grep FAIL && fail "--stats, $m"
  done
  run "$dir/tiny.trace" --kind host --mode async --lag 5
  check_lines 2
  printf '%s\n' "$out" | grep '^REPLAY ' | while read -r line; do
    [ "$(field result "$line")" = completed ] && [ "$(field peak_live "$line")" = 537813 ] ||
      echo "FAIL: --lag: $line"
  done | grep FAIL && fail "--lag"
  for bad in "--mode sync --kind host" "--mode sync --kind device" "--mode async --kind host --lag 0"; do
    # shellcheck disable=SC2086
    "$bin" "$dir/tiny.trace" --lag 5 $bad > /dev/null 2>&1
    [ $? -eq 2 ] || fail "--lag 5 $bad does not exit 2"
  done
  if "$bin" "$dir/tiny.trace" --kind device --allocator cudaMallocAsync --passes 1 2> /dev/null |
    grep -q '^REPLAY .* result=completed$'; then
    run "$dir/tiny.trace" --kind device --mode async --allocator all --lag 5
    # 2 passes each of magpool, cudaMallocAsync and cub (cudaMalloc: sync
    # only, its lines say skipped)
    [ "$(printf '%s\n' "$out" | grep -E "$re" | grep -c ' result=completed$')" -eq 6 ] ||
      fail "--lag on CUDA streams: not 6 completed passes"
    printf '%s\n' "$out" | grep '^REPLAY .* result=completed$' | while read -r line; do
      [ "$(field peak_live "$line")" = 537813 ] || echo "FAIL: --lag on CUDA streams: $line"
    done | grep FAIL && fail "--lag on CUDA streams"
  else
    echo "--lag on CUDA streams: no GPU, skipped"
  fi
  for m in sync async; do
    run "$dir/tiny.trace" --kind host --mode "$m" --evict 64K
    check_lines 2
    printf '%s\n' "$out" | grep '^REPLAY ' | while read -r line; do
      [ "$(field result "$line")" = completed ] && [ "$(field peak_live "$line")" = 537813 ] &&
        [ "$(field ns_per_event "$line")" != 0.0 ] || echo "FAIL: --evict: $line"
    done | grep FAIL && fail "--evict, $m"
  done
  for bad in 3X 32G; do
    "$bin" "$dir/tiny.trace" --evict $bad > /dev/null 2>&1
    [ $? -eq 2 ] || fail "--evict $bad does not exit 2"
  done
  "$bin" "$dir/tiny.trace" --kind nowhere > /dev/null 2>&1
  [ $? -eq 2 ] || fail "a bad --kind does not exit 2"
  "$bin" "$dir/tiny.trace" --pool-size 3X > /dev/null 2>&1
  [ $? -eq 2 ] || fail "a bad size does not exit 2"
  ;;
footprint)
  # The same bounds for both APIs.  Asynchronously the pool never waits
  # for another stream at a new peak; it retires the streams' parks, and
  # a retire on a host stream that has run all its work is passed at
  # once (docs/design.md, the park), so no callback timing is involved
  # but the streams' being idle, which host streams with no work are
  # but for a moment after each retire callback.
  for m in sync async; do
    for spec in gpt2_train_small:1.10 resnet50_train:1.05 multistream_serve:1.03 \
      gpt2_parity_magpool:1.042; do
      name=${spec%%:*} bound=${spec#*:}
      run "$dir/$name.trace.gz" --kind host --mode "$m" --passes 2
      check_lines 2
      printf '%s\n' "$out" | grep '^REPLAY ' | while read -r line; do
        [ "$(field result "$line")" = completed ] || echo "FAIL: not completed: $line"
        awk -v r="$(field ratio "$line")" -v b="$bound" 'BEGIN { exit !(r <= b) }' ||
          echo "FAIL: ratio above $bound: $line"
      done | grep FAIL && fail "$name, $m"
    done
  done
  ;;
cap)
  # capped NAME CAP MODE: both passes of NAME complete within CAP bytes.
  capped() {
    f="$dir/$1.trace.gz"
    [ -e "$f" ] || f="$1"
    run "$f" --kind host --mode "$3" --passes 2 --cap "$2"
    check_lines 2
    printf '%s\n' "$out" | grep '^REPLAY ' | while read -r line; do
      [ "$(field result "$line")" = completed ] || echo "FAIL: not completed: $line"
      [ "$(field peak_reserved "$line")" -le "$2" ] || echo "FAIL: over the cap: $line"
    done | grep FAIL && fail "$1 under the cap, $3"
  }
  # 4,000 live blocks of 136 KiB, then their frees (generated here):
  # cudaMalloc reserved 559,939,584 B for them on the H200 (run 129).
  tmp=$(mktemp -d)
  awk 'BEGIN { print "# 4,000 live blocks of 136 KiB"
               for (i = 0; i < 4000; i++) print "a " i " 139264 0"
               for (i = 0; i < 4000; i++) print "f " i " 0" }' > "$tmp/mid136.trace"
  for m in sync async; do
    capped gpt2_generate 827829780 "$m"
    capped moe_train_varlen 6079308104 "$m"
    capped t5_beam_generate 609642086 "$m"
    capped vit_train_varbatch 2363700019 "$m"
    capped bert_varlen_train 8785263329 "$m"
    capped llama_train_varlen 9683683246 "$m"
    capped gpt2_serve_threads 6967032545 "$m"
    capped "$tmp/mid136.trace" 571138375 "$m"
  done
  rm -rf "$tmp"
  ;;
first)
  # Footprint first (README): every recorded trace within its bound.
  export MAGPOOL_CONF=chunk_groups=0,thread_cache_bytes=0,stream_cache_bytes=0
  for m in sync async; do
    for spec in gpt2_train_small:r1.10 resnet50_train:r1.05 multistream_serve:r1.03 \
      gpt2_parity_magpool:r1.042 gpt2_generate:b827829780 t5_beam_generate:b609642086 \
      vit_train_varbatch:b2363700019 moe_train_varlen:b6079308104 \
      bert_varlen_train:b8785263329 llama_train_varlen:b9683683246 \
      gpt2_serve_threads:b6967032545; do
      name=${spec%%:*} bound=${spec#*:}
      run "$dir/$name.trace.gz" --kind host --mode "$m" --passes 2
      check_lines 2
      printf '%s\n' "$out" | grep '^REPLAY ' | while read -r line; do
        [ "$(field result "$line")" = completed ] || echo "FAIL: not completed: $line"
        case $bound in
        r*) awk -v r="$(field ratio "$line")" -v b="${bound#r}" 'BEGIN { exit !(r <= b) }' ||
              echo "FAIL: ratio above ${bound#r}: $line" ;;
        b*) [ "$(field peak_reserved "$line")" -le "${bound#b}" ] ||
              echo "FAIL: over ${bound#b} B: $line" ;;
        esac
      done | grep FAIL && fail "$name, footprint first, $m"
    done
  done
  unset MAGPOOL_CONF
  ;;
threads)
  for m in sync async; do
    run "$dir/tiny.trace" --kind host --mode "$m" --threads --window 0 --passes 2
    check_lines 2
    printf '%s\n' "$out" | grep '^REPLAY ' | while read -r line; do
      [ "$(field result "$line")" = completed ] && [ "$(field peak_live "$line")" = 537813 ] &&
        [ "$(field peak_reserved "$line")" -ge 537813 ] || echo "FAIL: --window 0: $line"
    done | grep FAIL && fail "tiny, --threads --window 0, $m"
    run "$dir/multistream_serve.trace.gz" --kind host --mode "$m" --threads --window 0 --passes 2
    check_lines 2
    printf '%s\n' "$out" | grep '^REPLAY ' | while read -r line; do
      [ "$(field result "$line")" = completed ] &&
        [ "$(field peak_live "$line")" = 2545957295 ] &&
        awk -v r="$(field ratio "$line")" 'BEGIN { exit !(r <= 1.05) }' ||
        echo "FAIL: multistream_serve, --threads: $line"
    done | grep FAIL && fail "multistream_serve, --threads --window 0, $m"
    run "$dir/tiny.trace" --kind host --mode "$m" --threads --passes 2
    check_lines 2
    printf '%s\n' "$out" | grep '^REPLAY ' | while read -r line; do
      [ "$(field result "$line")" = completed ] && [ "$(field peak_live "$line")" -gt 0 ] ||
        echo "FAIL: --threads: $line"
    done | grep FAIL && fail "tiny, --threads, $m"
    run "$dir/tiny.trace" --kind host --mode "$m" --threads --pool-size 64K --cap 256K
    check_lines 2
    for k in $(printf '%s\n' "$out" | sed -n 's/^REPLAY .* result=oom@\([0-9]*\)$/\1/p'); do
      [ "$k" -le 12 ] || fail "--threads: oom at event $k, after event 12"
    done
    [ "$(printf '%s\n' "$out" | grep -c '^REPLAY .* result=oom@')" -eq 2 ] ||
      fail "--threads, cap: no oom in a pass"
  done
  for bad in "--window 5" "--threads --window x" "--threads --mode async --lag 5" \
    "--threads --csv /dev/null" "--threads --evict 64K"; do
    # shellcheck disable=SC2086
    "$bin" "$dir/tiny.trace" --kind host $bad > /dev/null 2>&1
    [ $? -eq 2 ] || fail "$bad does not exit 2"
  done
  if "$bin" "$dir/tiny.trace" --kind device --allocator cudaMallocAsync --passes 1 2> /dev/null |
    grep -q '^REPLAY .* result=completed$'; then
    for m in sync async; do
      run "$dir/tiny.trace" --kind device --mode "$m" --allocator all --threads
      want=8
      [ "$m" = async ] && want=6 # cudaMalloc: sync only
      [ "$(printf '%s\n' "$out" | grep -E "$re" | grep -c ' result=completed$')" -eq "$want" ] ||
        fail "--threads on the GPU, $m: not $want completed passes"
      printf '%s\n' "$out" | grep '^REPLAY .* result=completed$' | while read -r line; do
        [ "$(field peak_reserved "$line")" -ge "$(field peak_live "$line")" ] ||
          echo "FAIL: --threads on the GPU: $line"
      done | grep FAIL && fail "--threads on the GPU, $m: a footprint below the live bytes"
    done
  else
    echo "--threads on CUDA streams: no GPU, skipped"
  fi
  ;;
*)
  echo "usage: $0 smoke|footprint|cap|first|threads REPLAY_BIN TRACE_DIR" >&2
  exit 2
  ;;
esac
[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "replay $mode: all checks passed"
