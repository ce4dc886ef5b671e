/* runs.c - runs of whole chunks for large blocks.  Layer 2.
 *
 * Blocks of a chunk or more that no cache serves take a run of
 * ceil(size / chunk) chunks in the upper half of the pool's address range
 * (data and invariants: types.h, mp_runs), not a buddy block, which must
 * sit 2^k-aligned where a warm pool's free mapped chunks seldom are.
 * Placement, among the free runs at least as long as the request
 * (best-fit preferring mapped memory, so that a warm pool maps nothing):
 *   - an exactly fitting run whose chunks are all mapped, at once;
 *   - else the window with the most mapped chunks, among a run's start
 *     and the windows that start or end with a row of mapped chunks in
 *     it (as tools/sim's model: a window at a run's ends only made
 *     gpt2_train_small move ~800 chunks a warm pass instead of ~0); ties
 *     go to the shorter run, then the lower address.
 * The long tail of never-used space is one free run like the others, with
 * no mapped chunk: it is taken only when nothing scores higher.
 * One lock, a word (runs_lock): large allocations are rare next to small
 * ones, each a scan of the free runs; a pthread mutex cost 15 % of a warm
 * replay (docs/benchmarks.md).  Fenced free runs (runs.h): a take that may
 * not use a fenced chunk looks at the pieces of a run between such chunks.
 */
#include "runs_bits.h"

#include <stdlib.h>
#include <string.h>

/* Free runs looked at per request, at most (longest lists first). */
#define MP_RUN_SCAN 256

/* The chunk map's mapped bitmap, read without its lock: a hint (a chunk
 * mapped or unmapped meanwhile makes the choice less good; chunk.c maps). */
static inline uint64_t map_word(const mp_chunks *c, uint64_t wi) {
  return mp_load_relaxed(&c->mapped[wi]);
}

/* Mapped chunks in run-space window [s, s + m). */
static uint32_t mapped_in(const mp_chunks *c, uint32_t s, uint32_t m) {
  uint64_t a = c->run0 + s, b = a + m;
  uint32_t k = 0;
  for (uint64_t wi = a / 64; wi <= (b - 1) / 64; wi++) {
    uint64_t w = map_word(c, wi), lo = wi * 64, hi = lo + 64;
    uint64_t from = a > lo ? a : lo, to = b < hi ? b : hi; /* the window's bits here */
    uint64_t in = (~(uint64_t)0 >> (64 - (to - from))) << (from - lo); /* all mapped: no popcount */
    k += (w & in) == in ? (uint32_t)(to - from) : (uint32_t)mp_popcount64(w & in);
  }
  return k;
}

/* The first run-space chunk in [i, end) mapped (set) or not; end if none. */
static uint32_t next_chunk(const mp_chunks *c, uint32_t i, uint32_t end, bool set) {
  uint64_t x = c->run0 + i, e = c->run0 + end;
  while (x < e) {
    uint64_t w = map_word(c, x / 64);
    if (!set) w = ~w;
    w &= ~(uint64_t)0 << (x % 64);
    if (w != 0) {
      x = (x & ~(uint64_t)63) + mp_ctz64(w);
      return x < e ? (uint32_t)(x - c->run0) : end;
    }
    x = (x & ~(uint64_t)63) + 64;
  }
  return end;
}

/* The first bin at or after L with a free run, MP_RUN_BINS if none. */
static uint32_t next_full(const mp_runs *r, uint32_t L) {
  for (uint32_t wi = L / 64; wi < MP_RUN_BINS / 64; wi++) {
    uint64_t w = r->full[wi] & (wi == L / 64 ? ~(uint64_t)0 << (L % 64) : ~(uint64_t)0);
    if (w != 0) return wi * 64 + mp_ctz64(w);
  }
  return MP_RUN_BINS;
}

/* May a take use fenced chunk k of another owner (ad: runs.h)? */
static bool adoptable(const mp_runs *r, uint32_t k, const mp_adopt *ad) {
  for (uint32_t j = 0; ad != NULL && j < ad->n; j++)
    if (r->owner[k] == ad->owner[j])
      return r->tag[k] != MP_TAG_SOLO && (int32_t)(r->tag[k] - ad->tag[j]) <= 0;
  return false;
}

/* The first chunk in [i, end) fenced by another than `owner` (any fenced
 * one if owner is 0) and not adopted; end if none.  Chunks at or above
 * `top` were never mapped, so never fenced. */
static uint32_t next_foreign(const mp_runs *r, uint32_t i, uint32_t end, uint32_t top,
                             uint64_t owner, const mp_adopt *ad) {
  uint32_t e = end < top ? end : top;
  for (uint32_t wi = i / 64; i < e && wi <= (e - 1) / 64; wi++) {
    uint64_t w = r->fbits[wi] & (wi == i / 64 ? ~(uint64_t)0 << (i % 64) : ~(uint64_t)0);
    for (; w != 0; w &= w - 1) {
      uint32_t k = wi * 64 + mp_ctz64(w);
      if (k >= e) return end;
      if ((owner == 0 || r->owner[k] != owner) && !adoptable(r, k, ad)) return k;
    }
  }
  return end;
}

typedef struct pick { uint32_t run, at, score, len; bool found; } pick;

static void window(const mp_chunks *c, pick *b, uint32_t run, uint32_t len, uint32_t m,
                   uint32_t at) {
  uint32_t sc = mapped_in(c, at, m);
  if (!b->found || sc > b->score || (sc == b->score && (len < b->len || (len == b->len && at < b->at))))
    *b = (pick){run, at, sc, len, true};
}

/* Scores the windows of [s, s + len), free run `run` or a piece of it,
 * for m chunks: its start and end, and each window that starts where a
 * row of mapped chunks starts or ends where one ends (clipped to the run).
 * Some window of the most mapped chunks is among them: slide any window
 * until one of its ends meets a row's end; it keeps its mapped chunks. */
static void consider(const magpool_t *pool, pick *b, uint32_t run, uint32_t s, uint32_t len,
                     uint32_t m) {
  const mp_chunks *c = pool->chunks;
  window(c, b, run, len, m, s);
  if (len == m || b->score == m) return;
  window(c, b, run, len, m, s + len - m);
  uint64_t top = mp_load_relaxed(&c->run_top);
  uint32_t end = top <= c->run0 ? 0 : (uint32_t)(top - c->run0);
  if (end > s + len) end = s + len;
  uint32_t last = s + len - m;
  for (uint32_t a = next_chunk(c, s, end, true); a < end && b->score < m;) {
    uint32_t z = next_chunk(c, a, end, false); /* the row is [a, z) */
    window(c, b, run, len, m, a < last ? a : last);
    if (z >= s + m) window(c, b, run, len, m, z - m < last ? z - m : last);
    a = next_chunk(c, z, end, true);
  }
}

/* Free run [s, s + len) for a take of m chunks by `owner`: whole, or
 * piece by piece between the chunks it may not use. */
static void consider_run(const magpool_t *pool, pick *b, uint32_t s, uint32_t len, uint32_t m,
                         uint64_t owner, const mp_adopt *ad) {
  const mp_runs *r = &pool->chunks->runs;
  if (mp_load_relaxed(&r->nfenced) == 0 || (owner != 0 && r->sole == owner)) {
    consider(pool, b, s, s, len, m);
    return;
  }
  uint64_t t = mp_load_relaxed(&pool->chunks->run_top);
  uint32_t top = t <= pool->chunks->run0 ? 0 : (uint32_t)(t - pool->chunks->run0);
  for (uint32_t a = s, end = s + len; a < end && !(b->found && b->score == m);) {
    uint32_t z = next_foreign(r, a, end, top, owner, ad);
    if (z - a >= m) consider(pool, b, s, a, z - a, m);
    a = z + 1;
  }
}

int64_t mp_runs_alloc(magpool_t *pool, uint32_t m, uint64_t owner, const mp_adopt *ad,
                      bool *held) {
  mp_runs *r = &pool->chunks->runs;
  *held = false;
  if (m == 0 || m > r->n) return -1;
  runs_lock(r);
  bool same = mp_load_relaxed(&r->taker) == owner; /* the run of takes by one owner */
  mp_store_relaxed(&r->takes, same ? mp_load_relaxed(&r->takes) + 1 : 1);
  if (!same) mp_store_relaxed(&r->taker, owner);
  uint64_t so = mp_load_relaxed(&r->solo);
  if (MP_UNLIKELY(so != 0 && so != owner)) { /* the caller ends that solo (runs.h) */
    runs_unlock(r);
    return -2;
  }
  pick b = {0, 0, 0, 0, false};
  unsigned looked = 0;
  /* The scan's first pick, the usual warm one, without its calls: the
   * newest free run of exactly m chunks, all mapped, usable whole. */
  uint32_t s0 = m < MP_RUN_BINS ? r->bin[m] : NIL;
  if (s0 != NIL && (mp_load_relaxed(&r->nfenced) == 0 || (owner != 0 && r->sole == owner)) &&
      mapped_in(pool->chunks, s0, m) == m)
    b = (pick){s0, s0, m, m, true}; /* the loops below are then skipped */
  /* By length, shortest first: once a window is all mapped, longer runs
   * cannot beat it. */
  for (uint32_t L = next_full(r, m); L < MP_RUN_BINS && looked < MP_RUN_SCAN &&
                                     !(b.found && b.score == m); L = next_full(r, L + 1))
    for (uint32_t s = r->bin[L]; s != NIL && looked < MP_RUN_SCAN; s = r->next[s], looked++) {
      consider_run(pool, &b, s, L, m, owner, ad);
      if (b.found && b.score == m && b.len == m) goto take; /* an exact fit, all mapped */
    }
  /* The long runs, the unused tail among them, always get a look. */
  if (!(b.found && b.score == m))
    for (uint32_t s = r->bin[0], k = 0; s != NIL && k < MP_RUN_SCAN; s = r->next[s], k++)
      if (r->head[s] >= m) consider_run(pool, &b, s, r->head[s], m, owner, ad);
  if (!b.found) {
    runs_unlock(r);
    return -1;
  }
  if (MP_UNLIKELY(so != 0 && b.score < m)) { /* the solo's own take would map: ends it */
    runs_unlock(r);
    return -2;
  }
take:;
  uint32_t s = b.run, len = r->head[s];
  list_remove(r, s);
  if (b.at > s) list_push(r, s, b.at - s);
  if (b.at + m < s + len) list_push(r, b.at + m, s + len - (b.at + m));
  /* The owner's fenced chunks leave fbits (fbit_put(k, false) each),
   * keeping busy count and tag; the others become busy (rbusy now, the
   * busy counts in mp_chunks_acquire, after the lock). */
  uint64_t own = 0, dret = 0;
  if (so != 0) { /* the solo's own take: its free chunks count busy again (rbusy) */
    uint64_t n = 0, x = 0;
    bits_clear(r->sbits, r->fbits, b.at, b.at + m, &n, &x);
    count_add(&r->nsolo, -n);
    *held = n == m; /* every chunk busy all along: mp_chunks_acquire_held */
  }
  if (mp_load_relaxed(&r->nfenced) != 0) {
    bits_clear(r->fbits, r->rbits, b.at, b.at + m, &own, &dret);
    count_add(&r->nfenced, -own);
    count_add(&r->nretired, -dret);
  }
  count_add(&r->rbusy, m - own);
  runs_unlock(r);
  return (int64_t)b.at;
}

void mp_runs_free(magpool_t *pool, uint32_t s, uint32_t m) {
  mp_runs *r = &pool->chunks->runs;
  runs_lock(r);
  if (r->next_tag != 0) { /* else no tag was ever given: no fence, no bit set */
    memset(&r->tag[s], 0, (size_t)m * sizeof r->tag[0]);
    uint64_t gone = 0, dret = 0; /* rbit_put(k, false) for each */
    bits_clear(r->rbits, r->fbits, s, s + m, &gone, &dret);
    count_add(&r->nretired, -dret);
  }
  insert(r, s, m);
  count_add(&r->rbusy, -(uint64_t)m); /* busy 0 already (give_run) */
  runs_unlock(r);
}

void mp_runs_putback(magpool_t *pool, uint32_t s, uint32_t m) {
  mp_chunks *c = pool->chunks;
  mp_runs *r = &c->runs;
  uint64_t down = 0;
  runs_lock(r);
  for (uint32_t k = s; k < s + m; k++)
    if (r->tag[k] == MP_TAG_SOLO) { /* free solo again, busy kept (its solo is on: runs.h) */
      bit_set(r->sbits, k, true), count(&r->nsolo, true);
      down++;
    } else if (r->tag[k] != 0) { /* a batch's: fenced again */
      fbit_put(r, k, true);
    } else {
      mp_store_release(&c->busy[c->run0 + k], 0);
      down++;
    }
  count_add(&r->rbusy, -down);
  insert(r, s, m);
  runs_unlock(r);
}

int mp_runs_init(magpool_t *pool, uint32_t n) {
  mp_runs *r = &pool->chunks->runs;
  r->n = n;
  r->head = calloc(n, sizeof *r->head);
  r->tail = calloc(n, sizeof *r->tail);
  r->next = calloc(n, sizeof *r->next);
  r->prev = calloc(n, sizeof *r->prev);
  r->tag = calloc(n, sizeof *r->tag);
  r->owner = calloc(n, sizeof *r->owner);
  r->fbits = calloc((n + 63) / 64, sizeof *r->fbits);
  r->rbits = calloc((n + 63) / 64, sizeof *r->rbits);
  r->sbits = calloc((n + 63) / 64, sizeof *r->sbits);
  if (r->head == NULL || r->tail == NULL || r->next == NULL || r->prev == NULL ||
      r->tag == NULL || r->owner == NULL || r->fbits == NULL || r->rbits == NULL ||
      r->sbits == NULL) {
    mp_runs_fini(pool);
    return MAGPOOL_ENOMEM;
  }
  mp_store_relaxed(&r->lock, 0);
  for (unsigned b = 0; b < MP_RUN_BINS; b++) r->bin[b] = NIL;
  for (unsigned w = 0; w < MP_RUN_BINS / 64; w++) r->full[w] = 0;
  r->free_chunks = 0;
  r->next_tag = 0;
  r->sole = 0;
  mp_store_relaxed(&r->solo, 0);
  mp_store_relaxed(&r->nsolo, 0);
  r->solo_lo = r->solo_hi = 0;
  mp_store_relaxed(&r->nfenced, 0);
  mp_store_relaxed(&r->nretired, 0);
  list_push(r, 0, n);
  return 0;
}

void mp_runs_fini(magpool_t *pool) {
  mp_runs *r = &pool->chunks->runs;
  void *v[] = {r->head, r->tail, r->next, r->prev, r->tag, r->owner, r->fbits, r->rbits, r->sbits};
  for (unsigned i = 0; i < sizeof v / sizeof v[0]; i++) free(v[i]);
  r->head = r->tail = r->next = r->prev = r->tag = NULL;
  r->owner = r->fbits = r->rbits = r->sbits = NULL;
}

/* Free runs against the blocks out: each run space chunk is in exactly
 * one free run or one live extent (ext[] at its first chunk), free runs
 * are not adjacent, each is on its length's list, and the lists hold
 * nothing else; the fences as runs.h says.  Quiescent pool. */
int mp_runs_check(magpool_t *pool) {
  mp_chunks *c = pool->chunks;
  mp_runs *r = &c->runs;
  uint64_t listed = 0, free_seen = 0;
  for (unsigned b = 0; b < MP_RUN_BINS; b++)
    if ((r->bin[b] != NIL) != (r->full[b / 64] >> (b % 64) & 1)) return MAGPOOL_EINVAL;
  for (unsigned b = 0; b < MP_RUN_BINS; b++)
    for (uint32_t s = r->bin[b], p = NIL; s != NIL; p = s, s = r->next[s]) {
      if (s >= r->n || r->head[s] == 0 || bin_of(r->head[s]) != b || r->prev[s] != p)
        return MAGPOOL_EINVAL;
      listed += r->head[s];
    }
  uint64_t so = mp_load_relaxed(&r->solo), nsolo = 0;
  uint32_t units = 1u << (c->shift - pool->min_shift); /* a whole chunk's */
  for (uint32_t k = 0; k < r->n; k++) { /* solo runs (runs.h) */
    nsolo += bit(r->sbits, k);
    bool solo_tag = r->tag[k] == MP_TAG_SOLO;
    if (solo_tag && (so == 0 || r->owner[k] != so || k < r->solo_lo || k >= r->solo_hi || fbit(r, k)))
      return MAGPOOL_EINVAL;
    if (bit(r->sbits, k) && (!solo_tag || mp_load_relaxed(&c->busy[c->run0 + k]) != units))
      return MAGPOOL_EINVAL;
  }
  if (nsolo != mp_load_relaxed(&r->nsolo)) return MAGPOOL_EINVAL;
  bool last_free = false;
  uint64_t fenced = 0, retired = 0;
  for (uint32_t i = 0; i < r->n;) {
    if (r->head[i] != 0) {
      uint32_t len = r->head[i];
      if (last_free || i + len > r->n || r->tail[i + len - 1] != len) return MAGPOOL_EINVAL;
      for (uint32_t k = i; k < i + len && k < r->n; k++) { /* fenced: tag and busy, else neither */
        bool f = fbit(r, k);
        if (f && r->sole != 0 && r->owner[k] != r->sole) return MAGPOOL_EINVAL;
        fenced += f;
        retired += f && rbit(r, k);
        bool solo = bit(r->sbits, k), tagged = r->tag[k] != 0 && !solo; /* free solo: sbits */
        if (f != tagged || (f || solo) != (mp_load_relaxed(&c->busy[c->run0 + k]) != 0))
          return MAGPOOL_EINVAL;
      }
      free_seen += len;
      i += len;
      last_free = true;
      continue;
    }
    uint32_t m = mp_load_relaxed(&c->ext[c->run0 + i]);
    if (m == 0 || i + m > r->n) return MAGPOOL_EINVAL; /* neither free nor out */
    for (uint32_t k = i; k < i + m; k++)
      if (mp_load_relaxed(&c->busy[c->run0 + k]) == 0 || fbit(r, k) || bit(r->sbits, k))
        return MAGPOOL_EINVAL;
    i += m;
    last_free = false;
  }
  return listed == free_seen && free_seen == r->free_chunks && fenced == mp_load_relaxed(&r->nfenced) &&
                 retired == mp_load_relaxed(&r->nretired)
             ? 0
             : MAGPOOL_EINVAL;
}
