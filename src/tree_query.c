/* tree_query.c - read-only questions about ranges of the buddy tree
 * (tree.h): a free block of an order or more inside a range, the mask of
 * a range's free granules, whether any free block overlaps a range, and
 * whether one block is free.  Layer 2, beside tree.c, which alone writes
 * the bitmaps.  Every answer is a hint taken from bitmap words read one
 * by one while other threads claim and free: a claim's CAS (tree.c)
 * decides, and the checkers that use mp_tree_any_free run quiescent. */
#include "tree.h"

int64_t mp_tree_find_in(const mp_tree *t, uint64_t lo, unsigned span, unsigned order) {
  for (unsigned p = order; p < span && p <= t->top; p++) {
    uint64_t nb = (uint64_t)1 << (span - p), i = lo >> p;
    if (nb > 64) continue; /* finer than a word: not looked at */
    uint64_t mask = nb == 64 ? ~(uint64_t)0 : ((((uint64_t)1 << nb) - 1) << (i % 64));
    /* ACQUIRE, as every first read before a claim: only a candidate,
     * which mp_tree_claim_at's CAS validates. */
    uint64_t w = mp_load_acquire(&t->level[p].layer[0][i / 64]) & mask;
    if (w != 0) return (int64_t)(((i / 64) * 64 + mp_ctz64(w)) << p);
  }
  return -1;
}

/* Sets granules [from, from + n) of mask m: n a power of two, from a
 * multiple of it. */
static inline void mask_set(uint64_t *m, uint64_t from, uint64_t n) {
  if (n >= 64)
    for (uint64_t k = from / 64; k < (from + n) / 64; k++) m[k] = ~(uint64_t)0;
  else
    m[from / 64] |= (((uint64_t)1 << n) - 1) << (from % 64);
}

/* Bit i of x (i < 32) to bits 2i and 2i + 1. */
static inline uint64_t spread2(uint64_t x) {
  x &= 0xffffffffu;
  x = (x | x << 16) & 0x0000ffff0000ffffull;
  x = (x | x << 8) & 0x00ff00ff00ff00ffull;
  x = (x | x << 4) & 0x0f0f0f0f0f0f0f0full;
  x = (x | x << 2) & 0x3333333333333333ull;
  x = (x | x << 1) & 0x5555555555555555ull;
  return x | x << 1;
}

/* ORs into m the granules of the free blocks of order g + d that the
 * bits of w stand for, the first at block `first` of the range. */
static void mask_add(uint64_t *m, uint64_t w, uint64_t first, unsigned d) {
  uint64_t per = (uint64_t)1 << d; /* granules a block spans */
  if (d == 0) { /* the granules themselves: first is a multiple of 64 */
    m[first / 64] |= w;
  } else if (d <= 2) { /* 64 / per blocks to a word of m, spread */
    for (uint64_t q = first * per; w != 0; q += 64, w >>= 64 / per) {
      uint64_t x = spread2(w);
      m[q / 64] |= d == 1 ? x : spread2(x);
    }
  } else {
    for (; w != 0; w &= w - 1) mask_set(m, (first + mp_ctz64(w)) * per, per);
  }
}

void mp_tree_free_mask(const mp_tree *t, uint64_t lo, unsigned span, unsigned g, uint64_t *m) {
  unsigned nw = span - g > 6 ? 1u << (span - g - 6) : 1;
  for (unsigned k = 0; k < nw; k++) m[k] = 0;
  for (unsigned p = g; p < span && p <= t->top; p++) {
    /* lo is aligned to 2^span: the range's 2^lb blocks of order p start
     * at a multiple of 2^lb, whole words of the level when lb >= 6.
     * Relaxed reads: a hint, which mp_tree_claim_at's CAS validates. */
    unsigned lb = span - p;
    uint64_t i0 = lo >> p;
    const _Atomic uint64_t *lw = t->level[p].layer[0] + i0 / 64;
    if (lb >= 6) {
      for (uint64_t k = 0; k < ((uint64_t)1 << (lb - 6)); k++) {
        uint64_t w = mp_load_relaxed(&lw[k]);
        if (w != 0) mask_add(m, w, k * 64, p - g);
      }
    } else {
      uint64_t w = (mp_load_relaxed(lw) >> (i0 % 64)) & (((uint64_t)1 << (1u << lb)) - 1);
      if (w != 0) mask_add(m, w, 0, p - g);
    }
  }
}

bool mp_tree_any_free(const mp_tree *t, uint64_t off, uint64_t n) {
  for (unsigned o = 0; o <= t->top && n != 0; o++) {
    uint64_t i = off >> o, last = (off + n - 1) >> o; /* blocks of order o overlapping */
    for (uint64_t wi = i / 64; wi <= last / 64; wi++) {
      uint64_t w = mp_load_acquire(&t->level[o].layer[0][wi]);
      if (wi == i / 64) w &= ~(uint64_t)0 << (i % 64);
      if (wi == last / 64 && last % 64 != 63) w &= ((uint64_t)1 << (last % 64 + 1)) - 1;
      if (w != 0) return true;
    }
  }
  return false;
}

bool mp_tree_is_free(const mp_tree *t, uint64_t off, unsigned order) {
  if (order > t->top) return false;
  uint64_t i = off >> order;
  uint64_t w = mp_load_acquire(&t->level[order].layer[0][i / 64]);
  return (w >> (i % 64)) & 1;
}
