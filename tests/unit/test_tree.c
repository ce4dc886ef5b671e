/* test_tree.c - unit tests of the lock-free buddy tree (src/tree.c) through
 * src/internal.h.
 *
 * Every step of the single-threaded tests is followed by mp_tree_check()
 * (invariants I1-I3) and by the I4 balance: free units reported by the
 * checker + units this test holds == nunits.
 */
#include "thread.h" /* internal.h and the thread record */

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* ------------------------------------------------------------------ */
/* helpers                                                            */
/* ------------------------------------------------------------------ */

static const uint64_t k_sizes[] = {1,  2,    3,    5,    7,         48,
                                   63, 64,   65,   1000, 4096,      4097,
                                   100000, (uint64_t)1 << 20,
                                   ((uint64_t)1 << 20) + 12345};
#define NSIZES (sizeof k_sizes / sizeof k_sizes[0])

/* Sizes small enough to run mp_tree_check (O(n)) after every single step. */
#define CHECK_EVERY_STEP_MAX 5000

static void tree_init(mp_tree *t, uint64_t n) {
  memset(t, 0, sizeof *t);
  int rc = mp_tree_init(t, n);
  cr_assert_eq(rc, 0, "mp_tree_init(%llu) = %d", (unsigned long long)n, rc);
  cr_assert_eq(t->nunits, n, "nunits %llu, expected %llu",
               (unsigned long long)t->nunits, (unsigned long long)n);
}

/* I1-I3 via the checker, then I4 with the units the caller holds. */
static void check_tree(const mp_tree *t, uint64_t held) {
  uint64_t free_units = ~(uint64_t)0;
  int rc = mp_tree_check(t, &free_units);
  cr_assert_eq(rc, 0, "mp_tree_check failed (nunits %llu, held %llu)",
               (unsigned long long)t->nunits, (unsigned long long)held);
  cr_assert_eq(free_units + held, t->nunits,
               "I4 broken: free %llu + held %llu != nunits %llu",
               (unsigned long long)free_units, (unsigned long long)held,
               (unsigned long long)t->nunits);
  cr_assert_eq(mp_tree_free_units(t), free_units,
               "mp_tree_free_units %llu != checker's %llu",
               (unsigned long long)mp_tree_free_units(t),
               (unsigned long long)free_units);
}

/* A fully free, fully coalesced tree is the binary decomposition of nunits:
 * for each set bit b of n, from the top, a free block of order b at the
 * running offset.  Together with "free units == n" and I1 this says the
 * free blocks are exactly those. */
static void assert_decomposition(const mp_tree *t) {
  uint64_t n = t->nunits;
  check_tree(t, 0);
  uint64_t off = 0;
  for (int b = 63; b >= 0; b--) {
    if (!((n >> b) & 1))
      continue;
    cr_assert(mp_tree_is_free(t, off, (unsigned)b),
              "nunits %llu: block (off %llu, order %d) of the binary "
              "decomposition is not free",
              (unsigned long long)n, (unsigned long long)off, b);
    off += (uint64_t)1 << b;
  }
  cr_assert_eq(off, n);
  cr_assert_eq(mp_tree_largest_free_order(t), (int)mpt_floor_log2(n),
               "nunits %llu: largest free order %d, expected %u",
               (unsigned long long)n, mp_tree_largest_free_order(t),
               mpt_floor_log2(n));
}

/* What mp_tree_alloc(t, order) must return on a quiescent tree, by its
 * contract: the lowest-address free block among the smallest order >= order
 * that has one (a coarser block is split and its lowest part kept).  Built
 * from mp_tree_is_free only; O(n). */
static int64_t oracle_alloc(const mp_tree *t, unsigned order) {
  uint64_t n = t->nunits;
  for (unsigned o = order; o < 64 && ((uint64_t)1 << o) <= n; o++) {
    uint64_t sz = (uint64_t)1 << o;
    for (uint64_t off = 0; off + sz <= n; off += sz)
      if (mp_tree_is_free(t, off, o))
        return (int64_t)off;
  }
  return -1;
}

/* Is block (off, order) free, or inside a free ancestor (merged)? */
static bool free_or_merged(const mp_tree *t, uint64_t off, unsigned order) {
  for (unsigned o = order; o < 63; o++) {
    uint64_t sz = (uint64_t)1 << o;
    uint64_t a = off & ~(sz - 1);
    if (a + sz > t->nunits)
      break;
    if (mp_tree_is_free(t, a, o))
      return true;
  }
  return false;
}

typedef struct blk {
  uint64_t off;
  unsigned order;
} blk;

/* ------------------------------------------------------------------ */
/* init                                                               */
/* ------------------------------------------------------------------ */

/* mp_popcount64 (base.h), which counts the tree's and the runs' bitmap
 * words, against a loop over the bits: edge words and pseudo-random ones. */
Test(tree, popcount_matches_a_bit_loop) {
  uint64_t x = 0x9e3779b97f4a7c15u;
  for (unsigned i = 0; i < 100000; i++) {
    uint64_t w = i == 0 ? 0 : i == 1 ? ~(uint64_t)0 : i < 66 ? (uint64_t)1 << (i - 2) : x;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    if (i % 3 == 0) w &= x; /* sparser words too */
    unsigned n = 0;
    for (unsigned b = 0; b < 64; b++) n += (unsigned)(w >> b & 1);
    cr_assert_eq(mp_popcount64(w), n, "word %#llx: %u bits, not %u", (unsigned long long)w, n,
                 mp_popcount64(w));
  }
}

Test(tree, init_sizes) {
  for (size_t i = 0; i < NSIZES; i++) {
    mp_tree t;
    uint64_t n = k_sizes[i];
    tree_init(&t, n);
    /* A new tree is wholly free and, reasonably, already coalesced: the
     * largest block that fits can be had at once. */
    assert_decomposition(&t);
    /* Nothing coarser than the largest block that fits exists. */
    unsigned too_big = mpt_floor_log2(n) + 1;
    cr_assert_eq(mp_tree_alloc(&t, too_big), -1,
                 "n %llu: order %u (bigger than the tree) was handed out",
                 (unsigned long long)n, too_big);
    cr_assert_eq(mp_tree_alloc(&t, MP_MAX_ORDER), -1);
    assert_decomposition(&t);
    mp_tree_fini(&t);
  }
}

Test(tree, init_twice_independent) {
  /* Two trees at once share nothing. */
  mp_tree a, b;
  tree_init(&a, 1000);
  tree_init(&b, 48);
  int64_t x = mp_tree_alloc(&a, 0);
  cr_assert_geq(x, 0);
  check_tree(&a, 1);
  assert_decomposition(&b);
  mp_tree_free(&a, (uint64_t)x, 0);
  mp_tree_coalesce_all(&a);
  assert_decomposition(&a);
  mp_tree_fini(&a);
  mp_tree_fini(&b);
}

/* ------------------------------------------------------------------ */
/* lowest address first                                               */
/* ------------------------------------------------------------------ */

Test(tree, lowest_first_pow2) {
  const uint64_t n = 4096;
  mp_tree t;
  tree_init(&t, n);
  /* On a fresh power-of-two tree, order-0 allocations walk the address
   * space upwards one unit at a time. */
  for (uint64_t i = 0; i < n; i++) {
    int64_t off = mp_tree_alloc(&t, 0);
    cr_assert_eq(off, (int64_t)i, "alloc #%llu returned %lld",
                 (unsigned long long)i, (long long)off);
    check_tree(&t, i + 1);
  }
  cr_assert_eq(mp_tree_alloc(&t, 0), -1);

  /* Release (no merge) 500 random distinct units: they stay order-0 free
   * blocks, and allocating them back yields them in ascending order. */
  mpt_rng r = mpt_rng_seed(42);
  uint64_t *perm = malloc(n * sizeof *perm);
  cr_assert_not_null(perm);
  for (uint64_t i = 0; i < n; i++)
    perm[i] = i;
  mpt_shuffle(&r, perm, n, sizeof *perm);
  const uint64_t k = 500;
  unsigned char *freed = calloc(n, 1);
  cr_assert_not_null(freed);
  for (uint64_t i = 0; i < k; i++) {
    mp_tree_release(&t, perm[i], 0);
    freed[perm[i]] = 1;
    check_tree(&t, n - i - 1);
  }
  uint64_t prev = 0;
  for (uint64_t i = 0; i < k; i++) {
    int64_t off = mp_tree_alloc(&t, 0);
    cr_assert_geq(off, 0);
    cr_assert(freed[off], "unit %lld handed out but was never released",
              (long long)off);
    if (i > 0)
      cr_assert_gt((uint64_t)off, prev,
                   "not lowest first: %lld after %llu", (long long)off,
                   (unsigned long long)prev);
    prev = (uint64_t)off;
    freed[off] = 0;
    check_tree(&t, n - k + i + 1);
  }
  cr_assert_eq(mp_tree_alloc(&t, 0), -1);

  for (uint64_t i = 0; i < n; i++)
    mp_tree_free(&t, perm[i], 0);
  mp_tree_coalesce_all(&t);
  assert_decomposition(&t);
  free(perm);
  free(freed);
  mp_tree_fini(&t);
}

/* Random alloc/free traffic compared, step by step, with the placement
 * rule of the contract (smallest sufficient order, lowest address). */
static void lowest_first_random(uint64_t n, uint64_t seed, int steps) {
  mp_tree t;
  tree_init(&t, n);
  mpt_rng r = mpt_rng_seed(seed);
  blk *held = malloc((size_t)n * sizeof *held);
  cr_assert_not_null(held);
  size_t nheld = 0;
  uint64_t held_units = 0;
  unsigned max_order = mpt_floor_log2(n) < 5 ? mpt_floor_log2(n) : 5;

  for (int s = 0; s < steps; s++) {
    uint64_t dice = mpt_below(&r, 100);
    if (dice < 60 || nheld == 0) {
      unsigned o = (unsigned)mpt_below(&r, max_order + 1);
      int64_t want = oracle_alloc(&t, o);
      int64_t got = mp_tree_alloc(&t, o);
      cr_assert_eq(got, want,
                   "n %llu step %d: alloc(order %u) = %lld, contract says "
                   "%lld",
                   (unsigned long long)n, s, o, (long long)got,
                   (long long)want);
      if (got >= 0) {
        held[nheld].off = (uint64_t)got;
        held[nheld].order = o;
        nheld++;
        held_units += (uint64_t)1 << o;
      }
    } else if (dice < 98) {
      size_t i = (size_t)mpt_below(&r, nheld);
      blk b = held[i];
      held[i] = held[--nheld];
      held_units -= (uint64_t)1 << b.order;
      if (mpt_below(&r, 2)) {
        mp_tree_free(&t, b.off, b.order);
        cr_assert(free_or_merged(&t, b.off, b.order),
                  "freed block (%llu, %u) is neither free nor inside a "
                  "free ancestor",
                  (unsigned long long)b.off, b.order);
      } else {
        mp_tree_release(&t, b.off, b.order);
        cr_assert(mp_tree_is_free(&t, b.off, b.order),
                  "released block (%llu, %u) is not free at its order",
                  (unsigned long long)b.off, b.order);
      }
    } else {
      mp_tree_coalesce_all(&t);
    }
    check_tree(&t, held_units);
  }
  for (size_t i = 0; i < nheld; i++)
    mp_tree_free(&t, held[i].off, held[i].order);
  mp_tree_coalesce_all(&t);
  assert_decomposition(&t);
  free(held);
  mp_tree_fini(&t);
}

Test(tree, lowest_first_random_1000) { lowest_first_random(1000, 1, 3000); }
Test(tree, lowest_first_random_48) { lowest_first_random(48, 2, 2000); }
Test(tree, lowest_first_random_4097) { lowest_first_random(4097, 3, 3000); }
Test(tree, lowest_first_random_4096) { lowest_first_random(4096, 4, 3000); }

/* ------------------------------------------------------------------ */
/* exhaustion at order 0, then free everything in random order        */
/* ------------------------------------------------------------------ */

Test(tree, exhaust_order0_then_free_random, .timeout = 120) {
  for (size_t si = 0; si < NSIZES; si++) {
    uint64_t n = k_sizes[si];
    int every = n <= CHECK_EVERY_STEP_MAX;
    mp_tree t;
    tree_init(&t, n);
    unsigned char *seen = calloc((size_t)n, 1);
    uint64_t *offs = malloc((size_t)n * sizeof *offs);
    cr_assert(seen && offs);

    uint64_t got = 0;
    for (;;) {
      int64_t off = mp_tree_alloc(&t, 0);
      if (off < 0)
        break;
      cr_assert_lt((uint64_t)off, n, "n %llu: unit %lld is past the end",
                   (unsigned long long)n, (long long)off);
      cr_assert(!seen[off], "n %llu: unit %lld handed out twice",
                (unsigned long long)n, (long long)off);
      cr_assert_lt(got, n, "n %llu: more than n units handed out",
                   (unsigned long long)n);
      seen[off] = 1;
      offs[got++] = (uint64_t)off;
      if (every || (got & 4095) == 0)
        check_tree(&t, got);
    }
    cr_assert_eq(got, n, "n %llu: only %llu units could be allocated",
                 (unsigned long long)n, (unsigned long long)got);
    for (uint64_t i = 0; i < n; i++)
      cr_assert(seen[i]);
    check_tree(&t, n);
    cr_assert_eq(mp_tree_largest_free_order(&t), -1);
    cr_assert_eq(mp_tree_alloc(&t, 0), -1, "alloc on a full tree succeeded");
    cr_assert_eq(mp_tree_free_units(&t), 0);

    /* Free in random order; half with free (release + merge), half with
     * release alone. */
    mpt_rng r = mpt_rng_seed(100 + si);
    mpt_shuffle(&r, offs, (size_t)n, sizeof *offs);
    for (uint64_t i = 0; i < n; i++) {
      if (i & 1)
        mp_tree_release(&t, offs[i], 0);
      else
        mp_tree_free(&t, offs[i], 0);
      if (every || (i & 4095) == 0)
        check_tree(&t, n - i - 1);
    }
    check_tree(&t, 0);
    mp_tree_coalesce_all(&t);
    assert_decomposition(&t);
    /* And the tree is usable again: the biggest block can be had. */
    int64_t big = mp_tree_alloc(&t, mpt_floor_log2(n));
    cr_assert_eq(big, 0, "n %llu: largest block at %lld, expected 0",
                 (unsigned long long)n, (long long)big);
    mp_tree_free(&t, 0, mpt_floor_log2(n));
    assert_decomposition(&t);

    free(seen);
    free(offs);
    mp_tree_fini(&t);
  }
}

/* ------------------------------------------------------------------ */
/* split and merge                                                    */
/* ------------------------------------------------------------------ */

/* mp_tree_free_mask's only word, for a range of at most 64 granules. */
static uint64_t mask1(const mp_tree *t, uint64_t lo, unsigned span, unsigned g) {
  uint64_t m[8];
  memset(m, 0xa5, sizeof m);
  mp_tree_free_mask(t, lo, span, g, m);
  cr_assert_eq(m[1], 0xa5a5a5a5a5a5a5a5ull, "a word past the mask was written");
  return m[0];
}

/* mp_tree_free_mask: in a range of 2^5 granules of order 2 (a span of
 * order 7 inside a tree of 2^9 units), the granules in free blocks of
 * orders 2..6.  mp_tree_any_free: any free block overlapping a range. */
Test(tree, free_mask_and_any_free) {
  mp_tree t;
  tree_init(&t, 512);
  cr_assert_eq(mask1(&t, 128, 7, 2), 0, "inside a free block of order 9: none");
  cr_assert(mp_tree_any_free(&t, 130, 1));
  /* Claim [128, 256): the span; then free units 136-143 (granules 2-3)
   * and 160-191 (granules 8-15). */
  cr_assert_eq(mp_tree_claim_at(&t, 128, 7), 128);
  cr_assert_eq(mask1(&t, 128, 7, 2), 0);
  cr_assert(!mp_tree_any_free(&t, 128, 128));
  cr_assert(mp_tree_any_free(&t, 100, 29), "unit 0-127 are free");
  mp_tree_release(&t, 128, 7);
  cr_assert_eq(mp_tree_claim_at(&t, 128, 3), 128); /* split: 136-143 free */
  cr_assert_eq(mp_tree_claim_at(&t, 144, 4), 144);
  cr_assert_eq(mp_tree_claim_at(&t, 192, 6), 192);
  /* Free now: 136-143 (order 3), 160-191 (order 5); busy 128-135,
   * 144-159, 192-255. */
  cr_assert_eq(mask1(&t, 128, 7, 2), 0xff0cu);
  cr_assert(mp_tree_any_free(&t, 140, 1));
  cr_assert(!mp_tree_any_free(&t, 144, 16));
  cr_assert(!mp_tree_any_free(&t, 192, 64));
  /* A unit freed inside a busy block is seen; the granule is not. */
  cr_assert_eq(mp_tree_claim_at(&t, 136, 3), 136);
  mp_tree_release(&t, 137, 0);
  cr_assert(mp_tree_any_free(&t, 128, 16), "unit 137 free under a claimed block");
  cr_assert_eq(mask1(&t, 128, 7, 2), 0xff00u, "granule 2 is only partly free");
  cr_assert_eq(mp_tree_claim_at(&t, 137, 0), 137);
  mp_tree_free(&t, 136, 3);
  mp_tree_free(&t, 128, 3);
  mp_tree_free(&t, 144, 4);
  mp_tree_free(&t, 192, 6);
  assert_decomposition(&t);
  mp_tree_fini(&t);
}

/* mp_tree_free_mask over eight words: 512 granules of order 0 (a span
 * of order 9 at unit 512 of a tree of 2^11 units).  Blocks set free
 * inside the claimed span show as their granules, in whichever word. */
Test(tree, free_mask_of_many_words) {
  mp_tree t;
  tree_init(&t, 2048);
  uint64_t m[8];
  cr_assert_eq(mp_tree_claim_at(&t, 512, 9), 512);
  mp_tree_free_mask(&t, 512, 9, 0, m);
  for (unsigned k = 0; k < 8; k++) cr_assert_eq(m[k], 0, "word %u", k);
  const uint64_t off[] = {600, 640, 768, 1000, 1004, 1007};
  const unsigned ord[] = {3, 6, 7, 2, 1, 0};
  for (unsigned i = 0; i < 6; i++) mp_tree_release(&t, off[i], ord[i]);
  mp_tree_free_mask(&t, 512, 9, 0, m);
  const uint64_t want[8] = {0, 0xffull << 24, ~0ull, 0, ~0ull, ~0ull, 0, 0xbfull << 40};
  for (unsigned k = 0; k < 8; k++) cr_assert_eq(m[k], want[k], "word %u: %#lx", k, (unsigned long)m[k]);
  for (unsigned i = 0; i < 6; i++) cr_assert_eq(mp_tree_claim_at(&t, off[i], ord[i]), (int64_t)off[i]);
  mp_tree_free(&t, 512, 9);
  assert_decomposition(&t);
  mp_tree_fini(&t);
}

Test(tree, release_does_not_merge_merge_does) {
  mp_tree t;
  tree_init(&t, 64);
  int64_t a = mp_tree_alloc(&t, 0);
  cr_assert_eq(a, 0);
  check_tree(&t, 1);
  /* The split left one free block of each order 0..5. */
  for (unsigned o = 0; o < 6; o++)
    cr_assert(mp_tree_is_free(&t, (uint64_t)1 << o, o),
              "split half of order %u at %u not published", o, 1u << o);
  cr_assert_eq(mp_tree_largest_free_order(&t), 5);

  mp_tree_release(&t, 0, 0);
  check_tree(&t, 0);
  cr_assert(mp_tree_is_free(&t, 0, 0), "released block not free");
  cr_assert(mp_tree_is_free(&t, 1, 0), "buddy changed by release");
  cr_assert(!mp_tree_is_free(&t, 0, 6), "release merged (must be lazy)");
  cr_assert_eq(mp_tree_largest_free_order(&t), 5);

  mp_tree_merge(&t, 0, 0);
  check_tree(&t, 0);
  cr_assert(mp_tree_is_free(&t, 0, 6), "merge did not rebuild the root");
  cr_assert(!mp_tree_is_free(&t, 0, 0));
  cr_assert(!mp_tree_is_free(&t, 1, 0));
  cr_assert_eq(mp_tree_largest_free_order(&t), 6);

  /* Merging a block that was already merged away does nothing. */
  mp_tree_merge(&t, 0, 0);
  mp_tree_merge(&t, 1, 0);
  mp_tree_merge(&t, 32, 5);
  assert_decomposition(&t);
  mp_tree_fini(&t);
}

Test(tree, merge_stops_at_busy_buddy) {
  mp_tree t;
  tree_init(&t, 64);
  int64_t a = mp_tree_alloc(&t, 0);
  int64_t b = mp_tree_alloc(&t, 0);
  int64_t c = mp_tree_alloc(&t, 1);
  cr_assert_eq(a, 0);
  cr_assert_eq(b, 1);
  cr_assert_eq(c, 2);
  check_tree(&t, 4);

  mp_tree_free(&t, 0, 0); /* buddy 1 is busy: stays an order-0 block */
  check_tree(&t, 3);
  cr_assert(mp_tree_is_free(&t, 0, 0));
  cr_assert(!mp_tree_is_free(&t, 0, 1));

  mp_tree_free(&t, 1, 0); /* merges into (0,1), stops: (2,1) is busy */
  check_tree(&t, 2);
  cr_assert(mp_tree_is_free(&t, 0, 1));
  cr_assert(!mp_tree_is_free(&t, 0, 0));
  cr_assert(!mp_tree_is_free(&t, 0, 2));

  mp_tree_free(&t, 2, 1); /* now all the way up */
  assert_decomposition(&t);
  mp_tree_fini(&t);
}

Test(tree, merge_never_enters_phantom_tail) {
  /* 48 = 32 + 16: the smallest order with a free block is 4 (16 @ 32), so
   * an order-0 request splits that one, not the 32-unit block. */
  mp_tree t;
  tree_init(&t, 48);
  int64_t a = mp_tree_alloc(&t, 0);
  cr_assert_eq(a, 32, "alloc(0) on a 48-unit tree returned %lld; the "
                      "contract's smallest-order rule says 32",
               (long long)a);
  check_tree(&t, 1);
  cr_assert(mp_tree_is_free(&t, 0, 5), "the 32-unit block was split");
  mp_tree_free(&t, 32, 0);
  check_tree(&t, 0);
  /* Merging stops at (32, order 4): its buddy (48..63) does not exist. */
  cr_assert(mp_tree_is_free(&t, 32, 4));
  cr_assert(!mp_tree_is_free(&t, 32, 5));
  cr_assert(!mp_tree_is_free(&t, 0, 6));
  assert_decomposition(&t);
  mp_tree_fini(&t);
}

Test(tree, coalesce_all_after_release_only) {
  mp_tree t;
  tree_init(&t, 1000);
  blk held[1000];
  size_t nh = 0;
  uint64_t units = 0;
  mpt_rng r = mpt_rng_seed(7);
  for (;;) {
    unsigned o = (unsigned)mpt_below(&r, 4);
    int64_t off = mp_tree_alloc(&t, o);
    if (off < 0) {
      if (o == 0)
        break;
      continue;
    }
    held[nh].off = (uint64_t)off;
    held[nh].order = o;
    nh++;
    units += (uint64_t)1 << o;
  }
  check_tree(&t, units);
  mpt_shuffle(&r, held, nh, sizeof held[0]);
  for (size_t i = 0; i < nh; i++)
    mp_tree_release(&t, held[i].off, held[i].order);
  check_tree(&t, 0);
  /* Nothing merged yet: every released block is still free at its own
   * order. */
  for (size_t i = 0; i < nh; i++)
    cr_assert(mp_tree_is_free(&t, held[i].off, held[i].order));
  mp_tree_coalesce_all(&t);
  assert_decomposition(&t);
  mp_tree_fini(&t);
}

/* ------------------------------------------------------------------ */
/* non-power-of-two trees never hand out blocks past nunits           */
/* ------------------------------------------------------------------ */

Test(tree, never_past_nunits) {
  static const uint64_t ns[] = {3, 5, 7, 48, 63, 65, 1000, 4097, 100000};
  for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
    uint64_t n = ns[i];
    for (unsigned o = 0; o <= mpt_floor_log2(n) + 1; o++) {
      mp_tree t;
      tree_init(&t, n);
      uint64_t sz = (uint64_t)1 << o;
      uint64_t count = 0;
      uint64_t *offs = malloc(((size_t)(n >> o) + 1) * sizeof *offs);
      cr_assert_not_null(offs);
      for (;;) {
        int64_t off = mp_tree_alloc(&t, o);
        if (off < 0)
          break;
        cr_assert_eq((uint64_t)off % sz, 0,
                     "n %llu order %u: block at %lld not aligned",
                     (unsigned long long)n, o, (long long)off);
        cr_assert_leq((uint64_t)off + sz, n,
                      "n %llu order %u: block at %lld reaches past nunits",
                      (unsigned long long)n, o, (long long)off);
        cr_assert_lt(count, n >> o, "n %llu order %u: too many blocks",
                     (unsigned long long)n, o);
        offs[count++] = (uint64_t)off;
        if (n <= CHECK_EVERY_STEP_MAX)
          check_tree(&t, count * sz);
      }
      /* Every aligned slot that fits is handed out exactly once. */
      cr_assert_eq(count, n >> o, "n %llu order %u: %llu blocks, expected %llu",
                   (unsigned long long)n, o, (unsigned long long)count,
                   (unsigned long long)(n >> o));
      check_tree(&t, count * sz);
      for (uint64_t k = 0; k < count; k++)
        mp_tree_free(&t, offs[k], o);
      mp_tree_coalesce_all(&t);
      assert_decomposition(&t);
      free(offs);
      mp_tree_fini(&t);
    }
  }
}

/* ------------------------------------------------------------------ */
/* multi-threaded: 4 threads, one tree, ownership checked per unit    */
/* ------------------------------------------------------------------ */

#define MT_THREADS 4
#define MT_HELD 64
#define MT_MERGE_Q 16
#define MT_MAX_ORDER 6

#if MPT_ASAN
#define MT_ITERS 150000
#else
#define MT_ITERS 1000000
#endif

typedef struct mt_shared {
  mp_tree *t;
  _Atomic unsigned char *owner; /* per unit: 1 while someone holds it */
  _Atomic long errors;
  _Atomic long allocs;
  char first_error[160];
  _Atomic int first_error_taken;
} mt_shared;

typedef struct mt_arg {
  mt_shared *sh;
  unsigned id;
} mt_arg;

static void mt_error(mt_shared *sh, const char *what, uint64_t unit,
                     unsigned o) {
  atomic_fetch_add_explicit(&sh->errors, 1, memory_order_relaxed);
  int expect = 0;
  /* Only the first reporter writes first_error; it is read after join. */
  if (atomic_compare_exchange_strong(&sh->first_error_taken, &expect, 1))
    snprintf(sh->first_error, sizeof sh->first_error,
             "%s (unit %llu, order %u)", what, (unsigned long long)unit, o);
}

static void mt_take(mt_shared *sh, uint64_t off, unsigned o) {
  uint64_t n = sh->t->nunits;
  uint64_t sz = (uint64_t)1 << o;
  if (off % sz != 0)
    mt_error(sh, "unaligned block", off, o);
  if (off + sz > n) {
    mt_error(sh, "block past nunits", off, o);
    return;
  }
  for (uint64_t u = off; u < off + sz; u++)
    if (atomic_fetch_add_explicit(&sh->owner[u], 1, memory_order_acq_rel) != 0)
      mt_error(sh, "unit handed out twice", u, o);
}

static void mt_give(mt_shared *sh, uint64_t off, unsigned o) {
  uint64_t sz = (uint64_t)1 << o;
  if (off + sz > sh->t->nunits)
    return;
  for (uint64_t u = off; u < off + sz; u++)
    if (atomic_exchange_explicit(&sh->owner[u], 0, memory_order_acq_rel) != 1)
      mt_error(sh, "unit ownership lost", u, o);
}

static void *mt_worker(void *p) {
  mt_arg *a = p;
  mt_shared *sh = a->sh;
  mp_tree *t = sh->t;
  mpt_rng r = mpt_rng_seed(1000 + a->id);
  blk held[MT_HELD];
  blk mq[MT_MERGE_Q];
  size_t nheld = 0, nmq = 0;
  long allocs = 0;

  for (long it = 0; it < MT_ITERS; it++) {
    uint64_t x = mpt_next(&r);
    if (nheld < MT_HELD && (nheld == 0 || (x & 1))) {
      unsigned o = (unsigned)((x >> 8) % (MT_MAX_ORDER + 1));
      int64_t off = mp_tree_alloc(t, o);
      if (off >= 0) {
        mt_take(sh, (uint64_t)off, o);
        held[nheld].off = (uint64_t)off;
        held[nheld].order = o;
        nheld++;
        allocs++;
      }
    } else {
      size_t i = (size_t)((x >> 16) % nheld);
      blk b = held[i];
      held[i] = held[--nheld];
      mt_give(sh, b.off, b.order);
      switch ((x >> 40) % 3) {
      case 0:
        mp_tree_free(t, b.off, b.order);
        break;
      case 1:
        mp_tree_release(t, b.off, b.order);
        break;
      default:
        /* Released now, merged later, by which time someone may have
         * reclaimed or merged it: the contract says merge then does
         * nothing harmful. */
        mp_tree_release(t, b.off, b.order);
        mq[nmq++] = b;
        break;
      }
    }
    if (nmq == MT_MERGE_Q) {
      for (size_t k = 0; k < nmq; k++)
        mp_tree_merge(t, mq[k].off, mq[k].order);
      nmq = 0;
    }
    if (a->id == 0 && it % 5000 == 4999)
      mp_tree_coalesce_all(t);
  }
  for (size_t i = 0; i < nheld; i++) {
    mt_give(sh, held[i].off, held[i].order);
    mp_tree_free(t, held[i].off, held[i].order);
  }
  for (size_t k = 0; k < nmq; k++)
    mp_tree_merge(t, mq[k].off, mq[k].order);
  atomic_fetch_add_explicit(&sh->allocs, allocs, memory_order_relaxed);
  return NULL;
}

static void mt_run(uint64_t n) {
  mp_tree t;
  tree_init(&t, n);
  mt_shared sh;
  memset(&sh, 0, sizeof sh);
  sh.t = &t;
  sh.owner = calloc((size_t)n, sizeof *sh.owner);
  cr_assert_not_null(sh.owner);
  atomic_init(&sh.errors, 0);
  atomic_init(&sh.allocs, 0);
  atomic_init(&sh.first_error_taken, 0);

  pthread_t th[MT_THREADS];
  mt_arg args[MT_THREADS];
  for (unsigned i = 0; i < MT_THREADS; i++) {
    args[i].sh = &sh;
    args[i].id = i;
    cr_assert_eq(pthread_create(&th[i], NULL, mt_worker, &args[i]), 0);
  }
  for (unsigned i = 0; i < MT_THREADS; i++)
    pthread_join(th[i], NULL);

  long errors = atomic_load(&sh.errors);
  cr_assert_eq(errors, 0, "%ld ownership errors; first: %s", errors,
               sh.first_error);
  cr_assert_gt(atomic_load(&sh.allocs), 0, "no allocation ever succeeded");
  for (uint64_t u = 0; u < n; u++)
    cr_assert_eq(atomic_load(&sh.owner[u]), 0);
  check_tree(&t, 0);
  mp_tree_coalesce_all(&t);
  assert_decomposition(&t);
  free((void *)sh.owner);
  mp_tree_fini(&t);
}

Test(tree_mt, four_threads_pow2, .timeout = 300) { mt_run(4096); }
Test(tree_mt, four_threads_non_pow2, .timeout = 300) { mt_run(3000); }
/* Small tree: heavy contention on the same words. */
Test(tree_mt, four_threads_tiny, .timeout = 300) { mt_run(200); }
