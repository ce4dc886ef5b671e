// cub_baseline.cu - cub::CachingDeviceAllocator behind the C interface of
// cuda_baselines.h, for magpool-bench's `cub` row.  Compiled by nvcc, only
// for the bench, only when MAGPOOL_WITH_CUDA is on.
//
// One instance is shared by every bench thread: cub guards its bins with one
// mutex, which is what the row measures.  No C++ exception crosses the C
// boundary: allocation of the wrapper uses nothrow new, and cub's own calls
// report errors as cudaError_t.
#include <cuda_runtime_api.h>

#include <cub/util_allocator.cuh>
#include <new>

#include "cuda_baselines.h"

struct bench_cub {
  cub::CachingDeviceAllocator alloc;
  int device;

  explicit bench_cub(int dev)
      : alloc(8u,  // bin_growth: cub's default
              3u,  // min_bin: 8^3 = 512 B
              7u,  // max_bin: 8^7 = 2 MiB (covers the bench's 1 MiB)
              cub::CachingDeviceAllocator::INVALID_SIZE,  // cache without cap
              true),  // skip_cleanup: bench_cub_destroy frees explicitly
        device(dev) {}
};

extern "C" int bench_cub_create(int device, bench_cub **out) {
  if (out == nullptr) return (int)cudaErrorInvalidValue;
  bench_cub *c = new (std::nothrow) bench_cub(device);
  if (c == nullptr) return (int)cudaErrorMemoryAllocation;
  *out = c;
  return (int)cudaSuccess;
}

extern "C" int bench_cub_alloc(bench_cub *c, void **ptr, size_t bytes,
                               struct CUstream_st *stream) {
  return (int)c->alloc.DeviceAllocate(c->device, ptr, bytes, (cudaStream_t)stream);
}

extern "C" int bench_cub_free(bench_cub *c, void *ptr) {
  return (int)c->alloc.DeviceFree(c->device, ptr);
}

extern "C" int bench_cub_destroy(bench_cub *c) {
  if (c == nullptr) return (int)cudaSuccess;
  cudaError_t e = c->alloc.FreeAllCached();
  delete c;
  return (int)e;
}
