/* chunk.c - the chunk map: physical memory behind a reserved range of
 * address space, mapped in chunks as blocks first need it.  Layer 2,
 * beside the tree; region.c calls it on every take from and give to the
 * tree of a pool whose source maps on demand.
 *
 * Data and invariants C1-C6: types.h, struct mp_chunks.
 *
 * Mapping policy (the "high-water budget"):
 *   - every chunk a block's extent overlaps is busy while the block is
 *     out of the tree (live, cached or pending); a busy chunk is mapped;
 *   - the pool maps at most budget = max(keep, min(cap, hwm + slack))
 *     chunks, where hwm is the high-water mark of busy chunks and slack
 *     max(c->slack0, 1.5 % of hwm) (docs/design.md, "Policy");
 *   - a take that needs an unmapped chunk creates memory while the
 *     budget allows, else moves an empty mapped chunk there (unmap with
 *     keep, then map: no create on sources that keep memory); with
 *     MP_TAKE_NOMAP it is refused (its thread's extent cache goes back);
 *   - growth maps each MP_CHUNK_GROUP-aligned window as one group (one
 *     piece of memory with map_group), unmapped whole, a move each whole
 *     MP_MOVE_GROUP-aligned window; pool_size and all of a pool without
 *     chunk_groups (one with a max_pool_size) are a chunk each (a group
 *     with one busy chunk pins its empty ones, which a capped pool needs);
 *   - empty chunks stay mapped, but above release_threshold at a give,
 *     and at magpool_trim (down to pool_size).
 * So mapped memory never exceeds the peak need by more than the slack,
 * and a request fails only when its chunks do not fit under the cap.
 *
 * Ordering.  A take counts its chunks busy (seq_cst RMW), then reads each
 * chunk's state (seq_cst load); only if one is not MAPPED does it take the
 * lock.  An unmap, under the lock, marks empty chunks UNMAPPING (seq_cst
 * store), then re-reads busy (seq_cst load), and unmaps only if it is
 * still 0.  In the single total order either the take's RMW comes first,
 * and the unmap sees busy > 0 and puts MAPPED back, or the unmap's load
 * comes first, and then the take's state load, which follows its RMW,
 * sees UNMAPPING or UNMAPPED and the take waits for the lock and maps the
 * chunk again.  A take never uses memory that an unmap may be taking
 * away.  An unmap marks every chunk of its rows of groups UNMAPPING before
 * it re-reads any busy count, so the argument holds for each chunk, and
 * one busy chunk keeps its whole group.  A give's decrement (RELEASE)
 * happens after the block's last use, and the unmap's re-read (ACQUIRE)
 * sees it: the user's accesses happen before the unmap.  Only the lock
 * holder changes state and the mapped bitmap; takers read a MAPPED store
 * with seq_cst (ACQUIRE), after the map.  Run space (one run a chunk):
 * plain stores of busy, and for the RMW's StoreLoad order an asymmetric
 * barrier (asym.h): the take's mp_asym_light, a compiler barrier where
 * membarrier works, against the unmap's mp_asym_heavy between its
 * marks and its re-reads (unmap_rows), which makes every running thread
 * of the process execute a full barrier: either a take's busy store is
 * seen by the re-read, or its state load comes after the marks. */
#include "asym.h"
#include "chunk.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Chunks the budget allows beyond the busy high-water mark, at least,
 * where growth maps chunk groups; one without them (footprint first:
 * 16 MiB of slack is 2-3 % of a pool of 600 MiB, docs/benchmarks.md,
 * 2026-12-04 last).  c->slack0 holds the pool's. */
#define MP_CHUNK_SLACK_MIN 8
/* Chunks a fixed pool_size rounds down to, at least; below, whole regions. */
#define MP_ROUND_DOWN_MIN 64

static inline pthread_mutex_t *lock_of(mp_chunks *c) { return c->lock; }

static inline uint64_t units_per_chunk(const magpool_t *pool, const mp_chunks *c) {
  return (uint64_t)1 << (c->shift - pool->min_shift);
}

static inline uint64_t budget(const mp_chunks *c) {
  uint64_t h = mp_load_relaxed(&c->hwm);
  uint64_t slack = h * 3 / 200 > c->slack0 ? h * 3 / 200 : c->slack0;
  uint64_t b = h + slack;
  if (b > c->cap) b = c->cap;
  return b > c->keep ? b : c->keep;
}

/* Maps chunks [a, a + n), all unmapped (with grp: one group, inside one
 * MP_CHUNK_GROUP-aligned window), with one source call: one piece of
 * memory if allowed (above) and n > 1, else a chunk each.  Lock held. */
static int map_window(magpool_t *pool, uint64_t a, uint64_t n, bool grp) {
  mp_chunks *c = pool->chunks;
  const mp_source_ops *src = pool->src;
  bool one = grp && n > 1 && src->map_group && pool->cfg.chunk_groups;
  char *addr = c->base + (a << c->shift);
  int rc = one ? src->map_group(pool->src_ctx, addr, n << c->shift)
               : src->map(pool->src_ctx, addr, n << c->shift);
  if (rc != 0) return rc;
  if (one) c->glen[a] = (uint32_t)n;
  for (uint64_t i = a; i < a + n; i++) {
    c->gfirst[i] = one ? (uint32_t)a : (uint32_t)i;
    if (!one) c->glen[i] = 1;
    mp_chunks_bit_put(c, i, true);
    mp_store_seq_cst(&c->state[i], MP_CHUNK_MAPPED);
  }
  uint64_t end = a + n;
  if (end > c->run0) {
    if (end > mp_load_relaxed(&c->run_top)) mp_store_relaxed(&c->run_top, end);
  } else if (end > mp_load_relaxed(&c->tree_top)) {
    mp_store_relaxed(&c->tree_top, end);
  }
  mp_store_relaxed(&c->nmapped, mp_load_relaxed(&c->nmapped) + n);
  mp_fetch_add_relaxed(&c->maps, n);
  mp_chunks_reserved_add(pool, (int64_t)n);
  return 0;
}

/* Maps chunks [first, first + n), all unmapped: the first `moved` (as
 * many as a move unmapped) a group per whole MP_MOVE_GROUP-aligned window
 * if the pool can grow (a fixed one has no group), else a chunk each; the
 * rest a group per MP_CHUNK_GROUP-aligned window (as map_window allows).
 * On failure what was mapped stays (empty mapped chunks).  Lock held. */
static int map_run(magpool_t *pool, uint64_t first, uint64_t n, uint64_t moved) {
  const mp_chunks *c = pool->chunks;
  for (uint64_t a = first, end = first + n; a < end;) {
    uint64_t w = moved != 0 ? MP_MOVE_GROUP : MP_CHUNK_GROUP;
    uint64_t b = (a / w + 1) * w;
    if (b > end) b = end;
    if (moved != 0 && moved < b - a) b = a + moved;
    bool grp = moved == 0 || (b - a == w && c->cap > c->keep); /* growth, whole window */
    int rc = map_window(pool, a, b - a, grp);
    if (rc != 0) return rc;
    moved -= moved != 0 ? b - a : 0;
    a = b;
  }
  return 0;
}

/* Completed stream frees not yet given back (ready) that could cover
 * `bytes`?  Only those: frees still pending behind their streams are not
 * waited for here (that would make a thread wait for other streams' work
 * whenever the pool reaches a new peak); the out-of-memory ladder waits
 * for them when nothing else is left. */
static bool returning_covers(const magpool_t *pool, size_t bytes) {
  int64_t r = mp_load_relaxed(&pool->retire.ready_bytes) + mp_load_relaxed(&pool->retire.ready_fenced);
  return r > 0 && (size_t)r >= bytes;
}

/* Makes room for n more mapped chunks under the budget, by unmapping empty ones (kept for
 * the map that follows: a move).  Creating memory beyond what is mapped is refused with
 * MP_EGROW unless `grow`, while stream frees on their way back could cover the run: the
 * caller waits for them first (pool.c's ladder).  (A take with MP_TAKE_NOMOVE never gets
 * here over the budget: mp_chunks_acquire refuses it.)  Lock held. */
static int make_room(magpool_t *pool, uint64_t n, int grow) {
  mp_chunks *c = pool->chunks;
  if (mp_load_relaxed(&c->nmapped) + n <= budget(c))
    return !grow && returning_covers(pool, n << c->shift) ? MP_EGROW : 0;
  /* Over the budget: moves.  Fail before unmapping anything if too few
   * chunks are empty for the run to fit under the cap. */
  uint64_t nm = mp_load_relaxed(&c->nmapped);
  if (nm + n > c->cap && mp_chunks_count_empty(c, nm + n - c->cap) < nm + n - c->cap)
    return MAGPOOL_ENOMEM;
  uint64_t over = mp_load_relaxed(&c->nmapped) + n - budget(c);
  /* A group unmapped whole may give more than `over`: never below
   * pool_size once the n chunks are mapped. */
  uint64_t floor = c->keep > n ? c->keep - n : 0;
  mp_fetch_add_relaxed(&c->moves, mp_chunks_unmap_highest(pool, over, 1, floor));
  return mp_load_relaxed(&c->nmapped) + n <= c->cap ? 0 : MAGPOOL_ENOMEM;
}

/* ------------------------------------------------------------ busy counts */

/* First chunk and chunk count of a block's extent, and the units it adds to each. */
typedef struct extent {
  uint64_t first, n, units;
} extent;

static extent extent_of(const magpool_t *pool, const char *p, unsigned order, size_t need) {
  const mp_chunks *c = pool->chunks;
  extent e;
  e.first = (uint64_t)(p - c->base) >> c->shift;
  size_t bs = mp_block_bytes(pool, order);
  if (bs < c->chunk) { /* an extent block's: its granules (need) */
    e.n = 1;
    e.units = order < c->xlo ? (uint64_t)1 << order : need >> pool->min_shift;
  } else {
    e.n = mp_chunks_for(c, need);
    e.units = units_per_chunk(pool, c);
  }
  return e;
}

/* A run-space chunk belongs to one run at a time, handed over under the
 * runs' lock (give_run counts down before mp_runs_free, take_run up after
 * mp_runs_alloc; a failed take's are counted down by mp_runs_putback):
 * stores, not RMWs (docs/design.md, chunked pools), and the runs count
 * them in rbusy under their lock, not here.  Down: RELEASE (the block's
 * last use happens before an unmap that reads 0). */
static inline bool owned(const mp_chunks *c, const extent *e) { return e->first >= c->run0; }

static void busy_sub(magpool_t *pool, const extent *e) {
  mp_chunks *c = pool->chunks;
  bool own = owned(c, e);
  for (uint64_t i = e->first; i < e->first + e->n; i++)
    if (own) mp_store_release(&c->busy[i], 0);
    else if (mp_fetch_sub_seq_cst(&c->busy[i], (uint32_t)e->units) == e->units)
      mp_fetch_sub_relaxed(&c->nbusy, 1);
}

void mp_chunks_lock(magpool_t *pool) { pthread_mutex_lock(lock_of(pool->chunks)); }
void mp_chunks_unlock(magpool_t *pool) { pthread_mutex_unlock(lock_of(pool->chunks)); }

/* Unmaps empty chunks above release_threshold (not below keep); skips if the lock is busy. */
static void release_excess(magpool_t *pool) {
  mp_chunks *c = pool->chunks;
  pthread_mutex_t *lk = lock_of(c);
  if (pthread_mutex_trylock(lk) != 0) return;
  uint64_t nm = mp_load_relaxed(&c->nmapped), nb = mp_chunks_nbusy(c);
  if (nm > c->keep && nm > nb && nm - nb > c->release) {
    uint64_t want = nm - nb - c->release;
    mp_chunks_unmap_highest(pool, want < nm - c->keep ? want : nm - c->keep, 0, c->keep);
  }
  pthread_mutex_unlock(lk);
}

/* A take that makes nb chunks busy: raises the high-water mark, which
 * raises the budget for good; false (refused) if it would while stream
 * frees on their way back could keep it where it is (the caller waits
 * for them, then asks again with grow), or for MP_TAKE_NOPEAK/NOMAP. */
static bool peak_ok(magpool_t *pool, uint64_t nb, int grow) {
  mp_chunks *c = pool->chunks;
  if (nb > mp_load_relaxed(&c->hwm) && (grow == MP_TAKE_NOMAP ||
      (grow == MP_TAKE_NOPEAK ? nb > c->keep : !grow && returning_covers(pool, c->chunk))))
    return false;
  mp_max_relaxed_u64(&c->hwm, nb);
  return true;
}

int mp_chunks_acquire_held(magpool_t *pool, char *p, unsigned order, size_t need, int grow) {
  mp_chunks *c = pool->chunks;
  extent e = extent_of(pool, p, order, need);
  mp_store_relaxed(&c->ext[e.first], (uint32_t)e.n);
  return peak_ok(pool, mp_load_relaxed(&c->nbusy) + mp_load_relaxed(&c->runs.rbusy), grow)
             ? 0
             : MP_EGROW;
}

int mp_chunks_acquire(magpool_t *pool, char *p, unsigned order, size_t need, int grow) {
  mp_chunks *c = pool->chunks;
  extent e = extent_of(pool, p, order, need);
  if (mp_block_bytes(pool, order) >= c->chunk) mp_store_relaxed(&c->ext[e.first], (uint32_t)e.n);
  /* own (fenced, busy already): relaxed stores and mp_asym_light stand for the RMWs above */
  bool own = owned(c, &e);
  const uint64_t end = e.first + e.n; /* &e escapes: read once */
  const uint32_t u = (uint32_t)e.units;
  uint64_t fresh = 0;
  int rc = MP_EGROW;
  if (!own)
    for (uint64_t i = e.first; i < end; i++) fresh += mp_fetch_add_seq_cst(&c->busy[i], u) == 0;
  else
    for (uint64_t i = e.first; i < end; i++) {
      fresh += mp_load_relaxed(&c->busy[i]) == 0;
      mp_store_relaxed(&c->busy[i], u);
    }
  if (own) mp_asym_light(); /* "Ordering" above */
  /* own: mp_runs_alloc counted the window (rbusy), a free solo chunk
   * among them with its busy count kept (runs.h), so always looked at. */
  if (own || fresh != 0) {
    uint64_t lower = own ? mp_load_relaxed(&c->nbusy) : mp_fetch_add_relaxed(&c->nbusy, fresh) + fresh;
    if (!peak_ok(pool, lower + mp_load_relaxed(&c->runs.rbusy), grow)) goto refuse;
  }
  MP_HOOK(MP_HOOK_CHUNK_TAKE, c->base + (e.first << c->shift));
  uint64_t i = e.first;
  while (i < end && mp_load_seq_cst(&c->state[i]) == MP_CHUNK_MAPPED) i++;
  if (MP_LIKELY(i == end)) return 0;

  if (grow == MP_TAKE_NOMAP) goto refuse; /* its thread's extent cache goes back first (xcache.c) */
  if (mp_load_relaxed(&c->runs.solo) != 0) { /* the caller ends it first (runs.h) */
    rc = MP_ESOLO;
    goto refuse;
  }
  /* Slow path: map what is not mapped, run by run. */
  pthread_mutex_t *lk = lock_of(c);
  pthread_mutex_lock(lk);
  rc = 0;
  /* MP_TAKE_NOMOVE (and NOPEAK): all rows under the budget, or none mapped
   * (the caller has another way: alloc_async.c).  nmapped changes only
   * under the lock and the budget never falls (hwm only rises). */
  if (grow >= MP_TAKE_NOMOVE) {
    uint64_t k = 0;
    for (uint64_t x = i; x < e.first + e.n; x++) k += mp_load_relaxed(&c->state[x]) != MP_CHUNK_MAPPED;
    if (mp_load_relaxed(&c->nmapped) + k > budget(c)) rc = MP_EGROW;
  }
  while (i < e.first + e.n && rc == 0) {
    if (mp_load_relaxed(&c->state[i]) == MP_CHUNK_MAPPED) { i++; continue; }
    uint64_t j = i;
    while (j < e.first + e.n && mp_load_relaxed(&c->state[j]) != MP_CHUNK_MAPPED) j++;
    uint64_t before = mp_load_relaxed(&c->nmapped), moved = mp_load_relaxed(&c->moves);
    rc = make_room(pool, j - i, grow);
    if (rc == 0) {
      uint64_t mv = mp_load_relaxed(&c->moves) - moved;
      rc = map_run(pool, i, j - i, mv < j - i ? mv : j - i);
    }
    if (rc == 0 && mp_load_relaxed(&c->nmapped) > before) mp_fetch_add_relaxed(&pool->grow_count, 1);
    i = j;
  }
  if (pool->src->drop_kept != NULL) pool->src->drop_kept(pool->src_ctx); /* a move's leftovers */
  pthread_mutex_unlock(lk);
  if (rc == 0) return 0;
refuse: /* the caller gives the block back; own: mp_runs_putback counts it down */
  if (!own) busy_sub(pool, &e);
  return rc;
}

void mp_chunks_release_excess(magpool_t *pool) {
  mp_chunks *c = pool->chunks;
  if (MP_UNLIKELY(c->release != UINT64_MAX) &&
      mp_load_relaxed(&c->nmapped) - mp_chunks_nbusy(c) > c->release)
    release_excess(pool);
}

void mp_chunks_release(magpool_t *pool, char *p, unsigned order) {
  extent e = extent_of(pool, p, order, mp_block_cost(pool, p, order));
  busy_sub(pool, &e);
  if (!owned(pool->chunks, &e)) mp_chunks_release_excess(pool); /* runs: rbusy not down yet */
}

void mp_chunks_release_n(magpool_t *pool, char *p, unsigned order, uint32_t k) {
  extent e = extent_of(pool, p, order, 0);
  e.units *= k;
  busy_sub(pool, &e);
  mp_chunks_release_excess(pool);
}

void mp_chunks_trim(magpool_t *pool) {
  mp_chunks *c = pool->chunks;
  pthread_mutex_lock(lock_of(c));
  uint64_t nm = mp_load_relaxed(&c->nmapped);
  if (nm > c->keep) mp_chunks_unmap_highest(pool, nm - c->keep, 0, c->keep);
  pthread_mutex_unlock(lock_of(c));
}

/* ------------------------------------------------------------ life cycle */

/* The per-chunk tables (NULL ones too: a failed creation). */
static void free_tabs(mp_chunks *c) {
  free(c->gfirst), free(c->glen), free(c->busy), free(c->ext);
  free((void *)c->state), free((void *)c->mapped);
}

int mp_chunks_init(magpool_t *pool) {
  const mp_source_ops *src = pool->src;
  const magpool_config_t *cfg = &pool->cfg;
  if (src->map == NULL) return MAGPOOL_ENOTSUP;
  size_t gran = src->granularity != NULL ? src->granularity(pool->src_ctx) : 4096;
  if (gran == 0) return MAGPOOL_ENOTSUP; /* this device cannot map chunks */
  size_t chunk = cfg->chunk_size;
  if (chunk < gran) chunk = gran;
  if (chunk < cfg->min_block) return MAGPOOL_ENOTSUP;
  /* pool_size is mapped at creation and kept (magpool.h): not whole
   * chunks, a growing pool rounds it up, within max_pool_size; else one
   * of MP_ROUND_DOWN_MIN chunks or more rounds it down, and a smaller one
   * holds exactly pool_size on whole regions. */
  size_t keep = (cfg->pool_size + chunk - 1) & ~(chunk - 1);
  if (keep != cfg->pool_size && (!cfg->allow_growth || keep < cfg->pool_size ||
                                 (cfg->max_pool_size != 0 && keep > cfg->max_pool_size))) {
    keep = cfg->pool_size & ~(chunk - 1);
    if (keep / chunk < MP_ROUND_DOWN_MIN) return MAGPOOL_ENOTSUP;
  }
  /* The cap: max_pool_size, else the source's capacity when growing, else pool_size. */
  size_t cap = keep;
  if (cfg->allow_growth) {
    if (cfg->max_pool_size != 0) cap = cfg->max_pool_size;
    else if (src->capacity != NULL && src->capacity(pool->src_ctx) > cap)
      cap = src->capacity(pool->src_ctx);
  }
  cap &= ~(chunk - 1);
  if (cap < keep) cap = keep;
  /* Twice the cap in address space (buddy blocks round requests up to a power of two),
   * and as much again for runs of chunks (runs.c): the tree has the lower half. */
  size_t va = (size_t)1 << mp_log2_ceil(cap);
  if (va < ((size_t)1 << 45)) va *= 2;
  if (va < chunk) va = chunk;
  va *= 2;
  mp_chunks *c = calloc(1, sizeof *c);
  pthread_mutex_t *lk = malloc(sizeof *lk);
  int rc = MAGPOOL_ENOMEM;
  if (c == NULL || lk == NULL) goto fail;
  pthread_mutex_init(lk, NULL);
  c->lock = lk;
  c->chunk = chunk;
  c->shift = mp_log2_floor(chunk);
  c->xlo = c->shift - pool->min_shift; /* no extent orders until mp_extents_setup */
  c->va_bytes = va;
  c->n = va >> c->shift;
  c->cap = cap >> c->shift;
  c->keep = keep >> c->shift;
  c->release = cfg->release_threshold == SIZE_MAX ? UINT64_MAX : cfg->release_threshold >> c->shift;
  c->slack0 = cfg->chunk_groups ? MP_CHUNK_SLACK_MIN : 1;
  c->busy = calloc(c->n, sizeof *c->busy);
  c->ext = calloc(c->n, sizeof *c->ext);
  c->state = calloc(c->n, sizeof *c->state);
  c->mapped = calloc((c->n + 63) / 64, sizeof *c->mapped);
  c->gfirst = calloc(c->n, sizeof *c->gfirst);
  c->glen = calloc(c->n, sizeof *c->glen);
  if (c->busy == NULL || c->ext == NULL || c->state == NULL || c->mapped == NULL ||
      c->gfirst == NULL || c->glen == NULL)
    goto fail_tabs;
  void *base = NULL;
  rc = src->va_reserve(pool->src_ctx, va, chunk, &base);
  if (rc != 0) goto fail_tabs;
  c->base = base;
  c->run0 = c->n / 2;
  pool->chunks = c;
  rc = mp_runs_init(pool, (uint32_t)(c->n - c->run0));
  if (rc != 0) goto fail_va;
  /* pool_size is mapped at creation, a chunk each, where placement fills first:
   * MP_KEEP_TREE chunks at the bottom of the tree's half, the rest at the
   * bottom of the run space (most of a pool is large blocks: design.md). */
  uint64_t t = c->keep < MP_KEEP_TREE ? c->keep : MP_KEEP_TREE;
  pthread_mutex_lock(lk);
  rc = t != 0 ? map_window(pool, 0, t, false) : 0;
  if (rc == 0 && c->keep > t) rc = map_window(pool, c->run0, c->keep - t, false);
  pthread_mutex_unlock(lk);
  if (rc == 0) return 0;
  mp_runs_fini(pool);
fail_va:
  pool->chunks = NULL;
  src->va_release(pool->src_ctx, base, va);
fail_tabs:
  free_tabs(c);
  pthread_mutex_destroy(lk);
fail:
  free(lk);
  free(c);
  return rc;
}

void mp_chunks_fini(magpool_t *pool) {
  mp_chunks *c = pool->chunks;
  if (c == NULL) return;
  pool->src->va_release(pool->src_ctx, c->base, c->va_bytes);
  mp_runs_fini(pool);
  free_tabs(c);
  pthread_mutex_destroy(lock_of(c));
  free(c->lock);
  free(c);
  pool->chunks = NULL;
}
