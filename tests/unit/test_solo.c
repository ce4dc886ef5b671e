/* test_solo.c - solo runs (src/runs.h, "Solo runs"; park.c): once a
 * stream S has made the pool's last MP_PARK_SOLO_RUNS run takes, its run
 * frees go back to the free runs as a synchronous free's, tagged
 * MP_TAG_SOLO, in no batch, and S is not asked about them; any other run
 * take, and any take that would map, is refused while they are there, and
 * its caller ends the solo (the runs are fenced for S in its open batch)
 * before it takes again, so that nobody but S gets those chunks before S
 * has passed them, and no unmap takes them from under S's work.
 *
 *   solo::a_solo_stream_gives_its_runs_back_in_no_batch   S held by a gate
 *        frees a run: free, MP_TAG_SOLO, not fenced, no batch; S's next
 *        take gets it back
 *   solo::an_unmap_leaves_a_solo_run_mapped   the highest empty chunks
 *        unmapped meanwhile: not the solo run's (busy counts kept)
 *   solo::the_solos_own_map_ends_it_and_asks   S's own request that would
 *        map ends the solo and asks S (idle: the run is unfenced at once)
 *   solo::the_sync_api_ends_a_solo   a synchronous allocation meanwhile
 *        does not get the run; the run is in S's open batch after, with
 *        a batch's tag, and S still gets it back
 *   solo::another_stream_ends_a_solo   the same for T's allocation
 *   solo::a_trim_ends_a_solo   trim fences the run for S, leaves it
 *        mapped and held (cached or pending) until S passes
 *   solo::a_release_ends_a_solo   releasing S puts the run behind S
 *        (pending until S passes), with nothing lost
 *   solo::a_drop_frees_the_runs_of_a_stream_that_passed_them   the
 *        drop a closing park with no host memory makes (mp_runs_solo_drop,
 *        S passed): the run is free, busy 0, unmappable, anyone's
 *   solo::release_threshold_unmaps_beside_a_solo   with release_threshold
 *        0, a synchronous free of another run unmaps its chunks while the
 *        solo is on, and leaves the solo run's mapped
 *   races::a_solo_free_after_an_end_is_solo_again   S's free stopped after
 *        it chose to give its run back solo (MP_HOOK_SOLO_PUT) while a
 *        synchronous take ends the solo: the free then begins a new solo,
 *        and the next synchronous take ends that too and keeps out of the
 *        run
 *   races::an_end_holds_the_fence_lock_against_a_solo_free   an end
 *        stopped inside the fence lock (MP_HOOK_SOLO_END) while S's free
 *        waits for it (MP_HOOK_PARK_WAIT): the run goes back after the
 *        end, solo, and the ending take keeps out of it
 *   races::a_solo_take_keeps_its_chunks_through_an_end_and_an_unmap   S's
 *        take of its solo run stopped before it counts it
 *        (MP_HOOK_RUN_HELD); the solo ends and every empty chunk is
 *        unmapped meanwhile: the run's chunks, busy all along, stay
 *        mapped, and the take goes on without looking at them
 * Host streams held by gates, parking on.  Every test checks
 * magpool_check (the solo invariants of mp_runs_check included) and ends
 * with the pool in one block.  Internal headers: links the static
 * archive.
 */
#define _GNU_SOURCE
#include "chunk.h"
#include "park.h"
#include "runs.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>

#include "flag.h"
#include "runs_util.h"
#include "stream_util.h"
#include "test_util.h"

#define BIG (4 * MiB)
#define PS (64 * MiB)

/* A 64 MiB pool, parking on (no thread cache), and host stream *S that
 * has made the pool's last MP_PARK_SOLO_RUNS run takes (each run freed at
 * once, S idle).  Returns a run of BIG allocated on S, not freed. */
static magpool_t *solo_pool(magpool_stream_t *S, void **x) {
  magpool_t *pool = mpt_pool(
      &(mpt_cfg){.pool_size = PS, .thread_cache = MPT_ZERO, .stream_cache = 64 * MiB});
  cr_assert_not_null(pool->chunks);
  *S = stream_new();
  for (unsigned i = 0; i < MP_PARK_SOLO_RUNS; i++) {
    void *y = magpool_alloc_async(pool, BIG, *S);
    cr_assert_not_null(y);
    cr_assert_eq(magpool_free_async(pool, y, *S), 0);
  }
  cr_assert_not_null(*x = magpool_alloc_async(pool, BIG, *S));
  return pool;
}

/* x freed on S (held): a solo run, S's, free but counted cached (not
 * free to others yet), in no batch, its busy counts kept. */
static void free_solo(magpool_t *pool, magpool_stream_t S, void *x) {
  uint64_t b0 = atomic_load(&pool->retire.batches);
  magpool_stats_t st0 = mpt_stats(pool);
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  uint32_t k = rchunk(pool, x);
  cr_assert(solo_free(pool, k) && solo_free(pool, k + 1), "the solo run is not in sbits");
  cr_assert_not(fenced(pool, k) || fenced(pool, k + 1), "the solo run is fenced");
  uint32_t units = 1u << (pool->chunks->shift - pool->min_shift); /* a live run's, kept */
  cr_assert_eq(atomic_load(&pool->chunks->busy[pool->chunks->run0 + k]), units);
  cr_assert_eq(atomic_load(&pool->chunks->busy[pool->chunks->run0 + k + 1]), units);
  cr_assert_eq(tag_of(pool, x), MP_TAG_SOLO);
  cr_assert_eq(pool->chunks->runs.owner[k], key_of(pool, S));
  cr_assert_eq(mp_runs_solo(pool), key_of(pool, S));
  cr_assert(atomic_load(&park_of(pool, S)->fsolo));
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.cached_bytes, st0.cached_bytes + BIG, "the solo run is not counted cached");
  cr_assert_eq(st.pending_bytes, 0);
  cr_assert_eq(st.free_bytes, st0.free_bytes, "the solo run counts free");
  cr_assert_eq(atomic_load(&pool->retire.batches), b0, "a solo free made a batch");
  cr_assert_eq(magpool_check(pool), 0, "magpool_check with a solo run");
}

/* solo_pool, S held by gate *g, and its run *x freed on it (free_solo). */
static magpool_t *solo_freed(magpool_stream_t *S, void **x, gate *g) {
  magpool_t *pool = solo_pool(S, x);
  gate_hold(g, *S);
  free_solo(pool, *S, *x);
  return pool;
}

/* After an end: x's chunks still fenced for S, with the open batch's tag,
 * and no solo left. */
static void assert_ended(magpool_t *pool, magpool_stream_t S, void *x) {
  mp_park *k = park_of(pool, S);
  cr_assert_eq(mp_runs_solo(pool), 0, "the solo did not end");
  cr_assert_not(atomic_load(&k->fsolo));
  cr_assert(fenced(pool, rchunk(pool, x)), "the run is not fenced at the end");
  cr_assert_not(solo_free(pool, rchunk(pool, x)));
  cr_assert_neq(tag_of(pool, x), MP_TAG_SOLO);
  cr_assert(k->fn != 0 && tag_of(pool, x) == k->ftag, "the run is not in S's open batch");
  cr_assert_eq(magpool_check(pool), 0, "magpool_check after a solo's end");
}

static void done(magpool_t *pool, magpool_stream_t S) {
  finish(pool, PS, &S, 1);
}

/* An unmap of every empty chunk, down to none (what trim, a move,
 * release_threshold do to some): x's chunks stay mapped. */
static void unmap_all_but(magpool_t *pool, void *x, const char *what) {
  mp_chunks *c = pool->chunks;
  uint64_t k = c->run0 + rchunk(pool, x);
  mp_chunks_lock(pool);
  uint64_t got = mp_chunks_unmap_highest(pool, UINT64_MAX, 0, 0);
  mp_chunks_unlock(pool);
  cr_assert_gt(got, 0, "nothing was unmapped: the test proves nothing");
  cr_assert(atomic_load(&c->state[k]) == MP_CHUNK_MAPPED &&
                atomic_load(&c->state[k + 1]) == MP_CHUNK_MAPPED,
            "an unmap took a chunk of %s", what);
}

/* done() after unmap_all_but, which went below pool_size: S released and
 * passed, trim, one block. */
static void done_unmapped(magpool_t *pool, magpool_stream_t S) {
  cr_assert_eq(magpool_stream_release(pool, S), 0);
  cr_assert_eq(magpool_host_stream_sync(S), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(magpool_check(pool), 0);
  mpt_assert_one_block(pool);
  cr_assert_eq(magpool_host_stream_destroy(S), 0);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

Test(solo, a_solo_stream_gives_its_runs_back_in_no_batch, .timeout = 60) {
  magpool_stream_t S;
  void *x;
  gate g;
  magpool_t *pool = solo_freed(&S, &x, &g);
  void *y = magpool_alloc_async(pool, BIG, S);
  cr_assert_eq(y, x, "S did not get its solo run back");
  cr_assert_not(fenced(pool, rchunk(pool, y)));
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  gate_release(&g, S);
  done(pool, S);
}

/* An unmap of every empty chunk while S's freed run x is solo: x's
 * chunks, free, kept their busy counts, so they stay mapped. */
Test(solo, an_unmap_leaves_a_solo_run_mapped, .timeout = 60) {
  magpool_stream_t S;
  void *x;
  gate g;
  magpool_t *pool = solo_freed(&S, &x, &g);
  unmap_all_but(pool, x, "a solo run, from under held S");
  cr_assert_eq(magpool_check(pool), 0);
  void *y = magpool_alloc_async(pool, BIG, S);
  cr_assert_eq(y, x, "S did not get its solo run back");
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  gate_release(&g, S);
  done_unmapped(pool, S);
}

static _Atomic int idle_asks;
static void ask_hook(int point, void *arg) {
  (void)arg;
  if (point == MP_HOOK_PARK_IDLE) atomic_fetch_add(&idle_asks, 1);
}

/* S (idle) frees x solo, then asks for a run that would map chunks (56
 * MiB of the 64 MiB pool: its run space maps 24 chunks): the take is
 * refused, S's own end fences x in S's batch and asks S, which has passed
 * it, and the take goes on. */
Test(solo, the_solos_own_map_ends_it_and_asks, .timeout = 60) {
  magpool_stream_t S;
  void *x;
  magpool_t *pool = solo_pool(&S, &x);
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  cr_assert_eq(mp_runs_solo(pool), key_of(pool, S));
  atomic_store(&idle_asks, 0);
  mp_hook_set(ask_hook);
  void *y = magpool_alloc_async(pool, 56 * MiB, S);
  mp_hook_set(NULL);
  cr_assert_not_null(y);
  cr_assert_eq(mp_runs_solo(pool), 0, "a take that maps did not end the solo");
  cr_assert_geq(atomic_load(&idle_asks), 1, "the solo's own end did not ask S");
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.cached_bytes + st.pending_bytes, 0, "S passed its run, which is still held");
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  done(pool, S);
}

Test(solo, the_sync_api_ends_a_solo, .timeout = 60) {
  magpool_stream_t S;
  void *x;
  gate g;
  magpool_t *pool = solo_freed(&S, &x, &g);
  void *z = magpool_alloc(pool, BIG);
  cr_assert_not_null(z, "a solo stream's fences made a synchronous allocation fail");
  cr_assert_not(overlaps(z, BIG, x, BIG), "the synchronous API got a run of held S");
  assert_ended(pool, S, x);
  void *y = magpool_alloc_async(pool, BIG, S);
  cr_assert_eq(y, x, "S did not get its run back after the end");
  cr_assert_eq(magpool_free(pool, z), 0);
  cr_assert_eq(magpool_free_async(pool, y, S), 0);
  gate_release(&g, S);
  done(pool, S);
}

Test(solo, another_stream_ends_a_solo, .timeout = 60) {
  magpool_stream_t S, T = stream_new();
  void *x;
  magpool_t *pool = solo_pool(&S, &x);
  gate g;
  gate_hold(&g, S);
  free_solo(pool, S, x);
  void *t = magpool_alloc_async(pool, BIG, T);
  cr_assert_not_null(t);
  cr_assert_not(overlaps(t, BIG, x, BIG), "T got a run of held S");
  assert_ended(pool, S, x);
  cr_assert_eq(magpool_free_async(pool, t, T), 0);
  gate_release(&g, S);
  cr_assert_eq(magpool_stream_release(pool, T), 0);
  cr_assert_eq(magpool_host_stream_sync(T), 0);
  cr_assert_eq(magpool_host_stream_destroy(T), 0);
  done(pool, S);
}

Test(solo, a_trim_ends_a_solo, .timeout = 60) {
  magpool_stream_t S;
  void *x;
  gate g;
  magpool_t *pool = solo_freed(&S, &x, &g);
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(mp_runs_solo(pool), 0, "trim left the solo");
  uint64_t k = pool->chunks->run0 + rchunk(pool, x);
  cr_assert(fenced(pool, rchunk(pool, x)), "trim did not fence the solo run");
  cr_assert_eq(atomic_load(&pool->chunks->state[k]), MP_CHUNK_MAPPED, "trim unmapped it");
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.cached_bytes + st.pending_bytes, BIG, "the solo run is not held for S");
  cr_assert_eq(magpool_check(pool), 0);
  gate_release(&g, S);
  done(pool, S);
}

Test(solo, a_release_ends_a_solo, .timeout = 60) {
  magpool_stream_t S;
  void *x;
  gate g;
  magpool_t *pool = solo_freed(&S, &x, &g);
  cr_assert_eq(magpool_stream_release(pool, S), 0);
  cr_assert_eq(mp_runs_solo(pool), 0, "the release left the solo");
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.pending_bytes, BIG, "the solo run is not behind S (%zu pending)",
               st.pending_bytes);
  void *z = magpool_alloc(pool, BIG);
  cr_assert_not_null(z);
  cr_assert_not(overlaps(z, BIG, x, BIG), "the synchronous API got a run of held S");
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, z), 0);
  gate_release(&g, S);
  cr_assert_eq(magpool_host_stream_sync(S), 0);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, PS);
  mpt_assert_one_block(pool);
  cr_assert_eq(magpool_host_stream_destroy(S), 0);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* The drop (park.c, end_solo_closing: a closing park with no host
 * memory for the end's range waits for S, then drops the solo), called
 * as that does once S has passed: x is free, its busy counts 0, no
 * longer cached, and an unmap or anyone's take may have it. */
Test(solo, a_drop_frees_the_runs_of_a_stream_that_passed_them, .timeout = 60) {
  magpool_stream_t S;
  void *x;
  gate g;
  magpool_t *pool = solo_freed(&S, &x, &g);
  gate_release(&g, S);
  cr_assert_eq(magpool_host_stream_sync(S), 0);
  magpool_stats_t st0 = mpt_stats(pool);
  mp_park *k = park_of(pool, S);
  cr_assert(mp_runs_solo_drop(pool, key_of(pool, S)), "S had no solo to drop");
  atomic_store(&k->fsolo, false); /* as end_solo_closing, under the fence lock */
  cr_assert_eq(mp_runs_solo(pool), 0);
  uint32_t r = rchunk(pool, x);
  uint64_t c0 = pool->chunks->run0 + r;
  cr_assert_not(solo_free(pool, r) || fenced(pool, r));
  cr_assert_eq(tag_of(pool, x), 0);
  cr_assert(atomic_load(&pool->chunks->busy[c0]) == 0 &&
                atomic_load(&pool->chunks->busy[c0 + 1]) == 0,
            "a dropped solo run kept its busy counts");
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.cached_bytes, st0.cached_bytes - BIG, "a dropped solo run still counts cached");
  cr_assert_eq(st.free_bytes, st0.free_bytes + BIG, "a dropped solo run does not count free");
  cr_assert_eq(magpool_check(pool), 0);
  void *z = magpool_alloc(pool, BIG);
  cr_assert_eq(z, x, "the synchronous API did not get the dropped run");
  cr_assert_eq(magpool_free(pool, z), 0);
  done(pool, S);
}

/* release_threshold 0, chunks one at a time: S's run x goes solo (held
 * S), then z, a run of the synchronous API taken before the solo, is
 * freed.  Its chunks are unmapped at once, solo or not; x's, which kept
 * their busy counts, stay mapped, and the solo goes on. */
Test(solo, release_threshold_unmaps_beside_a_solo, .timeout = 60) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB, .growth = 1,
                                         .thread_cache = MPT_ZERO, .stream_cache = 64 * MiB,
                                         .release = MPT_ZERO,
                                         .groups = 1}); /* a chunk each: a group goes whole */
  cr_assert_not_null(pool->chunks);
  void *z = magpool_alloc(pool, BIG), *x;
  cr_assert_not_null(z);
  magpool_stream_t S = stream_new();
  for (unsigned i = 0; i < MP_PARK_SOLO_RUNS; i++) {
    void *y = magpool_alloc_async(pool, BIG, S);
    cr_assert_not_null(y);
    cr_assert_eq(magpool_free_async(pool, y, S), 0);
  }
  cr_assert_not_null(x = magpool_alloc_async(pool, BIG, S));
  gate g;
  gate_hold(&g, S);
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  cr_assert_eq(mp_runs_solo(pool), key_of(pool, S), "x did not go solo");
  mp_chunks *c = pool->chunks;
  uint64_t kz = c->run0 + rchunk(pool, z), kx = c->run0 + rchunk(pool, x);
  cr_assert_eq(magpool_free(pool, z), 0);
  cr_assert(atomic_load(&c->state[kz]) == MP_CHUNK_UNMAPPED &&
                atomic_load(&c->state[kz + 1]) == MP_CHUNK_UNMAPPED,
            "release_threshold 0 left a free run mapped while a solo is on");
  cr_assert(atomic_load(&c->state[kx]) == MP_CHUNK_MAPPED &&
                atomic_load(&c->state[kx + 1]) == MP_CHUNK_MAPPED,
            "release_threshold took a solo run's chunks");
  cr_assert_eq(mp_runs_solo(pool), key_of(pool, S), "a free ended the solo");
  cr_assert_eq(magpool_check(pool), 0);
  gate_release(&g, S);
  cr_assert_eq(magpool_stream_release(pool, S), 0);
  cr_assert_eq(magpool_host_stream_sync(S), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 4 * MiB);
  cr_assert_eq(magpool_host_stream_destroy(S), 0);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------- races */

/* A job stops at its point (0: none) until the test lets it go, and
 * signals when it first waits for a park's lock (wait). */
typedef struct job {
  magpool_t *pool;
  magpool_stream_t s; /* NULL: a synchronous allocation of BIG */
  void *x;            /* freed on s, or the allocation's result */
  int stop, wait;
  flag stopped, go, waiting;
} job;
#define JOB(pool, s, x, stop, wait) {pool, s, x, stop, wait, FLAG_INIT, FLAG_INIT, FLAG_INIT}

static _Thread_local job *self;

static void solo_hook(int point, void *arg) {
  (void)arg;
  job *j = self;
  if (j == NULL) return;
  if (j->stop != 0 && point == j->stop) {
    j->stop = 0;
    flag_set(&j->stopped);
    flag_wait(&j->go);
  } else if (j->wait && point == MP_HOOK_PARK_WAIT) {
    j->wait = 0;
    flag_set(&j->waiting);
  }
}

static void *job_run(void *arg) {
  job *j = arg;
  self = j;
  if (j->s != NULL) cr_assert_eq(magpool_free_async(j->pool, j->x, j->s), 0);
  else j->x = magpool_alloc(j->pool, BIG);
  self = NULL;
  return NULL;
}

/* The job's allocation of BIG on its stream, into x. */
static void *job_alloc(void *arg) {
  job *j = arg;
  self = j;
  j->x = magpool_alloc_async(j->pool, BIG, j->s);
  self = NULL;
  return NULL;
}

/* x's free on held S chose a solo give and stopped before the fence
 * lock; a synchronous take ends the solo that is there and takes.  The
 * free then gives x back solo: the next synchronous take ends that one
 * too and keeps out of x. */
Test(races, a_solo_free_after_an_end_is_solo_again, .timeout = 60) {
  magpool_stream_t S;
  void *x;
  magpool_t *pool = solo_pool(&S, &x);
  gate g;
  gate_hold(&g, S);
  mp_hook_set(solo_hook);
  job a = JOB(pool, S, x, MP_HOOK_SOLO_PUT, 0);
  pthread_t ta;
  cr_assert_eq(pthread_create(&ta, NULL, job_run, &a), 0);
  flag_wait(&a.stopped);
  void *z = magpool_alloc(pool, BIG);
  cr_assert_not_null(z);
  cr_assert_eq(mp_runs_solo(pool), 0);
  flag_set(&a.go);
  pthread_join(ta, NULL);
  mp_hook_set(NULL);
  cr_assert_eq(tag_of(pool, x), MP_TAG_SOLO, "the free after the end is not solo");
  cr_assert_eq(mp_runs_solo(pool), key_of(pool, S));
  cr_assert_eq(magpool_check(pool), 0);
  void *w = magpool_alloc(pool, BIG);
  cr_assert_not_null(w);
  cr_assert_not(overlaps(w, BIG, x, BIG), "the synchronous API got a run of held S");
  assert_ended(pool, S, x);
  cr_assert_eq(magpool_free(pool, z), 0);
  cr_assert_eq(magpool_free(pool, w), 0);
  gate_release(&g, S);
  done(pool, S);
}

/* S holds solo run v.  x's free on held S chose a solo give and stopped
 * (MP_HOOK_SOLO_PUT); a synchronous take, refused, ends v's solo and
 * stops inside S's fence lock (MP_HOOK_SOLO_END); x's free goes on and
 * waits for that lock (MP_HOOK_PARK_WAIT).  Once the end is out, x is
 * given back solo anew, after the end: the ending take gets neither run
 * (refused again if its retry comes after x's fence), nor does the next. */
Test(races, an_end_holds_the_fence_lock_against_a_solo_free, .timeout = 60) {
  magpool_stream_t S;
  void *x, *v;
  magpool_t *pool = solo_pool(&S, &v);
  cr_assert_not_null(x = magpool_alloc_async(pool, BIG, S));
  gate g;
  gate_hold(&g, S);
  free_solo(pool, S, v);
  mp_hook_set(solo_hook);
  job a = JOB(pool, S, x, MP_HOOK_SOLO_PUT, 1), b = JOB(pool, NULL, NULL, MP_HOOK_SOLO_END, 0);
  pthread_t ta, tb;
  cr_assert_eq(pthread_create(&ta, NULL, job_run, &a), 0);
  flag_wait(&a.stopped);
  cr_assert_eq(pthread_create(&tb, NULL, job_run, &b), 0);
  flag_wait(&b.stopped);
  cr_assert(atomic_load(&park_of(pool, S)->fsolo), "the end began elsewhere than in S's lock");
  flag_set(&a.go);
  flag_wait(&a.waiting);
  flag_set(&b.go);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  mp_hook_set(NULL);
  cr_assert_not_null(b.x, "the ending take failed");
  cr_assert_not(overlaps(b.x, BIG, x, BIG), "the ending take got the run freed meanwhile");
  cr_assert_not(overlaps(b.x, BIG, v, BIG), "the ending take got the solo run");
  cr_assert(fenced(pool, rchunk(pool, v)), "the end did not fence the solo run");
  cr_assert(fenced(pool, rchunk(pool, x)) || solo_free(pool, rchunk(pool, x)),
            "the run freed after the end is neither solo nor fenced");
  cr_assert_neq(tag_of(pool, v), MP_TAG_SOLO, "the end left v solo");
  cr_assert_eq(magpool_check(pool), 0);
  /* x's fence came after the end: solo, unless the ending take's retry
   * came first.  A synchronous take ends it either way. */
  void *w = magpool_alloc(pool, BIG);
  cr_assert_not_null(w);
  cr_assert_not(overlaps(w, BIG, x, BIG) || overlaps(w, BIG, v, BIG),
                "the synchronous API got a run of held S");
  /* Ended: in S's open batch, or behind S if the take got to the
   * ladder's flush (its retry refused again). */
  cr_assert_eq(mp_runs_solo(pool), 0, "the solo did not end");
  cr_assert(fenced(pool, rchunk(pool, x)) && tag_of(pool, x) != MP_TAG_SOLO);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, w), 0);
  cr_assert_eq(magpool_free(pool, b.x), 0);
  gate_release(&g, S);
  done(pool, S);
}

/* S's take of its solo run x (a window of free solo chunks) stops before
 * it counts it (MP_HOOK_RUN_HELD).  Meanwhile another owner's end comes
 * and goes, and an unmap of every empty chunk: x's chunks kept their
 * busy counts, so they stay mapped, and the take, which does not look at
 * them again, hands out mapped memory.  (With the counts at 0 while solo,
 * the unmap took them and the take handed them out unmapped.) */
Test(races, a_solo_take_keeps_its_chunks_through_an_end_and_an_unmap, .timeout = 60) {
  magpool_stream_t S;
  void *x;
  gate g;
  magpool_t *pool = solo_freed(&S, &x, &g);
  mp_chunks *c = pool->chunks;
  uint64_t k = c->run0 + rchunk(pool, x);
  mp_hook_set(solo_hook);
  job a = JOB(pool, S, NULL, MP_HOOK_RUN_HELD, 0);
  pthread_t ta;
  cr_assert_eq(pthread_create(&ta, NULL, job_alloc, &a), 0);
  flag_wait(&a.stopped);
  cr_assert_not(solo_free(pool, rchunk(pool, x)), "the take did not get x's window");
  mp_streams_end_solo(pool, 0);
  cr_assert_eq(mp_runs_solo(pool), 0, "the solo did not end");
  unmap_all_but(pool, x, "the run being taken");
  flag_set(&a.go);
  pthread_join(ta, NULL);
  mp_hook_set(NULL);
  cr_assert_eq(a.x, x, "S did not get its solo run back");
  cr_assert(atomic_load(&c->state[k]) == MP_CHUNK_MAPPED &&
            atomic_load(&c->state[k + 1]) == MP_CHUNK_MAPPED);
  memset(a.x, 0x5a, BIG); /* mapped: a fault here is the bug */
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free_async(pool, a.x, S), 0);
  gate_release(&g, S);
  done_unmapped(pool, S);
}
