/* thread.c - the thread record: one per (thread, pool).  TLS memo,
 * creation and adoption, the trim epoch, thread exit, and orphaning at
 * destroy.  Layer 4, above the caches it orchestrates: it calls the thread
 * magazines (magazine.c) and the stream slots (stream_cache.c), which
 * never call it.
 *
 * Concurrency contract:
 *   the record's caches and memo ... owner thread only
 *   record->state .................. CAS by the owner (adopt, exit) and the
 *                                    destroyer (orphan); see types.h
 *   pool->tcaches .................. push-only (CAS RELEASE), anyone walks
 *                                    (ACQUIRE)
 *   TLS list, mp_tls_last .......... the thread itself
 * A thread's exit runs in its pthread key destructor: it moves each LIVE
 * record to EXITING, returns its caches, then FREE; records orphaned by a
 * destroyed pool are freed there or at the thread's next lookup.
 */
#include "thread.h"

#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The fast paths' fields fill a record's first two cache lines (records
 * are line-aligned, below), and what every call reads of the pool its
 * first three and regions[0] the fourth (pools are aligned too), so that a
 * call whose lines the program evicted misses as few as it can
 * (types.h; magpool-replay --evict). */
_Static_assert(offsetof(mp_tcache, st) == MP_CACHELINE &&
                   offsetof(mp_tcache, uid) <= 2 * MP_CACHELINE,
               "mp_tcache: the hot fields are not the first two lines");
_Static_assert(offsetof(magpool_t, trim_epoch) / MP_CACHELINE == 2 &&
                   offsetof(magpool_t, regions) / MP_CACHELINE == 3,
               "magpool_t: the fields every call reads are not lines 0-2");

_Thread_local mp_tcache *mp_tls_last MP_TLS_MODEL;
static _Thread_local mp_tcache *tls_list;

static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;


static void thread_exit(void *arg) {
  (void)arg;
  mp_tcache *tc = tls_list;
  tls_list = NULL;
  mp_tls_last = NULL;
  while (tc != NULL) {
    mp_tcache *next = tc->thread_next;
    int s = MP_TC_LIVE;
    if (mp_cas_strong_acq_rel(&tc->state, &s, MP_TC_EXITING)) {
      magpool_t *pool = tc->pool;
      mp_fetch_add_relaxed(&pool->nthreads, (uint64_t)-1); /* a hint */
      MP_DBG_ENTER(pool);
      MP_HOOK(MP_HOOK_EXIT_FLUSH, tc);
      /* The slots' blocks go behind their streams; a slot whose stream
       * was released has been emptied by the release. */
      mp_streams_thread_flush(pool, tc, true);
      tc->s_slot = NULL;
      tc->s_handle = NULL;
      mp_tcache_enter_owner_wait(tc); /* a thief that began before EXITING */
      mp_tcache_flush(pool, tc, &tc->acct);
      mp_tcache_drop_mags(pool, tc);
      mp_tcache_exit_owner(tc);
      tc->thread_next = NULL;
      MP_HOOK(MP_HOOK_EXIT_DONE, tc);
      MP_DBG_LEAVE(pool);
      /* RELEASE: the flushed record is complete before a new thread (CAS
       * FREE->LIVE, ACQUIRE) or the destroyer reuses or frees it. */
      mp_store_release(&tc->state, MP_TC_FREE);
    } else {
      free(tc); /* ORPHAN: its pool is gone and left it to us */
    }
    tc = next;
  }
}

static bool tls_key_made;

static void tls_key_init(void) { tls_key_made = pthread_key_create(&tls_key, thread_exit) == 0; }

/* The library is being unloaded (dlclose) or the process is exiting: no
 * thread may call thread_exit, whose code is about to go away, any more.
 * Records of threads still alive are then never returned (their memory
 * goes with the pools, or with the process). */
__attribute__((destructor)) static void tls_key_fini(void) {
  if (tls_key_made) pthread_key_delete(tls_key);
}

mp_tcache *mp_tcache_get_slow(magpool_t *pool) {
  mp_tcache *tc = NULL;
  mp_tcache **link = &tls_list;
  while (*link != NULL) { /* find ours; free records orphaned by destroy */
    mp_tcache *t = *link;
    if (mp_load_acquire(&t->state) == MP_TC_ORPHAN) {
      *link = t->thread_next;
      if (mp_tls_last == t) mp_tls_last = NULL;
      free(t);
      continue;
    }
    if (t->pool == pool && t->uid == pool->uid) { tc = t; break; }
    link = &t->thread_next;
  }
  if (tc == NULL) {
    /* Adopt a record of an exited thread, or make one. */
    for (mp_tcache *t = mp_load_acquire(&pool->tcaches); t != NULL; t = t->pool_next) {
      int s = MP_TC_FREE;
      if (mp_load_relaxed(&t->state) == MP_TC_FREE && mp_cas_strong_acq_rel(&t->state, &s, MP_TC_LIVE)) {
        tc = t;
        break;
      }
    }
    if (tc == NULL) {
      tc = aligned_alloc(MP_CACHELINE, (sizeof *tc + MP_CACHELINE - 1) & ~(size_t)(MP_CACHELINE - 1));
      if (tc == NULL) return NULL;
      memset(tc, 0, sizeof *tc);
      tc->pool = pool;
      tc->uid = pool->uid;
      tc->s_limit = (int64_t)pool->cfg.stream_cache_bytes; /* no slot yet */
      tc->shift = (uint8_t)pool->min_shift;
      tc->r0_base = pool->regions[0]->base;
      tc->r0_bytes = (size_t)pool->regions[0]->hdr_split << pool->min_shift; /* not run space */
      tc->r0_hdr = pool->regions[0]->hdr;
      mp_atomic_init(&tc->state, MP_TC_LIVE);
      mp_tcache *h = mp_load_relaxed(&pool->tcaches);
      do {
        tc->pool_next = h;
        /* RELEASE: the record is initialised before stats readers reach
         * it through the list (ACQUIRE in sum_threads). */
      } while (!mp_cas_weak_release(&pool->tcaches, &h, tc));
    }
    /* Counted LIVE (thread_exit uncounts it), then its share. */
    mp_fetch_add_relaxed(&pool->nthreads, 1);
    tc->limit = mp_cache_share(pool, pool->cfg.thread_cache_bytes);
    tc->epoch = mp_load_relaxed(&pool->trim_epoch);
    /* A reused record starts with no stream memo: cudaStreamPerThread, for
     * one, names another stream on this thread. */
    tc->s_slot = NULL;
    tc->s_handle = NULL;
    tc->thread_next = tls_list;
    tls_list = tc;
    pthread_once(&tls_once, tls_key_init);
    pthread_setspecific(tls_key, (void *)1);
  }
  uint64_t ep = mp_load_acquire(&pool->trim_epoch);
  if (tc->epoch != ep) { /* a trim ran: return our caches for this pool */
    /* Epoch first and memo set: the record is current before its caches
     * go back. */
    tc->epoch = ep;
    mp_tls_last = tc;
    mp_streams_thread_flush(pool, tc, false);
    mp_tcache_enter_owner_wait(tc);
    mp_tcache_flush(pool, tc, &tc->acct);
    mp_tcache_exit_owner(tc);
  }
  /* Tracking needs every allocation on a path that records it: it turns
   * the caches off (magpool_tracking_enable bumps the epoch to get here). */
  bool on = pool->nclasses != 0 && !mp_load_acquire(&pool->tracking);
  bool son = pool->s_nclasses != 0 && !mp_load_acquire(&pool->tracking);
  /* Held: a thief reads nclasses to find the magazines. */
  mp_tcache_enter_owner_wait(tc);
  if (!on && tc->nclasses != 0) {
    mp_tcache_flush(pool, tc, &tc->acct);
    mp_tcache_drop_mags(pool, tc);
  }
  tc->nclasses = (uint8_t)(on ? pool->nclasses : 0);
  tc->cache_max = on ? (uint32_t)mp_block_bytes(pool, pool->nclasses - 1) : 0;
  mp_tcache_exit_owner(tc);
  tc->s_nclasses = (uint8_t)(son ? pool->s_nclasses : 0);
  tc->s_cache_max = son ? (uint32_t)mp_block_bytes(pool, pool->s_nclasses - 1) : 0;
  mp_tls_last = tc;
  return tc;
}

void mp_tcaches_destroy(magpool_t *pool) {
  mp_tcache *t = mp_load_acquire(&pool->tcaches);
  while (t != NULL) {
    mp_tcache *next = t->pool_next;
    for (;;) {
      int s = mp_load_acquire(&t->state);
      if (s == MP_TC_EXITING) { /* its thread is flushing: wait */
        MP_HOOK(MP_HOOK_DESTROY_WAIT, t);
        sched_yield();
        continue;
      }
      if (s == MP_TC_LIVE) {
        /* The owner thread frees it later (thread_exit or the next lookup
         * of its TLS list); the pool's memory goes away with us, so the
         * record must never be flushed again - ORPHAN says so. */
        if (!mp_cas_strong_acq_rel(&t->state, &s, MP_TC_ORPHAN)) continue;
        /* The calling thread's own memo must not serve a new pool that
         * lands at this address with this record (uid guards it too). */
        if (mp_tls_last == t) mp_tls_last = NULL;
        break;
      }
      free(t); /* FREE: nobody owns it */
      break;
    }
    t = next;
  }
  pool->tcaches = NULL;
}

void mp_tcache_enter_owner_wait(mp_tcache *tc) {
  while (!mp_tcache_enter_owner(tc)) sched_yield();
}

/* Thieves: lock (a token unique to this call: the address of a local),
 * announce on every candidate, one barrier for all, then take each one's
 * magazines as its owner leaves. */
size_t mp_tcaches_steal(magpool_t *pool, mp_tcache *self, mp_acct *a) {
  char token_obj;
  uintptr_t token = (uintptr_t)&token_obj;
  size_t n = 0;
  for (mp_tcache *t = mp_load_acquire(&pool->tcaches); t != NULL; t = t->pool_next) {
    uintptr_t free_tok = 0;
    if (t == self || mp_load_acquire(&t->state) != MP_TC_LIVE ||
        mp_load_relaxed(&t->st.cached) == 0 || mp_load_relaxed(&t->thief) != 0 ||
        !mp_cas_strong_acquire(&t->thief, &free_tok, token))
      continue;
    mp_revoke_begin(&t->rv);
    n++;
  }
  if (n == 0) return 0;
  mp_asym_heavy();
  size_t bytes = 0;
  for (mp_tcache *t = mp_load_acquire(&pool->tcaches); t != NULL; t = t->pool_next) {
    if (mp_load_relaxed(&t->thief) != token) continue;
    mp_revoke_wait(&t->rv);
    bytes += (size_t)mp_load_relaxed(&t->st.cached);
    mp_tcache_flush(pool, t, a);
    mp_revoke_end(&t->rv);
    /* RELEASE: our writes to the record are done before the next thief's
     * ACQUIRE lock. */
    mp_store_release(&t->thief, 0);
  }
  return bytes;
}
