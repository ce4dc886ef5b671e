/* test_scope.c - scopes: everything a scope allocated is freed at its end,
 * and nothing else.
 */
#include <magpool.h>

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "test_util.h"

Test(scope, frees_everything_at_end) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
  void *outside = magpool_alloc(pool, 1000);
  cr_assert_not_null(outside);
  magpool_stats_t s0 = mpt_stats(pool);
  magpool_scope_t *sc = magpool_scope_begin(pool);
  cr_assert_not_null(sc);
  void *ps[200];
  mpt_rng r = mpt_rng_seed(5);
  for (int i = 0; i < 200; i++) {
    size_t sz = (size_t)mpt_range(&r, 0, 5000);
    ps[i] = magpool_scope_alloc(sc, sz);
    cr_assert_not_null(ps[i]);
    mpt_assert_block(pool, ps[i], sz, 64);
    memset(ps[i], 0x77, sz);
  }
  magpool_stats_t s1 = mpt_stats(pool);
  cr_assert_eq(s1.live_count, s0.live_count + 200);
  cr_assert_gt(s1.used_bytes, s0.used_bytes);
  cr_assert_eq(magpool_scope_end(sc), 0);
  magpool_stats_t s2 = mpt_stats(pool);
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
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(scope, scope_free_and_plain_free) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
  magpool_stats_t s0 = mpt_stats(pool);
  magpool_scope_t *sc = magpool_scope_begin(pool);
  cr_assert_not_null(sc);
  void *ps[50];
  for (int i = 0; i < 50; i++) {
    ps[i] = magpool_scope_alloc(sc, 300);
    cr_assert_not_null(ps[i]);
  }
  /* Scope blocks belong to the scope: the plain frees refuse them. */
  magpool_stats_t a = mpt_stats(pool);
  cr_assert_eq(magpool_free(pool, ps[0]), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_sized(pool, ps[1], 300), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_usable_size(pool, ps[0]), 512);
  cr_assert_eq(magpool_usable_size(pool, ps[1]), 512);
  magpool_stats_t b = mpt_stats(pool);
  mpt_assert_same_stats(a, b, "a plain free of a scope block");

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
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.live_count, s0.live_count);
  cr_assert_eq(s.used_bytes, s0.used_bytes);
  /* 51 allocations, 51 frees: 20 early, 30 at the end, 1 plain. */
  cr_assert_eq(s.alloc_count - s0.alloc_count, 51);
  cr_assert_eq(s.free_count - s0.free_count, 51,
               "free_count moved by %llu, expected 51",
               (unsigned long long)(s.free_count - s0.free_count));
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* A block freed early through the scope whose address is then handed out
 * again by magpool_alloc is not the scope's, and scope_end must leave it
 * alone. */
Test(scope, does_not_free_a_reused_address) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
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
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

Test(scope, many_blocks_and_nesting) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
  magpool_stats_t s0 = mpt_stats(pool);
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
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.live_count, s0.live_count + 1);
  cr_assert_eq(magpool_free(pool, plain), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}
