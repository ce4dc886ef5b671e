/* stream_cuda.c - stream ordering on CUDA streams: ids from
 * cudaStreamGetId, retire callbacks through cudaStreamAddCallback.
 * Layer 1.
 * Without CUDA in the build every operation answers MAGPOOL_ENODEV (no
 * DEVICE or PINNED pool can exist then anyway). */
#include "internal.h"

#if defined(MAGPOOL_HAVE_CUDA)
#include <cuda.h> /* types only: the driver is reached by entry point */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdlib.h>

/* The pool's source context starts with the device ordinal (source_cuda.c). */
static int dev_of(void *dev) { return dev != NULL ? *(int *)dev : 0; }

static int cuda_rc(cudaError_t e) {
  if (e == cudaSuccess) return 0;
  mp_set_cuda_error((int)e);
  return MAGPOOL_ECUDA;
}

static int cu_get_id(void *dev, magpool_stream_t s, uint64_t *id) {
  (void)dev;
  unsigned long long v = 0;
  int rc = cuda_rc(cudaStreamGetId((cudaStream_t)s, &v));
  if (rc == 0) *id = (uint64_t)v;
  return rc;
}

typedef struct cu_cb {
  void (*fn)(void *arg, int status);
  void *arg;
} cu_cb;

/* Runs on CUDA's callback thread: no CUDA calls here. */
static void CUDART_CB cu_trampoline(cudaStream_t s, cudaError_t status, void *arg) {
  (void)s;
  cu_cb c = *(cu_cb *)arg;
  free(arg);
  c.fn(c.arg, (int)status);
}

static int cu_after(void *dev, magpool_stream_t s, void (*fn)(void *, int), void *arg) {
  (void)dev;
  cu_cb *c = malloc(sizeof *c);
  if (c == NULL) return MAGPOOL_ENOMEM;
  c->fn = fn;
  c->arg = arg;
  /* cudaStreamAddCallback is slated for deprecation in favour of
   * cudaLaunchHostFunc, but unlike it, it also runs after a device error
   * (with the error as status), so a batch is never stranded. */
  int rc = cuda_rc(cudaStreamAddCallback((cudaStream_t)s, cu_trampoline, c, 0));
  if (rc != 0) free(c);
  return rc;
}

static int cu_sync_all(void *dev) {
  int saved = 0, d = dev_of(dev);
  if (cudaGetDevice(&saved) != cudaSuccess) return MAGPOOL_ECUDA;
  if (saved != d && cudaSetDevice(d) != cudaSuccess) return MAGPOOL_ECUDA;
  int rc = cuda_rc(cudaDeviceSynchronize());
  if (saved != d) (void)cudaSetDevice(saved);
  return rc;
}

static int cu_sync(void *dev, magpool_stream_t s) {
  /* cudaStreamPerThread names the calling thread's stream: from another
   * thread (the out-of-memory ladder) only a device-wide wait is right. */
  if ((cudaStream_t)s == cudaStreamPerThread) return cu_sync_all(dev);
  return cuda_rc(cudaStreamSynchronize((cudaStream_t)s));
}

/* The driver's cuStreamIsCapturing, cuStreamQuery and
 * cuThreadExchangeStreamCaptureMode, found once through the runtime (no
 * libcuda link): on the H200 cuStreamIsCapturing takes 20 ns where
 * cudaStreamIsCapturing takes 60 (every async free asks it:
 * capture_check), cuStreamQuery 0.17 us where cudaStreamQuery takes 0.33
 * (the idle op asks it), and neither touches the runtime's last-error
 * slot.  Looked up with the default-stream semantics this file is built
 * with, as the runtime calls they stand for; NULL where a lookup fails. */
static CUresult (*drv_is_capturing)(CUstream, CUstreamCaptureStatus *);
static CUresult (*drv_query)(CUstream);
static CUresult (*drv_exchange_mode)(CUstreamCaptureMode *);
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void *drv_fn(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return q == cudaDriverEntryPointSuccess ? fn : NULL;
}

static void drv_init(void) {
  drv_is_capturing = (CUresult(*)(CUstream, CUstreamCaptureStatus *))drv_fn("cuStreamIsCapturing");
  drv_query = (CUresult(*)(CUstream))drv_fn("cuStreamQuery");
  drv_exchange_mode = (CUresult(*)(CUstreamCaptureMode *))drv_fn("cuThreadExchangeStreamCaptureMode");
}

/* The driver's answer: 1 if s is being captured, 0 if not, -1 if the
 * driver cannot say (no entry point, or an error of its own). */
static int drv_capturing(magpool_stream_t s) {
  pthread_once(&drv_once, drv_init);
  CUstreamCaptureStatus ds = CU_STREAM_CAPTURE_STATUS_NONE;
  if (drv_is_capturing == NULL || drv_is_capturing((CUstream)s, &ds) != CUDA_SUCCESS) return -1;
  return ds != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* 1 if s is being captured, 0 if not, or a magpool error.  The driver is
 * asked first; on any error of its own (the legacy stream of a thread
 * with no current context, say) the runtime call answers instead, which
 * sets up the context and reports its errors as before. */
static int cu_capturing(void *dev, magpool_stream_t s) {
  (void)dev;
  int d = drv_capturing(s);
  if (d >= 0) return d;
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing((cudaStream_t)s, &st);
  if (e != cudaSuccess) return cuda_rc(e);
  return st != cudaStreamCaptureStatusNone;
}

static bool cu_per_thread(magpool_stream_t s) { return (cudaStream_t)s == cudaStreamPerThread; }

/* Has s finished everything queued on it?  Never waits; 0 when not known.
 *   - cudaStreamPerThread: not asked (the handle names the calling
 *     thread's stream, and a retire may run on another thread);
 *   - a stream being captured: not asked (querying it would invalidate
 *     the capture), nor a stream whose capture status cannot be read;
 *   - the query runs in relaxed capture mode (the thread's capture mode
 *     exchanged around it), so that a capture in global mode on another
 *     thread does not count it as a prohibited call.
 * Through the driver (cuStreamIsCapturing, cuStreamQuery: half the cost
 * of the runtime calls, and no last-error slot to keep clear).  An error
 * in the driver's capture question (no current context on this thread,
 * say) hands over to the runtime calls (idle_runtime), which set one up.
 * Success orders: every operation queued on s before the query has
 * completed and its writes are visible to work queued afterwards on any
 * stream (as with cudaEventQuery). */
static int idle_runtime(cudaStream_t cs);

static int cu_idle(void *dev, magpool_stream_t s) {
  (void)dev;
  cudaStream_t cs = (cudaStream_t)s;
  if (cs == cudaStreamPerThread) return 0;
  int d = drv_capturing(s);
  if (d < 0 || drv_query == NULL || drv_exchange_mode == NULL) return idle_runtime(cs);
  if (d) return 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (drv_exchange_mode(&mode) != CUDA_SUCCESS) return 0;
  CUresult r = drv_query((CUstream)cs);
  (void)drv_exchange_mode(&mode);
  return r == CUDA_SUCCESS;
}

/* cu_idle through the runtime.  Not asked while the program has an error
 * pending (cudaPeekAtLastError): a "not ready" answer must be cleared
 * from the last-error slot afterwards, and that must not clear the
 * program's error. */
static int idle_runtime(cudaStream_t cs) {
  if (cudaPeekAtLastError() != cudaSuccess) return 0;
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(cs, &st) != cudaSuccess) {
    (void)cudaGetLastError(); /* ours: the slot was clear above */
    return 0;
  }
  if (st != cudaStreamCaptureStatusNone) return 0;
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cudaError_t e = cudaStreamQuery(cs);
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  if (e != cudaSuccess) (void)cudaGetLastError(); /* not ready, or an error: not known */
  return e == cudaSuccess;
}

/* cross_stream_reuse: an event recorded on s, waited for by t, on the
 * pool's device.  Destroying it at once is fine: the wait holds on to
 * what it needs.  A failure leaves no error in the runtime's last-error
 * slot (the caller only does without the memory). */
static int cu_wait(void *dev, magpool_stream_t t, magpool_stream_t s) {
  int saved = 0, d = dev_of(dev);
  if (cudaGetDevice(&saved) != cudaSuccess) return MAGPOOL_ECUDA;
  if (saved != d && cudaSetDevice(d) != cudaSuccess) return MAGPOOL_ECUDA;
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) {
    e = cudaEventRecord(ev, (cudaStream_t)s);
    if (e == cudaSuccess) e = cudaStreamWaitEvent((cudaStream_t)t, ev, 0);
    (void)cudaEventDestroy(ev);
  }
  if (e != cudaSuccess) (void)cudaGetLastError();
  if (saved != d) (void)cudaSetDevice(saved);
  return e == cudaSuccess ? 0 : MAGPOOL_ECUDA;
}

const mp_stream_ops mp_cuda_stream_ops = {
  .get_id = cu_get_id,
  .after = cu_after,
  .sync = cu_sync,
  .capturing = cu_capturing,
  .sync_all = cu_sync_all,
  .per_thread = cu_per_thread,
  .idle = cu_idle,
  .wait = cu_wait,
  .check_capture = true,
};

#else

static int nocuda_get_id(void *dev, magpool_stream_t s, uint64_t *id) {
  (void)dev; (void)s; (void)id;
  return MAGPOOL_ENODEV;
}
static int nocuda_after(void *dev, magpool_stream_t s, void (*fn)(void *, int), void *arg) {
  (void)dev; (void)s; (void)fn; (void)arg;
  return MAGPOOL_ENODEV;
}
static int nocuda_sync(void *dev, magpool_stream_t s) {
  (void)dev; (void)s;
  return MAGPOOL_ENODEV;
}
static int nocuda_capturing(void *dev, magpool_stream_t s) {
  (void)dev; (void)s;
  return MAGPOOL_ENODEV;
}
static int nocuda_sync_all(void *dev) {
  (void)dev;
  return MAGPOOL_ENODEV;
}

static bool nocuda_per_thread(magpool_stream_t s) {
  (void)s;
  return false;
}

const mp_stream_ops mp_cuda_stream_ops = {
  .get_id = nocuda_get_id,
  .after = nocuda_after,
  .sync = nocuda_sync,
  .capturing = nocuda_capturing,
  .sync_all = nocuda_sync_all,
  .per_thread = nocuda_per_thread,
  .check_capture = true,
};
#endif
