/* source_fail.c - a host source that fails on demand, for the growth and
 * out-of-memory tests (mp_source_failing_arm).  Layer 1: it wraps the host
 * source's table. */
#include "internal.h"

static _Atomic long fail_countdown = -1; /* < 0: disarmed */

void mp_source_failing_arm(long countdown) { mp_store_relaxed(&fail_countdown, countdown); }

static int failing_reserve(void *ctx, size_t size, void **base) {
  long c = mp_load_relaxed(&fail_countdown);
  while (c >= 0) {
    if (c == 0) return MAGPOOL_ENOMEM;
    if (mp_cas_weak_relaxed(&fail_countdown, &c, c - 1)) break;
  }
  return mp_source_host.reserve(ctx, size, base);
}

static int failing_release(void *ctx, void *base, size_t size) {
  return mp_source_host.release(ctx, base, size);
}

static int failing_decommit(void *ctx, void *addr, size_t size) {
  return mp_source_host.decommit(ctx, addr, size);
}

const mp_source_ops mp_source_failing = {
  .name = "failing",
  .reserve = failing_reserve,
  .release = failing_release,
  .commit = NULL,
  .decommit = failing_decommit,
  .open = NULL,
  .close = NULL,
};
