/* test_debug.c - the debug tiers run (src/base.h, MAGPOOL_DEBUG).
 *
 * A pool is broken on purpose - a live block's bit is set free in its
 * tree, so the block is both handed out and free - and then:
 *   debug::checker_sees_the_break      magpool_check answers EINVAL, in
 *        every build
 *   debug::tier2_trim_traps            with MAGPOOL_DEBUG=2 the quiescent
 *        trim runs the checker and traps (SIGILL from __builtin_trap)
 *   debug::tier2_destroy_traps         so does destroy
 *   debug::below_tier2_trim_returns    below tier 2 trim checks nothing
 * MAGPOOL_TEST_DEBUG_TIER is the library's tier (tests/CMakeLists.txt).
 *
 * Internal headers: links the static archive.
 */
#include "internal.h"

#include <criterion/criterion.h>
#include <signal.h>

#include "test_util.h"

#ifndef MAGPOOL_TEST_DEBUG_TIER
#define MAGPOOL_TEST_DEBUG_TIER 0
#endif

/* A pool with two live buddies of order 0 (so nothing merges), the first
 * marked free in the tree behind the pool's back. */
static magpool_t *broken_pool(void) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB, .thread_cache = MPT_ZERO});
  void *a = magpool_alloc(pool, 64), *b = magpool_alloc(pool, 64);
  cr_assert(a && b);
  cr_assert_eq(magpool_check(pool), 0, "the pool is broken before the test breaks it");
  mp_region *r = mp_region_of(pool, a);
  cr_assert_not_null(r);
  mp_tree_release(&r->tree, (uint64_t)((char *)a - r->base) >> pool->min_shift, 0);
  return pool;
}

Test(debug, checker_sees_the_break) {
  magpool_t *pool = broken_pool();
  cr_assert_eq(magpool_check(pool), MAGPOOL_EINVAL,
               "magpool_check passed a live block whose tree bit is free");
}

Test(debug, tier2_trim_traps, .signal = SIGILL, .disabled = MAGPOOL_TEST_DEBUG_TIER < 2) {
  magpool_t *pool = broken_pool();
  magpool_trim(pool);
  cr_assert_fail("magpool_trim returned on a broken pool at debug tier 2");
}

Test(debug, tier2_destroy_traps, .signal = SIGILL, .disabled = MAGPOOL_TEST_DEBUG_TIER < 2) {
  magpool_t *pool = broken_pool();
  magpool_destroy(pool);
  cr_assert_fail("magpool_destroy returned on a broken pool at debug tier 2");
}

Test(debug, below_tier2_trim_returns, .disabled = MAGPOOL_TEST_DEBUG_TIER >= 2) {
  magpool_t *pool = broken_pool();
  cr_assert_eq(magpool_trim(pool), 0);
}
