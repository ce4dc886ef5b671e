#!/usr/bin/env bash
# pkgconfig.sh PREFIX - build tests/consumer/main.c against the magpool
# installed under PREFIX with pkg-config, once against the shared library
# and once against the static archive (--static), and run both.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
prefix=$(cd "$1" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cc=${CC:-cc}

pcdirs=$(find "$prefix" -name magpool.pc -printf '%h:' 2>/dev/null || true)
if [[ -z $pcdirs ]]; then
  echo "pkgconfig.sh: no magpool.pc under $prefix" >&2
  exit 1
fi
export PKG_CONFIG_PATH="${pcdirs%:}${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

# The .pc file must describe this prefix, not some other install.
pc_prefix=$(pkg-config --variable=prefix magpool)
if [[ $(cd "$pc_prefix" 2>/dev/null && pwd) != "$prefix" ]]; then
  echo "pkgconfig.sh: magpool.pc says prefix=$pc_prefix, but it is installed under $prefix" >&2
  exit 1
fi
libdir=$(pkg-config --variable=libdir magpool)
echo "pkg-config magpool $(pkg-config --modversion magpool): libdir $libdir"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Shared: exactly what a user types.
echo "+ $cc main.c \$(pkg-config --cflags --libs magpool)"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Wextra -Werror "$here/main.c" \
  $(pkg-config --cflags --libs magpool) -o "$out/consumer_pc_shared"
# ldd's output first: `ldd | grep -q` under pipefail fails when grep's
# early exit kills ldd with SIGPIPE.
deps_shared=$(ldd "$out/consumer_pc_shared" || true)
if ! grep -q 'libmagpool\.so' <<<"$deps_shared"; then
  echo "pkgconfig.sh: the shared build does not link libmagpool.so" >&2
  exit 1
fi
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$out/consumer_pc_shared"

# Static: --static adds Libs.private.  With both libmagpool.so and
# libmagpool.a in libdir the linker would still pick the .so for -lmagpool,
# so ask for the archive by name (GNU ld's -l:FILE).
echo "+ $cc main.c \$(pkg-config --cflags --libs --static magpool)   [-lmagpool -> -l:libmagpool.a]"
flags=$(pkg-config --cflags --libs --static magpool)
flags=${flags//-lmagpool/-l:libmagpool.a}
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror "$here/main.c" $flags -o "$out/consumer_pc_static"
deps_static=$(ldd "$out/consumer_pc_static" || true)
if grep -q 'libmagpool' <<<"$deps_static"; then
  echo "pkgconfig.sh: the static build still needs libmagpool.so" >&2
  exit 1
fi
"$out/consumer_pc_static"
echo "pkgconfig.sh: shared and static consumers OK"
