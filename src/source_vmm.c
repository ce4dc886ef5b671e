/* source_vmm.c - chunk mapping for the DEVICE source through the driver's
 * virtual memory management calls.  Layer 1 (source_vmm.h
 * has the contract; docs/design.md, "Memory sources: chunk mapping", the
 * reasons).
 *
 * State: the ranges reserved (each with one handle slot per chunk, so any
 * chunk can be unmapped or moved on its own) and a stack of kept handles
 * that the next map of their size uses before it creates memory (until
 * mp_vmm_drop_kept).  No locks: the pool serialises these (its map lock). */
#include "source_vmm.h"

#include <stdlib.h>

#if defined(MAGPOOL_HAVE_CUDA)
#include <cuda.h> /* types only: the calls go through entry points */
#include <cuda_runtime.h>
#include <pthread.h>

/* The driver calls, looked up once per process through the runtime (the
 * ABI of CUDA 12.0, unchanged for these since 10.2). */
#define MP_VMM_ABI 12000
static struct {
  CUresult (*dev_get)(CUdevice *, int);
  CUresult (*dev_attr)(int *, CUdevice_attribute, CUdevice);
  CUresult (*gran)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
  CUresult (*va_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*va_free)(CUdeviceptr, size_t);
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                     unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  int ok;
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static int lookup(const char *name, void **fn) {
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, MP_VMM_ABI, cudaEnableDefault, &q);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e == cudaSuccess && q == cudaDriverEntryPointSuccess && *fn != NULL;
}

static void drv_init(void) {
  drv.ok = lookup("cuDeviceGet", (void **)&drv.dev_get) &&
           lookup("cuDeviceGetAttribute", (void **)&drv.dev_attr) &&
           lookup("cuMemGetAllocationGranularity", (void **)&drv.gran) &&
           lookup("cuMemAddressReserve", (void **)&drv.va_reserve) &&
           lookup("cuMemAddressFree", (void **)&drv.va_free) &&
           lookup("cuMemCreate", (void **)&drv.create) &&
           lookup("cuMemRelease", (void **)&drv.release) &&
           lookup("cuMemMap", (void **)&drv.map) &&
           lookup("cuMemUnmap", (void **)&drv.unmap) &&
           lookup("cuMemSetAccess", (void **)&drv.access);
}

typedef struct vrange {
  struct vrange *next;
  uintptr_t base;
  size_t size, chunk;
  unsigned shift;                  /* log2(chunk)                       */
  CUmemGenericAllocationHandle *h; /* at a mapping's first chunk       */
  unsigned char *on;               /* per chunk: mapped                 */
  unsigned char *gl;               /* chunks of the mapping that starts
                                      here (1, or a group's length); 0
                                      elsewhere                         */
} vrange;

struct mp_vmm {
  int device;
  size_t gran;                /* 0: chunks cannot be mapped here         */
  CUmemAllocationProp prop;   /* of every chunk                          */
  CUmemAccessDesc acc;        /* read and write for the device          */
  vrange *ranges;
  struct kept { CUmemGenericAllocationHandle h; size_t size, nch; } *kept; /* nch: chunks */
  size_t nkept, capkept;
  mp_chunk_counts n;
};

/* Maps a driver error to a magpool code and remembers it. */
static int cu_err(CUresult r) {
  if (r == CUDA_SUCCESS) return 0;
  mp_set_cuda_error((int)r);
  return r == CUDA_ERROR_OUT_OF_MEMORY ? MAGPOOL_ENOMEM : MAGPOOL_ECUDA;
}

/* Runs with the source's device current, restoring the caller's. */
static int enter(const mp_vmm *v, int *saved) {
  cudaError_t e = cudaGetDevice(saved);
  if (e == cudaSuccess && *saved != v->device) e = cudaSetDevice(v->device);
  if (e == cudaSuccess) return 0;
  (void)cudaGetLastError();
  mp_set_cuda_error((int)e);
  return MAGPOOL_ECUDA;
}
static void leave(const mp_vmm *v, int saved) {
  if (saved != v->device) (void)cudaSetDevice(saved);
}

static int attr(CUdevice d, CUdevice_attribute a) {
  int x = 0;
  return drv.dev_attr(&x, a, d) == CUDA_SUCCESS ? x : 0;
}

/* Chooses the chunks' properties; leaves gran 0 where the driver cannot. */
static void choose(mp_vmm *v) {
  CUdevice d;
  if (drv.dev_get(&d, v->device) != CUDA_SUCCESS) return;
  if (!attr(d, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)) return;
  CUmemAllocationProp *p = &v->prop;
  p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p->requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  v->acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  v->acc.location.id = v->device;
  v->acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  p->location = v->acc.location;
  size_t g = 0;
  if (drv.gran(&g, p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) return;
  if (g != 0 && (g & (g - 1)) == 0) v->gran = g;
}

int mp_vmm_open(mp_vmm **out, int device) {
  (void)pthread_once(&drv_once, drv_init);
  mp_vmm *v = calloc(1, sizeof *v);
  if (v == NULL) return MAGPOOL_ENOMEM;
  v->device = device;
  if (drv.ok) choose(v);
  *out = v;
  return 0;
}

size_t mp_vmm_granularity(mp_vmm *v) { return v->gran; }

void mp_vmm_counts(const mp_vmm *v, mp_chunk_counts *out) { *out = v->n; }

/* ------------------------------------------------------------- handles -- */

/* Takes a kept handle of exactly `size` bytes into *h, if there is one. */
static bool take_kept(mp_vmm *v, size_t size, CUmemGenericAllocationHandle *h) {
  for (size_t i = v->nkept; i-- > 0;) {
    if (v->kept[i].size != size) continue;
    *h = v->kept[i].h;
    v->n.kept -= v->kept[i].nch;
    v->kept[i] = v->kept[--v->nkept];
    return true;
  }
  return false;
}

static int take_handle(mp_vmm *v, size_t size, CUmemGenericAllocationHandle *h, int *reused) {
  if ((*reused = take_kept(v, size, h)) != 0) return 0;
  int rc = cu_err(drv.create(h, size, &v->prop, 0));
  if (rc == 0) v->n.creates++;
  return rc;
}

static void drop_handle(mp_vmm *v, CUmemGenericAllocationHandle h) {
  if (drv.release(h) == CUDA_SUCCESS) v->n.releases++;
}

/* Keeps h (`size` bytes, nch chunks) for the next map of its size;
 * frees it if the stack cannot grow. */
static void keep_handle(mp_vmm *v, CUmemGenericAllocationHandle h, size_t size, size_t nch) {
  if (v->nkept == v->capkept) {
    size_t cap = v->capkept ? 2 * v->capkept : 64;
    struct kept *k = realloc(v->kept, cap * sizeof *k);
    if (k == NULL) { drop_handle(v, h); return; }
    v->kept = k;
    v->capkept = cap;
  }
  v->kept[v->nkept++] = (struct kept){h, size, nch};
  v->n.kept += nch;
}

static void drop_kept(mp_vmm *v) {
  while (v->nkept > 0) {
    v->nkept--;
    drop_handle(v, v->kept[v->nkept].h);
    v->n.kept -= v->kept[v->nkept].nch;
  }
}

/* -------------------------------------------------------------- ranges -- */

static int pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

int mp_vmm_va_reserve(mp_vmm *v, size_t size, size_t chunk, void **base) {
  if (base == NULL || !pow2(size) || !pow2(chunk) || chunk > size) return MAGPOOL_EINVAL;
  if (v->gran == 0) return MAGPOOL_ENOTSUP;
  if (chunk < v->gran) return MAGPOOL_EINVAL;
  size_t n = size / chunk;
  vrange *r = calloc(1, sizeof *r);
  CUmemGenericAllocationHandle *h = calloc(n, sizeof *h);
  unsigned char *on = calloc(n, 1), *gl = calloc(n, 1);
  int saved, rc = MAGPOOL_ENOMEM;
  if (r == NULL || h == NULL || on == NULL || gl == NULL) goto fail;
  if ((rc = enter(v, &saved)) != 0) goto fail;
  CUdeviceptr p = 0;
  rc = cu_err(drv.va_reserve(&p, size, size, 0, 0));
  leave(v, saved);
  if (rc) goto fail;
  if (p % size != 0) { /* never seen; the contract asks for it */
    (void)drv.va_free(p, size);
    rc = MAGPOOL_ENOMEM;
    goto fail;
  }
  r->base = (uintptr_t)p;
  r->size = size;
  r->chunk = chunk;
  r->shift = (unsigned)__builtin_ctzll((unsigned long long)chunk);
  r->h = h;
  r->on = on;
  r->gl = gl;
  r->next = v->ranges;
  v->ranges = r;
  *base = (void *)p;
  return 0;
fail:
  free(gl);
  free(on);
  free(h);
  free(r);
  return rc;
}

/* The driver's unmap of the mapping that starts at chunk i of r (a test
 * may fail it: MP_HOOK_VMM_UNMAP). */
static CUresult drv_unmap(vrange *r, size_t i) {
  mp_hook_unmap hk = {(void *)(r->base + (i << r->shift)), 0};
  MP_HOOK(MP_HOOK_VMM_UNMAP, &hk);
  if (hk.fail) return CUDA_ERROR_INVALID_VALUE;
  return drv.unmap(r->base + (i << r->shift), (size_t)r->gl[i] << r->shift);
}

/* The mapping at chunk i of r, unmapped: its handle kept (keep: for the
 * next map of its size) or freed. */
static void unmapped(mp_vmm *v, vrange *r, size_t i, int keep) {
  size_t n = r->gl[i];
  for (size_t k = i; k < i + n; k++) r->on[k] = 0;
  r->gl[i] = 0;
  v->n.mapped -= n;
  if (keep) keep_handle(v, r->h[i], n << r->shift, n);
  else drop_handle(v, r->h[i]);
}

/* Unmaps the mapping that starts at chunk i of r. */
static int unmap_one(mp_vmm *v, vrange *r, size_t i, int keep) {
  int rc = cu_err(drv_unmap(r, i));
  if (rc == 0) unmapped(v, r, i, keep);
  return rc;
}

/* Maps the mapping at chunk i of r back, its handle still held, with
 * access as before: 0, or -1 (then it stays unmapped). */
static int remap(const mp_vmm *v, vrange *r, size_t i) {
  CUdeviceptr a = r->base + (i << r->shift);
  size_t len = (size_t)r->gl[i] << r->shift;
  if (drv.map(a, len, 0, r->h[i], 0) != CUDA_SUCCESS) return -1;
  if (drv.access(a, len, &v->acc, 1) == CUDA_SUCCESS) return 0;
  (void)drv.unmap(a, len);
  return -1;
}

/* Unmaps and frees every mapping of r; returns the first error (0 if none). */
static int empty_range(mp_vmm *v, vrange *r) {
  int rc = 0;
  for (size_t i = 0, n = r->size >> r->shift; i < n; i++) {
    if (r->gl[i] == 0) continue;
    int e = unmap_one(v, r, i, 0);
    if (e && !rc) rc = e;
  }
  return rc;
}

int mp_vmm_va_release(mp_vmm *v, void *base, size_t size) {
  vrange **pp = &v->ranges;
  while (*pp != NULL && ((*pp)->base != (uintptr_t)base || (*pp)->size != size)) pp = &(*pp)->next;
  if (*pp == NULL) return MAGPOOL_EINVAL;
  vrange *r = *pp;
  int saved, rc = enter(v, &saved);
  if (rc) return rc;
  rc = empty_range(v, r);
  drop_kept(v);
  if (rc == 0) {
    rc = cu_err(drv.va_free(r->base, r->size));
    if (rc == 0) {
      *pp = r->next;
      free(r->h);
      free(r->on);
      free(r->gl);
      free(r);
    }
  }
  leave(v, saved);
  return rc;
}

void mp_vmm_close(mp_vmm *v) {
  if (v == NULL) return;
  int saved;
  int entered = v->ranges != NULL || v->nkept != 0 ? enter(v, &saved) == 0 : 0;
  while (v->ranges != NULL) {
    vrange *r = v->ranges;
    v->ranges = r->next;
    if (entered && empty_range(v, r) == 0) (void)drv.va_free(r->base, r->size);
    free(r->h);
    free(r->on);
    free(r->gl);
    free(r);
  }
  if (entered) {
    drop_kept(v);
    leave(v, saved);
  }
  free(v->kept);
  free(v);
}

/* The range holding [addr, addr + bytes) as a run of whole chunks, each
 * mapped (want 1) or each not (want 0); NULL if not so.  *first: index of
 * the run's first chunk. */
static vrange *find_run(mp_vmm *v, void *addr, size_t bytes, int want, size_t *first) {
  uintptr_t a = (uintptr_t)addr;
  for (vrange *r = v->ranges; r != NULL; r = r->next) {
    if (a < r->base || a - r->base >= r->size) continue;
    size_t off = a - r->base;
    if (bytes == 0 || (off | bytes) & (r->chunk - 1) || bytes > r->size - off) return NULL;
    size_t i0 = off >> r->shift, n = bytes >> r->shift;
    for (size_t i = i0; i < i0 + n; i++)
      if (r->on[i] != want) return NULL;
    *first = i0;
    return r;
  }
  return NULL;
}

/* Grants the run's access, one call over all of it. */
static CUresult set_access(mp_vmm *v, CUdeviceptr p, size_t bytes) {
  return drv.access(p, bytes, &v->acc, 1);
}

/* Unmaps chunks [i0, i0 + n) of r; the first `reused` of them go back to
 * the kept stack, the others are freed (undo of a failed map). */
static void undo_run(mp_vmm *v, vrange *r, size_t i0, size_t n, size_t reused) {
  for (size_t k = 0; k < n; k++) {
    size_t i = i0 + k;
    (void)drv.unmap(r->base + (i << r->shift), r->chunk);
    r->on[i] = 0;
    r->gl[i] = 0;
    v->n.mapped--;
    if (k < reused) {
      keep_handle(v, r->h[i], r->chunk, 1);
      v->n.reuses--;
    } else {
      drop_handle(v, r->h[i]);
    }
  }
}

int mp_vmm_map(mp_vmm *v, void *addr, size_t bytes) {
  size_t i0;
  vrange *r = find_run(v, addr, bytes, 0, &i0);
  if (r == NULL) return MAGPOOL_EINVAL;
  size_t n = bytes >> r->shift, done = 0, reused = 0;
  int saved, rc = enter(v, &saved);
  if (rc) return rc;
  /* Kept handles come first: once the stack has no handle of this size,
   * none is pushed before the run ends, so the run's first `reused`
   * chunks are exactly the kept ones. */
  for (; done < n; done++) {
    size_t i = i0 + done;
    CUmemGenericAllocationHandle h;
    int was_kept;
    if ((rc = take_handle(v, r->chunk, &h, &was_kept)) != 0) break;
    rc = cu_err(drv.map(r->base + (i << r->shift), r->chunk, 0, h, 0));
    if (rc) {
      if (was_kept) { keep_handle(v, h, r->chunk, 1); }
      else drop_handle(v, h);
      break;
    }
    r->h[i] = h;
    r->on[i] = 1;
    r->gl[i] = 1;
    v->n.mapped++;
    if (was_kept) { v->n.reuses++; reused++; }
  }
  if (rc == 0) rc = cu_err(set_access(v, (CUdeviceptr)addr, bytes));
  if (rc) undo_run(v, r, i0, done, reused);
  leave(v, saved);
  return rc;
}

int mp_vmm_map_group(mp_vmm *v, void *addr, size_t bytes) {
  size_t i0;
  vrange *r = find_run(v, addr, bytes, 0, &i0);
  size_t n = bytes >> (r != NULL ? r->shift : 0);
  if (r == NULL || n > 255) return MAGPOOL_EINVAL;
  if (n == 1) return mp_vmm_map(v, addr, bytes);
  int saved, rc = enter(v, &saved);
  if (rc) return rc;
  /* A kept handle of exactly this size (a move's group) serves, else the
   * kept ones are freed first to make room (one-chunk handles never make
   * a group: its unmap would be several calls, which can fail halfway). */
  CUmemGenericAllocationHandle h;
  int was_kept = take_kept(v, bytes, &h);
  if (!was_kept) drop_kept(v);
  if (was_kept || (rc = take_handle(v, bytes, &h, &was_kept)) == 0) {
    rc = cu_err(drv.map((CUdeviceptr)addr, bytes, 0, h, 0));
    if (rc == 0 && (rc = cu_err(set_access(v, (CUdeviceptr)addr, bytes))) != 0)
      (void)drv.unmap((CUdeviceptr)addr, bytes);
    if (rc && was_kept) {
      keep_handle(v, h, bytes, n);
    } else if (rc) {
      drop_handle(v, h);
    } else {
      v->n.reuses += was_kept ? n : 0;
      r->h[i0] = h;
      for (size_t k = i0; k < i0 + n; k++) r->on[k] = 1;
      r->gl[i0] = (unsigned char)n;
      v->n.mapped += n;
    }
  }
  leave(v, saved);
  return rc;
}

void mp_vmm_drop_kept(mp_vmm *v) {
  int saved;
  if (v->nkept == 0 || enter(v, &saved) != 0) return;
  drop_kept(v);
  leave(v, saved);
}

int mp_vmm_unmap(mp_vmm *v, void *addr, size_t bytes, int keep) {
  size_t i0;
  vrange *r = find_run(v, addr, bytes, 1, &i0);
  if (r == NULL) return MAGPOOL_EINVAL;
  size_t end = i0 + (bytes >> r->shift);
  /* Whole mappings only (cuMemUnmap cannot take part of one): checked
   * before anything is unmapped. */
  for (size_t i = i0; i < end; i += r->gl[i])
    if (r->gl[i] == 0 || i + r->gl[i] > end) return MAGPOOL_EINVAL;
  int saved, rc = enter(v, &saved);
  if (rc) return rc;
  /* One call per mapping (one over several costs as much), all or none:
   * after a failure those already unmapped are mapped back, so that the
   * caller's view (nothing unmapped) stays true.  One that cannot be is
   * lost (the driver failed twice): its memory is freed. */
  size_t i = i0;
  while (i < end && (rc = cu_err(drv_unmap(r, i))) == 0) i += r->gl[i];
  for (size_t k = i0, n; k < i; k += n) {
    n = r->gl[k];
    if (rc == 0 || remap(v, r, k) != 0) unmapped(v, r, k, rc == 0 && keep);
  }
  leave(v, saved);
  return rc;
}

#else /* no CUDA in this build */

int mp_vmm_open(mp_vmm **v, int device) {
  (void)v, (void)device;
  return MAGPOOL_ENODEV;
}
void mp_vmm_close(mp_vmm *v) { (void)v; }
size_t mp_vmm_granularity(mp_vmm *v) { return (void)v, 0; }
int mp_vmm_va_reserve(mp_vmm *v, size_t size, size_t chunk, void **base) {
  (void)v, (void)size, (void)chunk, (void)base;
  return MAGPOOL_ENODEV;
}
int mp_vmm_va_release(mp_vmm *v, void *base, size_t size) {
  (void)v, (void)base, (void)size;
  return MAGPOOL_ENODEV;
}
int mp_vmm_map(mp_vmm *v, void *addr, size_t bytes) {
  (void)v, (void)addr, (void)bytes;
  return MAGPOOL_ENODEV;
}
int mp_vmm_map_group(mp_vmm *v, void *addr, size_t bytes) { return mp_vmm_map(v, addr, bytes); }
int mp_vmm_unmap(mp_vmm *v, void *addr, size_t bytes, int keep) {
  (void)v, (void)addr, (void)bytes, (void)keep;
  return MAGPOOL_ENODEV;
}
void mp_vmm_drop_kept(mp_vmm *v) { (void)v; }
void mp_vmm_counts(const mp_vmm *v, mp_chunk_counts *out) {
  (void)v;
  *out = (mp_chunk_counts){0};
}
#endif
