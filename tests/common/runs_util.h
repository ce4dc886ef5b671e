/* runs_util.h - what the unit tests of the run space (test_fence.c,
 * test_solo.c) read of its state: run-space chunk numbers, busy counts,
 * fence and solo bits, a stream's entry key and park.  Internal headers:
 * include after runs.h and park.h.  Call from the test's own thread. */
#ifndef MAGPOOL_TEST_RUNS_UTIL_H
#define MAGPOOL_TEST_RUNS_UTIL_H

#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

static inline bool overlaps(const void *a, size_t an, const void *b, size_t bn) {
  const char *x = a, *y = b;
  return x < y + bn && y < x + an;
}

/* Run-space chunk number of address p. */
static inline uint32_t rchunk(magpool_t *pool, const void *p) {
  mp_chunks *c = pool->chunks;
  return (uint32_t)(((uint64_t)((const char *)p - c->base) >> c->shift) - c->run0);
}

static inline uint32_t busy_of(magpool_t *pool, uint32_t k) {
  return atomic_load(&pool->chunks->busy[pool->chunks->run0 + k]);
}

static inline bool fenced(magpool_t *pool, uint32_t k) {
  return pool->chunks->runs.fbits[k / 64] >> (k % 64) & 1;
}

/* The tag of p's first chunk (0: none, MP_TAG_SOLO: a solo run's). */
static inline uint32_t tag_of(magpool_t *pool, const void *p) {
  return pool->chunks->runs.tag[rchunk(pool, p)];
}

/* A free chunk of a solo run (runs.h, "Solo runs"). */
static inline bool solo_free(magpool_t *pool, uint32_t k) {
  return pool->chunks->runs.sbits[k / 64] >> (k % 64) & 1;
}

static inline uint64_t key_of(magpool_t *pool, magpool_stream_t s) {
  uint64_t sid;
  cr_assert_eq(pool->sops->get_id(pool->src_ctx, s, &sid), 0);
  return sid + 1;
}

static inline mp_park *park_of(magpool_t *pool, magpool_stream_t s) {
  mp_streams_read_lock();
  mp_sentry *e = mp_entry_find_rcu(pool, key_of(pool, s), s, false);
  mp_streams_read_unlock();
  cr_assert_not_null(e);
  return &e->park; /* the entry lives until s is released */
}

#endif /* MAGPOOL_TEST_RUNS_UTIL_H */
