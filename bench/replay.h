/* replay.h - what magpool-replay's source files share (docs/replay.md).
 *
 * Map (calls run one way: replay.c -> replay_magpool.c / replay_cuda.c ->
 * replay_trace.c):
 *   replay.c          command line, the loop over traces x allocators x
 *                     modes, the REPLAY and SUMMARY lines
 *   replay_trace.c    loading a trace (plain text or gzip) into compact
 *                     arrays; the clock; the per-pass bookkeeping helpers
 *   replay_magpool.c  the magpool runner (HOST, DEVICE, PINNED pools; sync
 *                     and async)
 *   replay_cuda.c     the CUDA side: device probe, CUDA streams, and the
 *                     peers cudaMallocAsync, cudaMalloc and cub (stubs
 *                     that say so when built without CUDA)
 *   replay_cub.cu     cub::CachingDeviceAllocator behind a C interface
 *                     (only with CUDA)
 *   replay_gate.cu    --lag on CUDA streams: gate kernels (only with CUDA)
 *   replay_threads.c  --threads: a pass replayed by one thread per trace
 *                     stream (every runner calls it)
 *
 * A loaded trace is two arrays: one 8-byte event per line, and one size per
 * allocation.  Every allocation event gets its own slot (its ordinal among
 * the allocations); a free names the slot of the allocation it frees, so
 * the replay needs no lookup: ptrs[slot] holds the live pointer.
 *
 * Replay is single-threaded, one thread issuing every event in trace order,
 * unless --threads asks for a thread per stream (replay_threads.c).
 */
#ifndef MAGPOOL_REPLAY_H
#define MAGPOOL_REPLAY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define REPLAY_MAX_STREAMS 1024u  /* stream numbers 0 .. 1023             */
#define REPLAY_MAX_SLOTS 0xFFFFFFFFu /* allocations per trace             */

/* One event.  op_stream: bit 31 set for a free; bits 0..30 the stream
 * number.  slot: the allocation's slot (see above). */
typedef struct replay_event {
  uint32_t op_stream;
  uint32_t slot;
} replay_event;

#define REPLAY_FREE_BIT 0x80000000u
static inline int replay_is_free(replay_event e) { return (e.op_stream & REPLAY_FREE_BIT) != 0; }
static inline uint32_t replay_stream(replay_event e) { return e.op_stream & ~REPLAY_FREE_BIT; }

typedef struct replay_trace {
  char *path;
  char *name;            /* base name without .trace.gz, .gz or .trace   */
  replay_event *ev;
  size_t nevents;
  uint64_t *size;        /* by slot                                      */
  size_t nslots;         /* allocation events                            */
  uint32_t nstreams;     /* highest stream number + 1                    */
  uint64_t peak_live;    /* of the whole trace, requested bytes          */
  size_t unknown_frees;  /* frees of IDs never allocated: dropped        */
} replay_trace;

/* Loads path (plain text, or gzip: told by its first two bytes, and
 * decompressed through `gzip -dc`).  0, or -1 after printing why. */
int replay_trace_load(const char *path, replay_trace *out);
void replay_trace_free(replay_trace *t);

enum replay_kind { REPLAY_HOST = 0, REPLAY_DEVICE = 1, REPLAY_PINNED = 2 };
enum replay_mode { REPLAY_SYNC = 0, REPLAY_ASYNC = 1 };
enum replay_alloc {
  REPLAY_MAGPOOL = 0,
  REPLAY_CUDA_MALLOC_ASYNC,
  REPLAY_CUDA_MALLOC,
  REPLAY_CUB,
  REPLAY_NALLOCS
};

extern const char *const replay_alloc_names[REPLAY_NALLOCS];
extern const char *const replay_mode_names[2];

typedef struct replay_opts {
  enum replay_kind kind;
  size_t pool_size;
  size_t cap;
  int passes;
  FILE *csv;             /* NULL: no per-event rows                       */
  int stats;             /* --stats: a STATS line after each magpool pass */
  size_t lag;            /* --lag: streams held N..2N events behind       */
  size_t evict;          /* --evict: bytes touched before each event (0:
                            none); each call is then timed alone          */
  volatile unsigned char *evict_buf;
  int threads;           /* --threads: a thread per trace stream          */
  size_t window;         /* --window: events a thread may run ahead       */
} replay_opts;

/* The outcome of one pass. */
enum replay_status {
  REPLAY_COMPLETED = 0,
  REPLAY_OOM,            /* allocation event `fail_event` failed          */
  REPLAY_SKIPPED,        /* this allocator does not run in this setting   */
  REPLAY_ERROR           /* a free or a CUDA call failed at `fail_event`  */
};

typedef struct replay_result {
  enum replay_status status;
  size_t fail_event;
  uint64_t peak_live;      /* bytes asked for, live at once, this pass    */
  uint64_t peak_reserved;  /* bytes the allocator held at most, this pass */
  uint64_t events;         /* events issued (the failed one included)     */
  uint64_t ns;             /* wall time of the events                     */
  /* magpool only, this pass's share of the pool's counters (--stats). */
  uint64_t grows, chunk_maps, chunk_unmaps, chunk_moves, stream_batches;
  uint64_t pending_at_peak; /* pending_at_peak_bytes after the pass           */
} replay_result;

/* A runner replays trace t `o->passes` times and fills res[0 .. passes-1].
 * It returns 0, or -1 after printing why it could not run at all (then
 * res is not filled). */
int replay_run_magpool(const replay_trace *t, const replay_opts *o, enum replay_mode mode,
                       replay_result *res);
int replay_run_cuda_malloc_async(const replay_trace *t, const replay_opts *o,
                                 enum replay_mode mode, replay_result *res);
int replay_run_cuda_malloc(const replay_trace *t, const replay_opts *o, enum replay_mode mode,
                           replay_result *res);
int replay_run_cub(const replay_trace *t, const replay_opts *o, enum replay_mode mode,
                   replay_result *res);

/* --threads (replay_threads.c).  A runner passes the allocator's calls:
 *   alloc  allocates `size` bytes for an event of trace stream `stream`:
 *          REPLAY_COMPLETED and *out, or the pass's status (REPLAY_OOM,
 *          REPLAY_ERROR), found on the calling thread;
 *   free   frees p (NULL if its allocation returned NULL) for an event of
 *          `stream`: 0, or nonzero on an error.
 * Both are called from the stream's worker thread, concurrently with the
 * other streams' workers.
 *   replay_threads_new   starts a worker per stream that has events (NULL
 *                        after printing why); kept for every pass, so
 *                        the later passes find the threads' caches warm
 *   replay_threads_pass  one pass: fills status, fail_event, events, ns
 *                        and peak_live of r (not peak_reserved)
 *   replay_threads_take  after a pass, the pointer still live in `slot`
 *                        (NULL if none), which the runner frees
 *   replay_threads_free  joins the workers and frees everything */
typedef struct replay_tops {
  enum replay_status (*alloc)(void *ctx, uint64_t size, uint32_t stream, void **out);
  int (*free)(void *ctx, void *p, uint32_t stream);
  void *ctx;
} replay_tops;
typedef struct replay_threads replay_threads;
replay_threads *replay_threads_new(const replay_trace *t, const replay_opts *o,
                                   const replay_tops *ops);
void replay_threads_pass(replay_threads *x, replay_result *r);
void *replay_threads_take(replay_threads *x, size_t slot);
void replay_threads_free(replay_threads *x);

/* 1 if a CUDA device is usable (and makes its primary context), else 0.
 * Always 0 in a build without CUDA. */
int replay_cuda_present(void);

/* CUDA streams for the magpool runner's async mode on DEVICE and PINNED
 * pools: n non-blocking streams into out[].  0, or -1 after printing why. */
int replay_cuda_streams_create(void **out, uint32_t n);
int replay_cuda_streams_sync(void **s, uint32_t n);
void replay_cuda_streams_destroy(void **s, uint32_t n);

/* --lag on CUDA streams (replay_gate.cu; a build without CUDA has none):
 * gate kernels hold each stream until the replay opens its mark, or for
 * 2 ms at most, as the host streams' marks do (replay_magpool.c).
 *   replay_gates_new     a mapped pinned word for the marks, opened 0
 *                        (NULL after printing why)
 *   replay_gates_mark    a gate for `mark` on each of the n streams, then
 *                        opens mark - 1 (0, or -1 after printing why)
 *   replay_gates_set     opens every mark up to `opened` (UINT64_MAX: all;
 *                        0 at a pass's start, once the streams are idle) */
typedef struct replay_gates replay_gates;
#ifdef __cplusplus
extern "C" {
#endif
replay_gates *replay_gates_new(void);
int replay_gates_mark(replay_gates *g, void **streams, uint32_t n, uint64_t mark);
void replay_gates_set(replay_gates *g, uint64_t opened);
void replay_gates_free(replay_gates *g);
#ifdef __cplusplus
}
#endif

/* ------------------------------------------------------------------ */
/* Helpers (replay_trace.c)                                           */
/* ------------------------------------------------------------------ */

uint64_t replay_now_ns(void);

/* --evict B (replay_opts.evict): the program's own work between two
 * allocator calls.  Before each event a runner touches (reads and writes)
 * one byte of every cache line of a B-byte buffer, replay_evict, which
 * pushes the allocator's data out of the caches as a real program's work
 * does; then it times the call alone:
 *   replay_clock c; replay_clock_start(&c);      at the pass's start
 *   uint64_t k = replay_call_start(o);          before each call
 *   replay_call_end(o, &c, k);                  after it
 *   r->ns = replay_clock_ns(o, &c);              at the pass's end
 * Ticks are the TSC on x86-64 (CLOCK_MONOTONIC elsewhere), turned into ns
 * by the pass's own ratio of ticks to wall time.  Without --evict the
 * calls are not timed one by one, and replay_clock_ns is the pass's wall
 * time, as before. */
typedef struct replay_clock {
  uint64_t ns0, tick0, ticks;
} replay_clock;

uint64_t replay_tick(void);
void replay_evict(const replay_opts *o);
void replay_clock_start(replay_clock *c);
uint64_t replay_clock_ns(const replay_opts *o, const replay_clock *c);

static inline uint64_t replay_call_start(const replay_opts *o) {
  if (o->evict == 0) return 0;
  replay_evict(o);
  return replay_tick();
}

static inline void replay_call_end(const replay_opts *o, replay_clock *c, uint64_t k) {
  if (o->evict != 0) c->ticks += replay_tick() - k;
}

/* One CSV row (the header is written by replay.c). */
void replay_csv_row(FILE *f, size_t event, uint64_t live, uint64_t reserved, const char *alloc,
                    const char *trace, int pass);

/* Fills every pass of res with `status` and zeros. */
void replay_fill(replay_result *res, int passes, enum replay_status status);

#endif /* MAGPOOL_REPLAY_H */
