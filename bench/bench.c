/* bench.c - magpool-bench: command line, driver and report.
 *
 *   magpool-bench [--kind host|device] [--workload fixed1k|random|all]
 *                 [--threads 1,2,4,8,16] [--seconds S] [--rows a,b,...]
 *
 * Every row runs at every thread count of the list, in this one process,
 * so the baselines (floor, a locked variant, the CUDA allocators) always
 * come from the same run as magpool (STYLE 14).  The threads of one
 * measurement are released together from a start gate, run for S seconds,
 * and count the alloc+free pairs they completed.
 *
 *   ns_per_pair  = wall ns * threads / total pairs   (per-thread latency)
 *   mpairs_per_s = total pairs / wall us             (aggregate throughput)
 *   scaling      = throughput at T / (T * throughput at 1)
 *
 * Output: a table per workload, then one line per measurement:
 *   SUMMARY allocator=NAME workload=W threads=T ns_per_pair=X mpairs_per_s=Y
 * followed by RATIO, SCALING, TARGET (informational: nothing here asserts
 * a timing) and, if any allocation failed, FAILURES lines.
 *
 * Exit status: 0; 2 for a usage error; 1 if a row could not be set up or
 * a worker could not start (allocation failures inside a run are counted
 * and reported, not fatal); 3 if a measurement hung (its workers had not
 * finished HANG_GRACE_S seconds after the stop): what was measured before
 * it is still reported.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "magpool.h"

#define MAX_THREAD_COUNTS 16
#define MAX_ROWS 16
#define MAX_THREADS 1024
#define MIB ((size_t)1 << 20)

static void sleep_seconds(double s) {
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* splitmix64: a fixed seed per thread, the same for every row. */
static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* log-uniform in [BENCH_MIN_SIZE, BENCH_MAX_SIZE] */
static uint32_t random_size(uint64_t *s) {
  double u = (double)(splitmix64(s) >> 11) * 0x1.0p-53; /* [0, 1) */
  double lo = log2((double)BENCH_MIN_SIZE), hi = log2((double)BENCH_MAX_SIZE);
  double v = exp2(lo + u * (hi - lo));
  uint32_t n = (uint32_t)v;
  if (n < BENCH_MIN_SIZE) n = BENCH_MIN_SIZE;
  if (n > BENCH_MAX_SIZE) n = BENCH_MAX_SIZE;
  return n;
}

static void make_steps(bench_thread *t) {
  uint64_t seed = 0x6D61677030304221ull ^ ((uint64_t)(t->tid + 1) * 0xD1B54A32D192ED03ull);
  for (unsigned i = 0; i < BENCH_WINDOW; i++) t->prefill[i] = random_size(&seed);
  for (unsigned i = 0; i < BENCH_STEPS; i++) {
    t->steps[i].slot = (uint32_t)(splitmix64(&seed) >> 58); /* 0..63 */
    t->steps[i].size = random_size(&seed);
  }
}

/* ------------------------------------------------------------------ */
/* One measurement                                                    */
/* ------------------------------------------------------------------ */

enum { RES_NONE = 0, RES_OK, RES_FAILED, RES_HUNG };

/* A worker that has not finished this long after it was told to stop (or a
 * gate that has not filled this long after the threads were started) is
 * taken as hung: the bench reports what it has and exits, rather than
 * losing every figure to an outer timeout. */
#define HANG_GRACE_S 30

typedef struct result {
  int status;
  uint64_t pairs, alloc_fails, free_fails, setup_fails;
  uint64_t wall_ns;
  double ns_per_pair, mpairs_per_s;
  char error[160]; /* first error, if any */
} result;

static void *worker_main(void *arg) {
  bench_thread *t = arg;
  const bench_row *row = t->run->row;
  if (row->thread_init != NULL && row->thread_init(t) != 0) {
    t->init_failed = 1;
    bench_wait_start(t);
    return NULL;
  }
  row->body(t);
  if (row->thread_fini != NULL) row->thread_fini(t);
  return NULL;
}

static size_t pool_bytes_for(enum bench_workload w, int nthreads) {
  /* fixed1k: one live KiB per thread plus caches; the default 256 MiB is
   * plenty.  random: up to 64 x 1 MiB live per thread plus caches and
   * slack; the pools may also grow. */
  size_t b = 256 * MIB;
  if (w == BENCH_RANDOM && (size_t)nthreads * 64 * MIB > b) b = (size_t)nthreads * 64 * MIB;
  return b;
}

static void run_one(const bench_row *row, enum bench_workload w, int nthreads, double seconds,
                    result *res) {
  memset(res, 0, sizeof *res);
  res->status = RES_FAILED;

  bench_run *run = aligned_alloc(64, sizeof(bench_run));
  bench_thread *th = aligned_alloc(64, sizeof(bench_thread) * (size_t)nthreads);
  pthread_t *tids = calloc((size_t)nthreads, sizeof *tids);
  if (run == NULL || th == NULL || tids == NULL) {
    snprintf(res->error, sizeof res->error, "out of memory for %d threads", nthreads);
    free(run), free(th), free(tids);
    return;
  }
  memset(run, 0, sizeof *run);
  memset(th, 0, sizeof(bench_thread) * (size_t)nthreads);
  atomic_init(&run->stop, 0);
  run->row = row;
  run->workload = w;
  run->nthreads = nthreads;
  run->seconds = seconds;
  run->pool_bytes = pool_bytes_for(w, nthreads);
  /* Slow rows (cudaMalloc): a few hundred pairs in all, whatever S is. */
  run->min_pairs = (row->flags & BENCH_ROW_SLOW) ? (256u + (unsigned)nthreads - 1) / (unsigned)nthreads : 0;
  pthread_mutex_init(&run->gate_mu, NULL);
  pthread_cond_init(&run->gate_cv, NULL);

  if (row->setup(run) != 0) {
    snprintf(res->error, sizeof res->error, "setup failed (see the message above)");
    goto out_gate;
  }

  int created = 0, spawn_err = 0;
  for (int i = 0; i < nthreads; i++) {
    th[i].run = run;
    th[i].tid = i;
    if (w == BENCH_RANDOM) {
      th[i].steps = malloc(sizeof(bench_step) * BENCH_STEPS);
      th[i].window = calloc(BENCH_WINDOW, sizeof(void *));
      if (th[i].steps == NULL || th[i].window == NULL) {
        spawn_err = ENOMEM;
        break;
      }
      make_steps(&th[i]);
    }
    spawn_err = pthread_create(&tids[i], NULL, worker_main, &th[i]);
    if (spawn_err != 0) break;
    created++;
  }

  /* Open the gate once every created worker has checked in (after its
   * thread_init and window fill).  If a worker could not be created, the
   * others still run, briefly, so that they can clean up. */
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += HANG_GRACE_S;
  int hung = 0;
  pthread_mutex_lock(&run->gate_mu);
  while (run->ready < created && !hung)
    hung = pthread_cond_timedwait(&run->gate_cv, &run->gate_mu, &deadline) == ETIMEDOUT;
  run->go = 1;
  pthread_cond_broadcast(&run->gate_cv);
  pthread_mutex_unlock(&run->gate_mu);

  if (spawn_err == 0 && !hung) sleep_seconds(seconds);
  /* RELAXED: the flag carries no data; pthread_join orders the results. */
  atomic_store_explicit(&run->stop, 1, memory_order_relaxed);
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += HANG_GRACE_S;
  for (int i = 0; i < created && !hung; i++)
    hung = pthread_timedjoin_np(tids[i], NULL, &deadline) == ETIMEDOUT;
  if (hung) {
    /* Leave everything as it is: the workers may still use it. */
    res->status = RES_HUNG;
    snprintf(res->error, sizeof res->error,
             "hung: workers still running %d s after they were told to stop (or to start)",
             HANG_GRACE_S);
    return;
  }

  row->teardown(run);

  uint64_t t0 = UINT64_MAX, t1 = 0;
  int init_failed = 0;
  for (int i = 0; i < created; i++) {
    const bench_thread *t = &th[i];
    if (t->init_failed) {
      init_failed++;
    } else {
      if (t->t0_ns < t0) t0 = t->t0_ns;
      if (t->t1_ns > t1) t1 = t->t1_ns;
    }
    res->pairs += t->pairs;
    res->alloc_fails += t->alloc_fails;
    res->free_fails += t->free_fails;
    res->setup_fails += t->setup_fails;
    if (t->nerrors > 0 && res->error[0] == '\0')
      snprintf(res->error, sizeof res->error, "thread %d: %s (%d)", t->tid,
               row->strerror(t->first_error), t->first_error);
  }
  if (spawn_err != 0) {
    snprintf(res->error, sizeof res->error, "starting worker %d of %d: %s", created + 1,
             nthreads, strerror(spawn_err));
  } else if (init_failed) {
    char first[sizeof res->error];
    memcpy(first, res->error, sizeof first);
    snprintf(res->error, sizeof res->error, "%d worker(s) failed to initialise: %.100s",
             init_failed, first);
  } else if (res->pairs == 0 || t1 <= t0) {
    if (res->error[0] == '\0') snprintf(res->error, sizeof res->error, "no pair completed");
  } else {
    res->status = RES_OK;
    res->wall_ns = t1 - t0;
    res->ns_per_pair = (double)res->wall_ns * nthreads / (double)res->pairs;
    res->mpairs_per_s = (double)res->pairs * 1e3 / (double)res->wall_ns;
  }

  for (int i = 0; i < nthreads; i++) {
    free(th[i].steps);
    free(th[i].window);
  }
out_gate:
  pthread_cond_destroy(&run->gate_cv);
  pthread_mutex_destroy(&run->gate_mu);
  free(tids);
  free(th);
  free(run);
}

/* ------------------------------------------------------------------ */
/* Command line                                                       */
/* ------------------------------------------------------------------ */

static const char *const workload_names[BENCH_NWORKLOADS] = {"fixed1k", "random"};
static const char *const workload_what[BENCH_NWORKLOADS] = {
    "each thread loops alloc 1 KiB + free",
    "each thread keeps 64 live blocks, log-uniform 64 B..1 MiB; "
    "each step frees one at random and allocates a new one"};

typedef struct options {
  int device;
  int workloads[BENCH_NWORKLOADS];
  int threads[MAX_THREAD_COUNTS];
  int nthreads;
  double seconds;
  const char *rows; /* comma list, or NULL for all */
} options;

static void usage(FILE *f) {
  fprintf(f,
          "usage: magpool-bench [--kind host|device] [--workload fixed1k|random|all]\n"
          "                     [--threads N[,N...]] [--seconds S] [--rows NAME[,NAME...]]\n"
          "\n"
          "  --kind       host (default): rows that need no GPU; device: also the CUDA\n"
          "               rows (falls back to host rows, exit 0, when no GPU is usable)\n"
          "  --workload   fixed1k, random or all (default all)\n"
          "  --threads    thread counts, e.g. 1,2,4,8,16 (default: powers of two up\n"
          "               to the online CPUs, at most 16)\n"
          "  --seconds    seconds per measurement (default 1)\n"
          "  --rows       only these rows (default all but magpool-trace): floor,\n"
          "               magpool, magpool-nocache, magpool-trace (the magpool row\n"
          "               recording a trace, to $TMPDIR), magpool-locked,\n"
          "               magpool-device, magpool-async,\n"
          "               magpool-async-nocheck, cudaMallocAsync,\n"
          "               cub, cudaMalloc\n");
}

static int parse_threads(const char *s, options *o) {
  o->nthreads = 0;
  while (*s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || errno || v < 1 || v > MAX_THREADS) return -1;
    if (o->nthreads == MAX_THREAD_COUNTS) return -1;
    o->threads[o->nthreads++] = (int)v;
    s = end;
    if (*s == ',') s++;
    else if (*s != '\0') return -1;
  }
  return o->nthreads > 0 ? 0 : -1;
}

static int parse_args(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->workloads[BENCH_FIXED1K] = o->workloads[BENCH_RANDOM] = 1;
  o->seconds = 1.0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    }
    /* --opt value and --opt=value */
    const char *eq = strchr(a, '=');
    char name[32];
    if (eq != NULL && (size_t)(eq - a) < sizeof name) {
      memcpy(name, a, (size_t)(eq - a));
      name[eq - a] = '\0';
      v = eq + 1;
    } else {
      snprintf(name, sizeof name, "%s", a);
      if (i + 1 < argc) v = argv[++i];
    }
    if (v == NULL) {
      fprintf(stderr, "magpool-bench: %s needs a value\n", name);
      return -1;
    }
    if (!strcmp(name, "--kind")) {
      if (!strcmp(v, "host")) o->device = 0;
      else if (!strcmp(v, "device")) o->device = 1;
      else goto bad;
    } else if (!strcmp(name, "--workload")) {
      o->workloads[BENCH_FIXED1K] = !strcmp(v, "fixed1k") || !strcmp(v, "all");
      o->workloads[BENCH_RANDOM] = !strcmp(v, "random") || !strcmp(v, "all");
      if (!o->workloads[BENCH_FIXED1K] && !o->workloads[BENCH_RANDOM]) goto bad;
    } else if (!strcmp(name, "--threads")) {
      if (parse_threads(v, o) != 0) goto bad;
    } else if (!strcmp(name, "--seconds")) {
      char *end;
      o->seconds = strtod(v, &end);
      if (end == v || *end != '\0' || !(o->seconds > 0) || o->seconds > 3600) goto bad;
    } else if (!strcmp(name, "--rows")) {
      o->rows = v;
    } else {
      fprintf(stderr, "magpool-bench: unknown option %s\n", name);
      return -1;
    }
    continue;
  bad:
    fprintf(stderr, "magpool-bench: bad value for %s: '%s'\n", name, v);
    return -1;
  }
  if (o->nthreads == 0) {
    int n = bench_ncpus();
    if (n > 16) n = 16;
    for (int t = 1; t <= n; t *= 2) o->threads[o->nthreads++] = t;
  }
  return 0;
}

static int row_selected(const options *o, const bench_row *row) {
  const char *name = row->name;
  if (o->rows == NULL) return !(row->flags & BENCH_ROW_OPTIN);
  size_t n = strlen(name);
  for (const char *s = o->rows; *s;) {
    const char *e = strchr(s, ',');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    if (len == n && !strncmp(s, name, n)) return 1;
    if (e == NULL) break;
    s = e + 1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* Report                                                             */
/* ------------------------------------------------------------------ */

typedef struct table {
  const bench_row *rows[MAX_ROWS];
  int nrows;
  const options *o;
  result res[MAX_ROWS][BENCH_NWORKLOADS][MAX_THREAD_COUNTS];
} table;

static int row_index(const table *tb, const char *name) {
  for (int r = 0; r < tb->nrows; r++)
    if (!strcmp(tb->rows[r]->name, name)) return r;
  return -1;
}

static int thread_index(const options *o, int nthreads) {
  for (int i = 0; i < o->nthreads; i++)
    if (o->threads[i] == nthreads) return i;
  return -1;
}

static const result *get(const table *tb, int r, int w, int ti) {
  if (r < 0 || ti < 0) return NULL;
  const result *x = &tb->res[r][w][ti];
  return x->status == RES_OK ? x : NULL;
}

/* throughput at T / (T * throughput at 1); < 0 if not measured */
static double scaling(const table *tb, int r, int w, int ti) {
  const result *one = get(tb, r, w, thread_index(tb->o, 1));
  const result *x = get(tb, r, w, ti);
  if (one == NULL || x == NULL) return -1;
  return x->mpairs_per_s / ((double)tb->o->threads[ti] * one->mpairs_per_s);
}

static void print_table(const table *tb, int w) {
  const options *o = tb->o;
  int fl = row_index(tb, "floor"), cma = row_index(tb, "cudaMallocAsync");
  printf("\n== %s: %s; %.2f s per measurement ==\n", workload_names[w], workload_what[w],
         o->seconds);
  printf("%-16s %7s %12s %11s %9s %9s %8s %10s\n", "allocator", "threads", "ns/pair",
         "Mpairs/s", "x floor", cma >= 0 ? "vs cMA" : "", "scaling", "fails");
  for (int r = 0; r < tb->nrows; r++) {
    for (int ti = 0; ti < o->nthreads; ti++) {
      const result *x = &tb->res[r][w][ti];
      if (x->status == RES_NONE) continue;
      if (x->status != RES_OK) {
        printf("%-16s %7d   not run: %s\n", tb->rows[r]->name, o->threads[ti], x->error);
        continue;
      }
      const result *f = get(tb, fl, w, ti), *c = get(tb, cma, w, ti);
      char xf[16] = "-", xc[16] = "", sc[16] = "-";
      if (f) snprintf(xf, sizeof xf, "%.2f", x->ns_per_pair / f->ns_per_pair);
      if (cma >= 0) snprintf(xc, sizeof xc, "%s", "-");
      if (c) snprintf(xc, sizeof xc, "%.1fx", c->ns_per_pair / x->ns_per_pair);
      double s = scaling(tb, r, w, ti);
      if (s >= 0) snprintf(sc, sizeof sc, "%.2f", s);
      printf("%-16s %7d %12.2f %11.3f %9s %9s %8s %10llu\n", tb->rows[r]->name,
             o->threads[ti], x->ns_per_pair, x->mpairs_per_s, xf, xc, sc,
             (unsigned long long)(x->alloc_fails + x->free_fails + x->setup_fails));
    }
  }
}

static void print_ratio(const table *tb, int r, int w, int ti, const char *vs) {
  const result *a = get(tb, r, w, ti), *b = get(tb, row_index(tb, vs), w, ti);
  if (a == NULL || b == NULL || r == row_index(tb, vs)) return;
  printf("RATIO allocator=%s workload=%s threads=%d vs=%s time_ratio=%.3f speedup=%.3f\n",
         tb->rows[r]->name, workload_names[w], tb->o->threads[ti], vs,
         a->ns_per_pair / b->ns_per_pair, b->ns_per_pair / a->ns_per_pair);
}

static void print_target(const char *id, int w, int nthreads, double value, const char *goal,
                         int met) {
  printf("TARGET id=%s workload=%s threads=%d value=%.3f goal=%s met=%s\n", id,
         workload_names[w], nthreads, value, goal, met ? "yes" : "no");
}

static void print_machine_lines(const options *o, const char *device_line) {
  char host[64] = "?", date[64] = "?", model[128] = "?";
  gethostname(host, sizeof host);
  host[sizeof host - 1] = '\0';
  time_t now = time(NULL);
  struct tm tm;
  if (gmtime_r(&now, &tm)) strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f) {
    char line[256];
    while (fgets(line, sizeof line, f)) {
      if (!strncmp(line, "model name", 10)) {
        char *c = strchr(line, ':');
        if (c) {
          c++;
          while (*c == ' ') c++;
          c[strcspn(c, "\n")] = '\0';
          snprintf(model, sizeof model, "%s", c);
        }
        break;
      }
    }
    fclose(f);
  }
  printf("magpool-bench (magpool %d.%d.%d) kind=%s seconds=%.2f threads=", magpool_version() / 10000,
         magpool_version() / 100 % 100, magpool_version() % 100, o->device ? "device" : "host",
         o->seconds);
  for (int i = 0; i < o->nthreads; i++) printf("%s%d", i ? "," : "", o->threads[i]);
  printf("\nmachine: %s, %d online CPUs, %s; date: %s\n", host, bench_ncpus(), model, date);
  if (device_line) printf("gpu: %s\n", device_line);
}

int main(int argc, char **argv) {
  options o;
  if (parse_args(argc, argv, &o) != 0) {
    usage(stderr);
    return 2;
  }

  static table tb; /* large: not on the stack */
  tb.o = &o;
  char devmsg[256] = "";
  int have_gpu = 0;
  if (o.device) {
    have_gpu = bench_cuda_probe(devmsg, sizeof devmsg);
    if (!have_gpu) {
      fprintf(stderr,
              "magpool-bench: --kind device: no usable CUDA device: %s\n"
              "magpool-bench: running the host rows only\n",
              devmsg);
      printf("NOTE --kind device requested but no usable CUDA device (%s); host rows only\n",
             devmsg);
    }
  }

  for (int i = 0; i < bench_host_nrows; i++)
    if (row_selected(&o, bench_host_rows[i])) tb.rows[tb.nrows++] = bench_host_rows[i];
  if (have_gpu)
    for (int i = 0; i < bench_device_nrows; i++)
      if (row_selected(&o, bench_device_rows[i]) && tb.nrows < MAX_ROWS)
        tb.rows[tb.nrows++] = bench_device_rows[i];
  if (tb.nrows == 0) {
    fprintf(stderr, "magpool-bench: --rows selects no row available here\n");
    return 2;
  }

  print_machine_lines(&o, have_gpu ? devmsg : NULL);
  printf("rows:\n");
  for (int r = 0; r < tb.nrows; r++) printf("  %-16s %s\n", tb.rows[r]->name, tb.rows[r]->what);
  fflush(stdout);

  int failed = 0, hung = 0;
  for (int w = 0; w < BENCH_NWORKLOADS; w++) {
    if (!o.workloads[w]) continue;
    for (int r = 0; r < tb.nrows; r++) {
      for (int ti = 0; ti < o.nthreads; ti++) {
        result *x = &tb.res[r][w][ti];
        fprintf(stderr, "magpool-bench: %-8s %-16s threads=%-3d ...", workload_names[w],
                tb.rows[r]->name, o.threads[ti]);
        run_one(tb.rows[r], (enum bench_workload)w, o.threads[ti], o.seconds, x);
        if (x->status == RES_OK)
          fprintf(stderr, " %10.2f ns/pair %10.3f Mpairs/s\n", x->ns_per_pair, x->mpairs_per_s);
        else
          fprintf(stderr, " not run: %s\n", x->error);
        if (x->status != RES_OK) failed = 1;
        if (x->status == RES_HUNG) {
          hung = 1;
          print_table(&tb, w); /* what this workload has so far */
          goto report;
        }
      }
    }
    print_table(&tb, w);
    fflush(stdout);
  }
report:
  if (hung) {
    printf("\nHUNG: a measurement did not finish; the figures below are those taken "
           "before it, and the rest were not measured\n");
  }

  printf("\n");
  for (int w = 0; w < BENCH_NWORKLOADS; w++)
    for (int r = 0; r < tb.nrows; r++)
      for (int ti = 0; ti < o.nthreads; ti++) {
        const result *x = get(&tb, r, w, ti);
        if (x)
          printf("SUMMARY allocator=%s workload=%s threads=%d ns_per_pair=%.2f "
                 "mpairs_per_s=%.3f\n",
                 tb.rows[r]->name, workload_names[w], o.threads[ti], x->ns_per_pair,
                 x->mpairs_per_s);
      }

  for (int w = 0; w < BENCH_NWORKLOADS; w++)
    for (int r = 0; r < tb.nrows; r++)
      for (int ti = 0; ti < o.nthreads; ti++) {
        const char *name = tb.rows[r]->name;
        print_ratio(&tb, r, w, ti, "floor");
        if (!strncmp(name, "magpool", 7)) {
          print_ratio(&tb, r, w, ti, "magpool-locked");
          print_ratio(&tb, r, w, ti, "cudaMallocAsync");
        }
      }

  for (int w = 0; w < BENCH_NWORKLOADS; w++)
    for (int r = 0; r < tb.nrows; r++)
      for (int ti = 0; ti < o.nthreads; ti++) {
        double s = scaling(&tb, r, w, ti);
        if (s >= 0 && o.threads[ti] > 1)
          printf("SCALING allocator=%s workload=%s threads=%d efficiency=%.3f\n",
                 tb.rows[r]->name, workload_names[w], o.threads[ti], s);
      }

  /* The targets of docs/benchmarks.md, where this run measured them. */
  int t1 = thread_index(&o, 1), t16 = thread_index(&o, 16);
  int mp = row_index(&tb, "magpool"), fl = row_index(&tb, "floor");
  int nc = row_index(&tb, "magpool-nocache"), lk = row_index(&tb, "magpool-locked");
  int as = row_index(&tb, "magpool-async"), cma = row_index(&tb, "cudaMallocAsync");
  int an = row_index(&tb, "magpool-async-nocheck");
  for (int w = 0; w < BENCH_NWORKLOADS; w++) {
    const result *a, *b;
    if (w == BENCH_FIXED1K && (a = get(&tb, mp, w, t1)) && (b = get(&tb, fl, w, t1))) {
      double v = a->ns_per_pair / b->ns_per_pair;
      print_target("magpool_vs_floor", w, 1, v, "<=3", v <= 3.0);
    }
    double s = scaling(&tb, mp, w, t16);
    if (s >= 0) print_target("magpool_scaling", w, 16, s, ">=0.8", s >= 0.8);
    if ((a = get(&tb, nc, w, t16)) && (b = get(&tb, lk, w, t16))) {
      double v = a->mpairs_per_s / b->mpairs_per_s;
      print_target("nocache_vs_locked", w, 16, v, ">=5", v >= 5.0);
    }
    if ((a = get(&tb, as, w, t1)) && (b = get(&tb, cma, w, t1))) {
      double v = a->mpairs_per_s / b->mpairs_per_s;
      print_target("async_vs_cudaMallocAsync", w, 1, v, ">=40", v >= 40.0);
    }
    if ((a = get(&tb, as, w, t16)) && (b = get(&tb, cma, w, t16))) {
      double v = a->mpairs_per_s / b->mpairs_per_s;
      print_target("async_vs_cudaMallocAsync", w, 16, v, ">=1000", v >= 1000.0);
    }
    if ((a = get(&tb, an, w, t1)) && (b = get(&tb, cma, w, t1))) {
      double v = a->mpairs_per_s / b->mpairs_per_s;
      print_target("async_nocheck_vs_cudaMallocAsync", w, 1, v, ">=40", v >= 40.0);
    }
    if ((a = get(&tb, an, w, t16)) && (b = get(&tb, cma, w, t16))) {
      double v = a->mpairs_per_s / b->mpairs_per_s;
      print_target("async_nocheck_vs_cudaMallocAsync", w, 16, v, ">=1000", v >= 1000.0);
    }
  }

  for (int w = 0; w < BENCH_NWORKLOADS; w++)
    for (int r = 0; r < tb.nrows; r++)
      for (int ti = 0; ti < o.nthreads; ti++) {
        const result *x = &tb.res[r][w][ti];
        if (x->status == RES_OK && (x->alloc_fails || x->free_fails || x->setup_fails))
          printf("FAILURES allocator=%s workload=%s threads=%d alloc_fails=%llu "
                 "free_fails=%llu window_fill_fails=%llu first=\"%s\"\n",
                 tb.rows[r]->name, workload_names[w], o.threads[ti],
                 (unsigned long long)x->alloc_fails, (unsigned long long)x->free_fails,
                 (unsigned long long)x->setup_fails, x->error);
        else if (x->status == RES_FAILED || x->status == RES_HUNG)
          printf("NOTRUN allocator=%s workload=%s threads=%d reason=\"%s\"\n", tb.rows[r]->name,
                 workload_names[w], o.threads[ti], x->error);
      }
  fflush(stdout);
  if (hung) {
    fflush(stderr);
    _exit(3); /* hung workers hold the row's state: do not unwind */
  }
  return failed ? 1 : 0;
}
