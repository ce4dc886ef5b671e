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
#   configure     cmake in build/ (RelWithDebInfo, tests on, install prefix
#                 a temporary directory)
#   build         everything: library, Criterion tests, stress, bench
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
passed=${MAGPOOL_STEPS_PASSED:-0}
failed=${MAGPOOL_STEPS_FAILED:-0}
failed_steps=()

prefix=$(mktemp -d "${TMPDIR:-/tmp}/magpool-prefix.XXXXXX")
trap 'rm -rf "$prefix"' EXIT

# step NAME DESCRIPTION COMMAND...: runs COMMAND in a subshell with
# errexit on, and counts it.
step() {
  local name=$1 what=$2
  shift 2
  local t0=$SECONDS rc
  echo
  echo "=== step: $name - $what"
  set +e
  (set -euo pipefail; "$@")
  rc=$?
  set -e
  if [[ $rc -eq 0 ]]; then
    passed=$((passed + 1))
    echo "=== PASS: $name ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1))
    failed_steps+=("$name")
    echo "=== FAIL: $name (exit $rc, $((SECONDS - t0)) s)"
  fi
}

run() {
  echo "+ $*"
  "$@"
}

# ------------------------------------------------------------------ deps --
packages=(build-essential cmake pkg-config libcriterion-dev)

deps() {
  if ! command -v dpkg-query >/dev/null; then
    echo "not a Debian/Ubuntu system: install a C11 compiler, cmake >= 3.20,"
    echo "pkg-config and Criterion yourself; checking the tools only"
    command -v cmake && command -v cc && command -v pkg-config
    return
  fi
  local missing=() p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$p")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    echo "already installed: ${packages[*]}"
    return
  fi
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo=(sudo)
    else
      echo "missing: ${missing[*]}; run as root: apt-get install -y ${missing[*]}" >&2
      return 1
    fi
  fi
  run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
  run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
}

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

echo
if [[ $failed -gt 0 ]]; then
  echo "failed steps: ${failed_steps[*]}"
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
