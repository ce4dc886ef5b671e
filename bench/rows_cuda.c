/* rows_cuda.c - the rows that need a GPU (only with --kind device).
 *
 *   magpool-device  a DEVICE pool, default config: magpool_alloc/free
 *   magpool-async   a DEVICE pool; each thread on its own non-blocking
 *                   stream: magpool_alloc_async/magpool_free_async
 *   cudaMallocAsync the device's default memory pool, release threshold
 *                   UINT64_MAX (it caches), on a per-thread non-blocking
 *                   stream: cudaMallocAsync/cudaFreeAsync
 *   cub             one shared cub::CachingDeviceAllocator (mutex-based),
 *                   DeviceAllocate/DeviceFree on the per-thread stream
 *   cudaMalloc      cudaMalloc/cudaFree (~57 us a pair: BENCH_ROW_SLOW)
 *
 * Every CUDA call's result is checked.  In the timed loop a failure is
 * counted and its first code reported; in setup it skips the row.
 * Built without CUDA (BENCH_HAVE_CUDA 0), this file only says so.
 */
#include <stdio.h>

#include "bench.h"
#include "magpool.h"

#if BENCH_HAVE_CUDA

#include <cuda_runtime_api.h>

#include "cuda_baselines.h"

#define BENCH_DEVICE 0

static const char *cuda_strerror(int code) { return cudaGetErrorString((cudaError_t)code); }

/* Reports a failed CUDA call made outside the timed loop. */
static int cuda_check(const char *row, const char *what, cudaError_t e) {
  if (e == cudaSuccess) return 0;
  fprintf(stderr, "magpool-bench: %s: %s: %s (%s)\n", row, what, cudaGetErrorName(e),
          cudaGetErrorString(e));
  return -1;
}

int bench_cuda_probe(char *msg, size_t msglen) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(msg, msglen, "cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e),
             cudaGetErrorString(e));
    return 0;
  }
  if (n <= 0) {
    snprintf(msg, msglen, "cudaGetDeviceCount: no CUDA device");
    return 0;
  }
  if ((e = cudaSetDevice(BENCH_DEVICE)) != cudaSuccess ||
      (e = cudaFree(NULL)) != cudaSuccess) { /* creates the primary context */
    snprintf(msg, msglen, "initialising device %d: %s (%s)", BENCH_DEVICE,
             cudaGetErrorName(e), cudaGetErrorString(e));
    return 0;
  }
  struct cudaDeviceProp prop;
  if ((e = cudaGetDeviceProperties(&prop, BENCH_DEVICE)) != cudaSuccess) {
    snprintf(msg, msglen, "cudaGetDeviceProperties: %s", cudaGetErrorString(e));
    return 0;
  }
  int rt = 0, drv = 0;
  if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = 0;
  if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
  snprintf(msg, msglen, "device %d: %s, %d SMs, %.1f GiB; runtime %d.%d, driver %d.%d",
           BENCH_DEVICE, prop.name, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (double)(1ull << 30), rt / 1000, (rt % 1000) / 10,
           drv / 1000, (drv % 1000) / 10);
  return 1;
}

/* ------------------------------------------------------------------ */
/* Per-thread stream (cudaMallocAsync, cub, magpool-async)            */
/* ------------------------------------------------------------------ */

static int stream_thread_init(bench_thread *t) {
  cudaError_t e = cudaSetDevice(BENCH_DEVICE);
  cudaStream_t s = NULL;
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    bench_note_error(t, (int)e);
    return -1;
  }
  t->priv = s;
  return 0;
}

static void stream_thread_fini(bench_thread *t) {
  cudaStream_t s = t->priv;
  if (s == NULL) return;
  cudaError_t e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) bench_note_error(t, (int)e);
  e = cudaStreamDestroy(s);
  if (e != cudaSuccess) bench_note_error(t, (int)e);
  t->priv = NULL;
}

static int device_thread_init(bench_thread *t) {
  cudaError_t e = cudaSetDevice(BENCH_DEVICE);
  if (e != cudaSuccess) {
    bench_note_error(t, (int)e);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* cudaMalloc                                                         */
/* ------------------------------------------------------------------ */

static int nothing_setup(bench_run *run) {
  (void)run;
  return 0;
}

static void sync_teardown(bench_run *run) {
  cuda_check(run->row->name, "cudaDeviceSynchronize", cudaDeviceSynchronize());
}

static inline void *cm_alloc(bench_thread *t, size_t size) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, size);
  if (BENCH_UNLIKELY(e != cudaSuccess)) {
    bench_note_error(t, (int)e);
    return NULL;
  }
  return p;
}

static inline int cm_free(bench_thread *t, void *ptr) {
  cudaError_t e = cudaFree(ptr);
  if (BENCH_UNLIKELY(e != cudaSuccess)) bench_note_error(t, (int)e);
  return (int)e;
}

static void cm_body(bench_thread *t) { bench_loop(t, cm_alloc, cm_free); }

static const bench_row row_cudamalloc = {
    .name = "cudaMalloc",
    .what = "cudaMalloc/cudaFree (time-limited, with a minimum pair count)",
    .flags = BENCH_ROW_DEVICE | BENCH_ROW_SLOW,
    .setup = nothing_setup,
    .teardown = sync_teardown,
    .thread_init = device_thread_init,
    .body = cm_body,
    .strerror = cuda_strerror,
};

/* ------------------------------------------------------------------ */
/* cudaMallocAsync                                                    */
/* ------------------------------------------------------------------ */

static int cma_setup(bench_run *run) {
  cudaMemPool_t mp;
  const char *name = run->row->name;
  if (cuda_check(name, "cudaDeviceGetDefaultMemPool",
                 cudaDeviceGetDefaultMemPool(&mp, BENCH_DEVICE)))
    return -1;
  uint64_t threshold = UINT64_MAX; /* keep everything: it caches */
  if (cuda_check(name, "cudaMemPoolSetAttribute(ReleaseThreshold)",
                 cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &threshold)))
    return -1;
  if (cuda_check(name, "cudaDeviceSetMemPool", cudaDeviceSetMemPool(BENCH_DEVICE, mp)))
    return -1;
  run->ctx = mp;
  return 0;
}

static void cma_teardown(bench_run *run) {
  const char *name = run->row->name;
  cuda_check(name, "cudaDeviceSynchronize", cudaDeviceSynchronize());
  /* Start the next run from an empty pool. */
  cuda_check(name, "cudaMemPoolTrimTo", cudaMemPoolTrimTo((cudaMemPool_t)run->ctx, 0));
  run->ctx = NULL;
}

static inline void *cma_alloc(bench_thread *t, size_t size) {
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, size, (cudaStream_t)t->priv);
  if (BENCH_UNLIKELY(e != cudaSuccess)) {
    bench_note_error(t, (int)e);
    return NULL;
  }
  return p;
}

static inline int cma_free(bench_thread *t, void *ptr) {
  cudaError_t e = cudaFreeAsync(ptr, (cudaStream_t)t->priv);
  if (BENCH_UNLIKELY(e != cudaSuccess)) bench_note_error(t, (int)e);
  return (int)e;
}

static void cma_body(bench_thread *t) { bench_loop(t, cma_alloc, cma_free); }

static const bench_row row_cudamallocasync = {
    .name = "cudaMallocAsync",
    .what = "cudaMallocAsync/cudaFreeAsync, default mem pool (release threshold "
            "UINT64_MAX), per-thread non-blocking stream",
    .flags = BENCH_ROW_DEVICE,
    .setup = cma_setup,
    .teardown = cma_teardown,
    .thread_init = stream_thread_init,
    .thread_fini = stream_thread_fini,
    .body = cma_body,
    .strerror = cuda_strerror,
};

/* ------------------------------------------------------------------ */
/* cub::CachingDeviceAllocator                                        */
/* ------------------------------------------------------------------ */

static int cub_setup(bench_run *run) {
  bench_cub *c = NULL;
  if (cuda_check(run->row->name, "bench_cub_create",
                 (cudaError_t)bench_cub_create(BENCH_DEVICE, &c)))
    return -1;
  run->ctx = c;
  return 0;
}

static void cub_teardown(bench_run *run) {
  const char *name = run->row->name;
  cuda_check(name, "cudaDeviceSynchronize", cudaDeviceSynchronize());
  cuda_check(name, "bench_cub_destroy (FreeAllCached)",
             (cudaError_t)bench_cub_destroy((bench_cub *)run->ctx));
  run->ctx = NULL;
}

static inline void *cub_alloc(bench_thread *t, size_t size) {
  void *p = NULL;
  int e = bench_cub_alloc((bench_cub *)t->run->ctx, &p, size, (struct CUstream_st *)t->priv);
  if (BENCH_UNLIKELY(e != 0)) {
    bench_note_error(t, e);
    return NULL;
  }
  return p;
}

static inline int cub_free(bench_thread *t, void *ptr) {
  int e = bench_cub_free((bench_cub *)t->run->ctx, ptr);
  if (BENCH_UNLIKELY(e != 0)) bench_note_error(t, e);
  return e;
}

static void cub_body(bench_thread *t) { bench_loop(t, cub_alloc, cub_free); }

static const bench_row row_cub = {
    .name = "cub",
    .what = "one shared cub::CachingDeviceAllocator (mutex), per-thread stream, "
            "no cap on cached bytes",
    .flags = BENCH_ROW_DEVICE,
    .setup = cub_setup,
    .teardown = cub_teardown,
    .thread_init = stream_thread_init,
    .thread_fini = stream_thread_fini,
    .body = cub_body,
    .strerror = cuda_strerror,
};

/* ------------------------------------------------------------------ */
/* magpool on DEVICE pools                                            */
/* ------------------------------------------------------------------ */

static int mpdev_setup_cfg(bench_run *run, int capture_check) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.capture_check = capture_check;
  cfg.kind = MAGPOOL_MEM_DEVICE;
  cfg.device = BENCH_DEVICE;
  cfg.pool_size = run->pool_bytes;
  cfg.allow_growth = 1;
  magpool_t *pool = NULL;
  int rc = magpool_create(&cfg, &pool);
  if (rc != 0) {
    fprintf(stderr, "magpool-bench: %s: magpool_create(DEVICE, %zu MiB): %s (%d)",
            run->row->name, cfg.pool_size >> 20, magpool_strerror(rc), rc);
    if (rc == MAGPOOL_ECUDA) fprintf(stderr, ", CUDA error %d", magpool_last_cuda_error());
    fputc('\n', stderr);
    return -1;
  }
  run->ctx = pool;
  return 0;
}

static int mpdev_setup(bench_run *run) { return mpdev_setup_cfg(run, 1); }
static int mpdev_setup_nocheck(bench_run *run) { return mpdev_setup_cfg(run, 0); }

static void mpdev_teardown(bench_run *run) {
  const char *name = run->row->name;
  cuda_check(name, "cudaDeviceSynchronize", cudaDeviceSynchronize());
  int rc = magpool_destroy((magpool_t *)run->ctx);
  if (rc != 0)
    fprintf(stderr, "magpool-bench: %s: magpool_destroy: %s (%d)\n", name, magpool_strerror(rc),
            rc);
  run->ctx = NULL;
}

static inline void *mpdev_alloc(bench_thread *t, size_t size) {
  void *p = magpool_alloc((magpool_t *)t->run->ctx, size);
  if (BENCH_UNLIKELY(p == NULL)) bench_note_error(t, magpool_last_error());
  return p;
}

static inline int mpdev_free(bench_thread *t, void *ptr) {
  int rc = magpool_free((magpool_t *)t->run->ctx, ptr);
  if (BENCH_UNLIKELY(rc != 0)) bench_note_error(t, rc);
  return rc;
}

static void mpdev_body(bench_thread *t) { bench_loop(t, mpdev_alloc, mpdev_free); }

static const bench_row row_magpool_device = {
    .name = "magpool-device",
    .what = "DEVICE pool, default config (thread caches on): magpool_alloc/magpool_free",
    .flags = BENCH_ROW_DEVICE,
    .setup = mpdev_setup,
    .teardown = mpdev_teardown,
    .thread_init = device_thread_init,
    .body = mpdev_body,
    .strerror = magpool_strerror,
};

static inline void *mpasync_alloc(bench_thread *t, size_t size) {
  void *p = magpool_alloc_async((magpool_t *)t->run->ctx, size, (magpool_stream_t)t->priv);
  if (BENCH_UNLIKELY(p == NULL)) bench_note_error(t, magpool_last_error());
  return p;
}

static inline int mpasync_free(bench_thread *t, void *ptr) {
  int rc = magpool_free_async((magpool_t *)t->run->ctx, ptr, (magpool_stream_t)t->priv);
  if (BENCH_UNLIKELY(rc != 0)) bench_note_error(t, rc);
  return rc;
}

static void mpasync_body(bench_thread *t) { bench_loop(t, mpasync_alloc, mpasync_free); }

static void mpasync_thread_fini(bench_thread *t) {
  /* The pool must forget the stream before it is destroyed (magpool.h):
   * release retires what is cached for it; the sync then lets the retire
   * callbacks run. */
  if (t->priv != NULL) {
    int rc = magpool_stream_release((magpool_t *)t->run->ctx, (magpool_stream_t)t->priv);
    if (rc != 0) {
      fprintf(stderr, "magpool-bench: magpool-async: magpool_stream_release: %s (%d)\n",
              magpool_strerror(rc), rc);
      t->free_fails++;
    }
  }
  stream_thread_fini(t);
}

static const char *mpasync_strerror(int code) {
  /* Stream setup errors are CUDA codes (positive); magpool's are negative. */
  return code > 0 ? cudaGetErrorString((cudaError_t)code) : magpool_strerror(code);
}

static const bench_row row_magpool_async = {
    .name = "magpool-async",
    .what = "DEVICE pool, per-thread non-blocking stream: "
            "magpool_alloc_async/magpool_free_async",
    .flags = BENCH_ROW_DEVICE,
    .setup = mpdev_setup,
    .teardown = mpdev_teardown,
    .thread_init = stream_thread_init,
    .thread_fini = mpasync_thread_fini,
    .body = mpasync_body,
    .strerror = mpasync_strerror,
};

/* The same with capture_check = 0: the program promises to release a
 * stream before capturing on it, and async frees skip
 * cudaStreamIsCapturing. */
static const bench_row row_magpool_async_nocheck = {
    .name = "magpool-async-nocheck",
    .what = "as magpool-async, pool created with capture_check = 0",
    .flags = BENCH_ROW_DEVICE,
    .setup = mpdev_setup_nocheck,
    .teardown = mpdev_teardown,
    .thread_init = stream_thread_init,
    .thread_fini = mpasync_thread_fini,
    .body = mpasync_body,
    .strerror = mpasync_strerror,
};

const bench_row *const bench_device_rows[] = {
    &row_magpool_device, &row_magpool_async, &row_magpool_async_nocheck,
    &row_cudamallocasync, &row_cub, &row_cudamalloc,
};
const int bench_device_nrows = (int)(sizeof bench_device_rows / sizeof bench_device_rows[0]);

#else /* !BENCH_HAVE_CUDA */

int bench_cuda_probe(char *msg, size_t msglen) {
  snprintf(msg, msglen, "this magpool-bench was built without CUDA (MAGPOOL_WITH_CUDA=OFF)");
  return 0;
}

const bench_row *const bench_device_rows[] = {NULL};
const int bench_device_nrows = 0;

#endif /* BENCH_HAVE_CUDA */
