/* tree.h - the lock-free buddy tree (tree.c; read-only queries of
 * ranges: tree_query.c).  Self-contained: the tree knows no pool, no
 * region and no thread, only units.  test_tree and the bench's locked
 * baseline include this header alone. */
#ifndef MAGPOOL_TREE_H
#define MAGPOOL_TREE_H

#include "atomic.h"
#include "base.h"

/* A tree of 2^top units; a block of order o is 2^o units, aligned to 2^o.
 * Only the first nunits units exist: the rest (the "phantom" tail of a
 * region whose size is not a power of two) is never free.
 *
 * Per order o, a bitmap free[o] of 2^(top-o) bits:
 *   bit i set  <=>  block i of order o is free and not split and not merged
 *                   into its parent.
 * Buddies 2j and 2j+1 share one 64-bit word, so one CAS claims a pair.
 *
 * Invariants (checked by mp_tree_check on a quiescent tree):
 *   I1  No two free blocks overlap: if block (o,i) is free, no ancestor and
 *       no descendant of it is free.
 *   I2  No free block reaches past nunits (phantom tail is never free).
 *   I3  Summary: for every layer L >= 1 of order o, a nonzero word of layer
 *       L-1 has its summary bit set in layer L.  (A set summary bit over a
 *       zero word is allowed: it is only a stale hint.)
 *   I4  free units (sum of 2^o over free bits) + units handed out ==
 *       nunits.  (The caller knows the units handed out; check returns the
 *       free units.)
 *
 * Concurrency: every operation may run concurrently with every other one.
 * No locks.  Bits are changed only by atomic RMW on the word that holds
 * them, so ABA on a bit is harmless: a CAS that claims bit i of word w
 * succeeds only if the bit is set now, whoever set it.
 */
#define MP_TREE_MAX_LAYERS 6 /* 64^6 words of bitmap: enough for 2^42 units */

typedef struct mp_level {
  /* layer[0] is the free bitmap itself; layer[k] summarises layer[k-1]:
   * bit j of layer k is (a hint that) word j of layer k-1 is nonzero. */
  _Atomic uint64_t *layer[MP_TREE_MAX_LAYERS];
  uint64_t nwords[MP_TREE_MAX_LAYERS];
  unsigned nlayers; /* the top layer has exactly one word */
} mp_level;

typedef struct mp_tree {
  uint64_t nunits;          /* units that exist                          */
  unsigned top;             /* tree covers 2^top units                   */
  mp_level level[MP_MAX_ORDER + 1];
  void *mem;                /* one mmap holding every layer              */
  size_t mem_bytes;
} mp_tree;

/* Builds a tree of nunits units (>= 1) with every unit free.  MAGPOOL_ENOMEM
 * if its bitmaps cannot be mapped. */
int mp_tree_init(mp_tree *t, uint64_t nunits);
void mp_tree_fini(mp_tree *t);

/* Claims a free block of the given order, lowest address first within the
 * smallest order that has one, splitting a coarser block when needed.
 * Returns its unit offset, or -1 if none is free now.  The caller owns the
 * block.  ACQUIRE: the claim synchronises with the release that freed it. */
int64_t mp_tree_alloc(mp_tree *t, unsigned order);

/* Claims block (off, order) - off aligned to it - if it, or a block that
 * contains it, is free now; a containing block is split down, and the
 * halves that do not hold off are freed.  Returns off, or -1 (nothing
 * changed).  ACQUIRE, as mp_tree_alloc. */
int64_t mp_tree_claim_at(mp_tree *t, uint64_t off, unsigned order);
/* A hint for mp_tree_claim_at: the lowest free block of order `order` or
 * more, below `span`, inside the aligned range [lo, lo + 2^span) (orders
 * at least span - 6 only: a word of bits each), smallest order first; its
 * offset, or -1.  Changes nothing. */
int64_t mp_tree_find_in(const mp_tree *t, uint64_t lo, unsigned span, unsigned order);
/* Another hint: which granules (blocks of order g, span - 9 <= g < span)
 * of the aligned range [lo, lo + 2^span) lie in free blocks of order g
 * to span - 1 now: bit k % 64 of m[k / 64] for the k-th; m has
 * max(1, 2^(span - g - 6)) words, all written.  A granule that is only
 * partly free, or free in a block of order span or more, reads 0.
 * Changes nothing; mp_tree_claim_at's CAS decides. */
void mp_tree_free_mask(const mp_tree *t, uint64_t lo, unsigned span, unsigned g, uint64_t *m);

/* Gives back block (off, order): sets its bit only (lazy coalescing).
 * RELEASE: the caller's writes to the block happen before a later claim. */
void mp_tree_release(mp_tree *t, uint64_t off, unsigned order);

/* Coalescing step for one released block: while the block and its buddy
 * are both free, claim the pair with one CAS and free the parent.  Stops at
 * the first buddy that is not free.  Safe to call for a block that has
 * already been merged or reclaimed by someone else (it then does nothing). */
void mp_tree_merge(mp_tree *t, uint64_t off, unsigned order);

/* release + merge. */
void mp_tree_free(mp_tree *t, uint64_t off, unsigned order);

/* Merges every pair of free buddies, bottom up.  After it, on a quiescent
 * tree, no two free buddies remain (so a fully free tree is one block, or
 * the binary decomposition of nunits). */
void mp_tree_coalesce_all(mp_tree *t);

/* Free units now (a racy sum of relaxed reads; exact when quiescent). */
uint64_t mp_tree_free_units(const mp_tree *t);

/* Largest order with a free block now, or -1. */
int mp_tree_largest_free_order(const mp_tree *t);

/* Does a free block overlap units [off, off + n) right now?  A word a
 * time at each order; for checkers. */
bool mp_tree_any_free(const mp_tree *t, uint64_t off, uint64_t n);

/* Is block (off, order) free right now? (tests) */
bool mp_tree_is_free(const mp_tree *t, uint64_t off, unsigned order);

/* Checks I1-I3 on a quiescent tree.  Returns 0 and stores the free units
 * in *free_units (may be NULL), or MAGPOOL_EINVAL and writes nothing. */
int mp_tree_check(const mp_tree *t, uint64_t *free_units);

#endif /* MAGPOOL_TREE_H */
