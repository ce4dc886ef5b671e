/* internal.h - magpool's internal prototypes, grouped by the file that
 * defines them, bottom layer first (the layers: types.h).
 *
 * Each entry point says, liburcu style: which threads may call it, what
 * the caller must hold, and what it orders.  "Owner" means the thread
 * whose record (mp_tcache) is passed; "any" means any thread, no lock.
 *
 * Inline code here calls no .c file: the inline helpers of a layer live in
 * that layer's header (hdr.h, thread.h, stream_cache.h, alloc.h).
 */
#ifndef MAGPOOL_INTERNAL_H
#define MAGPOOL_INTERNAL_H

#include "atomic.h"
#include "base.h"
#include "hdr.h"
#include "tree.h"
#include "types.h"

/* ============================================================ layer 0 */

/* --------------------------------------------------------- config_parse.c */
/* Applies MAGPOOL_TRACE and MAGPOOL_CONF to *cfg (magpool_config_init).
 * Any thread. */
void mp_config_apply_env(magpool_config_t *cfg);

/* ---------------------------------------------------------------- trace.c */
/* A pool's trace recorder (magpool_config_t.trace_path). */
typedef struct mp_trace mp_trace;
/* Opens a recorder writing to path ("%p": the pid; a path already open in
 * the process gets ".uid"); header becomes a comment line.  0,
 * MAGPOOL_ENOMEM, or MAGPOOL_EINVAL if the file cannot be created.  Any
 * thread. */
int mp_trace_open(mp_trace **out, const char *path, uint64_t uid, const char *header);
/* Writes the trace (unless process exit did) and frees the recorder.  Must not overlap a
 * record call on it (magpool_destroy's contract). */
void mp_trace_close(mp_trace *t);
/* Records a successful allocation: after it succeeded, before the pointer is returned.  Any thread. */
void mp_trace_alloc(mp_trace *t, const void *p, size_t size, const void *stream);
/* A free's sequence number: take it before the free is made, and record
 * the free with mp_trace_free only if it succeeded.  Any thread. */
uint64_t mp_trace_seq(mp_trace *t);
void mp_trace_free(mp_trace *t, uint64_t seq, const void *p, const void *stream);

/* ============================================================ layer 1 */

/* ----------------------------------------------------------- source_host.c */
extern const mp_source_ops mp_source_host;

/* ----------------------------------------------------------- source_fail.c */
/* A host source that fails on demand, for growth and out-of-memory tests.
 * While armed, the next `countdown` reserves succeed and every later one
 * fails with MAGPOOL_ENOMEM.  countdown < 0 disarms it.  Process-global;
 * any thread (relaxed: tests arm it before the pool calls it). */
extern const mp_source_ops mp_source_failing;
void mp_source_failing_arm(long countdown);
/* Host-stream ordering that fails on demand (retire's failure paths):
 * while armed (countdown >= 0), the next `countdown` after() calls succeed
 * and every later one fails with MAGPOOL_ENOMEM; callbacks report
 * `status` as a device error when it is nonzero.  Process-global. */
extern const mp_stream_ops mp_stream_failing_ops;
void mp_stream_failing_arm(long countdown, int status);

/* ----------------------------------------------------------- source_cuda.c */
/* Present in every build; without CUDA they fail with MAGPOOL_ENODEV at
 * open. */
extern const mp_source_ops mp_source_device;
extern const mp_source_ops mp_source_pinned;

/* Chunk counters of a DEVICE or PINNED source (source_vmm.c keeps them),
 * for tests and benchmarks.  Counts since open, except `mapped` and
 * `kept` (now).  Call it where map/unmap may not run (types.h: the
 * pool's map lock).  MAGPOOL_EINVAL if ctx or out is NULL. */
typedef struct mp_chunk_counts {
  uint64_t creates;  /* physical chunks created                        */
  uint64_t releases; /* physical chunks freed                          */
  uint64_t reuses;   /* chunks mapped with kept memory (no create)     */
  uint64_t mapped;   /* chunks mapped now                              */
  uint64_t kept;     /* chunks kept for the next map now               */
} mp_chunk_counts;
int mp_source_chunk_counts(void *src_ctx, mp_chunk_counts *out);

/* ----------------------------------------------------------- stream_host.c */
/* Host streams (public API in magpool.h), and their ordering ops. */
extern const mp_stream_ops mp_host_stream_ops;

/* Is s a live host stream made by magpool_host_stream_create?  (Checks a
 * magic word; s must be NULL, a host stream, or a pointer to readable
 * memory of at least 8 bytes - CUDA stream handles qualify.)  Any thread
 * that may use s. */
bool mp_host_stream_valid(magpool_stream_t s);
/* A 64-bit id unique over the process lifetime (never reused, never 0). */
uint64_t mp_host_stream_id(magpool_stream_t s);

/* ----------------------------------------------------------- stream_cuda.c */
extern const mp_stream_ops mp_cuda_stream_ops;

/* 0 if s is not being captured, MAGPOOL_ECAPTURE if it is, or the error of
 * the query.  Any thread. */
static inline int mp_capture_rc(magpool_t *pool, magpool_stream_t s) {
  int cap = pool->sops->capturing(pool->src_ctx, s);
  return cap > 0 ? MAGPOOL_ECAPTURE : cap;
}

/* ============================================================ layer 2 */

/* ---------------------------------------------------------------- region.c */

/* Region of p (NULL if none).  Any thread.  ACQUIRE on nregions: pairs
 * with the RELEASE that published the region (mp_region_add). */
static inline mp_region *mp_region_of(magpool_t *pool, const void *p) {
  unsigned n = mp_load_acquire(&pool->nregions);
  for (unsigned i = 0; i < n; i++) {
    mp_region *r = pool->regions[i];
    if ((uintptr_t)p - (uintptr_t)r->base < r->bytes) return r;
  }
  return NULL;
}

/* The header word of the block at p, which lies in region r. */
static inline _Atomic uint32_t *mp_region_hdr(const magpool_t *pool, mp_region *r,
                                              const void *p) {
  return mp_region_hdr_at(r, (size_t)((const char *)p - r->base) >> pool->min_shift);
}

/* Bytes of a block of this order. */
static inline size_t mp_block_bytes(const magpool_t *pool, unsigned order) {
  return (size_t)1 << (order + pool->min_shift);
}

/* The extent word of the block at unit u of the tree's half (extent.c):
 * its granules, written in the block's fourth header word, whose order
 * bits stay 0 (it reads as "no block", hdr.h).  Relaxed, as every header
 * word. */
static inline void mp_extent_mark(const magpool_t *pool, uint64_t u, uint32_t n) {
  mp_store_relaxed(&pool->chunks->hdr0[u + 3], n << 7);
}
static inline uint32_t mp_extent_read(const magpool_t *pool, uint64_t u) {
  return mp_load_relaxed(&pool->chunks->hdr0[u + 3]) >> 7;
}

/* What a block out of the tree costs in memory, the unit of every byte
 * count of the pool (acct.held, pending, used): its size, except on a
 * chunked pool for a block of a chunk or more, where only the chunks
 * backing its requested bytes count (types.h, mp_chunks; the extent is
 * recorded when the block is taken and kept until it is given back), and
 * for an extent block (extent.c), its granules. */
static inline size_t mp_block_cost(const magpool_t *pool, const void *p, unsigned order) {
  size_t bs = mp_block_bytes(pool, order);
  const mp_chunks *c = pool->chunks;
  if (MP_LIKELY(c == NULL || order < c->xlo)) return bs;
  uint64_t off = (uint64_t)((const char *)p - c->base);
  if (bs < c->chunk) /* an extent block's granules */
    return (size_t)mp_extent_read(pool, off >> pool->min_shift) << (c->gord + pool->min_shift);
  return (size_t)mp_load_relaxed(&c->ext[off >> c->shift]) << c->shift;
}

/* Chunks that back `bytes` of a block of a chunk or more (at least one). */
static inline uint64_t mp_chunks_for(const mp_chunks *c, size_t bytes) {
  return bytes == 0 ? 1 : (uint64_t)((bytes + c->chunk - 1) >> c->shift);
}

/* What a request of `size` in a block of `order` costs (mp_block_cost). */
static inline size_t mp_request_cost(const magpool_t *pool, unsigned order, size_t size) {
  size_t bs = mp_block_bytes(pool, order);
  const mp_chunks *c = pool->chunks;
  if (c == NULL || order < c->xlo) return bs;
  if (bs < c->chunk) { /* whole granules */
    size_t g = (size_t)1 << (c->gord + pool->min_shift);
    return (size + g - 1) & ~(g - 1);
  }
  return (size_t)mp_chunks_for(c, size) << c->shift;
}

/* Run of chunks (runs.c) for one request, not a buddy block? */
static inline bool mp_run_order(const magpool_t *pool, unsigned order) {
  size_t bs = mp_block_bytes(pool, order);
  return bs >= pool->chunks->chunk && bs > pool->cfg.cache_max_block;
}

/* Order for a request, or MAGPOOL_ENOMEM if no block could ever hold it
 * (this is where sizes near SIZE_MAX stop, before any arithmetic that
 * could overflow). */
static inline int mp_size_order(const magpool_t *pool, size_t size, unsigned *order) {
  if (size <= pool->cfg.min_block) { *order = 0; return 0; }
  unsigned maxo = MP_MAX_ORDER;
  if (maxo + pool->min_shift > 62) maxo = 62 - pool->min_shift;
  if (size > ((size_t)1 << (maxo + pool->min_shift))) return MAGPOOL_ENOMEM;
  size_t units = (size + pool->cfg.min_block - 1) >> pool->min_shift;
  *order = mp_log2_ceil(units);
  return 0;
}

/* Adds a region of `bytes` (a multiple of min_block) from the pool's
 * source.  Caller holds grow_lock, or owns the pool (create).  RELEASE:
 * publishes the built region through nregions. */
int mp_region_add(magpool_t *pool, size_t bytes);
/* Makes the pool's one region over reserved address space with its chunk
 * map (chunk.c), if the source maps on demand and pool_size is a multiple
 * of the chunk; MAGPOOL_ENOTSUP if not (the caller then adds a whole
 * region).  Create only. */
int mp_region_add_chunked(magpool_t *pool);
/* Gives a region back to its source.  Destroy only. */
void mp_region_destroy(magpool_t *pool, mp_region *r);
/* Grows the pool so that a block of `order` may fit.  `seen` is nregions
 * when the caller last failed: if another thread grew since, does nothing
 * and the caller retries.  Returns 0 if the caller should retry, else
 * MAGPOOL_ENOMEM.  Any thread; takes grow_lock. */
int mp_region_grow(magpool_t *pool, unsigned order, unsigned seen);

/* Takes one block of `order` from the trees, lowest region first; counts
 * it in *a.  NULL if no region has one now, or `grow` (0 or MP_TAKE_NOMAP,
 * as below) refused it.  Owner of a; ACQUIRE (tree). */
void *mp_region_take(magpool_t *pool, mp_acct *a, unsigned order, int grow);
/* As mp_region_take, but on a chunked pool only the first `need` bytes of
 * a block of a chunk or more are backed by memory (the rest is address
 * space no one may touch).  need <= block bytes.  grow: 0 waits for stream
 * frees on their way back before creating memory, 1 does not, or
 * MP_TAKE_NOMOVE/NOPEAK/NOMAP (base.h, chunk.c). */
void *mp_region_take_need(magpool_t *pool, mp_acct *a, unsigned order, size_t need,
                          int grow);
/* Gives a block back to its region's tree: release + merge.  Owner of a;
 * RELEASE (tree): the caller's writes to the block happen before the next
 * owner's. */
void mp_region_give(magpool_t *pool, mp_acct *a, void *p, unsigned order);
/* A run p freed on a stream that has not passed the free: fenced by (tag, owner, retired:
 * mp_runs_fence), chunks kept busy, range[0..1] its run-space range.  0: not a run; 2: every
 * chunk carried `tag` already (noted by the batch); else 1.  mp_region_give_solo: run p given
 * back as owner's solo run (runs.h); false (nothing done): another's solo is there. */
int mp_region_fence(magpool_t *pool, mp_acct *a, void *p, unsigned order, uint32_t tag,
                    uint64_t owner, bool retired, uint32_t *range);
bool mp_region_give_solo(magpool_t *pool, mp_acct *a, void *p, unsigned order, uint64_t owner);
/* The same without merging (lazy coalescing). */
void mp_region_give_lazy(magpool_t *pool, mp_acct *a, void *p, unsigned order);
/* Gives `n` (<= MP_MAG_SLOTS) blocks of one order back: sorts them by
 * address (reorders blk), merges buddies in place, then gives what is
 * left to the trees, which keep merging upwards.  Owner of a; no lock;
 * amortised O(n log n). */
void mp_blocks_give(magpool_t *pool, mp_acct *a, void **blk, uint32_t n, unsigned order);
/* Gives every magazine of a chain (linked through next) back to the
 * trees and the magazines to the spare list. */
void mp_chain_give(magpool_t *pool, mp_acct *a, mp_mag *chain);
/* Merges every pair of free buddies in every region.  Any thread. */
void mp_regions_coalesce(magpool_t *pool);

/* chunk.c - the chunk map (types.h, mp_chunks), layer 2.  Any thread. */
/* Builds pool->chunks: reserves the address range, maps pool_size.
 * MAGPOOL_ENOTSUP if the pool cannot be chunked (see mp_region_add_chunked). */
int mp_chunks_init(magpool_t *pool);
void mp_chunks_fini(magpool_t *pool);
/* Counts the extent of block (p, order) busy (need: bytes from p that must
 * be backed; blocks under a chunk are backed whole) and maps what is not
 * mapped, moving empty chunks under the budget.  MAGPOOL_ENOMEM (nothing
 * counted, but a run's counts stay for mp_runs_putback) if the cap does not allow it, MP_EGROW if it would create
 * memory while returning stream frees could cover it and !grow, or move chunks (grow
 * MP_TAKE_NOMOVE), or raise the mark (NOPEAK); MP_ESOLO to map while solo (runs.h). */
int mp_chunks_acquire(magpool_t *pool, char *p, unsigned order, size_t need, int grow);
/* Uncounts the extent of block (p, order), before it goes to the tree; a
 * run's caller then calls mp_chunks_release_excess, after mp_runs_free. */
void mp_chunks_release(magpool_t *pool, char *p, unsigned order);
void mp_chunks_release_excess(magpool_t *pool); /* empty chunks over release_threshold */
/* The same for k blocks of one order below a chunk, all in p's chunk. */
void mp_chunks_release_n(magpool_t *pool, char *p, unsigned order, uint32_t k);
/* Up to max empty mapped chunks of the tree's half, lowest first (a
 * snapshot: they may fill at once).  Takes the map lock. */
unsigned mp_chunks_empty_low(magpool_t *pool, uint64_t *out, unsigned max);
/* Unmaps every empty chunk beyond pool_size.  Takes the map lock. */
void mp_chunks_trim(magpool_t *pool);
/* C1-C5 on a quiescent pool: 0 or MAGPOOL_EINVAL. */
int mp_chunks_check(magpool_t *pool);
/* Bytes of extents out of the tree: the busy units of every chunk, times
 * min_block (C4 holds it against the accounts).  Quiescent pool. */
uint64_t mp_chunks_out_bytes(const magpool_t *pool);
bool mp_chunks_busy(const magpool_t *pool, uint64_t chunk);

/* Adds a->tree_delta to the pool's tree_out and raises the peak.  Owner
 * of a; relaxed (a statistic). */
void mp_acct_flush(magpool_t *pool, mp_acct *a);
/* Flushes a local account and moves its held bytes into the pool's, for
 * callers with no thread record (out of host memory, callbacks). */
void mp_acct_settle(magpool_t *pool, mp_acct *a);

/* ------------------------------------------------------------------- mag.c */

/* Treiber stack of magazines; any thread, concurrently with each other.
 * push RELEASE: the magazine's contents are written before it is
 * reachable; pop ACQUIRE: pairs with it. */
void mp_stack_push_mpmc(magpool_t *pool, mp_stack *s, mp_mag *m);
mp_mag *mp_stack_pop_mpmc(magpool_t *pool, mp_stack *s);

/* Maps the pool's slab table (address space only).  Create only. */
int mp_mags_init(magpool_t *pool);

/* An empty magazine for `order` with the thread caches' capacity for it
 * (or the given one), from the spare list or a new slab.  NULL when out of
 * host memory.  Any thread. */
mp_mag *mp_mag_new(magpool_t *pool, unsigned order);
mp_mag *mp_mag_new_cap(magpool_t *pool, unsigned order, uint32_t cap);
/* Back to the spare list (its blocks must be gone).  Any thread. */
void mp_mag_free(magpool_t *pool, mp_mag *m);
/* Frees every slab.  Destroy only. */
void mp_mags_destroy(magpool_t *pool);

/* ============================================================ layer 3 */

/* ---------------------------------------------------------------- retire.c */

/* Queues the magazines of `chain` behind all work enqueued on stream h so
 * far: one callback, or none if h has passed them (`passed`: -1 ask h, 0
 * it has not, 1 it has).  `pending` (or NULL) counts the batch for its
 * entry; with `owner` (the entry's key, or 0) a chunked pool's runs go
 * back to the free runs at once, fenced (runs.h), and the batch's drain
 * unfences them.  If no callback can be enqueued it waits for the
 * stream.  Any thread, no lock (an entry lock holder keeps h alive).
 * RELEASE: the caller's writes happen before the callback. */
void mp_retire_chain(magpool_t *pool, _Atomic int64_t *pending, uint64_t owner, magpool_stream_t h,
                     mp_mag *chain, int passed);
/* Gives every ready batch's blocks to the trees and unfences its runs.
 * a may be NULL.  Any thread, concurrently with itself and with callbacks
 * (one ACQUIRE exchange takes the list).  Returns the blocks given. */
size_t mp_retire_drain(magpool_t *pool, mp_acct *a);
/* Waits (no time limit) until *pending (an entry's batch count,
 * orphan_pending or pending_batches) is 0: a device-wide sync, then yields
 * and short sleeps.  Any thread, no lock held.  ACQUIRE. */
void mp_retire_wait(magpool_t *pool, _Atomic int64_t *pending);
/* Runs fenced with `tag` (park.c: n (start, length) pairs in fr, taken
 * over; `bytes` their cost) behind h: unfenced now if h has passed them,
 * else by the drain after one callback.  As mp_retire_chain. */
void mp_retire_fenced(magpool_t *pool, _Atomic int64_t *pending, magpool_stream_t h, uint32_t *fr,
                      uint32_t n, uint32_t tag, int64_t bytes);
/* Destroy: waits for every callback, frees the ready list. */
void mp_retire_fini(magpool_t *pool);

/* ============================================================ layer 4 */

/* ---------------------------------------------------------- stream_table.c */

int mp_stream_table_init(magpool_t *pool);
/* Frees every entry, live and dead (their slots must be gone), and waits
 * for every deferred free.  Destroy only. */
void mp_stream_table_fini(magpool_t *pool);
/* A read-side section (liburcu, urcu-bp: no registration).  Any thread;
 * may nest; must not wait for a grace period inside. */
void mp_streams_read_lock(void);
void mp_streams_read_unlock(void);
/* First thing of every RCU callback of magpool's (TSan's view of the
 * grace period). */
void mp_streams_rcu_callback(void);
/* The live entry for key (stream id + 1), created with handle h if
 * `create`.  NULL if absent, or out of host memory.  Inside a read-side
 * section; the entry stays valid until the section ends, or while a use
 * (a slot, mp_entry_use_rcu) is held. */
mp_sentry *mp_entry_find_rcu(magpool_t *pool, uint64_t key, magpool_stream_t h, bool create);
/* The entry lock (rank 1).  try: ACQUIRE on success; unlock: RELEASE. */
bool mp_entry_try(mp_sentry *e);
void mp_entry_lock(mp_sentry *e);
void mp_entry_unlock(mp_sentry *e);
/* Releases a live entry: sid 0, out of the table, onto the dead list.
 * Caller holds the entry lock, inside a read-side section. */
void mp_entry_release_locked(magpool_t *pool, mp_sentry *e);
/* A use of e that outlives the read-side section it is taken in; false if
 * e is already being freed.  Any thread. */
bool mp_entry_use_rcu(mp_sentry *e);
void mp_entry_unuse(mp_sentry *e);
/* Frees (after a grace period) the dead entries with no use and no
 * pending batch.  Any thread holding no entry lock. */
void mp_streams_reap(magpool_t *pool);
/* Calls fn on every live entry.  Inside a read-side section. */
void mp_streams_each_rcu(magpool_t *pool, void (*fn)(magpool_t *, mp_sentry *, void *),
                         void *arg);
/* Bytes in stream slots and ready batches, and pending bytes.  Any
 * thread, relaxed (a racy sum, exact when quiescent). */
void mp_streams_stats(magpool_t *pool, size_t *cached, size_t *pending);
/* Waits for every batch pending when it is called: synchronises each live
 * stream that holds pending batches (under its entry's lock, so it cannot
 * be released and destroyed meanwhile), waits for the callbacks of
 * released streams' batches and of batches with no entry.  Returns how
 * many waits it made.  Any thread holding no entry lock. */
size_t mp_streams_wait_pending(magpool_t *pool);

/* ---------------------------------------------------------- stream_cache.c */
/* (the inline owner side of the slots is in stream_cache.h) */

/* The memo's slow path: resolves s to the owner's slot and memoises it;
 * first drops the owner's closed slots.
 * Errors: MAGPOOL_EINVAL, MAGPOOL_ECAPTURE, MAGPOOL_ECUDA.  *out may be
 * NULL with 0 returned (table full, or no host memory: the stream then
 * runs uncached).  Owner of tc only. */
int mp_slot_lookup(magpool_t *pool, mp_tcache *tc, magpool_stream_t s, mp_sslot **out);
/* Owner: a cached block of `order` from the slot, or NULL (empty, or a
 * thief holds the slot). */
void *mp_slot_pop_owner(magpool_t *pool, mp_sslot *sl, unsigned order);
/* Owner: caches p (freed on s) in the slot; when the slot passes
 * stream_cache_bytes its full magazines are retired behind s.  false if
 * it could not cache p (a thief holds the slot, or no magazine). */
bool mp_slot_push_owner(magpool_t *pool, mp_sslot *sl, magpool_stream_t s, void *p,
                        unsigned order);
/* magpool_stream_release's work for stream id sid (handle s): every
 * thread's blocks freed on s go behind s's work, every slot closes (so
 * no memo reaches the entry any more), and the entry leaves the table.
 * Any thread; takes the entry lock. */
void mp_streams_release(magpool_t *pool, uint64_t sid, magpool_stream_t s);
/* Retires what every stream slot holds (behind their streams), skipping
 * busy entries and per-thread streams.  Any thread. */
void mp_streams_flush_caches(magpool_t *pool);
/* Retires every stream's park but except's (behind their streams; a
 * stream that has passed them gives them to the trees at once), skipping
 * busy entries, per-thread and capturing streams.  Never waits.  Any
 * thread. */
void mp_streams_retire_parks(magpool_t *pool, mp_sentry *except);
/* The owner retires its own slots (those of per-thread streams only it
 * can retire): at thread exit (`exiting`: its per-thread stream's entry is
 * released too) and after a trim.  Owner of tc only. */
void mp_streams_thread_flush(magpool_t *pool, mp_tcache *tc, bool exiting);
/* Destroy: waits for pending callbacks, frees the slots and the table. */
void mp_streams_destroy(magpool_t *pool);

/* -------------------------------------------------------------- magazine.c */

/* What touches tc's magazines runs with the record held: its owner (in
 * mp_tcache_enter_owner/exit, thread.h), or a thief after the revoke
 * handshake (mp_tcaches_steal).  Depots are shared (mp_stack_*_mpmc). */
/* A thread's share of thread_cache_bytes or stream_cache_bytes; any thread. */
size_t mp_cache_share(const magpool_t *pool, size_t budget);

/* Thread-magazine miss for a cached order: swap in the previous magazine,
 * take a full one from the depot, or refill from the trees.  NULL if the
 * trees have nothing (nothing cached changed): the caller runs the
 * out-of-memory ladder. */
void *mp_cache_alloc_slow(magpool_t *pool, mp_tcache *tc, unsigned order);
/* Thread-magazine free miss (full, over the budget, or not a cached
 * order): magazines, depot, or the tree.  For an order the thread does not
 * cache it only gives p to the tree, and needs the record held by no one. */
void mp_cache_free_slow(magpool_t *pool, mp_tcache *tc, void *p, unsigned order);
/* Returns every block tc's magazines hold to the trees, counting the tree
 * traffic in a (the owner's acct, or a thief's own). */
void mp_tcache_flush(magpool_t *pool, mp_tcache *tc, mp_acct *a);
/* Gives tc's (empty) magazines back to the spare list. */
void mp_tcache_drop_mags(magpool_t *pool, mp_tcache *tc);
/* Empties every depot into the trees.  Any thread (a: the caller's
 * account, or NULL). */
void mp_depot_drain(magpool_t *pool, mp_acct *a);

/* ------------------------- thread.c (the inline memo, mp_tcache_get: thread.h) */

/* Destroy: orphans live records, frees the others. */
void mp_tcaches_destroy(magpool_t *pool);
/* The ladder's reach into other threads' caches, idle threads included:
 * takes every other live record's magazines over with the revoke
 * handshake and gives their blocks to the trees, counted in a.  Skips a
 * record another thief holds.  Any thread holding no record (self is the
 * caller's, or NULL).  Returns the bytes given back. */
size_t mp_tcaches_steal(magpool_t *pool, mp_tcache *self, mp_acct *a);

/* ============================================================ layer 5 */

/* ------------------------------------------------------------------ pool.c */

/* The out-of-memory ladder for one block of `order`: drain ready batches,
 * flush caches and depots, wait for pending streams, grow.  NULL with
 * MAGPOOL_ENOMEM when nothing helps.  Owner of tc. */
void *mp_ladder_take(magpool_t *pool, mp_tcache *tc, unsigned order, size_t size);
/* Pools built with this hook use `ops` instead of the source their kind
 * names (tests only; NULL restores the normal choice).  Process-global,
 * read at magpool_create. */
void mp_pool_set_source_override(const mp_source_ops *ops);
/* The same for the stream ops of HOST pools (tests only). */
void mp_pool_set_stream_override(const mp_stream_ops *ops);

/* ----------------------------------------------------------------- alloc.c */
/* (the shared inline hand-out is in alloc.h) */

/* Everything of an allocation but the fast path, for a validated order:
 * thread magazine, cache miss, ladder.  Owner of tc. */
void *mp_alloc_order(magpool_t *pool, mp_tcache *tc, unsigned order, size_t size,
                     uint32_t flags);
/* Frees the validated live block p (header word h, order, requested req):
 * claims the header, counts, caches or gives back.  tc may be NULL (no
 * host memory for a record: no stats).  Owner of tc. */
void mp_free_validated(magpool_t *pool, mp_tcache *tc, void *p, _Atomic uint32_t *h,
                       unsigned order, size_t req);
/* magpool_alloc / magpool_free for scopes: the scope bit in the header. */
void *mp_alloc_flags(magpool_t *pool, size_t size, uint32_t flags);
int mp_free_checked(magpool_t *pool, void *p, size_t size, bool sized, bool scoped);

/* ----------------------------------------------------------------- track.c */

/* Tracking on only; any thread; take the tracking mutex. */
void mp_track_on_alloc(magpool_t *pool, void *p, size_t size);
void mp_track_on_free(magpool_t *pool, void *p);
void mp_track_destroy(magpool_t *pool);

/* ----------------------------------------------------------------- stats.c */

/* The expensive debug tier's check at trim and destroy: runs
 * magpool_check if the pool is quiescent (no other call in progress or
 * begun meanwhile, no pending callback) and traps if it fails. */
void mp_debug_check_quiescent(magpool_t *pool);

#endif /* MAGPOOL_INTERNAL_H */
