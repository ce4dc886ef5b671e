#!/usr/bin/env bash
# tools/test.sh - install what is missing, build magpool, and run every test.
#
#   tools/test.sh           all steps (about 7 minutes on 2 cores)
#   tools/test.sh --quick   skip the debug, sanitizer and fuzz builds
#   tools/test.sh stress [plain|tsan|asan|all] [magpool-stress args...]
#                           build magpool-stress in BUILD_DIR, BUILD_DIR-tsan
#                           or BUILD_DIR-asan (all: the three in turn, the
#                           default) and run it there; with no arguments
#                           it runs --seconds 10 (plain) or --seconds 20
#                           (sanitizers)
#
# Steps, each reported as PASS or FAIL; a failing step does not stop the
# ones after it, and the last line is "N passed, N failed":
#   deps          apt-get install what is missing (as root, or with sudo):
#                 build-essential cmake pkg-config libcriterion-dev
#                 liburcu-dev clang libclang-rt-dev
#   configure     cmake in build/ (RelWithDebInfo, tests on, install prefix
#                 a temporary directory)
#   build         everything: library, Criterion tests, stress, bench
#   layers        tools/check-layers.sh on build/libmagpool.a: calls go
#                 down the layers of src/, no cycle, no file of src/ over
#                 500 lines, atomics spelled out only in src/atomic.h
#   ctest         ctest --output-on-failure in build/
#   install       cmake --install into the temporary prefix
#   consumer      tests/consumer built with find_package(magpool), shared
#                 and static, and run
#   pkg-config    tests/consumer/pkgconfig.sh: the same program built with
#                 pkg-config, shared and --static, and run
#   (not with --quick:)
#   debug-build   build-debug/, MAGPOOL_DEBUG=2 (every assertion, and the
#                 tree and pool checkers at quiescent trims and at
#                 destroy), CUDA off, everything
#   debug-ctest   every test in build-debug/
#   tsan-build    build-tsan/, MAGPOOL_SANITIZE=thread, target magpool-stress
#   tsan-stress   magpool-stress --threads 4 --seconds 20 --seed 1 --streams 4
#                 --churn --destroy-rounds 20 under TSan
#   tsan-stress-growth  magpool-stress --grow-from 16 --pool-mb 64 (chunk
#                 groups and moves) under TSan
#   tsan-stress-keepup  magpool-stress --streams 1 --large-async (one stream
#                 makes every run take: its run frees skip questions, then go
#                 back solo) under TSan
#   tsan-stress-solo  magpool-stress --streams 1 --solo (solo runs, runs.h:
#                 ended by synchronous run takes, maps, release) under TSan
#   tsan-stress-crossreuse  magpool-stress --cross-reuse --grow-from 16
#                 --pool-mb 512 (streams at a new peak take runs others
#                 fenced, after waiting for them) under TSan
#   tsan-stress-nogroups  magpool-stress --grow-from 16 --pool-mb 64
#                 --no-groups (a capped pool's default: a chunk each, tree
#                 blocks into the fullest busy chunk, extent blocks) under TSan
#   asan-build    build-asan/, ASan + UBSan, CUDA off, everything
#   asan-ctest    every test (Criterion, stress, bench smoke) under
#                 ASan + UBSan
#   fuzz          BUILD_DIR-fuzz/, clang, MAGPOOL_BUILD_FUZZ=ON: the
#                 libFuzzer harness (tests/fuzz) runs its seeds, then
#                 fuzzes for FUZZ_SECONDS (default 60) with -seed=1; any
#                 crash or model violation fails the step (the input is
#                 left in BUILD_DIR-fuzz/crash-*)
# `stress` mode runs deps, then FLAVOUR-build and FLAVOUR-stress for each
# flavour (only the magpool-stress target is built).
#
# Environment: JOBS (build parallelism, default: number of CPUs);
# BUILD_DIR (default build; the other directories are BUILD_DIR-debug,
# BUILD_DIR-tsan, BUILD_DIR-asan, BUILD_DIR-fuzz and BUILD_DIR-consumer);
# SECONDS_PLAIN and SECONDS_SAN (the stress mode's default run lengths);
# FUZZ_SECONDS (the fuzz step's length).
# MAGPOOL_STEPS_PASSED / MAGPOOL_STEPS_FAILED start the counters (.ci/run
# passes its own steps in, so that one closing line covers everything).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=tools/lib.sh
source "$root/tools/lib.sh"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

quick=0
mode=all
flavours=()
if [[ ${1:-} == stress ]]; then
  mode=stress
  shift
  case ${1:-all} in
    plain|tsan|asan) flavours=("$1"); shift ;;
    all) flavours=(plain tsan asan); [[ $# -eq 0 ]] || shift ;;
    -*) flavours=(plain tsan asan) ;;
    *) echo "tools/test.sh: stress takes plain, tsan, asan or all, not $1" >&2; exit 2 ;;
  esac
else
  for arg in "$@"; do
    case $arg in
      --quick) quick=1 ;;
      -h|--help) usage; exit 0 ;;
      *) echo "tools/test.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
    esac
  done
fi

jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
b=${BUILD_DIR:-build}

prefix=$(mktemp -d "${TMPDIR:-/tmp}/magpool-prefix.XXXXXX")
trap 'rm -rf "$prefix"' EXIT

# ------------------------------------------------------------ main build --
configure() {
  run cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMAGPOOL_BUILD_TESTS=ON -DMAGPOOL_SANITIZE= \
    -DCMAKE_INSTALL_PREFIX="$prefix"
}

build() {
  run cmake --build "$b" -j"$jobs"
}

run_ctest() { # [BUILD_DIR]
  run ctest --test-dir "${1:-$b}" --output-on-failure --no-tests=error --timeout 900
}

install_prefix() {
  run cmake --install "$b" --prefix "$prefix"
  find "$prefix" -type f | sed "s|^$prefix/|  |" | sort
}

consumer_cmake() {
  rm -rf "$b-consumer"
  run cmake -S tests/consumer -B "$b-consumer" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
  run cmake --build "$b-consumer" -j"$jobs"
  run "$b-consumer"/consumer
  local deps # ldd's output first: see tests/consumer/pkgconfig.sh
  deps=$(ldd "$b-consumer"/consumer_static || true)
  if grep -q 'libmagpool' <<<"$deps"; then
    echo "consumer_static still needs libmagpool.so" >&2
    return 1
  fi
  run "$b-consumer"/consumer_static
}

consumer_pkgconfig() {
  run bash tests/consumer/pkgconfig.sh "$prefix"
}

# ---------------------------------------------------------- debug build --
debug_build() {
  run cmake -S . -B "$b-debug" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMAGPOOL_DEBUG=2 -DMAGPOOL_WITH_CUDA=OFF -DMAGPOOL_SANITIZE= \
    -DMAGPOOL_BUILD_TESTS=ON
  run cmake --build "$b-debug" -j"$jobs"
}

# ------------------------------------------------------------ sanitizers --
configure_tsan() {
  run cmake -S . -B "$b-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMAGPOOL_SANITIZE=thread -DMAGPOOL_BUILD_TESTS=ON
}

# MAGPOOL_SANITIZE takes one sanitizer; UBSan rides along in CMAKE_C_FLAGS.
# CUDA is off here: the sanitizer flags are global compile options, which
# nvcc (the bench's .cu file) does not take.
configure_asan() {
  run cmake -S . -B "$b-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMAGPOOL_SANITIZE=address -DMAGPOOL_BUILD_TESTS=ON -DMAGPOOL_WITH_CUDA=OFF \
    "-DCMAKE_C_FLAGS=-fsanitize=undefined -fno-sanitize-recover=undefined" \
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=undefined" \
    "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=undefined"
}

asan_build() {
  configure_asan
  run cmake --build "$b-asan" -j"$jobs"
}

# The sanitizers' settings for everything run from here.
export TSAN_OPTIONS="suppressions=$root/stress/tsan.supp halt_on_error=1"
export ASAN_OPTIONS=protect_shadow_gap=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# ------------------------------------------------------------------ fuzz --
# The harness needs clang (libFuzzer) and its own instrumented copy of the
# library; CUDA off.  New corpus entries go to BUILD_DIR-fuzz/corpus, the
# committed seeds stay as they are.
fuzz_step() {
  local dir="$b-fuzz" seconds=${FUZZ_SECONDS:-60}
  run cmake -S . -B "$dir" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMAGPOOL_BUILD_FUZZ=ON -DMAGPOOL_BUILD_TESTS=OFF -DMAGPOOL_WITH_CUDA=OFF \
    -DMAGPOOL_SANITIZE= -DMAGPOOL_DEBUG=1
  run cmake --build "$dir" -j"$jobs" --target magpool-fuzz
  run_ctest "$dir"
  mkdir -p "$dir/corpus"
  # -timeout: one input that hangs (a deadlock) fails the step too; the
  # outer timeout is a last resort should libFuzzer itself not return.
  # libFuzzer's line per new input goes to fuzz.log; shown here: the
  # summary, or the log's end on a failure.
  local cmd=(timeout $((seconds + 300)) "$dir/tests/fuzz/magpool-fuzz"
    -max_total_time="$seconds" -seed=1 -max_len=2048 -timeout=60
    -print_final_stats=1 -artifact_prefix="$dir/" "$dir/corpus" tests/fuzz/corpus)
  local rc=0
  echo "+ ${cmd[*]} >$dir/fuzz.log 2>&1"
  "${cmd[@]}" >"$dir/fuzz.log" 2>&1 || rc=$?
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::|^Done' "$dir/fuzz.log" || true
  if [[ $rc -ne 0 ]]; then
    grep -E -A12 'model violation|ERROR: [A-Za-z]+Sanitizer|ERROR: libFuzzer|runtime error' \
      "$dir/fuzz.log" | head -n 60 || true
    tail -n 12 "$dir/fuzz.log"
    echo "fuzz: exit $rc; the input is in $dir/ (crash-*, timeout-*, oom-*)" >&2
    return "$rc"
  fi
}

# ---------------------------------------------------------------- stress --
# A flavour is a build directory with its configure step:
#   plain  $b        (the main build)
#   tsan   $b-tsan   ThreadSanitizer
#   asan   $b-asan   AddressSanitizer + UBSan, CUDA off
stress_dir() {
  case $1 in
    plain) echo "$b" ;;
    tsan|asan) echo "$b-$1" ;;
  esac
}

stress_build() { # FLAVOUR
  case $1 in
    plain) configure ;;
    tsan) configure_tsan ;;
    asan) configure_asan ;;
  esac
  run cmake --build "$(stress_dir "$1")" -j"$jobs" --target magpool-stress
}

# stress_run FLAVOUR [ARGS...]: with no ARGS, --seconds SECONDS_PLAIN (10)
# or SECONDS_SAN (20).  stress_limit, when set, caps the run (timeout).
stress_limit=0
stress_run() {
  local flavour=$1 exe
  shift
  exe=$(stress_dir "$flavour")/stress/magpool-stress
  [[ -x $exe ]] || { echo "$exe not built" >&2; return 1; }
  if [[ $# -eq 0 ]]; then
    if [[ $flavour == plain ]]; then
      set -- --seconds "${SECONDS_PLAIN:-10}"
    else
      set -- --seconds "${SECONDS_SAN:-20}"
    fi
  fi
  case $flavour in
    tsan) echo "+ TSAN_OPTIONS=\"$TSAN_OPTIONS\" $exe $*" ;;
    asan) echo "+ ASAN_OPTIONS=$ASAN_OPTIONS UBSAN_OPTIONS=$UBSAN_OPTIONS $exe $*" ;;
    *) echo "+ $exe $*" ;;
  esac
  timeout "$stress_limit" "$exe" "$@"
}

stress_steps() { # FLAVOUR [ARGS...]
  local flavour=$1
  shift
  step "$flavour-build" "build magpool-stress in $(stress_dir "$flavour")/" \
    stress_build "$flavour"
  step "$flavour-stress" "magpool-stress ${*:-(default length)}, $flavour" \
    stress_run "$flavour" "$@"
}

# ------------------------------------------------------------------ main --
step deps "install the build dependencies if missing" deps
if [[ $mode == stress ]]; then
  for f in "${flavours[@]}"; do
    stress_steps "$f" "$@"
  done
  steps_summary
  exit
fi

step configure "cmake -S . -B $b (RelWithDebInfo, tests on)" configure
step build "build library, tests, stress and bench" build
step layers "tools/check-layers.sh on $b/libmagpool.a" \
  run bash tools/check-layers.sh "$b"
step ctest "run every registered test" run_ctest
step install "cmake --install $b into a temporary prefix" install_prefix
step consumer "find_package(magpool) consumer, shared and static" consumer_cmake
step pkg-config "pkg-config consumer, shared and --static" consumer_pkgconfig
if [[ $quick -eq 0 ]]; then
  step debug-build "build everything with MAGPOOL_DEBUG=2 (CUDA off)" debug_build
  step debug-ctest "run every test with MAGPOOL_DEBUG=2" run_ctest "$b-debug"
  stress_limit=300
  stress_steps tsan --threads 4 --seconds 20 --seed 1 --streams 4 --churn --destroy-rounds 20
  # A growing pool: chunks mapped in groups by growth, unmapped by moves.
  step tsan-stress-growth "magpool-stress on a pool growing from 16 to 64 MiB, tsan" \
    stress_run tsan --threads 4 --seconds 15 --seed 2 --streams 4 --grow-from 16 --pool-mb 64
  # One stream that keeps up: runs fenced without asking, settled by a yes.
  step tsan-stress-keepup "magpool-stress, one stream making every run take, tsan" \
    stress_run tsan --threads 2 --seconds 10 --seed 3 --streams 1 --large-async --grow-from 16 --pool-mb 64
  # Solo runs: one stream's runs given back unfenced, ended by the rare
  # synchronous run take, by maps, and at the end by release.
  step tsan-stress-solo "magpool-stress, one stream's solo runs, tsan" \
    stress_run tsan --threads 4 --seconds 15 --seed 6 --streams 1 --solo --grow-from 16 --pool-mb 64
  # cross_stream_reuse: adoption at new peaks (a few dozen in 15 s).
  step tsan-stress-crossreuse "magpool-stress, cross_stream_reuse on, tsan" \
    stress_run tsan --threads 4 --seconds 15 --seed 4 --streams 4 --large-async --grow-from 16 --pool-mb 512 --cross-reuse
  # chunk_groups 0 (a cap's default): chunks a piece each, packing.
  step tsan-stress-nogroups "magpool-stress, chunk_groups 0, tsan" \
    stress_run tsan --threads 4 --seconds 15 --seed 5 --streams 4 --large-async --grow-from 16 --pool-mb 64 --no-groups
  step asan-build "build everything with ASan + UBSan (CUDA off)" asan_build
  step asan-ctest "run every test under ASan + UBSan" run_ctest "$b-asan"
  step fuzz "build the libFuzzer harness with clang and fuzz for ${FUZZ_SECONDS:-60} s" fuzz_step
fi

steps_summary
