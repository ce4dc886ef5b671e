/* revoke.h - the revoke handshake: an owner touches its data with plain
 * loads and stores, and a thief can still take the data over safely.
 * Used by the stream slots (stream_cache.c) and the thread records'
 * magazines (thread.c).  Layer 0 (revoke.c has the thief's wait).
 *
 * An asymmetric Dekker (asym.h).  Owner: store active = 1, mp_asym_light,
 * load revoke; touch the data only if revoke is 0, and store active = 0
 * (RELEASE) after.  Thief: store revoke = 1, mp_asym_heavy, then wait for
 * active == 0 (ACQUIRE), take the data, and store revoke = 0 (RELEASE).
 * Either the owner's store of active reached the thief (it waits), or the
 * owner's load of revoke came after the barrier and sees 1 (it backs
 * off): they never both touch the data.  The owner pays two plain stores
 * and a plain load; the thief one system call.  Under ThreadSanitizer both
 * sides use seq_cst operations on the two flags (the production form is
 * checked by the deterministic tests that stop an owner inside its
 * section and a thief in its wait, tests/unit/test_races.c:
 * races::thief_waits_for_an_owner_inside, races::slot_flush_holds_off_release).
 *
 * Thieves of one object exclude each other by a lock of their own (the
 * entry lock for slots, the record's thief flag for thread records). */
#ifndef MAGPOOL_REVOKE_H
#define MAGPOOL_REVOKE_H

#include "asym.h"

typedef struct mp_revoke {
  _Atomic int active; /* owner inside its critical section               */
  _Atomic int revoke; /* a thief wants, or has, the data                 */
} mp_revoke;

/* Owner: enter, or back off (false: a thief holds or wants the data).
 * ACQUIRE on revoke, pairing with the thief's RELEASE of revoke = 0: what
 * it did to the data is visible. */
MP_INLINE bool mp_revoke_enter_owner(mp_revoke *r) {
  if (MP_TSAN) {
    mp_store_seq_cst(&r->active, 1);
    if (mp_load_seq_cst(&r->revoke) == 0) return true;
    mp_store_release(&r->active, 0);
    return false;
  }
  mp_store_relaxed(&r->active, 1);
  mp_asym_light(); /* StoreLoad between the store of active and the load of revoke */
  if (MP_LIKELY(mp_load_acquire(&r->revoke) == 0)) return true;
  mp_store_release(&r->active, 0);
  return false;
}

/* Owner: leave.  RELEASE: our writes happen before a thief that sees
 * active == 0 touches the data. */
MP_INLINE void mp_revoke_exit_owner(mp_revoke *r) { mp_store_release(&r->active, 0); }

/* Thief, holding its own exclusion: announce.  Call mp_asym_heavy (once
 * for any number of objects) before mp_revoke_wait. */
MP_INLINE void mp_revoke_begin(mp_revoke *r) { mp_store_seq_cst(&r->revoke, 1); }

/* Thief: wait until the owner is out.  ACQUIRE (the seq_cst load): pairs
 * with mp_revoke_exit_owner's RELEASE; the owner's writes are visible.
 * The owner's critical sections never block, so this wait is short. */
void mp_revoke_wait(mp_revoke *r);

/* Thief: hand back.  RELEASE: what the thief did is visible to the
 * owner's next enter. */
MP_INLINE void mp_revoke_end(mp_revoke *r) { mp_store_release(&r->revoke, 0); }

/* Thief: never hand back.  Every later enter fails; the owner learns
 * with mp_revoke_closed that the object is gone for good. */
#define MP_REVOKE_CLOSED 2
MP_INLINE void mp_revoke_close(mp_revoke *r) { mp_store_release(&r->revoke, MP_REVOKE_CLOSED); }
MP_INLINE bool mp_revoke_closed(mp_revoke *r) {
  return mp_load_acquire(&r->revoke) == MP_REVOKE_CLOSED;
}

#endif /* MAGPOOL_REVOKE_H */
