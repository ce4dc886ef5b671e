// replay_cub.cu - cub::CachingDeviceAllocator behind the C interface of
// replay_cub.h, for magpool-replay's `cub` peer.  Compiled by nvcc, only
// when MAGPOOL_WITH_CUDA is on.  Unlike magpool-bench's cub row, the
// allocator keeps cub's defaults (its cache is capped at 6 MiB - 1 B):
// the replay measures cub as programs use it out of the box.
//
// No C++ exception crosses the C boundary: the wrapper is allocated with
// nothrow new, and cub reports errors as cudaError_t.
#include <cuda_runtime_api.h>

#include <cub/util_allocator.cuh>
#include <mutex>
#include <new>

#include "replay_cub.h"

struct replay_cub {
  cub::CachingDeviceAllocator alloc;
  int device;
  explicit replay_cub(int dev) : alloc(true /* skip_cleanup: destroy frees */), device(dev) {}
};

extern "C" int replay_cub_create(int device, replay_cub **out) {
  if (out == nullptr) return (int)cudaErrorInvalidValue;
  replay_cub *c = new (std::nothrow) replay_cub(device);
  if (c == nullptr) return (int)cudaErrorMemoryAllocation;
  *out = c;
  return (int)cudaSuccess;
}

extern "C" int replay_cub_alloc(replay_cub *c, void **ptr, size_t bytes,
                                struct CUstream_st *stream) {
  return (int)c->alloc.DeviceAllocate(c->device, ptr, bytes, (cudaStream_t)stream);
}

extern "C" int replay_cub_free(replay_cub *c, void *ptr) {
  return (int)c->alloc.DeviceFree(c->device, ptr);
}

extern "C" void replay_cub_counters(replay_cub *c, const size_t **cached, const size_t **live) {
  // operator[] makes the device's entry now; a std::map node never moves,
  // so the addresses hold for the allocator's life.
  auto &tb = c->alloc.cached_bytes[c->device];
  *cached = &tb.free;
  *live = &tb.live;
}

extern "C" size_t replay_cub_held(replay_cub *c) {
  std::lock_guard<std::mutex> g(c->alloc.mutex);
  const auto &tb = c->alloc.cached_bytes[c->device];
  return tb.free + tb.live;
}

extern "C" int replay_cub_destroy(replay_cub *c) {
  if (c == nullptr) return (int)cudaSuccess;
  cudaError_t e = c->alloc.FreeAllCached();
  delete c;
  return (int)e;
}
