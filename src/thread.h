/* thread.h - the thread record's memo: the inline lookup every API entry
 * point starts with (thread.c owns the records).  Layer 4: included only
 * by the API layer and by thread.c itself. */
#ifndef MAGPOOL_THREAD_H
#define MAGPOOL_THREAD_H

#include "internal.h"

/* The calling thread's record for pool, created (or adopted) on first use,
 * brought up to date after a trim or a tracking switch (the owner's caches
 * go back first).  NULL only when out of host memory.  Calling thread
 * only. */
mp_tcache *mp_tcache_get_slow(magpool_t *pool);

/* The last record this thread used.  In the static archive initial-exec:
 * one %fs-relative load, no __tls_get_addr call (8 bytes of static TLS;
 * the linker relaxes it to local-exec in a program).  In the shared
 * library (MP_SHARED_LIB) the default global-dynamic model, which needs
 * no static TLS, so that dlopen() accepts the library in a running
 * process; the build asks for TLS descriptors there where the compiler
 * has them (CMakeLists.txt), which glibc resolves to a static-TLS load
 * when it has room. */
#if defined(MP_SHARED_LIB)
#  define MP_TLS_MODEL
#else
#  define MP_TLS_MODEL __attribute__((tls_model("initial-exec")))
#endif
extern _Thread_local mp_tcache *mp_tls_last MP_TLS_MODEL;

/* The memo check.  A pool's trim epoch starts at uid << 32, so one compare
 * covers both "a trim ran since" and "this record belongs to a destroyed
 * pool that had the same address".  Relaxed: the epoch is a hint; a trim
 * that this thread has not seen yet is honoured at its next call. */
MP_INLINE bool mp_tcache_current(const mp_tcache *tc, magpool_t *pool) {
  return tc != NULL && tc->pool == pool && tc->epoch == mp_load_relaxed(&pool->trim_epoch);
}

MP_INLINE mp_tcache *mp_tcache_get(magpool_t *pool) {
  mp_tcache *tc = mp_tls_last;
  if (MP_LIKELY(mp_tcache_current(tc, pool))) return tc;
  return mp_tcache_get_slow(pool);
}

/* Owner: hold the record's magazines, or back off (false: the ladder of
 * another thread is taking them over; revoke.h). */
MP_INLINE bool mp_tcache_enter_owner(mp_tcache *tc) { return mp_revoke_enter_owner(&tc->rv); }
MP_INLINE void mp_tcache_exit_owner(mp_tcache *tc) { mp_revoke_exit_owner(&tc->rv); }
/* Owner: hold them, waiting out a thief (whose steal never blocks). */
void mp_tcache_enter_owner_wait(mp_tcache *tc);

/* Order of a request the fast paths may serve (size <= a cache's largest
 * class, so no overflow): ceil(log2(ceil(size / min_block))). */
MP_INLINE unsigned mp_cached_order(const mp_tcache *tc, size_t size) {
  size_t q = (size - (size != 0)) >> tc->shift; /* (size - 1) / min_block */
  return q == 0 ? 0 : 64u - mp_clz64(q);
}

/* Header word of p if p is a unit-aligned address of region 0's tree
 * part (below hdr_split: every cached block), else NULL
 * (the fast paths' region test, from the record's copies). */
MP_INLINE _Atomic uint32_t *mp_tcache_r0_hdr(const mp_tcache *tc, const void *p) {
  size_t off = (size_t)((const char *)p - tc->r0_base);
  size_t unit = off >> tc->shift;
  if (MP_UNLIKELY(off >= tc->r0_bytes || (unit << tc->shift) != off)) return NULL;
  return &tc->r0_hdr[unit];
}

#endif /* MAGPOOL_THREAD_H */
