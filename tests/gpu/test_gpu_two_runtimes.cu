// test_gpu_two_runtimes.cu - two CUDA runtimes in one process: this
// program links the static CUDA runtime (nvcc's default) and dlopen()s
// the INSTALLED libmagpool.so, which links the shared one (libcudart.so)
// - as a program with its own runtime that loads magpool as a plugin.
// Streams made by this program's runtime, cudaStreamPerThread and the
// legacy stream (NULL and cudaStreamLegacy) go to magpool's
// alloc_async/free_async; kernels of this program's runtime write and
// check blocks on them; a block freed on a stream and taken again by
// another stream must not be overwritten before the first stream passed
// the free (a slow kernel holds it).
//
//   test_gpu_two_runtimes /path/to/libmagpool.so
// Exit status: 0 pass, 1 fail, 77 no usable GPU.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <magpool.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

int g_fail = 0;

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("two_runtimes: FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #x,      \
                  cudaGetErrorString(e_));                                           \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

#define EXPECT(c)                                                                    \
  do {                                                                               \
    if (!(c)) {                                                                      \
      std::printf("two_runtimes: FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);         \
      g_fail++;                                                                      \
    }                                                                                \
  } while (0)

struct Api {
  void (*config_init)(magpool_config_t *);
  int (*create)(const magpool_config_t *, magpool_t **);
  int (*destroy)(magpool_t *);
  void *(*alloc_async)(magpool_t *, size_t, magpool_stream_t);
  int (*free_async)(magpool_t *, void *, magpool_stream_t);
  int (*stream_release)(magpool_t *, magpool_stream_t);
  int (*trim)(magpool_t *);
  int (*check)(magpool_t *);
  int (*last_error)(void);
  int (*get_stats)(magpool_t *, magpool_stats_t *);
} mp;

void *sym(void *h, const char *n) {
  void *f = dlsym(h, n);
  if (f == nullptr) {
    std::printf("two_runtimes: FAIL no symbol %s\n", n);
    std::exit(1);
  }
  return f;
}

__global__ void fill(uint32_t *p, size_t n, uint32_t tag) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = tag ^ (uint32_t)i;
}

__global__ void count_bad(const uint32_t *p, size_t n, uint32_t tag, unsigned *bad) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (p[i] != (tag ^ (uint32_t)i)) atomicAdd(bad, 1u);
}

__global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// Allocate on s, fill, check on s, free on s: the round trip of one stream.
void round_trip(magpool_t *pool, cudaStream_t s, const char *name, uint32_t tag, unsigned *bad) {
  const size_t n = 1 << 18;
  for (int r = 0; r < 20; r++) {
    auto *p = (uint32_t *)mp.alloc_async(pool, n * 4, s);
    if (p == nullptr) {
      std::printf("two_runtimes: FAIL alloc_async on %s: %d\n", name, mp.last_error());
      g_fail++;
      return;
    }
    fill<<<64, 256, 0, s>>>(p, n, tag + r);
    count_bad<<<64, 256, 0, s>>>(p, n, tag + r, bad);
    EXPECT(mp.free_async(pool, p, s) == 0);
  }
  CK(cudaGetLastError());
  std::printf("two_runtimes: %s: 20 round trips\n", name);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) return 1;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("two_runtimes: no usable GPU: skipped\n");
    return 77;
  }
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    std::printf("two_runtimes: FAIL dlopen: %s\n", dlerror());
    return 1;
  }
  *(void **)&mp.config_init = sym(h, "magpool_config_init");
  *(void **)&mp.create = sym(h, "magpool_create");
  *(void **)&mp.destroy = sym(h, "magpool_destroy");
  *(void **)&mp.alloc_async = sym(h, "magpool_alloc_async");
  *(void **)&mp.free_async = sym(h, "magpool_free_async");
  *(void **)&mp.stream_release = sym(h, "magpool_stream_release");
  *(void **)&mp.trim = sym(h, "magpool_trim");
  *(void **)&mp.check = sym(h, "magpool_check");
  *(void **)&mp.last_error = sym(h, "magpool_last_error");
  *(void **)&mp.get_stats = sym(h, "magpool_get_stats");
  // Is the runtime in the process another one than magpool's?  Our own
  // symbol cudaMalloc is static (this binary); the library's is from
  // libcudart.so.
  void *theirs = dlsym(h, "cudaMalloc");
  void *ours = (void *)static_cast<cudaError_t (*)(void **, size_t)>(&cudaMalloc);
  std::printf("two_runtimes: magpool's cudaMalloc %p, this program's %p (%s)\n", theirs, ours,
              theirs != ours ? "two runtimes" : "one runtime");
  EXPECT(theirs != nullptr && theirs != ours);

  magpool_config_t cfg;
  mp.config_init(&cfg);
  cfg.kind = MAGPOOL_MEM_DEVICE;
  cfg.pool_size = (size_t)64 << 20;
  magpool_t *pool = nullptr;
  int rc = mp.create(&cfg, &pool);
  if (rc != 0) {
    std::printf("two_runtimes: FAIL create: %d\n", rc);
    return 1;
  }
  unsigned *bad = nullptr;
  CK(cudaMalloc(&bad, sizeof *bad));
  CK(cudaMemset(bad, 0, sizeof *bad));
  unsigned nbad = 0;
  cudaStream_t s1 = nullptr;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  round_trip(pool, s1, "a stream of this program's runtime", 0x1000, bad);
  round_trip(pool, cudaStreamPerThread, "cudaStreamPerThread", 0x2000, bad);
  round_trip(pool, nullptr, "the legacy stream (NULL)", 0x3000, bad);
  round_trip(pool, cudaStreamLegacy, "cudaStreamLegacy", 0x4000, bad);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
  EXPECT(nbad == 0);

  const size_t n = (size_t)16 << 20;  // 64 MiB: the whole pool
  // Not asserted: whether the out-of-memory ladder alone gets back what
  // the calling thread cached for its per-thread and legacy streams.
  {
    void *w = mp.alloc_async(pool, n * 4 - 4096, s1);
    magpool_stats_t st;
    mp.get_stats(pool, &st);
    std::printf("two_runtimes: NOTE whole-pool alloc_async before any release: %s "
                "(cached %zu, pending %zu)\n", w != nullptr ? "ok" : "ENOMEM",
                st.cached_bytes, st.pending_bytes);
    if (w != nullptr) EXPECT(mp.free_async(pool, w, s1) == 0);
  }
  // Done with these streams on this pool (magpool_stream_release's use).
  EXPECT(mp.stream_release(pool, cudaStreamPerThread) == 0);
  EXPECT(mp.stream_release(pool, nullptr) == 0);
  EXPECT(mp.stream_release(pool, cudaStreamLegacy) == 0);

  // Stream order across runtimes: a block freed on s1 behind a slow
  // kernel must not be handed to another stream before s1 passed it.
  auto *p = (uint32_t *)mp.alloc_async(pool, n * 4 - 4096, s1);
  EXPECT(p != nullptr);
  if (p == nullptr) {
    magpool_stats_t st;
    mp.get_stats(pool, &st);
    std::printf("two_runtimes: whole-pool alloc_async failed: %d; used %zu cached %zu "
                "pending %zu free %zu largest %zu reserved %zu live %llu\n", mp.last_error(),
                st.used_bytes, st.cached_bytes, st.pending_bytes, st.free_bytes,
                st.largest_free_block, st.reserved_bytes, (unsigned long long)st.live_count);
  }
  if (p != nullptr) {
    fill<<<64, 256, 0, s1>>>(p, n / 2, 0x5000);
    spin<<<1, 1, 0, s1>>>(200LL * 1000 * 1000);  // ~0.1 s
    count_bad<<<64, 256, 0, s1>>>(p, n / 2, 0x5000, bad);
    EXPECT(mp.free_async(pool, p, s1) == 0);
    auto *q = (uint32_t *)mp.alloc_async(pool, n * 4 - 4096, cudaStreamPerThread);
    EXPECT(q != nullptr);  // waited for s1: the pool is one block
    if (q != nullptr) {
      fill<<<64, 256, 0, cudaStreamPerThread>>>(q, n / 2, 0x6000);
      EXPECT(mp.free_async(pool, q, cudaStreamPerThread) == 0);
    }
  }
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
  EXPECT(nbad == 0);
  EXPECT(mp.stream_release(pool, s1) == 0);
  EXPECT(mp.stream_release(pool, cudaStreamPerThread) == 0);
  EXPECT(mp.trim(pool) == 0);
  EXPECT(mp.check(pool) == 0);
  EXPECT(mp.destroy(pool) == 0);
  CK(cudaStreamDestroy(s1));
  CK(cudaFree(bad));
  std::printf("two_runtimes: %s\n", g_fail ? "FAIL" : "PASS");
  return g_fail ? 1 : 0;
}
