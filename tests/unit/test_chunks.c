/* test_chunks.c - the chunk map (chunk.c) and the runs (runs.c) of a
 * chunked HOST pool, and the two windows where a take and an unmap meet.
 *
 *   chunks::maps_on_demand_then_trims   memory is mapped as blocks need
 *        it, counted in reserved_bytes, and trim unmaps down to pool_size
 *   chunks::runs_reuse_mapped_chunks    a run freed and asked for again
 *        comes back where its chunks are still mapped: nothing is mapped
 *   chunks::a_run_given_back_over_the_release_threshold_is_unmapped
 *        release_threshold 0 unmaps a freed run's chunks above pool_size
 *        at its give; without a threshold they stay mapped
 *   chunks::cap_is_kept_by_moving       under max_pool_size, a request
 *        that needs new chunks moves empty ones; beyond, ENOMEM
 *   chunks::usable_size_is_whole_chunks a run's usable size and alignment
 *   chunks::run_headers_are_per_chunk   run space keeps one header per
 *        chunk (types.h): a run's interior pointers, a chunk into it
 *        included, are refused and change nothing; a run whose slack needs
 *        the big-slack words frees sized; a run next to it keeps its own
 *   races::take_counted_before_unmap    a take stopped after counting its
 *        chunk busy, before reading its state (MP_HOOK_CHUNK_TAKE), while
 *        trim unmaps empty chunks: the chunk stays mapped
 *   races::unmap_sees_a_late_take       trim stopped with the chunk marked
 *        UNMAPPING (MP_HOOK_CHUNK_UNMAP) while a take counts it busy: the
 *        unmap backs off, and the take gets mapped memory
 *   chunks::growth_maps_groups          growth maps MP_CHUNK_GROUP-aligned
 *        groups, unmapped only whole; a move maps a chunk each under a cap
 *        of the user's and in a fixed pool
 *   chunks::a_move_maps_whole_windows_of_what_it_moved_as_one_piece   a
 *        take that moves and grows maps each whole MP_MOVE_GROUP-aligned
 *        window of what it moved as one piece, the moved chunks outside
 *        such windows a chunk each, and its growth a piece per
 *        MP_CHUNK_GROUP-aligned window
 *   chunks::a_take_that_moves_leaves_nothing_kept   through a host source
 *        that keeps what a move unmaps (as the DEVICE source does): no
 *        piece is left kept after any take, and some move's group map
 *        reuses a group the same take kept
 *   chunks::a_capped_pool_can_move_every_empty_chunk   under max_pool_size
 *        growth maps a chunk each: a run freed and then partly reused
 *        leaves empty chunks that a take at the cap can still move; with
 *        chunk_groups = 1 the same pool maps groups again
 *   chunks::a_capped_pool_packs_tree_blocks_into_the_fullest_chunk
 *        under max_pool_size a tree block goes to the fullest busy chunk
 *        with room; uncapped, to the tree's lowest free block
 *   races::a_pack_whose_block_is_taken_meanwhile   a pack stopped after
 *        finding a block (MP_HOOK_PACK_FOUND) that another take claims:
 *        it takes its next candidate chunk instead
 *   extents::a_block_takes_only_the_granules_it_needs   capped, three
 *        576 KiB blocks share a chunk, 576 KiB usable each, and fifteen
 *        of 136 KiB; uncapped, 576 KiB is 1 MiB
 *   extents::no_cache_and_chunk_groups_means_no_extent_blocks   with
 *        no thread cache, an uncapped pool's 576 KiB block is 1 MiB, a
 *        capped one's 576 KiB
 *   extents::a_take_tries_the_granules_just_given_back_first   the
 *        last extent block given back serves a request within an eighth
 *        of it before the chunk's smallest row; once taken, the row
 *   extents::the_checker_sees_a_piece_freed_under_a_live_block   E3
 *   races::an_extent_whose_piece_is_taken_meanwhile   an extent take
 *        stopped after finding its row (MP_HOOK_EXTENT_FOUND) loses a
 *        piece to another take: it gives back the pieces it claimed and
 *        takes an aligned block instead
 *   races::a_take_whose_given_back_granules_are_taken_meanwhile   a
 *        take stopped after reading the last given-back block's hint
 *        loses its granules to another take: it claims nothing there and
 *        takes the chunk's smallest row
 *   chunks::the_budget_maps_within_its_slack_before_moving   a take
 *        below the high-water mark that needs new chunks maps them, not
 *        moves, while the pool stays within the mark plus 1.5 % of it
 *   chunks::without_groups_the_slack_is_a_chunk   on a pool without
 *        chunk groups the mark plus one chunk: the same kind of take moves
 *   races::group_take_counted_before_unmap   as the first race, but the
 *        take counts one chunk of a group and trim looks at another: the
 *        whole group stays mapped
 *   races::group_unmap_sees_a_late_take      as the second, across a
 *        group: trim stopped with every chunk of the group UNMAPPING, a
 *        take counts another chunk of it: the unmap backs off for all
 *   chunks::a_row_of_empty_groups_goes_in_one_call   adjacent empty
 *        groups are unmapped with one source call; a busy group between
 *        them splits the row
 *   races::every_row_is_marked_before_any_re_read   trim stopped at the
 *        last of two rows it marks: the first is not unmapped yet; a take
 *        counts the last one busy: it stays, the first goes
 *   races::a_row_keeps_a_group_taken_in_its_window   trim stopped with a
 *        row of three groups UNMAPPING, a take counts the lowest: the row
 *        unmaps the other two with one call and the take's group stays
 * The first two take a block below a chunk (busy counts by RMW), the
 * group and row ones a run (run space: busy by stores and mp_asym_light
 * against trim's membarrier).
 *
 * Every test ends with magpool_check (tree, chunk map C1-C6, runs).
 * Internal headers: links the static archive.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include "flag.h"
#include "test_util.h"

#define CHUNK (2 * MiB)

static magpool_t *chunked_pool(size_t pool_size, size_t max) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = pool_size, .growth = 1, .max = max,
                                        .thread_cache = MPT_ZERO, .stream_cache = MPT_ZERO});
  cr_assert_not_null(pool->chunks, "a %zu-byte host pool is not chunked", pool_size);
  return pool;
}

Test(chunks, maps_on_demand_then_trims) {
  magpool_t *pool = chunked_pool(4 * MiB, 64 * MiB);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.reserved_bytes, 4 * MiB);
  cr_assert_eq(s.chunk_maps, 2);
  void *p = magpool_alloc(pool, 10 * MiB); /* a run of 5 chunks */
  cr_assert_not_null(p);
  memset(p, 0x5a, 10 * MiB);
  s = mpt_stats(pool);
  cr_assert_geq(s.reserved_bytes, 10 * MiB);
  cr_assert_leq(s.reserved_bytes, 14 * MiB);
  cr_assert_eq(s.peak_reserved_bytes, s.reserved_bytes);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, p), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  s = mpt_stats(pool);
  cr_assert_eq(s.reserved_bytes, 4 * MiB, "trim left %zu bytes mapped", s.reserved_bytes);
  cr_assert_geq(s.chunk_unmaps, 3);
  cr_assert_geq(s.peak_reserved_bytes, 10 * MiB);
  cr_assert_eq(magpool_reset_peaks(pool), 0);
  cr_assert_eq(mpt_stats(pool).peak_reserved_bytes, 4 * MiB);
  mpt_pool_done(pool);
}

/* pool_size is mapped where lowest-first placement goes first: 8 chunks
 * under the tree, the rest at the bottom of the run space.  A growing
 * 64 MiB pool (32 chunks) serves small blocks and a run of its 24 run
 * chunks with no move and no map; the next run creates (the budget
 * allows: the mark rose to 26 busy chunks) rather than moving the tree's
 * empty ones.  With all of pool_size under the tree, the run moved 24. */
static uint64_t chunk_index(magpool_t *pool, const void *p);

Test(chunks, pool_size_is_mapped_where_blocks_go) {
  magpool_t *pool = chunked_pool(64 * MiB, 0);
  mp_chunks *c = pool->chunks;
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 64 * MiB);
  void *s[64];
  for (int i = 0; i < 64; i++) cr_assert_not_null(s[i] = magpool_alloc(pool, 64 * KiB));
  void *r = magpool_alloc(pool, 48 * MiB);
  cr_assert_not_null(r);
  cr_assert_eq(chunk_index(pool, r), c->run0, "the run is not at the bottom of the run space");
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_eq(st.chunk_moves, 0, "%llu chunks moved", (unsigned long long)st.chunk_moves);
  cr_assert_eq(st.chunk_maps, 32, "%llu chunks mapped", (unsigned long long)st.chunk_maps);
  for (int i = 0; i < 64; i++)
    cr_assert_lt(chunk_index(pool, s[i]), MP_KEEP_TREE, "a small block above the tree's chunks");
  void *r2 = magpool_alloc(pool, 4 * MiB);
  cr_assert_not_null(r2);
  st = mpt_stats(pool);
  cr_assert_eq(st.chunk_moves, 0, "the second run moved %llu chunks", (unsigned long long)st.chunk_moves);
  cr_assert_eq(st.reserved_bytes, 68 * MiB);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, r2), 0);
  cr_assert_eq(magpool_free(pool, r), 0);
  for (int i = 0; i < 64; i++) cr_assert_eq(magpool_free(pool, s[i]), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 64 * MiB);
  mpt_pool_done(pool);
}

Test(chunks, runs_reuse_mapped_chunks) {
  magpool_t *pool = chunked_pool(4 * MiB, 0);
  void *a = magpool_alloc(pool, 7 * MiB);
  void *b = magpool_alloc(pool, 3 * MiB);
  cr_assert(a != NULL && b != NULL);
  cr_assert_eq(magpool_free(pool, a), 0);
  uint64_t maps = mpt_stats(pool).chunk_maps;
  void *c = magpool_alloc(pool, 7 * MiB);
  cr_assert_eq(c, a, "the freed run's mapped chunks were not reused");
  cr_assert_eq(mpt_stats(pool).chunk_maps, maps, "a warm reuse mapped memory");
  memset(c, 1, 7 * MiB);
  cr_assert_eq(magpool_free(pool, c), 0);
  cr_assert_eq(magpool_free(pool, b), 0);
  cr_assert_eq(magpool_check(pool), 0);
  mpt_pool_done(pool);
}

/* release_threshold 0: the give of a run unmaps its chunks above
 * pool_size at once (once the runs have counted them down: asked
 * before, it saw them busy and unmapped half); with the default (no
 * threshold) they stay mapped until a trim. */
Test(chunks, a_run_given_back_over_the_release_threshold_is_unmapped) {
  for (int keep_all = 0; keep_all < 2; keep_all++) {
    magpool_config_t cfg;
    magpool_config_init(&cfg);
    cfg.kind = MAGPOOL_MEM_HOST;
    cfg.pool_size = 4 * MiB;
    cfg.allow_growth = 1;
    cfg.thread_cache_bytes = 0;
    cfg.stream_cache_bytes = 0;
    cfg.release_threshold = keep_all ? SIZE_MAX : 0;
    cfg.chunk_groups = 0; /* a chunk each: a group would go whole */
    magpool_t *pool = NULL;
    cr_assert_eq(magpool_create(&cfg, &pool), 0);
    cr_assert_not_null(pool->chunks);
    void *r = magpool_alloc(pool, 8 * MiB);
    cr_assert_not_null(r);
    memset(r, 1, 8 * MiB);
    cr_assert_geq(mpt_stats(pool).reserved_bytes, 8 * MiB);
    cr_assert_eq(magpool_free(pool, r), 0);
    size_t res = mpt_stats(pool).reserved_bytes;
    if (keep_all) cr_assert_geq(res, 8 * MiB, "no threshold, yet %zu bytes stay mapped", res);
    else cr_assert_eq(res, 4 * MiB, "threshold 0, yet %zu bytes stay mapped", res);
    cr_assert_eq(magpool_check(pool), 0);
    mpt_pool_done(pool);
  }
}

Test(chunks, cap_is_kept_by_moving) {
  magpool_t *pool = chunked_pool(2 * MiB, 8 * MiB);
  /* Two 1 MiB buddy blocks fill chunk 0; a 4 MiB run takes two chunks. */
  void *x = magpool_alloc(pool, 1 * MiB), *y = magpool_alloc(pool, 1 * MiB);
  void *r = magpool_alloc(pool, 4 * MiB);
  cr_assert(x != NULL && y != NULL && r != NULL);
  cr_assert_eq(magpool_free(pool, r), 0);
  /* 6 MiB: three chunks; one more may be created (cap 4 chunks), the
   * run's two empty ones are reused or moved. */
  void *big = magpool_alloc(pool, 6 * MiB);
  cr_assert_not_null(big, "%s", magpool_strerror(magpool_last_error()));
  memset(big, 2, 6 * MiB);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_leq(s.reserved_bytes, 8 * MiB);
  cr_assert_leq(s.peak_reserved_bytes, 8 * MiB);
  /* Nothing more fits: 2 MiB live in chunk 0, 6 MiB in the run. */
  cr_assert_null(magpool_alloc(pool, 64));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_null(magpool_alloc(pool, 2 * MiB));
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, big), 0);
  cr_assert_eq(magpool_free(pool, x), 0);
  cr_assert_eq(magpool_free(pool, y), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

Test(chunks, usable_size_is_whole_chunks) {
  magpool_t *pool = chunked_pool(4 * MiB, 0);
  void *p = magpool_alloc(pool, 5 * MiB + 1);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_usable_size(pool, p), 6 * MiB);
  cr_assert_eq((uintptr_t)p % CHUNK, 0);
  memset(p, 3, 6 * MiB);
  cr_assert_eq(magpool_free_sized(pool, p, 5 * MiB), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_sized(pool, p, 5 * MiB + 1), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

Test(chunks, run_headers_are_per_chunk) {
  magpool_t *pool = chunked_pool(4 * MiB, 0);
  const size_t big = 65 * MiB + 1; /* order 128 MiB: slack over MP_HDR_BIG */
  char *p = magpool_alloc(pool, big);
  char *q = magpool_alloc(pool, 3 * MiB);
  cr_assert(p != NULL && q != NULL);
  cr_assert_geq(mp_block_bytes(pool, 21) - big, (size_t)MP_HDR_BIG, "the test needs a big slack");
  cr_assert_eq(magpool_usable_size(pool, p), 66 * MiB);
  magpool_stats_t a = mpt_stats(pool);
  const size_t in[] = {64, CHUNK, 2 * CHUNK, 32 * MiB, 64 * MiB};
  for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
    cr_assert_eq(magpool_usable_size(pool, p + in[i]), 0, "p + %zu", in[i]);
    cr_assert_eq(magpool_free(pool, p + in[i]), MAGPOOL_EINVAL, "p + %zu freed", in[i]);
  }
  cr_assert_eq(magpool_free(pool, q + CHUNK), MAGPOOL_EINVAL);
  mpt_assert_same_stats(a, mpt_stats(pool), "freeing a run's interior pointers");
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free_sized(pool, p, big - 1), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_sized(pool, p, big), 0);
  cr_assert_eq(magpool_free(pool, p), MAGPOOL_EINVAL, "a run freed twice");
  cr_assert_eq(magpool_usable_size(pool, q), 4 * MiB);
  cr_assert_eq(magpool_free_sized(pool, q, 3 * MiB), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* ================================================================ races */

static char *race_chunk;      /* the chunk (a pack: the block) the window is on */
static int race_point;        /* MP_HOOK_CHUNK_TAKE, _UNMAP or PACK_FOUND */
static _Thread_local int race_stop_me;
static flag race_stopped = FLAG_INIT, race_resume = FLAG_INIT;

static void race_hook(int point, void *arg) {
  if (point != race_point || arg != race_chunk || !race_stop_me) return;
  race_stop_me = 0;
  flag_set(&race_stopped);
  flag_wait(&race_resume);
}

typedef struct taker {
  magpool_t *pool;
  void *got;
  int stop;
  size_t size;
} taker;

static void *take_block(void *arg) {
  taker *t = arg;
  race_stop_me = t->stop;
  t->got = magpool_alloc(t->pool, t->size);
  if (t->got != NULL) memset(t->got, 7, t->size); /* faults if unmapped */
  return NULL;
}

/* Starts t's take in a thread of its own and returns once it stopped at
 * hook `point` with argument `at` (a find, not yet claimed). */
static pthread_t take_stopped_at(taker *t, int point, void *at) {
  race_chunk = at;
  race_point = point;
  mp_hook_set(race_hook);
  pthread_t th;
  pthread_create(&th, NULL, take_block, t);
  flag_wait(&race_stopped);
  return th;
}

static void race_reset(void);

/* Lets the thread stopped at the hook go on, waits for it, and clears
 * the window (a taker's block is then in its got). */
static void resume_stopped(pthread_t th) {
  flag_set(&race_resume);
  pthread_join(th, NULL);
  race_reset();
}

static void *trim_it(void *arg) {
  race_stop_me = 1;
  magpool_trim(arg);
  return NULL;
}

/* Chunk 0 full with two 1 MiB blocks, a third in chunk 1, freed: chunk 1
 * is empty and mapped above pool_size, what trim unmaps.  Returns it. */
static char *empty_chunk_above(magpool_t *pool, void **x, void **y) {
  *x = magpool_alloc(pool, 1 * MiB);
  *y = magpool_alloc(pool, 1 * MiB);
  void *z = magpool_alloc(pool, 1 * MiB);
  cr_assert(*x != NULL && *y != NULL && z != NULL);
  char *ch = (char *)((uintptr_t)z & ~(uintptr_t)(CHUNK - 1));
  cr_assert_neq(ch, (char *)((uintptr_t)*x & ~(uintptr_t)(CHUNK - 1)));
  cr_assert_eq(magpool_free(pool, z), 0);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 4 * MiB);
  return ch;
}

static void race_reset(void) {
  mp_hook_set(NULL);
  race_stopped = (flag)FLAG_INIT;
  race_resume = (flag)FLAG_INIT;
}

Test(races, take_counted_before_unmap) {
  magpool_t *pool = chunked_pool(2 * MiB, 0);
  void *x, *y;
  race_chunk = empty_chunk_above(pool, &x, &y);
  race_point = MP_HOOK_CHUNK_TAKE;
  mp_hook_set(race_hook);
  taker t = {pool, NULL, 1, 1 * MiB};
  pthread_t th;
  pthread_create(&th, NULL, take_block, &t);
  flag_wait(&race_stopped); /* busy counted, state not read */
  uint64_t unmaps = mpt_stats(pool).chunk_unmaps;
  cr_assert_eq(magpool_trim(pool), 0); /* may unmap only empty chunks */
  cr_assert_eq(mpt_stats(pool).chunk_unmaps, unmaps, "trim unmapped a chunk a take had counted");
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 4 * MiB);
  resume_stopped(th);
  cr_assert_not_null(t.got);
  cr_assert_eq((char *)((uintptr_t)t.got & ~(uintptr_t)(CHUNK - 1)), race_chunk);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, t.got), 0);
  cr_assert_eq(magpool_free(pool, x), 0);
  cr_assert_eq(magpool_free(pool, y), 0);
  mpt_assert_all_free(pool);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 2 * MiB);
  mpt_pool_done(pool);
}

Test(races, unmap_sees_a_late_take) {
  magpool_t *pool = chunked_pool(2 * MiB, 0);
  void *x, *y;
  race_chunk = empty_chunk_above(pool, &x, &y);
  race_point = MP_HOOK_CHUNK_UNMAP;
  mp_hook_set(race_hook);
  pthread_t tr, th;
  pthread_create(&tr, NULL, trim_it, pool);
  flag_wait(&race_stopped); /* the chunk is UNMAPPING, busy not re-read */
  taker t = {pool, NULL, 0, 1 * MiB};
  pthread_create(&th, NULL, take_block, &t);
  /* The take counts the chunk busy, sees it is not MAPPED, and waits for
   * the lock the stopped unmap holds. */
  uint64_t idx = (uint64_t)(race_chunk - pool->chunks->base) >> pool->chunks->shift;
  while (mp_load_seq_cst(&pool->chunks->busy[idx]) == 0) sched_yield();
  flag_set(&race_resume);
  pthread_join(tr, NULL);
  pthread_join(th, NULL);
  race_reset();
  cr_assert_not_null(t.got);
  cr_assert_eq(mp_load_relaxed(&pool->chunks->state[idx]), MP_CHUNK_MAPPED);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, t.got), 0);
  cr_assert_eq(magpool_free(pool, x), 0);
  cr_assert_eq(magpool_free(pool, y), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* ================================================================ groups */

static uint64_t chunk_index(magpool_t *pool, const void *p) {
  return (uint64_t)((const char *)p - pool->chunks->base) >> pool->chunks->shift;
}

/* Chunk 0 (pool_size) holds *x, so that trim finds no other empty chunk;
 * a run of MP_CHUNK_GROUP chunks mapped by growth, then freed: one empty
 * group above pool_size.  Returns its first chunk's index. */
static uint64_t empty_group_above(magpool_t *pool, void **x) {
  mp_chunks *c = pool->chunks;
  *x = magpool_alloc(pool, 1 * MiB);
  cr_assert_not_null(*x);
  void *b = magpool_alloc(pool, MP_CHUNK_GROUP * CHUNK);
  cr_assert_not_null(b);
  uint64_t g = chunk_index(pool, b);
  cr_assert_eq(g % MP_CHUNK_GROUP, 0, "the run does not start a group window");
  cr_assert_eq(c->glen[g], MP_CHUNK_GROUP, "growth mapped %u chunks as one group, not %u",
               c->glen[g], MP_CHUNK_GROUP);
  for (uint64_t k = g; k < g + MP_CHUNK_GROUP; k++) cr_assert_eq(c->gfirst[k], g);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, b), 0);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, (1 + MP_CHUNK_GROUP) * CHUNK);
  return g;
}

Test(chunks, growth_maps_groups) {
  magpool_t *pool = chunked_pool(2 * MiB, 0);
  void *x;
  uint64_t g = empty_group_above(pool, &x);
  /* Trim unmaps the group whole: one source call, every chunk of it. */
  uint64_t unmaps = mpt_stats(pool).chunk_unmaps;
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(mpt_stats(pool).chunk_unmaps - unmaps, MP_CHUNK_GROUP);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 2 * MiB);
  for (uint64_t k = g; k < g + MP_CHUNK_GROUP; k++)
    cr_assert_eq(mp_load_relaxed(&pool->chunks->state[k]), MP_CHUNK_UNMAPPED);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, x), 0);
  mpt_pool_done(pool);

  /* Under a cap of pool_size, every chunk beyond it comes by a move: a
   * chunk each, so that moves unmap what they map. */
  pool = chunked_pool(8 * MiB, 8 * MiB);
  void *a = magpool_alloc(pool, 4 * MiB), *b = magpool_alloc(pool, 4 * MiB);
  cr_assert(a != NULL && b != NULL);
  cr_assert_eq(magpool_free(pool, a), 0);
  cr_assert_eq(magpool_free(pool, b), 0);
  void *r = magpool_alloc(pool, 6 * MiB);
  cr_assert_not_null(r);
  for (uint64_t k = chunk_index(pool, r), n = 0; n < 3; k++, n++)
    cr_assert_eq(pool->chunks->glen[k], 1, "a chunk mapped by a move is in a group");
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 8 * MiB);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, r), 0);
  mpt_pool_done(pool);

  /* A fixed pool (no growth, no cap of the user's: chunk_groups on) maps
   * its runs by moves of its pool_size chunks, a chunk each: a group with
   * one busy chunk would pin the others, and it cannot grow past them.
   * Its 16 chunks: 8 under the tree, 8 at the bottom of the run space, so
   * a run of 12 moves 4. */
  pool = mpt_pool(&(mpt_cfg){.pool_size = 32 * MiB, .thread_cache = MPT_ZERO,
                             .stream_cache = MPT_ZERO});
  cr_assert(pool->chunks != NULL && pool->cfg.chunk_groups == 1);
  r = magpool_alloc(pool, 24 * MiB);
  cr_assert_not_null(r);
  cr_assert_eq(mpt_stats(pool).chunk_moves, 4, "the run moved %llu chunks",
               (unsigned long long)mpt_stats(pool).chunk_moves);
  for (uint64_t k = chunk_index(pool, r), n = 0; n < 12; k++, n++)
    cr_assert_eq(pool->chunks->glen[pool->chunks->gfirst[k]], 1,
                 "a fixed pool's move mapped chunk %lu in a group", (unsigned long)n);
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 32 * MiB);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, r), 0);
  mpt_pool_done(pool);
}

/* A take over the budget that both moves chunks and grows maps as many
 * chunks one each as it moved, and the rest in groups: a run of 16
 * chunks freed next to a live one of 8, then a run of 20 that fits only
 * past them (budget: 24 busy + 8 slack). */
/* The pieces a take that moves m chunks and grows the rest maps for its
 * row [k0, k0 + n): what chunk.c's map_run promises, written out. */
static void expect_piece(uint64_t k, uint64_t k0, uint64_t n, uint64_t m, uint64_t *first,
                         uint64_t *len) {
  uint64_t w = k < k0 + m ? MP_MOVE_GROUP : MP_CHUNK_GROUP;
  uint64_t lo = k < k0 + m ? k0 : k0 + m, hi = k < k0 + m ? k0 + m : k0 + n;
  uint64_t a = k / w * w < lo ? lo : k / w * w, b = (k / w + 1) * w > hi ? hi : (k / w + 1) * w;
  bool whole = k >= k0 + m || b - a == w;
  *first = whole ? a : k;
  *len = whole ? b - a : 1;
}

Test(chunks, a_move_maps_whole_windows_of_what_it_moved_as_one_piece) {
  magpool_t *pool = chunked_pool(2 * MiB, 0);
  mp_chunks *c = pool->chunks;
  void *a = magpool_alloc(pool, 16 * CHUNK), *b = magpool_alloc(pool, 8 * CHUNK);
  cr_assert(a != NULL && b != NULL);
  cr_assert_eq(magpool_free(pool, a), 0);
  uint64_t moves = mpt_stats(pool).chunk_moves;
  void *r = magpool_alloc(pool, 20 * CHUNK);
  cr_assert_not_null(r);
  uint64_t moved = mpt_stats(pool).chunk_moves - moves, k0 = chunk_index(pool, r), pieces = 0;
  cr_assert_geq(moved, MP_MOVE_GROUP + MP_MOVE_GROUP - 1,
                "%lu chunks moved: the test needs a whole move window", (unsigned long)moved);
  cr_assert_lt(moved, 20, "the run needed no growth: the test needs some");
  for (uint64_t k = k0; k < k0 + 20; k++) {
    uint64_t f, n;
    expect_piece(k, k0, 20, moved, &f, &n);
    cr_assert(c->gfirst[k] == f && c->glen[f] == n,
              "chunk %lu: piece at %lu of %u chunks, expected at %lu of %lu (%lu moved)",
              (unsigned long)(k - k0), (unsigned long)(c->gfirst[k] - k0), c->glen[c->gfirst[k]],
              (unsigned long)(f - k0), (unsigned long)n, (unsigned long)moved);
    pieces += c->gfirst[k] == k;
  }
  cr_assert_lt(pieces, 20, "every chunk its own piece");
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, r), 0);
  cr_assert_eq(magpool_free(pool, b), 0);
  mpt_pool_done(pool);
}

/* A host source that keeps what a move unmaps, as the DEVICE source does
 * (the host one has nothing to keep): pieces by size, and what happens to
 * them.  Maps take a kept piece of their size; a group map that finds
 * none frees them all first, as source_vmm.c's does. */
static struct {
  size_t size[256];
  int n, kept_groups, reused_groups, freed, drops;
  magpool_t *pool; /* its groups: a piece per mapping of an unmapped row */
} kp;
static mp_source_ops keeping;

static bool take_kept(size_t bytes) {
  for (int i = 0; i < kp.n; i++)
    if (kp.size[i] == bytes) {
      kp.size[i] = kp.size[--kp.n];
      return true;
    }
  return false;
}
static int keeping_unmap(void *ctx, void *addr, size_t bytes, int keep) {
  int rc = mp_source_host.unmap(ctx, addr, bytes, keep);
  mp_chunks *c = kp.pool->chunks;
  for (char *a = addr; rc == 0 && keep && a < (char *)addr + bytes;) {
    size_t len = (size_t)c->glen[(uint64_t)(a - c->base) >> c->shift] * CHUNK;
    cr_assert_lt(kp.n, 256);
    kp.size[kp.n++] = len;
    kp.kept_groups += len > CHUNK;
    a += len;
  }
  return rc;
}
static int keeping_map(void *ctx, void *addr, size_t bytes) {
  for (size_t off = 0; off < bytes; off += CHUNK) (void)take_kept(CHUNK);
  return mp_source_host.map(ctx, addr, bytes);
}
static int keeping_map_group(void *ctx, void *addr, size_t bytes) {
  if (take_kept(bytes)) {
    kp.reused_groups++;
  } else {
    kp.freed += kp.n;
    kp.n = 0;
  }
  return mp_source_host.map_group(ctx, addr, bytes);
}
static void keeping_drop(void *ctx) {
  (void)ctx;
  kp.drops++;
  kp.freed += kp.n;
  kp.n = 0;
}

/* Every take that moved ends with drop_kept: what its maps did not use
 * is not left with the source, held and uncounted.  Runs of 4 chunks on a
 * growing pool, freed and taken again elsewhere, move in groups of 4:
 * some of them reuse a group a move of the same take kept. */
Test(chunks, a_take_that_moves_leaves_nothing_kept) {
  keeping = mp_source_host;
  keeping.unmap = keeping_unmap;
  keeping.map = keeping_map;
  keeping.map_group = keeping_map_group;
  keeping.drop_kept = keeping_drop;
  memset(&kp, 0, sizeof kp);
  mp_pool_set_source_override(&keeping);
  magpool_t *pool = chunked_pool(2 * MiB, 0);
  mp_pool_set_source_override(NULL);
  cr_assert_eq(pool->src, &keeping);
  kp.pool = pool;
  enum { N = 48 };
  void *p[N] = {0};
  uint64_t moves0 = mpt_stats(pool).chunk_moves;
  /* Runs of 4-6 chunks; each round frees every other one and takes it
   * again one chunk longer, so that the holes are too short and the
   * runs land on unmapped chunks, moving the holes' chunks. */
  for (int round = 0; round < 8; round++) {
    for (int i = round % 2; i < N; i += round == 0 ? 1 : 2) {
      if (p[i] != NULL) cr_assert_eq(magpool_free(pool, p[i]), 0);
      p[i] = magpool_alloc(pool, (size_t)(4 + (i + round) % 3) * CHUNK);
      cr_assert_not_null(p[i]);
      cr_assert_eq(kp.n, 0, "round %d, run %d: %d pieces left kept after the take", round, i,
                   kp.n);
    }
    cr_assert_eq(magpool_check(pool), 0);
  }
  for (int i = 0; i < N; i++) cr_assert_eq(magpool_free(pool, p[i]), 0);
  uint64_t moved = mpt_stats(pool).chunk_moves - moves0;
  cr_assert_gt(moved, 0, "nothing moved: the test needs moves");
  cr_assert_gt(kp.drops, 0, "no take called drop_kept");
  cr_assert_gt(kp.reused_groups, 0, "no move's group map reused a group it kept (%d kept)",
               kp.kept_groups);
  cr_log_info("moved %lu chunks; groups kept %d, reused %d; pieces freed %d; drops %d",
              (unsigned long)moved, kp.kept_groups, kp.reused_groups, kp.freed, kp.drops);
  mpt_pool_done(pool);
}

/* A pool with a max_pool_size maps a chunk each (chunk.c): a run freed
 * and partly reused leaves empty chunks beside a busy one; at the cap, a
 * run that needs new chunks moves them.  In one group they could not
 * move, and the take failed with the memory there.  The tree's chunk is
 * kept busy (s) so that it cannot serve the move instead. */
Test(chunks, a_capped_pool_can_move_every_empty_chunk) {
  magpool_t *pool = chunked_pool(2 * MiB, 16 * CHUNK);
  mp_chunks *c = pool->chunks;
  void *s = magpool_alloc(pool, 64);
  void *x = magpool_alloc(pool, 4 * CHUNK), *y = magpool_alloc(pool, 4 * CHUNK);
  void *z = magpool_alloc(pool, 4 * CHUNK);
  cr_assert(s != NULL && x != NULL && y != NULL && z != NULL);
  uint64_t k0 = chunk_index(pool, x);
  for (uint64_t k = k0; k < k0 + 4; k++)
    cr_assert_eq(c->glen[c->gfirst[k]], 1, "chunk %lu is in a group of %u", (unsigned long)k,
                 c->glen[c->gfirst[k]]);
  cr_assert_eq(magpool_free(pool, x), 0);
  void *w = magpool_alloc(pool, 1 * CHUNK);
  cr_assert_eq(w, x, "the test needs the one-chunk run where the freed run was");
  cr_assert_eq(mpt_stats(pool).reserved_bytes, 13 * CHUNK);
  /* 10 chunks busy; 4 more need 3 empty ones moved (13 + 4 > 16). */
  uint64_t moves = mpt_stats(pool).chunk_moves;
  void *v = magpool_alloc(pool, 4 * CHUNK);
  cr_assert_not_null(v, "a take at the cap failed with %lu chunks busy of 16",
                     (unsigned long)mp_load_relaxed(&c->nbusy));
  cr_assert_geq(mpt_stats(pool).chunk_moves - moves, 1);
  cr_assert_leq(mpt_stats(pool).reserved_bytes, 16 * CHUNK);
  memset(v, 0x3c, 4 * CHUNK);
  cr_assert_eq(magpool_check(pool), 0);
  void *all[] = {s, w, y, z, v};
  for (unsigned i = 0; i < 5; i++) cr_assert_eq(magpool_free(pool, all[i]), 0);
  mpt_pool_done(pool);

  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = 2 * MiB;
  cfg.allow_growth = 1;
  cfg.max_pool_size = 16 * CHUNK;
  cfg.chunk_groups = 1;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  cr_assert_eq(pool->cfg.chunk_groups, 1);
  x = magpool_alloc(pool, 4 * CHUNK);
  cr_assert_not_null(x);
  k0 = chunk_index(pool, x);
  cr_assert_eq(pool->chunks->glen[pool->chunks->gfirst[k0]], 4,
               "chunk_groups = 1: growth of 4 chunks is one group");
  cr_assert_eq(magpool_free(pool, x), 0);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* Tree blocks of a capped pool go to the fullest busy chunk (region.c,
 * pack_pick).  pack_setup: chunk A and chunk B each hold four 512 KiB
 * blocks; three go from A and one (b[0]) from B, which leaves free blocks
 * in both; A is below B.  The live ones are a[3] and b[1..3]. */
static magpool_t *pack_setup(size_t max, void **a, void **b) {
  magpool_t *pool = chunked_pool(4 * MiB, max);
  cr_assert_eq(pool->cfg.chunk_groups, max == 0);
  for (unsigned i = 0; i < 4; i++) a[i] = magpool_alloc(pool, 512 * KiB);
  for (unsigned i = 0; i < 4; i++) b[i] = magpool_alloc(pool, 512 * KiB);
  for (unsigned i = 0; i < 4; i++) {
    cr_assert(a[i] != NULL && b[i] != NULL);
    cr_assert_eq(chunk_index(pool, a[i]), chunk_index(pool, a[0]), "a%u is not in a0's chunk", i);
    cr_assert_eq(chunk_index(pool, b[i]), chunk_index(pool, b[0]), "b%u is not in b0's chunk", i);
  }
  cr_assert_lt(chunk_index(pool, a[0]), chunk_index(pool, b[0]), "the test needs A below B");
  for (unsigned i = 0; i < 3; i++) cr_assert_eq(magpool_free(pool, a[i]), 0);
  cr_assert_eq(magpool_free(pool, b[0]), 0);
  return pool;
}

/* Frees pack_setup's live blocks and the n more in x, after the checker. */
static void pack_done(magpool_t *pool, void **a, void **b, void **x, unsigned n) {
  cr_assert_eq(magpool_check(pool), 0);
  void *live[] = {a[3], b[1], b[2], b[3]};
  for (unsigned i = 0; i < 4; i++) cr_assert_eq(magpool_free(pool, live[i]), 0);
  for (unsigned i = 0; i < n; i++) cr_assert_eq(magpool_free(pool, x[i]), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* The next 512 KiB request goes to B, three quarters busy, where the
 * tree's lowest address would have put it in A, a quarter busy; on an
 * uncapped pool (chunk groups, speed first) it still goes to A.  Returns
 * whether it went to B. */
static bool packed_take(size_t max) {
  void *a[4], *b[4];
  magpool_t *pool = pack_setup(max, a, b);
  uint64_t ca = chunk_index(pool, a[0]), cb = chunk_index(pool, b[0]);
  void *x = magpool_alloc(pool, 512 * KiB);
  cr_assert_not_null(x);
  uint64_t cx = chunk_index(pool, x);
  cr_assert(cx == ca || cx == cb, "x in chunk %lu, neither A (%lu) nor B (%lu)",
            (unsigned long)cx, (unsigned long)ca, (unsigned long)cb);
  memset(x, 0x5a, 512 * KiB);
  pack_done(pool, a, b, &x, 1);
  return cx == cb;
}

Test(chunks, a_capped_pool_packs_tree_blocks_into_the_fullest_chunk) {
  cr_assert(packed_take(64 * MiB), "capped: the block went to the emptier chunk");
  cr_assert(!packed_take(0), "uncapped: the block went to the fuller chunk, not the lowest");
}

/* A pack stopped after finding b[0]'s block in B, the fullest chunk
 * (MP_HOOK_PACK_FOUND), while another take packs into the same block and
 * claims it: the stopped pack's claim fails, and it takes its next
 * candidate, in A; the two blocks are distinct and both writable. */
Test(races, a_pack_whose_block_is_taken_meanwhile) {
  void *a[4], *b[4];
  magpool_t *pool = pack_setup(64 * MiB, a, b);
  taker t = {pool, NULL, 1, 512 * KiB};
  pthread_t th = take_stopped_at(&t, MP_HOOK_PACK_FOUND, b[0]);
  void *x[2] = {magpool_alloc(pool, 512 * KiB), NULL};
  cr_assert_eq(x[0], b[0], "the other take did not pack into b0's block");
  memset(x[0], 0x11, 512 * KiB);
  resume_stopped(th);
  x[1] = t.got;
  cr_assert_not_null(x[1]);
  cr_assert_neq(x[1], x[0], "both takes got b0's block");
  cr_assert_eq(chunk_index(pool, x[1]), chunk_index(pool, a[3]), "not the next candidate, A");
  pack_done(pool, a, b, x, 2);
}

/* Extent blocks (extent.c).  A capped pool caches blocks up to a 256th
 * of a chunk (8 KiB); a 576 KiB request (144 granules of 4 KiB) then
 * takes 576 KiB, three to a chunk, where its buddy order would take 1
 * MiB, two to a chunk; and fifteen 136 KiB requests (34 granules) share a
 * chunk, where their order (256 KiB) would fit eight.  Uncapped (the
 * caches up to 1 MiB), 576 KiB is a 1 MiB block. */
Test(extents, a_block_takes_only_the_granules_it_needs) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB, .growth = 1, .max = 64 * MiB});
  cr_assert_eq(pool->cfg.cache_max_block, 8 * KiB, "a capped pool caches up to chunk / 256");
  void *x[3];
  for (unsigned i = 0; i < 3; i++) {
    x[i] = magpool_alloc(pool, 576 * KiB);
    cr_assert_not_null(x[i]);
    cr_assert_eq(magpool_usable_size(pool, x[i]), 576 * KiB);
    cr_assert_eq((uintptr_t)x[i] % (4 * KiB), 0, "not aligned to a granule");
    cr_assert_eq(chunk_index(pool, x[i]), chunk_index(pool, x[0]), "x%u is not in x0's chunk", i);
    memset(x[i], 0x30 + (int)i, 576 * KiB);
  }
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.used_bytes, 3 * 576 * KiB, "used counts granules");
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free_sized(pool, x[0], 576 * KiB + 1), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_free_sized(pool, x[0], 576 * KiB), 0);
  cr_assert_eq(magpool_free(pool, x[1] + 64 * KiB), MAGPOOL_EINVAL, "an interior pointer");
  cr_assert_eq(magpool_free(pool, x[1]), 0);
  cr_assert_eq(magpool_free(pool, x[2]), 0);
  mpt_assert_all_free(pool);

  char *m[16];
  for (unsigned i = 0; i < 16; i++) {
    m[i] = magpool_alloc(pool, 136 * KiB - 100);
    cr_assert_not_null(m[i]);
    cr_assert_eq(magpool_usable_size(pool, m[i]), 136 * KiB);
    memset(m[i], 0x40 + (int)i, 136 * KiB);
    if (i > 0 && i < 15)
      cr_assert_eq(chunk_index(pool, m[i]), chunk_index(pool, m[0]), "m%u is not in m0's chunk", i);
  }
  cr_assert_neq(chunk_index(pool, m[15]), chunk_index(pool, m[0]), "sixteen in one chunk");
  s = mpt_stats(pool);
  cr_assert_eq(s.used_bytes, 16 * 136 * KiB);
  cr_assert_eq(magpool_check(pool), 0);
  for (unsigned i = 0; i < 16; i++) {
    for (size_t k = 0; k < 136 * KiB; k += 4 * KiB)
      cr_assert_eq(m[i][k], 0x40 + (int)i, "m%u overwritten at %zu", i, k);
    cr_assert_eq(magpool_free(pool, m[i]), 0);
  }
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);

  pool = mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB, .growth = 1});
  void *y = magpool_alloc(pool, 576 * KiB);
  cr_assert_not_null(y);
  cr_assert_eq(magpool_usable_size(pool, y), 1 * MiB, "uncapped: the buddy block, cached");
  cr_assert_eq(magpool_free(pool, y), 0);
  mpt_pool_done(pool);
}

/* With no thread cache (so no extent cache), a pool with chunk groups
 * (uncapped) keeps every block's power of two, whatever its stream caches
 * hold (no extent order: each extent take and give went to the tree, and
 * the halves traded chunks, extent.c); a capped pool (no groups) still
 * takes granules.  Stream caches of 0 and of 64 KiB (classes below the
 * block). */
Test(extents, no_cache_and_chunk_groups_means_no_extent_blocks) {
  for (int k = 0; k < 4; k++) {
    int capped = k & 1;
    magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB, .growth = 1,
                                          .max = capped ? 64 * MiB : 0,
                                          .thread_cache = MPT_ZERO,
                                          .stream_cache = k < 2 ? MPT_ZERO : 64 * KiB});
    cr_assert_not_null(pool->chunks);
    cr_assert_eq(pool->cfg.chunk_groups, !capped);
    void *y = magpool_alloc(pool, 576 * KiB);
    cr_assert_not_null(y);
    memset(y, 0x51, 576 * KiB);
    cr_assert_eq(magpool_usable_size(pool, y), capped ? 576 * KiB : 1 * MiB,
                 "case %d: usable %zu", k, magpool_usable_size(pool, y));
    cr_assert_eq(magpool_check(pool), 0);
    cr_assert_eq(magpool_free(pool, y), 0);
    mpt_assert_all_free(pool);
    mpt_pool_done(pool);
  }
}

/* An extent take tries the granules of the last extent block given back
 * first (xhint), if they hold it with at most an eighth to spare, before
 * the smallest row of its chunk.  One chunk holds x0-x4 of 34, 36, 34, 36
 * and 34 granules of 4 KiB in a row.  x0 then x3 go back: a 136 KiB
 * request (34 granules) takes x3's 36, though x0's 34 fit exactly; the
 * next finds x3's granules taken, and takes x0's row. */
Test(extents, a_take_tries_the_granules_just_given_back_first) {
  /* No thread cache, so no extent cache (xcache.c): the frees reach the tree. */
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB, .growth = 1, .max = 64 * MiB,
                                        .thread_cache = MPT_ZERO});
  const size_t sz[5] = {136 * KiB, 144 * KiB, 136 * KiB, 144 * KiB, 136 * KiB};
  char *x[5];
  for (unsigned i = 0; i < 5; i++) {
    x[i] = magpool_alloc(pool, sz[i]);
    cr_assert_not_null(x[i]);
    if (i > 0) cr_assert_eq(x[i], x[i - 1] + sz[i - 1], "x%u is not right after x%u", i, i - 1);
  }
  cr_assert_eq(magpool_free(pool, x[0]), 0);
  cr_assert_eq(magpool_free(pool, x[3]), 0);
  void *y = magpool_alloc(pool, 136 * KiB);
  cr_assert_eq(y, x[3], "not the granules given back last");
  cr_assert_eq(magpool_usable_size(pool, y), 136 * KiB);
  void *z = magpool_alloc(pool, 136 * KiB);
  cr_assert_eq(z, x[0], "not the smallest row once the last one was taken");
  cr_assert_eq(magpool_check(pool), 0);
  void *all[] = {x[1], x[2], x[4], y, z};
  mpt_free_all_done(pool, all, 5);
}

/* The checker sees an extent block that lost a piece to the tree (E3):
 * one of its pieces is freed behind the pool's back, then claimed again. */
Test(extents, the_checker_sees_a_piece_freed_under_a_live_block) {
  magpool_t *pool = chunked_pool(4 * MiB, 64 * MiB);
  char *x = magpool_alloc(pool, 576 * KiB), *y = magpool_alloc(pool, 576 * KiB);
  cr_assert(x != NULL && y != NULL);
  cr_assert_eq(magpool_check(pool), 0);
  mp_region *r = pool->regions[0];
  /* A granule of y's last piece (y starts at granule 144 of 4 KiB). */
  uint64_t u = (uint64_t)(y + 512 * KiB - r->base) >> pool->min_shift;
  cr_assert_eq((uint64_t)(y - x), 576 * KiB, "y right after x");
  mp_tree_free(&r->tree, u, pool->chunks->gord);
  cr_assert_eq(magpool_check(pool), MAGPOOL_EINVAL, "a live block's piece is free");
  cr_assert_eq(mp_tree_claim_at(&r->tree, u, pool->chunks->gord), (int64_t)u);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, x), 0);
  cr_assert_eq(magpool_free(pool, y), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* An extent take stopped after finding its row (MP_HOOK_EXTENT_FOUND):
 * chunk A holds x, its first 576 KiB; the row for 576 KiB more starts
 * there.  Another take claims the 128 KiB block at 640 KiB meanwhile.
 * The stopped take claims the row's first piece (576-640 KiB), loses
 * 640-768, gives the first back, and takes the aligned 1 MiB at 1 MiB
 * instead.  A take that kept its first piece would leave the pool not all
 * free at the end. */
Test(races, an_extent_whose_piece_is_taken_meanwhile) {
  magpool_t *pool = chunked_pool(4 * MiB, 64 * MiB);
  char *x = magpool_alloc(pool, 576 * KiB);
  cr_assert_not_null(x);
  char *a = (char *)((uintptr_t)x & ~(uintptr_t)(CHUNK - 1));
  cr_assert_eq(x, a, "x is not at its chunk's start");
  taker t = {pool, NULL, 1, 576 * KiB};
  pthread_t th = take_stopped_at(&t, MP_HOOK_EXTENT_FOUND, a + 576 * KiB);
  char *y = magpool_alloc(pool, 128 * KiB);
  cr_assert_eq(y, a + 640 * KiB, "the other take did not claim 640-768 KiB");
  memset(y, 0x11, 128 * KiB);
  resume_stopped(th);
  cr_assert_eq((char *)t.got, a + 1 * MiB, "not the aligned block above the lost row");
  cr_assert_eq(magpool_usable_size(pool, t.got), 576 * KiB);
  cr_assert_eq(magpool_check(pool), 0);
  void *z = magpool_alloc(pool, 64 * KiB); /* the first piece is free again */
  cr_assert_eq((char *)z, a + 576 * KiB, "the row's first piece was not given back");
  void *all[] = {x, y, t.got, z};
  for (unsigned i = 0; i < 4; i++) cr_assert_eq(magpool_free(pool, all[i]), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* A take stopped after reading the hint of the last extent block given
 * back (MP_HOOK_EXTENT_FOUND on its granules): x0 (36 granules) went back
 * at the chunk's start, before x1 (34).  Another take of 34 granules
 * claims x0's granules meanwhile.  The stopped take loses its first
 * piece, claims nothing, and takes the chunk's smallest row that holds
 * it: right after x1, not the 2 granules x0's spare left. */
Test(races, a_take_whose_given_back_granules_are_taken_meanwhile) {
  /* No thread cache, so no extent cache (xcache.c): x0's free reaches the tree. */
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 4 * MiB, .growth = 1, .max = 64 * MiB,
                                        .thread_cache = MPT_ZERO});
  char *x0 = magpool_alloc(pool, 144 * KiB), *x1 = magpool_alloc(pool, 136 * KiB);
  cr_assert(x0 != NULL && x1 != NULL);
  cr_assert_eq(x1, x0 + 144 * KiB, "x1 is not right after x0");
  cr_assert_eq(magpool_free(pool, x0), 0);
  taker t = {pool, NULL, 1, 136 * KiB};
  pthread_t th = take_stopped_at(&t, MP_HOOK_EXTENT_FOUND, x0);
  void *y = magpool_alloc(pool, 136 * KiB);
  cr_assert_eq(y, x0, "the other take did not claim x0's granules");
  memset(y, 0x11, 136 * KiB);
  resume_stopped(th);
  cr_assert_eq((char *)t.got, x1 + 136 * KiB, "not the row after x1");
  cr_assert_eq(magpool_usable_size(pool, t.got), 136 * KiB);
  cr_assert_eq(magpool_check(pool), 0);
  void *all[] = {x1, y, t.got};
  for (unsigned i = 0; i < 3; i++) cr_assert_eq(magpool_free(pool, all[i]), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* The budget's slack (chunk.c): max(8 chunks, 1.5 % of the high-water
 * mark H).  With 64 KiB chunks, H = 1000: a run X freed in front of a
 * live two-chunk run Y leaves holes of 500 and 498 mapped chunks, and a
 * run Z of 510 then needs 12 chunks that were never mapped.  At H +
 * 1.5 % (1015) it maps them; at 1 % (1010) it would move three empty
 * ones (1001 mapped, pool_size included, + 12 > 1010), as resnet50_train
 * and gpt2_parity_magpool kept doing warm (docs/design.md, "Policy"). */
Test(chunks, the_budget_maps_within_its_slack_before_moving) {
  const size_t ch = 64 * KiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = ch, .chunk = ch, .growth = 1,
                                        .thread_cache = MPT_ZERO, .stream_cache = MPT_ZERO});
  cr_assert_not_null(pool->chunks);
  void *a = magpool_alloc(pool, 1000 * ch);
  cr_assert_not_null(a);
  cr_assert_eq(magpool_free(pool, a), 0);
  uint64_t hwm = mp_load_relaxed(&pool->chunks->hwm);
  cr_assert_eq(hwm, 1000);
  void *x = magpool_alloc(pool, 500 * ch), *y = magpool_alloc(pool, 2 * ch);
  cr_assert(x != NULL && y != NULL);
  cr_assert_eq(magpool_free(pool, x), 0);
  magpool_stats_t s0 = mpt_stats(pool);
  cr_assert_eq(s0.reserved_bytes, 1001 * ch, "1000 chunks and pool_size's");
  void *z = magpool_alloc(pool, 510 * ch);
  cr_assert_not_null(z);
  magpool_stats_t s1 = mpt_stats(pool);
  cr_assert_eq(mp_load_relaxed(&pool->chunks->hwm), hwm, "not a new high-water mark");
  cr_assert_gt(s1.chunk_maps, s0.chunk_maps, "Z was placed on mapped chunks only: the test needs new ones");
  cr_assert_eq(s1.chunk_moves, s0.chunk_moves, "%lu chunks moved with %lu mapped of a budget of %lu",
               (unsigned long)(s1.chunk_moves - s0.chunk_moves), (unsigned long)(s1.reserved_bytes / ch),
               (unsigned long)(hwm + hwm * 3 / 200));
  cr_assert_leq(s1.reserved_bytes, (hwm + hwm * 3 / 200) * ch);
  memset(z, 0x7e, 510 * ch);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, z), 0);
  cr_assert_eq(magpool_free(pool, y), 0);
  mpt_pool_done(pool);
}

/* Without chunk groups (footprint first) the slack is at least one
 * chunk, not MP_CHUNK_SLACK_MIN (chunk.c): with 64 KiB chunks and H =
 * 100, a run X of 50 freed in front of a live run Y of 2 leaves a hole
 * of 50 mapped chunks, and a run Z of 60 then needs 12 chunks never
 * mapped.  The budget is H + 1 (1.5 % of 100 rounds down to 1): Z moves
 * 12 empty ones and the pool stays at 101 chunks, where a slack of 8
 * would have mapped 7 more. */
Test(chunks, without_groups_the_slack_is_a_chunk) {
  const size_t ch = 64 * KiB;
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = ch, cfg.chunk_size = ch, cfg.allow_growth = 1, cfg.chunk_groups = 0;
  cfg.thread_cache_bytes = 0, cfg.stream_cache_bytes = 0;
  magpool_t *pool = NULL;
  cr_assert_eq(magpool_create(&cfg, &pool), 0);
  cr_assert_not_null(pool->chunks);
  void *a = magpool_alloc(pool, 100 * ch);
  cr_assert_not_null(a);
  cr_assert_eq(magpool_free(pool, a), 0);
  uint64_t hwm = mp_load_relaxed(&pool->chunks->hwm);
  cr_assert_eq(hwm, 100);
  void *x = magpool_alloc(pool, 50 * ch), *y = magpool_alloc(pool, 2 * ch);
  cr_assert(x != NULL && y != NULL);
  cr_assert_eq(magpool_free(pool, x), 0);
  magpool_stats_t s0 = mpt_stats(pool);
  cr_assert_eq(s0.reserved_bytes, 101 * ch, "100 chunks and pool_size's");
  void *z = magpool_alloc(pool, 60 * ch);
  cr_assert_not_null(z);
  magpool_stats_t s1 = mpt_stats(pool);
  cr_assert_eq(mp_load_relaxed(&pool->chunks->hwm), hwm, "not a new high-water mark");
  cr_assert_gt(s1.chunk_maps, s0.chunk_maps, "Z was placed on mapped chunks only: the test needs new ones");
  cr_assert_leq(s1.reserved_bytes, (hwm + 1) * ch, "%lu chunks mapped, over the budget of %lu",
                (unsigned long)(s1.reserved_bytes / ch), (unsigned long)(hwm + 1));
  cr_assert_geq(s1.chunk_moves - s0.chunk_moves, 12);
  memset(z, 0x5a, 60 * ch);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, z), 0);
  cr_assert_eq(magpool_free(pool, y), 0);
  mpt_pool_done(pool);
}

Test(races, group_take_counted_before_unmap) {
  magpool_t *pool = chunked_pool(2 * MiB, 0);
  void *x;
  uint64_t g = empty_group_above(pool, &x);
  race_chunk = pool->chunks->base + (g << pool->chunks->shift);
  race_point = MP_HOOK_CHUNK_TAKE;
  mp_hook_set(race_hook);
  /* One chunk's run: lands in the empty group (mapped chunks first). */
  taker t = {pool, NULL, 1, CHUNK};
  pthread_t th;
  pthread_create(&th, NULL, take_block, &t);
  flag_wait(&race_stopped); /* chunk g counted busy, its state not read */
  uint64_t unmaps = mpt_stats(pool).chunk_unmaps;
  cr_assert_eq(magpool_trim(pool), 0); /* the group's other chunks are empty */
  cr_assert_eq(mpt_stats(pool).chunk_unmaps, unmaps, "trim unmapped part of a group in use");
  cr_assert_eq(mpt_stats(pool).reserved_bytes, (1 + MP_CHUNK_GROUP) * CHUNK);
  resume_stopped(th);
  cr_assert_not_null(t.got);
  cr_assert_eq(chunk_index(pool, t.got), g);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, t.got), 0);
  cr_assert_eq(magpool_free(pool, x), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* Starts trim in a thread of its own and returns once it stopped at
 * race_chunk (MP_HOOK_CHUNK_UNMAP), having marked it UNMAPPING. */
static pthread_t trim_stopped(magpool_t *pool) {
  race_point = MP_HOOK_CHUNK_UNMAP;
  mp_hook_set(race_hook);
  pthread_t tr;
  pthread_create(&tr, NULL, trim_it, pool);
  flag_wait(&race_stopped);
  return tr;
}

/* Trim stopped (trim_stopped, thread tr): a take of one chunk counts
 * chunk g busy (mapped chunks first, lowest address), sees it is not
 * MAPPED, and waits for the lock the stopped unmap holds; trim goes on.
 * Returns the take's block, at chunk g. */
static void *take_meets_stopped_trim(magpool_t *pool, pthread_t tr, uint64_t g) {
  taker t = {pool, NULL, 0, CHUNK};
  pthread_t th;
  pthread_create(&th, NULL, take_block, &t);
  while (mp_load_seq_cst(&pool->chunks->busy[g]) == 0) sched_yield();
  flag_set(&race_resume);
  pthread_join(tr, NULL);
  pthread_join(th, NULL);
  race_reset();
  cr_assert_not_null(t.got);
  cr_assert_eq(chunk_index(pool, t.got), g);
  return t.got;
}

/* Trim stopped with chunks [g, g + n) marked UNMAPPING, busy not re-read,
 * meets a take of chunk g (take_meets_stopped_trim). */
static void *trim_stopped_meets_take(magpool_t *pool, uint64_t g, uint64_t n) {
  pthread_t tr = trim_stopped(pool);
  for (uint64_t k = g; k < g + n; k++)
    cr_assert_eq(mp_load_relaxed(&pool->chunks->state[k]), MP_CHUNK_UNMAPPING, "chunk %lu",
                 (unsigned long)(k - g));
  return take_meets_stopped_trim(pool, tr, g);
}

Test(races, group_unmap_sees_a_late_take) {
  magpool_t *pool = chunked_pool(2 * MiB, 0);
  mp_chunks *c = pool->chunks;
  void *x;
  uint64_t g = empty_group_above(pool, &x);
  /* Trim looks at the highest chunk first: the group's last. */
  race_chunk = c->base + ((g + MP_CHUNK_GROUP - 1) << c->shift);
  void *got = trim_stopped_meets_take(pool, g, MP_CHUNK_GROUP);
  for (uint64_t k = g; k < g + MP_CHUNK_GROUP; k++)
    cr_assert_eq(mp_load_relaxed(&c->state[k]), MP_CHUNK_MAPPED);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, got), 0);
  cr_assert_eq(magpool_free(pool, x), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* =========================================================== rows */

/* A host source that counts its unmap calls and their chunks. */
static struct { int calls; size_t bytes; } uc;
static mp_source_ops counting;
static int counting_unmap(void *ctx, void *addr, size_t bytes, int keep) {
  uc.calls++;
  uc.bytes += bytes;
  return mp_source_host.unmap(ctx, addr, bytes, keep);
}

/* A growing pool whose chunk 0 holds a 1 MiB block (*x), and three
 * adjacent runs of a group each above it (r[0..2], lowest first). */
static magpool_t *three_groups(void **x, void *r[3]) {
  counting = mp_source_host;
  counting.unmap = counting_unmap;
  mp_pool_set_source_override(&counting);
  magpool_t *pool = chunked_pool(2 * MiB, 0);
  mp_pool_set_source_override(NULL);
  cr_assert_eq(pool->src, &counting);
  mp_chunks *c = pool->chunks;
  *x = magpool_alloc(pool, 1 * MiB);
  cr_assert_not_null(*x);
  for (int j = 0; j < 3; j++) {
    r[j] = magpool_alloc(pool, MP_CHUNK_GROUP * CHUNK);
    cr_assert_not_null(r[j]);
  }
  uint64_t g = chunk_index(pool, r[0]);
  for (int j = 0; j < 3; j++) {
    uint64_t k = g + (uint64_t)j * MP_CHUNK_GROUP;
    cr_assert_eq(chunk_index(pool, r[j]), k, "run %d is not above the one before", j);
    cr_assert_eq(c->gfirst[k], k);
    cr_assert_eq(c->glen[k], MP_CHUNK_GROUP, "growth mapped %u chunks as one group", c->glen[k]);
  }
  memset(&uc, 0, sizeof uc);
  return pool;
}

static void assert_states(magpool_t *pool, uint64_t g, const int mapped[3]) {
  mp_chunks *c = pool->chunks;
  for (int j = 0; j < 3; j++)
    for (uint64_t k = g + (uint64_t)j * MP_CHUNK_GROUP; k < g + (uint64_t)(j + 1) * MP_CHUNK_GROUP;
         k++)
      cr_assert_eq(mp_load_relaxed(&c->state[k]), mapped[j] ? MP_CHUNK_MAPPED : MP_CHUNK_UNMAPPED,
                   "group %d, chunk %lu", j, (unsigned long)(k - g));
}

/* Trim unmaps a row of adjacent empty groups with one source call (a
 * driver call costs what a mapping's does; on host pools one mprotect
 * and madvise); a busy group between two empty ones splits the row. */
Test(chunks, a_row_of_empty_groups_goes_in_one_call) {
  void *x, *r[3];
  magpool_t *pool = three_groups(&x, r);
  uint64_t g = chunk_index(pool, r[0]);
  for (int j = 0; j < 3; j++) cr_assert_eq(magpool_free(pool, r[j]), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(uc.calls, 1, "%d unmap calls for a row of three groups", uc.calls);
  cr_assert_eq(uc.bytes, 3 * MP_CHUNK_GROUP * CHUNK);
  assert_states(pool, g, (const int[3]){0, 0, 0});
  cr_assert_eq(mpt_stats(pool).reserved_bytes, CHUNK);
  cr_assert_eq(magpool_check(pool), 0);

  /* Again, the middle group busy: two rows of one group each. */
  for (int j = 0; j < 3; j++) {
    r[j] = magpool_alloc(pool, MP_CHUNK_GROUP * CHUNK);
    cr_assert_eq(chunk_index(pool, r[j]), g + (uint64_t)j * MP_CHUNK_GROUP);
  }
  memset(&uc, 0, sizeof uc);
  cr_assert_eq(magpool_free(pool, r[0]), 0);
  cr_assert_eq(magpool_free(pool, r[2]), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(uc.calls, 2, "%d unmap calls for two groups around a busy one", uc.calls);
  cr_assert_eq(uc.bytes, 2 * MP_CHUNK_GROUP * CHUNK);
  assert_states(pool, g, (const int[3]){0, 1, 0});
  memset(r[1], 3, MP_CHUNK_GROUP * CHUNK); /* still mapped */
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, r[1]), 0);
  cr_assert_eq(magpool_free(pool, x), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* Trim stopped (MP_HOOK_CHUNK_UNMAP) at the last group it marks, the
 * lowest, of two rows split by a busy group: the upper row is still
 * UNMAPPING, and no source call was made (every row is marked before the
 * one barrier and the re-reads: chunk_unmap.c).  A take of one chunk then
 * counts the lower row busy and waits for the lock; trim goes on: the
 * upper row goes with one call, the lower one is MAPPED again and the
 * take gets mapped memory there. */
Test(races, every_row_is_marked_before_any_re_read) {
  void *x, *r[3];
  magpool_t *pool = three_groups(&x, r);
  mp_chunks *c = pool->chunks;
  uint64_t g = chunk_index(pool, r[0]);
  cr_assert_eq(magpool_free(pool, r[0]), 0);
  cr_assert_eq(magpool_free(pool, r[2]), 0);
  race_chunk = c->base + ((g + MP_CHUNK_GROUP - 1) << c->shift);
  pthread_t tr = trim_stopped(pool);
  cr_assert_eq(uc.calls, 0, "%d unmap calls before the lower row's re-read", uc.calls);
  for (uint64_t k = g; k < g + 3 * MP_CHUNK_GROUP; k++)
    cr_assert_eq(mp_load_relaxed(&c->state[k]),
                 k < g + MP_CHUNK_GROUP || k >= g + 2 * MP_CHUNK_GROUP ? MP_CHUNK_UNMAPPING
                                                                       : MP_CHUNK_MAPPED,
                 "chunk %lu", (unsigned long)(k - g));
  void *got = take_meets_stopped_trim(pool, tr, g);
  cr_assert_eq(uc.calls, 1, "%d unmap calls for the upper row", uc.calls);
  cr_assert_eq(uc.bytes, MP_CHUNK_GROUP * CHUNK);
  assert_states(pool, g, (const int[3]){1, 1, 0});
  cr_assert_eq(magpool_check(pool), 0);
  void *done[] = {got, r[1], x};
  mpt_free_all_done(pool, done, 3);
}

/* Trim stopped (MP_HOOK_CHUNK_UNMAP) once it has marked all three groups
 * of a row UNMAPPING, busy counts not re-read; a take of one chunk counts
 * the row's lowest chunk busy (mapped chunks first, lowest address) and
 * waits for the lock.  The re-read finds that group busy: the other two
 * go with one call, the take's group is MAPPED again and the take gets
 * mapped memory. */
Test(races, a_row_keeps_a_group_taken_in_its_window) {
  void *x, *r[3];
  magpool_t *pool = three_groups(&x, r);
  mp_chunks *c = pool->chunks;
  uint64_t g = chunk_index(pool, r[0]);
  for (int j = 0; j < 3; j++) cr_assert_eq(magpool_free(pool, r[j]), 0);
  /* Trim looks at the highest chunk first: the lowest group is marked
   * last, at its last chunk. */
  race_chunk = c->base + ((g + MP_CHUNK_GROUP - 1) << c->shift);
  void *got = trim_stopped_meets_take(pool, g, 3 * MP_CHUNK_GROUP);
  cr_assert_eq(uc.calls, 1, "%d unmap calls for the two groups left", uc.calls);
  cr_assert_eq(uc.bytes, 2 * MP_CHUNK_GROUP * CHUNK);
  assert_states(pool, g, (const int[3]){1, 0, 0});
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_free(pool, got), 0);
  cr_assert_eq(magpool_free(pool, x), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}
