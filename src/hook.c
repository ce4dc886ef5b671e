/* hook.c - the test hooks (base.h): one process-wide function pointer,
 * called at named points on slow paths; and the ThreadSanitizer
 * annotations.  Layer 0. */
#include "internal.h"

_Atomic(mp_hook_fn) mp_hook_current;

void mp_hook_set(mp_hook_fn fn) { mp_store_relaxed(&mp_hook_current, fn); }

void __tsan_acquire(void *addr) __attribute__((weak));
void __tsan_release(void *addr) __attribute__((weak));

void mp_tsan_release(void *addr) {
  if (MP_TSAN) __tsan_release(addr);
}

void mp_tsan_acquire(void *addr) {
  if (MP_TSAN) __tsan_acquire(addr);
}
