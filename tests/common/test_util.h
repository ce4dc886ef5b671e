/* test_util.h - helpers shared by every Criterion test, unit and api.
 *
 * Only the public header, libc and Criterion here: the api tests include
 * this and must not see any internal header.  Everything is static inline,
 * so a test file pays nothing for what it does not use.
 *
 *   random numbers     mpt_rng: deterministic, one state per thread
 *   pools              mpt_pool (from a mpt_cfg), mpt_pool_done, mpt_stats
 *   checks             mpt_assert_conserved, mpt_assert_all_free,
 *                      mpt_free_all_done, mpt_assert_one_block, mpt_assert_block,
 *                      mpt_assert_same_stats, MPT_ASSERT_NO_LEAKS
 *
 * The mpt_assert_* helpers use cr_assert: call them from the test's own
 * thread only (workers record their failures for the test to assert).
 */
#ifndef MAGPOOL_TEST_UTIL_H
#define MAGPOOL_TEST_UTIL_H

#include <magpool.h>

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* --------------------------------------------------------------------- */
/* Deterministic random numbers (xorshift64*), one state per thread.     */
/* --------------------------------------------------------------------- */

typedef struct mpt_rng {
  uint64_t s;
} mpt_rng;

static inline mpt_rng mpt_rng_seed(uint64_t seed) {
  mpt_rng r;
  /* splitmix64 of the seed, so that seeds 1, 2, 3 give unrelated streams
   * and the state is never 0. */
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  r.s = z ? z : 1;
  return r;
}

static inline uint64_t mpt_next(mpt_rng *r) {
  uint64_t x = r->s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  r->s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [0, n); n > 0.  (Modulo bias is irrelevant here.) */
static inline uint64_t mpt_below(mpt_rng *r, uint64_t n) {
  return mpt_next(r) % n;
}

/* Uniform in [lo, hi]. */
static inline uint64_t mpt_range(mpt_rng *r, uint64_t lo, uint64_t hi) {
  return lo + mpt_below(r, hi - lo + 1);
}

/* Fisher-Yates shuffle of an array of n elements of elem_size bytes. */
static inline void mpt_shuffle(mpt_rng *r, void *base, size_t n,
                               size_t elem_size) {
  unsigned char *b = (unsigned char *)base;
  unsigned char tmp[64];
  if (n < 2 || elem_size > sizeof tmp)
    return;
  for (size_t i = n - 1; i > 0; i--) {
    size_t j = (size_t)mpt_below(r, (uint64_t)i + 1);
    if (j == i)
      continue;
    for (size_t k = 0; k < elem_size; k++) {
      tmp[k] = b[i * elem_size + k];
      b[i * elem_size + k] = b[j * elem_size + k];
      b[j * elem_size + k] = tmp[k];
    }
  }
}

static inline int mpt_is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

static inline unsigned mpt_floor_log2(uint64_t x) {
  return 63u - (unsigned)__builtin_clzll(x);
}

/* --------------------------------------------------------------------- */
/* LeakSanitizer.  Inside a Criterion test a leak report prints but the  */
/* test passes, so leak-prone tests end with MPT_ASSERT_NO_LEAKS().      */
/* --------------------------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
#define MPT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MPT_ASAN 1
#endif
#endif
#ifndef MPT_ASAN
#define MPT_ASAN 0
#endif

#if MPT_ASAN
#include <sanitizer/lsan_interface.h>
#define MPT_ASSERT_NO_LEAKS()                                                 \
  cr_assert_eq(__lsan_do_recoverable_leak_check(), 0,                         \
               "LeakSanitizer found leaks (see the report above)")
#else
#define MPT_ASSERT_NO_LEAKS() ((void)0)
#endif

/* --------------------------------------------------------------------- */
/* Pools                                                                 */
/* --------------------------------------------------------------------- */

/* What a test wants of a pool; everything else keeps the defaults of
 * magpool_config_init.  Written as a compound literal, so that a field the
 * test does not name is 0:
 *
 *   mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB, .thread_cache = MPT_ZERO})
 *
 * A field that is 0 (MPT_DEFAULT) keeps the default.  0 is also a real
 * value of some size fields (thread_cache 0: no per-thread caches;
 * stream_cache 0: every async free retired at once), so a size field that
 * must be 0 is set to MPT_ZERO. */
#define MPT_DEFAULT ((size_t)0)
#define MPT_ZERO SIZE_MAX

typedef struct mpt_cfg {
  size_t pool_size;        /* magpool_config_t.pool_size          */
  size_t thread_cache;     /* .thread_cache_bytes                 */
  size_t stream_cache;     /* .stream_cache_bytes                 */
  size_t max;              /* .max_pool_size (default 0: no limit) */
  size_t min_block;        /* .min_block                          */
  size_t cache_max;        /* .cache_max_block                    */
  size_t chunk;            /* .chunk_size (a fixed pool whose
                              pool_size it does not divide is not
                              chunked: whole regions) */
  int growth;              /* .allow_growth (default 0: off)      */
  magpool_mem_kind_t kind; /* .kind (default MAGPOOL_MEM_HOST)    */
  int cross_reuse;         /* .cross_stream_reuse (default 0: off) */
  size_t release;          /* .release_threshold                  */
  int groups;              /* .chunk_groups + 1 (default 0: auto)  */
} mpt_cfg;

static inline size_t mpt_cfg_size_(size_t v, size_t dflt) {
  return v == MPT_ZERO ? 0 : v == MPT_DEFAULT ? dflt : v;
}

/* Creates a pool from *c and asserts that it worked, and that the pool
 * holds exactly pool_size bytes (rounded down to a multiple of min_block,
 * as magpool_config_t says). */
static inline magpool_t *mpt_pool(const mpt_cfg *c) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = mpt_cfg_size_(c->pool_size, cfg.pool_size);
  cfg.thread_cache_bytes = mpt_cfg_size_(c->thread_cache, cfg.thread_cache_bytes);
  cfg.stream_cache_bytes = mpt_cfg_size_(c->stream_cache, cfg.stream_cache_bytes);
  cfg.max_pool_size = mpt_cfg_size_(c->max, cfg.max_pool_size);
  cfg.min_block = mpt_cfg_size_(c->min_block, cfg.min_block);
  cfg.cache_max_block = mpt_cfg_size_(c->cache_max, cfg.cache_max_block);
  cfg.chunk_size = mpt_cfg_size_(c->chunk, cfg.chunk_size);
  if (c->growth != 0)
    cfg.allow_growth = c->growth;
  if (c->kind != 0)
    cfg.kind = c->kind;
  if (c->cross_reuse != 0)
    cfg.cross_stream_reuse = c->cross_reuse;
  cfg.release_threshold = mpt_cfg_size_(c->release, cfg.release_threshold);
  if (c->groups != 0)
    cfg.chunk_groups = c->groups - 1;
  magpool_t *pool = NULL;
  int rc = magpool_create(&cfg, &pool);
  cr_assert_eq(rc, 0,
               "magpool_create(pool_size %zu, thread_cache %zu, stream_cache "
               "%zu, max %zu, min_block %zu, cache_max %zu, growth %d, kind "
               "%d) = %d (%s)",
               cfg.pool_size, cfg.thread_cache_bytes, cfg.stream_cache_bytes,
               cfg.max_pool_size, cfg.min_block, cfg.cache_max_block,
               cfg.allow_growth, (int)cfg.kind, rc, magpool_strerror(rc));
  cr_assert_not_null(pool);
  size_t total = 0;
  cr_assert_eq(magpool_mem_info(pool, NULL, &total), 0);
  cr_assert_eq(total, cfg.pool_size - cfg.pool_size % cfg.min_block,
               "a pool of pool_size %zu holds %zu bytes", cfg.pool_size,
               total);
  return pool;
}

/* The end of a test's pool: it checks, and it is destroyed. */
static inline void mpt_pool_done(magpool_t *pool) {
  int rc = magpool_check(pool);
  cr_assert_eq(rc, 0, "magpool_check = %d", rc);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* A snapshot of the pool's statistics (every field written: the struct is
 * filled with junk first). */
static inline magpool_stats_t mpt_stats(magpool_t *pool) {
  magpool_stats_t s;
  memset(&s, 0xA5, sizeof s);
  int rc = magpool_get_stats(pool, &s);
  cr_assert_eq(rc, 0, "magpool_get_stats = %d", rc);
  return s;
}

/* --------------------------------------------------------------------- */
/* Checks                                                                */
/* --------------------------------------------------------------------- */

static inline bool mpt_is_aligned(const void *p, size_t a) {
  return ((uintptr_t)p & (a - 1)) == 0;
}

/* The block size the header promises for a request: the next power of
 * two, at least min_block. */
static inline size_t mpt_block_size_for(size_t size, size_t min_block) {
  size_t b = min_block;
  while (b < size)
    b <<= 1;
  return b;
}

/* A live block's usable size: a power of two >= max(size, min_block), and
 * the block is aligned to it. */
static inline void mpt_assert_block(magpool_t *pool, const void *p,
                                    size_t size, size_t min_block) {
  size_t u = magpool_usable_size(pool, p);
  const size_t chunk = 2 * MiB; /* the default chunk_size */
  if (u >= chunk && !mpt_is_pow2(u)) {
    /* A large block on a chunked pool: a run of whole chunks. */
    cr_assert_eq(u % chunk, 0, "usable_size %zu of a run is not whole chunks", u);
    cr_assert_geq(u, size);
    cr_assert(mpt_is_aligned(p, chunk), "run %p not aligned to a chunk", p);
    return;
  }
  if (u >= chunk && !mpt_is_aligned(p, u)) {
    cr_assert(mpt_is_aligned(p, chunk), "run %p not aligned to a chunk", p);
    cr_assert_geq(u, size);
    return;
  }
  cr_assert(mpt_is_pow2(u), "usable_size %zu of a %zu-byte block is not a "
                            "power of two", u, size);
  cr_assert_geq(u, size);
  cr_assert_geq(u, min_block);
  cr_assert(mpt_is_aligned(p, u), "block %p of size %zu not aligned to %zu",
            p, size, u);
}

/* On a quiescent pool every reserved byte is in exactly one state:
 * used + cached + pending + free == reserved (each term is defined in
 * magpool_stats_t).  This form checks a snapshot taken while the pool was
 * quiescent. */
static inline void mpt_assert_stats_conserved(const magpool_stats_t *s) {
  cr_assert_eq(s->used_bytes + s->cached_bytes + s->pending_bytes +
                   s->free_bytes,
               s->reserved_bytes,
               "conservation: used %zu + cached %zu + pending %zu + free %zu "
               "!= reserved %zu",
               s->used_bytes, s->cached_bytes, s->pending_bytes,
               s->free_bytes, s->reserved_bytes);
  cr_assert_geq(s->peak_used_bytes, s->used_bytes);
  cr_assert_leq(s->largest_free_block, s->free_bytes);
  cr_assert_eq(s->alloc_count - s->free_count, s->live_count,
               "alloc_count %llu - free_count %llu != live_count %llu",
               (unsigned long long)s->alloc_count,
               (unsigned long long)s->free_count,
               (unsigned long long)s->live_count);
}

/* The same on a quiescent pool now, and magpool_mem_info agrees with the
 * stats: total = reserved, free = free in the tree plus cached. */
static inline void mpt_assert_conserved(magpool_t *pool) {
  magpool_stats_t s = mpt_stats(pool);
  mpt_assert_stats_conserved(&s);
  size_t fb = 0, tb = 0;
  cr_assert_eq(magpool_mem_info(pool, &fb, &tb), 0);
  cr_assert_eq(tb, s.reserved_bytes, "mem_info total %zu, reserved %zu", tb,
               s.reserved_bytes);
  cr_assert_eq(fb, s.free_bytes + s.cached_bytes,
               "mem_info free %zu, free %zu + cached %zu", fb, s.free_bytes,
               s.cached_bytes);
}

/* Fields that a call failing with EINVAL must not change. */
static inline void mpt_assert_same_stats(magpool_stats_t a, magpool_stats_t b,
                                         const char *what) {
  cr_assert_eq(a.used_bytes, b.used_bytes, "%s changed used_bytes", what);
  cr_assert_eq(a.requested_bytes, b.requested_bytes,
               "%s changed requested_bytes", what);
  cr_assert_eq(a.live_count, b.live_count, "%s changed live_count", what);
  cr_assert_eq(a.alloc_count, b.alloc_count, "%s changed alloc_count", what);
  cr_assert_eq(a.free_count, b.free_count, "%s changed free_count", what);
  cr_assert_eq(a.reserved_bytes, b.reserved_bytes,
               "%s changed reserved_bytes", what);
  cr_assert_eq(a.pending_bytes, b.pending_bytes, "%s changed pending_bytes",
               what);
}

/* After trim, with nothing live, nothing pending and no other live thread
 * holding a cache: nothing is used, cached or pending, and every reserved
 * byte is free in the tree.  (Any pool: grown, or not a power of two.) */
static inline void mpt_assert_all_free(magpool_t *pool) {
  cr_assert_eq(magpool_trim(pool), 0);
  mpt_assert_conserved(pool);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.used_bytes, 0, "used_bytes %zu after freeing everything",
               s.used_bytes);
  cr_assert_eq(s.requested_bytes, 0);
  cr_assert_eq(s.live_count, 0);
  cr_assert_eq(s.cached_bytes, 0, "cached_bytes %zu after trim",
               s.cached_bytes);
  cr_assert_eq(s.pending_bytes, 0, "pending_bytes %zu after trim",
               s.pending_bytes);
  cr_assert_eq(s.free_bytes, s.reserved_bytes, "free %zu of %zu after trim",
               s.free_bytes, s.reserved_bytes);
}

/* The end of a test: frees the n blocks p[] (each free must succeed),
 * asserts the pool all free (mpt_assert_all_free) and destroys it. */
static inline void mpt_free_all_done(magpool_t *pool, void *const *p, unsigned n) {
  for (unsigned i = 0; i < n; i++) cr_assert_eq(magpool_free(pool, p[i]), 0, "free %u of %u", i, n);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

/* The same, for a pool of one power-of-two region: it is one free block
 * again, which one allocation of the whole pool gets; then the pool is
 * trimmed and checked. */
static inline void mpt_assert_one_block(magpool_t *pool) {
  mpt_assert_all_free(pool);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.largest_free_block, s.reserved_bytes,
               "largest free block %zu, pool %zu: not one block after trim",
               s.largest_free_block, s.reserved_bytes);
  void *all = magpool_alloc(pool, s.reserved_bytes);
  cr_assert_not_null(all, "alloc of the whole pool (%zu bytes) failed: %s",
                     s.reserved_bytes, magpool_strerror(magpool_last_error()));
  cr_assert_eq(magpool_usable_size(pool, all), s.reserved_bytes);
  cr_assert_eq(magpool_free(pool, all), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(magpool_check(pool), 0);
}

#endif /* MAGPOOL_TEST_UTIL_H */
