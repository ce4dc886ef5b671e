/* runs.c - runs of whole chunks for large blocks.  Layer 2.
 *
 * Blocks of a chunk or more that no cache serves do not take a buddy
 * block: they take a run of ceil(size / chunk) chunks in the upper half of
 * the pool's address range (data and invariants: types.h, mp_runs).  A
 * buddy block of 2^k bytes has to sit at a 2^k-aligned free position,
 * and the free mapped chunks of a warm pool are seldom there; a run can
 * go wherever enough of them lie in a row.  Placement, among the free runs
 * at least as long as the request (best-fit with a preference for mapped
 * memory, which is what makes a warm pool map nothing):
 *   - an exactly fitting run whose chunks are all mapped, at once;
 *   - else the window (at the start or the end of a run) with the most
 *     mapped chunks; ties go to the shorter run, then the lower address.
 * The long tail of never-used space is one free run like the others, with
 * no mapped chunk: it is taken only when nothing scores higher.
 * One mutex: large allocations are rare next to small ones, and each
 * costs a scan of the free runs, not a system call.
 */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

#define NIL UINT32_MAX
/* Free runs looked at per request, at most (longest lists first). */
#define MP_RUN_SCAN 64

static inline uint32_t bin_of(uint32_t len) { return len < MP_RUN_BINS ? len : 0; }

static void list_push(mp_runs *r, uint32_t s, uint32_t len) {
  uint32_t b = bin_of(len);
  r->head[s] = len;
  r->tail[s + len - 1] = len;
  r->prev[s] = NIL;
  r->next[s] = r->bin[b];
  if (r->bin[b] != NIL) r->prev[r->bin[b]] = s;
  r->bin[b] = s;
  r->free_chunks += len;
}

static void list_remove(mp_runs *r, uint32_t s) {
  uint32_t len = r->head[s];
  uint32_t b = bin_of(len);
  if (r->prev[s] != NIL) r->next[r->prev[s]] = r->next[s];
  else r->bin[b] = r->next[s];
  if (r->next[s] != NIL) r->prev[r->next[s]] = r->prev[s];
  r->head[s] = 0;
  r->tail[s + len - 1] = 0;
  r->free_chunks -= len;
}

/* Mapped chunks in run-space window [s, s + m). */
static uint32_t mapped_in(const magpool_t *pool, uint32_t s, uint32_t m) {
  const mp_chunks *c = pool->chunks;
  uint32_t k = 0;
  for (uint32_t i = s; i < s + m; i++)
    k += mp_load_relaxed(&c->state[c->run0 + i]) == MP_CHUNK_MAPPED;
  return k;
}

typedef struct pick {
  uint32_t run, at, score, len;
  bool found;
} pick;

static void consider(const magpool_t *pool, pick *b, uint32_t s, uint32_t len, uint32_t m) {
  uint32_t at[2] = {s, s + len - m};
  for (int k = 0; k < (len > m ? 2 : 1); k++) {
    uint32_t sc = mapped_in(pool, at[k], m);
    if (!b->found || sc > b->score || (sc == b->score && (len < b->len || (len == b->len && at[k] < b->at)))) {
      *b = (pick){s, at[k], sc, len, true};
    }
  }
}

int64_t mp_runs_alloc(magpool_t *pool, uint32_t m) {
  mp_runs *r = &pool->chunks->runs;
  if (m == 0 || m > r->n) return -1;
  pthread_mutex_lock(r->lock);
  pick b = {0, 0, 0, 0, false};
  unsigned looked = 0;
  /* Exact fits first: a fully mapped one ends the search. */
  for (uint32_t s = m < MP_RUN_BINS ? r->bin[m] : NIL; s != NIL && looked < MP_RUN_SCAN;
       s = r->next[s], looked++) {
    consider(pool, &b, s, m, m);
    if (b.score == m) goto take;
  }
  for (uint32_t L = m + 1; L < MP_RUN_BINS && looked < MP_RUN_SCAN; L++)
    for (uint32_t s = r->bin[L]; s != NIL && looked < MP_RUN_SCAN; s = r->next[s], looked++)
      consider(pool, &b, s, L, m);
  /* The long runs, the unused tail among them, always get a look. */
  for (uint32_t s = r->bin[0], k = 0; s != NIL && k < MP_RUN_SCAN; s = r->next[s], k++)
    if (r->head[s] >= m) consider(pool, &b, s, r->head[s], m);
  if (!b.found) {
    pthread_mutex_unlock(r->lock);
    return -1;
  }
take:;
  uint32_t s = b.run, len = r->head[s];
  list_remove(r, s);
  if (b.at > s) list_push(r, s, b.at - s);
  if (b.at + m < s + len) list_push(r, b.at + m, s + len - (b.at + m));
  pthread_mutex_unlock(r->lock);
  return (int64_t)b.at;
}

void mp_runs_free(magpool_t *pool, uint32_t s, uint32_t m) {
  mp_runs *r = &pool->chunks->runs;
  pthread_mutex_lock(r->lock);
  uint32_t start = s, len = m;
  if (s > 0 && r->tail[s - 1] != 0) { /* coalesce with the run before */
    uint32_t l = r->tail[s - 1];
    list_remove(r, s - l);
    start = s - l;
    len += l;
  }
  if (s + m < r->n && r->head[s + m] != 0) { /* and the one after */
    uint32_t l = r->head[s + m];
    list_remove(r, s + m);
    len += l;
  }
  list_push(r, start, len);
  pthread_mutex_unlock(r->lock);
}

int mp_runs_init(magpool_t *pool, uint32_t n) {
  mp_runs *r = &pool->chunks->runs;
  r->n = n;
  r->head = calloc(n, sizeof *r->head);
  r->tail = calloc(n, sizeof *r->tail);
  r->next = calloc(n, sizeof *r->next);
  r->prev = calloc(n, sizeof *r->prev);
  r->lock = malloc(sizeof(pthread_mutex_t));
  if (r->head == NULL || r->tail == NULL || r->next == NULL || r->prev == NULL || r->lock == NULL) {
    mp_runs_fini(pool);
    return MAGPOOL_ENOMEM;
  }
  pthread_mutex_init(r->lock, NULL);
  for (unsigned b = 0; b < MP_RUN_BINS; b++) r->bin[b] = NIL;
  r->free_chunks = 0;
  list_push(r, 0, n);
  return 0;
}

void mp_runs_fini(magpool_t *pool) {
  mp_runs *r = &pool->chunks->runs;
  free(r->head);
  free(r->tail);
  free(r->next);
  free(r->prev);
  if (r->lock != NULL) pthread_mutex_destroy(r->lock);
  free(r->lock);
  r->head = r->tail = r->next = r->prev = NULL;
  r->lock = NULL;
}

/* Free runs against the blocks out: each run space chunk is in exactly
 * one free run or one live extent (ext[] at its first chunk), free runs
 * are not adjacent, each is on its length's list, and the lists hold
 * nothing else.  Quiescent pool. */
int mp_runs_check(magpool_t *pool) {
  mp_chunks *c = pool->chunks;
  mp_runs *r = &c->runs;
  uint64_t listed = 0, free_seen = 0;
  for (unsigned b = 0; b < MP_RUN_BINS; b++)
    for (uint32_t s = r->bin[b], p = NIL; s != NIL; p = s, s = r->next[s]) {
      if (s >= r->n || r->head[s] == 0 || bin_of(r->head[s]) != b || r->prev[s] != p)
        return MAGPOOL_EINVAL;
      listed += r->head[s];
    }
  bool last_free = false;
  for (uint32_t i = 0; i < r->n;) {
    if (r->head[i] != 0) {
      uint32_t len = r->head[i];
      if (last_free || i + len > r->n || r->tail[i + len - 1] != len) return MAGPOOL_EINVAL;
      free_seen += len;
      i += len;
      last_free = true;
      continue;
    }
    uint32_t m = mp_load_relaxed(&c->ext[c->run0 + i]);
    if (m == 0 || i + m > r->n) return MAGPOOL_EINVAL; /* neither free nor out */
    for (uint32_t k = i; k < i + m; k++)
      if (mp_load_relaxed(&c->busy[c->run0 + k]) == 0) return MAGPOOL_EINVAL;
    i += m;
    last_free = false;
  }
  return listed == free_seen && free_seen == r->free_chunks ? 0 : MAGPOOL_EINVAL;
}
