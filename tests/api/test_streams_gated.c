/* test_streams_gated.c - a block freed on a stream waits for that stream.
 *
 * What is tested (include/magpool.h, "Stream-ordered allocation"):
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
 * Every test ends with finish() (stream_util.h): all freed, streams
 * released and synchronised, trim; then used, cached and pending bytes are
 * 0, magpool_check passes, and the whole pool is one block again.
 */
#define _GNU_SOURCE /* stream_util.h */

#include <magpool.h>

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stream_util.h"

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

/* ---------------------------------------------------------- held blocks -- */

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
                        size_t hi, const rset *freed, heldv *v, mpt_rng *r, const char *who) {
  for (size_t i = 0; i < count; i++) {
    size_t n = (size_t)mpt_range(r, lo, hi);
    void *p = s != NULL ? magpool_alloc_async(pool, n, s) : magpool_alloc(pool, n);
    cr_assert_not_null(p, "%s: allocation %zu of %zu bytes failed: %s", who, i, n,
                       magpool_strerror(magpool_last_error()));
    const range *o = freed != NULL ? rset_overlap(freed, p, n) : NULL;
    cr_assert_null(o,
                   "%s: allocation %zu [%p, +%zu) overlaps block [%p, %p) freed on a "
                   "stream that has not reached the free yet",
                   who, i, p, n, o ? (void *)o->lo : NULL, o ? (void *)o->hi : NULL);
    uint64_t tag = mpt_next(r);
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

/* ===================================================================== */
/* 1. One block: reusable on its stream at once, nowhere else until the  */
/*    stream reached the free.                                           */
/* ===================================================================== */

/* thread_cache: MPT_DEFAULT, or MPT_ZERO for no per-thread caches (every
 * synchronous allocation then goes to the tree, lowest address first,
 * where a block released too early is found at once). */
static void one_block_case(size_t thread_cache) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .thread_cache = thread_cache});
  magpool_stream_t A = stream_new(), B = stream_new();
  gate g;
  gate_init(&g);
  mpt_rng r = mpt_rng_seed(1);

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
  if (thread_cache == MPT_DEFAULT)
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
      magpool_stats_t st = mpt_stats(pool);
      cr_assert_geq(st.pending_bytes, 1024,
                    "after trim, X (freed on blocked A) should be pending; pending_bytes "
                    "= %zu",
                    st.pending_bytes);
    }
  }
  cr_assert_eq(atomic_load(&sc.verified), 0, "A ran past its gate");
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_gt(st.pending_bytes, 0);

  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(A), 0);
  sc_assert_ok(&sc, "X");
  cr_assert_eq(magpool_trim(pool), 0);
  st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 0, "pending_bytes %zu after A drained", st.pending_bytes);

  release_held(pool, &v, "test 1");
  rset_free(&freed);
  gate_done(&g);
  magpool_stream_t s[] = {A, B};
  finish(pool, PS, s, 2);
}

Test(streams, one_block_stays_on_its_stream, .timeout = 120) { one_block_case(MPT_DEFAULT); }

Test(streams, one_block_stays_on_its_stream_no_thread_cache, .timeout = 120) {
  one_block_case(MPT_ZERO);
}

/* The stream cache is configured by stream_cache_bytes alone: turning the
 * per-thread caches off (thread_cache_bytes = 0), or switching tracking on,
 * must not turn it off.  magpool.h, magpool_alloc_async: "Blocks freed on s
 * are reused by allocations on s at once". */
static void stream_cache_case(size_t thread_cache, int tracking, const char *what) {
  const size_t PS = 16 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .thread_cache = thread_cache});
  if (tracking) cr_assert_eq(magpool_tracking_enable(pool, 1), 0);
  magpool_stream_t A = stream_new();
  gate g;
  gate_init(&g);
  launch(A, gate_task, &g);
  gate_wait_entered(&g);
  void *p = magpool_alloc_async(pool, 1024, A);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_free_async(pool, p, A), 0);
  size_t pending = mpt_stats(pool).pending_bytes;
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
  stream_cache_case(MPT_ZERO, 0, "thread_cache_bytes = 0");
}

Test(streams, stream_cache_works_with_tracking, .timeout = 60) {
  stream_cache_case(MPT_DEFAULT, 1, "tracking on");
}

/* ===================================================================== */
/* 2. Thousands of blocks freed on a blocked stream, retired many times.  */
/* ===================================================================== */

Test(streams, many_blocks_wait_for_their_stream, .timeout = 300) {
  const size_t PS = 128 * MiB, SC = 64 * KiB;
  enum { N = 20000 };
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .stream_cache = SC});
  magpool_stream_t A = stream_new(), B = stream_new();
  gate g;
  gate_init(&g);
  mpt_rng r = mpt_rng_seed(2);

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
  mpt_shuffle(&r, ord, N, sizeof *ord);
  rset freed = {0};
  for (size_t k = 0; k < N; k++) {
    blk *x = &b[ord[k]];
    cr_assert_eq(magpool_free_async(pool, x->p, A), 0, "free_async %zu", k);
    rset_add(&freed, x->p, x->n);
  }
  rset_seal(&freed);
  magpool_stats_t st = mpt_stats(pool);
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
    st = mpt_stats(pool);
    cr_assert_gt(st.pending_bytes, 0, "round %d: nothing pending while A is blocked", round);
    if (round == 1) {
      cr_assert_eq(magpool_trim(pool), 0);
      st = mpt_stats(pool);
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
  st = mpt_stats(pool);
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
/* 3. A block larger than cache_max_block (no thread's stream cache):   */
/*    parked on its stream; others get it only behind the stream.        */
/* ===================================================================== */

Test(streams, large_block_waits_for_its_stream, .timeout = 120) {
  /* Room for everything below with X still pending: running out of memory
   * while A is blocked would make the out-of-memory ladder wait for A. */
  const size_t PS = 128 * MiB, BIG = 2 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_stream_t A = stream_new(), B = stream_new();
  gate g;
  gate_init(&g);
  mpt_rng r = mpt_rng_seed(3);

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
  magpool_stats_t st = mpt_stats(pool);
  /* Parked on A (cached, reusable on A at once) or pending: not free. */
  cr_assert_geq(st.pending_bytes + st.cached_bytes, BIG,
                "a %zu-byte block freed on blocked A: pending %zu, cached %zu", BIG,
                st.pending_bytes, st.cached_bytes);

  rset freed = {0};
  rset_add(&freed, X, BIG);
  rset_seal(&freed);
  heldv v = {0};
  alloc_burst(pool, B, 8, BIG, BIG, &freed, &v, &r, "stream B, 2 MiB");
  alloc_burst(pool, NULL, 8, BIG, BIG, &freed, &v, &r, "magpool_alloc, 2 MiB");
  alloc_burst(pool, B, 2000, 16, 16384, &freed, &v, &r, "stream B, mixed");
  alloc_burst(pool, NULL, 2000, 16, 16384, &freed, &v, &r, "magpool_alloc, mixed");
  cr_assert_eq(magpool_trim(pool), 0);
  /* The trim retired A's park behind A, which is still blocked. */
  st = mpt_stats(pool);
  cr_assert_geq(st.pending_bytes, BIG, "after trim: pending %zu, the parked %zu-byte block "
                "should wait behind blocked A", st.pending_bytes, BIG);
  alloc_burst(pool, B, 4, BIG, BIG, &freed, &v, &r, "stream B, 2 MiB after trim");
  alloc_burst(pool, NULL, 4, BIG, BIG, &freed, &v, &r, "magpool_alloc, 2 MiB after trim");
  cr_assert_eq(atomic_load(&sc.verified), 0, "A ran past its gate");

  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(A), 0);
  sc_assert_ok(&sc, "2 MiB block");
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(mpt_stats(pool).pending_bytes, 0);
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
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .stream_cache = SC});
  magpool_stream_t s[NS + 1];
  gate g[NS];
  stream_check sc[NS];
  blk *b = calloc((size_t)NS * PER, sizeof *b);
  cr_assert_not_null(b);
  mpt_rng r = mpt_rng_seed(4);
  rset freed = {0};
  for (int k = 0; k < NS; k++) {
    s[k] = stream_new();
    gate_init(&g[k]);
    for (int i = 0; i < PER; i++) {
      size_t n = (size_t)mpt_range(&r, 64, 4096);
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
  cr_assert_gt(mpt_stats(pool).pending_bytes, 0);
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
  cr_assert_eq(mpt_stats(pool).pending_bytes, 0);
  release_held(pool, &v, "test 4");
  rset_free(&freed);
  free(b);
  finish(pool, PS, s, NS + 1);
}

/* ===================================================================== */
/* 5. Release, destroy, and a new stream (maybe at the old address).     */
/* ===================================================================== */

Test(streams, release_destroy_new_stream, .timeout = 300) {
  const size_t PS = 64 * MiB, SC = 64 * KiB;
  enum { N = 4000 };
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .stream_cache = SC});
  mpt_rng r = mpt_rng_seed(7);
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
  magpool_stats_t st = mpt_stats(pool);
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

  release_held(pool, &v, "test 5");
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
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .stream_cache = SC});
  mpt_rng r = mpt_rng_seed(8);
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
      size_t n = (size_t)mpt_range(&r, 256, 2048);
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
  cr_assert_gt(mpt_stats(pool).pending_bytes, 0);
  for (int k = 0; k < ROUNDS; k++) {
    cr_assert_eq(atomic_load(&sc[k].verified), 0);
    gate_open(&g[k]);
    cr_assert_eq(magpool_host_stream_destroy(live[k]), 0);
    sc_assert_ok(&sc[k], "churned stream");
    gate_done(&g[k]);
  }
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(mpt_stats(pool).pending_bytes, 0);
  release_held(pool, &v, "churn");
  rset_free(&freed);
  free(g);
  free(sc);
  free(b);
  magpool_stream_t s[] = {other};
  finish(pool, PS, s, 1);
}
