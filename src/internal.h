/* internal.h - magpool's internal types and prototypes, grouped by the file
 * that defines them.
 *
 * Map of the layers, bottom up, and who owns what:
 *
 *   mp_source   (source_host.c, source_cuda.c, source_fail.c)
 *               Where memory comes from: reserve/release address space.
 *               Stateless ops table + a context owned by the pool.
 *   mp_tree     (tree.c)  The shared buddy tree over one region, in units
 *               of min_block.  Lock-free: per-level free bitmaps changed
 *               only by atomic RMW, with 64-ary summaries.  Never touches
 *               the memory it manages; hands out unit offsets.
 *   mp_region   (pool.c)  One contiguous range from a source: its tree and
 *               its block-header table (order and requested size of every
 *               live block).  A pool has 1..MP_MAX_REGIONS regions; regions
 *               are only added (growth) and freed at destroy.
 *   mp_tcache   (magazine.c)  One thread's cache for one pool: loaded and
 *               previous magazine per size class.  Owned by its thread;
 *               other threads only read its stats counters (relaxed).
 *   mp_depot    (magazine.c)  Per-pool, per-class lock-free stack of full
 *               magazines.
 *   mp_stream*  (stream.c, retire.c, hoststream.c, stream_cuda.c)
 *               Per-stream caches, retire batches, ready list.
 *   magpool     (pool.c)  The public API; owns all of the above.
 */
#ifndef MAGPOOL_INTERNAL_H
#define MAGPOOL_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "magpool.h"

/* ------------------------------------------------------------------------ */
/* Configuration constants (always compiled; see STYLE: debug tiers)        */
/* ------------------------------------------------------------------------ */

#ifndef MP_DEBUG
#define MP_DEBUG 0 /* 0: release; 1: cheap asserts; 2: invariant checks */
#endif

#define MP_MAX_REGIONS 64   /* growth steps a pool can take              */
#define MP_MAX_ORDER 48     /* largest block: min_block << MP_MAX_ORDER  */

#define MP_LIKELY(x) __builtin_expect(!!(x), 1)
#define MP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define MP_NOINLINE __attribute__((noinline))
#define MP_INLINE static inline __attribute__((always_inline))
#define MP_CACHELINE 64

/* Memory orders live in the names of these wrappers (STYLE rule 3): grep
 * "release" finds every publication point. */
#define mp_load_relaxed(p) atomic_load_explicit((p), memory_order_relaxed)
#define mp_load_acquire(p) atomic_load_explicit((p), memory_order_acquire)
#define mp_store_relaxed(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define mp_store_release(p, v) atomic_store_explicit((p), (v), memory_order_release)
#define mp_fetch_add_relaxed(p, v) atomic_fetch_add_explicit((p), (v), memory_order_relaxed)
#define mp_fetch_add_acq_rel(p, v) atomic_fetch_add_explicit((p), (v), memory_order_acq_rel)
#define mp_cas_weak_acq_rel(p, e, d)                                          \
  atomic_compare_exchange_weak_explicit((p), (e), (d), memory_order_acq_rel,  \
                                        memory_order_acquire)
#define mp_cas_strong_relaxed(p, e, d)                                        \
  atomic_compare_exchange_strong_explicit((p), (e), (d), memory_order_relaxed,\
                                          memory_order_relaxed)
#define mp_load_seq_cst(p) atomic_load_explicit((p), memory_order_seq_cst)
#define mp_fetch_or_seq_cst(p, v) atomic_fetch_or_explicit((p), (v), memory_order_seq_cst)
#define mp_fetch_and_seq_cst(p, v) atomic_fetch_and_explicit((p), (v), memory_order_seq_cst)
#define mp_cas_weak_seq_cst(p, e, d)                                          \
  atomic_compare_exchange_weak_explicit((p), (e), (d), memory_order_seq_cst,  \
                                        memory_order_seq_cst)

/* Single-owner counter bump: the owner is the only writer, readers on other
 * threads use relaxed loads.  Compiles to a plain add; no lock prefix. */
#define mp_owner_add(p, v) mp_store_relaxed((p), mp_load_relaxed(p) + (v))

static inline unsigned mp_ctz64(uint64_t x) { return (unsigned)__builtin_ctzll(x); }
static inline unsigned mp_clz64(uint64_t x) { return (unsigned)__builtin_clzll(x); }
/* ceil(log2(x)) for x >= 1 */
static inline unsigned mp_log2_ceil(uint64_t x) {
  return x <= 1 ? 0 : 64u - mp_clz64(x - 1);
}
static inline unsigned mp_log2_floor(uint64_t x) { return 63u - mp_clz64(x); }

/* ------------------------------------------------------------------------ */
/* tree.c - the lock-free buddy tree                                        */
/* ------------------------------------------------------------------------ */

/* A tree of 2^top units; a block of order o is 2^o units, aligned to 2^o.
 * Only the first nunits units exist: the rest (the "phantom" tail of a
 * region whose size is not a power of two) is never free.
 *
 * Per order o, a bitmap free[o] of 2^(top-o) bits:
 *   bit i set  <=>  block i of order o is free and not split and not merged
 *                   into its parent.
 * Buddies 2j and 2j+1 share one 64-bit word, so one CAS claims a pair.
 *
 * Invariants (checked by mp_tree_check on a quiescent tree):
 *   I1  No two free blocks overlap: if block (o,i) is free, no ancestor and
 *       no descendant of it is free.
 *   I2  No free block reaches past nunits (phantom tail is never free).
 *   I3  Summary: for every layer L >= 1 of order o, a nonzero word of layer
 *       L-1 has its summary bit set in layer L.  (A set summary bit over a
 *       zero word is allowed: it is only a stale hint.)
 *   I4  free units (sum of 2^o over free bits) + units handed out ==
 *       nunits.  (The caller knows the units handed out; check returns the
 *       free units.)
 *
 * Concurrency: every operation may run concurrently with every other one.
 * No locks.  Bits are changed only by atomic RMW on the word that holds
 * them, so ABA on a bit is harmless: a CAS that claims bit i of word w
 * succeeds only if the bit is set now, whoever set it.
 */
#define MP_TREE_MAX_LAYERS 6 /* 64^6 words of bitmap: enough for 2^42 units */

typedef struct mp_level {
  /* layer[0] is the free bitmap itself; layer[k] summarises layer[k-1]:
   * bit j of layer k is (a hint that) word j of layer k-1 is nonzero. */
  _Atomic uint64_t *layer[MP_TREE_MAX_LAYERS];
  uint64_t nwords[MP_TREE_MAX_LAYERS];
  unsigned nlayers; /* the top layer has exactly one word */
} mp_level;

typedef struct mp_tree {
  uint64_t nunits;          /* units that exist                          */
  unsigned top;             /* tree covers 2^top units                   */
  mp_level level[MP_MAX_ORDER + 1];
  void *mem;                /* one mmap holding every layer              */
  size_t mem_bytes;
} mp_tree;

/* Builds a tree of nunits units (>= 1) with every unit free.  MAGPOOL_ENOMEM
 * if its bitmaps cannot be mapped. */
int mp_tree_init(mp_tree *t, uint64_t nunits);
void mp_tree_fini(mp_tree *t);

/* Claims a free block of the given order, lowest address first within the
 * smallest order that has one, splitting a coarser block when needed.
 * Returns its unit offset, or -1 if none is free now.  The caller owns the
 * block.  ACQUIRE: the claim synchronises with the release that freed it. */
int64_t mp_tree_alloc(mp_tree *t, unsigned order);

/* Gives back block (off, order): sets its bit only (lazy coalescing).
 * RELEASE: the caller's writes to the block happen before a later claim. */
void mp_tree_release(mp_tree *t, uint64_t off, unsigned order);

/* Coalescing step for one released block: while the block and its buddy
 * are both free, claim the pair with one CAS and free the parent.  Stops at
 * the first buddy that is not free.  Safe to call for a block that has
 * already been merged or reclaimed by someone else (it then does nothing). */
void mp_tree_merge(mp_tree *t, uint64_t off, unsigned order);

/* release + merge. */
void mp_tree_free(mp_tree *t, uint64_t off, unsigned order);

/* Merges every pair of free buddies, bottom up.  After it, on a quiescent
 * tree, no two free buddies remain (so a fully free tree is one block, or
 * the binary decomposition of nunits). */
void mp_tree_coalesce_all(mp_tree *t);

/* Free units now (a racy sum of relaxed reads; exact when quiescent). */
uint64_t mp_tree_free_units(const mp_tree *t);

/* Largest order with a free block now, or -1. */
int mp_tree_largest_free_order(const mp_tree *t);

/* Is block (off, order) free right now? (tests) */
bool mp_tree_is_free(const mp_tree *t, uint64_t off, unsigned order);

/* Checks I1-I3 on a quiescent tree.  Returns 0 and stores the free units
 * in *free_units (may be NULL), or MAGPOOL_EINVAL and writes nothing. */
int mp_tree_check(const mp_tree *t, uint64_t *free_units);

/* ------------------------------------------------------------------------ */
/* source_*.c - memory sources                                              */
/* ------------------------------------------------------------------------ */

/* A memory source reserves ranges of memory for a pool.  Host, device and
 * pinned sources back the whole range at once; sources that can map and
 * unmap chunks (CUDA VMM, host mmap with madvise) may implement commit and
 * decommit, which the pool calls with 2 MiB-aligned chunks.  NULL commit /
 * decommit means "always backed". */
typedef struct mp_source_ops {
  const char *name;
  /* Reserves size bytes (a multiple of the pool's min_block); on success
   * stores the base in *base.  Returns 0, MAGPOOL_ENOMEM, MAGPOOL_ENODEV or
   * MAGPOOL_ECUDA. */
  int (*reserve)(void *ctx, size_t size, void **base);
  int (*release)(void *ctx, void *base, size_t size);
  int (*commit)(void *ctx, void *addr, size_t size);
  int (*decommit)(void *ctx, void *addr, size_t size);
  /* Called once at pool creation; may set up ctx.  NULL = nothing to do. */
  int (*open)(void **ctx, const magpool_config_t *cfg);
  void (*close)(void *ctx);
} mp_source_ops;

extern const mp_source_ops mp_source_host;
/* CUDA sources: present in every build; without CUDA they fail with
 * MAGPOOL_ENODEV at open. */
extern const mp_source_ops mp_source_device;
extern const mp_source_ops mp_source_pinned;

/* A host source that fails on demand, for growth and out-of-memory tests.
 * While armed, the next `countdown` reserves succeed and every later one
 * fails with MAGPOOL_ENOMEM.  countdown < 0 disarms it.  Process-global. */
extern const mp_source_ops mp_source_failing;
void mp_source_failing_arm(long countdown);

/* Pools built with this hook use `ops` instead of the source their kind
 * names (tests only; NULL restores the normal choice).  Process-global,
 * read at magpool_create. */
void mp_pool_set_source_override(const mp_source_ops *ops);

/* ------------------------------------------------------------------------ */
/* errors.c                                                                 */
/* ------------------------------------------------------------------------ */

/* Sets the calling thread's last error; returns NULL for tail calls from
 * allocation functions. */
void *mp_fail(int code);
void mp_set_cuda_error(int cuda_code);

/* ------------------------------------------------------------------------ */
/* pool.c - regions, block headers, the public API                          */
/* ------------------------------------------------------------------------ */

/* Block header: one uint32 per unit of a region.  The word of a live
 * block's first unit encodes it; every other word reads as "no block":
 *   bits 0..5   order + 1 (0 = not the start of a live block)
 *   bit  6      the block belongs to a scope
 *   bits 7..31  slack = block bytes - requested bytes, when < MP_HDR_BIG;
 *               else MP_HDR_BIG, and the slack is kept in the next two
 *               words (order bits 0, so they still read as "no block").
 * Invariant: hdr[u] has nonzero order bits <=> a live block starts at u.
 * A free (cache or tree) atomically moves the word from live to 0 first,
 * which is what detects double, interior and foreign frees.
 * Cached blocks have header 0: to the API they are free. */
#define MP_HDR_ORDER_MASK 0x3fu
#define MP_HDR_SCOPE 0x40u
#define MP_HDR_SLACK_SHIFT 7
#define MP_HDR_BIG 0x1ffffffu

typedef struct mp_region {
  char *base;
  size_t bytes;
  uint64_t nunits;
  _Atomic uint32_t *hdr; /* nunits words, mmap'd (lazily backed)   */
  size_t hdr_bytes;
  mp_tree tree;
} mp_region;

/* A magazine: a bounded LIFO of free blocks of one class.  Owned by one
 * thread while loaded; owned by a stack while in a depot / spare list
 * (then only `next` is touched by others, atomically). */
typedef struct mp_mag {
  _Atomic(struct mp_mag *) next;
  uint32_t count;
  uint32_t cap;
  uint32_t order; /* class of its blocks (set by mp_mag_new)          */
  void *slot[];
} mp_mag;

/* A lock-free LIFO of magazines (Treiber stack).  ABA protection: the head
 * packs the pointer (magazines are 64-byte aligned, user space < 2^47, so
 * ptr >> 6 fits 41 bits) with a 23-bit version that every successful push
 * and pop increments.  A pop whose head was popped and pushed back between
 * its read and its CAS sees a different version and retries.  Magazines are
 * never unmapped while the pool lives, so reading a stale head's `next` is
 * safe (it is atomic, and the CAS then fails). */
typedef struct mp_stack {
  _Atomic uint64_t head;
  _Atomic int64_t bytes; /* depots: bytes held, on the head's line */
} __attribute__((aligned(MP_CACHELINE))) mp_stack;
void mp_stack_push(mp_stack *s, mp_mag *m);
mp_mag *mp_stack_pop(mp_stack *s);

/* Per-thread statistics, written only by the owning thread with plain
 * adds (mp_owner_add), read by anyone with relaxed loads. Unsigned,
 * wrapping: a block freed by another thread makes one thread's value
 * "negative"; the sum over threads is exact. */
typedef struct mp_tstats {
  _Atomic uint64_t held;      /* bytes taken from the trees, net: live
                                 bytes are derived on read as
                                 sum(held) - caches - depots - stream
                                 caches - pending, so a cache hit (live
                                 <-> cached) moves only `cached`       */
  _Atomic uint64_t requested; /* bytes, live requests                  */
  _Atomic uint64_t cached;    /* bytes, this thread's magazines        */
  _Atomic uint64_t allocs;
  _Atomic uint64_t frees;
} mp_tstats;

#define MP_MAX_CLASSES 24

typedef struct mp_tclass {
  mp_mag *loaded;
  mp_mag *prev;
} mp_tclass;

enum { MP_TC_FREE = 0, MP_TC_LIVE, MP_TC_EXITING, MP_TC_ORPHAN };

/* One thread's cache and counters for one pool.  Reached through the
 * thread's TLS list; also linked (immutably, push-only) into the pool's
 * list so stats, trim and destroy can find it.  Lifecycle (state):
 *   FREE -> LIVE        a thread adopts it (CAS; new or reused record)
 *   LIVE -> EXITING     its thread exits (CAS), returns the cache, -> FREE
 *   LIVE -> ORPHAN      the pool is destroyed (CAS); the thread frees it
 * Only the owner touches the magazines; others read `st` and `state`. */
typedef struct mp_tcache {
  /* Hot: everything the fast paths read, in the first cache lines. */
  magpool_t *pool;
  uint64_t epoch;        /* pool->trim_epoch last seen                 */
  unsigned nclasses;     /* 0 when caching is off or tracking is on    */
  unsigned s_nclasses;   /* stream-cache classes for the fast paths (0
                            while tracking is on)                      */
  size_t s_cache_max;    /* largest stream-cached request (0: none)    */
  unsigned shift;        /* log2(min_block)                            */
  size_t cache_max;      /* largest cached request (0: none)           */
  size_t limit;          /* thread_cache_bytes                         */
  char *r0_base;         /* copies of region 0 (never changes)         */
  size_t r0_bytes;
  _Atomic uint32_t *r0_hdr;
  uint64_t uid;          /* pool->uid when adopted: a destroyed pool's
                            address may be reused by a new pool        */
  int64_t tree_delta;    /* bytes taken from the tree, not yet added to
                            pool->tree_out                             */
  mp_tclass cls[MP_MAX_CLASSES];
  mp_tstats st;
  /* One-entry stream memo (stream.c): (handle, epoch) -> this thread's
   * slot in the stream's entry; and every slot this record owns. */
  magpool_stream_t s_handle;
  struct mp_sslot *s_slot;
  uint64_t s_epoch;
  bool s_check_capture;  /* CUDA streams: frees ask about capture     */
  struct mp_sslot *s_slots;
  _Atomic int state;
  struct mp_tcache *pool_next;   /* pool list; set before publication  */
  struct mp_tcache *thread_next; /* owner thread's list                */
} mp_tcache;

struct magpool_s {
  uint64_t uid;
  magpool_config_t cfg;
  unsigned min_shift;          /* log2(min_block)                       */
  unsigned nclasses;           /* cached orders are 0..nclasses-1       */
  uint32_t mag_cap[MP_MAX_CLASSES];
  unsigned s_nclasses;         /* stream-cached orders (stream caches
                                  work with or without thread caches)   */
  uint32_t s_mag_cap[MP_MAX_CLASSES];
  _Atomic uint64_t trim_epoch; /* bumped by magpool_trim                */

  const mp_source_ops *src;
  void *src_ctx;

  _Atomic unsigned nregions;   /* regions[0..nregions) are published    */
  mp_region *regions[MP_MAX_REGIONS];
  _Atomic size_t reserved;
  _Atomic uint64_t grow_count;
  void *grow_lock;             /* pthread_mutex_t *: growth is rare and
                                  calls into the source, so it is locked;
                                  the tree itself never is              */

  _Atomic int64_t tree_out;    /* bytes handed out by the trees, batched */
  _Atomic int64_t peak;

  _Atomic(mp_tcache *) tcaches;/* push-only list of thread records      */

  mp_stack depot[MP_MAX_CLASSES]; /* full magazines                     */
  size_t depot_limit;          /* per class                             */
  mp_stack spare;              /* empty magazines of any class          */
  _Atomic(void *) mag_chunks;  /* slabs magazines are carved from       */

  void *track;                 /* track.c state, NULL when off          */
  _Atomic int tracking;

  void *streams;               /* stream.c state                        */
  _Atomic uint64_t stream_epoch; /* bumped by every stream release: the
                                  thread memos' validity (stream.c)     */
};

/* Region of p (NULL if none).  Regions are only ever appended. */
static inline mp_region *mp_region_of(magpool_t *pool, const void *p) {
  unsigned n = mp_load_acquire(&pool->nregions);
  for (unsigned i = 0; i < n; i++) {
    mp_region *r = pool->regions[i];
    if ((uintptr_t)p - (uintptr_t)r->base < r->bytes) return r;
  }
  return NULL;
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

/* Bytes of a block of this order. */
static inline size_t mp_block_bytes(const magpool_t *pool, unsigned order) {
  return (size_t)1 << (order + pool->min_shift);
}

/* Header word for a live block. */
static inline uint32_t mp_hdr_make(unsigned order, size_t slack) {
  uint32_t s = slack < MP_HDR_BIG ? (uint32_t)slack : MP_HDR_BIG;
  return (uint32_t)(order + 1) | (s << MP_HDR_SLACK_SHIFT);
}
/* Writes the extra words for a big slack (no-op otherwise). */
void mp_hdr_store_big(_Atomic uint32_t *h, size_t slack);
size_t mp_hdr_slack(const _Atomic uint32_t *h, uint32_t word);

/* Takes one block of `order` from the trees (no caches, no ladder).
 * Counts it in tree_out.  NULL if no region has one now. */
void *mp_tree_take(magpool_t *pool, mp_tcache *tc, unsigned order);
/* Gives a block back to its region's tree: release + merge. */
void mp_tree_give(magpool_t *pool, mp_tcache *tc, void *p, unsigned order);
/* Gives a block back without merging (lazy coalescing). */
void mp_tree_give_lazy(magpool_t *pool, mp_tcache *tc, void *p, unsigned order);
/* The out-of-memory ladder for one block of `order`: drain ready lists,
 * flush caches and depots, wait for pending streams, grow.  NULL with
 * MAGPOOL_ENOMEM when nothing helps. */
void *mp_tree_take_hard(magpool_t *pool, mp_tcache *tc, unsigned order);
void mp_peak_note(magpool_t *pool, mp_tcache *tc);

/* ------------------------------------------------------------------------ */
/* magazine.c - per-thread caches and depots                                */
/* ------------------------------------------------------------------------ */

/* The calling thread's record for pool (created on first use).  NULL only
 * when out of host memory. */
mp_tcache *mp_tcache_get_slow(magpool_t *pool);

/* initial-exec: one %fs-relative load, no __tls_get_addr call, also in
 * the shared library (the variable is 8 bytes of static TLS). */
extern _Thread_local mp_tcache *mp_tls_last __attribute__((tls_model("initial-exec")));

/* The memo check.  A pool's trim epoch starts at uid << 32, so one compare
 * covers both "a trim ran since" and "this record belongs to a destroyed
 * pool that had the same address". */
MP_INLINE mp_tcache *mp_tcache_get(magpool_t *pool) {
  mp_tcache *tc = mp_tls_last;
  if (MP_LIKELY(tc != NULL && tc->pool == pool &&
                tc->epoch == mp_load_relaxed(&pool->trim_epoch)))
    return tc;
  return mp_tcache_get_slow(pool);
}

/* Order of a request the fast paths may serve (size <= a cache's largest
 * class, so no overflow): ceil(log2(ceil(size / min_block))). */
MP_INLINE unsigned mp_cached_order(const mp_tcache *tc, size_t size) {
  size_t q = (size - (size != 0)) >> tc->shift; /* (size - 1) / min_block */
  return q == 0 ? 0 : 64u - mp_clz64(q);
}

/* Slow paths behind the inline magazine hit in pool.c. */
void *mp_cache_alloc_slow(magpool_t *pool, mp_tcache *tc, unsigned order);
void mp_cache_free_slow(magpool_t *pool, mp_tcache *tc, void *p, unsigned order);
/* Returns everything tc caches to the depots/tree (all = everything,
 * else half of every magazine). */
void mp_tcache_flush(magpool_t *pool, mp_tcache *tc);
/* Empties every depot into the tree. */
void mp_depot_drain(magpool_t *pool);
/* Returns `n` blocks of one order to the trees: sorted by address, merged
 * in place with their buddies, then released and merged into the tree. */
void mp_blocks_give(magpool_t *pool, mp_tcache *tc, void **blk, uint32_t n,
                    unsigned order);
mp_mag *mp_mag_new(magpool_t *pool, unsigned order);
mp_mag *mp_mag_new_cap(magpool_t *pool, unsigned order, uint32_t cap);
void mp_mag_free(magpool_t *pool, mp_mag *m);
/* Pool teardown: orphan live records, free the others and all magazines. */
void mp_tcaches_destroy(magpool_t *pool);
void mp_mags_destroy(magpool_t *pool);

/* ------------------------------------------------------------------------ */
/* scope.c, track.c                                                         */
/* ------------------------------------------------------------------------ */

void mp_track_on_alloc(magpool_t *pool, void *p, size_t size);
void mp_track_on_free(magpool_t *pool, void *p);
void mp_track_destroy(magpool_t *pool);

/* Internal free with a header-bit requirement (scope.c): frees p only if
 * its header's scope bit equals `scoped`. */
int mp_free_checked(magpool_t *pool, void *p, size_t size, bool sized,
                    bool scoped);
void *mp_alloc_flags(magpool_t *pool, size_t size, uint32_t flags);

/* ------------------------------------------------------------------------ */
/* stream.c - per-stream caches, retire batches, ready lists                */
/* ------------------------------------------------------------------------ */

/* Stream ordering, behind a small interface (host streams in stream.c,
 * CUDA streams in stream_cuda.c).  `dev` is the pool's source context. */
typedef struct mp_stream_ops {
  /* The stream's id, unique for the life of the process. */
  int (*get_id)(void *dev, magpool_stream_t s, uint64_t *id);
  /* Runs fn(arg, status) once all work queued on s so far has finished;
   * fn must not call CUDA. */
  int (*after)(void *dev, magpool_stream_t s, void (*fn)(void *arg, int status), void *arg);
  int (*sync)(void *dev, magpool_stream_t s);
  /* 1 if s is being captured, 0 if not, or a negative error. */
  int (*capturing)(void *dev, magpool_stream_t s);
  /* Waits for all work of the pool's device; MAGPOOL_ENOTSUP on host. */
  int (*sync_all)(void *dev);
  /* Does handle s name a different stream on each thread
   * (cudaStreamPerThread)?  Such an entry's blocks can only be retired by
   * the thread whose stream it is. */
  bool (*per_thread)(magpool_stream_t s);
  /* Must every async free ask capturing() first?  (CUDA: yes, a free
   * recorded into a graph must not make its block reusable; host: no.) */
  bool check_capture;
} mp_stream_ops;
extern const mp_stream_ops mp_cuda_stream_ops;

int mp_streams_init(magpool_t *pool);
void mp_streams_destroy(magpool_t *pool);
/* Coalesces every completed batch into the tree.  Returns blocks given. */
size_t mp_streams_drain_ready(magpool_t *pool, mp_tcache *tc);
/* Retires what the stream caches hold (behind their streams' work). */
void mp_streams_flush_caches(magpool_t *pool, mp_tcache *tc);
/* Synchronises the streams that hold pending batches; returns how many. */
size_t mp_streams_wait_pending(magpool_t *pool, mp_tcache *tc);
/* magpool_trim's share: retire stream caches and drain ready batches. */
void mp_streams_trim(magpool_t *pool, mp_tcache *tc);
void mp_streams_stats(magpool_t *pool, size_t *cached, size_t *pending);
/* The record's thread is exiting: retire its stream slots. */
void mp_streams_thread_exit(magpool_t *pool, mp_tcache *tc);
/* A trim ran: the owner retires its stream slots (those of per-thread
 * streams only it can retire). */
void mp_streams_thread_flush(magpool_t *pool, mp_tcache *tc);

/* pool.c helpers shared with stream.c and scope.c */

/* Marks p live in its header and counts it: every path that hands a block
 * to the program ends here. */
MP_INLINE void *mp_hand_out(magpool_t *pool, mp_tcache *tc, void *p, unsigned order,
                            size_t size, uint32_t flags) {
  mp_region *r = mp_region_of(pool, p);
  size_t bs = mp_block_bytes(pool, order);
  _Atomic uint32_t *h = &r->hdr[(size_t)((char *)p - r->base) >> pool->min_shift];
  size_t slack = bs - size;
  if (MP_UNLIKELY(slack >= MP_HDR_BIG)) mp_hdr_store_big(h, slack);
  /* Relaxed: the header is only read by a later free of p, which the
   * program orders after this allocation (it must hold p to free it). */
  mp_store_relaxed(h, mp_hdr_make(order, slack) | flags);
  mp_owner_add(&tc->st.requested, size);
  mp_owner_add(&tc->st.allocs, 1);
  if (MP_UNLIKELY(mp_load_relaxed(&pool->tracking))) mp_track_on_alloc(pool, p, size);
  return p;
}

/* Validates p as a live block of the pool (optionally of the given
 * requested size) without changing anything.  On success stores the
 * header word's address, order and requested size. */
MP_INLINE int mp_peek_header(magpool_t *pool, const void *p, size_t size, bool sized,
                             bool scoped, _Atomic uint32_t **h_out, unsigned *order_out,
                             size_t *req_out) {
  mp_region *r = mp_region_of(pool, p);
  if (MP_UNLIKELY(r == NULL)) return MAGPOOL_EINVAL;
  size_t off = (size_t)((const char *)p - r->base);
  if (MP_UNLIKELY(off & (pool->cfg.min_block - 1))) return MAGPOOL_EINVAL;
  _Atomic uint32_t *h = &r->hdr[off >> pool->min_shift];
  uint32_t w = mp_load_relaxed(h);
  uint32_t o1 = w & MP_HDR_ORDER_MASK;
  if (MP_UNLIKELY(o1 == 0)) return MAGPOOL_EINVAL; /* interior, freed, foreign */
  if (MP_UNLIKELY(((w & MP_HDR_SCOPE) != 0) != scoped)) return MAGPOOL_EINVAL;
  unsigned order = o1 - 1;
  size_t slack = w >> MP_HDR_SLACK_SHIFT;
  if (MP_UNLIKELY(slack >= MP_HDR_BIG)) slack = mp_hdr_slack(h, w);
  size_t req = mp_block_bytes(pool, order) - slack;
  if (MP_UNLIKELY(sized && size != req)) return MAGPOOL_EINVAL;
  *h_out = h;
  *order_out = order;
  *req_out = req;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* hoststream.c - host streams (public API in magpool.h) plus:              */
/* ------------------------------------------------------------------------ */

/* Is s a live host stream made by magpool_host_stream_create?  (Checks a
 * magic word; s must be NULL, a host stream, or a pointer to readable
 * memory of at least 8 bytes - CUDA stream handles qualify.) */
bool mp_host_stream_valid(magpool_stream_t s);

/* A 64-bit id unique over the process lifetime (never reused, never 0). */
uint64_t mp_host_stream_id(magpool_stream_t s);

#endif /* MAGPOOL_INTERNAL_H */
