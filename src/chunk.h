/* chunk.h - the chunk map's two files: chunk.c (takes, gives, maps,
 * budget, life cycle) calls chunk_unmap.c (the unmap side of the take
 * against unmap handshake, and the reserved-bytes count), never the
 * other way.  Layer 2; data and invariants C1-C6: types.h, mp_chunks. */
#ifndef MAGPOOL_CHUNK_H
#define MAGPOOL_CHUNK_H

#include "runs.h"

/* The mapped bitmap (under the lock). */
static inline void mp_chunks_bit_put(mp_chunks *c, uint64_t i, bool on) {
  _Atomic uint64_t *w = &c->mapped[i / 64];
  uint64_t b = (uint64_t)1 << (i % 64), v = mp_load_relaxed(w);
  mp_store_relaxed(w, on ? v | b : v & ~b);
}

/* reserved (and its peak) by `chunks` chunks, mapped (> 0) or unmapped. */
void mp_chunks_reserved_add(magpool_t *pool, int64_t chunks);
/* Unmaps up to `want` empty mapped chunks, the highest first: run space,
 * then the lower half (lowest-first placement wants high chunks last),
 * never below `floor` mapped; `keep`: the source keeps their memory for
 * the maps of a move.  Returns how many were unmapped.  Lock held. */
uint64_t mp_chunks_unmap_highest(magpool_t *pool, uint64_t want, int keep, uint64_t floor);
/* Empty mapped chunks, counted up to `enough`.  Lock held. */
uint64_t mp_chunks_count_empty(mp_chunks *c, uint64_t enough);

#endif /* MAGPOOL_CHUNK_H */
