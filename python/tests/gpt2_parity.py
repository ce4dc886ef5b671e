#!/usr/bin/env python3
"""gpt2_parity.py - GPT-2 training with magpool as PyTorch's allocator must
give bit-identical losses to PyTorch's own allocator.

The model: GPT-2 from a transformers config (no download), 6 layers,
random init, fixed seeds, batch 8 x 512 random tokens, bf16 autocast,
AdamW, 30 steps, torch.use_deterministic_algorithms(True),
CUBLAS_WORKSPACE_CONFIG=:4096:8, attention on its math kernels (eager
attention; flash, memory-efficient and cuDNN SDPA off).  Every step also
works on a side stream: it copies the next batch to the GPU and computes
the gradient norm there, with the stream synchronisation a pluggable
allocator needs (no record_stream: see magpool_torch's docstring).

    gpt2_parity.py --compare [--repeat N] [--out DIR] [--magpool-conf "K=V,...;K=V,..."]
        runs each allocator in its own process (the allocator must be
        chosen before any CUDA allocation), N rounds, odd rounds in the
        reverse order; compares the losses bit for bit and prints peak
        reserved and mean step time (steps after --warmup) of each, and a
        ROUNDS line per magpool configuration: each round's step time
        against PyTorch's in the same round (mean and median steps, in
        percent), the median over the rounds, and each round's mean host
        time a step until the step's work is queued (before the loss is
        read), PyTorch's / this one's; --magpool-conf lists magpool
        configurations (';' between them), each run as its own allocator
        ("timing=1" also times magpool's entry points); --cpus 2-5 runs
        every child on those CPUs only.
        Exit 1 if the losses differ.
    gpt2_parity.py --compare --ddp --nproc 2 [--backend nccl|gloo] [--one-gpu]
        the same with torchrun and DistributedDataParallel over NCCL, one
        pool per device; each rank's losses must match the same rank's on
        PyTorch's allocator.  --one-gpu puts every rank on device 0 (one
        pool per process there), which NCCL refuses: use it with
        --backend gloo, whose all-reduce takes CUDA tensors, where a
        machine has one GPU.
    gpt2_parity.py --child --allocator torch|magpool [--ddp] --out FILE
        one run (what --compare starts).
Exit 77 when PyTorch with CUDA or transformers is missing (skipped)."""
import argparse
import json
import os
import subprocess
import sys
import time

import torch_gpu

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


def cpu_list(text):
    """"2-5,8" -> {2, 3, 4, 5, 8}."""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def child(args):
    if args.cpus:  # every allocator's run on the same CPUs (docs/benchmarks.md: migration)
        os.sched_setaffinity(0, cpu_list(args.cpus))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    for k, v in NO_MULTICAST.items():
        os.environ.setdefault(k, v)
    import torch
    if args.allocator == "magpool":
        import magpool_torch as mt
        conf = dict(kv.split("=", 1) for kv in args.magpool_conf.split(",") if kv)
        mt.enable(**conf)
    rank, local, world = 0, 0, 1
    if args.ddp:
        import torch.distributed as dist
        rank = int(os.environ["RANK"])
        local = 0 if args.one_gpu else int(os.environ["LOCAL_RANK"])
        world = int(os.environ["WORLD_SIZE"])
        torch.cuda.set_device(local)
        if args.backend == "nccl":
            dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        else:
            dist.init_process_group(args.backend)
    dev = torch.device("cuda", local)
    torch.manual_seed(1234)
    torch.cuda.manual_seed_all(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    torch.backends.cuda.enable_math_sdp(True)
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=6, n_head=12, n_embd=768, n_positions=512, vocab_size=50257,
                     attn_implementation="eager")
    try:
        cfg._attn_implementation = "eager"
    except Exception:  # noqa: BLE001 - older/newer config classes
        pass
    model = GPT2LMHeadModel(cfg).to(dev)
    if args.ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    params = [p for p in model.parameters()]
    gen = torch.Generator().manual_seed(4321 + rank)
    tokens = torch.randint(0, cfg.vocab_size, (args.steps, args.batch, args.seq), generator=gen)

    main = torch.cuda.current_stream(dev)
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        nxt = tokens[0].to(dev)
    losses, gnorms, times, launches, ends = [], [], [], [], []
    torch.cuda.synchronize(dev)
    st_warm = None
    window = [0.0, 0.0]  # CLOCK_MONOTONIC seconds of the steady steps, for profilers
    for step in range(args.steps):
        if step == args.warmup and args.allocator == "magpool":
            import magpool_torch as mt
            st_warm = mt.memory_stats(dev)  # the steady steps' share, below
        if step == args.warmup:
            window[0] = time.monotonic()
        t0 = time.perf_counter()
        batch = nxt                      # allocated on side
        main.wait_stream(side)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=batch, labels=batch)
        loss = out.loss
        loss.backward()
        side.wait_stream(main)           # side passes main's use of batch and grads
        with torch.cuda.stream(side):
            if step + 1 < args.steps:
                nxt = tokens[step + 1].to(dev)
            gn = torch.stack([p.grad.detach().float().norm() for p in params]).norm()
        main.wait_stream(side)           # main passes side's use of the grads
        opt.step()
        opt.zero_grad(set_to_none=True)
        launches.append(time.perf_counter() - t0)  # the host's share: work queued, none waited for
        losses.append(loss.item())
        gnorms.append(gn.item())
        del batch, out, loss, gn         # batch: freed on side, which waited for main
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
        if args.allocator == "magpool":  # where reserved memory is, after each step
            import magpool_torch as mt
            s = mt.memory_stats(dev)
            ends.append([s[k] for k in ("reserved_bytes.all.current", "allocated_bytes.all.current",
                                        "magpool.cached_bytes", "magpool.free_bytes",
                                        "magpool.pending_bytes")])
    res = {"allocator": args.allocator, "rank": rank, "world": world,
           "losses": [x.hex() for x in losses], "gnorms": [x.hex() for x in gnorms],
           "loss_first": losses[0], "loss_last": losses[-1],
           "step_ms": [t * 1e3 for t in times],
           "launch_ms": [t * 1e3 for t in launches],
           "mean_step_ms": 1e3 * sum(times[args.warmup:]) / len(times[args.warmup:]),
           "step_ends": ends, "steady_window": [window[0], time.monotonic()]}
    if args.allocator == "magpool":
        import magpool_torch as mt
        st = mt.memory_stats(dev)
        res["peak_reserved"] = st["reserved_bytes.all.peak"]
        res["peak_allocated"] = st["allocated_bytes.all.peak"]
        res["magpool_stats"] = st
        if st_warm is not None:
            res["magpool_steady"] = {k: st[k] - st_warm[k] for k in (
                "magpool.alloc_ns", "magpool.free_ns", "magpool.slow_allocs",
                "magpool.chunk_maps", "magpool.chunk_moves", "magpool.grow_count",
                "magpool.stream_batches") if k in st}
        if st["num_ooms"] != 0:
            print("gpt2_parity: magpool reported out-of-memory errors: %r" % st)
    else:
        res["peak_reserved"] = torch.cuda.max_memory_reserved(dev)
        res["peak_allocated"] = torch.cuda.max_memory_allocated(dev)
    if args.ddp:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()
    out = args.out if not args.ddp else "%s.rank%d.json" % (args.out, rank)
    with open(out, "w") as f:
        json.dump(res, f)
    print("RESULT", json.dumps({k: res[k] for k in ("allocator", "rank", "loss_first",
                                                   "loss_last", "mean_step_ms",
                                                   "peak_reserved", "peak_allocated")}),
          flush=True)


def launch(args, allocator, out, conf=""):
    me = os.path.abspath(__file__)
    common = ["--child", "--allocator", allocator, "--out", out, "--steps", str(args.steps),
              "--warmup", str(args.warmup), "--batch", str(args.batch), "--seq", str(args.seq),
              "--magpool-conf", conf, "--cpus", args.cpus, "--backend", args.backend]
    if args.one_gpu:
        common.append("--one-gpu")
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONUNBUFFERED="1",
               **NO_MULTICAST)
    if args.ddp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(args.nproc), me, "--ddp"] + common
    else:
        cmd = [sys.executable, me] + common
    r = subprocess.run(cmd, env=env)
    if r.returncode != 0:
        print("gpt2_parity: the %s run failed (%d)" % (allocator, r.returncode))
        sys.exit(1)
    if args.ddp:
        return [json.load(open("%s.rank%d.json" % (out, k))) for k in range(args.nproc)]
    return [json.load(open(out))]


def timed(st, steps):
    """The entry points' time a step, if the run timed them (timing=1)."""
    if st["magpool.alloc_ns"] == 0 and st["magpool.free_ns"] == 0:
        return "timing=off"
    line = "alloc_ms_per_step=%.2f free_ms_per_step=%.2f slow_allocs=%d" % (
        st["magpool.alloc_ns"] / 1e6 / steps, st["magpool.free_ns"] / 1e6 / steps,
        st["magpool.slow_allocs"])
    if "magpool.max_alloc_ns" in st:  # not in the steady steps' differences
        line += " max_alloc_ms=%.2f" % (st["magpool.max_alloc_ns"] / 1e6)
    return line


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2


def rounds_line(alloc, rank, ref, reps, warmup):
    """Round by round against PyTorch's allocator (the same round: the two
    ran one after the other): the ratio of mean steps and of median
    steps, in percent, and the median of each over the rounds."""
    mean_pc, med_pc, launch = [], [], []
    for t, m in zip(ref, reps):
        ts, ms = t[rank]["step_ms"][warmup:], m[rank]["step_ms"][warmup:]
        mean_pc.append(100 * (sum(ms) / len(ms) / (sum(ts) / len(ts)) - 1))
        med_pc.append(100 * (median(ms) / median(ts) - 1))
        lt, lm = t[rank].get("launch_ms", [])[warmup:], m[rank].get("launch_ms", [])[warmup:]
        launch.append("%.1f/%.1f" % (sum(lt) / len(lt), sum(lm) / len(lm)) if lt and lm else "-")
    return ("ROUNDS allocator=%s rank=%d mean_step_pct=%s median_step_pct=%s "
            "median_of_rounds_mean_pct=%+.1f median_of_rounds_median_pct=%+.1f "
            "launch_ms_torch_vs_this=%s" % (
                alloc, rank, ",".join("%+.1f" % x for x in mean_pc),
                ",".join("%+.1f" % x for x in med_pc), median(mean_pc), median(med_pc),
                ",".join(launch)))


def compare(args):
    torch_gpu.require("gpt2_parity", "transformers")
    os.makedirs(args.out, exist_ok=True)
    tag = ("ddp-" + args.backend + ("-one-gpu" if args.one_gpu else "")) if args.ddp else "single"
    confs = args.magpool_conf.split(";")
    labels = ["torch"] + ["magpool" + ("[%s]" % c if c else "") for c in confs]
    runs = {label: [] for label in labels}
    for i in range(args.repeat):
        # Odd rounds in reverse order (ABBA...): a drift of the machine
        # over the runs (docs/benchmarks.md: a run's position mattered)
        # weighs on every allocator alike.
        order = list(enumerate(labels))
        for k, label in (order if i % 2 == 0 else order[::-1]):
            alloc = "torch" if k == 0 else "magpool"
            conf = "" if k == 0 else confs[k - 1]
            runs[label].append(launch(args, alloc, os.path.join(
                args.out, "%s_%s%d_%d.json" % (tag, alloc, k, i)), conf))
    ok = True
    ref = runs["torch"][0]
    for alloc, reps in runs.items():
        for i, ranks in enumerate(reps):
            for r, res in enumerate(ranks):
                same = res["losses"] == ref[r]["losses"]
                ok &= same
                if not same:
                    bad = [k for k, (a, b) in enumerate(zip(res["losses"], ref[r]["losses"]))
                           if a != b]
                    print("gpt2_parity: %s run %d rank %d: losses differ from step %d"
                          % (alloc, i, r, bad[0] if bad else -1))
    print("gpt2_parity (%s, %d rank(s), %d steps, batch %dx%d): losses %s" % (
        tag, len(ref), args.steps, args.batch, args.seq,
        "BIT-IDENTICAL" if ok else "DIFFER"))
    for alloc, reps in runs.items():
        for r in range(len(ref)):
            ms = [reps[i][r]["mean_step_ms"] for i in range(len(reps))]
            pk = max(reps[i][r]["peak_reserved"] for i in range(len(reps)))
            pa = max(reps[i][r]["peak_allocated"] for i in range(len(reps)))
            print("SUMMARY parity=%s allocator=%s rank=%d mean_step_ms=%s peak_reserved_mib=%.0f "
                  "peak_allocated_mib=%.0f loss_last=%.6f" % (
                      tag, alloc, r, ",".join("%.2f" % m for m in ms), pk / 2**20, pa / 2**20,
                      reps[0][r]["loss_last"]))
            st = reps[-1][r].get("magpool_stats")
            if st:
                print("MAGPOOL allocator=%s rank=%d grow_count=%d chunk_maps=%d chunk_moves=%d "
                      "pending_at_peak_mib=%.0f %s allocs=%d first_step_ms=%.1f" % (
                          alloc, r, st["magpool.grow_count"], st["magpool.chunk_maps"],
                          st["magpool.chunk_moves"], st.get("magpool.pending_at_peak", 0) / 2**20,
                          timed(st, args.steps), st["allocation.all.allocated"],
                          reps[-1][r]["step_ms"][0]))
            if alloc != "torch":
                print(rounds_line(alloc, r, runs["torch"], reps, args.warmup))
            sd = reps[-1][r].get("magpool_steady")
            if sd:
                n = args.steps - args.warmup
                print("MAGPOOL_STEADY allocator=%s rank=%d steps=%d %s chunk_maps=%d "
                      "chunk_moves=%d grow_count=%d stream_batches=%d" % (
                          alloc, r, n, timed(sd, n), sd["magpool.chunk_maps"],
                          sd["magpool.chunk_moves"], sd["magpool.grow_count"],
                          sd.get("magpool.stream_batches", -1)))
            se = reps[-1][r].get("step_ends")
            if se:  # after the last step: where the reserved memory is
                print("MAGPOOL_END allocator=%s rank=%d reserved_mib=%.0f allocated_mib=%.0f "
                      "cached_mib=%.0f free_mib=%.0f pending_mib=%.0f" % (
                          (alloc, r) + tuple(x / 2**20 for x in se[-1])))
    sys.exit(0 if ok else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--ddp", action="store_true")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                    help="--ddp: the process group's backend (default nccl)")
    ap.add_argument("--one-gpu", action="store_true",
                    help="--ddp: every rank on device 0 (with --backend gloo)")
    ap.add_argument("--allocator", choices=["torch", "magpool"], default="torch")
    ap.add_argument("--out", default="gpt2_parity_out")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cpus", default="",
                    help="run every child on these CPUs only (\"2-5,8\"); default: any")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--magpool-conf", default="")
    args = ap.parse_args()
    if args.child:
        child(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
