/* bench.h - the harness shared by magpool-bench's source files.
 *
 * Map (calls run one way: bench.c -> rows_*.c -> bench_harness.c):
 *   bench.c         command line, driver (threads, start gate, timing), report
 *   bench_harness.c what every row's loop calls: clock, start gate,
 *                   error note, CPU count
 *   rows_host.c     rows that need no GPU: floor, magpool, magpool-nocache,
 *                   magpool-locked
 *   rows_cuda.c     rows that need a GPU: magpool-device, magpool-async,
 *                   cudaMallocAsync, cub, cudaMalloc (stubs without CUDA)
 *   cub_baseline.cu cub::CachingDeviceAllocator behind a C interface
 *                   (cuda_baselines.h); compiled only with CUDA
 *
 * Types and who owns them:
 *   bench_row     a static description of one allocator row (name, hooks).
 *   bench_run     one measurement: one row x one workload x one thread
 *                 count.  Owned by the driver thread; worker threads only
 *                 read it, except `stop`, which the driver writes once.
 *   bench_thread  one worker's state and results.  Written only by its
 *                 worker until the driver joins it; read by the driver after
 *                 pthread_join (which orders everything).
 *
 * Every row runs the same loop, bench_loop(), instantiated per row with
 * that row's alloc/free as inline functions, so no row pays an indirect
 * call that another row does not.
 */
#ifndef MAGPOOL_BENCH_H
#define MAGPOOL_BENCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

enum bench_workload { BENCH_FIXED1K = 0, BENCH_RANDOM = 1, BENCH_NWORKLOADS };

#define BENCH_WINDOW 64          /* live blocks per thread in `random`     */
#define BENCH_STEPS 4096         /* precomputed random steps, cycled       */
#define BENCH_MIN_SIZE 64u       /* random sizes: log-uniform ...          */
#define BENCH_MAX_SIZE (1u << 20)/* ... from 64 B to 1 MiB                 */
#define BENCH_FIXED_SIZE 1024u   /* fixed1k                                */
#define BENCH_CHUNK 64u          /* pairs between two looks at the clock   */

/* Row flags. */
#define BENCH_ROW_DEVICE 1u /* needs a GPU; only with --kind device        */
#define BENCH_ROW_SLOW 2u   /* ~tens of us per pair: look at the stop flag
                               every pair, and insist on a minimum count   */
#define BENCH_ROW_OPTIN 4u  /* runs only when --rows names it              */

/* One step of the random workload: free the block in `slot` (if any) and
 * allocate `size` bytes into it. */
typedef struct bench_step {
  uint32_t size;
  uint32_t slot;
} bench_step;

struct bench_thread;
struct bench_run;

typedef struct bench_row {
  const char *name;
  const char *what; /* one line for the report's legend */
  unsigned flags;
  /* Before the threads start: make run->ctx.  0, or -1 after printing why
   * (the row is then reported as not run). */
  int (*setup)(struct bench_run *run);
  /* After every thread has been joined. */
  void (*teardown)(struct bench_run *run);
  /* On the worker, before the window is filled: 0, or -1 after calling
   * bench_note_error().  NULL = nothing to do. */
  int (*thread_init)(struct bench_thread *t);
  /* On the worker, after the window has been freed.  NULL = nothing. */
  void (*thread_fini)(struct bench_thread *t);
  /* The measurement itself: bench_loop(t, row_alloc, row_free). */
  void (*body)(struct bench_thread *t);
  /* Names an error code stored by bench_note_error() for this row. */
  const char *(*strerror)(int code);
} bench_row;

typedef struct bench_run {
  /* Written by the driver once, read by the workers: ALIGNED so that the
   * read-mostly fields below do not share a line with it. */
  _Alignas(64) atomic_int stop;
  _Alignas(64) const bench_row *row;
  enum bench_workload workload;
  int nthreads;
  double seconds;
  size_t pool_bytes;     /* what a pool-backed row should reserve        */
  uint64_t min_pairs;    /* per thread, for BENCH_ROW_SLOW rows          */
  void *ctx;             /* row-global state made by row->setup          */
  /* Start gate: workers check in (ready++) and wait for `go`; the driver
   * opens it once every created worker has checked in.  A condvar rather
   * than a pthread barrier, so that a pthread_create failure cannot leave
   * the others waiting forever. */
  pthread_mutex_t gate_mu;
  pthread_cond_t gate_cv;
  int ready, go;         /* guarded by gate_mu */
} bench_run;

typedef struct bench_thread {
  _Alignas(64) bench_run *run;
  int tid;
  void *priv;            /* row state for this thread (e.g. a stream)    */
  bench_step *steps;     /* BENCH_STEPS precomputed steps (random)       */
  void **window;         /* BENCH_WINDOW live blocks (random)            */
  uint32_t prefill[BENCH_WINDOW]; /* sizes of the first window           */
  /* results */
  uint64_t pairs;        /* successful allocations in the timed loop     */
  uint64_t alloc_fails;  /* failed allocations in the timed loop         */
  uint64_t free_fails;   /* frees that returned an error                 */
  uint64_t setup_fails;  /* failed allocations while filling the window  */
  int nerrors;           /* calls to bench_note_error                    */
  int first_error;       /* the first error code noted, row-specific     */
  int init_failed;
  uint64_t t0_ns, t1_ns;
} bench_thread;

/* ------------------------------------------------------------------ */
/* Harness helpers (bench_harness.c)                                  */
/* ------------------------------------------------------------------ */

uint64_t bench_now_ns(void);

/* Records an error code (first one kept) for this thread's report.  Cold. */
void bench_note_error(bench_thread *t, int code);

/* Checks in at the run's start gate and waits for it to open. */
void bench_wait_start(bench_thread *t);

/* Online CPUs. */
int bench_ncpus(void);

/* Row tables (rows_host.c, rows_cuda.c). */
extern const bench_row *const bench_host_rows[];
extern const int bench_host_nrows;
extern const bench_row *const bench_device_rows[];
extern const int bench_device_nrows;

/* Is a CUDA device usable?  Returns 1, or 0 with a reason in msg.  Also
 * creates the primary context, so that no row pays for it. */
int bench_cuda_probe(char *msg, size_t msglen);

/* ------------------------------------------------------------------ */
/* The loop every row runs                                            */
/* ------------------------------------------------------------------ */

#define BENCH_COLD __attribute__((cold, noinline))
#define BENCH_LIKELY(x) __builtin_expect(!!(x), 1)
#define BENCH_UNLIKELY(x) __builtin_expect(!!(x), 0)

typedef void *(*bench_alloc_fn)(bench_thread *t, size_t size);
typedef int (*bench_free_fn)(bench_thread *t, void *ptr);

/* Stop once the driver said so and (for slow rows) this thread reached its
 * minimum.  RELAXED: the flag carries no data; the results are read after
 * pthread_join, which orders them. */
static inline int bench_should_stop(const bench_run *run, uint64_t pairs) {
  return atomic_load_explicit(&run->stop, memory_order_relaxed) &&
         pairs >= run->min_pairs;
}

/* Fills the window (random), waits at the start gate, runs the timed loop,
 * then frees the window.  `alloc` and `free_` are compile-time constants
 * at every call site: with always_inline, GCC calls them directly.
 * An allocation that fails is counted, never fatal; its slot stays empty. */
static inline __attribute__((always_inline)) void
bench_loop(bench_thread *t, bench_alloc_fn alloc, bench_free_fn free_) {
  bench_run *run = t->run;
  const unsigned chunk = (run->row->flags & BENCH_ROW_SLOW) ? 1u : BENCH_CHUNK;
  uint64_t pairs = 0, afail = 0, ffail = 0;

  if (run->workload == BENCH_FIXED1K) {
    bench_wait_start(t);
    t->t0_ns = bench_now_ns();
    do {
      for (unsigned i = 0; i < chunk; i++) {
        void *p = alloc(t, BENCH_FIXED_SIZE);
        if (BENCH_UNLIKELY(p == NULL)) {
          afail++;
          continue;
        }
        ffail += free_(t, p) != 0;
        pairs++;
      }
    } while (!bench_should_stop(run, pairs));
    t->t1_ns = bench_now_ns();
  } else {
    void **win = t->window;
    const bench_step *steps = t->steps;
    for (unsigned i = 0; i < BENCH_WINDOW; i++) {
      win[i] = alloc(t, t->prefill[i]);
      t->setup_fails += win[i] == NULL;
    }
    bench_wait_start(t);
    t->t0_ns = bench_now_ns();
    uint64_t k = 0;
    do {
      for (unsigned i = 0; i < chunk; i++) {
        const bench_step s = steps[k++ & (BENCH_STEPS - 1)];
        void *old = win[s.slot];
        if (BENCH_LIKELY(old != NULL)) ffail += free_(t, old) != 0;
        void *p = alloc(t, s.size);
        win[s.slot] = p;
        if (BENCH_UNLIKELY(p == NULL)) {
          afail++;
          continue;
        }
        pairs++;
      }
    } while (!bench_should_stop(run, pairs));
    t->t1_ns = bench_now_ns();
    for (unsigned i = 0; i < BENCH_WINDOW; i++) {
      if (win[i] != NULL) ffail += free_(t, win[i]) != 0;
      win[i] = NULL;
    }
  }
  t->pairs = pairs;
  t->alloc_fails = afail;
  t->free_fails = ffail;
}

#endif /* MAGPOOL_BENCH_H */
