// oom.cpp - throws PyTorch's own out-of-memory error for libmagpool_torch.so.
//
// magpool_torch.enable() compiles this file against the running PyTorch
// (its c10 headers and libc10.so) into a small cached library and hands
// magpool_torch_throw_oom to the shim (magpool_torch_set_oom_handler).
// When an allocation fails, the shim calls it; the c10::OutOfMemoryError
// it throws unwinds through the shim into PyTorch, whose Python bindings
// turn it into torch.OutOfMemoryError (torch.cuda.OutOfMemoryError), as
// for its own allocator.  PyTorch's CUDAPluggableAllocator does not check
// a NULL return itself.
#include <c10/util/Exception.h>

#include <cstddef>

extern "C" __attribute__((visibility("default"))) void magpool_torch_throw_oom(
    size_t size, int device, const char* detail) {
  TORCH_CHECK_WITH(OutOfMemoryError, false, "magpool: out of memory: tried to allocate ",
                   size, " bytes on cuda:", device, " (", detail,
                   "). See magpool_torch.memory_stats(); MAGPOOL_CONF sets the pool's "
                   "limits (max_pool_size).");
}
