/* xcache.c - the thread's extent cache.  Layer 4, beside magazine.c: it
 * calls the trees (region.c) and extent.h's queries; alloc.c and
 * magazine.c call it.
 *
 * Why: an extent block (extent.c) takes the granules its request needs,
 * not its power of two, but each take and give walks the chunk's mask and
 * claims or frees up to 18 tree pieces, some 2,000 instructions a pair,
 * where a magazine hit costs tens.  Programs allocate the same sizes
 * again and again, so the block a thread frees is kept, whole, for the
 * thread's next request of about its size.
 *
 * Data (types.h): 56 bins a record, one per granule class: counts 1-15
 * exactly, then eight classes a power of two (16-17, 18-19, ... 448-511).
 * A bin holds up to MP_XCAP blocks, oldest first, each with its granules
 * and order.
 *
 * Invariants (the pool's checker covers them through its byte counts):
 *   X1  A cached block is out of the tree as it was when live: its
 *       granules claimed, its extent word kept, its chunk busy (E1-E4 but
 *       the header, which is 0: to the API it is free).
 *   X2  st.cached counts each cached block's granules (mp_block_cost), so
 *       used + cached + pending + free == reserved still holds, and the
 *       ladder's steal (which skips records with nothing cached) and
 *       magpool_trim find these blocks as they find the magazines'.
 *   X3  The bins, with the magazines, stay within the thread's share of
 *       thread_cache_bytes (tc->limit, which the caller brings up to
 *       date): a put that would pass it is refused.
 *   X4  tc->xheld counts the cached blocks.  While it is not 0 the
 *       owner's takes from the trees may not map a chunk or raise the
 *       busy chunks' high-water mark (MP_TAKE_NOMAP, chunk.c): the blocks
 *       go back first (mp_xcache_tree_take, the magazines' refill), so
 *       that what they hold is used before memory is made.  (Without it
 *       an uncapped pool with small cache_max_block grew by up to a
 *       thread's share: docs/benchmarks.md, 2026-12-03, "last, 2".)
 *
 * Concurrency: as the magazines (magazine.c): the owner inside the
 * record's revoke enter/exit (mp_tcache_enter_owner, thread.h), or a
 * thief that took the record over with the revoke handshake
 * (mp_tcaches_steal, which flushes through mp_tcache_flush); plain loads
 * and stores either way, but for xheld, which the owner also reads
 * outside (relaxed: a stale count only refuses a take that is then
 * retried, or lets one map).  A take or put that finds a thief inside
 * backs off to the tree.
 *
 * Waste: a take accepts a block of n to n + n/8 granules for a request of
 * n (and never more than the request's order holds, so the block keeps
 * the request's order: E1), so a cached block wastes at most an eighth
 * of its request's granules, and only while it is live. */
#include "xcache.h"

#define ENT_ORDER_BITS 6

/* The bin of a count of granules (1 <= m < 512). */
static inline unsigned xbin(uint32_t m) {
  if (m < 16) return m;
  unsigned l = mp_log2_floor(m);
  return 16 + (l - 4) * 8 + ((m >> (l - 3)) & 7);
}

static inline size_t ent_bytes(const magpool_t *pool, uint32_t ent) {
  return (size_t)(ent >> ENT_ORDER_BITS) << (pool->chunks->gord + pool->min_shift);
}

static inline unsigned ent_order(uint32_t ent) {
  return ent & ((1u << ENT_ORDER_BITS) - 1);
}

/* Removes entry i of bin x, keeping the others' order. */
static void bin_remove(mp_xbin *x, uint32_t i) {
  for (uint32_t k = i + 1; k < x->count; k++) { /* none for the newest, the usual take */
    x->ent[k - 1] = x->ent[k];
    x->slot[k - 1] = x->slot[k];
  }
  x->count--;
}

void *mp_xcache_take(magpool_t *pool, mp_tcache *tc, unsigned order, size_t size) {
  if (!mp_xcache_holds(pool, tc, order)) return NULL;
  uint32_t n = mp_extent_granules(pool, size), hi = n + n / 8;
  uint32_t full = (uint32_t)1 << (order - pool->chunks->gord);
  if (hi > full) hi = full; /* the bins to look in */
  if (!mp_revoke_enter_owner(&tc->rv)) return NULL;
  void *p = NULL;
  for (unsigned b = xbin(n), last = xbin(hi); b <= last && p == NULL; b++) {
    mp_xbin *x = &tc->xc[b];
    for (uint32_t i = x->count; i-- > 0;) {
      uint32_t m = x->ent[i] >> ENT_ORDER_BITS;
      if (!mp_extent_fits(n, m) || m > full) continue;
      p = x->slot[i];
      mp_owner_add(&tc->st.cached, -(uint64_t)ent_bytes(pool, x->ent[i]));
      mp_owner_add(&tc->xheld, (uint32_t)-1);
      bin_remove(x, i);
      break;
    }
  }
  mp_revoke_exit_owner(&tc->rv);
  return p;
}

bool mp_xcache_put(magpool_t *pool, mp_tcache *tc, void *p, unsigned order) {
  if (!mp_xcache_holds(pool, tc, order)) return false;
  size_t cost = mp_block_cost(pool, p, order);
  uint32_t m = (uint32_t)(cost >> (pool->chunks->gord + pool->min_shift));
  if (!mp_revoke_enter_owner(&tc->rv)) return false;
  mp_xbin *x = &tc->xc[xbin(m)];
  if (x->count == MP_XCAP) { /* the oldest goes back */
    mp_owner_add(&tc->st.cached, -(uint64_t)ent_bytes(pool, x->ent[0]));
    mp_region_give(pool, &tc->acct, x->slot[0], ent_order(x->ent[0]));
    mp_owner_add(&tc->xheld, (uint32_t)-1);
    bin_remove(x, 0);
  }
  bool kept = mp_load_relaxed(&tc->st.cached) + cost <= tc->limit;
  if (kept) {
    x->ent[x->count] = m << ENT_ORDER_BITS | order;
    x->slot[x->count++] = p;
    mp_owner_add(&tc->st.cached, cost);
    mp_owner_add(&tc->xheld, 1);
    MP_HOOK(MP_HOOK_XCACHE_PUT, p);
  }
  mp_revoke_exit_owner(&tc->rv);
  return kept;
}

void mp_xcache_flush(magpool_t *pool, mp_tcache *tc, mp_acct *a) {
  for (unsigned b = 1; b < MP_XBINS; b++) {
    mp_xbin *x = &tc->xc[b];
    for (uint32_t i = 0; i < x->count; i++) {
      mp_owner_add(&tc->st.cached, -(uint64_t)ent_bytes(pool, x->ent[i]));
      mp_region_give(pool, a, x->slot[i], ent_order(x->ent[i]));
    }
    x->count = 0;
  }
  mp_store_relaxed(&tc->xheld, 0);
}

void *mp_xcache_tree_take(magpool_t *pool, mp_tcache *tc, unsigned order, size_t need) {
  if (mp_load_relaxed(&tc->xheld) == 0) return mp_region_take_need(pool, &tc->acct, order, need, 0);
  void *p = mp_region_take_need(pool, &tc->acct, order, need, MP_TAKE_NOMAP);
  if (p != NULL) return p;
  MP_HOOK(MP_HOOK_XCACHE_REFUSED, tc);
  if (mp_revoke_enter_owner(&tc->rv)) { /* else a thief holds them: it gives them back */
    mp_xcache_flush(pool, tc, &tc->acct);
    mp_revoke_exit_owner(&tc->rv);
  }
  return mp_region_take_need(pool, &tc->acct, order, need, 0);
}
