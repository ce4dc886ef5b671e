/* test_streams.c - host streams and stream-ordered allocation: a host
 * stream runs its work in order, async allocations and frees round trip,
 * bad inputs, the NULL stream, and four threads on their own streams.
 * The deterministic "a freed block waits for its stream" tests, with
 * streams held behind gates, are in test_streams_gated.c.
 */
#define _GNU_SOURCE /* stream_util.h */

#include <magpool.h>

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stream_util.h"

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
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
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
  mpt_assert_all_free(pool);
  magpool_stats_t stats = mpt_stats(pool);
  cr_assert_eq(stats.alloc_count, N);
  cr_assert_eq(stats.free_count, N);
  cr_assert_eq(stats.largest_free_block, 16 * MiB);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(magpool_host_stream_destroy(s[k]), 0);
  free(st);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* While stream s1 is held before a free, the freed block must not go to
 * another stream nor to the synchronous API. */
Test(stream, free_async_waits_for_the_stream, .timeout = 60) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB});
  magpool_stream_t s1, s2;
  cr_assert_eq(magpool_host_stream_create(&s1), 0);
  cr_assert_eq(magpool_host_stream_create(&s2), 0);
  gate g;
  gate_init(&g);
  launch(s1, gate_task, &g);

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
  gate_done(&g);
  cr_assert_eq(magpool_host_stream_sync(s2), 0);
  cr_assert_eq(magpool_stream_release(pool, s1), 0);
  cr_assert_eq(magpool_stream_release(pool, s2), 0);
  cr_assert_eq(magpool_host_stream_sync(s1), 0);
  cr_assert_eq(magpool_host_stream_sync(s2), 0);
  mpt_assert_all_free(pool);
  cr_assert_eq(mpt_stats(pool).largest_free_block, 1 * MiB);
  cr_assert_eq(magpool_host_stream_destroy(s1), 0);
  cr_assert_eq(magpool_host_stream_destroy(s2), 0);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(stream, async_inputs) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB});
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
  mpt_assert_all_free(pool);
  cr_assert_eq(magpool_host_stream_destroy(s), 0);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* ===================================================================== */
/* Errors and edge inputs.                                               */
/* ===================================================================== */

Test(streams, free_async_errors, .timeout = 120) {
  const size_t PS = 16 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_t *other = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB});
  magpool_stream_t A = stream_new(), C = stream_new();
  gate g;
  gate_init(&g);
  launch(A, gate_task, &g); /* A blocked: freed blocks stay pending */
  gate_wait_entered(&g);

  void *p = magpool_alloc_async(pool, 256, A);
  cr_assert_not_null(p);
  magpool_stats_t s0 = mpt_stats(pool);

  /* Foreign pointers: stack, malloc, another pool; interior; unaligned. */
  char local[64];
  void *m = malloc(256);
  void *q = magpool_alloc(other, 64);
  cr_assert(m && q);
  cr_assert_eq(magpool_free_async(pool, local, A), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_async(pool, m, A), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_async(pool, q, A), MAGPOOL_EINVAL, "another pool's block");
  cr_assert_eq(magpool_free_async(pool, (char *)p + 64, A), MAGPOOL_EINVAL, "interior");
  cr_assert_eq(magpool_free_async(pool, (char *)p + 1, A), MAGPOOL_EINVAL, "unaligned");
  mpt_assert_same_stats(s0, mpt_stats(pool), "a rejected free_async");
  cr_assert_eq(magpool_usable_size(pool, p), 256, "a rejected free_async freed p");
  cr_assert_eq(magpool_usable_size(other, q), 64, "free_async on pool freed other's block");
  cr_assert_eq(magpool_free(other, q), 0);
  free(m);

  /* NULL pointer: a no-op; NULL pool: EINVAL. */
  cr_assert_eq(magpool_free_async(pool, NULL, A), 0);
  cr_assert_eq(magpool_free_async(pool, NULL, NULL), 0);
  cr_assert_eq(magpool_free_async(NULL, p, A), MAGPOOL_EINVAL);
  cr_assert_null(magpool_alloc_async(NULL, 8, A));
  cr_assert_eq(magpool_last_error(), MAGPOOL_EINVAL);
  mpt_assert_same_stats(s0, mpt_stats(pool), "NULL arguments");

  /* Double free while the first free sits in A's stream cache. */
  cr_assert_eq(magpool_free_async(pool, p, A), 0);
  magpool_stats_t s1 = mpt_stats(pool);
  cr_assert_eq(s1.used_bytes + 256, s0.used_bytes);
  cr_assert_eq(magpool_free_async(pool, p, A), MAGPOOL_EINVAL, "double free_async (cached)");
  cr_assert_eq(magpool_free_async(pool, p, C), MAGPOOL_EINVAL, "double free on another stream");
  cr_assert_eq(magpool_free(pool, p), MAGPOOL_EINVAL, "sync free after free_async");
  cr_assert_eq(magpool_free_async(pool, p, NULL), MAGPOOL_EINVAL, "NULL-stream double free");
  mpt_assert_same_stats(s1, mpt_stats(pool), "a double free");

  /* Double free after a synchronous free. */
  void *x = magpool_alloc(pool, 512);
  cr_assert_not_null(x);
  cr_assert_eq(magpool_free(pool, x), 0);
  cr_assert_eq(magpool_free_async(pool, x, A), MAGPOOL_EINVAL, "free_async after magpool_free");

  /* Double free of a block larger than cache_max_block: it bypasses the
   * thread's stream cache and is parked on A (reusable on A at once) or
   * pending behind A, not live. */
  void *big = magpool_alloc_async(pool, 2 * MiB, A);
  cr_assert_not_null(big);
  cr_assert_eq(magpool_free_async(pool, big, A), 0);
  magpool_stats_t s2 = mpt_stats(pool);
  cr_assert_geq(s2.pending_bytes + s2.cached_bytes, 2 * MiB);
  cr_assert_eq(magpool_free_async(pool, big, A), MAGPOOL_EINVAL, "double free (pending)");
  cr_assert_eq(magpool_free(pool, big), MAGPOOL_EINVAL);
  mpt_assert_same_stats(s2, mpt_stats(pool), "a double free of a pending block");

  /* Sizes: 0 gives a unique min_block block; SIZE_MAX fails cleanly. */
  void *z1 = magpool_alloc_async(pool, 0, C), *z2 = magpool_alloc_async(pool, 0, C);
  cr_assert(z1 && z2 && z1 != z2);
  cr_assert_eq(magpool_free_async(pool, z1, C), 0);
  cr_assert_eq(magpool_free_async(pool, z2, C), 0);
  cr_assert_null(magpool_alloc_async(pool, SIZE_MAX, C));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_null(magpool_alloc_async(pool, SIZE_MAX / 2 + 1, C));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);

  /* Release: a stream the pool never saw, NULL on a HOST pool, NULL pool,
   * twice. */
  magpool_stream_t fresh = stream_new();
  cr_assert_eq(magpool_stream_release(pool, fresh), 0);
  cr_assert_eq(magpool_stream_release(other, A), 0, "a stream the other pool never saw");
  cr_assert_eq(magpool_stream_release(pool, NULL), 0);
  cr_assert_eq(magpool_stream_release(NULL, A), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_host_stream_destroy(fresh), 0);

  /* An allocation that cannot fit: the out-of-memory ladder may wait for
   * streams, so open A first. */
  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(A), 0);
  cr_assert_null(magpool_alloc_async(pool, 2 * PS, C));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  void *after = magpool_alloc_async(pool, 1024, C);
  cr_assert_not_null(after, "pool unusable after ENOMEM");
  cr_assert_eq(magpool_free_async(pool, after, C), 0);

  cr_assert_eq(magpool_stream_release(pool, A), 0);
  cr_assert_eq(magpool_stream_release(pool, A), 0, "second release");
  gate_done(&g);
  cr_assert_eq(magpool_destroy(other), 0);
  magpool_stream_t s[] = {A, C};
  finish(pool, PS, s, 2);
}

/* NULL stream on a HOST pool is the synchronous API: the free completes
 * at once (nothing pending, nothing waits for any stream). */
Test(streams, null_stream_is_the_sync_api, .timeout = 60) {
  const size_t PS = 16 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_stream_t A = stream_new();
  gate g;
  gate_init(&g);
  launch(A, gate_task, &g); /* a blocked stream exists meanwhile */
  gate_wait_entered(&g);

  void *p = magpool_alloc_async(pool, 1000, NULL);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_usable_size(pool, p), 1024);
  memset(p, 0xAB, 1000); /* host memory of a HOST pool: usable at once */
  cr_assert_eq(magpool_free_async(pool, p, NULL), 0);
  cr_assert_eq(magpool_usable_size(pool, p), 0);
  cr_assert_eq(mpt_stats(pool).pending_bytes, 0, "a NULL-stream free is pending");
  cr_assert_eq(magpool_free_async(pool, p, NULL), MAGPOOL_EINVAL);

  /* The whole pool through the NULL stream, freed, then at once the whole
   * pool again through magpool_alloc: the free did not wait for anything. */
  void *all = magpool_alloc_async(pool, PS, NULL);
  cr_assert_not_null(all, "%s", magpool_strerror(magpool_last_error()));
  cr_assert_eq(magpool_free_async(pool, all, NULL), 0);
  cr_assert_eq(mpt_stats(pool).pending_bytes, 0);
  void *again = magpool_alloc(pool, PS);
  cr_assert_not_null(again, "a block freed on the NULL stream was not free at once: %s",
                     magpool_strerror(magpool_last_error()));
  cr_assert_eq(magpool_free_async(pool, again, NULL), 0);

  /* A synchronous block freed on the NULL stream, and a NULL-stream block
   * freed on a real stream. */
  void *q = magpool_alloc(pool, 64);
  cr_assert_not_null(q);
  cr_assert_eq(magpool_free_async(pool, q, NULL), 0);
  void *w = magpool_alloc_async(pool, 64, NULL);
  cr_assert_not_null(w);
  cr_assert_eq(magpool_free_async(pool, w, A), 0);
  cr_assert_eq(magpool_free(pool, w), MAGPOOL_EINVAL);

  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(A), 0);
  gate_done(&g);
  magpool_stream_t s[] = {A};
  finish(pool, PS, s, 1);
}

/* ===================================================================== */
/* Four threads, each on its own host stream.                            */
/* ===================================================================== */

enum { MT_THREADS = 4, MT_ITERS = 20000, MT_WINDOW = 48 };

typedef struct mt_job {
  void *p;
  size_t n;
  uint64_t cookie;
  _Atomic size_t *bad;
  _Atomic size_t *checked;
} mt_job;

static void mt_write(void *arg) {
  mt_job *j = arg;
  fill(j->p, j->n, j->cookie);
}

static void mt_check(void *arg) {
  mt_job *j = arg;
  if (!verify(j->p, j->n, j->cookie)) atomic_fetch_add(j->bad, 1);
  atomic_fetch_add(j->checked, 1);
  free(j);
}

static void mt_nap(void *arg) {
  (void)arg;
  usleep(300); /* lets the host thread run ahead: frees pile up pending */
}

typedef struct mt_arg {
  magpool_t *pool;
  int id;
  _Atomic size_t *bad, *checked;
  _Atomic int *errors;
  size_t allocs;
} mt_arg;

#define MT_FAIL(a)                                                                            \
  do {                                                                                        \
    atomic_fetch_add((a)->errors, 1);                                                         \
    return NULL;                                                                              \
  } while (0)

static void *mt_thread(void *p) {
  mt_arg *a = p;
  magpool_stream_t s;
  if (magpool_host_stream_create(&s) != 0) MT_FAIL(a);
  mpt_rng r = mpt_rng_seed(100 + (uint64_t)a->id);
  mt_job *ring[MT_WINDOW];
  size_t head = 0, count = 0;
  for (size_t i = 0; i < MT_ITERS + MT_WINDOW; i++) {
    if (i < MT_ITERS) {
      size_t n = (size_t)mpt_range(&r, 16, 8192);
      int sync_alloc = mpt_next(&r) % 16 == 0;
      void *blkp = sync_alloc ? magpool_alloc(a->pool, n) : magpool_alloc_async(a->pool, n, s);
      if (blkp == NULL) MT_FAIL(a);
      a->allocs++;
      mt_job *j = malloc(sizeof *j);
      if (j == NULL) MT_FAIL(a);
      *j = (mt_job){blkp, n, ((uint64_t)a->id << 56) ^ (i * 0x100000001B3ull), a->bad,
                    a->checked};
      if (magpool_host_stream_launch(s, mt_write, j) != 0) MT_FAIL(a);
      if (i % 101 == 0 && magpool_host_stream_launch(s, mt_nap, NULL) != 0) MT_FAIL(a);
      ring[(head + count) % MT_WINDOW] = j;
      count++;
    }
    if (count == MT_WINDOW || (i >= MT_ITERS && count > 0)) {
      mt_job *j = ring[head];
      head = (head + 1) % MT_WINDOW;
      count--;
      void *blkp = j->p; /* j belongs to the check task once launched */
      if (magpool_host_stream_launch(s, mt_check, j) != 0) MT_FAIL(a);
      if (mpt_next(&r) % 16 == 0) {
        /* Synchronous free after waiting for the stream. */
        if (magpool_host_stream_sync(s) != 0) MT_FAIL(a);
        if (magpool_free(a->pool, blkp) != 0) MT_FAIL(a);
      } else {
        if (magpool_free_async(a->pool, blkp, s) != 0) MT_FAIL(a);
      }
    }
    if (i % 5000 == 4999 && a->id == 0 && magpool_trim(a->pool) != 0) MT_FAIL(a);
  }
  if (magpool_host_stream_sync(s) != 0) MT_FAIL(a);
  if (magpool_stream_release(a->pool, s) != 0) MT_FAIL(a);
  if (magpool_host_stream_destroy(s) != 0) MT_FAIL(a);
  return NULL;
}

static void four_threads_case(size_t stream_cache, size_t thread_cache) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(
      &(mpt_cfg){.pool_size = PS, .stream_cache = stream_cache, .thread_cache = thread_cache});
  _Atomic size_t bad = 0, checked = 0;
  _Atomic int errors = 0;
  pthread_t t[MT_THREADS];
  mt_arg a[MT_THREADS];
  for (int i = 0; i < MT_THREADS; i++) {
    a[i] = (mt_arg){pool, i, &bad, &checked, &errors, 0};
    cr_assert_eq(pthread_create(&t[i], NULL, mt_thread, &a[i]), 0);
  }
  size_t allocs = 0;
  for (int i = 0; i < MT_THREADS; i++) {
    cr_assert_eq(pthread_join(t[i], NULL), 0);
    allocs += a[i].allocs;
  }
  cr_assert_eq(atomic_load(&errors), 0, "%d threads hit a failing magpool call",
               atomic_load(&errors));
  cr_assert_eq(allocs, (size_t)MT_THREADS * MT_ITERS);
  cr_assert_eq(atomic_load(&checked), allocs, "%zu of %zu blocks checked",
               atomic_load(&checked), allocs);
  cr_assert_eq(atomic_load(&bad), 0,
               "%zu of %zu blocks lost their cookie before their stream freed them",
               atomic_load(&bad), allocs);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.alloc_count, st.free_count);
  cr_assert_geq(st.alloc_count, allocs);
  finish(pool, PS, NULL, 0);
}

Test(streams, four_threads_own_streams, .timeout = 600) {
  four_threads_case(32 * KiB, MPT_DEFAULT);
}

/* Tiny stream caches and no thread caches: blocks go back and forth
 * through retire batches and the tree all the time. */
Test(streams, four_threads_own_streams_tight, .timeout = 600) {
  four_threads_case(4 * KiB, MPT_ZERO);
}
