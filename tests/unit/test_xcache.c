/* test_xcache.c - the thread's extent cache (src/xcache.c): extent blocks
 * a thread frees, kept by granule count for its next requests of about
 * their size.  The pools are capped (64 MiB unless said), so that their
 * blocks from 8 KiB to a chunk are extent blocks; a granule is 4 KiB.
 *
 *   xcache::a_freed_block_serves_the_next_request_of_about_its_size
 *        a 136 KiB block (34 granules) freed is cached; a 136 KiB request
 *        and a 132 KiB one (33: within an eighth) get it back, a 120 KiB
 *        one (30) does not
 *   xcache::a_full_bin_gives_its_oldest_back   nine blocks of one class
 *        freed: eight cached, the first given back; the takes come out
 *        newest first, then the tree's hint finds the first
 *   xcache::the_cache_keeps_within_the_threads_share   thread_cache_bytes
 *        256 KiB: a second 136 KiB block goes back to the tree
 *   xcache::a_thread_exit_gives_its_blocks_back   nothing stays cached
 *        once the thread that cached a block has exited
 *   xcache::the_ladder_takes_an_idle_threads_extent_blocks   a request
 *        for the whole capped pool succeeds while an idle thread's cache
 *        holds extent blocks in its chunks (the out-of-memory promise)
 *   races::thief_waits_for_an_extent_cache_owner_inside   that ladder's
 *        thief meets the owner stopped inside its put (MP_HOOK_XCACHE_PUT,
 *        the block just kept): it waits, then gives the block back too
 *   races::a_take_that_meets_a_thief_goes_to_the_tree   the owner lets
 *        the waiting thief in and takes again while the thief holds the
 *        record (MP_HOOK_REVOKE_WAIT held): the take backs off to the
 *        tree, not to the bins the thief is about to empty
 *   xcache::a_take_that_would_map_gives_the_cached_blocks_back_first
 *        (X4) the kept chunks full, one block cached: a request it does
 *        not serve gets its granules, not a new chunk
 *   races::a_refused_take_meets_a_thief   the owner stopped between its
 *        refused take and giving its cached blocks back
 *        (MP_HOOK_XCACHE_REFUSED) while the ladder's thief takes them: the
 *        thief's flush leaves nothing counted, and the owner's take then
 *        succeeds
 *
 * Internal headers: links the static archive.
 */
#define _GNU_SOURCE
#include "thread.h" /* internal.h and the thread record */

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "flag.h"
#include "test_util.h"

static magpool_t *capped(size_t max, size_t thread_cache) {
  return mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB, .growth = 1, .max = max,
                             .thread_cache = thread_cache});
}

Test(xcache, a_freed_block_serves_the_next_request_of_about_its_size) {
  magpool_t *pool = capped(64 * MiB, MPT_DEFAULT);
  char *a = magpool_alloc(pool, 136 * KiB);
  cr_assert_not_null(a);
  cr_assert_eq(magpool_usable_size(pool, a), 136 * KiB, "not an extent block");
  cr_assert_eq(magpool_free(pool, a), 0);
  cr_assert_eq(mpt_stats(pool).cached_bytes, 136 * KiB, "the freed block is not cached");
  cr_assert_eq(magpool_check(pool), 0);

  char *b = magpool_alloc(pool, 136 * KiB);
  cr_assert_eq(b, a, "a request of its size did not get the cached block");
  cr_assert_eq(mpt_stats(pool).cached_bytes, 0);
  memset(b, 0x21, 136 * KiB);
  cr_assert_eq(magpool_free(pool, b), 0);

  char *c = magpool_alloc(pool, 132 * KiB); /* 33 granules: 34 is within an eighth */
  cr_assert_eq(c, a, "a request an eighth smaller did not get it");
  cr_assert_eq(magpool_usable_size(pool, c), 136 * KiB, "the block keeps its 34 granules");
  cr_assert_eq(magpool_free_sized(pool, c, 132 * KiB), 0);

  char *d = magpool_alloc(pool, 120 * KiB); /* 30 granules: 34 wastes too much */
  cr_assert_not_null(d);
  cr_assert_neq(d, a, "a 120 KiB request took the 136 KiB block");
  cr_assert_eq(magpool_usable_size(pool, d), 120 * KiB);
  cr_assert_eq(mpt_stats(pool).cached_bytes, 136 * KiB);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, d), 0);
  cr_assert_eq(mpt_stats(pool).cached_bytes, 256 * KiB);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

Test(xcache, a_full_bin_gives_its_oldest_back) {
  /* 16 MiB: the thread's share (pool_size / 8) holds a full bin. */
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB, .growth = 1, .max = 64 * MiB});
  void *x[MP_XCAP + 1];
  for (unsigned i = 0; i <= MP_XCAP; i++) cr_assert_not_null(x[i] = magpool_alloc(pool, 136 * KiB));
  for (unsigned i = 0; i <= MP_XCAP; i++) cr_assert_eq(magpool_free(pool, x[i]), 0);
  cr_assert_eq(mpt_stats(pool).cached_bytes, MP_XCAP * 136 * KiB, "not a full bin cached");
  cr_assert_eq(magpool_check(pool), 0);
  for (unsigned i = MP_XCAP; i >= 1; i--)
    cr_assert_eq(magpool_alloc(pool, 136 * KiB), x[i], "take %u: not the newest", MP_XCAP - i);
  cr_assert_eq(mpt_stats(pool).cached_bytes, 0);
  /* The bin is empty: the tree, whose hint is the block given back last. */
  cr_assert_eq(magpool_alloc(pool, 136 * KiB), x[0], "the oldest did not go back to the tree");
  mpt_free_all_done(pool, x, MP_XCAP + 1);
}

Test(xcache, the_cache_keeps_within_the_threads_share) {
  magpool_t *pool = capped(64 * MiB, 256 * KiB);
  void *a = magpool_alloc(pool, 136 * KiB), *b = magpool_alloc(pool, 136 * KiB);
  cr_assert(a != NULL && b != NULL);
  cr_assert_eq(magpool_free(pool, a), 0);
  cr_assert_eq(magpool_free(pool, b), 0);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.cached_bytes, 136 * KiB, "cached %zu of a 256 KiB share", s.cached_bytes);
  cr_assert_eq(magpool_check(pool), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

typedef struct worker {
  magpool_t *pool;
  size_t size;
  unsigned n;
  void *p[16];
  flag cached, done;
  bool stop_in_put, take_after; /* take_after: one more block once cached */
  void *got;
} worker;

static _Thread_local int stop_at; /* the hook point this thread stops at, once (0: none) */
static flag stopped = FLAG_INIT, go = FLAG_INIT, took = FLAG_INIT;
static _Atomic int thief_waited;
static bool thief_waits_for_the_take;

static void hook(int point, void *arg) {
  (void)arg;
  if (point == stop_at) {
    stop_at = 0;
    flag_set(&stopped);
    flag_wait(&go);
  } else if (point == MP_HOOK_REVOKE_WAIT && !atomic_exchange(&thief_waited, 1)) {
    flag_set(&go); /* the thief waits for the owner: let it out */
    if (thief_waits_for_the_take) flag_wait(&took); /* and hold the record meanwhile */
  }
}

/* Allocates n blocks of `size`, frees them (the last one stopped inside
 * the put when stop_in_put), says so, and waits for `done`. */
static void *cache_some(void *arg) {
  worker *w = arg;
  for (unsigned i = 0; i < w->n; i++) w->p[i] = magpool_alloc(w->pool, w->size);
  for (unsigned i = 0; i < w->n; i++) {
    stop_at = w->stop_in_put && i + 1 == w->n ? MP_HOOK_XCACHE_PUT : 0;
    magpool_free(w->pool, w->p[i]);
  }
  if (w->take_after) {
    w->got = magpool_alloc(w->pool, w->size);
    flag_set(&took);
  }
  flag_set(&w->cached);
  flag_wait(&w->done);
  return NULL;
}

/* Starts w's thread stopped inside the put of its last block
 * (stop_in_put), asks for the whole 8 MiB cap so that the ladder's thief
 * meets that owner, and waits until the thread is done caching.  Returns
 * the request's block, or NULL. */
static void *steal_from_an_owner_in_put(worker *w, pthread_t *th) {
  mp_hook_set(hook);
  cr_assert_eq(pthread_create(th, NULL, cache_some, w), 0);
  flag_wait(&stopped);
  void *all = magpool_alloc(w->pool, 8 * MiB);
  flag_wait(&w->cached);
  mp_hook_set(NULL);
  cr_assert_eq(atomic_load(&thief_waited), 1, "the thief never waited for the owner");
  return all;
}

/* Lets w's thread exit, then checks that the pool is empty and ends it. */
static void finish(worker *w, pthread_t th) {
  flag_set(&w->done);
  pthread_join(th, NULL);
  mpt_assert_all_free(w->pool);
  mpt_pool_done(w->pool);
}

Test(xcache, a_thread_exit_gives_its_blocks_back) {
  magpool_t *pool = capped(64 * MiB, MPT_DEFAULT);
  worker w = {.pool = pool, .size = 136 * KiB, .n = 3, .cached = FLAG_INIT, .done = FLAG_INIT};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cache_some, &w), 0);
  flag_wait(&w.cached);
  for (unsigned i = 0; i < w.n; i++) cr_assert_not_null(w.p[i]);
  cr_assert_eq(mpt_stats(pool).cached_bytes, 3 * 136 * KiB, "the worker caches nothing");
  flag_set(&w.done);
  pthread_join(th, NULL);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.cached_bytes, 0, "%zu bytes cached after the thread's exit", s.cached_bytes);
  cr_assert_eq(s.used_bytes, 0);
  cr_assert_eq(magpool_check(pool), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* A pool capped at 8 MiB; the worker's three cached 136 KiB blocks keep a
 * chunk busy; the whole cap is free only if they go back. */
Test(xcache, the_ladder_takes_an_idle_threads_extent_blocks, .timeout = 60) {
  magpool_t *pool = capped(8 * MiB, MPT_DEFAULT);
  worker w = {.pool = pool, .size = 136 * KiB, .n = 3, .cached = FLAG_INIT, .done = FLAG_INIT};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cache_some, &w), 0);
  flag_wait(&w.cached);
  cr_assert_eq(mpt_stats(pool).cached_bytes, 3 * 136 * KiB);
  void *all = magpool_alloc(pool, 8 * MiB);
  cr_assert_not_null(all, "ENOMEM (%s) while an idle thread caches extent blocks",
                     magpool_strerror(magpool_last_error()));
  cr_assert_eq(mpt_stats(pool).cached_bytes, 0);
  memset(all, 0x7e, 8 * MiB);
  cr_assert_eq(magpool_free(pool, all), 0);
  finish(&w, th); /* the owner finds its bins emptied */
}

Test(races, thief_waits_for_an_extent_cache_owner_inside, .timeout = 60) {
  magpool_t *pool = capped(8 * MiB, MPT_DEFAULT);
  worker w = {.pool = pool, .size = 136 * KiB, .n = 2, .cached = FLAG_INIT, .done = FLAG_INIT,
              .stop_in_put = true};
  pthread_t th;
  /* The owner is stopped inside its put, both blocks in its bin.  The
   * ladder's thief must wait for it (the hook lets it out then), and take
   * both blocks after, the one just kept included. */
  void *all = steal_from_an_owner_in_put(&w, &th);
  cr_assert_not_null(all, "ENOMEM (%s) with the owner's blocks cached",
                     magpool_strerror(magpool_last_error()));
  cr_assert_eq(mpt_stats(pool).cached_bytes, 0);
  cr_assert_eq(magpool_free(pool, all), 0);
  finish(&w, th);
}

Test(races, a_take_that_meets_a_thief_goes_to_the_tree, .timeout = 60) {
  magpool_t *pool = capped(8 * MiB, MPT_DEFAULT);
  thief_waits_for_the_take = true;
  worker w = {.pool = pool, .size = 136 * KiB, .n = 2, .cached = FLAG_INIT, .done = FLAG_INIT,
              .stop_in_put = true, .take_after = true};
  pthread_t th;
  /* The ladder's thief announces, finds the owner inside and waits; the
   * hook lets the owner out and holds the thief until the owner's next
   * take has run.  That take must not enter the bins: the tree serves it.
   * The whole cap then does not fit beside its live block. */
  void *all = steal_from_an_owner_in_put(&w, &th);
  cr_assert_not_null(w.got, "the owner's take failed");
  cr_assert(w.got != w.p[0] && w.got != w.p[1], "the take used a bin the thief held");
  cr_assert_eq(magpool_usable_size(pool, w.got), 136 * KiB);
  cr_assert_null(all, "the whole cap, while the owner holds a live block");
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_eq(mpt_stats(pool).cached_bytes, 0, "the thief left the bins full");
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, w.got), 0);
  finish(&w, th);
}

/* Sixteen 256 KiB extent blocks fill the two chunks pool_size keeps. */
static void fill_kept_chunks(magpool_t *pool, char *x[16]) {
  for (unsigned i = 0; i < 16; i++) cr_assert_not_null(x[i] = magpool_alloc(pool, 256 * KiB));
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 4 * MiB, "the blocks did not fill the kept chunks");
}

/* The pool may grow to 64 MiB.  A 200 KiB request (50 granules) is not
 * served by the cached 256 KiB block (64: past an eighth), and no mapped
 * chunk has room: the old take mapped a third chunk beside the cached
 * block's granules. */
Test(xcache, a_take_that_would_map_gives_the_cached_blocks_back_first) {
  magpool_t *pool = capped(64 * MiB, MPT_DEFAULT);
  char *x[16];
  fill_kept_chunks(pool, x);
  cr_assert_eq(magpool_free(pool, x[5]), 0);
  cr_assert_eq(mpt_stats(pool).cached_bytes, 256 * KiB, "the freed block is not cached");
  char *c = magpool_alloc(pool, 200 * KiB);
  cr_assert_not_null(c);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.reserved_bytes, 4 * MiB, "%zu bytes reserved: a chunk was mapped while the thread "
               "cached a block with room", s.reserved_bytes);
  cr_assert(c >= x[5] && c < x[5] + 256 * KiB, "the request did not get the cached block's granules");
  cr_assert_eq(s.cached_bytes, 0, "the cached block did not go back");
  cr_assert_eq(magpool_check(pool), 0);
  memset(c, 0x3c, 200 * KiB);
  cr_assert_eq(magpool_free(pool, c), 0);
  for (unsigned i = 0; i < 16; i++)
    if (i != 5) cr_assert_eq(magpool_free(pool, x[i]), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

typedef struct refuser {
  magpool_t *pool;
  char *x[16], *got;
  mp_tcache *tc;
  flag done;
} refuser;

/* Fills the kept chunks, caches x[5], then asks for 200 KiB, stopped
 * after the take was refused. */
static void *refuse_a_take(void *arg) {
  refuser *r = arg;
  fill_kept_chunks(r->pool, r->x);
  r->tc = mp_tcache_get(r->pool);
  magpool_free(r->pool, r->x[5]);
  stop_at = MP_HOOK_XCACHE_REFUSED;
  r->got = magpool_alloc(r->pool, 200 * KiB);
  flag_wait(&r->done);
  return NULL;
}

/* A pool capped at its 4 MiB.  The owner's take is refused (a third chunk
 * would be mapped), and before it gives its cached block back, another
 * thread's 256 KiB request finds the cap full: its ladder steals the
 * owner's record, whose block it gets.  The owner then finds its bins
 * empty and takes what that thread gave back. */
Test(races, a_refused_take_meets_a_thief, .timeout = 60) {
  magpool_t *pool = capped(4 * MiB, MPT_DEFAULT);
  refuser r = {.pool = pool, .done = FLAG_INIT};
  mp_hook_set(hook);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, refuse_a_take, &r), 0);
  flag_wait(&stopped);
  cr_assert_eq(mp_load_relaxed(&r.tc->xheld), 1, "the owner's block is not cached");
  void *b = magpool_alloc(pool, 256 * KiB);
  cr_assert_not_null(b, "ENOMEM (%s) with the owner's block cached",
                     magpool_strerror(magpool_last_error()));
  cr_assert_eq((char *)b, r.x[5], "the thief did not give the owner's block back");
  cr_assert_eq(mp_load_relaxed(&r.tc->xheld), 0, "the thief's flush left the count");
  cr_assert_eq(mpt_stats(pool).cached_bytes, 0);
  cr_assert_eq(magpool_free(pool, b), 0);
  cr_assert_eq(magpool_trim(pool), 0); /* this thread's cache: b back to the tree */
  flag_set(&go);
  flag_set(&r.done);
  pthread_join(th, NULL);
  mp_hook_set(NULL);
  cr_assert_not_null(r.got, "the owner's take failed after the thief emptied its bins");
  cr_assert(r.got >= r.x[5] && r.got < r.x[5] + 256 * KiB, "the owner's take mapped past the cap");
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, r.got), 0);
  for (unsigned i = 0; i < 16; i++)
    if (i != 5) cr_assert_eq(magpool_free(pool, r.x[i]), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}
