/* stress.c - magpool-stress: a multi-threaded torture test of the public API.
 *
 *   magpool-stress [--threads T] [--seconds S] [--seed N] [--streams K]
 *                  [--pool-mb M] [--exit-every N] [--churn]
 *                  [--destroy-rounds R] [--grow-from G] [--large-async]
 *                  [--cross-reuse] [--no-groups] [--solo]
 *
 * --solo: --large-async, but 1 in 8192 large requests is synchronous: with
 * --streams 1 the stream makes the pool's run takes, its run frees go back
 * solo (runs.h, "Solo runs"), and those synchronous takes end the solo
 * while the stream's work (stamp tasks) may still be on the runs.
 *
 * --cross-reuse: the pool's cross_stream_reuse is set, so an async request
 * at a new peak (with --grow-from) may take runs other streams fenced,
 * after its stream waits for theirs (stream_cache.c, mp_streams_adopt).
 *
 * --large-async: every large request (1 to 4 MiB) of a thread with a
 * stream is allocated on its stream, none synchronously, so that with
 * --streams 1 one stream makes every run take of the pool and its run
 * frees skip the question to the stream (park.c, streams that keep up).
 *
 * --grow-from G: the pool starts at G MiB and grows up to M (max_pool_size),
 * so chunks are mapped by growth (in groups: chunk_groups = 1, which a cap
 * otherwise turns off) and unmapped by moves; the end
 * check then wants G MiB reserved after trim.  With --no-groups,
 * chunk_groups is 0, as a cap makes it by default: a chunk each, and tree
 * blocks placed in the fullest busy chunk (region.c, pack_pick).
 *
 * T worker slots each run a thread that, until time is up, allocates blocks
 * of random sizes (log-uniform, 64 B .. 1 MiB; with --streams, 1 in 32
 * uniform in 1 .. 4 MiB; a per-slot splitmix64 PRNG
 * seeded from --seed and the slot index), keeps a bounded window of live
 * blocks, and frees them at random:
 *   - with magpool_free or magpool_free_sized (the exact requested size);
 *   - a quarter of the host-owned frees go through a shared exchange array:
 *     the thread swaps its block into a random slot (atomic exchange) and
 *     frees whatever it took out, so blocks are freed by threads other than
 *     the one that allocated them;
 *   - with --streams K, through host streams: a share of the allocations
 *     use magpool_alloc_async and a share of the frees magpool_free_async
 *     (see "Streams" below).
 *
 * Checks, each failure is a violation (details printed, exit status 1):
 *   - cookies: every block carries a cookie in its first and last 8 bytes
 *     and a few interior bytes, derived from the pointer, the requested
 *     size and a unique allocation serial; verified at free.
 *   - ownership: a bitmap with one bit per 64-byte granule of the pool's
 *     address range (which is within +-pool_size of the first block seen,
 *     as the pool does not grow).  A block's granules (its usable size) are
 *     set at allocation and cleared just before its free; a granule found
 *     already set means two live blocks overlap (the same address handed
 *     out twice included): counted as an overlap.  The bitmap uses relaxed
 *     atomics only, so it creates no happens-before edges that could hide a
 *     missing barrier in the library from ThreadSanitizer.
 *   - every return code: allocation may fail only with MAGPOOL_ENOMEM
 *     (counted); frees must return 0; usable sizes must be powers of two
 *     >= the request, and blocks aligned to them.
 *   - thread churn: a worker thread exits after --exit-every operations and
 *     a fresh thread takes over its slot (window, stream, PRNG), so the
 *     caches of exited threads are returned while the others run.
 *   - conservation at the end: everything is freed, streams are released
 *     and synchronised, magpool_trim() runs, and then the stats must show
 *     nothing used, cached or pending, alloc/free counts equal to ours,
 *     magpool_check() must pass, and (pool size a power of two) one block of
 *     the whole pool size must be allocatable.
 *
 * Streams (--streams K > 0).  Slot i is tied to host stream i % K.  The
 * semantics are those of cudaMallocAsync/cudaFreeAsync:
 *   - A block from magpool_alloc_async(pool, n, s) may only be touched by
 *     work queued on s after the call, or after s was synchronised.  So the
 *     worker does not write it: it launches a "mark" task on s that claims
 *     the block's ownership bits and writes the cookies.  Such blocks are
 *     "stream-owned" until the worker syncs s.
 *   - Before magpool_free_async(pool, p, s) the worker launches a "stamp"
 *     task on s that verifies the cookies, writes a stamp (stream index and
 *     serial) over them, reads it back, and clears the ownership bits.  The
 *     allocator must not give p to another stream or to the synchronous API
 *     before s has run that task: if it did, the other owner's ownership
 *     claim would find the bits still set (an overlap) or its cookie writes
 *     would break the stamp check; and ThreadSanitizer would see the racing
 *     writes.  Reuse on s itself is allowed at once, and is safe here
 *     because the reuser's mark task runs after the stamp task on s.
 *   - Stream-owned blocks are freed on their own stream, or after syncing
 *     it, through any path.  Only host-owned blocks enter the exchange.
 *   - At the end every stream is synchronised, released from the pool with
 *     magpool_stream_release, synchronised again, and destroyed.
 *   The async API is probed first (64 bytes, allocated and freed on a
 *   host stream).  A failure there is reported as a violation, and the
 *   run goes on with the synchronous API so that the rest is still
 *   checked.
 *
 * Stream churn (--churn, needs --streams K).  K more host streams, the
 * "boxes", are used by one worker at a time: magpool_stream_release must
 * not race async calls on the stream it releases, and a stream is
 * released before it is destroyed.  A worker takes a free box (CAS on the
 * box's busy flag, ACQUIRE), uses it next to its fixed stream for a random
 * number of operations (mean CHURN_HOLD), then gives it back: it syncs the
 * stream, so no block of its window stays owned by it; then, the box being
 * its alone, it does nothing (1/4), releases the stream from the pool and
 * goes on using it (1/4), or releases it, destroys it and creates a new
 * stream in its place (1/2); then it clears the busy flag (RELEASE).  A
 * new stream often gets the old handle (a host stream is a malloc'd
 * object): the pool must tell the two apart by id.  The previous holders'
 * thread records keep stream slots for a box's stream with blocks in
 * them, and workers that exit (thread churn) flush theirs, while the
 * holder releases and destroys it.  The stamp tasks check that a block
 * freed on a box stays with that stream until its work has run.
 *
 * Destroy rounds (--destroy-rounds R, default 0).  Next to the workers, a
 * rounds thread runs R rounds, one after the other; each:
 *   - creates a fresh 16 MiB pool and K host streams (K = --streams, or 2),
 *     and uses the pool itself once (its own record is LIVE at destroy);
 *   - starts T threads; each allocates blocks (64 B .. 64 KiB, cookies as
 *     above, written by a mark task for those allocated on a stream) and
 *     frees a few on every stream after a stamp task, so that its thread
 *     record owns a slot of each stream with blocks in it; leaves a few
 *     blocks in its thread cache and a few allocated; then reports done;
 *   - once all are done (no call on the pool runs any more, as
 *     magpool_destroy requires), synchronises or releases each stream (at
 *     random), checks the pool's alloc/free/live counts against its own,
 *     and tells the threads to exit; after a random short delay (each
 *     thread has one too) it calls magpool_destroy while they exit;
 *   - checks that every stamp task had run when destroy returned (destroy
 *     waits for the batches behind them), joins the threads and destroys
 *     the streams.
 * Threads that exit while destroy runs are the race destroy must wait out
 * before it frees stream state; under ASan or TSan a use after free
 * shows.  The summary counts threads that returned before, during and
 * after destroy.  The rounds' calls count in N below; the rounds thread is
 * joined after the workers, however long its rounds take.
 *
 * The last line printed is, exactly:
 *   stress: N ops, T threads, S s, X overlaps, Y lost
 * N: alloc and free calls made; X: overlaps found; Y: bytes the pool did not
 * account for at the end (used + cached + pending after trim, or, when the
 * whole-pool allocation fails, what keeps the pool from being one block).
 *
 * Under ThreadSanitizer the defaults shrink (window of live blocks, churn
 * period).  The pool keeps its size: a small pool next to 8 MiB thread
 * caches and 8 MiB stream caches spends its time in the out-of-memory path.
 * This program uses only magpool.h.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "magpool.h"

/* ------------------------------------------------------------------------ */
/* Build flavour                                                            */
/* ------------------------------------------------------------------------ */

#if defined(__SANITIZE_THREAD__)
#define STRESS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STRESS_TSAN 1
#endif
#endif
#ifndef STRESS_TSAN
#define STRESS_TSAN 0
#endif

#define DEFAULT_THREADS 8
#define DEFAULT_SECONDS 5
#define DEFAULT_SEED 1
#define DEFAULT_POOL_MB 256
#define DEFAULT_EXIT_EVERY (STRESS_TSAN ? 20000 : 200000)
#define WATCHDOG_GRACE_S (STRESS_TSAN ? 600 : 180)
#define CHURN_HOLD (STRESS_TSAN ? 250 : 2000) /* mean ops a box is held */

#define MIN_SIZE_LOG 6   /* 64 B  */
#define MAX_SIZE_LOG 20  /* 1 MiB */
#define LARGE_MIN_LOG 20 /* large requests: 1 MiB .. 4 MiB, on streams only */
#define GRANULE_LOG 6    /* ownership bitmap: one bit per 64 bytes */
#define NXCHG 64         /* exchange slots */
#define MAX_DETAILS 40   /* violation messages printed */

/* Memory orders in the names (STYLE rule 3). */
#define load_relaxed(p) atomic_load_explicit((p), memory_order_relaxed)
#define load_acquire(p) atomic_load_explicit((p), memory_order_acquire)
#define store_relaxed(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define store_release(p, v) atomic_store_explicit((p), (v), memory_order_release)
#define fetch_add_relaxed(p, v) atomic_fetch_add_explicit((p), (v), memory_order_relaxed)
#define fetch_or_relaxed(p, v) atomic_fetch_or_explicit((p), (v), memory_order_relaxed)
#define fetch_and_relaxed(p, v) atomic_fetch_and_explicit((p), (v), memory_order_relaxed)
#define exchange_acq_rel(p, v) atomic_exchange_explicit((p), (v), memory_order_acq_rel)

/* ------------------------------------------------------------------------ */
/* Types and globals                                                        */
/* ------------------------------------------------------------------------ */

/* One live block, as the harness knows it.  Owned by one worker window, or
 * by an exchange slot, or (between a stamp task's launch and its run) by
 * that task, which frees it. */
typedef struct blk {
  void *p;
  size_t req;      /* requested size */
  size_t usable;   /* magpool_usable_size at allocation */
  uint64_t serial; /* unique: slot index << 40 | slot's allocation count */
  int stream;      /* stream index if stream-owned, else -1 */
  bool tracked;    /* inside the ownership window */
} blk;

typedef struct counters {
  uint64_t ops;          /* alloc + free calls */
  uint64_t allocs;       /* successful allocations */
  uint64_t frees;        /* successful frees */
  uint64_t enomem;
  uint64_t async_allocs; /* successful, on a stream */
  uint64_t async_frees;  /* successful */
  uint64_t exchanges;
  uint64_t syncs;
  uint64_t handoffs;     /* --churn: stream boxes taken */
  uint64_t releases;     /* --churn: magpool_stream_release of a held box */
  uint64_t recreated;    /* --churn: box streams destroyed and created anew */
  uint64_t same_handle;  /* ... where the new stream got the old handle */
} counters;

/* --destroy-rounds: what the rounds did, summed (the rounds thread's own;
 * main reads it after joining that thread). */
typedef struct round_totals {
  unsigned rounds;
  unsigned threads;        /* round threads started; of them, returned from
                              their start function (then exit, flushing
                              their records): */
  unsigned ret_before;     /* ... before magpool_destroy was called */
  unsigned ret_during;     /* ... while it ran */
  unsigned ret_after;      /* ... after it returned */
  unsigned released;       /* streams released before destroy */
  unsigned synced;         /* streams only synchronised before destroy */
  counters c;              /* every call on the rounds' pools */
} round_totals;

/* A worker slot.  Its fields are used by the slot's current thread only;
 * main reads them after joining it, and a successor thread is created by
 * main after that join (pthread_join/pthread_create order them). */
typedef struct slot {
  unsigned idx;
  uint64_t rng;
  uint64_t nserial;
  blk **win;
  unsigned nlive, wcap;
  int stream; /* fixed stream: index into g_streams, or -1 */
  int held;   /* --churn: the box held (index into g_streams), or -1 */
  uint64_t hold_left; /* operations until the box is given back */
  counters c;
  pthread_t th;
  bool running;
  _Atomic int done; /* RELEASE by the exiting thread; ACQUIRE poll by main */
  unsigned generations;
} slot;

static struct {
  unsigned threads;
  unsigned seconds;
  uint64_t seed;
  unsigned streams;
  size_t pool_mb;
  size_t grow_from_mb; /* 0: a fixed pool of pool_mb */
  uint64_t exit_every;
  bool churn;
  bool large_async; /* --large-async */
  bool cross_reuse; /* --cross-reuse */
  bool no_groups;   /* --no-groups */
  bool solo;        /* --solo */
  unsigned destroy_rounds;
} g_opt;

static void add_counters(counters *to, const counters *c);

static magpool_t *g_pool;
static size_t g_pool_size;
static size_t g_held; /* reserved_bytes at creation: what trim goes back to */

static uintptr_t g_win_lo;   /* ownership window: [lo, lo + bytes) */
static size_t g_win_bytes;
static _Atomic uint64_t *g_own; /* one bit per granule, relaxed only */

static _Atomic(blk *) g_xchg[NXCHG];

/* g_streams[0, K): the shared streams; with --churn, g_streams[K, 2K): the
 * boxes.  A box's entry is written only by the worker holding the box (or
 * by main while no worker runs). */
static magpool_stream_t *g_streams;
static unsigned g_nstreams;
static _Atomic int *g_box_busy; /* [K]: box K + i held; CAS ACQUIRE, store RELEASE */
static bool g_async_ok; /* written before the workers start */

static _Atomic int g_stop;               /* relaxed: a hint to stop looping */
static _Atomic uint64_t g_violations;    /* relaxed counters */
static _Atomic uint64_t g_overlaps;
static _Atomic uint64_t g_details;

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...) {
  fetch_add_relaxed(&g_violations, 1);
  if (fetch_add_relaxed(&g_details, 1) >= MAX_DETAILS)
    return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  printf("VIOLATION: %s\n", buf); /* one locked stdio call per line */
  fflush(stdout);
}

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* splitmix64 */
static uint64_t rnd(slot *sl) {
  sl->rng += 0x9e3779b97f4a7c15ull;
  return mix64(sl->rng);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(unsigned ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static bool is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* Log-uniform over [64 B, 1 MiB): a random octave, then uniform inside it;
 * 1 in 64 requests is exactly 1 MiB (the cache-bypass boundary). */
static size_t rand_size_upto(slot *sl, unsigned max_log) {
  uint64_t r = rnd(sl);
  if ((r & 63) == 0)
    return (size_t)1 << max_log;
  r >>= 6;
  unsigned e = MIN_SIZE_LOG + (unsigned)(r % (max_log - MIN_SIZE_LOG));
  size_t base = (size_t)1 << e;
  return base + (size_t)((r >> 8) % base);
}

static size_t rand_size(slot *sl) { return rand_size_upto(sl, MAX_SIZE_LOG); }

/* Usable size a power of two >= req, and the block aligned to it; or, for
 * a block of a chunk (2 MiB) or more on a chunked pool, whole chunks >=
 * req, aligned to a chunk; or, with --no-groups, for a request over a
 * 256th of a chunk that needs less than its power of two (an extent
 * block, src/extent.c), whole granules (4 KiB) that hold it, aligned to
 * a granule, inside one chunk, no more than its power of two (a block its
 * stream kept may have more granules than it needs). */
static bool shape_ok(const void *p, size_t req, size_t usable) {
  if (usable >= req && is_pow2(usable) && ((uintptr_t)p & (usable - 1)) == 0)
    return true;
  const size_t chunk = (size_t)2 << 20, gran = chunk / 512;
  if (usable >= req && usable >= chunk && usable % chunk == 0 && ((uintptr_t)p & (chunk - 1)) == 0)
    return true;
  size_t pow2 = gran;
  while (pow2 < req) pow2 *= 2;
  if (g_opt.no_groups && req > chunk / 256 && usable >= req && usable <= pow2 &&
      usable % gran == 0 && ((uintptr_t)p & (gran - 1)) == 0 &&
      ((uintptr_t)p & (chunk - 1)) + usable <= chunk)
    return true;
  violation("block %p for %zu bytes: usable size %zu, not a power of two >= the "
            "request that the block is aligned to",
            p, req, usable);
  return false;
}

/* ------------------------------------------------------------------------ */
/* Cookies and stamps                                                       */
/* ------------------------------------------------------------------------ */

#define NINTERIOR 3

static uint64_t cookie_head(const blk *b) {
  return mix64((uint64_t)(uintptr_t)b->p ^ ((uint64_t)b->req << 21) ^
               (b->serial * 0x9e3779b97f4a7c15ull));
}
static uint64_t cookie_tail(uint64_t head) { return mix64(head ^ 0x5bd1e9955bd1e995ull); }

/* Interior byte i: its offset in [8, req - 8), and a value that depends on
 * the offset only (so two indices that pick the same offset agree). */
static size_t interior_off(const blk *b, uint64_t head, unsigned i) {
  return 8 + (size_t)(mix64(head + i + 1) % (b->req - 16));
}
static unsigned char interior_val(uint64_t head, size_t off) {
  return (unsigned char)(mix64(head ^ (off * 0x100000001b3ull)) | 1);
}

static uint64_t rd64(const void *p) {
  uint64_t v;
  memcpy(&v, p, sizeof v);
  return v;
}
static void wr64(void *p, uint64_t v) { memcpy(p, &v, sizeof v); }

static void write_cookies(const blk *b) {
  unsigned char *m = b->p;
  uint64_t h = cookie_head(b);
  wr64(m, h);
  wr64(m + b->req - 8, cookie_tail(h));
  for (unsigned i = 0; i < NINTERIOR; i++) {
    size_t off = interior_off(b, h, i);
    m[off] = interior_val(h, off);
  }
}

static bool verify_cookies(const blk *b, const char *where) {
  const unsigned char *m = b->p;
  uint64_t h = cookie_head(b);
  bool ok = rd64(m) == h && rd64(m + b->req - 8) == cookie_tail(h);
  for (unsigned i = 0; ok && i < NINTERIOR; i++) {
    size_t off = interior_off(b, h, i);
    ok = m[off] == interior_val(h, off);
  }
  if (!ok)
    violation("cookie mismatch at %s: block %p size %zu serial %#" PRIx64
              " head %016" PRIx64 " (want %016" PRIx64 ") tail %016" PRIx64,
              where, b->p, b->req, b->serial, rd64(m), h, rd64(m + b->req - 8));
  return ok;
}

/* ------------------------------------------------------------------------ */
/* Ownership bitmap                                                         */
/* ------------------------------------------------------------------------ */

/* Applies op to the bits of granules [g0, g1).  Returns true if every bit
 * had the value `expect_set` before. */
static bool own_apply(size_t g0, size_t g1, bool set) {
  bool clean = true;
  size_t g = g0;
  while (g < g1) {
    size_t w = g >> 6;
    unsigned bit = (unsigned)(g & 63);
    size_t n = 64 - bit;
    if (n > g1 - g)
      n = g1 - g;
    uint64_t mask = n == 64 ? ~0ull : (((1ull << n) - 1) << bit);
    if (set) {
      uint64_t old = fetch_or_relaxed(&g_own[w], mask);
      if (old & mask)
        clean = false;
    } else {
      uint64_t old = fetch_and_relaxed(&g_own[w], ~mask);
      if ((old & mask) != mask)
        clean = false;
    }
    g += n;
  }
  return clean;
}

static void own_range(const blk *b, size_t *g0, size_t *g1) {
  uintptr_t off = (uintptr_t)b->p - g_win_lo;
  *g0 = off >> GRANULE_LOG;
  *g1 = (off + b->usable + ((size_t)1 << GRANULE_LOG) - 1) >> GRANULE_LOG;
}

/* Claims b's granules.  An overlap means a live block already holds one. */
static void own_mark(const blk *b) {
  if (!b->tracked)
    return;
  size_t g0, g1;
  own_range(b, &g0, &g1);
  if (!own_apply(g0, g1, true)) {
    fetch_add_relaxed(&g_overlaps, 1);
    violation("overlap: block %p (usable %zu, serial %#" PRIx64
              ") overlaps a live block",
              b->p, b->usable, b->serial);
  }
}

static void own_clear(const blk *b) {
  if (!b->tracked)
    return;
  size_t g0, g1;
  own_range(b, &g0, &g1);
  if (!own_apply(g0, g1, false))
    violation("ownership bits of block %p (usable %zu, serial %#" PRIx64
              ") were cleared by someone else",
              b->p, b->usable, b->serial);
}

/* ------------------------------------------------------------------------ */
/* Stream tasks                                                             */
/* ------------------------------------------------------------------------ */

/* Runs on the stream after an alloc_async on it: the block's first use. */
static void mark_task(void *arg) {
  blk *b = arg;
  own_mark(b);
  write_cookies(b);
}

/* Runs on the stream before the free_async on it: the block's last use. */
static void stamp_task(void *arg) {
  blk *b = arg;
  verify_cookies(b, "async free (stream task)");
  unsigned char *m = b->p;
  uint64_t stamp = ((uint64_t)(b->stream + 1) << 48) ^ b->serial ^ 0x57a3b000000000ull;
  size_t mid = (b->req / 2) & ~(size_t)7;
  wr64(m, stamp);
  wr64(m + mid, ~stamp);
  wr64(m + b->req - 8, stamp);
  if (rd64(m) != stamp || rd64(m + mid) != ~stamp || rd64(m + b->req - 8) != stamp)
    violation("stamp corrupted: block %p size %zu serial %#" PRIx64
              " was written by someone else while stream %d still used it",
              b->p, b->req, b->serial, b->stream);
  own_clear(b);
  free(b);
}

/* ------------------------------------------------------------------------ */
/* Operations                                                               */
/* ------------------------------------------------------------------------ */

static void win_add(slot *sl, blk *b) { sl->win[sl->nlive++] = b; }

static blk *win_take(slot *sl, unsigned i) {
  blk *b = sl->win[i];
  sl->win[i] = sl->win[--sl->nlive];
  return b;
}

/* Syncs stream j (sl's fixed stream or its box); every block of the window
 * allocated on it so far has then had its mark task run, so it becomes
 * host-owned. */
static void stream_sync(slot *sl, int j) {
  int rc = magpool_host_stream_sync(g_streams[j]);
  sl->c.syncs++;
  if (rc != 0)
    violation("magpool_host_stream_sync: %s", magpool_strerror(rc));
  for (unsigned i = 0; i < sl->nlive; i++)
    if (sl->win[i]->stream == j)
      sl->win[i]->stream = -1;
}

/* A stream sl may use now: its fixed one or its box (a random one of the
 * two if it has both), or -1. */
static int pick_stream(slot *sl, uint64_t r) {
  if (!g_async_ok)
    return -1;
  if (sl->stream >= 0 && sl->held >= 0)
    return (r & 1) ? sl->held : sl->stream;
  return sl->stream >= 0 ? sl->stream : sl->held;
}

static void sync_free(slot *sl, blk *b) {
  verify_cookies(b, "free");
  size_t us = magpool_usable_size(g_pool, b->p);
  if (us != b->usable)
    violation("usable size of live block %p changed: %zu, was %zu", b->p, us, b->usable);
  own_clear(b);
  bool sized = rnd(sl) & 1;
  int rc = sized ? magpool_free_sized(g_pool, b->p, b->req) : magpool_free(g_pool, b->p);
  sl->c.ops++;
  if (rc != 0)
    violation("%s(%p, %zu): %s", sized ? "magpool_free_sized" : "magpool_free", b->p,
              b->req, magpool_strerror(rc));
  else
    sl->c.frees++;
  free(b);
}

/* Frees a block in stream order on stream j (one sl may use): a stamp
 * task, then free_async.  The block must be host-owned or owned by j. */
static void async_free(slot *sl, blk *b, int j) {
  magpool_stream_t s = g_streams[j];
  void *p = b->p;
  size_t req = b->req;
  b->stream = j; /* read by the stamp task */
  int rc = magpool_host_stream_launch(s, stamp_task, b);
  /* --large-async: half the large blocks' frees let the stream drain
   * first (the stamp included), so that the free's question to it
   * (park.c) may find it idle; the other half find their stamp queued. */
  if (rc == 0 && g_opt.large_async && req >= ((size_t)1 << LARGE_MIN_LOG) && (rnd(sl) & 1))
    magpool_host_stream_sync(s);
  if (rc != 0) {
    violation("magpool_host_stream_launch: %s", magpool_strerror(rc));
    magpool_host_stream_sync(s); /* earlier tasks done: b is host-owned */
    b->stream = -1;
    sync_free(sl, b);
    return;
  }
  /* b belongs to the stamp task now, which frees it. */
  rc = magpool_free_async(g_pool, p, s);
  sl->c.ops++;
  if (rc == 0) {
    sl->c.frees++;
    sl->c.async_frees++;
    return;
  }
  violation("magpool_free_async(%p, %zu): %s", p, req, magpool_strerror(rc));
  /* Do not leak it: once the stamp task has run, free it synchronously. */
  magpool_host_stream_sync(s);
  rc = magpool_free(g_pool, p);
  sl->c.ops++;
  if (rc != 0)
    violation("magpool_free(%p) after a failed free_async: %s", p, magpool_strerror(rc));
  else
    sl->c.frees++;
}

/* The harness's record of a block just allocated on pool: counted, its
 * fields set, not yet tracked in the ownership bitmap. */
static blk *blk_record(slot *sl, magpool_t *pool, void *p, size_t req, bool async) {
  sl->c.allocs++;
  if (async)
    sl->c.async_allocs++;
  blk *b = malloc(sizeof *b);
  if (b == NULL) {
    fprintf(stderr, "stress: out of host memory\n");
    abort();
  }
  b->p = p;
  b->req = req;
  b->usable = magpool_usable_size(pool, p);
  b->serial = ((uint64_t)sl->idx << 40) | ++sl->nserial;
  b->stream = -1;
  b->tracked = false;
  return b;
}

static void op_alloc(slot *sl) {
  size_t req = rand_size(sl);
  uint64_t r = rnd(sl);
  int j = pick_stream(sl, r >> 5);
  /* 1 in 32 allocations of a thread with streams is large (1 to 4 MiB,
   * past cache_max_block): freed on a stream, such blocks go through the
   * stream's park, which every thread on that stream takes from. */
  bool large = j >= 0 && ((r >> 40) & 31) == 0;
  if (large) req = ((size_t)1 << LARGE_MIN_LOG) + (size_t)((r >> 45) % (3u << LARGE_MIN_LOG));
  bool async = j >= 0 && ((r & 1) || (large && g_opt.large_async));
  if (large && g_opt.solo && ((r >> 50) & 8191) == 0) async = false; /* ends the solo */
  /* 1 in 16 async allocations pass the NULL stream: "no stream" on a
   * HOST pool, the same as magpool_alloc. */
  magpool_stream_t s = NULL;
  if (async && (((r >> 1) & 15) != 0 || (large && g_opt.large_async)))
    s = g_streams[j];
  void *p = async ? magpool_alloc_async(g_pool, req, s) : magpool_alloc(g_pool, req);
  sl->c.ops++;
  if (p == NULL) {
    int e = magpool_last_error();
    if (e == MAGPOOL_ENOMEM)
      sl->c.enomem++;
    else
      violation("%s(%zu) returned NULL: %s (%d)",
                async ? "magpool_alloc_async" : "magpool_alloc", req,
                magpool_strerror(e), e);
    return;
  }
  blk *b = blk_record(sl, g_pool, p, req, async);
  uintptr_t a = (uintptr_t)p;
  b->tracked = a >= g_win_lo && a - g_win_lo <= g_win_bytes &&
               b->usable <= g_win_bytes - (a - g_win_lo);
  if (!b->tracked)
    violation("block %p (usable %zu) lies outside the pool's address range", p, b->usable);
  if (!shape_ok(p, req, b->usable)) {
    if (b->usable < req)
      b->usable = req; /* keep the checks below in bounds */
    b->tracked = false;
  }

  if (s != NULL) {
    /* Only work queued on s may touch it now. */
    b->stream = j;
    int rc = magpool_host_stream_launch(s, mark_task, b);
    if (rc != 0) {
      violation("magpool_host_stream_launch: %s", magpool_strerror(rc));
      magpool_host_stream_sync(s);
      b->stream = -1;
      mark_task(b);
    }
  } else {
    own_mark(b);
    write_cookies(b);
  }
  win_add(sl, b);
}

/* Frees a host-owned block taken from the exchange. */
static void free_taken(slot *sl, blk *t) {
  uint64_t r = rnd(sl);
  int j = pick_stream(sl, r >> 2);
  if (j >= 0 && (r & 3) == 0)
    async_free(sl, t, j);
  else
    sync_free(sl, t);
}

static void op_free(slot *sl) {
  blk *b = win_take(sl, (unsigned)(rnd(sl) % sl->nlive));
  uint64_t r = rnd(sl);
  if (b->stream >= 0) {
    /* Stream-owned: mostly freed on its stream; else sync, then any path. */
    if ((r & 15) < 13) {
      async_free(sl, b, b->stream);
      return;
    }
    stream_sync(sl, b->stream); /* makes b (and its siblings) host-owned */
    b->stream = -1;
    r >>= 4;
  }
  unsigned k = (unsigned)(r & 7);
  int j = pick_stream(sl, r >> 40);
  if (k < 2) {
    /* Cross-thread free: swap b into a random slot, free what was there.
     * ACQ_REL: releases our cookie writes to the thread that takes b, and
     * acquires those of the thread that deposited what we take. */
    blk *t = exchange_acq_rel(&g_xchg[(r >> 3) % NXCHG], b);
    sl->c.exchanges++;
    if (t != NULL)
      free_taken(sl, t);
  } else if (k < 4 && j >= 0) {
    async_free(sl, b, j);
  } else {
    sync_free(sl, b);
  }
}

/* ------------------------------------------------------------------------ */
/* Stream churn (--churn)                                                   */
/* ------------------------------------------------------------------------ */

/* Tries to take a free box, starting at a random one. */
static void box_take(slot *sl) {
  unsigned k = g_opt.streams;
  unsigned i0 = (unsigned)(rnd(sl) % k);
  for (unsigned n = 0; n < k; n++) {
    unsigned i = (i0 + n) % k;
    int expect = 0;
    /* ACQUIRE: pairs with the RELEASE of the last holder's box_give, so
     * its calls on the stream (and a re-created handle) come before ours. */
    if (load_relaxed(&g_box_busy[i]) == 0 &&
        atomic_compare_exchange_strong_explicit(&g_box_busy[i], &expect, 1,
                                                memory_order_acquire, memory_order_relaxed)) {
      sl->held = (int)(k + i);
      sl->hold_left = 1 + rnd(sl) % (2 * CHURN_HOLD);
      sl->c.handoffs++;
      return;
    }
  }
}

/* Gives the held box back.  First a sync, so that no block of the window
 * is owned by the box's stream any more (the next holder may destroy it);
 * then, the box being ours alone, a quarter of the time nothing, a quarter
 * magpool_stream_release (the stream stays in use), and half the time
 * release, destroy and create a stream in its place, which often gets the
 * old handle: the pool must tell the two apart by id. */
static void box_give(slot *sl) {
  int j = sl->held;
  stream_sync(sl, j);
  unsigned what = (unsigned)(rnd(sl) & 3);
  if (what >= 1) {
    int rc = magpool_stream_release(g_pool, g_streams[j]);
    sl->c.releases++;
    if (rc != 0)
      violation("magpool_stream_release (churn): %s", magpool_strerror(rc));
  }
  if (what >= 2) {
    magpool_stream_t old = g_streams[j];
    int rc = magpool_host_stream_destroy(old);
    if (rc != 0)
      violation("magpool_host_stream_destroy (churn): %s", magpool_strerror(rc));
    rc = magpool_host_stream_create(&g_streams[j]);
    if (rc != 0) {
      fprintf(stderr, "magpool-stress: magpool_host_stream_create: %s\n", magpool_strerror(rc));
      exit(2);
    }
    sl->c.recreated++;
    if (g_streams[j] == old)
      sl->c.same_handle++;
  }
  /* RELEASE: pairs with the next holder's ACQUIRE in box_take. */
  store_release(&g_box_busy[j - (int)g_opt.streams], 0);
  sl->held = -1;
}

static void *worker_main(void *arg) {
  slot *sl = arg;
  uint64_t n = 0;
  while (!load_relaxed(&g_stop)) {
    if (g_opt.exit_every != 0 && n >= g_opt.exit_every)
      break;
    if (g_opt.churn && g_async_ok) {
      if (sl->held >= 0 && --sl->hold_left == 0)
        box_give(sl);
      else if (sl->held < 0 && (n & 15) == 0)
        box_take(sl);
    }
    if (sl->nlive == 0 || (sl->nlive < sl->wcap && (rnd(sl) & 1)))
      op_alloc(sl);
    else
      op_free(sl);
    n++;
  }
  if (sl->held >= 0)
    box_give(sl);
  /* RELEASE: pairs with main's ACQUIRE poll; the join orders the rest. */
  store_release(&sl->done, 1);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Destroy rounds (--destroy-rounds N)                                      */
/* ------------------------------------------------------------------------ */

#define ROUND_POOL_MB 16
#define ROUND_MAX_SIZE_LOG 16 /* blocks up to 64 KiB: all go through caches */
#define ROUND_PER_STREAM 3    /* blocks each round thread frees on each stream */
#define ROUND_CACHED 8        /* ... leaves in its thread cache */
#define ROUND_KEPT 2          /* ... leaves allocated (destroy takes them) */

/* One round.  Its threads write their slots, then count themselves in
 * ndone (RELEASE); the round's main reads the slots after seeing ndone ==
 * T (ACQUIRE), then sets go (RELEASE), which the threads wait for
 * (ACQUIRE) before they exit. */
typedef struct round {
  magpool_t *pool;
  magpool_stream_t *streams;
  unsigned nstreams;
  _Atomic unsigned ndone;
  _Atomic int go;
  _Atomic uint64_t stamped; /* stamp tasks run (relaxed) */
} round;

typedef struct rworker {
  slot sl;
  round *rd;
  pthread_t th;
  uint64_t stamps; /* stamp tasks launched */
  uint64_t kept;   /* blocks left allocated */
  double t_ret;    /* when it returned from rworker_main */
} rworker;

/* The round whose streams run stamp tasks now: set before its threads
 * start, and its streams are destroyed (all tasks run) before the next. */
static round *g_round;

/* A random short delay: none, a few yields, or a sleep of 20-200 us, so
 * that the round threads' exits fall before, during and after destroy. */
static void jitter(uint64_t r) {
  switch (r & 3) {
  case 1:
    for (uint64_t n = 1 + ((r >> 2) & 3); n > 0; n--)
      sched_yield();
    break;
  case 2: {
    struct timespec ts = {0, (long)(20000 + (r >> 2) % 180000)};
    nanosleep(&ts, NULL);
    break;
  }
  default:
    break;
  }
}

static void round_stamp_task(void *arg) {
  stamp_task(arg);
  fetch_add_relaxed(&g_round->stamped, 1);
}

/* A block of the round's pool, with its cookies: written here, or by a
 * mark task on s (stream index k) for an allocation on s. */
static blk *r_alloc(slot *sl, magpool_t *pool, magpool_stream_t s, int k) {
  size_t req = rand_size_upto(sl, ROUND_MAX_SIZE_LOG);
  void *p = s != NULL ? magpool_alloc_async(pool, req, s) : magpool_alloc(pool, req);
  sl->c.ops++;
  if (p == NULL) {
    int e = magpool_last_error();
    if (e == MAGPOOL_ENOMEM)
      sl->c.enomem++;
    else
      violation("%s(%zu) on a round's pool returned NULL: %s (%d)",
                s != NULL ? "magpool_alloc_async" : "magpool_alloc", req,
                magpool_strerror(e), e);
    return NULL;
  }
  blk *b = blk_record(sl, pool, p, req, s != NULL);
  /* b->tracked stays false: the ownership bitmap covers the main pool only */
  if (!shape_ok(p, req, b->usable) && b->usable < req)
    b->usable = req;
  if (s != NULL) {
    b->stream = k;
    int rc = magpool_host_stream_launch(s, mark_task, b);
    if (rc != 0) {
      violation("magpool_host_stream_launch: %s", magpool_strerror(rc));
      magpool_host_stream_sync(s);
      mark_task(b);
    }
  } else {
    write_cookies(b);
  }
  return b;
}

static void r_free(slot *sl, magpool_t *pool, blk *b) {
  verify_cookies(b, "free (round)");
  bool sized = rnd(sl) & 1;
  int rc = sized ? magpool_free_sized(pool, b->p, b->req) : magpool_free(pool, b->p);
  sl->c.ops++;
  if (rc != 0)
    violation("%s(%p, %zu) on a round's pool: %s", sized ? "magpool_free_sized" : "magpool_free",
              b->p, b->req, magpool_strerror(rc));
  else
    sl->c.frees++;
  free(b);
}

/* A stamp task, then free_async on s (stream index k); b is host-owned
 * or owned by s. */
static void r_free_async(rworker *w, blk *b, magpool_stream_t s, int k) {
  slot *sl = &w->sl;
  void *p = b->p;
  b->stream = k;
  int rc = magpool_host_stream_launch(s, round_stamp_task, b);
  if (rc != 0) {
    violation("magpool_host_stream_launch: %s", magpool_strerror(rc));
    magpool_host_stream_sync(s);
    r_free(sl, w->rd->pool, b);
    return;
  }
  w->stamps++;
  rc = magpool_free_async(w->rd->pool, p, s);
  sl->c.ops++;
  if (rc == 0) {
    sl->c.frees++;
    sl->c.async_frees++;
    return;
  }
  violation("magpool_free_async(%p) on a round's pool: %s", p, magpool_strerror(rc));
  magpool_host_stream_sync(s);
  rc = magpool_free(w->rd->pool, p);
  sl->c.ops++;
  if (rc != 0)
    violation("magpool_free(%p) after a failed free_async: %s", p, magpool_strerror(rc));
  else
    sl->c.frees++;
}

/* A round thread: on each stream, blocks freed in stream order (so its
 * thread record owns a slot of that stream with blocks in it), some
 * allocated on the stream first; then blocks left in its thread cache,
 * and a few left allocated.  Then it reports done, waits for go, and
 * exits while the round's main destroys the pool. */
static void *rworker_main(void *arg) {
  rworker *w = arg;
  slot *sl = &w->sl;
  round *rd = w->rd;
  unsigned k0 = (unsigned)(rnd(sl) % rd->nstreams);
  for (unsigned i = 0; i < rd->nstreams; i++) {
    int k = (int)((k0 + i) % rd->nstreams);
    magpool_stream_t s = rd->streams[k];
    for (unsigned j = 0; j < ROUND_PER_STREAM; j++) {
      blk *b = r_alloc(sl, rd->pool, (rnd(sl) & 1) ? s : NULL, k);
      if (b != NULL)
        r_free_async(w, b, s, k);
    }
  }
  blk *c[ROUND_CACHED];
  for (unsigned i = 0; i < ROUND_CACHED; i++)
    c[i] = r_alloc(sl, rd->pool, NULL, -1);
  for (unsigned i = 0; i < ROUND_CACHED; i++)
    if (c[i] != NULL)
      r_free(sl, rd->pool, c[i]);
  for (unsigned i = 0; i < ROUND_KEPT; i++) {
    blk *b = r_alloc(sl, rd->pool, NULL, -1);
    if (b != NULL) {
      verify_cookies(b, "kept block (round)");
      w->kept++;
      free(b); /* the block itself stays allocated */
    }
  }
  uint64_t r = rnd(sl);
  atomic_fetch_add_explicit(&rd->ndone, 1, memory_order_release);
  while (!load_acquire(&rd->go))
    sched_yield();
  jitter(r);
  w->t_ret = now_s();
  return NULL; /* the thread exits: its records for the pool are flushed */
}

static void one_round(slot *ms, unsigned r, round_totals *rt) {
  round rd;
  memset(&rd, 0, sizeof rd);
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = (size_t)ROUND_POOL_MB << 20;
  if (r % 4 == 3)
    cfg.stream_cache_bytes = 64u << 10; /* small stream caches: retire often */
  int rc = magpool_create(&cfg, &rd.pool);
  if (rc != 0) {
    fprintf(stderr, "magpool-stress: magpool_create (round): %s\n", magpool_strerror(rc));
    exit(2);
  }
  rd.nstreams = g_opt.streams > 0 ? g_opt.streams : 2;
  rd.streams = calloc(rd.nstreams, sizeof *rd.streams);
  rworker *w = calloc(g_opt.threads, sizeof *w);
  if (rd.streams == NULL || w == NULL)
    exit(2);
  for (unsigned k = 0; k < rd.nstreams; k++) {
    rc = magpool_host_stream_create(&rd.streams[k]);
    if (rc != 0) {
      fprintf(stderr, "magpool-stress: magpool_host_stream_create: %s\n", magpool_strerror(rc));
      exit(2);
    }
  }
  g_round = &rd;

  /* The round's main uses the pool too: its record is LIVE at destroy
   * (orphaned, freed at its next lookup). */
  uint64_t allocs = ms->c.allocs, frees = ms->c.frees;
  blk *mine = r_alloc(ms, rd.pool, NULL, -1);
  if (mine != NULL)
    r_free(ms, rd.pool, mine);
  allocs = ms->c.allocs - allocs;
  frees = ms->c.frees - frees;

  for (unsigned i = 0; i < g_opt.threads; i++) {
    w[i].rd = &rd;
    w[i].sl.idx = g_opt.threads + 1 + i;
    w[i].sl.rng = (g_opt.seed + 977 * (r + 1) + i) * 0x9e3779b97f4a7c15ull ^ 0x13198a2e03707344ull;
    w[i].sl.stream = -1;
    w[i].sl.held = -1;
    rc = pthread_create(&w[i].th, NULL, rworker_main, &w[i]);
    if (rc != 0) {
      fprintf(stderr, "magpool-stress: pthread_create: %s\n", strerror(rc));
      exit(2);
    }
  }
  rt->threads += g_opt.threads;
  while (load_acquire(&rd.ndone) < g_opt.threads)
    sched_yield();

  /* No call on the pool is running now.  Each stream is synchronised
   * (the round threads' slots keep their blocks, which their exits
   * retire) or released (the slots are emptied, their blocks retired
   * behind the stream's work, which destroy waits for). */
  for (unsigned k = 0; k < rd.nstreams; k++) {
    if (rnd(ms) & 1) {
      rc = magpool_stream_release(rd.pool, rd.streams[k]);
      rt->released++;
      if (rc != 0)
        violation("magpool_stream_release (round): %s", magpool_strerror(rc));
    } else {
      rc = magpool_host_stream_sync(rd.streams[k]);
      rt->synced++;
      if (rc != 0)
        violation("magpool_host_stream_sync: %s", magpool_strerror(rc));
    }
  }

  uint64_t kept = 0, stamps = 0;
  for (unsigned i = 0; i < g_opt.threads; i++) {
    allocs += w[i].sl.c.allocs;
    frees += w[i].sl.c.frees;
    kept += w[i].kept;
    stamps += w[i].stamps;
  }
  magpool_stats_t st;
  rc = magpool_get_stats(rd.pool, &st);
  if (rc != 0)
    violation("magpool_get_stats (round): %s", magpool_strerror(rc));
  else if (st.alloc_count != allocs || st.free_count != frees || st.live_count != kept)
    violation("round %u: the pool counted %" PRIu64 " allocations, %" PRIu64 " frees, %" PRIu64
              " live; the harness made %" PRIu64 ", %" PRIu64 ", and left %" PRIu64 " live",
              r, st.alloc_count, st.free_count, st.live_count, allocs, frees, kept);

  /* The threads exit now, while the pool is destroyed. */
  store_release(&rd.go, 1);
  jitter(rnd(ms));
  double t0 = now_s();
  rc = magpool_destroy(rd.pool);
  double t1 = now_s();
  if (rc != 0)
    violation("magpool_destroy (round): %s", magpool_strerror(rc));
  /* Every stream was synchronised or released: destroy has waited for
   * the batches behind every stamp task. */
  uint64_t ran = load_relaxed(&rd.stamped);
  if (ran != stamps)
    violation("round %u: magpool_destroy returned with %" PRIu64 " of %" PRIu64
              " blocks freed on its streams not yet passed by them",
              r, stamps - ran, stamps);

  for (unsigned i = 0; i < g_opt.threads; i++) {
    rc = pthread_join(w[i].th, NULL);
    if (rc != 0)
      violation("joining a round thread: %s", strerror(rc));
    if (w[i].t_ret < t0)
      rt->ret_before++;
    else if (w[i].t_ret <= t1)
      rt->ret_during++;
    else
      rt->ret_after++;
    add_counters(&rt->c, &w[i].sl.c);
  }
  for (unsigned k = 0; k < rd.nstreams; k++) {
    rc = magpool_host_stream_destroy(rd.streams[k]);
    if (rc != 0)
      violation("magpool_host_stream_destroy (round): %s", magpool_strerror(rc));
  }
  g_round = NULL;
  free(rd.streams);
  free(w);
  rt->rounds++;
}

static round_totals g_rt; /* the rounds thread's; main reads it after the join */

static void *rounds_main(void *arg) {
  (void)arg;
  slot rs; /* the rounds thread's own PRNG and counters */
  memset(&rs, 0, sizeof rs);
  rs.idx = 2 * g_opt.threads + 1;
  rs.rng = g_opt.seed * 0x2545f4914f6cdd1dull + 0x5eedull;
  rs.stream = -1;
  rs.held = -1;
  for (unsigned r = 0; r < g_opt.destroy_rounds; r++)
    one_round(&rs, r, &g_rt);
  add_counters(&g_rt.c, &rs.c);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Setup, supervision, final checks                                         */
/* ------------------------------------------------------------------------ */

static void usage(FILE *f) {
  fprintf(f,
          "usage: magpool-stress [--threads T] [--seconds S] [--seed N] [--streams K]\n"
          "                      [--pool-mb M] [--exit-every N] [--churn]\n"
          "                      [--destroy-rounds R] [--grow-from G] [--large-async]\n"
          "                      [--cross-reuse] [--no-groups] [--solo]\n"
          "defaults: T=%d S=%d N=%d K=0 M=%d N=%d (exit-every 0: no thread churn)\n"
          "--churn (needs K > 0): K more streams, handed from worker to worker,\n"
          "released, destroyed and created anew while the workers run\n"
          "--destroy-rounds R (default 0): R times, a fresh pool destroyed while\n"
          "the threads that used it exit, next to the workers\n"
          "--grow-from G (default 0: off): a pool of G MiB growing up to M MiB\n"
          "(chunks mapped by growth, in groups, and unmapped by moves)\n"
          "--large-async: large requests (1 to 4 MiB) always on the stream\n"
          "--cross-reuse: cross_stream_reuse on (a stream at a new peak takes\n"
          "runs other streams freed, after waiting for them)\n"
          "--no-groups (with --grow-from): chunk_groups 0, the cap's default\n"
          "(a chunk each; tree blocks into the fullest busy chunk)\n"
          "--solo: --large-async, with 1 in 8192 large requests synchronous\n",
          DEFAULT_THREADS, DEFAULT_SECONDS, DEFAULT_SEED, DEFAULT_POOL_MB,
          DEFAULT_EXIT_EVERY);
}

static bool parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
  if (s == NULL || *s == '\0' || *s == '-')
    return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno != 0 || *end != '\0' || v < lo || v > hi)
    return false;
  *out = v;
  return true;
}

static void parse_args(int argc, char **argv) {
  g_opt.threads = DEFAULT_THREADS;
  g_opt.seconds = DEFAULT_SECONDS;
  g_opt.seed = DEFAULT_SEED;
  g_opt.streams = 0;
  g_opt.pool_mb = DEFAULT_POOL_MB;
  g_opt.exit_every = DEFAULT_EXIT_EVERY;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    uint64_t x = 0; /* parse_u64 sets it when ok */
    bool ok = true;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      exit(0);
    } else if (strcmp(a, "--churn") == 0) {
      g_opt.churn = true;
      continue; /* a flag: no value */
    } else if (strcmp(a, "--large-async") == 0) {
      g_opt.large_async = true;
      continue;
    } else if (strcmp(a, "--cross-reuse") == 0) {
      g_opt.cross_reuse = true;
      continue;
    } else if (strcmp(a, "--no-groups") == 0) {
      g_opt.no_groups = true;
      continue;
    } else if (strcmp(a, "--solo") == 0) {
      g_opt.solo = g_opt.large_async = true;
      continue;
    } else if (strcmp(a, "--threads") == 0) {
      ok = parse_u64(v, 1, 1024, &x);
      g_opt.threads = (unsigned)x;
    } else if (strcmp(a, "--seconds") == 0) {
      ok = parse_u64(v, 0, 86400, &x);
      g_opt.seconds = (unsigned)x;
    } else if (strcmp(a, "--seed") == 0) {
      ok = parse_u64(v, 0, UINT64_MAX, &x);
      g_opt.seed = x;
    } else if (strcmp(a, "--streams") == 0) {
      ok = parse_u64(v, 0, 256, &x);
      g_opt.streams = (unsigned)x;
    } else if (strcmp(a, "--pool-mb") == 0) {
      ok = parse_u64(v, 4, (uint64_t)1 << 20, &x);
      g_opt.pool_mb = (size_t)x;
    } else if (strcmp(a, "--grow-from") == 0) {
      ok = parse_u64(v, 0, (uint64_t)1 << 20, &x);
      g_opt.grow_from_mb = (size_t)x;
    } else if (strcmp(a, "--destroy-rounds") == 0) {
      ok = parse_u64(v, 0, 1000000, &x);
      g_opt.destroy_rounds = (unsigned)x;
    } else if (strcmp(a, "--exit-every") == 0) {
      ok = parse_u64(v, 0, UINT64_MAX, &x);
      g_opt.exit_every = x;
    } else {
      fprintf(stderr, "magpool-stress: unknown argument '%s'\n", a);
      usage(stderr);
      exit(2);
    }
    if (!ok) {
      fprintf(stderr, "magpool-stress: bad value for %s: '%s'\n", a, v ? v : "");
      usage(stderr);
      exit(2);
    }
    i++;
  }
  if (g_opt.grow_from_mb != 0 &&
      (g_opt.grow_from_mb > g_opt.pool_mb || g_opt.grow_from_mb % 2 != 0 || g_opt.pool_mb % 2 != 0)) {
    fprintf(stderr, "magpool-stress: --grow-from G needs G <= M, both even (2 MiB chunks)\n");
    usage(stderr);
    exit(2);
  }
  if (g_opt.no_groups && g_opt.grow_from_mb == 0) {
    fprintf(stderr, "magpool-stress: --no-groups needs --grow-from G\n");
    usage(stderr);
    exit(2);
  }
  if (g_opt.churn && g_opt.streams == 0) {
    fprintf(stderr, "magpool-stress: --churn needs --streams K (K > 0)\n");
    usage(stderr);
    exit(2);
  }
}

static void watchdog(int sig) {
  (void)sig;
  static const char msg[] = "magpool-stress: watchdog: the run did not finish in time (hang?)\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  _exit(3);
}

static void spawn(slot *sl) {
  store_relaxed(&sl->done, 0);
  int rc = pthread_create(&sl->th, NULL, worker_main, sl);
  if (rc != 0) {
    fprintf(stderr, "magpool-stress: pthread_create: %s\n", strerror(rc));
    exit(2);
  }
  sl->running = true;
  sl->generations++;
}

static void reap(slot *sl) {
  pthread_join(sl->th, NULL);
  sl->running = false;
}

static void add_counters(counters *to, const counters *c) {
  to->ops += c->ops;
  to->allocs += c->allocs;
  to->frees += c->frees;
  to->enomem += c->enomem;
  to->async_allocs += c->async_allocs;
  to->async_frees += c->async_frees;
  to->exchanges += c->exchanges;
  to->syncs += c->syncs;
  to->handoffs += c->handoffs;
  to->releases += c->releases;
  to->recreated += c->recreated;
  to->same_handle += c->same_handle;
}

/* Probes the async API once; on failure reports it and disables it. */
static void probe_async(slot *ms) {
  magpool_stream_t s = g_streams[0];
  void *p = magpool_alloc_async(g_pool, 64, s);
  ms->c.ops++;
  if (p == NULL) {
    int e = magpool_last_error();
    violation("async API unavailable: magpool_alloc_async(64, host stream) failed: %s (%d); "
              "going on with the synchronous API only",
              magpool_strerror(e), e);
    return;
  }
  ms->c.allocs++;
  ms->c.async_allocs++;
  int rc = magpool_free_async(g_pool, p, s);
  ms->c.ops++;
  if (rc != 0) {
    violation("async API unavailable: magpool_free_async failed: %s (%d); "
              "going on with the synchronous API only",
              magpool_strerror(rc), rc);
    rc = magpool_free(g_pool, p);
    ms->c.ops++;
    if (rc != 0)
      violation("magpool_free of the async probe block: %s", magpool_strerror(rc));
    else
      ms->c.frees++;
    return;
  }
  ms->c.frees++;
  ms->c.async_frees++;
  g_async_ok = true;
}

/* Creates the pool, finds its address window, allocates the ownership
 * bitmap, creates the streams and probes the async API. */
static void setup(slot *ms) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = g_opt.pool_mb << 20;
  g_pool_size = cfg.pool_size; /* the cap: what the window covers */
  if (g_opt.grow_from_mb != 0) {
    cfg.pool_size = g_opt.grow_from_mb << 20;
    cfg.allow_growth = 1;
    cfg.max_pool_size = g_opt.pool_mb << 20;
    /* Groups under the cap too (their races are the test), unless
     * --no-groups asks for the cap's default. */
    cfg.chunk_groups = g_opt.no_groups ? 0 : 1;
  }
  if (g_opt.cross_reuse) cfg.cross_stream_reuse = 1;
  int rc = magpool_create(&cfg, &g_pool);
  if (rc != 0) {
    fprintf(stderr, "magpool-stress: magpool_create(%zu MiB): %s\n", g_opt.pool_mb,
            magpool_strerror(rc));
    exit(2);
  }
  /* pool_size as the pool holds it: rounded to whole chunks where it is
   * not whole chunks (magpool.h), never more than a fixed pool_size. */
  magpool_stats_t st0;
  magpool_get_stats(g_pool, &st0);
  g_held = st0.reserved_bytes;
  if (g_opt.grow_from_mb == 0 && (g_held > cfg.pool_size ||
                                  (cfg.pool_size % cfg.chunk_size == 0 && g_held != cfg.pool_size)))
    violation("a fixed pool of %zu B holds %zu", cfg.pool_size, g_held);

  /* Ownership window: without growth every block lies in [base, base +
   * pool_size), and base is within pool_size below any block. */
  void *probe = magpool_alloc(g_pool, 64);
  ms->c.ops++;
  if (probe == NULL) {
    fprintf(stderr, "magpool-stress: first allocation failed: %s\n",
            magpool_strerror(magpool_last_error()));
    exit(2);
  }
  ms->c.allocs++;
  uintptr_t pa = (uintptr_t)probe & ~(((uintptr_t)1 << GRANULE_LOG) - 1);
  /* A chunked pool reserves up to four times its size rounded up to a
   * power of two in address space (its tree's half and its runs' half):
   * the window covers that on either side of the probe. */
  size_t span = 1;
  while (span < g_pool_size) span <<= 1;
  span *= 4;
  g_win_lo = pa > span ? pa - span : 0;
  g_win_bytes = 2 * span;
  size_t nbits = g_win_bytes >> GRANULE_LOG;
  g_own = calloc((nbits + 63) / 64, sizeof *g_own);
  if (g_own == NULL) {
    fprintf(stderr, "magpool-stress: out of host memory\n");
    exit(2);
  }
  rc = magpool_free(g_pool, probe);
  ms->c.ops++;
  if (rc != 0)
    violation("magpool_free(first block): %s", magpool_strerror(rc));
  else
    ms->c.frees++;

  if (g_opt.streams > 0) {
    g_nstreams = g_opt.churn ? 2 * g_opt.streams : g_opt.streams;
    g_streams = calloc(g_nstreams, sizeof *g_streams);
    g_box_busy = calloc(g_opt.streams, sizeof *g_box_busy);
    if (g_streams == NULL || g_box_busy == NULL)
      exit(2);
    for (unsigned i = 0; i < g_nstreams; i++) {
      rc = magpool_host_stream_create(&g_streams[i]);
      if (rc != 0) {
        fprintf(stderr, "magpool-stress: magpool_host_stream_create: %s\n",
                magpool_strerror(rc));
        exit(2);
      }
    }
    probe_async(ms);
  }
}

/* Starts the workers, replaces those that exit (thread churn) until time
 * is up, then stops and joins them all.  Returns the seconds elapsed. */
static double run_workers(slot *slots) {
  double t0 = now_s();
  double deadline = t0 + g_opt.seconds;
  pthread_t rounds;
  if (g_opt.destroy_rounds > 0) {
    int rc = pthread_create(&rounds, NULL, rounds_main, NULL);
    if (rc != 0) {
      fprintf(stderr, "magpool-stress: pthread_create: %s\n", strerror(rc));
      exit(2);
    }
  }
  for (unsigned i = 0; i < g_opt.threads; i++)
    spawn(&slots[i]);
  while (now_s() < deadline) {
    sleep_ms(2);
    for (unsigned i = 0; i < g_opt.threads; i++) {
      slot *sl = &slots[i];
      if (sl->running && load_acquire(&sl->done)) {
        reap(sl);
        if (now_s() < deadline)
          spawn(sl);
      }
    }
  }
  store_relaxed(&g_stop, 1);
  for (unsigned i = 0; i < g_opt.threads; i++)
    if (slots[i].running)
      reap(&slots[i]);
  if (g_opt.destroy_rounds > 0)
    pthread_join(rounds, NULL); /* all its rounds, however long they take */
  return now_s() - t0;
}

/* Frees every block still live (windows and exchange), then releases,
 * syncs and destroys every stream.  All workers have been joined. */
static void teardown_blocks_and_streams(slot *ms, slot *slots) {
  int rc;
  /* Every stream's tasks done: every block is host-owned. */
  for (unsigned i = 0; i < g_nstreams; i++) {
    rc = magpool_host_stream_sync(g_streams[i]);
    if (rc != 0)
      violation("magpool_host_stream_sync: %s", magpool_strerror(rc));
  }
  for (unsigned i = 0; i < g_opt.threads; i++) {
    slot *sl = &slots[i];
    while (sl->nlive > 0) {
      blk *b = win_take(sl, sl->nlive - 1);
      b->stream = -1;
      sync_free(ms, b);
    }
  }
  for (unsigned i = 0; i < NXCHG; i++) {
    blk *b = exchange_acq_rel(&g_xchg[i], NULL);
    if (b != NULL)
      sync_free(ms, b);
  }
  /* magpool_stream_release retires each stream's cache behind its work;
   * the sync lets that run.  Then the streams are destroyed, so that no
   * thread other than this one that ever used the pool is alive (trim
   * cannot touch the caches of live threads). */
  for (unsigned i = 0; i < g_nstreams; i++) {
    rc = magpool_stream_release(g_pool, g_streams[i]);
    if (rc != 0)
      violation("magpool_stream_release: %s", magpool_strerror(rc));
    rc = magpool_host_stream_sync(g_streams[i]);
    if (rc != 0)
      violation("magpool_host_stream_sync: %s", magpool_strerror(rc));
  }
  for (unsigned i = 0; i < g_nstreams; i++) {
    rc = magpool_host_stream_destroy(g_streams[i]);
    if (rc != 0)
      violation("magpool_host_stream_destroy: %s", magpool_strerror(rc));
  }
}

/* The conservation check on a pool with no live block.  Returns the bytes
 * the pool does not account for; counts the harness's own whole-pool
 * allocation in *tot. */
static uint64_t conservation(counters *tot) {
  uint64_t lost = 0;
  int rc = magpool_trim(g_pool);
  if (rc != 0)
    violation("magpool_trim: %s", magpool_strerror(rc));

  magpool_stats_t st;
  rc = magpool_get_stats(g_pool, &st);
  if (rc != 0) {
    violation("magpool_get_stats: %s", magpool_strerror(rc));
    memset(&st, 0, sizeof st);
  }
  printf("stress: final stats: used %zu, requested %zu, reserved %zu, peak %zu, cached %zu, "
         "pending %zu, free %zu, largest free %zu, allocs %" PRIu64 ", frees %" PRIu64
         ", live %" PRIu64 "\n",
         st.used_bytes, st.requested_bytes, st.reserved_bytes, st.peak_used_bytes,
         st.cached_bytes, st.pending_bytes, st.free_bytes, st.largest_free_block,
         st.alloc_count, st.free_count, st.live_count);
  printf("stress: chunks mapped %" PRIu64 ", unmapped %" PRIu64 ", moved %" PRIu64 "\n",
         st.chunk_maps, st.chunk_unmaps, st.chunk_moves);
  if (st.used_bytes != 0 || st.live_count != 0 || st.requested_bytes != 0) {
    printf("LOST: %zu bytes (%zu requested) in %" PRIu64
           " allocations still counted live after everything was freed\n",
           st.used_bytes, st.requested_bytes, st.live_count);
    lost += st.used_bytes != 0 ? st.used_bytes : (st.live_count != 0 ? st.live_count : 1);
  }
  if (st.cached_bytes != 0) {
    printf("LOST: %zu bytes still cached after magpool_trim, with no other thread alive\n",
           st.cached_bytes);
    lost += st.cached_bytes;
  }
  if (st.pending_bytes != 0) {
    printf("LOST: %zu bytes still pending after every stream was released and synced\n",
           st.pending_bytes);
    lost += st.pending_bytes;
  }
  /* After trim: the pool size (a growing pool's initial size), as held. */
  if (st.reserved_bytes != g_held)
    violation("reserved_bytes %zu, want the pool size %zu", st.reserved_bytes, g_held);
  if (lost == 0 && st.free_bytes != st.reserved_bytes) {
    printf("LOST: free_bytes %zu != reserved_bytes %zu with nothing live, cached or pending\n",
           st.free_bytes, st.reserved_bytes);
    lost += st.reserved_bytes > st.free_bytes ? st.reserved_bytes - st.free_bytes : 1;
  }
  if (st.alloc_count != tot->allocs || st.free_count != tot->frees)
    violation("pool counted %" PRIu64 " allocations and %" PRIu64
              " frees; the harness made %" PRIu64 " and %" PRIu64,
              st.alloc_count, st.free_count, tot->allocs, tot->frees);

  rc = magpool_check(g_pool);
  if (rc != 0)
    violation("magpool_check after trim: %s", magpool_strerror(rc));

  if (is_pow2(g_pool_size)) {
    /* Fully coalesced: the whole pool is one block again. */
    void *whole = magpool_alloc(g_pool, g_pool_size);
    tot->ops++;
    if (whole == NULL) {
      printf("LOST: the pool is not one free block after trim: magpool_alloc(%zu) "
             "failed (%s); largest free block %zu\n",
             g_pool_size, magpool_strerror(magpool_last_error()), st.largest_free_block);
      if (lost == 0)
        lost = g_pool_size > st.largest_free_block ? g_pool_size - st.largest_free_block : 1;
    } else {
      tot->allocs++;
      rc = magpool_free(g_pool, whole);
      tot->ops++;
      if (rc != 0)
        violation("magpool_free(whole pool): %s", magpool_strerror(rc));
      else
        tot->frees++;
      rc = magpool_trim(g_pool);
      if (rc != 0)
        violation("magpool_trim: %s", magpool_strerror(rc));
      rc = magpool_check(g_pool);
      if (rc != 0)
        violation("magpool_check after the whole-pool block: %s", magpool_strerror(rc));
    }
  } else if (st.largest_free_block == 0) {
    printf("LOST: no free block at all after trim\n");
    if (lost == 0)
      lost = g_pool_size;
  }
  return lost;
}

int main(int argc, char **argv) {
  parse_args(argc, argv);
  setvbuf(stdout, NULL, _IOLBF, 0);

  /* Main's own slot: counters and PRNG for the setup and teardown work. */
  slot ms;
  memset(&ms, 0, sizeof ms);
  ms.idx = g_opt.threads;
  ms.rng = g_opt.seed * 0x2545f4914f6cdd1dull + 0xabcdefull;
  ms.stream = -1;
  ms.held = -1;
  setup(&ms);

  /* Window: live bytes average about a quarter of the pool.  A block of
   * the size distribution above has a mean usable size of about 150 KiB,
   * and a window holds wcap / 2 blocks on average. */
  size_t mean_usable = 150u << 10;
  size_t wcap = g_pool_size / (2 * (size_t)g_opt.threads * mean_usable);
  if (STRESS_TSAN)
    wcap /= 4; /* fewer live blocks: the per-op cost is 10-50x under TSan */
  if (wcap < 4)
    wcap = 4;
  if (wcap > 4096)
    wcap = 4096;

  slot *slots = calloc(g_opt.threads, sizeof *slots);
  if (slots == NULL)
    return 2;
  for (unsigned i = 0; i < g_opt.threads; i++) {
    slot *sl = &slots[i];
    sl->idx = i;
    sl->rng = (g_opt.seed + i) * 0x9e3779b97f4a7c15ull ^ 0x243f6a8885a308d3ull;
    sl->wcap = (unsigned)wcap;
    sl->win = calloc(wcap, sizeof *sl->win);
    if (sl->win == NULL)
      return 2;
    sl->stream = g_opt.streams > 0 ? (int)(i % g_opt.streams) : -1;
    sl->held = -1;
  }

  if (g_opt.grow_from_mb != 0) printf("stress: growing from %zu MiB\n", g_opt.grow_from_mb);
  printf("stress: pool %zu MiB, %u threads, %u s, seed %" PRIu64
         ", %u streams%s%s, window %zu blocks/thread, exit every %" PRIu64 " ops%s\n",
         g_opt.pool_mb, g_opt.threads, g_opt.seconds, g_opt.seed, g_opt.streams,
         g_opt.churn ? " + as many churned" : "",
         g_opt.streams ? (g_async_ok ? " (async on)" : " (async off)") : "", wcap,
         g_opt.exit_every, STRESS_TSAN ? " [tsan]" : "");

  signal(SIGALRM, watchdog);
  alarm(g_opt.seconds + WATCHDOG_GRACE_S);

  double elapsed = run_workers(slots);
  teardown_blocks_and_streams(&ms, slots);

  counters tot = ms.c;
  tot.ops += g_rt.c.ops; /* the rounds' pools are gone: only their calls count */
  unsigned generations = 0;
  for (unsigned i = 0; i < g_opt.threads; i++) {
    add_counters(&tot, &slots[i].c);
    generations += slots[i].generations;
    free(slots[i].win);
  }
  free(slots);

  uint64_t lost = conservation(&tot);
  int rc = magpool_destroy(g_pool);
  if (rc != 0)
    violation("magpool_destroy: %s", magpool_strerror(rc));
  alarm(0);

  uint64_t viol = load_relaxed(&g_violations);
  uint64_t overlaps = load_relaxed(&g_overlaps);
  printf("stress: %" PRIu64 " allocs (%" PRIu64 " async, %" PRIu64 " ENOMEM), %" PRIu64
         " frees (%" PRIu64 " async), %" PRIu64 " exchanges, %" PRIu64
         " stream syncs, %u worker threads, %.2f Mops/s, %" PRIu64 " violations\n",
         tot.allocs, tot.async_allocs, tot.enomem, tot.frees, tot.async_frees, tot.exchanges,
         tot.syncs, generations, elapsed > 0 ? (double)tot.ops / elapsed / 1e6 : 0.0, viol);
  if (g_opt.destroy_rounds > 0)
    printf("stress: destroy rounds: %u rounds, %u threads (returned before destroy %u, "
           "during %u, after %u), %u streams released and %u synchronised before destroy; %" PRIu64
           " allocs (%" PRIu64 " async, %" PRIu64 " ENOMEM), %" PRIu64 " frees (%" PRIu64
           " async)\n",
           g_rt.rounds, g_rt.threads, g_rt.ret_before, g_rt.ret_during, g_rt.ret_after, g_rt.released, g_rt.synced,
           g_rt.c.allocs, g_rt.c.async_allocs, g_rt.c.enomem, g_rt.c.frees, g_rt.c.async_frees);
  if (g_opt.churn)
    printf("stress: churn: %" PRIu64 " stream hand-offs, %" PRIu64 " releases, %" PRIu64
           " streams destroyed and created anew (%" PRIu64 " on the old handle)\n",
           tot.handoffs, tot.releases, tot.recreated, tot.same_handle);
  printf("stress: %" PRIu64 " ops, %u threads, %u s, %" PRIu64 " overlaps, %" PRIu64 " lost\n",
         tot.ops, g_opt.threads, g_opt.seconds, overlaps, lost);
  free(g_streams);
  free(g_box_busy);
  free(g_own);
  return (viol != 0 || overlaps != 0 || lost != 0) ? 1 : 0;
}
