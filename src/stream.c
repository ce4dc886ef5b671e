/* stream.c - stream-ordered allocation: per-stream caches, retire batches
 * and the ready list.
 *
 * Layers (see docs/design.md, "Streams"):
 *
 *   mp_sentry   one per (pool, stream id): a cache of blocks freed on that
 *               stream, reusable at once by allocations on the same stream
 *               (from any thread).  Guarded by a try-lock (`busy`): a
 *               thread that finds it busy never waits, it takes the
 *               uncached path instead.
 *   mp_batch    blocks retired from a stream cache: one stream callback per
 *               batch ("run when the stream has passed this point").
 *   ready list  batches whose callback ran; a lock-free LIFO that the
 *               callback pushes onto (O(1), no CUDA call) and drainers
 *               take whole (atomic exchange, so no ABA), sorting and
 *               coalescing the blocks into the tree (lazy coalescing).
 *
 * Stream identity is the stream's unique id (cudaStreamGetId, or the host
 * stream's id), never its handle: handles are reused after a stream is
 * destroyed, and cudaStreamPerThread names a different stream on every
 * thread.  A thread-local one-entry memo maps (handle, epoch) to the entry;
 * magpool_stream_release bumps the epoch, so no memo outlives a release.
 *
 * Concurrency contract:
 *   sentry cache (mag, full, bytes) ... holder of `busy` only
 *   sentry sid ........................ CAS (claim an empty or recycled
 *                                       slot); set to 0 by release under busy
 *   pending counters .................. atomic add/sub (retire, callback)
 *   ready list ........................ push: CAS (callbacks, any thread);
 *                                       take: exchange (drainers)
 * Accounting invariant (quiescent, in bytes):
 *   tree free + live + thread caches + depots + stream caches + pending +
 *   ready == reserved
 */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MP_STREAM_TABLE 1024u /* live streams per pool with a cache */

typedef struct mp_sentry {
  _Atomic uint64_t sid;       /* 0: empty or released                  */
  magpool_stream_t handle;    /* valid while sid != 0 (written under busy
                                 before publication of the sid)        */
  _Atomic int busy;           /* try-lock over the cache below         */
  _Atomic int64_t pending;    /* batches retired, callback not yet run */
  _Atomic int64_t cached;     /* mirror of bytes, for stats            */
  int64_t bytes;              /* blocks cached here (under busy)       */
  mp_mag *mag[MP_MAX_CLASSES];  /* loaded magazine per class          */
  mp_mag *full[MP_MAX_CLASSES]; /* chain of full magazines (via next)  */
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
  _Atomic uint64_t epoch;     /* bumped by every release               */
  _Atomic int64_t pending_bytes;
  _Atomic int64_t pending_batches;
  _Atomic int64_t ready_bytes;
  _Atomic(mp_batch *) ready;
  pthread_mutex_t create_lock; /* creating/recycling entries only      */
  _Atomic(mp_sentry *) tab[MP_STREAM_TABLE];
} mp_streams;

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

static const mp_stream_ops host_stream_ops = {
  .get_id = host_get_id,
  .after = host_after,
  .sync = host_sync,
  .capturing = host_capturing,
  .sync_all = host_sync_all,
};

/* -------------------------------------------------------- init / stats -- */

static inline mp_streams *S(magpool_t *pool) { return pool->streams; }

int mp_streams_init(magpool_t *pool) {
  mp_streams *ss = calloc(1, sizeof *ss);
  if (ss == NULL) return MAGPOOL_ENOMEM;
  ss->ops = pool->cfg.kind == MAGPOOL_MEM_HOST ? &host_stream_ops : &mp_cuda_stream_ops;
  atomic_init(&ss->epoch, 1);
  pthread_mutex_init(&ss->create_lock, NULL);
  pool->streams = ss;
  return 0;
}

void mp_streams_stats(magpool_t *pool, size_t *cached, size_t *pending) {
  mp_streams *ss = S(pool);
  int64_t c = mp_load_relaxed(&ss->ready_bytes);
  for (unsigned i = 0; i < MP_STREAM_TABLE; i++) {
    mp_sentry *e = mp_load_acquire(&ss->tab[i]);
    if (e != NULL) c += mp_load_relaxed(&e->cached);
  }
  int64_t p = mp_load_relaxed(&ss->pending_bytes);
  *cached = c > 0 ? (size_t)c : 0;
  *pending = p > 0 ? (size_t)p : 0;
}

/* ------------------------------------------------------------ try-lock -- */

static inline bool entry_try(mp_sentry *e) {
  int z = 0;
  /* ACQUIRE: pairs with the RELEASE in entry_unlock; the previous
   * holder's cache writes are visible to us. */
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

/* Detaches every magazine of e into one chain (caller holds busy). */
static mp_mag *entry_take_all(magpool_t *pool, mp_sentry *e) {
  mp_mag *chain = NULL;
  for (unsigned k = 0; k < MP_MAX_CLASSES; k++) {
    for (mp_mag *m = e->full[k]; m != NULL;) {
      mp_mag *mn = mp_load_relaxed(&m->next);
      mp_store_relaxed(&m->next, chain);
      chain = m;
      m = mn;
    }
    e->full[k] = NULL;
    mp_mag *m = e->mag[k];
    e->mag[k] = NULL;
    if (m != NULL && m->count != 0) {
      mp_store_relaxed(&m->next, chain);
      chain = m;
    } else if (m != NULL) {
      mp_mag_free(pool, m);
    }
  }
  e->bytes = 0;
  mp_store_relaxed(&e->cached, 0);
  return chain;
}

/* Detaches only the full magazines (caller holds busy). */
static mp_mag *entry_take_full(mp_sentry *e, int64_t bs_of[]) {
  mp_mag *chain = NULL;
  for (unsigned k = 0; k < MP_MAX_CLASSES; k++) {
    for (mp_mag *m = e->full[k]; m != NULL;) {
      mp_mag *mn = mp_load_relaxed(&m->next);
      e->bytes -= (int64_t)m->count * bs_of[k];
      mp_store_relaxed(&m->next, chain);
      chain = m;
      m = mn;
    }
    e->full[k] = NULL;
  }
  mp_store_relaxed(&e->cached, e->bytes);
  return chain;
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

/* The memo's slow path: resolves s to its entry for this thread.  Errors:
 * MAGPOOL_EINVAL (not a stream of this pool's kind), MAGPOOL_ECAPTURE,
 * MAGPOOL_ECUDA.  *out may be NULL with 0 returned (table full). */
static MP_NOINLINE int memo_slow(magpool_t *pool, mp_tcache *tc, magpool_stream_t s,
                                 mp_sentry **out) {
  mp_streams *ss = S(pool);
  int cap = ss->ops->capturing(pool->src_ctx, s);
  if (cap < 0) return cap;
  if (cap > 0) return MAGPOOL_ECAPTURE;
  uint64_t sid;
  int rc = ss->ops->get_id(pool->src_ctx, s, &sid);
  if (rc != 0) return rc;
  uint64_t ep = mp_load_acquire(&ss->epoch);
  mp_sentry *e = entry_find(ss, sid + 1, s, true); /* +1: 0 means empty */
  if (e != NULL) {
    tc->s_handle = s;
    tc->s_entry = e;
    tc->s_sid = sid + 1;
    tc->s_epoch = ep;
  }
  *out = e;
  return 0;
}

MP_INLINE int memo_get(magpool_t *pool, mp_tcache *tc, magpool_stream_t s, mp_sentry **out) {
  if (MP_LIKELY(tc->s_entry != NULL && tc->s_handle == s &&
                tc->s_epoch == mp_load_relaxed(&S(pool)->epoch))) {
    *out = tc->s_entry;
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
  mp_sentry *e;
  int rc = memo_get(pool, tc, s, &e);
  if (MP_UNLIKELY(rc != 0)) return mp_fail(rc);
  unsigned order;
  if (MP_UNLIKELY(mp_size_order(pool, size, &order) != 0)) return mp_fail(MAGPOOL_ENOMEM);
  if (order < pool->s_nclasses && e != NULL) {
    if (entry_try(e)) {
      void *p = NULL;
      if (MP_LIKELY(mp_load_relaxed(&e->sid) == tc->s_sid)) {
        mp_mag *m = e->mag[order];
        if (MP_LIKELY(m != NULL && m->count != 0)) {
          p = m->slot[--m->count];
        } else if (e->full[order] != NULL) { /* swap in a full magazine */
          mp_mag *f = e->full[order];
          e->full[order] = mp_load_relaxed(&f->next);
          if (m != NULL) mp_mag_free(pool, m);
          e->mag[order] = f;
          p = f->slot[--f->count];
        }
        if (p != NULL) {
          e->bytes -= (int64_t)mp_block_bytes(pool, order);
          mp_store_relaxed(&e->cached, e->bytes);
        }
      }
      entry_unlock(e);
      if (p != NULL) return mp_hand_out(pool, tc, p, order, size, 0);
    }
  }
  /* Miss: any block that is free for the whole pool is free for s too. */
  return magpool_alloc(pool, size);
}

/* The slow half of free_async, after the header was validated but not yet
 * claimed (*h still holds w). */
static MP_NOINLINE int free_async_slow(magpool_t *pool, mp_tcache *tc, mp_sentry *e,
                                       magpool_stream_t s, void *p, _Atomic uint32_t *h,
                                       unsigned order, size_t req) {
  mp_streams *ss = S(pool);
  /* Anything past this point may enqueue a callback: not during capture. */
  int cap = ss->ops->capturing(pool->src_ctx, s);
  if (cap < 0) return cap;
  if (cap > 0) return MAGPOOL_ECAPTURE;
  size_t bs = mp_block_bytes(pool, order);
  mp_store_relaxed(h, 0); /* claim: from here on the block is ours */
  if (MP_UNLIKELY(mp_load_relaxed(&pool->tracking))) mp_track_on_free(pool, p);
  mp_owner_add(&tc->st.requested, -(uint64_t)req);
  mp_owner_add(&tc->st.frees, 1);

  if (order < pool->s_nclasses && e != NULL) {
    entry_lock(e);
    if (mp_load_relaxed(&e->sid) == tc->s_sid) {
      mp_mag *m = e->mag[order];
      if (m != NULL && m->count == m->cap) { /* full: chain it */
        mp_store_relaxed(&m->next, e->full[order]);
        e->full[order] = m;
        m = NULL;
      }
      if (m == NULL) {
        m = e->mag[order] = mp_mag_new_cap(pool, order, pool->s_mag_cap[order]);
      }
      if (m != NULL) {
        m->slot[m->count++] = p;
        e->bytes += (int64_t)bs;
        mp_mag *chain = NULL;
        if (e->bytes > (int64_t)pool->cfg.stream_cache_bytes) {
          int64_t bs_of[MP_MAX_CLASSES];
          for (unsigned k = 0; k < MP_MAX_CLASSES; k++)
            bs_of[k] = k < pool->s_nclasses ? (int64_t)mp_block_bytes(pool, k) : 0;
          chain = entry_take_full(e, bs_of);
        }
        mp_store_relaxed(&e->cached, e->bytes);
        if (chain != NULL) retire(pool, e, s, chain);
        entry_unlock(e);
        return 0;
      }
    }
    entry_unlock(e);
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
  mp_sentry *e;
  int rc = memo_get(pool, tc, s, &e);
  if (MP_UNLIKELY(rc != 0)) return rc;
  /* Validate without claiming: nothing may change on an error. */
  _Atomic uint32_t *h;
  unsigned order;
  size_t req;
  int vr = mp_peek_header(pool, ptr, 0, false, false, &h, &order, &req);
  if (MP_UNLIKELY(vr != 0)) return vr;
  size_t bs = mp_block_bytes(pool, order);

  if (MP_LIKELY(order < pool->s_nclasses && e != NULL) && entry_try(e)) {
    mp_mag *m = e->mag[order];
    if (MP_LIKELY(mp_load_relaxed(&e->sid) == tc->s_sid && m != NULL && m->count < m->cap &&
                  e->bytes + (int64_t)bs <= (int64_t)pool->cfg.stream_cache_bytes)) {
      mp_store_relaxed(h, 0); /* claim */
      m->slot[m->count++] = ptr;
      e->bytes += (int64_t)bs;
      mp_store_relaxed(&e->cached, e->bytes);
      entry_unlock(e);
      if (MP_UNLIKELY(mp_load_relaxed(&pool->tracking))) mp_track_on_free(pool, ptr);
      mp_owner_add(&tc->st.requested, -(uint64_t)req);
      mp_owner_add(&tc->st.frees, 1);
      return 0;
    }
    entry_unlock(e);
  }
  return free_async_slow(pool, tc, e, s, ptr, h, order, req);
}

/* The fast paths: the calling thread's memo names s's entry, the entry's
 * try-lock is free, and the entry's magazine for the class has a block
 * (alloc) or room (free), for a block of region 0.  One CAS and one
 * release store on the entry; the rest is plain.  Anything else takes the
 * full path above, which repeats every check. */
MP_INLINE bool memo_hit(magpool_t *pool, mp_tcache *tc, magpool_stream_t s) {
  return tc != NULL && tc->pool == pool &&
         tc->epoch == mp_load_relaxed(&pool->trim_epoch) && tc->s_entry != NULL &&
         tc->s_handle == s && tc->s_epoch == mp_load_relaxed(&S(pool)->epoch);
}

void *magpool_alloc_async(magpool_t *pool, size_t size, magpool_stream_t s) {
  mp_tcache *tc = mp_tls_last;
  if (MP_LIKELY(memo_hit(pool, tc, s) && size <= tc->s_cache_max)) {
    size_t q = (size - (size != 0)) >> tc->shift;
    unsigned order = q == 0 ? 0 : 64u - mp_clz64(q);
    mp_sentry *e = tc->s_entry;
    if (MP_LIKELY(entry_try(e))) {
      mp_mag *m = e->mag[order];
      if (MP_LIKELY(mp_load_relaxed(&e->sid) == tc->s_sid && m != NULL && m->count != 0)) {
        char *p = m->slot[m->count - 1];
        size_t off = (size_t)(p - tc->r0_base);
        if (MP_LIKELY(off < tc->r0_bytes)) {
          size_t bs = (size_t)1 << (order + tc->shift);
          m->count--;
          e->bytes -= (int64_t)bs;
          mp_store_relaxed(&e->cached, e->bytes);
          entry_unlock(e);
          mp_store_relaxed(&tc->r0_hdr[off >> tc->shift],
                           (uint32_t)(order + 1) | (uint32_t)((bs - size) << MP_HDR_SLACK_SHIFT));
          mp_owner_add(&tc->st.requested, size);
          mp_owner_add(&tc->st.allocs, 1);
          return p;
        }
      }
      entry_unlock(e);
    }
  }
  return alloc_async_full(pool, size, s);
}

int magpool_free_async(magpool_t *pool, void *ptr, magpool_stream_t s) {
  mp_tcache *tc = mp_tls_last;
  if (MP_LIKELY(memo_hit(pool, tc, s))) {
    size_t off = (size_t)((char *)ptr - tc->r0_base);
    size_t unit = off >> tc->shift;
    if (MP_LIKELY(off < tc->r0_bytes && (unit << tc->shift) == off)) {
      _Atomic uint32_t *h = &tc->r0_hdr[unit];
      uint32_t w = mp_load_relaxed(h);
      unsigned order = (w & MP_HDR_ORDER_MASK) - 1; /* ~0u when not live */
      mp_sentry *e = tc->s_entry;
      if (MP_LIKELY(order < tc->s_nclasses && (w & MP_HDR_SCOPE) == 0 && entry_try(e))) {
        size_t bs = (size_t)1 << (order + tc->shift);
        mp_mag *m = e->mag[order];
        if (MP_LIKELY(mp_load_relaxed(&e->sid) == tc->s_sid && m != NULL && m->count < m->cap &&
                      e->bytes + (int64_t)bs <= (int64_t)pool->cfg.stream_cache_bytes)) {
          mp_store_relaxed(h, 0); /* claim */
          m->slot[m->count++] = ptr;
          e->bytes += (int64_t)bs;
          mp_store_relaxed(&e->cached, e->bytes);
          entry_unlock(e);
          mp_owner_add(&tc->st.requested, -(uint64_t)(bs - (w >> MP_HDR_SLACK_SHIFT)));
          mp_owner_add(&tc->st.frees, 1);
          return 0;
        }
        entry_unlock(e);
      }
    }
  }
  return free_async_full(pool, ptr, s);
}

int magpool_stream_release(magpool_t *pool, magpool_stream_t s) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  if (no_stream(pool, s)) return 0;
  mp_streams *ss = S(pool);
  int cap = ss->ops->capturing(pool->src_ctx, s);
  if (cap < 0) return cap;
  if (cap > 0) return MAGPOOL_ECAPTURE;
  uint64_t sid;
  int rc = ss->ops->get_id(pool->src_ctx, s, &sid);
  if (rc != 0) return rc;
  mp_sentry *e = entry_find(ss, sid + 1, s, false);
  if (e == NULL) return 0;
  entry_lock(e);
  if (mp_load_relaxed(&e->sid) == sid + 1) {
    mp_mag *chain = entry_take_all(pool, e);
    if (chain != NULL) retire(pool, e, s, chain);
    /* No memo may reach this entry for s any more. */
    mp_fetch_add_acq_rel(&ss->epoch, 1);
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
    if (e == NULL || mp_load_relaxed(&e->cached) == 0) continue;
    if (!entry_try(e)) continue; /* in use right now: skip it */
    if (mp_load_relaxed(&e->sid) != 0 &&
        ss->ops->capturing(pool->src_ctx, e->handle) == 0) {
      mp_mag *chain = entry_take_all(pool, e);
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
    magpool_stream_t h = e->handle;
    bool live = mp_load_relaxed(&e->sid) != 0;
    entry_unlock(e);
    if (live && ss->ops->sync(pool->src_ctx, h) == 0) n++;
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
  for (unsigned i = 0; i < MP_STREAM_TABLE; i++) free(mp_load_relaxed(&ss->tab[i]));
  pthread_mutex_destroy(&ss->create_lock);
  free(ss);
  pool->streams = NULL;
}
