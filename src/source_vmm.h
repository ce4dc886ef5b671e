/* source_vmm.h - chunk mapping for the DEVICE source (source_vmm.c), used
 * by source_cuda.c only.  Layer 1.
 *
 * An mp_vmm maps physical memory of one device per chunk into address
 * ranges it reserved, through the driver's virtual memory management calls
 * (looked up once through the runtime, so nothing links libcuda).  PINNED
 * pools do not map per chunk (docs/design.md, "PINNED: whole regions").
 *
 * Threads: mp_vmm_map*, mp_vmm_unmap, mp_vmm_drop_kept and mp_vmm_counts must not run at the
 * same time on one mp_vmm (the pool calls them under its map lock);
 * va_reserve / va_release not at the same time as anything else on it.
 * Each call works with the source's device current and gives the caller
 * its current device back.
 *
 * Without CUDA in the build every call fails with MAGPOOL_ENODEV (open)
 * or is never reached. */
#ifndef MAGPOOL_SOURCE_VMM_H
#define MAGPOOL_SOURCE_VMM_H

#include "internal.h"

typedef struct mp_vmm mp_vmm;

/* Makes the chunk state of a source on `device`.  Succeeds also where the
 * driver cannot map chunks: then mp_vmm_granularity answers 0 and
 * va_reserve MAGPOOL_ENOTSUP.  MAGPOOL_ENOMEM or MAGPOOL_ENODEV. */
int mp_vmm_open(mp_vmm **v, int device);
/* Releases every range and handle still held; NULL is a no-op. */
void mp_vmm_close(mp_vmm *v);
/* The minimum allocation granularity (a power of two), or 0 when chunks
 * cannot be mapped here. */
size_t mp_vmm_granularity(mp_vmm *v);
/* The mp_source_ops members of the same names (types.h has the
 * contracts); EINVAL for input outside them, nothing changed. */
int mp_vmm_va_reserve(mp_vmm *v, size_t size, size_t chunk, void **base);
int mp_vmm_va_release(mp_vmm *v, void *base, size_t size);
int mp_vmm_map(mp_vmm *v, void *addr, size_t bytes);
int mp_vmm_map_group(mp_vmm *v, void *addr, size_t bytes);
int mp_vmm_unmap(mp_vmm *v, void *addr, size_t bytes, int keep);
void mp_vmm_drop_kept(mp_vmm *v);
void mp_vmm_counts(const mp_vmm *v, mp_chunk_counts *out);

#endif /* MAGPOOL_SOURCE_VMM_H */
