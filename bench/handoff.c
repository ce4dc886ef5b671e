/* handoff.c - magpool-handoff: one thread allocates, another frees.
 *
 *   magpool-handoff [--kind host|device] [--sizes small|mixed]
 *                   [--seconds S] [--rounds N]
 *
 * A training step's forward thread allocates what its autograd thread
 * frees; a server's request thread allocates what its completion thread
 * frees.  Here a producer thread allocates blocks (sizes cycled from a
 * list) and hands them, HANDOFF_BATCH pointers at a time, through a
 * single-producer single-consumer ring (at most HANDOFF_INFLIGHT batches
 * in flight) to a consumer thread, which frees them.  Batches keep the
 * hand-off itself (the floor) to a few ns a block, so that the two
 * threads' timing does not decide the figure.  Rows:
 *   floor            the hand-off alone: no allocator (fake pointers)
 *   magpool          magpool_alloc / magpool_free
 *   magpool-async    magpool_alloc_async / magpool_free_async, both threads
 *                    on one stream (a host stream on a host pool, a CUDA
 *                    stream on a device pool)
 *   cudaMallocAsync  (--kind device) cudaMallocAsync / cudaFreeAsync on
 *                    one CUDA stream, the device's default pool with
 *                    release threshold UINT64_MAX
 *   cub              (--kind device) cub::CachingDeviceAllocator, one
 *                    instance, on one CUDA stream
 * Sizes: small = 512 B to 48 KiB (what stream caches hold), mixed = those
 * and 96 KiB, 768 KiB, 3 MiB and 6 MiB (runs, on chunked pools).
 * Output: a line per row and round, for the magpool rows their pool's
 *   POOL allocator=A workload=W peak_reserved_mib=N reserved_mib=N cached_mib=N
 * after the rounds (the pool: magpool_config_init, so MAGPOOL_CONF
 * applies, then a 64 MiB pool_size that may grow), then per row
 *   SUMMARY allocator=A workload=handoff-SIZES threads=2 ns_per_pair=X
 * (the median round).  No timing is asserted anywhere (ctest: a smoke run,
 * whose magpool-async row must have held less than 1 GiB).
 */
#include <magpool.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if BENCH_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_baselines.h"
#endif

#define HANDOFF_RING 16u     /* ring slots (a power of two)             */
#define HANDOFF_INFLIGHT 4u  /* most batches between the two threads    */
#define HANDOFF_BATCH 32u    /* blocks a batch                          */
#define HANDOFF_MAX_ROUNDS 15

enum row { FLOOR, MAGPOOL, MAGPOOL_ASYNC, CMA, CUB, NROWS };
static const char *const row_names[NROWS] = {"floor", "magpool", "magpool-async",
                                             "cudaMallocAsync", "cub"};

static const size_t small_sizes[] = {512, 1024, 3072, 12288, 24576, 49152};
static const size_t mixed_sizes[] = {3072,  12288, 49152, 786432,  3145728,
                                     512,   1024,  98304, 24576,   6291456};

typedef struct run {
  enum row row;
  magpool_t *pool;
  magpool_stream_t s;
#if BENCH_HAVE_CUDA
  bench_cub *cub;
#endif
  const size_t *sizes;
  size_t nsizes;
  double seconds;
  /* The ring: the producer writes slot[head], then head (RELEASE); the
   * consumer reads head (ACQUIRE), then slot[tail], then tail (RELEASE),
   * which the producer reads (ACQUIRE) before it reuses the slot.  A
   * batch of n == 0 ends the round. */
  _Alignas(64) _Atomic uint64_t head;
  _Alignas(64) _Atomic uint64_t tail;
  _Alignas(64) struct {
    uint32_t n;
    void *p[HANDOFF_BATCH];
  } slot[HANDOFF_RING];
  uint64_t pairs;
  int errors;
} run;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A wait step: a pause, and now and then the CPU (two spinning threads
 * on fewer free CPUs would otherwise wait out whole time slices). */
static inline void relax(unsigned *spins) {
  if (++*spins % 1024 == 0) sched_yield();
#if defined(__x86_64__) || defined(__i386__)
  else __builtin_ia32_pause();
#endif
}

static void *alloc_one(run *r, size_t n, uint64_t i) {
  switch (r->row) {
  case FLOOR: return (void *)(uintptr_t)((i + 1) << 6);
  case MAGPOOL: return magpool_alloc(r->pool, n);
  case MAGPOOL_ASYNC: return magpool_alloc_async(r->pool, n, r->s);
#if BENCH_HAVE_CUDA
  case CMA: {
    void *p = NULL;
    return cudaMallocAsync(&p, n, (cudaStream_t)r->s) == cudaSuccess ? p : NULL;
  }
  case CUB: {
    void *p = NULL;
    return bench_cub_alloc(r->cub, &p, n, (struct CUstream_st *)r->s) == 0 ? p : NULL;
  }
#endif
  default: return NULL;
  }
}

static int free_one(run *r, void *p) {
  switch (r->row) {
  case FLOOR: return 0;
  case MAGPOOL: return magpool_free(r->pool, p);
  case MAGPOOL_ASYNC: return magpool_free_async(r->pool, p, r->s);
#if BENCH_HAVE_CUDA
  case CMA: return cudaFreeAsync(p, (cudaStream_t)r->s) == cudaSuccess ? 0 : -1;
  case CUB: return bench_cub_free(r->cub, p);
#endif
  default: return -1;
  }
}

/* Producer: allocates until time is up (or an allocation fails), a
 * batch at a time; then hands over an empty batch (the end). */
static void *producer(void *arg) {
  run *r = arg;
  const uint64_t end = now_ns() + (uint64_t)(r->seconds * 1e9);
  uint64_t h = 0, i = 0;
  for (bool done = false; !done;) {
    for (unsigned n = 0; h - atomic_load_explicit(&r->tail, memory_order_acquire) >= HANDOFF_INFLIGHT;)
      relax(&n);
    uint32_t k = 0;
    if (now_ns() < end)
      for (; k < HANDOFF_BATCH; k++, i++) {
        void *p = alloc_one(r, r->sizes[i % r->nsizes], i);
        if (p == NULL) {
          r->errors++;
          break;
        }
        r->slot[h % HANDOFF_RING].p[k] = p;
      }
    done = k < HANDOFF_BATCH;
    r->slot[h % HANDOFF_RING].n = k;
    atomic_store_explicit(&r->head, ++h, memory_order_release);
    if (done && k != 0) { /* a failed allocation: the end follows */
      for (unsigned n = 0; h - atomic_load_explicit(&r->tail, memory_order_acquire) >= HANDOFF_INFLIGHT;)
        relax(&n);
      r->slot[h % HANDOFF_RING].n = 0;
      atomic_store_explicit(&r->head, ++h, memory_order_release);
    }
  }
  return NULL;
}

/* Consumer: frees what arrives until the empty batch. */
static void *consumer(void *arg) {
  run *r = arg;
  for (uint64_t t = 0;;) {
    for (unsigned n = 0; atomic_load_explicit(&r->head, memory_order_acquire) == t;) relax(&n);
    uint32_t k = r->slot[t % HANDOFF_RING].n;
    for (uint32_t j = 0; j < k; j++) {
      if (free_one(r, r->slot[t % HANDOFF_RING].p[j]) != 0) r->errors++;
      r->pairs++;
    }
    atomic_store_explicit(&r->tail, ++t, memory_order_release);
    if (k == 0) break;
  }
  return NULL;
}

/* One round of a row: ns per pair, or -1 after an error. */
static double round_ns(run *r) {
  atomic_store(&r->head, 0);
  atomic_store(&r->tail, 0);
  r->pairs = 0;
  r->errors = 0;
  pthread_t a, b;
  uint64_t t0 = now_ns();
  if (pthread_create(&b, NULL, consumer, r) != 0) return -1;
  if (pthread_create(&a, NULL, producer, r) != 0) {
    r->slot[0].n = 0; /* the end: the consumer stops */
    atomic_store(&r->head, 1);
    pthread_join(b, NULL);
    return -1;
  }
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  uint64_t t1 = now_ns();
  if (r->errors != 0 || r->pairs == 0) return -1;
  return (double)(t1 - t0) / (double)r->pairs;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Makes the row's allocator (and stream); 0, or -1 after saying why. */
static int row_setup(run *r, bool device) {
  r->pool = NULL;
  r->s = NULL;
  if (r->row == MAGPOOL || r->row == MAGPOOL_ASYNC) {
    magpool_config_t c;
    magpool_config_init(&c);
    c.kind = device ? MAGPOOL_MEM_DEVICE : MAGPOOL_MEM_HOST;
    c.pool_size = (size_t)64 << 20;
    c.allow_growth = 1;
    int rc = magpool_create(&c, &r->pool);
    if (rc != 0) {
      fprintf(stderr, "magpool-handoff: magpool_create: %s\n", magpool_strerror(rc));
      return -1;
    }
  }
  if (r->row == MAGPOOL_ASYNC && !device) return magpool_host_stream_create(&r->s) == 0 ? 0 : -1;
#if BENCH_HAVE_CUDA
  if (device && r->row != MAGPOOL && r->row != FLOOR) {
    cudaStream_t cs;
    if (cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess) return -1;
    r->s = (magpool_stream_t)cs;
    if (r->row == CMA) {
      cudaMemPool_t mp;
      uint64_t keep = UINT64_MAX;
      if (cudaDeviceGetDefaultMemPool(&mp, 0) != cudaSuccess ||
          cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess)
        return -1;
    }
    if (r->row == CUB && bench_cub_create(0, &r->cub) != 0) return -1;
  }
#endif
  return 0;
}

static void row_teardown(run *r, bool device) {
  if (r->s != NULL && !device) {
    magpool_host_stream_sync(r->s);
    if (r->pool != NULL) magpool_stream_release(r->pool, r->s);
    magpool_host_stream_destroy(r->s);
  }
#if BENCH_HAVE_CUDA
  if (r->s != NULL && device) {
    cudaStreamSynchronize((cudaStream_t)r->s);
    if (r->pool != NULL) magpool_stream_release(r->pool, r->s);
    if (r->row == CUB) bench_cub_destroy(r->cub);
    cudaStreamDestroy((cudaStream_t)r->s);
  }
#endif
  if (r->pool != NULL) magpool_destroy(r->pool);
}

static void usage(void) {
  fprintf(stderr, "usage: magpool-handoff [--kind host|device] [--sizes small|mixed] "
                  "[--seconds S] [--rounds N]\n");
  exit(2);
}

int main(int argc, char **argv) {
  bool device = false, mixed = false;
  double seconds = 0.5;
  int rounds = 5;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--kind") && v) device = !strcmp(v, "device");
    else if (!strcmp(argv[i], "--sizes") && v) mixed = !strcmp(v, "mixed");
    else if (!strcmp(argv[i], "--seconds") && v) seconds = atof(v);
    else if (!strcmp(argv[i], "--rounds") && v) rounds = atoi(v);
    else usage();
    i++;
  }
  if (seconds <= 0 || rounds < 1 || rounds > HANDOFF_MAX_ROUNDS) usage();
#if BENCH_HAVE_CUDA
  int ndev = 0;
  if (device && (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)) {
    fprintf(stderr, "magpool-handoff: no GPU: host rows only\n");
    device = false;
  }
#else
  if (device) fprintf(stderr, "magpool-handoff: built without CUDA: host rows only\n");
  device = false;
#endif
  const char *wl = mixed ? "handoff-mixed" : "handoff-small";
  static run r; /* large (the ring), and its atomics want no stack */
  r.sizes = mixed ? mixed_sizes : small_sizes;
  r.nsizes = mixed ? sizeof mixed_sizes / sizeof *mixed_sizes
                   : sizeof small_sizes / sizeof *small_sizes;
  r.seconds = seconds;
  int status = 0;
  for (int k = 0; k < NROWS; k++) {
    if ((k == CMA || k == CUB) && !device) continue;
    r.row = (enum row)k;
    if (row_setup(&r, device) != 0) {
      printf("ROW allocator=%s not run (setup failed)\n", row_names[k]);
      row_teardown(&r, device);
      status = 1;
      continue;
    }
    double ns[HANDOFF_MAX_ROUNDS];
    int ok = 0;
    for (int j = 0; j < rounds; j++) {
      double x = round_ns(&r);
      printf("ROUND allocator=%s workload=%s round=%d ns_per_pair=%.1f pairs=%llu\n",
             row_names[k], wl, j + 1, x, (unsigned long long)r.pairs);
      if (x > 0) ns[ok++] = x;
    }
    magpool_stats_t st;
    if (r.pool != NULL && magpool_get_stats(r.pool, &st) == 0)
      printf("POOL allocator=%s workload=%s peak_reserved_mib=%zu reserved_mib=%zu cached_mib=%zu\n",
             row_names[k], wl, st.peak_reserved_bytes >> 20, st.reserved_bytes >> 20,
             st.cached_bytes >> 20);
    row_teardown(&r, device);
    if (ok != rounds) {
      printf("ROW allocator=%s failed (%d of %d rounds)\n", row_names[k], rounds - ok, rounds);
      status = 1;
      continue;
    }
    qsort(ns, (size_t)ok, sizeof *ns, cmp_double);
    printf("SUMMARY allocator=%s workload=%s threads=2 ns_per_pair=%.1f\n", row_names[k], wl,
           ns[ok / 2]);
  }
  return status;
}
