/* runs_bits.h - what runs.c (the free runs, placement) and runs_fence.c
 * (fences: tags, unfence, retire) share: the lock, the free runs' lists
 * and the fence bitmaps' helpers, all under the lock.  Private to those
 * two files; the others include runs.h.  Data and invariants: types.h
 * (mp_runs), runs.h. */
#ifndef MAGPOOL_RUNS_BITS_H
#define MAGPOOL_RUNS_BITS_H

#include "runs.h"

#include <sched.h>

#define NIL UINT32_MAX

/* The lock (mp_word_trylock): every section is a few list operations
 * or a bounded scan, and calls nothing. */
static inline void runs_lock(mp_runs *r) {
  for (unsigned spins = 0; !mp_word_trylock(&r->lock); spins++)
    if (spins >= 64) sched_yield();
}
static inline void runs_unlock(mp_runs *r) { mp_word_unlock(&r->lock); }

/* The free runs' lists, by length (bin_of), under the lock. */
static inline uint32_t bin_of(uint32_t len) { return len < MP_RUN_BINS ? len : 0; }

static inline void list_push(mp_runs *r, uint32_t s, uint32_t len) {
  uint32_t b = bin_of(len);
  r->head[s] = len;
  r->tail[s + len - 1] = len;
  r->prev[s] = NIL;
  r->next[s] = r->bin[b];
  if (r->bin[b] != NIL) r->prev[r->bin[b]] = s;
  r->bin[b] = s;
  r->full[b / 64] |= (uint64_t)1 << (b % 64);
  r->free_chunks += len;
}

static inline void list_remove(mp_runs *r, uint32_t s) {
  uint32_t len = r->head[s];
  uint32_t b = bin_of(len);
  if (r->prev[s] != NIL) r->next[r->prev[s]] = r->next[s];
  else if ((r->bin[b] = r->next[s]) == NIL) r->full[b / 64] &= ~((uint64_t)1 << (b % 64));
  if (r->next[s] != NIL) r->prev[r->next[s]] = r->prev[s];
  r->head[s] = 0;
  r->tail[s + len - 1] = 0;
  r->free_chunks -= len;
}

/* [s, s + m) joins the free runs, coalescing with its neighbours. */
static inline void insert(mp_runs *r, uint32_t s, uint32_t m) {
  uint32_t start = s, len = m;
  if (s > 0 && r->tail[s - 1] != 0) { /* coalesce with the run before */
    start = s - r->tail[s - 1];
    len += r->tail[s - 1];
    list_remove(r, start);
  }
  if (s + m < r->n && r->head[s + m] != 0) { /* and the one after */
    len += r->head[s + m];
    list_remove(r, s + m);
  }
  list_push(r, start, len);
}

static inline bool bit(const uint64_t *w, uint32_t k) { return w[k / 64] >> (k % 64) & 1; }
static inline bool fbit(const mp_runs *r, uint32_t k) { return bit(r->fbits, k); }
static inline bool rbit(const mp_runs *r, uint32_t k) { return bit(r->rbits, k); }
static inline void bit_set(uint64_t *w, uint32_t k, bool on) {
  w[k / 64] = on ? w[k / 64] | (uint64_t)1 << (k % 64) : w[k / 64] & ~((uint64_t)1 << (k % 64));
}
/* Adds k (wrapping: -k subtracts) to a counter only the lock holder writes. */
static inline void count_add(_Atomic uint64_t *n, uint64_t k) {
  mp_store_relaxed(n, mp_load_relaxed(n) + k);
}
static inline void count(_Atomic uint64_t *n, bool up) { count_add(n, up ? 1 : (uint64_t)-1); }
/* `sole` for a chunk of owner o about to join fbits: a hint that lets
 * a take by the only owner of fenced chunks skip looking for others'. */
static inline void sole_put(mp_runs *r, uint64_t o) {
  if (mp_load_relaxed(&r->nfenced) == 0) r->sole = o;
  else if (r->sole != o) r->sole = 0;
}
/* Chunk k in or out of fbits (nretired follows if its batch is retired). */
static inline void fbit_put(mp_runs *r, uint32_t k, bool on) {
  if (on) sole_put(r, r->owner[k]);
  bit_set(r->fbits, k, on);
  count(&r->nfenced, on);
  if (rbit(r, k)) count(&r->nretired, on);
}
/* The bits of word wi that lie in [a, b). */
static inline uint64_t word_mask(uint32_t a, uint32_t b, uint32_t wi) {
  uint64_t lo = (uint64_t)wi * 64, m = ~(uint64_t)0;
  if (a > lo) m &= ~(uint64_t)0 << (a - lo);
  if (b < lo + 64) m &= ~(uint64_t)0 >> (lo + 64 - b);
  return m;
}

/* Clears bits [a, b) of w, a word at a time; *n += how many were set,
 * *both += how many of those are also set in `other`. */
static inline void bits_clear(uint64_t *w, const uint64_t *other, uint32_t a, uint32_t b, uint64_t *n,
                              uint64_t *both) {
  for (uint32_t wi = a / 64; wi <= (b - 1) / 64; wi++) {
    uint64_t f = w[wi] & word_mask(a, b, wi);
    if (f == 0) continue; /* the common case: nothing fenced or retired */
    w[wi] &= ~f;
    *n += (uint64_t)mp_popcount64(f);
    *both += (uint64_t)mp_popcount64(f & other[wi]);
  }
}

/* Chunk k's batch retired (on) or the chunk out of any batch (off). */
static inline void rbit_put(mp_runs *r, uint32_t k, bool on) {
  if (rbit(r, k) == on) return;
  bit_set(r->rbits, k, on);
  if (fbit(r, k)) count(&r->nretired, on);
}

#endif /* MAGPOOL_RUNS_BITS_H */
