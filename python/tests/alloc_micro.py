#!/usr/bin/env python3
"""alloc_micro.py - what a tensor's allocation and free cost through
PyTorch, with PyTorch's own CUDA caching allocator and with magpool behind
CUDAPluggableAllocator: the whole path a program pays (the dispatcher,
the allocator interface and the allocator), not magpool's entry points
alone (gpt2_parity.py --magpool-conf timing=1 times those).

    alloc_micro.py [--sizes 512,65536,4194304,67108864] [--iters N]
                   [--keep K] [--rounds R] [--cpus 2] [--magpool-conf "K=V,...;..."]

Each allocator runs in its own process (PyTorch's allocator must be
chosen before the first CUDA allocation), R rounds, alternating.  Per
size: a warm-up of N/10, then N times
    ring[i % K] = torch.empty(size, dtype=torch.uint8, device="cuda")
on the current stream, timed with time.perf_counter_ns around the loop:
each step allocates one tensor and frees the one allocated K steps
before (K tensors live, so the allocator does not hand the same block
back every time).  --magpool-conf lists magpool configurations (';'
between them), each its own allocator; with "timing=1" the child also
reports magpool's entry points' share (two clock reads a call more).
Output, per allocator, size and round:
    MICRO allocator=A size=B round=R ns_per_pair=X [entry_ns_per_pair=Y]
then per allocator and size the median round:
    SUMMARY micro allocator=A size=B ns_per_pair=X
No timing is asserted.  Exit 77 (skipped) without PyTorch and a GPU.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch_gpu


def child(args):
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    import torch
    if args.allocator == "magpool":
        import magpool_torch as mt
        conf = dict(kv.split("=", 1) for kv in args.conf.split(",") if kv)
        mt.enable(**conf)
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    out = {}
    for size in [int(s) for s in args.sizes.split(",")]:
        ring = [None] * args.keep
        for i in range(max(args.iters // 10, args.keep)):  # warm-up: the pool's blocks
            ring[i % args.keep] = torch.empty(size, dtype=torch.uint8, device=dev)
        torch.cuda.synchronize(dev)
        st0 = mt.memory_stats(dev) if args.allocator == "magpool" else None
        t0 = time.perf_counter_ns()
        for i in range(args.iters):
            ring[i % args.keep] = torch.empty(size, dtype=torch.uint8, device=dev)
        t1 = time.perf_counter_ns()
        res = {"ns_per_pair": (t1 - t0) / args.iters}
        if st0 is not None:
            st1 = mt.memory_stats(dev)
            ns = (st1["magpool.alloc_ns"] - st0["magpool.alloc_ns"] +
                  st1["magpool.free_ns"] - st0["magpool.free_ns"])
            if ns > 0:
                res["entry_ns_per_pair"] = ns / args.iters
        del ring
        torch.cuda.synchronize(dev)
        out[str(size)] = res
    with open(args.out, "w") as f:
        json.dump(out, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="512,65536,4194304,67108864")
    ap.add_argument("--iters", type=int, default=200000)
    ap.add_argument("--keep", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpus", default="")
    ap.add_argument("--magpool-conf", dest="magpool_conf", default="")
    ap.add_argument("--out", default="/tmp/alloc_micro")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--allocator", default="torch", help=argparse.SUPPRESS)
    ap.add_argument("--conf", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.iters < 1 or args.keep < 1 or args.rounds < 1:
        ap.error("--iters, --keep and --rounds must be at least 1")
    if args.child:
        child(args)
        return
    torch_gpu.require("alloc_micro")
    os.makedirs(args.out, exist_ok=True)
    confs = args.magpool_conf.split(";")
    labels = [("torch", "")] + [("magpool", c) for c in confs]
    names = ["torch"] + ["magpool" + ("[%s]" % c if c else "") for c in confs]
    got = {n: [] for n in names}
    for r in range(args.rounds):
        for (alloc, conf), name in zip(labels, names):
            path = os.path.join(args.out, "%s_%d.json" % (name.replace("=", "-"), r))
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--allocator", alloc,
                   "--conf", conf, "--sizes", args.sizes, "--iters", str(args.iters),
                   "--keep", str(args.keep), "--cpus", args.cpus, "--out", path]
            if subprocess.run(cmd).returncode != 0:
                print("alloc_micro: the %s run failed" % name)
                sys.exit(1)
            res = json.load(open(path))
            got[name].append(res)
            for size, v in res.items():
                extra = (" entry_ns_per_pair=%.1f" % v["entry_ns_per_pair"]
                         if "entry_ns_per_pair" in v else "")
                print("MICRO allocator=%s size=%s round=%d ns_per_pair=%.1f%s" % (
                    name, size, r + 1, v["ns_per_pair"], extra), flush=True)
    for name in names:
        for size in got[name][0]:
            med = statistics.median(x[size]["ns_per_pair"] for x in got[name])
            print("SUMMARY micro allocator=%s size=%s ns_per_pair=%.1f" % (name, size, med))


if __name__ == "__main__":
    main()
