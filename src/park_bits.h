/* park_bits.h - what park.c (parking, retiring, the fence batch) and
 * park_take.c (taking parked blocks) share: the park's locks and its byte
 * counts.  Private to those two files; the others include park.h.  Data:
 * types.h (mp_park). */
#ifndef MAGPOOL_PARK_BITS_H
#define MAGPOOL_PARK_BITS_H

#include "park.h"

#include <sched.h>

/* The park's locks (lock, flock): test-and-test-and-set words. */
static inline void word_lock(mp_park *k, _Atomic int *w) {
  /* ACQUIRE: the last holder's writes (magazines, counts, fence ranges)
   * are visible to us. */
  for (unsigned spins = 0; !mp_word_trylock(w); spins++) {
    MP_HOOK(MP_HOOK_PARK_WAIT, k);
    if (spins >= 64) sched_yield();
  }
}

static inline void word_unlock(_Atomic int *w) { mp_word_unlock(w); }
static inline void park_lock(mp_park *k) { word_lock(k, &k->lock); }
static inline void park_unlock(mp_park *k) { word_unlock(&k->lock); }

static inline bool is_small(const magpool_t *pool, unsigned order) { return order < pool->s_nclasses; }

static inline void set_bytes(mp_park *k, const magpool_t *pool, unsigned o, int64_t d) {
  k->obytes[o] += d;
  mp_store_relaxed(&k->bytes, mp_load_relaxed(&k->bytes) + d);
  if (is_small(pool, o)) k->small_bytes += d;
}

/* May blocks of `order` cost less than their size (runs backed for
 * their first request, extent blocks)? */
static inline bool partial(const magpool_t *pool, unsigned order) {
  return pool->chunks != NULL && order >= pool->chunks->xlo;
}

#endif /* MAGPOOL_PARK_BITS_H */
