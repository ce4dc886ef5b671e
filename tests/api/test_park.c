/* test_park.c - stream-ordered reuse of large blocks across threads.
 *
 * magpool.h, magpool_alloc_async: "Blocks freed on s are reused by
 * allocations on s at once: ... any block, of any size, by every thread's
 * allocations on s; any other allocation (another stream, the synchronous
 * API) gets them only once s has passed the free."  And
 * stream_cache_bytes: "0 retires every async free at once".
 *
 * The stream is held by a gate throughout, so no retire callback can run:
 * pending_bytes counts every block retired behind it, and stays 0 while
 * the blocks go from thread to thread without a retire.  On chunked pools
 * a run (a block of a chunk or more) freed on the blocked stream is not
 * parked but fenced: back in the pool's free runs for that stream only
 * (magpool_alloc_async), counted cached as a parked block, and pending
 * once its batch goes behind the stream.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "stream_util.h"

#define BIG (4 * MiB)

typedef struct ctx {
  magpool_t *pool;
  magpool_stream_t s;
  void *x;
  _Atomic long turn;
  _Atomic int bad; /* a thread got another block than x, or a call failed */
} ctx;

typedef struct arg {
  ctx *c;
  int id;
} arg;

/* Thread `id` of two, in turns: allocate 4 MiB on s (must be x, freed by
 * the other thread on s just before), free it on s. */
enum { ROUNDS = 500 };
static void *pingpong(void *p) {
  arg *a = p;
  ctx *c = a->c;
  for (long k = 0; k < ROUNDS; k++) {
    long mine = 2 * k + a->id;
    while (atomic_load(&c->turn) != mine) sched_yield();
    void *q = magpool_alloc_async(c->pool, BIG, c->s);
    if (q != c->x) atomic_store(&c->bad, 1);
    if (q != NULL && magpool_free_async(c->pool, q, c->s) != 0) atomic_store(&c->bad, 1);
    atomic_store(&c->turn, mine + 1);
  }
  return NULL;
}

static void *alloc_on(void *p) {
  ctx *c = p;
  c->x = magpool_alloc_async(c->pool, BIG, c->s);
  return NULL;
}

static void *free_on(void *p) {
  ctx *c = p;
  if (magpool_free_async(c->pool, c->x, c->s) != 0) atomic_store(&c->bad, 1);
  return NULL;
}

static void run(void *(*fn)(void *), void *p) {
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, fn, p), 0);
  pthread_join(t, NULL);
}

/* A pool of whole regions (chunk_size does not divide pool_size: not
 * chunked), where the 4 MiB block is parked; on a chunked pool it is a
 * run and is fenced instead (another_thread_reuses_a_fenced_run_at_once). */
Test(park, another_thread_reuses_a_large_block_at_once, .timeout = 120) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .chunk = 128 * MiB});
  magpool_stream_t S = stream_new(), T = stream_new();
  gate g;
  gate_hold(&g, S);

  ctx c = {.pool = pool, .s = S};
  run(alloc_on, &c); /* thread 1 allocates x on S ... */
  cr_assert_not_null(c.x);
  run(free_on, &c); /* ... and frees it on S, which is blocked */
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 0, "the 4 MiB free was retired at once (pending %zu)",
               st.pending_bytes);
  cr_assert_geq(st.cached_bytes, BIG);

  /* Another stream and the synchronous API do not get x: S has not
   * passed the free. */
  void *t1 = magpool_alloc_async(pool, BIG, T);
  void *t2 = magpool_alloc(pool, BIG);
  cr_assert(t1 != NULL && t2 != NULL);
  cr_assert_neq(t1, c.x, "stream T got a block freed on blocked S");
  cr_assert_neq(t2, c.x, "magpool_alloc got a block freed on blocked S");

  /* Thread 2 (and this one) on S get x at once, without a retire. */
  void *y = NULL;
  ctx c2 = {.pool = pool, .s = S};
  run(alloc_on, &c2);
  y = c2.x;
  cr_assert_eq(y, c.x, "another thread's allocation on S got %p, not %p freed on S", y, c.x);
  cr_assert_eq(mpt_stats(pool).pending_bytes, 0);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);

  /* 1000 more frees of x on S by two threads in turns: every one is
   * reused at once by the other thread, and nothing is retired. */
  atomic_store(&c.turn, 0);
  arg a0 = {&c, 0}, a1 = {&c, 1};
  pthread_t w0, w1;
  cr_assert_eq(pthread_create(&w0, NULL, pingpong, &a0), 0);
  cr_assert_eq(pthread_create(&w1, NULL, pingpong, &a1), 0);
  pthread_join(w0, NULL);
  pthread_join(w1, NULL);
  cr_assert_eq(atomic_load(&c.bad), 0, "a thread on S did not get back the block freed on S");
  st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 0, "1000 frees on S, each reused at once: pending %zu",
               st.pending_bytes);

  /* Trim retires the park behind S: x is pending, still out of reach. */
  cr_assert_eq(magpool_trim(pool), 0);
  st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, BIG);
  void *t3 = magpool_alloc_async(pool, BIG, T);
  cr_assert_not_null(t3);
  cr_assert_neq(t3, c.x, "stream T got the block trim retired behind blocked S");

  cr_assert_eq(magpool_free_async(pool, t1, T), 0);
  cr_assert_eq(magpool_free_async(pool, t3, T), 0);
  cr_assert_eq(magpool_free(pool, t2), 0);
  gate_release(&g, S);
  magpool_stream_t s[] = {S, T};
  finish(pool, PS, s, 2);
}

/* The same on a chunked pool, where the 4 MiB block is a run: freed on
 * blocked S by one thread, it goes back to the free runs fenced for S
 * (magpool_alloc_async): pending, out of reach of T and the synchronous
 * API; another thread's allocation on S gets it at once. */
Test(park, another_thread_reuses_a_fenced_run_at_once, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_stream_t S = stream_new(), T = stream_new();
  gate g;
  gate_hold(&g, S);
  ctx c = {.pool = pool, .s = S}, c2 = {.pool = pool, .s = S};
  run(alloc_on, &c);
  cr_assert_not_null(c.x);
  run(free_on, &c);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.cached_bytes, BIG, "the run fenced for blocked S is not cached (%zu)",
               st.cached_bytes);
  cr_assert_eq(st.pending_bytes, 0);
  void *t1 = magpool_alloc_async(pool, BIG, T), *t2 = magpool_alloc(pool, BIG);
  cr_assert(t1 != NULL && t2 != NULL);
  cr_assert(t1 != c.x && t2 != c.x, "T or the synchronous API got a run fenced for blocked S");
  run(alloc_on, &c2);
  cr_assert_eq(c2.x, c.x, "another thread's allocation on S got %p, not %p freed on S", c2.x, c.x);
  cr_assert_eq(mpt_stats(pool).cached_bytes, 0);
  mpt_assert_conserved(pool);
  cr_assert_eq(magpool_free_async(pool, c2.x, S), 0);
  cr_assert_eq(magpool_free_async(pool, t1, T), 0);
  cr_assert_eq(magpool_free(pool, t2), 0);
  gate_release(&g, S);
  magpool_stream_t s[] = {S, T};
  finish(pool, PS, s, 2);
}

/* stream_cache_bytes = 0: "0 retires every async free at once" - also a
 * large one, which is then not reused on its stream before it passed.
 * The retire behind blocked S is one batch (stream_batches); a free on a
 * stream that has passed everything queues none. */
Test(park, no_stream_cache_parks_nothing, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .stream_cache = MPT_ZERO});
  magpool_stream_t S = stream_new();
  gate g;
  gate_hold(&g, S);
  void *x = magpool_alloc_async(pool, BIG, S);
  cr_assert_not_null(x);
  uint64_t b0 = mpt_stats(pool).stream_batches;
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, BIG);
  cr_assert_eq(st.cached_bytes, 0);
  cr_assert_eq(st.stream_batches, b0 + 1, "%llu batches behind S for one free",
               (unsigned long long)(st.stream_batches - b0));
  /* Retired, the run is back in the free runs fenced by S (runs.h):
   * another stream cannot have it, S can, at once. */
  magpool_stream_t T = stream_new();
  void *t = magpool_alloc_async(pool, BIG, T);
  cr_assert_not_null(t);
  cr_assert(t != x, "T got a run retired behind blocked S");
  void *y = magpool_alloc_async(pool, BIG, S);
  cr_assert_eq(y, x, "S did not get the run it retired");
  cr_assert_eq(mpt_stats(pool).pending_bytes, 0);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  cr_assert_eq(magpool_host_stream_sync(T), 0);
  uint64_t b1 = mpt_stats(pool).stream_batches;
  cr_assert_eq(magpool_free_async(pool, t, T), 0);
  cr_assert_eq(mpt_stats(pool).stream_batches, b1, "a free on idle T queued a batch");
  gate_release(&g, S);
  magpool_stream_t s[] = {S, T};
  finish(pool, PS, s, 2);
}

/* A chunked pool backs a large block only in the whole chunks its request
 * needs, and every byte count counts those chunks (magpool.h,
 * magpool_usable_size).  A 5 MiB run (3 chunks of 2 MiB, in an 8 MiB
 * order) freed on blocked S is fenced: 6 MiB pending.  S's 7 MiB request
 * takes its 3 chunks and the free one after them: nothing left pending;
 * throughout, the counts add up and magpool_check passes. */
Test(park, a_fenced_run_serves_a_larger_request_of_its_stream, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_stream_t S = stream_new();
  gate g;
  gate_hold(&g, S);
  void *x = magpool_alloc_async(pool, 5 * MiB, S);
  cr_assert_not_null(x);
  size_t cost = magpool_usable_size(pool, x);
  cr_assert_eq(cost, 6 * MiB, "a 5 MiB run costs 3 chunks, got %zu", cost);
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.cached_bytes, cost, "fenced: its cost %zu, cached %zu", cost, st.cached_bytes);
  cr_assert_eq(st.pending_bytes, 0);
  mpt_assert_conserved(pool);
  cr_assert_eq(magpool_check(pool), 0, "magpool_check with a run fenced");

  void *y = magpool_alloc_async(pool, 7 * MiB, S);
  cr_assert_eq(y, x, "S's 7 MiB request did not start on its fenced 6 MiB run");
  cr_assert_eq(magpool_usable_size(pool, y), 8 * MiB);
  st = mpt_stats(pool);
  cr_assert_eq(st.cached_bytes, 0);
  cr_assert_eq(st.used_bytes, 8 * MiB);
  mpt_assert_conserved(pool);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  cr_assert_eq(magpool_check(pool), 0);
  gate_release(&g, S);
  finish(pool, PS, &S, 1);
}

/* A new peak: an allocation on S that would raise the pool's high-water
 * mark of busy chunks above pool_size.  T's park and fenced runs go
 * behind T first.  The 8 MiB run was fenced for T while T was blocked; T
 * has since finished all its work, so T has passed the free and the run
 * is unfenced at once, where S's request finds its chunks: the pool does
 * not grow, nothing is pending. */
Test(park, a_new_peak_takes_back_what_a_passed_stream_parked, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .growth = 1});
  magpool_stream_t S = stream_new(), T = stream_new();
  gate g;
  gate_hold(&g, T);
  void *fill = magpool_alloc(pool, PS - 8 * MiB);
  void *x = magpool_alloc_async(pool, 8 * MiB, T);
  cr_assert(fill != NULL && x != NULL);
  cr_assert_eq(magpool_free_async(pool, x, T), 0);
  gate_release(&g, T);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.cached_bytes, 8 * MiB, "the 8 MiB run was not fenced for T");
  cr_assert_eq(st.pending_bytes, 0);
  size_t res = st.reserved_bytes;
  void *y = magpool_alloc_async(pool, 8 * MiB, S);
  cr_assert_not_null(y);
  st = mpt_stats(pool);
  cr_assert_eq(st.reserved_bytes, res, "the pool grew from %zu to %zu with 8 MiB parked on idle T",
               res, st.reserved_bytes);
  cr_assert_eq(st.pending_bytes, 0);
  cr_assert_eq(st.cached_bytes, 0);
  cr_assert_eq(st.used_bytes, PS, "used %zu: not the filler and y alone", st.used_bytes);
  mpt_assert_conserved(pool);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  cr_assert_eq(magpool_free(pool, fill), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  magpool_stream_t s[] = {S, T};
  finish(pool, PS, s, 2);
}

/* The same with T blocked: the run fenced for T goes behind T, where S
 * cannot have it (T has not passed the free): S's request gets new
 * memory, and the run is pending until T passes.  The new peak records that pending
 * run (pending_at_peak_bytes), after T passed too, until reset_peaks. */
Test(park, a_new_peak_never_takes_what_a_blocked_stream_parked, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .growth = 1});
  magpool_stream_t S = stream_new(), T = stream_new();
  gate g;
  gate_hold(&g, T);
  void *fill = magpool_alloc(pool, PS - 8 * MiB);
  void *x = magpool_alloc_async(pool, 8 * MiB, T);
  cr_assert(fill != NULL && x != NULL);
  cr_assert_eq(magpool_free_async(pool, x, T), 0);
  cr_assert_eq(mpt_stats(pool).cached_bytes, 8 * MiB, "the 8 MiB run was not fenced for T");
  void *y = magpool_alloc_async(pool, 8 * MiB, S);
  cr_assert_not_null(y);
  cr_assert_neq(y, x, "S got the run freed on T before T passed the free");
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 8 * MiB, "T's fenced run is not pending (%zu)", st.pending_bytes);
  cr_assert_eq(st.cached_bytes, 0);
  cr_assert_gt(st.peak_reserved_bytes, PS, "y did not raise the peak");
  cr_assert_eq(st.pending_at_peak_bytes, 8 * MiB, "pending at the peak: %zu",
               st.pending_at_peak_bytes);
  mpt_assert_conserved(pool);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  cr_assert_eq(magpool_free(pool, fill), 0);
  gate_release(&g, T);
  cr_assert_eq(magpool_host_stream_sync(S), 0);
  st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 0);
  cr_assert_eq(st.pending_at_peak_bytes, 8 * MiB, "the peak's record moved without a new peak");
  cr_assert_eq(magpool_reset_peaks(pool), 0);
  cr_assert_eq(mpt_stats(pool).pending_at_peak_bytes, 0);
  cr_assert_eq(magpool_trim(pool), 0);
  magpool_stream_t s[] = {S, T};
  finish(pool, PS, s, 2);
}

/* Parking off: a free on a stream that has finished all its work (none
 * was ever queued) is already passed, so the block goes to the tree at
 * once, and a synchronous allocation may have it. */
Test(park, a_free_on_a_passed_stream_is_not_pending, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .stream_cache = MPT_ZERO});
  magpool_stream_t S = stream_new();
  void *x = magpool_alloc_async(pool, BIG, S);
  cr_assert_not_null(x);
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 0, "a free on a passed stream is pending (%zu)", st.pending_bytes);
  cr_assert_eq(st.used_bytes, 0);
  cr_assert_eq(st.free_bytes, PS);
  finish(pool, PS, &S, 1);
}

/* Runs freed on a stream that has finished all its work are already
 * passed: they go to the tree at once, as a synchronous free's would, and
 * the synchronous API has them.  Both kinds: a 4 MiB run (under the
 * park's budget, with the defaults and a 64 MiB pool 8 MiB for blocks
 * above the stream caches' sizes) and a 16 MiB one (over it).  Parked,
 * they would keep their chunks busy. */
Test(park, runs_freed_on_a_passed_stream_go_to_the_tree, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_stream_t S = stream_new();
  const size_t sizes[] = {4 * MiB, 16 * MiB};
  for (int k = 0; k < 2; k++) {
    void *x = magpool_alloc_async(pool, sizes[k], S);
    cr_assert_not_null(x);
    cr_assert_eq(magpool_free_async(pool, x, S), 0);
    magpool_stats_t st = mpt_stats(pool);
    cr_assert_eq(st.cached_bytes, 0, "a %zu B free on passed S was parked (%zu)", sizes[k],
                 st.cached_bytes);
    cr_assert_eq(st.pending_bytes, 0, "a free on passed S is pending (%zu)", st.pending_bytes);
    cr_assert_eq(st.used_bytes, 0);
    mpt_assert_conserved(pool);
    void *y = magpool_alloc(pool, sizes[k]);
    cr_assert_eq(y, x, "the synchronous API did not get the %zu B run freed on passed S",
                 sizes[k]);
    cr_assert_eq(magpool_free(pool, y), 0);
  }
  finish(pool, PS, &S, 1);
}

/* The same frees with S blocked: S has not passed them, so each run is
 * fenced for S (magpool_alloc_async), and S's next request of its size,
 * from this thread, reuses it at once.  The 16 MiB request starts on the
 * 4 MiB run's fenced chunks; its free passes the budget, so S's fence
 * batch goes behind S: pending, where the 4 MiB run was cached. */
Test(park, runs_freed_on_a_blocked_stream_are_fenced, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_stream_t S = stream_new();
  gate g;
  gate_hold(&g, S);
  const size_t sizes[] = {4 * MiB, 16 * MiB};
  void *first = NULL;
  for (int k = 0; k < 2; k++) {
    void *x = magpool_alloc_async(pool, sizes[k], S);
    cr_assert_not_null(x);
    if (k == 0) first = x;
    else cr_assert_eq(x, first, "S's 16 MiB request did not start on its fenced 4 MiB run");
    cr_assert_eq(magpool_free_async(pool, x, S), 0);
    /* Fenced: cached while S's open fence batch holds at most the
     * budget (8 MiB here), pending once the batch goes behind S. */
    magpool_stats_t st = mpt_stats(pool);
    size_t pend = k == 0 ? 0 : sizes[k];
    cr_assert_eq(st.pending_bytes, pend, "the %zu B run: pending %zu, expected %zu", sizes[k],
                 st.pending_bytes, pend);
    cr_assert_eq(st.cached_bytes, sizes[k] - pend, "the %zu B run: cached %zu", sizes[k],
                 st.cached_bytes);
    void *y = magpool_alloc_async(pool, sizes[k], S);
    cr_assert_eq(y, x, "S's next %zu B request did not reuse its fenced run", sizes[k]);
    st = mpt_stats(pool);
    cr_assert(st.pending_bytes == 0 && st.cached_bytes == 0);
    cr_assert_eq(magpool_free_async(pool, y, S), 0);
  }
  gate_release(&g, S);
  finish(pool, PS, &S, 1);
}

/* At a new peak (the request would raise the pool's high-water mark of
 * busy chunks), S's request starts on the chunks of a run fenced for S:
 * a 16 MiB run (8 chunks) freed on blocked S, then S asks for 24 MiB: the
 * pool maps only the 4 chunks that were never there. */
Test(park, at_a_new_peak_a_stream_grows_from_its_fenced_runs, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .growth = 1});
  magpool_stream_t S = stream_new();
  gate g;
  gate_hold(&g, S);
  void *fill = magpool_alloc(pool, PS - 16 * MiB);
  void *x = magpool_alloc_async(pool, 16 * MiB, S);
  cr_assert(fill != NULL && x != NULL);
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 16 * MiB, "the 16 MiB run was not fenced on blocked S");
  size_t res = st.reserved_bytes;
  void *y = magpool_alloc_async(pool, 24 * MiB, S);
  cr_assert_eq(y, x, "S's 24 MiB request at a new peak did not start on its fenced run");
  st = mpt_stats(pool);
  cr_assert_eq(st.reserved_bytes, res + 8 * MiB, "the pool grew from %zu to %zu", res,
               st.reserved_bytes);
  cr_assert_eq(st.pending_bytes, 0);
  mpt_assert_conserved(pool);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  cr_assert_eq(magpool_free(pool, fill), 0);
  gate_release(&g, S);
  cr_assert_eq(magpool_trim(pool), 0);
  finish(pool, PS, &S, 1);
}

/* Opens the gates of S and T, trims, and finishes with both streams. */
static void finish_gated(magpool_t *pool, size_t ps, magpool_stream_t S, gate *gs,
                         magpool_stream_t T, gate *gt) {
  gate_release(gs, S);
  gate_release(gt, T);
  cr_assert_eq(magpool_trim(pool), 0);
  magpool_stream_t s[] = {S, T};
  finish(pool, ps, s, 2);
}

/* A request that the busy-chunk count calls a new peak, served by a run
 * fenced for its own stream, raises nothing: it neither retires other
 * streams' parks nor asks its stream.  Blocked T holds an 8 MiB run fenced
 * in its open batch; S frees 8 MiB and asks for 8 MiB again with the
 * pool's busy chunks at their mark (a ring of large blocks on one stream,
 * as a training step's).  S gets its run back; T's stays cached, with no
 * batch behind T. */
Test(park, a_ring_at_the_mark_reuses_its_run_and_retires_no_park, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .growth = 1, .stream_cache = 64 * MiB});
  magpool_stream_t S = stream_new(), T = stream_new();
  gate gs, gt;
  gate_hold(&gs, S);
  gate_hold(&gt, T);
  void *fill = magpool_alloc(pool, PS - 16 * MiB);
  void *t = magpool_alloc_async(pool, 8 * MiB, T);
  cr_assert(fill != NULL && t != NULL);
  cr_assert_eq(magpool_free_async(pool, t, T), 0);
  void *x = magpool_alloc_async(pool, 8 * MiB, S);
  cr_assert_not_null(x);
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  magpool_stats_t st = mpt_stats(pool);
  size_t res = st.reserved_bytes;
  cr_assert_eq(st.cached_bytes, 16 * MiB, "the two runs are not fenced in open batches");
  cr_assert_eq(st.pending_bytes, 0);
  uint64_t batches = st.stream_batches;
  for (int k = 0; k < 4; k++) {
    void *y = magpool_alloc_async(pool, 8 * MiB, S);
    cr_assert_eq(y, x, "round %d: S did not get its own fenced run back", k);
    st = mpt_stats(pool);
    cr_assert_eq(st.stream_batches, batches, "round %d: %llu batches went behind a stream", k,
                 (unsigned long long)(st.stream_batches - batches));
    cr_assert_eq(st.pending_bytes, 0, "round %d: T's run went pending (%zu)", k, st.pending_bytes);
    cr_assert_eq(st.reserved_bytes, res, "round %d: the pool went from %zu to %zu", k, res,
                 st.reserved_bytes);
    cr_assert_eq(magpool_free_async(pool, y, S), 0);
  }
  mpt_assert_conserved(pool);
  cr_assert_eq(magpool_free(pool, fill), 0);
  finish_gated(pool, PS, S, &gs, T, &gt);
}

/* A stream that alone takes runs (the pool's last MP_PARK_SOLO_RUNS run
 * takes were its own) keeps its fence batch open past the budget: no batch goes
 * behind it, where each budget's worth of run frees cost one (a stream
 * callback, which holds the stream's later work: design.md, "Solo").  Once
 * another stream takes a run, S's next run free over the budget sends the
 * batch behind S as before.  S and T blocked; the runs' budget is
 * max(stream_cache_bytes, pool_size / 8) = 8 MiB. */
Test(park, a_stream_that_alone_takes_runs_keeps_its_batch_open, .timeout = 60) {
  enum { N = 70 };
  const size_t PS = 64 * MiB, B = 4 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .growth = 1, .stream_cache = 1 * MiB});
  magpool_stream_t S = stream_new(), T = stream_new();
  gate gs, gt;
  gate_hold(&gs, S);
  gate_hold(&gt, T);
  /* The mark first, above all that follows: no request below is a new
   * peak (which would settle S's batch from T's allocation). */
  void *big = magpool_alloc(pool, 512 * MiB);
  cr_assert_not_null(big);
  cr_assert_eq(magpool_free(pool, big), 0);
  /* S alone takes runs: MP_PARK_SOLO_RUNS (4096) takes and frees. */
  for (int i = 0; i < 4100; i++) {
    void *r = magpool_alloc_async(pool, B, S);
    cr_assert_not_null(r);
    cr_assert_eq(magpool_free_async(pool, r, S), 0);
  }
  static void *x[N + 1];
  for (int i = 0; i <= N; i++) cr_assert_not_null(x[i] = magpool_alloc_async(pool, B, S));
  uint64_t batches = mpt_stats(pool).stream_batches;
  for (int i = 0; i < N; i++) cr_assert_eq(magpool_free_async(pool, x[i], S), 0);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.stream_batches, batches, "%llu batches behind S, which alone takes runs",
               (unsigned long long)(st.stream_batches - batches));
  cr_assert_eq(st.pending_bytes, 0, "pending %zu", st.pending_bytes);
  cr_assert_eq(st.cached_bytes, N * B, "cached %zu: not the %d runs fenced for S", st.cached_bytes, N);
  void *y = magpool_alloc_async(pool, B, T); /* T takes a run: S is not alone */
  cr_assert_not_null(y);
  cr_assert_eq(magpool_free_async(pool, x[N], S), 0);
  st = mpt_stats(pool);
  cr_assert_eq(st.stream_batches, batches + 1, "%llu batches after another stream took a run",
               (unsigned long long)(st.stream_batches - batches));
  cr_assert_eq(st.pending_bytes, (N + 1) * B, "pending %zu cached %zu: not S's whole batch",
               st.pending_bytes, st.cached_bytes);
  mpt_assert_conserved(pool);
  cr_assert_eq(magpool_free_async(pool, y, T), 0);
  finish_gated(pool, PS, S, &gs, T, &gt);
}

/* Below a peak, fenced chunks are mapped chunks: a run fenced for S
 * serves S's smaller request where the tree would have to move chunks
 * (unmap empty ones and map them where the run lands: 53 us a chunk on a
 * GPU).  A fixed 64 MiB pool maps 24 of its 32 chunks at the bottom of the
 * run space and 8 under the buddy tree, so its first run, of 28 chunks,
 * moves 4; a 9 MiB request on S then lands on that run, fenced for S, with
 * no move, and the 23 chunks it leaves stay fenced. */
Test(park, a_fenced_run_serves_before_chunks_move, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_stream_t S = stream_new();
  gate g;
  gate_hold(&g, S);
  void *x = magpool_alloc_async(pool, 56 * MiB, S);
  cr_assert_not_null(x);
  cr_assert_eq(mpt_stats(pool).chunk_moves, 4, "the first run moved %llu chunks",
               (unsigned long long)mpt_stats(pool).chunk_moves);
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  cr_assert_eq(mpt_stats(pool).pending_bytes, 56 * MiB, "the 56 MiB run was not fenced");
  uint64_t moves = mpt_stats(pool).chunk_moves;
  void *y = magpool_alloc_async(pool, 9 * MiB, S);
  cr_assert_eq(y, x, "S's 9 MiB request did not land on its fenced run");
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.chunk_moves, moves, "%llu chunks moved", (unsigned long long)(st.chunk_moves - moves));
  cr_assert_eq(st.pending_bytes, 46 * MiB, "pending %zu: not the 23 chunks left fenced", st.pending_bytes);
  mpt_assert_conserved(pool);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  gate_release(&g, S);
  cr_assert_eq(magpool_trim(pool), 0);
  finish(pool, PS, &S, 1);
}

/* stream_cache_bytes: "shared equally by the streams the thread has
 * used", and the streams' own keep "shared equally by the streams the
 * pool knows".  One thread frees 1 MiB of 64 KiB blocks on each of 16
 * blocked streams (a stream_cache_bytes of 1 MiB): each stream alone
 * would keep it all, cached.  Shared, the thread's slots keep at most
 * 1 MiB in all, the streams' parks 1 MiB in all, and the rest is
 * retired behind the streams (pending); every byte is one or the other.
 * Each stream still reuses what it kept, at once. */
Test(park, many_streams_share_one_stream_cache, .timeout = 60) {
  enum { NS = 16, PER = 16 };
  const size_t PS = 64 * MiB, SC = 1 * MiB, B = 64 * KiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .stream_cache = SC});
  magpool_stream_t s[NS];
  gate g[NS];
  void *p[NS][PER];
  for (int i = 0; i < NS; i++) {
    s[i] = stream_new();
    gate_hold(&g[i], s[i]);
    for (int j = 0; j < PER; j++) cr_assert_not_null(p[i][j] = magpool_alloc_async(pool, B, s[i]));
  }
  for (int i = 0; i < NS; i++)
    for (int j = 0; j < PER; j++) cr_assert_eq(magpool_free_async(pool, p[i][j], s[i]), 0);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.cached_bytes + st.pending_bytes, (size_t)NS * PER * B,
               "cached %zu + pending %zu: not every byte freed", st.cached_bytes, st.pending_bytes);
  cr_assert_leq(st.cached_bytes, 2 * SC, "%zu bytes kept for 16 streams (stream_cache_bytes %zu)",
                st.cached_bytes, SC);
  cr_assert_gt(st.cached_bytes, 0, "nothing kept");
  mpt_assert_conserved(pool);
  /* What a stream kept, it reuses: the pending bytes do not change. */
  size_t reused = 0;
  for (int i = 0; i < NS; i++) {
    void *q = magpool_alloc_async(pool, B, s[i]);
    cr_assert_not_null(q);
    for (int j = 0; j < PER; j++) reused += q == p[i][j];
    cr_assert_eq(magpool_free_async(pool, q, s[i]), 0);
  }
  cr_assert_gt(reused, 0, "no stream reused a block it kept");
  cr_assert_eq(mpt_stats(pool).pending_bytes, st.pending_bytes);
  for (int i = 0; i < NS; i++) gate_release(&g[i], s[i]);
  finish(pool, PS, s, NS);
}

/* stream_cache_bytes: "a released stream's share goes back to the others
 * when the thread next calls on another stream than its last".  Another
 * thread uses U, so two streams share the parks' budget (512 KiB each).
 * This thread uses T and releases it, then frees 1 MiB of 64 KiB blocks
 * on blocked S: with T's share given back its slot keeps all of it and
 * nothing goes behind S; with T's share still held the slot would keep
 * 512 KiB, and its overflow would pass S's park's 512 KiB and go
 * behind S (pending). */
static void *use_once(void *arg) {
  ctx *c = arg;
  void *q = magpool_alloc_async(c->pool, 64 * KiB, c->s);
  if (q == NULL || magpool_free_async(c->pool, q, c->s) != 0) atomic_store(&c->bad, 1);
  return NULL;
}

Test(park, a_released_streams_share_goes_back, .timeout = 60) {
  enum { PER = 16 };
  const size_t PS = 64 * MiB, SC = 1 * MiB, B = 64 * KiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .stream_cache = SC});
  magpool_stream_t S = stream_new(), T = stream_new(), U = stream_new();
  ctx cu = {.pool = pool, .s = U};
  run(use_once, &cu);
  cr_assert_eq(atomic_load(&cu.bad), 0);
  void *t = magpool_alloc_async(pool, B, T);
  cr_assert_not_null(t);
  cr_assert_eq(magpool_free_async(pool, t, T), 0);
  cr_assert_eq(magpool_stream_release(pool, T), 0);
  cr_assert_eq(magpool_host_stream_sync(T), 0);
  gate g;
  gate_hold(&g, S);
  void *p[PER];
  for (int j = 0; j < PER; j++) cr_assert_not_null(p[j] = magpool_alloc_async(pool, B, S));
  for (int j = 0; j < PER; j++) cr_assert_eq(magpool_free_async(pool, p[j], S), 0);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 0, "%zu bytes sent behind S: T's share was not given back",
               st.pending_bytes);
  cr_assert_geq(st.cached_bytes, PER * B, "cached %zu", st.cached_bytes);
  gate_release(&g, S);
  cr_assert_eq(magpool_host_stream_destroy(T), 0);
  magpool_stream_t s[] = {S, U};
  finish(pool, PS, s, 2);
}
