/* region.c - regions and growth, and every hand-off between the caches and
 * the trees: take, give, the sorted batch give-back that does the lazy
 * coalescing, and the accounting of tree traffic.  Layer 2.
 *
 * A pool is 1..MP_MAX_REGIONS regions.  Regions are only appended (growth,
 * under grow_lock; nregions is published with a RELEASE store after the
 * region is complete, and every reader loads it with ACQUIRE) and freed at
 * destroy.  Each has its own tree and header table.
 *
 * Accounting: every block taken from or given to a tree moves the caller's
 * mp_acct (held, and tree_delta).  tree_delta reaches the pool's shared
 * tree_out and peak counters in steps of MP_PEAK_BATCH, so that a slow path
 * rarely writes a shared line.
 */
#include "extent.h"
#include "runs.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

/* Tree usage reaches the shared peak counter in steps of this size: the
 * random workload's refills and flushes of large classes made a smaller
 * step a contended atomic on most slow paths. */
#define MP_PEAK_BATCH ((int64_t)4 << 20)

/* --------------------------------------------------------------- regions */

/* Builds a region of `bytes` at `base` (NULL: reserve it from the source)
 * and publishes it. */
static int region_add(magpool_t *pool, size_t bytes, void *base, size_t tree_bytes) {
  unsigned n = mp_load_relaxed(&pool->nregions);
  if (n >= MP_MAX_REGIONS) return MAGPOOL_ENOMEM;
  mp_region *r = calloc(1, sizeof *r);
  if (r == NULL) return MAGPOOL_ENOMEM;
  r->bytes = bytes;
  r->nunits = bytes >> pool->min_shift;
  int rc = mp_tree_init(&r->tree, tree_bytes >> pool->min_shift);
  if (rc != 0) goto fail_r;
  /* A chunked region's run space (above the tree) has a header per chunk
   * (types.h). */
  r->hdr_split = tree_bytes >> pool->min_shift;
  r->hdr_rshift = tree_bytes < bytes ? pool->chunks->shift - pool->min_shift : 0;
  uint64_t words = r->hdr_split;
  if (tree_bytes < bytes)
    words += ((r->nunits - r->hdr_split) >> r->hdr_rshift) * MP_HDR_RUN_WORDS + 1;
  r->hdr_bytes = (size_t)words * sizeof(uint32_t);
  void *h = mmap(NULL, r->hdr_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (h == MAP_FAILED) { rc = MAGPOOL_ENOMEM; goto fail_tree; }
  r->hdr = h;
  bool whole = base == NULL;
  if (whole) {
    rc = pool->src->reserve(pool->src_ctx, bytes, &base);
    if (rc != 0) goto fail_hdr;
  }
  r->base = base;
  pool->regions[n] = r;
  /* RELEASE: the region is fully built before readers of nregions
   * (mp_region_of, ACQUIRE) can reach it. */
  mp_store_release(&pool->nregions, n + 1);
  if (whole) { /* a chunked region's memory is counted as it is mapped */
    size_t now = mp_fetch_add_relaxed(&pool->reserved, bytes) + bytes;
    if (mp_max_relaxed_size(&pool->peak_reserved, now) == now) /* a new peak */
      mp_store_relaxed(&pool->pending_at_peak, mp_load_relaxed(&pool->retire.pending_bytes));
  }
  return 0;
fail_hdr:
  munmap(r->hdr, r->hdr_bytes);
fail_tree:
  mp_tree_fini(&r->tree);
fail_r:
  free(r);
  return rc;
}

int mp_region_add(magpool_t *pool, size_t bytes) { return region_add(pool, bytes, NULL, bytes); }

int mp_region_add_chunked(magpool_t *pool) {
  int rc = mp_chunks_init(pool);
  if (rc != 0) return rc;
  /* The tree gets the lower half; the upper half is run space (runs.c). */
  rc = region_add(pool, pool->chunks->va_bytes, pool->chunks->base, pool->chunks->va_bytes / 2);
  if (rc != 0) mp_chunks_fini(pool);
  return rc;
}

void mp_region_destroy(magpool_t *pool, mp_region *r) {
  if (pool->chunks == NULL) pool->src->release(pool->src_ctx, r->base, r->bytes);
  munmap(r->hdr, r->hdr_bytes);
  mp_tree_fini(&r->tree);
  free(r);
}

int mp_region_grow(magpool_t *pool, unsigned order, unsigned seen) {
  /* A chunked pool grows as its chunks are mapped, up to its cap. */
  if (!pool->cfg.allow_growth || pool->chunks != NULL) return MAGPOOL_ENOMEM;
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
    rc = mp_region_add(pool, size);
    if (rc == 0 || size == need) break;
    size = size / 2 > need ? (size / 2) & ~(pool->cfg.min_block - 1) : need;
  }
  if (rc == 0) mp_fetch_add_relaxed(&pool->grow_count, 1);
out:
  pthread_mutex_unlock(lk);
  return rc;
}

void mp_regions_coalesce(magpool_t *pool) {
  unsigned n = mp_load_acquire(&pool->nregions);
  for (unsigned i = 0; i < n; i++) mp_tree_coalesce_all(&pool->regions[i]->tree);
}

/* ------------------------------------------------------------ accounting */

void mp_acct_flush(magpool_t *pool, mp_acct *a) {
  int64_t d = a->tree_delta;
  a->tree_delta = 0;
  int64_t now = mp_fetch_add_relaxed(&pool->tree_out, d) + d;
  mp_max_relaxed(&pool->peak, now);
}

void mp_acct_settle(magpool_t *pool, mp_acct *a) {
  mp_acct_flush(pool, a);
  mp_fetch_add_relaxed(&pool->held_extra, mp_load_relaxed(&a->held));
  mp_store_relaxed(&a->held, 0);
}

static inline void acct_add(magpool_t *pool, mp_acct *a, int64_t d) {
  mp_owner_add(&a->held, (uint64_t)d);
  a->tree_delta += d;
  if (a->tree_delta >= MP_PEAK_BATCH || a->tree_delta <= -MP_PEAK_BATCH) mp_acct_flush(pool, a);
}

/* ------------------------------------------------------------- hand-offs */

/* ------------------------------------------------------------ run blocks */

/* mp_chunks_acquire, noting a refusal for a stream's solo (runs.h) in a. */
static int acquire(magpool_t *pool, mp_acct *a, char *p, unsigned order, size_t need, int grow) {
  int rc = mp_chunks_acquire(pool, p, order, need, grow);
  if (MP_UNLIKELY(rc == MP_ESOLO)) a->solo_hit = true;
  return rc;
}

/* A large block as a run of chunks (runs.c); the block keeps its buddy
 * order for its header and stats, but occupies only its chunks. */
static void *take_run(magpool_t *pool, mp_acct *a, unsigned order, size_t need, int grow) {
  mp_chunks *c = pool->chunks;
  uint32_t m = (uint32_t)mp_chunks_for(c, need);
  bool held;
  int64_t s = mp_runs_alloc(pool, m, a->fence_owner, a->adopt, &held);
  if (s < 0) {
    if (s == -2) a->solo_hit = true; /* the API's slow path ends that solo (runs.h) */
    return NULL;
  }
  char *p = c->base + ((size_t)(c->run0 + (uint64_t)s) << c->shift);
  if (held) MP_HOOK(MP_HOOK_RUN_HELD, p);
  if ((held ? mp_chunks_acquire_held(pool, p, order, need, grow)
            : acquire(pool, a, p, order, need, grow)) != 0) {
    mp_runs_putback(pool, (uint32_t)s, m);
    return NULL;
  }
  acct_add(pool, a, (int64_t)mp_block_cost(pool, p, order));
  return p;
}

static void give_run(magpool_t *pool, mp_acct *a, void *p, unsigned order) {
  mp_chunks *c = pool->chunks;
  size_t cost = mp_block_cost(pool, p, order);
  mp_chunks_release(pool, p, order);
  uint64_t first = ((uint64_t)((char *)p - c->base) >> c->shift) - c->run0;
  mp_runs_free(pool, (uint32_t)first, (uint32_t)(cost >> c->shift));
  mp_chunks_release_excess(pool); /* after the runs counted its chunks down */
  acct_add(pool, a, -(int64_t)cost);
}

int mp_region_fence(magpool_t *pool, mp_acct *a, void *p, unsigned order, uint32_t tag,
                    uint64_t owner, bool retired, uint32_t *range) {
  if (!mp_is_run(pool, p)) return 0;
  mp_chunks *c = pool->chunks;
  size_t cost = mp_block_cost(pool, p, order);
  range[0] = (uint32_t)(((uint64_t)((char *)p - c->base) >> c->shift) - c->run0);
  range[1] = (uint32_t)(cost >> c->shift);
  bool again = mp_runs_fence(pool, range[0], range[1], tag, owner, retired);
  acct_add(pool, a, -(int64_t)cost);
  return again ? 2 : 1;
}

bool mp_region_give_solo(magpool_t *pool, mp_acct *a, void *p, unsigned order, uint64_t owner) {
  mp_chunks *c = pool->chunks;
  size_t cost = mp_block_cost(pool, p, order);
  uint32_t s = (uint32_t)(((uint64_t)((char *)p - c->base) >> c->shift) - c->run0);
  uint32_t m = (uint32_t)(cost >> c->shift);
  if (!mp_runs_solo_give(pool, s, m, owner)) return false; /* its chunks stay busy: no release_excess */
  acct_add(pool, a, -(int64_t)cost);
  return true;
}

/* Empty mapped chunks tried before a small block opens an unmapped one. */
#define MP_PREFER_TRIES 4

/* A block under a chunk that landed in an unmapped chunk (so it split a
 * block of a chunk or more) moves, if it can, into the lowest empty
 * mapped chunk whose addresses are free: memory already there is used
 * before any is mapped or moved (tools/sim: "small-aware").  Returns the
 * block's offset, the new one or off. */
static int64_t prefer_mapped(magpool_t *pool, mp_region *r, int64_t off, unsigned order) {
  mp_chunks *c = pool->chunks;
  if (mp_block_bytes(pool, order) > c->chunk) return off;
  uint64_t ch = ((uint64_t)off << pool->min_shift) >> c->shift;
  /* Only a chunk that is unmapped: one being unmapped (UNMAPPING) is
   * settled by the take's slow path under the lock. */
  if (mp_load_relaxed(&c->state[ch]) != MP_CHUNK_UNMAPPED) return off;
  uint64_t cand[MP_PREFER_TRIES];
  unsigned n = mp_chunks_empty_low(pool, cand, MP_PREFER_TRIES);
  unsigned cshift = c->shift - pool->min_shift;
  for (unsigned k = 0; k < n; k++) {
    int64_t got = mp_tree_claim_at(&r->tree, cand[k] << cshift, order);
    if (got >= 0) {
      mp_tree_free(&r->tree, (uint64_t)off, order);
      return got;
    }
  }
  return off;
}

/* Fullest first: the busy chunks of the tree's half a pack tries. */
#define MP_PACK_TRIES 4

/* On a chunked pool without chunk groups (one with a max_pool_size, where
 * footprint comes first): a block of a 64th of a chunk to half a chunk
 * goes into the fullest busy chunk of the tree's half that has a free
 * block for it, not where the tree's lowest address would put it, so that
 * sparse chunks empty and can move (t5_beam_generate's capped async pass:
 * docs/benchmarks.md, 2026-12-03 evening).  The busy counts and the
 * bitmap words are hints (relaxed, acquire); mp_tree_claim_at's CAS
 * decides.  -1: none (the caller asks the tree). */
static int64_t pack_pick(magpool_t *pool, mp_region *r, unsigned order) {
  mp_chunks *c = pool->chunks;
  unsigned cord = c->shift - pool->min_shift;
  if (pool->cfg.chunk_groups || order >= cord || cord - order > 6 || r != pool->regions[0])
    return -1;
  uint64_t per = (uint64_t)1 << cord, cand[MP_PACK_TRIES];
  unsigned n = mp_chunks_fullest(pool, (uint64_t)1 << order, cand, MP_PACK_TRIES);
  for (unsigned i = 0; i < n; i++) {
    int64_t off = mp_tree_find_in(&r->tree, cand[i] * per, cord, order);
    if (off < 0) continue;
    MP_HOOK(MP_HOOK_PACK_FOUND, r->base + ((size_t)off << pool->min_shift));
    /* Another take may have claimed it since: the next candidate. */
    if ((off = mp_tree_claim_at(&r->tree, (uint64_t)off, order)) >= 0) return off;
  }
  return -1;
}

/* A block of `order` from region r's tree: on a chunked pool packed
 * (pack_pick) or at the lowest address, then moved into mapped memory
 * if it landed in an unmapped chunk (prefer_mapped).  -1: none. */
static int64_t tree_pick(magpool_t *pool, mp_region *r, unsigned order) {
  int64_t off = pool->chunks != NULL ? pack_pick(pool, r, order) : -1;
  if (off < 0) off = mp_tree_alloc(&r->tree, order);
  if (off >= 0 && pool->chunks != NULL) off = prefer_mapped(pool, r, off, order);
  return off;
}

/* An extent block (extent.c) of `need` bytes: a row of granules in a
 * busy chunk, else an aligned block of the next power of two of granules
 * from the tree, its tail given back.  A request that needs the whole
 * order takes it aligned, as any tree block (magazines carve those). */
static void *take_extent(magpool_t *pool, mp_acct *a, unsigned order, size_t need, int grow) {
  mp_region *r = pool->regions[0];
  unsigned g = pool->chunks->gord;
  uint32_t n = mp_extent_granules(pool, need);
  int64_t off = n < ((uint32_t)1 << (order - g)) ? mp_extent_fit(pool, r, n) : -1;
  if (off < 0) {
    unsigned o2 = g + mp_log2_ceil(n);
    if ((off = tree_pick(pool, r, o2)) < 0) return NULL;
    mp_extent_trim(pool, r, (uint64_t)off, o2, n);
  }
  mp_extent_mark(pool, (uint64_t)off, n);
  char *p = r->base + ((size_t)off << pool->min_shift);
  if (acquire(pool, a, p, order, (size_t)n << (g + pool->min_shift), grow) != 0) {
    mp_extent_put(pool, r, (uint64_t)off, n, true); /* nothing was counted */
    return NULL;
  }
  acct_add(pool, a, (int64_t)mp_block_cost(pool, p, order));
  return p;
}

static void *take(magpool_t *pool, mp_acct *a, unsigned order, size_t need, int grow,
                  bool run_ok) {
  if (run_ok && pool->chunks != NULL && mp_run_order(pool, order))
    return take_run(pool, a, order, need, grow);
  if (mp_extent_order(pool, order)) return take_extent(pool, a, order, need, grow);
  unsigned n = mp_load_acquire(&pool->nregions);
  for (unsigned i = 0; i < n; i++) {
    mp_region *r = pool->regions[i];
    if (order > r->tree.top) continue;
    int64_t off = tree_pick(pool, r, order);
    if (off >= 0) {
      char *p = r->base + ((size_t)off << pool->min_shift);
      if (pool->chunks != NULL && acquire(pool, a, p, order, need, grow) != 0) {
        /* No memory for it under the cap: nothing was counted. */
        mp_tree_free(&r->tree, (uint64_t)off, order);
        return NULL;
      }
      acct_add(pool, a, (int64_t)mp_block_cost(pool, p, order));
      return p;
    }
  }
  return NULL;
}

void *mp_region_take_need(magpool_t *pool, mp_acct *a, unsigned order, size_t need,
                          int grow) {
  return take(pool, a, order, need, grow, true);
}

void *mp_region_take(magpool_t *pool, mp_acct *a, unsigned order, int grow) {
  /* Full extent, from the tree: magazines carve it. */
  return take(pool, a, order, mp_block_bytes(pool, order), grow, false);
}

static void give(magpool_t *pool, mp_acct *a, void *p, unsigned order, bool merge) {
  if (mp_is_run(pool, p)) { give_run(pool, a, p, order); return; }
  int64_t cost = (int64_t)mp_block_cost(pool, p, order);
  if (pool->chunks != NULL) mp_chunks_release(pool, p, order);
  mp_region *r = mp_region_of(pool, p);
  uint64_t off = (uint64_t)((char *)p - r->base) >> pool->min_shift;
  /* An extent block's granules: read before its pieces go. */
  if (mp_extent_order(pool, order)) {
    uint32_t n = (uint32_t)(cost >> (pool->chunks->gord + pool->min_shift));
    mp_extent_put(pool, r, off, n, merge);
    mp_extent_given(pool, off, n);
  } else if (merge) {
    mp_tree_free(&r->tree, off, order);
  } else {
    mp_tree_release(&r->tree, off, order);
  }
  acct_add(pool, a, -cost);
}

void mp_region_give(magpool_t *pool, mp_acct *a, void *p, unsigned order) {
  give(pool, a, p, order, true);
}

void mp_region_give_lazy(magpool_t *pool, mp_acct *a, void *p, unsigned order) {
  give(pool, a, p, order, false);
}

/* To the tree only: the chunks and the account were settled block by
 * block, before the merge. */
static void tree_give(magpool_t *pool, mp_region *r, char *p, unsigned o) {
  mp_tree_free(&r->tree, (uint64_t)(p - r->base) >> pool->min_shift, o);
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

/* Uncounts n blocks sorted by address: one count-down per chunk for the
 * blocks below a chunk that share one (a magazine's flush mostly does). */
static void chunks_release_sorted(magpool_t *pool, void **blk, uint32_t n, unsigned order) {
  mp_chunks *c = pool->chunks;
  if (mp_block_bytes(pool, order) >= c->chunk) {
    for (uint32_t i = 0; i < n; i++) mp_chunks_release(pool, blk[i], order);
    return;
  }
  for (uint32_t i = 0; i < n;) {
    uint64_t ch = (uint64_t)((char *)blk[i] - c->base) >> c->shift;
    uint32_t j = i + 1;
    while (j < n && (uint64_t)((char *)blk[j] - c->base) >> c->shift == ch) j++;
    mp_chunks_release_n(pool, blk[i], order, j - i);
    i = j;
  }
}

/* Sorted by address and merged in place: a stack of (block, order) where
 * the top two merge while they are buddies of one order in one region.
 * What is left is given to the tree, whose merge step then continues
 * upwards against blocks outside the batch.  The stack holds at most one
 * entry per order above the batch's plus the batch itself, so
 * MP_MAG_SLOTS + MP_MAX_ORDER + 2 entries never overflow for n <=
 * MP_MAG_SLOTS. */
void mp_blocks_give(magpool_t *pool, mp_acct *a, void **blk, uint32_t n, unsigned order) {
  if (n == 0) return;
  mp_assert(n <= MP_MAG_SLOTS);
  if (pool->chunks != NULL && (mp_is_run(pool, blk[0]) || mp_extent_order(pool, order))) {
    for (uint32_t i = 0; i < n; i++) give(pool, a, blk[i], order, true); /* no buddies */
    return;
  }
  if (n > 1) qsort(blk, n, sizeof *blk, cmp_ptr);
  int64_t cost = 0;
  for (uint32_t i = 0; i < n; i++) cost += (int64_t)mp_block_cost(pool, blk[i], order);
  if (pool->chunks != NULL) chunks_release_sorted(pool, blk, n, order);
  acct_add(pool, a, -cost);
  struct mp_merge_ent {
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
      struct mp_merge_ent *x = &st[top - 2], *y = &st[top - 1];
      if (x->o != y->o || x->r != y->r || x->o >= x->r->tree.top) break;
      size_t bs = mp_block_bytes(pool, x->o);
      size_t off = (size_t)(x->p - x->r->base);
      if ((off & (2 * bs - 1)) != 0 || y->p != x->p + bs) break;
      x->o++; /* x and y become their parent */
      top--;
    }
    if (top == sizeof st / sizeof st[0]) { /* cannot happen for n <= 64 */
      for (unsigned k = 0; k < top; k++) tree_give(pool, st[k].r, st[k].p, st[k].o);
      top = 0;
    }
  }
  for (unsigned k = 0; k < top; k++) tree_give(pool, st[k].r, st[k].p, st[k].o);
}

void mp_chain_give(magpool_t *pool, mp_acct *a, mp_mag *chain) {
  for (mp_mag *m = chain; m != NULL;) {
    mp_mag *mn = mp_load_relaxed(&m->next);
    mp_blocks_give(pool, a, m->slot, m->count, m->order);
    mp_mag_free(pool, m);
    m = mn;
  }
}
