/* extent.c - extent blocks: a chunked pool's blocks below a chunk of the
 * orders no cache holds (c->xlo up to the chunk's) take whole granules,
 * a 512th of a chunk each (4 KiB of 2 MiB), as many as the request needs,
 * in a row inside one chunk of the tree's half, rather than their power
 * of two.  Layer 2.
 *
 * Why: the buddy order of a block from half a chunk to a chunk rounds a
 * 576 KiB tensor up to 1 MiB, so a chunk holds two where it could hold
 * three, and a pool capped at cudaMalloc's footprint + 2 % ran out with
 * 26 chunks empty (vit_train_varbatch, docs/benchmarks.md); and 4,000
 * live blocks of 136 KiB took 256 KiB each, so a pool capped at
 * cudaMalloc's + 2 % failed at the 2,176th.  A capped pool's caches hold
 * blocks up to a 256th of a chunk (pool.c), so its blocks from 8 KiB to
 * a chunk are extent blocks.  Cached orders keep their power of two: any
 * block of a class must serve any request of it with no check on the
 * fast path.
 *
 * The tree holds an extent block as the aligned pieces of its range (the
 * greedy split of [a, a + n) granules: at each step the largest block
 * aligned at the position that does not pass the end; at most
 * 2 x MP_EXTENT_SPAN of them).  No new shared state: every piece is a
 * tree block, claimed with mp_tree_claim_at's CAS and given back with
 * mp_tree_free, so the tree's own argument (tree.c) covers the hand-over
 * of each piece.  Any split of an owned range into aligned pieces may go
 * back, not only the one that claimed it.
 *
 * Invariants (mp_extent_check, via magpool_check, quiescent):
 *   E1  A block of extent order o out of the tree, starting at unit u,
 *       has n = mp_extent_read(u) granules, 1 <= n <= 2^(o - gord); u is
 *       granule aligned and the n granules lie in one chunk; n == 2^(o -
 *       gord) only for a block aligned to its order.
 *   E2  n granules hold the block's request (bs - slack).
 *   E3  No free block of the tree overlaps it.
 *   E4  Its chunk's busy count includes n granules' units (C4 sums it).
 * The extent word lives in the block's fourth header word (its order
 * bits 0, so it reads as no block): written by the taker before the
 * block is counted, read by whoever gives it back, who holds the block
 * through the same hand-over as its contents.
 *
 * Placement (mp_extent_fit): the granules of the last extent block given
 * back (xhint), when they hold n with at most an eighth to spare; else
 * that block's chunk, then the fullest busy chunks by their counts
 * (mp_chunks_fullest), and in each the granules that are free in free
 * tree blocks (mp_tree_free_mask: the chunk's bitmap words, level by
 * level); the smallest row of free granules that holds n, at its low
 * end.  A claim that loses a piece to another take gives back the pieces
 * it got and tries the next chunk (MP_HOOK_EXTENT_FOUND opens that window
 * in the tests).  With no row anywhere, the caller takes an aligned
 * block of the next power of two of granules from the tree as before and
 * trims its tail (mp_extent_trim), so the chunk it opens has room for the
 * next. */
#include "extent.h"

/* Chunks a take looks at: fullest first, and the lowest it scans. */
#define MP_EXTENT_TRIES 8
#define MP_PACK_SCAN 1024

void mp_extents_setup(magpool_t *pool) {
  mp_chunks *c = pool->chunks;
  unsigned cord = c->shift - pool->min_shift;
  c->hdr0 = pool->regions[0]->hdr;
  c->xlo = cord;
  /* The extent word needs four header words in a granule: at least 2^2
   * units (a chunk of fewer than 2^11 units has fewer granules). */
  if (cord < 3) return;
  c->gord = cord >= MP_EXTENT_SPAN + 2 ? cord - MP_EXTENT_SPAN : 2;
  unsigned lo = pool->nclasses > pool->s_nclasses ? pool->nclasses : pool->s_nclasses;
  /* No thread cache on a pool with chunk groups: none.  With no extent
   * cache (xcache.c needs the thread caches) each extent block went to
   * the tree at every take and give, and the two halves traded the
   * budget's last chunks: gpt2_generate moved 22,000-26,000 chunks a
   * warm pass, where buddy blocks move 70 and take less memory
   * (docs/benchmarks.md, 2026-12-04). */
  if (pool->nclasses == 0 && pool->cfg.chunk_groups) return;
  if (lo < c->gord + 1) lo = c->gord + 1;
  if (lo < cord) c->xlo = lo;
}

unsigned mp_chunks_fullest(magpool_t *pool, uint64_t units, uint64_t *cand, unsigned max) {
  mp_chunks *c = pool->chunks;
  uint64_t per = (uint64_t)1 << (c->shift - pool->min_shift);
  uint64_t top = mp_load_relaxed(&c->tree_top);
  uint32_t cb[MP_EXTENT_TRIES];
  unsigned n = 0;
  if (max > MP_EXTENT_TRIES) max = MP_EXTENT_TRIES;
  for (uint64_t ch = 0; ch < top && ch < MP_PACK_SCAN; ch++) {
    uint32_t b = mp_load_relaxed(&c->busy[ch]);
    if (b == 0 || per - b < units) continue; /* empty, or too full */
    /* Insert into the fullest max, fullest first. */
    unsigned k = n < max ? n++ : max;
    for (; k > 0 && cb[k - 1] < b; k--)
      if (k < max) cand[k] = cand[k - 1], cb[k] = cb[k - 1];
    if (k < max) cand[k] = ch, cb[k] = b;
  }
  return n;
}

/* The order, above the granule's, of the piece at granule x of a range
 * ending at granule end. */
static inline unsigned piece(uint64_t x, uint64_t end) {
  unsigned k = x == 0 ? 63 : mp_ctz64(x), f = mp_log2_floor(end - x);
  return k < f ? k : f;
}

/* Gives back granules [x, end) (owned) as their pieces. */
static void put_range(mp_tree *t, uint64_t x, uint64_t end, unsigned g, bool merge) {
  while (x < end) {
    unsigned k = piece(x, end);
    if (merge) mp_tree_free(t, x << g, g + k);
    else mp_tree_release(t, x << g, g + k);
    x += (uint64_t)1 << k;
  }
}

/* Claims granules [a, a + n) piece by piece; on a lost piece gives back
 * the ones it got. */
static bool claim_range(mp_tree *t, uint64_t a, uint32_t n, unsigned g) {
  uint64_t end = a + n;
  for (uint64_t x = a; x < end;) {
    unsigned k = piece(x, end);
    if (mp_tree_claim_at(t, x << g, g + k) < 0) {
      put_range(t, a, x, g, true);
      return false;
    }
    x += (uint64_t)1 << k;
  }
  return true;
}

/* The first bit at or after x of the nw words of m that is set (`set`)
 * or clear; nw * 64 if none. */
static uint64_t next_bit(const uint64_t *m, unsigned nw, uint64_t x, bool set) {
  unsigned k = (unsigned)(x / 64);
  if (k >= nw) return (uint64_t)nw * 64;
  uint64_t w = (set ? m[k] : ~m[k]) & (~(uint64_t)0 << (x % 64));
  while (w == 0) {
    if (++k == nw) return (uint64_t)nw * 64;
    w = set ? m[k] : ~m[k];
  }
  return (uint64_t)k * 64 + mp_ctz64(w);
}

/* The start of the smallest row of set bits of m (nw words) that holds
 * n, or -1. */
static int64_t best_row(const uint64_t *m, unsigned nw, uint32_t n) {
  int64_t best = -1;
  uint64_t blen = UINT64_MAX, end = (uint64_t)nw * 64;
  for (uint64_t x = 0; x < end && blen != n;) {
    uint64_t s = next_bit(m, nw, x, true);
    if (s >= end) break;
    x = next_bit(m, nw, s, false);
    if (x - s >= n && x - s < blen) best = (int64_t)s, blen = x - s;
  }
  return best;
}

/* The row for n granules in chunk ch, claimed; -1: none, or lost. */
static int64_t fit_in(magpool_t *pool, mp_region *r, uint64_t ch, uint32_t n) {
  mp_chunks *c = pool->chunks;
  unsigned cord = c->shift - pool->min_shift, g = c->gord, span = cord - g;
  uint64_t lo = ch << cord, m[MP_EXTENT_WORDS];
  mp_tree_free_mask(&r->tree, lo, cord, g, m);
  int64_t s = best_row(m, span > 6 ? 1u << (span - 6) : 1, n);
  if (s < 0) return -1;
  uint64_t off = lo + ((uint64_t)s << g);
  MP_HOOK(MP_HOOK_EXTENT_FOUND, r->base + (off << pool->min_shift));
  return claim_range(&r->tree, off >> g, n, g) ? (int64_t)off : -1;
}

int64_t mp_extent_fit(magpool_t *pool, mp_region *r, uint32_t n) {
  mp_chunks *c = pool->chunks;
  unsigned g = c->gord, span = c->shift - pool->min_shift - g;
  uint64_t h = mp_load_relaxed(&c->xhint), x = h >> MP_EXTENT_SPAN, cand[MP_EXTENT_TRIES];
  uint64_t hn = h & (((uint64_t)1 << MP_EXTENT_SPAN) - 1), hc = x >> span;
  bool busy = hc < mp_load_relaxed(&c->tree_top) && mp_load_relaxed(&c->busy[hc]) != 0;
  int64_t off;
  /* First the granules of the last extent block given back, if they hold
   * n with at most an eighth to spare: a loop frees and takes blocks of
   * the same sizes (about 40 % of gpt2_generate's and t5_beam_generate's
   * extent takes follow the free of one of their size), and the mask of a
   * chunk costs some 800 instructions.  Not in an empty chunk, which the
   * fullest chunks' room should spare.  A lost piece gives back the ones
   * claimed, as in fit_in. */
  if (busy && mp_extent_fits(n, (uint32_t)hn)) {
    MP_HOOK(MP_HOOK_EXTENT_FOUND, r->base + ((x << g) << pool->min_shift));
    if (claim_range(&r->tree, x, n, g)) return (int64_t)(x << g);
  }
  /* Then its chunk: a step of a training loop frees and takes blocks of
   * the same sizes. */
  if (busy && (off = fit_in(pool, r, hc, n)) >= 0) return off;
  unsigned k = mp_chunks_fullest(pool, (uint64_t)n << g, cand, MP_EXTENT_TRIES);
  for (unsigned i = 0; i < k; i++)
    if (cand[i] != hc && (off = fit_in(pool, r, cand[i], n)) >= 0) return off;
  return -1;
}

void mp_extent_given(magpool_t *pool, uint64_t off, uint32_t n) {
  mp_chunks *c = pool->chunks;
  mp_store_relaxed(&c->xhint, (off >> c->gord) << MP_EXTENT_SPAN | n);
}

void mp_extent_trim(magpool_t *pool, mp_region *r, uint64_t off, unsigned order, uint32_t n) {
  unsigned g = pool->chunks->gord;
  put_range(&r->tree, (off >> g) + n, (off + ((uint64_t)1 << order)) >> g, g, true);
}

void mp_extent_put(magpool_t *pool, mp_region *r, uint64_t off, uint32_t n, bool merge) {
  unsigned g = pool->chunks->gord;
  put_range(&r->tree, off >> g, (off >> g) + n, g, merge);
}

int mp_extent_check(magpool_t *pool, mp_region *r, uint64_t u, unsigned o, uint32_t w,
                    uint64_t *cost) {
  mp_chunks *c = pool->chunks;
  unsigned g = c->gord, cord = c->shift - pool->min_shift;
  uint64_t n = mp_extent_read(pool, u), full = (uint64_t)1 << (o - g);
  size_t req = mp_block_bytes(pool, o) - mp_hdr_slack(&c->hdr0[u], w);
  if ((u & (((uint64_t)1 << g) - 1)) != 0 || n == 0 || n > full) return MAGPOOL_EINVAL; /* E1 */
  if (n == full && (u & (((uint64_t)1 << o) - 1)) != 0) return MAGPOOL_EINVAL;
  if ((u >> cord) != ((u + (n << g) - 1) >> cord)) return MAGPOOL_EINVAL;
  if ((n << (g + pool->min_shift)) < req) return MAGPOOL_EINVAL; /* E2 */
  if (mp_tree_any_free(&r->tree, u, n << g)) return MAGPOOL_EINVAL; /* E3 */
  *cost = n << (g + pool->min_shift);
  return 0;
}
