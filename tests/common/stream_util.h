/* stream_util.h - helpers shared by the stream tests (tests/api/
 * test_streams*.c): a pattern to fill blocks with and check, a gate that
 * holds a host stream, and the end of every stream test.
 *
 * Tasks run on host-stream worker threads, where cr_assert must not be
 * used: they count failures in atomics that the test thread asserts on.
 *
 * Needs _GNU_SOURCE (usleep, pthread_cond_timedwait, clock_gettime under
 * C11), defined by the including file before any system header.
 */
#ifndef MAGPOOL_STREAM_UTIL_H
#define MAGPOOL_STREAM_UTIL_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

/* -------------------------------------------------------------- pattern -- */

/* A pattern that depends on the tag and on the position, so that a block
 * overwritten by another block's fill, or shifted, does not verify. */
static inline uint64_t pat_word(uint64_t tag, size_t i) {
  uint64_t x = tag * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD6E8FEB86659FD93ull;
  return x ^ (x >> 29);
}

static inline void fill(void *p, size_t n, uint64_t tag) {
  uint64_t *w = p;
  size_t nw = n / 8;
  for (size_t i = 0; i < nw; i++) w[i] = pat_word(tag, i);
  unsigned char *b = p;
  for (size_t i = nw * 8; i < n; i++) b[i] = (unsigned char)(tag + i);
}

static inline int verify(const void *p, size_t n, uint64_t tag) {
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

static inline void gate_init(gate *g) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->open = 0;
  atomic_init(&g->entered, 0);
  atomic_init(&g->timed_out, 0);
}

static inline void gate_task(void *arg) {
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

static inline void gate_open(gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Waits (bounded) until the gate task runs: A is then blocked for sure,
 * and every task queued on A before the gate has finished. */
static inline void gate_wait_entered(gate *g) {
  for (int i = 0; i < 100000 && !atomic_load(&g->entered); i++) usleep(100);
  cr_assert(atomic_load(&g->entered), "the gate task never started");
}

static inline void gate_done(gate *g) {
  cr_assert_eq(atomic_load(&g->timed_out), 0,
               "a gate opened itself after %d s: the test did not open it",
               GATE_LIMIT_S);
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
}

/* -------------------------------------------------------------- streams -- */

static inline magpool_stream_t stream_new(void) {
  magpool_stream_t s = NULL;
  cr_assert_eq(magpool_host_stream_create(&s), 0);
  cr_assert_not_null(s);
  return s;
}

static inline void launch(magpool_stream_t s, void (*fn)(void *), void *arg) {
  cr_assert_eq(magpool_host_stream_launch(s, fn, arg), 0);
}

/* Blocks s with gate g (initialised here) until gate_release: every task
 * queued on s before returns has run, and none after runs meanwhile. */
static inline void gate_hold(gate *g, magpool_stream_t s) {
  gate_init(g);
  launch(s, gate_task, g);
  gate_wait_entered(g);
}

/* Opens g, waits until s has run everything queued on it, and checks that
 * the gate did not open itself. */
static inline void gate_release(gate *g, magpool_stream_t s) {
  gate_open(g);
  cr_assert_eq(magpool_host_stream_sync(s), 0);
  gate_done(g);
}

/* ------------------------------------------------------------- finish -- */

/* The end of every stream test: streams released and synchronised; then
 * nothing is used, cached or pending, the pool checks and is one free
 * block of pool_size bytes again; the streams and the pool are destroyed. */
static inline void finish(magpool_t *pool, size_t pool_size,
                          magpool_stream_t *s, size_t ns) {
  for (size_t i = 0; i < ns; i++) {
    cr_assert_eq(magpool_stream_release(pool, s[i]), 0);
    cr_assert_eq(magpool_host_stream_sync(s[i]), 0);
  }
  cr_assert_eq(mpt_stats(pool).reserved_bytes, pool_size);
  mpt_assert_one_block(pool);
  for (size_t i = 0; i < ns; i++)
    cr_assert_eq(magpool_host_stream_destroy(s[i]), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  mpt_pool_done(pool);
  MPT_ASSERT_NO_LEAKS();
}

#endif /* MAGPOOL_STREAM_UTIL_H */
