#!/usr/bin/env python3
"""cap-sweep.py - the smallest max_pool_size a trace completes under, and
whether every larger cap completes too.

    tools/cap-sweep.py REPLAY_BIN TRACE... [--kind host|device|pinned]
                       [--mode sync|async|both] [--passes N] [--step B]
                       [--above K] [--below K] [-j N]

For each TRACE x mode it runs REPLAY_BIN (magpool-replay), one process a
cap, each pass on a pool that starts at 64 MiB and grows up to the cap:

  1. one uncapped pass, for the trace's peak_live;
  2. a bisection over caps in multiples of --step (default 2 MiB, the
     default chunk) for the smallest one under which every pass completes;
  3. the check of magpool's promise that a bigger cap never fails where a
     smaller one succeeds, around that minimum: every multiple of the step
     from the minimum to K steps above it (--above, default 32), caps
     between two multiples, and the minimum x 1.1, 1.25, 1.5, 2 must
     complete every pass with peak_reserved at most the cap; none of the
     K caps below it (--below, default 8) may complete (the bisection
     found the one below the minimum failing).

Output, one line per trace x mode:
  CAPSWEEP trace=NAME mode=M peak_live=B min_cap=B min_ratio=R checked=N failed=N
and one line per cap that broke the promise:
  CAPFAIL trace=NAME mode=M cap=B why=TEXT
Exit status: 0, 1 if a cap broke the promise or a replay could not run,
2 for bad arguments.  Caps under the 64 MiB starting pool are not tried.
"""
import argparse
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

POOL = 64 << 20
FIELD = re.compile(r"(\w+)=(\S+)")


def parse_size(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text)
    if m is None:
        raise argparse.ArgumentTypeError("not a size: %s" % text)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


class Sweep:
    def __init__(self, args, trace, mode):
        self.a, self.trace, self.mode = args, trace, mode
        self.name = os.path.basename(trace).split(".")[0]

    def replay(self, cap, passes):
        """The REPLAY lines' fields of one process, or None if it failed."""
        cmd = [self.a.replay, self.trace, "--kind", self.a.kind, "--mode", self.mode,
               "--passes", str(passes)]
        if cap is not None:
            cmd += ["--cap", str(cap)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        lines = [dict(FIELD.findall(ln)) for ln in p.stdout.splitlines()
                 if ln.startswith("REPLAY ")]
        if p.returncode != 0 or len(lines) != passes:
            return None
        return lines

    def verdict(self, cap):
        """(completed every pass within the cap, why not)."""
        lines = self.replay(cap, self.a.passes)
        if lines is None:
            return False, "replay failed"
        for ln in lines:
            if ln["result"] != "completed":
                return False, "pass %s %s" % (ln["pass"], ln["result"])
            if int(ln["peak_reserved"]) > cap:
                return False, "pass %s peak_reserved %s over the cap" % (
                    ln["pass"], ln["peak_reserved"])
        return True, ""

    def run(self, pool):
        step = self.a.step
        first = self.replay(None, 1)
        if first is None:
            return None
        live = int(first[0]["peak_live"])
        floor = -(-POOL // step)  # the smallest cap tried: the starting pool
        # lo: a cap known to fail (under peak_live), or the floor's if none is
        lo = live // step if live % step else live // step - 1
        if lo < floor:
            if self.verdict(floor * step)[0]:
                lo = floor - 1
            else:
                lo = floor
        hi = max(lo + 1, live * 5 // 4 // step)
        while not self.verdict(hi * step)[0]:
            if hi * step > 64 * live:
                return {"live": live, "min": None, "checked": 0,
                        "fails": [(hi * step, "no cap up to 64x peak_live completes")]}
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.verdict(mid * step)[0]:
                hi = mid
            else:
                lo = mid
        good = [k * step for k in range(hi, hi + self.a.above + 1)]
        good += [k * step + step // 2 + 4097 for k in range(hi, hi + self.a.above + 1, 4)]
        good += [int(hi * step * f) for f in (1.1, 1.25, 1.5, 2.0)]
        bad = [k * step for k in range(max(hi - self.a.below, floor), hi)]
        got = list(pool.map(self.verdict, good + bad))
        fails = [(c, why) for c, (ok, why) in zip(good, got[:len(good)]) if not ok]
        fails += [(c, "completes below the smallest cap found (bisection broken)")
                  for c, (ok, _) in zip(bad, got[len(good):]) if ok]
        return {"live": live, "min": hi * step, "checked": len(good) + len(bad), "fails": fails}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("replay")
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--kind", default="host", choices=["host", "device", "pinned"])
    ap.add_argument("--mode", default="both", choices=["sync", "async", "both"])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--step", type=parse_size, default=2 << 20)
    ap.add_argument("--above", type=int, default=32)
    ap.add_argument("--below", type=int, default=8)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    try:
        a = ap.parse_args()
    except SystemExit as e:
        sys.exit(2 if e.code else 0)
    if a.passes < 1 or a.step < 4096 or a.above < 0 or a.below < 0 or a.jobs < 1:
        ap.print_usage(sys.stderr)
        sys.exit(2)
    if not os.access(a.replay, os.X_OK):
        print("cap-sweep.py: %s is not an executable magpool-replay" % a.replay, file=sys.stderr)
        sys.exit(2)
    modes = ["sync", "async"] if a.mode == "both" else [a.mode]
    rc = 0
    with ThreadPoolExecutor(a.jobs) as pool:
        for t in a.traces:
            for m in modes:
                s = Sweep(a, t, m)
                r = s.run(pool)
                if r is None:
                    print("CAPFAIL trace=%s mode=%s cap=0 why=the uncapped replay failed"
                          % (s.name, m))
                    rc = 1
                    continue
                ratio = "%.4f" % (r["min"] / r["live"]) if r["min"] else "none"
                print("CAPSWEEP trace=%s mode=%s peak_live=%d min_cap=%d min_ratio=%s checked=%d "
                      "failed=%d" % (s.name, m, r["live"], r["min"] or 0, ratio, r["checked"],
                                     len(r["fails"])))
                for cap, why in r["fails"]:
                    print("CAPFAIL trace=%s mode=%s cap=%d why=%s" % (s.name, m, cap, why))
                    rc = 1
                sys.stdout.flush()
    sys.exit(rc)


if __name__ == "__main__":
    main()
