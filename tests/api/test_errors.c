/* test_errors.c - bad inputs: NULL arguments, foreign, interior and freed
 * pointers, wrong sizes; a call that fails changes nothing.
 */
#include <magpool.h>

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

Test(badinput, free_null_is_noop) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB});
  magpool_stats_t a = mpt_stats(pool);
  cr_assert_eq(magpool_free(pool, NULL), 0);
  magpool_stats_t b = mpt_stats(pool);
  mpt_assert_same_stats(a, b, "free(NULL)");
  mpt_pool_done(pool);
}

Test(badinput, foreign_pointers) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB});
  void *live = magpool_alloc(pool, 128);
  cr_assert_not_null(live);
  magpool_stats_t a = mpt_stats(pool);
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
  magpool_t *other = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB});
  void *q = magpool_alloc(other, 128);
  cr_assert_not_null(q);
  cr_assert_eq(magpool_free(pool, q), MAGPOOL_EINVAL);
  magpool_stats_t b = mpt_stats(pool);
  mpt_assert_same_stats(a, b, "freeing foreign pointers");
  cr_assert_eq(magpool_usable_size(pool, live), 128);
  cr_assert_eq(magpool_free(other, q), 0);
  cr_assert_eq(magpool_free(pool, live), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(other);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(badinput, interior_pointers) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB});
  char *p = magpool_alloc(pool, 256);
  cr_assert_not_null(p);
  char *big = magpool_alloc(pool, 4096);
  cr_assert_not_null(big);
  magpool_stats_t a = mpt_stats(pool);
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
  magpool_stats_t b = mpt_stats(pool);
  mpt_assert_same_stats(a, b, "freeing interior pointers");
  cr_assert_eq(magpool_usable_size(pool, p), 256);
  cr_assert_eq(magpool_usable_size(pool, big), 4096);
  cr_assert_eq(magpool_free(pool, p), 0);
  cr_assert_eq(magpool_free(pool, big), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

Test(badinput, double_free) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB});
  void *p = magpool_alloc(pool, 256);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_free(pool, p), 0);
  magpool_stats_t a = mpt_stats(pool);
  cr_assert_eq(magpool_free(pool, p), MAGPOOL_EINVAL, "double free accepted");
  cr_assert_eq(magpool_free_sized(pool, p, 256), MAGPOOL_EINVAL,
               "double free (sized) accepted");
  magpool_stats_t b = mpt_stats(pool);
  mpt_assert_same_stats(a, b, "a double free");
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
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

Test(badinput, free_sized_wrong_size) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB});
  const size_t size = 1000; /* block 1024 */
  void *p = magpool_alloc(pool, size);
  cr_assert_not_null(p);
  magpool_stats_t a = mpt_stats(pool);
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
  magpool_stats_t b = mpt_stats(pool);
  mpt_assert_same_stats(a, b, "free_sized with a wrong size");
  cr_assert_eq(magpool_free_sized(pool, p, size), 0);
  cr_assert_eq(magpool_usable_size(pool, p), 0);

  /* size 0 allocations are freed with size 0. */
  void *z = magpool_alloc(pool, 0);
  cr_assert_not_null(z);
  cr_assert_eq(magpool_free_sized(pool, z, 1), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_sized(pool, z, 64), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_sized(pool, z, 0), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

Test(badinput, size_zero) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB});
  void *ps[100];
  for (int i = 0; i < 100; i++) {
    ps[i] = magpool_alloc(pool, 0);
    cr_assert_not_null(ps[i], "alloc(0) #%d returned NULL", i);
    cr_assert_eq(magpool_usable_size(pool, ps[i]), 64);
    for (int j = 0; j < i; j++)
      cr_assert_neq(ps[i], ps[j], "alloc(0) returned the same block twice");
  }
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.live_count, 100);
  cr_assert_eq(s.used_bytes, 100 * 64);
  cr_assert_eq(s.requested_bytes, 0);
  for (int i = 0; i < 100; i++)
    cr_assert_eq(magpool_free(pool, ps[i]), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

Test(badinput, huge_sizes) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
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
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.alloc_count, 2, "failed allocations were counted");
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
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

  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB});
  cr_assert_eq(magpool_get_stats(pool, NULL), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_usable_size(pool, NULL), 0);
  mpt_pool_done(pool);
}

static void *trim_elsewhere(void *pool) {
  cr_assert_eq(magpool_trim(pool), 0);
  return NULL;
}

/* A failing async call changes nothing, also when a trim on another thread
 * has moved the pool's epoch under the caller, whose next call would
 * return its caches (found by fuzzing against a model: the async calls
 * fetched the thread record, and so flushed, before they validated). */
Test(badinput, async_einval_after_a_trim_elsewhere_changes_nothing) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB});
  magpool_stream_t s;
  cr_assert_eq(magpool_host_stream_create(&s), 0);
  void *keep = magpool_alloc_async(pool, 64, s); /* the thread knows s */
  cr_assert_not_null(keep);
  void *p[8];
  for (int i = 0; i < 8; i++) cr_assert_not_null(p[i] = magpool_alloc(pool, 1024));
  for (int i = 0; i < 8; i++) cr_assert_eq(magpool_free(pool, p[i]), 0);
  char foreign[64];
  magpool_stream_t not_a_stream = (magpool_stream_t)(void *)foreign;
  memset(foreign, 0, sizeof foreign);
  for (int call = 0; call < 3; call++) {
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, trim_elsewhere, pool), 0);
    pthread_join(th, NULL);
    magpool_stats_t before = mpt_stats(pool);
    cr_assert_gt(before.cached_bytes, 0, "nothing cached: the test tests nothing");
    int rc = call == 0   ? magpool_free_async(pool, foreign, s)
             : call == 1 ? magpool_free_async(pool, keep, not_a_stream)
                         : (magpool_alloc_async(pool, 64, not_a_stream) == NULL
                                ? magpool_last_error()
                                : 0);
    cr_assert_eq(rc, MAGPOOL_EINVAL, "call %d: %d", call, rc);
    mpt_assert_same_stats(before, mpt_stats(pool), "a failed async call after a trim");
  }
  cr_assert_eq(magpool_free_async(pool, keep, s), 0);
  cr_assert_eq(magpool_stream_release(pool, s), 0);
  cr_assert_eq(magpool_host_stream_sync(s), 0);
  cr_assert_eq(magpool_host_stream_destroy(s), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  mpt_pool_done(pool);
}
