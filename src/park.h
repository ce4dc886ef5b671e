/* park.h - the stream entry's park (park.c), layer 4: the async paths
 * (alloc_async.c) and the stream slots (stream_cache.c) call it. */
#ifndef MAGPOOL_PARK_H
#define MAGPOOL_PARK_H

#include "internal.h"

/* ------------------------------------------------------------------ park.c */
/* Run frees that do not ask the stream (passed_hint, park.c) after it
 * said "not passed", at most; after it said "passed" twice running, at
 * most, and only while the last MP_PARK_SOLO run takes of the pool were
 * the stream's; idle_back's flag: the last answer was "passed". */
#define MP_PARK_IDLE_BACK 64u
#define MP_PARK_YES_BACK 8u
/* MP_PARK_YES_BACK while the stream made the pool's last MP_PARK_SOLO_RUNS
 * run takes (a training loop's stream: one query in 8 run frees cost it
 * about 10 ns an event on an H200; docs/design.md). */
#define MP_PARK_YES_BACK_SOLO 64u
#define MP_PARK_SOLO 64u
#define MP_PARK_YES 0x80000000u
/* A stream whose run frees keep their fence batch open past the budget
 * (mp_park_solo): it made the pool's last MP_PARK_SOLO_RUNS run takes, a
 * training loop's steps of them, not a burst of one stream among several. */
#define MP_PARK_SOLO_RUNS 4096u

/* The stream entry's park (mp_park, types.h): blocks freed on the entry's
 * stream that allocations on it from any thread reuse at once.  Every
 * function takes the park's lock (rank 0, innermost) for a few loads and
 * stores; the caller holds a use of e (a slot, or the entry lock inside a
 * read-side section).  The lock orders the parker's writes (to the
 * magazines, and the program's to the block on the host) before the
 * taker's: ACQUIRE CAS, RELEASE store. */

/* A parked block of `order` for a request of `size`, or NULL (none now;
 * the mask is read first, relaxed, so a miss costs no lock).  On a
 * chunked pool only a block whose cost (mp_block_cost) covers the
 * request's whole chunks serves: a parked run keeps the chunks it was
 * backed with; the one of least cost, and (unless `peak`: the request
 * would raise the pool's high-water mark) at most max(need / 8, a chunk)
 * above the request's.  Any thread allocating on e's stream. */
void *mp_park_take(magpool_t *pool, mp_sentry *e, unsigned order, size_t size, bool peak);
/* Parks p (freed on s, e's stream); a run on a chunked pool is fenced
 * for s instead (runs.h), into the open fence batch, which goes behind s
 * in one batch once its runs pass the budget.  If the park would pass its budget
 * (mp_park_budget), its least recently used orders go behind s first, and
 * now and then the orders idle for long (park.c): in one batch (one
 * stream callback); p stays parked (alone if it is over the budget).  A
 * run (a chunk or more) or a block over the budget is parked only if s
 * has not passed its free (mp_stream_ops.idle), or was not asked (s is
 * asked now and then: park.c, passed_hint).  false if p was not
 * parked (s passed it, parking off, the entry released, no magazine): the
 * caller retires p, passing on *passed (what the park learned of s: -1
 * not asked, 0 not passed, 1 passed).  A fenced run's bytes leave `a`,
 * the calling thread's account (settled in its batches, not per call).
 * Any thread freeing on s. */
bool mp_park_put(magpool_t *pool, mp_acct *a, mp_sentry *e, magpool_stream_t s, void *p,
                 unsigned order, int *passed);
/* Parks a chain of full magazines of stream-cached orders (a slot's
 * overflow, freed on s), retiring the park's stream-cached blocks first
 * if they would pass their budget.  false: nothing parked, the caller
 * retires the chain. */
bool mp_park_put_chain(magpool_t *pool, mp_sentry *e, magpool_stream_t s, mp_mag *chain);
/* Detaches everything parked in e and returns it prepended to `chain`;
 * with `close`, later parks fail (the entry is being released).  The
 * caller retires the result behind e's stream.  Any thread holding e's
 * entry lock (so e's stream is valid), or its destroy. */
mp_mag *mp_park_take_all(magpool_t *pool, mp_sentry *e, bool close, mp_mag *chain);
/* mp_park_take_all, retiring what it takes behind h (with `chain`), and
 * the open fence batch with it (with `close`, later runs are not fenced
 * here: the caller retires them).  Under e's entry lock (h valid). */
void mp_park_retire_all(magpool_t *pool, mp_sentry *e, magpool_stream_t h, bool close,
                        mp_mag *chain);
/* A whole magazine of stream-cached `order` (at least two blocks, at
 * most `room` bytes) off e's park for the caller's slot, or NULL (none
 * now: the mask is read first, relaxed).  Any thread allocating on e's
 * stream, holding a use of e. */
mp_mag *mp_park_take_mag(magpool_t *pool, mp_sentry *e, unsigned order, int64_t room);
/* Before new memory for an allocation on s (e's stream): e's park goes
 * behind s (to the trees at once if s has passed it: mp_retire_chain),
 * so that what the allocation cannot use of it is not held for s alone
 * while the pool grows; runs fenced without asking while s keeps up
 * (passed_hint) are asked about first.  Never waits.  Nothing if s is
 * capturing.  The caller holds a use of e. */
void mp_park_settle(magpool_t *pool, mp_sentry *e, magpool_stream_t s);
/* Ends e's solo (runs.h): its runs are fenced for e's stream in the open
 * fence batch, as any (no CUDA call, no wait).  false: no host memory for
 * that (the solo goes on).  Any thread holding no lock, e alive (a use of
 * it, or a read-side section). */
bool mp_park_end_solo(magpool_t *pool, mp_sentry *e);
/* The same for the stream whose solo runs refused a take
 * (mp_acct.solo_hit): the API's slow path, before it takes again.  self:
 * the taker's stream (its mp_acct.fence_owner), in a call on it; if the
 * solo is its own, its stream is asked too (mp_park_settle). */
void mp_streams_end_solo(magpool_t *pool, uint64_t self);
/* The budget of `order`'s kind (park.c): stream-cached orders
 * stream_cache_bytes, larger ones max(stream_cache_bytes, pool_size / 8).
 * The open fence batch goes behind its stream past it (fence_put): not
 * split, since its runs are in the free runs already, and a smaller
 * batch would only cost more callbacks. */
static inline int64_t mp_park_kind_budget(const magpool_t *pool, unsigned order) {
  int64_t sc = (int64_t)pool->cfg.stream_cache_bytes;
  if (order < pool->s_nclasses || sc == 0) return sc;
  int64_t big = (int64_t)(pool->cfg.pool_size / 8);
  return big > sc ? big : sc;
}

/* Has s made the pool's last `n` run takes (runs.taker, runs.takes: it
 * alone takes runs now)?  A hint (relaxed). */
static inline bool mp_park_solo(const magpool_t *pool, const mp_sentry *e, uint64_t n) {
  return pool->chunks != NULL && mp_load_relaxed(&pool->chunks->runs.taker) == e->key &&
         mp_load_relaxed(&pool->chunks->runs.takes) >= n;
}

/* The most bytes a park keeps of blocks of `order`: its kind's budget
 * split among the pool's live streams, so that a program with many
 * streams holds no more in parks than one with one.  A hint (relaxed). */
static inline int64_t mp_park_budget(const magpool_t *pool, unsigned order) {
  uint64_t n = mp_load_relaxed(&pool->streams->nlive);
  return mp_park_kind_budget(pool, order) / (int64_t)(n > 1 ? n : 1);
}

#endif /* MAGPOOL_PARK_H */
