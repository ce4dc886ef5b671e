#!/usr/bin/env python3
"""test_magpool_torch.py - magpool_torch inside PyTorch, on a GPU.

Runs itself in a child process with MAGPOOL_TRACE set (the allocator must
be chosen before any CUDA allocation, and the trace is written at exit),
then checks the trace.  The child:
  - enables magpool (pool_size from enable(), over MAGPOOL_CONF);
  - computes on the default (legacy) stream and on a side stream, with the
    synchronisation a pluggable allocator needs (no record_stream);
  - checks memory_stats(): the keys, allocated bytes following tensors,
    reserved bytes at least the pool size, the entry points untimed by
    default and timed after enable(timing=True);
  - asks for more than max_pool_size: torch.OutOfMemoryError, counted in
    num_ooms, and allocation works afterwards (in a child without trace);
  - empty_cache() and reset_peak_memory_stats(); empty_cache() gives back
    a block freed on a stream still running (it waits, as PyTorch's does),
    and empty_cache(wait=False) leaves it pending;
Exit 0 pass, 1 fail, 77 when PyTorch with CUDA is not there (skipped)."""
import os
import subprocess
import sys
import tempfile


def fail(msg):
    print("test_magpool_torch: FAIL:", msg, flush=True)
    sys.exit(1)


def step(msg):
    print("test_magpool_torch: child:", msg, flush=True)


def child():
    import faulthandler
    faulthandler.enable()
    import torch
    import magpool_torch as mt
    oom = os.environ["MAGPOOL_TEST_CHILD"] == "oom"
    mt.enable(pool_size="256M", thread_cache_bytes="4M", max_pool_size="2G")
    check = lambda c, m: c or fail(m)
    x = torch.randn(1024, 1024, device="cuda")  # 4 MiB
    st = mt.memory_stats()
    check(st["magpool.pool_created"] == 1, "pool created on first use")
    check(st["allocated_bytes.all.current"] >= 4 << 20, "allocated follows tensors: %r" % st)
    check(st["reserved_bytes.all.current"] >= 256 << 20, "reserved >= pool_size: %r" % st)
    check(st["magpool.alloc_ns"] == 0 and st["magpool.free_ns"] == 0,
          "entry points untimed by default: %r" % st)
    mt.enable(timing=True, pool_size="256M", thread_cache_bytes="4M", max_pool_size="2G")
    z = torch.empty(1 << 20, device="cuda")
    del z
    st = mt.memory_stats()
    check(st["magpool.alloc_ns"] > 0 and st["magpool.free_ns"] > 0,
          "enable(timing=True) times the entry points: %r" % st)
    y = x @ x
    ref = (x.double().cpu() @ x.double().cpu()).float()
    check(torch.allclose(y.cpu(), ref, rtol=1e-3, atol=1e-2), "matmul through magpool memory")
    step("matmul")
    with open("/proc/self/maps") as f:
        rt = sorted({l.split()[-1] for l in f if "libcudart" in l})
    step("CUDA runtimes mapped: %s" % rt)

    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        a = torch.ones(1 << 22, device="cuda")
        b = a * 2
    main.wait_stream(side)
    c = b + 1
    side.wait_stream(main)  # b is freed on side: side must pass main's use first
    del a, b
    check(int(c.sum().item()) == 3 * (1 << 22), "side-stream work")
    before = mt.memory_stats()["allocated_bytes.all.current"]
    del c
    after = mt.memory_stats()["allocated_bytes.all.current"]
    check(before - after == 4 << 22, "a freed tensor leaves allocated: %d" % (before - after))
    step("side stream")
    if oom:
        try:
            torch.empty(3 << 30, dtype=torch.uint8, device="cuda")  # over max_pool_size
            fail("no out-of-memory error")
        except torch.OutOfMemoryError as e:
            check("magpool" in str(e), "the message is magpool's: %s" % e)
        step("out-of-memory error over max_pool_size")
        st = mt.memory_stats()
        check(st["num_ooms"] >= 1 and st["num_alloc_retries"] >= 1, "ooms counted: %r" % st)
        w = torch.zeros(1000, device="cuda") + 1
        check(int(w.sum().item()) == 1000, "allocation after the out-of-memory error")
    # A 512 MiB block freed while its stream still runs: pending through a
    # trim that does not wait, back to the GPU through one that does.
    for wait in (False, True):
        big = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        for _ in range(100):
            big.add_(1)
        del big
        mt.empty_cache(wait=wait)
        st = mt.memory_stats()
        held = st["magpool.pending_bytes"] + st["magpool.cached_bytes"]
        if wait:
            check(held < (64 << 20), "empty_cache() left %d bytes pending or cached" % held)
        elif held < (512 << 20):
            step("the stream had passed the free before the trim: wait=False proved nothing")
        torch.cuda.synchronize()
    mt.empty_cache()
    mt.reset_peak_memory_stats()
    st = mt.memory_stats()
    check(st["allocated_bytes.all.peak"] == st["allocated_bytes.all.current"], "peak reset")
    torch.cuda.synchronize()
    step("OK %r" % st)


def main():
    try:
        import torch
        if not torch.cuda.is_available():
            raise ImportError("no CUDA device")
    except Exception as e:  # noqa: BLE001 - any failure to get a GPU means skip
        print("test_magpool_torch: skipped:", e)
        sys.exit(77)
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "torch.trace")
        env = dict(os.environ, MAGPOOL_TEST_CHILD="oom")
        r = subprocess.run([sys.executable, __file__], env=env)
        if r.returncode != 0:
            fail("child (out of memory) exited %d" % r.returncode)
        env = dict(os.environ, MAGPOOL_TRACE=trace, MAGPOOL_TEST_CHILD="trace")
        r = subprocess.run([sys.executable, __file__], env=env)
        if r.returncode != 0:
            fail("child (trace) exited %d" % r.returncode)
        live, n_a, n_f, streams = {}, 0, 0, set()
        with open(trace) as f:
            for line in f:
                if line.startswith("#"):
                    continue
                t = line.split()
                if t[0] == "a":
                    n_a += 1
                    live[int(t[1])] = int(t[2])
                    streams.add(int(t[3]))
                elif t[0] == "f":
                    n_f += 1
                    if int(t[1]) not in live:
                        fail("free of %s before its allocation" % t[1])
                    del live[int(t[1])]
                    streams.add(int(t[2]))
                else:
                    fail("bad line %r" % line)
        if n_a < 5 or len(streams) < 2 or sorted(streams) != list(range(len(streams))):
            fail("trace: %d allocations, streams %r" % (n_a, sorted(streams)))
        print("test_magpool_torch: PASS (trace: %d allocations, %d frees, %d streams)"
              % (n_a, n_f, len(streams)))


if __name__ == "__main__":
    if os.environ.get("MAGPOOL_TEST_CHILD"):
        child()
    else:
        main()
