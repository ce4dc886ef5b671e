#!/bin/sh
# run-stress.sh - build magpool-stress plain, under ThreadSanitizer and under
# AddressSanitizer, and run each one.
#
#   tools/run-stress.sh [plain|tsan|asan|all] [magpool-stress arguments...]
#
# Build directories: build-stress, build-stress-tsan, build-stress-asan
# (under the source tree, git-ignored).  JOBS (default 2) sets the build
# parallelism; SECONDS_PLAIN / SECONDS_SAN the default run lengths used when
# no arguments are given.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
which=${1:-all}
[ $# -gt 0 ] && shift
jobs=${JOBS:-2}

run_one() {
  flavour=$1; shift
  case $flavour in
    plain) dir=build-stress;      san="";       secs=${SECONDS_PLAIN:-10} ;;
    tsan)  dir=build-stress-tsan; san=thread;   secs=${SECONDS_SAN:-20} ;;
    asan)  dir=build-stress-asan; san=address;  secs=${SECONDS_SAN:-20} ;;
    *) echo "run-stress.sh: unknown flavour $flavour" >&2; exit 2 ;;
  esac
  cmake -S "$here" -B "$here/$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DMAGPOOL_SANITIZE="$san" >/dev/null
  cmake --build "$here/$dir" -j"$jobs" --target magpool-stress
  echo "== $flavour: magpool-stress $*"
  if [ $# -eq 0 ]; then set -- --seconds "$secs"; fi
  TSAN_OPTIONS="suppressions=$here/stress/tsan.supp halt_on_error=1" \
  ASAN_OPTIONS="protect_shadow_gap=0" \
    "$here/$dir/stress/magpool-stress" "$@"
}

case $which in
  all) run_one plain "$@"; run_one tsan "$@"; run_one asan "$@" ;;
  *) run_one "$which" "$@" ;;
esac
