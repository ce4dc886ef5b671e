/* test_api.c - integration tests of magpool through its public header only.
 *
 * Every expectation below comes from a contract in include/magpool.h.  Where
 * the header leaves room for more than one reading, the comment next to the
 * test says which reading it takes.
 *
 * Each Criterion test runs in its own process, so thread-local state
 * (magpool_last_error, the thread caches) starts fresh in every test.
 */
#define _POSIX_C_SOURCE 200809L /* pthread_barrier_t, access() */

#include <magpool.h>

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

/* ------------------------------------------------------------------ */
/* helpers                                                            */
/* ------------------------------------------------------------------ */

static magpool_t *pool_new(size_t pool_size, int growth, size_t max) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = pool_size;
  cfg.allow_growth = growth;
  cfg.max_pool_size = max;
  magpool_t *pool = NULL;
  int rc = magpool_create(&cfg, &pool);
  cr_assert_eq(rc, 0, "magpool_create(pool_size %zu) = %d (%s)", pool_size,
               rc, magpool_strerror(rc));
  cr_assert_not_null(pool);
  return pool;
}

static magpool_stats_t stats_of(magpool_t *pool) {
  magpool_stats_t s;
  memset(&s, 0xA5, sizeof s);
  int rc = magpool_get_stats(pool, &s);
  cr_assert_eq(rc, 0, "magpool_get_stats = %d", rc);
  return s;
}

/* On a quiescent pool every reserved byte is in exactly one state:
 * used + cached + pending + free == reserved (STYLE.md rule 8; each term is
 * defined in magpool_stats_t). */
static void assert_conserved(const magpool_stats_t *s) {
  cr_assert_eq(s->used_bytes + s->cached_bytes + s->pending_bytes +
                   s->free_bytes,
               s->reserved_bytes,
               "conservation: used %zu + cached %zu + pending %zu + free %zu "
               "!= reserved %zu",
               s->used_bytes, s->cached_bytes, s->pending_bytes,
               s->free_bytes, s->reserved_bytes);
  cr_assert_geq(s->peak_used_bytes, s->used_bytes);
  cr_assert_leq(s->largest_free_block, s->free_bytes);
  cr_assert_eq(s->alloc_count - s->free_count, s->live_count,
               "alloc_count %llu - free_count %llu != live_count %llu",
               (unsigned long long)s->alloc_count,
               (unsigned long long)s->free_count,
               (unsigned long long)s->live_count);
}

/* After trim with nothing live and no other live thread: one free block per
 * region, nothing cached or pending. */
static void assert_all_free(magpool_t *pool) {
  cr_assert_eq(magpool_trim(pool), 0);
  magpool_stats_t s = stats_of(pool);
  assert_conserved(&s);
  cr_assert_eq(s.used_bytes, 0, "used_bytes %zu after freeing everything",
               s.used_bytes);
  cr_assert_eq(s.requested_bytes, 0);
  cr_assert_eq(s.live_count, 0);
  cr_assert_eq(s.cached_bytes, 0, "cached_bytes %zu after trim",
               s.cached_bytes);
  cr_assert_eq(s.pending_bytes, 0);
  cr_assert_eq(s.free_bytes, s.reserved_bytes);
}

static void pool_done(magpool_t *pool) {
  int rc = magpool_check(pool);
  cr_assert_eq(rc, 0, "magpool_check = %d", rc);
  cr_assert_eq(magpool_destroy(pool), 0);
}

static bool is_aligned(const void *p, size_t a) {
  return ((uintptr_t)p & (a - 1)) == 0;
}

/* A live block's usable size: a power of two >= max(size, min_block), and
 * the block is aligned to it. */
static void assert_block(magpool_t *pool, const void *p, size_t size,
                         size_t min_block) {
  size_t u = magpool_usable_size(pool, p);
  cr_assert(mpt_is_pow2(u), "usable_size %zu of a %zu-byte block is not a "
                            "power of two", u, size);
  cr_assert_geq(u, size);
  cr_assert_geq(u, min_block);
  cr_assert(is_aligned(p, u), "block %p of size %zu not aligned to %zu", p,
            size, u);
}

/* The block size the header promises for a request: the next power of two,
 * at least min_block. */
static size_t block_size_for(size_t size, size_t min_block) {
  size_t b = min_block;
  while (b < size)
    b <<= 1;
  return b;
}

/* ------------------------------------------------------------------ */
/* config, version, errors, align_up                                  */
/* ------------------------------------------------------------------ */

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
  pool_done(pool);

  magpool_config_init(&cfg);
  cfg.min_block = 65536;
  cfg.pool_size = 4 * MiB;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  p = magpool_alloc(pool, 1);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_usable_size(pool, p), 65536);
  cr_assert(is_aligned(p, 65536));
  cr_assert_eq(magpool_free(pool, p), 0);
  pool_done(pool);

  /* pool_size == min_block: one block. */
  magpool_config_init(&cfg);
  cfg.pool_size = 64;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  p = magpool_alloc(pool, 64);
  cr_assert_not_null(p);
  cr_assert_null(magpool_alloc(pool, 1));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_eq(magpool_free(pool, p), 0);
  pool_done(pool);

  /* pool_size is rounded down to a multiple of min_block: 1 MiB + 100
   * holds 1 MiB + 64 with min_block 64, and 1 MiB + 63 holds 1 MiB. */
  magpool_config_init(&cfg);
  cfg.pool_size = 1 * MiB + 100;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  magpool_stats_t s = stats_of(pool);
  cr_assert_eq(s.reserved_bytes, 1 * MiB + 64, "reserved %zu for pool_size "
                                               "1 MiB + 100", s.reserved_bytes);
  cr_assert_eq(s.free_bytes, 1 * MiB + 64);
  pool_done(pool);
  magpool_config_init(&cfg);
  cfg.pool_size = 1 * MiB + 63;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  s = stats_of(pool);
  cr_assert_eq(s.reserved_bytes, 1 * MiB, "reserved %zu for pool_size 1 MiB "
                                          "+ 63", s.reserved_bytes);
  pool_done(pool);

  /* max_pool_size == pool_size is valid. */
  magpool_config_init(&cfg);
  cfg.pool_size = 1 * MiB;
  cfg.allow_growth = 1;
  cfg.max_pool_size = 1 * MiB;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------------ */
/* pools                                                              */
/* ------------------------------------------------------------------ */

Test(pool, create_destroy_default) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  magpool_t *pool = NULL;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  cr_assert_not_null(pool);
  magpool_stats_t s = stats_of(pool);
  cr_assert_eq(s.reserved_bytes, 256 * MiB);
  cr_assert_eq(s.used_bytes, 0);
  cr_assert_eq(s.requested_bytes, 0);
  cr_assert_eq(s.live_count, 0);
  cr_assert_eq(s.alloc_count, 0);
  cr_assert_eq(s.free_count, 0);
  cr_assert_eq(s.grow_count, 0);
  cr_assert_eq(s.cached_bytes, 0);
  cr_assert_eq(s.pending_bytes, 0);
  cr_assert_eq(s.free_bytes, 256 * MiB);
  cr_assert_eq(s.largest_free_block, 256 * MiB);
  cr_assert_eq(s.peak_used_bytes, 0);
  assert_conserved(&s);
  pool_done(pool);
  cr_assert_eq(magpool_destroy(NULL), MAGPOOL_EINVAL);

  /* Many pools at once, destroyed in another order. */
  magpool_t *pools[8];
  for (int i = 0; i < 8; i++)
    pools[i] = pool_new(1 * MiB, 0, 0);
  for (int i = 0; i < 8; i++) {
    void *p = magpool_alloc(pools[i], 100);
    cr_assert_not_null(p);
    for (int j = 0; j < 8; j++)
      if (j != i)
        cr_assert_eq(magpool_usable_size(pools[j], p), 0,
                     "a block of pool %d is live in pool %d", i, j);
    cr_assert_eq(magpool_free(pools[(i + 1) % 8], p), MAGPOOL_EINVAL,
                 "a pool freed another pool's block");
    cr_assert_eq(magpool_free(pools[i], p), 0);
  }
  for (int i = 7; i >= 0; i--)
    pool_done(pools[i]);
  MPT_ASSERT_NO_LEAKS();
}

Test(pool, destroy_with_live_allocations) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  for (int i = 0; i < 1000; i++)
    cr_assert_not_null(magpool_alloc(pool, (size_t)(i * 37) % 5000));
  cr_assert_not_null(magpool_alloc(pool, 2 * MiB));
  /* Live allocations are given back with the pool. */
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_destroy(pool), 0);
  MPT_ASSERT_NO_LEAKS();
}

Test(pool, usable_size_and_alignment) {
  magpool_t *pool = pool_new(64 * MiB, 0, 0);
  static const size_t sizes[] = {0,    1,     2,       63,      64,
                                 65,   100,   127,     128,     129,
                                 1000, 1024,  1025,    4096,    65535,
                                 65536, 65537, 1 * MiB - 1, 1 * MiB,
                                 1 * MiB + 1, 3 * MiB, 8 * MiB};
  const size_t n = sizeof sizes / sizeof sizes[0];
  void *ps[sizeof sizes / sizeof sizes[0]];
  for (size_t i = 0; i < n; i++) {
    ps[i] = magpool_alloc(pool, sizes[i]);
    cr_assert_not_null(ps[i], "alloc(%zu) failed: %s", sizes[i],
                       magpool_strerror(magpool_last_error()));
    size_t want = block_size_for(sizes[i], 64);
    cr_assert_eq(magpool_usable_size(pool, ps[i]), want,
                 "usable_size of alloc(%zu) = %zu, expected %zu", sizes[i],
                 magpool_usable_size(pool, ps[i]), want);
    assert_block(pool, ps[i], sizes[i], 64);
    /* The block is real, writable memory of its usable size. */
    memset(ps[i], (int)i, want);
  }
  for (size_t i = 0; i < n; i++) {
    size_t want = block_size_for(sizes[i], 64);
    const unsigned char *b = ps[i];
    cr_assert(b[0] == (unsigned char)i && b[want - 1] == (unsigned char)i,
              "block %zu was overwritten by another block", i);
  }
  /* usable_size of things that are not live allocations. */
  cr_assert_eq(magpool_usable_size(pool, NULL), 0);
  cr_assert_eq(magpool_usable_size(pool, (char *)ps[5] + 1), 0);
  int local;
  cr_assert_eq(magpool_usable_size(pool, &local), 0);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(magpool_free(pool, ps[i]), 0);
    cr_assert_eq(magpool_usable_size(pool, ps[i]), 0,
                 "usable_size of a freed block is not 0");
  }
  assert_all_free(pool);
  pool_done(pool);
}

/* "Allocates size bytes, aligned to the block size": also for the largest
 * blocks, whose alignment is that of the region itself (a plain mmap base
 * is only page-aligned, and often 2 MiB-aligned by luck).  Eight pools are
 * alive at once, so that no lucky address layout can hide a region base
 * that is not aligned to the pool's largest block. */
Test(pool, large_blocks_aligned_to_their_size) {
  static const size_t sizes[] = {64 * MiB, 48 * MiB, 256 * MiB, 96 * MiB,
                                 24 * MiB, 40 * MiB, 80 * MiB,  112 * MiB};
  enum { NP = sizeof sizes / sizeof sizes[0] };
  magpool_t *pools[NP];
  void *first[NP], *second[NP];
  for (size_t i = 0; i < NP; i++) {
    pools[i] = pool_new(sizes[i], 0, 0);
    size_t big = (size_t)1 << mpt_floor_log2(sizes[i]);
    first[i] = magpool_alloc(pools[i], big);
    cr_assert_not_null(first[i]);
    cr_assert_eq(magpool_usable_size(pools[i], first[i]), big);
    /* The next block is the largest piece of what is left. */
    size_t rest = sizes[i] - big;
    second[i] = NULL;
    if (rest) {
      size_t nxt = (size_t)1 << mpt_floor_log2(rest);
      second[i] = magpool_alloc(pools[i], nxt);
      cr_assert_not_null(second[i]);
    }
  }
  int bad = 0;
  char msg[512] = "";
  size_t used = 0;
  for (size_t i = 0; i < NP; i++) {
    size_t big = (size_t)1 << mpt_floor_log2(sizes[i]);
    if (!is_aligned(first[i], big)) {
      bad++;
      used += (size_t)snprintf(msg + used, sizeof msg - used,
                               " [%zu MiB pool: %zu MiB block at %p]",
                               sizes[i] / MiB, big / MiB, first[i]);
      if (used >= sizeof msg)
        used = sizeof msg - 1;
    }
    if (second[i]) {
      size_t nxt = magpool_usable_size(pools[i], second[i]);
      if (!is_aligned(second[i], nxt))
        bad++;
    }
  }
  for (size_t i = 0; i < NP; i++) {
    if (second[i])
      cr_assert_eq(magpool_free(pools[i], second[i]), 0);
    cr_assert_eq(magpool_free(pools[i], first[i]), 0);
    pool_done(pools[i]);
  }
  cr_assert_eq(bad, 0, "%d of the largest blocks are not aligned to their "
                       "block size, which magpool_alloc promises:%s",
               bad, msg);
}

/* The same promise for pools past 1 GiB (GPU pools are often that big).
 * min_block 64 KiB keeps the metadata small; nothing is touched, so the
 * pools cost address space only. */
Test(pool, huge_pool_blocks_aligned) {
  static const size_t gib = (size_t)1 << 30;
  static const size_t sizes[] = {2 * gib, 3 * gib, 4 * gib, 8 * gib};
  enum { NP = sizeof sizes / sizeof sizes[0] };
  magpool_t *pools[NP];
  void *first[NP];
  for (size_t i = 0; i < NP; i++) {
    magpool_config_t cfg;
    magpool_config_init(&cfg);
    cfg.pool_size = sizes[i];
    cfg.min_block = 65536;
    int rc = magpool_create(&cfg, &pools[i]);
    cr_assert_eq(rc, 0, "create %zu GiB: %s", sizes[i] / gib,
                 magpool_strerror(rc));
    size_t big = (size_t)1 << mpt_floor_log2(sizes[i]);
    first[i] = magpool_alloc(pools[i], big);
    cr_assert_not_null(first[i], "%zu GiB block of a %zu GiB pool",
                       big / gib, sizes[i] / gib);
  }
  int bad = 0;
  char msg[512] = "";
  size_t used = 0;
  for (size_t i = 0; i < NP; i++) {
    size_t big = (size_t)1 << mpt_floor_log2(sizes[i]);
    if (!is_aligned(first[i], big)) {
      bad++;
      used += (size_t)snprintf(msg + used, sizeof msg - used,
                               " [%zu GiB pool: %zu GiB block at %p]",
                               sizes[i] / gib, big / gib, first[i]);
      if (used >= sizeof msg)
        used = sizeof msg - 1;
    }
  }
  for (size_t i = 0; i < NP; i++) {
    cr_assert_eq(magpool_free(pools[i], first[i]), 0);
    pool_done(pools[i]);
  }
  cr_assert_eq(bad, 0, "%d blocks of 2 GiB or more are not aligned to "
                       "their block size, which magpool_alloc promises:%s",
               bad, msg);
}

Test(pool, stats_and_mem_info) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  size_t fb = 0, tb = 0;
  cr_assert_eq(magpool_mem_info(pool, &fb, &tb), 0);
  cr_assert_eq(tb, 16 * MiB);
  cr_assert_eq(fb, 16 * MiB);
  cr_assert_eq(magpool_mem_info(pool, NULL, NULL), 0);
  cr_assert_eq(magpool_mem_info(pool, &fb, NULL), 0);
  cr_assert_eq(magpool_mem_info(pool, NULL, &tb), 0);
  cr_assert_eq(magpool_mem_info(NULL, &fb, &tb), MAGPOOL_EINVAL);

  static const size_t sizes[] = {100, 1 * MiB, 5000, 0, 64, 65, 300000};
  const size_t n = sizeof sizes / sizeof sizes[0];
  void *ps[sizeof sizes / sizeof sizes[0]];
  size_t used = 0, req = 0;
  for (size_t i = 0; i < n; i++) {
    ps[i] = magpool_alloc(pool, sizes[i]);
    cr_assert_not_null(ps[i]);
    used += block_size_for(sizes[i], 64);
    req += sizes[i];
    magpool_stats_t s = stats_of(pool);
    cr_assert_eq(s.used_bytes, used, "after %zu allocs: used %zu, expected "
                                     "%zu", i + 1, s.used_bytes, used);
    cr_assert_eq(s.requested_bytes, req);
    cr_assert_eq(s.live_count, i + 1);
    cr_assert_eq(s.alloc_count, i + 1);
    cr_assert_eq(s.free_count, 0);
    cr_assert_eq(s.reserved_bytes, 16 * MiB);
    cr_assert_geq(s.peak_used_bytes, used);
    assert_conserved(&s);
    /* free memory = what the pool can still hand out without growing =
     * free in the tree plus cached (nothing is pending here). */
    cr_assert_eq(magpool_mem_info(pool, &fb, &tb), 0);
    cr_assert_eq(tb, 16 * MiB);
    cr_assert_eq(fb, s.free_bytes + s.cached_bytes);
    cr_assert_eq(fb, 16 * MiB - used, "mem_info free %zu, expected %zu", fb,
                 16 * MiB - used);
  }
  size_t peak = stats_of(pool).peak_used_bytes;
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(magpool_free(pool, ps[i]), 0);
    used -= block_size_for(sizes[i], 64);
    req -= sizes[i];
    magpool_stats_t s = stats_of(pool);
    cr_assert_eq(s.used_bytes, used);
    cr_assert_eq(s.requested_bytes, req);
    cr_assert_eq(s.live_count, n - i - 1);
    cr_assert_eq(s.free_count, i + 1);
    cr_assert_eq(s.alloc_count, n);
    cr_assert_geq(s.peak_used_bytes, peak, "peak went down");
    assert_conserved(&s);
  }
  assert_all_free(pool);
  pool_done(pool);
}

/* A pool of 2^k bytes: after random traffic, freeing everything and trim,
 * it hands out 2^k bytes in one piece, covering every address it ever
 * handed out. */
Test(pool, full_coalescing, .timeout = 120) {
  const size_t pool_size = 64 * MiB;
  magpool_t *pool = pool_new(pool_size, 0, 0);
  magpool_stats_t s0 = stats_of(pool);

  enum { N = 3000 };
  void **ps = calloc(N, sizeof *ps);
  size_t *sz = calloc(N, sizeof *sz);
  cr_assert(ps && sz);
  mpt_rng r = mpt_rng_seed(12345);
  uintptr_t lo = UINTPTR_MAX, hi = 0;

  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < N; i++) {
      if (ps[i])
        continue;
      uint64_t d = mpt_below(&r, 100);
      /* About 28 MB live at the peak: well under the 64 MiB pool, so
       * that no allocation can fail for lack of space. */
      size_t size = d < 75   ? (size_t)mpt_range(&r, 0, 1024)
                    : d < 99 ? (size_t)mpt_range(&r, 1025, 32 * KiB)
                             : (size_t)mpt_range(&r, 32 * KiB + 1, 512 * KiB);
      void *p = magpool_alloc(pool, size);
      cr_assert_not_null(p, "round %d: alloc #%d of %zu bytes failed: %s",
                         round, i, size,
                         magpool_strerror(magpool_last_error()));
      assert_block(pool, p, size, 64);
      size_t u = magpool_usable_size(pool, p);
      /* Stamp the whole block with its index; checked before free. */
      memset(p, (int)(i & 0xFF), u);
      ps[i] = p;
      sz[i] = size;
      if ((uintptr_t)p < lo)
        lo = (uintptr_t)p;
      if ((uintptr_t)p + u > hi)
        hi = (uintptr_t)p + u;
    }
    /* Free a random half (all of it in the last round). */
    for (int i = 0; i < N; i++) {
      if (round < 2 && mpt_below(&r, 2))
        continue;
      size_t u = magpool_usable_size(pool, ps[i]);
      const unsigned char *b = ps[i];
      cr_assert(b[0] == (unsigned char)(i & 0xFF) &&
                    b[u / 2] == (unsigned char)(i & 0xFF) &&
                    b[u - 1] == (unsigned char)(i & 0xFF),
                "block %d overwritten: two live blocks overlap", i);
      int rc = (i & 1) ? magpool_free_sized(pool, ps[i], sz[i])
                       : magpool_free(pool, ps[i]);
      cr_assert_eq(rc, 0, "free of block %d: %d", i, rc);
      ps[i] = NULL;
    }
  }

  cr_assert_eq(magpool_trim(pool), 0);
  magpool_stats_t s = stats_of(pool);
  cr_assert_eq(s.used_bytes, s0.used_bytes, "leak: used %zu, was %zu",
               s.used_bytes, s0.used_bytes);
  cr_assert_eq(s.live_count, 0);
  cr_assert_eq(s.cached_bytes, 0, "cached %zu after trim", s.cached_bytes);
  cr_assert_eq(s.pending_bytes, 0);
  cr_assert_eq(s.free_bytes, pool_size);
  cr_assert_eq(s.largest_free_block, pool_size,
               "largest free block %zu after trim: not coalesced",
               s.largest_free_block);
  cr_assert_eq(s.alloc_count, s.free_count);
  assert_conserved(&s);
  cr_assert_eq(magpool_check(pool), 0);

  void *all = magpool_alloc(pool, pool_size);
  cr_assert_not_null(all, "the whole 64 MiB is not one block after trim: %s",
                     magpool_strerror(magpool_last_error()));
  cr_assert_eq(magpool_usable_size(pool, all), pool_size);
  cr_assert_leq((uintptr_t)all, lo);
  cr_assert_geq((uintptr_t)all + pool_size, hi,
                "the whole-pool block does not cover earlier blocks");
  memset(all, 0x11, pool_size);
  cr_assert_null(magpool_alloc(pool, 0), "a full pool handed out more");
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_eq(magpool_free(pool, all), 0);
  void *again = magpool_alloc(pool, pool_size);
  cr_assert_eq(again, all);
  cr_assert_eq(magpool_free_sized(pool, again, pool_size), 0);
  assert_all_free(pool);
  free(ps);
  free(sz);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* "Need not be a power of two: the pool holds exactly that many bytes." */
Test(pool, holds_exactly_48mib) {
  magpool_t *pool = pool_new(48 * MiB, 0, 0);
  magpool_stats_t s = stats_of(pool);
  cr_assert_eq(s.reserved_bytes, 48 * MiB);
  cr_assert_eq(s.largest_free_block, 32 * MiB);
  void *blocks[64];
  size_t n = 0;
  while (n < 64) {
    void *p = magpool_alloc(pool, 1 * MiB);
    if (!p)
      break;
    blocks[n++] = p;
  }
  cr_assert_eq(n, 48, "%zu 1 MiB blocks from a 48 MiB pool", n);
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  s = stats_of(pool);
  cr_assert_eq(s.used_bytes, 48 * MiB);
  cr_assert_eq(s.live_count, 48);
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < i; j++)
      cr_assert_neq(blocks[i], blocks[j]);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(magpool_free(pool, blocks[i]), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  s = stats_of(pool);
  cr_assert_eq(s.largest_free_block, 32 * MiB);
  cr_assert_eq(s.free_bytes, 48 * MiB);

  void *a = magpool_alloc(pool, 32 * MiB);
  cr_assert_not_null(a, "32 MiB from an empty 48 MiB pool failed");
  void *b = magpool_alloc(pool, 16 * MiB);
  cr_assert_not_null(b, "16 MiB next to 32 MiB in a 48 MiB pool failed");
  cr_assert_null(magpool_alloc(pool, 64), "a 48 MiB pool gave out more "
                                         "than 48 MiB");
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  /* Both blocks are real memory. */
  memset(a, 1, 32 * MiB);
  memset(b, 2, 16 * MiB);
  cr_assert_eq(magpool_free(pool, a), 0);
  cr_assert_eq(magpool_free(pool, b), 0);
  assert_all_free(pool);
  cr_assert_null(magpool_alloc(pool, 48 * MiB), "48 MiB is not one block");
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  pool_done(pool);
}

/* ------------------------------------------------------------------ */
/* growth                                                             */
/* ------------------------------------------------------------------ */

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
  magpool_t *pool = pool_new(16 * MiB, 1, 64 * MiB);
  void *blocks[128];
  size_t n = fill_with_mib(pool, blocks, 128);
  cr_assert_eq(n, 64, "%zu 1 MiB blocks from a pool growing 16 -> 64 MiB", n);
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  magpool_stats_t s = stats_of(pool);
  cr_assert_eq(s.reserved_bytes, 64 * MiB, "reserved %zu", s.reserved_bytes);
  cr_assert_geq(s.grow_count, 1);
  cr_assert_eq(s.used_bytes, 64 * MiB);
  assert_conserved(&s);
  size_t fb = 1, tb = 0;
  cr_assert_eq(magpool_mem_info(pool, &fb, &tb), 0);
  cr_assert_eq(tb, 64 * MiB);
  cr_assert_eq(fb, 0);

  /* A clear failure, repeatable, and nothing more reserved. */
  cr_assert_null(magpool_alloc(pool, 1 * MiB));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_null(magpool_alloc(pool, 64));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_eq(stats_of(pool).reserved_bytes, 64 * MiB);

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
  assert_all_free(pool);
  cr_assert_eq(stats_of(pool).reserved_bytes, 64 * MiB);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(growth, no_growth_without_allow_growth) {
  magpool_t *pool = pool_new(16 * MiB, 0, 64 * MiB);
  void *blocks[64];
  size_t n = fill_with_mib(pool, blocks, 64);
  cr_assert_eq(n, 16, "%zu 1 MiB blocks from a 16 MiB pool", n);
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  magpool_stats_t s = stats_of(pool);
  cr_assert_eq(s.reserved_bytes, 16 * MiB);
  cr_assert_eq(s.grow_count, 0);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(magpool_free(pool, blocks[i]), 0);
  assert_all_free(pool);
  pool_done(pool);
}

/* Reading: growth takes a region large enough for the request, within
 * max_pool_size. */
Test(growth, large_request_grows) {
  magpool_t *pool = pool_new(16 * MiB, 1, 64 * MiB);
  void *big = magpool_alloc(pool, 32 * MiB);
  cr_assert_not_null(big, "32 MiB from a 16 MiB pool that may grow to 64: %s",
                     magpool_strerror(magpool_last_error()));
  memset(big, 7, 32 * MiB);
  magpool_stats_t s = stats_of(pool);
  cr_assert_geq(s.reserved_bytes, 48 * MiB);
  cr_assert_leq(s.reserved_bytes, 64 * MiB);
  cr_assert_geq(s.grow_count, 1);
  /* 40 MiB more cannot fit under the 64 MiB cap. */
  cr_assert_null(magpool_alloc(pool, 40 * MiB));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_leq(stats_of(pool).reserved_bytes, 64 * MiB);
  cr_assert_eq(magpool_free(pool, big), 0);
  assert_all_free(pool);
  pool_done(pool);
}

Test(growth, unlimited_growth) {
  magpool_t *pool = pool_new(4 * MiB, 1, 0);
  void *blocks[20];
  for (int i = 0; i < 20; i++) {
    blocks[i] = magpool_alloc(pool, 1 * MiB);
    cr_assert_not_null(blocks[i], "alloc %d on an unlimited pool failed", i);
  }
  magpool_stats_t s = stats_of(pool);
  cr_assert_geq(s.reserved_bytes, 20 * MiB);
  cr_assert_geq(s.grow_count, 1);
  /* Sizes near SIZE_MAX still fail cleanly on a pool that may grow. */
  cr_assert_null(magpool_alloc(pool, SIZE_MAX));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_null(magpool_alloc(pool, SIZE_MAX / 2 + 1));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  for (int i = 0; i < 20; i++)
    cr_assert_eq(magpool_free(pool, blocks[i]), 0);
  assert_all_free(pool);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------------ */
/* bad inputs                                                         */
/* ------------------------------------------------------------------ */

/* Fields that a call failing with EINVAL must not change. */
static void assert_same_stats(const magpool_stats_t *a,
                              const magpool_stats_t *b, const char *what) {
  cr_assert_eq(a->used_bytes, b->used_bytes, "%s changed used_bytes", what);
  cr_assert_eq(a->requested_bytes, b->requested_bytes,
               "%s changed requested_bytes", what);
  cr_assert_eq(a->live_count, b->live_count, "%s changed live_count", what);
  cr_assert_eq(a->alloc_count, b->alloc_count, "%s changed alloc_count",
               what);
  cr_assert_eq(a->free_count, b->free_count, "%s changed free_count", what);
  cr_assert_eq(a->reserved_bytes, b->reserved_bytes,
               "%s changed reserved_bytes", what);
}

Test(badinput, free_null_is_noop) {
  magpool_t *pool = pool_new(1 * MiB, 0, 0);
  magpool_stats_t a = stats_of(pool);
  cr_assert_eq(magpool_free(pool, NULL), 0);
  magpool_stats_t b = stats_of(pool);
  assert_same_stats(&a, &b, "free(NULL)");
  pool_done(pool);
}

Test(badinput, foreign_pointers) {
  magpool_t *pool = pool_new(1 * MiB, 0, 0);
  void *live = magpool_alloc(pool, 128);
  cr_assert_not_null(live);
  magpool_stats_t a = stats_of(pool);
  int on_stack[16];
  cr_assert_eq(magpool_free(pool, on_stack), MAGPOOL_EINVAL);
  char *heap = malloc(4096);
  cr_assert_not_null(heap);
  cr_assert_eq(magpool_free(pool, heap), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free(pool, heap + 64), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_sized(pool, heap, 4096), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free(pool, (void *)(uintptr_t)64), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free(pool, (void *)(uintptr_t)-64), MAGPOOL_EINVAL);
  free(heap);
  /* A block of another pool is foreign too. */
  magpool_t *other = pool_new(1 * MiB, 0, 0);
  void *q = magpool_alloc(other, 128);
  cr_assert_not_null(q);
  cr_assert_eq(magpool_free(pool, q), MAGPOOL_EINVAL);
  magpool_stats_t b = stats_of(pool);
  assert_same_stats(&a, &b, "freeing foreign pointers");
  cr_assert_eq(magpool_usable_size(pool, live), 128);
  cr_assert_eq(magpool_free(other, q), 0);
  cr_assert_eq(magpool_free(pool, live), 0);
  assert_all_free(pool);
  pool_done(other);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(badinput, interior_pointers) {
  magpool_t *pool = pool_new(1 * MiB, 0, 0);
  char *p = magpool_alloc(pool, 256);
  cr_assert_not_null(p);
  char *big = magpool_alloc(pool, 4096);
  cr_assert_not_null(big);
  magpool_stats_t a = stats_of(pool);
  cr_assert_eq(magpool_free(pool, p + 64), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free(pool, p + 1), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free(pool, p + 128), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free(pool, p + 255), MAGPOOL_EINVAL);
  /* Interior at a min_block boundary of a larger block: looks like a
   * block start but is not one. */
  cr_assert_eq(magpool_free(pool, big + 64), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free(pool, big + 2048), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_sized(pool, big + 2048, 2048), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_usable_size(pool, big + 2048), 0);
  magpool_stats_t b = stats_of(pool);
  assert_same_stats(&a, &b, "freeing interior pointers");
  cr_assert_eq(magpool_usable_size(pool, p), 256);
  cr_assert_eq(magpool_usable_size(pool, big), 4096);
  cr_assert_eq(magpool_free(pool, p), 0);
  cr_assert_eq(magpool_free(pool, big), 0);
  assert_all_free(pool);
  pool_done(pool);
}

Test(badinput, double_free) {
  magpool_t *pool = pool_new(1 * MiB, 0, 0);
  void *p = magpool_alloc(pool, 256);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_free(pool, p), 0);
  magpool_stats_t a = stats_of(pool);
  cr_assert_eq(magpool_free(pool, p), MAGPOOL_EINVAL, "double free accepted");
  cr_assert_eq(magpool_free_sized(pool, p, 256), MAGPOOL_EINVAL,
               "double free (sized) accepted");
  magpool_stats_t b = stats_of(pool);
  assert_same_stats(&a, &b, "a double free");
  /* Had the double free been taken, a cache would now hold p twice. */
  void *x = magpool_alloc(pool, 256);
  void *y = magpool_alloc(pool, 256);
  void *z = magpool_alloc(pool, 256);
  cr_assert(x && y && z);
  cr_assert(x != y && y != z && x != z, "one block handed out twice");
  cr_assert_eq(magpool_free(pool, x), 0);
  cr_assert_eq(magpool_free(pool, y), 0);
  cr_assert_eq(magpool_free(pool, z), 0);
  /* Large blocks (past the caches) too. */
  void *L = magpool_alloc(pool, 512 * KiB);
  cr_assert_not_null(L);
  cr_assert_eq(magpool_free(pool, L), 0);
  cr_assert_eq(magpool_free(pool, L), MAGPOOL_EINVAL);
  assert_all_free(pool);
  pool_done(pool);
}

Test(badinput, free_sized_wrong_size) {
  magpool_t *pool = pool_new(1 * MiB, 0, 0);
  const size_t size = 1000; /* block 1024 */
  void *p = magpool_alloc(pool, size);
  cr_assert_not_null(p);
  magpool_stats_t a = stats_of(pool);
  static const size_t wrong[] = {size + 1, size - 1, 0, 1024, 5000, 64,
                                 SIZE_MAX};
  for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
    int rc = magpool_free_sized(pool, p, wrong[i]);
    cr_assert_eq(rc, MAGPOOL_EINVAL,
                 "free_sized(size %zu) of a %zu-byte block returned %d",
                 wrong[i], size, rc);
    cr_assert_eq(magpool_usable_size(pool, p), 1024,
                 "a failed free_sized(%zu) freed the block", wrong[i]);
  }
  magpool_stats_t b = stats_of(pool);
  assert_same_stats(&a, &b, "free_sized with a wrong size");
  cr_assert_eq(magpool_free_sized(pool, p, size), 0);
  cr_assert_eq(magpool_usable_size(pool, p), 0);

  /* size 0 allocations are freed with size 0. */
  void *z = magpool_alloc(pool, 0);
  cr_assert_not_null(z);
  cr_assert_eq(magpool_free_sized(pool, z, 1), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_sized(pool, z, 64), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_sized(pool, z, 0), 0);
  assert_all_free(pool);
  pool_done(pool);
}

Test(badinput, size_zero) {
  magpool_t *pool = pool_new(1 * MiB, 0, 0);
  void *ps[100];
  for (int i = 0; i < 100; i++) {
    ps[i] = magpool_alloc(pool, 0);
    cr_assert_not_null(ps[i], "alloc(0) #%d returned NULL", i);
    cr_assert_eq(magpool_usable_size(pool, ps[i]), 64);
    for (int j = 0; j < i; j++)
      cr_assert_neq(ps[i], ps[j], "alloc(0) returned the same block twice");
  }
  magpool_stats_t s = stats_of(pool);
  cr_assert_eq(s.live_count, 100);
  cr_assert_eq(s.used_bytes, 100 * 64);
  cr_assert_eq(s.requested_bytes, 0);
  for (int i = 0; i < 100; i++)
    cr_assert_eq(magpool_free(pool, ps[i]), 0);
  assert_all_free(pool);
  pool_done(pool);
}

Test(badinput, huge_sizes) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  static const size_t huge[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX / 2 + 1,
                                SIZE_MAX / 2, 16 * MiB + 1, 32 * MiB};
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
    void *p = magpool_alloc(pool, huge[i]);
    cr_assert_null(p, "alloc(%zu) succeeded", huge[i]);
    cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM,
                 "alloc(%zu): last_error %d", huge[i], magpool_last_error());
  }
  /* The pool still works, and a success leaves last_error alone. */
  void *p = magpool_alloc(pool, 100);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM,
               "a successful alloc changed last_error");
  void *whole = magpool_alloc(pool, 8 * MiB);
  cr_assert_not_null(whole);
  cr_assert_eq(magpool_free(pool, whole), 0);
  cr_assert_eq(magpool_free(pool, p), 0);
  magpool_stats_t s = stats_of(pool);
  cr_assert_eq(s.alloc_count, 2, "failed allocations were counted");
  assert_all_free(pool);
  pool_done(pool);
}

static void noop_leak_fn(void *ptr, size_t size, const char *tag, void *arg) {
  (void)ptr;
  (void)size;
  (void)tag;
  (void)arg;
}

/* Reading: the "NULL pool -> MAGPOOL_EINVAL" convention of the error list
 * holds for every function taking a pool, including tracking. */
Test(badinput, null_arguments) {
  cr_assert_null(magpool_alloc(NULL, 8));
  cr_assert_eq(magpool_last_error(), MAGPOOL_EINVAL);
  cr_assert_null(magpool_alloc(NULL, 0));
  cr_assert_eq(magpool_last_error(), MAGPOOL_EINVAL);
  int x;
  cr_assert_eq(magpool_free(NULL, &x), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_sized(NULL, &x, 4), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_trim(NULL), MAGPOOL_EINVAL);
  magpool_stats_t s;
  cr_assert_eq(magpool_get_stats(NULL, &s), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_mem_info(NULL, NULL, NULL), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_destroy(NULL), MAGPOOL_EINVAL);
  cr_assert_null(magpool_scope_begin(NULL));
  cr_assert_eq(magpool_last_error(), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_scope_end(NULL), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_tracking_enable(NULL, 1), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_leak_check(NULL, noop_leak_fn, NULL), MAGPOOL_EINVAL);
  cr_assert_null(magpool_alloc_async(NULL, 8, NULL));
  cr_assert_eq(magpool_last_error(), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_async(NULL, &x, NULL), MAGPOOL_EINVAL);

  magpool_t *pool = pool_new(1 * MiB, 0, 0);
  cr_assert_eq(magpool_get_stats(pool, NULL), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_usable_size(pool, NULL), 0);
  pool_done(pool);
}

/* ------------------------------------------------------------------ */
/* memory kinds that need a GPU                                       */
/* ------------------------------------------------------------------ */

static bool nvidia_device_node(void) {
  return access("/dev/nvidiactl", F_OK) == 0 || access("/dev/nvidia0", F_OK) == 0;
}

static void try_gpu_kind(magpool_mem_kind_t kind, const char *name) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.kind = kind;
  cfg.pool_size = 16 * MiB;
  magpool_t *sentinel = (magpool_t *)(uintptr_t)0x5A5A;
  magpool_t *pool = sentinel;
  int rc = magpool_create(&cfg, &pool);
  if (!nvidia_device_node()) {
    /* No driver: the contract says ENODEV ("or in a build without CUDA");
     * ENOTSUP is accepted as the other honest answer. */
    cr_assert(rc == MAGPOOL_ENODEV || rc == MAGPOOL_ENOTSUP,
              "%s pool on a machine without a GPU: create = %d (%s)", name,
              rc, magpool_strerror(rc));
    cr_assert_eq(pool, sentinel, "%s: *out changed on failure", name);
    return;
  }
  /* A machine with an NVIDIA driver: the pool may work (CUDA build) or not
   * (build without CUDA). */
  if (rc != 0) {
    cr_assert(rc == MAGPOOL_ENODEV || rc == MAGPOOL_ENOTSUP ||
                  rc == MAGPOOL_ECUDA,
              "%s: create = %d", name, rc);
    cr_assert_eq(pool, sentinel);
    return;
  }
  void *p = magpool_alloc(pool, 1 * MiB);
  cr_assert_not_null(p, "%s: alloc failed: %s", name,
                     magpool_strerror(magpool_last_error()));
  if (kind == MAGPOOL_MEM_PINNED)
    memset(p, 1, 1 * MiB); /* pinned memory is host memory */
  cr_assert_eq(magpool_free(pool, p), 0);
  assert_all_free(pool);
  /* The whole pool as one block.  DEVICE and PINNED regions are aligned
   * as cudaMalloc / cudaHostAlloc align them: the header promises 256 B. */
  void *all = magpool_alloc(pool, 16 * MiB);
  cr_assert_not_null(all, "%s: the whole 16 MiB pool is not one block",
                     name);
  cr_assert(is_aligned(all, 256),
            "%s: 16 MiB block at %p not aligned to 256 B", name, all);
  cr_assert_eq(magpool_free(pool, all), 0);
  assert_all_free(pool);
  pool_done(pool);
}

Test(kinds, device_pool_without_gpu) { try_gpu_kind(MAGPOOL_MEM_DEVICE, "DEVICE"); }
Test(kinds, pinned_pool_without_gpu) { try_gpu_kind(MAGPOOL_MEM_PINNED, "PINNED"); }

Test(kinds, bad_device_ordinal) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.kind = MAGPOOL_MEM_DEVICE;
  cfg.device = 4096;
  cfg.pool_size = 1 * MiB;
  magpool_t *sentinel = (magpool_t *)(uintptr_t)0x5A5A;
  magpool_t *pool = sentinel;
  int rc = magpool_create(&cfg, &pool);
  cr_assert_neq(rc, 0, "a pool on device 4096 was created");
  cr_assert_lt(rc, 0);
  cr_assert_eq(pool, sentinel);
}

/* ------------------------------------------------------------------ */
/* multi-threaded                                                     */
/* ------------------------------------------------------------------ */

#define MT_THREADS 4
#define MT_SLOTS 256
#define MT_XCHG 64
#if MPT_ASAN
#define MT_OPS 100000
#else
#define MT_OPS 600000
#endif

#define COOKIE_HEAD 0x6D61677068656164ull /* "magphead" */
#define COOKIE_TAIL 0x6D61677074616C6Cull /* "magptall" */

typedef struct mt_shared {
  magpool_t *pool;
  _Atomic(void *) xchg[MT_XCHG];
  _Atomic long errors;
  _Atomic long allocs;
  _Atomic long frees;
  _Atomic int first_taken;
  char first[200];
} mt_shared;

typedef struct mt_arg {
  mt_shared *sh;
  unsigned id;
} mt_arg;

static void mt_err(mt_shared *sh, const char *msg, const void *p, size_t n) {
  atomic_fetch_add(&sh->errors, 1);
  int e = 0;
  if (atomic_compare_exchange_strong(&sh->first_taken, &e, 1))
    snprintf(sh->first, sizeof sh->first, "%s (ptr %p, %zu)", msg, p, n);
}

/* Block layout while live: [0,8) head cookie, [8,16) requested size,
 * [usable-8, usable) tail cookie.  usable >= 64 always. */
static void *mt_alloc(mt_shared *sh, size_t size) {
  void *p = magpool_alloc(sh->pool, size);
  if (!p) {
    mt_err(sh, "allocation failed", NULL, size);
    return NULL;
  }
  size_t u = magpool_usable_size(sh->pool, p);
  if (u < size || u < 64 || !mpt_is_pow2(u) || !is_aligned(p, u)) {
    mt_err(sh, "bad usable size / alignment", p, u);
    return p;
  }
  uint64_t head = COOKIE_HEAD ^ (uint64_t)(uintptr_t)p;
  uint64_t tail = COOKIE_TAIL ^ (uint64_t)(uintptr_t)p ^ size;
  uint64_t sz = size;
  memcpy(p, &head, 8);
  memcpy((char *)p + 8, &sz, 8);
  memcpy((char *)p + u - 8, &tail, 8);
  atomic_fetch_add_explicit(&sh->allocs, 1, memory_order_relaxed);
  return p;
}

static void mt_free(mt_shared *sh, void *p, int sized) {
  size_t u = magpool_usable_size(sh->pool, p);
  if (u < 64) {
    mt_err(sh, "live block not live", p, u);
    return;
  }
  uint64_t head, sz, tail;
  memcpy(&head, p, 8);
  memcpy(&sz, (char *)p + 8, 8);
  memcpy(&tail, (char *)p + u - 8, 8);
  if (head != (COOKIE_HEAD ^ (uint64_t)(uintptr_t)p))
    mt_err(sh, "head cookie overwritten", p, u);
  if (tail != (COOKIE_TAIL ^ (uint64_t)(uintptr_t)p ^ sz))
    mt_err(sh, "tail cookie overwritten", p, u);
  /* Scramble so that a second owner of the same block would notice. */
  uint64_t junk = 0xDEADDEADDEADDEADull;
  memcpy(p, &junk, 8);
  memcpy((char *)p + u - 8, &junk, 8);
  int rc = sized ? magpool_free_sized(sh->pool, p, (size_t)sz)
                 : magpool_free(sh->pool, p);
  if (rc != 0)
    mt_err(sh, sized ? "free_sized failed" : "free failed", p, (size_t)sz);
  else
    atomic_fetch_add_explicit(&sh->frees, 1, memory_order_relaxed);
}

static size_t mt_size(mpt_rng *r) {
  uint64_t d = mpt_below(r, 1000);
  if (d < 600)
    return (size_t)mpt_range(r, 0, 256);
  if (d < 900)
    return (size_t)mpt_range(r, 257, 8 * KiB);
  if (d < 995)
    return (size_t)mpt_range(r, 8 * KiB + 1, 128 * KiB);
  return (size_t)mpt_range(r, 128 * KiB + 1, 2 * MiB); /* past the caches */
}

static void *mt_worker(void *vp) {
  mt_arg *a = vp;
  mt_shared *sh = a->sh;
  mpt_rng r = mpt_rng_seed(77 + a->id);
  void *slots[MT_SLOTS] = {0};
  for (long op = 0; op < MT_OPS; op++) {
    uint64_t x = mpt_next(&r);
    size_t i = (size_t)(x % MT_SLOTS);
    uint64_t what = (x >> 20) % 100;
    if (what < 5) {
      /* Hand a block to whoever takes the exchange slot next: frees from
       * threads other than the allocating one. */
      void *mine = slots[i];
      slots[i] = NULL;
      if (!mine)
        mine = mt_alloc(sh, mt_size(&r));
      if (mine) {
        void *theirs =
            atomic_exchange(&sh->xchg[(x >> 40) % MT_XCHG], mine);
        if (theirs)
          mt_free(sh, theirs, (int)((x >> 50) & 1));
      }
    } else if (slots[i]) {
      mt_free(sh, slots[i], (int)((x >> 50) & 1));
      slots[i] = NULL;
    } else {
      slots[i] = mt_alloc(sh, mt_size(&r));
    }
    if (a->id == 0 && op % 8192 == 8191) {
      /* Trim and stats run concurrently with everything else. */
      if (magpool_trim(sh->pool) != 0)
        mt_err(sh, "concurrent trim failed", NULL, 0);
      magpool_stats_t s;
      if (magpool_get_stats(sh->pool, &s) != 0)
        mt_err(sh, "concurrent get_stats failed", NULL, 0);
      else if (s.used_bytes > s.reserved_bytes)
        mt_err(sh, "used_bytes > reserved_bytes", NULL, s.used_bytes);
    }
  }
  for (size_t i = 0; i < MT_SLOTS; i++)
    if (slots[i])
      mt_free(sh, slots[i], (int)(i & 1));
  return NULL;
}

Test(mt, random_traffic_four_threads, .timeout = 300) {
  magpool_t *pool = pool_new(256 * MiB, 0, 0);
  mt_shared *sh = calloc(1, sizeof *sh);
  cr_assert_not_null(sh);
  sh->pool = pool;
  pthread_t th[MT_THREADS];
  mt_arg args[MT_THREADS];
  for (unsigned i = 0; i < MT_THREADS; i++) {
    args[i].sh = sh;
    args[i].id = i;
    cr_assert_eq(pthread_create(&th[i], NULL, mt_worker, &args[i]), 0);
  }
  for (unsigned i = 0; i < MT_THREADS; i++)
    pthread_join(th[i], NULL);
  for (size_t k = 0; k < MT_XCHG; k++) {
    void *p = atomic_exchange(&sh->xchg[k], NULL);
    if (p)
      mt_free(sh, p, 0);
  }
  long errors = atomic_load(&sh->errors);
  cr_assert_eq(errors, 0, "%ld errors; first: %s", errors, sh->first);
  long allocs = atomic_load(&sh->allocs), frees = atomic_load(&sh->frees);
  cr_assert_gt(allocs, 0);
  cr_assert_eq(allocs, frees, "allocs %ld != frees %ld", allocs, frees);

  /* Conservation: the workers have exited, so trim gets back their caches
   * too; the pool is one free block again. */
  assert_all_free(pool);
  magpool_stats_t s = stats_of(pool);
  cr_assert_eq(s.alloc_count, (uint64_t)allocs);
  cr_assert_eq(s.free_count, (uint64_t)frees);
  cr_assert_eq(s.largest_free_block, 256 * MiB);
  cr_assert_eq(s.reserved_bytes, 256 * MiB);
  free(sh);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* A thread that cached blocks and is still alive returns its whole cache
 * for the pool at its next allocation or free on that pool after a trim. */
typedef struct cache_arg {
  magpool_t *pool;
  pthread_barrier_t *bar;
  int errors;
  size_t kept_usable;
} cache_arg;

static void *cache_worker(void *vp) {
  cache_arg *a = vp;
  void *ps[200];
  void *kept = magpool_alloc(a->pool, 64);
  if (!kept)
    a->errors++;
  a->kept_usable = kept ? magpool_usable_size(a->pool, kept) : 0;
  for (int i = 0; i < 200; i++) {
    ps[i] = magpool_alloc(a->pool, 64 + (size_t)(i % 4) * 64);
    if (!ps[i])
      a->errors++;
  }
  for (int i = 0; i < 200; i++)
    if (ps[i] && magpool_free(a->pool, ps[i]) != 0)
      a->errors++;
  pthread_barrier_wait(a->bar); /* A: cache filled */
  pthread_barrier_wait(a->bar); /* B: main trimmed */
  /* The next free on this pool returns the whole cache (and then caches
   * at most this one block). */
  if (kept && magpool_free(a->pool, kept) != 0)
    a->errors++;
  pthread_barrier_wait(a->bar); /* C */
  pthread_barrier_wait(a->bar); /* D: main checked, while we still live */
  return NULL;
}

Test(mt, live_thread_returns_cache_after_trim, .timeout = 60) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  cache_arg a = {pool, &bar, 0, 0};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, cache_worker, &a), 0);
  pthread_barrier_wait(&bar); /* A */
  cr_assert_eq(magpool_trim(pool), 0);
  magpool_stats_t before = stats_of(pool);
  pthread_barrier_wait(&bar); /* B */
  pthread_barrier_wait(&bar); /* C */
  cr_assert_eq(magpool_trim(pool), 0);
  magpool_stats_t s = stats_of(pool);
  pthread_barrier_wait(&bar); /* D */
  pthread_join(t, NULL);
  cr_assert_eq(a.errors, 0);
  cr_assert_eq(s.live_count, 0);
  cr_assert_leq(s.cached_bytes, a.kept_usable,
                "a live thread kept %zu cached bytes after trim and its next "
                "free on the pool (%zu before); at most the block it freed "
                "(%zu) may stay",
                s.cached_bytes, before.cached_bytes, a.kept_usable);
  assert_conserved(&s);
  pthread_barrier_destroy(&bar);
  /* The thread has exited: its cache came back at exit. */
  assert_all_free(pool);
  cr_assert_eq(stats_of(pool).largest_free_block, 16 * MiB);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

static void *exit_worker(void *vp) {
  cache_arg *a = vp;
  for (int round = 0; round < 20; round++) {
    void *ps[100];
    for (int i = 0; i < 100; i++) {
      ps[i] = magpool_alloc(a->pool, (size_t)(i % 8) * 100);
      if (!ps[i])
        a->errors++;
    }
    for (int i = 0; i < 100; i++)
      if (ps[i] && magpool_free(a->pool, ps[i]) != 0)
        a->errors++;
  }
  return NULL;
}

Test(mt, exited_threads_caches_come_back, .timeout = 60) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  cache_arg a[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (cache_arg){pool, NULL, 0, 0};
    cr_assert_eq(pthread_create(&t[i], NULL, exit_worker, &a[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    cr_assert_eq(a[i].errors, 0);
  }
  assert_all_free(pool);
  cr_assert_eq(stats_of(pool).largest_free_block, 16 * MiB);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* A thread holds cache entries of pool A; A is destroyed and B created
 * (perhaps at A's address).  A's records are orphaned: the thread must
 * never hand them out as B's blocks. */
static void *stale_worker(void *vp) {
  cache_arg *a = vp;
  void *ps[300];
  for (int i = 0; i < 300; i++)
    ps[i] = magpool_alloc(a->pool, 64 + (size_t)(i % 3) * 64);
  for (int i = 0; i < 300; i++)
    if (!ps[i] || magpool_free(a->pool, ps[i]) != 0)
      a->errors++;
  pthread_barrier_wait(a->bar); /* A: cache holds blocks of the old pool */
  pthread_barrier_wait(a->bar); /* B: old pool destroyed, a->pool is new */
  magpool_t *pool = a->pool;
  for (int i = 0; i < 300; i++) {
    size_t sz = 64 + (size_t)(i % 3) * 64;
    ps[i] = magpool_alloc(pool, sz);
    if (!ps[i] || magpool_usable_size(pool, ps[i]) < sz) {
      a->errors++;
      ps[i] = NULL;
      continue;
    }
    memset(ps[i], 0x3C, sz); /* faults if it came from the dead pool */
  }
  for (int i = 0; i < 300; i++)
    if (ps[i] && magpool_free(pool, ps[i]) != 0)
      a->errors++;
  return NULL;
}

Test(mt, stale_cache_after_destroy, .timeout = 60) {
  magpool_t *old = pool_new(8 * MiB, 0, 0);
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  cache_arg a = {old, &bar, 0, 0};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, stale_worker, &a), 0);
  pthread_barrier_wait(&bar); /* A */
  cr_assert_eq(magpool_destroy(old), 0);
  a.pool = pool_new(8 * MiB, 0, 0);
  pthread_barrier_wait(&bar); /* B */
  pthread_join(t, NULL);
  cr_assert_eq(a.errors, 0, "%d errors using a new pool after the old one "
                            "was destroyed under a thread's cache",
               a.errors);
  assert_all_free(a.pool);
  cr_assert_eq(stats_of(a.pool).largest_free_block, 8 * MiB);
  pthread_barrier_destroy(&bar);
  pool_done(a.pool);
  MPT_ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------------ */
/* scopes                                                             */
/* ------------------------------------------------------------------ */

Test(scope, frees_everything_at_end) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  void *outside = magpool_alloc(pool, 1000);
  cr_assert_not_null(outside);
  magpool_stats_t s0 = stats_of(pool);
  magpool_scope_t *sc = magpool_scope_begin(pool);
  cr_assert_not_null(sc);
  void *ps[200];
  mpt_rng r = mpt_rng_seed(5);
  for (int i = 0; i < 200; i++) {
    size_t sz = (size_t)mpt_range(&r, 0, 5000);
    ps[i] = magpool_scope_alloc(sc, sz);
    cr_assert_not_null(ps[i]);
    assert_block(pool, ps[i], sz, 64);
    memset(ps[i], 0x77, sz);
  }
  magpool_stats_t s1 = stats_of(pool);
  cr_assert_eq(s1.live_count, s0.live_count + 200);
  cr_assert_gt(s1.used_bytes, s0.used_bytes);
  cr_assert_eq(magpool_scope_end(sc), 0);
  magpool_stats_t s2 = stats_of(pool);
  cr_assert_eq(s2.used_bytes, s0.used_bytes, "scope leaked: used %zu, was %zu",
               s2.used_bytes, s0.used_bytes);
  cr_assert_eq(s2.requested_bytes, s0.requested_bytes);
  cr_assert_eq(s2.live_count, s0.live_count);
  for (int i = 0; i < 200; i++)
    cr_assert_eq(magpool_usable_size(pool, ps[i]), 0,
                 "scope block %d still live after the scope ended", i);
  /* The block allocated outside the scope is untouched. */
  cr_assert_eq(magpool_usable_size(pool, outside), 1024);
  cr_assert_eq(magpool_free(pool, outside), 0);
  assert_all_free(pool);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(scope, scope_free_and_plain_free) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  magpool_stats_t s0 = stats_of(pool);
  magpool_scope_t *sc = magpool_scope_begin(pool);
  cr_assert_not_null(sc);
  void *ps[50];
  for (int i = 0; i < 50; i++) {
    ps[i] = magpool_scope_alloc(sc, 300);
    cr_assert_not_null(ps[i]);
  }
  /* Scope blocks belong to the scope: the plain frees refuse them. */
  magpool_stats_t a = stats_of(pool);
  cr_assert_eq(magpool_free(pool, ps[0]), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_sized(pool, ps[1], 300), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_usable_size(pool, ps[0]), 512);
  cr_assert_eq(magpool_usable_size(pool, ps[1]), 512);
  magpool_stats_t b = stats_of(pool);
  assert_same_stats(&a, &b, "a plain free of a scope block");

  /* 20 freed early through the scope. */
  for (int i = 0; i < 50; i += 5) {
    cr_assert_eq(magpool_scope_free(sc, ps[i]), 0);
    cr_assert_eq(magpool_usable_size(pool, ps[i]), 0);
  }
  for (int i = 1; i < 50; i += 5)
    cr_assert_eq(magpool_scope_free(sc, ps[i]), 0);
  /* Not live blocks of this scope. */
  cr_assert_eq(magpool_scope_free(sc, ps[0]), MAGPOOL_EINVAL, "scope double "
                                                              "free");
  void *plain = magpool_alloc(pool, 300);
  cr_assert_not_null(plain);
  cr_assert_eq(magpool_scope_free(sc, plain), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_scope_free(sc, (char *)ps[2] + 64), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_scope_free(sc, NULL), 0);
  cr_assert_eq(magpool_scope_free(NULL, ps[2]), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_usable_size(pool, plain), 512);
  cr_assert_eq(magpool_usable_size(pool, ps[2]), 512);
  cr_assert_eq(magpool_free(pool, plain), 0);

  cr_assert_eq(magpool_scope_end(sc), 0);
  magpool_stats_t s = stats_of(pool);
  cr_assert_eq(s.live_count, s0.live_count);
  cr_assert_eq(s.used_bytes, s0.used_bytes);
  /* 51 allocations, 51 frees: 20 early, 30 at the end, 1 plain. */
  cr_assert_eq(s.alloc_count - s0.alloc_count, 51);
  cr_assert_eq(s.free_count - s0.free_count, 51,
               "free_count moved by %llu, expected 51",
               (unsigned long long)(s.free_count - s0.free_count));
  assert_all_free(pool);
  pool_done(pool);
}

/* A block freed early through the scope whose address is then handed out
 * again by magpool_alloc is not the scope's, and scope_end must leave it
 * alone. */
Test(scope, does_not_free_a_reused_address) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  magpool_scope_t *sc = magpool_scope_begin(pool);
  cr_assert_not_null(sc);
  void *a = magpool_scope_alloc(sc, 256);
  cr_assert_not_null(a);
  void *keep = magpool_scope_alloc(sc, 256);
  cr_assert_not_null(keep);
  cr_assert_eq(magpool_scope_free(sc, a), 0);
  /* Ask for 256-byte blocks until the address comes back (it usually does
   * at once: lowest address first, thread cache LIFO). */
  void *got[64];
  int n = 0, hit = -1;
  while (n < 64) {
    got[n] = magpool_alloc(pool, 256);
    cr_assert_not_null(got[n]);
    if (got[n] == a) {
      hit = n;
      n++;
      break;
    }
    n++;
  }
  cr_assert_eq(magpool_scope_end(sc), 0);
  cr_assert_eq(magpool_usable_size(pool, keep), 0);
  for (int i = 0; i < n; i++)
    cr_assert_eq(magpool_usable_size(pool, got[i]), 256,
                 "scope_end freed block %p, which was allocated outside the "
                 "scope%s",
                 got[i], i == hit ? " (at the address of a scope block freed "
                                    "early)"
                                  : "");
  for (int i = 0; i < n; i++)
    cr_assert_eq(magpool_free(pool, got[i]), 0);
  assert_all_free(pool);
  pool_done(pool);
}

Test(scope, many_blocks_and_nesting) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  magpool_stats_t s0 = stats_of(pool);
  magpool_scope_t *outer = magpool_scope_begin(pool);
  cr_assert_not_null(outer);
  for (int i = 0; i < 20000; i++)
    cr_assert_not_null(magpool_scope_alloc(outer, 64), "scope alloc %d", i);
  void *o1 = magpool_scope_alloc(outer, 128);
  cr_assert_not_null(o1);
  magpool_scope_t *inner = magpool_scope_begin(pool);
  cr_assert_not_null(inner);
  void *i1 = magpool_scope_alloc(inner, 128);
  cr_assert_not_null(i1);
  /* A block of one scope is not another scope's. */
  cr_assert_eq(magpool_scope_free(inner, o1), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_scope_free(outer, i1), MAGPOOL_EINVAL);
  void *plain = magpool_alloc(pool, 128);
  cr_assert_not_null(plain);
  /* A failed scope allocation reports ENOMEM and leaves the scope usable. */
  cr_assert_null(magpool_scope_alloc(inner, SIZE_MAX));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_eq(magpool_scope_end(inner), 0);
  cr_assert_eq(magpool_usable_size(pool, i1), 0);
  cr_assert_eq(magpool_usable_size(pool, o1), 128, "ending the inner scope "
                                                   "freed an outer block");
  cr_assert_eq(magpool_usable_size(pool, plain), 128);
  cr_assert_eq(magpool_scope_end(outer), 0);
  cr_assert_eq(magpool_usable_size(pool, o1), 0);
  cr_assert_eq(magpool_usable_size(pool, plain), 128);
  magpool_stats_t s = stats_of(pool);
  cr_assert_eq(s.live_count, s0.live_count + 1);
  cr_assert_eq(magpool_free(pool, plain), 0);
  assert_all_free(pool);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------------ */
/* tracking and leak checks                                           */
/* ------------------------------------------------------------------ */

typedef struct leak_rec {
  void *ptr;
  size_t size;
  const char *tag;
} leak_rec;

typedef struct leak_list {
  leak_rec r[64];
  int n;
  int overflow;
} leak_list;

static void collect_leak(void *ptr, size_t size, const char *tag, void *arg) {
  leak_list *l = arg;
  if (l->n < 64)
    l->r[l->n++] = (leak_rec){ptr, size, tag};
  else
    l->overflow = 1;
}

static bool same_tag(const char *a, const char *b) {
  if (!a || !b)
    return a == b;
  return strcmp(a, b) == 0;
}

/* Reading: "size" in a leak report is the size the program asked for. */
static void expect_reported(const leak_list *l, const void *ptr, size_t size,
                            const char *tag) {
  int found = 0;
  for (int i = 0; i < l->n; i++) {
    if (l->r[i].ptr != ptr)
      continue;
    found++;
    cr_assert_eq(l->r[i].size, size, "block %p reported with size %zu, "
                                     "allocated with %zu",
                 ptr, l->r[i].size, size);
    cr_assert(same_tag(l->r[i].tag, tag),
              "block %p reported with tag \"%s\", expected \"%s\"", ptr,
              l->r[i].tag ? l->r[i].tag : "(null)", tag ? tag : "(null)");
  }
  cr_assert_eq(found, 1, "block %p reported %d times", ptr, found);
}

static long leaks(magpool_t *pool, leak_list *l) {
  memset(l, 0, sizeof *l);
  long n = magpool_leak_check(pool, collect_leak, l);
  cr_assert_eq(l->overflow, 0);
  cr_assert_eq(n, l->n, "leak_check returned %ld but called fn %d times", n,
               l->n);
  return n;
}

Test(tracking, reports_exactly_the_live_blocks) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  cr_assert_eq(magpool_tracking_enable(pool, 1), 0);
  leak_list l;
  cr_assert_eq(leaks(pool, &l), 0);

  magpool_set_tag("alpha");
  void *a1 = magpool_alloc(pool, 100);
  void *a2 = magpool_alloc(pool, 2000);
  magpool_set_tag("beta");
  void *b1 = magpool_alloc(pool, 5);
  void *b2 = magpool_alloc(pool, 2 * MiB); /* past the caches */
  magpool_set_tag(NULL);
  void *n1 = magpool_alloc(pool, 77);
  cr_assert(a1 && a2 && b1 && b2 && n1);

  cr_assert_eq(leaks(pool, &l), 5);
  expect_reported(&l, a1, 100, "alpha");
  expect_reported(&l, a2, 2000, "alpha");
  expect_reported(&l, b1, 5, "beta");
  expect_reported(&l, b2, 2 * MiB, "beta");
  expect_reported(&l, n1, 77, NULL);

  cr_assert_eq(magpool_free(pool, a1), 0);
  cr_assert_eq(magpool_free_sized(pool, b1, 5), 0);
  /* A failed free leaves the record alone. */
  cr_assert_eq(magpool_free_sized(pool, a2, 1), MAGPOOL_EINVAL);
  cr_assert_eq(leaks(pool, &l), 3);
  expect_reported(&l, a2, 2000, "alpha");
  expect_reported(&l, b2, 2 * MiB, "beta");
  expect_reported(&l, n1, 77, NULL);

  cr_assert_eq(magpool_free(pool, a2), 0);
  cr_assert_eq(magpool_free(pool, b2), 0);
  cr_assert_eq(magpool_free(pool, n1), 0);
  cr_assert_eq(leaks(pool, &l), 0);
  assert_all_free(pool);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(tracking, enable_needs_no_live_allocation) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  void *p = magpool_alloc(pool, 64);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_tracking_enable(pool, 1), MAGPOOL_EBUSY);
  cr_assert_eq(magpool_free(pool, p), 0);
  cr_assert_eq(magpool_tracking_enable(pool, 1), 0);
  magpool_set_tag("t");
  p = magpool_alloc(pool, 64);
  cr_assert_not_null(p);
  leak_list l;
  cr_assert_eq(leaks(pool, &l), 1);
  expect_reported(&l, p, 64, "t");
  cr_assert_eq(magpool_free(pool, p), 0);
  cr_assert_eq(leaks(pool, &l), 0);
  assert_all_free(pool);
  pool_done(pool);
}

typedef struct tag_arg {
  magpool_t *pool;
  void *p;
} tag_arg;

static void *tag_worker(void *vp) {
  tag_arg *a = vp;
  magpool_set_tag("worker");
  a->p = magpool_alloc(a->pool, 300);
  return NULL;
}

Test(tracking, tags_are_per_thread) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  cr_assert_eq(magpool_tracking_enable(pool, 1), 0);
  magpool_set_tag("main");
  tag_arg a = {pool, NULL};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, tag_worker, &a), 0);
  pthread_join(t, NULL);
  cr_assert_not_null(a.p);
  void *m = magpool_alloc(pool, 400);
  cr_assert_not_null(m);
  leak_list l;
  cr_assert_eq(leaks(pool, &l), 2);
  expect_reported(&l, a.p, 300, "worker");
  expect_reported(&l, m, 400, "main");
  /* Freed on another thread than the one that allocated it. */
  cr_assert_eq(magpool_free(pool, a.p), 0);
  cr_assert_eq(magpool_free(pool, m), 0);
  cr_assert_eq(leaks(pool, &l), 0);
  assert_all_free(pool);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------------ */
/* host streams and stream-ordered allocation                         */
/* ------------------------------------------------------------------ */

typedef struct order_rec {
  int next;
  int seen[1000];
} order_rec;

typedef struct order_item {
  order_rec *rec;
  int idx;
} order_item;

static void order_fn(void *arg) {
  order_item *it = arg;
  it->rec->seen[it->rec->next++] = it->idx;
}

Test(stream, host_stream_runs_in_order, .timeout = 60) {
  magpool_stream_t s = NULL;
  cr_assert_eq(magpool_host_stream_create(&s), 0);
  cr_assert_not_null(s);
  order_rec *rec = calloc(1, sizeof *rec);
  order_item *items = calloc(1000, sizeof *items);
  cr_assert(rec && items);
  for (int i = 0; i < 1000; i++) {
    items[i] = (order_item){rec, i};
    cr_assert_eq(magpool_host_stream_launch(s, order_fn, &items[i]), 0);
  }
  cr_assert_eq(magpool_host_stream_sync(s), 0);
  cr_assert_eq(rec->next, 1000, "%d of 1000 functions ran before sync "
                                "returned", rec->next);
  for (int i = 0; i < 1000; i++)
    cr_assert_eq(rec->seen[i], i, "function %d ran at position %d",
                 rec->seen[i], i);
  cr_assert_eq(magpool_host_stream_destroy(s), 0);
  free(rec);
  free(items);
  MPT_ASSERT_NO_LEAKS();
}

/* Work on a stream writes a stamp into a block and later checks it; the
 * block is freed on the stream right after.  If a block freed on one stream
 * were handed to the other before the first passed the free, the other
 * stream's stamp would break the check. */
typedef struct stamp {
  unsigned char *p;
  unsigned char v;
  _Atomic int *bad;
} stamp;

static void stamp_write(void *arg) {
  stamp *st = arg;
  memset(st->p, st->v, 64);
}

static void stamp_check(void *arg) {
  stamp *st = arg;
  for (int i = 0; i < 64; i++)
    if (st->p[i] != st->v) {
      atomic_fetch_add(st->bad, 1);
      break;
    }
}

Test(stream, async_alloc_free_round_trip, .timeout = 120) {
  magpool_t *pool = pool_new(16 * MiB, 0, 0);
  magpool_stream_t s[2];
  cr_assert_eq(magpool_host_stream_create(&s[0]), 0);
  cr_assert_eq(magpool_host_stream_create(&s[1]), 0);
  enum { N = 4000 };
  stamp *st = calloc(N, sizeof *st);
  cr_assert_not_null(st);
  _Atomic int bad = 0;
  mpt_rng r = mpt_rng_seed(9);
  for (int i = 0; i < N; i++) {
    magpool_stream_t on = s[i & 1];
    size_t sz = (size_t)mpt_range(&r, 64, 4096);
    void *p = magpool_alloc_async(pool, sz, on);
    cr_assert_not_null(p, "alloc_async %d: %s", i,
                       magpool_strerror(magpool_last_error()));
    cr_assert_geq(magpool_usable_size(pool, p), sz);
    st[i] = (stamp){p, (unsigned char)(i % 251 + 1), &bad};
    cr_assert_eq(magpool_host_stream_launch(on, stamp_write, &st[i]), 0);
    cr_assert_eq(magpool_host_stream_launch(on, stamp_check, &st[i]), 0);
    cr_assert_eq(magpool_free_async(pool, p, on), 0);
  }
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(magpool_host_stream_sync(s[k]), 0);
    cr_assert_eq(magpool_stream_release(pool, s[k]), 0);
    cr_assert_eq(magpool_host_stream_sync(s[k]), 0);
  }
  cr_assert_eq(atomic_load(&bad), 0,
               "%d stamps broken: a block was reused across streams before "
               "its free was reached",
               atomic_load(&bad));
  assert_all_free(pool);
  magpool_stats_t stats = stats_of(pool);
  cr_assert_eq(stats.alloc_count, N);
  cr_assert_eq(stats.free_count, N);
  cr_assert_eq(stats.largest_free_block, 16 * MiB);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(magpool_host_stream_destroy(s[k]), 0);
  free(st);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;
} gate;

static void gate_wait(void *arg) {
  gate *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->open)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* While stream s1 is held before a free, the freed block must not go to
 * another stream nor to the synchronous API. */
Test(stream, free_async_waits_for_the_stream, .timeout = 60) {
  magpool_t *pool = pool_new(1 * MiB, 0, 0);
  magpool_stream_t s1, s2;
  cr_assert_eq(magpool_host_stream_create(&s1), 0);
  cr_assert_eq(magpool_host_stream_create(&s2), 0);
  gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  cr_assert_eq(magpool_host_stream_launch(s1, gate_wait, &g), 0);

  void *a = magpool_alloc_async(pool, 256, s1);
  cr_assert_not_null(a);
  cr_assert_eq(magpool_free_async(pool, a, s1), 0);
  cr_assert_eq(magpool_usable_size(pool, a), 0,
               "a block freed with free_async is still live");
  /* Freeing it again is a double free. */
  cr_assert_eq(magpool_free_async(pool, a, s1), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free(pool, a), MAGPOOL_EINVAL);

  void *b[64], *c[64];
  for (int i = 0; i < 64; i++) {
    b[i] = magpool_alloc_async(pool, 256, s2);
    c[i] = magpool_alloc(pool, 256);
    cr_assert(b[i] && c[i]);
    cr_assert_neq(b[i], a, "a block freed on s1 went to s2 before s1 "
                           "reached the free");
    cr_assert_neq(c[i], a, "a block freed on s1 went to magpool_alloc "
                           "before s1 reached the free");
  }
  for (int i = 0; i < 64; i++) {
    cr_assert_eq(magpool_free_async(pool, b[i], s2), 0);
    cr_assert_eq(magpool_free(pool, c[i]), 0);
  }
  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(s1), 0);
  cr_assert_eq(magpool_host_stream_sync(s2), 0);
  cr_assert_eq(magpool_stream_release(pool, s1), 0);
  cr_assert_eq(magpool_stream_release(pool, s2), 0);
  cr_assert_eq(magpool_host_stream_sync(s1), 0);
  cr_assert_eq(magpool_host_stream_sync(s2), 0);
  assert_all_free(pool);
  cr_assert_eq(stats_of(pool).largest_free_block, 1 * MiB);
  cr_assert_eq(magpool_host_stream_destroy(s1), 0);
  cr_assert_eq(magpool_host_stream_destroy(s2), 0);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(stream, async_inputs) {
  magpool_t *pool = pool_new(1 * MiB, 0, 0);
  magpool_stream_t s;
  cr_assert_eq(magpool_host_stream_create(&s), 0);
  /* NULL stream on a HOST pool: the same as magpool_alloc. */
  void *p = magpool_alloc_async(pool, 100, NULL);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_usable_size(pool, p), 128);
  cr_assert_eq(magpool_free(pool, p), 0);
  p = magpool_alloc(pool, 100);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_free_async(pool, p, s), 0, "a synchronous block "
                                                  "freed on a stream");
  int local;
  cr_assert_eq(magpool_free_async(pool, &local, s), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_async(pool, NULL, s), 0);
  cr_assert_null(magpool_alloc_async(pool, SIZE_MAX, s));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  /* A stream the pool has never seen. */
  magpool_stream_t fresh;
  cr_assert_eq(magpool_host_stream_create(&fresh), 0);
  cr_assert_eq(magpool_stream_release(pool, fresh), 0);
  cr_assert_eq(magpool_host_stream_destroy(fresh), 0);

  cr_assert_eq(magpool_host_stream_sync(s), 0);
  cr_assert_eq(magpool_stream_release(pool, s), 0);
  cr_assert_eq(magpool_host_stream_sync(s), 0);
  assert_all_free(pool);
  cr_assert_eq(magpool_host_stream_destroy(s), 0);
  pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}
