/* replay_magpool.c - replaying a trace on a magpool pool.
 *
 * The pool: magpool_config_init, then pool_size, allow_growth = 1,
 * max_pool_size = --cap (0: the default, no limit), kind.  It is created
 * before pass 1 (cold) and kept for the later passes (warm).  Between two
 * passes the streams are synchronised and whatever the trace left live is
 * freed; the pool is NOT trimmed, so what it mapped stays mapped.  Each
 * pass starts with magpool_reset_peaks, and its peak_reserved is
 * peak_reserved_bytes read once the pass is over.
 *
 * sync:  magpool_alloc / magpool_free.
 * async: one stream per trace stream number (host streams on HOST pools,
 *        non-blocking CUDA streams on DEVICE and PINNED pools);
 *        magpool_alloc_async on the allocation's stream,
 *        magpool_free_async on the free's own stream; with --lag, the
 *        streams are held behind the replay (below; CUDA streams by gate
 *        kernels, replay_gate.cu).
 * --threads: the same calls from a thread per trace stream
 *        (replay_threads.c), started after the pool is created and joined
 *        before it is destroyed.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "magpool.h"
#include "replay.h"

#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* --lag (host streams): every `lag` events each stream gets a mark, a
 * task that holds it until the next mark is set or MP_LAG_HOLD_NS have
 * passed, so a stream runs lag to 2 * lag events behind the replay, as a
 * GPU behind its host: its frees stay unpassed that long.  The bound in
 * time lets a wait for the stream (magpool's out-of-memory path) end, as
 * it would on a GPU, which finishes its work by itself. */
#define MP_LAG_HOLD_NS 2000000L

typedef struct lagger {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t opened; /* marks up to this one are open */
} lagger;

typedef struct lag_mark {
  lagger *l;
  uint64_t n;
} lag_mark;

static void lag_task(void *arg) {
  lag_mark *k = arg;
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_nsec += MP_LAG_HOLD_NS;
  if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&k->l->mu);
  while (k->l->opened < k->n)
    if (pthread_cond_timedwait(&k->l->cv, &k->l->mu, &dl) != 0) break;
  pthread_mutex_unlock(&k->l->mu);
  free(k);
}

static void lag_open(lagger *l, uint64_t upto) {
  pthread_mutex_lock(&l->mu);
  if (upto > l->opened) l->opened = upto;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

/* The marks of a pass: host streams (a lagger each) or CUDA streams (the
 * gates); every `every` events. */
typedef struct lag_ctl {
  lagger *lg;
  replay_gates *gt;
  size_t every;
} lag_ctl;

/* Mark n on every stream, and opens mark n - 1.  0, or -1 if a gate could
 * not be queued. */
static int lag_mark_all(const lag_ctl *lc, magpool_stream_t *st, uint32_t ns, uint64_t n) {
  if (lc->gt != NULL) return replay_gates_mark(lc->gt, (void **)st, ns, n);
  for (uint32_t k = 0; k < ns; k++) {
    lag_mark *x = malloc(sizeof *x);
    if (x != NULL) {
      *x = (lag_mark){&lc->lg[k], n};
      if (magpool_host_stream_launch(st[k], lag_task, x) != 0) free(x);
    }
    lag_open(&lc->lg[k], n - 1);
  }
  return 0;
}

/* Every mark open (the pass's end: the streams then run free), or none
 * (its start: the streams ran everything of the last pass). */
static void lag_set(const lag_ctl *lc, uint32_t ns, uint64_t opened) {
  if (lc->gt != NULL) {
    replay_gates_set(lc->gt, opened);
    return;
  }
  for (uint32_t k = 0; k < ns; k++) {
    pthread_mutex_lock(&lc->lg[k].mu);
    lc->lg[k].opened = opened;
    pthread_cond_broadcast(&lc->lg[k].cv);
    pthread_mutex_unlock(&lc->lg[k].mu);
  }
}

/* One pass.  `async`, `csv != NULL` and `ev` (o->evict != 0) are
 * constants at every call site, so the timed loop has no test for them. */
static inline __attribute__((always_inline)) void
mp_pass(const replay_trace *t, magpool_t *pool, magpool_stream_t *st, void **ptrs, int async,
        FILE *csv, int pass, replay_result *r, const lag_ctl *lc, const replay_opts *o, int ev) {
  const replay_event *evs = t->ev;
  const uint64_t *size = t->size;
  const size_t n = t->nevents;
  uint64_t live = 0, peak = 0;
  size_t i;
  r->status = REPLAY_COMPLETED;
  /* Marks are numbered from 1 in each pass; 0 is open.  The streams ran
   * everything of the last pass (streams_sync). */
  if (lc != NULL) lag_set(lc, t->nstreams, 0);
  replay_clock clk;
  replay_clock_start(&clk);
  for (i = 0; i < n; i++) {
    const replay_event e = evs[i];
    if (lc != NULL && i % lc->every == 0 &&
        UNLIKELY(lag_mark_all(lc, st, t->nstreams, i / lc->every + 1) != 0)) {
      r->status = REPLAY_ERROR;
      break;
    }
    const uint64_t sz = size[e.slot];
    const uint64_t k0 = ev ? replay_call_start(o) : 0;
    if (!replay_is_free(e)) {
      void *p = async ? magpool_alloc_async(pool, sz, st[replay_stream(e)])
                      : magpool_alloc(pool, sz);
      if (UNLIKELY(p == NULL)) {
        r->status = magpool_last_error() == MAGPOOL_ENOMEM ? REPLAY_OOM : REPLAY_ERROR;
        break;
      }
      if (ev) replay_call_end(o, &clk, k0);
      ptrs[e.slot] = p;
      live += sz;
      if (live > peak) peak = live;
    } else {
      int rc = async ? magpool_free_async(pool, ptrs[e.slot], st[replay_stream(e)])
                     : magpool_free(pool, ptrs[e.slot]);
      if (UNLIKELY(rc != 0)) {
        r->status = REPLAY_ERROR;
        break;
      }
      if (ev) replay_call_end(o, &clk, k0);
      ptrs[e.slot] = NULL;
      live -= sz;
    }
    if (csv != NULL) {
      size_t total = 0;
      magpool_mem_info(pool, NULL, &total);
      replay_csv_row(csv, i, live, total, "magpool", t->name, pass);
    }
  }
  r->ns = replay_clock_ns(o, &clk);
  if (lc != NULL) lag_set(lc, t->nstreams, UINT64_MAX);
  r->events = i < n ? i + 1 : n;
  r->fail_event = i;
  r->peak_live = peak;
}

/* --threads: the calls, from the stream's worker. */
typedef struct mp_tctx {
  magpool_t *pool;
  magpool_stream_t *st; /* NULL: sync */
} mp_tctx;

static enum replay_status mp_t_alloc(void *ctx, uint64_t size, uint32_t stream, void **out) {
  const mp_tctx *c = ctx;
  void *p = c->st != NULL ? magpool_alloc_async(c->pool, size, c->st[stream])
                          : magpool_alloc(c->pool, size);
  *out = p;
  if (LIKELY(p != NULL)) return REPLAY_COMPLETED;
  return magpool_last_error() == MAGPOOL_ENOMEM ? REPLAY_OOM : REPLAY_ERROR;
}

static int mp_t_free(void *ctx, void *p, uint32_t stream) {
  const mp_tctx *c = ctx;
  return c->st != NULL ? magpool_free_async(c->pool, p, c->st[stream]) : magpool_free(c->pool, p);
}

static int streams_sync(magpool_stream_t *st, uint32_t n, int cuda) {
  if (cuda) return replay_cuda_streams_sync((void **)st, n);
  int bad = 0;
  for (uint32_t k = 0; k < n; k++)
    if (st[k] != NULL && magpool_host_stream_sync(st[k]) != 0) bad = -1;
  return bad;
}

static void streams_destroy(magpool_t *pool, magpool_stream_t *st, uint32_t n, int cuda) {
  if (st == NULL) return;
  streams_sync(st, n, cuda);
  for (uint32_t k = 0; k < n; k++)
    if (st[k] != NULL && pool != NULL) magpool_stream_release(pool, st[k]);
  if (cuda) {
    replay_cuda_streams_destroy((void **)st, n);
  } else {
    for (uint32_t k = 0; k < n; k++)
      if (st[k] != NULL) magpool_host_stream_destroy(st[k]);
  }
}

static int streams_create(magpool_stream_t *st, uint32_t n, int cuda) {
  if (cuda) return replay_cuda_streams_create((void **)st, n);
  for (uint32_t k = 0; k < n; k++) {
    int rc = magpool_host_stream_create(&st[k]);
    if (rc != 0) {
      fprintf(stderr, "magpool-replay: magpool_host_stream_create: %s\n", magpool_strerror(rc));
      return -1;
    }
  }
  return 0;
}

int replay_run_magpool(const replay_trace *t, const replay_opts *o, enum replay_mode mode,
                       replay_result *res) {
  const int async = mode == REPLAY_ASYNC;
  const int cuda = o->kind != REPLAY_HOST;
  magpool_t *pool = NULL;
  magpool_stream_t *st = NULL;
  replay_threads *thr = NULL;
  mp_tctx tctx;
  void **ptrs = calloc(t->nslots ? t->nslots : 1, sizeof *ptrs);
  int ret = -1;
  if (ptrs == NULL) {
    fprintf(stderr, "magpool-replay: out of memory\n");
    return -1;
  }
  lagger *lg = NULL;
  lag_ctl lag = {NULL, NULL, o->lag}, *lc = NULL;
  if (async) {
    st = calloc(t->nstreams, sizeof *st);
    if (st == NULL || streams_create(st, t->nstreams, cuda) != 0) goto out;
    if (o->lag != 0 && cuda) {
      if ((lag.gt = replay_gates_new()) == NULL) goto out;
      lc = &lag;
    } else if (o->lag != 0) {
      lg = calloc(t->nstreams, sizeof *lg);
      if (lg == NULL) goto out;
      for (uint32_t k = 0; k < t->nstreams; k++) {
        pthread_mutex_init(&lg[k].mu, NULL);
        pthread_cond_init(&lg[k].cv, NULL);
      }
      lag.lg = lg;
      lc = &lag;
    }
  }

  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = o->pool_size;
  cfg.allow_growth = 1;
  if (o->cap != 0) cfg.max_pool_size = o->cap;
  cfg.kind = o->kind == REPLAY_DEVICE   ? MAGPOOL_MEM_DEVICE
             : o->kind == REPLAY_PINNED ? MAGPOOL_MEM_PINNED
                                        : MAGPOOL_MEM_HOST;
  int rc = magpool_create(&cfg, &pool);
  if (rc != 0) {
    fprintf(stderr, "magpool-replay: magpool_create (pool size %zu, cap %zu): %s\n",
            o->pool_size, o->cap, magpool_strerror(rc));
    pool = NULL;
    goto out;
  }
  if (o->threads) {
    tctx = (mp_tctx){pool, async ? st : NULL};
    replay_tops ops = {mp_t_alloc, mp_t_free, &tctx};
    if ((thr = replay_threads_new(t, o, &ops)) == NULL) goto out;
  }

  for (int p = 0; p < o->passes; p++) {
    replay_result *r = &res[p];
    memset(r, 0, sizeof *r);
    magpool_reset_peaks(pool);
    magpool_stats_t s0;
    if (magpool_get_stats(pool, &s0) != 0) memset(&s0, 0, sizeof s0);
    if (thr != NULL)
      replay_threads_pass(thr, r);
    else if (o->csv != NULL) /* timing aside: every event reads the footprint */
      mp_pass(t, pool, st, ptrs, async, o->csv, p + 1, r, lc, o, o->evict != 0);
    else if (o->evict != 0 && async)
      mp_pass(t, pool, st, ptrs, 1, NULL, p + 1, r, lc, o, 1);
    else if (o->evict != 0)
      mp_pass(t, pool, st, ptrs, 0, NULL, p + 1, r, NULL, o, 1);
    else if (async)
      mp_pass(t, pool, st, ptrs, 1, NULL, p + 1, r, lc, o, 0);
    else
      mp_pass(t, pool, st, ptrs, 0, NULL, p + 1, r, NULL, o, 0);
    magpool_stats_t s;
    if (magpool_get_stats(pool, &s) == 0) {
      r->peak_reserved = s.peak_reserved_bytes;
      r->grows = s.grow_count - s0.grow_count;
      r->chunk_maps = s.chunk_maps - s0.chunk_maps;
      r->chunk_unmaps = s.chunk_unmaps - s0.chunk_unmaps;
      r->chunk_moves = s.chunk_moves - s0.chunk_moves;
      r->stream_batches = s.stream_batches - s0.stream_batches;
      r->pending_at_peak = s.pending_at_peak_bytes;
    }
    if (r->status == REPLAY_ERROR) /* --threads: the error was the worker's */
      fprintf(stderr, "magpool-replay: %s: magpool, event %zu: %s\n", t->name, r->fail_event,
              thr != NULL ? "failed"
              : magpool_strerror(replay_is_free(t->ev[r->fail_event]) ? MAGPOOL_EINVAL
                                                                       : magpool_last_error()));
    /* Between passes (not timed): let the streams pass their frees, then
     * free what is still live.  No trim: the pool stays warm. */
    if (async && streams_sync(st, t->nstreams, cuda) != 0) {
      fprintf(stderr, "magpool-replay: synchronising the streams failed\n");
      goto out;
    }
    for (size_t k = 0; thr != NULL && k < t->nslots; k++) ptrs[k] = replay_threads_take(thr, k);
    for (size_t k = 0; k < t->nslots; k++)
      if (ptrs[k] != NULL) {
        if (magpool_free(pool, ptrs[k]) != 0)
          fprintf(stderr, "magpool-replay: %s: freeing a live block after the pass failed\n",
                  t->name);
        ptrs[k] = NULL;
      }
  }
  ret = 0;
out:
  replay_threads_free(thr); /* the workers' caches go back before the destroy */
  streams_destroy(pool, st, async ? t->nstreams : 0, cuda); /* the marks ran */
  for (uint32_t k = 0; lg != NULL && k < t->nstreams; k++) {
    pthread_mutex_destroy(&lg[k].mu);
    pthread_cond_destroy(&lg[k].cv);
  }
  free(lg);
  replay_gates_free(lag.gt);
  if (pool != NULL) magpool_destroy(pool);
  free(st);
  free(ptrs);
  return ret;
}
