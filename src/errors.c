/* errors.c - the one error channel: codes, names, thread-local last
 * error.  Layer 0: every layer may call it; it calls nothing. */
#include "internal.h"

static _Thread_local int tls_last_error;
static _Thread_local int tls_last_cuda_error;

void *mp_fail(int code) {
  tls_last_error = code;
  return NULL;
}

void mp_set_cuda_error(int cuda_code) { tls_last_cuda_error = cuda_code; }

int magpool_last_error(void) { return tls_last_error; }
int magpool_last_cuda_error(void) { return tls_last_cuda_error; }

const char *magpool_strerror(int code) {
  switch (code) {
  case MAGPOOL_OK: return "success";
  case MAGPOOL_EINVAL: return "invalid argument";
  case MAGPOOL_ENOMEM: return "out of memory: the request does not fit in the pool";
  case MAGPOOL_ENOTSUP: return "operation not supported";
  case MAGPOOL_ENODEV: return "no CUDA device or driver";
  case MAGPOOL_ECUDA: return "a CUDA call failed";
  case MAGPOOL_ECAPTURE: return "stream is being captured into a CUDA graph";
  case MAGPOOL_EBUSY: return "resource busy";
  default: return "unknown magpool error code";
  }
}
