/* stream_cache.c - the per-thread stream slots: the cache of blocks one
 * thread freed on one stream, the memo that finds the slot, and the
 * thieves that take slots over (release, trim, the ladder, exit).
 * Layer 4: calls the stream table (stream_table.c), retire, magazines and
 * regions; the thread record calls it, never the reverse.
 *
 * A block freed on stream S by thread T is reusable at once by T's
 * allocations on S (the slot), and by everyone else once S has passed the
 * free (the slot's magazines are retired behind S).  A thread-local
 * one-entry memo maps (handle, epoch) to the slot; magpool_stream_release
 * bumps the epoch, so no memo outlives a release.
 *
 * Thieves take slots over with the revoke handshake (revoke.h), holding
 * the slot's entry lock, which also keeps thieves of one entry apart.
 *
 * Concurrency contract:
 *   slot cache (mag, full) ... owner inside enter/exit, or a thief holding
 *                              the entry lock after revoke
 *   slot bytes ............... written with the cache; read by stats
 *   entry slot list .......... push under the entry lock; walked by
 *                              thieves under it and by stats; never shrinks
 *   owner's slot list, memo .. owner only
 * Accounting invariant (quiescent, in bytes):
 *   tree free + live + thread caches + depots + stream slots + pending +
 *   ready == reserved
 */
#include "stream_cache.h"

#include <sched.h>
#include <stdlib.h>

/* ----------------------------------------------------------------- slots */

/* Detaches every magazine of sl into one chain.  Owner inside, or a thief
 * holding the slot. */
static mp_mag *slot_take_all(magpool_t *pool, mp_sslot *sl) {
  mp_mag *chain = NULL;
  for (unsigned k = 0; k < MP_MAX_CLASSES; k++) {
    for (mp_mag *m = sl->full[k]; m != NULL;) {
      mp_mag *mn = mp_load_relaxed(&m->next);
      mp_store_relaxed(&m->next, chain);
      chain = m;
      m = mn;
    }
    sl->full[k] = NULL;
    mp_mag *m = sl->mag[k];
    sl->mag[k] = NULL;
    if (m != NULL && m->count != 0) {
      mp_store_relaxed(&m->next, chain);
      chain = m;
    } else if (m != NULL) {
      mp_mag_free(pool, m);
    }
  }
  mp_store_relaxed(&sl->bytes, 0);
  return chain;
}

/* Detaches only the full magazines.  Owner inside. */
static mp_mag *slot_take_full(magpool_t *pool, mp_sslot *sl) {
  mp_mag *chain = NULL;
  int64_t gone = 0;
  for (unsigned k = 0; k < MP_MAX_CLASSES; k++) {
    for (mp_mag *m = sl->full[k]; m != NULL;) {
      mp_mag *mn = mp_load_relaxed(&m->next);
      gone += (int64_t)m->count * (int64_t)mp_block_bytes(pool, k);
      mp_store_relaxed(&m->next, chain);
      chain = m;
      m = mn;
    }
    sl->full[k] = NULL;
  }
  mp_slot_bytes_add(sl, -gone);
  return chain;
}

/* Thief: takes every non-empty slot of e and returns their magazines as
 * one chain.  Caller holds the entry lock. */
static mp_mag *entry_steal_locked(magpool_t *pool, mp_sentry *e) {
  mp_sslot *head = mp_load_acquire(&e->slots);
  bool any = false;
  for (mp_sslot *sl = head; sl != NULL; sl = sl->next) {
    if (mp_load_relaxed(&sl->bytes) == 0) continue;
    mp_revoke_begin(&sl->rv);
    any = true;
  }
  if (!any) return NULL;
  mp_revoke_barrier();
  mp_mag *chain = NULL;
  for (mp_sslot *sl = head; sl != NULL; sl = sl->next) {
    if (mp_load_relaxed(&sl->rv.revoke) == 0) continue;
    mp_revoke_wait(&sl->rv); /* the owner's cache writes are visible */
    mp_mag *c = slot_take_all(pool, sl);
    while (c != NULL) {
      mp_mag *n = mp_load_relaxed(&c->next);
      mp_store_relaxed(&c->next, chain);
      chain = c;
      c = n;
    }
    mp_revoke_end(&sl->rv); /* the emptied cache is visible to the owner */
  }
  return chain;
}

/* The owner's slot in e, made on first use.  Owner only; takes the entry
 * lock to push a new slot. */
static mp_sslot *slot_of_owner(mp_sentry *e, mp_tcache *tc) {
  for (mp_sslot *sl = mp_load_acquire(&e->slots); sl != NULL; sl = sl->next)
    if (sl->owner == tc) return sl;
  mp_sslot *sl = calloc(1, sizeof *sl);
  if (sl == NULL) return NULL;
  sl->owner = tc;
  sl->e = e;
  mp_entry_lock(e);
  sl->next = mp_load_relaxed(&e->slots);
  /* RELEASE: the slot is initialised before walkers reach it. */
  mp_store_release(&e->slots, sl);
  mp_entry_unlock(e);
  sl->tnext = tc->s_slots;
  tc->s_slots = sl;
  return sl;
}

int mp_slot_lookup(magpool_t *pool, mp_tcache *tc, magpool_stream_t s, mp_sslot **out) {
  int cap = mp_capture_rc(pool, s);
  if (cap != 0) return cap;
  uint64_t sid;
  int rc = pool->sops->get_id(pool->src_ctx, s, &sid);
  if (rc != 0) return rc;
  uint64_t ep = mp_load_acquire(&pool->stream_epoch);
  mp_sentry *e = mp_entry_find(pool, sid + 1, s, true); /* +1: 0 means empty */
  mp_sslot *sl = e != NULL ? slot_of_owner(e, tc) : NULL;
  if (sl != NULL) {
    tc->s_handle = s;
    tc->s_slot = sl;
    tc->s_epoch = ep;
    tc->s_check_capture = pool->sops->check_capture && pool->cfg.capture_check;
  }
  *out = sl;
  return 0;
}

void *mp_slot_pop_owner(magpool_t *pool, mp_sslot *sl, unsigned order) {
  if (!mp_slot_enter_owner(sl)) return NULL;
  void *p = NULL;
  mp_mag *m = sl->mag[order];
  if (m != NULL && m->count != 0) {
    p = m->slot[--m->count];
  } else if (sl->full[order] != NULL) { /* swap in a full magazine */
    mp_mag *f = sl->full[order];
    sl->full[order] = mp_load_relaxed(&f->next);
    if (m != NULL) mp_mag_free(pool, m);
    sl->mag[order] = f;
    p = f->slot[--f->count];
  }
  if (p != NULL) mp_slot_bytes_add(sl, -(int64_t)mp_block_bytes(pool, order));
  mp_slot_exit_owner(sl);
  return p;
}

bool mp_slot_push_owner(magpool_t *pool, mp_sslot *sl, magpool_stream_t s, void *p,
                        unsigned order) {
  if (!mp_slot_enter_owner(sl)) return false;
  mp_mag *m = sl->mag[order];
  if (m != NULL && m->count == m->cap) { /* full: chain it */
    mp_store_relaxed(&m->next, sl->full[order]);
    sl->full[order] = m;
    m = NULL;
  }
  if (m == NULL) m = sl->mag[order] = mp_mag_new_cap(pool, order, pool->s_mag_cap[order]);
  if (m == NULL) {
    mp_slot_exit_owner(sl);
    return false;
  }
  m->slot[m->count++] = p;
  mp_slot_bytes_add(sl, (int64_t)mp_block_bytes(pool, order));
  mp_mag *chain = NULL;
  if (mp_load_relaxed(&sl->bytes) > (int64_t)pool->cfg.stream_cache_bytes)
    chain = slot_take_full(pool, sl);
  mp_slot_exit_owner(sl);
  if (chain != NULL) mp_retire_chain(pool, &sl->e->pending, s, chain);
  return true;
}

/* ---------------------------------------------------------------- thieves */

void mp_streams_release(magpool_t *pool, uint64_t sid, magpool_stream_t s) {
  mp_sentry *e = mp_entry_find(pool, sid + 1, s, false);
  if (e == NULL) return;
  mp_entry_lock(e);
  if (mp_load_relaxed(&e->sid) == sid + 1) {
    /* Every thread's blocks freed on s go behind s's work, now, while s is
     * still a valid stream. */
    mp_mag *chain = entry_steal_locked(pool, e);
    if (chain != NULL) mp_retire_chain(pool, &e->pending, s, chain);
    /* No memo may reach this entry for s any more. */
    mp_fetch_add_acq_rel(&pool->stream_epoch, 1);
    mp_store_release(&e->sid, 0);
  }
  mp_entry_unlock(e);
}

void mp_streams_flush_caches(magpool_t *pool) {
  mp_streams *ss = pool->streams;
  for (unsigned i = 0; i < MP_STREAM_TABLE; i++) {
    mp_sentry *e = mp_load_acquire(&ss->tab[i]);
    if (e == NULL || mp_load_relaxed(&e->sid) == 0) continue;
    if (!mp_entry_try(e)) continue; /* another thief is at it */
    /* A per-thread stream's handle names our own stream here, not its
     * owner's: only the owner retires it (mp_streams_thread_flush). */
    if (mp_load_relaxed(&e->sid) != 0 && !pool->sops->per_thread(e->handle) &&
        pool->sops->capturing(pool->src_ctx, e->handle) == 0) {
      mp_mag *chain = entry_steal_locked(pool, e);
      if (chain != NULL) mp_retire_chain(pool, &e->pending, e->handle, chain);
    }
    mp_entry_unlock(e);
  }
}

/* The owner's flush holds its entry's lock from before it reads the
 * stream until the blocks are retired: a release (which takes the lock)
 * cannot clear the stream in between, so the program cannot destroy the
 * stream under the retire either.  Blocks never go to the tree here. */
void mp_streams_thread_flush(magpool_t *pool, mp_tcache *tc) {
  for (mp_sslot *sl = tc->s_slots; sl != NULL; sl = sl->tnext) {
    if (mp_load_relaxed(&sl->bytes) == 0) continue;
    mp_sentry *e = sl->e;
    mp_entry_lock(e);
    /* Released: the release took what the slot held, and no async call on
     * the stream may race a release, so the slot is empty.  Capturing: a
     * callback may not be enqueued; the blocks stay cached until a later
     * flush.  A thief holds revoke only under the entry lock, which we
     * hold, so the enter cannot fail; it orders us after the last thief. */
    if (mp_load_relaxed(&e->sid) == 0 || pool->sops->capturing(pool->src_ctx, e->handle) != 0 ||
        !mp_slot_enter_owner(sl)) {
      mp_entry_unlock(e);
      continue;
    }
    mp_mag *chain = slot_take_all(pool, sl);
    mp_slot_exit_owner(sl);
    MP_HOOK(MP_HOOK_SLOT_FLUSH, sl);
    if (chain != NULL) mp_retire_chain(pool, &e->pending, e->handle, chain);
    mp_entry_unlock(e);
  }
}

void mp_streams_destroy(magpool_t *pool) {
  mp_streams *ss = pool->streams;
  if (ss == NULL) return;
  mp_retire_fini(pool);
  for (unsigned i = 0; i < MP_STREAM_TABLE; i++) {
    mp_sentry *e = mp_load_relaxed(&ss->tab[i]);
    if (e == NULL) continue;
    for (mp_sslot *sl = mp_load_relaxed(&e->slots); sl != NULL;) {
      mp_sslot *n = sl->next;
      free(sl);
      sl = n;
    }
  }
  mp_stream_table_fini(pool);
}
