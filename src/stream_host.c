/* stream_host.c - host streams: in-order executors on a host thread, and
 * the pool's stream-ordering ops on them (mp_host_stream_ops).  Layer 1.
 *
 * A host stream stands in for a CUDA stream where there is no GPU (CI, the
 * stress harness, users of MAGPOOL_MEM_HOST pools).  It is one worker thread
 * that runs launched functions one at a time, in launch order, plus a FIFO
 * of tasks.  The pool's stream-ordered logic only needs two things from it:
 * "run this after everything queued so far" (launch) and a stable identity
 * (mp_host_stream_id).
 *
 * This is not the allocator's fast path, so the queue is a plain mutex +
 * condition variables.  What matters is the contract:
 *
 *   - launch may be called from any thread, including from inside a task
 *     running on this or another host stream: the worker never holds the
 *     queue lock while it runs a task.
 *   - sync may be called from any number of threads at once.  It waits on a
 *     sequence number: the number of tasks launched before the call versus
 *     the number completed.
 *   - destroy must not overlap any other call on the same stream (except a
 *     task of that stream launching more work, which destroy then waits
 *     for).
 *
 * Concurrency table (same stream):
 *
 *                 launch  sync  valid/id  destroy
 *   launch         yes    yes    yes       no
 *   sync           yes    yes    yes       no
 *   valid/id       yes    yes    yes       no
 *   destroy        no     no     no        no
 *
 * Ordering (everything goes through s->lock, a mutex):
 *   - launch  -> task:  the launcher's writes before launch() happen before
 *     the task runs.  The launcher unlocks after enqueueing; the worker
 *     locks before dequeueing (mutex release/acquire).
 *   - task -> sync:  a task's effects happen before sync() returns for any
 *     sync that was called after the task was launched.  The worker locks
 *     after running the task to bump `completed`; the syncer locks to read
 *     it (mutex release/acquire).  ThreadSanitizer understands both edges.
 *   - task -> later task: program order on the single worker thread.
 *
 * Identity: the first 8 bytes of the object are a magic word, so that
 * mp_host_stream_valid() can tell a host stream from a CUDA stream handle
 * (which also points at readable memory) and from a destroyed one.  Ids come
 * from a process-wide 64-bit counter starting at 1: never 0, never reused,
 * unlike the handle's address.
 */
#include "internal.h"

#include <errno.h>
#include <pthread.h> /* pthread_setname_np: _GNU_SOURCE, set by the build */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* "mpHSTRM1" / "mpHSdead" */
#define MP_HS_MAGIC_LIVE 0x314d525453487066ull
#define MP_HS_MAGIC_DYING 0x64616564534870ffull

/* Spent task nodes kept for reuse, per stream (bounded). */
#define MP_HS_SPARE_MAX 256

typedef struct mp_hs_task {
  struct mp_hs_task *next;
  void (*fn)(void *arg);
  void *arg;
} mp_hs_task;

typedef struct mp_host_stream {
  /* Must stay first: mp_host_stream_valid() reads the first 8 bytes of any
   * stream handle.  Written at create (before the handle is published by
   * the caller) and at destroy (which no other call may overlap); read with
   * relaxed loads.  The CAS at destroy only makes a second destroy of the
   * same (still allocated) stream fail cleanly. */
  _Atomic uint64_t magic;
  uint64_t id; /* immutable after create */

  pthread_mutex_t lock;
  pthread_cond_t work_cv; /* worker waits: queue empty and not stopping */
  pthread_cond_t done_cv; /* syncers and destroy wait: completed < target */

  /* Everything below is protected by lock. */
  mp_hs_task *head, *tail; /* FIFO of launched, not yet started tasks */
  mp_hs_task *spare;       /* recycled task nodes */
  unsigned nspare;
  uint64_t launched;       /* tasks ever launched */
  uint64_t completed;      /* tasks ever finished */
  unsigned nwaiters;       /* threads blocked on done_cv */
  bool stop;               /* destroy: exit once the queue is empty */

  pthread_t worker; /* immutable after create */
} mp_host_stream;

/* Ids: relaxed is enough, the RMW alone makes them unique. */
static _Atomic uint64_t mp_hs_next_id = 1;

static inline mp_host_stream *mp_hs_of(magpool_stream_t s) {
  return (mp_host_stream *)(void *)s;
}

bool mp_host_stream_valid(magpool_stream_t s) {
  if (s == NULL)
    return false;
  /* Relaxed: the handle was published to this thread by the caller, and
   * destroy may not overlap this call; see the field comment. */
  return mp_load_relaxed((_Atomic uint64_t *)(void *)s) == MP_HS_MAGIC_LIVE;
}

uint64_t mp_host_stream_id(magpool_stream_t s) {
  if (!mp_host_stream_valid(s))
    return 0;
  return mp_hs_of(s)->id;
}

/* The worker: pop one task under the lock, run it without the lock, count
 * it complete under the lock.  Exits when stop is set and the queue is
 * empty, so destroy runs everything queued before (and during) it. */
static void *mp_hs_worker_main(void *p) {
  mp_host_stream *hs = p;
  pthread_mutex_lock(&hs->lock);
  for (;;) {
    while (hs->head == NULL && !hs->stop)
      pthread_cond_wait(&hs->work_cv, &hs->lock);
    mp_hs_task *t = hs->head;
    if (t == NULL)
      break; /* stop and drained */
    hs->head = t->next;
    if (hs->head == NULL)
      hs->tail = NULL;
    void (*fn)(void *) = t->fn;
    void *arg = t->arg;
    if (hs->nspare < MP_HS_SPARE_MAX) {
      t->next = hs->spare;
      hs->spare = t;
      hs->nspare++;
      t = NULL;
    }
    pthread_mutex_unlock(&hs->lock);

    free(t); /* NULL when recycled */
    fn(arg); /* no lock held: fn may launch on any host stream */

    /* Unlock is the RELEASE that publishes fn's effects to every syncer
     * that sees the new `completed`; pairs with the lock in sync(). */
    pthread_mutex_lock(&hs->lock);
    hs->completed++;
    if (hs->nwaiters != 0)
      pthread_cond_broadcast(&hs->done_cv);
  }
  pthread_mutex_unlock(&hs->lock);
  return NULL;
}

int magpool_host_stream_create(magpool_stream_t *out) {
  if (out == NULL)
    return MAGPOOL_EINVAL;
  mp_host_stream *hs = calloc(1, sizeof *hs);
  if (hs == NULL)
    return MAGPOOL_ENOMEM;
  if (pthread_mutex_init(&hs->lock, NULL) != 0)
    goto fail_mutex;
  if (pthread_cond_init(&hs->work_cv, NULL) != 0)
    goto fail_work_cv;
  if (pthread_cond_init(&hs->done_cv, NULL) != 0)
    goto fail_done_cv;
  hs->id = mp_fetch_add_relaxed(&mp_hs_next_id, 1);
  mp_store_relaxed(&hs->magic, MP_HS_MAGIC_LIVE);

  /* The worker runs with every signal blocked, so that process signals go
   * to the application's own threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&hs->worker, NULL, mp_hs_worker_main, hs);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0)
    goto fail_thread;
  (void)pthread_setname_np(hs->worker, "magpool-hstream");

  /* The caller publishes the handle; pthread_create ordered the fields
   * above before the worker's first read. */
  *out = (magpool_stream_t)(void *)hs;
  return 0;

fail_thread:
  mp_store_relaxed(&hs->magic, 0);
  pthread_cond_destroy(&hs->done_cv);
fail_done_cv:
  pthread_cond_destroy(&hs->work_cv);
fail_work_cv:
  pthread_mutex_destroy(&hs->lock);
fail_mutex:
  free(hs);
  return MAGPOOL_ENOMEM;
}

int magpool_host_stream_launch(magpool_stream_t s, void (*fn)(void *arg),
                               void *arg) {
  if (!mp_host_stream_valid(s) || fn == NULL)
    return MAGPOOL_EINVAL;
  mp_host_stream *hs = mp_hs_of(s);

  pthread_mutex_lock(&hs->lock);
  mp_hs_task *t = hs->spare;
  if (t != NULL) {
    hs->spare = t->next;
    hs->nspare--;
  } else {
    /* malloc under the lock is rare (the spare list is empty only while
     * the queue grows past its high-water mark) and keeps this simple. */
    t = malloc(sizeof *t);
    if (t == NULL) {
      pthread_mutex_unlock(&hs->lock);
      return MAGPOOL_ENOMEM;
    }
  }
  t->next = NULL;
  t->fn = fn;
  t->arg = arg;
  if (hs->tail != NULL)
    hs->tail->next = t;
  else
    hs->head = t;
  hs->tail = t;
  hs->launched++;
  /* Unlock is the RELEASE that makes the caller's earlier writes visible to
   * fn; pairs with the worker's lock before it dequeues. */
  pthread_cond_signal(&hs->work_cv);
  pthread_mutex_unlock(&hs->lock);
  return 0;
}

/* Waits, with hs->lock held, until `completed` reaches target. */
static void mp_hs_wait_locked(mp_host_stream *hs, uint64_t target) {
  hs->nwaiters++;
  while (hs->completed < target)
    pthread_cond_wait(&hs->done_cv, &hs->lock);
  hs->nwaiters--;
}

/* Contract: blocks until every function launched on s before this call
 * (by any thread) has returned, and their effects are visible to the
 * caller.  Any thread may call it, concurrently.  Calling it from a task of
 * s itself would wait for that task forever: MAGPOOL_EBUSY instead.
 * Returns MAGPOOL_EINVAL for NULL or a handle that is not a live host
 * stream. */
int magpool_host_stream_sync(magpool_stream_t s) {
  if (!mp_host_stream_valid(s))
    return MAGPOOL_EINVAL;
  mp_host_stream *hs = mp_hs_of(s);
  if (pthread_equal(pthread_self(), hs->worker))
    return MAGPOOL_EBUSY;

  /* Lock is the ACQUIRE that pairs with the worker's unlock after it
   * counted a task complete: the task's effects happen before we return. */
  pthread_mutex_lock(&hs->lock);
  mp_hs_wait_locked(hs, hs->launched);
  pthread_mutex_unlock(&hs->lock);
  return 0;
}

/* Contract: runs everything queued on s (including what those tasks launch
 * on s meanwhile), stops and joins the worker, and frees s.  Must not
 * overlap any other call on s.  MAGPOOL_EINVAL for NULL or a handle that is
 * not a live host stream; MAGPOOL_EBUSY (changing nothing) if called from a
 * task of s itself. */
int magpool_host_stream_destroy(magpool_stream_t s) {
  if (!mp_host_stream_valid(s))
    return MAGPOOL_EINVAL;
  mp_host_stream *hs = mp_hs_of(s);
  uint64_t live = MP_HS_MAGIC_LIVE;
  if (pthread_equal(pthread_self(), hs->worker))
    return MAGPOOL_EBUSY;
  /* Relaxed CAS: claims the destruction; ordering with other calls on s is
   * the caller's (destroy must not overlap them). */
  if (!mp_cas_strong_relaxed(&hs->magic, &live, MP_HS_MAGIC_DYING))
    return MAGPOOL_EINVAL;

  pthread_mutex_lock(&hs->lock);
  hs->stop = true;
  pthread_cond_signal(&hs->work_cv);
  pthread_mutex_unlock(&hs->lock);
  /* The worker drains the queue before it exits; join is the ACQUIRE that
   * makes every task's effects visible here. */
  pthread_join(hs->worker, NULL);

  mp_hs_task *t = hs->spare;
  while (t != NULL) {
    mp_hs_task *n = t->next;
    free(t);
    t = n;
  }
  pthread_cond_destroy(&hs->done_cv);
  pthread_cond_destroy(&hs->work_cv);
  pthread_mutex_destroy(&hs->lock);
  mp_store_relaxed(&hs->magic, 0);
  free(hs);
  return 0;
}

/* ------------------------------------------------------ ordering ops -- */

static int host_get_id(void *dev, magpool_stream_t s, uint64_t *id) {
  (void)dev;
  if (!mp_host_stream_valid(s)) return MAGPOOL_EINVAL;
  *id = mp_host_stream_id(s);
  return 0;
}

typedef struct host_cb {
  void (*fn)(void *arg, int status);
  void *arg;
} host_cb;

static void host_trampoline(void *arg) {
  host_cb c = *(host_cb *)arg;
  free(arg);
  c.fn(c.arg, 0);
}

static int host_after(void *dev, magpool_stream_t s, void (*fn)(void *, int), void *arg) {
  (void)dev;
  host_cb *c = malloc(sizeof *c);
  if (c == NULL) return MAGPOOL_ENOMEM;
  c->fn = fn;
  c->arg = arg;
  int rc = magpool_host_stream_launch(s, host_trampoline, c);
  if (rc != 0) free(c);
  return rc;
}

static int host_sync(void *dev, magpool_stream_t s) {
  (void)dev;
  return magpool_host_stream_sync(s);
}

static int host_capturing(void *dev, magpool_stream_t s) {
  (void)dev;
  MP_HOOK(MP_HOOK_CAPTURE_ASK, s);
  return 0;
}

static int host_sync_all(void *dev) {
  (void)dev;
  return MAGPOOL_ENOTSUP;
}

/* Lock: the ACQUIRE that pairs with the worker's unlock after it counted
 * the last task complete, so what the tasks did happens before the
 * caller reuses anything they used. */
static int host_idle(void *dev, magpool_stream_t s) {
  (void)dev;
  if (!mp_host_stream_valid(s)) return 0;
  mp_host_stream *hs = mp_hs_of(s);
  pthread_mutex_lock(&hs->lock);
  int idle = hs->completed == hs->launched;
  pthread_mutex_unlock(&hs->lock);
  return idle;
}

static bool host_per_thread(magpool_stream_t s) {
  (void)s;
  return false;
}

/* wait: a latch that a task on s opens and a task on t waits for; each
 * task drops one of its two references, the last one frees it. */
typedef struct host_latch {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open, refs;
} host_latch;

static void latch_drop(host_latch *l) { /* mu held; released here */
  bool last = --l->refs == 0;
  pthread_mutex_unlock(&l->mu);
  if (!last) return;
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
  free(l);
}

static void latch_open(void *arg) {
  host_latch *l = arg;
  pthread_mutex_lock(&l->mu);
  l->open = 1;
  pthread_cond_broadcast(&l->cv);
  latch_drop(l);
}

static void latch_wait(void *arg) {
  host_latch *l = arg;
  pthread_mutex_lock(&l->mu);
  while (!l->open) pthread_cond_wait(&l->cv, &l->mu);
  latch_drop(l);
}

/* The mutex orders what s's tasks did before the latch opened before
 * what t's tasks do after it. */
static int host_wait(void *dev, magpool_stream_t t, magpool_stream_t s) {
  (void)dev;
  host_latch *l = malloc(sizeof *l);
  if (l == NULL) return MAGPOOL_ENOMEM;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, NULL);
  l->open = 0;
  l->refs = 2;
  int rc = magpool_host_stream_launch(s, latch_open, l);
  if (rc != 0) {
    l->refs = 1;
    pthread_mutex_lock(&l->mu);
    latch_drop(l);
    return rc;
  }
  rc = magpool_host_stream_launch(t, latch_wait, l);
  if (rc != 0) { /* s's task drops the other reference */
    pthread_mutex_lock(&l->mu);
    latch_drop(l);
  }
  return rc;
}

const mp_stream_ops mp_host_stream_ops = {
  .per_thread = host_per_thread,
  .check_capture = false,
  .get_id = host_get_id,
  .after = host_after,
  .sync = host_sync,
  .capturing = host_capturing,
  .sync_all = host_sync_all,
  .idle = host_idle,
  .wait = host_wait,
};
