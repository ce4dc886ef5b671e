/* stream_cache.h - the owner's side of the stream slots' revoke handshake
 * (stream_cache.c has the thief's side and the argument).  Inline: the
 * async fast paths in alloc_async.c enter and leave a slot with two plain
 * stores and a plain load. */
#ifndef MAGPOOL_STREAM_CACHE_H
#define MAGPOOL_STREAM_CACHE_H

#include "internal.h"

/* True when membarrier(PRIVATE_EXPEDITED) is registered: the thief then
 * supplies the owner's StoreLoad barrier.  Set once by
 * mp_stream_cache_init, before any pool exists; read-only after. */
extern bool mp_asym_ok;

/* Owner: enter the slot's critical section, or back off (false: a thief
 * holds or wants the slot).  Orders: ACQUIRE on revoke, pairing with the
 * thief's RELEASE of revoke = 0 - what it did to the cache is visible. */
MP_INLINE bool mp_slot_enter_owner(mp_sslot *sl) {
  if (MP_TSAN) {
    /* TSan models neither membarrier nor fences: the same Dekker argument
     * with seq_cst operations on both flags, in a form it understands. */
    mp_store_seq_cst(&sl->active, 1);
    if (mp_load_seq_cst(&sl->revoke) == 0) return true;
    mp_store_release(&sl->active, 0);
    return false;
  }
  mp_store_relaxed(&sl->active, 1);
  /* StoreLoad between the store of active and the load of revoke.  With
   * membarrier the thief supplies the hardware barrier and the compiler
   * must only keep the order; without it, the owner fences itself. */
  if (MP_LIKELY(mp_asym_ok)) mp_signal_fence_seq_cst();
  else mp_fence_seq_cst();
  if (MP_LIKELY(mp_load_acquire(&sl->revoke) == 0)) return true;
  mp_store_release(&sl->active, 0);
  return false;
}

/* Owner: leave.  RELEASE: our cache writes happen before a thief that sees
 * active == 0 touches the cache. */
MP_INLINE void mp_slot_exit_owner(mp_sslot *sl) { mp_store_release(&sl->active, 0); }

/* Owner inside, or a thief holding the slot: bytes cached. */
MP_INLINE void mp_slot_bytes_add(mp_sslot *sl, int64_t d) {
  mp_store_relaxed(&sl->bytes, mp_load_relaxed(&sl->bytes) + d);
}

#endif /* MAGPOOL_STREAM_CACHE_H */
