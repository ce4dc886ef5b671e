/* test_growth.c - pools that may grow (allow_growth, max_pool_size), and
 * one that may not.
 */
#include <magpool.h>

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "test_util.h"

static size_t fill_with_mib(magpool_t *pool, void **blocks, size_t cap) {
  size_t n = 0;
  while (n < cap) {
    void *p = magpool_alloc(pool, 1 * MiB);
    if (!p)
      break;
    blocks[n++] = p;
  }
  return n;
}

Test(growth, grows_to_exactly_max) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB, .growth = 1, .max = 64 * MiB});
  void *blocks[128];
  size_t n = fill_with_mib(pool, blocks, 128);
  cr_assert_eq(n, 64, "%zu 1 MiB blocks from a pool growing 16 -> 64 MiB", n);
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.reserved_bytes, 64 * MiB, "reserved %zu", s.reserved_bytes);
  cr_assert_geq(s.grow_count, 1);
  cr_assert_eq(s.used_bytes, 64 * MiB);
  mpt_assert_conserved(pool);
  size_t fb = 1, tb = 0;
  cr_assert_eq(magpool_mem_info(pool, &fb, &tb), 0);
  cr_assert_eq(tb, 64 * MiB);
  cr_assert_eq(fb, 0);

  /* A clear failure, repeatable, and nothing more reserved. */
  cr_assert_null(magpool_alloc(pool, 1 * MiB));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_null(magpool_alloc(pool, 64));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 64 * MiB);

  /* Still serves after frees. */
  for (size_t i = 0; i < n; i += 4)
    cr_assert_eq(magpool_free(pool, blocks[i]), 0);
  for (size_t i = 0; i < n; i += 4) {
    blocks[i] = magpool_alloc(pool, 1 * MiB);
    cr_assert_not_null(blocks[i]);
    memset(blocks[i], 3, 1 * MiB);
  }
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(magpool_free(pool, blocks[i]), 0);
  /* Trim unmaps every empty chunk beyond pool_size. */
  mpt_assert_all_free(pool);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 16 * MiB);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(growth, no_growth_without_allow_growth) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB, .max = 64 * MiB});
  void *blocks[64];
  size_t n = fill_with_mib(pool, blocks, 64);
  cr_assert_eq(n, 16, "%zu 1 MiB blocks from a 16 MiB pool", n);
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.reserved_bytes, 16 * MiB);
  cr_assert_eq(s.grow_count, 0);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(magpool_free(pool, blocks[i]), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* Reading: growth takes a region large enough for the request, within
 * max_pool_size. */
Test(growth, large_request_grows) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB, .growth = 1, .max = 64 * MiB});
  void *big = magpool_alloc(pool, 32 * MiB);
  cr_assert_not_null(big, "32 MiB from a 16 MiB pool that may grow to 64: %s",
                     magpool_strerror(magpool_last_error()));
  memset(big, 7, 32 * MiB);
  /* Memory is mapped where the block needs it, within the cap. */
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_geq(s.reserved_bytes, 32 * MiB);
  cr_assert_leq(s.reserved_bytes, 64 * MiB);
  cr_assert_geq(s.grow_count, 1);
  /* 40 MiB more cannot fit under the 64 MiB cap. */
  cr_assert_null(magpool_alloc(pool, 40 * MiB));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_leq(mpt_stats(pool).reserved_bytes, 64 * MiB);
  cr_assert_eq(magpool_free(pool, big), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

Test(growth, unlimited_growth) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB, .growth = 1});
  void *blocks[20];
  for (int i = 0; i < 20; i++) {
    blocks[i] = magpool_alloc(pool, 1 * MiB);
    cr_assert_not_null(blocks[i], "alloc %d on an unlimited pool failed", i);
  }
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_geq(s.reserved_bytes, 20 * MiB);
  cr_assert_geq(s.grow_count, 1);
  /* Sizes near SIZE_MAX still fail cleanly on a pool that may grow. */
  cr_assert_null(magpool_alloc(pool, SIZE_MAX));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_null(magpool_alloc(pool, SIZE_MAX / 2 + 1));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  for (int i = 0; i < 20; i++)
    cr_assert_eq(magpool_free(pool, blocks[i]), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}
