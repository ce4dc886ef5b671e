/* shim.c - libmagpool_torch.so: magpool behind PyTorch's
 * CUDAPluggableAllocator.
 *
 * PyTorch calls
 *   void *magpool_torch_alloc(ssize_t size, int device, cudaStream_t stream)
 *   void  magpool_torch_free(void *ptr, ssize_t size, int device,
 *                            cudaStream_t stream)
 * with the current stream of the device at allocation, and at free the
 * size, device and stream of that allocation (PyTorch keeps them).  So
 * both are stream-ordered: magpool_alloc_async / magpool_free_async on
 * that stream (NULL: the legacy default stream).
 *
 * One pool per device, a DEVICE pool created on the first allocation on
 * that device, with this configuration (later wins):
 *   magpool's built-in defaults, allow_growth=1 and stream_cache_bytes=1G
 *   (make_config says why), MAGPOOL_CONF, then the
 *   string given to magpool_torch_configure;
 * kind and device are always DEVICE and the allocation's device.
 *
 * The entry points keep only the counts memory_stats needs (relaxed
 * atomics).  Timing them (two clock reads a call, the alloc_ns, free_ns,
 * slow_allocs and max_alloc_ns counters) is off unless MAGPOOL_TORCH_TIMING
 * is set to a value other than "0" when the library first needs to know,
 * or magpool_torch_set_timing(1) is called.
 *
 * Out of memory: the pool is trimmed and the allocation tried once more
 * (num_alloc_retries); if that fails too (num_ooms), the allocation
 * fails.  PyTorch 2.11's CUDAPluggableAllocator does not check a NULL
 * return, so the magpool_torch module does not hand these entry points
 * to PyTorch directly: it builds oom.cpp against the running PyTorch,
 * whose alloc entry point calls magpool_torch_alloc_nothrow and throws
 * PyTorch's own c10::OutOfMemoryError from a C++ frame (Python sees
 * torch.OutOfMemoryError).  C hosts may instead set a handler
 * (magpool_torch_set_oom_handler) that magpool_torch_alloc calls; this
 * file is built with -fexceptions for that case.
 */
#define _GNU_SOURCE
#include <magpool.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "magpool_torch.h"

#define SHIM_API MAGPOOL_TORCH_API
#define MAX_DEVICES 64

typedef struct CUstream_st *cudaStream_t;

typedef struct {
  _Atomic(magpool_t *) pool;
  _Atomic int64_t allocated, peak;
  _Atomic uint64_t retries, ooms, allocs, frees, free_errors;
  _Atomic uint64_t alloc_ns, free_ns, slow_allocs, max_alloc_ns;
  int create_rc; /* the last failed create (under lock) */
} device_state;

static device_state devs[MAX_DEVICES];
static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;
static char *user_conf; /* under create_lock */
static void (*_Atomic oom_handler)(size_t size, int device, const char *detail);

/* ----------------------------------------------------------- the pools */

static int make_config(magpool_config_t *c, int device) {
  magpool_config_init(c);                  /* built-in defaults, MAGPOOL_CONF */
  /* The shim's defaults, below the variable.  stream_cache_bytes=1G:
   * PyTorch keeps its GPU busy, so a stream is seldom idle when a park is
   * retired, and retired blocks wait for a stream callback (which also
   * holds the stream) before any reuse; a larger park lets the stream's
   * own allocations reuse them at once.  GPT-2 on the H200 (benchmarks.md,
   * 2026-12-01 evening): 41.6 ms a step and 8,476 MiB peak reserved, against
   * 50.2 ms and 9,508 MiB with the core's 8 MiB. */
  (void)magpool_config_parse(c, "allow_growth=1,stream_cache_bytes=1G");
  const char *e = getenv("MAGPOOL_CONF");  /* below the variable: again   */
  if (e != NULL) (void)magpool_config_parse(c, e); /* (a bad one: no-op)  */
  if (user_conf != NULL && magpool_config_parse(c, user_conf) != 0) return MAGPOOL_EINVAL;
  c->kind = MAGPOOL_MEM_DEVICE;
  c->device = device;
  return 0;
}

static magpool_t *pool_of(int device) {
  if (device < 0 || device >= MAX_DEVICES) return NULL;
  magpool_t *p = atomic_load_explicit(&devs[device].pool, memory_order_acquire);
  if (p != NULL) return p;
  pthread_mutex_lock(&create_lock);
  p = atomic_load_explicit(&devs[device].pool, memory_order_relaxed);
  if (p == NULL) {
    magpool_config_t c;
    int rc = make_config(&c, device);
    if (rc == 0) rc = magpool_create(&c, &p);
    if (rc != 0) {
      p = NULL;
      if (devs[device].create_rc != rc)
        fprintf(stderr, "magpool_torch: cannot create the pool of cuda:%d: %s\n", device,
                magpool_strerror(rc));
      devs[device].create_rc = rc;
    } else {
      atomic_store_explicit(&devs[device].pool, p, memory_order_release);
    }
  }
  pthread_mutex_unlock(&create_lock);
  return p;
}

/* ------------------------------------------------- the allocator entry */

/* Time spent in the entry points (CLOCK_MONOTONIC, 20-30 ns a read): where
 * a training step's allocator time goes.  Off by default: a call then
 * reads no clock.  -1: not known yet (MAGPOOL_TORCH_TIMING decides). */
static _Atomic int timing = -1;

static bool timing_on(void) {
  int t = atomic_load_explicit(&timing, memory_order_relaxed);
  if (__builtin_expect(t >= 0, 1)) return t != 0;
  const char *e = getenv("MAGPOOL_TORCH_TIMING");
  int want = e != NULL && e[0] != '\0' && strcmp(e, "0") != 0;
  /* A racing magpool_torch_set_timing wins over the variable. */
  atomic_compare_exchange_strong_explicit(&timing, &t, want, memory_order_relaxed,
                                          memory_order_relaxed);
  return atomic_load_explicit(&timing, memory_order_relaxed) != 0;
}

SHIM_API void magpool_torch_set_timing(int on) {
  atomic_store_explicit(&timing, on != 0, memory_order_relaxed);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void note_time(device_state *d, uint64_t t0) {
  uint64_t dt = now_ns() - t0;
  atomic_fetch_add_explicit(&d->alloc_ns, dt, memory_order_relaxed);
  if (dt > 100000) atomic_fetch_add_explicit(&d->slow_allocs, 1, memory_order_relaxed);
  uint64_t m = atomic_load_explicit(&d->max_alloc_ns, memory_order_relaxed);
  while (dt > m && !atomic_compare_exchange_weak_explicit(&d->max_alloc_ns, &m, dt,
                                                          memory_order_relaxed,
                                                          memory_order_relaxed)) {
  }
}

static void note_alloc(device_state *d, size_t size) {
  int64_t now = atomic_fetch_add_explicit(&d->allocated, (int64_t)size, memory_order_relaxed) +
                (int64_t)size;
  int64_t pk = atomic_load_explicit(&d->peak, memory_order_relaxed);
  while (now > pk &&
         !atomic_compare_exchange_weak_explicit(&d->peak, &pk, now, memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
  atomic_fetch_add_explicit(&d->allocs, 1, memory_order_relaxed);
}

static _Thread_local char last_failure[160];

static void *alloc_impl(ssize_t size, int device, cudaStream_t stream) {
  uint64_t t0 = timing_on() ? now_ns() : 0;
  magpool_t *pool = pool_of(device);
  size_t n = size < 0 ? 0 : (size_t)size;
  void *p = NULL;
  int err = MAGPOOL_ENODEV;
  if (pool != NULL) {
    device_state *d = &devs[device];
    p = magpool_alloc_async(pool, n, stream);
    if (p == NULL && (err = magpool_last_error()) == MAGPOOL_ENOMEM) {
      atomic_fetch_add_explicit(&d->retries, 1, memory_order_relaxed);
      magpool_trim(pool);
      p = magpool_alloc_async(pool, n, stream);
      if (p == NULL) err = magpool_last_error();
    }
    if (p != NULL) {
      note_alloc(d, n);
      if (t0 != 0) note_time(d, t0);
      return p;
    }
    atomic_fetch_add_explicit(&d->ooms, 1, memory_order_relaxed);
  } else if (device >= 0 && device < MAX_DEVICES) {
    atomic_fetch_add_explicit(&devs[device].ooms, 1, memory_order_relaxed);
  }
  snprintf(last_failure, sizeof last_failure, "%zu bytes on cuda:%d: %s", n, device,
           magpool_strerror(err));
  return NULL;
}

SHIM_API void *magpool_torch_alloc(ssize_t size, int device, cudaStream_t stream) {
  void *p = alloc_impl(size, device, stream);
  if (p != NULL) return p;
  void (*h)(size_t, int, const char *) = atomic_load(&oom_handler);
  if (h != NULL) h(size < 0 ? 0 : (size_t)size, device, last_failure); /* throws */
  fprintf(stderr, "magpool_torch: allocation failed: %s\n", last_failure);
  return NULL;
}

SHIM_API void *magpool_torch_alloc_nothrow(ssize_t size, int device, cudaStream_t stream) {
  return alloc_impl(size, device, stream);
}

SHIM_API const char *magpool_torch_last_failure(void) { return last_failure; }

SHIM_API void magpool_torch_free(void *ptr, ssize_t size, int device, cudaStream_t stream) {
  if (ptr == NULL || device < 0 || device >= MAX_DEVICES) return;
  uint64_t t0 = timing_on() ? now_ns() : 0;
  device_state *d = &devs[device];
  magpool_t *pool = atomic_load_explicit(&d->pool, memory_order_acquire);
  int rc = pool != NULL ? magpool_free_async(pool, ptr, stream) : MAGPOOL_EINVAL;
  if (t0 != 0) atomic_fetch_add_explicit(&d->free_ns, now_ns() - t0, memory_order_relaxed);
  if (rc != 0) {
    /* Not ours, or the stream is being captured: nothing to free now. */
    if (atomic_fetch_add_explicit(&d->free_errors, 1, memory_order_relaxed) == 0)
      fprintf(stderr, "magpool_torch: free of %p on cuda:%d failed: %s\n", ptr, device,
              magpool_strerror(rc));
    return;
  }
  atomic_fetch_sub_explicit(&d->allocated, size < 0 ? 0 : (int64_t)size, memory_order_relaxed);
  atomic_fetch_add_explicit(&d->frees, 1, memory_order_relaxed);
}

/* ---------------------------------------------------------- management */

SHIM_API int magpool_torch_configure(const char *conf) {
  magpool_config_t c;
  magpool_config_init(&c);
  if (conf != NULL && magpool_config_parse(&c, conf) != 0) return MAGPOOL_EINVAL;
  char *copy = conf != NULL && conf[0] != '\0' ? strdup(conf) : NULL;
  if (conf != NULL && conf[0] != '\0' && copy == NULL) return MAGPOOL_ENOMEM;
  pthread_mutex_lock(&create_lock);
  free(user_conf);
  user_conf = copy;
  pthread_mutex_unlock(&create_lock);
  return 0;
}

SHIM_API void magpool_torch_set_oom_handler(void (*fn)(size_t size, int device,
                                                       const char *detail)) {
  atomic_store(&oom_handler, fn);
}

SHIM_API int magpool_torch_get_stats(int device, magpool_torch_stats *out) {
  if (device < 0 || device >= MAX_DEVICES || out == NULL) return MAGPOOL_EINVAL;
  device_state *d = &devs[device];
  memset(out, 0, sizeof *out);
  int64_t a = atomic_load_explicit(&d->allocated, memory_order_relaxed);
  out->allocated_current = a < 0 ? 0 : (uint64_t)a;
  out->allocated_peak = (uint64_t)atomic_load_explicit(&d->peak, memory_order_relaxed);
  out->num_alloc_retries = atomic_load_explicit(&d->retries, memory_order_relaxed);
  out->num_ooms = atomic_load_explicit(&d->ooms, memory_order_relaxed);
  out->alloc_count = atomic_load_explicit(&d->allocs, memory_order_relaxed);
  out->free_count = atomic_load_explicit(&d->frees, memory_order_relaxed);
  out->live_count = out->alloc_count - out->free_count;
  out->alloc_ns = atomic_load_explicit(&d->alloc_ns, memory_order_relaxed);
  out->free_ns = atomic_load_explicit(&d->free_ns, memory_order_relaxed);
  out->slow_allocs = atomic_load_explicit(&d->slow_allocs, memory_order_relaxed);
  out->max_alloc_ns = atomic_load_explicit(&d->max_alloc_ns, memory_order_relaxed);
  magpool_t *pool = atomic_load_explicit(&d->pool, memory_order_acquire);
  if (pool != NULL) {
    magpool_stats_t st;
    if (magpool_get_stats(pool, &st) == 0) {
      out->reserved_current = st.reserved_bytes;
      out->reserved_peak = st.peak_reserved_bytes;
      out->grow_count = st.grow_count;
      out->chunk_maps = st.chunk_maps;
      out->chunk_unmaps = st.chunk_unmaps;
      out->chunk_moves = st.chunk_moves;
      out->pending_at_peak = st.pending_at_peak_bytes;
      out->cached_current = st.cached_bytes;
      out->free_current = st.free_bytes;
      out->pending_current = st.pending_bytes;
      out->stream_batches = st.stream_batches;
    }
    out->pool_created = 1;
  }
  return 0;
}

SHIM_API int magpool_torch_empty_cache(int device) {
  for (int i = 0; i < MAX_DEVICES; i++) {
    if (device >= 0 && i != device) continue;
    magpool_t *pool = atomic_load_explicit(&devs[i].pool, memory_order_acquire);
    if (pool != NULL) magpool_trim(pool);
  }
  return 0;
}

SHIM_API int magpool_torch_reset_peak(int device) {
  for (int i = 0; i < MAX_DEVICES; i++) {
    if (device >= 0 && i != device) continue;
    device_state *d = &devs[i];
    atomic_store_explicit(&d->peak, atomic_load_explicit(&d->allocated, memory_order_relaxed),
                          memory_order_relaxed);
    magpool_t *pool = atomic_load_explicit(&d->pool, memory_order_acquire);
    if (pool != NULL) magpool_reset_peaks(pool);
  }
  return 0;
}
