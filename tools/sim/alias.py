# Moves that leave the old mapping in place (an "alias"), on the model of hwm.py (small-aware buddy tree,
# large runs, high-water budget with slack max(8 chunks, 1.5 % of H), victim 'hi').
#
# A physical chunk (handle) may be mapped at several chunk addresses; at most one of them is its *live*
# place (the allocator's MAPPED chunk), the others are *stale*: still mapped, never handed out.
#   - a chunk c that a block needs and that holds a stale mapping of a handle h whose live place is empty
#     is a *flip*: h's live place becomes stale and c live, with no driver call;
#   - otherwise c is created (budget allows) or moved to as in hwm.py, but a move maps the victim's handle
#     at c and leaves the victim's address mapped (stale): one map, no unmap;
#   - a stale mapping at c of some other handle is unmapped first (one unmap);
#   - aware=True: placement counts chunks with a flippable stale mapping as mapped.
# Counts per pass: creates, flips, maps (alias maps of moves), unmaps, against the plain model's moves
# (an unmap and a map each).  Usage: python3 alias.py TRACE...
import os
import sys
from collections import defaultdict
from sortedcontainers import SortedList

import hwm

CH, CHLOG = hwm.CH, hwm.CHLOG


def run(ev, passes=3, slack=(8, 0.015), alias=True, aware=False, max_stale=None):
    small = hwm.Buddy(0, 43)
    runs = hwm.Runs(1 << 22, 1 << 22)
    ref = defaultdict(int)
    live_of = {}                  # chunk -> handle (live places)
    stale = {}                    # chunk -> handle (stale mappings)
    places = defaultdict(set)     # handle -> stale places
    where = {}                    # handle -> live chunk
    empty = SortedList()          # live places with ref 0
    flippable = SortedList()      # stale chunks whose handle's live place is empty
    st = {'busy': 0, 'H': 0, 'next': 0}
    out = []
    peak_live = 0

    def limit():
        return hwm.budget(st['H'], slack)

    def set_empty(h, on):
        c = where[h]
        if on:
            empty.add(c)
        else:
            empty.remove(c)
        for s in places[h]:
            if on:
                flippable.add(s)
            else:
                flippable.remove(s)

    def drop_stale(c, cnt):
        g = stale.pop(c)
        places[g].discard(c)
        if where.get(g) is not None and where[g] in empty:
            flippable.remove(c)
        cnt['unmaps'] += 1

    def give(blk):
        t, off, k, n, s = blk
        t.give(off, k, n)
        for c in range(off >> CHLOG, ((off + n - 1) >> CHLOG) + 1):
            ref[c] -= 1
            if ref[c] == 0:
                st['busy'] -= 1
                set_empty(live_of[c], True)

    for p in range(passes):
        live = {}
        cur = 0
        cnt = dict(creates=0, flips=0, maps=0, unmaps=0, moves=0)
        peak_mapped = len(live_of)
        for is_a, aid, s, stream in ev:
            if is_a:
                n = max(s, hwm.MINB)
                k = max((n - 1).bit_length(), 6)
                if n >= CH:
                    t = runs
                    if aware:
                        sc = SortedList(list(empty) + list(flippable))
                    else:
                        sc = empty
                    off = t.alloc((n + CH - 1) >> CHLOG, sc) << CHLOG
                else:
                    t = small
                    off = hwm.take_small(t, k, empty, 1 << 22)
                c0, c1 = off >> CHLOG, (off + n - 1) >> CHLOG
                newb = [c for c in range(c0, c1 + 1) if ref[c] == 0]
                st['busy'] += len(newb)
                st['H'] = max(st['H'], st['busy'])
                for c in newb:
                    if c in live_of:
                        set_empty(live_of[c], False)
                for c in newb:
                    if c in live_of:
                        continue
                    if alias and c in stale and c in flippable:
                        h = stale[c]
                        set_empty(h, False)            # h's old live place: out of empty (and flippable)
                        del stale[c]
                        places[h].discard(c)
                        old = where[h]
                        del live_of[old]
                        stale[old] = h
                        places[h].add(old)
                        where[h] = c
                        live_of[c] = h
                        cnt['flips'] += 1
                        continue
                    if c in stale:
                        drop_stale(c, cnt)
                    if len(live_of) < limit() or not empty:
                        h = st['next']
                        st['next'] += 1
                        cnt['creates'] += 1
                    else:
                        v = empty[-1]
                        h = live_of.pop(v)
                        set_empty(h, False)
                        cnt['moves'] += 1
                        cnt['maps'] += 1
                        if alias:
                            stale[v] = h
                            places[h].add(v)
                        else:
                            cnt['unmaps'] += 1
                    where[h] = c
                    live_of[c] = h
                for c in range(c0, c1 + 1):
                    ref[c] += 1
                live[aid] = (t, off, k, n, s)
                cur += s
                peak_live = max(peak_live, cur)
                peak_mapped = max(peak_mapped, len(live_of))
            else:
                blk = live.pop(aid)
                cur -= blk[4]
                give(blk)
        for blk in list(live.values()):
            give(blk)
        out.append(dict(pass_=p + 1, fp=peak_mapped * CH / peak_live, stale=len(stale), **cnt))
    return out


if __name__ == '__main__':
    for path in sys.argv[1:]:
        ev = hwm.load(path)
        name = os.path.basename(path).split('.')[0]
        for label, kw in (('plain', dict(alias=False)), ('alias', dict(alias=True)),
                          ('alias+aware', dict(alias=True, aware=True))):
            for r in run(ev, **kw):
                print(f"| {label} | {name} | {r['pass_']} | {r['fp']:.3f} | {r['creates']} | {r['moves']} | "
                      f"{r['flips']} | {r['maps']} | {r['unmaps']} | {r['stale']} |", flush=True)
