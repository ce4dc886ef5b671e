/* test_park.c - the stream entry's park (src/park.c): blocks freed on a
 * stream that every thread's allocations on it reuse at once, retired
 * behind the stream in batches.
 *
 * The places where two threads meet on a park are opened on purpose with
 * the test hooks (src/base.h, MP_HOOK_PARK_*): one thread is stopped
 * holding the park's lock, the other is let run into it, and the outcome
 * is checked.  The streams are host streams held by a gate, so a block
 * retired behind one cannot come back while the test looks.
 *
 *   park::put_meets_take          a free parks a 4 MiB block on S and stops
 *        holding the lock; another thread's allocation on S waits for the
 *        lock, then gets that block: no retire, no callback
 *   park::take_holds_off_flush    an allocation holds the lock; the
 *        ladder's cache flush waits, and finds nothing left to retire
 *   park::flush_holds_off_take    the flush holds the lock; the waiting
 *        allocation finds nothing and gets another block: the parked one
 *        is pending behind blocked S
 *   park::release_retires_the_park   magpool_stream_release retires what
 *        another thread parked, behind S, and closes the park
 *   park::a_busy_stream_is_asked_less_and_less   after a "not passed",
 *        run frees ask the stream again after 1, 2, 4 ... frees; a "passed"
 *        starts over
 *   park::a_run_free_asks_no_capture_question   frees of a run on a
 *        stream known not to be captured make no capture question
 *   park::a_slot_miss_takes_a_whole_parked_magazine   a thread that
 *        allocates on S what another freed on S takes the park's blocks a
 *        magazine at a time into its slot, not one a call
 *   park::a_refill_meets_a_release   a release closes the slot between the
 *        refill's take off the park and its load: the magazine is not lost
 *   park::an_extent_block_is_reused_on_its_stream_when_it_fits   a
 *        576 KiB extent block parked on S serves a 513 KiB request on S
 *        (129 granules of 4 KiB in its 144), not a 700 KiB one (175)
 *   park::thousand_large_frees_few_batches,
 *   park::thousand_random_large_frees_fewer_batches   1000 frees of large
 *        blocks on one stream cost far fewer than 1000 retire batches
 *
 * Internal headers: links the static archive.
 */
#define _GNU_SOURCE
#include "park.h"
#include "thread.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>

#include "stream_util.h"
#include "flag.h"
#include "test_util.h"


#define BIG (4 * MiB)

/* The hook: the thread marked `stopper` stops at point `stop_at` (once);
 * the thread marked `waiter` reports MP_HOOK_PARK_WAIT (once). */
static _Atomic int stop_at;
static _Thread_local int stopper, waiter;
static flag stopped = FLAG_INIT, go = FLAG_INIT, waiting = FLAG_INIT;

static void park_hook(int point, void *arg) {
  (void)arg;
  if (stopper && point == atomic_load(&stop_at)) {
    stopper = 0;
    flag_set(&stopped);
    flag_wait(&go);
  } else if (waiter && point == MP_HOOK_PARK_WAIT) {
    waiter = 0;
    flag_set(&waiting);
  }
}

static uint64_t batches(magpool_t *pool) { return atomic_load(&pool->retire.batches); }

/* A pool, a host stream held by a gate, and a 4 MiB block allocated on
 * it (not yet freed). */
typedef struct setup {
  magpool_t *pool;
  magpool_stream_t s;
  gate g;
  void *x;
} setup;

/* A pool of whole regions (chunk_size does not divide pool_size), where
 * the 4 MiB block is a buddy block that the park holds; on a chunked pool
 * it would be a run, fenced instead (src/runs.h, tests/unit/test_fence.c). */
static void setup_on(setup *t, bool chunked) {
  t->pool = mpt_pool(&(mpt_cfg){.pool_size = 64 * MiB, .chunk = chunked ? 0 : 128 * MiB});
  cr_assert_eq(t->pool->chunks != NULL, chunked);
  t->s = stream_new();
  gate_init(&t->g);
  launch(t->s, gate_task, &t->g);
  gate_wait_entered(&t->g);
  t->x = magpool_alloc_async(t->pool, BIG, t->s);
  cr_assert_not_null(t->x);
}

static void setup_begin(setup *t) { setup_on(t, false); }

static void setup_end(setup *t) {
  gate_open(&t->g);
  cr_assert_eq(magpool_host_stream_sync(t->s), 0);
  gate_done(&t->g);
  finish(t->pool, 64 * MiB, &t->s, 1);
}

typedef struct job {
  setup *t;
  int op; /* 0 free x, 1 allocate BIG, 2 flush the caches (ladder rung 1) */
  int stop, wait;
  flag ready, start;
  void *got;
} job;

/* Runs one operation.  First, for the async calls, the thread makes its
 * slot in S's entry (a slot is made under the entry lock, which a flush
 * holds while it stops), with a block it frees synchronously (so nothing
 * of it stays cached or pending). */
#define FLAGS .ready = FLAG_INIT, .start = FLAG_INIT

static void *run_job(void *arg) {
  job *j = arg;
  if (j->op != 2) {
    void *w = magpool_alloc_async(j->t->pool, 64, j->t->s);
    cr_assert_not_null(w);
    cr_assert_eq(magpool_free(j->t->pool, w), 0);
  }
  flag_set(&j->ready);
  flag_wait(&j->start);
  stopper = j->stop;
  waiter = j->wait;
  if (j->op == 0) cr_assert_eq(magpool_free_async(j->t->pool, j->t->x, j->t->s), 0);
  else if (j->op == 1) j->got = magpool_alloc_async(j->t->pool, BIG, j->t->s);
  else mp_streams_flush_caches(j->t->pool);
  return NULL;
}

/* Thread `first` runs until it stops at `point` holding the park's lock;
 * then `second` runs until it waits for the lock; then both finish. */
static void meet(job *first, int point, job *second) {
  atomic_store(&stop_at, point);
  first->stop = 1;
  second->wait = 1;
  mp_hook_set(park_hook);
  pthread_t a, b;
  cr_assert_eq(pthread_create(&a, NULL, run_job, first), 0);
  cr_assert_eq(pthread_create(&b, NULL, run_job, second), 0);
  flag_wait(&first->ready);
  flag_wait(&second->ready);
  flag_set(&first->start);
  flag_wait(&stopped);
  flag_set(&second->start);
  flag_wait(&waiting);
  flag_set(&go);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  mp_hook_set(NULL);
}

Test(park, put_meets_take, .timeout = 60) {
  setup t;
  setup_begin(&t);
  uint64_t b0 = batches(t.pool);
  job fr = {.t = &t, .op = 0, FLAGS}, al = {.t = &t, .op = 1, FLAGS};
  meet(&fr, MP_HOOK_PARK_PUT, &al);
  cr_assert_eq(al.got, t.x, "the allocation on S got %p, not the block %p another thread "
               "parked on S", al.got, t.x);
  cr_assert_eq(batches(t.pool), b0, "a retire batch ran between the free and the reuse");
  cr_assert_eq(mpt_stats(t.pool).pending_bytes, 0);
  cr_assert_eq(magpool_free_async(t.pool, al.got, t.s), 0);
  setup_end(&t);
}

Test(park, take_holds_off_flush, .timeout = 60) {
  setup t;
  setup_begin(&t);
  cr_assert_eq(magpool_free_async(t.pool, t.x, t.s), 0);
  cr_assert_geq(mpt_stats(t.pool).cached_bytes, BIG, "the 4 MiB block was not parked");
  uint64_t b0 = batches(t.pool);
  job al = {.t = &t, .op = 1, FLAGS}, fl = {.t = &t, .op = 2, FLAGS};
  meet(&al, MP_HOOK_PARK_TAKE, &fl);
  cr_assert_eq(al.got, t.x, "the allocation that held the park's lock lost its block");
  cr_assert_eq(batches(t.pool), b0, "the flush retired something it should not have seen");
  magpool_stats_t st = mpt_stats(t.pool);
  cr_assert_eq(st.pending_bytes, 0);
  cr_assert_eq(st.cached_bytes, 0, "cached %zu after the block was taken", st.cached_bytes);
  cr_assert_eq(magpool_free_async(t.pool, al.got, t.s), 0);
  setup_end(&t);
}

Test(park, flush_holds_off_take, .timeout = 60) {
  setup t;
  setup_begin(&t);
  cr_assert_eq(magpool_free_async(t.pool, t.x, t.s), 0);
  uint64_t b0 = batches(t.pool);
  job fl = {.t = &t, .op = 2, FLAGS}, al = {.t = &t, .op = 1, FLAGS};
  meet(&fl, MP_HOOK_PARK_FLUSH, &al);
  cr_assert_not_null(al.got);
  cr_assert_eq(batches(t.pool), b0 + 1, "the flush retired %llu batches, expected one",
               (unsigned long long)(batches(t.pool) - b0));
  cr_assert_neq(al.got, t.x, "a block the flush retired behind blocked S was handed out");
  cr_assert_eq(mpt_stats(t.pool).pending_bytes, BIG);
  cr_assert_eq(magpool_free_async(t.pool, al.got, t.s), 0);
  setup_end(&t);
}

/* ------------------------------------------------------------- release */

typedef struct rel_arg {
  setup *t;
} rel_arg;

static void *parker(void *arg) {
  setup *t = arg;
  cr_assert_eq(magpool_free_async(t->pool, t->x, t->s), 0);
  return NULL;
}

Test(park, release_retires_the_park, .timeout = 60) {
  setup t;
  setup_begin(&t);
  pthread_t a;
  cr_assert_eq(pthread_create(&a, NULL, parker, &t), 0); /* another thread parks x */
  pthread_join(a, NULL);
  uint64_t sid;
  cr_assert_eq(t.pool->sops->get_id(t.pool->src_ctx, t.s, &sid), 0);
  mp_streams_read_lock();
  mp_sentry *e = mp_entry_find_rcu(t.pool, sid + 1, t.s, false);
  cr_assert_not_null(e);
  cr_assert_eq(atomic_load(&e->park.bytes), (int64_t)BIG);
  cr_assert(mp_entry_use_rcu(e)); /* keep the dead entry for the look below */
  mp_streams_read_unlock();

  uint64_t b0 = batches(t.pool);
  cr_assert_eq(magpool_stream_release(t.pool, t.s), 0);
  cr_assert_eq(batches(t.pool), b0 + 1);
  magpool_stats_t st = mpt_stats(t.pool);
  cr_assert_eq(st.pending_bytes, BIG, "release did not retire the parked block behind S");
  cr_assert_eq(st.cached_bytes, 0);
  /* The dead entry's park is closed: nothing parks there any more. */
  cr_assert_eq(atomic_load(&e->park.bytes), 0);
  int passed = -1;
  mp_acct acct = {0};
  cr_assert_not(mp_park_put(t.pool, &acct, e, t.s, t.x, 16, &passed),
                "a released entry's park took a block");
  cr_assert_eq(atomic_load(&acct.held), 0);
  mp_entry_unuse(e);
  /* S, used again, is a new entry: blocked, it gives nothing back. */
  void *y = magpool_alloc_async(t.pool, BIG, t.s);
  cr_assert_not_null(y);
  cr_assert_neq(y, t.x, "the block retired behind blocked S came back before S passed");
  void *z = magpool_alloc(t.pool, BIG);
  cr_assert_neq(z, t.x);
  cr_assert_eq(magpool_free(t.pool, z), 0);
  cr_assert_eq(magpool_free_async(t.pool, y, t.s), 0);
  setup_end(&t);
}

/* --------------------------------------------------------------- batches */

/* 1000 large async frees on one stream, two patterns; the old design
 * retired every one of them alone (1000 batches, 1000 stream callbacks). */

/* Steps, as a training loop makes them: each allocates blocks of four
 * sizes on the stream and frees them in random order.  After the first
 * step every allocation finds its block parked. */
Test(park, thousand_large_frees_few_batches, .timeout = 120) {
  const size_t PS = 256 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_stream_t s = stream_new();
  mpt_rng r = mpt_rng_seed(7);
  static const size_t sizes[] = {2 * MiB, 3 * MiB, 6 * MiB, 12 * MiB};
  enum { N = 1000, K = 4 };
  void *first[K];
  uint64_t b0 = batches(pool);
  size_t same = 0;
  for (int step = 0; step < N / K; step++) {
    void *p[K];
    for (int i = 0; i < K; i++) {
      p[i] = magpool_alloc_async(pool, sizes[i], s);
      cr_assert_not_null(p[i]);
      if (step == 0) first[i] = p[i];
      same += p[i] == first[i];
    }
    mpt_shuffle(&r, p, K, sizeof *p);
    for (int i = 0; i < K; i++) cr_assert_eq(magpool_free_async(pool, p[i], s), 0);
  }
  uint64_t nb = batches(pool) - b0;
  cr_log_info("steps: %d large frees, %llu batches", N, (unsigned long long)nb);
  cr_assert_leq(nb, N / 100, "%d large async frees on one stream retired %llu batches", N,
                (unsigned long long)nb);
  cr_assert_eq(same, (size_t)N, "an allocation did not get its block back from the park");
  finish(pool, PS, &s, 1);
}

/* Random: a live window of 6 blocks of four sizes, one freed and one of a
 * random size allocated per round.  The park cannot hold every block a
 * random walk leaves behind within its budget, so it retires now and
 * then: a weaker bound, still far below one batch per free. */
Test(park, thousand_random_large_frees_fewer_batches, .timeout = 120) {
  const size_t PS = 256 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS});
  magpool_stream_t s = stream_new();
  mpt_rng r = mpt_rng_seed(7);
  static const size_t sizes[] = {2 * MiB, 3 * MiB, 6 * MiB, 12 * MiB};
  enum { W = 6, N = 1000 };
  void *live[W];
  for (int i = 0; i < W; i++) {
    live[i] = magpool_alloc_async(pool, sizes[mpt_range(&r, 0, 3)], s);
    cr_assert_not_null(live[i]);
  }
  uint64_t b0 = batches(pool);
  for (int k = 0; k < N; k++) {
    int i = (int)mpt_range(&r, 0, W - 1);
    cr_assert_eq(magpool_free_async(pool, live[i], s), 0);
    live[i] = magpool_alloc_async(pool, sizes[mpt_range(&r, 0, 3)], s);
    cr_assert_not_null(live[i], "allocation %d", k);
  }
  uint64_t nb = batches(pool) - b0;
  cr_log_info("random: %d large frees, %llu batches", N, (unsigned long long)nb);
  cr_assert_leq(nb, N / 4, "%d large async frees on one stream retired %llu batches", N,
                (unsigned long long)nb);
  for (int i = 0; i < W; i++) cr_assert_eq(magpool_free_async(pool, live[i], s), 0);
  finish(pool, PS, &s, 1);
}

/* Counts each hook point reached (the tests below). */
static _Atomic int hook_hits[MP_HOOK_CAPTURE_ASK + 1]; /* by point */
static void count_hits(int point, void *arg) {
  (void)arg;
  if (point >= 0 && point <= MP_HOOK_CAPTURE_ASK) atomic_fetch_add(&hook_hits[point], 1);
}

/* A stream that has not passed a run's free is asked less and less: after
 * each "no", the next 1, 2, 4 ... run frees are fenced for it without
 * asking (park.c, passed_hint; a chunked pool, where the 4 MiB block is a
 * run).  On blocked S, 20 frees of a 4 MiB run (each reallocated by S from
 * its fenced chunks) ask at frees 1, 3, 6, 11 and 20: 5 times.  Once S
 * has passed, the frees still skip the question as scheduled, and the
 * first that asks (at most 16 frees later) sends its run to the free runs
 * unfenced; the next free asks at once. */
Test(park, a_busy_stream_is_asked_less_and_less, .timeout = 60) {
  setup t;
  setup_on(&t, true);
  atomic_store(&hook_hits[MP_HOOK_PARK_IDLE], 0);
  mp_hook_set(count_hits);
  for (int k = 0; k < 20; k++) {
    cr_assert_eq(magpool_free_async(t.pool, t.x, t.s), 0);
    magpool_stats_t st = mpt_stats(t.pool); /* fenced: cached, or pending once retired */
    cr_assert_eq(st.cached_bytes + st.pending_bytes, BIG, "free %d: the run was not fenced", k + 1);
    void *y = magpool_alloc_async(t.pool, BIG, t.s);
    cr_assert_eq(y, t.x, "free %d: S did not get its fenced run back", k + 1);
  }
  cr_assert_eq(atomic_load(&hook_hits[MP_HOOK_PARK_IDLE]), 5,
               "blocked S was asked %d times in 20 frees",
               atomic_load(&hook_hits[MP_HOOK_PARK_IDLE]));
  gate_open(&t.g);
  cr_assert_eq(magpool_host_stream_sync(t.s), 0);
  /* Frees that skip the question; then the one that asks. */
  for (int frees = 1; atomic_load(&hook_hits[MP_HOOK_PARK_IDLE]) == 5; frees++) {
    cr_assert_leq(frees, 17, "S passed, and 17 frees later none has asked");
    cr_assert_eq(magpool_free_async(t.pool, t.x, t.s), 0);
    t.x = magpool_alloc_async(t.pool, BIG, t.s);
    cr_assert_not_null(t.x);
  }
  cr_assert_eq(atomic_load(&hook_hits[MP_HOOK_PARK_IDLE]), 6);
  cr_assert_eq(magpool_free_async(t.pool, t.x, t.s), 0);
  magpool_stats_t st = mpt_stats(t.pool);
  cr_assert_eq(st.cached_bytes + st.pending_bytes, 0, "passed S: the run after a yes was fenced");
  cr_assert_eq(atomic_load(&hook_hits[MP_HOOK_PARK_IDLE]), 7);
  mp_hook_set(NULL);
  t.x = magpool_alloc_async(t.pool, BIG, t.s);
  gate_done(&t.g);
  cr_assert_eq(magpool_free_async(t.pool, t.x, t.s), 0);
  finish(t.pool, 64 * MiB, &t.s, 1);
}

/* A free asks whether its stream is being captured only where that is not
 * known (alloc_async.c, free_async_full): a host stream never is, nor is a
 * stream of a pool with capture_check 0 once the thread's memo names it.
 * On blocked S (a chunked pool: the 4 MiB block is a run, fenced for S),
 * ten frees of the run, each reallocated by S, ask no question; each had
 * asked once before, a driver call on a CUDA stream. */
Test(park, a_run_free_asks_no_capture_question, .timeout = 60) {
  setup t;
  setup_on(&t, true);
  atomic_store(&hook_hits[MP_HOOK_CAPTURE_ASK], 0);
  mp_hook_set(count_hits);
  for (int k = 0; k < 10; k++) {
    cr_assert_eq(magpool_free_async(t.pool, t.x, t.s), 0);
    void *y = magpool_alloc_async(t.pool, BIG, t.s);
    cr_assert_eq(y, t.x, "free %d: S did not get its fenced run back", k + 1);
  }
  mp_hook_set(NULL);
  cr_assert_eq(atomic_load(&hook_hits[MP_HOOK_CAPTURE_ASK]), 0,
               "10 frees of a run on a host stream asked %d capture questions",
               atomic_load(&hook_hits[MP_HOOK_CAPTURE_ASK]));
  cr_assert_eq(magpool_free_async(t.pool, t.x, t.s), 0);
  setup_end(&t);
}

/* ---------------------------------- a thread allocating what another frees */

/* Thread B frees on S what thread A allocates on S (a training step's
 * backward thread frees what its forward thread allocated): B's slot
 * overflows into S's park a magazine at a time, and A's slot misses. */
#define SMALL (4 * KiB)
#define NSMALL 1024 /* 4 MiB, four times the stream cache below */

typedef struct xfree {
  magpool_t *pool;
  magpool_stream_t s;
  void **p;
  int n;
} xfree;

static void *free_on_s(void *arg) {
  xfree *x = arg;
  for (int i = 0; i < x->n; i++) cr_assert_eq(magpool_free_async(x->pool, x->p[i], x->s), 0);
  return NULL;
}

/* S's entry (the caller keeps S registered). */
static mp_sentry *entry_of(magpool_t *pool, magpool_stream_t s) {
  uint64_t sid;
  cr_assert_eq(pool->sops->get_id(pool->src_ctx, s, &sid), 0);
  mp_streams_read_lock();
  mp_sentry *e = mp_entry_find_rcu(pool, sid + 1, s, false);
  mp_streams_read_unlock();
  cr_assert_not_null(e);
  return e;
}

static bool one_of(void **p, int n, const void *q) {
  for (int i = 0; i < n; i++)
    if (p[i] == q) return true;
  return false;
}

/* A pool with a 1 MiB stream cache, S held by a gate, NSMALL blocks that
 * this thread allocated on S and thread B freed on S. */
static magpool_t *freed_by_another(magpool_stream_t *s, gate *g, void **p) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 64 * MiB, .chunk = 128 * MiB, .stream_cache = MiB});
  *s = stream_new();
  gate_hold(g, *s);
  for (int i = 0; i < NSMALL; i++) cr_assert_not_null(p[i] = magpool_alloc_async(pool, SMALL, *s));
  xfree x = {pool, *s, p, NSMALL};
  pthread_t b;
  cr_assert_eq(pthread_create(&b, NULL, free_on_s, &x), 0);
  pthread_join(b, NULL);
  return pool;
}

Test(park, a_slot_miss_takes_a_whole_parked_magazine, .timeout = 60) {
  magpool_stream_t s;
  gate g;
  static void *p[NSMALL], *q[NSMALL];
  magpool_t *pool = freed_by_another(&s, &g, p);
  mp_park *k = &entry_of(pool, s)->park;
  int64_t parked = atomic_load(&k->bytes);
  cr_assert_geq(parked, 2 * (int64_t)SMALL, "B's overflow parked %lld bytes", (long long)parked);
  /* A's first allocation misses its slot: a whole magazine leaves the
   * park (one block handed out, the rest in A's slot). */
  cr_assert_not_null(q[0] = magpool_alloc_async(pool, SMALL, s));
  int64_t left = atomic_load(&k->bytes);
  int took = (int)((parked - left) / (int64_t)SMALL);
  cr_assert_geq(took, 2, "a slot miss took %d block(s) off the park, not a magazine", took);
  /* The rest of that magazine: A's slot, the park untouched. */
  for (int i = 1; i < took; i++) {
    cr_assert_not_null(q[i] = magpool_alloc_async(pool, SMALL, s));
    cr_assert_eq(atomic_load(&k->bytes), left, "allocation %d of the magazine went to the park", i);
  }
  for (int i = 0; i < took; i++)
    cr_assert(one_of(p, NSMALL, q[i]), "block %d is not one that B freed on S", i);
  for (int i = 0; i < took; i++) cr_assert_eq(magpool_free_async(pool, q[i], s), 0);
  gate_release(&g, s);
  finish(pool, 64 * MiB, &s, 1);
}

/* A slot keeps one full magazine of a class behind the loaded one; what
 * was behind goes to the park.  Thread B frees on S, well within its
 * share of a 64 MiB stream cache, NSMALL blocks this thread allocated,
 * and stays alive (its exit would return its slot): all but two
 * magazines of them are in S's park for this thread to refill from.
 * Before, B's slot held all of them, and this thread, missing, would have
 * allocated new blocks. */
typedef struct xfree_wait {
  xfree x;
  flag freed, done;
} xfree_wait;

static void *free_on_s_and_wait(void *arg) {
  xfree_wait *w = arg;
  free_on_s(&w->x);
  flag_set(&w->freed);
  flag_wait(&w->done);
  return NULL;
}

Test(park, a_slot_keeps_one_full_magazine_behind_the_loaded_one, .timeout = 60) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 64 * MiB, .chunk = 128 * MiB, .stream_cache = 64 * MiB});
  magpool_stream_t s = stream_new();
  gate g;
  gate_hold(&g, s);
  static void *p[NSMALL], *q[NSMALL];
  for (int i = 0; i < NSMALL; i++) cr_assert_not_null(p[i] = magpool_alloc_async(pool, SMALL, s));
  xfree_wait w = {.x = {pool, s, p, NSMALL}, .freed = FLAG_INIT, .done = FLAG_INIT};
  pthread_t b;
  cr_assert_eq(pthread_create(&b, NULL, free_on_s_and_wait, &w), 0);
  flag_wait(&w.freed);
  unsigned order;
  cr_assert_eq(mp_size_order(pool, SMALL, &order), 0);
  int64_t cap = pool->s_mag_cap[order], parked = atomic_load(&entry_of(pool, s)->park.bytes);
  int64_t least = (int64_t)(NSMALL - 2 * cap) * (int64_t)SMALL;
  cr_assert_gt(least, 0, "the test needs more than two magazines of blocks");
  cr_assert_geq(parked, least, "B's slot kept %lld of %lld bytes it freed, over two magazines",
                (long long)((int64_t)NSMALL * SMALL - parked), (long long)NSMALL * SMALL);
  /* This thread's allocations reuse them: nothing new from the tree. */
  for (int i = 0; i < NSMALL - 2 * cap; i++) {
    cr_assert_not_null(q[i] = magpool_alloc_async(pool, SMALL, s));
    cr_assert(one_of(p, NSMALL, q[i]), "block %d is not one that B freed on S", i);
  }
  for (int i = 0; i < NSMALL - 2 * cap; i++) cr_assert_eq(magpool_free_async(pool, q[i], s), 0);
  flag_set(&w.done);
  pthread_join(b, NULL);
  gate_release(&g, s);
  finish(pool, 64 * MiB, &s, 1);
}

/* A thief between the two halves of a refill: thread A's allocation took
 * a magazine off the park and stops (MP_HOOK_PARK_TAKE, the park's lock
 * held); magpool_stream_release steals A's slot and closes it, then waits
 * for that lock.  A's closed slot refuses the magazine: its blocks go back
 * to the park or behind S, A's allocation is served all the same, and
 * nothing is lost or handed out twice (finish: the pool whole again). */
typedef struct refill {
  magpool_t *pool;
  magpool_stream_t s;
  void *got;
} refill;

static void *alloc_stopping(void *arg) {
  refill *a = arg;
  stopper = 1;
  a->got = magpool_alloc_async(a->pool, SMALL, a->s);
  return NULL;
}

static void *release_waiting(void *arg) {
  refill *a = arg;
  waiter = 1;
  cr_assert_eq(magpool_stream_release(a->pool, a->s), 0);
  return NULL;
}

Test(park, a_refill_meets_a_release, .timeout = 60) {
  magpool_stream_t s;
  gate g;
  static void *p[NSMALL];
  magpool_t *pool = freed_by_another(&s, &g, p);
  mp_park *k = &entry_of(pool, s)->park;
  cr_assert_geq(atomic_load(&k->bytes), 2 * (int64_t)SMALL);
  atomic_store(&stop_at, MP_HOOK_PARK_TAKE);
  mp_hook_set(park_hook);
  refill a = {pool, s, NULL};
  pthread_t al, rel;
  cr_assert_eq(pthread_create(&al, NULL, alloc_stopping, &a), 0);
  flag_wait(&stopped); /* A holds the park's lock, a magazine in hand */
  cr_assert_eq(pthread_create(&rel, NULL, release_waiting, &a), 0);
  flag_wait(&waiting); /* the release closed A's slot and waits for the lock */
  flag_set(&go);
  pthread_join(al, NULL);
  pthread_join(rel, NULL);
  mp_hook_set(NULL);
  cr_assert_not_null(a.got, "the allocation whose refill was refused failed");
  cr_assert_eq(magpool_free(pool, a.got), 0);
  gate_release(&g, s);
  finish(pool, 64 * MiB, &s, 1);
}

/* Extent blocks (src/extent.c) on a park: a capped chunked pool caches
 * blocks up to 8 KiB, so a 576 KiB block freed on S (held by a gate) is
 * parked, costed by its 144 granules of 4 KiB.  An allocation on S of
 * 513 KiB (129 granules, within the park's waste bound of an eighth)
 * reuses it at once; one of 700 KiB (175 granules) of the same order does
 * not: the parked block is too small for it. */
Test(park, an_extent_block_is_reused_on_its_stream_when_it_fits, .timeout = 60) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 64 * MiB, .growth = 1, .max = 128 * MiB});
  cr_assert_not_null(pool->chunks);
  cr_assert_eq(pool->cfg.cache_max_block, 8 * KiB);
  magpool_stream_t s = stream_new();
  gate g;
  gate_hold(&g, s);
  void *x = magpool_alloc_async(pool, 576 * KiB, s);
  cr_assert_not_null(x);
  cr_assert_eq(magpool_usable_size(pool, x), 576 * KiB);
  cr_assert_eq(magpool_free_async(pool, x, s), 0);
  cr_assert_eq(atomic_load(&entry_of(pool, s)->park.bytes), 576 * KiB, "not parked by its granules");
  void *z = magpool_alloc_async(pool, 700 * KiB, s);
  cr_assert_not_null(z);
  cr_assert_neq(z, x, "a 576 KiB block served 700 KiB");
  cr_assert_eq(magpool_usable_size(pool, z), 700 * KiB);
  void *y = magpool_alloc_async(pool, 513 * KiB, s);
  cr_assert_eq(y, x, "the parked block was not reused on its stream");
  cr_assert_eq(magpool_usable_size(pool, y), 576 * KiB);
  cr_assert_eq(magpool_free_async(pool, y, s), 0);
  cr_assert_eq(magpool_free_async(pool, z, s), 0);
  gate_release(&g, s);
  cr_assert_eq(magpool_stream_release(pool, s), 0);
  cr_assert_eq(magpool_host_stream_sync(s), 0);
  cr_assert_eq(magpool_check(pool), 0);
  mpt_assert_all_free(pool);
  cr_assert_eq(magpool_host_stream_destroy(s), 0);
  mpt_pool_done(pool);
}
