# shellcheck shell=bash
# tools/lib.sh - helpers for tools/test.sh, tools/demo.sh and .ci/run.
# Source it (bash); it runs nothing by itself.
#
#   magpool_packages   the Debian packages magpool builds and tests with
#   deps [--ci]        install the missing ones with apt-get (see below)
#   run CMD...         print "+ CMD", then run it
#   step NAME WHAT CMD...
#                      run CMD in a subshell with errexit on, print
#                      "=== PASS: NAME (N s)" or "=== FAIL: NAME (exit R, N s)"
#                      and count it; a failing step does not stop the script
#   steps_summary      print the failed steps, then "N passed, N failed";
#                      returns non-zero if any step failed
#
# The counters (passed, failed, failed_steps) start from
# MAGPOOL_STEPS_PASSED, MAGPOOL_STEPS_FAILED and MAGPOOL_FAILED_STEPS, so
# that a script which hands over to another (.ci/run to tools/test.sh)
# ends with one closing line covering every step.

# clang and libclang-rt-dev (the default clang's compiler-rt, which holds
# libFuzzer): tools/test.sh's fuzz step.
magpool_packages=(build-essential cmake pkg-config libcriterion-dev liburcu-dev
                  clang libclang-rt-dev)

passed=${MAGPOOL_STEPS_PASSED:-0}
failed=${MAGPOOL_STEPS_FAILED:-0}
read -ra failed_steps <<<"${MAGPOOL_FAILED_STEPS:-}"

run() {
  echo "+ $*"
  "$@"
}

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

steps_summary() {
  echo
  if [[ ${#failed_steps[@]} -gt 0 ]]; then
    echo "failed steps: ${failed_steps[*]}"
  fi
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}

# deps [--ci]: install magpool_packages with apt-get, as root or through
# sudo (which may ask for a password only on a terminal).
#   without --ci  only the packages dpkg does not list as installed; on a
#                 system without dpkg, check that the tools are there and
#                 leave the rest to the user
#   --ci          (a clean Debian as root) every package, always
# Either way: apt-get update, check that each package exists in the apt
# sources, then apt-get install.
deps() {
  local ci=0 p
  [[ ${1:-} == --ci ]] && ci=1
  if [[ $ci -eq 0 ]] && ! command -v dpkg-query >/dev/null; then
    echo "not a Debian/Ubuntu system: install a C11 compiler, cmake >= 3.20,"
    echo "pkg-config, Criterion and liburcu yourself; checking the tools only"
    command -v cmake && command -v cc && command -v pkg-config
    return
  fi
  local want=()
  if [[ $ci -eq 1 ]]; then
    want=("${magpool_packages[@]}")
  else
    for p in "${magpool_packages[@]}"; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
        want+=("$p")
    done
    if [[ ${#want[@]} -eq 0 ]]; then
      echo "already installed: ${magpool_packages[*]}"
      return
    fi
  fi
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null && { [[ -t 0 ]] || sudo -n true 2>/dev/null; }; then
      sudo=(sudo)
    else
      echo "missing: ${want[*]}; as root run: apt-get install -y ${want[*]}" >&2
      return 1
    fi
  fi
  run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update || return
  for p in "${want[@]}"; do
    if ! apt-cache show "$p" >/dev/null 2>&1; then
      echo "no package named $p in the configured apt sources" >&2
      return 1
    fi
  done
  run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${want[@]}"
}
