/* test_fence.c - fenced free runs (src/runs.h): a run freed on a stream S
 * that has not passed the free goes back to the free runs at once, where
 * S's allocations may take it (whole, in pieces, or joined with free
 * chunks) and nobody else's may, until the retire batch that fenced it
 * has passed and been drained.
 *
 *   fence::a_blocked_streams_run_is_its_own_at_once   S frees a run while
 *        blocked: pending, not usable by the synchronous API or by T; S's
 *        next allocation gets it, and nothing is pending
 *   fence::the_stream_joins_its_fenced_runs   two fenced runs of S serve
 *        one request of S of their joint size, with no chunk mapped; a
 *        larger one joins them with free chunks; T's request keeps out
 *   races::a_drain_meets_a_take_of_fenced_chunks   S's take stopped after
 *        taking fenced chunks and counting them busy (MP_HOOK_CHUNK_TAKE)
 *        while S passes the free and the batch is drained: the drain only
 *        clears the tag, the chunks stay busy, trim leaves them mapped,
 *        and the take gets them
 *   races::a_later_batch_keeps_its_fence   S takes its fenced run back
 *        and frees it again behind a second gate; the first batch passes
 *        and drains: the run stays fenced by the second
 *   races::a_failed_take_fences_again   S's take of a window with fenced
 *        chunks fails (the cap): mp_runs_putback fences them again (seen
 *        at the ladder's first rung, MP_HOOK_LADDER_RUNG); the request
 *        ends in ENOMEM once S has passed, with nothing lost
 *   races::a_trim_waits_for_a_fence_put,
 *   races::a_fence_put_after_a_close_opens_a_new_batch   the park's open
 *        fence batch against a trim that closes it (MP_HOOK_FENCE_PUT,
 *        MP_HOOK_FENCE_CLOSE)
 *   fence::an_extent_blocks_free_takes_no_fence_tag   an extent block
 *        freed on a held S is parked, with no fence tag taken
 *   fence::a_release_sends_the_memos_next_calls_the_full_way   after a
 *        release, a free and an allocation on S whose memo still names
 *        the closed slot look S up again (its new entry)
 *   fence::a_piece_freed_again_is_noted_once   S takes a chunk of its
 *        fenced run back and frees it again: the open batch notes no new
 *        range and counts its bytes once; S passing unfences both
 *   fence::a_stream_that_keeps_up_is_asked_less_and_less   on an idle S
 *        that makes every run take, run frees ask S after 1, 2, 4, 8, 8 ...
 *        frees; the runs fenced between are unfenced by the next "yes",
 *        with no callback
 *   fence::a_stream_alone_for_long_gives_solo   after MP_PARK_SOLO_RUNS
 *        such takes, no free asks: each run goes back solo (free, tagged
 *        MP_TAG_SOLO, counted cached), in no batch; S's release ends that
 *        (test_solo.c)
 *   races::a_yes_settles_only_runs_fenced_before_it   a free stopped after
 *        S said "passed" (MP_HOOK_PARK_PASSED) while S is blocked and
 *        another free fences its run: the "yes" unfences the run fenced
 *        before the question, not that one
 *   fence::a_new_peak_asks_a_stream_that_keeps_up   such a run is asked
 *        about (and unfenced) before the pool maps chunks for S
 *   fence::a_no_after_a_streak_keeps_the_open_batch   a "not passed" after
 *        such a run leaves it in the open batch, S's, with no callback
 *   races::a_flush_during_the_question_takes_the_runs_along   unless a
 *        flush came while the question was out: then it goes behind S
 * Host streams held by gates; parking off (stream_cache_bytes 0), so
 * every async free is retired at once, but in the last eight tests.  Every test ends with
 * magpool_check (the runs' fence invariants included).
 * Internal headers: links the static archive.
 */
#define _GNU_SOURCE
#include "extent.h"
#include "park.h"
#include "runs.h"
#include "thread.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "flag.h"
#include "runs_util.h"
#include "stream_util.h"
#include "test_util.h"

#define CHUNK (2 * MiB)
#define BIG (4 * MiB)

static magpool_t *fence_pool(size_t pool_size, size_t max) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = pool_size, .growth = max != 0, .max = max,
                          .thread_cache = MPT_ZERO, .stream_cache = MPT_ZERO});
  cr_assert_not_null(pool->chunks, "a %zu-byte host pool is not chunked", pool_size);
  return pool;
}

/* A 4 MiB run allocated on s and freed on s (blocked: it goes fenced). */
static void *fence_one(magpool_t *pool, magpool_stream_t s) {
  void *x = magpool_alloc_async(pool, BIG, s);
  cr_assert_not_null(x);
  cr_assert_eq(magpool_free_async(pool, x, s), 0);
  return x;
}

Test(fence, a_blocked_streams_run_is_its_own_at_once, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = fence_pool(PS, 0);
  magpool_stream_t S = stream_new(), T = stream_new();
  gate g;
  gate_hold(&g, S);
  void *x = fence_one(pool, S);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, BIG, "the run freed on blocked S is not pending (%zu)",
               st.pending_bytes);
  cr_assert_eq(st.used_bytes, 0);
  cr_assert_eq(st.free_bytes, PS - BIG, "fenced bytes counted free");
  cr_assert_eq(magpool_check(pool), 0, "magpool_check with a fenced run");
  uint32_t k = rchunk(pool, x);
  cr_assert(fenced(pool, k) && fenced(pool, k + 1));
  cr_assert_eq(pool->chunks->runs.owner[k], key_of(pool, S));

  void *z = magpool_alloc(pool, BIG);
  cr_assert_not_null(z);
  cr_assert_not(overlaps(z, BIG, x, BIG), "the synchronous API got chunks fenced by blocked S");
  void *t = magpool_alloc_async(pool, BIG, T);
  cr_assert_not_null(t);
  cr_assert_not(overlaps(t, BIG, x, BIG), "T got chunks fenced by blocked S");
  void *y = magpool_alloc_async(pool, BIG, S);
  cr_assert_eq(y, x, "S did not get back the run it freed");
  st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 0);
  cr_assert_eq(st.used_bytes, 3 * BIG);
  cr_assert_eq(magpool_check(pool), 0);

  cr_assert_eq(magpool_free(pool, z), 0);
  cr_assert_eq(magpool_free_async(pool, t, T), 0);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  gate_release(&g, S);
  cr_assert_eq(mpt_stats(pool).pending_bytes, 0, "fenced after S passed and stats drained");
  magpool_stream_t s[] = {S, T};
  finish(pool, PS, s, 2);
}

/* A run over several words of the fence bitmaps (fbits, rbits): its
 * chunks leave them a word at a time when S takes the run back, and the
 * counts (nfenced, nretired) follow (magpool_check: mp_runs_check). */
Test(fence, a_run_over_bitmap_words_leaves_them_whole, .timeout = 60) {
  const size_t PS = 512 * MiB, PAD = 30 * CHUNK, RUN = 100 * CHUNK;
  magpool_t *pool = fence_pool(PS, 0);
  magpool_stream_t S = stream_new();
  gate g;
  gate_hold(&g, S);
  void *pad = magpool_alloc(pool, PAD);
  cr_assert_not_null(pad);
  void *x = magpool_alloc_async(pool, RUN, S);
  cr_assert_not_null(x);
  uint32_t k0 = rchunk(pool, x), n = (uint32_t)(RUN / CHUNK);
  cr_assert_neq(k0 / 64, (k0 + n - 1) / 64, "run at chunk %u does not cross a word", k0);
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  for (uint32_t k = k0; k < k0 + n; k++) cr_assert(fenced(pool, k), "chunk %u not fenced", k);
  cr_assert_eq(atomic_load(&pool->chunks->runs.nfenced), n);
  cr_assert_eq(magpool_check(pool), 0, "magpool_check with a fenced run over three words");
  void *y = magpool_alloc_async(pool, RUN, S);
  cr_assert_eq(y, x, "S did not get back the run it freed");
  for (uint32_t k = k0; k < k0 + n; k++) cr_assert_not(fenced(pool, k), "chunk %u still fenced", k);
  cr_assert_eq(atomic_load(&pool->chunks->runs.nfenced), 0);
  cr_assert_eq(atomic_load(&pool->chunks->runs.nretired), 0);
  cr_assert_eq(magpool_check(pool), 0, "magpool_check after the run was taken back");
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  cr_assert_eq(magpool_free(pool, pad), 0);
  gate_release(&g, S);
  finish(pool, PS, &S, 1);
}

Test(fence, the_stream_joins_its_fenced_runs, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = fence_pool(PS, 0);
  magpool_stream_t S = stream_new(), T = stream_new();
  gate g;
  gate_hold(&g, S);
  char *a = magpool_alloc_async(pool, BIG, S);
  char *b = magpool_alloc_async(pool, BIG, S);
  cr_assert(a != NULL && b != NULL);
  cr_assert_eq(b, a + BIG, "runs in an empty run space are not placed in a row");
  cr_assert_eq(magpool_free_async(pool, a, S), 0);
  cr_assert_eq(magpool_free_async(pool, b, S), 0);
  cr_assert_eq(mpt_stats(pool).pending_bytes, 2 * BIG);
  cr_assert_eq(magpool_check(pool), 0);

  /* T keeps out of both. */
  void *t = magpool_alloc_async(pool, 2 * BIG, T);
  cr_assert_not_null(t);
  cr_assert_not(overlaps(t, 2 * BIG, a, 2 * BIG), "T got chunks fenced by blocked S");

  /* S's request of their joint size: both fenced runs, no chunk mapped. */
  magpool_stats_t st = mpt_stats(pool);
  void *y = magpool_alloc_async(pool, 2 * BIG, S);
  cr_assert_eq(y, a, "S's 8 MiB request did not join its two fenced 4 MiB runs");
  magpool_stats_t st2 = mpt_stats(pool);
  cr_assert_eq(st2.chunk_maps, st.chunk_maps, "chunks were mapped for fenced memory");
  cr_assert_eq(st2.pending_bytes, 0);

  /* Freed again, then asked for with 4 MiB more: the fenced 8 MiB and
   * the free chunks after them (T's run, back from idle T at once). */
  cr_assert_eq(magpool_free_async(pool, t, T), 0);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  size_t want = 3 * BIG;
  void *w = magpool_alloc_async(pool, want, S);
  cr_assert_eq(w, a, "S's 12 MiB request did not start on its fenced run (%p, %p)", w, (void *)a);
  for (uint32_t k = rchunk(pool, a); k < rchunk(pool, a) + want / CHUNK; k++)
    cr_assert(!fenced(pool, k) && busy_of(pool, k) != 0);
  cr_assert_eq(mpt_stats(pool).pending_bytes, 0);
  cr_assert_eq(magpool_check(pool), 0);
  memset(w, 3, want); /* mapped throughout */

  cr_assert_eq(magpool_free_async(pool, w, S), 0);
  gate_release(&g, S);
  magpool_stream_t s[] = {S, T};
  finish(pool, PS, s, 2);
}

/* ================================================================ races */

static int stop_point;
static void *stop_arg;
static _Thread_local int stop_me;
static flag stopped = FLAG_INIT, resume = FLAG_INIT;

static void stop_hook(int point, void *arg) {
  if (point != stop_point || arg != stop_arg || !stop_me) return;
  stop_me = 0;
  flag_set(&stopped);
  flag_wait(&resume);
}

static void hook_reset(void) {
  mp_hook_set(NULL);
  stopped = (flag)FLAG_INIT;
  resume = (flag)FLAG_INIT;
}

typedef struct taker {
  magpool_t *pool;
  magpool_stream_t s;
  size_t size;
  void *got;
  int err;
} taker;

static void *take_on_stream(void *arg) {
  taker *t = arg;
  stop_me = 1;
  t->got = magpool_alloc_async(t->pool, t->size, t->s);
  t->err = t->got == NULL ? magpool_last_error() : 0;
  stop_me = 0;
  return NULL;
}

Test(races, a_drain_meets_a_take_of_fenced_chunks, .timeout = 60) {
  magpool_t *pool = fence_pool(4 * MiB, 64 * MiB);
  magpool_stream_t S = stream_new();
  gate g;
  gate_hold(&g, S);
  void *x = fence_one(pool, S);
  uint32_t k = rchunk(pool, x);
  cr_assert(fenced(pool, k) && fenced(pool, k + 1));

  stop_point = MP_HOOK_CHUNK_TAKE;
  stop_arg = x;
  mp_hook_set(stop_hook);
  taker t = {pool, S, BIG, NULL, 0};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, take_on_stream, &t), 0);
  flag_wait(&stopped); /* fenced chunks taken, counted busy, state not read */
  cr_assert(!fenced(pool, k) && !fenced(pool, k + 1), "the take left its chunks in fbits");

  /* S passes the free; the batch is drained while the take is stopped. */
  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(S), 0);
  cr_assert_not_null(atomic_load(&pool->retire.ready), "the batch's callback has not run");
  mp_retire_drain(pool, NULL);
  cr_assert_eq(pool->chunks->runs.tag[k], 0, "the drain left the passed batch's tag");
  cr_assert(busy_of(pool, k) != 0 && busy_of(pool, k + 1) != 0,
            "the drain counted down chunks a take holds");
  cr_assert_eq(magpool_trim(pool), 0);
  for (uint32_t i = k; i < k + 2; i++)
    cr_assert_eq(atomic_load(&pool->chunks->state[pool->chunks->run0 + i]), MP_CHUNK_MAPPED,
                 "trim unmapped a chunk a take holds");

  flag_set(&resume);
  pthread_join(th, NULL);
  hook_reset();
  gate_done(&g);
  cr_assert_eq(t.got, x, "the stopped take did not get the fenced run");
  memset(t.got, 5, BIG);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 0);
  cr_assert_eq(st.used_bytes, BIG);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free_async(pool, t.got, S), 0); /* S idle: straight back */
  cr_assert_eq(magpool_trim(pool), 0);
  finish(pool, 4 * MiB, &S, 1);
}

Test(races, a_later_batch_keeps_its_fence, .timeout = 60) {
  magpool_t *pool = fence_pool(4 * MiB, 64 * MiB);
  magpool_stream_t S = stream_new();
  gate g1, g2;
  gate_hold(&g1, S);
  void *x = fence_one(pool, S); /* batch 1, behind g1 */
  uint32_t k = rchunk(pool, x), tag1 = pool->chunks->runs.tag[k];
  gate_init(&g2);
  launch(S, gate_task, &g2);
  void *y = magpool_alloc_async(pool, BIG, S);
  cr_assert_eq(y, x, "S did not get its fenced run back");
  cr_assert_eq(magpool_free_async(pool, y, S), 0); /* batch 2, behind g2 */
  uint32_t tag2 = pool->chunks->runs.tag[k];
  cr_assert(tag2 != 0 && tag2 != tag1, "the second free did not fence with a new tag");

  gate_open(&g1);
  gate_wait_entered(&g2); /* batch 1's callback ran before g2 started */
  mp_retire_drain(pool, NULL);
  cr_assert(fenced(pool, k) && fenced(pool, k + 1), "batch 1's drain unfenced batch 2's run");
  cr_assert_eq(pool->chunks->runs.tag[k], tag2);
  cr_assert_eq(mpt_stats(pool).pending_bytes, BIG);
  void *z = magpool_alloc(pool, BIG);
  cr_assert_not_null(z);
  cr_assert_not(overlaps(z, BIG, x, BIG), "the synchronous API got a run fenced by batch 2");
  cr_assert_eq(magpool_check(pool), 0);

  gate_open(&g2);
  cr_assert_eq(magpool_host_stream_sync(S), 0);
  gate_done(&g1);
  gate_done(&g2);
  cr_assert_eq(mpt_stats(pool).pending_bytes, 0);
  cr_assert(!fenced(pool, k) && busy_of(pool, k) == 0, "batch 2's drain left the run fenced");
  cr_assert_eq(magpool_free(pool, z), 0);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  finish(pool, 4 * MiB, &S, 1);
}

/* What the ladder's first rung saw of x's chunks (recorded by the hook
 * on the taking thread, asserted by the test). */
static struct {
  int seen;
  bool fenced[2];
  uint32_t busy[2], tag;
  uint64_t owner;
} rung0;
static uint32_t rung0_k;
static magpool_t *rung0_pool;

static void rung_hook(int point, void *arg) {
  if (point != MP_HOOK_LADDER_RUNG || arg != (void *)(uintptr_t)0 || !stop_me || rung0.seen)
    return;
  rung0.seen = 1;
  for (int i = 0; i < 2; i++) {
    rung0.fenced[i] = fenced(rung0_pool, rung0_k + (uint32_t)i);
    rung0.busy[i] = busy_of(rung0_pool, rung0_k + (uint32_t)i);
  }
  rung0.tag = rung0_pool->chunks->runs.tag[rung0_k];
  rung0.owner = rung0_pool->chunks->runs.owner[rung0_k];
  stop_me = 0;
  flag_set(&stopped);
  flag_wait(&resume);
}

Test(races, a_failed_take_fences_again, .timeout = 60) {
  /* Cap 12 MiB: 6 chunks.  Two tree chunks kept busy by four 1 MiB
   * blocks, S's 4 MiB run fenced: 4 chunks mapped, none empty. */
  magpool_t *pool = fence_pool(4 * MiB, 12 * MiB);
  magpool_stream_t S = stream_new();
  void *small[4];
  for (int i = 0; i < 4; i++) cr_assert_not_null(small[i] = magpool_alloc(pool, 1 * MiB));
  gate g;
  gate_hold(&g, S);
  void *x = fence_one(pool, S);
  uint32_t k = rchunk(pool, x);
  uint32_t tag = pool->chunks->runs.tag[k];
  cr_assert(fenced(pool, k) && tag != 0);

  /* S asks for 10 MiB: the window at x (2 fenced + 3 unmapped chunks)
   * would need 7 mapped, over the cap, with no empty chunk to move. */
  rung0_pool = pool;
  rung0_k = k;
  memset(&rung0, 0, sizeof rung0);
  mp_hook_set(rung_hook);
  taker t = {pool, S, 10 * MiB, NULL, 0};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, take_on_stream, &t), 0);
  flag_wait(&stopped);
  cr_assert(rung0.fenced[0] && rung0.fenced[1], "a failed take left S's chunks unfenced");
  cr_assert(rung0.busy[0] != 0 && rung0.busy[1] != 0, "a failed take counted fenced chunks down");
  cr_assert_eq(rung0.tag, tag, "a failed take changed the fence's tag");
  cr_assert_eq(rung0.owner, key_of(pool, S));
  /* Meanwhile the synchronous API cannot have them. */
  void *z = magpool_alloc(pool, BIG);
  cr_assert_not_null(z);
  cr_assert_not(overlaps(z, BIG, x, BIG), "the synchronous API got chunks a failed take put back");
  cr_assert_eq(magpool_free(pool, z), 0);

  /* The ladder waits for S (rung 2): let it pass. */
  gate_open(&g);
  flag_set(&resume);
  pthread_join(th, NULL);
  hook_reset();
  cr_assert_eq(magpool_host_stream_sync(S), 0);
  gate_done(&g);
  cr_assert_null(t.got, "10 MiB fit beside 4 MiB live under a 12 MiB cap");
  cr_assert_eq(t.err, MAGPOOL_ENOMEM);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, 0);
  cr_assert_eq(st.used_bytes, 4 * MiB);
  cr_assert_eq(atomic_load(&pool->chunks->runs.nfenced), 0);
  cr_assert_eq(magpool_check(pool), 0, "magpool_check after failed takes of fenced chunks");
  for (int i = 0; i < 4; i++) cr_assert_eq(magpool_free(pool, small[i]), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  finish(pool, 4 * MiB, &S, 1);
}

/* ------------------------------------------------- the open fence batch */

/* A park with the default stream_cache_bytes (8 MiB; 8 MiB for runs on a
 * 64 MiB pool): a 4 MiB run freed on blocked S joins the open batch. */
static int fstop_point;
static _Thread_local int fstopper, fwaiter;
static flag fstopped = FLAG_INIT, fgo = FLAG_INIT, fwaiting = FLAG_INIT;

static void fence_hook(int point, void *arg) {
  (void)arg;
  if (fstopper && point == fstop_point) {
    fstopper = 0;
    flag_set(&fstopped);
    flag_wait(&fgo);
  } else if (fwaiter && point == MP_HOOK_PARK_WAIT) {
    fwaiter = 0;
    flag_set(&fwaiting);
  }
}

typedef struct fjob {
  magpool_t *pool;
  magpool_stream_t s;
  void *x; /* freed on s; NULL: trim */
  int stop, wait;
  flag ready, start;
} fjob;

/* A free first makes the thread's slot for s (under the entry lock,
 * which a stopped trim holds), with a block it frees synchronously. */
static void *fjob_run(void *arg) {
  fjob *j = arg;
  if (j->x != NULL) {
    void *w = magpool_alloc_async(j->pool, 64, j->s);
    cr_assert_not_null(w);
    cr_assert_eq(magpool_free(j->pool, w), 0);
  }
  flag_set(&j->ready);
  flag_wait(&j->start);
  fstopper = j->stop;
  fwaiter = j->wait;
  if (j->x != NULL) cr_assert_eq(magpool_free_async(j->pool, j->x, j->s), 0);
  else cr_assert_eq(magpool_trim(j->pool), 0);
  return NULL;
}

/* `first` runs until it stops at `point` holding the fence lock; then
 * `second` until it waits for that lock; then both finish. */
static void fmeet(fjob *first, int point, fjob *second) {
  fstop_point = point;
  first->stop = 1;
  second->wait = 1;
  mp_hook_set(fence_hook);
  pthread_t a, b;
  cr_assert_eq(pthread_create(&a, NULL, fjob_run, first), 0);
  cr_assert_eq(pthread_create(&b, NULL, fjob_run, second), 0);
  flag_wait(&first->ready);
  flag_wait(&second->ready);
  flag_set(&first->start);
  flag_wait(&fstopped);
  flag_set(&second->start);
  flag_wait(&fwaiting);
  flag_set(&fgo);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  mp_hook_set(NULL);
}

/* A free holds the fence lock with its run noted in the open batch while
 * trim waits for the lock: the trim's batch then carries that run (one
 * batch, the open one empty after), and S still gets the run. */
/* A 64 MiB pool with parking on, a host stream *S held by g, and a 4 MiB
 * run allocated on it (not yet freed). */
static magpool_t *parking_pool(magpool_stream_t *S, gate *g, void **x) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 64 * MiB, .thread_cache = MPT_ZERO});
  *S = stream_new();
  gate_hold(g, *S);
  *x = magpool_alloc_async(pool, BIG, *S);
  cr_assert_not_null(*x);
  return pool;
}

Test(races, a_trim_waits_for_a_fence_put, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_stream_t S;
  gate g;
  void *x;
  magpool_t *pool = parking_pool(&S, &g, &x);
  mp_park *k = park_of(pool, S);
  uint64_t b0 = atomic_load(&pool->retire.batches);
  fjob fr = {pool, S, x, 0, 0, FLAG_INIT, FLAG_INIT}, tr = {pool, S, NULL, 0, 0, FLAG_INIT, FLAG_INIT};
  fmeet(&fr, MP_HOOK_FENCE_PUT, &tr);
  cr_assert_eq(atomic_load(&pool->retire.batches), b0 + 1, "the trim did not retire one batch");
  cr_assert_eq(k->fn, 0, "the trim left the run in the open batch");
  cr_assert(fenced(pool, rchunk(pool, x)), "the run is not fenced");
  cr_assert_eq(mpt_stats(pool).pending_bytes, BIG);
  void *y = magpool_alloc_async(pool, BIG, S);
  cr_assert_eq(y, x, "S did not get its run back after the trim retired it");
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  gate_release(&g, S);
  finish(pool, PS, &S, 1);
}

/* Trim holds the fence lock, the open batch detached, while a free waits
 * for the lock: the free's run starts a new batch with a new tag, and the
 * trim's batch, once S passes, unfences only its own run. */
Test(races, a_fence_put_after_a_close_opens_a_new_batch, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_stream_t S;
  gate g;
  void *x;
  magpool_t *pool = parking_pool(&S, &g, &x);
  void *z = fence_one(pool, S);
  mp_park *k = park_of(pool, S);
  uint32_t t1 = pool->chunks->runs.tag[rchunk(pool, z)];
  cr_assert(k->fn == 1 && k->ftag == t1, "z is not in the open batch");
  fjob tr = {pool, S, NULL, 0, 0, FLAG_INIT, FLAG_INIT}, fr = {pool, S, x, 0, 0, FLAG_INIT, FLAG_INIT};
  fmeet(&tr, MP_HOOK_FENCE_CLOSE, &fr);
  uint32_t t2 = pool->chunks->runs.tag[rchunk(pool, x)];
  cr_assert(t2 != 0 && t2 != t1, "the free after the close did not start a new batch");
  cr_assert(k->fn == 1 && k->ftag == t2);
  /* z's batch is behind S (pending), x's open (cached, as parked). */
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, BIG, "z, retired by the trim, is not pending (%zu)", st.pending_bytes);
  cr_assert_eq(st.cached_bytes, BIG, "x, in the open batch, is not cached (%zu)", st.cached_bytes);
  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(S), 0);
  gate_done(&g);
  st = mpt_stats(pool);
  cr_assert(st.pending_bytes == 0 && st.cached_bytes == BIG, "the trim's batch unfenced x, or not z");
  cr_assert(!fenced(pool, rchunk(pool, z)) && fenced(pool, rchunk(pool, x)));
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_trim(pool), 0); /* S idle: x unfenced at once */
  st = mpt_stats(pool);
  cr_assert(st.pending_bytes == 0 && st.cached_bytes == 0);
  finish(pool, PS, &S, 1);
}

/* S takes a piece of its run back out of the open batch and frees it
 * again: the batch notes nothing new (its chunks carry the batch's tag
 * and lie in the range noted for the run), so the park's budget counts
 * them once; once S passes, the run's range unfences them all. */
Test(fence, a_piece_freed_again_is_noted_once, .timeout = 60) {
  magpool_stream_t S;
  void *x;
  gate g;
  magpool_t *pool = parking_pool(&S, &g, &x);
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  mp_park *k = park_of(pool, S);
  cr_assert(k->fn == 1 && atomic_load(&k->fbytes) == (int64_t)BIG, "x is not in the open batch");
  void *y = magpool_alloc_async(pool, CHUNK, S);
  cr_assert_not_null(y);
  cr_assert(overlaps(y, CHUNK, x, BIG), "S's chunk request did not take a piece of its fenced run");
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  cr_assert_eq(k->fn, 1, "the piece freed again was noted as a new range (%u ranges)", k->fn);
  cr_assert_eq(atomic_load(&k->fbytes), (int64_t)BIG, "the piece's bytes counted twice");
  cr_assert(fenced(pool, rchunk(pool, x)) && fenced(pool, rchunk(pool, x) + 1));
  cr_assert_eq(magpool_check(pool), 0);
  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(S), 0);
  gate_done(&g);
  cr_assert_eq(magpool_trim(pool), 0); /* S idle: the batch's range unfences both chunks */
  cr_assert(!fenced(pool, rchunk(pool, x)) && !fenced(pool, rchunk(pool, x) + 1));
  magpool_stats_t st = mpt_stats(pool);
  cr_assert(st.pending_bytes == 0 && st.cached_bytes == 0);
  finish(pool, 64 * MiB, &S, 1);
}

/* An extent block (below a chunk, in whole granules) freed on a held S is
 * parked for S, as any block that is not a run is: it never enters the
 * fence batch, so its free takes no fence tag (no lock of the runs, none
 * of the fence batch), and the run freed after it opens the batch with
 * the pool's first tag. */
Test(fence, an_extent_blocks_free_takes_no_fence_tag, .timeout = 60) {
  const size_t PS = 64 * MiB, X = 576 * KiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .cache_max = 256 * KiB});
  magpool_stream_t S = stream_new();
  gate g;
  gate_hold(&g, S);
  void *x = magpool_alloc_async(pool, X, S), *r = magpool_alloc_async(pool, BIG, S);
  cr_assert(x != NULL && r != NULL);
  unsigned order;
  cr_assert_eq(mp_size_order(pool, X, &order), 0);
  cr_assert(mp_extent_order(pool, order) && !mp_is_run(pool, x), "X is not an extent block here");
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  mp_park *k = park_of(pool, S);
  cr_assert_eq(mp_runs_tag_now(pool), 0, "the extent block's free took fence tag %u",
               mp_runs_tag_now(pool));
  cr_assert(k->fn == 0 && (atomic_load(&k->mask) >> order & 1), "x is not parked for S");
  cr_assert_eq(magpool_free_async(pool, r, S), 0);
  cr_assert(k->fn == 1 && k->ftag == 1 && mp_runs_tag_now(pool) == 1, "the run is not fenced");
  cr_assert_eq(magpool_alloc_async(pool, X, S), x, "S did not get its parked extent block back");
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  cr_assert_eq(magpool_check(pool), 0);
  gate_release(&g, S);
  finish(pool, PS, &S, 1);
}

/* A release closes the slot the thread's memo names; the memo still names
 * S, so the next async calls on S find it there (memo_hit) and must look
 * S up again rather than go through the closed slot to the released
 * entry: a run freed after the release is fenced in S's new entry's open
 * batch, and an allocation after a second release leaves the memo on an
 * open slot. */
Test(fence, a_release_sends_the_memos_next_calls_the_full_way, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .thread_cache = MPT_ZERO});
  magpool_stream_t S = stream_new();
  gate g;
  gate_hold(&g, S);
  void *x = magpool_alloc_async(pool, BIG, S);
  cr_assert_not_null(x);
  cr_assert_eq(magpool_stream_release(pool, S), 0);
  cr_assert(mp_tls_last->s_handle == S && mp_revoke_closed(&mp_tls_last->s_slot->rv),
            "the release did not close the slot the memo names");
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  mp_park *k = park_of(pool, S);
  cr_assert(k->fn == 1 && fenced(pool, rchunk(pool, x)), "x is not fenced in S's new entry");
  cr_assert_eq(magpool_stream_release(pool, S), 0);
  void *y = magpool_alloc_async(pool, BIG, S);
  cr_assert_not_null(y);
  cr_assert(!mp_revoke_closed(&mp_tls_last->s_slot->rv), "the allocation used the closed slot");
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  cr_assert_eq(magpool_check(pool), 0);
  gate_release(&g, S);
  finish(pool, PS, &S, 1);
}

/* ------------------------------------------- streams that keep up (park.c) */

/* Counts the park's questions to its stream (MP_HOOK_PARK_IDLE); stops
 * the thread marked `qstopper` once, after its stream answered
 * (MP_HOOK_PARK_PASSED). */
static _Atomic int asked;
static _Thread_local int qstopper;
static flag qstopped = FLAG_INIT, qgo = FLAG_INIT;

static void ask_hook(int point, void *arg) {
  (void)arg;
  if (point == MP_HOOK_PARK_IDLE) atomic_fetch_add(&asked, 1);
  if (point == MP_HOOK_PARK_PASSED && qstopper) {
    qstopper = 0;
    flag_set(&qstopped);
    flag_wait(&qgo);
  }
}

/* Did freeing x on s ask s? */
static bool free_asks(magpool_t *pool, void *x, magpool_stream_t s) {
  int before = atomic_load(&asked);
  cr_assert_eq(magpool_free_async(pool, x, s), 0);
  return atomic_load(&asked) != before;
}

/* S idle (every question answers "passed") and the only stream taking
 * runs, for `n` run frees.  The first MP_PARK_SOLO - 1 frees ask; from
 * the one after S's MP_PARK_SOLO-th take, frees skip the question 1, 2,
 * 4, then 8 times between two that ask (MP_PARK_YES_BACK).  A skipped
 * free fences its run (cached, S's); the next that asks unfences it, with
 * no batch.  Once S made MP_PARK_SOLO_RUNS takes, no free asks: each
 * gives its run back solo (free, MP_TAG_SOLO: runs.h), in no batch.
 * Returns the longest gap between two questions. */
static unsigned keeps_up(unsigned n) {
  const size_t PS = 64 * MiB;
  /* A run budget (64 MiB) that eight fences of a 4 MiB run stay under. */
  magpool_t *pool = mpt_pool(
      &(mpt_cfg){.pool_size = PS, .thread_cache = MPT_ZERO, .stream_cache = 64 * MiB});
  cr_assert_not_null(pool->chunks);
  magpool_stream_t S = stream_new();
  uint64_t b0 = atomic_load(&pool->retire.batches);
  atomic_store(&asked, 0);
  mp_hook_set(ask_hook);
  unsigned next = MP_PARK_SOLO - 1, skip = 0, skipped = 0, gap = 0, longest = 0;
  for (unsigned i = 0; i < n; i++) {
    void *x = magpool_alloc_async(pool, BIG, S);
    cr_assert_not_null(x);
    bool a = free_asks(pool, x, S);
    magpool_stats_t st = mpt_stats(pool);
    bool solo = i + 1 >= MP_PARK_SOLO_RUNS; /* S's takes so far: i + 1 */
    bool expect = !solo && (i < MP_PARK_SOLO - 1 || i == next);
    cr_assert_eq(a, expect, "free %u: asked %d, expected %d", i, a, expect);
    if (solo) {
      cr_assert_eq(st.cached_bytes, BIG, "free %u: the solo run counts %zu cached", i, st.cached_bytes);
      cr_assert_not(fenced(pool, rchunk(pool, x)));
      cr_assert_eq(pool->chunks->runs.tag[rchunk(pool, x)], MP_TAG_SOLO);
      cr_assert_eq(atomic_load(&pool->chunks->runs.solo), key_of(pool, S));
      skipped++;
    } else if (a) {
      cr_assert_eq(st.cached_bytes + st.pending_bytes, 0, "free %u: a yes left a run fenced", i);
      longest = gap > longest ? gap : longest;
      gap = 0;
      if (i < MP_PARK_SOLO - 1) continue;
      skip = skip == 0 ? 1 : skip < MP_PARK_YES_BACK ? 2 * skip : MP_PARK_YES_BACK;
      next = i + skip + 1;
    } else {
      cr_assert_eq(st.cached_bytes, BIG, "free %u: the run not asked about is not fenced", i);
      cr_assert(fenced(pool, rchunk(pool, x)));
      skipped++;
      gap++;
    }
  }
  mp_hook_set(NULL);
  cr_assert_geq(skipped, (n - MP_PARK_SOLO) * 2 / 3, "only %u of %u frees skipped the question",
                skipped, n - MP_PARK_SOLO);
  cr_assert_eq(atomic_load(&pool->retire.batches), b0, "an idle stream's frees made batches");
  cr_assert_eq(magpool_check(pool), 0);
  finish(pool, PS, &S, 1);
  return longest;
}

Test(fence, a_stream_that_keeps_up_is_asked_less_and_less, .timeout = 60) {
  cr_assert_eq(keeps_up(MP_PARK_SOLO + 60), MP_PARK_YES_BACK);
}

/* A training loop's stream, alone for MP_PARK_SOLO_RUNS takes: its run
 * frees are not asked about any more, and make no batch (keeps_up). */
Test(fence, a_stream_alone_for_long_gives_solo, .timeout = 120) {
  cr_assert_eq(keeps_up(MP_PARK_SOLO_RUNS + 300), MP_PARK_YES_BACK);
}

/* S makes the pool's last MP_PARK_SOLO run takes, then n more runs of
 * BIG (out[]), and has said "passed" twice running: its next run free
 * skips the question.  Returns S's park. */
static mp_park *keep_up(magpool_t *pool, magpool_stream_t S, void **out, int n) {
  for (unsigned i = 0; i < MP_PARK_SOLO; i++) {
    void *y = magpool_alloc_async(pool, BIG, S);
    cr_assert_not_null(y);
    cr_assert_eq(magpool_free_async(pool, y, S), 0);
  }
  for (int i = 0; i < n; i++) cr_assert_not_null(out[i] = magpool_alloc_async(pool, BIG, S));
  mp_park *k = park_of(pool, S);
  atomic_store(&k->idle_back, MP_PARK_YES | 1u); /* after a yes, skip one */
  atomic_store(&k->idle_skip, 1u);
  return k;
}

/* keep_up on a fresh 64 MiB pool (no thread cache) and host stream *S;
 * S's park in *k unless k is NULL. */
static magpool_t *keeping_pool(magpool_stream_t *S, mp_park **k, void **out, int n) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 64 * MiB, .thread_cache = MPT_ZERO});
  *S = stream_new();
  mp_park *park = keep_up(pool, *S, out, n);
  if (k != NULL) *k = park;
  return pool;
}

static void *free_and_stop(void *arg) {
  fjob *j = arg;
  qstopper = 1;
  cr_assert_eq(magpool_free_async(j->pool, j->x, j->s), 0);
  return NULL;
}

/* S keeps up and x's free skipped the question (x fenced, in the open
 * batch).  Thread A frees z: it detaches the batch, asks, S says
 * "passed", and A stops there.  S is then blocked and w freed on it: w's
 * free asks ("no") and fences w in a new batch.  A's "yes" must unfence
 * x only: w was freed after the question, behind the blocked task. */
Test(races, a_yes_settles_only_runs_fenced_before_it, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_stream_t S;
  void *b[3];
  mp_park *k;
  magpool_t *pool = keeping_pool(&S, &k, b, 3);
  void *x = b[0], *z = b[1], *w = b[2];
  atomic_store(&asked, 0);
  mp_hook_set(ask_hook);
  cr_assert_not(free_asks(pool, x, S), "x's free asked");
  cr_assert(fenced(pool, rchunk(pool, x)), "x, not asked about, is not fenced");
  fjob a = {pool, S, z, 0, 0, FLAG_INIT, FLAG_INIT};
  pthread_t ta;
  cr_assert_eq(pthread_create(&ta, NULL, free_and_stop, &a), 0);
  flag_wait(&qstopped);
  cr_assert_eq(atomic_load(&asked), 1);
  cr_assert_eq(k->fn, 0, "the batch with x was not detached before the question");
  gate g;
  gate_hold(&g, S);
  cr_assert(free_asks(pool, w, S), "w's free did not ask");
  cr_assert(fenced(pool, rchunk(pool, w)), "w, freed on blocked S, is not fenced");
  flag_set(&qgo);
  pthread_join(ta, NULL);
  mp_hook_set(NULL);
  cr_assert_not(fenced(pool, rchunk(pool, x)), "S's yes did not unfence x");
  cr_assert(fenced(pool, rchunk(pool, w)), "S's yes unfenced w, freed after the question");
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.cached_bytes + st.pending_bytes, BIG, "fenced: %zu + %zu", st.cached_bytes,
               st.pending_bytes);
  cr_assert_eq(magpool_check(pool), 0);
  gate_release(&g, S);
  finish(pool, PS, &S, 1);
}

/* S keeps up and x's free skipped the question (x fenced, in the open
 * batch).  S's next request would raise the pool's high-water mark: S is
 * asked first (mp_park_settle), says "passed", and x is unfenced with no
 * batch before the pool maps chunks for the request. */
Test(fence, a_new_peak_asks_a_stream_that_keeps_up, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .growth = true, .max = 4 * PS,
                                        .thread_cache = MPT_ZERO});
  magpool_stream_t S = stream_new();
  void *x;
  (void)keep_up(pool, S, &x, 1);
  uint64_t b0 = atomic_load(&pool->retire.batches);
  atomic_store(&asked, 0);
  mp_hook_set(ask_hook);
  cr_assert_not(free_asks(pool, x, S), "x's free asked");
  cr_assert(fenced(pool, rchunk(pool, x)), "x, not asked about, is not fenced");
  void *big = magpool_alloc_async(pool, 2 * PS, S); /* more than the pool ever held */
  mp_hook_set(NULL);
  cr_assert_not_null(big);
  cr_assert_eq(atomic_load(&asked), 1, "the new peak did not ask S");
  cr_assert_not(fenced(pool, rchunk(pool, x)), "S said passed, and x is still fenced");
  cr_assert_eq(atomic_load(&pool->retire.batches), b0, "x went behind S in a batch");
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.cached_bytes + st.pending_bytes, 0);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free_async(pool, big, S), 0);
  cr_assert_eq(magpool_host_stream_sync(S), 0);
  cr_assert_eq(magpool_trim(pool), 0); /* back to pool_size */
  finish(pool, PS, &S, 1);
}

/* S keeps up and x's free skipped the question (x fenced, in the open
 * batch); then S is blocked, and z's free asks: "not passed".  x stays in
 * the open batch (cached, no batch behind S), z joins it, and S's next
 * request gets its runs back. */
Test(fence, a_no_after_a_streak_keeps_the_open_batch, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_stream_t S;
  void *b[2];
  mp_park *k;
  magpool_t *pool = keeping_pool(&S, &k, b, 2);
  void *x = b[0], *z = b[1];
  uint64_t b0 = atomic_load(&pool->retire.batches);
  atomic_store(&asked, 0);
  mp_hook_set(ask_hook);
  cr_assert_not(free_asks(pool, x, S), "x's free asked");
  gate g;
  gate_hold(&g, S);
  cr_assert(free_asks(pool, z, S), "z's free did not ask");
  mp_hook_set(NULL);
  cr_assert_eq(atomic_load(&pool->retire.batches), b0, "the no sent x behind S in a batch");
  cr_assert_eq(k->fn, 2, "x and z are not both in the open batch (%u ranges)", k->fn);
  cr_assert(fenced(pool, rchunk(pool, x)) && fenced(pool, rchunk(pool, z)));
  magpool_stats_t st = mpt_stats(pool);
  cr_assert(st.cached_bytes == 2 * BIG && st.pending_bytes == 0, "cached %zu, pending %zu",
            st.cached_bytes, st.pending_bytes);
  void *y = magpool_alloc_async(pool, 2 * BIG, S);
  cr_assert_not_null(y);
  cr_assert_eq(mpt_stats(pool).chunk_maps, st.chunk_maps, "S's request mapped chunks");
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  gate_release(&g, S);
  finish(pool, PS, &S, 1);
}

/* As above, but thread A's free (z), which detached the batch with x, is
 * stopped after S said "not passed" (MP_HOOK_PARK_PASSED) while trim
 * flushes the caches.  While x is out of the batch it counts in
 * pending_batches (the ladder goes round again); after the flush, A does
 * not put x back in the open batch: it goes behind S with the flush. */
Test(races, a_flush_during_the_question_takes_the_runs_along, .timeout = 60) {
  const size_t PS = 64 * MiB;
  magpool_stream_t S;
  void *b[2];
  magpool_t *pool = keeping_pool(&S, NULL, b, 2);
  void *x = b[0], *z = b[1];
  cr_assert_eq(magpool_free_async(pool, x, S), 0); /* skipped: fenced */
  gate g;
  gate_hold(&g, S);
  int64_t pb = atomic_load(&pool->retire.pending_batches);
  mp_hook_set(ask_hook);
  fjob a = {pool, S, z, 0, 0, FLAG_INIT, FLAG_INIT};
  pthread_t ta;
  cr_assert_eq(pthread_create(&ta, NULL, free_and_stop, &a), 0);
  flag_wait(&qstopped);
  cr_assert_eq(atomic_load(&pool->retire.pending_batches), pb + 1,
               "x, out of the open batch, is not counted on its way");
  cr_assert_eq(magpool_trim(pool), 0);
  flag_set(&qgo);
  pthread_join(ta, NULL);
  mp_hook_set(NULL);
  cr_assert(fenced(pool, rchunk(pool, x)) && fenced(pool, rchunk(pool, z)));
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, BIG, "x did not go behind S with the flush (pending %zu)",
               st.pending_bytes);
  cr_assert_eq(st.cached_bytes, BIG, "z is not in the open batch (cached %zu)", st.cached_bytes);
  cr_assert_eq(magpool_check(pool), 0);
  gate_release(&g, S);
  cr_assert_eq(magpool_trim(pool), 0);
  finish(pool, PS, &S, 1);
}
