/* hook.c - the test hooks (base.h): one process-wide function pointer,
 * called at named points on slow paths.  Layer 0. */
#include "internal.h"

_Atomic(mp_hook_fn) mp_hook_current;

void mp_hook_set(mp_hook_fn fn) { mp_store_relaxed(&mp_hook_current, fn); }
