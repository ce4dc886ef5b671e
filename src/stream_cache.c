/* stream_cache.c - the per-thread stream slots: the cache of blocks one
 * thread freed on one stream, the memo that finds the slot, and the
 * thieves that take slots over (release, trim, the ladder, exit).
 * Layer 4: calls the stream table (stream_table.c), retire, magazines and
 * regions; the thread record calls it, never the reverse.
 *
 * A block freed on stream S by thread T is reusable at once by T's
 * allocations on S (the slot); the slot's overflow goes to S's park
 * (park.c), reusable at once by every thread's allocations on S; everyone
 * else gets them once S has passed the free (the park retires them behind
 * S in batches; thieves retire slots and park together), or, with
 * cross_stream_reuse, a stream at a new peak that waits for S first
 * (mp_streams_adopt: its runs only).  A thread-local
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
#include "park.h"
#include "runs.h"
#include "stream_cache.h"

#include <sched.h>
#include <stdlib.h>
#include <urcu-bp.h>

/* ----------------------------------------------------------------- slots */

/* Detaches every magazine of sl onto `chain` (NULL: a new one).  Owner
 * inside, or a thief holding the slot. */
static mp_mag *slot_take_all(magpool_t *pool, mp_sslot *sl, mp_mag *chain) {
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

/* Detaches the full magazines of class k onto chain; their bytes leave
 * the slot's.  Owner inside. */
static mp_mag *slot_take_full_class(magpool_t *pool, mp_sslot *sl, unsigned k, mp_mag *chain) {
  int64_t gone = 0;
  for (mp_mag *m = sl->full[k]; m != NULL;) {
    mp_mag *mn = mp_load_relaxed(&m->next);
    gone += (int64_t)m->count * (int64_t)mp_block_bytes(pool, k);
    mp_store_relaxed(&m->next, chain);
    chain = m;
    m = mn;
  }
  sl->full[k] = NULL;
  if (gone != 0) mp_slot_bytes_add(sl, -gone);
  return chain;
}

/* Detaches only the full magazines, of every class, onto chain.  Owner
 * inside. */
static mp_mag *slot_take_full(magpool_t *pool, mp_sslot *sl, mp_mag *chain) {
  for (unsigned k = 0; k < MP_MAX_CLASSES; k++) chain = slot_take_full_class(pool, sl, k, chain);
  return chain;
}

/* Thief: takes every non-empty slot of e (with `close`, every slot, and
 * closes them for good: the entry is being released) and returns their
 * magazines as one chain.  Caller holds the entry lock. */
static mp_mag *entry_steal_locked(magpool_t *pool, mp_sentry *e, bool close) {
  mp_sslot *head = mp_load_acquire(&e->slots);
  bool any = false;
  for (mp_sslot *sl = head; sl != NULL; sl = mp_load_acquire(&sl->next)) {
    if (!close && mp_load_relaxed(&sl->bytes) == 0) continue;
    mp_revoke_begin(&sl->rv);
    any = true;
  }
  if (!any) return NULL;
  mp_asym_heavy();
  mp_mag *chain = NULL;
  for (mp_sslot *sl = head; sl != NULL; sl = mp_load_acquire(&sl->next)) {
    if (mp_load_relaxed(&sl->rv.revoke) != 1) continue;
    mp_revoke_wait(&sl->rv); /* the owner's cache writes are visible */
    mp_mag *c = slot_take_all(pool, sl, NULL);
    while (c != NULL) {
      mp_mag *n = mp_load_relaxed(&c->next);
      mp_store_relaxed(&c->next, chain);
      chain = c;
      c = n;
    }
    if (close) mp_revoke_close(&sl->rv); /* the owner's memo sees it */
    else mp_revoke_end(&sl->rv);         /* the emptied cache is visible */
  }
  if (close) {
    MP_HOOK(MP_HOOK_SLOTS_CLOSED, e);
    /* After the closes (RMW, releasing them): an owner that reads the new
     * count sweeps and sees them closed (sweep_closed_owner). */
    mp_fetch_add_acq_rel(&pool->streams->closes, 1);
  }
  return chain;
}

/* Slots are freed after a grace period: a stats walk may be reading one
 * that its owner just unlinked. */
typedef struct slot_node {
  mp_sslot sl;
  struct rcu_head rcu;
} slot_node;

static void slot_free_rcu(struct rcu_head *h) {
  mp_streams_rcu_callback();
  slot_node *sn = caa_container_of(h, slot_node, rcu);
  mp_tsan_acquire(sn); /* call_rcu's hand-off, which TSan cannot see */
  free(sn);
}

/* The thread's slots share its share of stream_cache_bytes
 * (mp_cache_share: all of it unless many threads use the pool): each
 * keeps at most s_limit bytes of its own frees (the free fast path and
 * mp_slot_push_owner), so a thread that frees on many streams holds no
 * more than one that frees on one.  Owner only; again at each push that
 * needs a magazine, so that a share that fell is given back. */
static void slots_changed(mp_tcache *tc, int d) {
  tc->s_nslots += d;
  tc->s_limit = (int64_t)(mp_cache_share(tc->pool, tc->pool->cfg.stream_cache_bytes) /
                          (tc->s_nslots > 0 ? tc->s_nslots : 1));
}

/* The owner's slot in e, made on first use (then counted as a use of e).
 * NULL if e was released meanwhile (*dead set) or out of host memory.
 * Owner only, inside a read-side section; takes the entry lock to push a
 * new slot. */
static mp_sslot *slot_of_owner(mp_sentry *e, mp_tcache *tc, bool *dead) {
  *dead = false;
  for (mp_sslot *sl = mp_load_acquire(&e->slots); sl != NULL; sl = mp_load_acquire(&sl->next))
    if (sl->owner == tc) return sl;
  slot_node *sn = calloc(1, sizeof *sn);
  if (sn == NULL) return NULL;
  mp_sslot *sl = &sn->sl;
  sl->owner = tc;
  sl->e = e;
  mp_entry_lock(e);
  if (mp_load_relaxed(&e->sid) == 0) { /* released under us: look again */
    mp_entry_unlock(e);
    free(sn);
    *dead = true;
    return NULL;
  }
  mp_fetch_add_acq_rel(&e->users, 1);
  mp_store_relaxed(&sl->next, mp_load_relaxed(&e->slots));
  /* RELEASE: the slot is initialised before walkers reach it. */
  mp_store_release(&e->slots, sl);
  mp_entry_unlock(e);
  sl->tnext = tc->s_slots;
  tc->s_slots = sl;
  slots_changed(tc, 1);
  return sl;
}

/* The owner drops its closed slots (their entries are released): off its
 * list, off the entry's list (under the entry lock), one use of the entry
 * less, freed after a grace period.  Owner only.  Unless `all`, only when
 * a release closed slots since the last sweep: a thread that moves among
 * many streams looks one up at each move, and would walk every slot it
 * owns each time.  Invariant: a closed slot still on tc's list was closed
 * by a release not yet counted in tc->s_closes.  The count is read before
 * the walk, so a close counted later is swept by a later call; one that
 * is closed but not yet counted may wait for the next sweep (where it is
 * found like any closed slot: the memo and the enter see it closed). */
static void sweep_closed_owner(magpool_t *pool, mp_tcache *tc, bool all) {
  /* ACQUIRE: pairs with the count's RMW in entry_steal_locked. */
  uint64_t n = mp_load_acquire(&pool->streams->closes);
  if (n == tc->s_closes && !all) return;
  tc->s_closes = n;
  bool any = false;
  for (mp_sslot **link = &tc->s_slots; *link != NULL;) {
    mp_sslot *sl = *link;
    if (!mp_revoke_closed(&sl->rv)) {
      link = &sl->tnext;
      continue;
    }
    *link = sl->tnext;
    slots_changed(tc, -1);
    if (tc->s_slot == sl) tc->s_slot = NULL;
    mp_sentry *e = sl->e;
    mp_entry_lock(e);
    _Atomic(mp_sslot *) *pl = &e->slots;
    while (mp_load_relaxed(pl) != sl) pl = &mp_load_relaxed(pl)->next;
    /* RELEASE: walkers see the list with or without sl, never broken. */
    mp_store_release(pl, mp_load_relaxed(&sl->next));
    mp_entry_unlock(e);
    mp_entry_unuse(e);
    slot_node *sn = caa_container_of(sl, slot_node, sl);
    mp_tsan_release(sn);
    urcu_bp_call_rcu(&sn->rcu, slot_free_rcu);
    any = true;
  }
  if (any) mp_streams_reap(pool);
}

int mp_slot_lookup(magpool_t *pool, mp_tcache *tc, magpool_stream_t s, mp_sslot **out) {
  int cap = mp_capture_rc(pool, s);
  if (cap != 0) return cap;
  uint64_t sid;
  int rc = pool->sops->get_id(pool->src_ctx, s, &sid);
  if (rc != 0) return rc;
  sweep_closed_owner(pool, tc, false);
  mp_sslot *sl = NULL;
  bool dead = true;
  mp_streams_read_lock();
  while (dead) {
    mp_sentry *e = mp_entry_find_rcu(pool, sid + 1, s, true);
    if (e == NULL) break;
    sl = slot_of_owner(e, tc, &dead);
  }
  mp_streams_read_unlock();
  if (sl != NULL) {
    tc->s_handle = s;
    tc->s_slot = sl;
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

void *mp_slot_load_owner(magpool_t *pool, mp_sslot *sl, magpool_stream_t s, mp_mag *m) {
  if (!mp_slot_enter_owner(sl)) { /* a thief: the blocks go where its slot's went */
    if (!mp_park_put_chain(pool, sl->e, s, m))
      mp_retire_chain(pool, &sl->e->pending, sl->e->key, s, m, -1);
    return NULL;
  }
  unsigned o = m->order;
  int64_t bs = (int64_t)mp_block_bytes(pool, o), add = (int64_t)m->count * bs - bs;
  mp_mag *cur = sl->mag[o];
  if (cur == NULL || cur->count == 0) { /* the pop missed: empty, nothing behind it */
    if (cur != NULL) mp_mag_free(pool, cur);
    sl->mag[o] = cur = m;
  } else { /* not after a miss (a thief empties what it holds): m goes behind */
    mp_store_relaxed(&m->next, sl->full[o]);
    sl->full[o] = m;
  }
  void *p = cur->slot[--cur->count];
  mp_slot_bytes_add(sl, add);
  mp_slot_exit_owner(sl);
  return p;
}

/* A slot's overflow goes to the stream's park, where any thread's
 * allocations on s reuse it; the park batches the retires. */
static void park_overflow(magpool_t *pool, mp_sslot *sl, magpool_stream_t s, mp_mag *chain) {
  if (chain != NULL && !mp_park_put_chain(pool, sl->e, s, chain))
    mp_retire_chain(pool, &sl->e->pending, sl->e->key, s, chain, -1);
}

bool mp_slot_push_owner(magpool_t *pool, mp_sslot *sl, magpool_stream_t s, void *p,
                        unsigned order) {
  if (!mp_slot_enter_owner(sl)) return false;
  mp_mag *m = sl->mag[order], *chain = NULL;
  if (m != NULL && m->count == m->cap) { /* full: it stays behind the new one */
    /* and what was behind goes to the stream's park (below), as a thread
     * cache's depot: a thread that frees what another allocates on s (a
     * training step's backward and forward threads) would otherwise hold
     * it up to its share while the other allocates new blocks.  */
    chain = slot_take_full_class(pool, sl, order, NULL);
    mp_store_relaxed(&m->next, NULL);
    sl->full[order] = m;
    m = NULL;
  }
  if (m == NULL) {
    slots_changed(sl->owner, 0);
    /* A magazine no larger than the slot's share, so that the share
     * overflows a full magazine at a time, not the slot's whole cache. */
    uint32_t cap = pool->s_mag_cap[order];
    int64_t fit = sl->owner->s_limit / (int64_t)mp_block_bytes(pool, order);
    if (fit < (int64_t)cap) cap = fit > 1 ? (uint32_t)fit : 1;
    m = sl->mag[order] = mp_mag_new_cap(pool, order, cap);
  }
  if (m == NULL) { /* no host memory: p is the caller's, the chain not */
    mp_slot_exit_owner(sl);
    park_overflow(pool, sl, s, chain);
    return false;
  }
  m->slot[m->count++] = p;
  mp_slot_bytes_add(sl, (int64_t)mp_block_bytes(pool, order));
  /* Over its share: the full magazines go, and the partial ones too if
   * that is not enough (they were sized for the whole budget). */
  if (mp_load_relaxed(&sl->bytes) > sl->owner->s_limit) {
    chain = slot_take_full(pool, sl, chain);
    if (mp_load_relaxed(&sl->bytes) > sl->owner->s_limit) chain = slot_take_all(pool, sl, chain);
  }
  mp_slot_exit_owner(sl);
  park_overflow(pool, sl, s, chain);
  return true;
}

/* ---------------------------------------------------------------- thieves */

/* Under the entry lock and a read-side section: every thread's blocks
 * freed on the entry's stream go behind its work (h names it here), the
 * slots close, and the entry leaves the table. */
static void entry_release_locked(magpool_t *pool, mp_sentry *e, magpool_stream_t h) {
  mp_park_retire_all(pool, e, h, true, entry_steal_locked(pool, e, true));
  mp_entry_release_locked(pool, e);
}

void mp_streams_release(magpool_t *pool, uint64_t sid, magpool_stream_t s) {
  mp_streams_read_lock();
  mp_sentry *e = mp_entry_find_rcu(pool, sid + 1, s, false);
  if (e != NULL) {
    mp_entry_lock(e);
    if (mp_load_relaxed(&e->sid) == sid + 1) entry_release_locked(pool, e, s);
    mp_entry_unlock(e);
  }
  mp_streams_read_unlock();
  mp_streams_reap(pool);
}

static void flush_one(magpool_t *pool, mp_sentry *e, void *arg) {
  (void)arg;
  if (mp_load_relaxed(&e->sid) == 0 || !mp_entry_try(e)) return; /* busy: another thief */
  /* A per-thread stream's handle names our own stream here, not its
   * owner's: only the owner retires it (mp_streams_thread_flush). */
  if (mp_load_relaxed(&e->sid) != 0 && !pool->sops->per_thread(e->handle) &&
      pool->sops->capturing(pool->src_ctx, e->handle) == 0) {
    mp_park_retire_all(pool, e, e->handle, false, entry_steal_locked(pool, e, false));
  }
  mp_entry_unlock(e);
}

static void park_retire_one(magpool_t *pool, mp_sentry *e, void *except) {
  if (e == except || (mp_load_relaxed(&e->park.bytes) == 0 && mp_load_relaxed(&e->park.fbytes) == 0))
    return;
  if (mp_load_relaxed(&e->sid) == 0 || !mp_entry_try(e)) return; /* busy: skip it */
  if (mp_load_relaxed(&e->sid) != 0 && !pool->sops->per_thread(e->handle) &&
      pool->sops->capturing(pool->src_ctx, e->handle) == 0) {
    mp_park_retire_all(pool, e, e->handle, false, NULL);
  }
  mp_entry_unlock(e);
}

typedef struct adopt_walk {
  mp_sentry *self;
  magpool_stream_t t;
  mp_adopt *ad;
} adopt_walk;

/* Under the entry lock: no release can clear the stream meanwhile, so
 * the program cannot destroy it under the wait either.  The tag is read
 * before the park's open batch is detached: a run fenced with a tag at
 * most it was fenced before the detach (under the fence lock), so its
 * free, and the work before it, come before the wait's mark on the
 * stream; a batch opened later takes a newer tag. */
static void adopt_one(magpool_t *pool, mp_sentry *e, void *arg) {
  adopt_walk *w = arg;
  if (e == w->self || w->ad->n == MP_ADOPT_MAX ||
      (mp_load_relaxed(&e->pending) == 0 && mp_load_relaxed(&e->park.fbytes) == 0))
    return;
  if (mp_load_relaxed(&e->sid) == 0 || !mp_entry_try(e)) return; /* busy: skip it */
  if (mp_load_relaxed(&e->sid) != 0 && !pool->sops->per_thread(e->handle) &&
      pool->sops->capturing(pool->src_ctx, e->handle) == 0) {
    uint32_t tag = mp_runs_tag_now(pool);
    mp_park_retire_all(pool, e, e->handle, false, NULL);
    MP_HOOK(MP_HOOK_ADOPT, e);
    if (pool->sops->wait(pool->src_ctx, w->t, e->handle) == 0) {
      w->ad->owner[w->ad->n] = e->key;
      w->ad->tag[w->ad->n++] = tag;
    }
  }
  mp_entry_unlock(e);
}

void mp_streams_adopt(magpool_t *pool, mp_sentry *self, magpool_stream_t t, mp_adopt *ad) {
  adopt_walk w = {self, t, ad};
  mp_streams_read_lock();
  mp_streams_each_rcu(pool, adopt_one, &w);
  mp_streams_read_unlock();
}

void mp_streams_retire_parks(magpool_t *pool, mp_sentry *except) {
  mp_streams_read_lock();
  mp_streams_each_rcu(pool, park_retire_one, except);
  mp_streams_read_unlock();
}

void mp_streams_flush_caches(magpool_t *pool) {
  mp_streams_read_lock();
  mp_streams_each_rcu(pool, flush_one, NULL);
  mp_streams_read_unlock();
}

/* The owner's flush holds its entry's lock from before it reads the
 * stream until the blocks are retired: a release (which takes the lock)
 * cannot clear the stream in between, so the program cannot destroy the
 * stream under the retire either.  Blocks never go to the tree here. */
void mp_streams_thread_flush(magpool_t *pool, mp_tcache *tc, bool exiting) {
  sweep_closed_owner(pool, tc, exiting);
  for (mp_sslot *sl = tc->s_slots; sl != NULL; sl = sl->tnext) {
    mp_sentry *e = sl->e;
    /* At exit, the entry of this thread's per-thread stream is released:
     * no other thread can ever name that stream. */
    bool own_stream = exiting && pool->sops->per_thread(e->handle);
    /* After a trim, the stream's park too (every thread that used the
     * stream passes here); at exit only the slot: other threads may still
     * be reusing the park. */
    bool park = !exiting && (mp_load_relaxed(&e->park.bytes) != 0 ||
                             mp_load_relaxed(&e->park.fbytes) != 0);
    if (mp_load_relaxed(&sl->bytes) == 0 && !park && !own_stream) continue;
    mp_streams_read_lock();
    mp_entry_lock(e);
    /* Released: the release took what the slot held, and no async call on
     * the stream may race a release, so the slot is empty.  Capturing: a
     * callback may not be enqueued; the blocks stay cached until a later
     * flush.  A thief holds revoke only under the entry lock, which we
     * hold, so the enter cannot fail; it orders us after the last thief. */
    if (mp_load_relaxed(&e->sid) != 0 && pool->sops->capturing(pool->src_ctx, e->handle) == 0) {
      if (own_stream) {
        entry_release_locked(pool, e, e->handle);
      } else if (mp_slot_enter_owner(sl)) {
        mp_mag *chain = slot_take_all(pool, sl, NULL);
        mp_slot_exit_owner(sl);
        MP_HOOK(MP_HOOK_SLOT_FLUSH, sl);
        if (park) mp_park_retire_all(pool, e, e->handle, false, chain);
        else if (chain != NULL) mp_retire_chain(pool, &e->pending, e->key, e->handle, chain, -1);
      }
    }
    mp_entry_unlock(e);
    mp_streams_read_unlock();
  }
  if (exiting) sweep_closed_owner(pool, tc, true);
}

/* Destroy: nothing else runs on the pool.  Every slot is in exactly one
 * entry's list (the table's entries and the dead ones). */
static void destroy_slots(mp_sentry *e) {
  for (mp_sslot *sl = mp_load_relaxed(&e->slots); sl != NULL;) {
    mp_sslot *n = mp_load_relaxed(&sl->next);
    free(caa_container_of(sl, slot_node, sl));
    sl = n;
  }
  mp_store_relaxed(&e->slots, NULL);
}

static void destroy_one(magpool_t *pool, mp_sentry *e, void *arg) {
  (void)pool;
  (void)arg;
  destroy_slots(e);
}

void mp_streams_destroy(magpool_t *pool) {
  mp_streams *ss = pool->streams;
  if (ss == NULL) return;
  mp_retire_fini(pool);
  mp_streams_read_lock();
  mp_streams_each_rcu(pool, destroy_one, NULL);
  mp_streams_read_unlock();
  for (mp_sentry *e = ss->dead; e != NULL; e = e->dead_next) destroy_slots(e);
  mp_stream_table_fini(pool);
}
