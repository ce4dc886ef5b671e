// replay_gate.cu - --lag on CUDA streams (magpool-replay): gate kernels
// that hold each stream behind the replay, as a GPU busy with a program's
// kernels runs behind its host.  Compiled by nvcc, only when
// MAGPOOL_WITH_CUDA is on; the C interface is in replay.h.
//
// One mapped pinned word, `opened`, written by the host and polled by the
// kernels.  replay_gates_mark(g, st, n, mark) queues on each stream a
// one-thread kernel that spins until opened >= mark or MP_GATE_HOLD_NS
// have passed since it started (the globaltimer); the host then sets
// opened to mark - 1: the stream stops at the newest mark until the next
// one is queued, lag to 2 * lag events behind.  The bound in time is that of the host streams'
// marks (replay_magpool.c): a call that waits for a stream (cudaFree,
// magpool's out-of-memory path) ends, as it would on a GPU that finishes
// its work by itself.
#include <cuda_runtime_api.h>

#include <new>

#include "replay.h"

#define MP_GATE_HOLD_NS 2000000ull

struct replay_gates {
  volatile unsigned long long *host; // the host's view of `opened`
  unsigned long long *dev;           // the kernels' view
};

__global__ void k_gate(const volatile unsigned long long *opened, unsigned long long mark,
                       unsigned long long hold_ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (*opened < mark) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > hold_ns) break;
    __nanosleep(500);
  }
}

static int fail(const char *what, cudaError_t e) {
  fprintf(stderr, "magpool-replay: --lag: %s: %s\n", what, cudaGetErrorString(e));
  return -1;
}

extern "C" replay_gates *replay_gates_new(void) {
  replay_gates *g = new (std::nothrow) replay_gates;
  if (g == nullptr) return nullptr;
  void *h = nullptr;
  cudaError_t e = cudaHostAlloc(&h, sizeof(unsigned long long), cudaHostAllocMapped);
  if (e == cudaSuccess) e = cudaHostGetDevicePointer((void **)&g->dev, h, 0);
  if (e != cudaSuccess) {
    fail("a mapped pinned word", e);
    if (h != nullptr) cudaFreeHost(h);
    delete g;
    return nullptr;
  }
  g->host = (volatile unsigned long long *)h;
  *g->host = 0;
  return g;
}

extern "C" int replay_gates_mark(replay_gates *g, void **streams, uint32_t n, uint64_t mark) {
  for (uint32_t k = 0; k < n; k++) {
    k_gate<<<1, 1, 0, (cudaStream_t)streams[k]>>>(g->dev, mark, MP_GATE_HOLD_NS);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fail("a gate kernel", e);
  }
  replay_gates_set(g, mark - 1);
  return 0;
}

extern "C" void replay_gates_set(replay_gates *g, uint64_t opened) {
  // A plain store to mapped memory, which the kernels poll through
  // volatile loads; the fence keeps it after the launches before it.
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  *g->host = opened;
}

extern "C" void replay_gates_free(replay_gates *g) {
  if (g == nullptr) return;
  cudaFreeHost((void *)g->host);
  delete g;
}
