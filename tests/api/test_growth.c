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

/* A pool made from these fields (host memory, chunks of 2 MiB). */
static magpool_t *odd_pool(size_t pool_size, int growth, size_t max) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = pool_size;
  cfg.allow_growth = growth;
  cfg.max_pool_size = max;
  magpool_t *pool = NULL;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  return pool;
}

/* A pool_size that is not whole chunks (100,000,000 B, as programs write
 * it).  Growing: rounded up to whole chunks, so the pool maps chunks and a
 * large block is a run of whole chunks (5 MiB + 1 takes 6 MiB, not the 8
 * MiB of a buddy block); trim keeps the rounded size.  Fixed: exactly
 * pool_size.  Growing under a max_pool_size below the rounded size: whole
 * regions, never past the max. */
Test(growth, a_pool_size_of_part_chunks) {
  const size_t PS = 100000000, CH = 2 * MiB, UP = (PS / CH + 1) * CH;
  magpool_t *pool = odd_pool(PS, 1, 0);
  size_t total = 0;
  cr_assert_eq(magpool_mem_info(pool, NULL, &total), 0);
  cr_assert_eq(total, UP, "a growing pool of %zu B holds %zu, not %zu", PS, total, UP);
  void *run = magpool_alloc(pool, 5 * MiB + 1);
  cr_assert_not_null(run);
  cr_assert_eq(magpool_usable_size(pool, run), 6 * MiB, "usable %zu: not a run of chunks",
               magpool_usable_size(pool, run));
  void *more = magpool_alloc(pool, 200 * MiB); /* grows past pool_size */
  cr_assert_not_null(more);
  cr_assert_eq(magpool_free(pool, more), 0);
  cr_assert_eq(magpool_free(pool, run), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, UP);
  mpt_pool_done(pool);

  pool = odd_pool(PS, 0, 0);
  cr_assert_eq(magpool_mem_info(pool, NULL, &total), 0);
  cr_assert_eq(total, PS - PS % 64, "a fixed pool of %zu B holds %zu", PS, total);
  mpt_pool_done(pool);

  const size_t MAX = PS + 64 * 1024; /* below UP */
  pool = odd_pool(PS, 1, MAX);
  cr_assert_eq(magpool_mem_info(pool, NULL, &total), 0);
  cr_assert_eq(total, PS - PS % 64, "a pool capped below whole chunks holds %zu", total);
  void *b[128];
  size_t n = fill_with_mib(pool, b, 128);
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_geq(n, 64);
  cr_assert_leq(mpt_stats(pool).reserved_bytes, MAX);
  for (size_t i = 0; i < n; i++) cr_assert_eq(magpool_free(pool, b[i]), 0);
  mpt_pool_done(pool);
}

/* A fixed pool of at least 64 chunks whose pool_size is not whole chunks
 * (1,000,000,000 B) rounds it down to whole chunks and maps chunks: it
 * holds at most pool_size, and a block larger than half of it is a run of
 * chunks.  On whole regions (512 MiB, 256 MiB, ...) the largest block was
 * 512 MiB, and a fixed pool of cudaMalloc's footprint + 2 % in bytes ran
 * out at event 174-1,456 of the shared traces.  Capped below the size
 * rounded up, a growing pool does the same and never passes its cap. */
Test(growth, a_large_fixed_pool_of_part_chunks_maps_chunks) {
  const size_t PS = 1000000000, CH = 2 * MiB, DOWN = PS / CH * CH;
  for (int capped = 0; capped <= 1; capped++) {
    magpool_t *pool = capped ? odd_pool(PS, 1, PS + 64 * 1024) : odd_pool(PS, 0, 0);
    size_t total = 0;
    cr_assert_eq(magpool_mem_info(pool, NULL, &total), 0);
    cr_assert_eq(total, DOWN, "a pool of %zu B holds %zu, not %zu", PS, total, DOWN);
    cr_assert_eq(mpt_stats(pool).reserved_bytes, DOWN);
    void *big = magpool_alloc(pool, 600000000);
    cr_assert_not_null(big, "600 MB did not fit in %zu B: %s", DOWN,
                       magpool_strerror(magpool_last_error()));
    cr_assert_eq(magpool_usable_size(pool, big), 287 * CH);
    void *rest = magpool_alloc(pool, DOWN - 287 * CH); /* the rest, to the chunk */
    cr_assert_not_null(rest, "the last %zu B did not fit", DOWN - 287 * CH);
    cr_assert_null(magpool_alloc(pool, 64));
    cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
    cr_assert_eq(mpt_stats(pool).peak_reserved_bytes, DOWN, "the pool took more than it holds");
    cr_assert_eq(magpool_check(pool), 0);
    cr_assert_eq(magpool_free(pool, rest), 0);
    cr_assert_eq(magpool_free(pool, big), 0);
    mpt_pool_done(pool);
  }
}
