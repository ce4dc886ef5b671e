/* source_cuda.c - CUDA memory sources: device memory and pinned host
 * memory.  Whole regions come from cudaMalloc and cudaHostAlloc (reserve,
 * release); device address ranges mapped per chunk from the driver's
 * virtual memory management calls (va_reserve ... unmap, in source_vmm.c).
 * Pinned memory is whole regions only (mp_source_pinned says why).  Built
 * in every configuration; with no CUDA in the build they fail with
 * MAGPOOL_ENODEV at open.  Layer 1. */
#include "internal.h"
#include "source_vmm.h"

#include <stdlib.h>

#if defined(MAGPOOL_HAVE_CUDA)
#include <cuda_runtime.h>

typedef struct cuda_ctx {
  int device;
  mp_vmm *vmm; /* chunk mapping (source_vmm.c); NULL for pinned memory */
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

static int cuda_open(void **ctx, const magpool_config_t *cfg, int chunks) {
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
  int rc = chunks ? mp_vmm_open(&c->vmm, c->device) : 0;
  if (rc) {
    free(c);
    return rc;
  }
  *ctx = c;
  return 0;
}

static int device_open(void **ctx, const magpool_config_t *cfg) { return cuda_open(ctx, cfg, 1); }
static int pinned_open(void **ctx, const magpool_config_t *cfg) { return cuda_open(ctx, cfg, 0); }

static void cuda_close(void *ctx) {
  cuda_ctx *c = ctx;
  if (c == NULL) return;
  mp_vmm_close(c->vmm);
  free(c);
}

/* Chunk mapping, of the DEVICE source only. */
static size_t cuda_granularity(void *ctx) { return mp_vmm_granularity(((cuda_ctx *)ctx)->vmm); }
static int cuda_va_reserve(void *ctx, size_t size, size_t chunk, void **base) {
  return mp_vmm_va_reserve(((cuda_ctx *)ctx)->vmm, size, chunk, base);
}
static int cuda_va_release(void *ctx, void *base, size_t size) {
  return mp_vmm_va_release(((cuda_ctx *)ctx)->vmm, base, size);
}
static int cuda_map(void *ctx, void *addr, size_t bytes) {
  return mp_vmm_map(((cuda_ctx *)ctx)->vmm, addr, bytes);
}
static int cuda_map_group(void *ctx, void *addr, size_t bytes) {
  return mp_vmm_map_group(((cuda_ctx *)ctx)->vmm, addr, bytes);
}
static int cuda_unmap(void *ctx, void *addr, size_t bytes, int keep) {
  return mp_vmm_unmap(((cuda_ctx *)ctx)->vmm, addr, bytes, keep);
}
static void cuda_drop_kept(void *ctx) { mp_vmm_drop_kept(((cuda_ctx *)ctx)->vmm); }

int mp_source_chunk_counts(void *ctx, mp_chunk_counts *out) {
  if (ctx == NULL || out == NULL) return MAGPOOL_EINVAL;
  const mp_vmm *v = ((cuda_ctx *)ctx)->vmm;
  if (v == NULL) *out = (mp_chunk_counts){0};
  else mp_vmm_counts(v, out);
  return 0;
}

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

/* The device's memory: the default cap of a growing DEVICE pool. */
static size_t device_capacity(void *ctx) {
  cuda_ctx *c = ctx;
  int saved;
  if (with_device(c, &saved) != 0) return 0;
  size_t fr = 0, total = 0;
  if (cudaMemGetInfo(&fr, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    total = 0;
  }
  restore_device(c, saved);
  return total;
}

const mp_source_ops mp_source_device = {
  .name = "device",
  .capacity = device_capacity,
  .reserve = device_reserve,
  .release = device_release,
  .commit = NULL,
  .decommit = NULL,
  .open = device_open,
  .close = cuda_close,
  .granularity = cuda_granularity,
  .va_reserve = cuda_va_reserve,
  .va_release = cuda_va_release,
  .map = cuda_map,
  .map_group = cuda_map_group,
  .unmap = cuda_unmap,
  .drop_kept = cuda_drop_kept,
};

const mp_source_ops mp_source_pinned = {
  .name = "pinned",
  /* Whole regions (cudaHostAlloc) only.  Host memory mapped per chunk
   * breaks runtime calls that programs make on pinned blocks (H200, CUDA
   * 13, 2026-12-02; docs/design.md, "PINNED: whole regions"): through
   * cuMemCreate handles, cudaHostGetDevicePointer answers the handle's
   * start for a pointer inside it and cudaMemset refuses a range over two
   * handles; through cudaHostRegister per chunk, cudaMemset and cudaMemcpy
   * refuse a range over two registrations. */
  .reserve = pinned_reserve,
  .release = pinned_release,
  .commit = NULL,
  .decommit = NULL,
  .open = pinned_open,
  .close = cuda_close,
};

#else /* no CUDA in this build: open fails, so no other op is reached;
        * each still answers MAGPOOL_ENODEV (granularity: 0) */

static int nocuda_open(void **ctx, const magpool_config_t *cfg) {
  (void)ctx;
  (void)cfg;
  return MAGPOOL_ENODEV;
}
static int nocuda_reserve(void *ctx, size_t size, void **base) {
  (void)ctx, (void)size, (void)base;
  return MAGPOOL_ENODEV;
}
static int nocuda_release(void *ctx, void *base, size_t size) {
  (void)ctx, (void)base, (void)size;
  return MAGPOOL_ENODEV;
}
static size_t nocuda_granularity(void *ctx) {
  (void)ctx;
  return 0;
}
static int nocuda_va_reserve(void *ctx, size_t size, size_t chunk, void **base) {
  (void)ctx, (void)size, (void)chunk, (void)base;
  return MAGPOOL_ENODEV;
}
static int nocuda_map(void *ctx, void *addr, size_t bytes) {
  (void)ctx, (void)addr, (void)bytes;
  return MAGPOOL_ENODEV;
}
static int nocuda_unmap(void *ctx, void *addr, size_t bytes, int keep) {
  (void)ctx, (void)addr, (void)bytes, (void)keep;
  return MAGPOOL_ENODEV;
}

int mp_source_chunk_counts(void *ctx, mp_chunk_counts *out) {
  if (ctx == NULL || out == NULL) return MAGPOOL_EINVAL;
  *out = (mp_chunk_counts){0};
  return 0;
}

const mp_source_ops mp_source_device = {
  .name = "device", .reserve = nocuda_reserve, .release = nocuda_release,
  .open = nocuda_open, .granularity = nocuda_granularity,
  .va_reserve = nocuda_va_reserve, .va_release = nocuda_release,
  .map = nocuda_map, .unmap = nocuda_unmap,
};
const mp_source_ops mp_source_pinned = {
  .name = "pinned", .reserve = nocuda_reserve, .release = nocuda_release,
  .open = nocuda_open, .granularity = nocuda_granularity,
  .va_reserve = nocuda_va_reserve, .va_release = nocuda_release,
  .map = nocuda_map, .unmap = nocuda_unmap,
};
#endif
