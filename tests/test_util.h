/* test_util.h - small helpers shared by the Criterion tests.
 *
 * Only libc here: test_api.c includes this next to <magpool.h> and must not
 * see any internal header.
 */
#ifndef MAGPOOL_TEST_UTIL_H
#define MAGPOOL_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

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

#endif /* MAGPOOL_TEST_UTIL_H */
