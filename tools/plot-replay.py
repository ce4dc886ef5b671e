#!/usr/bin/env python3
"""plot-replay.py - plots the footprint magpool-replay --csv recorded.

    tools/plot-replay.py CSV... -o out.png [--trace NAME] [--pass P]
                         [--allocator A[,A...]] [--no-live] [--title TEXT]

Each CSV has the columns event,live_bytes,reserved_bytes,allocator,trace,
pass (magpool-replay --csv FILE writes them).  The figure has one panel per
trace x pass (after the selection flags), and in each panel one line per
allocator: its reserved bytes (GiB) over the event index.  The bytes the
trace had live are drawn once per panel as a dashed black line (its
peak_live is the same for every allocator that completed the pass), unless
--no-live is given.

Runs headless (matplotlib's Agg backend).  Exit status 2 for bad
arguments, 1 if nothing was left to plot.
"""
import argparse
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is set)

GIB = float(1 << 30)


def load(paths, traces, passes, allocators):
    """{(trace, pass): {allocator: ([event], [reserved]), '': live}}"""
    panels = {}
    for path in paths:
        with open(path, newline="") as f:
            rows = csv.DictReader(f)
            need = {"event", "live_bytes", "reserved_bytes", "allocator", "trace", "pass"}
            if rows.fieldnames is None or not need.issubset(rows.fieldnames):
                sys.exit(f"plot-replay: {path}: not a magpool-replay CSV (columns {sorted(need)})")
            for r in rows:
                trace, pas, alloc = r["trace"], int(r["pass"]), r["allocator"]
                if traces and trace not in traces:
                    continue
                if passes and pas not in passes:
                    continue
                if allocators and alloc not in allocators:
                    continue
                panel = panels.setdefault((trace, pas), {"lines": {}, "live": {}})
                ev = int(r["event"])
                xs, ys = panel["lines"].setdefault(alloc, ([], []))
                xs.append(ev)
                ys.append(int(r["reserved_bytes"]) / GIB)
                panel["live"][ev] = int(r["live_bytes"]) / GIB
    return panels


def main():
    ap = argparse.ArgumentParser(description="Plot magpool-replay --csv footprints.")
    ap.add_argument("csv", nargs="+", help="CSV files written by magpool-replay --csv")
    ap.add_argument("-o", "--output", required=True, help="the image to write (PNG, SVG, PDF)")
    ap.add_argument("--trace", action="append", default=[], help="only this trace (repeatable)")
    ap.add_argument("--pass", dest="passes", action="append", type=int, default=[],
                    help="only this pass (repeatable)")
    ap.add_argument("--allocator", default="",
                    help="only these allocators, comma-separated")
    ap.add_argument("--no-live", action="store_true", help="do not draw the live bytes")
    ap.add_argument("--title", default="", help="a title over the figure")
    a = ap.parse_args()

    allocators = {x for x in a.allocator.split(",") if x}
    panels = load(a.csv, set(a.trace), set(a.passes), allocators)
    if not panels:
        print("plot-replay: no rows left to plot", file=sys.stderr)
        return 1

    keys = sorted(panels)
    fig, axes = plt.subplots(len(keys), 1, figsize=(10, 3.2 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        panel = panels[key]
        for alloc in sorted(panel["lines"]):
            xs, ys = panel["lines"][alloc]
            ax.plot(xs, ys, label=f"{alloc} reserved", linewidth=1.2)
        if not a.no_live:
            ev = sorted(panel["live"])
            ax.plot(ev, [panel["live"][e] for e in ev], "k--", linewidth=0.8, label="live")
        ax.set_title(f"{key[0]}, pass {key[1]}")
        ax.set_xlabel("event")
        ax.set_ylabel("GiB")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
