#!/usr/bin/env bash
# tools/test.sh - install what is missing, build magpool, and run every test.
#
#   tools/test.sh           all steps (about 10 minutes on 2 cores)
#   tools/test.sh --quick   skip the sanitizer builds (TSan stress, ASan+UBSan)
#
# Steps, each reported as PASS or FAIL; a failing step does not stop the
# ones after it, and the last line is "N passed, N failed":
#   deps          apt-get install what is missing (as root, or with sudo):
#                 build-essential cmake pkg-config libcriterion-dev
#                 liburcu-dev
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
#   tsan-build    build-tsan/, MAGPOOL_SANITIZE=thread, target magpool-stress
#   tsan-stress   magpool-stress --threads 4 --seconds 20 --seed 1 under TSan
#   asan-build    build-asan/, ASan + UBSan, CUDA off, everything
#   asan-ctest    every test (Criterion, stress, bench smoke) under
#                 ASan + UBSan
#
# Environment: JOBS (build parallelism, default: number of CPUs);
# BUILD_DIR (default build; the other directories are BUILD_DIR-tsan,
# BUILD_DIR-asan and BUILD_DIR-consumer).
# MAGPOOL_STEPS_PASSED / MAGPOOL_STEPS_FAILED start the counters (.ci/run
# passes its own steps in, so that one closing line covers everything).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=tools/lib.sh
source "$root/tools/lib.sh"

quick=0
for arg in "$@"; do
  case $arg in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "tools/test.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

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

run_ctest() {
  run ctest --test-dir "$b" --output-on-failure --no-tests=error --timeout 900
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
  if ldd "$b-consumer"/consumer_static | grep -q 'libmagpool'; then
    echo "consumer_static still needs libmagpool.so" >&2
    return 1
  fi
  run "$b-consumer"/consumer_static
}

consumer_pkgconfig() {
  run bash tests/consumer/pkgconfig.sh "$prefix"
}

# ------------------------------------------------------------ sanitizers --
tsan_build() {
  run cmake -S . -B "$b-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMAGPOOL_SANITIZE=thread -DMAGPOOL_BUILD_TESTS=ON
  run cmake --build "$b-tsan" -j"$jobs" --target magpool-stress
}

tsan_stress() {
  local exe
  exe=$(find "$b-tsan" -type f -name magpool-stress -perm -u+x | head -n1)
  [[ -n $exe ]] || { echo "magpool-stress not built" >&2; return 1; }
  echo "+ TSAN_OPTIONS=\"suppressions=$root/stress/tsan.supp halt_on_error=1\" $exe --threads 4 --seconds 20 --seed 1"
  TSAN_OPTIONS="suppressions=$root/stress/tsan.supp halt_on_error=1" \
    timeout 300 "$exe" --threads 4 --seconds 20 --seed 1
}

# MAGPOOL_SANITIZE takes one sanitizer; UBSan rides along in CMAKE_C_FLAGS.
# CUDA is off here: the sanitizer flags are global compile options, which
# nvcc (the bench's .cu file) does not take.
asan_build() {
  run cmake -S . -B "$b-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMAGPOOL_SANITIZE=address -DMAGPOOL_BUILD_TESTS=ON -DMAGPOOL_WITH_CUDA=OFF \
    "-DCMAKE_C_FLAGS=-fsanitize=undefined -fno-sanitize-recover=undefined" \
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=undefined" \
    "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=undefined"
  run cmake --build "$b-asan" -j"$jobs"
}

asan_ctest() {
  echo "+ ASAN_OPTIONS=protect_shadow_gap=0 ctest --test-dir $b-asan --output-on-failure ..."
  ASAN_OPTIONS=protect_shadow_gap=0 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$b-asan" --output-on-failure --no-tests=error --timeout 900
}

# ------------------------------------------------------------------ main --
step deps "install the build dependencies if missing" deps
step configure "cmake -S . -B $b (RelWithDebInfo, tests on)" configure
step build "build library, tests, stress and bench" build
step layers "tools/check-layers.sh on $b/libmagpool.a" \
  run bash tools/check-layers.sh "$b"
step ctest "run every registered test" run_ctest
step install "cmake --install $b into a temporary prefix" install_prefix
step consumer "find_package(magpool) consumer, shared and static" consumer_cmake
step pkg-config "pkg-config consumer, shared and --static" consumer_pkgconfig
if [[ $quick -eq 0 ]]; then
  step tsan-build "build magpool-stress with ThreadSanitizer" tsan_build
  step tsan-stress "magpool-stress 4 threads, 20 s, under TSan" tsan_stress
  step asan-build "build everything with ASan + UBSan (CUDA off)" asan_build
  step asan-ctest "run every test under ASan + UBSan" asan_ctest
fi

steps_summary
