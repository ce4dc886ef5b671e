/* test_source.c - the test-only failing memory source (src/internal.h:
 * mp_source_failing, installed with mp_pool_set_source_override), which
 * makes the pool's growth and out-of-memory paths testable.
 */
#include "internal.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "test_util.h"

static magpool_t *failing_pool(long countdown, size_t pool_size, int growth,
                               size_t max) {
  mp_pool_set_source_override(&mp_source_failing);
  mp_source_failing_arm(countdown);
  return mpt_pool(
      &(mpt_cfg){.pool_size = pool_size, .growth = growth, .max = max});
}

static void failing_done(magpool_t *pool) {
  mpt_pool_done(pool);
  mp_source_failing_arm(-1);
  mp_pool_set_source_override(NULL);
}

Test(internal_source, create_fails_cleanly) {
  mp_pool_set_source_override(&mp_source_failing);
  mp_source_failing_arm(0);
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = 16 * MiB;
  magpool_t *sentinel = (magpool_t *)(uintptr_t)0x1234;
  magpool_t *pool = sentinel;
  int rc = magpool_create(&cfg, &pool);
  cr_assert_eq(rc, MAGPOOL_ENOMEM, "create on a failing source: %d", rc);
  cr_assert_eq(pool, sentinel, "*out changed on failure");
  /* Disarmed, the same source works. */
  mp_source_failing_arm(-1);
  rc = magpool_create(&cfg, &pool);
  cr_assert_eq(rc, 0);
  void *p = magpool_alloc(pool, 1000);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_free(pool, p), 0);
  failing_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(internal_source, growth_then_source_fails) {
  /* Creation and one growth succeed; every later reserve fails. */
  magpool_t *pool = failing_pool(2, 16 * MiB, 1, 0);
  void **blocks = calloc(4096, sizeof *blocks);
  cr_assert_not_null(blocks);
  size_t n = 0;
  while (n < 4096) {
    void *p = magpool_alloc(pool, MiB);
    if (!p)
      break;
    blocks[n++] = p;
  }
  cr_assert_lt(n, 4096, "the failing source never failed");
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  magpool_stats_t s;
  cr_assert_eq(magpool_get_stats(pool, &s), 0);
  cr_assert_eq(s.grow_count, 1, "grow_count %llu, expected 1",
               (unsigned long long)s.grow_count);
  cr_assert_gt(s.reserved_bytes, 16 * MiB, "the successful growth is not "
                                           "in reserved_bytes");
  cr_assert_gt(n, 16, "no block came from the grown region");
  /* Two regions, each wastes less than one 1 MiB block. */
  cr_assert_leq(n * MiB, s.reserved_bytes);
  cr_assert_lt(s.reserved_bytes - n * MiB, 2 * MiB,
               "only %zu MiB of %zu reserved could be allocated", n,
               s.reserved_bytes / MiB);
  cr_assert_eq(s.used_bytes, n * MiB);
  /* A clear failure, again, and nothing changed. */
  cr_assert_null(magpool_alloc(pool, MiB));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  magpool_stats_t s2;
  cr_assert_eq(magpool_get_stats(pool, &s2), 0);
  cr_assert_eq(s2.reserved_bytes, s.reserved_bytes);
  cr_assert_eq(s2.live_count, n);

  /* Still serves after frees. */
  for (size_t i = 0; i < n; i += 2)
    cr_assert_eq(magpool_free(pool, blocks[i]), 0);
  for (size_t i = 0; i < n; i += 2) {
    blocks[i] = magpool_alloc(pool, MiB);
    cr_assert_not_null(blocks[i], "re-alloc %zu failed after frees", i);
  }
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(magpool_free(pool, blocks[i]), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(magpool_get_stats(pool, &s2), 0);
  cr_assert_eq(s2.used_bytes, 0);
  cr_assert_eq(s2.live_count, 0);
  cr_assert_eq(s2.free_bytes, s2.reserved_bytes);
  free(blocks);
  failing_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(internal_source, no_growth_when_source_refuses) {
  /* Only creation succeeds; growth is allowed but the source refuses. */
  magpool_t *pool = failing_pool(1, 16 * MiB, 1, 64 * MiB);
  void *blocks[64];
  size_t n = 0;
  while (n < 64) {
    void *p = magpool_alloc(pool, MiB);
    if (!p)
      break;
    blocks[n++] = p;
  }
  cr_assert_eq(n, 16, "%zu 1 MiB blocks from a 16 MiB pool that cannot grow",
               n);
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  magpool_stats_t s;
  cr_assert_eq(magpool_get_stats(pool, &s), 0);
  cr_assert_eq(s.grow_count, 0);
  cr_assert_eq(s.reserved_bytes, 16 * MiB);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(magpool_free(pool, blocks[i]), 0);
  failing_done(pool);
  MPT_ASSERT_NO_LEAKS();
}
