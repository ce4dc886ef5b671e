#!/usr/bin/env python3
"""make_corpus.py - writes the seed inputs of tests/fuzz/corpus/.

Run by hand after changing the input format of fuzz_api.c (its operation
table or an operation's arguments); the seeds are committed.  Each seed is
one scenario written in the harness's byte format: config bytes, then
operations with their arguments.

    python3 tests/fuzz/make_corpus.py
"""
import os
import struct

OPS = [
    "alloc", "alloc2", "alloc_async_null", "alloc_async_s0", "alloc_async_s1",
    "scope_alloc0", "scope_alloc1", "free", "free2", "free_sized",
    "free_async_null", "free_async_s0", "free_async_s1", "bad_free",
    "free_wrong_size", "free_scoped", "scope_free", "scope_begin", "scope_end",
    "sync", "release", "stream_recycle", "trim", "tracking", "tag", "usable",
    "free_all_trim", "null_args", "leak_check", "create", "nop", "gate",
]
OP = {name: i for i, name in enumerate(OPS)}


def u8(x):
    return bytes([x & 0xFF])


def u16(x):
    return struct.pack("<H", x & 0xFFFF)


def config(mb_shift=2, shape=0, c=10, extra=0, growth=0, maxsel=0,
           scache=1, tcache=1, cmax=0, capture=1):
    """The six config bytes (decode_config) for the wanted choices."""
    for a in range(256):
        if a % 13 == mb_shift and (a >> 4) % 4 == cmax and (a >> 6) & 1 == capture:
            break
    else:
        raise ValueError("no byte a")
    b = shape
    d = (scache << 4) | (1 if extra else 0) | (extra << 1 if extra else 0)
    d &= 0xFF
    e = next(e for e in range(256)
             if e & 1 == growth and (e >> 1) % 5 == maxsel and (e >> 4) % 4 == scache)
    f = next(f for f in range(256) if f % 5 == tcache)
    return bytes([a, b, c, d, e, f])


def small(n):          # decode_size: 1 + u8
    return u8(8) + u8(n - 1)


def pow2(k):           # decode_size: 1 << k
    return u8(3) + u8(k)


def zero():
    return u8(0)


def huge(i):           # decode_size: the huge candidates
    return u8(6) + u8(i)


def near_pool(i):      # decode_size: sizes around the pool size
    return u8(5) + u8(i)


def op(name, *args):
    return u8(OP[name]) + b"".join(args)


def seed_sync():
    s = config(mb_shift=2, shape=0, c=10)          # 64 B blocks, 64 KiB pool
    for n in (1, 64, 65, 200, 17, 100):
        s += op("alloc", small(n))
    s += op("alloc", zero()) + op("alloc", pow2(12)) + op("alloc", huge(0))
    s += op("alloc", near_pool(0)) + op("alloc", huge(4))
    s += op("free", u16(1)) + op("free_sized", u16(2))
    s += op("free_wrong_size", u16(0), u8(0)) + op("free_wrong_size", u16(1), u8(2))
    for k in range(6):
        s += op("bad_free", u8(k), u16(3), u8(k), u16(7))
    s += op("usable", u16(0)) + op("trim") + op("sync", u8(2))
    s += op("alloc", pow2(15)) + op("free2", u16(0)) + op("trim")
    s += op("free_all_trim", u8(0))
    return s


def seed_streams():
    s = config(mb_shift=1, shape=1, c=200, scache=2, tcache=2)
    for i in range(6):
        s += op("alloc_async_s0", small(30 + i * 20))
        s += op("alloc_async_s1", small(10 + i * 40))
    s += op("alloc_async_null", small(5))
    for i in range(4):
        s += op("free_async_s0", u16(i)) + op("free_async_s1", u16(i + 1))
    s += op("alloc_async_s0", small(30)) + op("alloc", small(30))
    s += op("free_async_null", u16(0)) + op("sync", u8(0))
    s += op("release", u8(1)) + op("alloc_async_s1", small(90))
    s += op("stream_recycle", u8(0)) + op("alloc_async_s0", zero())
    s += op("bad_free", u8(3), u16(0), u8(3), u16(0))
    s += op("trim") + op("sync", u8(2))
    s += op("free_all_trim", u8(6)) + op("alloc_async_s0", pow2(10))
    s += op("free_all_trim", u8(1))
    return s


def seed_scopes_tracking():
    s = config(mb_shift=0, shape=3, c=40, tcache=0)  # 16 B blocks, no thread cache
    s += op("tracking", u8(1)) + op("tag", u8(1))
    s += op("scope_begin", u8(0)) + op("scope_begin", u8(1))
    s += op("scope_alloc0", small(10)) + op("scope_alloc1", small(20))
    s += op("tag", u8(2)) + op("alloc", small(16)) + op("alloc_async_s0", zero())
    s += op("leak_check") + op("free_scoped", u16(0), u8(0))
    s += op("free_scoped", u16(1), u8(5)) + op("scope_free", u8(0), u8(0), u16(2))
    s += op("scope_free", u8(0), u8(1))
    s += op("tracking", u8(0)) + op("leak_check") + op("tracking", u8(1))
    s += op("scope_end", u8(1)) + op("scope_end", u8(0))
    s += op("free", u16(0)) + op("free_async_s0", u16(0))
    s += op("tracking", u8(0)) + op("tracking", u8(1)) + op("tag", u8(0))
    s += op("alloc_async_s0", zero()) + op("leak_check") + op("free_all_trim", u8(0))
    return s


def seed_growth():
    s = config(mb_shift=6, shape=3, c=3, growth=1, maxsel=4)
    for _ in range(4):
        s += op("alloc", near_pool(0))
    s += op("alloc", pow2(22)) + op("alloc", huge(7)) + op("alloc", huge(2))
    s += op("free", u16(0)) + op("alloc", pow2(20)) + op("sync", u8(2))
    s += op("free_all_trim", u8(0))
    s += op("create", config(mb_shift=3, shape=2, c=5, growth=1, maxsel=3))
    for _ in range(3):
        s += op("alloc", near_pool(2))
    s += op("alloc", near_pool(7)) + op("free_all_trim", u8(1))
    return s


def seed_gates():
    s = config(mb_shift=2, shape=0, c=9, scache=2, tcache=4)  # 32 KiB pool
    for i in range(8):
        s += op("alloc_async_s0", small(60))
    s += op("alloc", small(100)) + op("gate", u8(0))
    for i in range(4):
        s += op("free_async_s0", u16(0))
    s += op("alloc", small(60)) + op("alloc_async_s1", small(60))
    s += op("alloc_async_s0", small(60)) + op("alloc_async_s0", small(60))
    s += op("free_async_s0", u16(1)) + op("trim") + op("alloc", small(60))
    s += op("sync", u8(2)) + op("release", u8(0)) + op("alloc", pow2(12))
    s += op("gate", u8(0)) + op("alloc", small(60)) + op("sync", u8(0))
    s += op("gate", u8(1)) + op("free_async_s1", u16(0)) + op("alloc", small(60))
    s += op("free_all_trim", u8(0))
    return s


def seed_oom_streams():
    """Every block freed on a stream, then the whole pool at once: the
    out-of-memory ladder must wait for the stream (live, released, and
    destroyed and made again)."""
    s = config(mb_shift=2, shape=0, c=10)          # 64 KiB pool
    for stream, then in ((0, None), (1, op("release", u8(1))),
                         (0, op("stream_recycle", u8(0)))):
        for _ in range(4):
            s += op("alloc_async_s%d" % stream, pow2(14))
        for _ in range(4):
            s += op("free_async_s%d" % stream, u16(0))
        if then:
            s += then
        s += op("alloc", pow2(16)) + op("free", u16(0))
    s += op("alloc_async_s0", pow2(16)) + op("free_async_s0", u16(0))
    s += op("trim") + op("alloc", pow2(16))
    return s


def seed_args():
    s = config(mb_shift=4, shape=1, c=77, extra=9)  # pool size not a multiple
    for k in range(16):
        s += op("null_args", u8(k))
        if k == 10:
            s += struct.pack("<Q", 2**64 - 5) + u8(12)
        if k >= 12:
            s += config(mb_shift=2) + u8(k - 12)
    for k in range(4):
        s += op("null_args", u8(12 + k)) + config(mb_shift=3) + u8(4 + k)
    s += op("null_args", u8(12)) + config(mb_shift=3) + u8(8)
    return s


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out, exist_ok=True)
    seeds = {
        "sync": seed_sync(), "streams": seed_streams(),
        "scopes_tracking": seed_scopes_tracking(), "growth": seed_growth(),
        "args": seed_args(), "gates": seed_gates(),
        "oom_streams": seed_oom_streams(),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, "seed_" + name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
