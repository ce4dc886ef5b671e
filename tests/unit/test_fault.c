/* test_fault.c - retire's failure paths, driven by the failing stream ops
 * (src/internal.h: mp_stream_failing_ops, installed with
 * mp_pool_set_stream_override).  Whatever fails, no block is lost, none is
 * handed out before its stream passed the free, and the pool comes back
 * to one block.
 *
 *   fault::callback_cannot_be_enqueued   after() fails: retire waits for
 *        the stream itself and makes the batch ready at once
 *   fault::callback_reports_a_device_error   the callback runs with an
 *        error status: the blocks come back all the same
 *   fault::release_with_failing_callbacks   a release's retire fails
 *
 * Internal headers: links the static archive.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <criterion/criterion.h>

#include "stream_util.h"
#include "test_util.h"

static magpool_t *faulty_pool(long countdown, int status) {
  mp_pool_set_stream_override(&mp_stream_failing_ops);
  mp_stream_failing_arm(countdown, status);
  return mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB, .stream_cache = MPT_ZERO});
}

static void faulty_done(magpool_t *pool, magpool_stream_t s) {
  mp_stream_failing_arm(-1, 0);
  finish(pool, 4 * MiB, &s, 1);
  mp_pool_set_stream_override(NULL);
}

/* Frees n blocks on s (stream caches off: each free is retired at once),
 * then lets s run its callbacks, so that the counts checked stand still
 * (a callback that ends between the stats read and mem_info's would
 * move bytes from pending to free in between: seen under ASan). */
static void free_on(magpool_t *pool, magpool_stream_t s, int n) {
  void *p[32];
  for (int i = 0; i < n; i++) cr_assert_not_null(p[i] = magpool_alloc_async(pool, 64 * KiB, s));
  for (int i = 0; i < n; i++) cr_assert_eq(magpool_free_async(pool, p[i], s), 0);
  cr_assert_eq(magpool_host_stream_sync(s), 0);
  mpt_assert_conserved(pool);
}

Test(fault, callback_cannot_be_enqueued, .timeout = 60) {
  magpool_t *pool = faulty_pool(0, 0); /* every after() fails */
  magpool_stream_t s = stream_new();
  free_on(pool, s, 16);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 0, "a batch whose callback failed stays pending");
  cr_assert_eq(st.live_count, 0);
  void *all = magpool_alloc(pool, 4 * MiB);
  cr_assert_not_null(all, "blocks of failed retires did not come back");
  cr_assert_eq(magpool_free(pool, all), 0);
  faulty_done(pool, s);
}

Test(fault, callback_reports_a_device_error, .timeout = 60) {
  magpool_t *pool = faulty_pool(-1, -42); /* callbacks say "error" */
  magpool_stream_t s = stream_new();
  free_on(pool, s, 16);
  cr_assert_eq(magpool_host_stream_sync(s), 0);
  void *all = magpool_alloc(pool, 4 * MiB);
  cr_assert_not_null(all, "blocks whose callback reported an error did not come back");
  cr_assert_eq(magpool_free(pool, all), 0);
  faulty_done(pool, s);
}

Test(fault, release_with_failing_callbacks, .timeout = 60) {
  mp_pool_set_stream_override(&mp_stream_failing_ops);
  mp_stream_failing_arm(-1, 0);
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB});
  magpool_stream_t s = stream_new();
  free_on(pool, s, 16); /* cached in this thread's slot for s */
  cr_assert_gt(mpt_stats(pool).cached_bytes, 0);
  mp_stream_failing_arm(0, 0); /* the release's retire cannot enqueue */
  cr_assert_eq(magpool_stream_release(pool, s), 0);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 0);
  void *all = magpool_alloc(pool, 4 * MiB);
  cr_assert_not_null(all);
  cr_assert_eq(magpool_free(pool, all), 0);
  faulty_done(pool, s);
}
