/* retire.c - blocks freed on a stream wait here until the stream has
 * passed the free: one batch per retire, one stream callback per batch,
 * and the ready list the callbacks push onto.  Layer 3: it knows stream
 * ops (through pool->sops), magazines and regions; never a thread record
 * or a stream entry (a batch carries only the entry's pending counter).
 *
 *   retire ..... any thread: builds a batch, counts it pending, asks the
 *                stream op to run batch_done after the stream's work
 *   batch_done . the callback, on CUDA's callback thread or a host
 *                stream's worker: O(1), no CUDA call; pushes the batch on
 *                the ready list (push_mp: a CAS, any number of pushers)
 *   drain ...... any thread, concurrently with itself: takes the whole
 *                list with one exchange (take_all: no node is ever popped
 *                alone, so no ABA) and gives the blocks to the trees
 *
 * Accounting: a batch's bytes are pending from retire until its callback,
 * then ready until a drain gives them to the trees.
 */
#include "runs.h"

#include <sched.h>
#include <stdlib.h>
#include <time.h>

/* The ready list's push: any thread, any number at once. */
static void ready_push_mp(mp_retire *rt, mp_batch *b) {
  mp_batch *h = mp_load_relaxed(&rt->ready);
  do {
    b->next = h;
    /* RELEASE: the batch is complete before a drainer takes it (ACQUIRE
     * exchange in ready_take_all); without it the drainer could read a
     * half-written batch. */
  } while (!mp_cas_weak_release(&rt->ready, &h, b));
}

/* The ready list's take: the whole list at once.  ACQUIRE: pairs with the
 * RELEASE push. */
static mp_batch *ready_take_all(mp_retire *rt) { return mp_xchg_acquire(&rt->ready, NULL); }

/* The stream callback.  A device error status changes nothing: the blocks
 * are accounted for either way. */
static void batch_done(void *arg, int status) {
  (void)status;
  mp_batch *b = arg;
  mp_retire *rt = &b->pool->retire;
  /* Read everything we need from b before the push: once it is on the
   * ready list a drainer may free it. */
  _Atomic int64_t *pending = b->pending;
  mp_fetch_add_relaxed(&rt->ready_bytes, b->bytes);
  mp_fetch_add_relaxed(&rt->ready_fenced, b->fbytes);
  mp_fetch_add_relaxed(&rt->pending_bytes, -b->bytes);
  ready_push_mp(rt, b);
  mp_fetch_add_acq_rel(pending, -1);
  /* Last: destroy waits for pending_batches == 0 and then frees the pool;
   * after this RMW the callback touches nothing of it. */
  mp_fetch_add_acq_rel(&rt->pending_batches, -1);
}

/* The runs of `chain` go back to the free runs fenced by (a new tag,
 * owner) (runs.h), noted in b; returns what is left of the chain.  No
 * host memory for the note: nothing is fenced. */
static mp_mag *fence_runs(magpool_t *pool, mp_batch *b, uint64_t owner, mp_mag *chain) {
  uint32_t n = 0;
  for (mp_mag *m = chain; m != NULL; m = mp_load_relaxed(&m->next))
    if (mp_run_order(pool, m->order)) n += m->count;
  if (n == 0 || (b->fr = malloc(2 * sizeof *b->fr * n)) == NULL) return chain;
  b->tag = mp_runs_tag(pool);
  mp_acct a = {0};
  mp_mag *keep = NULL;
  for (mp_mag *m = chain, *mn; m != NULL; m = mn) {
    mn = mp_load_relaxed(&m->next);
    uint32_t k = 0;
    for (uint32_t i = 0; i < m->count; i++)
      if (!mp_region_fence(pool, &a, m->slot[i], m->order, b->tag, owner, true,
                           &b->fr[2 * b->nfr]))
        m->slot[k++] = m->slot[i];
      else
        b->fbytes += (int64_t)b->fr[2 * b->nfr++ + 1] << pool->chunks->shift;
    m->count = k;
    if (k == 0) {
      mp_mag_free(pool, m);
      continue;
    }
    mp_store_relaxed(&m->next, keep);
    keep = m;
  }
  mp_acct_settle(pool, &a);
  return keep;
}

/* Counts batch b pending and asks for its callback behind h (or, if
 * that fails, waits for h and runs it). */
static void enqueue(magpool_t *pool, mp_batch *b, magpool_stream_t h) {
  mp_retire *rt = &pool->retire;
  mp_fetch_add_relaxed(&rt->pending_bytes, b->bytes);
  mp_fetch_add_relaxed(&rt->batches, 1);
  mp_fetch_add_acq_rel(&rt->pending_batches, 1);
  mp_fetch_add_acq_rel(b->pending, 1);
  int rc = pool->sops->after(pool->src_ctx, h, batch_done, b);
  if (rc != 0) {
    pool->sops->sync(pool->src_ctx, h);
    batch_done(b, rc);
  }
}

void mp_retire_chain(magpool_t *pool, _Atomic int64_t *pending, uint64_t owner, magpool_stream_t h,
                     mp_mag *chain, int passed) {
  mp_retire *rt = &pool->retire;
  /* A stream that has finished everything queued on it has passed these
   * frees already: the blocks go to the trees now, no batch. */
  if (passed < 0) passed = pool->sops->idle != NULL && pool->sops->idle(pool->src_ctx, h) == 1;
  mp_batch *b = passed ? NULL : malloc(sizeof *b);
  if (b == NULL) { /* passed, or no host memory: wait for the stream, then free */
    if (!passed) pool->sops->sync(pool->src_ctx, h);
    mp_acct a = {0};
    mp_chain_give(pool, &a, chain);
    mp_acct_settle(pool, &a);
    return;
  }
  if (pending == NULL) pending = &rt->orphan_pending;
  b->pool = pool;
  b->pending = pending;
  b->fr = NULL;
  b->nfr = b->tag = 0;
  b->fbytes = 0;
  if (owner != 0 && pool->chunks != NULL) chain = fence_runs(pool, b, owner, chain);
  b->mags = chain;
  b->bytes = 0;
  for (mp_mag *m = chain; m != NULL; m = mp_load_relaxed(&m->next))
    for (uint32_t i = 0; i < m->count; i++)
      b->bytes += (int64_t)mp_block_cost(pool, m->slot[i], m->order);
  enqueue(pool, b, h);
}

void mp_retire_fenced(magpool_t *pool, _Atomic int64_t *pending, magpool_stream_t h, uint32_t *fr,
                      uint32_t n, uint32_t tag, int64_t bytes) {
  bool passed = pool->sops->idle != NULL && pool->sops->idle(pool->src_ctx, h) == 1;
  mp_batch *b = passed ? NULL : malloc(sizeof *b);
  if (b == NULL) { /* passed, or no host memory: wait for the stream */
    if (!passed) pool->sops->sync(pool->src_ctx, h);
    mp_runs_unfence(pool, fr, n, tag);
    free(fr);
    return;
  }
  *b = (mp_batch){.pool = pool, .pending = pending != NULL ? pending : &pool->retire.orphan_pending,
                  .fbytes = bytes, .fr = fr, .nfr = n, .tag = tag};
  mp_runs_retire(pool, fr, n, tag); /* from cached to pending */
  enqueue(pool, b, h);
}

size_t mp_retire_drain(magpool_t *pool, mp_acct *a) {
  mp_retire *rt = &pool->retire;
  if (mp_load_relaxed(&rt->ready) == NULL) return 0;
  mp_batch *b = ready_take_all(rt);
  mp_acct local = {0};
  mp_acct *acct = a != NULL ? a : &local;
  size_t n = 0;
  while (b != NULL) {
    mp_batch *next = b->next;
    for (mp_mag *m = b->mags; m != NULL; m = mp_load_relaxed(&m->next)) n += m->count;
    mp_chain_give(pool, acct, b->mags);
    if (b->nfr != 0) mp_runs_unfence(pool, b->fr, b->nfr, b->tag);
    mp_fetch_add_relaxed(&rt->ready_bytes, -b->bytes);
    mp_fetch_add_relaxed(&rt->ready_fenced, -b->fbytes);
    free(b->fr);
    free(b);
    b = next;
  }
  if (a == NULL) mp_acct_settle(pool, &local);
  return n;
}

void mp_retire_wait(magpool_t *pool, _Atomic int64_t *pending) {
  if (mp_load_acquire(pending) == 0) return;
  /* A device-wide wait covers every CUDA stream (callbacks included). */
  if (pool->sops->sync_all(pool->src_ctx) == 0 && mp_load_acquire(pending) == 0) return;
  /* Host streams, or a failed sync: the callbacks come from the streams'
   * own threads.  Yield first, then sleep in short steps. */
  for (unsigned spins = 0; mp_load_acquire(pending) != 0; spins++) {
    if (spins < 64) {
      sched_yield();
    } else {
      struct timespec ts = {0, 50 * 1000};
      nanosleep(&ts, NULL);
    }
  }
}

void mp_retire_fini(magpool_t *pool) {
  mp_retire *rt = &pool->retire;
  /* Every callback must have run before the pool's memory goes away. */
  mp_retire_wait(pool, &rt->pending_batches);
  mp_batch *b = ready_take_all(rt);
  while (b != NULL) {
    mp_batch *n = b->next;
    free(b->fr);
    free(b); /* its magazines live in the pool's slabs */
    b = n;
  }
}
