/* source_fail.c - a host source and host-stream ordering that fail on
 * demand, for the growth, out-of-memory and retire tests
 * (mp_source_failing_arm, mp_stream_failing_arm).  Layer 1: they wrap the
 * host tables. */
#include "internal.h"

#include <stdlib.h>

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

/* ----------------------------------------------------- failing ordering */

/* Host-stream ordering that fails on demand (retire's failure paths):
 * while armed, the next `countdown` after() calls succeed and every later
 * one fails with MAGPOOL_ENOMEM; callbacks report `status` (a device
 * error) when it is nonzero. */
static _Atomic long after_countdown = -1;
static _Atomic int callback_status;

void mp_stream_failing_arm(long countdown, int status) {
  mp_store_relaxed(&callback_status, status);
  mp_store_relaxed(&after_countdown, countdown);
}

typedef struct fail_cb {
  void (*fn)(void *arg, int status);
  void *arg;
  int status;
} fail_cb;

static void fail_trampoline(void *arg, int status) {
  fail_cb c = *(fail_cb *)arg;
  free(arg);
  c.fn(c.arg, c.status != 0 ? c.status : status);
}

static int failing_after(void *dev, magpool_stream_t s, void (*fn)(void *, int), void *arg) {
  long c = mp_load_relaxed(&after_countdown);
  while (c >= 0) {
    if (c == 0) return MAGPOOL_ENOMEM;
    if (mp_cas_weak_relaxed(&after_countdown, &c, c - 1)) break;
  }
  fail_cb *cb = malloc(sizeof *cb);
  if (cb == NULL) return MAGPOOL_ENOMEM;
  cb->fn = fn;
  cb->arg = arg;
  cb->status = mp_load_relaxed(&callback_status);
  int rc = mp_host_stream_ops.after(dev, s, fail_trampoline, cb);
  if (rc != 0) free(cb);
  return rc;
}

static int failing_get_id(void *dev, magpool_stream_t s, uint64_t *id) {
  return mp_host_stream_ops.get_id(dev, s, id);
}
static int failing_sync(void *dev, magpool_stream_t s) { return mp_host_stream_ops.sync(dev, s); }
static int failing_capturing(void *dev, magpool_stream_t s) {
  return mp_host_stream_ops.capturing(dev, s);
}
static int failing_sync_all(void *dev) { return mp_host_stream_ops.sync_all(dev); }
static bool failing_per_thread(magpool_stream_t s) { return mp_host_stream_ops.per_thread(s); }

const mp_stream_ops mp_stream_failing_ops = {
  .get_id = failing_get_id,
  .after = failing_after,
  .sync = failing_sync,
  .capturing = failing_capturing,
  .sync_all = failing_sync_all,
  .per_thread = failing_per_thread,
  .check_capture = false,
};
