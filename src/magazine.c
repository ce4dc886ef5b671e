/* magazine.c - the thread magazines and the shared depots.  Layer 4:
 * calls magazine objects (mag.c) and the trees (region.c); the thread
 * record (thread.c) and the API call it.  On a miss in the trees it
 * returns NULL: the out-of-memory ladder is the API layer's.
 *
 * Concurrency contract:
 *   tc magazines (cls[]) and .... the owner inside mp_tcache_enter_owner/
 *   tc->st.cached                 exit (thread.h), or a thief that took the
 *                                 record over (mp_tcaches_steal): plain
 *                                 loads and stores either way
 *   tc->st (the others) ......... owner writes (plain add), anyone reads
 *                                 (relaxed)
 *   depot stacks ................ any thread push/pop (mp_stack_*_mpmc);
 *                                 their byte counts are relaxed RMW
 *
 * Hoarding bound: a thread's magazines for one pool never hold more than
 * its share of thread_cache_bytes (mp_cache_share) at the end of any call
 * (checked before every cached push and after every refill; the share is
 * read again at each slow path, so a thread whose share fell gives back
 * the excess at its next one).  Each class's depot holds at most
 * depot_limit bytes (min(2 x thread_cache_bytes, pool_size / 16)); the
 * out-of-memory ladder drains them.  A depot's byte count shares the cache
 * line of its head, which every depot operation touches anyway.
 */
#include "internal.h"

#include <string.h>

#include "xcache.h"

/* The caches of all threads together keep about max(MP_CACHE_SHARERS
 * budgets, reserved / 8), split among the pool's live thread records (n
 * rounded down to a power of two, a shift on the slow paths: at most
 * twice that); each keeps its whole budget while that allows, and a
 * sixteenth of it at least.  Without the split, a server of 64 threads
 * held 64 budgets: a fifth of what a small pool reserved (a thread per
 * stream of a 64-stream trace: docs/design.md). */
#define MP_CACHE_SHARERS 4u

size_t mp_cache_share(const magpool_t *pool, size_t budget) {
  uint64_t n = mp_load_relaxed(&pool->nthreads); /* hints, both */
  if (n <= MP_CACHE_SHARERS) return budget;
  size_t total = mp_load_relaxed(&pool->reserved) >> 3;
  if (total / MP_CACHE_SHARERS < budget) /* stream_cache_bytes may be "max" */
    total = budget <= SIZE_MAX / MP_CACHE_SHARERS ? budget * MP_CACHE_SHARERS : SIZE_MAX;
  size_t s = total >> mp_log2_floor(n); /* total / n, at most twice that */
  return s >= budget ? budget : s > budget >> 4 ? s : budget >> 4;
}

static inline void cached_add(mp_tcache *tc, int64_t d) {
  mp_owner_add(&tc->st.cached, (uint64_t)d);
}

/* Gives the oldest half (at least one) of m's blocks to the tree. */
static void mag_flush_half(magpool_t *pool, mp_tcache *tc, mp_mag *m, unsigned order) {
  uint32_t k = m->count / 2 ? m->count / 2 : m->count;
  if (k == 0) return;
  mp_blocks_give(pool, &tc->acct, m->slot, k, order);
  memmove(m->slot, m->slot + k, (m->count - k) * sizeof(void *));
  m->count -= k;
  cached_add(tc, -(int64_t)k * (int64_t)mp_block_bytes(pool, order));
}

static void mag_flush_all(magpool_t *pool, mp_tcache *tc, mp_acct *a, mp_mag *m,
                          unsigned order) {
  if (m == NULL || m->count == 0) return;
  mp_blocks_give(pool, a, m->slot, m->count, order);
  cached_add(tc, -(int64_t)m->count * (int64_t)mp_block_bytes(pool, order));
  m->count = 0;
}

/* Flushes halves of the fullest classes until `need` more bytes fit. */
static void reclaim(magpool_t *pool, mp_tcache *tc, size_t need) {
  while (mp_load_relaxed(&tc->st.cached) + need > tc->limit) {
    unsigned best = 0;
    size_t best_bytes = 0;
    for (unsigned k = 0; k < tc->nclasses; k++) {
      mp_tclass *c = &tc->cls[k];
      size_t cnt = (c->loaded ? c->loaded->count : 0) + (c->prev ? c->prev->count : 0);
      size_t b = cnt * mp_block_bytes(pool, k);
      if (b > best_bytes) { best_bytes = b; best = k; }
    }
    if (best_bytes == 0) return;
    mp_tclass *c = &tc->cls[best];
    if (c->prev && c->prev->count) mag_flush_half(pool, tc, c->prev, best);
    else mag_flush_half(pool, tc, c->loaded, best);
  }
}

/* Moves a full magazine into the depot, or - over the depot's limit - its
 * blocks to the tree.  Returns the magazine if it is now the caller's
 * (empty), NULL if the depot took it. */
static mp_mag *depot_put(magpool_t *pool, mp_tcache *tc, mp_mag *m, unsigned order) {
  int64_t bytes = (int64_t)m->count * (int64_t)mp_block_bytes(pool, order);
  cached_add(tc, -bytes);
  mp_stack *d = &pool->depot[order];
  if (mp_load_relaxed(&d->bytes) + bytes > (int64_t)pool->depot_limit) {
    mp_blocks_give(pool, &tc->acct, m->slot, m->count, order);
    m->count = 0;
    return m;
  }
  mp_fetch_add_relaxed(&d->bytes, bytes);
  mp_stack_push_mpmc(pool, d, m);
  return NULL;
}

void mp_depot_drain(magpool_t *pool, mp_acct *a) {
  mp_acct local = {0};
  mp_acct *acct = a != NULL ? a : &local;
  for (unsigned k = 0; k < pool->nclasses; k++) {
    mp_mag *m;
    while ((m = mp_stack_pop_mpmc(pool, &pool->depot[k])) != NULL) {
      int64_t bytes = (int64_t)m->count * (int64_t)mp_block_bytes(pool, k);
      mp_fetch_add_relaxed(&pool->depot[k].bytes, -bytes);
      mp_blocks_give(pool, acct, m->slot, m->count, k);
      mp_mag_free(pool, m);
    }
  }
  if (a == NULL) mp_acct_settle(pool, &local);
  else mp_acct_flush(pool, a);
}

/* ------------------------------------------------------------ slow paths */

void *mp_cache_alloc_slow(magpool_t *pool, mp_tcache *tc, unsigned order) {
  mp_tclass *c = &tc->cls[order];
  tc->limit = mp_cache_share(pool, pool->cfg.thread_cache_bytes);
  size_t bs = mp_block_bytes(pool, order);
  mp_mag *m;
  if (c->prev != NULL && c->prev->count != 0) { /* swap in the previous */
    m = c->prev;
    c->prev = c->loaded;
    c->loaded = m;
    cached_add(tc, -(int64_t)bs);
    return m->slot[--m->count];
  }
  if ((m = mp_stack_pop_mpmc(pool, &pool->depot[order])) != NULL) { /* full from depot */
    int64_t bytes = (int64_t)m->count * (int64_t)bs;
    mp_fetch_add_relaxed(&pool->depot[order].bytes, -bytes);
    cached_add(tc, bytes);
    if (c->loaded != NULL) {
      if (c->prev == NULL) c->prev = c->loaded;
      else mp_mag_free(pool, c->loaded);
    }
    c->loaded = m;
    void *p = m->slot[--m->count];
    cached_add(tc, -(int64_t)bs);
    if (mp_load_relaxed(&tc->st.cached) > tc->limit) reclaim(pool, tc, 0);
    return p;
  }
  /* Refill: carve one larger block into n blocks, one for the caller.
   * n - 1 must fit in what the thread may still cache. */
  MP_HOOK(MP_HOOK_REFILL, tc);
  size_t cached = mp_load_relaxed(&tc->st.cached);
  size_t room = cached < tc->limit ? tc->limit - cached : 0;
  uint32_t n = pool->mag_cap[order];
  while (n > 1 && (size_t)(n - 1) * bs > room) n /= 2;
  /* On a chunked pool, a carve of at most 1/2^MP_CARVE_CHUNK_SHIFT of a
   * chunk: the blocks it leaves cached keep their chunk busy, and whole
   * chunks held for a few live blocks each took the budget's slack from
   * the runs (tools/sim/README.md, "the C pool against the model"). */
  if (pool->chunks != NULL)
    while (n > 1 && (size_t)n * bs > pool->chunks->chunk >> MP_CARVE_CHUNK_SHIFT) n /= 2;
  if (c->loaded == NULL && n > 1) {
    c->loaded = mp_mag_new(pool, order);
    if (c->loaded == NULL) n = 1;
  }
  unsigned k = mp_log2_floor(n);
  char *p;
  /* No map while the extent cache holds blocks: they go back first (X4, xcache.c). */
  int grow = mp_load_relaxed(&tc->xheld) != 0 ? MP_TAKE_NOMAP : 0;
  for (;;) {
    p = mp_region_take(pool, &tc->acct, order + k, grow);
    if (p != NULL) break;
    if (k == 0 && grow != 0) {
      mp_xcache_flush(pool, tc, &tc->acct);
      grow = 0;
      k = mp_log2_floor(n);
      continue;
    }
    if (k == 0) return NULL; /* the caller runs the ladder; nothing is half-done */
    k--;
  }
  n = (uint32_t)1 << k;
  if (n > 1) {
    m = c->loaded; /* empty: the fast path missed */
    for (uint32_t i = n - 1; i >= 1; i--) m->slot[m->count++] = p + (size_t)i * bs;
    cached_add(tc, (int64_t)(n - 1) * (int64_t)bs);
  }
  return p;
}

void mp_cache_free_slow(magpool_t *pool, mp_tcache *tc, void *p, unsigned order) {
  if (order >= tc->nclasses) {
    if (mp_xcache_holds(pool, tc, order)) { /* an extent block: kept if it fits */
      tc->limit = mp_cache_share(pool, pool->cfg.thread_cache_bytes);
      if (mp_xcache_put(pool, tc, p, order)) return;
    }
    if (tc->nclasses == 0 && mp_block_bytes(pool, order) <= pool->cfg.cache_max_block) {
      /* Caching off: small blocks are only released (lazy coalescing).
       * Merging every free at once would make each alloc/free pair split
       * and re-merge a chain of blocks; the out-of-memory ladder and trim
       * coalesce instead. */
      mp_region_give_lazy(pool, &tc->acct, p, order);
    } else {
      mp_region_give(pool, &tc->acct, p, order);
    }
    return;
  }
  mp_tclass *c = &tc->cls[order];
  size_t bs = mp_block_bytes(pool, order);
  tc->limit = mp_cache_share(pool, pool->cfg.thread_cache_bytes);
  if (mp_load_relaxed(&tc->st.cached) + bs > tc->limit) {
    reclaim(pool, tc, bs);
    if (mp_load_relaxed(&tc->st.cached) + bs > tc->limit) {
      mp_region_give(pool, &tc->acct, p, order);
      return;
    }
  }
  if (c->loaded == NULL && (c->loaded = mp_mag_new(pool, order)) == NULL) {
    mp_region_give(pool, &tc->acct, p, order);
    return;
  }
  if (c->loaded->count == c->loaded->cap) {
    /* The full loaded magazine becomes the previous one; an empty
     * previous one is reused, a full one goes to the depot. */
    mp_mag *e = c->prev;
    if (e != NULL && e->count != 0) e = depot_put(pool, tc, e, order);
    c->prev = c->loaded;
    c->loaded = e != NULL ? e : mp_mag_new(pool, order);
    if (c->loaded == NULL) {
      c->loaded = c->prev;
      c->prev = NULL;
      mp_region_give(pool, &tc->acct, p, order);
      return;
    }
  }
  c->loaded->slot[c->loaded->count++] = p;
  cached_add(tc, (int64_t)bs);
}

void mp_tcache_flush(magpool_t *pool, mp_tcache *tc, mp_acct *a) {
  for (unsigned k = 0; k < tc->nclasses; k++) {
    mag_flush_all(pool, tc, a, tc->cls[k].loaded, k);
    mag_flush_all(pool, tc, a, tc->cls[k].prev, k);
  }
  mp_xcache_flush(pool, tc, a);
  mp_acct_flush(pool, a);
}

/* Gives the (empty) magazines back to the spare stack. */
void mp_tcache_drop_mags(magpool_t *pool, mp_tcache *tc) {
  for (unsigned k = 0; k < tc->nclasses; k++) {
    if (tc->cls[k].loaded) mp_mag_free(pool, tc->cls[k].loaded);
    if (tc->cls[k].prev) mp_mag_free(pool, tc->cls[k].prev);
    tc->cls[k].loaded = tc->cls[k].prev = NULL;
  }
}
