/* source_cuda.c - CUDA memory sources: device memory (cudaMalloc) and
 * pinned host memory (cudaHostAlloc).  Built in every configuration; with
 * no CUDA in the build they fail with MAGPOOL_ENODEV at open.  Layer 1. */
#include "internal.h"

#include <stdlib.h>

#if defined(MAGPOOL_HAVE_CUDA)
#include <cuda_runtime.h>

typedef struct cuda_ctx {
  int device;
} cuda_ctx;

/* Maps a CUDA error to a magpool code and remembers it. */
static int cuda_err(cudaError_t e) {
  if (e == cudaSuccess) return 0;
  mp_set_cuda_error((int)e);
  switch (e) {
  case cudaErrorMemoryAllocation: return MAGPOOL_ENOMEM;
  case cudaErrorNoDevice:
  case cudaErrorInsufficientDriver:
  case cudaErrorInvalidDevice:
  case cudaErrorDevicesUnavailable:
  case cudaErrorInitializationError:
  case cudaErrorStubLibrary:
  case cudaErrorCallRequiresNewerDriver:
    return MAGPOOL_ENODEV;
  default: return MAGPOOL_ECUDA;
  }
}

static int cuda_open(void **ctx, const magpool_config_t *cfg) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* clear the sticky-free error state */
    int rc = cuda_err(e);
    return rc == MAGPOOL_ECUDA ? MAGPOOL_ENODEV : rc;
  }
  if (n <= 0) return MAGPOOL_ENODEV;
  if (cfg->device < 0 || cfg->device >= n) return MAGPOOL_EINVAL;
  cuda_ctx *c = calloc(1, sizeof *c);
  if (c == NULL) return MAGPOOL_ENOMEM;
  c->device = cfg->device;
  *ctx = c;
  return 0;
}

static void cuda_close(void *ctx) { free(ctx); }

/* Runs with the pool's device current, restoring the caller's. */
static int with_device(cuda_ctx *c, int *saved) {
  cudaError_t e = cudaGetDevice(saved);
  if (e != cudaSuccess) return cuda_err(e);
  if (*saved != c->device) {
    e = cudaSetDevice(c->device);
    if (e != cudaSuccess) return cuda_err(e);
  }
  return 0;
}
static void restore_device(cuda_ctx *c, int saved) {
  if (saved != c->device) (void)cudaSetDevice(saved);
}

static int device_reserve(void *ctx, size_t size, void **base) {
  cuda_ctx *c = ctx;
  int saved, rc = with_device(c, &saved);
  if (rc) return rc;
  void *p = NULL;
  rc = cuda_err(cudaMalloc(&p, size));
  restore_device(c, saved);
  if (rc == 0) *base = p;
  else (void)cudaGetLastError();
  return rc;
}

static int device_release(void *ctx, void *base, size_t size) {
  (void)size;
  cuda_ctx *c = ctx;
  int saved, rc = with_device(c, &saved);
  if (rc) return rc;
  rc = cuda_err(cudaFree(base));
  restore_device(c, saved);
  return rc;
}

static int pinned_reserve(void *ctx, size_t size, void **base) {
  cuda_ctx *c = ctx;
  int saved, rc = with_device(c, &saved);
  if (rc) return rc;
  void *p = NULL;
  rc = cuda_err(cudaHostAlloc(&p, size, cudaHostAllocPortable));
  restore_device(c, saved);
  if (rc == 0) *base = p;
  else (void)cudaGetLastError();
  return rc;
}

static int pinned_release(void *ctx, void *base, size_t size) {
  (void)ctx;
  (void)size;
  return cuda_err(cudaFreeHost(base));
}

const mp_source_ops mp_source_device = {
  .name = "device",
  .reserve = device_reserve,
  .release = device_release,
  .commit = NULL,
  .decommit = NULL,
  .open = cuda_open,
  .close = cuda_close,
};

const mp_source_ops mp_source_pinned = {
  .name = "pinned",
  .reserve = pinned_reserve,
  .release = pinned_release,
  .commit = NULL,
  .decommit = NULL,
  .open = cuda_open,
  .close = cuda_close,
};

#else /* no CUDA in this build */

static int nocuda_open(void **ctx, const magpool_config_t *cfg) {
  (void)ctx;
  (void)cfg;
  return MAGPOOL_ENODEV;
}
static int nocuda_reserve(void *ctx, size_t size, void **base) {
  (void)ctx;
  (void)size;
  (void)base;
  return MAGPOOL_ENODEV;
}
static int nocuda_release(void *ctx, void *base, size_t size) {
  (void)ctx;
  (void)base;
  (void)size;
  return MAGPOOL_ENODEV;
}

const mp_source_ops mp_source_device = {
  .name = "device", .reserve = nocuda_reserve, .release = nocuda_release,
  .open = nocuda_open,
};
const mp_source_ops mp_source_pinned = {
  .name = "pinned", .reserve = nocuda_reserve, .release = nocuda_release,
  .open = nocuda_open,
};
#endif
