#!/usr/bin/env bash
# tools/check-layers.sh - check that magpool's objects call down the layers
# only, and two rules on the sources in src/.
#
#   tools/check-layers.sh [ARCHIVE | BUILD_DIR] [--src DIR] [--table FILE]
#
# ARCHIVE is the static library (default: $BUILD_DIR/libmagpool.a, BUILD_DIR
# defaulting to build); a build directory stands for the libmagpool.a in
# it.  --src names the source folder (default: src/ of this repository).
# --table reads "file layer" lines from FILE instead of the table below
# (to try the check on another archive).
#
# Objects: every member of the archive is a file of the table below, named
# by its source (tree.c.o and tree.o are both tree.c).  For each object,
# `nm` lists the symbols it defines (T, D, B, R, W, V, ..., TLS included)
# and the ones it needs (`nm -u`); a needed symbol that another object
# defines is an edge A -> B.  FAIL on:
#   - an object that the table does not name, or a table entry with no
#     object (the table stays complete);
#   - an edge to a higher layer:
#       UPWARD: a.c (layer N) -> b.c (layer M): sym1 sym2
#   - a cycle in the object graph, within one layer too:
#       CYCLE: a.c -> b.c -> a.c
#   - a file in src/ (.c or .h) over MAX_LINES lines;
#   - atomic_*_explicit, atomic_thread_fence, atomic_signal_fence or
#     atomic_init anywhere in src/ but src/atomic.h (as whole words: the
#     mp_atomic_init wrapper is fine).
# PASS prints the edges of each file and a one-line summary.  Exit status:
# 0 pass, 1 fail, 2 usage error (no archive, no nm).
#
# Needs bash, binutils (nm) and awk.
set -euo pipefail

# ---------------------------------------------------------------- table --
# file layer: a file may call files of its own layer (without a cycle) and
# of lower layers.  Headers are not listed: the check is on objects.
LAYERS='
errors.c        0   base: error codes, last-error slots, test hooks,
hook.c          0   the asymmetric barrier, the revoke handshake
asym.c          0
revoke.c        0
config_parse.c  0   MAGPOOL_CONF parser, trace recorder
trace.c         0

source_host.c   1   memory sources and ordering
source_fail.c   1
source_cuda.c   1
source_vmm.c    1
stream_host.c   1
stream_cuda.c   1

tree.c          2   tree, regions, block header, magazine objects
tree_query.c    2
region.c        2
chunk.c         2
chunk_check.c   2
chunk_unmap.c   2
extent.c        2
runs.c          2
runs_fence.c    2
mag.c           2

retire.c        3   retire: batches, stream callback, ready list

stream_table.c  4   caches and the thread record
stream_cache.c  4
park.c          4
park_take.c     4
magazine.c      4
xcache.c        4
thread.c        4

alloc.c         5   the API
alloc_async.c   5
pool.c          5
stats.c         5
scope.c         5
track.c         5
'
MAX_LINES=500
ATOMICS_HOME=atomic.h   # the one file in src/ that may spell the atomics out

# ------------------------------------------------------------ arguments --
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$root/src
target=
table_file=
while [[ $# -gt 0 ]]; do
  case $1 in
    --src) src=${2:?--src needs a folder}; shift 2 ;;
    --table) table_file=${2:?--table needs a file}; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "check-layers.sh: unknown option $1" >&2; exit 2 ;;
    *) target=$1; shift ;;
  esac
done
target=${target:-${BUILD_DIR:-build}}
if [[ -d $target ]]; then
  if [[ -f $target/libmagpool.a ]]; then
    target=$target/libmagpool.a
  else
    found=$(find "$target" -name libmagpool.a -type f -print -quit)
    [[ -n $found ]] || { echo "check-layers.sh: no libmagpool.a under $target" >&2; exit 2; }
    target=$found
  fi
fi
[[ -f $target ]] || { echo "check-layers.sh: no archive $target (build first)" >&2; exit 2; }
command -v nm >/dev/null || { echo "check-layers.sh: nm not found (binutils)" >&2; exit 2; }
echo "check-layers: $target"

work=$(mktemp -d "${TMPDIR:-/tmp}/check-layers.XXXXXX")
trap 'rm -rf "$work"' EXIT

# ------------------------------------------------------ symbols -> edges --
# Member names become source names: tree.c.o -> tree.c, tree.o -> tree.c.
srcname='function srcname(m) { sub(/\.o$/, "", m); if (m !~ /\.c$/) m = m ".c"; return m }'
# nm -A on an archive starts each line with ARCHIVE:MEMBER:; this prints
# "file rest-of-line" instead.
member_lines() { # nm options...
  nm -A "$@" "$target" 2>/dev/null | awk -v a="$target:" "$srcname"'
    index($0, a) == 1 { $0 = substr($0, length(a) + 1) }
    { i = index($0, ":"); print srcname(substr($0, 1, i - 1)), substr($0, i + 1) }'
}
# defs: "file symbol" for every external symbol an object defines.
# uses: "file symbol" for every symbol an object needs.
member_lines -g --defined-only |
  awk 'NF >= 3 && $(NF - 1) ~ /^[ABCDGIRSTVWiu]$/ { print $1, $NF }' | sort -u >"$work/defs"
member_lines -u | awk 'NF >= 2 { print $1, $NF }' | sort -u >"$work/uses"
ar t "$target" | awk "$srcname"'{ print srcname($0) }' | sort -u >"$work/objects"
[[ -s $work/objects ]] || { echo "check-layers.sh: $target has no objects" >&2; exit 2; }

if [[ -n $table_file ]]; then cat -- "$table_file"; else printf '%s\n' "$LAYERS"; fi | awk 'NF >= 2 && $1 !~ /^#/ { print $1, $2 }' >"$work/table"

# One awk program judges the graph: table, definitions, uses, objects.
set +e
awk -v T="$work/table" -v D="$work/defs" -v U="$work/uses" -v O="$work/objects" '
  BEGIN {
    while ((getline l < T) > 0) { split(l, f, " "); layer[f[1]] = f[2] + 0; order[++ntab] = f[1] }
    while ((getline l < O) > 0) { obj[l] = 1; objs[++nobj] = l }
    while ((getline l < D) > 0) {
      split(l, f, " ")
      if (!(f[2] in owner)) owner[f[2]] = f[1]
    }
    while ((getline l < U) > 0) {
      split(l, f, " ")
      if (!(f[2] in owner) || owner[f[2]] == f[1]) continue
      e = f[1] SUBSEP owner[f[2]]
      if (!(e in syms)) { nout[f[1]]++; out[f[1], nout[f[1]]] = owner[f[2]]; nedges++ }
      syms[e] = syms[e] " " f[2]
    }
    bad = 0
    for (i = 1; i <= nobj; i++)
      if (!(objs[i] in layer)) { print "NOT IN TABLE: " objs[i] " (an object with no layer)"; bad++ }
    for (i = 1; i <= ntab; i++)
      if (!(order[i] in obj)) { print "NO OBJECT: " order[i] " (a table entry the archive lacks)"; bad++ }

    # Edges, in table order, then the objects the table lacks.
    for (i = 1; i <= ntab; i++) if (order[i] in obj) list[++n] = order[i]
    for (i = 1; i <= nobj; i++) if (!(objs[i] in layer)) list[++n] = objs[i]
    for (i = 1; i <= n; i++) {
      a = list[i]
      for (j = 1; j <= nout[a]; j++) {
        b = out[a, j]
        if ((a in layer) && (b in layer) && layer[b] > layer[a]) {
          print "UPWARD: " a " (layer " layer[a] ") -> " b " (layer " layer[b] "):" syms[a, b]
          bad++
        }
      }
    }

    # Cycles: depth-first search; a back edge closes the cycle on the stack.
    for (i = 1; i <= n; i++) if (!(list[i] in color)) dfs(list[i])

    if (bad) { print "check-layers: " bad " problem(s) in the object graph"; exit 1 }
    for (i = 1; i <= n; i++) {
      a = list[i]
      line = a " (layer " layer[a] ")"
      if (nout[a] == 0) { print line ": calls no other object"; continue }
      print line ":"
      for (j = 1; j <= nout[a]; j++) { b = out[a, j]; print "  -> " b " (layer " layer[b] "):" syms[a, b] }
    }
    printf "check-layers: %d objects, %d edges, all down the layers, no cycle\n", n, nedges
  }
  function dfs(a,   j, b, k, cyc) {
    color[a] = 1; stack[++depth] = a
    for (j = 1; j <= nout[a]; j++) {
      b = out[a, j]
      if ((b in color) && color[b] == 1) {
        cyc = b
        for (k = depth; k >= 1 && stack[k] != b; k--) ;
        for (k = k + 1; k <= depth; k++) cyc = cyc " -> " stack[k]
        print "CYCLE: " cyc " -> " b
        bad++
      } else if (!(b in color)) dfs(b)
    }
    depth--; color[a] = 2
  }'
graph_rc=$?
set -e

# ---------------------------------------------------------- the sources --
src_rc=0
if [[ -d $src ]]; then
  nsrc=0
  while IFS= read -r f; do
    nsrc=$((nsrc + 1))
    n=$(wc -l <"$f")
    if ((n > MAX_LINES)); then
      echo "TOO LONG: ${f#"$root"/} has $n lines (at most $MAX_LINES)"
      src_rc=1
    fi
    [[ ${f##*/} == "$ATOMICS_HOME" && ${f%/*} == "${src%/}" ]] && continue
    if grep -nE '\batomic_[a-z_]*_explicit|\batomic_thread_fence|\batomic_signal_fence|\batomic_init\b' "$f" >"$work/atomics"; then
      sed "s|^|ATOMICS OUTSIDE $ATOMICS_HOME: ${f#"$root"/}:|" "$work/atomics" | head -n 5
      n=$(wc -l <"$work/atomics")
      ((n <= 5)) || echo "ATOMICS OUTSIDE $ATOMICS_HOME: ${f#"$root"/}: ... $((n - 5)) more"
      src_rc=1
    fi
  done < <(find "$src" -type f \( -name '*.c' -o -name '*.h' \) | sort)
  if ((src_rc == 0)); then
    echo "check-layers: ${src#"$root"/}: $nsrc .c/.h files, none over $MAX_LINES lines, atomics only in $ATOMICS_HOME"
  fi
else
  echo "check-layers: no source folder $src" >&2
  src_rc=1
fi

if ((graph_rc != 0 || src_rc != 0)); then
  echo "check-layers: FAIL"
  exit 1
fi
echo "check-layers: PASS"
