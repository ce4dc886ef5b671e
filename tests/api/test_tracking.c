/* test_tracking.c - allocation tracking, per-thread tags and leak checks.
 */
#include <magpool.h>

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "test_util.h"

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
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
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
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(tracking, enable_needs_no_live_allocation) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
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
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
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
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
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
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

static void count_one(void *ptr, size_t size, const char *tag, void *arg) {
  (void)ptr;
  (void)size;
  (void)tag;
  (*(long *)arg)++;
}

/* Frees made while tracking was off do not leave stale entries behind for
 * the next tracking period (found by fuzzing against a model). */
Test(tracking, off_then_on_starts_clean) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB});
  cr_assert_eq(magpool_tracking_enable(pool, 1), 0);
  void *a = magpool_alloc(pool, 300);
  cr_assert_not_null(a);
  cr_assert_eq(magpool_tracking_enable(pool, 0), 0);
  cr_assert_eq(magpool_free(pool, a), 0); /* untracked free of a tracked block */
  cr_assert_eq(magpool_tracking_enable(pool, 1), 0);
  long n = 0;
  cr_assert_eq(magpool_leak_check(pool, count_one, &n), 0, "a freed block is reported live");
  cr_assert_eq(n, 0);
  void *b = magpool_alloc(pool, 300); /* may reuse a's address */
  cr_assert_not_null(b);
  n = 0;
  cr_assert_eq(magpool_leak_check(pool, count_one, &n), 1, "one live block, reported %ld times", n);
  cr_assert_eq(magpool_free(pool, b), 0);
  cr_assert_eq(magpool_leak_check(pool, NULL, NULL), 0);
  mpt_pool_done(pool);
}

/* A zero-size async allocation is tracked like any other, also once the
 * thread's memo for the stream is warm (found by fuzzing). */
Test(tracking, zero_size_async_is_tracked) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB});
  magpool_stream_t s;
  cr_assert_eq(magpool_host_stream_create(&s), 0);
  cr_assert_eq(magpool_tracking_enable(pool, 1), 0);
  void *p[4];
  for (int i = 0; i < 4; i++) {
    p[i] = magpool_alloc_async(pool, 0, s);
    cr_assert_not_null(p[i]);
    cr_assert_eq(magpool_leak_check(pool, NULL, NULL), 1, "allocation %d of size 0 on a stream "
                 "escaped tracking", i);
    cr_assert_eq(magpool_free_async(pool, p[i], s), 0);
  }
  cr_assert_eq(magpool_stream_release(pool, s), 0);
  cr_assert_eq(magpool_host_stream_sync(s), 0);
  cr_assert_eq(magpool_host_stream_destroy(s), 0);
  cr_assert_eq(magpool_leak_check(pool, NULL, NULL), 0);
  cr_assert_eq(magpool_tracking_enable(pool, 0), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  mpt_pool_done(pool);
}
