/* alloc.h - the hand-out every allocation path ends with, shared by the
 * synchronous (alloc.c) and stream-ordered (alloc_async.c) entry points.
 * Layer 5. */
#ifndef MAGPOOL_ALLOC_H
#define MAGPOOL_ALLOC_H

#include "thread.h"

/* Marks p live in its header and counts it in the owner's record.  Owner
 * of tc.  Relaxed: the header is read only by a later free of p, which the
 * program orders after this allocation (hdr.h). */
MP_INLINE void *mp_hand_out(magpool_t *pool, mp_tcache *tc, void *p, unsigned order,
                            size_t size, uint32_t flags) {
  mp_region *r = mp_region_of(pool, p);
  mp_hdr_set(mp_region_hdr(pool, r, p), order, mp_block_bytes(pool, order) - size, flags);
  mp_owner_add(&tc->st.requested, size);
  mp_owner_add(&tc->st.allocs, 1);
  if (MP_UNLIKELY(mp_load_relaxed(&pool->tracking))) mp_track_on_alloc(pool, p, size);
  return p;
}

/* Validates p as a live block of the pool (of the given requested size if
 * sized; of a scope iff scoped) without changing anything.  On success
 * stores its header word's address, order and requested size.  Any
 * thread; relaxed reads (hdr.h). */
MP_INLINE int mp_block_validate(magpool_t *pool, const void *p, size_t size, bool sized,
                                bool scoped, _Atomic uint32_t **h_out, unsigned *order_out,
                                size_t *req_out) {
  mp_region *r = mp_region_of(pool, p);
  if (MP_UNLIKELY(r == NULL)) return MAGPOOL_EINVAL;
  size_t off = (size_t)((const char *)p - r->base);
  if (MP_UNLIKELY(off & (pool->cfg.min_block - 1))) return MAGPOOL_EINVAL;
  _Atomic uint32_t *h = mp_region_hdr_at(r, off >> pool->min_shift);
  uint32_t w = mp_hdr_read(h);
  if (MP_UNLIKELY(!mp_hdr_live(w))) return MAGPOOL_EINVAL; /* interior, freed, foreign */
  if (MP_UNLIKELY(mp_hdr_scoped(w) != scoped)) return MAGPOOL_EINVAL;
  unsigned order = mp_hdr_order(w);
  size_t req = mp_block_bytes(pool, order) - mp_hdr_slack(h, w);
  if (MP_UNLIKELY(sized && size != req)) return MAGPOOL_EINVAL;
  *h_out = h;
  *order_out = order;
  *req_out = req;
  return 0;
}

/* Host pools take NULL for "no stream": the async calls are then the
 * synchronous ones. */
MP_INLINE bool mp_no_stream(const magpool_t *pool, magpool_stream_t s) {
  return s == NULL && pool->cfg.kind == MAGPOOL_MEM_HOST;
}

#endif /* MAGPOOL_ALLOC_H */
