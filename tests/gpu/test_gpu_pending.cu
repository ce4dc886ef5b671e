// test_gpu_pending.cu - the out-of-memory promise on real CUDA streams:
// MAGPOOL_ENOMEM only when the memory truly is not there, never while it
// is pending on a stream.
//
// Usage: test_gpu_pending [ROUNDS]    (default 400; MAGPOOL_GPU_TEST_SMALL=1
//                                      in the environment: 40, for the
//                                      compute-sanitizer runs)
//
// 8 host threads, one non-blocking CUDA stream each, one 64 MiB DEVICE
// pool.  Each thread, ROUNDS times: allocate 4 MiB on its stream, run a
// kernel of about 0.2 ms on it that writes the block, free it on the
// stream.  At most 8 x 4 MiB = 32 MiB is ever live; everything else is
// pending behind the kernels or free.  Every allocation must succeed.
//
// Exit status: 0 pass, 1 fail, 77 no usable GPU (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>
#include <magpool.h>

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kThreads = 8;
constexpr size_t kBlock = 4u << 20;
constexpr size_t kPool = 64u << 20;

std::atomic<int> g_fail{0};
std::atomic<long> g_enomem{0}, g_allocs{0};
std::atomic<int> g_snap_taken{0};
magpool_stats_t g_snap; // the pool right after the first ENOMEM

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "gpu_pending: FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #x, \
                   cudaGetErrorString(e_));                                          \
      g_fail++;                                                                      \
    }                                                                                \
  } while (0)

__device__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Writes the block, then holds the stream for about ns nanoseconds.
__global__ void k_write_hold(uint32_t *p, size_t n, uint32_t tag, unsigned long long ns) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = tag ^ (uint32_t)i;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long t0 = gtimer();
    while (gtimer() - t0 < ns) {
    }
  }
}

struct worker_arg {
  magpool_t *pool;
  int id;
  int rounds;
};

void *worker(void *varg) {
  worker_arg *a = static_cast<worker_arg *>(varg);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int r = 0; r < a->rounds; r++) {
    void *p = magpool_alloc_async(a->pool, kBlock, s);
    g_allocs++;
    if (p == nullptr) {
      if (magpool_last_error() == MAGPOOL_ENOMEM) {
        if (g_enomem++ == 0 && !g_snap_taken.exchange(1)) magpool_get_stats(a->pool, &g_snap);
      } else {
        g_fail++;
      }
      continue;
    }
    k_write_hold<<<64, 256, 0, s>>>(static_cast<uint32_t *>(p), kBlock / 4,
                                    (uint32_t)(a->id * 100000 + r), 200000ull);
    CK(cudaGetLastError());
    if (magpool_free_async(a->pool, p, s) != 0) g_fail++;
  }
  CK(cudaStreamSynchronize(s));
  if (magpool_stream_release(a->pool, s) != 0) g_fail++;
  CK(cudaStreamSynchronize(s));
  CK(cudaStreamDestroy(s));
  return nullptr;
}

}  // namespace

int main(int argc, char **argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int rounds = std::getenv("MAGPOOL_GPU_TEST_SMALL") ? 40 : 400;
  if (argc > 1) rounds = std::atoi(argv[1]);
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    std::printf("gpu_pending: SKIP (no CUDA device: %s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  CK(cudaSetDevice(0));
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.kind = MAGPOOL_MEM_DEVICE;
  cfg.pool_size = kPool;
  magpool_t *pool = nullptr;
  int rc = magpool_create(&cfg, &pool);
  if (rc != 0) {
    std::printf("gpu_pending: FAIL magpool_create: %s\n", magpool_strerror(rc));
    return 1;
  }
  pthread_t th[kThreads];
  worker_arg args[kThreads];
  for (int i = 0; i < kThreads; i++) {
    args[i] = {pool, i, rounds};
    pthread_create(&th[i], nullptr, worker, &args[i]);
  }
  for (int i = 0; i < kThreads; i++) pthread_join(th[i], nullptr);
  magpool_stats_t st;
  magpool_get_stats(pool, &st);
  if (magpool_trim(pool) != 0 || magpool_check(pool) != 0) g_fail++;
  void *all = magpool_alloc(pool, kPool);
  if (all == nullptr) {
    std::printf("gpu_pending: FAIL the whole pool is not one block after trim\n");
    g_fail++;
  } else {
    magpool_free(pool, all);
  }
  magpool_destroy(pool);
  std::printf("gpu_pending: %ld allocations of 4 MiB on a 64 MiB pool, %ld ENOMEM, "
              "peak %zu bytes\n",
              g_allocs.load(), g_enomem.load(), st.peak_used_bytes);
  if (g_snap_taken)
    std::printf("gpu_pending: at the first ENOMEM: used %zu, cached %zu, pending %zu, free %zu, "
                "largest free %zu, live %llu\n",
                g_snap.used_bytes, g_snap.cached_bytes, g_snap.pending_bytes, g_snap.free_bytes,
                g_snap.largest_free_block, (unsigned long long)g_snap.live_count);
  bool ok = g_fail == 0 && g_enomem == 0;
  std::printf("gpu_pending: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
