/* xcache.h - the thread's extent cache (xcache.c): extent blocks (extent.h)
 * the thread freed, kept by granule count for its next requests of about
 * their size.  Layer 4; data: types.h (mp_tcache.xc, mp_xbin). */
#ifndef MAGPOOL_XCACHE_H
#define MAGPOOL_XCACHE_H

#include "extent.h"

/* Does the thread's extent cache take blocks of `order`: an extent order
 * (extent.h), with the record's caches on (not tracking, and
 * thread_cache_bytes not 0)?  Owner thread. */
static inline bool mp_xcache_holds(const magpool_t *pool, const mp_tcache *tc, unsigned order) {
  return tc->nclasses != 0 && mp_extent_order(pool, order);
}

/* A cached extent block for a request of `size` bytes of extent order
 * `order`: one whose granules hold the request with at most an eighth of
 * them to spare (the waste rule of mp_extent_fit's hint), the most
 * recently cached first.  NULL: none, or not an extent order, or the
 * record's caches are off (tracking, thread_cache_bytes 0), or a thief
 * holds them.  Owner thread; enters and leaves the record itself. */
void *mp_xcache_take(magpool_t *pool, mp_tcache *tc, unsigned order, size_t size);
/* Keeps the extent block p of `order`, its header already cleared, in the
 * thread's cache: true.  False (the caller gives it back): not an extent
 * order, caches off (mp_xcache_holds), a thief inside, or over tc->limit
 * (the thread's share of thread_cache_bytes, brought up to date by the
 * caller).  A full bin gives its oldest block back first.  Owner thread;
 * enters and leaves the record itself. */
bool mp_xcache_put(magpool_t *pool, mp_tcache *tc, void *p, unsigned order);
/* Gives every cached block back, accounted in a.  The record held: its
 * owner inside, or a thief. */
void mp_xcache_flush(magpool_t *pool, mp_tcache *tc, mp_acct *a);
/* The owner's take from the trees of `order` for `need` bytes
 * (mp_region_take_need, grow 0), outside its record: while the extent
 * cache holds blocks it may not map a chunk or raise the busy chunks'
 * mark (MP_TAKE_NOMAP); refused, the cached blocks go back (unless a thief
 * holds the record, which gives them back itself) and it takes again.
 * NULL: the trees have none (the caller runs the ladder). */
void *mp_xcache_tree_take(magpool_t *pool, mp_tcache *tc, unsigned order, size_t need);

#endif /* MAGPOOL_XCACHE_H */
