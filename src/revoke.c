/* revoke.c - the thief's wait of the revoke handshake (revoke.h).
 * Layer 0: calls nothing of magpool's. */
#include "revoke.h"

#include <sched.h>

void mp_revoke_wait(mp_revoke *r) {
  while (mp_load_seq_cst(&r->active) != 0) {
    MP_HOOK(MP_HOOK_REVOKE_WAIT, r);
    sched_yield();
  }
}
