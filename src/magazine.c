/* magazine.c - per-thread magazine caches, the shared depots, and the
 * batch hand-back to the tree that does the lazy coalescing.
 *
 * Concurrency contract:
 *   mp_tcache magazines ......... owner thread only (plain loads/stores)
 *   mp_tcache.st ................ owner writes (plain add), anyone reads
 *                                 (relaxed)
 *   mp_tcache.state ............. CAS by owner (exit) and destroyer
 *   pool->tcaches ............... push-only (CAS), anyone walks
 *   depot / spare stacks ........ any thread push/pop (lock-free, ABA
 *                                 protected by a version in the head)
 *
 * Hoarding bound: a thread's magazines for one pool never hold more than
 * thread_cache_bytes at the end of any call (checked before every cached
 * push and after every refill).  Each class's depot holds at most
 * depot_limit bytes (min(2 x thread_cache_bytes, pool_size / 16)); the
 * out-of-memory ladder drains them.  A depot's byte count shares the cache
 * line of its head, which every depot operation touches anyway.
 */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

_Thread_local mp_tcache *mp_tls_last __attribute__((tls_model("initial-exec")));
static _Thread_local mp_tcache *tls_list;

static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

/* ------------------------------------------------------------ the stack */

#define MP_STACK_PTR_BITS 41
#define MP_STACK_PTR_MASK (((uint64_t)1 << MP_STACK_PTR_BITS) - 1)

static inline mp_mag *stack_ptr(uint64_t h) {
  return (mp_mag *)(uintptr_t)((h & MP_STACK_PTR_MASK) << 6);
}
static inline uint64_t stack_pack(mp_mag *m, uint64_t h_old) {
  uint64_t ver = (h_old >> MP_STACK_PTR_BITS) + 1;
  return ((uint64_t)(uintptr_t)m >> 6) | (ver << MP_STACK_PTR_BITS);
}

void mp_stack_push(mp_stack *s, mp_mag *m) {
  uint64_t h = mp_load_acquire(&s->head);
  do {
    mp_store_relaxed(&m->next, stack_ptr(h));
    /* RELEASE: the magazine's contents (slots, count) are written before
     * it becomes reachable; pairs with the ACQUIRE in mp_stack_pop. */
  } while (!mp_cas_weak_acq_rel(&s->head, &h, stack_pack(m, h)));
}

mp_mag *mp_stack_pop(mp_stack *s) {
  uint64_t h = mp_load_acquire(&s->head);
  for (;;) {
    mp_mag *m = stack_ptr(h);
    if (m == NULL) return NULL;
    /* m may be popped and reused by another thread right now: `next` is
     * atomic and magazines are never unmapped while the pool lives, so
     * this read is safe; the version in the CAS rejects it if stale. */
    mp_mag *next = mp_load_relaxed(&m->next);
    if (mp_cas_weak_acq_rel(&s->head, &h, stack_pack(next, h))) return m;
  }
}

/* ------------------------------------------------------------ magazines */

#define MP_MAG_SLOTS 64u
#define MP_MAG_BYTES \
  ((sizeof(mp_mag) + MP_MAG_SLOTS * sizeof(void *) + MP_CACHELINE - 1) & ~(size_t)(MP_CACHELINE - 1))
#define MP_MAG_CHUNK_MAGS 64u

/* Magazine slabs: a list of chunks freed at pool destroy. */
typedef struct mag_chunk {
  struct mag_chunk *next;
} mag_chunk;

mp_mag *mp_mag_new(magpool_t *pool, unsigned order) {
  return mp_mag_new_cap(pool, order, pool->mag_cap[order < pool->nclasses ? order : 0]);
}

mp_mag *mp_mag_new_cap(magpool_t *pool, unsigned order, uint32_t cap) {
  mp_mag *m = mp_stack_pop(&pool->spare);
  if (m == NULL) {
    size_t bytes = MP_CACHELINE + MP_MAG_CHUNK_MAGS * MP_MAG_BYTES;
    char *c = aligned_alloc(MP_CACHELINE, bytes);
    if (c == NULL) return NULL;
    mag_chunk *ch = (mag_chunk *)c;
    ch->next = mp_load_relaxed(&pool->mag_chunks);
    while (!atomic_compare_exchange_weak_explicit(&pool->mag_chunks, (void **)&ch->next, ch,
                                                  memory_order_release, memory_order_relaxed)) {
    }
    char *first = c + MP_CACHELINE;
    for (unsigned i = 1; i < MP_MAG_CHUNK_MAGS; i++) {
      mp_mag *x = (mp_mag *)(first + i * MP_MAG_BYTES);
      x->count = 0;
      x->cap = 0;
      mp_stack_push(&pool->spare, x);
    }
    m = (mp_mag *)first;
  }
  m->count = 0;
  m->cap = cap != 0 ? cap : 1;
  m->order = order;
  mp_store_relaxed(&m->next, NULL);
  return m;
}

void mp_mag_free(magpool_t *pool, mp_mag *m) {
  m->count = 0;
  mp_stack_push(&pool->spare, m);
}

void mp_mags_destroy(magpool_t *pool) {
  mag_chunk *c = mp_load_acquire(&pool->mag_chunks);
  while (c != NULL) {
    mag_chunk *n = c->next;
    free(c);
    c = n;
  }
  pool->mag_chunks = NULL;
}

/* ------------------------------------------------- hand-back to the tree */

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

/* Sorted by address and merged in place: a stack of (block, order) where
 * the top two merge while they are buddies of one order in one region.
 * What is left is given to the tree, whose merge step then continues
 * upwards against blocks outside the batch. */
void mp_blocks_give(magpool_t *pool, mp_tcache *tc, void **blk, uint32_t n, unsigned order) {
  if (n == 0) return;
  if (n > 1) qsort(blk, n, sizeof *blk, cmp_ptr);
  struct ent {
    char *p;
    unsigned o;
    mp_region *r;
  } st[MP_MAG_SLOTS + MP_MAX_ORDER + 2];
  unsigned top = 0;
  for (uint32_t i = 0; i < n; i++) {
    mp_region *r = mp_region_of(pool, blk[i]);
    st[top].p = blk[i];
    st[top].o = order;
    st[top].r = r;
    top++;
    while (top >= 2) {
      struct ent *a = &st[top - 2], *b = &st[top - 1];
      if (a->o != b->o || a->r != b->r || a->o >= a->r->tree.top) break;
      size_t bs = mp_block_bytes(pool, a->o);
      size_t off = (size_t)(a->p - a->r->base);
      if ((off & (2 * bs - 1)) != 0 || b->p != a->p + bs) break;
      a->o++; /* a and b become their parent */
      top--;
    }
    if (top == sizeof st / sizeof st[0]) { /* cannot happen for n <= 64 */
      for (unsigned k = 0; k < top; k++) mp_tree_give(pool, tc, st[k].p, st[k].o);
      top = 0;
    }
  }
  for (unsigned k = 0; k < top; k++) mp_tree_give(pool, tc, st[k].p, st[k].o);
}

static inline void cached_add(mp_tcache *tc, int64_t d) {
  mp_owner_add(&tc->st.cached, (uint64_t)d);
}

/* Gives the oldest half (at least one) of m's blocks to the tree. */
static void mag_flush_half(magpool_t *pool, mp_tcache *tc, mp_mag *m, unsigned order) {
  uint32_t k = m->count / 2 ? m->count / 2 : m->count;
  if (k == 0) return;
  mp_blocks_give(pool, tc, m->slot, k, order);
  memmove(m->slot, m->slot + k, (m->count - k) * sizeof(void *));
  m->count -= k;
  cached_add(tc, -(int64_t)k * (int64_t)mp_block_bytes(pool, order));
}

static void mag_flush_all(magpool_t *pool, mp_tcache *tc, mp_mag *m, unsigned order) {
  if (m == NULL || m->count == 0) return;
  mp_blocks_give(pool, tc, m->slot, m->count, order);
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
    mp_blocks_give(pool, tc, m->slot, m->count, order);
    m->count = 0;
    return m;
  }
  mp_fetch_add_relaxed(&d->bytes, bytes);
  mp_stack_push(d, m);
  return NULL;
}

void mp_depot_drain(magpool_t *pool) {
  mp_tcache *tc = mp_tcache_get(pool);
  mp_tcache tmp;
  if (tc == NULL) {
    memset(&tmp, 0, sizeof tmp);
    tc = &tmp;
  }
  for (unsigned k = 0; k < pool->nclasses; k++) {
    mp_mag *m;
    while ((m = mp_stack_pop(&pool->depot[k])) != NULL) {
      int64_t bytes = (int64_t)m->count * (int64_t)mp_block_bytes(pool, k);
      mp_fetch_add_relaxed(&pool->depot[k].bytes, -bytes);
      mp_blocks_give(pool, tc, m->slot, m->count, k);
      mp_mag_free(pool, m);
    }
  }
  mp_peak_note(pool, tc);
}

/* ------------------------------------------------------------ slow paths */

void *mp_cache_alloc_slow(magpool_t *pool, mp_tcache *tc, unsigned order) {
  mp_tclass *c = &tc->cls[order];
  size_t bs = mp_block_bytes(pool, order);
  mp_mag *m;
  if (c->prev != NULL && c->prev->count != 0) { /* swap in the previous */
    m = c->prev;
    c->prev = c->loaded;
    c->loaded = m;
    cached_add(tc, -(int64_t)bs);
    return m->slot[--m->count];
  }
  if ((m = mp_stack_pop(&pool->depot[order])) != NULL) { /* full from depot */
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
  size_t cached = mp_load_relaxed(&tc->st.cached);
  size_t room = cached < tc->limit ? tc->limit - cached : 0;
  uint32_t n = pool->mag_cap[order];
  while (n > 1 && (size_t)(n - 1) * bs > room) n /= 2;
  if (c->loaded == NULL && n > 1) {
    c->loaded = mp_mag_new(pool, order);
    if (c->loaded == NULL) n = 1;
  }
  unsigned k = mp_log2_floor(n);
  char *p;
  for (;;) {
    p = mp_tree_take(pool, tc, order + k);
    if (p != NULL) break;
    if (k == 0) {
      /* The ladder may flush this thread's cache; nothing is half-done. */
      return mp_tree_take_hard(pool, tc, order);
    }
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
    if (tc->nclasses == 0 && mp_block_bytes(pool, order) <= pool->cfg.cache_max_block) {
      /* Caching off: small blocks are only released (lazy coalescing).
       * Merging every free at once would make each alloc/free pair split
       * and re-merge a chain of blocks; the out-of-memory ladder and trim
       * coalesce instead. */
      mp_tree_give_lazy(pool, tc, p, order);
    } else {
      mp_tree_give(pool, tc, p, order);
    }
    return;
  }
  mp_tclass *c = &tc->cls[order];
  size_t bs = mp_block_bytes(pool, order);
  if (mp_load_relaxed(&tc->st.cached) + bs > tc->limit) {
    reclaim(pool, tc, bs);
    if (mp_load_relaxed(&tc->st.cached) + bs > tc->limit) {
      mp_tree_give(pool, tc, p, order);
      return;
    }
  }
  if (c->loaded == NULL && (c->loaded = mp_mag_new(pool, order)) == NULL) {
    mp_tree_give(pool, tc, p, order);
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
      mp_tree_give(pool, tc, p, order);
      return;
    }
  }
  c->loaded->slot[c->loaded->count++] = p;
  cached_add(tc, (int64_t)bs);
}

void mp_tcache_flush(magpool_t *pool, mp_tcache *tc) {
  for (unsigned k = 0; k < tc->nclasses; k++) {
    mag_flush_all(pool, tc, tc->cls[k].loaded, k);
    mag_flush_all(pool, tc, tc->cls[k].prev, k);
  }
  mp_peak_note(pool, tc);
}

/* Gives the (empty) magazines back to the spare stack. */
static void tcache_drop_mags(magpool_t *pool, mp_tcache *tc) {
  for (unsigned k = 0; k < tc->nclasses; k++) {
    if (tc->cls[k].loaded) mp_mag_free(pool, tc->cls[k].loaded);
    if (tc->cls[k].prev) mp_mag_free(pool, tc->cls[k].prev);
    tc->cls[k].loaded = tc->cls[k].prev = NULL;
  }
}

/* --------------------------------------------------------- thread records */

static void thread_exit(void *arg) {
  (void)arg;
  mp_tcache *tc = tls_list;
  tls_list = NULL;
  mp_tls_last = NULL;
  while (tc != NULL) {
    mp_tcache *next = tc->thread_next;
    int s = MP_TC_LIVE;
    if (atomic_compare_exchange_strong_explicit(&tc->state, &s, MP_TC_EXITING,
                                                memory_order_acq_rel,
                                                memory_order_acquire)) {
      mp_streams_thread_exit(tc->pool, tc);
      mp_tcache_flush(tc->pool, tc);
      tcache_drop_mags(tc->pool, tc);
      tc->thread_next = NULL;
      /* RELEASE: the flushed record is complete before a new thread (CAS
       * FREE->LIVE, ACQUIRE) or the destroyer reuses or frees it. */
      mp_store_release(&tc->state, MP_TC_FREE);
    } else {
      free(tc); /* ORPHAN: its pool is gone and left it to us */
    }
    tc = next;
  }
}

static void tls_key_init(void) { pthread_key_create(&tls_key, thread_exit); }

mp_tcache *mp_tcache_get_slow(magpool_t *pool) {
  mp_tcache *tc = NULL;
  mp_tcache **link = &tls_list;
  while (*link != NULL) { /* find ours; free records orphaned by destroy */
    mp_tcache *t = *link;
    if (mp_load_acquire(&t->state) == MP_TC_ORPHAN) {
      *link = t->thread_next;
      if (mp_tls_last == t) mp_tls_last = NULL;
      free(t);
      continue;
    }
    if (t->pool == pool && t->uid == pool->uid) { tc = t; break; }
    link = &t->thread_next;
  }
  if (tc == NULL) {
    /* Adopt a record of an exited thread, or make one. */
    for (mp_tcache *t = mp_load_acquire(&pool->tcaches); t != NULL; t = t->pool_next) {
      int s = MP_TC_FREE;
      if (mp_load_relaxed(&t->state) == MP_TC_FREE &&
          atomic_compare_exchange_strong_explicit(&t->state, &s, MP_TC_LIVE,
                                                  memory_order_acq_rel,
                                                  memory_order_relaxed)) {
        tc = t;
        break;
      }
    }
    if (tc == NULL) {
      tc = aligned_alloc(MP_CACHELINE, (sizeof *tc + MP_CACHELINE - 1) & ~(size_t)(MP_CACHELINE - 1));
      if (tc == NULL) return NULL;
      memset(tc, 0, sizeof *tc);
      tc->pool = pool;
      tc->uid = pool->uid;
      tc->limit = pool->cfg.thread_cache_bytes;
      tc->shift = pool->min_shift;
      tc->r0_base = pool->regions[0]->base;
      tc->r0_bytes = pool->regions[0]->bytes;
      tc->r0_hdr = pool->regions[0]->hdr;
      atomic_init(&tc->state, MP_TC_LIVE);
      mp_tcache *h = mp_load_relaxed(&pool->tcaches);
      do {
        tc->pool_next = h;
        /* RELEASE: the record is initialised before stats readers reach
         * it through the list (ACQUIRE in sum_threads). */
      } while (!atomic_compare_exchange_weak_explicit(&pool->tcaches, &h, tc,
                                                      memory_order_release,
                                                      memory_order_relaxed));
    }
    tc->epoch = mp_load_relaxed(&pool->trim_epoch);
    /* A reused record starts with no stream memo: cudaStreamPerThread, for
     * one, names another stream on this thread. */
    tc->s_slot = NULL;
    tc->s_handle = NULL;
    tc->thread_next = tls_list;
    tls_list = tc;
    pthread_once(&tls_once, tls_key_init);
    pthread_setspecific(tls_key, (void *)1);
  }
  uint64_t ep = mp_load_acquire(&pool->trim_epoch);
  if (tc->epoch != ep) { /* a trim ran: return our caches for this pool */
    /* Epoch first and memo set: the flushes below may call back into
     * mp_tcache_get (mp_depot_drain, retire's out-of-memory path). */
    tc->epoch = ep;
    mp_tls_last = tc;
    mp_streams_thread_flush(pool, tc);
    mp_tcache_flush(pool, tc);
  }
  /* Tracking needs every allocation on a path that records it: it turns
   * the caches off (magpool_tracking_enable bumps the epoch to get here). */
  bool on = pool->nclasses != 0 && !mp_load_acquire(&pool->tracking);
  if (!on && tc->nclasses != 0) {
    mp_tcache_flush(pool, tc);
    tcache_drop_mags(pool, tc);
  }
  tc->nclasses = on ? pool->nclasses : 0;
  bool son = pool->s_nclasses != 0 && !mp_load_acquire(&pool->tracking);
  tc->s_nclasses = son ? pool->s_nclasses : 0;
  tc->s_cache_max = son ? mp_block_bytes(pool, pool->s_nclasses - 1) : 0;
  tc->cache_max = on ? mp_block_bytes(pool, pool->nclasses - 1) : 0;
  mp_tls_last = tc;
  return tc;
}

void mp_tcaches_destroy(magpool_t *pool) {
  mp_tcache *t = mp_load_acquire(&pool->tcaches);
  while (t != NULL) {
    mp_tcache *next = t->pool_next;
    for (;;) {
      int s = mp_load_acquire(&t->state);
      if (s == MP_TC_EXITING) { /* its thread is flushing: wait */
        sched_yield();
        continue;
      }
      if (s == MP_TC_LIVE) {
        /* The owner thread frees it later (thread_exit or the next lookup
         * of its TLS list); the pool's memory goes away with us, so the
         * record must never be flushed again - ORPHAN says so. */
        if (!atomic_compare_exchange_strong_explicit(&t->state, &s, MP_TC_ORPHAN,
                                                     memory_order_acq_rel,
                                                     memory_order_acquire))
          continue;
        /* The calling thread's own memo must not serve a new pool that
         * lands at this address with this record (uid guards it too). */
        if (mp_tls_last == t) mp_tls_last = NULL;
        break;
      }
      free(t); /* FREE: nobody owns it */
      break;
    }
    t = next;
  }
  pool->tcaches = NULL;
}
