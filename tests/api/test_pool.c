/* test_pool.c - pools: create and destroy, block sizes and alignment,
 * statistics, coalescing, and a pool whose size is not a power of two.
 */
#include <magpool.h>

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

Test(pool, create_destroy_default) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  magpool_t *pool = NULL;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  cr_assert_not_null(pool);
  magpool_stats_t s = mpt_stats(pool);
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
  mpt_assert_conserved(pool);
  mpt_pool_done(pool);
  cr_assert_eq(magpool_destroy(NULL), MAGPOOL_EINVAL);

  /* Many pools at once, destroyed in another order. */
  magpool_t *pools[8];
  for (int i = 0; i < 8; i++)
    pools[i] = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB});
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
    mpt_pool_done(pools[i]);
  MPT_ASSERT_NO_LEAKS();
}

Test(pool, destroy_with_live_allocations) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
  for (int i = 0; i < 1000; i++)
    cr_assert_not_null(magpool_alloc(pool, (size_t)(i * 37) % 5000));
  cr_assert_not_null(magpool_alloc(pool, 2 * MiB));
  /* Live allocations are given back with the pool. */
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_destroy(pool), 0);
  MPT_ASSERT_NO_LEAKS();
}

Test(pool, usable_size_and_alignment) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 64 * MiB});
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
    size_t want = mpt_block_size_for(sizes[i], 64);
    cr_assert_eq(magpool_usable_size(pool, ps[i]), want,
                 "usable_size of alloc(%zu) = %zu, expected %zu", sizes[i],
                 magpool_usable_size(pool, ps[i]), want);
    mpt_assert_block(pool, ps[i], sizes[i], 64);
    /* The block is real, writable memory of its usable size. */
    memset(ps[i], (int)i, want);
  }
  for (size_t i = 0; i < n; i++) {
    size_t want = mpt_block_size_for(sizes[i], 64);
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
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
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
    pools[i] = mpt_pool(&(mpt_cfg){.pool_size = sizes[i]});
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
    if (!mpt_is_aligned(first[i], big)) {
      bad++;
      used += (size_t)snprintf(msg + used, sizeof msg - used,
                               " [%zu MiB pool: %zu MiB block at %p]",
                               sizes[i] / MiB, big / MiB, first[i]);
      if (used >= sizeof msg)
        used = sizeof msg - 1;
    }
    if (second[i]) {
      size_t nxt = magpool_usable_size(pools[i], second[i]);
      if (!mpt_is_aligned(second[i], nxt))
        bad++;
    }
  }
  for (size_t i = 0; i < NP; i++) {
    if (second[i])
      cr_assert_eq(magpool_free(pools[i], second[i]), 0);
    cr_assert_eq(magpool_free(pools[i], first[i]), 0);
    mpt_pool_done(pools[i]);
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
    if (!mpt_is_aligned(first[i], big)) {
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
    mpt_pool_done(pools[i]);
  }
  cr_assert_eq(bad, 0, "%d blocks of 2 GiB or more are not aligned to "
                       "their block size, which magpool_alloc promises:%s",
               bad, msg);
}

Test(pool, stats_and_mem_info) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
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
    used += mpt_block_size_for(sizes[i], 64);
    req += sizes[i];
    magpool_stats_t s = mpt_stats(pool);
    cr_assert_eq(s.used_bytes, used, "after %zu allocs: used %zu, expected "
                                     "%zu", i + 1, s.used_bytes, used);
    cr_assert_eq(s.requested_bytes, req);
    cr_assert_eq(s.live_count, i + 1);
    cr_assert_eq(s.alloc_count, i + 1);
    cr_assert_eq(s.free_count, 0);
    cr_assert_eq(s.reserved_bytes, 16 * MiB);
    cr_assert_geq(s.peak_used_bytes, used);
    mpt_assert_conserved(pool);
    /* free memory = what the pool can still hand out without growing =
     * free in the tree plus cached (nothing is pending here). */
    cr_assert_eq(magpool_mem_info(pool, &fb, &tb), 0);
    cr_assert_eq(tb, 16 * MiB);
    cr_assert_eq(fb, s.free_bytes + s.cached_bytes);
    cr_assert_eq(fb, 16 * MiB - used, "mem_info free %zu, expected %zu", fb,
                 16 * MiB - used);
  }
  size_t peak = mpt_stats(pool).peak_used_bytes;
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(magpool_free(pool, ps[i]), 0);
    used -= mpt_block_size_for(sizes[i], 64);
    req -= sizes[i];
    magpool_stats_t s = mpt_stats(pool);
    cr_assert_eq(s.used_bytes, used);
    cr_assert_eq(s.requested_bytes, req);
    cr_assert_eq(s.live_count, n - i - 1);
    cr_assert_eq(s.free_count, i + 1);
    cr_assert_eq(s.alloc_count, n);
    cr_assert_geq(s.peak_used_bytes, peak, "peak went down");
    mpt_assert_conserved(pool);
  }
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* A pool of 2^k bytes: after random traffic, freeing everything and trim,
 * it hands out 2^k bytes in one piece, covering every address it ever
 * handed out. */
Test(pool, full_coalescing, .timeout = 120) {
  const size_t pool_size = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = pool_size});
  magpool_stats_t s0 = mpt_stats(pool);

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
      mpt_assert_block(pool, p, size, 64);
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
  magpool_stats_t s = mpt_stats(pool);
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
  mpt_assert_conserved(pool);
  cr_assert_eq(magpool_check(pool), 0);

  void *all = magpool_alloc(pool, pool_size);
  cr_assert_not_null(all, "the whole 64 MiB is not one block after trim: %s",
                     magpool_strerror(magpool_last_error()));
  cr_assert_eq(magpool_usable_size(pool, all), pool_size);
  /* (A block of a chunk or more is a run of chunks in its own part of
   * the address range, so it need not cover the earlier blocks.) */
  memset(all, 0x11, pool_size);
  cr_assert_null(magpool_alloc(pool, 0), "a full pool handed out more");
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_eq(magpool_free(pool, all), 0);
  void *again = magpool_alloc(pool, pool_size);
  cr_assert_eq(again, all);
  cr_assert_eq(magpool_free_sized(pool, again, pool_size), 0);
  mpt_assert_all_free(pool);
  free(ps);
  free(sz);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* "Need not be a power of two: the pool holds exactly that many bytes." */
Test(pool, holds_exactly_48mib) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 48 * MiB});
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.reserved_bytes, 48 * MiB);
  cr_assert_eq(s.largest_free_block, 48 * MiB);
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
  s = mpt_stats(pool);
  cr_assert_eq(s.used_bytes, 48 * MiB);
  cr_assert_eq(s.live_count, 48);
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < i; j++)
      cr_assert_neq(blocks[i], blocks[j]);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(magpool_free(pool, blocks[i]), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  s = mpt_stats(pool);
  /* Chunked: any request up to the free bytes fits (its block is address
   * space; memory backs only its chunks). */
  cr_assert_eq(s.largest_free_block, 48 * MiB);
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
  mpt_assert_all_free(pool);
  /* On a chunked pool 48 MiB is one request: a 64 MiB block of address
   * space, 48 MiB of it backed; then nothing more fits. */
  void *all = magpool_alloc(pool, 48 * MiB);
  cr_assert_not_null(all, "48 MiB from an empty 48 MiB pool");
  cr_assert_eq(magpool_usable_size(pool, all), 48 * MiB);
  memset(all, 3, 48 * MiB);
  cr_assert_null(magpool_alloc(pool, 64));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 48 * MiB);
  cr_assert_eq(magpool_free(pool, all), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}
