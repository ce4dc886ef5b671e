/* replay_cuda.c - the CUDA side of magpool-replay: the device probe, CUDA
 * streams for magpool's async mode, and the three peers.
 *
 * The peers run with --kind device only, on device 0; with another kind, or
 * with no usable GPU, or in a build without CUDA, their rows say
 * result=skipped (and stderr says why).
 *
 *   cudaMallocAsync  the device's default memory pool.  Its release
 *       threshold is set to UINT64_MAX for the run: at the default (0) the
 *       pool unmaps everything free at every synchronisation, so pass 2
 *       would start cold again; with it, what pass 1 took stays mapped, as
 *       magpool keeps what it mapped.  The pool is trimmed to 0 before
 *       pass 1 (cold) and after the last pass, and the threshold is then
 *       set back.  sync mode: every event on the legacy default stream;
 *       async: one non-blocking stream per trace stream.  peak_reserved:
 *       cudaMemPoolAttrReservedMemHigh, reset at the start of every pass.
 *   cudaMalloc  sync only (async rows are result=skipped).  Its footprint
 *       is what the driver gives out: cudaMemGetInfo is read after every
 *       allocation, relative to what was free before the first pass (the
 *       driver keeps freed small blocks' pages for later passes).  The
 *       reading is not timed: each cudaMalloc / cudaFree is timed alone
 *       with CLOCK_MONOTONIC, and ns_per_event is their sum / events.
 *   cub  cub::CachingDeviceAllocator with its defaults (replay_cub.h),
 *       made fresh for pass 1 and kept for the later passes; sync mode on
 *       the legacy default stream, async on one stream per trace stream.
 *       peak_reserved: what the driver gives out, as for cudaMalloc
 *       (cudaMemGetInfo against the free memory before the first pass),
 *       read after each allocation that cub served from the device (its
 *       cached + live bytes rose: it called cudaMalloc), inside the timed
 *       loop (1-2 us against that cudaMalloc's tens).  cub's own count
 *       left out the driver's rounding: its blocks over its largest bin
 *       (2 MiB) are cudaMalloc'd at their size, which the driver rounds
 *       to 2 MiB, so it read 1.001-1.009 where cudaMalloc reads 1.010-1.059
 *       (run 145, docs/benchmarks.md).
 *
 * With --lag, the async passes of both stream-ordered peers hold their
 * streams behind the replay with the gate kernels of replay_gate.cu, as
 * magpool's runner does: the same marks at the same events.
 *
 * --threads (replay_threads.c): the calls from a thread per trace stream.
 * cudaMallocAsync's footprint is its pool's attribute, as without;
 * cudaMalloc's is cudaMemGetInfo read by the worker after each allocation,
 * and cub's the same after each allocation that raised its counters (the
 * peak of what they say then: a free on another thread between a call and
 * its read may hide a peak by what that free gave back to the device); cub's calls
 * go one at a time (cub_t_alloc says why).  Both reads are inside the timed pass, where the single-threaded
 * replay keeps cudaMalloc's out of it: about 1-2 us against cudaMalloc's
 * tens.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"

#if BENCH_HAVE_CUDA

#include <cuda_runtime_api.h>

#include "replay_cub.h"

#define DEV 0

static int check(const char *what, cudaError_t e) {
  if (e == cudaSuccess) return 0;
  fprintf(stderr, "magpool-replay: %s: %s (%s)\n", what, cudaGetErrorName(e),
          cudaGetErrorString(e));
  return -1;
}

int replay_cuda_present(void) {
  static int known = -1;
  if (known >= 0) return known;
  int n = 0;
  known = cudaGetDeviceCount(&n) == cudaSuccess && n > 0 && cudaSetDevice(DEV) == cudaSuccess &&
          cudaFree(NULL) == cudaSuccess;
  cudaGetLastError();
  return known;
}

int replay_cuda_streams_create(void **out, uint32_t n) {
  for (uint32_t k = 0; k < n; k++) {
    cudaStream_t s = NULL;
    if (check("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)))
      return -1;
    out[k] = s;
  }
  return 0;
}

int replay_cuda_streams_sync(void **s, uint32_t n) {
  int bad = 0;
  for (uint32_t k = 0; k < n; k++)
    if (s[k] != NULL && check("cudaStreamSynchronize", cudaStreamSynchronize(s[k]))) bad = -1;
  return bad;
}

void replay_cuda_streams_destroy(void **s, uint32_t n) {
  for (uint32_t k = 0; k < n; k++)
    if (s[k] != NULL) {
      check("cudaStreamDestroy", cudaStreamDestroy(s[k]));
      s[k] = NULL;
    }
}

/* Why a peer does not run here, or NULL. */
static const char *peer_unavailable(const replay_opts *o) {
  if (o->kind != REPLAY_DEVICE) return "needs --kind device";
  if (!replay_cuda_present()) return "no usable CUDA device";
  return NULL;
}

static enum replay_status cuda_fail_status(cudaError_t e) {
  cudaGetLastError(); /* an out-of-memory error is not sticky: clear it */
  return e == cudaErrorMemoryAllocation ? REPLAY_OOM : REPLAY_ERROR;
}

static void note_error(const replay_trace *t, const char *peer, const replay_result *r,
                       cudaError_t e) {
  if (r->status == REPLAY_ERROR)
    fprintf(stderr, "magpool-replay: %s: %s, event %zu: %s\n", t->name, peer, r->fail_event,
            cudaGetErrorString(e));
}

/* Streams for a peer: n non-blocking ones (async), or n legacy ones. */
static cudaStream_t *peer_streams(const replay_trace *t, enum replay_mode mode) {
  cudaStream_t *st = calloc(t->nstreams, sizeof *st);
  if (st == NULL) return NULL;
  if (mode == REPLAY_ASYNC && replay_cuda_streams_create((void **)st, t->nstreams) != 0) {
    replay_cuda_streams_destroy((void **)st, t->nstreams);
    free(st);
    return NULL;
  }
  return st;
}

/* --lag: the gate of event i's mark on every stream (every o->lag events).
 * true if it could not be queued: the pass stops with an error. */
static bool lag_mark(replay_gates *gt, cudaStream_t *st, const replay_trace *t, size_t i,
                     const replay_opts *o, replay_result *r) {
  if (replay_gates_mark(gt, (void **)st, t->nstreams, i / o->lag + 1) == 0) return false;
  r->status = REPLAY_ERROR;
  return true;
}

static void peer_streams_free(const replay_trace *t, cudaStream_t *st) {
  if (st == NULL) return;
  cudaDeviceSynchronize();
  replay_cuda_streams_destroy((void **)st, t->nstreams);
  free(st);
}

/* --threads: what a peer's workers share - its streams (legacy ones in
 * sync mode), cub, and the highest footprint a worker read this pass. */
typedef struct peer_tctx {
  cudaStream_t *st;
  replay_cub *cub;
  pthread_mutex_t cub_mu; /* cub's calls, one at a time (below) */
  size_t free0; /* cudaMalloc, cub: device memory free before the first pass */
  _Atomic uint64_t peak;
} peer_tctx;

static void peak_note(peer_tctx *c, uint64_t v) {
  uint64_t old = atomic_load_explicit(&c->peak, memory_order_relaxed);
  while (v > old && !atomic_compare_exchange_weak_explicit(&c->peak, &old, v, memory_order_relaxed,
                                                           memory_order_relaxed)) {
  }
}

/* ------------------------------------------------------------------ */
/* cudaMallocAsync                                                    */
/* ------------------------------------------------------------------ */

/* --threads: the calls, from the stream's worker (legacy streams, NULL,
 * in sync mode); an error other than lack of memory is printed here, by
 * the thread that has it. */
static enum replay_status cma_t_alloc(void *ctx, uint64_t size, uint32_t stream, void **out) {
  cudaError_t e = cudaMallocAsync(out, size, ((cudaStream_t *)ctx)[stream]);
  if (e == cudaSuccess) return REPLAY_COMPLETED;
  *out = NULL;
  enum replay_status st = cuda_fail_status(e);
  if (st == REPLAY_ERROR) check("cudaMallocAsync", e);
  return st;
}

static int cma_t_free(void *ctx, void *p, uint32_t stream) {
  return check("cudaFreeAsync", cudaFreeAsync(p, ((cudaStream_t *)ctx)[stream]));
}

int replay_run_cuda_malloc_async(const replay_trace *t, const replay_opts *o,
                                 enum replay_mode mode, replay_result *res) {
  const char *why = peer_unavailable(o);
  if (why != NULL) {
    fprintf(stderr, "magpool-replay: cudaMallocAsync skipped: %s\n", why);
    replay_fill(res, o->passes, REPLAY_SKIPPED);
    return 0;
  }
  cudaMemPool_t mp;
  if (check("cudaDeviceGetDefaultMemPool", cudaDeviceGetDefaultMemPool(&mp, DEV))) return -1;
  uint64_t old_thr = 0, thr = UINT64_MAX, zero = 0;
  if (check("cudaMemPoolGetAttribute(ReleaseThreshold)",
            cudaMemPoolGetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &old_thr)) ||
      check("cudaMemPoolSetAttribute(ReleaseThreshold)",
            cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &thr)))
    return -1;
  void **ptrs = calloc(t->nslots ? t->nslots : 1, sizeof *ptrs);
  cudaStream_t *st = peer_streams(t, mode);
  replay_gates *gt = NULL;
  replay_threads *wk = NULL;
  int ret = -1;
  if (ptrs == NULL || st == NULL || (o->lag != 0 && (gt = replay_gates_new()) == NULL)) goto out;
  if (check("cudaDeviceSynchronize", cudaDeviceSynchronize()) ||
      check("cudaMemPoolTrimTo", cudaMemPoolTrimTo(mp, 0)))
    goto out;
  if (o->threads) {
    replay_tops ops = {cma_t_alloc, cma_t_free, st};
    if ((wk = replay_threads_new(t, o, &ops)) == NULL) goto out;
  }

  for (int p = 0; p < o->passes; p++) {
    replay_result *r = &res[p];
    memset(r, 0, sizeof *r);
    if (check("cudaMemPoolSetAttribute(ReservedMemHigh)",
              cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReservedMemHigh, &zero)))
      goto out;
    uint64_t live = 0, peak = 0;
    size_t i, n = t->nevents;
    cudaError_t e = cudaSuccess;
    if (gt != NULL) replay_gates_set(gt, 0);
    replay_clock clk;
    replay_clock_start(&clk);
    if (wk != NULL) n = 0; /* the workers replay it */
    for (i = 0; i < n; i++) {
      const replay_event ev = t->ev[i];
      const uint64_t sz = t->size[ev.slot];
      cudaStream_t s = st[replay_stream(ev)];
      if (gt != NULL && i % o->lag == 0 && lag_mark(gt, st, t, i, o, r)) break;
      const uint64_t k0 = replay_call_start(o);
      if (!replay_is_free(ev)) {
        e = cudaMallocAsync(&ptrs[ev.slot], sz, s);
        replay_call_end(o, &clk, k0);
        if (e != cudaSuccess) {
          ptrs[ev.slot] = NULL;
          r->status = cuda_fail_status(e);
          break;
        }
        live += sz;
        if (live > peak) peak = live;
      } else {
        e = cudaFreeAsync(ptrs[ev.slot], s);
        replay_call_end(o, &clk, k0);
        if (e != cudaSuccess) {
          r->status = cuda_fail_status(e);
          break;
        }
        ptrs[ev.slot] = NULL;
        live -= sz;
      }
      if (o->csv != NULL) {
        uint64_t cur = 0;
        cudaMemPoolGetAttribute(mp, cudaMemPoolAttrReservedMemCurrent, &cur);
        replay_csv_row(o->csv, i, live, cur, "cudaMallocAsync", t->name, p + 1);
      }
    }
    r->ns = replay_clock_ns(o, &clk);
    if (gt != NULL) replay_gates_set(gt, UINT64_MAX);
    r->events = i < n ? i + 1 : n;
    r->fail_event = i;
    r->peak_live = peak;
    if (wk != NULL) {
      replay_threads_pass(wk, r);
      for (size_t k = 0; k < t->nslots; k++) ptrs[k] = replay_threads_take(wk, k);
    } else {
      note_error(t, "cudaMallocAsync", r, e);
    }
    uint64_t high = 0;
    cudaMemPoolGetAttribute(mp, cudaMemPoolAttrReservedMemHigh, &high);
    r->peak_reserved = high;
    if (check("cudaDeviceSynchronize", cudaDeviceSynchronize())) goto out;
    for (size_t k = 0; k < t->nslots; k++)
      if (ptrs[k] != NULL) {
        check("cudaFreeAsync", cudaFreeAsync(ptrs[k], 0));
        ptrs[k] = NULL;
      }
    if (check("cudaDeviceSynchronize", cudaDeviceSynchronize())) goto out;
  }
  ret = 0;
out:
  replay_threads_free(wk);
  if (gt != NULL) replay_gates_set(gt, UINT64_MAX);
  peer_streams_free(t, st);
  replay_gates_free(gt);
  free(ptrs);
  /* The frees queued on the streams just destroyed complete after the
   * destroy returns: wait for them, or the pool would release their
   * memory at a later synchronisation, under the next allocator's
   * baseline (cudaMalloc's --threads pass read 0 bytes taken, run 110). */
  cudaDeviceSynchronize();
  cudaMemPoolTrimTo(mp, 0);
  cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &old_thr);
  return ret;
}

/* ------------------------------------------------------------------ */
/* cudaMalloc                                                         */
/* ------------------------------------------------------------------ */

/* --threads: the calls, and the device's memory taken, read after each
 * allocation by the worker that made it. */
static enum replay_status cm_t_alloc(void *ctx, uint64_t size, uint32_t stream, void **out) {
  peer_tctx *c = ctx;
  (void)stream;
  cudaError_t e = cudaMalloc(out, size);
  if (e != cudaSuccess) {
    *out = NULL;
    enum replay_status st = cuda_fail_status(e);
    if (st == REPLAY_ERROR) check("cudaMalloc", e);
    return st;
  }
  size_t f = 0, total = 0;
  if (cudaMemGetInfo(&f, &total) == cudaSuccess && f < c->free0) peak_note(c, c->free0 - f);
  return REPLAY_COMPLETED;
}

static int cm_t_free(void *ctx, void *p, uint32_t stream) {
  (void)ctx, (void)stream;
  return check("cudaFree", cudaFree(p));
}

int replay_run_cuda_malloc(const replay_trace *t, const replay_opts *o, enum replay_mode mode,
                           replay_result *res) {
  const char *why = mode == REPLAY_ASYNC ? "sync mode only" : peer_unavailable(o);
  if (why != NULL) {
    fprintf(stderr, "magpool-replay: cudaMalloc skipped: %s\n", why);
    replay_fill(res, o->passes, REPLAY_SKIPPED);
    return 0;
  }
  void **ptrs = calloc(t->nslots ? t->nslots : 1, sizeof *ptrs);
  if (ptrs == NULL) return -1;
  peer_tctx tc = {.st = NULL};
  replay_threads *wk = NULL;
  if (o->threads) {
    replay_tops ops = {cm_t_alloc, cm_t_free, &tc};
    if ((wk = replay_threads_new(t, o, &ops)) == NULL) {
      free(ptrs);
      return -1;
    }
  }
  /* One baseline for every pass: the driver keeps the pages of freed small
   * blocks for its next cudaMalloc, so a later pass's own baseline would
   * not see it reuse them (tiny.trace's second pass read 0 bytes taken). */
  size_t free0 = 0, total = 0, f = 0;
  cudaMemPool_t mp; /* and nothing of the stream-ordered pool's left to release under it */
  if (check("cudaDeviceSynchronize", cudaDeviceSynchronize()) ||
      (cudaDeviceGetDefaultMemPool(&mp, DEV) == cudaSuccess &&
       check("cudaMemPoolTrimTo", cudaMemPoolTrimTo(mp, 0))) ||
      check("cudaMemGetInfo", cudaMemGetInfo(&free0, &total))) {
    replay_threads_free(wk);
    free(ptrs);
    return -1;
  }
  for (int p = 0; p < o->passes; p++) {
    replay_result *r = &res[p];
    memset(r, 0, sizeof *r);
    if (check("cudaDeviceSynchronize", cudaDeviceSynchronize())) {
      replay_threads_free(wk);
      free(ptrs);
      return -1;
    }
    uint64_t live = 0, peak = 0, peak_res = 0, ns = 0, taken = 0;
    size_t i, n = t->nevents;
    if (wk != NULL) { /* the workers replay it */
      tc.free0 = free0;
      atomic_store_explicit(&tc.peak, 0, memory_order_relaxed);
      replay_threads_pass(wk, r);
      r->peak_reserved = atomic_load_explicit(&tc.peak, memory_order_relaxed);
      for (size_t k = 0; k < t->nslots; k++)
        if ((ptrs[k] = replay_threads_take(wk, k)) != NULL) check("cudaFree", cudaFree(ptrs[k]));
      continue;
    }
    cudaError_t e = cudaSuccess;
    for (i = 0; i < n; i++) {
      const replay_event ev = t->ev[i];
      const uint64_t sz = t->size[ev.slot];
      if (o->evict != 0) replay_evict(o); /* each call is timed alone anyway */
      const uint64_t t0 = replay_now_ns();
      if (!replay_is_free(ev)) {
        e = cudaMalloc(&ptrs[ev.slot], sz);
        ns += replay_now_ns() - t0;
        if (e != cudaSuccess) {
          ptrs[ev.slot] = NULL;
          r->status = cuda_fail_status(e);
          break;
        }
        live += sz;
        if (live > peak) peak = live;
        /* Sampled outside the timed call. */
        if (cudaMemGetInfo(&f, &total) == cudaSuccess) taken = f < free0 ? free0 - f : 0;
        if (taken > peak_res) peak_res = taken;
      } else {
        e = cudaFree(ptrs[ev.slot]);
        ns += replay_now_ns() - t0;
        if (e != cudaSuccess) {
          r->status = cuda_fail_status(e);
          break;
        }
        ptrs[ev.slot] = NULL;
        live -= sz;
        if (o->csv != NULL && cudaMemGetInfo(&f, &total) == cudaSuccess)
          taken = f < free0 ? free0 - f : 0;
      }
      if (o->csv != NULL) replay_csv_row(o->csv, i, live, taken, "cudaMalloc", t->name, p + 1);
    }
    r->ns = ns;
    r->events = i < n ? i + 1 : n;
    r->fail_event = i;
    r->peak_live = peak;
    r->peak_reserved = peak_res;
    note_error(t, "cudaMalloc", r, e);
    for (size_t k = 0; k < t->nslots; k++)
      if (ptrs[k] != NULL) {
        check("cudaFree", cudaFree(ptrs[k]));
        ptrs[k] = NULL;
      }
  }
  replay_threads_free(wk);
  free(ptrs);
  return 0;
}

/* ------------------------------------------------------------------ */
/* cub                                                                */
/* ------------------------------------------------------------------ */

/* --threads: the calls, and cub's counters, read after each allocation
 * by the worker that made it.  One call at a time, under cub_mu: cub's
 * DeviceFree records a cached block's ready event after releasing its
 * lock, and meanwhile another thread on the same stream may take the
 * block, free it past cub's cache limit and destroy that event; with 16
 * threads on the legacy stream the replay crashed so every time (run 98,
 * docs/benchmarks.md).  cub takes its own lock for each call anyway. */
static enum replay_status cub_t_alloc(void *ctx, uint64_t size, uint32_t stream, void **out) {
  peer_tctx *c = ctx;
  pthread_mutex_lock(&c->cub_mu);
  uint64_t held = replay_cub_held(c->cub);
  cudaError_t e = (cudaError_t)replay_cub_alloc(c->cub, out, size, (struct CUstream_st *)c->st[stream]);
  size_t f = 0, total = 0;
  if (e == cudaSuccess && replay_cub_held(c->cub) > held && cudaMemGetInfo(&f, &total) == cudaSuccess &&
      f < c->free0)
    peak_note(c, c->free0 - f);
  pthread_mutex_unlock(&c->cub_mu);
  if (e != cudaSuccess) {
    *out = NULL;
    enum replay_status st = cuda_fail_status(e);
    if (st == REPLAY_ERROR) check("cub DeviceAllocate", e);
    return st;
  }
  return REPLAY_COMPLETED;
}

static int cub_t_free(void *ctx, void *p, uint32_t stream) {
  peer_tctx *c = ctx;
  (void)stream;
  pthread_mutex_lock(&c->cub_mu);
  cudaError_t e = (cudaError_t)replay_cub_free(c->cub, p);
  pthread_mutex_unlock(&c->cub_mu);
  return check("cub DeviceFree", e);
}

int replay_run_cub(const replay_trace *t, const replay_opts *o, enum replay_mode mode,
                   replay_result *res) {
  const char *why = peer_unavailable(o);
  if (why != NULL) {
    fprintf(stderr, "magpool-replay: cub skipped: %s\n", why);
    replay_fill(res, o->passes, REPLAY_SKIPPED);
    return 0;
  }
  replay_cub *cub = NULL;
  if (check("cub create", (cudaError_t)replay_cub_create(DEV, &cub))) return -1;
  const size_t *cached, *livec;
  replay_cub_counters(cub, &cached, &livec);
  void **ptrs = calloc(t->nslots ? t->nslots : 1, sizeof *ptrs);
  cudaStream_t *st = peer_streams(t, mode);
  replay_gates *gt = NULL;
  replay_threads *wk = NULL;
  peer_tctx tc = {.st = st, .cub = cub};
  pthread_mutex_init(&tc.cub_mu, NULL);
  int ret = -1;
  size_t total = 0, f = 0;
  if (ptrs == NULL || st == NULL || (o->lag != 0 && (gt = replay_gates_new()) == NULL)) goto out;
  /* One baseline for every pass, as cudaMalloc's (cub keeps its cache). */
  if (check("cudaDeviceSynchronize", cudaDeviceSynchronize()) ||
      check("cudaMemGetInfo", cudaMemGetInfo(&tc.free0, &total)))
    goto out;
  if (o->threads) {
    replay_tops ops = {cub_t_alloc, cub_t_free, &tc};
    if ((wk = replay_threads_new(t, o, &ops)) == NULL) goto out;
  }

  for (int p = 0; p < o->passes; p++) {
    replay_result *r = &res[p];
    memset(r, 0, sizeof *r);
    uint64_t live = 0, peak = 0, held0 = *cached + *livec, taken = 0;
    if (cudaMemGetInfo(&f, &total) == cudaSuccess && f < tc.free0) taken = tc.free0 - f;
    uint64_t peak_res = taken;
    size_t i, n = t->nevents;
    if (wk != NULL) { /* the workers replay it */
      atomic_store_explicit(&tc.peak, taken, memory_order_relaxed);
      replay_threads_pass(wk, r);
      r->peak_reserved = atomic_load_explicit(&tc.peak, memory_order_relaxed);
      if (check("cudaDeviceSynchronize", cudaDeviceSynchronize())) goto out;
      for (size_t k = 0; k < t->nslots; k++)
        if ((ptrs[k] = replay_threads_take(wk, k)) != NULL)
          check("cub DeviceFree", (cudaError_t)replay_cub_free(cub, ptrs[k]));
      continue;
    }
    cudaError_t e = cudaSuccess;
    if (gt != NULL) replay_gates_set(gt, 0);
    replay_clock clk;
    replay_clock_start(&clk);
    for (i = 0; i < n; i++) {
      const replay_event ev = t->ev[i];
      const uint64_t sz = t->size[ev.slot];
      if (gt != NULL && i % o->lag == 0 && lag_mark(gt, st, t, i, o, r)) break;
      const uint64_t k0 = replay_call_start(o);
      if (!replay_is_free(ev)) {
        e = (cudaError_t)replay_cub_alloc(cub, &ptrs[ev.slot], sz,
                                          (struct CUstream_st *)st[replay_stream(ev)]);
        replay_call_end(o, &clk, k0);
        if (e != cudaSuccess) {
          ptrs[ev.slot] = NULL;
          r->status = cuda_fail_status(e);
          break;
        }
        live += sz;
        if (live > peak) peak = live;
      } else {
        e = (cudaError_t)replay_cub_free(cub, ptrs[ev.slot]);
        replay_call_end(o, &clk, k0);
        if (e != cudaSuccess) {
          r->status = cuda_fail_status(e);
          break;
        }
        ptrs[ev.slot] = NULL;
        live -= sz;
      }
      const uint64_t held = *cached + *livec;
      if (held > held0 && cudaMemGetInfo(&f, &total) == cudaSuccess) { /* from the device */
        taken = f < tc.free0 ? tc.free0 - f : 0;
        if (taken > peak_res) peak_res = taken;
      }
      held0 = held;
      if (o->csv != NULL) { /* its own reading: a free may have given memory back */
        if (cudaMemGetInfo(&f, &total) == cudaSuccess) taken = f < tc.free0 ? tc.free0 - f : 0;
        replay_csv_row(o->csv, i, live, taken, "cub", t->name, p + 1);
      }
    }
    r->ns = replay_clock_ns(o, &clk);
    if (gt != NULL) replay_gates_set(gt, UINT64_MAX);
    r->events = i < n ? i + 1 : n;
    r->fail_event = i;
    r->peak_live = peak;
    r->peak_reserved = peak_res;
    note_error(t, "cub", r, e);
    if (check("cudaDeviceSynchronize", cudaDeviceSynchronize())) goto out;
    for (size_t k = 0; k < t->nslots; k++)
      if (ptrs[k] != NULL) {
        check("cub DeviceFree", (cudaError_t)replay_cub_free(cub, ptrs[k]));
        ptrs[k] = NULL;
      }
  }
  ret = 0;
out:
  replay_threads_free(wk);
  pthread_mutex_destroy(&tc.cub_mu);
  if (gt != NULL) replay_gates_set(gt, UINT64_MAX);
  peer_streams_free(t, st);
  replay_gates_free(gt);
  free(ptrs);
  check("cub destroy", (cudaError_t)replay_cub_destroy(cub));
  return ret;
}

#else /* !BENCH_HAVE_CUDA */

int replay_cuda_present(void) { return 0; }

int replay_cuda_streams_create(void **out, uint32_t n) {
  (void)out, (void)n;
  fprintf(stderr, "magpool-replay: CUDA streams: built without CUDA\n");
  return -1;
}

int replay_cuda_streams_sync(void **s, uint32_t n) {
  (void)s, (void)n;
  return 0;
}

void replay_cuda_streams_destroy(void **s, uint32_t n) { (void)s, (void)n; }

replay_gates *replay_gates_new(void) {
  fprintf(stderr, "magpool-replay: --lag on CUDA streams: built without CUDA\n");
  return NULL;
}
int replay_gates_mark(replay_gates *g, void **streams, uint32_t n, uint64_t mark) {
  (void)g, (void)streams, (void)n, (void)mark;
  return -1;
}
void replay_gates_set(replay_gates *g, uint64_t opened) { (void)g, (void)opened; }
void replay_gates_free(replay_gates *g) { (void)g; }

static int skipped(const char *peer, const replay_trace *t, const replay_opts *o,
                   enum replay_mode mode, replay_result *res) {
  (void)t, (void)mode;
  fprintf(stderr, "magpool-replay: %s skipped: built without CUDA\n", peer);
  replay_fill(res, o->passes, REPLAY_SKIPPED);
  return 0;
}

int replay_run_cuda_malloc_async(const replay_trace *t, const replay_opts *o,
                                 enum replay_mode mode, replay_result *res) {
  return skipped("cudaMallocAsync", t, o, mode, res);
}
int replay_run_cuda_malloc(const replay_trace *t, const replay_opts *o, enum replay_mode mode,
                           replay_result *res) {
  return skipped("cudaMalloc", t, o, mode, res);
}
int replay_run_cub(const replay_trace *t, const replay_opts *o, enum replay_mode mode,
                   replay_result *res) {
  return skipped("cub", t, o, mode, res);
}

#endif
