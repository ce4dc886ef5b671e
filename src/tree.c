/* tree.c - the lock-free buddy tree.
 *
 * See tree.h for the data layout and invariants I1-I4.  Layer 2; it
 * knows units only, and calls nothing of magpool's.  This file is the
 * only writer of the bitmaps.  The memory-ordering argument, in one place:
 *
 * (a) Handing a block from its freer to its next owner.  Every change of a
 *     free bit is an atomic RMW, acq_rel or stronger, on the bitmap word.  A
 *     free sets the bit (RELEASE); a claim clears it with a CAS (ACQUIRE).
 *     A merge claims a pair (ACQUIRE) and sets the parent's bit (RELEASE);
 *     a split claims the parent (ACQUIRE) and sets the halves (RELEASE).  So
 *     along any chain free -> merge/split* -> claim, each step synchronises
 *     with the previous one, and the freer's writes to the block happen
 *     before the claimer's.  Without it a claimer could see stale contents
 *     (and TSan would report the hand-over of user memory).
 *
 * (b) Summaries never hide a free block for good.  Rule: whoever makes a
 *     word go from zero to nonzero sets its summary bit afterwards (summary
 *     set, an RMW); whoever clears a summary bit re-reads the word
 *     afterwards and, if it is nonzero, sets the bit again.  The summary
 *     word's RMWs are totally ordered: either the setter's OR comes after
 *     the clear (bit ends set), or it comes before, and then the clearer's
 *     RMW (acquire) synchronises with the setter's (release), which was
 *     sequenced after the setter's write of the word, so the re-read sees
 *     the word nonzero and restores the bit.  Each layer of the 64-ary
 *     hierarchy applies the same rule to the layer below it.
 *
 * (c) Setting skips a summary bit that is already set, and claims leave
 *     the bit of a word they empty set: on the hot path a summary line is
 *     then only read.  The skip is a store-buffer pattern (setter: RMW the
 *     word, then load the summary, in summary_set; clearer: RMW the
 *     summary, then load the word, in summary_clear), so those four
 *     accesses, and every RMW of a bitmap or summary word, are seq_cst: in
 *     the one total order, a setter whose load saw the bit came before the
 *     clear, and the clearer's re-read comes after the setter's RMW of the
 *     word.  On x86 a seq_cst RMW is the same locked instruction as
 *     acq_rel, and a seq_cst load a plain load.
 *     The other loads are ACQUIRE, and take no part in that argument:
 *       - level_find_word's summary reads and the first read of a word in
 *         level_claim and mp_tree_merge only pick a candidate; the seq_cst
 *         CAS that follows re-validates it (a stale read costs a retry or
 *         a restart, never a wrong claim);
 *       - mp_tree_coalesce_all's scan only proposes pairs to
 *         mp_tree_merge, which claims them with a CAS;
 *       - level_any_below and tree_query.c's mp_tree_is_free,
 *         mp_tree_find_in and mp_tree_any_free are queries whose answer is
 *         a snapshot by contract (exact only on a quiescent tree).
 *     Acquire there (rather than relaxed) keeps a reader that acts on a
 *     set bit ordered after the release that set it.  mp_tree_free_mask
 *     (tree_query.c) reads relaxed: its mask is only a hint of where to
 *     try mp_tree_claim_at, whose CAS orders what the claimer reads.
 *
 * (d) No double claim.  A claim is a CAS that clears one set bit; two
 *     claimers of one bit cannot both succeed.  A pair merge is a CAS that
 *     clears both bits of one word at once, so it cannot race a claim of
 *     either half.  ABA on a word is harmless: the CAS only asks "is this
 *     bit set now", never "is this the same block as before".
 */
#include "tree.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* --------------------------------------------------------------- layout -- */

int mp_tree_init(mp_tree *t, uint64_t nunits) {
  if (t == NULL || nunits == 0) return MAGPOOL_EINVAL;
  memset(t, 0, sizeof *t);
  unsigned top = mp_log2_ceil(nunits);
  if (top > MP_MAX_ORDER) return MAGPOOL_EINVAL;
  t->nunits = nunits;
  t->top = top;

  /* Size every layer of every level, then carve them from one mapping. */
  uint64_t total_words = 0;
  for (unsigned o = 0; o <= top; o++) {
    mp_level *lv = &t->level[o];
    uint64_t bits = (uint64_t)1 << (top - o);
    uint64_t words = (bits + 63) / 64;
    unsigned L = 0;
    for (;;) {
      if (L >= MP_TREE_MAX_LAYERS) return MAGPOOL_EINVAL;
      lv->nwords[L] = words;
      total_words += words;
      L++;
      if (words == 1) break;
      words = (words + 63) / 64;
    }
    lv->nlayers = L;
  }
  size_t bytes = (size_t)total_words * sizeof(uint64_t);
  void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) return MAGPOOL_ENOMEM;
  t->mem = mem;
  t->mem_bytes = bytes;
  _Atomic uint64_t *w = mem; /* mmap gives zeroed pages: all bits clear */
  for (unsigned o = 0; o <= top; o++) {
    mp_level *lv = &t->level[o];
    for (unsigned L = 0; L < lv->nlayers; L++) {
      lv->layer[L] = w;
      w += lv->nwords[L];
    }
  }

  /* Initially free: the binary decomposition of nunits, largest first. */
  uint64_t off = 0;
  for (int o = (int)top; o >= 0; o--) {
    uint64_t sz = (uint64_t)1 << o;
    if (nunits & sz) {
      mp_tree_release(t, off, (unsigned)o);
      off += sz;
    }
  }
  return 0;
}

void mp_tree_fini(mp_tree *t) {
  if (t != NULL && t->mem != NULL) munmap(t->mem, t->mem_bytes);
  if (t != NULL) memset(t, 0, sizeof *t);
}

/* ------------------------------------------------------------ summaries -- */

/* Word c of layer L-1 became nonzero: set its bit in layer L, and upwards
 * while a summary word goes from zero to nonzero.  See (b). */
static void summary_set(mp_level *lv, unsigned L, uint64_t c) {
  for (; L < lv->nlayers; L++, c /= 64) {
    uint64_t bit = (uint64_t)1 << (c % 64);
    _Atomic uint64_t *sw = &lv->layer[L][c / 64];
    /* Already set: nothing to do, and no write to a line every thread
     * reads.  SEQ_CST (with the RMW on word c before it, and with
     * summary_clear's clear and re-read): if this load sees the bit, it
     * comes before any clear of it in the single total order, so that
     * clearer's re-read sees word c nonzero and restores the bit (c). */
    if (mp_load_seq_cst(sw) & bit) return;
    uint64_t old = mp_fetch_or_seq_cst(sw, bit);
    if (old != 0) return; /* word was nonzero: its own bit is handled */
  }
}

/* Word c of layer L-1 was seen empty: clear its bit in layer L, re-check,
 * and continue upwards while summary words become empty.  See (b). */
static void summary_clear(mp_level *lv, unsigned L, uint64_t c) {
  for (; L < lv->nlayers; L++, c /= 64) {
    uint64_t bit = (uint64_t)1 << (c % 64);
    _Atomic uint64_t *sw = &lv->layer[L][c / 64];
    /* SEQ_CST: pairs with summary_set (b, c). */
    uint64_t old = mp_fetch_and_seq_cst(sw, ~bit);
    if (mp_load_seq_cst(&lv->layer[L - 1][c]) != 0) {
      /* The word refilled in between: restore its bit (and above). */
      summary_set(lv, L, c);
      return;
    }
    if ((old & ~bit) != 0) return; /* summary word still nonzero */
  }
}

/* ------------------------------------------------------------ bit level -- */

/* Sets bit i of level o's free bitmap: block (o, i) becomes free. */
static void level_set(mp_level *lv, uint64_t i) {
  uint64_t bit = (uint64_t)1 << (i % 64);
  /* The RELEASE half of this seq_cst RMW: the freer's writes to the block
   * happen before the claim that reads this bit (a). */
  uint64_t old = mp_fetch_or_seq_cst(&lv->layer[0][i / 64], bit);
  mp_assert((old & bit) == 0); /* double release */
  if (old == 0) summary_set(lv, 1, i / 64);
}

/* Finds the lowest word index of layer 0 that the summaries say is nonzero,
 * fixing stale summary bits on the way.  -1 if the level looks empty. */
static int64_t level_find_word(mp_level *lv) {
  unsigned top = lv->nlayers - 1;
restart:;
  uint64_t idx = 0;
  for (unsigned L = top; L >= 1; L--) {
    uint64_t w = mp_load_acquire(&lv->layer[L][idx]);
    if (w == 0) {
      if (L == top) return -1;
      /* Stale bit in layer L+1 pointing at this empty word. */
      summary_clear(lv, L + 1, idx);
      goto restart;
    }
    idx = idx * 64 + mp_ctz64(w);
  }
  return (int64_t)idx;
}

/* Claims the lowest free block of one level.  Returns its index or -1. */
static int64_t level_claim(mp_level *lv) {
  for (;;) {
    int64_t wi = level_find_word(lv);
    if (wi < 0) return -1;
    _Atomic uint64_t *wp = &lv->layer[0][wi];
    uint64_t w = mp_load_acquire(wp);
    while (w != 0) {
      uint64_t bit = w & (~w + 1); /* lowest set bit: lowest address */
      /* ACQUIRE on success: synchronises with the release that set the
       * bit (a).  On failure w is reloaded and we try the new lowest. */
      if (mp_cas_weak_seq_cst(wp, &w, w & ~bit)) {
        /* Emptying the word leaves its summary bit set (a stale hint, I3
         * allows it): the next free into the word then finds the bit set
         * and writes no summary line.  A finder that meets the empty
         * word clears the bit. */
        return wi * 64 + mp_ctz64(bit);
      }
    }
    /* The word emptied under us: fix its summary and search again. */
    if (lv->nlayers > 1) summary_clear(lv, 1, (uint64_t)wi);
    else return -1;
  }
}

/* ------------------------------------------------------------ tree ops --- */

int64_t mp_tree_alloc(mp_tree *t, unsigned order) {
  if (order > t->top) return -1;
  for (unsigned p = order; p <= t->top; p++) {
    int64_t idx = level_claim(&t->level[p]);
    if (idx < 0) continue;
    uint64_t off = (uint64_t)idx << p;
    /* Split down: keep the lowest part, free the upper halves. */
    for (unsigned q = p; q > order; q--) {
      uint64_t half = off + ((uint64_t)1 << (q - 1));
      level_set(&t->level[q - 1], half >> (q - 1));
    }
    return (int64_t)off;
  }
  return -1;
}

int64_t mp_tree_claim_at(mp_tree *t, uint64_t off, unsigned order) {
  if (order > t->top || (off & (((uint64_t)1 << order) - 1)) != 0 || off >= t->nunits) return -1;
  for (unsigned p = order; p <= t->top; p++) {
    uint64_t i = off >> p, bit = (uint64_t)1 << (i % 64);
    _Atomic uint64_t *wp = &t->level[p].layer[0][i / 64];
    uint64_t w = mp_load_acquire(wp);
    while (w & bit) {
      /* ACQUIRE on success, as in level_claim (a). */
      if (mp_cas_weak_seq_cst(wp, &w, w & ~bit)) {
        /* Split down towards off: free the halves off is not in. */
        uint64_t base = i << p;
        for (unsigned q = p; q > order; q--) {
          uint64_t half = (uint64_t)1 << (q - 1);
          if (off >= base + half) {
            level_set(&t->level[q - 1], base >> (q - 1));
            base += half;
          } else {
            level_set(&t->level[q - 1], (base + half) >> (q - 1));
          }
        }
        return (int64_t)off;
      }
    }
  }
  return -1;
}

void mp_tree_release(mp_tree *t, uint64_t off, unsigned order) {
  level_set(&t->level[order], off >> order);
}

void mp_tree_merge(mp_tree *t, uint64_t off, unsigned order) {
  for (unsigned o = order; o < t->top; o++) {
    mp_level *lv = &t->level[o];
    uint64_t i = off >> o;
    uint64_t pair = (uint64_t)3 << ((i & ~(uint64_t)1) % 64);
    _Atomic uint64_t *wp = &lv->layer[0][i / 64];
    uint64_t w = mp_load_acquire(wp);
    for (;;) {
      if ((w & pair) != pair) return; /* buddy (or this block) not free */
      /* ACQUIRE: we now own both halves (a, d). */
      if (mp_cas_weak_seq_cst(wp, &w, w & ~pair)) break;
    }
    /* As in level_claim, an emptied word keeps its summary bit. */
    off &= ~(((uint64_t)2 << o) - 1);
    /* RELEASE (in level_set): publish the parent. */
    level_set(&t->level[o + 1], off >> (o + 1));
  }
}

void mp_tree_free(mp_tree *t, uint64_t off, unsigned order) {
  mp_tree_release(t, off, order);
  mp_tree_merge(t, off, order);
}

/* Calls fn(arg, wi, w) for every nonzero word wi of layer 0, found
 * through the summaries from word c of layer L down: a tree over a large
 * address range is mostly zero words (untouched pages), which cost
 * nothing.  A word whose summary bit is clear for a moment (a concurrent
 * clear before its re-read, tree.c (b)) may be missed; on a quiescent
 * tree (I3) none is. */
static void walk_words(const mp_level *lv, unsigned L, uint64_t c,
                       void (*fn)(void *arg, uint64_t wi, uint64_t w), void *arg) {
  uint64_t w = mp_load_acquire(&lv->layer[L][c]);
  if (L == 0) {
    if (w != 0) fn(arg, c, w);
    return;
  }
  while (w != 0) {
    uint64_t below = c * 64 + mp_ctz64(w);
    w &= w - 1;
    if (below < lv->nwords[L - 1]) walk_words(lv, L - 1, below, fn, arg);
  }
}

typedef struct coalesce_arg {
  mp_tree *t;
  unsigned o;
} coalesce_arg;

static void coalesce_word(void *arg, uint64_t wi, uint64_t w) {
  coalesce_arg *a = arg;
  /* Even bits whose odd neighbour is also set. */
  uint64_t pairs = w & (w >> 1) & 0x5555555555555555ull;
  while (pairs != 0) {
    unsigned b = mp_ctz64(pairs);
    pairs &= pairs - 1;
    mp_tree_merge(a->t, (wi * 64 + b) << a->o, a->o);
  }
}

void mp_tree_coalesce_all(mp_tree *t) {
  for (unsigned o = 0; o < t->top; o++) {
    mp_level *lv = &t->level[o];
    coalesce_arg a = {t, o};
    walk_words(lv, lv->nlayers - 1, 0, coalesce_word, &a);
  }
}

/* ------------------------------------------------------------- queries --- */

static void count_word(void *arg, uint64_t wi, uint64_t w) {
  (void)wi;
  *(uint64_t *)arg += (uint64_t)mp_popcount64(w);
}

uint64_t mp_tree_free_units(const mp_tree *t) {
  uint64_t units = 0;
  for (unsigned o = 0; o <= t->top; o++) {
    const mp_level *lv = &t->level[o];
    uint64_t bits = 0;
    walk_words(lv, lv->nlayers - 1, 0, count_word, &bits);
    units += bits << o;
  }
  return units;
}

/* Depth-first walk of the summaries: is any bit of layer 0 below word idx
 * of layer L set?  Follows set summary bits only, so stale bits cost a
 * probe each and empty subtrees cost nothing. */
static bool level_any_below(const mp_level *lv, unsigned L, uint64_t idx) {
  uint64_t w = mp_load_acquire(&lv->layer[L][idx]);
  if (L == 0) return w != 0;
  while (w != 0) {
    unsigned b = mp_ctz64(w);
    w &= w - 1;
    if (level_any_below(lv, L - 1, idx * 64 + b)) return true;
  }
  return false;
}

int mp_tree_largest_free_order(const mp_tree *t) {
  for (int o = (int)t->top; o >= 0; o--) {
    const mp_level *lv = &t->level[o];
    if (level_any_below(lv, lv->nlayers - 1, 0)) return o;
  }
  return -1;
}

/* ---------------------------------------------------------------- check -- */

/* Levels with at most this many bitmap words are scanned word by word,
 * with I3 checked on every word; larger ones (trees over a large address
 * range, mostly untouched zero pages) are walked through their summaries.
 * There a nonzero word under a clear summary bit is not seen, so its
 * free units go uncounted: the caller's I4 balance then fails, which is
 * how such an I3 break shows. */
#define MP_CHECK_SCAN_WORDS 65536

typedef struct check_ctx {
  const mp_tree *t;
  unsigned o;
  uint64_t units;
  int rc;
} check_ctx;

/* One free block (level o, index i): I2, and I1 as "no ancestor free"
 * (two aligned buddy blocks overlap only if one contains the other). */
static void check_block(check_ctx *k, uint64_t i) {
  const mp_tree *t = k->t;
  uint64_t nbits = (uint64_t)1 << (t->top - k->o);
  uint64_t start = i << k->o, len = (uint64_t)1 << k->o;
  if (i >= nbits || start + len > t->nunits) { k->rc = MAGPOOL_EINVAL; return; }
  for (unsigned a = k->o + 1; a <= t->top; a++)
    if (mp_tree_is_free(t, start, a)) { k->rc = MAGPOOL_EINVAL; return; }
  k->units += len;
}

static void check_word(check_ctx *k, uint64_t wi, uint64_t w) {
  while (w != 0 && k->rc == 0) {
    check_block(k, wi * 64 + mp_ctz64(w));
    w &= w - 1;
  }
}

static void check_word_cb(void *arg, uint64_t wi, uint64_t w) { check_word(arg, wi, w); }

int mp_tree_check(const mp_tree *t, uint64_t *free_units) {
  check_ctx k = {t, 0, 0, 0};
  for (unsigned o = 0; o <= t->top && k.rc == 0; o++) {
    const mp_level *lv = &t->level[o];
    k.o = o;
    if (lv->nwords[0] > MP_CHECK_SCAN_WORDS) {
      walk_words(lv, lv->nlayers - 1, 0, check_word_cb, &k);
      continue;
    }
    /* I3: summaries cover nonzero words. */
    for (unsigned L = 1; L < lv->nlayers && k.rc == 0; L++)
      for (uint64_t c = 0; c < lv->nwords[L - 1]; c++)
        if (mp_load_relaxed(&lv->layer[L - 1][c]) != 0 &&
            !((mp_load_relaxed(&lv->layer[L][c / 64]) >> (c % 64)) & 1)) {
          k.rc = MAGPOOL_EINVAL;
          break;
        }
    for (uint64_t wi = 0; wi < lv->nwords[0] && k.rc == 0; wi++)
      check_word(&k, wi, mp_load_relaxed(&lv->layer[0][wi]));
  }
  if (k.rc == 0 && free_units != NULL) *free_units = k.units;
  return k.rc;
}
