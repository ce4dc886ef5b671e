/* track.c - allocation tracking (pointer, size, tag) and leak checks.
 * Layer 5.
 * Off by default.  While on, every allocation and free of the pool takes
 * one mutex and updates an open-addressing hash table; that is the price
 * of a debugging aid, and it is kept out of the untracked fast path by one
 * relaxed load of pool->tracking. */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local const char *tls_tag;

typedef struct mp_track_ent {
  void *p; /* NULL: empty; TOMB: deleted */
  size_t size;
  const char *tag;
} mp_track_ent;

typedef struct mp_track {
  pthread_mutex_t lk;
  mp_track_ent *tab;
  size_t cap, n, used; /* used counts tombstones too */
} mp_track;

#define TOMB ((void *)1)

void magpool_set_tag(const char *tag) { tls_tag = tag; }

static size_t hash_ptr(const void *p, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x & (cap - 1);
}

static int rehash(mp_track *t, size_t cap) {
  mp_track_ent *nt = calloc(cap, sizeof *nt);
  if (nt == NULL) return MAGPOOL_ENOMEM;
  for (size_t i = 0; i < t->cap; i++) {
    mp_track_ent *e = &t->tab[i];
    if (e->p == NULL || e->p == TOMB) continue;
    size_t j = hash_ptr(e->p, cap);
    while (nt[j].p != NULL) j = (j + 1) & (cap - 1);
    nt[j] = *e;
  }
  free(t->tab);
  t->tab = nt;
  t->cap = cap;
  t->used = t->n;
  return 0;
}

int magpool_tracking_enable(magpool_t *pool, int on) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  magpool_stats_t st;
  magpool_get_stats(pool, &st);
  if (on) {
    if (mp_load_relaxed(&pool->tracking)) return 0;
    if (st.live_count != 0) return MAGPOOL_EBUSY;
    mp_track *t = pool->track;
    if (t == NULL) {
      t = calloc(1, sizeof *t);
      if (t == NULL) return MAGPOOL_ENOMEM;
      pthread_mutex_init(&t->lk, NULL);
      if (rehash(t, 1024) != 0) {
        free(t);
        return MAGPOOL_ENOMEM;
      }
      pool->track = t;
    } else {
      /* Left from an earlier tracking period: frees made while tracking
       * was off did not remove their entries, and nothing is live now, so
       * every entry is stale. */
      pthread_mutex_lock(&t->lk);
      memset(t->tab, 0, t->cap * sizeof *t->tab);
      t->n = 0;
      t->used = 0;
      pthread_mutex_unlock(&t->lk);
    }
    /* RELEASE: the table exists before any thread sees tracking on. */
    mp_store_release(&pool->tracking, 1);
  } else {
    mp_store_release(&pool->tracking, 0);
  }
  /* Every thread re-reads the flag on its next call (mp_tcache_get_slow):
   * caches go off while tracking is on, so no allocation escapes it. */
  mp_fetch_add_acq_rel(&pool->trim_epoch, 1);
  return 0;
}

void mp_track_on_alloc(magpool_t *pool, void *p, size_t size) {
  mp_track *t = pool->track;
  pthread_mutex_lock(&t->lk);
  if ((t->used + 1) * 2 > t->cap && rehash(t, t->n * 4 > t->cap ? t->cap * 2 : t->cap) != 0) {
    pthread_mutex_unlock(&t->lk); /* out of host memory: not recorded */
    return;
  }
  size_t j = hash_ptr(p, t->cap);
  while (t->tab[j].p != NULL && t->tab[j].p != TOMB) j = (j + 1) & (t->cap - 1);
  if (t->tab[j].p == NULL) t->used++;
  t->tab[j].p = p;
  t->tab[j].size = size;
  t->tab[j].tag = tls_tag;
  t->n++;
  pthread_mutex_unlock(&t->lk);
}

void mp_track_on_free(magpool_t *pool, void *p) {
  mp_track *t = pool->track;
  pthread_mutex_lock(&t->lk);
  size_t j = hash_ptr(p, t->cap);
  while (t->tab[j].p != NULL) {
    if (t->tab[j].p == p) {
      t->tab[j].p = TOMB;
      t->n--;
      break;
    }
    j = (j + 1) & (t->cap - 1);
  }
  pthread_mutex_unlock(&t->lk);
}

long magpool_leak_check(magpool_t *pool,
                        void (*fn)(void *ptr, size_t size, const char *tag, void *arg),
                        void *arg) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  mp_track *t = pool->track;
  if (t == NULL || !mp_load_acquire(&pool->tracking)) return MAGPOOL_ENOTSUP;
  long count = 0;
  pthread_mutex_lock(&t->lk);
  for (size_t i = 0; i < t->cap; i++) {
    mp_track_ent *e = &t->tab[i];
    if (e->p == NULL || e->p == TOMB) continue;
    if (fn != NULL) fn(e->p, e->size, e->tag, arg);
    count++;
  }
  pthread_mutex_unlock(&t->lk);
  return count;
}

void mp_track_destroy(magpool_t *pool) {
  mp_track *t = pool->track;
  if (t == NULL) return;
  pthread_mutex_destroy(&t->lk);
  free(t->tab);
  free(t);
  pool->track = NULL;
}
