/* stream_table.c - the stream table: stream id -> entry, on liburcu's
 * lock-free hash table (cds_lfht, urcu-bp flavour: the application's
 * threads and CUDA's callback threads need no registration); the entry
 * lock; the entries' lives; and the walks over every entry.  Layer 4; the
 * slots inside the entries belong to stream_cache.c, which calls this file
 * and never the reverse.
 *
 * Stream identity is the stream's unique id (cudaStreamGetId, or the host
 * stream's id), never its handle: handles are reused after a stream is
 * destroyed, and cudaStreamPerThread names a different stream on every
 * thread.  The key is the id + 1.
 *
 * An entry's life:
 *   live      in the table; found by lookups inside a read-side section;
 *             created with cds_lfht_add_unique, so one id never has two
 *             live entries (the loser of a creation race frees its own,
 *             never published, entry)
 *   dead      released (mp_entry_release_locked): sid 0, removed from the
 *             table, pushed on the pool's dead list.  Its batches still
 *             count down its `pending`, its owners still hold their
 *             (closed) slots, and waiters may hold a use
 *   reaped    dead with no users and no pending: off the dead list, freed
 *             by call_rcu after a grace period, so a reader that found it
 *             in the table before the removal is done with it first
 * A use from outside a read-side section (a waiter) is taken inside one
 * with mp_entry_use_rcu, which fails on a reaped entry: a Dekker pair with
 * the reaper (use: increment users, then read reaped; reaper: set reaped,
 * then read users; both seq_cst), so never both proceed.
 *
 * Concurrency contract:
 *   lookups, walks ............ inside mp_streams_read_lock/unlock
 *   entry sid, slot list ...... changed under the entry lock
 *   dead list ................. under dead_lock
 *   users, pending ............ atomic RMW, any thread
 */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <urcu-bp.h>
#include <urcu/rculfhash.h>

/* The entry and its liburcu links, which no other file sees. */
typedef struct ent_node {
  mp_sentry e;
  struct cds_lfht_node node;
  struct rcu_head rcu;
} ent_node;

static inline ent_node *node_of(mp_sentry *e) { return (ent_node *)(void *)e; }

/* ThreadSanitizer does not see liburcu's orderings (TSan builds only;
 * mp_tsan_*):
 *   - grace periods: a read-side section's end RELEASEs a token and every
 *     RCU callback ACQUIREs it;
 *   - call_rcu's hand-off: the caller RELEASEs the object before
 *     call_rcu, the callback ACQUIREs it;
 *   - publication in the table: the creator RELEASEs the entry before
 *     cds_lfht_add_unique, and whoever meets a node in the table ACQUIREs
 *     it before reading it. */
static char rcu_token;

void mp_streams_read_lock(void) { urcu_bp_read_lock(); }

void mp_streams_read_unlock(void) {
  mp_tsan_release(&rcu_token);
  urcu_bp_read_unlock();
}

void mp_streams_rcu_callback(void) { mp_tsan_acquire(&rcu_token); }

/* An entry's memory: the node and its park's fence ranges. */
static void ent_free(ent_node *en) {
  free(en->e.park.fr);
  free(en);
}

static void ent_free_rcu(struct rcu_head *h) {
  mp_streams_rcu_callback();
  ent_node *en = caa_container_of(h, ent_node, rcu);
  mp_tsan_acquire(en);
  ent_free(en);
}

static void ent_call_rcu(ent_node *en) {
  mp_tsan_release(en);
  urcu_bp_call_rcu(&en->rcu, ent_free_rcu);
}

int mp_stream_table_init(magpool_t *pool) {
  mp_streams *ss = calloc(1, sizeof *ss);
  if (ss == NULL) return MAGPOOL_ENOMEM;
  ss->ht = cds_lfht_new_flavor(64, 64, 0, CDS_LFHT_AUTO_RESIZE | CDS_LFHT_ACCOUNTING,
                               &urcu_bp_flavor, NULL);
  if (ss->ht == NULL) {
    free(ss);
    return MAGPOOL_ENOMEM;
  }
  pthread_mutex_init(&ss->dead_lock, NULL);
  mp_atomic_init(&ss->nlive, 0);
  mp_atomic_init(&ss->closes, 0);
  pool->streams = ss;
  return 0;
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

static inline unsigned long hash_key(uint64_t x) {
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  return (unsigned long)(x ^ (x >> 29));
}

static int match_key(struct cds_lfht_node *n, const void *key) {
  ent_node *en = caa_container_of(n, ent_node, node);
  mp_tsan_acquire(en);
  return en->e.key == *(const uint64_t *)key;
}

mp_sentry *mp_entry_find_rcu(magpool_t *pool, uint64_t key, magpool_stream_t h, bool create) {
  struct cds_lfht *ht = pool->streams->ht;
  struct cds_lfht_iter it;
  cds_lfht_lookup(ht, hash_key(key), match_key, &key, &it);
  struct cds_lfht_node *n = cds_lfht_iter_get_node(&it);
  if (n != NULL || !create) return n != NULL ? &caa_container_of(n, ent_node, node)->e : NULL;
  ent_node *en = calloc(1, sizeof *en);
  if (en == NULL) return NULL;
  en->e.key = key;
  en->e.handle = h;
  mp_atomic_init(&en->e.sid, key);
  cds_lfht_node_init(&en->node);
  mp_tsan_release(en);
  /* Publication: liburcu's add orders the entry's initialisation before
   * any lookup that finds it (rcu_assign_pointer, RELEASE). */
  n = cds_lfht_add_unique(ht, hash_key(key), match_key, &key, &en->node);
  if (n != &en->node) free(en); /* another thread created it first */
  else mp_fetch_add_relaxed(&pool->streams->nlive, 1);
  return &caa_container_of(n, ent_node, node)->e;
}

/* ----------------------------------------------------------------- lives */

void mp_entry_release_locked(magpool_t *pool, mp_sentry *e) {
  mp_streams *ss = pool->streams;
  mp_store_release(&e->sid, 0);
  (void)cds_lfht_del(ss->ht, &node_of(e)->node);
  mp_fetch_sub_relaxed(&ss->nlive, 1);
  pthread_mutex_lock(&ss->dead_lock);
  e->dead_next = ss->dead;
  ss->dead = e;
  pthread_mutex_unlock(&ss->dead_lock);
}

bool mp_entry_use_rcu(mp_sentry *e) {
  mp_fetch_add_acq_rel(&e->users, 1);
  if (mp_load_seq_cst(&e->reaped) == 0) return true;
  mp_fetch_add_acq_rel(&e->users, -1);
  return false;
}

void mp_entry_unuse(mp_sentry *e) { mp_fetch_add_acq_rel(&e->users, -1); }

void mp_streams_reap(magpool_t *pool) {
  mp_streams *ss = pool->streams;
  pthread_mutex_lock(&ss->dead_lock);
  for (mp_sentry **link = &ss->dead; *link != NULL;) {
    mp_sentry *e = *link;
    if (mp_load_acquire(&e->users) == 0 && mp_load_acquire(&e->pending) == 0) {
      mp_store_seq_cst(&e->reaped, 1);
      if (mp_load_seq_cst(&e->users) == 0) {
        *link = e->dead_next;
        ent_call_rcu(node_of(e));
        continue;
      }
      mp_store_seq_cst(&e->reaped, 0); /* a waiter came: it keeps it */
    }
    link = &e->dead_next;
  }
  pthread_mutex_unlock(&ss->dead_lock);
}

/* Destroy: nothing runs on the pool, so no reader can hold an entry of
 * it; every entry, live or dead, is freed at once.  Frees deferred earlier
 * (call_rcu) touch nothing of the pool and finish on their own: waiting
 * for them here (urcu_bp_barrier) cost every destroy the call_rcu
 * worker's 10 ms poll. */
void mp_stream_table_fini(magpool_t *pool) {
  mp_streams *ss = pool->streams;
  if (ss == NULL) return;
  struct cds_lfht_iter it;
  struct cds_lfht_node *n;
  mp_streams_read_lock();
  cds_lfht_for_each(ss->ht, &it, n) {
    (void)cds_lfht_del(ss->ht, n);
    ent_free(caa_container_of(n, ent_node, node));
  }
  mp_streams_read_unlock();
  for (mp_sentry *e = ss->dead, *next; e != NULL; e = next) {
    next = e->dead_next;
    ent_free(node_of(e));
  }
  (void)cds_lfht_destroy(ss->ht, NULL);
  pthread_mutex_destroy(&ss->dead_lock);
  free(ss);
  pool->streams = NULL;
}

/* ----------------------------------------------------------------- walks */

void mp_streams_each_rcu(magpool_t *pool, void (*fn)(magpool_t *, mp_sentry *, void *),
                         void *arg) {
  struct cds_lfht_iter it;
  struct cds_lfht_node *n;
  cds_lfht_for_each(pool->streams->ht, &it, n) {
    ent_node *en = caa_container_of(n, ent_node, node);
    mp_tsan_acquire(en);
    fn(pool, &en->e, arg);
  }
}

static void stats_one(magpool_t *pool, mp_sentry *e, void *arg) {
  (void)pool;
  int64_t *c = arg;
  *c += mp_load_relaxed(&e->park.bytes);
  for (mp_sslot *sl = mp_load_acquire(&e->slots); sl != NULL; sl = mp_load_acquire(&sl->next))
    *c += mp_load_relaxed(&sl->bytes);
}

void mp_streams_stats(magpool_t *pool, size_t *cached, size_t *pending) {
  int64_t c = mp_load_relaxed(&pool->retire.ready_bytes);
  mp_streams_read_lock();
  mp_streams_each_rcu(pool, stats_one, &c);
  mp_streams_read_unlock();
  int64_t p = mp_load_relaxed(&pool->retire.pending_bytes);
  *cached = c > 0 ? (size_t)c : 0;
  *pending = p > 0 ? (size_t)p : 0;
}

/* Waiters: entries with pending batches, each with a use taken inside the
 * read-side section, waited for outside it. */
typedef struct waitlist {
  mp_sentry **e;
  size_t n, cap;
} waitlist;

static void waitlist_add(waitlist *w, mp_sentry *e) {
  if (w->n == w->cap) {
    size_t nc = w->cap ? 2 * w->cap : 16;
    mp_sentry **ne = realloc(w->e, nc * sizeof *ne);
    if (ne == NULL) return; /* no host memory: the orphan wait covers it */
    w->e = ne;
    w->cap = nc;
  }
  if (mp_entry_use_rcu(e)) w->e[w->n++] = e;
}

static void wait_collect(magpool_t *pool, mp_sentry *e, void *arg) {
  (void)pool;
  if (mp_load_acquire(&e->pending) != 0) waitlist_add(arg, e);
}

size_t mp_streams_wait_pending(magpool_t *pool) {
  mp_streams *ss = pool->streams;
  if (mp_load_acquire(&pool->retire.pending_batches) == 0) return 0;
  waitlist w = {NULL, 0, 0};
  mp_streams_read_lock();
  mp_streams_each_rcu(pool, wait_collect, &w);
  mp_streams_read_unlock();
  pthread_mutex_lock(&ss->dead_lock); /* dead entries cannot be reaped */
  for (mp_sentry *e = ss->dead; e != NULL; e = e->dead_next)
    if (mp_load_acquire(&e->pending) != 0) waitlist_add(&w, e);
  pthread_mutex_unlock(&ss->dead_lock);
  for (size_t i = 0; i < w.n; i++) {
    mp_sentry *e = w.e[i];
    mp_entry_lock(e);
    /* Under the entry lock a release cannot retire the entry, and so the
     * program cannot destroy its stream, while we wait on it.  A stream
     * is in order: once it is synchronised, every batch retired on it so
     * far has run its callback. */
    bool synced = mp_load_relaxed(&e->sid) != 0 && pool->sops->sync(pool->src_ctx, e->handle) == 0;
    mp_entry_unlock(e);
    /* Released (its handle may be gone), or the sync failed: a dead
     * entry gets no new batches, so its count only falls. */
    if (!synced) mp_retire_wait(pool, &e->pending);
    mp_entry_unuse(e);
  }
  size_t n = w.n;
  free(w.e);
  if (mp_load_acquire(&pool->retire.orphan_pending) != 0) {
    mp_retire_wait(pool, &pool->retire.orphan_pending);
    n++;
  }
  mp_streams_reap(pool);
  return n;
}
