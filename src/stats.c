/* stats.c - statistics, the free-memory query, and the pool checker.
 * Layer 5.  Stats are sums of per-thread counters written by their owners
 * (relaxed reads: a racy sum while threads run, exact on a quiescent
 * pool), the depots' and stream caches' byte counts, and the trees.
 */
#include "extent.h"
#include "runs.h"

#include <string.h>

/* ----------------------------------------------------------------- stats */

typedef struct sums {
  uint64_t held, requested, cached, allocs, frees;
} sums;

static sums sum_threads(magpool_t *pool) {
  sums s = {mp_load_relaxed(&pool->held_extra), 0, 0, 0, 0};
  for (mp_tcache *t = mp_load_acquire(&pool->tcaches); t != NULL; t = t->pool_next) {
    s.held += mp_load_relaxed(&t->acct.held);
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

/* Free tree bytes: what the regions hold minus what the threads took out
 * (sum of acct.held), so no bitmap is scanned.  Clamped: while threads
 * run, the terms are read at slightly different instants. */
static size_t tree_free(magpool_t *pool, const sums *s) {
  uint64_t reserved = mp_load_relaxed(&pool->reserved);
  /* fenced, and a solo's (runs.h): not free */
  uint64_t out = s->held + mp_runs_fenced_bytes(pool, false) + mp_runs_solo_bytes(pool);
  return out < reserved ? (size_t)(reserved - out) : 0;
}

/* Fenced free runs (runs.h): in neither the accounts' held bytes nor the
 * retire counters.  *open: those whose batch is open (cached, as parked
 * blocks), *retired: those behind their stream (pending).  Relaxed; the
 * two counts are read at two instants, so clamped. */
static void fenced_split(const magpool_t *pool, size_t *open, size_t *retired) {
  size_t f = mp_runs_fenced_bytes(pool, false), r = mp_runs_fenced_bytes(pool, true);
  *retired = r < f ? r : f;
  *open = f - *retired + mp_runs_solo_bytes(pool); /* a solo's free runs too */
}

/* Largest free block: per region, the summaries of each level from the
 * top order down; a level whose top summary word is 0 costs one load. */
static size_t largest_free(magpool_t *pool) {
  size_t lg = 0;
  unsigned n = mp_load_acquire(&pool->nregions);
  for (unsigned i = 0; i < n; i++) {
    int o = mp_tree_largest_free_order(&pool->regions[i]->tree);
    if (o >= 0 && mp_block_bytes(pool, (unsigned)o) > lg) lg = mp_block_bytes(pool, (unsigned)o);
  }
  return lg;
}

int magpool_get_stats(magpool_t *pool, magpool_stats_t *out) {
  if (pool == NULL || out == NULL) return MAGPOOL_EINVAL;
  memset(out, 0, sizeof *out);
  /* Retired fenced runs (runs.h) count as pending until their batch is
   * drained: drain what has passed (nothing to do: one load). */
  if (pool->chunks != NULL) mp_retire_drain(pool, NULL);
  sums s = sum_threads(pool);
  size_t scached = 0, spending = 0;
  mp_streams_stats(pool, &scached, &spending);
  int64_t depot = depot_sum(pool);
  out->requested_bytes = (size_t)s.requested;
  out->reserved_bytes = mp_load_relaxed(&pool->reserved);
  out->cached_bytes = (size_t)s.cached + (size_t)(depot > 0 ? depot : 0) + scached;
  size_t fopen, fretired;
  fenced_split(pool, &fopen, &fretired);
  out->pending_bytes = spending + fretired;
  /* Live bytes: everything out of the trees that is not cached or
   * pending.  Exact on a quiescent pool; while threads run, each term is
   * read at a slightly different instant, so clamp. */
  int64_t used = (int64_t)(s.held - s.cached) - (depot > 0 ? depot : 0) - (int64_t)scached -
                 (int64_t)spending;
  out->used_bytes = used > 0 ? (size_t)used : 0;
  out->cached_bytes += fopen;
  out->free_bytes = tree_free(pool, &s);
  out->largest_free_block = largest_free(pool);
  /* A chunked pool's tree is address space; what it can hand out without
   * mapping beyond what it has is bounded by its free bytes. */
  if (pool->chunks != NULL) {
    /* A request of up to that many bytes gets a block of address space
     * whose backed extent, whole chunks, fits in the free bytes. */
    size_t ch = pool->chunks->chunk, f = out->free_bytes;
    size_t fit = f >= ch ? f & ~(ch - 1) : f == 0 ? 0 : (size_t)1 << mp_log2_floor(f);
    if (out->largest_free_block > fit) out->largest_free_block = fit;
  }
  if (pool->chunks != NULL) {
    out->chunk_maps = mp_load_relaxed(&pool->chunks->maps);
    out->chunk_unmaps = mp_load_relaxed(&pool->chunks->unmaps);
    out->chunk_moves = mp_load_relaxed(&pool->chunks->moves);
  }
  out->alloc_count = s.allocs;
  out->free_count = s.frees;
  out->live_count = s.allocs - s.frees;
  out->grow_count = mp_load_relaxed(&pool->grow_count);
  /* The batched peak can lag by a few batches; the current out-of-tree
   * bytes are an exact lower bound for it. */
  int64_t now = (int64_t)(out->used_bytes + out->cached_bytes + out->pending_bytes);
  out->peak_used_bytes = (size_t)mp_max_relaxed(&pool->peak, now);
  out->peak_reserved_bytes = mp_max_relaxed_size(&pool->peak_reserved, out->reserved_bytes);
  int64_t pp = mp_load_relaxed(&pool->pending_at_peak);
  out->pending_at_peak_bytes = pp > 0 ? (size_t)pp : 0;
  out->stream_batches = mp_load_relaxed(&pool->retire.batches);
  return 0;
}

int magpool_reset_peaks(magpool_t *pool) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  magpool_stats_t st;
  magpool_get_stats(pool, &st);
  mp_store_relaxed(&pool->peak, (int64_t)(st.used_bytes + st.cached_bytes + st.pending_bytes));
  mp_store_relaxed(&pool->peak_reserved, st.reserved_bytes);
  mp_store_relaxed(&pool->pending_at_peak, (int64_t)st.pending_bytes);
  return 0;
}

int magpool_mem_info(magpool_t *pool, size_t *free_bytes, size_t *total_bytes) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  if (free_bytes != NULL) {
    sums s = sum_threads(pool);
    size_t scached = 0, spending = 0;
    mp_streams_stats(pool, &scached, &spending);
    int64_t depot = depot_sum(pool);
    size_t fopen, fretired;
    fenced_split(pool, &fopen, &fretired);
    *free_bytes =
        tree_free(pool, &s) + (size_t)s.cached + (size_t)(depot > 0 ? depot : 0) + scached + fopen;
  }
  if (total_bytes != NULL) *total_bytes = mp_load_relaxed(&pool->reserved);
  return 0;
}

/* ----------------------------------------------------------------- check */

/* Live headers of region r in units [from, to): well formed, not free in
 * the tree.  Adds their units and their cost. */
static int scan_live(magpool_t *pool, mp_region *r, uint64_t from, uint64_t to,
                     uint64_t *live_units, uint64_t *live_cost) {
  for (uint64_t u = from; u < to; u++) {
    uint32_t w = mp_hdr_read(mp_region_hdr_at(r, u));
    if (!mp_hdr_live(w)) continue;
    unsigned o = mp_hdr_order(w);
    uint64_t len = (uint64_t)1 << o;
    const mp_chunks *c = pool->chunks;
    if (c != NULL && u >= r->tree.nunits) { /* a run (runs.c): whole chunks */
      uint64_t per = (uint64_t)1 << (c->shift - pool->min_shift);
      size_t cost = mp_block_cost(pool, r->base + (u << pool->min_shift), o);
      if ((u & (per - 1)) != 0 || cost == 0 || u + (cost >> pool->min_shift) > r->nunits)
        return MAGPOOL_EINVAL;
      *live_units += cost >> pool->min_shift;
      *live_cost += cost;
      u += (cost >> pool->min_shift) - 1;
      continue;
    }
    if (mp_extent_order(pool, o)) { /* granules (extent.c) */
      uint64_t cost;
      if (mp_extent_check(pool, r, u, o, w, &cost) != 0) return MAGPOOL_EINVAL;
      *live_units += cost >> pool->min_shift;
      *live_cost += cost;
      u += (cost >> pool->min_shift) - 1;
      continue;
    }
    if ((u & (len - 1)) != 0 || u + len > r->nunits) return MAGPOOL_EINVAL;
    if (mp_tree_is_free(&r->tree, u, o)) return MAGPOOL_EINVAL;
    *live_units += len;
    *live_cost += mp_block_cost(pool, r->base + (u << pool->min_shift), o);
    u += len - 1; /* interior words hold no header */
  }
  return 0;
}

/* A chunked pool: the tree (I1-I3), the chunk map (C1-C5), and the byte
 * counts: out of the tree (sum of accounts) == busy extents (C4), live headers (all in busy chunks) == used bytes, and
 * reserved - out == free bytes. */
static int check_chunked(magpool_t *pool) {
  mp_region *r = pool->regions[0];
  mp_chunks *c = pool->chunks;
  if (mp_tree_check(&r->tree, NULL) != 0 || mp_chunks_check(pool) != 0 || mp_runs_check(pool) != 0)
    return MAGPOOL_EINVAL;
  uint64_t live_units = 0, live_cost = 0;
  uint64_t per = (uint64_t)1 << (c->shift - pool->min_shift);
  for (uint64_t i = 0; i < c->n; i++) {
    if (!mp_chunks_busy(pool, i)) continue;
    uint64_t from = i * per, to = from + per;
    /* A block that starts in an earlier busy chunk was scanned there. */
    if (scan_live(pool, r, from, to, &live_units, &live_cost) != 0) return MAGPOOL_EINVAL;
  }
  magpool_stats_t st;
  magpool_get_stats(pool, &st); /* first: it drains passed fences */
  sums s = sum_threads(pool);
  /* fenced and solo free runs stay busy (runs.h) */
  uint64_t out = s.held + mp_runs_fenced_bytes(pool, false) + mp_runs_solo_bytes(pool);
  if (out != mp_chunks_out_bytes(pool)) return MAGPOOL_EINVAL; /* C4 */
  if (live_cost != st.used_bytes) return MAGPOOL_EINVAL;
  if (st.reserved_bytes - out != st.free_bytes) return MAGPOOL_EINVAL;
  return 0;
}

/* Pool invariant, in min-block units, on a quiescent pool:
 *   tree free + live blocks + cached + pending == reserved
 * plus the tree's own I1-I3, and every live header well formed and not
 * overlapping a free tree block.  Chunked pools: check_chunked. */
int magpool_check(magpool_t *pool) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  if (pool->chunks != NULL) return check_chunked(pool);
  uint64_t total_units = 0, free_units = 0, live_units = 0, live_cost = 0;
  unsigned n = mp_load_acquire(&pool->nregions);
  for (unsigned i = 0; i < n; i++) {
    mp_region *r = pool->regions[i];
    uint64_t fu;
    if (mp_tree_check(&r->tree, &fu) != 0) return MAGPOOL_EINVAL;
    free_units += fu;
    total_units += r->nunits;
    if (scan_live(pool, r, 0, r->nunits, &live_units, &live_cost) != 0) return MAGPOOL_EINVAL;
  }
  magpool_stats_t st;
  magpool_get_stats(pool, &st);
  uint64_t other = (st.cached_bytes + st.pending_bytes) >> pool->min_shift;
  if (free_units + live_units + other != total_units) return MAGPOOL_EINVAL;
  if ((live_units << pool->min_shift) != st.used_bytes) return MAGPOOL_EINVAL;
  /* The stats' counters against the scan. */
  if ((free_units << pool->min_shift) != st.free_bytes) return MAGPOOL_EINVAL;
  return 0;
}

/* ------------------------------------------------------------ debug tier */

/* Is anything but the caller at work on the pool: another API call, a
 * thread's exit flush, or a pending stream callback? */
static bool pool_busy(magpool_t *pool) {
  if (mp_load_acquire(&pool->dbg_active) != 1) return true;
  if (mp_load_acquire(&pool->retire.pending_batches) != 0) return true;
  for (mp_tcache *t = mp_load_acquire(&pool->tcaches); t != NULL; t = t->pool_next)
    if (mp_load_acquire(&t->state) == MP_TC_EXITING) return true;
  return false;
}

/* The check runs only on a quiescent pool, where its sums are exact: no
 * other call in progress before or after it, and none begun in between
 * (dbg_calls unchanged).  A failure seen under those conditions is a
 * broken invariant, and traps. */
void mp_debug_check_quiescent(magpool_t *pool) {
  uint64_t calls = mp_load_acquire(&pool->dbg_calls);
  if (pool_busy(pool)) return;
  int rc = magpool_check(pool);
  if (pool_busy(pool) || mp_load_acquire(&pool->dbg_calls) != calls) return;
  mp_assert_expensive(rc == 0);
}
