#!/usr/bin/env python3
"""lag.py - the footprint a stream-ordered allocator could reach when the
streams run behind the host (magpool-replay --lag N), as a floor to
measure magpool's --lag footprints against.

The model: one address range, first-fit by lowest address among the free
extents a request may use, extents split on allocation and joined with
free neighbours of the same standing.  Sizes are the trace's (a 0-byte
request counts as 1 byte); no chunks, no rounding, no caches.
A free on stream S at event i is:
  - at once free for later allocations on S (stream order: S's later
    work runs after its earlier work);
  - free for every stream from event i + lag on (S has passed it).
Footprint = highest address ever used / peak live bytes.  With lag 0
every free is free for all at once: the best a single heap can do.

    python3 tools/sim/lag.py [--lag N ...] TRACE...

prints one line per trace and lag:
    LAG trace=NAME lag=N footprint=R
magpool-replay --lag N holds a stream N to 2N events behind (or 2 ms);
compare with this model's 2N.
"""
import argparse
import bisect
import gzip
import os
import sys


def load(path):
    op = gzip.open if path.endswith(".gz") else open
    ev = []
    with op(path, "rt") as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            p = line.split()
            if p[0] == "a":  # a 0-byte request still takes an address
                ev.append(("a", int(p[1]), max(int(p[2]), 1), int(p[3])))
            else:
                ev.append(("f", int(p[1]), None, int(p[2])))
    return ev


class Heap:
    """Free extents keyed by start: start -> [length, owner, until].
    owner None: free for all.  Else free for `owner` only until event
    `until`, then for all."""

    def __init__(self):
        self.starts = []
        self.ext = {}
        self.top = 0

    def _insert(self, s, n, owner, until):
        bisect.insort(self.starts, s)
        self.ext[s] = [n, owner, until]

    def _remove(self, s):
        self.starts.pop(bisect.bisect_left(self.starts, s))
        return self.ext.pop(s)

    def settle(self, now):
        """Extents whose fence has passed become free for all, and join
        free-for-all neighbours."""
        for s in list(self.starts):
            e = self.ext.get(s)
            if e is not None and e[1] is not None and e[2] <= now:
                e[1] = None
        self._join_all()

    def _join_all(self):
        out, ext = [], {}
        for s in self.starts:
            n, o, u = self.ext[s]
            if out:
                ps = out[-1]
                pn, po, pu = ext[ps]
                if ps + pn == s and po == o:
                    ext[ps] = [pn + n, po, max(pu, u)]
                    continue
            out.append(s)
            ext[s] = [n, o, u]
        self.starts, self.ext = out, ext

    def alloc(self, size, stream):
        for s in self.starts:
            n, o, u = self.ext[s]
            if n >= size and (o is None or o == stream):
                self._remove(s)
                if n > size:
                    self._insert(s + size, n - size, o, u)
                return s
        # Grow at the top; a free extent ending at the top that this
        # stream may use is extended rather than left behind.
        if self.starts:
            ls = self.starts[-1]
            ln, lo, lu = self.ext[ls]
            if ls + ln == self.top and (lo is None or lo == stream):
                self._remove(ls)
                self.top = ls + size
                return ls
        s = self.top
        self.top += size
        return s

    def free(self, s, size, stream, until):
        owner = None if until is None else stream
        self._insert(s, size, owner, until if until is not None else 0)
        i = bisect.bisect_left(self.starts, s)
        # Join with neighbours of the same standing.
        if i + 1 < len(self.starts):
            ns = self.starts[i + 1]
            nn, no, nu = self.ext[ns]
            if s + size == ns and no == owner:
                self._remove(ns)
                self.ext[s] = [size + nn, owner, max(self.ext[s][2], nu)]
        if i > 0:
            ps = self.starts[i - 1]
            pn, po, pu = self.ext[ps]
            if ps + pn == s and po == owner:
                cur = self._remove(s)
                self.ext[ps] = [pn + cur[0], po, max(pu, cur[2])]


def run(ev, lag):
    h = Heap()
    where, size = {}, {}
    live = peak = 0
    pending = []  # fence times, to settle lazily
    for i, (k, ident, sz, st) in enumerate(ev):
        if pending and pending[0] <= i:
            while pending and pending[0] <= i:
                pending.pop(0)
            h.settle(i)
        if k == "a":
            where[ident] = h.alloc(sz, st)
            size[ident] = sz
            live += sz
            peak = max(peak, live)
        elif ident in where:
            until = None if lag == 0 else i + lag
            h.free(where.pop(ident), size[ident], st, until)
            live -= size.pop(ident)
            if until is not None:
                pending.append(until)
    return h.top / peak if peak else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lag", type=int, action="append")
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    lags = a.lag or [0, 200, 2000]
    for t in a.traces:
        ev = load(t)
        name = os.path.basename(t).split(".")[0]
        for lag in lags:
            print("LAG trace=%s lag=%d footprint=%.3f" % (name, lag, run(ev, lag)))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
