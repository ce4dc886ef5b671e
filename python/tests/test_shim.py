#!/usr/bin/env python3
"""test_shim.py - the installed magpool_torch package without PyTorch:
libmagpool_torch.so loads (ctypes), configuration strings are checked
(a bad one raises ValueError naming it and changes nothing), statistics
of a device with no pool, and an allocation: on a machine with a GPU it
succeeds and shows in the statistics; without one it fails cleanly
(NULL, num_ooms counted).  Needs PYTHONPATH to hold the installed
package (ctest sets it)."""
import ctypes
import sys

import magpool_torch as mt


def check(cond, what):
    if not cond:
        print("test_shim: FAILED:", what)
        sys.exit(1)


lib = mt._load()
lib.magpool_torch_alloc.restype = ctypes.c_void_p
lib.magpool_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.magpool_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                   ctypes.c_void_p]

check(mt._conf_string({"pool_size": "64M", "allow_growth": True}) ==
      "pool_size=64M,allow_growth=1", "keyword arguments become a config string")
try:
    mt.enable(pool_sise="1G")
    check(False, "a bad key must raise")
except ValueError as e:
    check("pool_sise" in str(e), "message names the key: %s" % e)
try:
    mt.enable(kind="host")
    check(False, "kind is the module's")
except ValueError:
    pass
check(lib.magpool_torch_configure(b"pool_size=64M,thread_cache_bytes=1M") == 0, "configure")
check(lib.magpool_torch_configure(b"pool_size=64Q") == -1, "bad value refused")

st = mt.memory_stats(0)
for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
            "reserved_bytes.all.current", "reserved_bytes.all.peak",
            "num_alloc_retries", "num_ooms"):
    check(key in st, "key %s" % key)
check(st["magpool.pool_created"] == 0 and st["allocated_bytes.all.current"] == 0, "no pool yet")
try:
    mt.memory_stats(1000)
    check(False, "device 1000 must raise")
except ValueError:
    pass

p = lib.magpool_torch_alloc(1000, 0, None)
st = mt.memory_stats(0)
if p:
    check(st["allocated_bytes.all.current"] == 1000 and st["magpool.pool_created"] == 1,
          "allocation counted: %r" % st)
    check(st["reserved_bytes.all.current"] >= 64 << 20, "the configured pool_size")
    check(st["magpool.chunk_maps"] >= 32 and st["magpool.chunk_moves"] == 0,
          "the 64 MiB pool's 32 chunks counted, nothing moved: %r" % st)
    check(st["magpool.pending_at_peak"] == 0, "nothing was pending at the peak: %r" % st)
    lib.magpool_torch_free(p, 1000, 0, None)
    st = mt.memory_stats(0)
    check(st["allocated_bytes.all.current"] == 0 and st["allocated_bytes.all.peak"] == 1000,
          "free counted: %r" % st)
    mt.reset_peak_memory_stats(0)
    check(mt.memory_stats(0)["allocated_bytes.all.peak"] == 0, "peak reset")
    mt.empty_cache()
    print("test_shim: OK (GPU: allocation on cuda:0)")
else:
    check(st["num_ooms"] == 1 and st["magpool.pool_created"] == 0 and
          st["magpool.pending_at_peak"] == 0, "failed allocation counted: %r" % st)
    print("test_shim: OK (no GPU: the allocation failed cleanly)")
