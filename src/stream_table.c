/* stream_table.c - the stream table: stream id -> entry, the entry lock,
 * and the walks over every entry (stats, waiting for pending streams).
 * Layer 4; the slots inside the entries belong to stream_cache.c, which
 * calls this file and never the reverse.
 *
 * Stream identity is the stream's unique id (cudaStreamGetId, or the host
 * stream's id), never its handle: handles are reused after a stream is
 * destroyed, and cudaStreamPerThread names a different stream on every
 * thread.  Ids are stored + 1, so that 0 means "empty or released".
 *
 * Concurrency contract:
 *   tab[i] ......... set once (RELEASE) under create_lock; never cleared
 *                    while the pool lives; read by anyone (ACQUIRE)
 *   entry sid ...... set under create_lock (RELEASE, after handle);
 *                    cleared by release under the entry lock
 *   entry busy ..... the entry lock: thieves and slot creation; no fast
 *                    path takes it, and the ladder and trim only try it
 */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

int mp_stream_table_init(magpool_t *pool) {
  mp_streams *ss = calloc(1, sizeof *ss);
  if (ss == NULL) return MAGPOOL_ENOMEM;
  pthread_mutex_init(&ss->create_lock, NULL);
  pool->streams = ss;
  return 0;
}

void mp_stream_table_fini(magpool_t *pool) {
  mp_streams *ss = pool->streams;
  if (ss == NULL) return;
  for (unsigned i = 0; i < MP_STREAM_TABLE; i++) free(mp_load_relaxed(&ss->tab[i]));
  pthread_mutex_destroy(&ss->create_lock);
  free(ss);
  pool->streams = NULL;
}

/* ------------------------------------------------------------ entry lock */

bool mp_entry_try(mp_sentry *e) {
  int z = 0;
  /* ACQUIRE: pairs with the RELEASE in mp_entry_unlock; the previous
   * holder's writes (slot list, stolen magazines) are visible to us. */
  return mp_load_relaxed(&e->busy) == 0 && mp_cas_strong_acquire(&e->busy, &z, 1);
}

void mp_entry_unlock(mp_sentry *e) { mp_store_release(&e->busy, 0); }

void mp_entry_lock(mp_sentry *e) {
  while (!mp_entry_try(e)) { /* slow paths only */
    MP_HOOK(MP_HOOK_ENTRY_WAIT, e);
    sched_yield();
  }
}

/* --------------------------------------------------------------- lookups */

static inline uint64_t hash_sid(uint64_t x) {
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  return x ^ (x >> 29);
}

/* Probes from the hash until sid or an empty slot.  With `recycle`, also
 * notes the first released entry without pending batches on the path, and
 * with `empty` the empty slot that ended the probe (MP_STREAM_TABLE if
 * none). */
static mp_sentry *entry_probe(mp_streams *ss, uint64_t sid, mp_sentry **recycle,
                              unsigned *empty) {
  unsigned start = (unsigned)hash_sid(sid) & (MP_STREAM_TABLE - 1);
  if (recycle != NULL) *recycle = NULL;
  for (unsigned k = 0; k < MP_STREAM_TABLE; k++) {
    unsigned i = (start + k) & (MP_STREAM_TABLE - 1);
    mp_sentry *e = mp_load_acquire(&ss->tab[i]);
    if (e == NULL) {
      if (empty != NULL) *empty = i;
      return NULL;
    }
    uint64_t es = mp_load_acquire(&e->sid);
    if (es == sid) return e;
    if (recycle != NULL && *recycle == NULL && es == 0 && mp_load_acquire(&e->pending) == 0)
      *recycle = e;
  }
  if (empty != NULL) *empty = MP_STREAM_TABLE;
  return NULL;
}

/* Finding is lock-free.  Creating takes the table mutex (a stream's first
 * use by a pool, rare), so that one sid never gets two entries: it
 * re-probes, then recycles the first released entry without pending
 * batches on the probe path, or takes the first empty slot - either way
 * the first match any later probe sees. */
mp_sentry *mp_entry_find(magpool_t *pool, uint64_t sid, magpool_stream_t h, bool create) {
  mp_streams *ss = pool->streams;
  mp_sentry *e = entry_probe(ss, sid, NULL, NULL);
  if (e != NULL || !create) return e;
  pthread_mutex_lock(&ss->create_lock);
  mp_sentry *rec;
  unsigned empty;
  e = entry_probe(ss, sid, &rec, &empty);
  if (e == NULL && rec != NULL) {
    mp_entry_lock(rec);
    if (mp_load_relaxed(&rec->sid) == 0 && mp_load_acquire(&rec->pending) == 0) {
      rec->handle = h;
      /* RELEASE: handle is written before finders can match the sid. */
      mp_store_release(&rec->sid, sid);
      e = rec;
    }
    mp_entry_unlock(rec);
  }
  if (e == NULL && empty < MP_STREAM_TABLE) {
    e = calloc(1, sizeof *e);
    if (e != NULL) {
      e->handle = h;
      mp_atomic_init(&e->sid, sid);
      /* RELEASE: the entry is initialised before finders see it. */
      mp_store_release(&ss->tab[empty], e);
    }
  }
  pthread_mutex_unlock(&ss->create_lock);
  return e;
}

/* ----------------------------------------------------------------- walks */

void mp_streams_stats(magpool_t *pool, size_t *cached, size_t *pending) {
  mp_streams *ss = pool->streams;
  int64_t c = mp_load_relaxed(&pool->retire.ready_bytes);
  for (unsigned i = 0; i < MP_STREAM_TABLE; i++) {
    mp_sentry *e = mp_load_acquire(&ss->tab[i]);
    if (e == NULL) continue;
    for (mp_sslot *sl = mp_load_acquire(&e->slots); sl != NULL; sl = sl->next)
      c += mp_load_relaxed(&sl->bytes);
  }
  int64_t p = mp_load_relaxed(&pool->retire.pending_bytes);
  *cached = c > 0 ? (size_t)c : 0;
  *pending = p > 0 ? (size_t)p : 0;
}

size_t mp_streams_wait_pending(magpool_t *pool) {
  mp_streams *ss = pool->streams;
  if (mp_load_acquire(&pool->retire.pending_batches) == 0) return 0;
  size_t n = 0;
  for (unsigned i = 0; i < MP_STREAM_TABLE; i++) {
    mp_sentry *e = mp_load_acquire(&ss->tab[i]);
    if (e == NULL || mp_load_acquire(&e->pending) == 0) continue;
    mp_entry_lock(e);
    /* Under the entry lock a release cannot retire the entry, and so the
     * program cannot destroy its stream, while we wait on it.  A stream
     * is in order: once it is synchronised, every batch retired on it so
     * far has run its callback. */
    bool synced = mp_load_relaxed(&e->sid) != 0 && pool->sops->sync(pool->src_ctx, e->handle) == 0;
    mp_entry_unlock(e);
    /* Released (its handle may be gone), or the sync failed: the entry
     * gets no new batches once released, so its count only falls. */
    if (!synced) mp_retire_wait(pool, &e->pending);
    n++;
  }
  if (mp_load_acquire(&pool->retire.orphan_pending) != 0) {
    mp_retire_wait(pool, &pool->retire.orphan_pending);
    n++;
  }
  return n;
}
