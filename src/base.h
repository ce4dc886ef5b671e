/* base.h - macros, limits, debug tiers and bit helpers every file uses.
 * No types of the pool and no code that calls into a .c file. */
#ifndef MAGPOOL_BASE_H
#define MAGPOOL_BASE_H

#include <stdatomic.h> /* _Atomic in declarations; operations: atomic.h */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "magpool.h"

/* ---------------------------------------------------------------- limits */

/* Internal return code (never public): a chunked pool would have to map
 * more memory while stream frees that could cover the request are still
 * on their way back (chunk.c, make_room). */
#define MP_EGROW (-100)
/* Internal: a take would map a chunk while a stream's solo runs are
 * there (runs.h): the caller ends the solo and takes again. */
#define MP_ESOLO (-101)
/* The `grow` of a take (region.c, chunk.c): 0 waits for returning stream
 * frees before creating memory, 1 does not, MP_TAKE_NOMOVE is 1 but is
 * refused (MP_EGROW) where it would move chunks, MP_TAKE_NOPEAK is
 * NOMOVE refused also where it would raise the busy chunks' high-water
 * mark above pool_size (a take that only reuses what is busy or mapped),
 * MP_TAKE_NOMAP is 0 refused also where it would map a chunk or raise the
 * mark at all (a thread whose extent cache holds blocks: xcache.c). */
#define MP_TAKE_NOMOVE 2
#define MP_TAKE_NOPEAK 3
#define MP_TAKE_NOMAP 4
#define MP_MAX_REGIONS 64 /* growth steps a pool can take                 */
#define MP_MAX_ORDER 48   /* largest block: min_block << MP_MAX_ORDER     */
#define MP_MAX_CLASSES 24 /* cached orders (thread and stream caches)     */
#define MP_XBINS 56       /* extent-cache bins: granule counts 1-511 (xcache.c) */
#define MP_XCAP 8         /* blocks an extent-cache bin holds             */
#define MP_MAG_SLOTS 64u  /* blocks a magazine can hold: every class's cap
                             is a power of two <= this (pool.c), and
                             mp_blocks_give's merge stack is sized by it   */
#define MP_CARVE_CHUNK_SHIFT 4 /* a thread-cache refill of a chunked pool
                                   carves at most chunk >> this bytes
                                   (magazine.c, mp_cache_alloc_slow)    */
#define MP_CHUNK_GROUP 8       /* most chunks mapped as one piece of
                                   memory (chunk.c, C6)                */
#define MP_MOVE_GROUP 4        /* most chunks a move maps as one piece
                                   (chunk.c, map_run)                  */
#define MP_KEEP_TREE 8         /* chunks of pool_size mapped under the
                                   tree; the rest in run space (chunk.c) */
#define MP_CACHELINE 64
#define MP_MAG_SLABS_MAX (1u << 20) /* 64 magazines a slab: 2^26 magazines,
                                       indices fit 32 bits               */

/* ---------------------------------------------------------------- macros */

#define MP_LIKELY(x) __builtin_expect(!!(x), 1)
#define MP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define MP_NOINLINE __attribute__((noinline))
#define MP_INLINE static inline __attribute__((always_inline))

/* ThreadSanitizer build?  Used only in the form `if (MP_TSAN)`. */
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

/* ----------------------------------------------------------- debug tiers */

/* MP_DEBUG (CMake: MAGPOOL_DEBUG)
 *   0  release: no checks
 *   1  mp_assert: cheap checks of preconditions and local invariants
 *   2  also mp_assert_expensive: whole-structure checkers (mp_tree_check,
 *      magpool_check) at every quiescent magpool_trim and at destroy
 * A failed check traps at once: the state that broke it is still there
 * for the debugger. */
#ifndef MP_DEBUG
#define MP_DEBUG 0
#endif

#define mp_assert(c)                                                           \
  do {                                                                         \
    if (MP_DEBUG >= 1 && !(c)) __builtin_trap();                               \
  } while (0)
#define mp_assert_expensive(c)                                                 \
  do {                                                                         \
    if (MP_DEBUG >= 2 && !(c)) __builtin_trap();                               \
  } while (0)

/* ----------------------------------------------------------- bit helpers */

static inline unsigned mp_ctz64(uint64_t x) { return (unsigned)__builtin_ctzll(x); }
static inline unsigned mp_clz64(uint64_t x) { return (unsigned)__builtin_clzll(x); }
/* Set bits of x.  Without -mpopcnt (the portable build) GCC's builtin is a
 * libgcc call; this is a dozen inline instructions (the run bitmaps). */
static inline unsigned mp_popcount64(uint64_t x) {
#ifdef __POPCNT__
  return (unsigned)__builtin_popcountll(x);
#else
  x -= (x >> 1) & 0x5555555555555555u;
  x = (x & 0x3333333333333333u) + ((x >> 2) & 0x3333333333333333u);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fu;
  return (unsigned)((x * 0x0101010101010101u) >> 56);
#endif
}
/* ceil(log2(x)) for x >= 1 */
static inline unsigned mp_log2_ceil(uint64_t x) {
  return x <= 1 ? 0 : 64u - mp_clz64(x - 1);
}
static inline unsigned mp_log2_floor(uint64_t x) { return 63u - mp_clz64(x); }

/* ------------------------------------------------------------ test hooks */

/* Points where a test can stop a thread to open a race window on purpose
 * (tests/unit).  Each is on a slow path; production pays one relaxed load
 * of a global pointer there. */
enum {
  MP_HOOK_STACK_POP = 1, /* arg: the mp_stack; a pop read head and next  */
  MP_HOOK_EXIT_FLUSH,    /* arg: the record; its thread is exiting (state
                            EXITING), before it returns its caches       */
  MP_HOOK_EXIT_DONE,     /* arg: the record; its caches are back         */
  MP_HOOK_DESTROY_WAIT,  /* arg: the record; destroy waits for its exit */
  MP_HOOK_DESTROY_STREAMS, /* arg: the pool; destroy frees stream state  */
  MP_HOOK_SLOT_FLUSH,    /* arg: the slot; the owner's flush holds its
                            entry's lock and has read the stream          */
  MP_HOOK_ENTRY_WAIT,    /* arg: the entry; its lock is busy              */
  MP_HOOK_LADDER_RUNG,   /* arg: the rung number, (void *)(uintptr_t); the
                            ladder's take failed and the rung begins     */
  MP_HOOK_REFILL,        /* arg: the record; its owner holds it (inside
                            enter/exit) and is about to refill a class   */
  MP_HOOK_REVOKE_WAIT,   /* arg: the mp_revoke; a thief waits for its
                            owner to leave                               */
  MP_HOOK_CHUNK_TAKE,    /* arg: the chunk's address; a take counted the
                            chunk busy and has not yet read its state     */
  MP_HOOK_CHUNK_UNMAP,   /* arg: the chunk's address; an unmap marked it
                            UNMAPPING and has not yet re-read busy        */
  MP_HOOK_PARK_WAIT,     /* arg: the mp_park; its lock is busy           */
  MP_HOOK_PARK_PUT,      /* arg: the mp_park; a free holds its lock, the
                            block is in, not yet visible to others       */
  MP_HOOK_PARK_TAKE,     /* arg: the mp_park; an allocation holds its
                            lock and has not yet looked                  */
  MP_HOOK_PARK_IDLE,     /* arg: the mp_park; a free asks its stream
                            whether it has passed the free             */
  MP_HOOK_PARK_PASSED,   /* arg: the mp_park; the stream was asked, the
                            runs fenced before have not been settled   */
  MP_HOOK_PARK_FLUSH,    /* arg: the mp_park; a flush (trim, the ladder,
                            release, a thread's flush) holds its lock and
                            has not yet taken anything                   */
  MP_HOOK_FENCE_PUT,     /* arg: the mp_park; a free holds its fence lock,
                            its run fenced and noted in the open batch   */
  MP_HOOK_FENCE_CLOSE,   /* arg: the mp_park; a flush holds its fence
                            lock, the open batch detached, not retired   */
  MP_HOOK_ADOPT,         /* arg: the mp_sentry; a new peak read its newest
                            tag and retired its park, not yet waited for */
  MP_HOOK_ADOPT_TAKE,    /* arg: the mp_adopt; its streams waited for, the
                            take not yet made                            */
  MP_HOOK_SLOTS_CLOSED,  /* arg: the mp_sentry; a release closed its
                            slots and has not yet counted the close      */
  MP_HOOK_CAPTURE_ASK,   /* arg: the stream; a host stream is asked
                            whether it is being captured (never)         */
  MP_HOOK_VMM_UNMAP,     /* arg: an mp_hook_unmap; the DEVICE source is
                            about to unmap one mapping; a test may set
                            `fail` to fail the call                      */
  MP_HOOK_PACK_FOUND,    /* arg: a free block's address; a capped pool's
                            pack found it, not yet claimed               */
  MP_HOOK_EXTENT_FOUND,  /* arg: the first free granule of a row an
                            extent take found, not yet claimed (extent.c) */
  MP_HOOK_XCACHE_PUT,    /* arg: the block; its thread's extent cache has
                            just kept it, the record still held (xcache.c) */
  MP_HOOK_XCACHE_REFUSED, /* arg: the record; a take of its owner was
                            refused a map (MP_TAKE_NOMAP), the record not
                            held, its extent cache not yet given back   */
  MP_HOOK_SOLO_PUT,      /* arg: the mp_park; a run free chose to give
                            its run back solo, the fence lock not yet
                            taken (park.c)                               */
  MP_HOOK_SOLO_END,      /* arg: the mp_park; a solo's end holds the
                            fence lock, its runs not yet fenced          */
  MP_HOOK_RUN_HELD,      /* arg: the run; a take got a window of free solo
                            chunks (runs.h), not yet counted (region.c)  */
};
/* MP_HOOK_VMM_UNMAP's argument: the mapping's address, and a flag a test
 * sets to make the driver call fail. */
typedef struct mp_hook_unmap {
  void *addr;
  int fail;
} mp_hook_unmap;
typedef void (*mp_hook_fn)(int point, void *arg);
/* The hook (hook.c); NULL but in tests.  Relaxed: a test sets it before
 * it starts the threads that reach the points. */
extern _Atomic(mp_hook_fn) mp_hook_current;
/* Sets (or with NULL clears) the process-wide hook.  Tests only. */
void mp_hook_set(mp_hook_fn fn);
#define MP_HOOK(point, arg)                                                    \
  do {                                                                         \
    mp_hook_fn hook_fn_ = mp_load_relaxed(&mp_hook_current);                   \
    if (MP_UNLIKELY(hook_fn_ != NULL)) hook_fn_((point), (arg));               \
  } while (0)

/* ThreadSanitizer annotations (hook.c): an edge TSan cannot see, because
 * the library that makes it is not instrumented (liburcu's publication in
 * its hash table, its call_rcu hand-off).  No-ops but under TSan. */
void mp_tsan_release(void *addr);
void mp_tsan_acquire(void *addr);

/* --------------------------------------------------------------- errors.c */

/* Sets the calling thread's last error; returns NULL for tail calls from
 * allocation functions.  Threads: any.  Orders: nothing (thread-local). */
void *mp_fail(int code);
/* Remembers the CUDA error behind the last MAGPOOL_ECUDA of this thread. */
void mp_set_cuda_error(int cuda_code);

/* Counting of calls in progress, for mp_debug_check_quiescent (stats.c;
 * the counters are the pool's dbg_calls and dbg_active, types.h).  Compiled
 * only with MP_DEBUG >= 2; every mutating public entry point brackets its
 * work with them. */
#if MP_DEBUG >= 2
#define MP_DBG_ENTER(pool)                                                     \
  do {                                                                         \
    if ((pool) != NULL) {                                                      \
      mp_fetch_add_acq_rel(&(pool)->dbg_calls, 1);                             \
      mp_fetch_add_acq_rel(&(pool)->dbg_active, 1);                            \
    }                                                                          \
  } while (0)
#define MP_DBG_LEAVE(pool)                                                     \
  do {                                                                         \
    if ((pool) != NULL) mp_fetch_add_acq_rel(&(pool)->dbg_active, -1);         \
  } while (0)
#else
#define MP_DBG_ENTER(pool) ((void)0)
#define MP_DBG_LEAVE(pool) ((void)0)
#endif

#endif /* MAGPOOL_BASE_H */
