#!/usr/bin/env bash
# python/tests/gpu_checks.sh - the checks of the shared library and of
# magpool_torch on a GPU machine with PyTorch (see README, "Python and
# PyTorch"), from the repository root:
#
#   gpu_checks.sh single   build (tools/offline-gpu/device-run.sh build),
#                          (REPEAT, PARITY_CONFS, PARITY_CPUS: gpt2_parity.py's
#                          --repeat, --magpool-conf (default ";timing=1": the
#                          module's defaults, untimed and timed) and --cpus;
#                          SKIP_BENCH=1: no bench;
#                          TRACE_RUN=1: one more magpool run recording a
#                          trace to $OUT; BASE_DIR: a source tree whose
#                          bench to build and run beside this one)
#                          install, the GPU and install ctests (dlopen,
#                          ctypes, two CUDA runtimes, magpool_torch), the
#                          GPT-2 parity run (--repeat 2), and the host
#                          bench static archive vs shared library
#   gpu_checks.sh ddp      build the library and the shim only, install,
#                          the GPT-2 parity run with torchrun and DDP on
#                          every GPU over NCCL; on a machine with one GPU,
#                          two ranks on it over gloo
#
# Logs go to $OUT (default ./out).  NVLink multicast stays off.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 2
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
mode=${1:-single}
B=build-dev
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$root/$B/install-test-prefix/lib/python3/site-packages
export MAGPOOL_TORCH_CACHE=/tmp/magpool_torch_cache PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "== $* (+$(( $(date +%s) - t0 ))s)"; }
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "gpus", torch.cuda.device_count())'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
rc=0
if [[ $mode == single ]]; then
  stamp build
  OUT=$OUT BUILD_DIR=$B bash tools/offline-gpu/device-run.sh build >"$OUT/build-run.log" 2>&1 || {
    tail -30 "$OUT/build.log"; exit 1; }
  stamp ctest
  (cd $B && ctest --output-on-failure -j4 \
     -R "${CTEST_REGEX:-install_fixture|dlopen_installed|ctypes_installed|no_static_tls|test_gpu|magpool_torch}") \
     >"$OUT/ctest-gpu.log" 2>&1 || rc=1
  grep -E "tests passed|Passed|Failed|Skipped|two_runtimes:|test_magpool_torch|test_shim|cudart" \
     "$OUT/ctest-gpu.log" | tail -40
  readelf -d $B/install-test-prefix/lib/libmagpool.so | grep -E 'NEEDED|FLAGS|RUNPATH'
  stamp parity
  python3 python/tests/gpt2_parity.py --compare --repeat "${REPEAT:-2}" --out "$OUT/parity" \
     --magpool-conf "${PARITY_CONFS-;timing=1}" --cpus "${PARITY_CPUS:-}" \
     2>&1 | tee "$OUT/parity.log" | grep -E "^(RESULT|SUMMARY|MAGPOOL|gpt2_parity)" || rc=1
  if [[ -n ${TRACE_RUN:-} ]]; then
    stamp traced magpool run
    MAGPOOL_TRACE=$OUT/gpt2_magpool.trace python3 python/tests/gpt2_parity.py --child \
      --allocator magpool --out "$OUT/traced.json" 2>&1 | grep -E "^RESULT" || rc=1
    gzip -f "$OUT/gpt2_magpool.trace"
  fi
  stamp bench
  rows=${BENCH_ROWS:-magpool,magpool-trace}
  if [[ -n ${BASE_DIR:-} ]]; then  # the same bench built on an earlier tree
    CPATH=/tmp/deps/usr/include${CPATH:+:$CPATH} cmake -S "$BASE_DIR" -B "$BASE_DIR/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH=/tmp/deps/usr \
      -DCMAKE_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu \
      -DCMAKE_INCLUDE_PATH=/tmp/deps/usr/include >"$OUT/base-build.log" 2>&1 &&
      CPATH=/tmp/deps/usr/include${CPATH:+:$CPATH} \
      cmake --build "$BASE_DIR/build" -j16 --target magpool-bench magpool-bench-shared \
        >>"$OUT/base-build.log" 2>&1 || rc=1
  fi
  [[ -n ${SKIP_BENCH:-} ]] || for round in 1 2; do
    for b in $B/bench/magpool-bench $B/bench/magpool-bench-shared \
             ${BASE_DIR:+$BASE_DIR/build/bench/magpool-bench $BASE_DIR/build/bench/magpool-bench-shared}; do
      r=$rows
      [[ $b == "${BASE_DIR:-none}"* ]] && r=magpool
      $b --kind host --threads 1,4,16 --seconds 0.5 --rows "$r" 2>&1 | grep '^SUMMARY' |
        sed "s|^|${b#$root/} round=$round |"
    done
  done | tee "$OUT/bench-host.log"
else
  stamp build
  { cmake -S . -B $B -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DMAGPOOL_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH=/tmp/deps/usr \
      -DCMAKE_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu \
      -DCMAKE_INCLUDE_PATH=/tmp/deps/usr/include &&
    cmake --build $B -j16 && cmake --install $B --prefix $B/install-test-prefix; } \
    >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  stamp ddp
  n=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  more=(--nproc "$n")
  # One GPU: two ranks on it over gloo (NCCL refuses two ranks on one
  # device); the multi-GPU run over NCCL needs a machine with two.
  (( n >= 2 )) || { more=(--nproc 2 --backend gloo --one-gpu); echo "one GPU: DDP over gloo, 2 ranks on device 0"; }
  python3 python/tests/gpt2_parity.py --compare --ddp "${more[@]}" --out "$OUT/ddp" \
     2>&1 | tee "$OUT/ddp.log" | grep -E "gpt2_parity|SUMMARY|Error|error" | tail -20 || rc=1
fi
stamp done rc=$rc
exit $rc
