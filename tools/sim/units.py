# Runs in units below a chunk: blocks that share their end chunks, on the model of hwm.py (small-aware
# buddy tree for blocks below `run_min`, high-water budget with slack max(8 chunks, 1.5 % of H), victim
# 'hi').
#
# magpool's runs are whole chunks: a block of 2.25 MiB takes two chunks, and the 1.75 MiB left of its
# last chunk serves nobody.  Here a run is `unit` bytes a unit (unit = CH: magpool's runs), so one chunk
# may hold the end of one block and the start of the next, and a chunk is busy while any block overlaps it
# (as in magpool's tree).  Placement, among the free runs of at least m units: the window that needs the
# fewest chunks mapped (neither busy nor mapped and empty), then the one that shares most busy chunks, then
# the shorter run, then the lower address; candidate windows start at a run's start, end at its end, or
# start or end on a chunk boundary.  Counts per pass: creates and moves (chunks).
# Usage: python3 units.py [--unit K ...] TRACE...   (K in KiB; default 2048 and 256)
import argparse
import os
from collections import defaultdict
from sortedcontainers import SortedList

import hwm

CH, CHLOG = hwm.CH, hwm.CHLOG


class URuns(hwm.Runs):
    """Free runs of `unit` bytes a unit, from unit `base` on (hwm.Runs' list and free; its own
    placement).  A run block's k is its length in units."""
    def __init__(self, base, n, unit):
        super().__init__(base, n)
        self.unit = unit

    def give(self, off, k, n):
        self.free(off // self.unit, k)

    def alloc(self, m, upc, cost, mapped, fit=False):
        """cost(a, m) -> (chunks to map, -busy chunks shared): lower is better.  mapped: SortedList of
        the mapped chunks (busy ones included): windows start or end at their rows' edges."""
        best = None
        for s, L in self.runs.items():
            if L < m:
                continue
            starts = {s, s + L - m}
            c_first, c_last = s // upc, (s + L - 1) // upc
            if L > m:
                for c in mapped.irange(c_first, c_last):
                    for st in (c * upc, c * upc - m, (c + 1) * upc, (c + 1) * upc - m):
                        if s <= st <= s + L - m:
                            starts.add(st)
            for st in starts:
                need, sh = cost(st, m)
                key = (need, L, sh, st) if fit else (need, sh, L, st)
                if best is None or key < best[0]:
                    best = (key, s, L, st)
            if best is not None and best[0][0] == 0 and best[0][1 if fit else 2] == m:
                break
        _, s, L, st = best
        return self.cut(s, L, st, m)


def run(ev, unit=CH, passes=3, slack=(8, 0.015), run_min=CH, fit=False):
    upc = CH // unit
    small = hwm.Buddy(0, 43)
    RB = 1 << 22                       # run space: chunks [2^22, 2^23)
    runs = URuns(RB * upc, (1 << 22) * upc, unit)
    ref = defaultdict(int)
    mapped = set()
    msl = SortedList()               # mapped, sorted
    empty = SortedList()
    st = {'busy': 0, 'H': 0}
    out = []
    peak_live = 0

    def limit():
        return hwm.budget(st['H'], slack)

    def cost(a, m):
        c0, c1 = a // upc, (a + m - 1) // upc
        need = shared = 0
        for c in range(c0, c1 + 1):
            if ref[c] > 0:
                shared += 1
            elif c not in mapped:
                need += 1
        return (need, -shared)

    for p in range(passes):
        live = {}
        cur = 0
        creates = moves = 0
        peak_mapped = len(mapped)
        for is_a, aid, s, stream in ev:
            if is_a:
                n = max(s, hwm.MINB)
                if n >= run_min:
                    mu = (n + unit - 1) // unit
                    a = runs.alloc(mu, upc, cost, msl, fit)
                    off, t, k = a * unit, runs, mu
                else:
                    t = small
                    k = max((n - 1).bit_length(), 6)
                    off = hwm.take_small(t, k, empty, RB)
                c0, c1 = off >> CHLOG, (off + n - 1) >> CHLOG
                made, victims = hwm.take_chunks(c0, c1, ref, mapped, empty, st, limit,
                                                lambda c: empty[-1])
                creates += len(made) - len(victims)
                moves += len(victims)
                for v in victims:
                    msl.remove(v)
                for c in made:
                    msl.add(c)
                live[aid] = (t, off, k, n, s)
                cur += s
                peak_live = max(peak_live, cur)
                peak_mapped = max(peak_mapped, len(mapped))
            else:
                blk = live.pop(aid)
                cur -= blk[4]
                hwm.release(blk, ref, empty, st)
        for blk in list(live.values()):
            hwm.release(blk, ref, empty, st)
        out.append(dict(pass_=p + 1, fp=peak_mapped * CH / peak_live, creates=creates, moves=moves,
                        mapped=len(mapped), H=st['H']))
    return out


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--unit', type=int, action='append', help='KiB')
    ap.add_argument('--run-min', type=int, default=2048, help='KiB: blocks at least this big are runs')
    ap.add_argument('--passes', type=int, default=3)
    ap.add_argument('--fit', action='store_true', help='ties: the shortest free run before sharing')
    ap.add_argument('--slack', type=float, default=0.015, help='fraction of H (at least 8 chunks)')
    ap.add_argument('traces', nargs='+')
    a = ap.parse_args()
    for path in a.traces:
        ev = hwm.load(path)
        name = os.path.basename(path).split('.')[0]
        for u in a.unit or [2048, 256]:
            for r in run(ev, unit=u << 10, passes=a.passes, run_min=a.run_min << 10, slack=(8, a.slack), fit=a.fit):
                print(f"| {u} KiB{' fit' if a.fit else ''} | {a.run_min} KiB | {a.slack:g} | {name} | {r['pass_']} | {r['fp']:.3f} | {r['creates']} | "
                      f"{r['moves']} |", flush=True)
