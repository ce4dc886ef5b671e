/* alloc_async.c - the stream-ordered entry points: magpool_alloc_async,
 * magpool_free_async, magpool_stream_release.  Layer 5.
 *
 * The fast paths: the calling thread's memo names its slot for s, no thief
 * holds the slot, and the slot's magazine for the class has a block
 * (alloc) or room (free), for a block of region 0.  No atomic RMW, no
 * lock, no shared write but the block's header.  Anything else takes the
 * full path, which repeats every check.  The full paths use the stream's
 * park (park.c) next: blocks any thread freed on s, of any size.  A miss
 * calls the validated internal paths of alloc.c (any block free for the
 * whole pool is free for s too), never the public entry points.
 */
#include "alloc.h"
#include "park.h"
#include "runs.h"
#include "stream_cache.h"

/* The memo: the record's slot for s, while no trim happened since (the
 * trim epoch, thread.h).  A release closes the slot (revoke.h): the fast
 * paths' enter then fails, and the full paths look s up again. */
MP_INLINE bool memo_hit(magpool_t *pool, mp_tcache *tc, magpool_stream_t s) {
  return mp_tcache_current(tc, pool) && tc->s_slot != NULL && tc->s_handle == s;
}

MP_INLINE int memo_get(magpool_t *pool, mp_tcache *tc, magpool_stream_t s, mp_sslot **out) {
  if (MP_LIKELY(tc->s_slot != NULL && tc->s_handle == s &&
                !mp_revoke_closed(&tc->s_slot->rv))) {
    *out = tc->s_slot;
    return 0;
  }
  return mp_slot_lookup(pool, tc, s, out);
}

/* The stream is checked before anything changes: fetching the thread
 * record may return its caches after a trim, and a call that fails must
 * leave the pool as it was.  A stream the thread's memo names (record of
 * this pool, slot open) is known good; any other is asked about (capture,
 * id), and *asked (unless NULL) says so. */
static int stream_precheck(magpool_t *pool, magpool_stream_t s, bool *asked) {
  mp_tcache *tc = mp_tls_last;
  bool known = tc != NULL && tc->pool == pool && tc->uid == pool->uid && tc->s_slot != NULL &&
               tc->s_handle == s && !mp_revoke_closed(&tc->s_slot->rv);
  if (asked != NULL) *asked = !known;
  if (known) return 0;
  int cap = mp_capture_rc(pool, s);
  if (cap != 0) return cap;
  uint64_t sid;
  return pool->sops->get_id(pool->src_ctx, s, &sid);
}

/* ------------------------------------------------------------------ alloc */

static void *alloc_on_stream(magpool_t *pool, mp_tcache *tc, mp_sslot *sl, unsigned order,
                             size_t size, magpool_stream_t s);

/* alloc_on_stream for the take's owner: runs fenced by s (runs.h) are
 * s's at once, so its takes may use them. */
static void *alloc_owned(magpool_t *pool, mp_tcache *tc, mp_sslot *sl, unsigned order, size_t size,
                         magpool_stream_t s) {
  tc->acct.fence_owner = sl != NULL ? sl->e->key : 0;
  void *p = alloc_on_stream(pool, tc, sl, order, size, s);
  tc->acct.fence_owner = 0;
  return p;
}

static MP_NOINLINE void *alloc_async_full(magpool_t *pool, size_t size, magpool_stream_t s) {
  if (MP_UNLIKELY(pool == NULL)) return mp_fail(MAGPOOL_EINVAL);
  mp_sslot *sl = NULL;
  unsigned order;
  mp_tcache *tc;
  if (MP_UNLIKELY(mp_size_order(pool, size, &order) != 0)) return mp_fail(MAGPOOL_ENOMEM);
  if (mp_no_stream(pool, s)) {
    if (MP_UNLIKELY((tc = mp_tcache_get(pool)) == NULL)) return mp_fail(MAGPOOL_ENOMEM);
    return mp_alloc_order(pool, tc, order, size, 0);
  }
  int rc = stream_precheck(pool, s, NULL);
  if (MP_UNLIKELY(rc != 0)) return mp_fail(rc);
  if (MP_UNLIKELY((tc = mp_tcache_get(pool)) == NULL)) return mp_fail(MAGPOOL_ENOMEM);
  rc = memo_get(pool, tc, s, &sl);
  if (MP_UNLIKELY(rc != 0)) return mp_fail(rc);
  return alloc_owned(pool, tc, sl, order, size, s);
}

/* alloc_async_full after a memo hit (a request above the slot's classes,
 * or a slot miss): the stream and the record are known good, so only the
 * slot's close is checked again (a release since sends the call the full
 * way, which looks s up anew). */
static MP_NOINLINE void *alloc_async_known(magpool_t *pool, mp_tcache *tc, size_t size,
                                           magpool_stream_t s) {
  mp_sslot *sl = tc->s_slot;
  unsigned order;
  if (MP_UNLIKELY(mp_revoke_closed(&sl->rv))) return alloc_async_full(pool, size, s);
  if (MP_UNLIKELY(mp_size_order(pool, size, &order) != 0)) return mp_fail(MAGPOOL_ENOMEM);
  return alloc_owned(pool, tc, sl, order, size, s);
}

/* Would a block of `order` for `size` make a chunked pool's busy chunks
 * pass their high-water mark (and pool_size, which stays mapped)?  A
 * block under a chunk counts as one chunk: it may need one free of
 * blocks.  A hint (relaxed reads); false on other pools. */
static bool new_peak(const magpool_t *pool, unsigned order, size_t size) {
  const mp_chunks *c = pool->chunks;
  if (c == NULL) return false;
  uint64_t n = (uint64_t)(mp_request_cost(pool, order, size) >> c->shift);
  uint64_t after = mp_chunks_nbusy(c) + (n == 0 ? 1 : n);
  return after > mp_load_relaxed(&c->hwm) && after > c->keep;
}

/* A slot miss on a stream-cached order: a whole magazine of what other
 * threads freed on s, off its park, within the slot's share, so that a
 * thread that allocates what another frees (a training step's forward
 * and backward threads) takes the park's lock once a magazine, not once
 * a block.  NULL: none (the caller takes single blocks). */
static void *slot_refill(magpool_t *pool, mp_sslot *sl, unsigned order, magpool_stream_t s) {
  if (order >= pool->s_nclasses) return NULL;
  int64_t room = sl->owner->s_limit - mp_load_relaxed(&sl->bytes);
  mp_mag *m = room > 0 ? mp_park_take_mag(pool, sl->e, order, room) : NULL;
  return m != NULL ? mp_slot_load_owner(pool, sl, s, m) : NULL;
}

/* cross_stream_reuse at a new peak: s waits for the other streams that
 * have runs fenced, and the take may use those runs (mp_streams_adopt).
 * Not while s is captured: the wait would join the graph. */
static MP_NOINLINE void *alloc_adopting(magpool_t *pool, mp_tcache *tc, mp_sslot *sl,
                                        unsigned order, size_t size, magpool_stream_t s) {
  mp_adopt ad = {.n = 0};
  if (pool->sops->capturing(pool->src_ctx, s) == 0) mp_streams_adopt(pool, sl->e, s, &ad);
  if (ad.n == 0) return mp_alloc_order(pool, tc, order, size, 0);
  MP_HOOK(MP_HOOK_ADOPT_TAKE, &ad);
  tc->acct.adopt = &ad;
  void *p = mp_alloc_order(pool, tc, order, size, 0);
  tc->acct.adopt = NULL;
  return p;
}

/* alloc_async_full on a known stream: its slot, its park, the tree. */
static void *alloc_on_stream(magpool_t *pool, mp_tcache *tc, mp_sslot *sl, unsigned order,
                             size_t size, magpool_stream_t s) {
  if (sl != NULL) {
    void *p = order < pool->s_nclasses ? mp_slot_pop_owner(pool, sl, order) : NULL;
    /* Then what any thread freed on s: free for s at once. */
    if (p == NULL) p = slot_refill(pool, sl, order, s);
    if (p == NULL) p = mp_park_take(pool, sl->e, order, size, false);
    if (p != NULL) return mp_hand_out(pool, tc, p, order, size, 0);
    if (new_peak(pool, order, size)) {
      /* The count says a new peak, but the busy chunks count S's own
       * fenced runs, which S reuses without raising it: the tree first,
       * refused where it would raise the mark or move chunks.  Then a
       * parked run that covers the request serves it whatever it
       * wastes: its chunks are busy already, and the other way maps new
       * ones (and on a busy stream the run would only go pending
       * behind S). */
      if ((p = mp_region_take_need(pool, &tc->acct, order, size, MP_TAKE_NOPEAK)) != NULL ||
          (p = mp_park_take(pool, sl->e, order, size, true)) != NULL)
        return mp_hand_out(pool, tc, p, order, size, 0);
      mp_streams_retire_parks(pool, sl->e);
      mp_park_settle(pool, sl->e, s);
      mp_retire_drain(pool, &tc->acct);
      if (pool->cfg.cross_stream_reuse && pool->sops->wait != NULL &&
          mp_load_relaxed(&pool->chunks->runs.nfenced) != 0)
        return alloc_adopting(pool, tc, sl, order, size, s);
    } else if (pool->chunks != NULL && mp_run_order(pool, order) &&
               (mp_load_relaxed(&sl->e->park.mask) >> order & 1)) {
      /* Runs of this order are parked on S, none within the waste rule:
       * if the tree can serve without moving chunks (53 us each on a
       * GPU), it does; else a parked run serves, whatever it wastes (its
       * chunks are busy already), before the tree moves chunks. */
      p = mp_region_take_need(pool, &tc->acct, order, size, MP_TAKE_NOMOVE);
      if (p == NULL) p = mp_park_take(pool, sl->e, order, size, true);
      if (p != NULL) return mp_hand_out(pool, tc, p, order, size, 0);
    }
  }
  return mp_alloc_order(pool, tc, order, size, 0);
}

void *magpool_alloc_async(magpool_t *pool, size_t size, magpool_stream_t s) {
  MP_DBG_ENTER(pool);
  void *ret;
  mp_tcache *tc = mp_tls_last;
  bool known = memo_hit(pool, tc, s);
  /* size - 1 < max: size 0 (a min_block block) takes the full path, and
   * nothing does while the stream caches are off (tracking). */
  if (MP_LIKELY(known && size - 1 < tc->s_cache_max)) {
    unsigned order = mp_cached_order(tc, size);
    mp_sslot *sl = tc->s_slot;
    if (MP_LIKELY(mp_slot_enter_owner(sl))) {
      mp_mag *m = sl->mag[order];
      if (MP_LIKELY(m != NULL && m->count != 0)) {
        char *p = m->slot[m->count - 1];
        size_t off = (size_t)(p - tc->r0_base);
        if (MP_LIKELY(off < tc->r0_bytes)) {
          size_t bs = (size_t)1 << (order + tc->shift);
          m->count--;
          mp_slot_bytes_add(sl, -(int64_t)bs);
          mp_slot_exit_owner(sl);
          mp_store_relaxed(&tc->r0_hdr[off >> tc->shift], mp_hdr_make_small(order, bs - size, 0));
          mp_owner_add(&tc->st.requested, size);
          mp_owner_add(&tc->st.allocs, 1);
          ret = p;
          goto out;
        }
      }
      mp_slot_exit_owner(sl);
    }
  }
  ret = known ? alloc_async_known(pool, tc, size, s) : alloc_async_full(pool, size, s);
out:
  MP_DBG_LEAVE(pool);
  /* Trace recording (trace.c): after the allocation succeeded. */
  if (ret != NULL && MP_UNLIKELY(pool->trace != NULL)) mp_trace_alloc(pool->trace, ret, size, s);
  return ret;
}

/* ------------------------------------------------------------------- free */

/* The slow half of free_async, after the header was validated but not yet
 * claimed.  not_capturing: s is known not to be captured now - the caller
 * has just asked (free_async_capture, stream_precheck), or the pool asks
 * no question on s (host streams; capture_check 0, where the program
 * releases s before it captures on it, which closes every memo of s, so
 * a stream that passed stream_precheck is not being captured). */
static MP_NOINLINE int free_async_slow(magpool_t *pool, mp_tcache *tc, mp_sslot *sl,
                                       magpool_stream_t s, void *p, _Atomic uint32_t *h,
                                       unsigned order, size_t req, bool not_capturing) {
  /* Anything past this point may enqueue a callback: not during capture. */
  int cap = not_capturing ? 0 : mp_capture_rc(pool, s);
  if (cap != 0) return cap;
  mp_hdr_clear(h); /* claim: from here on the block is ours */
  if (MP_UNLIKELY(mp_load_relaxed(&pool->tracking))) mp_track_on_free(pool, p);
  mp_owner_add(&tc->st.requested, -(uint64_t)req);
  mp_owner_add(&tc->st.frees, 1);
  if (order < pool->s_nclasses && sl != NULL && mp_slot_push_owner(pool, sl, s, p, order))
    return 0;
  /* Not in the slot: the stream's park, reusable at once by any thread's
   * allocations on s, retired in batches. */
  int passed = -1;
  if (sl != NULL && mp_park_put(pool, &tc->acct, sl->e, s, p, order, &passed)) return 0;
  /* Unparked: retire this block alone. */
  mp_mag *m = mp_mag_new(pool, order);
  if (m == NULL) { /* no host memory: wait for the stream instead */
    pool->sops->sync(pool->src_ctx, s);
    mp_region_give(pool, &tc->acct, p, order);
    return 0;
  }
  m->slot[0] = p;
  m->count = 1;
  mp_store_relaxed(&m->next, NULL);
  mp_retire_chain(pool, sl != NULL ? &sl->e->pending : NULL, sl != NULL ? sl->e->key : 0, s, m,
                  passed);
  return 0;
}

static MP_NOINLINE int free_async_full(magpool_t *pool, void *ptr, magpool_stream_t s,
                                       bool not_capturing) {
  if (MP_UNLIKELY(pool == NULL)) return MAGPOOL_EINVAL;
  if (ptr == NULL) return 0;
  /* Validate without claiming: nothing may change on an error. */
  _Atomic uint32_t *h;
  unsigned order;
  size_t req;
  if (mp_no_stream(pool, s)) {
    int vr = mp_block_validate(pool, ptr, 0, false, false, &h, &order, &req);
    if (MP_UNLIKELY(vr != 0)) return vr;
    mp_free_validated(pool, mp_tcache_get(pool), ptr, h, order, req);
    return 0;
  }
  /* Pointer and stream are checked before anything changes (see
   * stream_precheck). */
  int rc = mp_block_validate(pool, ptr, 0, false, false, &h, &order, &req);
  if (MP_UNLIKELY(rc != 0)) return rc;
  bool asked;
  if (MP_UNLIKELY((rc = stream_precheck(pool, s, &asked)) != 0)) return rc;
  mp_tcache *tc = mp_tcache_get(pool);
  if (MP_UNLIKELY(tc == NULL)) return MAGPOOL_ENOMEM;
  mp_sslot *sl;
  rc = memo_get(pool, tc, s, &sl);
  if (MP_UNLIKELY(rc != 0)) return rc;
  /* With capture_check 0 every free of a run asked here: a driver call,
   * 50 ns on the H200 (docs/benchmarks.md, run 112). */
  not_capturing = not_capturing || asked ||
                  !(pool->sops->check_capture && pool->cfg.capture_check);
  return free_async_slow(pool, tc, sl, s, ptr, h, order, req, not_capturing);
}

/* free_async_full after a memo hit whose block the slot did not take (a
 * run, a block above the slot's classes, a full slot): the stream and the
 * record are known good, so the pointer is validated and only the slot's
 * close is checked again (a release since sends the call the full way).
 * Asks no more than free_async_full: a known stream was not asked there. */
static MP_NOINLINE int free_async_known(magpool_t *pool, mp_tcache *tc, void *ptr,
                                        magpool_stream_t s, bool not_capturing) {
  mp_sslot *sl = tc->s_slot;
  if (ptr == NULL) return 0;
  if (MP_UNLIKELY(mp_revoke_closed(&sl->rv))) return free_async_full(pool, ptr, s, not_capturing);
  _Atomic uint32_t *h;
  unsigned order;
  size_t req;
  int rc = mp_block_validate(pool, ptr, 0, false, false, &h, &order, &req);
  if (MP_UNLIKELY(rc != 0)) return rc;
  not_capturing = not_capturing || !(pool->sops->check_capture && pool->cfg.capture_check);
  return free_async_slow(pool, tc, sl, s, ptr, h, order, req, not_capturing);
}

/* The free fast path proper: true if it freed ptr into the thread's slot.
 * No calls, so the inline caller needs no stack frame. */
MP_INLINE bool free_async_hit(mp_tcache *tc, void *ptr) {
  _Atomic uint32_t *h = mp_tcache_r0_hdr(tc, ptr);
  if (MP_UNLIKELY(h == NULL)) return false;
  uint32_t w = mp_hdr_read(h);
  unsigned order = mp_hdr_order(w); /* ~0u when not live */
  mp_sslot *sl = tc->s_slot;
  if (MP_UNLIKELY(order >= tc->s_nclasses || mp_hdr_scoped(w) || !mp_slot_enter_owner(sl)))
    return false;
  size_t bs = (size_t)1 << (order + tc->shift);
  mp_mag *m = sl->mag[order];
  if (MP_UNLIKELY(m == NULL || m->count >= m->cap ||
                  mp_load_relaxed(&sl->bytes) + (int64_t)bs > tc->s_limit)) {
    mp_slot_exit_owner(sl);
    return false;
  }
  mp_hdr_clear(h); /* claim */
  m->slot[m->count++] = ptr;
  mp_slot_bytes_add(sl, (int64_t)bs);
  mp_slot_exit_owner(sl);
  mp_owner_add(&tc->st.requested, -(uint64_t)(bs - mp_hdr_slack_small(w)));
  mp_owner_add(&tc->st.frees, 1);
  return true;
}

/* CUDA streams: a free recorded into a graph being captured must not make
 * its block reusable now (graph replays would keep writing it), so every
 * free asks first, once (the slow half does not ask again); on a capturing
 * stream free_async_slow answers MAGPOOL_ECAPTURE, after the validation. */
static MP_NOINLINE int free_async_capture(magpool_t *pool, mp_tcache *tc, void *ptr,
                                          magpool_stream_t s) {
  int cap = mp_capture_rc(pool, s);
  if (cap == 0 && free_async_hit(tc, ptr)) return 0;
  return free_async_known(pool, tc, ptr, s, cap == 0);
}

static inline int free_async_impl(magpool_t *pool, void *ptr, magpool_stream_t s) {
  mp_tcache *tc = mp_tls_last;
  if (MP_LIKELY(memo_hit(pool, tc, s))) {
    if (MP_UNLIKELY(tc->s_check_capture)) return free_async_capture(pool, tc, ptr, s);
    if (MP_LIKELY(free_async_hit(tc, ptr))) return 0;
    return free_async_known(pool, tc, ptr, s, false);
  }
  return free_async_full(pool, ptr, s, false);
}

/* Trace recording (trace.c): the sequence number before the free. */
static MP_NOINLINE int free_async_traced(magpool_t *pool, void *ptr, magpool_stream_t s) {
  uint64_t seq = mp_trace_seq(pool->trace);
  int rc = free_async_impl(pool, ptr, s);
  if (rc == 0) mp_trace_free(pool->trace, seq, ptr, s);
  return rc;
}

int magpool_free_async(magpool_t *pool, void *ptr, magpool_stream_t s) {
  MP_DBG_ENTER(pool);
  int rc = pool != NULL && ptr != NULL && MP_UNLIKELY(pool->trace != NULL)
               ? free_async_traced(pool, ptr, s)
               : free_async_impl(pool, ptr, s);
  MP_DBG_LEAVE(pool);
  return rc;
}

/* ---------------------------------------------------------------- release */

int magpool_stream_release(magpool_t *pool, magpool_stream_t s) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  if (mp_no_stream(pool, s)) return 0;
  int cap = mp_capture_rc(pool, s);
  if (cap != 0) return cap;
  uint64_t sid;
  int rc = pool->sops->get_id(pool->src_ctx, s, &sid);
  if (rc != 0) return rc;
  MP_DBG_ENTER(pool);
  mp_streams_release(pool, sid, s);
  MP_DBG_LEAVE(pool);
  return 0;
}
