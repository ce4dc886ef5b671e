/* test_streams.c - stream-ordered allocation on host streams.
 *
 * What is tested (docs: include/magpool.h, "Stream-ordered allocation"):
 *
 *   A block freed with magpool_free_async(pool, p, A) is reusable at once
 *   by allocations on A, and by nothing else - no other stream, not the
 *   synchronous API - until A has run everything queued before the free.
 *
 * How: stream A is held behind a gate, a task that blocks on a condition
 * variable until the test opens it (deterministic; no sleeps, no timing
 * asserts).  Work queued on A writes a pattern into each block before the
 * gate and verifies it after the gate; the blocks are freed on A while A is
 * blocked.  The test then allocates thousands of blocks on other streams
 * and through magpool_alloc, keeps them live, fills each with its own
 * pattern, and checks by address that none of them overlaps a block freed
 * on A.  If one did, the pointer check fails at once, and the host fill
 * also breaks A's pattern, which A's verify task reports after the gate.
 *
 * Every test ends with the same conservation check: all freed, streams
 * released and synchronised, trim; then used, cached and pending bytes are
 * 0, magpool_check passes, and the whole pool is one block again.
 *
 * Tasks run on host-stream worker threads, where cr_assert must not be
 * used: they count failures in atomics that the test thread asserts on.
 *
 * Public header only.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <magpool.h>

/* LeakSanitizer inside a Criterion test prints but passes: finish() asks
 * it explicitly under ASan. */
#if defined(__SANITIZE_ADDRESS__)
#define ST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ST_ASAN 1
#endif
#endif
#ifdef ST_ASAN
#include <sanitizer/lsan_interface.h>
#define ST_ASSERT_NO_LEAKS()                                                                  \
  cr_assert_eq(__lsan_do_recoverable_leak_check(), 0,                                         \
               "LeakSanitizer found leaks (see the report above)")
#else
#define ST_ASSERT_NO_LEAKS() ((void)0)
#endif

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ------------------------------------------------------------------ rng -- */

typedef struct rng {
  uint64_t s;
} rng;

static rng rng_seed(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (rng){z ? z : 1};
}

static uint64_t rng_next(rng *r) {
  uint64_t x = r->s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  r->s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

static size_t rng_range(rng *r, size_t lo, size_t hi) {
  return lo + (size_t)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

/* -------------------------------------------------------------- pattern -- */

/* A pattern that depends on the tag and on the position, so that a block
 * overwritten by another block's fill, or shifted, does not verify. */
static uint64_t pat_word(uint64_t tag, size_t i) {
  uint64_t x = tag * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD6E8FEB86659FD93ull;
  return x ^ (x >> 29);
}

static void fill(void *p, size_t n, uint64_t tag) {
  uint64_t *w = p;
  size_t nw = n / 8;
  for (size_t i = 0; i < nw; i++) w[i] = pat_word(tag, i);
  unsigned char *b = p;
  for (size_t i = nw * 8; i < n; i++) b[i] = (unsigned char)(tag + i);
}

static int verify(const void *p, size_t n, uint64_t tag) {
  const uint64_t *w = p;
  size_t nw = n / 8;
  for (size_t i = 0; i < nw; i++)
    if (w[i] != pat_word(tag, i)) return 0;
  const unsigned char *b = p;
  for (size_t i = nw * 8; i < n; i++)
    if (b[i] != (unsigned char)(tag + i)) return 0;
  return 1;
}

/* ----------------------------------------------------------------- gate -- */

/* A task that blocks its stream until the test opens the gate.  As a last
 * resort against a hung test (an assertion failed before gate_open), it
 * opens itself after GATE_LIMIT_S seconds and records that, which fails
 * the test that owns it. */
#define GATE_LIMIT_S 120

typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;
  _Atomic int entered;   /* the task has started waiting */
  _Atomic int timed_out; /* it opened itself             */
} gate;

static void gate_init(gate *g) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->open = 0;
  atomic_init(&g->entered, 0);
  atomic_init(&g->timed_out, 0);
}

static void gate_task(void *arg) {
  gate *g = arg;
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += GATE_LIMIT_S;
  pthread_mutex_lock(&g->mu);
  atomic_store(&g->entered, 1);
  while (!g->open) {
    if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT) {
      atomic_store(&g->timed_out, 1);
      break;
    }
  }
  pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Waits (bounded) until the gate task runs: A is then blocked for sure,
 * and every task queued on A before the gate has finished. */
static void gate_wait_entered(gate *g) {
  for (int i = 0; i < 100000 && !atomic_load(&g->entered); i++) usleep(100);
  cr_assert(atomic_load(&g->entered), "the gate task never started");
}

static void gate_done(gate *g) {
  cr_assert_eq(atomic_load(&g->timed_out), 0,
               "a gate opened itself after %d s: the test did not open it",
               GATE_LIMIT_S);
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
}

/* --------------------------------------------------- stream-side checks -- */

/* Blocks that work on a stream writes before the gate and verifies after. */
typedef struct blk {
  void *p;
  size_t n;
  uint64_t tag;
} blk;

typedef struct stream_check {
  blk *b;
  size_t count;
  _Atomic size_t written;
  _Atomic size_t verified;
  _Atomic size_t bad;
} stream_check;

static void sc_init(stream_check *sc, blk *b, size_t count) {
  sc->b = b;
  sc->count = count;
  atomic_init(&sc->written, 0);
  atomic_init(&sc->verified, 0);
  atomic_init(&sc->bad, 0);
}

static void sc_write_task(void *arg) {
  stream_check *sc = arg;
  for (size_t i = 0; i < sc->count; i++) fill(sc->b[i].p, sc->b[i].n, sc->b[i].tag);
  atomic_store(&sc->written, sc->count);
}

static void sc_verify_task(void *arg) {
  stream_check *sc = arg;
  size_t bad = 0;
  for (size_t i = 0; i < sc->count; i++)
    if (!verify(sc->b[i].p, sc->b[i].n, sc->b[i].tag)) bad++;
  atomic_store(&sc->bad, bad);
  atomic_store(&sc->verified, sc->count);
}

static void sc_assert_ok(stream_check *sc, const char *what) {
  cr_assert_eq(atomic_load(&sc->written), sc->count, "%s: write task did not run", what);
  cr_assert_eq(atomic_load(&sc->verified), sc->count, "%s: verify task did not run", what);
  cr_assert_eq(atomic_load(&sc->bad), 0,
               "%s: %zu of %zu blocks were overwritten before their stream reached "
               "the free: a block freed on the stream was handed to someone else",
               what, atomic_load(&sc->bad), sc->count);
}

/* ------------------------------------------------- sets of freed blocks -- */

typedef struct range {
  uintptr_t lo, hi; /* [lo, hi) */
} range;

typedef struct rset {
  range *r;
  size_t n, cap;
} rset;

static void rset_add(rset *s, const void *p, size_t n) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 1024;
    s->r = realloc(s->r, s->cap * sizeof *s->r);
    cr_assert_not_null(s->r);
  }
  s->r[s->n++] = (range){(uintptr_t)p, (uintptr_t)p + n};
}

static int range_cmp(const void *a, const void *b) {
  const range *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void rset_seal(rset *s) {
  qsort(s->r, s->n, sizeof *s->r, range_cmp);
  for (size_t i = 1; i < s->n; i++)
    cr_assert_leq(s->r[i - 1].hi, s->r[i].lo,
                  "two live blocks overlap: [%p, %p) and [%p, %p)",
                  (void *)s->r[i - 1].lo, (void *)s->r[i - 1].hi, (void *)s->r[i].lo,
                  (void *)s->r[i].hi);
}

/* The range of a sealed set that overlaps [p, p + n), or NULL. */
static const range *rset_overlap(const rset *s, const void *p, size_t n) {
  uintptr_t lo = (uintptr_t)p, hi = lo + n;
  size_t a = 0, b = s->n; /* first range with r.lo >= hi */
  while (a < b) {
    size_t m = (a + b) / 2;
    if (s->r[m].lo < hi)
      a = m + 1;
    else
      b = m;
  }
  if (a == 0) return NULL;
  const range *c = &s->r[a - 1]; /* last range starting below hi */
  return c->hi > lo ? c : NULL;
}

static void rset_free(rset *s) {
  free(s->r);
  s->r = NULL;
  s->n = s->cap = 0;
}

/* ---------------------------------------------------------- pool helpers -- */

#define DEFAULT_TC SIZE_MAX

/* A HOST pool.  stream_cache 0: the default; thread_cache DEFAULT_TC: the
 * default, 0: no per-thread caches (every synchronous allocation then goes
 * to the tree, lowest address first, where a block released too early is
 * found at once). */
static magpool_t *pool_new_tc(size_t size, size_t stream_cache, size_t thread_cache) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = size;
  cfg.kind = MAGPOOL_MEM_HOST;
  if (stream_cache != 0) cfg.stream_cache_bytes = stream_cache;
  if (thread_cache != DEFAULT_TC) cfg.thread_cache_bytes = thread_cache;
  magpool_t *pool = NULL;
  int rc = magpool_create(&cfg, &pool);
  cr_assert_eq(rc, 0, "magpool_create: %s", magpool_strerror(rc));
  cr_assert_not_null(pool);
  return pool;
}

static magpool_t *pool_new(size_t size, size_t stream_cache) {
  return pool_new_tc(size, stream_cache, DEFAULT_TC);
}

static magpool_stats_t stats_of(magpool_t *pool) {
  magpool_stats_t st;
  cr_assert_eq(magpool_get_stats(pool, &st), 0);
  return st;
}

static magpool_stream_t stream_new(void) {
  magpool_stream_t s = NULL;
  cr_assert_eq(magpool_host_stream_create(&s), 0);
  cr_assert_not_null(s);
  return s;
}

static void launch(magpool_stream_t s, void (*fn)(void *), void *arg) {
  cr_assert_eq(magpool_host_stream_launch(s, fn, arg), 0);
}

/* Live blocks the test thread holds while a stream is blocked. */
typedef struct held {
  void *p;
  size_t n;
  uint64_t tag;
  magpool_stream_t s; /* freed on s (NULL: magpool_free) */
} held;

typedef struct heldv {
  held *h;
  size_t n, cap;
} heldv;

static void heldv_push(heldv *v, held h) {
  if (v->n == v->cap) {
    v->cap = v->cap ? 2 * v->cap : 1024;
    v->h = realloc(v->h, v->cap * sizeof *v->h);
    cr_assert_not_null(v->h);
  }
  v->h[v->n++] = h;
}

/* Allocates `count` blocks of [lo, hi] bytes on s (s NULL: magpool_alloc),
 * fills each with its own pattern, keeps them in v, and checks that none
 * overlaps a block of `freed` (blocks freed on a stream that has not yet
 * reached the free). */
static void alloc_burst(magpool_t *pool, magpool_stream_t s, size_t count, size_t lo,
                        size_t hi, const rset *freed, heldv *v, rng *r, const char *who) {
  for (size_t i = 0; i < count; i++) {
    size_t n = rng_range(r, lo, hi);
    void *p = s != NULL ? magpool_alloc_async(pool, n, s) : magpool_alloc(pool, n);
    cr_assert_not_null(p, "%s: allocation %zu of %zu bytes failed: %s", who, i, n,
                       magpool_strerror(magpool_last_error()));
    const range *o = freed != NULL ? rset_overlap(freed, p, n) : NULL;
    cr_assert_null(o,
                   "%s: allocation %zu [%p, +%zu) overlaps block [%p, %p) freed on a "
                   "stream that has not reached the free yet",
                   who, i, p, n, o ? (void *)o->lo : NULL, o ? (void *)o->hi : NULL);
    uint64_t tag = rng_next(r);
    fill(p, n, tag);
    heldv_push(v, (held){p, n, tag, s});
  }
}

/* Verifies every held block's pattern (no two live blocks alias), then
 * frees them on the stream they came from. */
static void release_held(magpool_t *pool, heldv *v, const char *who) {
  for (size_t i = 0; i < v->n; i++)
    cr_assert(verify(v->h[i].p, v->h[i].n, v->h[i].tag),
              "%s: live block %zu at %p lost its pattern: two live blocks share memory",
              who, i, v->h[i].p);
  for (size_t i = 0; i < v->n; i++) {
    int rc = v->h[i].s != NULL ? magpool_free_async(pool, v->h[i].p, v->h[i].s)
                               : magpool_free(pool, v->h[i].p);
    cr_assert_eq(rc, 0, "%s: free of live block %zu: %s", who, i, magpool_strerror(rc));
  }
  free(v->h);
  v->h = NULL;
  v->n = v->cap = 0;
}

/* The end of every test: streams released, synchronised and destroyed;
 * trim; then nothing is used, cached or pending, the pool checks, and it is
 * one free block again. */
static void finish(magpool_t *pool, size_t pool_size, magpool_stream_t *s, size_t ns) {
  for (size_t i = 0; i < ns; i++) {
    cr_assert_eq(magpool_stream_release(pool, s[i]), 0);
    cr_assert_eq(magpool_host_stream_sync(s[i]), 0);
  }
  cr_assert_eq(magpool_trim(pool), 0);
  magpool_stats_t st = stats_of(pool);
  cr_assert_eq(st.used_bytes, 0, "used_bytes %zu after everything was freed", st.used_bytes);
  cr_assert_eq(st.live_count, 0);
  cr_assert_eq(st.pending_bytes, 0, "pending_bytes %zu after every stream was synchronised",
               st.pending_bytes);
  cr_assert_eq(st.cached_bytes, 0, "cached_bytes %zu after release, sync and trim",
               st.cached_bytes);
  cr_assert_eq(st.free_bytes, pool_size, "free_bytes %zu of %zu after trim", st.free_bytes,
               pool_size);
  cr_assert_eq(magpool_check(pool), 0, "magpool_check failed");
  void *all = magpool_alloc(pool, pool_size);
  cr_assert_not_null(all, "the whole pool (%zu bytes) is not one block after trim: %s",
                     pool_size, magpool_strerror(magpool_last_error()));
  cr_assert_eq(magpool_free(pool, all), 0);
  for (size_t i = 0; i < ns; i++) cr_assert_eq(magpool_host_stream_destroy(s[i]), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_destroy(pool), 0);
  ST_ASSERT_NO_LEAKS();
}

/* ===================================================================== */
/* 1. One block: reusable on its stream at once, nowhere else until the  */
/*    stream reached the free.                                           */
/* ===================================================================== */

static void one_block_case(size_t thread_cache) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = pool_new_tc(PS, 0, thread_cache);
  magpool_stream_t A = stream_new(), B = stream_new();
  gate g;
  gate_init(&g);
  rng r = rng_seed(1);

  void *X = magpool_alloc_async(pool, 1024, A);
  cr_assert_not_null(X);
  cr_assert_geq(magpool_usable_size(pool, X), 1024);
  blk xb = {X, 1024, 0x5EED0001};
  stream_check sc;
  sc_init(&sc, &xb, 1);
  launch(A, sc_write_task, &sc); /* writes X's pattern              */
  launch(A, gate_task, &g);      /* holds A                          */
  launch(A, sc_verify_task, &sc); /* X must still hold the pattern   */
  cr_assert_eq(magpool_free_async(pool, X, A), 0);
  gate_wait_entered(&g);
  cr_assert_eq(atomic_load(&sc.written), 1);
  cr_assert_eq(magpool_usable_size(pool, X), 0, "X is still live after free_async");

  /* An allocation on A right after the free gets X back (LIFO stream
   * cache).  It is A's block now, for work queued on A from here on: the
   * host does not touch it, and frees it on A again.  (Without thread
   * caches that is stream_cache_needs_no_thread_cache's subject; here the
   * run goes on to the part that matters most: X must not leak out.) */
  void *Y = magpool_alloc_async(pool, 1024, A);
  if (thread_cache == DEFAULT_TC)
    cr_assert_eq(Y, X,
                 "an allocation on A right after free_async(X, A) returned %p, not X=%p", Y,
                 X);
  cr_assert_not_null(Y);
  cr_assert_eq(magpool_free_async(pool, Y, A), 0);

  rset freed = {0};
  rset_add(&freed, X, 1024);
  rset_seal(&freed);

  heldv v = {0};
  for (int round = 0; round < 3; round++) {
    alloc_burst(pool, B, 1000, 1024, 1024, &freed, &v, &r, "stream B, 1 KiB");
    alloc_burst(pool, NULL, 1000, 1024, 1024, &freed, &v, &r, "magpool_alloc, 1 KiB");
    alloc_burst(pool, B, 300, 16, 4096, &freed, &v, &r, "stream B, mixed");
    alloc_burst(pool, NULL, 300, 16, 4096, &freed, &v, &r, "magpool_alloc, mixed");
    if (round == 1) {
      /* Trim retires A's stream cache behind A's queued work; X must
       * stay out of reach until A passes the free. */
      cr_assert_eq(magpool_trim(pool), 0);
      magpool_stats_t st = stats_of(pool);
      cr_assert_geq(st.pending_bytes, 1024,
                    "after trim, X (freed on blocked A) should be pending; pending_bytes "
                    "= %zu",
                    st.pending_bytes);
    }
  }
  cr_assert_eq(atomic_load(&sc.verified), 0, "A ran past its gate");
  magpool_stats_t st = stats_of(pool);
  cr_assert_gt(st.pending_bytes, 0);

  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(A), 0);
  sc_assert_ok(&sc, "X");
  cr_assert_eq(magpool_trim(pool), 0);
  st = stats_of(pool);
  cr_assert_eq(st.pending_bytes, 0, "pending_bytes %zu after A drained", st.pending_bytes);

  release_held(pool, &v, "test 1");
  rset_free(&freed);
  gate_done(&g);
  magpool_stream_t s[] = {A, B};
  finish(pool, PS, s, 2);
}

Test(streams, one_block_stays_on_its_stream, .timeout = 120) { one_block_case(DEFAULT_TC); }

Test(streams, one_block_stays_on_its_stream_no_thread_cache, .timeout = 120) {
  one_block_case(0);
}

/* The stream cache is configured by stream_cache_bytes alone: turning the
 * per-thread caches off (thread_cache_bytes = 0), or switching tracking on,
 * must not turn it off.  magpool.h, magpool_alloc_async: "Blocks freed on s
 * are reused by allocations on s at once". */
static void stream_cache_case(size_t thread_cache, int tracking, const char *what) {
  const size_t PS = 16 * MiB;
  magpool_t *pool = pool_new_tc(PS, 0, thread_cache);
  if (tracking) cr_assert_eq(magpool_tracking_enable(pool, 1), 0);
  magpool_stream_t A = stream_new();
  gate g;
  gate_init(&g);
  launch(A, gate_task, &g);
  gate_wait_entered(&g);
  void *p = magpool_alloc_async(pool, 1024, A);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_free_async(pool, p, A), 0);
  size_t pending = stats_of(pool).pending_bytes;
  void *q = magpool_alloc_async(pool, 1024, A);
  cr_assert_not_null(q);
  int reused = q == p;
  cr_assert_eq(magpool_free_async(pool, q, A), 0);
  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(A), 0);
  gate_done(&g);
  if (tracking) {
    cr_assert_eq(magpool_leak_check(pool, NULL, NULL), 0);
  }
  magpool_stream_t s[] = {A};
  finish(pool, PS, s, 1);
  cr_expect_eq(pending, 0,
               "%s: one 1 KiB block freed on A (stream_cache_bytes 8 MiB) went straight to "
               "a retire batch (pending_bytes %zu) instead of A's stream cache",
               what, pending);
  cr_assert(reused,
            "%s: an allocation on A right after free_async(p, A) did not get p back: the "
            "per-stream cache is off",
            what);
}

Test(streams, stream_cache_needs_no_thread_cache, .timeout = 60) {
  stream_cache_case(0, 0, "thread_cache_bytes = 0");
}

Test(streams, stream_cache_works_with_tracking, .timeout = 60) {
  stream_cache_case(DEFAULT_TC, 1, "tracking on");
}

/* ===================================================================== */
/* 2. Thousands of blocks freed on a blocked stream, retired many times.  */
/* ===================================================================== */

Test(streams, many_blocks_wait_for_their_stream, .timeout = 300) {
  const size_t PS = 128 * MiB, SC = 64 * KiB;
  enum { N = 20000 };
  magpool_t *pool = pool_new(PS, SC);
  magpool_stream_t A = stream_new(), B = stream_new();
  gate g;
  gate_init(&g);
  rng r = rng_seed(2);

  /* The blocks come from every source a free_async may get: allocations
   * on A, on B (idle, so the host may hand them on), and magpool_alloc. */
  blk *b = calloc(N, sizeof *b);
  cr_assert_not_null(b);
  for (size_t i = 0; i < N; i++) {
    void *p = i % 3 == 0   ? magpool_alloc_async(pool, 1024, A)
              : i % 3 == 1 ? magpool_alloc(pool, 1024)
                           : magpool_alloc_async(pool, 1024, B);
    cr_assert_not_null(p, "setup allocation %zu", i);
    b[i] = (blk){p, 1024, 0xB10C0000ull + i};
  }
  stream_check sc;
  sc_init(&sc, b, N);
  launch(A, sc_write_task, &sc);
  launch(A, gate_task, &g);
  launch(A, sc_verify_task, &sc);
  gate_wait_entered(&g);

  /* Free them all on A, in random order, while A is blocked. */
  size_t *ord = malloc(N * sizeof *ord);
  cr_assert_not_null(ord);
  for (size_t i = 0; i < N; i++) ord[i] = i;
  for (size_t i = N - 1; i > 0; i--) {
    size_t j = (size_t)(rng_next(&r) % (i + 1));
    size_t t = ord[i];
    ord[i] = ord[j];
    ord[j] = t;
  }
  rset freed = {0};
  for (size_t k = 0; k < N; k++) {
    blk *x = &b[ord[k]];
    cr_assert_eq(magpool_free_async(pool, x->p, A), 0, "free_async %zu", k);
    rset_add(&freed, x->p, x->n);
  }
  rset_seal(&freed);
  magpool_stats_t st = stats_of(pool);
  cr_assert_eq(st.used_bytes, 0, "used_bytes %zu with no live allocation", st.used_bytes);
  /* 20 MiB freed with a 64 KiB stream cache: nearly all of it was retired
   * behind the gate.  The cache keeps at most about stream_cache_bytes. */
  cr_assert_leq(st.pending_bytes, (size_t)N * 1024);
  cr_assert_geq(st.pending_bytes, (size_t)N * 1024 - 2 * SC,
                "pending_bytes %zu: most of the %zu bytes freed on blocked A should be "
                "retired behind it (stream_cache_bytes %zu)",
                st.pending_bytes, (size_t)N * 1024, SC);

  /* Allocation on A right after: the block freed last (LIFO). */
  void *last = b[ord[N - 1]].p;
  void *Y = magpool_alloc_async(pool, 1024, A);
  cr_assert_eq(Y, last, "alloc on A after the frees returned %p, not the block freed last %p",
               Y, last);
  cr_assert_eq(magpool_free_async(pool, Y, A), 0);

  heldv v = {0};
  for (int round = 0; round < 4; round++) {
    alloc_burst(pool, B, 1000, 1024, 1024, &freed, &v, &r, "stream B, 1 KiB");
    alloc_burst(pool, NULL, 1000, 1024, 1024, &freed, &v, &r, "magpool_alloc, 1 KiB");
    alloc_burst(pool, B, 250, 16, 8192, &freed, &v, &r, "stream B, mixed");
    alloc_burst(pool, NULL, 250, 16, 8192, &freed, &v, &r, "magpool_alloc, mixed");
    st = stats_of(pool);
    cr_assert_gt(st.pending_bytes, 0, "round %d: nothing pending while A is blocked", round);
    if (round == 1) {
      cr_assert_eq(magpool_trim(pool), 0);
      st = stats_of(pool);
      /* Nothing of A has completed: after trim retired A's cache, exactly
       * the N blocks freed on A are pending. */
      cr_assert_eq(st.pending_bytes, (size_t)N * 1024,
                   "pending_bytes %zu after trim, expected %zu (every block freed on "
                   "blocked A)",
                   st.pending_bytes, (size_t)N * 1024);
    }
  }
  cr_assert_eq(atomic_load(&sc.verified), 0, "A ran past its gate");

  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(A), 0);
  sc_assert_ok(&sc, "20000 blocks freed on A");
  cr_assert_eq(magpool_trim(pool), 0);
  st = stats_of(pool);
  cr_assert_eq(st.pending_bytes, 0, "pending_bytes %zu after A drained and trim",
               st.pending_bytes);

  release_held(pool, &v, "test 2");
  rset_free(&freed);
  free(ord);
  free(b);
  gate_done(&g);
  magpool_stream_t s[] = {A, B};
  finish(pool, PS, s, 2);
}

/* ===================================================================== */
/* 3. A block larger than cache_max_block (no stream cache): retired     */
/*    alone at once, still behind the stream.                            */
/* ===================================================================== */

Test(streams, large_block_waits_for_its_stream, .timeout = 120) {
  /* Room for everything below with X still pending: running out of memory
   * while A is blocked would make the out-of-memory ladder wait for A. */
  const size_t PS = 128 * MiB, BIG = 2 * MiB;
  magpool_t *pool = pool_new(PS, 0);
  magpool_stream_t A = stream_new(), B = stream_new();
  gate g;
  gate_init(&g);
  rng r = rng_seed(3);

  void *X = magpool_alloc_async(pool, BIG, A);
  cr_assert_not_null(X);
  blk xb = {X, BIG, 0xB16B10C};
  stream_check sc;
  sc_init(&sc, &xb, 1);
  launch(A, sc_write_task, &sc);
  launch(A, gate_task, &g);
  launch(A, sc_verify_task, &sc);
  gate_wait_entered(&g);
  cr_assert_eq(magpool_free_async(pool, X, A), 0);
  magpool_stats_t st = stats_of(pool);
  cr_assert_geq(st.pending_bytes, BIG, "a %zu-byte block freed on blocked A: pending %zu",
                BIG, st.pending_bytes);

  rset freed = {0};
  rset_add(&freed, X, BIG);
  rset_seal(&freed);
  heldv v = {0};
  alloc_burst(pool, B, 8, BIG, BIG, &freed, &v, &r, "stream B, 2 MiB");
  alloc_burst(pool, NULL, 8, BIG, BIG, &freed, &v, &r, "magpool_alloc, 2 MiB");
  alloc_burst(pool, B, 2000, 16, 16384, &freed, &v, &r, "stream B, mixed");
  alloc_burst(pool, NULL, 2000, 16, 16384, &freed, &v, &r, "magpool_alloc, mixed");
  cr_assert_eq(magpool_trim(pool), 0);
  alloc_burst(pool, B, 4, BIG, BIG, &freed, &v, &r, "stream B, 2 MiB after trim");
  alloc_burst(pool, NULL, 4, BIG, BIG, &freed, &v, &r, "magpool_alloc, 2 MiB after trim");
  cr_assert_eq(atomic_load(&sc.verified), 0, "A ran past its gate");

  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(A), 0);
  sc_assert_ok(&sc, "2 MiB block");
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(stats_of(pool).pending_bytes, 0);
  release_held(pool, &v, "test 3");
  rset_free(&freed);
  gate_done(&g);
  magpool_stream_t s[] = {A, B};
  finish(pool, PS, s, 2);
}

/* ===================================================================== */
/* 4. Many streams blocked at once, each with its own freed blocks.      */
/* ===================================================================== */

Test(streams, many_blocked_streams, .timeout = 300) {
  const size_t PS = 64 * MiB, SC = 16 * KiB;
  enum { NS = 24, PER = 400 };
  magpool_t *pool = pool_new(PS, SC);
  magpool_stream_t s[NS + 1];
  gate g[NS];
  stream_check sc[NS];
  blk *b = calloc((size_t)NS * PER, sizeof *b);
  cr_assert_not_null(b);
  rng r = rng_seed(4);
  rset freed = {0};
  for (int k = 0; k < NS; k++) {
    s[k] = stream_new();
    gate_init(&g[k]);
    for (int i = 0; i < PER; i++) {
      size_t n = rng_range(&r, 64, 4096);
      void *p = magpool_alloc_async(pool, n, s[k]);
      cr_assert_not_null(p);
      b[k * PER + i] = (blk){p, n, ((uint64_t)k << 32) | (uint64_t)i};
    }
    sc_init(&sc[k], &b[k * PER], PER);
    launch(s[k], sc_write_task, &sc[k]);
    launch(s[k], gate_task, &g[k]);
    launch(s[k], sc_verify_task, &sc[k]);
    for (int i = 0; i < PER; i++) {
      cr_assert_eq(magpool_free_async(pool, b[k * PER + i].p, s[k]), 0);
      rset_add(&freed, b[k * PER + i].p, b[k * PER + i].n);
    }
  }
  rset_seal(&freed);
  s[NS] = stream_new(); /* a stream that frees nothing */
  heldv v = {0};
  alloc_burst(pool, s[NS], 3000, 16, 4096, &freed, &v, &r, "fresh stream");
  alloc_burst(pool, NULL, 3000, 16, 4096, &freed, &v, &r, "magpool_alloc");
  cr_assert_eq(magpool_trim(pool), 0);
  alloc_burst(pool, s[NS], 1000, 16, 4096, &freed, &v, &r, "fresh stream after trim");
  alloc_burst(pool, NULL, 1000, 16, 4096, &freed, &v, &r, "magpool_alloc after trim");
  cr_assert_gt(stats_of(pool).pending_bytes, 0);
  /* Release every blocked stream (retiring its cache behind the gate);
   * the blocks still may not come back. */
  for (int k = 0; k < NS; k++) cr_assert_eq(magpool_stream_release(pool, s[k]), 0);
  alloc_burst(pool, s[NS], 1000, 16, 4096, &freed, &v, &r, "fresh stream after releases");
  alloc_burst(pool, NULL, 1000, 16, 4096, &freed, &v, &r, "magpool_alloc after releases");
  for (int k = NS - 1; k >= 0; k--) {
    cr_assert_eq(atomic_load(&sc[k].verified), 0, "stream %d ran past its gate", k);
    gate_open(&g[k]);
  }
  for (int k = 0; k < NS; k++) {
    cr_assert_eq(magpool_host_stream_sync(s[k]), 0);
    sc_assert_ok(&sc[k], "blocked stream");
    gate_done(&g[k]);
  }
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(stats_of(pool).pending_bytes, 0);
  release_held(pool, &v, "test 4");
  rset_free(&freed);
  free(b);
  finish(pool, PS, s, NS + 1);
}

/* ===================================================================== */
/* 5. Errors and edge inputs.                                            */
/* ===================================================================== */

static void assert_same_accounting(magpool_stats_t a, magpool_stats_t b, const char *what) {
  cr_assert_eq(a.used_bytes, b.used_bytes, "%s changed used_bytes", what);
  cr_assert_eq(a.live_count, b.live_count, "%s changed live_count", what);
  cr_assert_eq(a.free_count, b.free_count, "%s changed free_count", what);
  cr_assert_eq(a.pending_bytes, b.pending_bytes, "%s changed pending_bytes", what);
}

Test(streams, free_async_errors, .timeout = 120) {
  const size_t PS = 16 * MiB;
  magpool_t *pool = pool_new(PS, 0);
  magpool_t *other = pool_new(1 * MiB, 0);
  magpool_stream_t A = stream_new(), C = stream_new();
  gate g;
  gate_init(&g);
  launch(A, gate_task, &g); /* A blocked: freed blocks stay pending */
  gate_wait_entered(&g);

  void *p = magpool_alloc_async(pool, 256, A);
  cr_assert_not_null(p);
  magpool_stats_t s0 = stats_of(pool);

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
  assert_same_accounting(s0, stats_of(pool), "a rejected free_async");
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
  assert_same_accounting(s0, stats_of(pool), "NULL arguments");

  /* Double free while the first free sits in A's stream cache. */
  cr_assert_eq(magpool_free_async(pool, p, A), 0);
  magpool_stats_t s1 = stats_of(pool);
  cr_assert_eq(s1.used_bytes + 256, s0.used_bytes);
  cr_assert_eq(magpool_free_async(pool, p, A), MAGPOOL_EINVAL, "double free_async (cached)");
  cr_assert_eq(magpool_free_async(pool, p, C), MAGPOOL_EINVAL, "double free on another stream");
  cr_assert_eq(magpool_free(pool, p), MAGPOOL_EINVAL, "sync free after free_async");
  cr_assert_eq(magpool_free_async(pool, p, NULL), MAGPOOL_EINVAL, "NULL-stream double free");
  assert_same_accounting(s1, stats_of(pool), "a double free");

  /* Double free after a synchronous free. */
  void *x = magpool_alloc(pool, 512);
  cr_assert_not_null(x);
  cr_assert_eq(magpool_free(pool, x), 0);
  cr_assert_eq(magpool_free_async(pool, x, A), MAGPOOL_EINVAL, "free_async after magpool_free");

  /* Double free of a block that went to a pending batch (bypasses the
   * stream cache: larger than cache_max_block). */
  void *big = magpool_alloc_async(pool, 2 * MiB, A);
  cr_assert_not_null(big);
  cr_assert_eq(magpool_free_async(pool, big, A), 0);
  magpool_stats_t s2 = stats_of(pool);
  cr_assert_geq(s2.pending_bytes, 2 * MiB);
  cr_assert_eq(magpool_free_async(pool, big, A), MAGPOOL_EINVAL, "double free (pending)");
  cr_assert_eq(magpool_free(pool, big), MAGPOOL_EINVAL);
  assert_same_accounting(s2, stats_of(pool), "a double free of a pending block");

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
  magpool_t *pool = pool_new(PS, 0);
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
  cr_assert_eq(stats_of(pool).pending_bytes, 0, "a NULL-stream free is pending");
  cr_assert_eq(magpool_free_async(pool, p, NULL), MAGPOOL_EINVAL);

  /* The whole pool through the NULL stream, freed, then at once the whole
   * pool again through magpool_alloc: the free did not wait for anything. */
  void *all = magpool_alloc_async(pool, PS, NULL);
  cr_assert_not_null(all, "%s", magpool_strerror(magpool_last_error()));
  cr_assert_eq(magpool_free_async(pool, all, NULL), 0);
  cr_assert_eq(stats_of(pool).pending_bytes, 0);
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
/* 6. Release, destroy, and a new stream (maybe at the old address).      */
/* ===================================================================== */

Test(streams, release_destroy_new_stream, .timeout = 300) {
  const size_t PS = 64 * MiB, SC = 64 * KiB;
  enum { N = 4000 };
  magpool_t *pool = pool_new(PS, SC);
  rng r = rng_seed(7);
  magpool_stream_t A = stream_new();
  gate ga;
  gate_init(&ga);

  blk *b = calloc(N, sizeof *b);
  cr_assert_not_null(b);
  for (size_t i = 0; i < N; i++) {
    b[i].p = magpool_alloc_async(pool, 1024, A);
    cr_assert_not_null(b[i].p);
    b[i].n = 1024;
    b[i].tag = 0xA000000ull + i;
  }
  stream_check sca;
  sc_init(&sca, b, N);
  launch(A, sc_write_task, &sca);
  launch(A, gate_task, &ga);
  launch(A, sc_verify_task, &sca);
  gate_wait_entered(&ga);

  /* First half freed on A; then a new stream C, while A lives and is
   * blocked, must not get them. */
  rset freed = {0};
  for (size_t i = 0; i < N / 2; i++) {
    cr_assert_eq(magpool_free_async(pool, b[i].p, A), 0);
    rset_add(&freed, b[i].p, 1024);
  }
  rset_seal(&freed);
  magpool_stream_t C = stream_new();
  heldv v = {0};
  alloc_burst(pool, C, 1500, 1024, 1024, &freed, &v, &r, "stream C");
  /* C's own frees are reusable on C at once (and still none of A's). */
  for (size_t i = 0; i < 500; i++) {
    held h = v.h[--v.n];
    cr_assert_eq(magpool_free_async(pool, h.p, C), 0);
  }
  alloc_burst(pool, C, 1000, 16, 4096, &freed, &v, &r, "stream C, reuse");
  /* C's frees retired (on overflow, and by trim) behind C: let C run
   * those callbacks, so that from here on only A's frees are pending. */
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(magpool_host_stream_sync(C), 0);
  alloc_burst(pool, C, 1000, 16, 4096, &freed, &v, &r, "stream C, after trim");

  /* Second half freed on A.  From here to D's first use no other stream
   * is used, so this thread's stream memo still names A's handle when D
   * (perhaps at A's address) comes. */
  for (size_t i = N / 2; i < N; i++) {
    cr_assert_eq(magpool_free_async(pool, b[i].p, A), 0);
    rset_add(&freed, b[i].p, 1024);
  }
  rset_seal(&freed);
  cr_assert_eq(magpool_stream_release(pool, A), 0);
  magpool_stats_t st = stats_of(pool);
  /* Release retired A's whole cache behind the gate; C's cached frees
   * are not pending, and nothing of A completed. */
  cr_assert_eq(st.pending_bytes, (size_t)N * 1024,
               "pending_bytes %zu after releasing blocked A, expected %zu", st.pending_bytes,
               (size_t)N * 1024);
  alloc_burst(pool, NULL, 2000, 16, 4096, &freed, &v, &r, "magpool_alloc after release");
  cr_assert_eq(magpool_trim(pool), 0);
  alloc_burst(pool, NULL, 1000, 1024, 1024, &freed, &v, &r, "magpool_alloc after trim");
  cr_assert_eq(atomic_load(&sca.verified), 0, "A ran past its gate");

  /* Open A, destroy it (runs its queue: the verify task and the retire
   * callbacks), and create D - malloc may give it A's address.  To make
   * that likely with glibc (calloc skips the per-thread tcache, which
   * holds 7 chunks of a size), destroy 7 filler streams first so that A's
   * freed object lands in a bin that calloc does search. */
  void *old_a = (void *)A;
  magpool_stream_t filler[7];
  for (int i = 0; i < 7; i++) filler[i] = stream_new();
  for (int i = 0; i < 7; i++) cr_assert_eq(magpool_host_stream_destroy(filler[i]), 0);
  gate_open(&ga);
  cr_assert_eq(magpool_host_stream_destroy(A), 0);
  sc_assert_ok(&sca, "blocks freed on A before its release");
  gate_done(&ga);
  magpool_stream_t D = stream_new();
  cr_log_info("new stream %s the destroyed stream's address",
              (void *)D == old_a ? "reuses" : "does not reuse");

  /* D is a stream of its own: its frees wait for D, and allocations on D
   * get D's frees back at once. */
  gate gd;
  gate_init(&gd);
  enum { M = 1000 };
  blk *d = calloc(M, sizeof *d);
  cr_assert_not_null(d);
  for (size_t i = 0; i < M; i++) {
    d[i].p = magpool_alloc_async(pool, 2048, D);
    cr_assert_not_null(d[i].p);
    d[i].n = 2048;
    d[i].tag = 0xD000000ull + i;
  }
  stream_check scd;
  sc_init(&scd, d, M);
  launch(D, sc_write_task, &scd);
  launch(D, gate_task, &gd);
  launch(D, sc_verify_task, &scd);
  gate_wait_entered(&gd);
  rset dfreed = {0};
  for (size_t i = 0; i < M; i++) {
    cr_assert_eq(magpool_free_async(pool, d[i].p, D), 0);
    rset_add(&dfreed, d[i].p, 2048);
  }
  rset_seal(&dfreed);
  void *y = magpool_alloc_async(pool, 2048, D);
  cr_assert_eq(y, d[M - 1].p,
               "alloc on new stream D right after its frees returned %p, not the block "
               "freed last %p",
               y, d[M - 1].p);
  cr_assert_eq(magpool_free_async(pool, y, D), 0);
  alloc_burst(pool, C, 2000, 16, 4096, &dfreed, &v, &r, "stream C while D blocked");
  alloc_burst(pool, NULL, 2000, 16, 4096, &dfreed, &v, &r, "magpool_alloc while D blocked");
  cr_assert_eq(magpool_stream_release(pool, D), 0);
  alloc_burst(pool, NULL, 500, 2048, 2048, &dfreed, &v, &r, "magpool_alloc, D released");
  cr_assert_eq(atomic_load(&scd.verified), 0, "D ran past its gate");
  gate_open(&gd);
  cr_assert_eq(magpool_host_stream_sync(D), 0);
  sc_assert_ok(&scd, "blocks freed on D");
  gate_done(&gd);

  release_held(pool, &v, "test 6");
  rset_free(&freed);
  rset_free(&dfreed);
  free(b);
  free(d);
  magpool_stream_t s[] = {C, D};
  finish(pool, PS, s, 2);
}

/* Streams created and released in a loop while earlier ones are still
 * blocked: a released stream's table entry must not be reused (nor its
 * blocks handed out) before its pending batches completed. */
Test(streams, stream_churn_with_blocked_streams, .timeout = 300) {
  const size_t PS = 64 * MiB, SC = 8 * KiB;
  enum { ROUNDS = 64, PER = 64 };
  magpool_t *pool = pool_new(PS, SC);
  rng r = rng_seed(8);
  magpool_stream_t live[ROUNDS];
  gate *g = calloc(ROUNDS, sizeof *g);
  stream_check *sc = calloc(ROUNDS, sizeof *sc);
  blk *b = calloc((size_t)ROUNDS * PER, sizeof *b);
  cr_assert(g && sc && b);
  rset freed = {0};
  heldv v = {0};
  magpool_stream_t other = stream_new();
  for (int k = 0; k < ROUNDS; k++) {
    magpool_stream_t s = live[k] = stream_new();
    gate_init(&g[k]);
    for (int i = 0; i < PER; i++) {
      size_t n = rng_range(&r, 256, 2048);
      void *p = magpool_alloc_async(pool, n, s);
      cr_assert_not_null(p);
      /* None of the earlier, still blocked, streams' frees. */
      if (freed.n != 0) {
        const range *o = rset_overlap(&freed, p, n);
        cr_assert_null(o, "round %d: new stream got [%p, +%zu), overlapping a block freed "
                          "on a blocked, released stream",
                       k, p, n);
      }
      b[k * PER + i] = (blk){p, n, ((uint64_t)k << 20) | (uint64_t)i};
    }
    sc_init(&sc[k], &b[k * PER], PER);
    launch(s, sc_write_task, &sc[k]);
    launch(s, gate_task, &g[k]);
    launch(s, sc_verify_task, &sc[k]);
    for (int i = 0; i < PER; i++) {
      cr_assert_eq(magpool_free_async(pool, b[k * PER + i].p, s), 0);
      rset_add(&freed, b[k * PER + i].p, b[k * PER + i].n);
    }
    rset_seal(&freed);
    cr_assert_eq(magpool_stream_release(pool, s), 0);
    alloc_burst(pool, other, 50, 16, 4096, &freed, &v, &r, "other stream");
    alloc_burst(pool, NULL, 50, 16, 4096, &freed, &v, &r, "magpool_alloc");
  }
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_gt(stats_of(pool).pending_bytes, 0);
  for (int k = 0; k < ROUNDS; k++) {
    cr_assert_eq(atomic_load(&sc[k].verified), 0);
    gate_open(&g[k]);
    cr_assert_eq(magpool_host_stream_destroy(live[k]), 0);
    sc_assert_ok(&sc[k], "churned stream");
    gate_done(&g[k]);
  }
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(stats_of(pool).pending_bytes, 0);
  release_held(pool, &v, "churn");
  rset_free(&freed);
  free(g);
  free(sc);
  free(b);
  magpool_stream_t s[] = {other};
  finish(pool, PS, s, 1);
}

/* ===================================================================== */
/* 7. Four threads, each on its own host stream.                         */
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
  rng r = rng_seed(100 + (uint64_t)a->id);
  mt_job *ring[MT_WINDOW];
  size_t head = 0, count = 0;
  for (size_t i = 0; i < MT_ITERS + MT_WINDOW; i++) {
    if (i < MT_ITERS) {
      size_t n = rng_range(&r, 16, 8192);
      int sync_alloc = rng_next(&r) % 16 == 0;
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
      if (rng_next(&r) % 16 == 0) {
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
  magpool_t *pool = pool_new_tc(PS, stream_cache, thread_cache);
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
  magpool_stats_t st = stats_of(pool);
  cr_assert_eq(st.alloc_count, st.free_count);
  cr_assert_geq(st.alloc_count, allocs);
  finish(pool, PS, NULL, 0);
}

Test(streams, four_threads_own_streams, .timeout = 600) {
  four_threads_case(32 * KiB, DEFAULT_TC);
}

/* Tiny stream caches and no thread caches: blocks go back and forth
 * through retire batches and the tree all the time. */
Test(streams, four_threads_own_streams_tight, .timeout = 600) {
  four_threads_case(4 * KiB, 0);
}
