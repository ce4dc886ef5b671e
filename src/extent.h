/* extent.h - extent blocks (extent.c): on a chunked pool, a block of an
 * order no cache holds and below a chunk takes only the granules (a 512th
 * of a chunk) its request needs, anywhere in one chunk, not its power of
 * two.  Layer 2; data: types.h (mp_chunks: xlo, gord, hdr0, xhint). */
#ifndef MAGPOOL_EXTENT_H
#define MAGPOOL_EXTENT_H

#include "internal.h"

/* log2 of the granules in a chunk (fewer in a chunk of under 2^11
 * units), and the words of a chunk's granule mask (mp_tree_free_mask). */
#define MP_EXTENT_SPAN 9
#define MP_EXTENT_WORDS ((1u << MP_EXTENT_SPAN) / 64)

/* An extent block's order: a chunked pool's, below a chunk, not cached. */
static inline bool mp_extent_order(const magpool_t *pool, unsigned order) {
  const mp_chunks *c = pool->chunks;
  return c != NULL && order >= c->xlo && mp_block_bytes(pool, order) < c->chunk;
}

/* Granules a request of `need` bytes takes (at least one). */
static inline uint32_t mp_extent_granules(const magpool_t *pool, size_t need) {
  unsigned gs = pool->chunks->gord + pool->min_shift;
  return need == 0 ? 1 : (uint32_t)((need + ((size_t)1 << gs) - 1) >> gs);
}

/* The waste rule of a block kept for reuse (mp_extent_fit's hint, the
 * thread's extent cache): m granules serve a request of n if they hold it
 * with at most an eighth of n to spare. */
static inline bool mp_extent_fits(uint32_t n, uint32_t m) { return n <= m && m - n <= n / 8; }

/* Sets xlo and gord from the pool's cache classes.  Create only, after
 * the classes are known. */
void mp_extents_setup(magpool_t *pool);
/* Up to max busy chunks of the tree's half with at least `units` free by
 * their counts, fullest first, among the lowest MP_PACK_SCAN below
 * tree_top (relaxed reads: hints). */
unsigned mp_chunks_fullest(magpool_t *pool, uint64_t units, uint64_t *cand, unsigned max);
/* Claims n granules (fewer than an order's) in one busy chunk of region
 * r, the fullest that has them in a row, the smallest such row there:
 * each of the range's aligned pieces with mp_tree_claim_at.  Returns the
 * range's unit offset, or -1 (nothing claimed). */
int64_t mp_extent_fit(magpool_t *pool, mp_region *r, uint32_t n);
/* Notes the extent block of n granules at unit off of the tree's half,
 * just given back, as the first place mp_extent_fit tries (xhint: a
 * relaxed hint, its granule index and n). */
void mp_extent_given(magpool_t *pool, uint64_t off, uint32_t n);
/* An owned block (off, order) keeps its first n granules: the pieces of
 * the rest go back to the tree. */
void mp_extent_trim(magpool_t *pool, mp_region *r, uint64_t off, unsigned order, uint32_t n);
/* Gives back the pieces of the n granules at off: mp_tree_free, or
 * mp_tree_release only (lazy) when !merge. */
void mp_extent_put(magpool_t *pool, mp_region *r, uint64_t off, uint32_t n, bool merge);
/* magpool_check's part: the live block of extent order o at unit u (word
 * w) is well formed (its granules in one chunk, enough for its request,
 * fewer than the order's when split) and no piece of it is free in the
 * tree.  Its cost in *cost; 0 or MAGPOOL_EINVAL. */
int mp_extent_check(magpool_t *pool, mp_region *r, uint64_t u, unsigned o, uint32_t w,
                    uint64_t *cost);

#endif /* MAGPOOL_EXTENT_H */
