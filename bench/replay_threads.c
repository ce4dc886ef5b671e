/* replay_threads.c - --threads: a pass replayed by one thread per trace
 * stream, as a server runs a thread per request stream.
 *
 * Worker k issues, in trace order, every event whose stream is k (an
 * allocation on its stream, a free on the free's stream).  Two rules keep
 * the replay a replay of the trace:
 *   - a free waits until its allocation has returned (the slot's pointer,
 *     published RELEASE by the allocating worker, read ACQUIRE);
 *   - the window: event i starts only once every event before i - W is
 *     done (W = --window, 256 by default), so that no worker runs far
 *     ahead of the others and the live bytes follow the trace's.  W = 0 is
 *     the trace's own order, each event handed from thread to thread.
 * Progress: the pending event of least index can always go (every earlier
 * event is done, its allocation among them), so the replay never stalls.
 *
 * Each worker publishes the index of its next event (`next`, its own cache
 * line; SIZE_MAX when it has none); a worker reads the others' only when
 * its own index passes what it last saw + W.  A waiting worker spins, then
 * yields (a machine with fewer cores than workers still progresses).
 *
 * Measurements: ns is from the start signal to the last worker's end (the
 * events, the waits and the hand-offs: a replay with threads, not the
 * calls alone).  peak_live is the peak of the bytes the program holds, in
 * the order the events happened: a block is the program's from its
 * allocation's return (the tick after the call) to its free's call (the
 * tick before), the least any allocator must hold for it, so that no
 * allocator's ratio can fall below 1 however long its calls take; each
 * worker's ticks are merged after the pass.  Within W events of the
 * trace's order, it may differ from the single-threaded replay's.
 *
 * Concurrency: `gen` and `quit` under `mu` (the pass hand-out; the last
 * worker to finish wakes the main thread through `done_cv`); `ready`,
 * `start`, `running`, `stop`, `next` and the slots are atomics with the
 * order named at each use; everything else a worker owns during a pass
 * and the main thread reads after `running` fell to 0 (ACQUIRE, pairing
 * with each worker's RELEASE decrement).
 */
#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"

typedef struct worker {
  alignas(64) _Atomic size_t next; /* index of the next event; SIZE_MAX: none */
  alignas(64) struct replay_threads *x;
  uint32_t stream;
  size_t *idx;     /* this stream's events, in trace order */
  size_t n;
  uint64_t *tick;  /* each done event's tick (peak_live, below) */
  size_t done;     /* events done this pass */
  int failed;      /* the event after them failed */
  uint64_t end_ns; /* when it finished */
  pthread_t th;
} worker;

struct replay_threads {
  const replay_trace *t;
  replay_tops ops;
  size_t window;
  _Atomic(void *) *slot;
  worker *w;
  uint32_t nw, nstarted;
  pthread_mutex_t mu;
  pthread_cond_t cv, done_cv;
  uint64_t gen; /* passes handed out (under mu) */
  int quit;     /* under mu */
  _Atomic uint32_t ready, running;
  _Atomic int start, stop;
  pthread_mutex_t fmu; /* the first failure */
  size_t fail_event;
  enum replay_status fail_status;
  uint64_t t0;
};

static void relax(unsigned *spins) {
  if (++*spins < 64) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  } else {
    sched_yield();
  }
}

/* What a slot holds for an allocation that returned NULL successfully:
 * an address no allocator returns (the engine's own). */
static inline void *nul(struct replay_threads *x) { return (void *)x; }

static void fail(struct replay_threads *x, size_t i, enum replay_status st) {
  pthread_mutex_lock(&x->fmu);
  if (i < x->fail_event) x->fail_event = i, x->fail_status = st;
  pthread_mutex_unlock(&x->fmu);
  atomic_store_explicit(&x->stop, 1, memory_order_relaxed); /* a hint: others stop soon */
}

/* The least `next` of the other workers, once it is at least i - W (true),
 * or false if the pass stops meanwhile. */
static bool wait_window(struct replay_threads *x, const worker *me, size_t i, size_t *lo) {
  for (unsigned spins = 0;; relax(&spins)) {
    size_t m = SIZE_MAX;
    for (uint32_t k = 0; k < x->nw; k++) {
      if (&x->w[k] == me) continue;
      /* Relaxed: the window only paces the workers; data flows through
       * the slots (RELEASE / ACQUIRE below). */
      size_t v = atomic_load_explicit(&x->w[k].next, memory_order_relaxed);
      if (v < m) m = v;
    }
    *lo = m;
    if (m >= i || i - m <= x->window) return true;
    if (atomic_load_explicit(&x->stop, memory_order_relaxed)) return false;
  }
}

static void run_pass(worker *me) {
  struct replay_threads *x = me->x;
  const replay_trace *t = x->t;
  atomic_fetch_add_explicit(&x->ready, 1, memory_order_relaxed);
  for (unsigned spins = 0; !atomic_load_explicit(&x->start, memory_order_acquire);) relax(&spins);
  size_t j, lo = 0;
  for (j = 0; j < me->n; j++) {
    const size_t i = me->idx[j];
    if (i > lo && i - lo > x->window && !wait_window(x, me, i, &lo)) break;
    const replay_event e = t->ev[i];
    if (!replay_is_free(e)) {
      void *p = NULL;
      enum replay_status st = x->ops.alloc(x->ops.ctx, t->size[e.slot], me->stream, &p);
      if (st != REPLAY_COMPLETED) {
        fail(x, i, st);
        me->failed = 1;
        break;
      }
      me->tick[j] = replay_tick(); /* the program's from here on */
      /* RELEASE: the allocation happens before the free that reads it
       * (ACQUIRE below), on whichever worker.  A NULL from a successful
       * call (a peer's zero-byte allocation) is kept as the sentinel. */
      atomic_store_explicit(&x->slot[e.slot], p != NULL ? p : nul(x), memory_order_release);
    } else {
      void *p;
      for (unsigned spins = 0;
           (p = atomic_load_explicit(&x->slot[e.slot], memory_order_acquire)) == NULL;) {
        if (atomic_load_explicit(&x->stop, memory_order_relaxed)) goto out;
        relax(&spins);
      }
      atomic_store_explicit(&x->slot[e.slot], NULL, memory_order_relaxed);
      me->tick[j] = replay_tick(); /* given back from here on */
      if (x->ops.free(x->ops.ctx, p != nul(x) ? p : NULL, me->stream) != 0) {
        fail(x, i, REPLAY_ERROR);
        me->failed = 1;
        break;
      }
    }
    atomic_store_explicit(&me->next, j + 1 < me->n ? me->idx[j + 1] : SIZE_MAX,
                          memory_order_relaxed);
    if (atomic_load_explicit(&x->stop, memory_order_relaxed)) {
      j++;
      break;
    }
  }
out:
  me->done = j;
  me->end_ns = replay_now_ns();
  atomic_store_explicit(&me->next, SIZE_MAX, memory_order_relaxed);
  /* RELEASE: done, tick[] and end_ns before the main thread reads them
   * (its ACQUIRE load of `running`).  The last one wakes it. */
  if (atomic_fetch_sub_explicit(&x->running, 1, memory_order_release) == 1) {
    pthread_mutex_lock(&x->mu);
    pthread_cond_broadcast(&x->done_cv);
    pthread_mutex_unlock(&x->mu);
  }
}

static void *worker_main(void *arg) {
  worker *me = arg;
  struct replay_threads *x = me->x;
  uint64_t seen = 0;
  for (;;) {
    pthread_mutex_lock(&x->mu);
    while (x->gen == seen && !x->quit) pthread_cond_wait(&x->cv, &x->mu);
    int quit = x->quit;
    seen = x->gen;
    pthread_mutex_unlock(&x->mu);
    if (quit) return NULL;
    run_pass(me);
  }
}

replay_threads *replay_threads_new(const replay_trace *t, const replay_opts *o,
                                   const replay_tops *ops) {
  struct replay_threads *x = calloc(1, sizeof *x);
  if (x == NULL) return NULL;
  x->t = t;
  x->ops = *ops;
  x->window = o->window;
  pthread_mutex_init(&x->mu, NULL);
  pthread_cond_init(&x->cv, NULL);
  pthread_cond_init(&x->done_cv, NULL);
  pthread_mutex_init(&x->fmu, NULL);
  size_t *count = calloc(t->nstreams ? t->nstreams : 1, sizeof *count);
  x->slot = calloc(t->nslots ? t->nslots : 1, sizeof *x->slot);
  if (count == NULL || x->slot == NULL) goto fail;
  for (size_t i = 0; i < t->nevents; i++) count[replay_stream(t->ev[i])]++;
  for (uint32_t s = 0; s < t->nstreams; s++) x->nw += count[s] != 0;
  x->w = aligned_alloc(64, sizeof(worker) * (x->nw ? x->nw : 1));
  if (x->w == NULL) goto fail;
  memset(x->w, 0, sizeof(worker) * (x->nw ? x->nw : 1));
  uint32_t k = 0;
  for (uint32_t s = 0; s < t->nstreams; s++) {
    if (count[s] == 0) continue;
    worker *w = &x->w[k];
    w->x = x;
    w->stream = s;
    w->idx = malloc(count[s] * sizeof *w->idx);
    w->tick = malloc(count[s] * sizeof *w->tick);
    count[s] = k++; /* from here on: the stream's worker */
    if (w->idx == NULL || w->tick == NULL) goto fail;
  }
  for (size_t i = 0; i < t->nevents; i++) {
    worker *w = &x->w[count[replay_stream(t->ev[i])]];
    w->idx[w->n++] = i;
  }
  for (k = 0; k < x->nw; k++, x->nstarted++)
    if (pthread_create(&x->w[k].th, NULL, worker_main, &x->w[k]) != 0) {
      fprintf(stderr, "magpool-replay: --threads: cannot start thread %u\n", k);
      goto fail;
    }
  free(count);
  return x;
fail:
  free(count);
  replay_threads_free(x);
  return NULL;
}

typedef struct stamp {
  uint64_t tick;
  size_t i;
} stamp;

static int by_tick(const void *a, const void *b) {
  const stamp *p = a, *q = b;
  return p->tick < q->tick ? -1 : p->tick > q->tick ? 1 : p->i < q->i ? -1 : p->i > q->i;
}

/* The peak of the bytes held, in the order of the events' ticks. */
static uint64_t peak_live(const struct replay_threads *x, size_t done) {
  const replay_trace *t = x->t;
  stamp *s = malloc((done ? done : 1) * sizeof *s);
  if (s == NULL) return 0;
  size_t n = 0;
  for (uint32_t k = 0; k < x->nw; k++)
    for (size_t j = 0; j < x->w[k].done; j++)
      s[n++] = (stamp){x->w[k].tick[j], x->w[k].idx[j]};
  qsort(s, n, sizeof *s, by_tick);
  uint64_t live = 0, peak = 0;
  for (size_t m = 0; m < n; m++) {
    const replay_event e = t->ev[s[m].i];
    if (!replay_is_free(e)) {
      live += t->size[e.slot];
      if (live > peak) peak = live;
    } else {
      live -= t->size[e.slot];
    }
  }
  free(s);
  return peak;
}

void replay_threads_pass(replay_threads *x, replay_result *r) {
  x->fail_event = SIZE_MAX;
  x->fail_status = REPLAY_COMPLETED;
  atomic_store_explicit(&x->stop, 0, memory_order_relaxed);
  atomic_store_explicit(&x->start, 0, memory_order_relaxed);
  atomic_store_explicit(&x->ready, 0, memory_order_relaxed);
  atomic_store_explicit(&x->running, x->nw, memory_order_relaxed);
  for (uint32_t k = 0; k < x->nw; k++) {
    x->w[k].done = 0;
    x->w[k].failed = 0;
    atomic_store_explicit(&x->w[k].next, x->w[k].idx[0], memory_order_relaxed);
  }
  pthread_mutex_lock(&x->mu); /* publishes the resets above to the workers */
  x->gen++;
  pthread_cond_broadcast(&x->cv);
  pthread_mutex_unlock(&x->mu);
  for (unsigned spins = 0; atomic_load_explicit(&x->ready, memory_order_relaxed) < x->nw;)
    relax(&spins);
  x->t0 = replay_now_ns();
  /* RELEASE: pairs with the workers' ACQUIRE wait on `start`. */
  atomic_store_explicit(&x->start, 1, memory_order_release);
  /* Asleep, not spinning: the workers may need this core. */
  pthread_mutex_lock(&x->mu);
  while (atomic_load_explicit(&x->running, memory_order_acquire) != 0)
    pthread_cond_wait(&x->done_cv, &x->mu);
  pthread_mutex_unlock(&x->mu);
  uint64_t end = x->t0, done = 0;
  for (uint32_t k = 0; k < x->nw; k++) {
    if (x->w[k].end_ns > end) end = x->w[k].end_ns;
    done += x->w[k].done + (size_t)x->w[k].failed;
  }
  r->status = x->fail_status;
  r->fail_event = x->fail_event == SIZE_MAX ? x->t->nevents : x->fail_event;
  r->events = done;
  r->ns = end - x->t0;
  r->peak_live = peak_live(x, done);
}

void *replay_threads_take(replay_threads *x, size_t slot) {
  void *p = atomic_exchange_explicit(&x->slot[slot], NULL, memory_order_relaxed);
  return p != nul(x) ? p : NULL;
}

void replay_threads_free(replay_threads *x) {
  if (x == NULL) return;
  pthread_mutex_lock(&x->mu);
  x->quit = 1;
  pthread_cond_broadcast(&x->cv);
  pthread_mutex_unlock(&x->mu);
  for (uint32_t k = 0; k < x->nstarted; k++) pthread_join(x->w[k].th, NULL);
  for (uint32_t k = 0; x->w != NULL && k < x->nw; k++) {
    free(x->w[k].idx);
    free(x->w[k].tick);
  }
  free(x->w);
  free((void *)x->slot);
  pthread_mutex_destroy(&x->mu);
  pthread_cond_destroy(&x->cv);
  pthread_cond_destroy(&x->done_cv);
  pthread_mutex_destroy(&x->fmu);
  free(x);
}
