/* asym.h - the asymmetric StoreLoad barrier (asym.c), layer 0: a Dekker
 * handshake whose frequent side must stay cheap and whose rare side may
 * make a system call, as liburcu's membarrier flavour does.  Used by the
 * revoke handshake (revoke.h: owner vs thief) and by the chunk map (a
 * take of run-space chunks vs an unmap, chunk.c and chunk_unmap.c).
 *
 * The frequent side stores its flag, calls mp_asym_light, then loads the
 * other side's flag.  The rare side stores its flag, calls mp_asym_heavy
 * (membarrier(PRIVATE_EXPEDITED): every running thread of the process
 * executes a full barrier), then loads.  Either the frequent side's store
 * reached the rare side's load, or the frequent side's load came after
 * the barrier and sees the rare side's store.  Where membarrier is not
 * available both sides fence.  Under ThreadSanitizer, which models
 * neither membarrier nor fences, mp_asym_heavy does nothing, mp_asym_light
 * fences, and the callers make the flags' stores and loads seq_cst: the
 * same argument in the one total order, in a form TSan checks. */
#ifndef MAGPOOL_ASYM_H
#define MAGPOOL_ASYM_H

#include "atomic.h"
#include "base.h"

/* True when membarrier(PRIVATE_EXPEDITED) is registered.  Set once by
 * mp_asym_init, before any pool exists; read-only after. */
extern bool mp_asym_ok;

/* Once per process (pthread_once inside). */
void mp_asym_init(void);

/* The rare side: a full barrier on every running thread of the process
 * (retried, never replaced by a one-sided fence once the frequent sides
 * rely on it). */
void mp_asym_heavy(void);

/* The frequent side.  With membarrier the rare side supplies the hardware
 * barrier and the compiler must only keep the order; without it, or under
 * TSan, a full fence here. */
MP_INLINE void mp_asym_light(void) {
  if (!MP_TSAN && MP_LIKELY(mp_asym_ok)) mp_signal_fence_seq_cst();
  else mp_fence_seq_cst();
}

#endif /* MAGPOOL_ASYM_H */
