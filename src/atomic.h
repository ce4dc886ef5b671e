/* atomic.h - the only file in src/ that spells out C11 atomics.
 *
 * Every wrapper carries its memory order in its name (STYLE rule 3), so
 * `grep release src/` finds every publication point and `grep acquire` every
 * consumer.  Nothing else in src/ may write atomic_*_explicit, a fence or
 * atomic_init (tools/check-layers.sh fails the build's tests if one does).
 *
 * Orders used, and what each is for:
 *   relaxed   counters and hints; no ordering with anything else
 *   acquire   a load (or the load half of an RMW) that consumes data
 *             published by a release on the same variable
 *   release   a store (or the store half of an RMW) that publishes data
 *             written before it
 *   acq_rel   an RMW that both consumes and publishes
 *   seq_cst   where a store-buffer (Dekker) argument needs the single
 *             total order: the tree's summary skip (tree.c) and the TSan
 *             form of the slot handshake (stream_cache.h)
 */
#ifndef MAGPOOL_ATOMIC_H
#define MAGPOOL_ATOMIC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Initialisation of an object no other thread can see yet. */
#define mp_atomic_init(p, v) atomic_init((p), (v))

/* -- loads ---------------------------------------------------------------- */
#define mp_load_relaxed(p) atomic_load_explicit((p), memory_order_relaxed)
#define mp_load_acquire(p) atomic_load_explicit((p), memory_order_acquire)
#define mp_load_seq_cst(p) atomic_load_explicit((p), memory_order_seq_cst)

/* -- stores --------------------------------------------------------------- */
#define mp_store_relaxed(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define mp_store_release(p, v) atomic_store_explicit((p), (v), memory_order_release)
#define mp_store_seq_cst(p, v) atomic_store_explicit((p), (v), memory_order_seq_cst)

/* -- read-modify-write ---------------------------------------------------- */
#define mp_fetch_add_relaxed(p, v) atomic_fetch_add_explicit((p), (v), memory_order_relaxed)
#define mp_fetch_add_seq_cst(p, v) atomic_fetch_add_explicit((p), (v), memory_order_seq_cst)
#define mp_fetch_sub_seq_cst(p, v) atomic_fetch_sub_explicit((p), (v), memory_order_seq_cst)
#define mp_fetch_sub_relaxed(p, v) atomic_fetch_sub_explicit((p), (v), memory_order_relaxed)
#define mp_fetch_add_acq_rel(p, v) atomic_fetch_add_explicit((p), (v), memory_order_acq_rel)
#define mp_fetch_or_seq_cst(p, v) atomic_fetch_or_explicit((p), (v), memory_order_seq_cst)
#define mp_fetch_and_seq_cst(p, v) atomic_fetch_and_explicit((p), (v), memory_order_seq_cst)
#define mp_xchg_acquire(p, v) atomic_exchange_explicit((p), (v), memory_order_acquire)

/* Compare-and-swap: *e is updated with the value seen on failure.  The
 * failure order is the strongest one C11 allows below the success order
 * (no release on a failed CAS). */
#define mp_cas_weak_acq_rel(p, e, d)                                           \
  atomic_compare_exchange_weak_explicit((p), (e), (d), memory_order_acq_rel,   \
                                        memory_order_acquire)
#define mp_cas_weak_release(p, e, d)                                           \
  atomic_compare_exchange_weak_explicit((p), (e), (d), memory_order_release,   \
                                        memory_order_relaxed)
#define mp_cas_weak_relaxed(p, e, d)                                           \
  atomic_compare_exchange_weak_explicit((p), (e), (d), memory_order_relaxed,   \
                                        memory_order_relaxed)
#define mp_cas_weak_seq_cst(p, e, d)                                           \
  atomic_compare_exchange_weak_explicit((p), (e), (d), memory_order_seq_cst,   \
                                        memory_order_seq_cst)
#define mp_cas_strong_relaxed(p, e, d)                                         \
  atomic_compare_exchange_strong_explicit((p), (e), (d), memory_order_relaxed, \
                                          memory_order_relaxed)
#define mp_cas_strong_acquire(p, e, d)                                         \
  atomic_compare_exchange_strong_explicit((p), (e), (d), memory_order_acquire, \
                                          memory_order_relaxed)
#define mp_cas_strong_acq_rel(p, e, d)                                         \
  atomic_compare_exchange_strong_explicit((p), (e), (d), memory_order_acq_rel, \
                                          memory_order_acquire)

/* -- fences --------------------------------------------------------------- */
/* A full StoreLoad barrier on this thread. */
#define mp_fence_seq_cst() atomic_thread_fence(memory_order_seq_cst)
/* A compiler-only barrier: keeps program order against reordering by the
 * compiler, emits no instruction (the other side supplies the hardware
 * barrier, e.g. membarrier). */
#define mp_signal_fence_seq_cst() atomic_signal_fence(memory_order_seq_cst)

/* -- composites ----------------------------------------------------------- */

/* Single-owner counter bump: the owner is the only writer, readers on other
 * threads use relaxed loads.  Compiles to a plain add; no lock prefix. */
#define mp_owner_add(p, v) mp_store_relaxed((p), mp_load_relaxed(p) + (v))

/* Raises *p to at least v (relaxed: a statistic, ordered with nothing).
 * Returns the largest of v and the value seen. */
static inline int64_t mp_max_relaxed(_Atomic int64_t *p, int64_t v) {
  int64_t cur = mp_load_relaxed(p);
  while (v > cur && !mp_cas_weak_relaxed(p, &cur, v)) {
  }
  return v > cur ? v : cur;
}

static inline uint64_t mp_max_relaxed_u64(_Atomic uint64_t *p, uint64_t v) {
  uint64_t cur = mp_load_relaxed(p);
  while (v > cur && !mp_cas_weak_relaxed(p, &cur, v)) {
  }
  return v > cur ? v : cur;
}

static inline size_t mp_max_relaxed_size(_Atomic size_t *p, size_t v) {
  size_t cur = mp_load_relaxed(p);
  while (v > cur && !mp_cas_weak_relaxed(p, &cur, v)) {
  }
  return v > cur ? v : cur;
}

/* A word lock (test-and-test-and-set): 0 free, 1 held.  For short leaf
 * critical sections, where a pthread mutex's call and bookkeeping cost
 * more than the section (runs.c, park.c); the caller's loop decides how
 * to wait.  ACQUIRE on success pairs with mp_word_unlock's RELEASE: the
 * last holder's writes are visible to the next. */
static inline int mp_word_trylock(_Atomic int *w) {
  int z = 0;
  return mp_load_relaxed(w) == 0 && mp_cas_strong_acquire(w, &z, 1);
}
#define mp_word_unlock(w) mp_store_release((w), 0)

#endif /* MAGPOOL_ATOMIC_H */
