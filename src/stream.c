/* stream.c - stream-ordered allocation: per-thread stream caches, retire
 * batches and the ready list.
 *
 * Layers (see docs/design.md, "Streams"):
 *
 *   mp_sentry   one per (pool, stream id): the stream's handle, its pending
 *               batch count, and the list of its slots.
 *   mp_sslot    one per (thread record, stream entry): the blocks this
 *               thread freed on the stream, reusable at once by this
 *               thread's allocations on the same stream.  Only its owner
 *               touches it on the fast path, with plain loads and stores;
 *               a thief (release, trim, the out-of-memory ladder) takes it
 *               over with the revoke handshake below.
 *   mp_batch    blocks retired from a slot: one stream callback per batch
 *               ("run when the stream has passed this point").
 *   ready list  batches whose callback ran; a lock-free LIFO that the
 *               callback pushes onto (O(1), no CUDA call) and drainers
 *               take whole (atomic exchange, so no ABA), sorting and
 *               coalescing the blocks into the tree (lazy coalescing).
 *
 * Stream identity is the stream's unique id (cudaStreamGetId, or the host
 * stream's id), never its handle: handles are reused after a stream is
 * destroyed, and cudaStreamPerThread names a different stream on every
 * thread.  A thread-local one-entry memo maps (handle, epoch) to the slot;
 * magpool_stream_release bumps the epoch, so no memo outlives a release.
 *
 * The revoke handshake (an asymmetric Dekker, as liburcu's membarrier
 * flavour uses): the owner stores active = 1, then loads revoke, and
 * touches the cache only if revoke is 0, storing active = 0 (release)
 * after.  A thief stores revoke = 1, runs membarrier(PRIVATE_EXPEDITED) -
 * which makes every running thread of the process execute a full barrier -
 * then waits for active == 0 (acquire), takes the cache, and stores
 * revoke = 0 (release).  Either the owner's store of active reached the
 * thief (it waits), or the owner's load of revoke came after the barrier
 * and sees 1 (it backs off): they never both touch the cache.  The owner
 * pays two plain stores and a plain load; the thief pays one system call.
 * Where membarrier is unavailable, the owner issues a full fence instead.
 *
 * Concurrency contract:
 *   slot cache (mag, full) ........ owner inside enter/exit, or a thief
 *                                   holding the entry lock after revoke
 *   slot bytes .................... written as the cache; read by stats
 *   entry slot list ............... push under the entry lock; walked by
 *                                   thieves under it; never shrinks
 *   entry sid ..................... set under the create mutex; cleared by
 *                                   release under the entry lock
 *   pending counters .............. atomic add/sub (retire, callback)
 *   ready list .................... push: CAS (callbacks, any thread);
 *                                   take: exchange (drainers)
 * Accounting invariant (quiescent, in bytes):
 *   tree free + live + thread caches + depots + stream slots + pending +
 *   ready == reserved
 */
#include "internal.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MP_STREAM_TABLE 1024u /* live streams per pool with a cache */

typedef struct mp_sslot {
  struct mp_tcache *owner;      /* immutable                             */
  struct mp_sentry *e;          /* immutable                             */
  struct mp_sslot *next;        /* entry's list (immutable once pushed)  */
  struct mp_sslot *tnext;       /* owner record's list (owner only)      */
  _Atomic int active;           /* owner inside its critical section     */
  _Atomic int revoke;           /* a thief wants, or has, the cache      */
  _Atomic int64_t bytes;        /* bytes cached (owner-add style)        */
  mp_mag *mag[MP_MAX_CLASSES];  /* loaded magazine per class             */
  mp_mag *full[MP_MAX_CLASSES]; /* chain of full magazines (via next)    */
} mp_sslot;

typedef struct mp_sentry {
  _Atomic uint64_t sid;       /* 0: empty or released                  */
  magpool_stream_t handle;    /* valid while sid != 0 (written before the
                                 sid is published)                      */
  _Atomic int busy;           /* entry lock: thieves, slot creation    */
  _Atomic int64_t pending;    /* batches retired, callback not yet run */
  _Atomic(mp_sslot *) slots;  /* one per thread record that used it    */
} mp_sentry;

typedef struct mp_batch {
  struct mp_batch *next;      /* ready-list link                       */
  magpool_t *pool;
  mp_sentry *e;               /* NULL for batches without an entry     */
  int64_t bytes;
  mp_mag *mags;               /* chain via mag->next, order in mag->order */
} mp_batch;

typedef struct mp_streams {
  const mp_stream_ops *ops;
  _Atomic int64_t pending_bytes;
  _Atomic int64_t pending_batches;
  _Atomic int64_t ready_bytes;
  _Atomic(mp_batch *) ready;
  pthread_mutex_t create_lock; /* creating/recycling entries only      */
  _Atomic(mp_sentry *) tab[MP_STREAM_TABLE];
} mp_streams;

/* ------------------------------------------------- asymmetric barrier -- */

/* ThreadSanitizer models neither membarrier nor standalone fences: TSan
 * builds run the handshake with seq_cst operations on the two flags, which
 * is the same Dekker argument in a form it understands. */
#if defined(__SANITIZE_THREAD__)
#define MP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MP_TSAN 1
#endif
#endif
#ifndef MP_TSAN
#define MP_TSAN 0
#endif

static bool asym_ok; /* set once, before any pool exists */
static pthread_once_t asym_once = PTHREAD_ONCE_INIT;

static void asym_init(void) {
#if defined(__NR_membarrier)
  long q = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (q > 0 && (q & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
      syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
    asym_ok = true;
#endif
}

/* The thief's side: a full barrier on every running thread. */
static void asym_heavy(void) {
  if (MP_TSAN) return; /* seq_cst flags instead, see MP_TSAN */
#if defined(__NR_membarrier)
  if (asym_ok && syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return;
#endif
#if !MP_TSAN
  atomic_thread_fence(memory_order_seq_cst);
#endif
}

/* Owner: enter the slot's critical section, or back off (false). */
MP_INLINE bool slot_enter(mp_sslot *sl) {
#if MP_TSAN
  atomic_store_explicit(&sl->active, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&sl->revoke, memory_order_seq_cst) == 0) return true;
  mp_store_release(&sl->active, 0);
  return false;
#endif
  mp_store_relaxed(&sl->active, 1);
  /* With membarrier the thief supplies the full barrier; the compiler
   * must still keep the store before the load.  Without it, the owner
   * needs the StoreLoad fence itself. */
#if !MP_TSAN
  if (MP_LIKELY(asym_ok)) atomic_signal_fence(memory_order_seq_cst);
  else atomic_thread_fence(memory_order_seq_cst);
#endif
  /* ACQUIRE: pairs with the thief's RELEASE of revoke = 0 in slot_give_
   * back; what it did to the cache is visible to us. */
  if (MP_LIKELY(mp_load_acquire(&sl->revoke) == 0)) return true;
  mp_store_release(&sl->active, 0);
  return false;
}

/* RELEASE: our cache writes happen before a thief that sees active == 0. */
MP_INLINE void slot_exit(mp_sslot *sl) { mp_store_release(&sl->active, 0); }

MP_INLINE void slot_bytes_add(mp_sslot *sl, int64_t d) {
  mp_store_relaxed(&sl->bytes, mp_load_relaxed(&sl->bytes) + d);
}

/* ----------------------------------------------------------- host ops -- */

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
  (void)s;
  return 0;
}

static int host_sync_all(void *dev) {
  (void)dev;
  return MAGPOOL_ENOTSUP;
}

static bool host_per_thread(magpool_stream_t s) {
  (void)s;
  return false;
}

static const mp_stream_ops host_stream_ops = {
  .per_thread = host_per_thread,
  .check_capture = false,
  .get_id = host_get_id,
  .after = host_after,
  .sync = host_sync,
  .capturing = host_capturing,
  .sync_all = host_sync_all,
};

/* -------------------------------------------------------- init / stats -- */

static inline mp_streams *S(magpool_t *pool) { return pool->streams; }

int mp_streams_init(magpool_t *pool) {
  pthread_once(&asym_once, asym_init);
  mp_streams *ss = calloc(1, sizeof *ss);
  if (ss == NULL) return MAGPOOL_ENOMEM;
  ss->ops = pool->cfg.kind == MAGPOOL_MEM_HOST ? &host_stream_ops : &mp_cuda_stream_ops;
  atomic_init(&pool->stream_epoch, 1);
  pthread_mutex_init(&ss->create_lock, NULL);
  pool->streams = ss;
  return 0;
}

void mp_streams_stats(magpool_t *pool, size_t *cached, size_t *pending) {
  mp_streams *ss = S(pool);
  int64_t c = mp_load_relaxed(&ss->ready_bytes);
  for (unsigned i = 0; i < MP_STREAM_TABLE; i++) {
    mp_sentry *e = mp_load_acquire(&ss->tab[i]);
    if (e == NULL) continue;
    for (mp_sslot *sl = mp_load_acquire(&e->slots); sl != NULL; sl = sl->next)
      c += mp_load_relaxed(&sl->bytes);
  }
  int64_t p = mp_load_relaxed(&ss->pending_bytes);
  *cached = c > 0 ? (size_t)c : 0;
  *pending = p > 0 ? (size_t)p : 0;
}

/* ---------------------------------------------------------- entry lock -- */

/* Serialises the slow paths on one entry: thieves (release, trim, the
 * ladder) and slot creation.  No fast path takes it; the ladder and trim
 * only try it and skip a busy entry. */
static inline bool entry_try(mp_sentry *e) {
  int z = 0;
  /* ACQUIRE: pairs with the RELEASE in entry_unlock; the previous
   * holder's writes (slot list, stolen magazines) are visible to us. */
  return mp_load_relaxed(&e->busy) == 0 &&
         atomic_compare_exchange_strong_explicit(&e->busy, &z, 1, memory_order_acquire,
                                                 memory_order_relaxed);
}
static inline void entry_unlock(mp_sentry *e) { mp_store_release(&e->busy, 0); }
static void entry_lock(mp_sentry *e) {
  while (!entry_try(e)) sched_yield(); /* release/trim/destroy only */
}

/* ------------------------------------------------------------- ready list */

/* The stream callback.  O(1), no CUDA call, any thread (CUDA's callback
 * thread or a host stream's worker).  A device error status changes
 * nothing: the blocks are accounted for either way. */
static void batch_done(void *arg, int status) {
  (void)status;
  mp_batch *b = arg;
  mp_streams *ss = S(b->pool);
  /* Read everything we need from b before the push: once it is on the
   * ready list a drainer may free it. */
  mp_sentry *e = b->e;
  mp_fetch_add_relaxed(&ss->ready_bytes, b->bytes);
  mp_fetch_add_relaxed(&ss->pending_bytes, -b->bytes);
  mp_batch *h = mp_load_relaxed(&ss->ready);
  do {
    b->next = h;
    /* RELEASE: the batch is complete before a drainer takes it (ACQUIRE
     * exchange in mp_streams_drain_ready); without it the drainer could
     * read a half-written batch. */
  } while (!atomic_compare_exchange_weak_explicit(&ss->ready, &h, b, memory_order_release,
                                                  memory_order_relaxed));
  if (e != NULL) mp_fetch_add_acq_rel(&e->pending, -1);
  /* Last: destroy waits for pending_batches == 0 and then frees the pool;
   * after this RMW the callback touches nothing of it. */
  mp_fetch_add_acq_rel(&ss->pending_batches, -1);
}

size_t mp_streams_drain_ready(magpool_t *pool, mp_tcache *tc) {
  mp_streams *ss = S(pool);
  if (mp_load_relaxed(&ss->ready) == NULL) return 0;
  /* ACQUIRE: pairs with the RELEASE push in batch_done.  Taking the whole
   * list with one exchange means no node is ever popped alone: no ABA. */
  mp_batch *b = atomic_exchange_explicit(&ss->ready, NULL, memory_order_acquire);
  size_t n = 0;
  mp_tcache tmp;
  if (tc == NULL) {
    memset(&tmp, 0, sizeof tmp);
    tc = &tmp;
  }
  while (b != NULL) {
    mp_batch *next = b->next;
    for (mp_mag *m = b->mags; m != NULL;) {
      mp_mag *mn = mp_load_relaxed(&m->next);
      mp_blocks_give(pool, tc, m->slot, m->count, m->order);
      n += m->count;
      mp_mag_free(pool, m);
      m = mn;
    }
    mp_fetch_add_relaxed(&ss->ready_bytes, -b->bytes);
    free(b);
    b = next;
  }
  if (tc == &tmp) mp_peak_note(pool, tc);
  return n;
}

/* --------------------------------------------------------------- retire -- */

/* Queues `mags` (a chain) behind all work enqueued on stream h so far.  If
 * the callback cannot be enqueued, waits for the stream instead and makes
 * the batch ready at once; if even that fails (a dead device) the blocks
 * are still accounted for. */
static int retire(magpool_t *pool, mp_sentry *e, magpool_stream_t h, mp_mag *mags) {
  mp_streams *ss = S(pool);
  mp_batch *b = malloc(sizeof *b);
  if (b == NULL) { /* no host memory: wait for the stream, then free */
    ss->ops->sync(pool->src_ctx, h);
    mp_tcache *tc = mp_tcache_get(pool);
    for (mp_mag *m = mags; m != NULL;) {
      mp_mag *mn = mp_load_relaxed(&m->next);
      if (tc != NULL) mp_blocks_give(pool, tc, m->slot, m->count, m->order);
      mp_mag_free(pool, m);
      m = mn;
    }
    return 0;
  }
  b->pool = pool;
  b->e = e;
  b->mags = mags;
  b->bytes = 0;
  for (mp_mag *m = mags; m != NULL; m = mp_load_relaxed(&m->next))
    b->bytes += (int64_t)m->count * (int64_t)mp_block_bytes(pool, m->order);
  mp_fetch_add_relaxed(&ss->pending_bytes, b->bytes);
  mp_fetch_add_acq_rel(&ss->pending_batches, 1);
  if (e != NULL) mp_fetch_add_acq_rel(&e->pending, 1);
  int rc = ss->ops->after(pool->src_ctx, h, batch_done, b);
  if (rc != 0) {
    ss->ops->sync(pool->src_ctx, h);
    batch_done(b, rc);
  }
  return 0;
}

/* ---------------------------------------------------------------- slots -- */

/* Detaches every magazine of sl into one chain (owner inside, or thief). */
static mp_mag *slot_take_all(magpool_t *pool, mp_sslot *sl) {
  mp_mag *chain = NULL;
  for (unsigned k = 0; k < MP_MAX_CLASSES; k++) {
    for (mp_mag *m = sl->full[k]; m != NULL;) {
      mp_mag *mn = mp_load_relaxed(&m->next);
      mp_store_relaxed(&m->next, chain);
      chain = m;
      m = mn;
    }
    sl->full[k] = NULL;
    mp_mag *m = sl->mag[k];
    sl->mag[k] = NULL;
    if (m != NULL && m->count != 0) {
      mp_store_relaxed(&m->next, chain);
      chain = m;
    } else if (m != NULL) {
      mp_mag_free(pool, m);
    }
  }
  mp_store_relaxed(&sl->bytes, 0);
  return chain;
}

/* Detaches only the full magazines. */
static mp_mag *slot_take_full(magpool_t *pool, mp_sslot *sl) {
  mp_mag *chain = NULL;
  int64_t gone = 0;
  for (unsigned k = 0; k < MP_MAX_CLASSES; k++) {
    for (mp_mag *m = sl->full[k]; m != NULL;) {
      mp_mag *mn = mp_load_relaxed(&m->next);
      gone += (int64_t)m->count * (int64_t)mp_block_bytes(pool, k);
      mp_store_relaxed(&m->next, chain);
      chain = m;
      m = mn;
    }
    sl->full[k] = NULL;
  }
  slot_bytes_add(sl, -gone);
  return chain;
}

/* Thief: takes every non-empty slot of e (caller holds the entry lock)
 * and returns their magazines as one chain. */
static mp_mag *entry_steal(magpool_t *pool, mp_sentry *e) {
  mp_sslot *head = mp_load_acquire(&e->slots);
  bool any = false;
  for (mp_sslot *sl = head; sl != NULL; sl = sl->next) {
    if (mp_load_relaxed(&sl->bytes) == 0) continue;
    atomic_store_explicit(&sl->revoke, 1, memory_order_seq_cst);
    any = true;
  }
  if (!any) return NULL;
  asym_heavy();
  mp_mag *chain = NULL;
  for (mp_sslot *sl = head; sl != NULL; sl = sl->next) {
    if (mp_load_relaxed(&sl->revoke) == 0) continue;
    /* ACQUIRE: pairs with slot_exit's RELEASE. */
    while (atomic_load_explicit(&sl->active, memory_order_seq_cst) != 0) sched_yield();
    mp_mag *c = slot_take_all(pool, sl);
    while (c != NULL) {
      mp_mag *n = mp_load_relaxed(&c->next);
      mp_store_relaxed(&c->next, chain);
      chain = c;
      c = n;
    }
    /* RELEASE: the emptied cache is visible to the owner's next enter. */
    mp_store_release(&sl->revoke, 0);
  }
  return chain;
}

/* The calling thread's slot in e, made on first use. */
static mp_sslot *slot_of(mp_sentry *e, mp_tcache *tc) {
  for (mp_sslot *sl = mp_load_acquire(&e->slots); sl != NULL; sl = sl->next)
    if (sl->owner == tc) return sl;
  mp_sslot *sl = calloc(1, sizeof *sl);
  if (sl == NULL) return NULL;
  sl->owner = tc;
  sl->e = e;
  entry_lock(e);
  sl->next = mp_load_relaxed(&e->slots);
  /* RELEASE: the slot is initialised before walkers reach it. */
  mp_store_release(&e->slots, sl);
  entry_unlock(e);
  sl->tnext = tc->s_slots;
  tc->s_slots = sl;
  return sl;
}

/* 0 if s is not being captured, MAGPOOL_ECAPTURE if it is, or the error of
 * the query. */
static int capture_rc(magpool_t *pool, magpool_stream_t s) {
  int cap = S(pool)->ops->capturing(pool->src_ctx, s);
  return cap > 0 ? MAGPOOL_ECAPTURE : cap;
}

/* ------------------------------------------------------------- lookups -- */

static inline uint64_t hash_sid(uint64_t x) {
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  return x ^ (x >> 29);
}

/* Entry for stream id sid, created if `create`.  NULL if the table is
 * full (the stream then runs uncached: every async free is retired alone).
 * Finding is lock-free: probe from the hash until the sid or an empty slot.
 * Creating takes the table mutex (a stream's first use by a pool, rare),
 * so that one sid never gets two entries: it re-probes, then recycles the
 * first released entry without pending batches on the probe path, or takes
 * the first empty slot - either way the first match any later probe sees. */
static mp_sentry *entry_probe(mp_streams *ss, uint64_t sid, mp_sentry **recycle,
                              unsigned *empty) {
  unsigned start = (unsigned)hash_sid(sid) & (MP_STREAM_TABLE - 1);
  if (recycle != NULL) *recycle = NULL;
  for (unsigned k = 0; k < MP_STREAM_TABLE; k++) {
    unsigned i = (start + k) & (MP_STREAM_TABLE - 1);
    mp_sentry *e = mp_load_acquire(&ss->tab[i]);
    if (e == NULL) {
      if (empty != NULL) *empty = i;
      return NULL;
    }
    uint64_t es = mp_load_acquire(&e->sid);
    if (es == sid) return e;
    if (recycle != NULL && *recycle == NULL && es == 0 && mp_load_acquire(&e->pending) == 0)
      *recycle = e;
  }
  if (empty != NULL) *empty = MP_STREAM_TABLE;
  return NULL;
}

static mp_sentry *entry_find(mp_streams *ss, uint64_t sid, magpool_stream_t h, bool create) {
  mp_sentry *e = entry_probe(ss, sid, NULL, NULL);
  if (e != NULL || !create) return e;
  pthread_mutex_lock(&ss->create_lock);
  mp_sentry *rec;
  unsigned empty;
  e = entry_probe(ss, sid, &rec, &empty);
  if (e == NULL && rec != NULL) {
    entry_lock(rec);
    if (mp_load_relaxed(&rec->sid) == 0 && mp_load_acquire(&rec->pending) == 0) {
      rec->handle = h;
      /* RELEASE: handle is written before finders can match the sid. */
      mp_store_release(&rec->sid, sid);
      e = rec;
    }
    entry_unlock(rec);
  }
  if (e == NULL && empty < MP_STREAM_TABLE) {
    e = calloc(1, sizeof *e);
    if (e != NULL) {
      e->handle = h;
      atomic_init(&e->sid, sid);
      /* RELEASE: the entry is initialised before finders see it. */
      mp_store_release(&ss->tab[empty], e);
    }
  }
  pthread_mutex_unlock(&ss->create_lock);
  return e;
}

/* The memo's slow path: resolves s to this thread's slot.  Errors:
 * MAGPOOL_EINVAL (not a stream of this pool's kind), MAGPOOL_ECAPTURE,
 * MAGPOOL_ECUDA.  *out may be NULL with 0 returned (table full, or no host
 * memory for a slot: the stream then runs uncached). */
static MP_NOINLINE int memo_slow(magpool_t *pool, mp_tcache *tc, magpool_stream_t s,
                                 mp_sslot **out) {
  mp_streams *ss = S(pool);
  int cap = capture_rc(pool, s);
  if (cap != 0) return cap;
  uint64_t sid;
  int rc = ss->ops->get_id(pool->src_ctx, s, &sid);
  if (rc != 0) return rc;
  uint64_t ep = mp_load_acquire(&pool->stream_epoch);
  mp_sentry *e = entry_find(ss, sid + 1, s, true); /* +1: 0 means empty */
  mp_sslot *sl = e != NULL ? slot_of(e, tc) : NULL;
  if (sl != NULL) {
    tc->s_handle = s;
    tc->s_slot = sl;
    tc->s_epoch = ep;
    tc->s_check_capture = ss->ops->check_capture && pool->cfg.capture_check;
  }
  *out = sl;
  return 0;
}

MP_INLINE int memo_get(magpool_t *pool, mp_tcache *tc, magpool_stream_t s, mp_sslot **out) {
  if (MP_LIKELY(tc->s_slot != NULL && tc->s_handle == s &&
                tc->s_epoch == mp_load_relaxed(&pool->stream_epoch))) {
    *out = tc->s_slot;
    return 0;
  }
  return memo_slow(pool, tc, s, out);
}

/* ----------------------------------------------------------- public API */

static inline bool no_stream(magpool_t *pool, magpool_stream_t s) {
  return s == NULL && pool->cfg.kind == MAGPOOL_MEM_HOST;
}

static MP_NOINLINE void *alloc_async_full(magpool_t *pool, size_t size, magpool_stream_t s) {
  if (MP_UNLIKELY(pool == NULL)) return mp_fail(MAGPOOL_EINVAL);
  if (no_stream(pool, s)) return magpool_alloc(pool, size);
  mp_tcache *tc = mp_tcache_get(pool);
  if (MP_UNLIKELY(tc == NULL)) return mp_fail(MAGPOOL_ENOMEM);
  mp_sslot *sl;
  int rc = memo_get(pool, tc, s, &sl);
  if (MP_UNLIKELY(rc != 0)) return mp_fail(rc);
  unsigned order;
  if (MP_UNLIKELY(mp_size_order(pool, size, &order) != 0)) return mp_fail(MAGPOOL_ENOMEM);
  if (order < pool->s_nclasses && sl != NULL && slot_enter(sl)) {
    void *p = NULL;
    mp_mag *m = sl->mag[order];
    if (m != NULL && m->count != 0) {
      p = m->slot[--m->count];
    } else if (sl->full[order] != NULL) { /* swap in a full magazine */
      mp_mag *f = sl->full[order];
      sl->full[order] = mp_load_relaxed(&f->next);
      if (m != NULL) mp_mag_free(pool, m);
      sl->mag[order] = f;
      p = f->slot[--f->count];
    }
    if (p != NULL) slot_bytes_add(sl, -(int64_t)mp_block_bytes(pool, order));
    slot_exit(sl);
    if (p != NULL) return mp_hand_out(pool, tc, p, order, size, 0);
  }
  /* Miss: any block that is free for the whole pool is free for s too. */
  return magpool_alloc(pool, size);
}

/* The slow half of free_async, after the header was validated but not yet
 * claimed. */
static MP_NOINLINE int free_async_slow(magpool_t *pool, mp_tcache *tc, mp_sslot *sl,
                                       magpool_stream_t s, void *p, _Atomic uint32_t *h,
                                       unsigned order, size_t req) {
  mp_streams *ss = S(pool);
  /* Anything past this point may enqueue a callback: not during capture. */
  int cap = capture_rc(pool, s);
  if (cap != 0) return cap;
  size_t bs = mp_block_bytes(pool, order);
  mp_store_relaxed(h, 0); /* claim: from here on the block is ours */
  if (MP_UNLIKELY(mp_load_relaxed(&pool->tracking))) mp_track_on_free(pool, p);
  mp_owner_add(&tc->st.requested, -(uint64_t)req);
  mp_owner_add(&tc->st.frees, 1);

  mp_sentry *e = sl != NULL ? sl->e : NULL;
  if (order < pool->s_nclasses && sl != NULL && slot_enter(sl)) {
    mp_mag *m = sl->mag[order];
    if (m != NULL && m->count == m->cap) { /* full: chain it */
      mp_store_relaxed(&m->next, sl->full[order]);
      sl->full[order] = m;
      m = NULL;
    }
    if (m == NULL) m = sl->mag[order] = mp_mag_new_cap(pool, order, pool->s_mag_cap[order]);
    if (m != NULL) {
      m->slot[m->count++] = p;
      slot_bytes_add(sl, (int64_t)bs);
      mp_mag *chain = NULL;
      if (mp_load_relaxed(&sl->bytes) > (int64_t)pool->cfg.stream_cache_bytes)
        chain = slot_take_full(pool, sl);
      slot_exit(sl);
      if (chain != NULL) retire(pool, e, s, chain);
      return 0;
    }
    slot_exit(sl);
  }
  /* Uncached: retire this block alone. */
  mp_mag *m = mp_mag_new(pool, order);
  if (m == NULL) { /* no host memory: wait for the stream instead */
    ss->ops->sync(pool->src_ctx, s);
    mp_tree_give(pool, tc, p, order);
    return 0;
  }
  m->slot[0] = p;
  m->count = 1;
  mp_store_relaxed(&m->next, NULL);
  return retire(pool, e, s, m);
}

static MP_NOINLINE int free_async_full(magpool_t *pool, void *ptr, magpool_stream_t s) {
  if (MP_UNLIKELY(pool == NULL)) return MAGPOOL_EINVAL;
  if (ptr == NULL) return 0;
  if (no_stream(pool, s)) return magpool_free(pool, ptr);
  mp_tcache *tc = mp_tcache_get(pool);
  if (MP_UNLIKELY(tc == NULL)) return MAGPOOL_ENOMEM;
  mp_sslot *sl;
  int rc = memo_get(pool, tc, s, &sl);
  if (MP_UNLIKELY(rc != 0)) return rc;
  /* Validate without claiming: nothing may change on an error. */
  _Atomic uint32_t *h;
  unsigned order;
  size_t req;
  int vr = mp_peek_header(pool, ptr, 0, false, false, &h, &order, &req);
  if (MP_UNLIKELY(vr != 0)) return vr;
  return free_async_slow(pool, tc, sl, s, ptr, h, order, req);
}

/* The fast paths: the calling thread's memo names its slot for s, no
 * thief holds the slot, and the slot's magazine for the class has a block
 * (alloc) or room (free), for a block of region 0.  No atomic RMW, no
 * lock, no shared write but the block's header.  Anything else takes the
 * full path above, which repeats every check. */
MP_INLINE bool memo_hit(magpool_t *pool, mp_tcache *tc, magpool_stream_t s) {
  return tc != NULL && tc->pool == pool &&
         tc->epoch == mp_load_relaxed(&pool->trim_epoch) && tc->s_slot != NULL &&
         tc->s_handle == s && tc->s_epoch == mp_load_relaxed(&pool->stream_epoch);
}

void *magpool_alloc_async(magpool_t *pool, size_t size, magpool_stream_t s) {
  mp_tcache *tc = mp_tls_last;
  if (MP_LIKELY(memo_hit(pool, tc, s) && size <= tc->s_cache_max)) {
    unsigned order = mp_cached_order(tc, size);
    mp_sslot *sl = tc->s_slot;
    if (MP_LIKELY(slot_enter(sl))) {
      mp_mag *m = sl->mag[order];
      if (MP_LIKELY(m != NULL && m->count != 0)) {
        char *p = m->slot[m->count - 1];
        size_t off = (size_t)(p - tc->r0_base);
        if (MP_LIKELY(off < tc->r0_bytes)) {
          size_t bs = (size_t)1 << (order + tc->shift);
          m->count--;
          slot_bytes_add(sl, -(int64_t)bs);
          slot_exit(sl);
          mp_store_relaxed(&tc->r0_hdr[off >> tc->shift],
                           (uint32_t)(order + 1) | (uint32_t)((bs - size) << MP_HDR_SLACK_SHIFT));
          mp_owner_add(&tc->st.requested, size);
          mp_owner_add(&tc->st.allocs, 1);
          return p;
        }
      }
      slot_exit(sl);
    }
  }
  return alloc_async_full(pool, size, s);
}

/* The free fast path proper: true if it freed ptr into the thread's slot.
 * No calls, so the inline caller needs no stack frame. */
MP_INLINE bool free_async_hit(magpool_t *pool, mp_tcache *tc, void *ptr) {
  size_t off = (size_t)((char *)ptr - tc->r0_base);
  size_t unit = off >> tc->shift;
  if (MP_UNLIKELY(off >= tc->r0_bytes || (unit << tc->shift) != off)) return false;
  _Atomic uint32_t *h = &tc->r0_hdr[unit];
  uint32_t w = mp_load_relaxed(h);
  unsigned order = (w & MP_HDR_ORDER_MASK) - 1; /* ~0u when not live */
  mp_sslot *sl = tc->s_slot;
  if (MP_UNLIKELY(order >= tc->s_nclasses || (w & MP_HDR_SCOPE) != 0 || !slot_enter(sl)))
    return false;
  size_t bs = (size_t)1 << (order + tc->shift);
  mp_mag *m = sl->mag[order];
  if (MP_UNLIKELY(m == NULL || m->count >= m->cap ||
                  mp_load_relaxed(&sl->bytes) + (int64_t)bs >
                      (int64_t)pool->cfg.stream_cache_bytes)) {
    slot_exit(sl);
    return false;
  }
  mp_store_relaxed(h, 0); /* claim */
  m->slot[m->count++] = ptr;
  slot_bytes_add(sl, (int64_t)bs);
  slot_exit(sl);
  mp_owner_add(&tc->st.requested, -(uint64_t)(bs - (w >> MP_HDR_SLACK_SHIFT)));
  mp_owner_add(&tc->st.frees, 1);
  return true;
}

/* CUDA streams: a free recorded into a graph being captured must not make
 * its block reusable now (graph replays would keep writing it), so every
 * free asks first; free_async_slow answers MAGPOOL_ECAPTURE. */
static MP_NOINLINE int free_async_capture(magpool_t *pool, mp_tcache *tc, void *ptr,
                                          magpool_stream_t s) {
  if (capture_rc(pool, s) == 0 && free_async_hit(pool, tc, ptr)) return 0;
  return free_async_full(pool, ptr, s);
}

int magpool_free_async(magpool_t *pool, void *ptr, magpool_stream_t s) {
  mp_tcache *tc = mp_tls_last;
  if (MP_LIKELY(memo_hit(pool, tc, s))) {
    if (MP_UNLIKELY(tc->s_check_capture)) return free_async_capture(pool, tc, ptr, s);
    if (MP_LIKELY(free_async_hit(pool, tc, ptr))) return 0;
  }
  return free_async_full(pool, ptr, s);
}

int magpool_stream_release(magpool_t *pool, magpool_stream_t s) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  if (no_stream(pool, s)) return 0;
  mp_streams *ss = S(pool);
  int cap = capture_rc(pool, s);
  if (cap != 0) return cap;
  uint64_t sid;
  int rc = ss->ops->get_id(pool->src_ctx, s, &sid);
  if (rc != 0) return rc;
  mp_sentry *e = entry_find(ss, sid + 1, s, false);
  if (e == NULL) return 0;
  entry_lock(e);
  if (mp_load_relaxed(&e->sid) == sid + 1) {
    /* Every thread's blocks freed on s go behind s's work, now, while s is
     * still a valid stream. */
    mp_mag *chain = entry_steal(pool, e);
    if (chain != NULL) retire(pool, e, s, chain);
    /* No memo may reach this entry for s any more. */
    mp_fetch_add_acq_rel(&pool->stream_epoch, 1);
    mp_store_release(&e->sid, 0);
  }
  entry_unlock(e);
  return 0;
}

/* --------------------------------------------------------- ladder, trim -- */

void mp_streams_flush_caches(magpool_t *pool, mp_tcache *tc) {
  (void)tc;
  mp_streams *ss = S(pool);
  for (unsigned i = 0; i < MP_STREAM_TABLE; i++) {
    mp_sentry *e = mp_load_acquire(&ss->tab[i]);
    if (e == NULL || mp_load_relaxed(&e->sid) == 0) continue;
    if (!entry_try(e)) continue; /* another thief is at it */
    /* A per-thread stream's handle names our own stream here, not its
     * owner's: only the owner retires it (mp_streams_thread_flush). */
    if (mp_load_relaxed(&e->sid) != 0 && !ss->ops->per_thread(e->handle) &&
        ss->ops->capturing(pool->src_ctx, e->handle) == 0) {
      mp_mag *chain = entry_steal(pool, e);
      if (chain != NULL) retire(pool, e, e->handle, chain);
    }
    entry_unlock(e);
  }
}

size_t mp_streams_wait_pending(magpool_t *pool, mp_tcache *tc) {
  (void)tc;
  mp_streams *ss = S(pool);
  if (mp_load_acquire(&ss->pending_batches) == 0) return 0;
  size_t n = 0;
  for (unsigned i = 0; i < MP_STREAM_TABLE; i++) {
    mp_sentry *e = mp_load_acquire(&ss->tab[i]);
    if (e == NULL || mp_load_acquire(&e->pending) == 0) continue;
    if (!entry_try(e)) continue;
    /* Sync under the entry lock: a release (which takes it) cannot retire
     * the entry, and its stream be destroyed, while we wait on it. */
    if (mp_load_relaxed(&e->sid) != 0 && ss->ops->sync(pool->src_ctx, e->handle) == 0) n++;
    entry_unlock(e);
  }
  if (mp_load_acquire(&ss->pending_batches) != 0) {
    /* Batches of released streams (or ones we could not sync): wait for
     * the whole device, or, on host streams, for their callbacks - at
     * most a second, since a released host stream may be blocked. */
    if (ss->ops->sync_all(pool->src_ctx) != 0) {
      struct timespec t0, t;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      while (mp_load_acquire(&ss->pending_batches) != 0) {
        sched_yield();
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec >= 1) break;
      }
    }
    n++;
  }
  return n;
}

void mp_streams_trim(magpool_t *pool, mp_tcache *tc) {
  mp_streams_flush_caches(pool, tc);
  mp_streams_drain_ready(pool, tc);
}

/* A thread leaves (its record is being flushed): its slots' blocks go
 * behind their streams.  A slot whose stream was released has been
 * emptied by the release. */
void mp_streams_thread_exit(magpool_t *pool, mp_tcache *tc) {
  mp_streams_thread_flush(pool, tc);
  tc->s_slot = NULL;
  tc->s_handle = NULL;
}

void mp_streams_thread_flush(magpool_t *pool, mp_tcache *tc) {
  mp_streams *ss = S(pool);
  for (mp_sslot *sl = tc->s_slots; sl != NULL; sl = sl->tnext) {
    if (mp_load_relaxed(&sl->bytes) == 0 || !slot_enter(sl)) continue;
    mp_mag *chain = slot_take_all(pool, sl);
    slot_exit(sl);
    if (chain == NULL) continue;
    mp_sentry *e = sl->e;
    if (mp_load_acquire(&e->sid) != 0 && ss->ops->capturing(pool->src_ctx, e->handle) == 0) {
      retire(pool, e, e->handle, chain);
    } else { /* stream gone (or capturing): wait for the device instead */
      ss->ops->sync_all(pool->src_ctx);
      for (mp_mag *m = chain; m != NULL;) {
        mp_mag *mn = mp_load_relaxed(&m->next);
        mp_blocks_give(pool, tc, m->slot, m->count, m->order);
        mp_mag_free(pool, m);
        m = mn;
      }
    }
  }
}

void mp_streams_destroy(magpool_t *pool) {
  mp_streams *ss = S(pool);
  if (ss == NULL) return;
  /* Every callback must have run before the pool's memory goes away. */
  while (mp_load_acquire(&ss->pending_batches) != 0) {
    if (ss->ops->sync_all(pool->src_ctx) != 0) sched_yield();
  }
  mp_batch *b = atomic_exchange_explicit(&ss->ready, NULL, memory_order_acquire);
  while (b != NULL) {
    mp_batch *n = b->next;
    free(b); /* its magazines live in the pool's slabs */
    b = n;
  }
  for (unsigned i = 0; i < MP_STREAM_TABLE; i++) {
    mp_sentry *e = mp_load_relaxed(&ss->tab[i]);
    if (e == NULL) continue;
    for (mp_sslot *sl = mp_load_relaxed(&e->slots); sl != NULL;) {
      mp_sslot *n = sl->next;
      free(sl);
      sl = n;
    }
    free(e);
  }
  pthread_mutex_destroy(&ss->create_lock);
  free(ss);
  pool->streams = NULL;
}
