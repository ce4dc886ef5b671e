/* asym.c - the rare side of the asymmetric barrier (asym.h).
 * Layer 0: calls nothing of magpool's. */
#include "asym.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

bool mp_asym_ok;
static pthread_once_t asym_once = PTHREAD_ONCE_INIT;

static void asym_register(void) {
#if defined(__NR_membarrier)
  long q = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (q > 0 && (q & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
      syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
    mp_asym_ok = true;
#endif
}

void mp_asym_init(void) { pthread_once(&asym_once, asym_register); }

/* Once registration succeeded, the frequent sides rely on it and fence no
 * more, so a failing call (the kernel may answer ENOMEM) is retried, never
 * replaced by a local fence: that would leave them without a barrier. */
void mp_asym_heavy(void) {
  if (MP_TSAN) return; /* seq_cst flags instead */
#if defined(__NR_membarrier)
  if (mp_asym_ok) {
    for (unsigned tries = 0;
         syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0; tries++) {
      if (tries < 16) sched_yield();
      else usleep(1000);
    }
    return;
  }
#endif
  mp_fence_seq_cst(); /* the frequent sides fence themselves (mp_asym_ok false) */
}
