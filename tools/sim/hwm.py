# Buddy over virtual addresses, physical memory in 2 MiB chunks, "high-water budget" mapping policy.
#
# H = high-water mark of busy chunks (chunks overlapped by a live block's requested bytes).
# An allocation that needs an unmapped chunk c creates a chunk while mapped < H + slack (H counts this
# allocation), else moves an empty mapped chunk (victim: hi, lo or near c) to c. Nothing else unmaps.
#
# Placement knobs:
#   small_aware: a block < 2 MiB that must split a free block >= 2 MiB takes the lowest mapped empty chunk
#                whose addresses are free (free blocks below 2 MiB always lie in busy chunks already).
#   large_aware: a block >= 2 MiB goes where most of its needed chunks are mapped and empty (all, if
#                possible); ties go to the lowest address; no mapped chunk usable: lowest address.
#   sep:         blocks < 2 MiB and >= 2 MiB come from two separate trees (two halves of the range).
#   per_stream:  each stream has its own tree (its own sub-range); chunks are shared.
# Counts per pass: creates, moves (each one chunk) and map runs (contiguous newly mapped chunks of one
# allocation: one cuMemSetAccess each). Footprint = peak mapped / peak live.
import gzip
from collections import defaultdict
from sortedcontainers import SortedList, SortedDict

CH = 2 << 20
CHLOG = 21
MINB = 64


class Buddy:
    def __init__(self, base, log):
        self.base, self.log = base, log
        self.free = [SortedList() for _ in range(log + 1)]
        self.free[log].add(base)

    def lowest(self, k):
        for j in range(k, self.log + 1):
            if self.free[j]:
                return j, self.free[j][0]
        raise MemoryError

    def take(self, j, off, k, at):
        """Remove free block (j, off); split it so that the order-k block at 'at' is returned."""
        self.free[j].remove(off)
        while j > k:
            j -= 1
            half = 1 << j
            if at >= off + half:
                self.free[j].add(off)
                off += half
            else:
                self.free[j].add(off + half)
        return off

    def holder(self, pos, k):
        """The free block of order >= k containing the order-k position pos, or None."""
        for j in range(k, self.log + 1):
            a = pos & ~((1 << j) - 1)
            if a in self.free[j]:
                return j, a
        return None

    def give(self, off, k, n):
        """Block (off, order k, n bytes) back (release)."""
        self.push(off, k)

    def push(self, off, k):
        while k < self.log:
            b = off ^ (1 << k)
            fl = self.free[k]
            if b in fl:
                fl.remove(b)
                off = min(off, b)
                k += 1
            else:
                break
        self.free[k].add(off)


class Runs:
    """Blocks >= 2 MiB as runs of whole chunks (no buddy alignment) in their own range of chunk numbers.
    Placement: the window of free chunks with the most mapped (empty) chunks; ties: the smallest free run,
    then the lowest address."""
    def __init__(self, base, n):
        self.runs = SortedDict({base: n})

    def alloc(self, m, empty):
        best = None
        for s, L in self.runs.items():
            if L < m:
                continue
            starts = {s}
            for e in empty.irange(s, s + L - 1):
                starts.add(min(e, s + L - m))
                starts.add(max(s, e - m + 1))
            for st in starts:
                sc = empty.bisect_left(st + m) - empty.bisect_left(st)
                key = (-sc, L, st)
                if best is None or key < best[0]:
                    best = (key, s, L, st)
        _, s, L, st = best
        return self.cut(s, L, st, m)

    def cut(self, s, L, st, m):
        """Takes [st, st + m) out of free run [s, s + L); returns st."""
        del self.runs[s]
        if st > s:
            self.runs[s] = st - s
        if st + m < s + L:
            self.runs[st + m] = s + L - st - m
        return st

    def give(self, off, k, n):
        """Block at byte offset off of n bytes back (release)."""
        self.free(off >> CHLOG, (n + CH - 1) >> CHLOG)

    def free(self, s, n):
        i = self.runs.bisect_left(s)
        if i < len(self.runs):
            ns = self.runs.keys()[i]
            if ns == s + n:
                n += self.runs.pop(ns)
        if i > 0:
            ps = self.runs.keys()[i - 1]
            if ps + self.runs[ps] == s:
                n += self.runs.pop(ps)
                s = ps
        self.runs[s] = n


def budget(H, slack, keep=0):
    """Chunks the pool may map at high-water mark H: slack is a count, a
    fraction of H (a float), or (count, fraction), the larger of the two;
    never below keep (pool_size)."""
    if isinstance(slack, tuple):
        return max(keep, H + max(slack[0], int(slack[1] * H)))
    return max(keep, H + (int(slack * H) if isinstance(slack, float) else slack))


def take_small(t, k, empty, top):
    """Small-aware placement in tree t for an order-k block: the lowest free block, unless that splits a
    free block of 2 MiB or more; then the lowest mapped empty chunk below chunk `top` whose addresses are
    free, if any (alias.py, units.py)."""
    j, off = t.lowest(k)
    if j > 20:
        for c in empty.irange(0, top - 1):
            hd = t.holder(c << CHLOG, CHLOG)
            if hd:
                return t.take(hd[0], hd[1], k, c << CHLOG)
    return t.take(j, off, k, off)


def load(path):
    ev = []
    for l in gzip.open(path, 'rt'):
        if l[0] == '#':
            continue
        p = l.split()
        if p[0] == 'a':
            ev.append((True, int(p[1]), int(p[2]), int(p[3])))
        else:
            ev.append((False, int(p[1]), 0, int(p[2])))
    return ev


def run(ev, slack=0, victim='hi', small_aware=False, large_aware=False, sep=False, per_stream=False, large_runs=False,
        passes=2, scan=512, run_min=CH, keep=0, keep_runs=False):
    """slack: int chunks, float (fraction of H), or (int, float): the larger of the two."""
    nstreams = max(e[3] for e in ev) + 1
    trees = {}

    def tree(stream, large):
        key = (stream if per_stream else 0, large if sep else False)
        t = trees.get(key)
        if t is None:
            log = 44
            base = 0
            if per_stream:
                log = 40
                base = key[0] << 41
            if sep:
                log -= 1
                base += (1 << log) if large else 0
            t = trees[key] = Buddy(base, log)
        return t

    runs_alloc = Runs(1 << 22, 1 << 22)   # chunks [2^22, 2^23): addresses [8 TiB, 16 TiB)
    runs_ps = {}
    if large_runs:
        sep = True

    ref = defaultdict(int)
    mapped = set()
    k0 = (1 << 22) if keep_runs else 0
    empty = SortedList(range(k0, k0 + keep))
    mapped.update(range(k0, k0 + keep))
    st = {'busy': 0, 'H': 0}

    def limit():
        return budget(st['H'], slack, keep)

    def pick_victim(c):
        if victim == 'hi':
            return empty[-1]
        if victim == 'lo':
            return empty[0]
        if victim == 'iso':   # an empty chunk with no empty neighbour (from the top), else the highest
            for i in range(len(empty) - 1, max(-1, len(empty) - 1 - scan), -1):
                x = empty[i]
                if (i == 0 or empty[i - 1] != x - 1) and (i == len(empty) - 1 or empty[i + 1] != x + 1):
                    return x
            return empty[-1]
        i = empty.bisect_left(c)
        cands = []
        if i < len(empty):
            cands.append(empty[i])
        if i > 0:
            cands.append(empty[i - 1])
        return min(cands, key=lambda x: abs(x - c))

    def place(t, k, n):
        if n < CH:
            if small_aware:
                j, off = t.lowest(k)
                if j <= 20:
                    return t.take(j, off, k, off)
                lo, hi = t.base >> CHLOG, (t.base + (1 << t.log)) >> CHLOG
                for i, c in enumerate(empty.irange(lo, hi - 1)):
                    if i >= scan:
                        break
                    h = t.holder(c << CHLOG, CHLOG)
                    if h:
                        return t.take(h[0], h[1], k, c << CHLOG)
            j, off = t.lowest(k)
            return t.take(j, off, k, off)
        if large_aware:
            lo, hi = t.base >> CHLOG, (t.base + (1 << t.log)) >> CHLOG
            need = (n + CH - 1) >> CHLOG
            mask = ~((1 << k) - 1)
            best = None
            seen = set()
            for i, c in enumerate(empty.irange(lo, hi - 1)):
                if i >= scan:
                    break
                pos = (c << CHLOG) & mask
                if pos in seen:
                    continue
                seen.add(pos)
                h = t.holder(pos, k)
                if not h:
                    continue
                c0 = pos >> CHLOG
                sc = empty.bisect_left(c0 + need) - empty.bisect_left(c0)
                if best is None or sc > best[0]:
                    best = (sc, pos, h)
                    if sc == need:
                        break
            if best:
                return t.take(best[2][0], best[2][1], k, best[1])
        j, off = t.lowest(k)
        return t.take(j, off, k, off)

    live_all = {}
    out = []
    peak_live = 0
    for p in range(passes):
        live = {}
        cur = 0
        creates = moves = runs = 0
        peak_mapped = len(mapped)
        for is_a, aid, s, stream in ev:
            if is_a:
                n = max(s, MINB)
                k = max((n - 1).bit_length(), 6)
                if large_runs and n >= run_min:
                    t = runs_alloc if not per_stream else runs_ps.setdefault(
                        stream, Runs((1 << 22) + (stream << 18), 1 << 18))
                    off = t.alloc((n + CH - 1) >> CHLOG, empty) << CHLOG
                else:
                    t = tree(stream, n >= CH)
                    off = place(t, k, n)
                c0, c1 = off >> CHLOG, (off + n - 1) >> CHLOG
                made, victims = take_chunks(c0, c1, ref, mapped, empty, st, limit, pick_victim)
                creates += len(made) - len(victims)
                moves += len(victims)
                runs += sum(1 for i, c in enumerate(made) if i == 0 or made[i - 1] != c - 1)
                live[aid] = (t, off, k, n, s)
                cur += s
                if cur > peak_live:
                    peak_live = cur
                if len(mapped) > peak_mapped:
                    peak_mapped = len(mapped)
            else:
                blk = live.pop(aid)
                cur -= blk[4]
                release(blk, ref, empty, st)
        for blk in live.values():
            release(blk, ref, empty, st)
        out.append(dict(pass_=p + 1, fp=peak_mapped * CH / peak_live, creates=creates, moves=moves,
                        runs=runs, events=len(ev), H=st['H'], mapped=len(mapped)))
    return out


def take_chunks(c0, c1, ref, mapped, empty, st, limit, pick_victim):
    """A block over chunks [c0, c1]: counts them busy (raising H), then maps those not mapped: creates
    while mapped < limit(), else moves the victim pick_victim(c) names.  Returns (the chunks mapped, in
    order; the victims unmapped for them)."""
    newb = [c for c in range(c0, c1 + 1) if ref[c] == 0]
    st['busy'] += len(newb)
    if st['busy'] > st['H']:
        st['H'] = st['busy']
    for c in newb:
        if c in mapped:
            empty.remove(c)
    made, victims = [], []
    for c in newb:
        if c in mapped:
            continue
        if not (len(mapped) < limit() or not empty):
            v = pick_victim(c)
            empty.remove(v)
            mapped.discard(v)
            victims.append(v)
        mapped.add(c)
        made.append(c)
    for c in range(c0, c1 + 1):
        ref[c] += 1
    return made, victims


def release(blk, ref, empty, st):
    t, off, k, n, s = blk
    t.give(off, k, n)
    for c in range(off >> CHLOG, ((off + n - 1) >> CHLOG) + 1):
        ref[c] -= 1
        if ref[c] == 0:
            empty.add(c)
            st['busy'] -= 1
