/* test_oom.c - the out-of-memory promise (magpool.h, magpool_alloc): an
 * allocation fails with MAGPOOL_ENOMEM only if the request still does not
 * fit after every cache is drained (idle threads' included, see
 * unit/test_races.c), every depot is drained, every pending stream free
 * has completed, and growth has been tried.  One test per rung, and the
 * reproduction that failed before the ladder waited for what was pending.
 *
 *   oom::async_round_trips_never_fail   64 MiB pool, one host stream:
 *        16 x 1 MiB allocated and async-freed, then 32 MiB async, 1000
 *        rounds, with and without caches
 *   oom::ready_batches_are_drained      completed stream frees
 *   oom::caches_and_depots_are_drained  this thread's cache, depots
 *   oom::pending_frees_are_waited_for   a blocked stream opened later
 *   oom::released_busy_stream_is_waited_for   the same after a release
 *   oom::growth_is_tried_last           a growing pool grows only after
 *        what is cached and pending did not suffice
 *   oom::truly_full_fails               live memory: ENOMEM, pool usable
 *
 * Public header only.
 */
#define _GNU_SOURCE
#include <magpool.h>

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stream_util.h"
#include "test_util.h"

static void async_round_trips(size_t thread_cache, size_t stream_cache) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){
      .pool_size = PS, .thread_cache = thread_cache, .stream_cache = stream_cache});
  magpool_stream_t s = stream_new();
  int failures = 0;
  for (int round = 0; round < 1000; round++) {
    void *p[16];
    for (int i = 0; i < 16; i++) {
      p[i] = magpool_alloc_async(pool, 1 * MiB, s);
      cr_assert_not_null(p[i], "round %d: 1 MiB #%d", round, i);
    }
    for (int i = 0; i < 16; i++) cr_assert_eq(magpool_free_async(pool, p[i], s), 0);
    void *big = magpool_alloc_async(pool, 32 * MiB, s);
    if (big == NULL) {
      failures++;
      cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
      continue;
    }
    cr_assert_eq(magpool_free_async(pool, big, s), 0);
  }
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(failures, 0,
               "%d of 1000 rounds failed with ENOMEM while at most 16 MiB of a 64 MiB "
               "pool was live (now: live %llu, cached %zu, pending %zu)",
               failures, (unsigned long long)st.live_count, st.cached_bytes,
               st.pending_bytes);
  finish(pool, PS, &s, 1);
}

Test(oom, async_round_trips_never_fail, .timeout = 300) {
  async_round_trips(MPT_DEFAULT, MPT_DEFAULT);
}

Test(oom, async_round_trips_never_fail_uncached, .timeout = 300) {
  async_round_trips(MPT_ZERO, MPT_ZERO);
}

/* Fills the pool with blocks of bs, frees them with `release`, and then
 * asks for the whole pool. */
Test(oom, ready_batches_are_drained, .timeout = 60) {
  const size_t PS = 4 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_stream_t s = stream_new();
  void *p[64];
  for (int i = 0; i < 64; i++) cr_assert_not_null(p[i] = magpool_alloc_async(pool, 64 * KiB, s));
  for (int i = 0; i < 64; i++) cr_assert_eq(magpool_free_async(pool, p[i], s), 0);
  cr_assert_eq(magpool_stream_release(pool, s), 0); /* retired behind s */
  cr_assert_eq(magpool_host_stream_sync(s), 0);      /* callbacks ran: ready */
  cr_assert_eq(mpt_stats(pool).pending_bytes, 0);
  void *all = magpool_alloc(pool, PS);
  cr_assert_not_null(all, "ENOMEM (%s) with every block on the ready list",
                     magpool_strerror(magpool_last_error()));
  cr_assert_eq(magpool_free(pool, all), 0);
  finish(pool, PS, &s, 1);
}

Test(oom, caches_and_depots_are_drained, .timeout = 60) {
  const size_t PS = 8 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .thread_cache = 1 * MiB});
  /* Many blocks of several classes freed: the magazines fill, the rest
   * goes to the depots. */
  enum { N = 96 };
  void *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = magpool_alloc(pool, (size_t)1024 << (i % 6));
    cr_assert_not_null(p[i]);
  }
  for (int i = 0; i < N; i++) cr_assert_eq(magpool_free(pool, p[i]), 0);
  cr_assert_gt(mpt_stats(pool).cached_bytes, 0);
  void *all = magpool_alloc(pool, PS);
  cr_assert_not_null(all, "ENOMEM (%s) with everything cached",
                     magpool_strerror(magpool_last_error()));
  cr_assert_eq(magpool_free(pool, all), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  mpt_assert_one_block(pool);
  mpt_pool_done(pool);
}

typedef struct opener {
  gate *g;
  unsigned delay_us;
} opener;

/* Opens the gate after a while: the allocation on the test's thread is
 * then (most likely) waiting in the ladder.  Whatever the delay, the
 * allocation must succeed: the free it waits for is coming. */
static void *open_later(void *arg) {
  opener *o = arg;
  usleep(o->delay_us);
  gate_open(o->g);
  return NULL;
}

static void pending_case(int release_first) {
  const size_t PS = 4 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_stream_t s = stream_new();
  gate g;
  gate_init(&g);
  void *p[4];
  for (int i = 0; i < 4; i++) cr_assert_not_null(p[i] = magpool_alloc_async(pool, 1 * MiB, s));
  launch(s, gate_task, &g); /* s is busy until the gate opens */
  gate_wait_entered(&g);
  for (int i = 0; i < 4; i++) cr_assert_eq(magpool_free_async(pool, p[i], s), 0);
  if (release_first) cr_assert_eq(magpool_stream_release(pool, s), 0);
  opener o = {&g, 200 * 1000};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, open_later, &o), 0);
  void *all = magpool_alloc(pool, PS);
  cr_assert_not_null(all, "ENOMEM (%s) while every block was pending on a stream that "
                          "was about to reach the frees",
                     magpool_strerror(magpool_last_error()));
  pthread_join(th, NULL);
  cr_assert_eq(magpool_free(pool, all), 0);
  gate_done(&g);
  finish(pool, PS, &s, 1);
}

Test(oom, pending_frees_are_waited_for, .timeout = 60) { pending_case(0); }

Test(oom, released_busy_stream_is_waited_for, .timeout = 60) { pending_case(1); }

/* A stream that alone takes runs keeps its fence batch open past the
 * budget (design.md, "Solo"): its runs are fenced for it, not pending,
 * and no callback is on its way.  The synchronous API's request for the
 * whole pool must still get them: the ladder retires the batch behind the
 * stream and waits for it. */
Test(oom, a_solo_streams_open_batch_is_waited_for, .timeout = 60) {
  enum { N = 16 };
  const size_t PS = 64 * MiB, B = 4 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_stream_t s = stream_new();
  for (int i = 0; i < 4100; i++) { /* s alone takes runs */
    void *r = magpool_alloc_async(pool, B, s);
    cr_assert_not_null(r);
    cr_assert_eq(magpool_free_async(pool, r, s), 0);
  }
  void *p[N];
  for (int i = 0; i < N; i++) cr_assert_not_null(p[i] = magpool_alloc_async(pool, B, s));
  gate g;
  gate_init(&g);
  launch(s, gate_task, &g); /* s is busy until the gate opens */
  gate_wait_entered(&g);
  uint64_t batches = mpt_stats(pool).stream_batches;
  for (int i = 0; i < N; i++) cr_assert_eq(magpool_free_async(pool, p[i], s), 0);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.stream_batches, batches, "the solo stream's batch went behind it");
  cr_assert_eq(st.cached_bytes, PS, "cached %zu: the runs are not fenced for s", st.cached_bytes);
  opener o = {&g, 200 * 1000};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, open_later, &o), 0);
  void *all = magpool_alloc(pool, PS);
  cr_assert_not_null(all, "ENOMEM (%s) with every run fenced for a stream about to pass",
                     magpool_strerror(magpool_last_error()));
  pthread_join(th, NULL);
  cr_assert_eq(magpool_free(pool, all), 0);
  gate_done(&g);
  finish(pool, PS, &s, 1);
}

Test(oom, growth_is_tried_last, .timeout = 60) {
  const size_t PS = 4 * MiB;
  /* No stream cache: the frees are pending (or ready) at once.  The cap
   * leaves room for one more chunk: the whole-pool request fits only if
   * the pending frees are waited for and their chunks reused. */
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .growth = 1, .max = PS + 2 * MiB,
                                        .stream_cache = MPT_ZERO});
  magpool_stream_t s = stream_new();
  void *p[4];
  for (int i = 0; i < 4; i++) cr_assert_not_null(p[i] = magpool_alloc_async(pool, 1 * MiB, s));
  for (int i = 0; i < 4; i++) cr_assert_eq(magpool_free_async(pool, p[i], s), 0);
  void *all = magpool_alloc(pool, PS);
  cr_assert_not_null(all, "%s", magpool_strerror(magpool_last_error()));
  memset(all, 1, PS);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_leq(st.reserved_bytes, PS + 2 * MiB);
  cr_assert_eq(st.pending_bytes, 0);
  /* Now it grows into the last chunk the cap allows, and no further. */
  void *more = magpool_alloc(pool, 1 * MiB);
  cr_assert_not_null(more);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, PS + 2 * MiB);
  cr_assert_null(magpool_alloc(pool, 2 * MiB));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_eq(magpool_free(pool, more), 0);
  cr_assert_eq(magpool_free(pool, all), 0);
  cr_assert_eq(magpool_stream_release(pool, s), 0);
  cr_assert_eq(magpool_host_stream_sync(s), 0);
  cr_assert_eq(magpool_host_stream_destroy(s), 0);
  mpt_pool_done(pool);
}

Test(oom, truly_full_fails, .timeout = 60) {
  const size_t PS = 4 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  void *a = magpool_alloc(pool, 1 * MiB);
  cr_assert_not_null(a);
  cr_assert_null(magpool_alloc(pool, PS), "the whole pool while 1 MiB is live");
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  void *b = magpool_alloc(pool, 2 * MiB);
  cr_assert_not_null(b, "the pool is unusable after ENOMEM");
  cr_assert_eq(magpool_free(pool, b), 0);
  cr_assert_eq(magpool_free(pool, a), 0);
  mpt_pool_done(pool);
}
