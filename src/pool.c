/* pool.c - the public pool API: creation, regions and growth, block
 * headers, the allocation and free paths, the out-of-memory ladder, trim,
 * stats and the checker.
 *
 * The fast paths (magpool_alloc / magpool_free on a magazine hit) touch
 * only the calling thread's cache record, the block's header word and the
 * region table: no locks, no atomic RMW, no shared counters, no CUDA.
 */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static _Atomic uint64_t next_pool_uid = 1;
static _Atomic(const mp_source_ops *) source_override;

void mp_pool_set_source_override(const mp_source_ops *ops) {
  mp_store_release(&source_override, ops);
}

/* ---------------------------------------------------------------- config */

#define MP_DEFAULT_POOL_SIZE ((size_t)256 << 20)
#define MP_DEFAULT_MIN_BLOCK ((size_t)64)
#define MP_DEFAULT_THREAD_CACHE ((size_t)8 << 20)
#define MP_DEFAULT_CACHE_MAX ((size_t)1 << 20)
#define MP_DEFAULT_STREAM_CACHE ((size_t)8 << 20)
#define MP_MAG_MAX_SLOTS 64u
/* Tree usage reaches the shared peak counter in steps of this size: the
 * random workload's refills and flushes of large classes made a smaller
 * step a contended atomic on most slow paths. */
#define MP_PEAK_BATCH ((int64_t)4 << 20)

void magpool_config_init(magpool_config_t *cfg) {
  if (cfg == NULL) return;
  memset(cfg, 0, sizeof *cfg);
  cfg->struct_size = sizeof *cfg;
  cfg->pool_size = MP_DEFAULT_POOL_SIZE;
  cfg->allow_growth = 0;
  cfg->max_pool_size = 0;
  cfg->min_block = MP_DEFAULT_MIN_BLOCK;
  cfg->kind = MAGPOOL_MEM_HOST;
  cfg->device = 0;
  cfg->thread_cache_bytes = MP_DEFAULT_THREAD_CACHE;
  cfg->cache_max_block = MP_DEFAULT_CACHE_MAX;
  cfg->stream_cache_bytes = MP_DEFAULT_STREAM_CACHE;
  cfg->capture_check = 1;
}

/* The fields every caller must have (the first version's config). */
#define MP_CONFIG_MIN_SIZE (offsetof(magpool_config_t, kind) + sizeof(magpool_mem_kind_t))

static int config_load(const magpool_config_t *in, magpool_config_t *out) {
  if (in->struct_size < MP_CONFIG_MIN_SIZE) return MAGPOOL_EINVAL;
  magpool_config_init(out);
  size_t n = in->struct_size < sizeof *out ? in->struct_size : sizeof *out;
  memcpy(out, in, n);
  out->struct_size = sizeof *out;
  size_t mb = out->min_block;
  if (mb < 16 || mb > 65536 || (mb & (mb - 1)) != 0) return MAGPOOL_EINVAL;
  out->pool_size &= ~(mb - 1);
  if (out->pool_size < mb) return MAGPOOL_EINVAL;
  if (out->max_pool_size != 0 && out->max_pool_size < out->pool_size) return MAGPOOL_EINVAL;
  /* Cached blocks stay under 32 MiB so their header's slack field never
   * needs the big-slack words (the fast paths rely on it). */
  if (out->cache_max_block > ((size_t)16 << 20)) out->cache_max_block = (size_t)16 << 20;
  if (out->kind != MAGPOOL_MEM_HOST && out->kind != MAGPOOL_MEM_DEVICE &&
      out->kind != MAGPOOL_MEM_PINNED)
    return MAGPOOL_EINVAL;
  return 0;
}

/* --------------------------------------------------------------- regions */

/* Adds a region of `bytes` (a multiple of min_block).  Callers serialise
 * on grow_lock (or own the pool, at creation). */
static int region_add(magpool_t *pool, size_t bytes) {
  unsigned n = mp_load_relaxed(&pool->nregions);
  if (n >= MP_MAX_REGIONS) return MAGPOOL_ENOMEM;
  mp_region *r = calloc(1, sizeof *r);
  if (r == NULL) return MAGPOOL_ENOMEM;
  r->bytes = bytes;
  r->nunits = bytes >> pool->min_shift;
  int rc = mp_tree_init(&r->tree, r->nunits);
  if (rc != 0) goto fail_r;
  r->hdr_bytes = (size_t)r->nunits * sizeof(uint32_t);
  void *h = mmap(NULL, r->hdr_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (h == MAP_FAILED) { rc = MAGPOOL_ENOMEM; goto fail_tree; }
  r->hdr = h;
  void *base = NULL;
  rc = pool->src->reserve(pool->src_ctx, bytes, &base);
  if (rc != 0) goto fail_hdr;
  r->base = base;
  pool->regions[n] = r;
  /* RELEASE: the region is fully built before readers of nregions
   * (mp_region_of, ACQUIRE) can reach it. */
  mp_store_release(&pool->nregions, n + 1);
  mp_fetch_add_relaxed(&pool->reserved, bytes);
  return 0;
fail_hdr:
  munmap(r->hdr, r->hdr_bytes);
fail_tree:
  mp_tree_fini(&r->tree);
fail_r:
  free(r);
  return rc;
}

static void region_destroy(magpool_t *pool, mp_region *r) {
  pool->src->release(pool->src_ctx, r->base, r->bytes);
  munmap(r->hdr, r->hdr_bytes);
  mp_tree_fini(&r->tree);
  free(r);
}

/* Grows the pool so that a block of `order` may fit.  `seen` is nregions
 * when the caller last failed: if another thread grew since, do nothing and
 * let the caller retry.  Returns 0 if the caller should retry. */
static int pool_grow(magpool_t *pool, unsigned order, unsigned seen) {
  if (!pool->cfg.allow_growth) return MAGPOOL_ENOMEM;
  pthread_mutex_t *lk = pool->grow_lock;
  pthread_mutex_lock(lk);
  int rc = 0;
  if (mp_load_relaxed(&pool->nregions) != seen) goto out;
  size_t need = mp_block_bytes(pool, order);
  size_t have = mp_load_relaxed(&pool->reserved);
  size_t size = have > need ? have : need; /* double, at least the block */
  if (pool->cfg.max_pool_size != 0) {
    size_t room = pool->cfg.max_pool_size > have ? pool->cfg.max_pool_size - have : 0;
    room &= ~(pool->cfg.min_block - 1);
    if (room < need) { rc = MAGPOOL_ENOMEM; goto out; }
    if (size > room) size = room;
  }
  for (;;) {
    rc = region_add(pool, size);
    if (rc == 0 || size == need) break;
    size = size / 2 > need ? (size / 2) & ~(pool->cfg.min_block - 1) : need;
  }
  if (rc == 0) mp_fetch_add_relaxed(&pool->grow_count, 1);
out:
  pthread_mutex_unlock(lk);
  return rc;
}

/* ------------------------------------------------------------- creation */

/* Classes a cache of `budget` bytes serves: blocks up to cache_max_block
 * and no larger than half the budget (a bigger one could never be
 * cached); a magazine holds at most a quarter of the budget, and at most
 * MP_MAG_MAX_SLOTS blocks.  Returns the number of classes (0 if budget is
 * 0) and fills caps[]. */
static unsigned cache_classes(const magpool_t *pool, size_t budget, uint32_t caps[]) {
  if (budget == 0) return 0;
  size_t cmax = pool->cfg.cache_max_block;
  if (cmax > budget / 2) cmax = budget / 2;
  unsigned n = 0;
  while (n < MP_MAX_CLASSES && mp_block_bytes(pool, n) <= cmax) n++;
  for (unsigned k = 0; k < n; k++) {
    size_t fit = budget / 4 / mp_block_bytes(pool, k);
    uint32_t cap = 1;
    while (cap * 2 <= MP_MAG_MAX_SLOTS && cap * 2 <= fit) cap *= 2;
    caps[k] = cap;
  }
  return n;
}

int magpool_create(const magpool_config_t *cfg, magpool_t **out) {
  if (cfg == NULL || out == NULL) return MAGPOOL_EINVAL;
  magpool_config_t c;
  int rc = config_load(cfg, &c);
  if (rc != 0) return rc;

  /* Cache-line aligned: the depot heads inside are. */
  size_t pbytes = (sizeof(magpool_t) + MP_CACHELINE - 1) & ~(size_t)(MP_CACHELINE - 1);
  magpool_t *pool = aligned_alloc(MP_CACHELINE, pbytes);
  if (pool == NULL) return MAGPOOL_ENOMEM;
  memset(pool, 0, pbytes);
  pool->cfg = c;
  pool->uid = mp_fetch_add_relaxed(&next_pool_uid, 1);
  atomic_init(&pool->trim_epoch, pool->uid << 32); /* see mp_tcache_get */
  pool->min_shift = mp_log2_floor(c.min_block);

  /* A thread may hoard at most an eighth of the initial pool, whatever
   * was asked: idle threads' caches cannot be reclaimed by others. */
  if (c.thread_cache_bytes > c.pool_size / 8) c.thread_cache_bytes = c.pool_size / 8;
  pool->cfg.thread_cache_bytes = c.thread_cache_bytes;
  pool->nclasses = cache_classes(pool, c.thread_cache_bytes, pool->mag_cap);
  pool->s_nclasses = cache_classes(pool, c.stream_cache_bytes, pool->s_mag_cap);
  size_t dl = 2 * c.thread_cache_bytes;
  pool->depot_limit = dl < c.pool_size / 16 ? dl : c.pool_size / 16;

  const mp_source_ops *ovr = mp_load_acquire(&source_override);
  if (ovr != NULL) pool->src = ovr;
  else if (c.kind == MAGPOOL_MEM_DEVICE) pool->src = &mp_source_device;
  else if (c.kind == MAGPOOL_MEM_PINNED) pool->src = &mp_source_pinned;
  else pool->src = &mp_source_host;

  pthread_mutex_t *lk = malloc(sizeof *lk);
  if (lk == NULL) { free(pool); return MAGPOOL_ENOMEM; }
  pthread_mutex_init(lk, NULL);
  pool->grow_lock = lk;

  if (pool->src->open != NULL) {
    rc = pool->src->open(&pool->src_ctx, &c);
    if (rc != 0) goto fail;
  }
  rc = region_add(pool, c.pool_size);
  if (rc != 0) goto fail_src;
  rc = mp_streams_init(pool);
  if (rc != 0) goto fail_region;
  *out = pool;
  return 0;

fail_region:
  region_destroy(pool, pool->regions[0]);
fail_src:
  if (pool->src->close != NULL) pool->src->close(pool->src_ctx);
fail:
  pthread_mutex_destroy(lk);
  free(lk);
  free(pool);
  return rc;
}

int magpool_destroy(magpool_t *pool) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  mp_streams_destroy(pool);
  mp_tcaches_destroy(pool);
  mp_mags_destroy(pool);
  mp_track_destroy(pool);
  unsigned n = mp_load_acquire(&pool->nregions);
  for (unsigned i = 0; i < n; i++) region_destroy(pool, pool->regions[i]);
  if (pool->src->close != NULL) pool->src->close(pool->src_ctx);
  pthread_mutex_destroy(pool->grow_lock);
  free(pool->grow_lock);
  free(pool);
  return 0;
}

/* --------------------------------------------------------------- headers */

void mp_hdr_store_big(_Atomic uint32_t *h, size_t slack) {
  if (slack < MP_HDR_BIG) return;
  mp_store_relaxed(&h[1], (uint32_t)(slack & MP_HDR_BIG) << MP_HDR_SLACK_SHIFT);
  mp_store_relaxed(&h[2], (uint32_t)((slack >> 25) & MP_HDR_BIG) << MP_HDR_SLACK_SHIFT);
}

size_t mp_hdr_slack(const _Atomic uint32_t *h, uint32_t word) {
  size_t s = word >> MP_HDR_SLACK_SHIFT;
  if (s < MP_HDR_BIG) return s;
  size_t lo = mp_load_relaxed(&h[1]) >> MP_HDR_SLACK_SHIFT;
  size_t hi = mp_load_relaxed(&h[2]) >> MP_HDR_SLACK_SHIFT;
  return lo | (hi << 25);
}

/* ------------------------------------------------------- tree hand-offs */

void mp_peak_note(magpool_t *pool, mp_tcache *tc) {
  int64_t d = tc->tree_delta;
  tc->tree_delta = 0;
  int64_t now = mp_fetch_add_relaxed(&pool->tree_out, d) + d;
  int64_t pk = mp_load_relaxed(&pool->peak);
  while (now > pk &&
         !atomic_compare_exchange_weak_explicit(&pool->peak, &pk, now,
                                                memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}

static inline void tree_delta_add(magpool_t *pool, mp_tcache *tc, int64_t d) {
  mp_owner_add(&tc->st.held, (uint64_t)d);
  tc->tree_delta += d;
  if (tc->tree_delta >= MP_PEAK_BATCH || tc->tree_delta <= -MP_PEAK_BATCH)
    mp_peak_note(pool, tc);
}

void *mp_tree_take(magpool_t *pool, mp_tcache *tc, unsigned order) {
  unsigned n = mp_load_acquire(&pool->nregions);
  for (unsigned i = 0; i < n; i++) {
    mp_region *r = pool->regions[i];
    if (order > r->tree.top) continue;
    int64_t off = mp_tree_alloc(&r->tree, order);
    if (off >= 0) {
      tree_delta_add(pool, tc, (int64_t)mp_block_bytes(pool, order));
      return r->base + ((size_t)off << pool->min_shift);
    }
  }
  return NULL;
}

void mp_tree_give(magpool_t *pool, mp_tcache *tc, void *p, unsigned order) {
  mp_region *r = mp_region_of(pool, p);
  uint64_t off = (uint64_t)((char *)p - r->base) >> pool->min_shift;
  mp_tree_free(&r->tree, off, order);
  tree_delta_add(pool, tc, -(int64_t)mp_block_bytes(pool, order));
}

void mp_tree_give_lazy(magpool_t *pool, mp_tcache *tc, void *p, unsigned order) {
  mp_region *r = mp_region_of(pool, p);
  uint64_t off = (uint64_t)((char *)p - r->base) >> pool->min_shift;
  mp_tree_release(&r->tree, off, order);
  tree_delta_add(pool, tc, -(int64_t)mp_block_bytes(pool, order));
}

static void coalesce_all(magpool_t *pool) {
  unsigned n = mp_load_acquire(&pool->nregions);
  for (unsigned i = 0; i < n; i++) mp_tree_coalesce_all(&pool->regions[i]->tree);
}

void *mp_tree_take_hard(magpool_t *pool, mp_tcache *tc, unsigned order) {
  for (unsigned step = 0;; step++) {
    unsigned seen = mp_load_acquire(&pool->nregions);
    void *p = mp_tree_take(pool, tc, order);
    if (p != NULL) return p;
    switch (step) {
    case 0: /* 1. completed stream frees: drain the ready lists */
      mp_streams_drain_ready(pool, tc);
      break;
    case 1: /* 2. caches: ours, then every depot, then finish coalescing */
      mp_tcache_flush(pool, tc);
      mp_streams_flush_caches(pool, tc);
      mp_depot_drain(pool);
      coalesce_all(pool);
      break;
    case 2: /* 3. wait for streams that hold pending frees */
      if (mp_streams_wait_pending(pool, tc) > 0) {
        mp_streams_drain_ready(pool, tc);
        coalesce_all(pool);
      }
      break;
    default: /* 4. grow, as long as growing helps; 5. fail */
      if (pool_grow(pool, order, seen) != 0) return mp_fail(MAGPOOL_ENOMEM);
      break;
    }
  }
}

/* ------------------------------------------------------ allocation path */

static MP_NOINLINE void *alloc_slow(magpool_t *pool, mp_tcache *tc, unsigned order) {
  mp_streams_drain_ready(pool, tc); /* lazy coalescing of stream frees */
  if (order < tc->nclasses) return mp_cache_alloc_slow(pool, tc, order);
  void *p = mp_tree_take(pool, tc, order);
  return p != NULL ? p : mp_tree_take_hard(pool, tc, order);
}

/* Everything but a magazine hit. */
static MP_NOINLINE void *alloc_full(magpool_t *pool, size_t size, uint32_t flags) {
  if (MP_UNLIKELY(pool == NULL)) return mp_fail(MAGPOOL_EINVAL);
  unsigned order;
  if (MP_UNLIKELY(mp_size_order(pool, size, &order) != 0)) return mp_fail(MAGPOOL_ENOMEM);
  mp_tcache *tc = mp_tcache_get(pool);
  if (MP_UNLIKELY(tc == NULL)) return mp_fail(MAGPOOL_ENOMEM);
  void *p;
  mp_mag *m;
  if (order < tc->nclasses && (m = tc->cls[order].loaded) != NULL && m->count != 0) {
    p = m->slot[--m->count];
    mp_owner_add(&tc->st.cached, -(uint64_t)mp_block_bytes(pool, order));
  } else {
    p = alloc_slow(pool, tc, order);
    if (p == NULL) return NULL;
  }
  return mp_hand_out(pool, tc, p, order, size, flags);
}

/* The fast path: a hit in the calling thread's magazine for a block of
 * region 0.  Reads only the thread's record and the magazine; writes the
 * block's header word and the thread's own counters.  No atomic RMW, no
 * lock, no shared counter, no CUDA call.  The header needs no big-slack
 * words here: cached blocks are at most 16 MiB (config_load). */
MP_INLINE void *alloc_impl(magpool_t *pool, size_t size, uint32_t flags) {
  mp_tcache *tc = mp_tls_last;
  if (MP_LIKELY(tc != NULL && tc->pool == pool &&
                tc->epoch == mp_load_relaxed(&pool->trim_epoch) && size <= tc->cache_max)) {
    unsigned order = mp_cached_order(tc, size);
    mp_mag *m = tc->cls[order].loaded;
    if (MP_LIKELY(m != NULL && m->count != 0)) {
      char *p = m->slot[m->count - 1];
      size_t off = (size_t)(p - tc->r0_base);
      if (MP_LIKELY(off < tc->r0_bytes)) {
        size_t bs = (size_t)1 << (order + tc->shift);
        m->count--;
        mp_store_relaxed(&tc->r0_hdr[off >> tc->shift],
                         (uint32_t)(order + 1) | (uint32_t)((bs - size) << MP_HDR_SLACK_SHIFT) |
                             flags);
        mp_owner_add(&tc->st.cached, -(uint64_t)bs);
        mp_owner_add(&tc->st.requested, size);
        mp_owner_add(&tc->st.allocs, 1);
        return p;
      }
    }
  }
  return alloc_full(pool, size, flags);
}

void *magpool_alloc(magpool_t *pool, size_t size) { return alloc_impl(pool, size, 0); }

void *mp_alloc_flags(magpool_t *pool, size_t size, uint32_t flags) {
  return alloc_impl(pool, size, flags);
}

/* ------------------------------------------------------------ free path */

static MP_NOINLINE int free_full(magpool_t *pool, void *p, size_t size, bool sized, bool scoped) {
  if (MP_UNLIKELY(pool == NULL)) return MAGPOOL_EINVAL;
  if (p == NULL) return 0;
  unsigned order;
  size_t req;
  _Atomic uint32_t *h;
  int rc = mp_peek_header(pool, p, size, sized, scoped, &h, &order, &req);
  if (MP_UNLIKELY(rc != 0)) return rc;
  /* Claim: the header moves live -> 0 exactly once per allocation.  A
   * plain store suffices between frees the program orders; keeping locked
   * instructions off the fast path is why racing double frees of one
   * pointer are the caller's data race (see magpool_free). */
  mp_store_relaxed(h, 0);
  mp_tcache *tc = mp_tcache_get(pool);
  size_t bs = mp_block_bytes(pool, order);
  if (MP_UNLIKELY(tc == NULL)) { /* no host memory for a record: no stats */
    mp_tcache tmp;
    memset(&tmp, 0, sizeof tmp);
    mp_tree_give(pool, &tmp, p, order);
    mp_peak_note(pool, &tmp);
    return 0;
  }
  if (MP_UNLIKELY(mp_load_relaxed(&pool->tracking))) mp_track_on_free(pool, p);
  mp_owner_add(&tc->st.requested, -(uint64_t)req);
  mp_owner_add(&tc->st.frees, 1);
  mp_mag *m;
  if (MP_LIKELY(order < tc->nclasses && (m = tc->cls[order].loaded) != NULL &&
                m->count < m->cap &&
                mp_load_relaxed(&tc->st.cached) + bs <= tc->limit)) {
    m->slot[m->count++] = p; /* magazine hit */
    mp_owner_add(&tc->st.cached, bs);
    return 0;
  }
  mp_cache_free_slow(pool, tc, p, order);
  return 0;
}


/* The fast path: p is a live block of region 0 of a cached class, and the
 * calling thread's magazine for it has room.  Validation is complete (the
 * same checks as mp_peek_header); anything unusual goes to free_full,
 * which repeats them and reports errors. */
MP_INLINE int free_impl(magpool_t *pool, void *p, size_t size, bool sized, bool scoped) {
  mp_tcache *tc = mp_tls_last;
  if (MP_LIKELY(tc != NULL && tc->pool == pool &&
                tc->epoch == mp_load_relaxed(&pool->trim_epoch))) {
    size_t off = (size_t)((char *)p - tc->r0_base);
    size_t unit = off >> tc->shift;
    if (MP_LIKELY(off < tc->r0_bytes && (unit << tc->shift) == off)) {
      _Atomic uint32_t *h = &tc->r0_hdr[unit];
      uint32_t w = mp_load_relaxed(h);
      unsigned order = (w & MP_HDR_ORDER_MASK) - 1; /* ~0u when not live */
      if (MP_LIKELY(order < tc->nclasses &&
                    (w & MP_HDR_SCOPE) == (scoped ? MP_HDR_SCOPE : 0u))) {
        size_t bs = (size_t)1 << (order + tc->shift);
        size_t req = bs - (w >> MP_HDR_SLACK_SHIFT);
        mp_mag *m = tc->cls[order].loaded;
        if (MP_LIKELY((!sized || size == req) && m != NULL && m->count < m->cap &&
                      mp_load_relaxed(&tc->st.cached) + bs <= tc->limit)) {
          mp_store_relaxed(h, 0); /* claim (see free_full) */
          m->slot[m->count++] = p;
          mp_owner_add(&tc->st.cached, bs);
                  mp_owner_add(&tc->st.requested, -(uint64_t)req);
          mp_owner_add(&tc->st.frees, 1);
          return 0;
        }
      }
    }
  }
  return free_full(pool, p, size, sized, scoped);
}

int mp_free_checked(magpool_t *pool, void *p, size_t size, bool sized, bool scoped) {
  return free_impl(pool, p, size, sized, scoped);
}

int magpool_free(magpool_t *pool, void *ptr) { return free_impl(pool, ptr, 0, false, false); }

int magpool_free_sized(magpool_t *pool, void *ptr, size_t size) {
  return free_impl(pool, ptr, size, true, false);
}

size_t magpool_usable_size(magpool_t *pool, const void *ptr) {
  if (pool == NULL || ptr == NULL) return 0;
  mp_region *r = mp_region_of(pool, ptr);
  if (r == NULL) return 0;
  size_t off = (size_t)((const char *)ptr - r->base);
  if (off & (pool->cfg.min_block - 1)) return 0;
  uint32_t w = mp_load_relaxed(&r->hdr[off >> pool->min_shift]);
  if ((w & MP_HDR_ORDER_MASK) == 0) return 0;
  return mp_block_bytes(pool, (w & MP_HDR_ORDER_MASK) - 1);
}

/* ------------------------------------------------------------------ trim */

int magpool_trim(magpool_t *pool) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  /* Other threads see the new epoch at their next call on this pool and
   * return their caches then (mp_tcache_get_slow). */
  uint64_t ep = mp_fetch_add_acq_rel(&pool->trim_epoch, 1) + 1;
  mp_tcache *tc = mp_tcache_get(pool);
  if (tc != NULL) {
    mp_tcache_flush(pool, tc);
    tc->epoch = ep;
  }
  mp_streams_trim(pool, tc);
  mp_depot_drain(pool);
  coalesce_all(pool);
  if (tc != NULL) mp_peak_note(pool, tc);
  return 0;
}

/* ----------------------------------------------------------------- stats */

typedef struct sums {
  uint64_t held, requested, cached, allocs, frees;
} sums;

static sums sum_threads(magpool_t *pool) {
  sums s = {0, 0, 0, 0, 0};
  for (mp_tcache *t = mp_load_acquire(&pool->tcaches); t != NULL; t = t->pool_next) {
    s.held += mp_load_relaxed(&t->st.held);
    s.requested += mp_load_relaxed(&t->st.requested);
    s.cached += mp_load_relaxed(&t->st.cached);
    s.allocs += mp_load_relaxed(&t->st.allocs);
    s.frees += mp_load_relaxed(&t->st.frees);
  }
  return s;
}

static int64_t depot_sum(magpool_t *pool) {
  int64_t d = 0;
  for (unsigned k = 0; k < MP_MAX_CLASSES; k++) d += mp_load_relaxed(&pool->depot[k].bytes);
  return d;
}

static void tree_sums(magpool_t *pool, uint64_t *free_bytes, size_t *largest) {
  uint64_t fb = 0;
  size_t lg = 0;
  unsigned n = mp_load_acquire(&pool->nregions);
  for (unsigned i = 0; i < n; i++) {
    mp_region *r = pool->regions[i];
    fb += mp_tree_free_units(&r->tree) << pool->min_shift;
    int o = mp_tree_largest_free_order(&r->tree);
    if (o >= 0 && mp_block_bytes(pool, (unsigned)o) > lg) lg = mp_block_bytes(pool, (unsigned)o);
  }
  *free_bytes = fb;
  *largest = lg;
}

int magpool_get_stats(magpool_t *pool, magpool_stats_t *out) {
  if (pool == NULL || out == NULL) return MAGPOOL_EINVAL;
  memset(out, 0, sizeof *out);
  sums s = sum_threads(pool);
  size_t scached = 0, spending = 0;
  mp_streams_stats(pool, &scached, &spending);
  int64_t depot = depot_sum(pool);
  out->requested_bytes = (size_t)s.requested;
  out->reserved_bytes = mp_load_relaxed(&pool->reserved);
  out->cached_bytes = (size_t)s.cached + (size_t)(depot > 0 ? depot : 0) + scached;
  out->pending_bytes = spending;
  /* Live bytes: everything out of the trees that is not cached or
   * pending.  Exact on a quiescent pool; while threads run, each term is
   * read at a slightly different instant, so clamp. */
  int64_t used = (int64_t)(s.held - s.cached) - (depot > 0 ? depot : 0) - (int64_t)scached -
                 (int64_t)spending;
  out->used_bytes = used > 0 ? (size_t)used : 0;
  uint64_t fb;
  tree_sums(pool, &fb, &out->largest_free_block);
  out->free_bytes = (size_t)fb;
  out->alloc_count = s.allocs;
  out->free_count = s.frees;
  out->live_count = s.allocs - s.frees;
  out->grow_count = mp_load_relaxed(&pool->grow_count);
  /* The batched peak can lag by a few batches; the current out-of-tree
   * bytes are an exact lower bound for it. */
  int64_t now = (int64_t)(out->used_bytes + out->cached_bytes + out->pending_bytes);
  int64_t pk = mp_load_relaxed(&pool->peak);
  while (now > pk &&
         !atomic_compare_exchange_weak_explicit(&pool->peak, &pk, now,
                                                memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
  out->peak_used_bytes = (size_t)(pk > now ? pk : now);
  return 0;
}

int magpool_mem_info(magpool_t *pool, size_t *free_bytes, size_t *total_bytes) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  if (free_bytes != NULL) {
    uint64_t fb;
    size_t lg;
    tree_sums(pool, &fb, &lg);
    sums s = sum_threads(pool);
    size_t scached = 0, spending = 0;
    mp_streams_stats(pool, &scached, &spending);
    int64_t depot = depot_sum(pool);
    *free_bytes = (size_t)fb + (size_t)s.cached + (size_t)(depot > 0 ? depot : 0) + scached;
  }
  if (total_bytes != NULL) *total_bytes = mp_load_relaxed(&pool->reserved);
  return 0;
}

/* ----------------------------------------------------------------- check */

/* Pool invariant, in min-block units, on a quiescent pool:
 *   tree free + live blocks + cached + pending == reserved
 * plus the tree's own I1-I3, and every live header well formed and not
 * overlapping a free tree block. */
int magpool_check(magpool_t *pool) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  uint64_t total_units = 0, free_units = 0, live_units = 0;
  unsigned n = mp_load_acquire(&pool->nregions);
  for (unsigned i = 0; i < n; i++) {
    mp_region *r = pool->regions[i];
    uint64_t fu;
    if (mp_tree_check(&r->tree, &fu) != 0) return MAGPOOL_EINVAL;
    free_units += fu;
    total_units += r->nunits;
    for (uint64_t u = 0; u < r->nunits; u++) {
      uint32_t w = mp_load_relaxed(&r->hdr[u]);
      uint32_t o1 = w & MP_HDR_ORDER_MASK;
      if (o1 == 0) continue;
      unsigned o = o1 - 1;
      uint64_t len = (uint64_t)1 << o;
      if ((u & (len - 1)) != 0 || u + len > r->nunits) return MAGPOOL_EINVAL;
      if (mp_tree_is_free(&r->tree, u, o)) return MAGPOOL_EINVAL;
      live_units += len;
      u += len - 1; /* interior words hold no header */
    }
  }
  magpool_stats_t st;
  magpool_get_stats(pool, &st);
  uint64_t other = (st.cached_bytes + st.pending_bytes) >> pool->min_shift;
  if (free_units + live_units + other != total_units) return MAGPOOL_EINVAL;
  if ((live_units << pool->min_shift) != st.used_bytes) return MAGPOOL_EINVAL;
  return 0;
}
