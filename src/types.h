/* types.h - every internal struct of magpool, with who writes and who reads
 * each field.  No code.  The tree's types are in tree.h (it knows no pool).
 *
 * Layers, bottom up (docs/design.md has the picture; tools/check-layers.sh
 * enforces that calls only point down):
 *   0 base      atomic.h base.h types.h internal.h errors.c
 *   1 memory    source_host.c source_fail.c source_cuda.c   (where memory
 *               comes from) stream_host.c stream_cuda.c     (ordering)
 *   2 blocks    tree.c region.c mag.c hdr.h (tree, regions, block header, magazine objects)
 *   3 retire    retire.c                                    (batches, the
 *               stream callback, the ready list)
 *   4 caches    stream_table.c stream_cache.c magazine.c xcache.c thread.c
 *   5 API       alloc.c alloc_async.c pool.c stats.c scope.c track.c
 *
 * Locks, by rank: a thread holding a lock of rank r takes only locks of
 * higher rank.  The fast paths take none.
 *   1  entry->busy            one entry's slow paths (thieves, slot
 *                             creation); trim only tries it
 *   2  streams->dead_lock     the list of released entries
 *   3  pool->grow_lock        growth (calls into the memory source)
 *   3  track->lk              tracking table (tracking on only)
 *   4  host stream lock       one host stream's queue (stream_host.c)
 */
#ifndef MAGPOOL_TYPES_H
#define MAGPOOL_TYPES_H

#include <pthread.h>

#include "atomic.h"
#include "base.h"
#include "revoke.h"
#include "tree.h"

/* ------------------------------------------------------ layer 1: memory */

/* A memory source reserves ranges of memory for a pool.  Host, device and
 * pinned sources back the whole range at once; sources that can map and
 * unmap chunks may implement commit and decommit.  NULL commit / decommit
 * means "always backed".  Stateless table + a context owned by the pool. */
typedef struct mp_source_ops {
  const char *name;
  /* Reserves size bytes (a multiple of the pool's min_block) at *base:
   * 0, MAGPOOL_ENOMEM, MAGPOOL_ENODEV or MAGPOOL_ECUDA. */
  int (*reserve)(void *ctx, size_t size, void **base);
  int (*release)(void *ctx, void *base, size_t size);
  int (*commit)(void *ctx, void *addr, size_t size);
  int (*decommit)(void *ctx, void *addr, size_t size);
  /* Called once at pool creation; may set up ctx.  NULL = nothing to do. */
  int (*open)(void **ctx, const magpool_config_t *cfg);
  void (*close)(void *ctx);
  /* Sources that map memory on demand set those below (map != NULL);
   * others leave them NULL and give whole regions through reserve.  The
   * pool calls map, unmap and drop_kept under its map lock only (not
   * thread-safe against each other); va_* at create and destroy.
   * granularity: smallest chunk it can map (a power of two; NULL: 4 KiB). */
  size_t (*granularity)(void *ctx);
  /* Reserves `size` bytes of address space (a power of two), aligned to
   * `size`, with no memory behind it; chunk (a power of two >=
   * granularity, dividing size) is the unit of every later map/unmap. */
  int (*va_reserve)(void *ctx, size_t size, size_t chunk, void **base);
  /* Unmaps whatever is still mapped in the range and gives it back. */
  int (*va_release)(void *ctx, void *base, size_t size);
  /* Backs [addr, addr + bytes) with memory readable and writable by the
   * pool's users: a run of whole chunks, none of them mapped now.  Uses
   * kept memory (unmap with keep) before it creates new memory.  On
   * failure nothing of the run is mapped.  MAGPOOL_ENOMEM or ECUDA. */
  int (*map)(void *ctx, void *addr, size_t bytes);
  /* As map, but with one piece of memory for the whole run (a chunk of
   * the driver's cost per chunk: docs/design.md, "What it costs"), which
   * can only go back whole (every later unmap names exactly this run):
   * kept memory of exactly its size, else new (all kept freed first).
   * NULL: map only. */
  int (*map_group)(void *ctx, void *addr, size_t bytes);
  /* Takes the memory of [addr, addr + bytes) away (whole mappings; all or
   * none).  keep != 0: each mapping's memory stays with the source for the
   * next map of its size (a move costs no create) until drop_kept; keep ==
   * 0: it is freed.  drop_kept (NULL: nothing is ever kept) frees what is
   * kept, at the end of each move: none is held and uncounted. */
  int (*unmap)(void *ctx, void *addr, size_t bytes, int keep);
  void (*drop_kept)(void *ctx);
  /* Memory the source could give in all (host RAM, device memory): the
   * default cap of a growing pool with no max_pool_size.  NULL or 0:
   * unknown (the pool then caps at its pool_size unless told). */
  size_t (*capacity)(void *ctx);
} mp_source_ops;

/* Stream ordering, behind a small interface (host streams in
 * stream_host.c, CUDA streams in stream_cuda.c).  `dev` is the pool's
 * source context.  Every op may be called from any thread. */
typedef struct mp_stream_ops {
  /* The stream's id, unique for the life of the process. */
  int (*get_id)(void *dev, magpool_stream_t s, uint64_t *id);
  /* Runs fn(arg, status) once all work queued on s has finished (no CUDA in fn). */
  int (*after)(void *dev, magpool_stream_t s, void (*fn)(void *arg, int status), void *arg);
  int (*sync)(void *dev, magpool_stream_t s);
  /* 1 if s is being captured, 0 if not, or a negative error. */
  int (*capturing)(void *dev, magpool_stream_t s);
  /* Waits for all work of the pool's device; MAGPOOL_ENOTSUP on host. */
  int (*sync_all)(void *dev);
  /* Does handle s name a different stream on each thread (cudaStream-
   * PerThread)?  Only the thread whose stream it is retires its blocks. */
  bool (*per_thread)(magpool_stream_t s);
  /* 1 if s has finished every piece of work queued on it so far (so a
   * free made on s now is already passed), 0 if not or not known; never
   * waits.  NULL: never known.  (CUDA: stream_cuda.c says when it asks,
   * so that the query never touches a capture in progress.) */
  int (*idle)(void *dev, magpool_stream_t s);
  /* t's work queued from now on waits for all of s's queued so far
   * (cross_stream_reuse); 0, or an error (t does not wait). */
  int (*wait)(void *dev, magpool_stream_t t, magpool_stream_t s);
  /* Must every async free ask capturing() first?  (CUDA: yes, a free in
   * a graph being captured must not make its block reusable; host: no.) */
  bool check_capture;
} mp_stream_ops;

/* ------------------------------------------------------ layer 2: blocks */

/* One contiguous range from a source: its tree and its block-header table
 * (hdr.h).  Immutable once published in pool->regions (growth appends, destroy frees). */
typedef struct mp_region {
  char *base;
  size_t bytes;
  uint64_t nunits;
  /* The header table (hdr.h), mmap'd and backed lazily: one word per unit
   * below hdr_split (the tree's units; all of a pool without chunks); in
   * a chunked pool's run space above it, where blocks start on chunks
   * (2^hdr_rshift units), MP_HDR_RUN_WORDS words per chunk, then one
   * word that stays 0 for every other unit: a page of the table per
   * 1,024 chunks, not per 64 KiB (the warm replays' page faults). */
  _Atomic uint32_t *hdr;
  size_t hdr_bytes;
  uint64_t hdr_split;
  unsigned hdr_rshift;
  mp_tree tree;
} mp_region;

/* A run's header word and its two big-slack words (hdr.h), padded. */
#define MP_HDR_RUN_WORDS 4

/* The header word of unit u of r (u < r->nunits). */
MP_INLINE _Atomic uint32_t *mp_region_hdr_at(const mp_region *r, uint64_t u) {
  if (MP_LIKELY(u < r->hdr_split)) return &r->hdr[u];
  uint64_t v = u - r->hdr_split, k = v >> r->hdr_rshift;
  if ((k << r->hdr_rshift) != v) k = (r->nunits - r->hdr_split) >> r->hdr_rshift; /* the 0 */
  return &r->hdr[r->hdr_split + k * MP_HDR_RUN_WORDS];
}

/* The chunk map of a pool whose source maps memory on demand (chunk.c).
 * The pool's one region is a reserved range of address space; physical
 * memory backs it in chunks of `chunk` bytes.
 *
 * busy[c]: units (min blocks) of blocks out of the tree that overlap
 *   chunk c with their extent (the whole block below a chunk, but an
 *   extent block's granules, extent.c; above, the chunks covering the
 *   requested bytes, ext[] holding their count at the first), or of a
 *   fenced or solo free run (runs.h).  Changed by atomic RMW by any
 *   thread; in run space (c >= run0: one run a chunk) by stores.
 * state[c]: MP_CHUNK_UNMAPPED, MAPPED or UNMAPPING; written only under
 *   `lock`, read by anyone.
 * mapped[]: a bitmap of MAPPED chunks, written under `lock` only
 *   (runs.c reads it, relaxed, as a hint for placement).
 *
 * Invariants (mp_chunks_check, quiescent):
 *   C1  busy[c] > 0  =>  state[c] == MAPPED
 *   C2  nmapped == |{c : state[c] == MAPPED}| == popcount(mapped) <= cap
 *   C3  nbusy + runs.rbusy <= hwm; + runs.nsolo, == |{c : busy[c] > 0}|
 *   C4  Σ busy[c] units × min_block == the accounts' held + fenced and
 *       solo runs (stats.c checks it: no shared counter on hot paths)
 *   C5  pool->reserved == nmapped * chunk
 *   C6  the mapped chunks are tiled by groups (gfirst, glen): each of
 *       1..MP_CHUNK_GROUP chunks in one MP_CHUNK_GROUP-aligned window,
 *       all MAPPED, mapped by one source call and unmapped whole (one
 *       piece of memory where the source has map_group)
 * The one race that matters, a take that finds a chunk MAPPED against an
 * unmap that finds it empty, is a store-buffer pattern (chunk.c). */
enum { MP_CHUNK_UNMAPPED = 0, MP_CHUNK_MAPPED = 1, MP_CHUNK_UNMAPPING = 2 };

/* Runs of whole chunks for blocks of a chunk or more (runs.c): the upper
 * half of a chunked pool's address range, with no buddy alignment, so a
 * block's chunks can be put back exactly where free mapped chunks are.
 * All under `lock`.  Chunk numbers are relative to the run space.
 *   head[i] = len  <=> a free run of len chunks starts at i   (else 0)
 *   tail[i] = len  <=> a free run of len chunks ends at i     (else 0)
 *   free runs of length L < MP_RUN_BINS are on list bin[L], longer ones
 *   on bin[0], linked through next/prev (by start; UINT32_MAX ends)
 * Invariants (mp_runs_check): free runs do not overlap, are never
 * adjacent (freeing coalesces), are each on the list of their length,
 * and with the blocks out (ext[] of the chunk map) tile the space; a
 * bin's bit in `full` is set iff its list is not empty.  Fenced free
 * runs: tag (batch, 0: none), owner (the freeing stream entry's key),
 * fbits (fenced and free), rbits (its batch retired): runs.h. */
#define MP_RUN_BINS 256
typedef struct mp_runs {
  uint32_t n;               /* chunks in the run space                  */
  uint32_t *head, *tail, *next, *prev;
  uint32_t bin[MP_RUN_BINS];
  uint64_t full[MP_RUN_BINS / 64]; /* bit L set <=> bin[L] != UINT32_MAX  */
  uint64_t free_chunks;  _Atomic int lock; /* TTAS word: runs.c         */
  uint32_t *tag, next_tag;  /* fenced free runs (above)                 */
  uint64_t *owner, *fbits, *rbits, sole; /* rbits: retired; sole: fbits' one owner, 0: mixed */
  _Atomic uint64_t solo, nsolo; uint64_t *sbits; uint32_t solo_lo, solo_hi; /* runs.h */
  _Atomic uint64_t nfenced, nretired, taker, takes, rbusy; /* |fbits|, |fbits & rbits|;
          the last take's owner (0: none), how many takes it made in a row;
          rbusy: the busy run-space chunks, free solo ones not (C3) */
} mp_runs;

typedef struct mp_chunks {
  size_t chunk;             /* bytes per chunk, a power of two          */
  unsigned shift;           /* log2(chunk)                              */
  unsigned xlo, gord;       /* lowest order whose cost is not its size
                               (extent.c), log2 of a granule's units    */
  _Atomic uint32_t *hdr0;   /* the tree's header words (extent words)   */
  char *base;               /* the reserved range                       */
  size_t va_bytes;          /* its size, a power of two                 */
  uint64_t n;               /* chunks in the range                      */
  uint64_t cap;             /* most chunks mapped at once               */
  uint64_t keep;            /* chunks trim leaves mapped (pool_size)    */
  uint64_t release, slack0; /* empty chunks kept at a give; least slack */
  _Atomic uint32_t *busy;
  _Atomic uint32_t *ext;
  _Atomic uint8_t *state;
  _Atomic uint64_t *mapped; /* written under lock; runs.c reads it    */
  uint32_t *gfirst, *glen;  /* under lock: a mapped chunk's group's
                               first chunk; glen at that first chunk    */
  _Atomic uint64_t nmapped; /* written under lock                       */
  _Atomic uint64_t nbusy;   /* busy chunks of the lower half (C3)     */
  _Atomic uint64_t hwm;     /* high-water mark of the busy chunks (C3)  */
  _Atomic uint64_t maps, unmaps, moves;
  _Atomic uint64_t tree_top; /* written under lock: above every mapped
                               chunk of the lower half (region.c reads it) */
  _Atomic uint64_t run_top; /* above every mapped chunk of the run
                               space (written under lock)               */
  uint64_t run0;            /* first chunk of the run space (upper half) */
  _Atomic uint64_t xhint;   /* last extent given: granule << 9 | count */
  mp_runs runs;
  void *lock;               /* pthread_mutex_t *                        */
} mp_chunks;

/* Where tree traffic is counted: bytes taken from the trees, net.  Owned by one thread (a
 * thread record's, or a caller's local one that it settles into the pool, mp_acct_settle). */
typedef struct mp_acct {
  _Atomic uint64_t held; /* owner writes (plain add), stats read (relaxed); wrapping: a
                            block freed by another thread makes one owner's "negative" */
  int64_t tree_delta;    /* owner only: not yet added to pool->tree_out  */
  uint64_t fence_owner;  /* owner only: the stream whose fenced runs its
                            takes may use (0: none; alloc_async.c)      */
  const struct mp_adopt *adopt; /* owner only: others' too (runs.h)     */
  bool solo_hit;         /* owner only: a run take met solo (runs.h)   */
} mp_acct;

/* A magazine: a bounded LIFO of free blocks of one class.  Owned by one
 * thread (or one stream slot) while loaded; owned by a stack while in a
 * depot or the spare list (then only `next` is touched by others,
 * atomically).  In a retire batch, a chain linked through `next`. */
typedef struct mp_mag {
  _Atomic(struct mp_mag *) next;
  uint32_t count;
  uint32_t cap;
  uint32_t order; /* class of its blocks (set by mp_mag_new)          */
  uint32_t idx;   /* 1-based index in the pool's slab table; immutable */
  void *slot[];
} mp_mag;

/* A lock-free LIFO of magazines (Treiber stack), push and pop from any
 * thread (mp_stack_push_mpmc / mp_stack_pop_mpmc).  ABA protection: the
 * head packs the top magazine's 32-bit index (no pointer bits, so any
 * address layout works) with a 32-bit version that every successful push
 * and pop increments.  A pop whose head was popped and pushed back between
 * its read and its CAS sees a different version and retries, unless just
 * a multiple of 2^32 operations ran meanwhile (minutes of one core doing
 * nothing else).  Magazines are never unmapped while the pool lives: a
 * stale head's `next` is safe to read (atomic; the CAS then fails). */
typedef struct mp_stack {
  _Atomic uint64_t head;
  _Atomic int64_t bytes; /* depots: bytes held (relaxed), on the head's line */
} __attribute__((aligned(MP_CACHELINE))) mp_stack;

/* ------------------------------------------------------ layer 3: retire */

/* Blocks freed on a stream, waiting for the stream to pass the free.
 * Written by the retiring thread, then handed to the stream callback
 * (ordered by the stream op's own release/acquire), then to the ready
 * list (RELEASE push, ACQUIRE take-all), then freed by the drainer. */
typedef struct mp_batch {
  struct mp_batch *next;     /* ready-list link                        */
  magpool_t *pool;
  _Atomic int64_t *pending;  /* the entry's batch count, or orphan_pending */
  int64_t bytes, fbytes;     /* blocks in mags; fenced runs            */
  mp_mag *mags;              /* chain via mag->next, order in mag->order */
  uint32_t *fr, nfr, tag;    /* fenced runs: nfr (start, len) pairs     */
} mp_batch;

/* The pool's retire state.  All counters are atomic RMW from any thread. */
typedef struct mp_retire {
  _Atomic int64_t pending_bytes;   /* retired, callback not yet run      */
  _Atomic int64_t pending_batches; /* same, in batches; destroy waits 0  */
  _Atomic int64_t ready_bytes;     /* callback ran, not yet drained      */
  _Atomic int64_t ready_fenced;    /* same, fenced runs (fbytes)         */
  _Atomic(mp_batch *) ready;       /* push: CAS (callbacks); take: xchg  */
  _Atomic int64_t orphan_pending;  /* batches of no stream entry (no host
                                      memory for one), callback not run  */
  _Atomic uint64_t batches;        /* batches retired so far (relaxed; a
                                      statistic the tests read)          */
} mp_retire;

/* ------------------------------------------------------ layer 4: caches */

/* One per (thread record, stream entry): the blocks this thread freed on
 * the stream, reusable at once by this thread's allocations on it.  The
 * owner touches the cache with plain loads and stores between
 * mp_slot_enter_owner and mp_slot_exit_owner; a thief (release, trim, the
 * ladder), holding the entry lock, takes it over with the revoke
 * handshake (revoke.h). */
typedef struct mp_sslot {
  struct mp_tcache *owner;      /* immutable                             */
  struct mp_sentry *e;          /* immutable                             */
  _Atomic(struct mp_sslot *) next; /* entry's list: changed under the
                                   entry lock, walked lock-free (RCU)    */
  struct mp_sslot *tnext;       /* owner record's list (owner only)      */
  mp_revoke rv;                 /* owner vs thieves (revoke.h)           */
  _Atomic int64_t bytes;        /* bytes cached (stats read it, relaxed) */
  mp_mag *mag[MP_MAX_CLASSES];  /* loaded magazine per class             */
  mp_mag *full[MP_MAX_CLASSES]; /* chain of full magazines (via next)    */
} mp_sslot;

/* Blocks freed on one stream that any thread's allocations on that
 * stream may reuse at once ("parked"), until a batch retires them behind
 * the stream (park.c).  Per order, a chain of magazines whose head may be
 * partial (or empty: kept for the next park).  Everything but `mask` and
 * `bytes` is under `lock`, the innermost lock (rank 0: its holder takes
 * only the lock-free magazine stacks).  Runs are not parked but fenced
 * (runs.h) into the open fence batch, under `flock` (held only for a
 * fence's runs lock). */
typedef struct mp_park {
  _Atomic int lock;             /* 0 free, 1 held: ACQUIRE CAS, RELEASE  */
  _Atomic uint64_t mask;        /* bit o: order o has blocks (relaxed)  */
  _Atomic int64_t bytes;        /* bytes parked (stats read it relaxed) */
  int64_t small_bytes;          /* of orders < pool->s_nclasses (lock)   */
  uint32_t clock;               /* parks and takes so far (lock)         */
  bool closed;                  /* released: parks go elsewhere (lock)   */
  mp_mag *mags[MP_MAX_ORDER + 1]; /* per order, chain via next (lock)    */
  int64_t obytes[MP_MAX_ORDER + 1]; /* per order, bytes parked (lock)    */
  uint32_t used[MP_MAX_ORDER + 1];  /* per order, clock at last use     */
  _Atomic int flock;            /* the open fence batch: lock, closed,  */
  bool fclosed;                 /* tag, (start, length) pairs, bytes,   */
  uint32_t ftag, fn, fcap, fgen, *fr; /* flushes (fbytes: also relaxed) */
  _Atomic int64_t fbytes; _Atomic bool fsolo; /* solo: runs.h (flock) */
  _Atomic uint32_t idle_skip;   /* run frees that answer "not known"     */
  _Atomic uint32_t idle_back;   /* without asking the stream, and the
                                   next such count (park.c, passed_hint):
                                   hints, relaxed, outside the lock      */
} mp_park;

/* One per (pool, stream id) while the stream is in use; a new one after
 * each release.  Life (stream_table.c): created into the table (liburcu
 * cds_lfht, found inside read-side sections), removed from it by release
 * onto the pool's dead list, freed with call_rcu once it is dead, has no
 * users (slots, waiters) and no pending batch. */
typedef struct mp_sentry {
  uint64_t key;               /* stream id + 1 (0 is never an id + 1)   */
  _Atomic uint64_t sid;       /* key while live, 0 once released (under
                                 the entry lock)                        */
  magpool_stream_t handle;    /* valid while sid != 0 (immutable)       */
  _Atomic int busy;           /* the entry lock (rank 1)                */
  _Atomic int64_t pending;    /* batches retired, callback not yet run  */
  _Atomic int64_t users;      /* slots, and waiters outside a read-side
                                 section                                */
  _Atomic int reaped;         /* dead, no users, no pending: being freed */
  _Atomic(mp_sslot *) slots;  /* push under the entry lock; slots leave
                                 only once the entry is dead (RCU)      */
  struct mp_sentry *dead_next;/* dead list (under dead_lock)            */
  mp_park park;               /* blocks any thread may reuse on the
                                 stream (park.c)                        */
} mp_sentry;

/* The stream table: the liburcu hash table of live entries (nlive of
 * them: the parks' budgets), the released entries that batches or slots
 * still use, and `closes`, releases that closed slots (owners' sweeps). */
typedef struct mp_streams {
  struct cds_lfht *ht;         /* stream_table.c only                   */
  pthread_mutex_t dead_lock;   /* rank 2                                */
  mp_sentry *dead;             _Atomic uint64_t nlive, closes;
} mp_streams;

/* Per-thread statistics, written only by the owning thread with plain adds
 * (mp_owner_add), read by anyone relaxed.  Unsigned, wrapping; the sum over threads is
 * exact.  Live bytes are derived on read as sum(acct.held) - caches - depots - stream
 * caches - pending, so a cache hit (live <-> cached) moves only `cached`. */
typedef struct mp_tstats {
  _Atomic uint64_t requested; /* bytes, live requests                  */
  _Atomic uint64_t cached;    /* bytes, this thread's magazines and xc */
  _Atomic uint64_t allocs;
  _Atomic uint64_t frees;
} mp_tstats;

typedef struct mp_tclass { mp_mag *loaded, *prev; } mp_tclass;
/* An extent-cache bin (xcache.c): ent = granules << 6 | order, oldest first. */
typedef struct mp_xbin { uint32_t count, ent[MP_XCAP]; void *slot[MP_XCAP]; } mp_xbin;
enum { MP_TC_FREE = 0, MP_TC_LIVE, MP_TC_EXITING, MP_TC_ORPHAN };

/* The thread record: one thread's caches, counters and stream memo for
 * one pool (thread.c owns its life).  Reached through the thread's TLS
 * list; also linked (push-only) into the pool's list so stats, trim and
 * destroy can find it.  Lifecycle (state, CAS):
 *   FREE -> LIVE        a thread adopts it (new or reused record)
 *   LIVE -> EXITING     its thread exits, returns the caches, -> FREE
 *   LIVE -> ORPHAN      the pool is destroyed; the thread frees it
 * Only the owner touches the memo.  The magazines, xc and st.cached: the
 * owner inside mp_tcache_enter_owner/exit, or a thief holding `thief`
 * after the revoke handshake (mp_tcaches_steal), which accounts the tree
 * traffic in its own acct.  Others read `st`, `acct.held` and `state`. */
typedef struct mp_tcache {
  /* Hot: what the fast paths read, in two cache lines (thread.c asserts
   * it): a call pays a miss a line the program evicted (replay --evict). */
  magpool_t *pool;
  uint64_t epoch;        /* pool->trim_epoch last seen                 */
  mp_revoke rv;          /* the magazines and st.cached: owner inside
                            enter/exit, or a thief (the ladder) holding
                            `thief` after revoke (revoke.h)            */
  char *r0_base;         /* copies of region 0 (never changes); r0_bytes */
  size_t r0_bytes;       /* is its tree part's (below hdr_split)        */
  _Atomic uint32_t *r0_hdr;
  /* One-entry stream memo (stream_cache.c): handle -> this thread's slot,
   * valid until a release closes the slot; its slots (s_slots, s_nslots: closed ones swept once
   * streams->closes passes s_closes), each one's share of stream_cache_bytes, s_limit (owner). */
  magpool_stream_t s_handle;
  mp_sslot *s_slot;
  mp_tstats st;          /* line 2: the counters and limits            */
  size_t limit;          /* thread_cache_bytes                         */
  int64_t s_limit;
  uint32_t cache_max;    /* largest cached request (0: none; <= 16 MiB) */
  uint32_t s_cache_max;  /* largest stream-cached request (0: none)    */
  uint8_t shift;         /* log2(min_block)                            */
  uint8_t nclasses;      /* 0 when caching is off or tracking is on    */
  uint8_t s_nclasses;    /* stream-cache classes (0 while tracking)    */
  bool s_check_capture;  /* CUDA streams: frees ask about capture      */
  uint64_t uid;          /* pool->uid when adopted: a destroyed pool's
                            address may be reused by a new pool        */
  mp_acct acct;          /* tree traffic of this thread                */
  mp_tclass cls[MP_MAX_CLASSES];
  mp_sslot *s_slots;     unsigned s_nslots;     uint64_t s_closes;
  _Atomic int state;
  _Atomic uintptr_t thief;       /* thieves' lock: a thief's token, or 0 */
  struct mp_tcache *pool_next;   /* pool list; set before publication  */
  struct mp_tcache *thread_next; /* owner thread's list                */
  mp_xbin xc[MP_XBINS];          /* extent cache: held as cls[]        */
  _Atomic uint32_t xheld;        /* blocks in xc (X4, xcache.c)          */
} mp_tcache;

/* --------------------------------------------------------- the pool */

struct magpool_s {
  /* Lines 0-2 (thread.c asserts it): what every call reads, read-mostly. */
  uint64_t uid;
  magpool_config_t cfg;
  unsigned min_shift;          /* log2(min_block)                       */
  unsigned nclasses;           /* cached orders are 0..nclasses-1       */
  _Atomic uint64_t trim_epoch; /* bumped by magpool_trim and tracking   */
  struct mp_trace *trace;      /* trace.c recorder, NULL when off (set
                                  at create)                            */
  mp_chunks *chunks;           /* NULL: regions are whole (no mapping)  */
  const mp_source_ops *src;    /* the backend: chosen once at create    */
  const mp_stream_ops *sops;
  void *src_ctx;
  unsigned s_nclasses;         /* stream-cached orders (stream caches
                                  work with or without thread caches)   */
  _Atomic int tracking;
  _Atomic unsigned nregions;   /* regions[0..nregions) are published    */
  mp_region *regions[MP_MAX_REGIONS];
  uint32_t mag_cap[MP_MAX_CLASSES];
  uint32_t s_mag_cap[MP_MAX_CLASSES];
  _Atomic size_t reserved;
  _Atomic uint64_t grow_count;
  void *grow_lock;             /* pthread_mutex_t * (rank 3)            */

  _Atomic int64_t tree_out;    /* bytes handed out by the trees, batched */
  _Atomic int64_t peak;
  _Atomic size_t peak_reserved; /* high-water mark of reserved         */
  _Atomic int64_t pending_at_peak; /* retire.pending_bytes at its rise */
  _Atomic uint64_t held_extra; /* acct.held of settled local accounts   */
  _Atomic(mp_tcache *) tcaches;/* push-only list of thread records      */

  mp_stack depot[MP_MAX_CLASSES]; /* full magazines                     */
  size_t depot_limit;          /* per class                             */
  mp_stack spare;              /* empty magazines of any class          */
  _Atomic(char *) *mag_tab;    /* slab table (mag.c): index -> slab     */
  _Atomic uint32_t mag_nslabs; /* slabs taken (may pass the table's size) */
  _Atomic uint64_t nthreads;   /* LIVE records (a line rarely written)  */

  void *track;                 /* track.c state, NULL when off          */
  mp_retire retire;            /* retire.c                              */
  mp_streams *streams;         /* stream_table.c                        */
  /* MP_DEBUG >= 2 only (always present, so every build agrees on the
   * layout): calls in progress and calls begun, to tell a quiescent
   * pool from a busy one (MP_DBG_ENTER in internal.h). */
  _Atomic int64_t dbg_active;
  _Atomic uint64_t dbg_calls;
};

#endif /* MAGPOOL_TYPES_H */
