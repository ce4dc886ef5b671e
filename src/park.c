/* park.c - the stream entry's park: blocks freed on a stream that
 * allocations on that stream reuse at once, from any thread and at any
 * size, until they are retired behind the stream in batches.  Layer 4:
 * calls retire and the magazine objects; stream_cache.c (the thieves) and
 * alloc_async.c (the async calls) call it.
 *
 * A thread's own slot (stream_cache.c) stays the first tier for small
 * blocks: lock-free, no atomic RMW.  The park is the shared second tier:
 *   - blocks of orders no slot caches (larger than cache_max_block, or
 *     than half of stream_cache_bytes), and blocks a slot refused (a thief
 *     held it, no magazine), one at a time (mp_park_put);
 *   - a slot's overflow, whole magazines (mp_park_put_chain).
 * A slot miss takes a whole magazine (mp_park_take_mag) or one block
 * (mp_park_take) before it goes to the tree.  Reuse is by order; on a
 * chunked pool a run also by cost (its backed chunks must cover the
 * request, best fit within need/8), and every count is a block's cost
 * (mp_block_cost).
 *
 * At a new peak (mp_park_new_peak: the busy chunks would pass their
 * high-water mark and pool_size) an allocation retires the parks,
 * every other stream's and its own (mp_park_settle), before the tree:
 * held blocks would otherwise raise the mark for good.  Never a wait.
 *
 * Budget and batching (one stream callback per batch, never per free;
 * docs/design.md has the figures): stream-cached orders at most
 * stream_cache_bytes, larger ones max(stream_cache_bytes, pool_size / 8),
 * each split among the pool's live streams (park.h); a park that would pass
 * its budget retires the kind's least recently used orders down to half of
 * it (make_room_locked); every MP_PARK_AGE_STEP-th park retires the orders
 * idle for MP_PARK_AGE operations; trim, the ladder's cache rung, release
 * and a thread's own flush retire the whole park under the entry lock
 * (mp_park_take_all); stream_cache_bytes == 0 turns parking off (every
 * async free retired).  Runs are fenced instead of parked (fence_put,
 * passed_hint); a run batch stays open past the budget while s alone takes
 * runs (solo).  Parked bytes are cached bytes in the statistics.
 *
 * Concurrency: the lock is a test-and-test-and-set word, held for a few
 * loads and stores (and, at most, one magazine from the lock-free spare
 * stack); it is the innermost lock, so holding it never waits for
 * anything but another holder.  Its ACQUIRE CAS and RELEASE store order
 * a parker's writes before a taker's reads; `mask` and `bytes` are also
 * read without it, relaxed, as a hint (a stale mask costs one missed
 * reuse or one empty look) and as a statistic.
 */
#include "park_bits.h"
#include "runs.h"

#include <stdlib.h>

/* Age: every MP_PARK_AGE_STEP-th park retires the orders that no park or
 * take touched in the last MP_PARK_AGE operations on the park. */
#define MP_PARK_AGE 256u
#define MP_PARK_AGE_STEP 64u

/* What a magazine's blocks cost (mp_block_cost). */
static int64_t mag_cost(const magpool_t *pool, const mp_mag *m) {
  int64_t b = 0;
  for (uint32_t i = 0; i < m->count; i++) b += (int64_t)mp_block_cost(pool, m->slot[i], m->order);
  return b;
}

/* Under the lock: detaches every block of order o onto *chain; frees
 * empty magazines. */
static void detach_order(magpool_t *pool, mp_park *k, unsigned o, mp_mag **chain) {
  mp_mag *m = k->mags[o];
  k->mags[o] = NULL;
  while (m != NULL) {
    mp_mag *mn = mp_load_relaxed(&m->next);
    if (m->count == 0) {
      mp_mag_free(pool, m);
    } else {
      mp_store_relaxed(&m->next, *chain);
      *chain = m;
    }
    m = mn;
  }
  set_bytes(k, pool, o, -k->obytes[o]);
  mp_store_relaxed(&k->mask, mp_load_relaxed(&k->mask) & ~((uint64_t)1 << o));
}

/* Under the lock: every order in [lo, hi) onto *chain. */
static void detach_range(magpool_t *pool, mp_park *k, unsigned lo, unsigned hi, mp_mag **chain) {
  for (unsigned o = lo; o < hi; o++)
    if (k->mags[o] != NULL) detach_order(pool, k, o, chain);
}

/* Under the lock, before `add` bytes of `order` come in: every
 * MP_PARK_AGE_STEP-th time, the orders idle for MP_PARK_AGE operations go;
 * then, if the kind of `order` (stream-cached orders, or larger ones)
 * would pass its budget, its least recently used orders go until it fits
 * in half the budget (so that the batch is worth its callback, and the
 * next ones are far).  What goes is put on *old (one batch). */
static void make_room_locked(magpool_t *pool, mp_park *k, unsigned order, int64_t add,
                             mp_mag **old) {
  uint32_t now = ++k->clock;
  if (now % MP_PARK_AGE_STEP == 0) {
    for (unsigned o = 0; o <= MP_MAX_ORDER; o++)
      if (k->mags[o] != NULL && o != order && now - k->used[o] > MP_PARK_AGE)
        detach_order(pool, k, o, old);
  }
  k->used[order] = now;
  bool small = is_small(pool, order);
  unsigned lo = small ? 0 : pool->s_nclasses, hi = small ? pool->s_nclasses : MP_MAX_ORDER + 1;
  int64_t budget = mp_park_budget(pool, order);
  int64_t kind = small ? k->small_bytes : mp_load_relaxed(&k->bytes) - k->small_bytes;
  if (kind + add <= budget) return;
  while (kind + add > budget / 2) {
    unsigned lru = hi;
    for (unsigned o = lo; o < hi; o++)
      if (k->obytes[o] != 0 && (lru == hi || now - k->used[o] > now - k->used[lru])) lru = o;
    if (lru == hi) break; /* nothing left: the new block is parked alone */
    kind -= k->obytes[lru];
    detach_order(pool, k, lru, old);
  }
}

/* ------------------------------------------------------------ fenced runs */

/* The open fence batch, detached.  Until its runs are unfenced, back in
 * the open batch or behind the stream, it counts in pending_batches: the
 * ladder goes round again while that is not 0, and misses no run. */
typedef struct fbatch {
  uint32_t *fr, n, tag, cap;
  int64_t bytes;
} fbatch;

static fbatch fence_detach(magpool_t *pool, mp_park *k) { /* under flock */
  fbatch f = {k->fr, k->fn, k->ftag, k->fcap, mp_load_relaxed(&k->fbytes)};
  if (f.n != 0) mp_fetch_add_acq_rel(&pool->retire.pending_batches, 1);
  k->fr = NULL;
  k->fn = k->fcap = 0;
  mp_store_relaxed(&k->fbytes, 0);
  return f;
}

static void fence_done(magpool_t *pool, fbatch f) {
  if (f.n != 0) mp_fetch_add_acq_rel(&pool->retire.pending_batches, -1);
}

static void fence_retire(magpool_t *pool, mp_sentry *e, magpool_stream_t s, fbatch f) {
  if (f.n != 0) mp_retire_fenced(pool, &e->pending, s, f.fr, f.n, f.tag, f.bytes);
  else free(f.fr);
  fence_done(pool, f);
}

/* Under the fence lock: room in the open batch for one more range (the
 * array doubles); false: no host memory. */
static bool fr_room(mp_park *k) {
  if (k->fn < k->fcap) return true;
  uint32_t cap = k->fcap != 0 ? 2 * k->fcap : 16, *fr = realloc(k->fr, 2 * sizeof *fr * cap);
  if (fr == NULL) return false;
  k->fr = fr;
  k->fcap = cap;
  return true;
}

/* ------------------------------------------------------------- solo runs */

/* Under the fence lock: the solo's runs (runs.h) are fenced for s with
 * the open batch's tag, their range noted in it.  false: no host memory
 * for the range (the solo goes on). */
static bool solo_merge(magpool_t *pool, mp_sentry *e) {
  mp_park *k = &e->park;
  if (!mp_load_relaxed(&k->fsolo)) return true;
  MP_HOOK(MP_HOOK_SOLO_END, k);
  if (!fr_room(k)) return false;
  uint32_t tag = k->fn != 0 ? k->ftag : mp_runs_tag(pool), *r = &k->fr[2 * k->fn];
  if (mp_runs_solo_end(pool, e->key, tag, r)) {
    k->ftag = tag;
    k->fn++;
    mp_store_relaxed(&k->fbytes, mp_load_relaxed(&k->fbytes) + ((int64_t)r[1] << pool->chunks->shift));
  }
  mp_store_relaxed(&k->fsolo, false);
  return true;
}

bool mp_park_end_solo(magpool_t *pool, mp_sentry *e) {
  word_lock(&e->park, &e->park.flock);
  bool ok = solo_merge(pool, e);
  word_unlock(&e->park.flock);
  return ok;
}

/* Run p freed on s while s makes every run take (mp_park_solo): given
 * back as s's solo run (runs.h), in no batch, s not asked.  1 done; 0 not
 * (another stream's solo is there, or no host memory for the end's
 * range); -1 the park is closed. */
static int solo_put(magpool_t *pool, mp_acct *a, mp_sentry *e, void *p, unsigned order) {
  mp_park *k = &e->park;
  int rc = -1;
  MP_HOOK(MP_HOOK_SOLO_PUT, k);
  word_lock(k, &k->flock);
  if (k->fclosed) goto out;
  rc = 0;
  if (!fr_room(k)) goto out; /* the end's range, so that it seldom needs memory */
  if (!mp_region_give_solo(pool, a, p, order, e->key)) goto out;
  mp_store_relaxed(&k->fsolo, true);
  rc = 1;
out:
  word_unlock(&k->flock);
  return rc;
}

typedef struct solo_walk { uint64_t key, self; } solo_walk;

static int ask(magpool_t *pool, mp_sentry *e, magpool_stream_t s, bool settle);

/* The solo's own take (self): its stream is asked too, as at a new peak,
 * so that the runs it has passed are unfenced at once (a call on the
 * stream is under way, so its handle is good). */
static void end_solo_one(magpool_t *pool, mp_sentry *e, void *arg) {
  const solo_walk *w = arg;
  if (e->key != w->key || !mp_park_end_solo(pool, e)) return;
  if (w->key == w->self && pool->sops->idle != NULL && mp_load_relaxed(&e->sid) != 0 &&
      pool->sops->capturing(pool->src_ctx, e->handle) == 0)
    (void)ask(pool, e, e->handle, true);
}

void mp_streams_end_solo(magpool_t *pool, uint64_t self) {
  solo_walk w = {mp_runs_solo(pool), self};
  if (w.key == 0) return;
  mp_streams_read_lock();
  mp_streams_each_rcu(pool, end_solo_one, &w);
  mp_streams_read_unlock();
}

/* A release or flush (h: e's stream, valid): the solo's runs join the open
 * batch, which goes behind h.  With no host memory for that, a closing
 * park waits for h instead (no solo free comes after the close), and the
 * solo's runs stay free as they are. */
static void end_solo_closing(magpool_t *pool, mp_sentry *e, magpool_stream_t h, bool close) {
  if (!mp_load_relaxed(&e->park.fsolo) || mp_park_end_solo(pool, e) || !close) return;
  pool->sops->sync(pool->src_ctx, h);
  word_lock(&e->park, &e->park.flock);
  (void)mp_runs_solo_drop(pool, e->key);
  mp_store_relaxed(&e->park.fsolo, false);
  word_unlock(&e->park.flock);
}

/* Run p, freed on s, which has not passed the free (or was not asked):
 * back to the free runs at once, fenced for s with the open batch's tag
 * (runs.h), its range noted in the batch; the batch goes behind s once
 * it holds more than the park's budget of runs, unless `keep` (s keeps
 * up: the next question, a few frees on, settles the batch; passed_hint).
 * 1 fenced, 0 no host memory to note it (park it), -1 the park is closed
 * (the caller retires p). */
static int fence_put(magpool_t *pool, mp_acct *a, mp_sentry *e, magpool_stream_t s, void *p,
                     unsigned order, bool keep) {
  mp_park *k = &e->park;
  fbatch old = {NULL, 0, 0, 0, 0};
  int rc = -1;
  word_lock(k, &k->flock);
  if (k->fclosed) goto out;
  rc = 0;
  if (!fr_room(k)) goto out; /* no host memory for the range: p is parked */
  if (k->fn == 0) k->ftag = mp_runs_tag(pool);
  uint32_t *r = &k->fr[2 * k->fn];
  int f = mp_region_fence(pool, a, p, order, k->ftag, e->key, false, r);
  if (f == 0) goto out;
  rc = 1;
  /* A run s took back from this batch and freed again (f == 2): its
   * chunks are noted already and carry the tag again, and their bytes
   * count once (the budget is of runs held fenced, not of frees). */
  if (f == 1) {
    int64_t now = mp_load_relaxed(&k->fbytes) + ((int64_t)r[1] << pool->chunks->shift);
    k->fn++;
    mp_store_relaxed(&k->fbytes, now);
    if (now > mp_park_kind_budget(pool, order) && !keep) old = fence_detach(pool, k);
  }
  MP_HOOK(MP_HOOK_FENCE_PUT, k);
out:
  word_unlock(&k->flock);
  fence_retire(pool, e, s, old);
  return rc;
}

/* Asks s whether it has passed everything queued on it (1 yes, else 0).
 * With `settle`, first detaches the open fence batch: on a yes its runs
 * are unfenced at once (their frees came before the question), on a no
 * they go back into the open batch (behind s if a free opened a new one
 * or a flush came meanwhile).  Detached before the question, the batch
 * holds no run freed after it.  Not on a capturing stream. */
static int ask(magpool_t *pool, mp_sentry *e, magpool_stream_t s, bool settle) {
  mp_park *k = &e->park;
  fbatch old = {NULL, 0, 0, 0, 0};
  uint32_t gen = 0;
  if (settle) {
    word_lock(k, &k->flock);
    if (!k->fclosed && k->fn != 0) old = fence_detach(pool, k);
    gen = k->fgen;
    word_unlock(&k->flock);
  }
  MP_HOOK(MP_HOOK_PARK_IDLE, k);
  int passed = pool->sops->idle(pool->src_ctx, s) == 1;
  MP_HOOK(MP_HOOK_PARK_PASSED, k);
  if (!passed) {
    if (old.n != 0) { /* back, unless a flush came (these then go too) */
      word_lock(k, &k->flock);
      if (!k->fclosed && k->fn == 0 && k->fgen == gen) {
        free(k->fr);
        k->fr = old.fr, k->fn = old.n, k->fcap = old.cap, k->ftag = old.tag;
        mp_store_relaxed(&k->fbytes, old.bytes);
        fence_done(pool, old);
        old = (fbatch){NULL, 0, 0, 0, 0};
      }
      word_unlock(&k->flock);
    }
    fence_retire(pool, e, s, old);
  } else {
    if (old.n != 0) mp_runs_unfence(pool, old.fr, old.n, old.tag);
    free(old.fr);
    fence_done(pool, old);
  }
  return passed;
}

/* Has s passed a run freed on it now?  1 yes, 0 no, -1 not asked (the
 * run is then fenced for s).  s is asked now and then, as `idle` costs
 * 0.5 us on a CUDA stream (docs/design.md, "streams that keep up"): after
 * each "no" the next 1, 2, 4 ... MP_PARK_IDLE_BACK run frees do not ask;
 * after a "yes" that follows a "yes", while s made the pool's last
 * MP_PARK_SOLO run takes (runs.taker, runs.takes), neither do the next 1,
 * 2, 4 ... MP_PARK_YES_BACK (_SOLO after MP_PARK_SOLO_RUNS), and the next
 * question settles their runs (ask).  The counters (idle_skip; idle_back,
 * with MP_PARK_YES) are relaxed hints outside the locks: a lost update
 * asks once more or less, and "not asked" only fences a run that could
 * have gone unfenced. */
static int passed_hint(magpool_t *pool, mp_sentry *e, magpool_stream_t s) {
  mp_park *k = &e->park;
  uint32_t skip = mp_load_relaxed(&k->idle_skip);
  uint32_t st = mp_load_relaxed(&k->idle_back), back = st & ~MP_PARK_YES;
  bool yes_before = (st & MP_PARK_YES) != 0, solo = mp_park_solo(pool, e, MP_PARK_SOLO);
  if (skip != 0 && (solo || !yes_before)) {
    mp_store_relaxed(&k->idle_skip, skip - 1);
    return -1;
  }
  int passed = ask(pool, e, s, yes_before);
  uint32_t most = !passed ? MP_PARK_IDLE_BACK
                  : mp_park_solo(pool, e, MP_PARK_SOLO_RUNS) ? MP_PARK_YES_BACK_SOLO
                                                             : MP_PARK_YES_BACK;
  if (passed ? !yes_before || !solo : yes_before) back = passed ? 0 : 1; /* a streak begins */
  else back = back == 0 ? 1 : back < most ? 2 * back : most;
  mp_store_relaxed(&k->idle_back, passed ? MP_PARK_YES | back : back);
  mp_store_relaxed(&k->idle_skip, back);
  return passed;
}

bool mp_park_put(magpool_t *pool, mp_acct *a, mp_sentry *e, magpool_stream_t s, void *p,
                 unsigned order, int *passed) {
  if (pool->cfg.stream_cache_bytes == 0) return false;
  if (mp_is_run(pool, p) && mp_park_solo(pool, e, MP_PARK_SOLO_RUNS)) { /* runs.h */
    int f = solo_put(pool, a, e, p, order);
    if (f != 0) return f > 0;
  }
  mp_park *k = &e->park;
  int64_t b = (int64_t)mp_block_cost(pool, p, order);
  /* A run (a chunk or more), or a block over its budget (which would be
   * parked alone and retired at the next park): if s has passed its free,
   * the caller gives it to the trees now, as a synchronous free's would
   * (docs/design.md, the park: "Runs on passed streams").  Else a run is
   * fenced for s (fence_put), where s's requests of any size may use its
   * chunks; a parked one would serve only its order. */
  if ((partial(pool, order) || b > mp_park_budget(pool, order)) && pool->sops->idle != NULL &&
      (*passed = passed_hint(pool, e, s)) == 1)
    return false;
  if (mp_is_run(pool, p)) { /* not an extent block: no fence lock, no tag */
    /* Open past the budget: s not asked in a streak of "passed" (the next
     * question settles it), or s alone takes runs (design.md, "Solo"). */
    bool keep = (*passed < 0 && (mp_load_relaxed(&k->idle_back) & MP_PARK_YES) != 0) ||
                mp_park_solo(pool, e, MP_PARK_SOLO_RUNS);
    int f = fence_put(pool, a, e, s, p, order, keep);
    if (f != 0) return f > 0;
  }
  mp_mag *old = NULL;
  bool ok = false;
  park_lock(k);
  if (!k->closed) {
    make_room_locked(pool, k, order, b, &old);
    mp_mag *m = k->mags[order];
    if (m == NULL || m->count == m->cap) {
      mp_mag *n = mp_mag_new_cap(pool, order, MP_MAG_SLOTS);
      if (n != NULL) {
        mp_store_relaxed(&n->next, m);
        k->mags[order] = n;
      }
      m = n;
    }
    if (m != NULL) {
      m->slot[m->count++] = p;
      set_bytes(k, pool, order, b);
      mp_store_relaxed(&k->mask, mp_load_relaxed(&k->mask) | (uint64_t)1 << order);
      ok = true;
      MP_HOOK(MP_HOOK_PARK_PUT, k);
    }
  }
  park_unlock(k);
  if (old != NULL) mp_retire_chain(pool, &e->pending, e->key, s, old, *passed);
  return ok;
}

bool mp_park_put_chain(magpool_t *pool, mp_sentry *e, magpool_stream_t s, mp_mag *chain) {
  if (pool->cfg.stream_cache_bytes == 0 || chain == NULL) return false;
  mp_park *k = &e->park;
  int64_t add = 0;
  for (mp_mag *m = chain; m != NULL; m = mp_load_relaxed(&m->next))
    add += mag_cost(pool, m);
  /* A chain over the stream's whole share is not parked: it would be
   * parked alone, and held for this stream while others go without. */
  if (add > mp_park_budget(pool, chain->order)) return false;
  mp_mag *old = NULL;
  bool ok = false;
  park_lock(k);
  if (!k->closed) {
    make_room_locked(pool, k, chain->order, add, &old);
    uint64_t mask = mp_load_relaxed(&k->mask);
    for (mp_mag *m = chain, *mn; m != NULL; m = mn) {
      mn = mp_load_relaxed(&m->next);
      mp_mag *h = k->mags[m->order];
      if (h != NULL) { /* behind the head, which may be partial */
        mp_store_relaxed(&m->next, mp_load_relaxed(&h->next));
        mp_store_relaxed(&h->next, m);
      } else {
        mp_store_relaxed(&m->next, NULL);
        k->mags[m->order] = m;
      }
      if (m->count != 0) mask |= (uint64_t)1 << m->order;
      set_bytes(k, pool, m->order, mag_cost(pool, m));
      k->used[m->order] = k->clock;
    }
    mp_store_relaxed(&k->mask, mask);
    ok = true;
    MP_HOOK(MP_HOOK_PARK_PUT, k);
  }
  park_unlock(k);
  if (old != NULL) mp_retire_chain(pool, &e->pending, e->key, s, old, -1);
  return ok;
}

mp_mag *mp_park_take_all(magpool_t *pool, mp_sentry *e, bool close, mp_mag *chain) {
  mp_park *k = &e->park;
  if (!close && mp_load_relaxed(&k->bytes) == 0) return chain;
  park_lock(k);
  MP_HOOK(MP_HOOK_PARK_FLUSH, k);
  detach_range(pool, k, 0, MP_MAX_ORDER + 1, &chain);
  if (close) k->closed = true;
  park_unlock(k);
  return chain;
}

void mp_park_retire_all(magpool_t *pool, mp_sentry *e, magpool_stream_t h, bool close,
                        mp_mag *chain) {
  mp_park *k = &e->park;
  chain = mp_park_take_all(pool, e, close, chain);
  if (chain != NULL) mp_retire_chain(pool, &e->pending, e->key, h, chain, -1);
  end_solo_closing(pool, e, h, close); /* its runs go with the batch */
  /* Even with an empty batch: fgen tells a question out (ask) of the flush. */
  word_lock(k, &k->flock);
  fbatch f = fence_detach(pool, k);
  k->fgen++;
  if (close) k->fclosed = true;
  MP_HOOK(MP_HOOK_FENCE_CLOSE, k);
  bool again = close && mp_load_relaxed(&k->fsolo); /* a solo free came in between */
  word_unlock(&k->flock);
  fence_retire(pool, e, h, f);
  if (again) {
    end_solo_closing(pool, e, h, true);
    word_lock(k, &k->flock);
    f = fence_detach(pool, k);
    word_unlock(&k->flock);
    fence_retire(pool, e, h, f);
  }
}

void mp_park_settle(magpool_t *pool, mp_sentry *e, magpool_stream_t s) {
  mp_park *k = &e->park;
  bool fenced = (mp_load_relaxed(&k->idle_back) & MP_PARK_YES) != 0 &&
                mp_load_relaxed(&k->fbytes) != 0 && pool->sops->idle != NULL;
  if ((mp_load_relaxed(&k->bytes) == 0 && !fenced) || pool->sops->capturing(pool->src_ctx, s) != 0)
    return;
  /* s keeps up (passed_hint): the runs its frees fenced without asking
   * are asked about now, before the pool maps more for them. */
  if (fenced) (void)ask(pool, e, s, true);
  if (mp_load_relaxed(&k->bytes) == 0) return;
  /* The park only: s may use its fenced runs (runs.h) whatever happens. */
  mp_mag *chain = mp_park_take_all(pool, e, false, NULL);
  if (chain != NULL) mp_retire_chain(pool, &e->pending, e->key, s, chain, -1);
}
