#!/usr/bin/env python3
"""synth-trace.py - a synthetic allocation trace of many streams, in the
format of the shared traces (`a ID SIZE STREAM` / `f ID STREAM`), for
replaying what no recorded trace has: a program that allocates on dozens
of streams, as a server with a stream per request slot does.

    python3 tools/synth-trace.py --streams N [--events E] [--seed S] OUT.trace.gz

The model: one thread; each event frees a random live allocation (with
probability 1/2, or when 2,000 are live) or allocates on a random stream.
Sizes are drawn evenly from 512 B, 4 KiB, 64 KiB, 1 MiB, 3 MiB, 17 MiB
and a size uniform in [1 B, 64 MiB).  A free names the allocation's own
stream, or (one in ten) another one.  The same seed gives the same trace.
docs/benchmarks.md (2026-12-02, "many streams") used --streams 4, 16 and
64 with the default events, seeds 7, 5 and 1.
"""
import argparse
import gzip
import random

SIZES = [512, 4096, 65536, 1 << 20, 3 << 20, 17 << 20]


def events(streams, n, seed):
    r = random.Random(seed)
    live = {}
    nid = 0
    for _ in range(n):
        if live and (r.random() < 0.5 or len(live) > 2000):
            k = r.choice(list(live))
            s = live.pop(k)
            yield "f %d %d" % (k, r.randrange(streams) if r.random() < 0.1 else s)
        else:
            s = r.randrange(streams)
            size = r.choice(SIZES + [r.randrange(1, 64 << 20)])
            yield "a %d %d %d" % (nid, size, s)
            live[nid] = s
            nid += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--streams", type=int, required=True)
    ap.add_argument("--events", type=int, default=40000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    with gzip.open(a.out, "wt") as f:
        f.write("# synth-trace.py --streams %d --events %d --seed %d\n"
                % (a.streams, a.events, a.seed))
        f.write("# a ID SIZE STREAM | f ID STREAM\n")
        for e in events(a.streams, a.events, a.seed):
            f.write(e + "\n")


if __name__ == "__main__":
    main()
