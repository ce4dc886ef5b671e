/* test_cache_api.c - the per-thread caches' public contract, through
 * include/magpool.h only (see magpool_config_t.thread_cache_bytes,
 * magpool_trim and magpool_stats_t.cached_bytes).
 *
 * What the public API can measure: magpool_stats_t.cached_bytes is the sum
 * of every thread's cache, every depot (shared stacks of full magazines)
 * and every stream cache (no streams are used here).  Depots are not
 * visible on their own, so where a test needs one thread's cache alone it
 * uses the contract of magpool_trim: a trim from another thread empties the
 * depots and the trimming thread's cache but cannot touch the cache of a
 * live idle thread - after it, cached_bytes is exactly what the idle
 * threads hold.  Where a test reads cached_bytes while depots may hold
 * magazines, it allows the depot bound of docs/design.md: per size class
 * min(2 x thread_cache_bytes, pool_size / 16).
 *
 * Each Criterion test runs in its own process.
 */
#define _POSIX_C_SOURCE 200809L /* pthread_barrier_t */

#include <magpool.h>

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* ------------------------------------------------------------------ */
/* helpers                                                            */
/* ------------------------------------------------------------------ */

static magpool_t *pool_new(size_t pool_size, size_t thread_cache_bytes) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = pool_size;
  cfg.thread_cache_bytes = thread_cache_bytes;
  magpool_t *pool = NULL;
  int rc = magpool_create(&cfg, &pool);
  cr_assert_eq(rc, 0, "magpool_create(pool %zu, cache %zu) = %d (%s)",
               pool_size, thread_cache_bytes, rc, magpool_strerror(rc));
  cr_assert_not_null(pool);
  return pool;
}

static magpool_stats_t stats_of(magpool_t *pool) {
  magpool_stats_t s;
  memset(&s, 0xA5, sizeof s);
  cr_assert_eq(magpool_get_stats(pool, &s), 0);
  return s;
}

/* Not for use in worker threads (Criterion asserts belong to the test's
 * thread): workers record their failures in their argument struct. */
static size_t cached_now(magpool_t *pool) {
  magpool_stats_t s;
  if (magpool_get_stats(pool, &s) != 0) return SIZE_MAX;
  return s.cached_bytes;
}

/* On a quiescent pool: used + cached + pending + free == reserved. */
static void assert_conserved(const magpool_stats_t *s) {
  cr_assert_eq(s->used_bytes + s->cached_bytes + s->pending_bytes +
                   s->free_bytes,
               s->reserved_bytes,
               "used %zu + cached %zu + pending %zu + free %zu != reserved "
               "%zu", s->used_bytes, s->cached_bytes, s->pending_bytes,
               s->free_bytes, s->reserved_bytes);
}

/* After trim, with nothing live and no other live thread: nothing cached,
 * and a power-of-two pool is one free block that one allocation gets. */
static void assert_one_block(magpool_t *pool, size_t pool_size) {
  cr_assert_eq(magpool_trim(pool), 0);
  magpool_stats_t s = stats_of(pool);
  assert_conserved(&s);
  cr_assert_eq(s.cached_bytes, 0, "cached_bytes %zu after trim",
               s.cached_bytes);
  cr_assert_eq(s.used_bytes, 0, "used_bytes %zu", s.used_bytes);
  cr_assert_eq(s.pending_bytes, 0);
  cr_assert_eq(s.free_bytes, pool_size);
  cr_assert_eq(s.largest_free_block, pool_size,
               "largest free block %zu, pool %zu: not one block after trim",
               s.largest_free_block, pool_size);
  void *all = magpool_alloc(pool, pool_size);
  cr_assert_not_null(all, "alloc of the whole pool failed: %s",
                     magpool_strerror(magpool_last_error()));
  cr_assert_eq(magpool_free(pool, all), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(magpool_check(pool), 0);
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
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  magpool_t *pool = NULL;
  cr_assert_eq(magpool_create(&cfg, &pool), 0); /* default HOST pool */
  void *p[100];
  for (int i = 0; i < 100; i++) {
    p[i] = magpool_alloc(pool, 1 * KiB);
    cr_assert_not_null(p[i]);
  }
  for (int i = 0; i < 100; i++) cr_assert_eq(magpool_free(pool, p[i]), 0);
  magpool_stats_t s = stats_of(pool);
  assert_conserved(&s);
  cr_assert_gt(s.cached_bytes, 0, "nothing cached after 100 frees");
  cr_assert_eq(s.used_bytes, 0, "used_bytes %zu after freeing everything",
               s.used_bytes);
  cr_assert_eq(s.live_count, 0);
  /* magpool_mem_info counts cached bytes as free. */
  size_t fb = 0, tb = 0;
  cr_assert_eq(magpool_mem_info(pool, &fb, &tb), 0);
  cr_assert_eq(fb, tb);
  assert_one_block(pool, cfg.pool_size);
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
  const size_t pool_size = 256 * MiB;
  magpool_t *pool = pool_new(pool_size, 16 * MiB);
  fill_arg a = {.pool = pool};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cache_and_exit, &a), 0);
  cr_assert_eq(pthread_join(th, NULL), 0);
  cr_assert_eq(a.failed, 0);
  cr_assert_gt(a.cached_seen, 0, "the thread cached nothing");
  /* The thread is gone; trim from the main thread. */
  assert_one_block(pool, pool_size);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* ------------------------------------------------------------------ */
/* 3. idle threads' full caches do not starve the others              */
/* ------------------------------------------------------------------ */

#define IDLE_THREADS 8
#define IDLE_POOL (256 * MiB)
#define IDLE_TCB (8 * MiB)
/* Fragmentation slack for the main thread's 1 MiB blocks, justified by
 * the fill below.  With thread_cache_bytes = 8 MiB the magazine capacities
 * of docs/design.md (min(64, tcb / 4 / block) slots) are 64, 64, 64, 32,
 * 8 and 2 for the six sizes, so each size is allocated exactly one
 * magazine's worth: one refill carves it out of one block of 64 KiB,
 * 256 KiB, 1 MiB, 2 MiB, 2 MiB and 2 MiB, and after the frees every
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
  magpool_t *pool = pool_new(IDLE_POOL, IDLE_TCB);
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
  magpool_stats_t s = stats_of(pool);
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
  s = stats_of(pool);
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
  s = stats_of(pool);
  cr_assert_eq(s.cached_bytes, 0, "cached %zu after exits + trim",
               s.cached_bytes);
  cr_assert_eq(s.used_bytes, 0);
  cr_assert_eq(magpool_check(pool), 0);
  assert_one_block(pool, IDLE_POOL);
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
  magpool_t *pool = pool_new(BOUND_POOL, BOUND_TCB);
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
  assert_one_block(pool, BOUND_POOL);
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
  magpool_t *pool = pool_new(SMALL_POOL, 64 * MiB);
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
    size_t c = stats_of(pool).cached_bytes;
    if (c > mx) mx = c;
    cr_assert_leq(c, bound, "free %d: cached %zu > 2 MiB + depot 1 MiB", i, c);
  }
  free(p);
  cr_log_info("lowered_1k: max cached %zu", mx);
  cr_assert_gt(mx, 0);
  assert_one_block(pool, SMALL_POOL);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* The same limit, measured on one idle thread's cache alone: 8 MiB of
 * 64 KiB blocks freed by a worker.  Had the limit stayed at 64 MiB, the
 * worker's two 64-slot magazines would keep all 8 MiB. */
static const size_t lowered_sizes[] = {64 * KiB};

Test(cache_api, oversized_limit_lowered_thread, .timeout = 120) {
  magpool_t *pool = pool_new(SMALL_POOL, 64 * MiB);
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
  assert_one_block(pool, SMALL_POOL);
  cr_assert_eq(magpool_destroy(pool), 0);
}
