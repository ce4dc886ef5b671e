/* alloc.c - the synchronous entry points: magpool_alloc, magpool_free,
 * magpool_free_sized, magpool_usable_size.  Layer 5.
 *
 * Each has an inline fast path - a hit in the calling thread's magazine
 * for a block of region 0 - that touches only the thread's record, the
 * magazine and the block's header word: no locks, no atomic RMW, no shared
 * counters, no CUDA.  Everything else is the noinline full path, which
 * repeats every check and reports errors; a thread-cache miss there goes
 * to magazine.c, and a tree miss to the out-of-memory ladder (pool.c).
 * The stream-ordered entry points (alloc_async.c) reuse the validated
 * halves, mp_alloc_order and mp_free_validated.
 */
#include "alloc.h"

#include "park.h"
#include "xcache.h"

/* ------------------------------------------------------ allocation path */

/* A thread-magazine miss, or an order no magazine holds: the magazines'
 * slow path (record held), else the extent cache (xcache.c) and the tree;
 * the ladder (record not held) when they come up empty.  While a thief
 * holds our magazines, the tree serves us directly. */
static MP_NOINLINE void *alloc_slow(magpool_t *pool, mp_tcache *tc, unsigned order,
                                    size_t size) {
  /* Lazy coalescing of stream frees; the check saves a call when none is
   * ready. */
  if (mp_load_relaxed(&pool->retire.ready) != NULL) mp_retire_drain(pool, &tc->acct);
  void *p;
  if (order < tc->nclasses && mp_tcache_enter_owner(tc)) {
    p = mp_cache_alloc_slow(pool, tc, order);
    mp_tcache_exit_owner(tc);
  } else if (!mp_xcache_holds(pool, tc, order) ||
             (p = mp_xcache_take(pool, tc, order, size)) == NULL) {
    p = mp_xcache_tree_take(pool, tc, order, size);
  }
  if (MP_UNLIKELY(tc->acct.solo_hit)) { /* a stream's solo runs in the way (runs.h) */
    tc->acct.solo_hit = false;
    if (p == NULL) {
      mp_streams_end_solo(pool, tc->acct.fence_owner);
      p = mp_xcache_tree_take(pool, tc, order, size);
      tc->acct.solo_hit = false;
    }
  }
  return p != NULL ? p : mp_ladder_take(pool, tc, order, size);
}

MP_INLINE void *alloc_order(magpool_t *pool, mp_tcache *tc, unsigned order, size_t size,
                            uint32_t flags) {
  void *p = NULL;
  mp_mag *m;
  if (order < tc->nclasses && mp_tcache_enter_owner(tc)) {
    if ((m = tc->cls[order].loaded) != NULL && m->count != 0) {
      p = m->slot[--m->count];
      mp_owner_add(&tc->st.cached, -(uint64_t)mp_block_bytes(pool, order));
    }
    mp_tcache_exit_owner(tc);
  }
  if (p == NULL && (p = alloc_slow(pool, tc, order, size)) == NULL) return NULL;
  return mp_hand_out(pool, tc, p, order, size, flags);
}

void *mp_alloc_order(magpool_t *pool, mp_tcache *tc, unsigned order, size_t size,
                     uint32_t flags) {
  return alloc_order(pool, tc, order, size, flags);
}

/* Everything but a magazine hit. */
static MP_NOINLINE void *alloc_full(magpool_t *pool, size_t size, uint32_t flags) {
  if (MP_UNLIKELY(pool == NULL)) return mp_fail(MAGPOOL_EINVAL);
  unsigned order;
  if (MP_UNLIKELY(mp_size_order(pool, size, &order) != 0)) return mp_fail(MAGPOOL_ENOMEM);
  mp_tcache *tc = mp_tcache_get(pool);
  if (MP_UNLIKELY(tc == NULL)) return mp_fail(MAGPOOL_ENOMEM);
  return alloc_order(pool, tc, order, size, flags);
}

/* The fast path.  The header needs no big-slack words here: cached blocks
 * are at most 16 MiB (pool.c's config check). */
MP_INLINE void *alloc_impl(magpool_t *pool, size_t size, uint32_t flags) {
  mp_tcache *tc = mp_tls_last;
  if (MP_LIKELY(mp_tcache_current(tc, pool) && size <= tc->cache_max &&
                mp_tcache_enter_owner(tc))) {
    unsigned order = mp_cached_order(tc, size);
    mp_mag *m = tc->cls[order].loaded;
    if (MP_LIKELY(m != NULL && m->count != 0)) {
      char *p = m->slot[m->count - 1];
      size_t off = (size_t)(p - tc->r0_base);
      if (MP_LIKELY(off < tc->r0_bytes)) {
        size_t bs = (size_t)1 << (order + tc->shift);
        m->count--;
        mp_owner_add(&tc->st.cached, -(uint64_t)bs);
        mp_tcache_exit_owner(tc);
        mp_store_relaxed(&tc->r0_hdr[off >> tc->shift], mp_hdr_make_small(order, bs - size, flags));
        mp_owner_add(&tc->st.requested, size);
        mp_owner_add(&tc->st.allocs, 1);
        return p;
      }
    }
    mp_tcache_exit_owner(tc);
  }
  return alloc_full(pool, size, flags);
}

/* Trace recording (trace.c): one load and a branch when off.  An
 * allocation is recorded once it succeeded; a free takes its sequence
 * number before it is made (see trace.c). */
#define TRACED(pool) MP_UNLIKELY((pool)->trace != NULL)

void *magpool_alloc(magpool_t *pool, size_t size) {
  MP_DBG_ENTER(pool);
  void *p = alloc_impl(pool, size, 0);
  MP_DBG_LEAVE(pool);
  if (p != NULL && TRACED(pool)) mp_trace_alloc(pool->trace, p, size, NULL);
  return p;
}

void *mp_alloc_flags(magpool_t *pool, size_t size, uint32_t flags) {
  MP_DBG_ENTER(pool);
  void *p = alloc_impl(pool, size, flags);
  MP_DBG_LEAVE(pool);
  if (p != NULL && TRACED(pool)) mp_trace_alloc(pool->trace, p, size, NULL);
  return p;
}

/* ------------------------------------------------------------ free path */

MP_INLINE void free_validated(magpool_t *pool, mp_tcache *tc, void *p, _Atomic uint32_t *h,
                              unsigned order, size_t req) {
  /* Claim: the header moves live -> 0 exactly once per allocation.  A
   * plain store suffices between frees the program orders; keeping locked
   * instructions off the fast path is why racing double frees of one
   * pointer are the caller's data race (see magpool_free). */
  mp_hdr_clear(h);
  if (MP_UNLIKELY(tc == NULL)) { /* no host memory for a record: no stats */
    mp_acct a = {0};
    mp_region_give(pool, &a, p, order);
    mp_acct_settle(pool, &a);
    return;
  }
  size_t bs = mp_block_bytes(pool, order);
  if (MP_UNLIKELY(mp_load_relaxed(&pool->tracking))) mp_track_on_free(pool, p);
  mp_owner_add(&tc->st.requested, -(uint64_t)req);
  mp_owner_add(&tc->st.frees, 1);
  if (order >= tc->nclasses) {
    mp_cache_free_slow(pool, tc, p, order); /* the tree: no magazine */
    return;
  }
  if (MP_UNLIKELY(!mp_tcache_enter_owner(tc))) { /* a thief holds our magazines */
    mp_region_give(pool, &tc->acct, p, order);
    return;
  }
  mp_mag *m = tc->cls[order].loaded;
  if (MP_LIKELY(m != NULL && m->count < m->cap &&
                mp_load_relaxed(&tc->st.cached) + bs <= tc->limit)) {
    m->slot[m->count++] = p; /* magazine hit */
    mp_owner_add(&tc->st.cached, bs);
  } else {
    mp_cache_free_slow(pool, tc, p, order);
  }
  mp_tcache_exit_owner(tc);
}

static MP_NOINLINE int free_full(magpool_t *pool, void *p, size_t size, bool sized, bool scoped) {
  if (MP_UNLIKELY(pool == NULL)) return MAGPOOL_EINVAL;
  if (p == NULL) return 0;
  unsigned order;
  size_t req;
  _Atomic uint32_t *h;
  int rc = mp_block_validate(pool, p, size, sized, scoped, &h, &order, &req);
  if (MP_UNLIKELY(rc != 0)) return rc;
  free_validated(pool, mp_tcache_get(pool), p, h, order, req);
  return 0;
}

void mp_free_validated(magpool_t *pool, mp_tcache *tc, void *p, _Atomic uint32_t *h,
                       unsigned order, size_t req) {
  free_validated(pool, tc, p, h, order, req);
}

/* The fast path: p is a live block of region 0 of a cached class, and the
 * calling thread's magazine for it has room.  Validation is complete (the
 * same checks as mp_block_validate); anything unusual goes to free_full,
 * which repeats them and reports errors. */
MP_INLINE int free_impl(magpool_t *pool, void *p, size_t size, bool sized, bool scoped) {
  mp_tcache *tc = mp_tls_last;
  if (MP_LIKELY(mp_tcache_current(tc, pool))) {
    _Atomic uint32_t *h = mp_tcache_r0_hdr(tc, p);
    if (MP_LIKELY(h != NULL)) {
      uint32_t w = mp_hdr_read(h);
      unsigned order = mp_hdr_order(w); /* ~0u when not live */
      if (MP_LIKELY(order < tc->nclasses && mp_hdr_scoped(w) == scoped)) {
        size_t bs = (size_t)1 << (order + tc->shift);
        size_t req = bs - mp_hdr_slack_small(w);
        if (MP_LIKELY((!sized || size == req) && mp_tcache_enter_owner(tc))) {
          mp_mag *m = tc->cls[order].loaded;
          if (MP_LIKELY(m != NULL && m->count < m->cap &&
                        mp_load_relaxed(&tc->st.cached) + bs <= tc->limit)) {
            mp_hdr_clear(h); /* claim (see mp_free_validated) */
            m->slot[m->count++] = p;
            mp_owner_add(&tc->st.cached, bs);
            mp_tcache_exit_owner(tc);
            mp_owner_add(&tc->st.requested, -(uint64_t)req);
            mp_owner_add(&tc->st.frees, 1);
            return 0;
          }
          mp_tcache_exit_owner(tc);
        }
      }
    }
  }
  return free_full(pool, p, size, sized, scoped);
}

static MP_NOINLINE int free_traced(magpool_t *pool, void *p, size_t size, bool sized,
                                   bool scoped) {
  uint64_t seq = mp_trace_seq(pool->trace);
  int rc = free_impl(pool, p, size, sized, scoped);
  if (rc == 0) mp_trace_free(pool->trace, seq, p, NULL);
  return rc;
}

MP_INLINE int free_entry(magpool_t *pool, void *p, size_t size, bool sized, bool scoped) {
  MP_DBG_ENTER(pool);
  int rc = pool != NULL && p != NULL && TRACED(pool) ? free_traced(pool, p, size, sized, scoped)
                                                     : free_impl(pool, p, size, sized, scoped);
  MP_DBG_LEAVE(pool);
  return rc;
}

int mp_free_checked(magpool_t *pool, void *p, size_t size, bool sized, bool scoped) {
  return free_entry(pool, p, size, sized, scoped);
}

int magpool_free(magpool_t *pool, void *ptr) { return free_entry(pool, ptr, 0, false, false); }

int magpool_free_sized(magpool_t *pool, void *ptr, size_t size) {
  return free_entry(pool, ptr, size, true, false);
}

/* -------------------------------------------------------------- queries */

size_t magpool_usable_size(magpool_t *pool, const void *ptr) {
  if (pool == NULL || ptr == NULL) return 0;
  mp_region *r = mp_region_of(pool, ptr);
  if (r == NULL) return 0;
  size_t off = (size_t)((const char *)ptr - r->base);
  if (off & (pool->cfg.min_block - 1)) return 0;
  uint32_t w = mp_hdr_read(mp_region_hdr_at(r, off >> pool->min_shift));
  if (!mp_hdr_live(w)) return 0;
  return mp_block_cost(pool, ptr, mp_hdr_order(w));
}

size_t magpool_align_up(size_t n, size_t align) {
  if (align == 0 || (align & (align - 1)) != 0) return 0;
  if (n > SIZE_MAX - (align - 1)) return 0;
  return (n + align - 1) & ~(align - 1);
}
