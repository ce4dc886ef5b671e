/* stream_cache.h - the owner's side of the stream slots: entering and
 * leaving a slot through the revoke handshake (revoke.h).  Inline: the
 * async fast paths in alloc_async.c enter and leave a slot with two plain
 * stores and a plain load.  Layer 4. */
#ifndef MAGPOOL_STREAM_CACHE_H
#define MAGPOOL_STREAM_CACHE_H

#include "internal.h"

/* Owner: enter the slot, or back off (false: a thief holds or wants it). */
MP_INLINE bool mp_slot_enter_owner(mp_sslot *sl) { return mp_revoke_enter_owner(&sl->rv); }

/* Owner: leave the slot. */
MP_INLINE void mp_slot_exit_owner(mp_sslot *sl) { mp_revoke_exit_owner(&sl->rv); }

/* Owner inside, or a thief holding the slot: bytes cached. */
MP_INLINE void mp_slot_bytes_add(mp_sslot *sl, int64_t d) {
  mp_store_relaxed(&sl->bytes, mp_load_relaxed(&sl->bytes) + d);
}

/* Owner, after a pop missed: m, a magazine off the park
 * (mp_park_take_mag), becomes the slot's magazine of its order (or goes
 * behind it, should that hold blocks), and one block is returned.  If a
 * thief holds the slot, m goes back to the park (or behind s) and NULL is
 * returned. */
void *mp_slot_load_owner(magpool_t *pool, mp_sslot *sl, magpool_stream_t s, mp_mag *m);

/* cross_stream_reuse, at a new peak on stream t (entry `self`): every
 * other stream that has runs fenced, in its open batch or behind it, as
 * far as *ad has room: its newest tag read, its park retired (as
 * mp_streams_retire_parks does), then t made to wait for it; those
 * waited for are added to *ad (runs.h), whose runs a take on t may then
 * use.  Skips a stream being captured, a per-thread one and one whose
 * entry is busy. */
void mp_streams_adopt(magpool_t *pool, mp_sentry *self, magpool_stream_t t, struct mp_adopt *ad);

#endif /* MAGPOOL_STREAM_CACHE_H */
