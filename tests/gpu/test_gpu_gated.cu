// test_gpu_gated.cu - deterministic stream-ordering checks on CUDA streams.
//
// A "gate" kernel blocks a stream until the host opens it (it polls a flag
// in mapped pinned memory), so a stream can be held behind its frees for as
// long as the test needs, with no timing assumptions:
//
//   1. gated_stream: thousands of blocks freed on a blocked stream A (small
//      stream cache: retired in many batches) must not reach stream B or
//      magpool_alloc, nor be trimmed back, until A passes the frees.  Work
//      on A writes each block before the gate and checks it after; work on
//      B writes every block B gets.
//   2. per_thread_stream_trim: thread T frees blocks on cudaStreamPerThread
//      while its per-thread stream is blocked; then ANOTHER thread calls
//      magpool_trim, which retires T's per-thread stream cache.  Those
//      blocks must stay pending until T's stream passes the frees: the
//      retire must go behind T's stream, not behind the trimming thread's
//      own per-thread stream (cudaStreamPerThread names a different stream
//      on every thread).
//   3. cross_stream_reuse: on a pool with the field set, a request on B at
//      a new peak takes a run freed on gated A at once, and B's work
//      queued after the allocation runs only once A has passed: A checks
//      the run's pattern after its gate, B overwrites it right after the
//      allocation.  Had B not waited for A, A's check would fail.
//
// While a stream is gated the test thread makes no CUDA call that might
// wait for the whole device (cudaMalloc, cudaFree, pageable copies, first
// launch of a kernel: kernels are loaded eagerly up front).
//
// Set MAGPOOL_TEST_TRACE=1 for timestamped progress on stderr, and
// MAGPOOL_GPU_TEST_SMALL=1 for a size compute-sanitizer gets through.
//
// Exit status: 0 pass, 1 fail, 77 no usable GPU (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>
#include <magpool.h>

#define GPU_TEST "gpu_gated"
#include "gpu_check.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <stdlib.h>
#include <vector>

namespace {

// MAGPOOL_TEST_TRACE=1: timestamped progress on stderr (to see where a run
// waits, e.g. for a gated stream).
double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
const double g_t0 = now_s();
const bool g_trace = std::getenv("MAGPOOL_TEST_TRACE") != nullptr;
#define TRACE(...)                                                                     \
  do {                                                                                 \
    if (g_trace) {                                                                     \
      std::fprintf(stderr, "[%8.3f] ", now_s() - g_t0);                                \
      std::fprintf(stderr, __VA_ARGS__);                                               \
      std::fprintf(stderr, "\n");                                                      \
    }                                                                                  \
  } while (0)

__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Blocks its stream until *flag != 0 (set by the host) or timeout_ns passed
// (then it records the timeout, which fails the test).
__global__ void k_gate(volatile int *flag, unsigned long long timeout_ns, int *timed_out) {
  unsigned long long t0 = gtimer();
  while (*flag == 0) {
    if (gtimer() - t0 > timeout_ns) {
      *timed_out = 1;
      break;
    }
    __nanosleep(20000);
  }
}

__device__ __forceinline__ uint32_t pat(uint64_t tag, uint32_t i) {
  uint64_t x = tag * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD6E8FEB86659FD93ull;
  x ^= x >> 31;
  return (uint32_t)x ^ (uint32_t)(x >> 32);
}

// Block b of a batch: p[b] of n[b] words, tag base + b.
__global__ void k_fill_many(uint32_t *const *p, const uint32_t *n, uint64_t base) {
  uint32_t *q = p[blockIdx.x];
  for (uint32_t i = threadIdx.x; i < n[blockIdx.x]; i += blockDim.x)
    q[i] = pat(base + blockIdx.x, i);
}

__global__ void k_check_many(uint32_t *const *p, const uint32_t *n, uint64_t base,
                             unsigned long long *bad) {
  const uint32_t *q = p[blockIdx.x];
  int b = 0;
  for (uint32_t i = threadIdx.x; i < n[blockIdx.x]; i += blockDim.x)
    if (q[i] != pat(base + blockIdx.x, i)) b = 1;
  b = __syncthreads_or(b);
  if (threadIdx.x == 0 && b) atomicAdd(bad, 1ull);
}

__global__ void k_fill1(uint32_t *p, uint32_t n, uint64_t tag) {
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) p[i] = pat(tag, i);
}

__global__ void k_check1(const uint32_t *p, uint32_t n, uint64_t tag, unsigned long long *bad) {
  int b = 0;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
    if (p[i] != pat(tag, i)) b = 1;
  b = __syncthreads_or(b);
  if (threadIdx.x == 0 && b) atomicAdd(bad, 1ull);
}

// A mapped pinned word the host writes and a gate kernel reads.
struct Gate {
  int *h = nullptr, *d = nullptr;        // flag
  int *h_to = nullptr, *d_to = nullptr;  // timed out
  void init() {
    CK(cudaHostAlloc((void **)&h, sizeof(int), cudaHostAllocMapped));
    CK(cudaHostAlloc((void **)&h_to, sizeof(int), cudaHostAllocMapped));
    *h = 0;
    *h_to = 0;
    CK(cudaHostGetDevicePointer((void **)&d, h, 0));
    CK(cudaHostGetDevicePointer((void **)&d_to, h_to, 0));
  }
  void block(cudaStream_t s) {
    k_gate<<<1, 1, 0, s>>>(d, 60ull * 1000 * 1000 * 1000, d_to);
    CK(cudaGetLastError());
  }
  void open() { __atomic_store_n(h, 1, __ATOMIC_SEQ_CST); }
  void done(const char *what) {
    EXPECT(__atomic_load_n(h_to, __ATOMIC_SEQ_CST) == 0,
           "%s: the gate kernel timed out: the host never opened it", what);
    CK(cudaFreeHost(h));
    CK(cudaFreeHost(h_to));
  }
};

// Pointers and sizes of a batch of blocks, on the device, for the
// many-block kernels (kept outside the pool).
struct Batch {
  std::vector<uint32_t *> p;
  std::vector<uint32_t> n;
  uint32_t **dp = nullptr;
  uint32_t *dn = nullptr;
  // On s, not the legacy stream: that one would wait for every blocking
  // stream, a gated per-thread stream included.
  void upload(cudaStream_t s) {
    CK(cudaMalloc(&dp, p.size() * sizeof *dp));
    CK(cudaMalloc(&dn, n.size() * sizeof *dn));
    CK(cudaMemcpyAsync(dp, p.data(), p.size() * sizeof *dp, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyAsync(dn, n.data(), n.size() * sizeof *dn, cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
  }
  void fill(cudaStream_t s, uint64_t base) {
    for (size_t off = 0; off < p.size(); off += 65535) {
      unsigned g = (unsigned)std::min<size_t>(65535, p.size() - off);
      k_fill_many<<<g, 128, 0, s>>>(dp + off, dn + off, base + off);
    }
    CK(cudaGetLastError());
  }
  // One launch per block and no device memory for the arrays: for use
  // while a stream is gated (no cudaMalloc, no pageable copy then).
  void fill_each(cudaStream_t s, uint64_t base) {
    for (size_t i = 0; i < p.size(); i++) k_fill1<<<1, 128, 0, s>>>(p[i], n[i], base + i);
    CK(cudaGetLastError());
  }
  void check_each(cudaStream_t s, uint64_t base, unsigned long long *bad) {
    for (size_t i = 0; i < p.size(); i++) k_check1<<<1, 128, 0, s>>>(p[i], n[i], base + i, bad);
    CK(cudaGetLastError());
  }
  void check(cudaStream_t s, uint64_t base, unsigned long long *bad) {
    for (size_t off = 0; off < p.size(); off += 65535) {
      unsigned g = (unsigned)std::min<size_t>(65535, p.size() - off);
      k_check_many<<<g, 128, 0, s>>>(dp + off, dn + off, base + off, bad);
    }
    CK(cudaGetLastError());
  }
  void release() {
    if (dp != nullptr) CK(cudaFree(dp));
    if (dn != nullptr) CK(cudaFree(dn));
  }
};

// Sorted [lo, hi) ranges of freed blocks.
struct Ranges {
  std::vector<std::pair<uintptr_t, uintptr_t>> r;
  void add(const void *p, size_t n) { r.push_back({(uintptr_t)p, (uintptr_t)p + n}); }
  void seal() { std::sort(r.begin(), r.end()); }
  bool overlaps(const void *p, size_t n) const {
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    auto it = std::lower_bound(r.begin(), r.end(), std::make_pair(hi, (uintptr_t)0));
    if (it == r.begin()) return false;
    --it;
    return it->second > lo;
  }
};

magpool_t *make_pool(size_t size, size_t stream_cache, size_t thread_cache) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.kind = MAGPOOL_MEM_DEVICE;
  cfg.device = 0;
  cfg.pool_size = size;
  cfg.stream_cache_bytes = stream_cache;
  cfg.thread_cache_bytes = thread_cache;
  magpool_t *pool = nullptr;
  int rc = magpool_create(&cfg, &pool);
  REQUIRE(rc == 0, "magpool_create: %s", magpool_strerror(rc));
  return pool;
}

magpool_stats_t stats(magpool_t *pool) {
  magpool_stats_t st;
  REQUIRE(magpool_get_stats(pool, &st) == 0, "stats");
  return st;
}

void expect_empty(magpool_t *pool, size_t size, const char *what) {
  EXPECT(magpool_trim(pool) == 0, "%s: trim", what);
  magpool_stats_t st = stats(pool);
  EXPECT(st.used_bytes == 0, "%s: used_bytes %zu", what, st.used_bytes);
  EXPECT(st.pending_bytes == 0, "%s: pending_bytes %zu", what, st.pending_bytes);
  EXPECT(st.cached_bytes == 0, "%s: cached_bytes %zu", what, st.cached_bytes);
  EXPECT(magpool_check(pool) == 0, "%s: magpool_check", what);
  void *all = magpool_alloc(pool, size);
  EXPECT(all != nullptr, "%s: whole pool not one block after trim", what);
  if (all != nullptr) EXPECT(magpool_free(pool, all) == 0, "%s: free", what);
}

// Allocates count blocks of n bytes on s (nullptr: magpool_alloc), checks
// none overlaps `freed`, and appends them to b.  Returns how many overlap.
size_t grab(magpool_t *pool, cudaStream_t s, bool sync, size_t count, size_t n,
            const Ranges &freed, Batch &b) {
  size_t hits = 0;
  for (size_t i = 0; i < count; i++) {
    void *q = sync ? magpool_alloc(pool, n) : magpool_alloc_async(pool, n, (magpool_stream_t)s);
    REQUIRE(q != nullptr, "allocation failed: %s", magpool_strerror(magpool_last_error()));
    if (freed.overlaps(q, n)) hits++;
    b.p.push_back((uint32_t *)q);
    b.n.push_back((uint32_t)(n / 4));
  }
  return hits;
}

// ------------------------------------------------------------------ 1 --

void gated_stream() {
  const size_t PS = 256u << 20, SC = 64u << 10;
  // MAGPOOL_GPU_TEST_SMALL: a size compute-sanitizer gets through.
  const size_t N = std::getenv("MAGPOOL_GPU_TEST_SMALL") ? 512 : 8192, SZ = 1024;
  magpool_t *pool = make_pool(PS, SC, 4u << 20);
  cudaStream_t A, B;
  CK(cudaStreamCreateWithFlags(&A, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&B, cudaStreamNonBlocking));
  unsigned long long *bad;
  CK(cudaMalloc(&bad, sizeof *bad));
  CK(cudaMemset(bad, 0, sizeof *bad));
  Gate g;
  g.init();

  Batch a;
  for (size_t i = 0; i < N; i++) {
    void *p = magpool_alloc_async(pool, SZ, (magpool_stream_t)A);
    REQUIRE(p != nullptr, "alloc on A");
    a.p.push_back((uint32_t *)p);
    a.n.push_back(SZ / 4);
  }
  TRACE("gated: %zu blocks allocated on A", N);
  a.upload(A);
  a.fill(A, 1000000);
  g.block(A);
  a.check(A, 1000000, bad);
  TRACE("gated: A filled, gate and check queued");
  Ranges freed;
  for (size_t i = 0; i < N; i++) {
    EXPECT(magpool_free_async(pool, a.p[i], (magpool_stream_t)A) == 0, "free_async");
    freed.add(a.p[i], SZ);
  }
  freed.seal();
  TRACE("gated: freed on A");
  magpool_stats_t st = stats(pool);
  EXPECT(st.pending_bytes + 2 * SC >= N * SZ && st.pending_bytes <= N * SZ,
         "pending_bytes %zu after freeing %zu bytes on blocked A (stream cache %zu)",
         st.pending_bytes, N * SZ, SC);

  Batch b;
  size_t hits = 0;
  hits += grab(pool, B, false, 4000, SZ, freed, b);
  hits += grab(pool, B, true, 4000, SZ, freed, b);
  hits += grab(pool, B, false, 500, 4096, freed, b);
  TRACE("gated: first allocations elsewhere");
  EXPECT(magpool_trim(pool) == 0, "trim");
  st = stats(pool);
  EXPECT(st.pending_bytes == N * SZ,
         "pending_bytes %zu after trim with A blocked, expected %zu", st.pending_bytes,
         N * SZ);
  hits += grab(pool, B, false, 4000, SZ, freed, b);
  hits += grab(pool, B, true, 4000, SZ, freed, b);
  EXPECT(hits == 0, "%zu allocations elsewhere got blocks freed on A before A passed the frees",
         hits);
  TRACE("gated: trim and second allocations");
  b.fill_each(B, 2000000);  // would break A's patterns if any block were shared
  CK(cudaStreamSynchronize(B));

  TRACE("gated: B filled, opening the gate");
  g.open();
  CK(cudaStreamSynchronize(A));
  TRACE("gated: A done");
  unsigned long long nbad = 1;
  CK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
  EXPECT(nbad == 0, "%llu blocks freed on A were overwritten before A reached the frees", nbad);
  g.done("gated_stream");
  CK(cudaMemset(bad, 0, sizeof *bad));
  b.check_each(B, 2000000, bad);
  CK(cudaStreamSynchronize(B));
  CK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
  EXPECT(nbad == 0, "%llu of B's live blocks lost their pattern", nbad);
  for (size_t i = 0; i < b.p.size(); i++)
    EXPECT(magpool_free_async(pool, b.p[i], (magpool_stream_t)B) == 0, "free on B");
  EXPECT(magpool_stream_release(pool, (magpool_stream_t)A) == 0, "release A");
  EXPECT(magpool_stream_release(pool, (magpool_stream_t)B) == 0, "release B");
  CK(cudaDeviceSynchronize());
  expect_empty(pool, PS, "gated_stream");
  a.release();
  b.release();
  CK(cudaFree(bad));
  CK(cudaStreamDestroy(A));
  CK(cudaStreamDestroy(B));
  EXPECT(magpool_destroy(pool) == 0, "destroy");
  std::printf("gpu_gated: gated_stream: %zu blocks freed on a blocked stream, %zu allocations "
              "elsewhere, %zu overlaps, %llu corruptions\n",
              N, b.p.size(), hits, nbad);
}

// ------------------------------------------------------------------ 2 --

struct PtdsShared {
  magpool_t *pool;
  Gate gate;
  Batch t;  // T's blocks
  unsigned long long *bad;
  std::atomic<int> freed{0}, finish{0};
};

void *ptds_thread(void *arg) {
  PtdsShared *sh = (PtdsShared *)arg;
  CK(cudaSetDevice(0));
  cudaStream_t s = cudaStreamPerThread;
  const size_t M = 256, SZ = 1024;
  for (size_t i = 0; i < M; i++) {
    void *p = magpool_alloc_async(sh->pool, SZ, (magpool_stream_t)s);
    REQUIRE(p != nullptr, "alloc on T's per-thread stream");
    sh->t.p.push_back((uint32_t *)p);
    sh->t.n.push_back(SZ / 4);
  }
  sh->t.upload(s);
  sh->t.fill(s, 3000000);
  sh->gate.block(s);
  sh->t.check(s, 3000000, sh->bad);
  TRACE("T: %zu blocks allocated on its per-thread stream, gate queued", M);
  for (size_t i = 0; i < M; i++) {
    int rc = magpool_free_async(sh->pool, sh->t.p[i], (magpool_stream_t)s);
    if (rc != 0) {
      EXPECT(rc == 0, "free_async %zu of %zu (%p) on T's per-thread stream: %s (CUDA error %d)",
             i, M, (void *)sh->t.p[i], magpool_strerror(rc), magpool_last_cuda_error());
      break;
    }
  }
  TRACE("T: freed");
  sh->freed.store(1);
  while (sh->finish.load() == 0) usleep(1000);
  CK(cudaStreamSynchronize(s));
  EXPECT(magpool_stream_release(sh->pool, (magpool_stream_t)s) == 0, "release T's stream");
  CK(cudaStreamSynchronize(s));
  return nullptr;
}

void per_thread_stream_trim() {
  const size_t PS = 64u << 20, SZ = 1024, M = 256;
  // No thread caches: a block that reaches the tree too early is the first
  // one a later 1 KiB allocation gets.
  PtdsShared sh;
  sh.pool = make_pool(PS, 8u << 20, 0);
  CK(cudaMalloc(&sh.bad, sizeof *sh.bad));
  CK(cudaMemset(sh.bad, 0, sizeof *sh.bad));
  sh.gate.init();
  pthread_t th;
  REQUIRE(pthread_create(&th, nullptr, ptds_thread, &sh) == 0, "pthread_create");
  while (sh.freed.load() == 0) usleep(1000);
  TRACE("ptds: T freed its blocks");

  Ranges freed;
  for (size_t i = 0; i < M; i++) freed.add(sh.t.p[i], SZ);
  freed.seal();
  magpool_stats_t st0 = stats(sh.pool);

  // Another thread trims: T's per-thread stream cache is retired.
  EXPECT(magpool_trim(sh.pool) == 0, "trim");
  // If the retire callback went onto THIS thread's per-thread stream, it
  // has run once this returns; if it went behind T's stream, it has not.
  TRACE("ptds: trimmed");
  CK(cudaStreamSynchronize(cudaStreamPerThread));
  EXPECT(magpool_trim(sh.pool) == 0, "trim");
  TRACE("ptds: synchronised own per-thread stream, trimmed");
  magpool_stats_t st = stats(sh.pool);
  // A trim from another thread cannot name T's per-thread stream (the handle
  // means the caller's own), so T's blocks stay in T's stream cache until T
  // retires them itself; or, were they retired, they must be pending behind
  // T's stream.  Either way they must not be back in the pool.
  EXPECT(st.pending_bytes + st.cached_bytes >= M * SZ,
         "T's %zu freed bytes are neither pending nor cached (pending_bytes %zu, cached %zu; "
         "before trim %zu and %zu) although T's per-thread stream is blocked before the "
         "frees: the trim gave them back behind the wrong stream",
         M * SZ, st.pending_bytes, st.cached_bytes, st0.pending_bytes, st0.cached_bytes);

  cudaStream_t B;
  CK(cudaStreamCreateWithFlags(&B, cudaStreamNonBlocking));
  Batch b;
  size_t hits = grab(sh.pool, B, false, 2 * M, SZ, freed, b);
  hits += grab(sh.pool, B, true, 2 * M, SZ, freed, b);
  EXPECT(hits == 0,
         "%zu allocations got blocks freed on T's per-thread stream before it passed the "
         "frees",
         hits);
  b.fill_each(B, 4000000);
  CK(cudaStreamSynchronize(B));

  TRACE("ptds: allocations elsewhere done, opening the gate");
  sh.gate.open();
  sh.finish.store(1);
  REQUIRE(pthread_join(th, nullptr) == 0, "pthread_join");
  CK(cudaDeviceSynchronize());
  unsigned long long nbad = 1;
  CK(cudaMemcpy(&nbad, sh.bad, sizeof nbad, cudaMemcpyDeviceToHost));
  EXPECT(nbad == 0,
         "%llu of T's blocks were overwritten before T's per-thread stream reached the frees",
         nbad);
  sh.gate.done("per_thread_stream_trim");
  for (size_t i = 0; i < b.p.size(); i++)
    EXPECT(magpool_free_async(sh.pool, b.p[i], (magpool_stream_t)B) == 0, "free on B");
  EXPECT(magpool_stream_release(sh.pool, (magpool_stream_t)B) == 0, "release B");
  CK(cudaDeviceSynchronize());
  expect_empty(sh.pool, PS, "per_thread_stream_trim");
  sh.t.release();
  b.release();
  CK(cudaFree(sh.bad));
  CK(cudaStreamDestroy(B));
  EXPECT(magpool_destroy(sh.pool) == 0, "destroy");
  std::printf("gpu_gated: per_thread_stream_trim: pending after trim %zu of %zu, %zu overlaps, "
              "%llu corruptions\n",
              st.pending_bytes, M * SZ, hits, nbad);
}

// ------------------------------------------------------------------ 3 --

void cross_stream_reuse() {
  const size_t CH = 2u << 20, PS = 8 * CH, RUN = 4 * CH;
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.kind = MAGPOOL_MEM_DEVICE;
  cfg.pool_size = PS;
  cfg.allow_growth = 1;
  cfg.cross_stream_reuse = 1;
  magpool_t *pool = nullptr;
  int rc = magpool_create(&cfg, &pool);
  REQUIRE(rc == 0, "magpool_create: %s", magpool_strerror(rc));
  cudaStream_t A, B;
  CK(cudaStreamCreateWithFlags(&A, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&B, cudaStreamNonBlocking));
  unsigned long long *bad = nullptr;
  CK(cudaMalloc(&bad, sizeof *bad));
  CK(cudaMemset(bad, 0, sizeof *bad));
  CK(cudaDeviceSynchronize());
  // fill and x take the pool's 8 chunks: B's request is a new peak.
  void *fill = magpool_alloc(pool, PS - RUN);
  void *x = magpool_alloc_async(pool, RUN, (magpool_stream_t)A);
  REQUIRE(fill != nullptr && x != nullptr, "allocation failed");
  const uint32_t n = (uint32_t)(RUN / 4);
  k_fill1<<<1, 128, 0, A>>>((uint32_t *)x, n, 77);
  Gate g;
  g.init();
  g.block(A);
  k_check1<<<1, 128, 0, A>>>((const uint32_t *)x, n, 77, bad);
  CK(cudaGetLastError());
  EXPECT(magpool_free_async(pool, x, (magpool_stream_t)A) == 0, "free on A");
  size_t res = stats(pool).reserved_bytes;
  TRACE("cross: freed on gated A");
  void *y = magpool_alloc_async(pool, RUN, (magpool_stream_t)B);
  TRACE("cross: allocated on B");
  EXPECT(y == x, "B's request at a new peak did not take the run freed on A (%p, %p)", y, x);
  EXPECT(stats(pool).reserved_bytes == res, "the pool mapped more: %zu, was %zu",
         stats(pool).reserved_bytes, res);
  if (y != nullptr) k_fill1<<<1, 128, 0, B>>>((uint32_t *)y, n, 99);
  CK(cudaGetLastError());
  g.open();
  CK(cudaStreamSynchronize(A));
  CK(cudaStreamSynchronize(B));
  unsigned long long nbad = 1;
  CK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
  EXPECT(nbad == 0, "B wrote the run before A had passed its free (A's check failed)");
  g.done("cross_stream_reuse");
  if (y != nullptr) EXPECT(magpool_free_async(pool, y, (magpool_stream_t)B) == 0, "free on B");
  EXPECT(magpool_free(pool, fill) == 0, "free");
  CK(cudaStreamSynchronize(B));
  EXPECT(magpool_stream_release(pool, (magpool_stream_t)A) == 0, "release A");
  EXPECT(magpool_stream_release(pool, (magpool_stream_t)B) == 0, "release B");
  CK(cudaStreamDestroy(A));
  CK(cudaStreamDestroy(B));
  CK(cudaFree(bad));
  EXPECT(magpool_check(pool) == 0, "magpool_check");
  EXPECT(magpool_destroy(pool) == 0, "destroy");
  std::printf("gpu_gated: cross_stream_reuse: %s, %llu corruptions\n",
              y == x ? "took the run" : "did not take the run", nbad);
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // Load every kernel now.  With lazy loading (the default since CUDA 12),
  // the first launch of a kernel while a gate kernel spins waits for the
  // gate: the host would block before it opens the gate.  (Seen on an H200
  // with CUDA 13: a first launch on an idle stream waited for the gate.)
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    std::printf("gpu_gated: SKIP (no CUDA device: %s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  CK(cudaSetDevice(0));
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, k_gate));
  CK(cudaFuncGetAttributes(&fa, k_fill_many));
  CK(cudaFuncGetAttributes(&fa, k_check_many));
  CK(cudaFuncGetAttributes(&fa, k_fill1));
  CK(cudaFuncGetAttributes(&fa, k_check1));
  gated_stream();
  per_thread_stream_trim();
  cross_stream_reuse();
  std::printf("gpu_gated: %s (%d failures)\n", g_fail ? "FAIL" : "PASS", g_fail);
  return g_fail ? 1 : 0;
}
