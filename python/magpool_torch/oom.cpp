// oom.cpp - the allocation entry points PyTorch calls when magpool_torch
// is enabled: the shim's, plus PyTorch's own out-of-memory error.
//
// magpool_torch.enable() compiles this file against the running PyTorch
// (its c10 headers and libc10.so) into a small cached library, linked to
// libmagpool_torch.so, and hands ITS two functions to
// CUDAPluggableAllocator.  PyTorch 2.11's CUDAPluggableAllocator does not
// check a NULL return; here a failed allocation throws
// c10::OutOfMemoryError from this C++ frame, which PyTorch's Python
// bindings turn into torch.OutOfMemoryError (torch.cuda.OutOfMemoryError),
// as for its own allocator.
#include <c10/util/Exception.h>

#include <sys/types.h>

struct CUstream_st;

extern "C" {
void *magpool_torch_alloc_nothrow(ssize_t size, int device, CUstream_st *stream);
const char *magpool_torch_last_failure(void);
void magpool_torch_free(void *ptr, ssize_t size, int device, CUstream_st *stream);

__attribute__((visibility("default"))) void *magpool_torch_alloc_or_throw(ssize_t size,
                                                                           int device,
                                                                           CUstream_st *stream) {
  void *p = magpool_torch_alloc_nothrow(size, device, stream);
  TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr, "magpool: out of memory: ",
                   magpool_torch_last_failure(),
                   ". See magpool_torch.memory_stats(); MAGPOOL_CONF or enable() set the "
                   "pool's limits (max_pool_size).");
  return p;
}

__attribute__((visibility("default"))) void magpool_torch_free_fwd(void *ptr, ssize_t size,
                                                                    int device,
                                                                    CUstream_st *stream) {
  magpool_torch_free(ptr, size, device, stream);
}
}
