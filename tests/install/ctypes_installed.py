#!/usr/bin/env python3
"""ctypes_installed.py - loads the installed libmagpool.so into python3
with ctypes (a process that is already running, with its own threads and
TLS) and uses it: a HOST pool, config parsing, stats, and a DEVICE pool
where a GPU is present (else a clean MAGPOOL_ENODEV / MAGPOOL_ECUDA).

    python3 ctypes_installed.py /path/to/libmagpool.so
Exit 0 on success, 1 on failure."""
import ctypes
import sys
import threading


class Config(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("pool_size", ctypes.c_size_t),
                ("allow_growth", ctypes.c_int), ("max_pool_size", ctypes.c_size_t),
                ("min_block", ctypes.c_size_t), ("kind", ctypes.c_int),
                ("device", ctypes.c_int), ("thread_cache_bytes", ctypes.c_size_t),
                ("cache_max_block", ctypes.c_size_t), ("stream_cache_bytes", ctypes.c_size_t),
                ("capture_check", ctypes.c_int), ("chunk_size", ctypes.c_size_t),
                ("release_threshold", ctypes.c_size_t), ("trace_path", ctypes.c_char_p),
                ("chunk_groups", ctypes.c_int), ("cross_stream_reuse", ctypes.c_int)]


class Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "used_bytes", "requested_bytes", "reserved_bytes", "peak_used_bytes",
        "cached_bytes", "pending_bytes", "free_bytes", "largest_free_block")] + \
        [(n, ctypes.c_uint64) for n in ("alloc_count", "free_count", "live_count", "grow_count")] + \
        [("peak_reserved_bytes", ctypes.c_size_t)] + \
        [(n, ctypes.c_uint64) for n in ("chunk_maps", "chunk_unmaps", "chunk_moves")]


def check(cond, what):
    if not cond:
        print("ctypes_installed: FAILED:", what)
        sys.exit(1)


def main():
    lib = ctypes.CDLL(sys.argv[1])
    lib.magpool_alloc.restype = ctypes.c_void_p
    lib.magpool_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.magpool_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.magpool_destroy.argtypes = [ctypes.c_void_p]
    lib.magpool_get_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(Stats)]
    lib.magpool_config_error.restype = ctypes.c_char_p
    check(lib.magpool_version() // 100 == 3, "version 0.3.x")

    cfg = Config()
    lib.magpool_config_init(ctypes.byref(cfg))
    check(cfg.struct_size == ctypes.sizeof(Config),
          "struct_size %d == %d" % (cfg.struct_size, ctypes.sizeof(Config)))
    check(lib.magpool_config_parse(ctypes.byref(cfg), b"pool_size=8M,allow_growth=on") == 0,
          "parse")
    check(cfg.pool_size == 8 << 20 and cfg.allow_growth == 1, "parsed values")
    check(lib.magpool_config_parse(ctypes.byref(cfg), b"nope=1") == -1, "bad key")
    check(b"nope" in lib.magpool_config_error(), "message names the key")

    pool = ctypes.c_void_p()
    check(lib.magpool_create(ctypes.byref(cfg), ctypes.byref(pool)) == 0, "create")
    errors = []

    def work():
        for i in range(2000):
            p = lib.magpool_alloc(pool, 64 + i)
            if not p or lib.magpool_free(pool, ctypes.c_void_p(p)) != 0:
                errors.append(i)
                return
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, "allocations on three Python threads")
    st = Stats()
    check(lib.magpool_get_stats(pool, ctypes.byref(st)) == 0, "stats")
    check(st.alloc_count == 6000 and st.used_bytes == 0, "counts %d" % st.alloc_count)
    check(lib.magpool_destroy(pool) == 0, "destroy")

    lib.magpool_config_init(ctypes.byref(cfg))
    cfg.kind = 1
    cfg.pool_size = 16 << 20
    rc = lib.magpool_create(ctypes.byref(cfg), ctypes.byref(pool))
    if rc == 0:
        p = lib.magpool_alloc(pool, 4096)
        check(bool(p), "device alloc")
        check(lib.magpool_free(pool, ctypes.c_void_p(p)) == 0, "device free")
        check(lib.magpool_destroy(pool) == 0, "device destroy")
        print("ctypes_installed: DEVICE pool created and used")
    else:
        check(rc in (-4, -5), "DEVICE pool without a GPU: %d" % rc)
        print("ctypes_installed: no GPU: DEVICE pool refused cleanly (%d)" % rc)
    print("ctypes_installed: OK (%s)" % sys.argv[1])


main()
