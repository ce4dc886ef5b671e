/* pool.c - the pool's life: configuration, create and destroy (with the
 * choice of backend), trim, and the out-of-memory ladder.  Layer 5: the
 * policy above the caches.  The caches return NULL on a miss; only the
 * API layer decides what to give up to satisfy a request.
 */
#include "extent.h"
#include "park.h"
#include "thread.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Atomic uint64_t next_pool_uid = 1;
static _Atomic(const mp_source_ops *) source_override;
static _Atomic(const mp_stream_ops *) stream_override;

void mp_pool_set_stream_override(const mp_stream_ops *ops) {
  mp_store_release(&stream_override, ops);
}

void mp_pool_set_source_override(const mp_source_ops *ops) {
  mp_store_release(&source_override, ops);
}

/* ---------------------------------------------------------------- config */

#define MP_DEFAULT_POOL_SIZE ((size_t)256 << 20)
#define MP_DEFAULT_MIN_BLOCK ((size_t)64)
#define MP_DEFAULT_THREAD_CACHE ((size_t)8 << 20)
#define MP_DEFAULT_CACHE_MAX ((size_t)1 << 20)
#define MP_DEFAULT_STREAM_CACHE ((size_t)8 << 20)
#define MP_DEFAULT_CHUNK ((size_t)2 << 20)

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
  cfg->chunk_size = MP_DEFAULT_CHUNK;
  cfg->release_threshold = SIZE_MAX;
  cfg->trace_path = NULL;
  cfg->chunk_groups = -1;
  cfg->cross_stream_reuse = 0;
  mp_config_apply_env(cfg); /* MAGPOOL_CONF, MAGPOOL_TRACE (config_parse.c) */
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
  /* The cap is checked against the size asked for, before rounding. */
  if (out->max_pool_size != 0 && out->max_pool_size < out->pool_size) return MAGPOOL_EINVAL;
  out->pool_size &= ~(mb - 1);
  if (out->pool_size < mb) return MAGPOOL_EINVAL;
  /* Cached blocks stay under 32 MiB so their header's slack field never
   * needs the big-slack words (the fast paths rely on it). */
  if (out->cache_max_block > ((size_t)16 << 20)) out->cache_max_block = (size_t)16 << 20;
  size_t ch = out->chunk_size;
  if (ch < ((size_t)64 << 10) || ch > ((size_t)1 << 30) || (ch & (ch - 1)) != 0) return MAGPOOL_EINVAL;
  if (out->kind != MAGPOOL_MEM_HOST && out->kind != MAGPOOL_MEM_DEVICE &&
      out->kind != MAGPOOL_MEM_PINNED)
    return MAGPOOL_EINVAL;
  if (out->chunk_groups < -1 || out->chunk_groups > 1) return MAGPOOL_EINVAL;
  if (out->chunk_groups < 0) out->chunk_groups = out->max_pool_size == 0; /* chunk.c */
  return 0;
}

/* The backend of a kind: where memory comes from, and how frees are
 * ordered.  One choice, made once at create. */
static void backend_for(magpool_mem_kind_t kind, const mp_source_ops **src,
                        const mp_stream_ops **sops) {
  const mp_source_ops *ovr = mp_load_acquire(&source_override);
  if (kind == MAGPOOL_MEM_DEVICE) *src = &mp_source_device;
  else if (kind == MAGPOOL_MEM_PINNED) *src = &mp_source_pinned;
  else *src = &mp_source_host;
  if (ovr != NULL) *src = ovr;
  *sops = kind == MAGPOOL_MEM_HOST ? &mp_host_stream_ops : &mp_cuda_stream_ops;
  const mp_stream_ops *sovr = mp_load_acquire(&stream_override);
  if (sovr != NULL && kind == MAGPOOL_MEM_HOST) *sops = sovr;
}

/* ------------------------------------------------------- create/destroy */

/* Classes a cache of `budget` bytes serves: blocks up to cache_max_block
 * and no larger than half the budget (a bigger one could never be
 * cached); a magazine holds at most a quarter of the budget, and at most
 * MP_MAG_SLOTS blocks.  Returns the number of classes (0 if budget is
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
    while (cap * 2 <= MP_MAG_SLOTS && cap * 2 <= fit) cap *= 2;
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
  mp_atomic_init(&pool->trim_epoch, pool->uid << 32); /* see mp_tcache_get */
  pool->min_shift = mp_log2_floor(c.min_block);

  /* A thread may hoard at most an eighth of the initial pool, whatever
   * was asked: only the out-of-memory ladder reaches idle threads'
   * caches, so this bounds what a trim leaves behind. */
  if (c.thread_cache_bytes > c.pool_size / 8) c.thread_cache_bytes = c.pool_size / 8;
  pool->cfg.thread_cache_bytes = c.thread_cache_bytes;
  pool->nclasses = cache_classes(pool, c.thread_cache_bytes, pool->mag_cap);
  pool->s_nclasses = cache_classes(pool, c.stream_cache_bytes, pool->s_mag_cap);
  size_t dl = 2 * c.thread_cache_bytes;
  pool->depot_limit = dl < c.pool_size / 16 ? dl : c.pool_size / 16;

  backend_for(c.kind, &pool->src, &pool->sops);

  pthread_mutex_t *lk = malloc(sizeof *lk);
  if (lk == NULL) { free(pool); return MAGPOOL_ENOMEM; }
  pthread_mutex_init(lk, NULL);
  pool->grow_lock = lk;

  if (pool->src->open != NULL) {
    rc = pool->src->open(&pool->src_ctx, &c);
    if (rc != 0) goto fail;
  }
  rc = mp_region_add_chunked(pool);
  if (rc == MAGPOOL_ENOTSUP) rc = mp_region_add(pool, c.pool_size);
  if (rc != 0) goto fail_src;
  /* A cached block lies within one chunk; without chunk groups (footprint
   * first) within a 256th of one (8 KiB of 2 MiB), and larger ones below
   * a chunk are extent blocks (extent.c), whose granules hold a 136 KiB
   * request in 136 KiB where its power of two would take 256. */
  size_t cmax = pool->chunks == NULL ? SIZE_MAX
                : pool->chunks->chunk >> (pool->cfg.chunk_groups ? 0 : 8);
  if (pool->cfg.cache_max_block > cmax) {
    pool->cfg.cache_max_block = cmax;
    pool->nclasses = cache_classes(pool, pool->cfg.thread_cache_bytes, pool->mag_cap);
    pool->s_nclasses = cache_classes(pool, c.stream_cache_bytes, pool->s_mag_cap);
  }
  if (pool->chunks != NULL) mp_extents_setup(pool);
  rc = mp_mags_init(pool);
  if (rc != 0) goto fail_region;
  mp_asym_init();
  rc = mp_stream_table_init(pool);
  if (rc != 0) goto fail_mags;
  pool->cfg.trace_path = NULL; /* the caller's string; the recorder copies it */
  if (c.trace_path != NULL) {
    char hdr[160];
    snprintf(hdr, sizeof hdr, "pool kind=%d pool_size=%zu min_block=%zu allow_growth=%d",
             (int)c.kind, c.pool_size, c.min_block, c.allow_growth);
    rc = mp_trace_open(&pool->trace, c.trace_path, pool->uid, hdr);
    if (rc != 0) goto fail_trace;
  }
  *out = pool;
  return 0;

fail_trace:
  mp_streams_destroy(pool);
fail_mags:
  mp_mags_destroy(pool);
fail_region:
  mp_region_destroy(pool, pool->regions[0]);
  mp_chunks_fini(pool);
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
  MP_DBG_ENTER(pool);
  if (MP_DEBUG >= 2) mp_debug_check_quiescent(pool);
  mp_trace_close(pool->trace);
  /* Thread records first: a thread that is exiting right now is walking
   * its stream slots, and tcaches_destroy waits for it; only then may
   * the slots go. */
  mp_tcaches_destroy(pool);
  MP_HOOK(MP_HOOK_DESTROY_STREAMS, pool);
  mp_streams_destroy(pool);
  mp_mags_destroy(pool);
  mp_track_destroy(pool);
  unsigned n = mp_load_acquire(&pool->nregions);
  for (unsigned i = 0; i < n; i++) mp_region_destroy(pool, pool->regions[i]);
  mp_chunks_fini(pool);
  if (pool->src->close != NULL) pool->src->close(pool->src_ctx);
  pthread_mutex_destroy(pool->grow_lock);
  free(pool->grow_lock);
  free(pool);
  return 0;
}

/* ---------------------------------------------------------------- ladder */

/* Rounds the ladder makes at most while completions keep coming (see
 * below). */
#define MP_LADDER_ROUNDS 1024

/* Tries a failing take again while the trees hold enough free bytes for
 * it: a free block is out of sight for a moment while another thread
 * merges it with its buddy or splits it (claimed, its parts or parent not
 * yet published), and a pool where every thread allocates and frees
 * large blocks is seldom out of such a window for long. */
#define MP_LADDER_RETAKES 64

/* The most the pool may hold: what it has, or its chunk cap. */
static size_t pool_capacity(const magpool_t *pool, size_t reserved) {
  return pool->chunks != NULL ? (size_t)(pool->chunks->cap << pool->chunks->shift) : reserved;
}

static void *retake(magpool_t *pool, mp_tcache *tc, unsigned order, size_t size) {
  size_t cost = mp_request_cost(pool, order, size);
  for (unsigned i = 0; i < MP_LADDER_RETAKES; i++) {
    magpool_stats_t st;
    magpool_get_stats(pool, &st);
    size_t room = pool_capacity(pool, st.reserved_bytes) - st.reserved_bytes + st.free_bytes;
    if (room < cost) return NULL;
    sched_yield();
    void *p = mp_region_take_need(pool, &tc->acct, order, size, true);
    if (p != NULL) return p;
  }
  return NULL;
}

/* Could the request fit if what is not live came back: live bytes plus
 * the request within what the pool holds (or may map, when chunked)? */
static bool could_fit(magpool_t *pool, unsigned order, size_t size) {
  magpool_stats_t st;
  magpool_get_stats(pool, &st);
  return st.used_bytes + mp_request_cost(pool, order, size) <=
         pool_capacity(pool, st.reserved_bytes);
}

/* The out-of-memory promise (magpool.h): MAGPOOL_ENOMEM only when the
 * request does not fit after every rung.  Each rung frees more, at a
 * higher price; after each, the take is tried again:
 *   0  completed stream frees: drain the ready list
 *   1  caches: ours, every other thread's (idle ones included, taken
 *      over with the revoke handshake), every stream slot (retired behind
 *      its stream), every depot; drain; coalesce
 *   2  wait for every batch pending now, whatever its stream; drain;
 *      coalesce
 *   3  grow, as long as growing helps
 * A round that ends with batches still pending or ready (other threads
 * free on streams meanwhile, and take what the rungs freed first) is
 * followed by another, as long as the request could fit beside what is
 * live, up to MP_LADDER_ROUNDS: a completion that is known to be coming is
 * waited for; memory held live is not there.
 * The caller holds no lock and is outside its record's critical section
 * on every rung, so two ladders never wait for each other. */
void *mp_ladder_take(magpool_t *pool, mp_tcache *tc, unsigned order, size_t size) {
  for (unsigned round = 0;; round++) {
    for (unsigned rung = 0;; rung++) {
      unsigned seen = mp_load_acquire(&pool->nregions);
      void *p = mp_region_take_need(pool, &tc->acct, order, size, rung > 0);
      if (p != NULL) return p;
      MP_HOOK(MP_HOOK_LADDER_RUNG, (void *)(uintptr_t)rung);
      if (rung == 0) {
        /* Completed stream frees first; a chunked pool raises its
         * high-water mark only after them (rung 1 may create). */
        mp_retire_drain(pool, &tc->acct);
      } else if (rung == 1) {
        mp_streams_end_solo(pool, tc->acct.fence_owner); /* no entry lock needed */
        mp_tcache_enter_owner_wait(tc);
        mp_tcache_flush(pool, tc, &tc->acct);
        mp_tcache_exit_owner(tc);
        mp_tcaches_steal(pool, tc, &tc->acct);
        mp_streams_flush_caches(pool);
        mp_depot_drain(pool, &tc->acct);
        mp_retire_drain(pool, &tc->acct);
        mp_regions_coalesce(pool);
      } else if (rung == 2) {
        mp_streams_wait_pending(pool);
        mp_retire_drain(pool, &tc->acct);
        mp_regions_coalesce(pool);
      } else if (mp_region_grow(pool, order, seen) != 0) {
        break; /* growing no longer helps */
      }
    }
    if (round + 1 < MP_LADDER_ROUNDS &&
        /* ready_bytes, not the list: it falls only once a drainer (maybe
         * another thread, list already taken) has given the blocks back. */
        (mp_load_acquire(&pool->retire.pending_batches) != 0 ||
         mp_load_acquire(&pool->retire.ready_bytes) != 0 ||
         mp_load_acquire(&pool->retire.ready_fenced) != 0) &&
        could_fit(pool, order, size))
      continue;
    void *p = retake(pool, tc, order, size);
    return p != NULL ? p : mp_fail(MAGPOOL_ENOMEM);
  }
}

/* ------------------------------------------------------------------ trim */

int magpool_trim(magpool_t *pool) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  MP_DBG_ENTER(pool);
  /* Other threads see the new epoch at their next call on this pool and
   * return their caches then (mp_tcache_get_slow). */
  uint64_t ep = mp_fetch_add_acq_rel(&pool->trim_epoch, 1) + 1;
  mp_tcache *tc = mp_tcache_get(pool);
  if (tc != NULL) {
    mp_tcache_enter_owner_wait(tc);
    mp_tcache_flush(pool, tc, &tc->acct);
    mp_tcache_exit_owner(tc);
    tc->epoch = ep;
  }
  mp_acct *a = tc != NULL ? &tc->acct : NULL;
  mp_streams_flush_caches(pool);
  mp_streams_end_solo(pool, 0); /* where the flush skipped a busy entry (runs.h) */
  mp_retire_drain(pool, a);
  mp_depot_drain(pool, a);
  mp_regions_coalesce(pool);
  if (pool->chunks != NULL) mp_chunks_trim(pool);
  if (MP_DEBUG >= 2) mp_debug_check_quiescent(pool);
  MP_DBG_LEAVE(pool);
  return 0;
}

int magpool_version(void) { return MAGPOOL_VERSION; }
