#!/usr/bin/env bash
# tools/demo.sh - install what is missing, build magpool-bench, and run it.
#
#   tools/demo.sh [magpool-bench arguments...]
#
# With no arguments the bench runs every row for 1 s each, on the GPU rows
# too (--kind device) when `nvidia-smi -L` lists a GPU, else on the host rows
# only (--kind host).  Build directory: build-bench/ (Release).
# Environment: JOBS (build parallelism, default: number of CPUs).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
# shellcheck source=tools/lib.sh
source "$root/tools/lib.sh"

# -- dependencies: apt-get what is missing, when we can -----------------------
# shellcheck disable=SC2119 # deps takes --ci, which is not for here
if ! deps; then
  echo "demo.sh: could not install the build dependencies" >&2
  exit 1
fi

# -- which rows -------------------------------------------------------------
kind=host
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  kind=device
  echo "== GPU found:"
  nvidia-smi -L
else
  echo "== no GPU (nvidia-smi -L lists none): host rows only"
fi

# -- build --------------------------------------------------------------------
echo "== building magpool-bench in build-bench/"
run cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DMAGPOOL_BUILD_TESTS=ON
run cmake --build build-bench -j"$jobs" --target magpool-bench
bench=build-bench/bench/magpool-bench
[[ -x $bench ]] || bench=$(find build-bench -type f -name magpool-bench -perm -u+x | head -n1)
[[ -n $bench && -x $bench ]] || { echo "demo.sh: magpool-bench was not built" >&2; exit 1; }

# -- run ----------------------------------------------------------------------
if [[ $# -eq 0 ]]; then
  set -- --kind "$kind" --seconds 1
fi
echo "== $bench $*"
exec "$bench" "$@"
