#!/usr/bin/env bash
# fetch-device-deps.sh - download the Debian packages the device machine
# lacks (liburcu, Criterion and Criterion's runtime dependencies) into the
# git-ignored folder .deps/ at the repository root.
#
# Runs on a networked Debian 12 machine with apt, not on the GPU machine:
# that one has no apt-get and no network.  device-run.sh, beside this
# script, unpacks these .debs there with `dpkg -x` into /tmp/deps.
#
# Idempotent: a package whose .deb is already in .deps/ is not downloaded
# again.  Pass the device tool `carry: [".deps"]` so the folder travels
# (it is git-ignored, so it is not copied otherwise).
#
# Usage: tools/offline-gpu/fetch-device-deps.sh   (from anywhere in the repo)
set -euo pipefail

PKGS=(
  liburcu8 liburcu-dev
  libcriterion3 libcriterion-dev
  libnanomsg5 libgit2-1.5 libprotobuf-c1 libhttp-parser2.9 libssh2-1
  libmbedtls14 libmbedx509-1 libmbedcrypto7
)

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$root/.deps"
cd "$root/.deps"

missing=()
for p in "${PKGS[@]}"; do
  if compgen -G "${p}_*.deb" >/dev/null; then
    echo "have    $(compgen -G "${p}_*.deb" | head -n1)"
  else
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "fetch   ${missing[*]}"
  # apt-get download needs package lists; refresh them once if it fails.
  if ! apt-get download "${missing[@]}"; then
    echo "apt-get download failed; running apt-get update and retrying" >&2
    apt-get update
    apt-get download "${missing[@]}"
  fi
fi

# Every package must be present now.
rc=0
for p in "${PKGS[@]}"; do
  if ! compgen -G "${p}_*.deb" >/dev/null; then
    echo "fetch-device-deps: missing ${p}_*.deb in $root/.deps" >&2
    rc=1
  fi
done
if ((rc == 0)); then
  echo "ok: ${#PKGS[@]} packages in $root/.deps ($(du -sh . | cut -f1))"
fi
exit $rc
