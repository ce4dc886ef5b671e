/* rows_host.c - the rows that need no GPU.
 *
 *   floor           a thread-local stack pop + push of pre-filled pointers:
 *                   two real (not inlined) calls touching thread-local
 *                   memory.  The least any allocator's pair can cost.
 *   magpool         a HOST pool, default config (per-thread caches on),
 *                   magpool_alloc / magpool_free.
 *   magpool-nocache the same with thread_cache_bytes = 0: the lock-free
 *                   tree alone.
 *   magpool-trace   the magpool row recording a trace (trace_path, a
 *                   file in $TMPDIR removed after the run): the cost of
 *                   recording.  Runs only when --rows names it.
 *   magpool-locked  the same buddy tree (mp_tree_* from src/tree.h)
 *                   over a region this file manages, with this file's own
 *                   order table, all behind ONE global pthread mutex: the
 *                   lock-based baseline.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"
#if !BENCH_SHARED_LIB
#include "tree.h"
#endif
#include "magpool.h"

/* ------------------------------------------------------------------ */
/* floor                                                              */
/* ------------------------------------------------------------------ */

#define FLOOR_CAP 128 /* > BENCH_WINDOW + 1 */

static _Thread_local void *floor_stack[FLOOR_CAP];
static _Thread_local unsigned floor_top;

/* Real calls, like magpool_alloc/magpool_free are: noipa keeps GCC from
 * seeing through them (a pop followed by a push of the same pointer is
 * otherwise a no-op it may delete). */
#if defined(__GNUC__) && !defined(__clang__)
#define FLOOR_OPAQUE __attribute__((noinline, noipa))
#else
#define FLOOR_OPAQUE __attribute__((noinline))
#endif

FLOOR_OPAQUE static void *floor_pop(size_t size) {
  (void)size;
  if (BENCH_UNLIKELY(floor_top == 0)) return NULL;
  return floor_stack[--floor_top];
}

FLOOR_OPAQUE static int floor_push(void *ptr) {
  if (BENCH_UNLIKELY(floor_top == FLOOR_CAP)) return -1;
  floor_stack[floor_top++] = ptr;
  return 0;
}

static int floor_thread_init(bench_thread *t) {
  /* The pointers are never dereferenced; they only have to be distinct. */
  char *buf = malloc((size_t)FLOOR_CAP * 64);
  if (buf == NULL) {
    bench_note_error(t, MAGPOOL_ENOMEM);
    return -1;
  }
  t->priv = buf;
  floor_top = 0;
  for (unsigned i = 0; i < FLOOR_CAP; i++) floor_stack[floor_top++] = buf + (size_t)i * 64;
  return 0;
}

static void floor_thread_fini(bench_thread *t) {
  free(t->priv);
  t->priv = NULL;
  floor_top = 0;
}

static inline void *floor_alloc(bench_thread *t, size_t size) {
  void *p = floor_pop(size);
  if (BENCH_UNLIKELY(p == NULL)) bench_note_error(t, MAGPOOL_ENOMEM);
  return p;
}

static inline int floor_free(bench_thread *t, void *ptr) {
  int rc = floor_push(ptr);
  if (BENCH_UNLIKELY(rc != 0)) bench_note_error(t, MAGPOOL_EINVAL);
  return rc;
}

static void floor_body(bench_thread *t) { bench_loop(t, floor_alloc, floor_free); }

static int floor_setup(bench_run *run) {
  (void)run;
  return 0;
}

static void floor_teardown(bench_run *run) { (void)run; }

static const bench_row row_floor = {
    .name = "floor",
    .what = "thread-local stack pop+push of pre-filled pointers (2 real calls)",
    .setup = floor_setup,
    .teardown = floor_teardown,
    .thread_init = floor_thread_init,
    .thread_fini = floor_thread_fini,
    .body = floor_body,
    .strerror = magpool_strerror,
};

/* ------------------------------------------------------------------ */
/* magpool, magpool-nocache: HOST pools through the public API        */
/* ------------------------------------------------------------------ */

static char trace_file[512];

static int magpool_row_setup(bench_run *run, size_t thread_cache_bytes, int cache_default) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.trace_path = NULL;
  if (run->row->flags & BENCH_ROW_OPTIN) { /* magpool-trace */
    const char *dir = getenv("TMPDIR");
    snprintf(trace_file, sizeof trace_file, "%s/magpool-bench-%ld.trace",
             dir != NULL ? dir : "/tmp", (long)getpid());
    cfg.trace_path = trace_file;
  }
  cfg.kind = MAGPOOL_MEM_HOST;
  cfg.pool_size = run->pool_bytes;
  cfg.allow_growth = 1; /* a request that does not fit is counted, never fatal */
  if (!cache_default) cfg.thread_cache_bytes = thread_cache_bytes;
  magpool_t *pool = NULL;
  int rc = magpool_create(&cfg, &pool);
  if (rc != 0) {
    fprintf(stderr, "magpool-bench: %s: magpool_create(HOST, %zu MiB): %s (%d)\n",
            run->row->name, cfg.pool_size >> 20, magpool_strerror(rc), rc);
    return -1;
  }
  run->ctx = pool;
  return 0;
}

static int magpool_setup(bench_run *run) { return magpool_row_setup(run, 0, 1); }
static int magpool_nocache_setup(bench_run *run) { return magpool_row_setup(run, 0, 0); }

static void magpool_teardown(bench_run *run) {
  int rc = magpool_destroy((magpool_t *)run->ctx);
  if (rc != 0)
    fprintf(stderr, "magpool-bench: %s: magpool_destroy: %s (%d)\n", run->row->name,
            magpool_strerror(rc), rc);
  if (run->row->flags & BENCH_ROW_OPTIN) unlink(trace_file);
  run->ctx = NULL;
}

static inline void *magpool_row_alloc(bench_thread *t, size_t size) {
  void *p = magpool_alloc((magpool_t *)t->run->ctx, size);
  if (BENCH_UNLIKELY(p == NULL)) bench_note_error(t, magpool_last_error());
  return p;
}

static inline int magpool_row_free(bench_thread *t, void *ptr) {
  int rc = magpool_free((magpool_t *)t->run->ctx, ptr);
  if (BENCH_UNLIKELY(rc != 0)) bench_note_error(t, rc);
  return rc;
}

static void magpool_body(bench_thread *t) { bench_loop(t, magpool_row_alloc, magpool_row_free); }

static const bench_row row_magpool = {
    .name = "magpool",
    .what = "HOST pool, default config (thread caches on): magpool_alloc/magpool_free",
    .setup = magpool_setup,
    .teardown = magpool_teardown,
    .body = magpool_body,
    .strerror = magpool_strerror,
};

static const bench_row row_magpool_trace = {
    .name = "magpool-trace",
    .what = "the magpool row recording a trace (trace_path in $TMPDIR)",
    .flags = BENCH_ROW_OPTIN,
    .setup = magpool_setup,
    .teardown = magpool_teardown,
    .body = magpool_body,
    .strerror = magpool_strerror,
};

static const bench_row row_magpool_nocache = {
    .name = "magpool-nocache",
    .what = "HOST pool, thread_cache_bytes = 0: the lock-free buddy tree alone",
    .setup = magpool_nocache_setup,
    .teardown = magpool_teardown,
    .body = magpool_body,
    .strerror = magpool_strerror,
};

#if !BENCH_SHARED_LIB /* the tree is hidden in the shared library */
/* ------------------------------------------------------------------ */
/* magpool-locked: the same tree behind one mutex                     */
/* ------------------------------------------------------------------ */

#define LOCKED_SHIFT 6 /* min_block 64 */

typedef struct locked_pool {
  pthread_mutex_t mu; /* guards tree and order: every call takes it */
  mp_tree tree;
  char *base;         /* the region: mapped, never touched          */
  size_t bytes;
  uint64_t nunits;
  uint8_t *order;     /* per unit: 0 = no live block starts here,
                         else the live block's order + 1            */
} locked_pool;

static int locked_setup(bench_run *run) {
  locked_pool *lp = calloc(1, sizeof *lp);
  if (lp == NULL) {
    fprintf(stderr, "magpool-bench: magpool-locked: out of memory\n");
    return -1;
  }
  lp->bytes = run->pool_bytes & ~(((size_t)1 << LOCKED_SHIFT) - 1);
  lp->nunits = lp->bytes >> LOCKED_SHIFT;
  void *base = mmap(NULL, lp->bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    fprintf(stderr, "magpool-bench: magpool-locked: mmap(%zu MiB): %s\n", lp->bytes >> 20,
            strerror(errno));
    free(lp);
    return -1;
  }
  lp->base = base;
  lp->order = calloc(lp->nunits, 1);
  int rc = lp->order ? mp_tree_init(&lp->tree, lp->nunits) : MAGPOOL_ENOMEM;
  if (rc != 0) {
    fprintf(stderr, "magpool-bench: magpool-locked: mp_tree_init(%llu units): %s (%d)\n",
            (unsigned long long)lp->nunits, magpool_strerror(rc), rc);
    free(lp->order);
    munmap(lp->base, lp->bytes);
    free(lp);
    return -1;
  }
  pthread_mutex_init(&lp->mu, NULL);
  run->ctx = lp;
  return 0;
}

static void locked_teardown(bench_run *run) {
  locked_pool *lp = run->ctx;
  uint64_t free_units = 0;
  /* Every block was freed: the tree must hold all its units again. */
  mp_tree_coalesce_all(&lp->tree);
  if (mp_tree_check(&lp->tree, &free_units) != 0 || free_units != lp->nunits)
    fprintf(stderr,
            "magpool-bench: magpool-locked: tree check after the run: %llu of %llu "
            "units free (expected all)\n",
            (unsigned long long)free_units, (unsigned long long)lp->nunits);
  mp_tree_fini(&lp->tree);
  pthread_mutex_destroy(&lp->mu);
  free(lp->order);
  munmap(lp->base, lp->bytes);
  free(lp);
  run->ctx = NULL;
}

static inline void *locked_alloc(bench_thread *t, size_t size) {
  locked_pool *lp = t->run->ctx;
  size_t units = (size + ((size_t)1 << LOCKED_SHIFT) - 1) >> LOCKED_SHIFT;
  unsigned order = mp_log2_ceil(units ? units : 1);
  pthread_mutex_lock(&lp->mu);
  int64_t off = mp_tree_alloc(&lp->tree, order);
  if (BENCH_LIKELY(off >= 0)) lp->order[off] = (uint8_t)(order + 1);
  pthread_mutex_unlock(&lp->mu);
  if (BENCH_UNLIKELY(off < 0)) {
    bench_note_error(t, MAGPOOL_ENOMEM);
    return NULL;
  }
  return lp->base + ((size_t)off << LOCKED_SHIFT);
}

static inline int locked_free(bench_thread *t, void *ptr) {
  locked_pool *lp = t->run->ctx;
  uint64_t off = (uint64_t)((char *)ptr - lp->base) >> LOCKED_SHIFT;
  pthread_mutex_lock(&lp->mu);
  unsigned o = lp->order[off];
  if (BENCH_LIKELY(o != 0)) {
    lp->order[off] = 0;
    mp_tree_free(&lp->tree, off, o - 1);
  }
  pthread_mutex_unlock(&lp->mu);
  if (BENCH_UNLIKELY(o == 0)) {
    bench_note_error(t, MAGPOOL_EINVAL);
    return MAGPOOL_EINVAL;
  }
  return 0;
}

static void locked_body(bench_thread *t) { bench_loop(t, locked_alloc, locked_free); }

static const bench_row row_locked = {
    .name = "magpool-locked",
    .what = "the same buddy tree (mp_tree_alloc/mp_tree_free) behind one global pthread mutex",
    .setup = locked_setup,
    .teardown = locked_teardown,
    .body = locked_body,
    .strerror = magpool_strerror,
};
#endif

/* ------------------------------------------------------------------ */

const bench_row *const bench_host_rows[] = {
    &row_floor,
    &row_magpool,
    &row_magpool_nocache,
    &row_magpool_trace,
#if !BENCH_SHARED_LIB
    &row_locked,
#endif
};
const int bench_host_nrows = (int)(sizeof bench_host_rows / sizeof bench_host_rows[0]);
