/* test_config.c - magpool_config_t and its checks at creation, the version,
 * the error codes and magpool_align_up.
 */
#include <magpool.h>

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "test_util.h"

Test(config, defaults) {
  magpool_config_t cfg;
  memset(&cfg, 0xAB, sizeof cfg);
  magpool_config_init(&cfg);
  cr_assert_eq(cfg.struct_size, sizeof(magpool_config_t));
  cr_assert_eq(cfg.pool_size, 256 * MiB);
  cr_assert_eq(cfg.allow_growth, 0);
  cr_assert_eq(cfg.max_pool_size, 0);
  cr_assert_eq(cfg.min_block, 64);
  cr_assert_eq(cfg.kind, MAGPOOL_MEM_HOST);
  cr_assert_eq(cfg.device, 0);
  cr_assert_eq(cfg.thread_cache_bytes, 8 * MiB);
  cr_assert_eq(cfg.cache_max_block, 1 * MiB);
  cr_assert_eq(cfg.stream_cache_bytes, 8 * MiB);
  cr_assert_eq(cfg.capture_check, 1);
  cr_assert_eq(cfg.chunk_groups, -1);
  cr_assert_eq(cfg.cross_stream_reuse, 0);
  magpool_config_init(NULL); /* no-op, must not crash */
}

Test(config, version) {
  cr_assert_eq(magpool_version(), MAGPOOL_VERSION,
               "library %d, header %d", magpool_version(), MAGPOOL_VERSION);
  cr_assert_eq(MAGPOOL_VERSION, MAGPOOL_VERSION_MAJOR * 10000 +
                                    MAGPOOL_VERSION_MINOR * 100 +
                                    MAGPOOL_VERSION_PATCH);
}

Test(config, strerror_all_codes) {
  static const int codes[] = {MAGPOOL_OK,      MAGPOOL_EINVAL, MAGPOOL_ENOMEM,
                              MAGPOOL_ENOTSUP, MAGPOOL_ENODEV, MAGPOOL_ECUDA,
                              MAGPOOL_ECAPTURE, MAGPOOL_EBUSY};
  const size_t n = sizeof codes / sizeof codes[0];
  for (size_t i = 0; i < n; i++) {
    const char *s = magpool_strerror(codes[i]);
    cr_assert_not_null(s, "strerror(%d) is NULL", codes[i]);
    cr_assert_gt(strlen(s), 0, "strerror(%d) is empty", codes[i]);
    for (size_t j = 0; j < i; j++)
      cr_assert_str_neq(s, magpool_strerror(codes[j]),
                        "codes %d and %d share the text \"%s\"", codes[i],
                        codes[j], s);
  }
  /* Never NULL, even for codes that do not exist. */
  cr_assert_not_null(magpool_strerror(-1000));
  cr_assert_not_null(magpool_strerror(42));
  cr_assert_not_null(magpool_strerror(-2147483647 - 1));
}

Test(config, last_error_starts_at_zero) {
  cr_assert_eq(magpool_last_error(), 0);
  cr_assert_eq(magpool_last_cuda_error(), 0);
}

Test(config, align_up) {
  const size_t top = (size_t)1 << (sizeof(size_t) * 8 - 1);
  cr_assert_eq(magpool_align_up(0, 64), 0);
  cr_assert_eq(magpool_align_up(1, 64), 64);
  cr_assert_eq(magpool_align_up(63, 64), 64);
  cr_assert_eq(magpool_align_up(64, 64), 64);
  cr_assert_eq(magpool_align_up(65, 64), 128);
  cr_assert_eq(magpool_align_up(5, 1), 5);
  cr_assert_eq(magpool_align_up(1000, 4096), 4096);
  cr_assert_eq(magpool_align_up(8193, 4096), 12288);
  cr_assert_eq(magpool_align_up(7, top), top);
  cr_assert_eq(magpool_align_up(top, top), top);
  cr_assert_eq(magpool_align_up(SIZE_MAX, 1), SIZE_MAX);
  cr_assert_eq(magpool_align_up(SIZE_MAX - 63, 64), SIZE_MAX - 63);
  cr_assert_eq(magpool_align_up(SIZE_MAX - 64, 64), SIZE_MAX - 63);
  /* align not a power of two */
  cr_assert_eq(magpool_align_up(100, 0), 0);
  cr_assert_eq(magpool_align_up(100, 3), 0);
  cr_assert_eq(magpool_align_up(100, 48), 0);
  cr_assert_eq(magpool_align_up(100, SIZE_MAX), 0);
  /* overflow */
  cr_assert_eq(magpool_align_up(SIZE_MAX, 2), 0);
  cr_assert_eq(magpool_align_up(SIZE_MAX - 62, 64), 0);
  cr_assert_eq(magpool_align_up(top + 1, top), 0);
}

static void expect_create_einval(const magpool_config_t *cfg,
                                 const char *what) {
  magpool_t *sentinel = (magpool_t *)(uintptr_t)0x5A5A;
  magpool_t *out = sentinel;
  int rc = magpool_create(cfg, &out);
  cr_assert_eq(rc, MAGPOOL_EINVAL, "%s: create = %d, expected EINVAL", what,
               rc);
  cr_assert_eq(out, sentinel, "%s: *out changed on failure", what);
}

Test(config, bad_configs) {
  magpool_config_t cfg;

  magpool_config_init(&cfg);
  cfg.min_block = 48;
  expect_create_einval(&cfg, "min_block 48");
  magpool_config_init(&cfg);
  cfg.min_block = 0;
  expect_create_einval(&cfg, "min_block 0");
  magpool_config_init(&cfg);
  cfg.min_block = 8;
  expect_create_einval(&cfg, "min_block 8 (< 16)");
  magpool_config_init(&cfg);
  cfg.min_block = 131072;
  expect_create_einval(&cfg, "min_block 131072 (> 65536)");
  magpool_config_init(&cfg);
  cfg.min_block = 100;
  expect_create_einval(&cfg, "min_block 100");
  magpool_config_init(&cfg);
  cfg.pool_size = 32;
  expect_create_einval(&cfg, "pool_size 32 < min_block 64");
  magpool_config_init(&cfg);
  cfg.pool_size = 0;
  expect_create_einval(&cfg, "pool_size 0");
  magpool_config_init(&cfg);
  cfg.struct_size = 0;
  expect_create_einval(&cfg, "struct_size 0");
  magpool_config_init(&cfg);
  cfg.struct_size = 1;
  expect_create_einval(&cfg, "struct_size 1");
  magpool_config_init(&cfg);
  cfg.pool_size = 16 * MiB;
  cfg.allow_growth = 1;
  cfg.max_pool_size = 8 * MiB;
  expect_create_einval(&cfg, "max_pool_size below pool_size");
  magpool_config_init(&cfg);
  cfg.chunk_groups = 2;
  expect_create_einval(&cfg, "chunk_groups 2");
  magpool_config_init(&cfg);
  cfg.chunk_groups = -2;
  expect_create_einval(&cfg, "chunk_groups -2");

  magpool_config_init(&cfg);
  magpool_t *out = (magpool_t *)(uintptr_t)0x5A5A;
  cr_assert_eq(magpool_create(NULL, &out), MAGPOOL_EINVAL);
  cr_assert_eq(out, (magpool_t *)(uintptr_t)0x5A5A);
  cr_assert_eq(magpool_create(&cfg, NULL), MAGPOOL_EINVAL);
}

Test(config, edge_configs) {
  magpool_config_t cfg;
  magpool_t *pool;

  /* Smallest and largest min_block. */
  magpool_config_init(&cfg);
  cfg.min_block = 16;
  cfg.pool_size = 1 * MiB;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  void *p = magpool_alloc(pool, 1);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_usable_size(pool, p), 16);
  cr_assert_eq(magpool_free(pool, p), 0);
  mpt_pool_done(pool);

  magpool_config_init(&cfg);
  cfg.min_block = 65536;
  cfg.pool_size = 4 * MiB;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  p = magpool_alloc(pool, 1);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_usable_size(pool, p), 65536);
  cr_assert(mpt_is_aligned(p, 65536));
  cr_assert_eq(magpool_free(pool, p), 0);
  mpt_pool_done(pool);

  /* pool_size == min_block: one block. */
  magpool_config_init(&cfg);
  cfg.pool_size = 64;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  p = magpool_alloc(pool, 64);
  cr_assert_not_null(p);
  cr_assert_null(magpool_alloc(pool, 1));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_eq(magpool_free(pool, p), 0);
  mpt_pool_done(pool);

  /* pool_size is rounded down to a multiple of min_block: 1 MiB + 100
   * holds 1 MiB + 64 with min_block 64, and 1 MiB + 63 holds 1 MiB. */
  magpool_config_init(&cfg);
  cfg.pool_size = 1 * MiB + 100;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.reserved_bytes, 1 * MiB + 64, "reserved %zu for pool_size "
                                               "1 MiB + 100", s.reserved_bytes);
  cr_assert_eq(s.free_bytes, 1 * MiB + 64);
  mpt_pool_done(pool);
  magpool_config_init(&cfg);
  cfg.pool_size = 1 * MiB + 63;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  s = mpt_stats(pool);
  cr_assert_eq(s.reserved_bytes, 1 * MiB, "reserved %zu for pool_size 1 MiB "
                                          "+ 63", s.reserved_bytes);
  mpt_pool_done(pool);

  /* max_pool_size == pool_size is valid. */
  magpool_config_init(&cfg);
  cfg.pool_size = 1 * MiB;
  cfg.allow_growth = 1;
  cfg.max_pool_size = 1 * MiB;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* The cap is compared with the pool size asked for, not the size rounded
 * down to min_block (found by fuzzing): 1000 rounds to 960, a cap of 970
 * is still below what was asked. */
Test(config, max_below_asked_pool_size) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = 1000;
  cfg.max_pool_size = 970;
  cfg.allow_growth = 1;
  magpool_t *pool = NULL;
  cr_assert_eq(magpool_create(&cfg, &pool), MAGPOOL_EINVAL);
  cr_assert_null(pool);
  cfg.max_pool_size = 1000;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  cr_assert_eq(magpool_destroy(pool), 0);
}
