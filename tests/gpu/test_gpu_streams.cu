// test_gpu_streams.cu - stream-ordered allocation on real CUDA streams.
//
// Usage: test_gpu_streams [TOTAL_ALLOCS [POOL_MIB]]
//   TOTAL_ALLOCS  allocations over all threads (default 131072, >= 10^5;
//                 4096 with MAGPOOL_GPU_TEST_SMALL=1 in the environment,
//                 for compute-sanitizer)
//   POOL_MIB      DEVICE pool size in MiB (default 1024)
//
// 8 host threads share 8 CUDA streams (non-blocking, so that no implicit
// synchronisation hides a bug).  Each thread loops:
//
//   p = magpool_alloc_async(pool, size, s)     size 256 B .. 64 KiB
//   [spin ~10 ms on s]                         sometimes: the whole chain lags
//   k_write<<<.., s>>>(p, tag)                 tag = stream slot, thread, serial
//   [spin ~10 ms on s]                         sometimes: the check lags
//   k_check<<<.., s>>>(p, tag)                 counts mismatches on the device
//   [spin ~10 ms on s]                         sometimes: the free is pending long
//   magpool_free_async(pool, p, s)             or: on another stream after an
//                                              event wait, or magpool_free after
//                                              cudaStreamSynchronize
//
// If magpool handed p to another stream before s passed the free, that
// stream's k_write would overwrite p while s's k_check has not run yet, and
// the device corruption counter moves.  Also: streams are released,
// destroyed and recreated mid-run (handles may be reused), two threads use
// cudaStreamPerThread and two the legacy default stream for part of their
// work, one thread calls magpool_trim now and then, and a few blocks come
// from the synchronous magpool_alloc.
//
// At the end: corruption counter 0, every check kernel ran, and after
// release + trim the pool is empty, nothing pending or cached, magpool_check
// passes and the whole pool is one block again.
//
// Exit status: 0 pass, 1 fail, 77 no usable GPU (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>
#include <magpool.h>

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

namespace {

constexpr int kThreads = 8;
constexpr int kStreams = 8;
constexpr int kRecreateEvery = 1500;  // per thread, iterations
constexpr int kTrimEvery = 700;       // thread 0, iterations
constexpr double kSpinMs = 10.0;

[[noreturn]] void die(const char *file, int line, const char *what, const char *why) {
  std::fprintf(stderr, "gpu_streams: FAIL %s:%d: %s: %s\n", file, line, what, why);
  std::fflush(stderr);
  std::fflush(stdout);
  _exit(1);
}

#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e_ = (x);                                              \
    if (e_ != cudaSuccess) die(__FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
  } while (0)

#define MP(x)                                                          \
  do {                                                                 \
    int r_ = (x);                                                      \
    if (r_ != 0) die(__FILE__, __LINE__, #x, magpool_strerror(r_));    \
  } while (0)

#define REQUIRE(c, ...)                                                \
  do {                                                                 \
    if (!(c)) {                                                        \
      char m_[512];                                                    \
      std::snprintf(m_, sizeof m_, __VA_ARGS__);                       \
      die(__FILE__, __LINE__, #c, m_);                                 \
    }                                                                  \
  } while (0)

__device__ unsigned long long g_corrupt;  // CUDA blocks that saw a bad word
__device__ unsigned long long g_checked;  // check kernels that ran

__device__ __forceinline__ uint32_t pat(uint64_t tag, uint32_t i) {
  uint64_t x = tag * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD6E8FEB86659FD93ull;
  x ^= x >> 31;
  return (uint32_t)x ^ (uint32_t)(x >> 32);
}

__global__ void k_write(uint32_t *p, uint32_t nwords, uint64_t tag) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < nwords;
       i += gridDim.x * blockDim.x)
    p[i] = pat(tag, i);
}

__global__ void k_check(const uint32_t *p, uint32_t nwords, uint64_t tag) {
  int bad = 0;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < nwords;
       i += gridDim.x * blockDim.x)
    if (p[i] != pat(tag, i)) bad = 1;
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    if (bad) atomicAdd(&g_corrupt, 1ull);
    if (blockIdx.x == 0) atomicAdd(&g_checked, 1ull);
  }
}

__global__ void k_spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

struct Slot {
  pthread_rwlock_t lk;  // read: enqueue on s; write: release/destroy/recreate
  cudaStream_t s;
};

Slot g_slot[kStreams];
magpool_t *g_pool;
long long g_spin_cycles;
long g_iters;  // per thread

std::atomic<long> n_allocs{0}, n_sync_allocs{0}, n_cross{0}, n_sync_free{0}, n_recreate{0},
    n_ptds{0}, n_legacy{0}, n_spins{0}, n_trims{0};

void launch_pair_grid(uint32_t nwords, unsigned *grid) {
  unsigned g = (nwords + 255) / 256;
  *grid = g < 64 ? g : 64;
}

void recreate(int k) {
  Slot &sl = g_slot[k];
  pthread_rwlock_wrlock(&sl.lk);
  // Stream-ordered contract: release before destroying.  Work still queued
  // on the old stream (spins, checks, retire callbacks) keeps running.
  MP(magpool_stream_release(g_pool, (magpool_stream_t)sl.s));
  CK(cudaStreamDestroy(sl.s));
  CK(cudaStreamCreateWithFlags(&sl.s, cudaStreamNonBlocking));
  pthread_rwlock_unlock(&sl.lk);
  n_recreate++;
}

void *worker(void *arg) {
  const int id = (int)(intptr_t)arg;
  CK(cudaSetDevice(0));
  std::mt19937_64 rng(0xC0FFEEull + (uint64_t)id * 7919);
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  const bool uses_ptds = id == 4 || id == 6;
  const bool uses_legacy = id == 5 || id == 7;
  bool used_ptds = false;

  for (long i = 0; i < g_iters; i++) {
    if (i % kRecreateEvery == kRecreateEvery / 2) recreate((int)(rng() % kStreams));
    if (id == 0 && i % kTrimEvery == kTrimEvery - 1) {
      MP(magpool_trim(g_pool));
      n_trims++;
    }

    // Which stream: a shared slot, or this thread's per-thread stream, or
    // the legacy default stream.
    int k = -1;
    cudaStream_t s;
    unsigned pick = (unsigned)(rng() % 4);
    if (uses_ptds && pick == 0) {
      s = cudaStreamPerThread;
      used_ptds = true;
      n_ptds++;
    } else if (uses_legacy && pick == 0) {
      s = 0;  // legacy default stream
      n_legacy++;
    } else {
      k = (int)(rng() % kStreams);
      pthread_rwlock_rdlock(&g_slot[k].lk);
      s = g_slot[k].s;
    }

    size_t size = 256 + (size_t)(rng() % (65536 - 256 + 1));
    size &= ~(size_t)3;
    bool sync_alloc = rng() % 32 == 0;
    void *p = sync_alloc ? magpool_alloc(g_pool, size)
                         : magpool_alloc_async(g_pool, size, (magpool_stream_t)s);
    REQUIRE(p != nullptr, "thread %d iter %ld: %s of %zu bytes failed: %s", id, i,
            sync_alloc ? "magpool_alloc" : "magpool_alloc_async", size,
            magpool_strerror(magpool_last_error()));
    n_allocs++;
    if (sync_alloc) n_sync_allocs++;

    uint32_t nwords = (uint32_t)(size / 4);
    uint64_t tag = ((uint64_t)(k + 2) << 56) | ((uint64_t)id << 48) | (uint64_t)i;
    unsigned grid;
    launch_pair_grid(nwords, &grid);
    unsigned r = (unsigned)(rng() % 1000);
    // Threads on the per-thread stream spin more: their frees then sit in
    // a cache whose stream is far behind (see the trim in thread 0).
    unsigned spin_rate = (k < 0) ? 60 : 15;  // per mille, each position
    if (r < spin_rate) {
      k_spin<<<1, 1, 0, s>>>(g_spin_cycles);
      n_spins++;
    }
    k_write<<<grid, 256, 0, s>>>((uint32_t *)p, nwords, tag);
    if (r >= spin_rate && r < 2 * spin_rate) {
      k_spin<<<1, 1, 0, s>>>(g_spin_cycles);
      n_spins++;
    }
    k_check<<<grid, 256, 0, s>>>((const uint32_t *)p, nwords, tag);
    if (r >= 2 * spin_rate && r < 3 * spin_rate) {
      k_spin<<<1, 1, 0, s>>>(g_spin_cycles);
      n_spins++;
    }
    CK(cudaGetLastError());

    unsigned mode = (unsigned)(rng() % 16);
    if (mode == 0) {
      // Synchronous free once the stream is done with the block.
      CK(cudaStreamSynchronize(s));
      MP(magpool_free(g_pool, p));
      n_sync_free++;
    } else if (mode <= 2 && k >= 0) {
      // Cross-stream free: stream m waits for s, then frees on m.
      int m = (k + 1 + (int)(rng() % (kStreams - 1))) % kStreams;
      pthread_rwlock_rdlock(&g_slot[m].lk);
      cudaStream_t sm = g_slot[m].s;
      CK(cudaEventRecord(ev, s));
      CK(cudaStreamWaitEvent(sm, ev, 0));
      MP(magpool_free_async(g_pool, p, (magpool_stream_t)sm));
      pthread_rwlock_unlock(&g_slot[m].lk);
      n_cross++;
    } else {
      MP(magpool_free_async(g_pool, p, (magpool_stream_t)s));
    }
    if (k >= 0) pthread_rwlock_unlock(&g_slot[k].lk);
  }

  if (used_ptds) {
    // cudaStreamPerThread is this thread's own stream: release it here.
    CK(cudaStreamSynchronize(cudaStreamPerThread));
    MP(magpool_stream_release(g_pool, (magpool_stream_t)cudaStreamPerThread));
  }
  CK(cudaEventDestroy(ev));
  return nullptr;
}

}  // namespace

int main(int argc, char **argv) {
  // MAGPOOL_GPU_TEST_SMALL: a size compute-sanitizer gets through.
  long total = argc > 1 ? std::strtol(argv[1], nullptr, 10)
                        : std::getenv("MAGPOOL_GPU_TEST_SMALL") ? 4096 : 131072;
  long pool_mib = argc > 2 ? std::strtol(argv[2], nullptr, 10) : 1024;
  if (total < kThreads || pool_mib < 64) {
    std::fprintf(stderr, "usage: %s [TOTAL_ALLOCS >= %d [POOL_MIB >= 64]]\n", argv[0], kThreads);
    return 1;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    std::printf("gpu_streams: SKIP (no CUDA device: %s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  CK(cudaSetDevice(0));
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  REQUIRE(clock_khz > 0, "clock rate %d kHz", clock_khz);
  g_spin_cycles = (long long)(kSpinMs * clock_khz);  // kHz * ms = cycles

  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.kind = MAGPOOL_MEM_DEVICE;
  cfg.device = 0;
  cfg.pool_size = (size_t)pool_mib << 20;
  // A small stream cache: batches are retired (and come back through the
  // ready list) thousands of times instead of staying on their stream.
  cfg.stream_cache_bytes = 256 << 10;
  int rc = magpool_create(&cfg, &g_pool);
  if (rc == MAGPOOL_ENODEV) {
    std::printf("gpu_streams: SKIP (magpool_create: %s)\n", magpool_strerror(rc));
    return 77;
  }
  MP(rc);

  for (int k = 0; k < kStreams; k++) {
    pthread_rwlock_init(&g_slot[k].lk, nullptr);
    CK(cudaStreamCreateWithFlags(&g_slot[k].s, cudaStreamNonBlocking));
  }
  unsigned long long zero = 0;
  CK(cudaMemcpyToSymbol(g_corrupt, &zero, sizeof zero));
  CK(cudaMemcpyToSymbol(g_checked, &zero, sizeof zero));
  CK(cudaDeviceSynchronize());

  g_iters = (total + kThreads - 1) / kThreads;
  auto t0 = std::chrono::steady_clock::now();
  pthread_t th[kThreads];
  for (int t = 0; t < kThreads; t++)
    REQUIRE(pthread_create(&th[t], nullptr, worker, (void *)(intptr_t)t) == 0, "pthread_create");
  for (int t = 0; t < kThreads; t++) REQUIRE(pthread_join(th[t], nullptr) == 0, "pthread_join");
  CK(cudaDeviceSynchronize());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  unsigned long long corrupt = 0, checked = 0;
  CK(cudaMemcpyFromSymbol(&corrupt, g_corrupt, sizeof corrupt));
  CK(cudaMemcpyFromSymbol(&checked, g_checked, sizeof checked));

  // Everything was freed by the threads.  Release the streams, wait for
  // the retire callbacks, trim: the pool must be whole again.
  for (int k = 0; k < kStreams; k++) MP(magpool_stream_release(g_pool, (magpool_stream_t)g_slot[k].s));
  MP(magpool_stream_release(g_pool, nullptr));  // the legacy default stream
  CK(cudaDeviceSynchronize());
  MP(magpool_trim(g_pool));
  magpool_stats_t st;
  MP(magpool_get_stats(g_pool, &st));
  int check = magpool_check(g_pool);
  void *all = magpool_alloc(g_pool, cfg.pool_size);
  if (all != nullptr) MP(magpool_free(g_pool, all));

  long allocs = n_allocs.load();
  std::printf("gpu_streams: %ld allocs, %d threads, %d streams, %llu corruptions "
              "(%llu checks, %ld cross-stream frees, %ld sync frees, %ld sync allocs, "
              "%ld recreations, %ld per-thread-stream and %ld legacy-stream uses, %ld spins, "
              "%ld trims, %.1f s)\n",
              allocs, kThreads, kStreams, corrupt, checked, n_cross.load(), n_sync_free.load(),
              n_sync_allocs.load(), n_recreate.load(), n_ptds.load(), n_legacy.load(),
              n_spins.load(), n_trims.load(), secs);
  std::printf("gpu_streams: after trim: used %zu, pending %zu, cached %zu, live %" PRIu64
              ", check %d, whole-pool alloc %s\n",
              st.used_bytes, st.pending_bytes, st.cached_bytes, st.live_count, check,
              all != nullptr ? "ok" : "FAILED");

  bool ok = true;
  auto expect = [&ok](bool c, const char *what) {
    if (!c) {
      std::printf("gpu_streams: FAIL: %s\n", what);
      ok = false;
    }
  };
  expect(allocs >= 100000 || total < 100000, "fewer than 10^5 allocations");
  expect(corrupt == 0, "blocks were overwritten before their stream passed the free");
  expect(checked == (unsigned long long)allocs, "not every check kernel ran");
  expect(st.used_bytes == 0, "used_bytes != 0 after everything was freed");
  expect(st.live_count == 0, "live_count != 0");
  expect(st.pending_bytes == 0, "pending_bytes != 0 after device synchronize");
  expect(st.cached_bytes == 0, "cached_bytes != 0 after release and trim");
  expect(check == 0, "magpool_check failed");
  expect(all != nullptr, "the whole pool is not one block after trim");

  for (int k = 0; k < kStreams; k++) {
    CK(cudaStreamDestroy(g_slot[k].s));
    pthread_rwlock_destroy(&g_slot[k].lk);
  }
  MP(magpool_destroy(g_pool));
  std::printf("gpu_streams: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
