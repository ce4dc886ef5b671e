/* test_threads.c - many threads on one pool, and the per-thread caches'
 * public contract (magpool_config_t.thread_cache_bytes, magpool_trim and
 * magpool_stats_t.cached_bytes).
 *
 *   mt         random traffic from four threads, frees on other threads
 *              than the allocating one; the caches of live, exited and
 *              stale threads
 *   cache_api  what the caches hold, when they give it back, and their
 *              bound
 */
#define _POSIX_C_SOURCE 200809L /* pthread_barrier_t */

#include <magpool.h>

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

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
  if (u < size || u < 64 || !mpt_is_pow2(u) || !mpt_is_aligned(p, u)) {
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
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 256 * MiB});
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
  mpt_assert_all_free(pool);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.alloc_count, (uint64_t)allocs);
  cr_assert_eq(s.free_count, (uint64_t)frees);
  cr_assert_eq(s.largest_free_block, 256 * MiB);
  cr_assert_eq(s.reserved_bytes, 256 * MiB);
  free(sh);
  mpt_pool_done(pool);
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
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  cache_arg a = {pool, &bar, 0, 0};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, cache_worker, &a), 0);
  pthread_barrier_wait(&bar); /* A */
  cr_assert_eq(magpool_trim(pool), 0);
  magpool_stats_t before = mpt_stats(pool);
  pthread_barrier_wait(&bar); /* B */
  pthread_barrier_wait(&bar); /* C */
  cr_assert_eq(magpool_trim(pool), 0);
  magpool_stats_t s = mpt_stats(pool);
  pthread_barrier_wait(&bar); /* D */
  pthread_join(t, NULL);
  cr_assert_eq(a.errors, 0);
  cr_assert_eq(s.live_count, 0);
  cr_assert_leq(s.cached_bytes, a.kept_usable,
                "a live thread kept %zu cached bytes after trim and its next "
                "free on the pool (%zu before); at most the block it freed "
                "(%zu) may stay",
                s.cached_bytes, before.cached_bytes, a.kept_usable);
  mpt_assert_stats_conserved(&s);
  pthread_barrier_destroy(&bar);
  /* The thread has exited: its cache came back at exit. */
  mpt_assert_all_free(pool);
  cr_assert_eq(mpt_stats(pool).largest_free_block, 16 * MiB);
  mpt_pool_done(pool);
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
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
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
  mpt_assert_all_free(pool);
  cr_assert_eq(mpt_stats(pool).largest_free_block, 16 * MiB);
  mpt_pool_done(pool);
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
  magpool_t *old = mpt_pool(&(mpt_cfg){.pool_size = 8 * MiB});
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  cache_arg a = {old, &bar, 0, 0};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, stale_worker, &a), 0);
  pthread_barrier_wait(&bar); /* A */
  cr_assert_eq(magpool_destroy(old), 0);
  a.pool = mpt_pool(&(mpt_cfg){.pool_size = 8 * MiB});
  pthread_barrier_wait(&bar); /* B */
  pthread_join(t, NULL);
  cr_assert_eq(a.errors, 0, "%d errors using a new pool after the old one "
                            "was destroyed under a thread's cache",
               a.errors);
  mpt_assert_all_free(a.pool);
  cr_assert_eq(mpt_stats(a.pool).largest_free_block, 8 * MiB);
  pthread_barrier_destroy(&bar);
  mpt_pool_done(a.pool);
  MPT_ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------------ */
/* the caches' public contract                                        */
/* ------------------------------------------------------------------ */

/* What the public API can measure: magpool_stats_t.cached_bytes is the sum
 * of every thread's cache, every depot (shared stacks of full magazines)
 * and every stream cache (no streams are used here).  Depots are not
 * visible on their own, so where a test needs one thread's cache alone it
 * uses the contract of magpool_trim: a trim from another thread empties the
 * depots and the trimming thread's cache but cannot touch the cache of a
 * live idle thread - after it, cached_bytes is exactly what the idle
 * threads hold.  Where a test reads cached_bytes while depots may hold
 * magazines, it allows the depot bound of docs/design.md: per size class
 * min(2 x thread_cache_bytes, pool_size / 16). */

/* Not for use in worker threads (Criterion asserts belong to the test's
 * thread): workers record their failures in their argument struct. */
static size_t cached_now(magpool_t *pool) {
  magpool_stats_t s;
  if (magpool_get_stats(pool, &s) != 0) return SIZE_MAX;
  return s.cached_bytes;
}

/* Depot bound of docs/design.md, per size class. */
static size_t depot_bound(size_t pool_size, size_t tcb) {
  size_t a = 2 * tcb, b = pool_size / 16;
  return a < b ? a : b;
}

/* ------------------------------------------------------------------ */
/* 1. caches hold memory after frees                                  */
/* ------------------------------------------------------------------ */

Test(cache_api, frees_are_cached) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){0}); /* the default HOST pool */
  void *p[100];
  for (int i = 0; i < 100; i++) {
    p[i] = magpool_alloc(pool, 1 * KiB);
    cr_assert_not_null(p[i]);
  }
  for (int i = 0; i < 100; i++) cr_assert_eq(magpool_free(pool, p[i]), 0);
  mpt_assert_conserved(pool);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_gt(s.cached_bytes, 0, "nothing cached after 100 frees");
  cr_assert_eq(s.used_bytes, 0, "used_bytes %zu after freeing everything",
               s.used_bytes);
  cr_assert_eq(s.live_count, 0);
  /* magpool_mem_info counts cached bytes as free. */
  size_t fb = 0, tb = 0;
  cr_assert_eq(magpool_mem_info(pool, &fb, &tb), 0);
  cr_assert_eq(fb, tb);
  mpt_assert_one_block(pool);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* ------------------------------------------------------------------ */
/* 2. a thread's cache is returned when it exits                      */
/* ------------------------------------------------------------------ */

typedef struct fill_arg {
  magpool_t *pool;
  size_t cached_seen; /* cached_bytes the thread saw before it exited */
  int failed;
} fill_arg;

static void *cache_and_exit(void *vp) {
  fill_arg *a = vp;
  static const size_t sizes[] = {64, 1 * KiB, 4 * KiB, 64 * KiB, 1 * MiB};
  enum { N = 200 };
  void *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = magpool_alloc(a->pool, sizes[i % 5]);
    if (p[i] == NULL) a->failed = 1;
  }
  for (int i = 0; i < N; i++)
    if (magpool_free(a->pool, p[i]) != 0) a->failed = 1;
  a->cached_seen = cached_now(a->pool);
  return NULL;
}

Test(cache_api, exited_thread_then_trim) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 256 * MiB, .thread_cache = 16 * MiB});
  fill_arg a = {.pool = pool};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cache_and_exit, &a), 0);
  cr_assert_eq(pthread_join(th, NULL), 0);
  cr_assert_eq(a.failed, 0);
  cr_assert_gt(a.cached_seen, 0, "the thread cached nothing");
  /* The thread is gone; trim from the main thread. */
  mpt_assert_one_block(pool);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* ------------------------------------------------------------------ */
/* 3. idle threads' full caches do not starve the others              */
/* ------------------------------------------------------------------ */

#define IDLE_THREADS 8
/* 1 GiB: with 9 threads live (8 + main) each keeps its whole
 * thread_cache_bytes only while reserved / 8 covers them all (the share
 * of many threads, mp_cache_share); a 256 MiB pool gives each 4 MiB. */
#define IDLE_POOL (1024 * MiB)
#define IDLE_TCB (8 * MiB)
/* Fragmentation slack for the main thread's 1 MiB blocks, justified by
 * the fill below.  With thread_cache_bytes = 8 MiB the magazine capacities
 * (src/pool.c: the largest power of two <= min(64, tcb / 4 / block) slots)
 * are 64, 64, 64, 32, 8 and 2 for the six sizes, so each size is allocated
 * exactly one magazine's worth: one refill carves it out of one block of
 * 64 KiB, 256 KiB, 1 MiB, 2 MiB, 2 MiB and 2 MiB, and after the frees every
 * carved block is cached whole (7.3125 MiB per thread, no reclaim, nothing
 * reaches a depot).  Only the 64 KiB and 256 KiB carves are smaller than
 * the main thread's 1 MiB blocks: each can spoil at most one 1 MiB-aligned
 * block, so at most 2 x 8 = 16 blocks, of which 8 x 320 KiB are the caches
 * themselves: slack = 16 MiB covers it. */
#define IDLE_SLACK (16 * MiB)

static const struct {
  size_t size;
  int count;
} idle_fill[] = {{1 * KiB, 64},  {4 * KiB, 64},   {16 * KiB, 64},
                 {64 * KiB, 32}, {256 * KiB, 8}, {1 * MiB, 2}};

typedef struct idle_shared {
  magpool_t *pool;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int turn;     /* which thread fills now; IDLE_THREADS when all did */
  int released; /* main lets them exit */
  size_t delta[IDLE_THREADS]; /* cached_bytes growth by each fill */
  int failed[IDLE_THREADS];
} idle_shared;

typedef struct idle_arg {
  idle_shared *sh;
  int id;
} idle_arg;

static void *idle_worker(void *vp) {
  idle_arg *a = vp;
  idle_shared *sh = a->sh;
  pthread_mutex_lock(&sh->mu);
  while (sh->turn != a->id) pthread_cond_wait(&sh->cv, &sh->mu);
  pthread_mutex_unlock(&sh->mu);

  /* Our turn: every other thread is blocked, so the change of
   * cached_bytes is this thread's doing alone. */
  size_t before = cached_now(sh->pool);
  void *p[300];
  int n = 0;
  for (size_t c = 0; c < sizeof idle_fill / sizeof idle_fill[0]; c++)
    for (int i = 0; i < idle_fill[c].count; i++) {
      void *q = magpool_alloc(sh->pool, idle_fill[c].size);
      if (q == NULL) sh->failed[a->id] = 1;
      else p[n++] = q;
    }
  for (int i = 0; i < n; i++)
    if (magpool_free(sh->pool, p[i]) != 0) sh->failed[a->id] = 1;
  size_t after = cached_now(sh->pool);
  sh->delta[a->id] = after >= before ? after - before : 0;
  if (after < before) sh->failed[a->id] = 2;

  pthread_mutex_lock(&sh->mu);
  sh->turn++;
  pthread_cond_broadcast(&sh->cv);
  while (!sh->released) pthread_cond_wait(&sh->cv, &sh->mu); /* idle */
  pthread_mutex_unlock(&sh->mu);
  return NULL; /* no magpool call after the fill: the cache stays full */
}

Test(cache_api, idle_threads_do_not_starve_main, .timeout = 300) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = IDLE_POOL, .thread_cache = IDLE_TCB});
  idle_shared *sh = calloc(1, sizeof *sh);
  cr_assert_not_null(sh);
  sh->pool = pool;
  pthread_mutex_init(&sh->mu, NULL);
  pthread_cond_init(&sh->cv, NULL);
  pthread_t th[IDLE_THREADS];
  idle_arg args[IDLE_THREADS];
  for (int i = 0; i < IDLE_THREADS; i++) {
    args[i].sh = sh;
    args[i].id = i;
    cr_assert_eq(pthread_create(&th[i], NULL, idle_worker, &args[i]), 0);
  }
  pthread_mutex_lock(&sh->mu);
  while (sh->turn != IDLE_THREADS) pthread_cond_wait(&sh->cv, &sh->mu);
  pthread_mutex_unlock(&sh->mu);

  size_t sum = 0;
  for (int i = 0; i < IDLE_THREADS; i++) {
    cr_assert_eq(sh->failed[i], 0, "thread %d: fill failed (%d)", i,
                 sh->failed[i]);
    /* "Close to" the limit: the fill caches 7.3125 MiB (see IDLE_SLACK);
     * at least 3/4 of the limit keeps the test meaningful. */
    cr_assert_geq(sh->delta[i], IDLE_TCB / 4 * 3,
                  "thread %d cached only %zu bytes", i, sh->delta[i]);
    cr_assert_leq(sh->delta[i], IDLE_TCB,
                  "thread %d: cached_bytes grew by %zu > thread_cache_bytes "
                  "(the fill reaches no depot)", i, sh->delta[i]);
    sum += sh->delta[i];
  }
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.cached_bytes, sum, "cached %zu, threads' fills %zu",
               s.cached_bytes, sum);
  cr_assert_leq(s.cached_bytes, IDLE_THREADS * IDLE_TCB);

  /* The main thread takes 1 MiB blocks until the pool says no. */
  enum { MAXB = IDLE_POOL / MiB };
  void **blk = calloc(MAXB + 1, sizeof *blk);
  size_t nb = 0;
  void *q;
  while (nb <= MAXB && (q = magpool_alloc(pool, 1 * MiB)) != NULL)
    blk[nb++] = q;
  cr_assert_leq(nb, MAXB);
  int err = magpool_last_error();
  cr_assert_eq(err, MAGPOOL_ENOMEM, "last error %d (%s), expected ENOMEM",
               err, magpool_strerror(err));
  size_t got = nb * MiB;
  s = mpt_stats(pool);
  cr_log_info("idle: threads cache %zu B; main got %zu MiB; afterwards "
              "cached %zu, free %zu, largest free %zu", sum, got >> 20,
              s.cached_bytes, s.free_bytes, s.largest_free_block);
  cr_assert_geq(got, (size_t)IDLE_POOL - IDLE_THREADS * IDLE_TCB - IDLE_SLACK,
                "main got %zu MiB of a %zu MiB pool while %d idle threads "
                "cache %zu B", got >> 20, (size_t)IDLE_POOL >> 20,
                IDLE_THREADS, sum);
  /* While they idle: the out-of-memory ladder drained the depots and the
   * main thread's own cache, so only the idle caches remain. */
  cr_assert_leq(s.cached_bytes, IDLE_THREADS * IDLE_TCB,
                "cached %zu while the threads idle", s.cached_bytes);
  cr_assert_leq(s.cached_bytes, sum);
  cr_assert_lt(s.largest_free_block, 1 * MiB,
               "ENOMEM for 1 MiB with a %zu-byte block free",
               s.largest_free_block);
  cr_assert_eq(s.used_bytes, got);

  for (size_t i = 0; i < nb; i++) cr_assert_eq(magpool_free(pool, blk[i]), 0);
  free(blk);
  pthread_mutex_lock(&sh->mu);
  sh->released = 1;
  pthread_cond_broadcast(&sh->cv);
  pthread_mutex_unlock(&sh->mu);
  for (int i = 0; i < IDLE_THREADS; i++) pthread_join(th[i], NULL);

  cr_assert_eq(magpool_trim(pool), 0);
  s = mpt_stats(pool);
  cr_assert_eq(s.cached_bytes, 0, "cached %zu after exits + trim",
               s.cached_bytes);
  cr_assert_eq(s.used_bytes, 0);
  cr_assert_eq(magpool_check(pool), 0);
  mpt_assert_one_block(pool);
  pthread_cond_destroy(&sh->cv);
  pthread_mutex_destroy(&sh->mu);
  free(sh);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* ------------------------------------------------------------------ */
/* 4. the bound holds per thread                                      */
/* ------------------------------------------------------------------ */

/* One worker frees in phases; between phases it idles while the main
 * thread trims (depots empty, the worker's cache untouched) and reads the
 * worker's cache alone. */

#define BOUND_POOL (256 * MiB)
#define BOUND_TCB (2 * MiB)
#define BOUND_PHASES 3
#define BOUND_LIVE (48 * MiB)

static const size_t bound_sizes[] = {1 * KiB, 16 * KiB, 64 * KiB, 256 * KiB,
                                     1 * MiB};
#define BOUND_NCLASSES (sizeof bound_sizes / sizeof bound_sizes[0])

typedef struct phase_arg {
  magpool_t *pool;
  pthread_barrier_t done, resume;
  size_t live_target;
  const size_t *sizes;
  size_t nsizes;
  size_t limit_during; /* cached_bytes may not exceed this after a free */
  size_t max_during[BOUND_PHASES];
  size_t frees[BOUND_PHASES];
  int failed;
  char why[160];
} phase_arg;

static void phase_fail(phase_arg *a, const char *msg, size_t v) {
  if (a->failed) return;
  a->failed = 1;
  snprintf(a->why, sizeof a->why, "%s (%zu)", msg, v);
}

static void *phase_worker(void *vp) {
  phase_arg *a = vp;
  size_t cap = a->live_target / a->sizes[0] + 1;
  void **p = malloc(cap * sizeof *p);
  if (p == NULL) {
    phase_fail(a, "malloc", 0);
    cap = 0;
  }
  for (int ph = 0; ph < BOUND_PHASES; ph++) {
    mpt_rng r = mpt_rng_seed(100 + (uint64_t)ph);
    size_t n = 0, live = 0;
    while (p != NULL && live < a->live_target && n < cap) {
      size_t sz = a->sizes[mpt_below(&r, a->nsizes)];
      void *q = magpool_alloc(a->pool, sz);
      if (q == NULL) {
        phase_fail(a, "alloc failed, size", sz);
        break;
      }
      p[n++] = q;
      live += sz;
    }
    if (p != NULL) mpt_shuffle(&r, p, n, sizeof *p);
    size_t mx = 0;
    for (size_t i = 0; i < n; i++) {
      if (magpool_free(a->pool, p[i]) != 0) phase_fail(a, "free failed", i);
      size_t c = cached_now(a->pool);
      if (c > mx) mx = c;
      if (c > a->limit_during)
        phase_fail(a, "cached_bytes over the bound after a free", c);
    }
    a->max_during[ph] = mx;
    a->frees[ph] = n;
    pthread_barrier_wait(&a->done);   /* idle: main measures */
    pthread_barrier_wait(&a->resume);
  }
  free(p);
  return NULL;
}

/* Runs the worker's phases; after each, trims from this thread and
 * returns the worker's cache alone in cache[ph]. */
static void run_phases(phase_arg *a, size_t cache[BOUND_PHASES]) {
  pthread_barrier_init(&a->done, NULL, 2);
  pthread_barrier_init(&a->resume, NULL, 2);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, phase_worker, a), 0);
  for (int ph = 0; ph < BOUND_PHASES; ph++) {
    pthread_barrier_wait(&a->done);
    /* Empties the depots and this thread's (empty) cache; the worker is
     * alive and idle, so its cache is all that stays cached. */
    magpool_trim(a->pool);
    cache[ph] = cached_now(a->pool);
    pthread_barrier_wait(&a->resume);
  }
  pthread_join(th, NULL);
  pthread_barrier_destroy(&a->done);
  pthread_barrier_destroy(&a->resume);
  cr_assert_eq(a->failed, 0, "worker: %s", a->why);
}

Test(cache_api, bound_per_thread, .timeout = 300) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = BOUND_POOL, .thread_cache = BOUND_TCB});
  phase_arg *a = calloc(1, sizeof *a);
  a->pool = pool;
  a->live_target = BOUND_LIVE;
  a->sizes = bound_sizes;
  a->nsizes = BOUND_NCLASSES;
  /* During the frees cached_bytes is the worker's cache plus the depots
   * of the classes it uses (nobody else caches). */
  a->limit_during =
      BOUND_TCB + BOUND_NCLASSES * depot_bound(BOUND_POOL, BOUND_TCB);
  size_t cache[BOUND_PHASES];
  run_phases(a, cache);
  for (int ph = 0; ph < BOUND_PHASES; ph++) {
    cr_log_info("bound: phase %d: %zu frees, max cached during %zu, "
                "worker's cache alone %zu", ph, a->frees[ph],
                a->max_during[ph], cache[ph]);
    cr_assert_gt(a->frees[ph], 100);
    cr_assert_leq(a->max_during[ph], a->limit_during);
    cr_assert_gt(cache[ph], 0, "phase %d: the worker cached nothing", ph);
    cr_assert_leq(cache[ph], BOUND_TCB,
                  "phase %d: one idle thread caches %zu > thread_cache_bytes "
                  "%zu", ph, cache[ph], (size_t)BOUND_TCB);
  }
  free(a);
  mpt_assert_one_block(pool);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* ------------------------------------------------------------------ */
/* 5. thread_cache_bytes above pool_size / 8 is lowered               */
/* ------------------------------------------------------------------ */

#define SMALL_POOL (16 * MiB)
#define LOWERED_TCB (SMALL_POOL / 8) /* 2 MiB */

/* The check, on the main thread: 8 MiB of 1 KiB blocks freed.
 * cached_bytes is this thread's cache plus the 1 KiB class's depot, at
 * most min(2 x 2 MiB, 16 MiB / 16) = 1 MiB.  (Note: this check alone would
 * also pass with the limit left at 64 MiB, because the magazines of one
 * class hold far less than 2 MiB of 1 KiB blocks; the test below is the
 * one that tells the two apart.) */
Test(cache_api, oversized_limit_lowered_1k) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = SMALL_POOL, .thread_cache = 64 * MiB});
  enum { N = 8192 }; /* 8 MiB of 1 KiB blocks */
  void **p = malloc(N * sizeof *p);
  for (int i = 0; i < N; i++) {
    p[i] = magpool_alloc(pool, 1 * KiB);
    cr_assert_not_null(p[i], "alloc %d failed", i);
  }
  const size_t bound = LOWERED_TCB + depot_bound(SMALL_POOL, LOWERED_TCB);
  size_t mx = 0;
  for (int i = 0; i < N; i++) {
    cr_assert_eq(magpool_free(pool, p[i]), 0);
    size_t c = mpt_stats(pool).cached_bytes;
    if (c > mx) mx = c;
    cr_assert_leq(c, bound, "free %d: cached %zu > 2 MiB + depot 1 MiB", i, c);
  }
  free(p);
  cr_log_info("lowered_1k: max cached %zu", mx);
  cr_assert_gt(mx, 0);
  mpt_assert_one_block(pool);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* The same limit, measured on one idle thread's cache alone: 8 MiB of
 * 64 KiB blocks freed by a worker.  Had the limit stayed at 64 MiB, the
 * worker's two 64-slot magazines would keep all 8 MiB. */
static const size_t lowered_sizes[] = {64 * KiB};

Test(cache_api, oversized_limit_lowered_thread, .timeout = 120) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = SMALL_POOL, .thread_cache = 64 * MiB});
  phase_arg *a = calloc(1, sizeof *a);
  a->pool = pool;
  a->live_target = 8 * MiB;
  a->sizes = lowered_sizes;
  a->nsizes = 1;
  a->limit_during = LOWERED_TCB + depot_bound(SMALL_POOL, LOWERED_TCB);
  size_t cache[BOUND_PHASES];
  run_phases(a, cache);
  for (int ph = 0; ph < BOUND_PHASES; ph++) {
    cr_log_info("lowered: phase %d: %zu frees, max cached during %zu, "
                "worker's cache alone %zu", ph, a->frees[ph],
                a->max_during[ph], cache[ph]);
    cr_assert_eq(a->frees[ph], 128);
    cr_assert_leq(a->max_during[ph], a->limit_during);
    cr_assert_gt(cache[ph], 0);
    cr_assert_leq(cache[ph], LOWERED_TCB,
                  "phase %d: one idle thread caches %zu > pool_size / 8", ph,
                  cache[ph]);
  }
  free(a);
  mpt_assert_one_block(pool);
  cr_assert_eq(magpool_destroy(pool), 0);
}
