"""magpool_torch - magpool as PyTorch's CUDA allocator.

    import magpool_torch
    magpool_torch.enable()            # before any CUDA allocation
    ...                               # train as usual

enable(**config) takes any magpool_config_t field (pool_size="1G",
allow_growth=True, thread_cache_bytes="4M", max_pool_size=..., ...); they
apply over the MAGPOOL_CONF environment variable, which applies over
magpool's defaults (the module's own defaults are allow_growth=1 and
stream_cache_bytes=1G, for streams that the GPU keeps busy).  kind and
device are set by the module: one DEVICE pool per GPU, created on the
first allocation on that GPU.

What a pluggable allocator cannot see (and what to do instead):
  - Tensor.record_stream(s): PyTorch does not pass it on.  A block is
    freed in the order of the stream it was allocated on.  Before the
    last reference to a tensor used on another stream goes, make the
    allocating stream wait for that stream
    (alloc_stream.wait_stream(other), or an event), or synchronise.
  - torch.cuda.memory_stats() and friends raise for pluggable allocators:
    use magpool_torch.memory_stats(); torch.cuda.empty_cache() does not
    reach magpool: use magpool_torch.empty_cache().
  - CUDA graphs (torch.cuda.graph) need PyTorch's private pools: not
    supported through a pluggable allocator.

MAGPOOL_TRACE=path records every allocation and free (one file per pool;
"%p" in the path becomes the process id), written at exit; replay it with
magpool-replay.
"""
import ctypes
import hashlib
import os
import subprocess
import sys
import sysconfig

__all__ = ["enable", "is_enabled", "memory_stats", "empty_cache",
           "reset_peak_memory_stats", "library_path"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_SHIM = os.path.join(_HERE, "libmagpool_torch.so")
_lib = None
_oom_lib = None
_enabled = False


class _Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "allocated_current", "allocated_peak", "reserved_current", "reserved_peak",
        "num_alloc_retries", "num_ooms", "alloc_count", "free_count", "live_count",
        "pool_created", "grow_count", "alloc_ns", "free_ns", "slow_allocs", "max_alloc_ns",
        "chunk_maps", "chunk_unmaps", "chunk_moves", "pending_at_peak", "cached_current",
        "free_current", "pending_current", "stream_batches")]


def library_path():
    """The path of libmagpool_torch.so (the CUDAPluggableAllocator)."""
    return _SHIM


def _load():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(_SHIM)
        lib.magpool_torch_configure.argtypes = [ctypes.c_char_p]
        lib.magpool_torch_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
        lib.magpool_torch_empty_cache.argtypes = [ctypes.c_int]
        lib.magpool_torch_reset_peak.argtypes = [ctypes.c_int]
        lib.magpool_torch_set_oom_handler.argtypes = [ctypes.c_void_p]
        lib.magpool_torch_set_timing.argtypes = [ctypes.c_int]
        lib.magpool_config_error.restype = ctypes.c_char_p
        _lib = lib
    return _lib


def _conf_string(config):
    items = []
    for key, value in config.items():
        if key in ("kind", "device"):
            raise ValueError("magpool_torch: %s is set by the module (one DEVICE pool "
                             "per GPU)" % key)
        if isinstance(value, bool):
            value = int(value)
        if value is None:
            value = ""
        value = str(value)
        if "," in value or "=" in value:
            raise ValueError("magpool_torch: bad value %r for %s" % (value, key))
        items.append("%s=%s" % (key, value))
    return ",".join(items)


def _build_oom_helper():
    """Compiles oom.cpp against the running PyTorch, once per PyTorch
    build (cached under $MAGPOOL_TORCH_CACHE, default
    ~/.cache/magpool_torch).  Returns the library's path or None."""
    import torch
    from torch.utils import cpp_extension
    src = os.path.join(_HERE, "oom.cpp")
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    with open(src, "rb") as f:
        key = hashlib.sha256(f.read() + repr((torch.__version__, torch.__file__, abi,
                                              _SHIM)).encode())
    cache = os.environ.get("MAGPOOL_TORCH_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "magpool_torch")
    so = os.path.join(cache, "oom-%s.so" % key.hexdigest()[:16])
    if not os.path.exists(so):
        os.makedirs(cache, exist_ok=True)
        cxx = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++"
        tmp = "%s.%d.tmp" % (so, os.getpid())
        cmd = cxx.split() + ["-O2", "-shared", "-fPIC", "-std=c++17",
                             "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi]
        cmd += ["-I" + p for p in cpp_extension.include_paths()]
        cmd += [src, "-o", tmp, "-L" + torch_lib, "-lc10", "-Wl,-rpath," + torch_lib,
                _SHIM, "-Wl,-rpath," + _HERE]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            sys.stderr.write("magpool_torch: could not build the out-of-memory helper "
                             "(allocation failures will not raise torch.OutOfMemoryError):\n"
                             + r.stdout.decode(errors="replace")[-2000:] + "\n")
            return None
        os.replace(tmp, so)
    return so


def enable(timing=None, **config):
    """Makes magpool PyTorch's CUDA allocator.  Call before anything
    allocates CUDA memory (PyTorch refuses to swap an allocator in use).
    config: magpool_config_t fields, applied over MAGPOOL_CONF.  Raises
    ValueError for an unknown field or a bad value.  timing=True times the
    allocator's entry points (memory_stats' magpool.alloc_ns, free_ns,
    slow_allocs, max_alloc_ns) at two clock reads a call; off by default,
    or as MAGPOOL_TORCH_TIMING says (None: leave it as it is)."""
    global _enabled, _oom_lib
    lib = _load()
    conf = _conf_string(config)
    if lib.magpool_torch_configure(conf.encode()) != 0:
        raise ValueError("magpool_torch.enable: %s" % lib.magpool_config_error().decode())
    if isinstance(timing, str):  # from a "key=value" string
        timing = timing.strip().lower() not in ("", "0", "false", "no", "off")
    if timing is not None:
        lib.magpool_torch_set_timing(1 if timing else 0)
    if _enabled:
        return
    import torch
    if _oom_lib is None:
        _oom_lib = _build_oom_helper()
    if _oom_lib is not None:
        alloc = torch.cuda.memory.CUDAPluggableAllocator(
            _oom_lib, "magpool_torch_alloc_or_throw", "magpool_torch_free_fwd")
    else:  # no C++ compiler: failures come back as NULL (see the warning)
        alloc = torch.cuda.memory.CUDAPluggableAllocator(
            _SHIM, "magpool_torch_alloc", "magpool_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    _enabled = True


def is_enabled():
    """True once enable() has switched PyTorch's allocator."""
    return _enabled


def _device_index(device):
    if device is None:
        import torch
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    import torch
    d = torch.device(device)
    return d.index if d.index is not None else torch.cuda.current_device()


def memory_stats(device=None):
    """The keys of torch.cuda.memory_stats() that apply, for one device:
    allocated_bytes.all.current/.peak (bytes PyTorch asked for, in live
    blocks), reserved_bytes.all.current/.peak (what the pool took from the
    GPU), num_alloc_retries, num_ooms, allocation.all.current /
    .allocated / .freed (counts); plus magpool.* keys: pool_created,
    grow_count, chunk_maps, chunk_unmaps and chunk_moves (the pool's chunk
    calls, each a driver call of tens of us), pending_at_peak (bytes freed
    on streams that had not reached the frees when reserved bytes last
    peaked), cached_bytes, free_bytes and pending_bytes (magpool_stats_t's,
    now: where reserved memory that holds no live block is), stream_batches
    (batches of frees queued behind streams, ever: each a host function in
    the stream that holds its later work until the host has run it), and the time
    spent in the allocator's entry points (alloc_ns, free_ns, slow_allocs
    over 100 us, max_alloc_ns; 0 unless timing is on: enable(timing=True)
    or MAGPOOL_TORCH_TIMING=1)."""
    st = _Stats()
    if _load().magpool_torch_get_stats(_device_index(device), ctypes.byref(st)) != 0:
        raise ValueError("magpool_torch.memory_stats: bad device %r" % (device,))
    return {
        "allocated_bytes.all.current": st.allocated_current,
        "allocated_bytes.all.peak": st.allocated_peak,
        "reserved_bytes.all.current": st.reserved_current,
        "reserved_bytes.all.peak": st.reserved_peak,
        "num_alloc_retries": st.num_alloc_retries,
        "num_ooms": st.num_ooms,
        "allocation.all.current": st.live_count,
        "allocation.all.allocated": st.alloc_count,
        "allocation.all.freed": st.free_count,
        "magpool.pool_created": st.pool_created,
        "magpool.grow_count": st.grow_count,
        "magpool.alloc_ns": st.alloc_ns,
        "magpool.free_ns": st.free_ns,
        "magpool.slow_allocs": st.slow_allocs,
        "magpool.max_alloc_ns": st.max_alloc_ns,
        "magpool.chunk_maps": st.chunk_maps,
        "magpool.chunk_unmaps": st.chunk_unmaps,
        "magpool.chunk_moves": st.chunk_moves,
        "magpool.pending_at_peak": st.pending_at_peak,
        "magpool.cached_bytes": st.cached_current,
        "magpool.free_bytes": st.free_current,
        "magpool.pending_bytes": st.pending_current,
        "magpool.stream_batches": st.stream_batches,
    }


def empty_cache(device=None, wait=True):
    """Trims magpool's pool(s) (magpool_trim): cached blocks go back to the
    pool's tree, and empty chunks beyond pool_size go back to the GPU.
    Blocks freed on streams that have not yet run to their frees stay
    pending through a trim; with wait (the default, as
    torch.cuda.empty_cache waits for them) each device with a pool is
    synchronised and trimmed again, so that those go back too (through
    PyTorch: without it, one trim).  device None: every device."""
    lib = _load()
    dev = -1 if device is None else _device_index(device)
    lib.magpool_torch_empty_cache(dev)
    if not wait:
        return
    try:
        import torch
    except ImportError:
        return
    devs = [dev] if dev >= 0 else [
        i for i in range(torch.cuda.device_count()) if memory_stats(i)["magpool.pool_created"]]
    for i in devs:
        torch.cuda.synchronize(i)
    if devs:
        lib.magpool_torch_empty_cache(dev)


def reset_peak_memory_stats(device=None):
    """Restarts allocated_bytes.all.peak and reserved_bytes.all.peak.
    device None: every device."""
    _load().magpool_torch_reset_peak(-1 if device is None else _device_index(device))
