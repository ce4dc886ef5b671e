#!/usr/bin/env bash
# device-run.sh - build and check magpool on the lent GPU machine.
#
#   tools/offline-gpu/device-run.sh [build] [tests] [bench] [stress] [memcheck]
#
# Runs ON the device machine, from the repository root (a copy of the
# working tree).  No argument means: tests bench stress memcheck.  The
# build always runs first (the "build" argument alone only builds).
#
#   (always)  unpack .deps/*.deb (fetch-device-deps.sh fetched them; carry
#             the git-ignored .deps along) into /tmp/deps, point
#             the compiler, linker, loader, pkg-config and CMake at it, then
#             configure build-dev with -DCMAKE_CUDA_ARCHITECTURES=90 and
#             build it                                    -> $OUT/build.log
#   tests     ctest --output-on-failure                   -> $OUT/ctest.log
#   bench     magpool-bench --kind device, threads 1,2,4,8,16, both
#             workloads                                   -> $OUT/bench.log
#   stress    magpool-stress, 20 s (10 s plain + 10 s with host streams)
#                                                         -> $OUT/stress.log
#   memcheck  compute-sanitizer memcheck, racecheck and synccheck on every
#             ctest test whose executable's name starts with test_gpu
#             (skipped if none), each test in its small size
#             (MAGPOOL_GPU_TEST_SMALL=1)
#                                                         -> $OUT/memcheck.log
# and a summary (step status, ctest result, SUMMARY and TARGET lines) on
# stdout and in $OUT/summary.txt.  At most 6 files land in $OUT.
#
# A failing step does not stop the next one; the exit status is non-zero
# if any step failed.  Every step runs under `timeout`, within a total
# budget (DEVICE_RUN_BUDGET, default 500 s) that keeps the whole run well
# inside 9 minutes.
#
# Environment: OUT (default ./out), JOBS (build parallelism, default 16),
# BENCH_SECONDS (default 1), BENCH_THREADS (default 1,2,4,8,16),
# STRESS_THREADS (default 16), DEVICE_RUN_BUDGET (seconds, default 500),
# DEPS_DIR (default /tmp/deps), BUILD_DIR (default build-dev).
#
# It also works on a machine without a GPU (a dry run): GPU tests skip,
# and the bench falls back to its host rows.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 2

OUT=${OUT:-$root/out}
JOBS=${JOBS:-16}
BENCH_SECONDS=${BENCH_SECONDS:-1}
BENCH_THREADS=${BENCH_THREADS:-1,2,4,8,16}
STRESS_THREADS=${STRESS_THREADS:-16}
BUDGET=${DEVICE_RUN_BUDGET:-500}
DEPS=${DEPS_DIR:-/tmp/deps}
BUILD=${BUILD_DIR:-build-dev}
mkdir -p "$OUT"

start=$(date +%s)
steps=("$@")
((${#steps[@]})) || steps=(tests bench stress memcheck)
for s in "${steps[@]}"; do
  case $s in build | tests | bench | stress | memcheck) ;;
    *) echo "device-run.sh: unknown step '$s' (build tests bench stress memcheck)" >&2; exit 2 ;;
  esac
done

status=()   # "step: ok|FAILED (rc N)|skipped (why)" lines
failed=0

elapsed() { echo $(($(date +%s) - start)); }

# Seconds a step may take: its cap, or what is left of the budget.
allow() {
  local cap=$1 left=$((BUDGET - $(date +%s) + start - 5))
  ((left < cap)) && cap=$left
  echo "$cap"
}

# run_step NAME LOG CAP CMD...: runs CMD under timeout, output to LOG.
run_step() {
  local name=$1 log=$2 cap t rc t0
  cap=$(allow "$3")
  shift 3
  if ((cap < 10)); then
    status+=("$name: skipped (budget of ${BUDGET}s spent)")
    echo "== $name: skipped, budget spent" | tee -a "$log"
    failed=1
    return 1
  fi
  t0=$(date +%s)
  echo "== $name (limit ${cap}s, at +$(elapsed)s)"
  timeout --kill-after=15 "$cap" "$@" >>"$log" 2>&1
  rc=$?
  t=$(($(date +%s) - t0))
  if ((rc == 0)); then
    status+=("$name: ok (${t}s)")
  elif ((rc == 124 || rc == 137)); then
    status+=("$name: FAILED (timed out after ${cap}s)")
    failed=1
  else
    status+=("$name: FAILED (rc $rc, ${t}s)")
    failed=1
  fi
  echo "== $name: rc $rc after ${t}s" >>"$log"
  return $rc
}

# ---------------------------------------------------------------- deps --
unpack_deps() {
  shopt -s nullglob
  local debs=("$root"/.deps/*.deb)
  shopt -u nullglob
  if ((${#debs[@]} == 0)); then
    echo "no .deps/*.deb: relying on system liburcu/Criterion" \
         "(fetch them with tools/offline-gpu/fetch-device-deps.sh and carry .deps)"
    return 0
  fi
  mkdir -p "$DEPS"
  local d
  for d in "${debs[@]}"; do
    if command -v dpkg >/dev/null 2>&1; then
      dpkg -x "$d" "$DEPS" || return 1
    else # no dpkg: a .deb is an ar archive holding data.tar.*
      local tmp
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$d" && tar -xf data.tar.* -C "$DEPS") || return 1
      rm -rf "$tmp"
    fi
  done
  echo "unpacked ${#debs[@]} packages into $DEPS"
}

{
  echo "device-run.sh: $(date -u '+%F %T UTC') on $(hostname), $(nproc) CPUs," \
       "$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')"
  command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  unpack_deps
} >"$OUT/build.log" 2>&1
deps_rc=$?

LIBDIR=$DEPS/usr/lib/x86_64-linux-gnu
export CPATH="$DEPS/usr/include:$DEPS/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
# The unpacked .pc files say prefix=/usr: the sysroot puts their -I and -L
# under $DEPS (liburcu).
export PKG_CONFIG_SYSROOT_DIR=$DEPS
export LIBRARY_PATH="$LIBDIR${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$LIBDIR/pkgconfig:$DEPS/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export CMAKE_PREFIX_PATH="$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# The steps run in child shells (under timeout): they read these.
export root OUT JOBS DEPS LIBDIR BUILD

# --------------------------------------------------------------- build --
# Runs in a child shell (under timeout), through declare -f.
# shellcheck disable=SC2317
build() {
  cmake -S "$root" -B "$root/$BUILD" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DMAGPOOL_WITH_CUDA="${MAGPOOL_WITH_CUDA:-ON}" \
    -DCMAKE_PREFIX_PATH="$DEPS/usr" \
    -DCMAKE_LIBRARY_PATH="$LIBDIR" \
    -DCMAKE_INCLUDE_PATH="$DEPS/usr/include" &&
    cmake --build "$root/$BUILD" -j"$JOBS"
}

built=0
if ((deps_rc != 0)); then
  status+=("deps: FAILED (unpacking .deps, see build.log)")
  failed=1
fi
if run_step build "$OUT/build.log" 300 bash -c "$(declare -f build); build"; then
  built=1
else
  echo "-- build failed; last lines of build.log:"
  tail -n 30 "$OUT/build.log"
fi

bench_bin=$root/$BUILD/bench/magpool-bench
stress_bin=$root/$BUILD/stress/magpool-stress

# --------------------------------------------------------------- steps --
# Runs in a child shell (under timeout), through declare -f.
# shellcheck disable=SC2317
memcheck() {
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  local json
  json=$(mktemp /tmp/magpool-tests.XXXXXX)
  ctest --test-dir "$root/$BUILD" --show-only=json-v1 >"$json" || return 1
  SANITIZER=$sanitizer TESTS_JSON=$json python3 - <<'EOF'
import json, os, subprocess, sys
tests = json.load(open(os.environ["TESTS_JSON"]))["tests"]
os.remove(os.environ["TESTS_JSON"])
gpu = [t for t in tests
       if t.get("command") and os.path.basename(t["command"][0]).startswith("test_gpu")]
if not gpu:
    print("memcheck: no ctest test runs a test_gpu* executable: skipped")
    sys.exit(0)
if not os.path.exists(os.environ["SANITIZER"]):
    print("memcheck: compute-sanitizer not found"); sys.exit(1)
bad = 0
for t in gpu:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    env = dict(os.environ)
    for kv in props.get("ENVIRONMENT", []):
        k, _, v = kv.partition("=")
        env[k] = v
    env["MAGPOOL_GPU_TEST_SMALL"] = "1"  # each test's compute-sanitizer size
    for tool in ("memcheck", "racecheck", "synccheck"):
        extra = ["--leak-check", "full"] if tool == "memcheck" else []
        cmd = [os.environ["SANITIZER"], "--tool", tool, "--error-exitcode", "97",
               "--target-processes", "all"] + extra + t["command"]
        print("== %s: %s: %s" % (tool, t["name"], " ".join(cmd)), flush=True)
        try:
            rc = subprocess.call(cmd, cwd=props.get("WORKING_DIRECTORY"), env=env, timeout=150)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        print("== %s: %s rc %s" % (tool, t["name"], rc), flush=True)
        print("SANITIZER %s %s %s" % (tool, t["name"], "clean" if rc == 0 else "FAIL(rc %s)" % rc),
              flush=True)
        bad += rc != 0
print("sanitizers: %d failures over %d GPU test executables x 3 tools" % (bad, len(gpu)))
sys.exit(1 if bad else 0)
EOF
}

for s in "${steps[@]}"; do
  [ "$s" = build ] && continue
  if ((!built)); then
    status+=("$s: skipped (build failed)")
    continue
  fi
  case $s in
    tests)
      run_step tests "$OUT/ctest.log" 240 \
        ctest --test-dir "$root/$BUILD" --output-on-failure -j8 --timeout 180 ;;
    bench)
      run_step bench "$OUT/bench.log" 300 \
        "$bench_bin" --kind device --workload all --threads "$BENCH_THREADS" \
        --seconds "$BENCH_SECONDS" ;;
    stress)
      {
        run_step stress-plain "$OUT/stress.log" 40 \
          "$stress_bin" --threads "$STRESS_THREADS" --seconds 10 --seed 1
        run_step stress-streams "$OUT/stress.log" 40 \
          "$stress_bin" --threads "$STRESS_THREADS" --seconds 10 --seed 2 --streams 4
      } ;;
    memcheck)
      run_step memcheck "$OUT/memcheck.log" 480 bash -c "$(declare -f memcheck); memcheck" ;;
  esac
done

# ------------------------------------------------------------- summary --
{
  echo
  echo "======== device-run.sh summary ($(date -u '+%F %T UTC'), $(elapsed)s) ========"
  head -n 2 "$OUT/build.log"
  if [ -f "$OUT/ctest.log" ]; then
    echo "-- ctest:"
    grep -E 'tests passed|tests failed|\*\*\*|Failed|Not Run|Timeout' "$OUT/ctest.log" | tail -n 30
  fi
  if [ -f "$OUT/bench.log" ]; then
    echo "-- bench:"
    grep -E '^(magpool-bench \(|machine:|gpu:|NOTE|SUMMARY|TARGET|FAILURES|NOTRUN)' "$OUT/bench.log"
  fi
  if [ -f "$OUT/stress.log" ]; then
    echo "-- stress (last lines):"
    tail -n 8 "$OUT/stress.log"
  fi
  if [ -f "$OUT/memcheck.log" ]; then
    echo "-- memcheck:"
    grep -E 'ERROR SUMMARY|^SANITIZER|^sanitizers:|^memcheck:|timeout' "$OUT/memcheck.log" | tail -n 30
  fi
  echo "-- steps:"
  printf '   %s\n' "${status[@]}"
  if ((failed)); then echo "RESULT: FAILED"; else echo "RESULT: ok"; fi
} | tee "$OUT/summary.txt"

exit $failed
