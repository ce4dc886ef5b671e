/* magpool-replay - replays recorded allocation traces on magpool and its
 * peers, and reports the memory each one held against what the program
 * had live (docs/replay.md).
 *
 * Output, one line per trace x allocator x mode x pass:
 *   REPLAY trace=NAME allocator=A mode=M pass=P peak_live=B peak_reserved=B
 *          ratio=R ns_per_event=N result=completed|oom@EVENT
 * (one line each; result may also be skipped, or error@EVENT), then one
 * line per trace x allocator x mode:
 *   SUMMARY trace=NAME allocator=A mode=M peak_live=B ns_per_event=N
 *           ratio_cold=R ratio_warm=R result=...
 *
 * Exit status: 0; 2 for a usage error; 1 if a trace could not be loaded,
 * an allocator could not be set up, or a call failed for another reason
 * than lack of memory (an out-of-memory pass is a result, not an error).
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"

const char *const replay_alloc_names[REPLAY_NALLOCS] = {"magpool", "cudaMallocAsync",
                                                        "cudaMalloc", "cub"};
const char *const replay_mode_names[2] = {"sync", "async"};

static const char usage_text[] =
    "usage: magpool-replay TRACE... [--kind host|device|pinned] [--mode sync|async]\n"
    "           [--allocator magpool|cudaMallocAsync|cudaMalloc|cub|all]\n"
    "           [--pool-size B] [--cap B] [--passes N] [--csv FILE] [--stats]\n"
    "                     [--evict B]\n"
    "           [--lag N] [--threads [--window N]]\n"
    "\n"
    "Replays each TRACE (text or gzip: `a ID SIZE STREAM` / `f ID STREAM` lines)\n"
    "from one thread, in trace order (or a thread per stream: --threads), and\n"
    "prints for every pass\n"
    "  REPLAY trace=NAME allocator=A mode=M pass=P peak_live=B peak_reserved=B\n"
    "         ratio=R ns_per_event=N result=completed|oom@EVENT\n"
    "then a SUMMARY line per trace x allocator x mode.  Pass 1 is cold (a fresh\n"
    "pool); later passes replay on the same, warm pool.\n"
    "\n"
    "  --kind K       pool memory (default: device if a GPU is present, else host)\n"
    "  --mode M       sync: magpool_alloc/magpool_free; async: one stream per\n"
    "                 trace stream, magpool_alloc_async/magpool_free_async\n"
    "                 (default sync)\n"
    "  --allocator A  magpool (default); cudaMallocAsync, cudaMalloc, cub\n"
    "                 (--kind device only; cudaMalloc sync only); all = the four\n"
    "  --pool-size B  magpool's initial pool size (default 64M); it may grow\n"
    "  --cap B        magpool's max_pool_size (default 0: no cap)\n"
    "  --passes N     passes per trace (default 2)\n"
    "  --csv FILE     one row per event: event,live_bytes,reserved_bytes,\n"
    "                 allocator,trace,pass.  Reading the footprint at every\n"
    "                 event slows the passes: their ns_per_event is then not\n"
    "                 a measurement of the allocator\n"
    "  --stats        after each magpool pass, a line\n"
    "                   STATS trace=NAME allocator=magpool mode=M pass=P grows=N\n"
    "                   chunk_maps=N chunk_unmaps=N chunk_moves=N stream_batches=N\n"
    "                   pending_at_peak=B\n"
    "                 (that pass's growths, chunk calls and stream batches,\n"
    "                 magpool_stats_t)\n"
    "  --lag N        --mode async: the streams run behind the replay, as a\n"
    "                 GPU runs behind its host: every N events each stream is\n"
    "                 held at a mark until the next mark is set (N to 2N\n"
    "                 events behind), or for 2 ms at most (so that a wait for\n"
    "                 a stream ends); host streams by a task, CUDA streams\n"
    "                 (magpool, cudaMallocAsync, cub) by a gate kernel.  A\n"
    "                 footprint measurement: the passes' timing depends on\n"
    "                 the machine's scheduling, and includes the marks\n"
    "  --evict B      before each event, read and write one byte of every\n"
    "                 cache line of a B-byte buffer (the program's own work\n"
    "                 between two calls, which pushes the allocator's data\n"
    "                 out of the caches), and time each call alone: a pass's\n"
    "                 ns_per_event is then its calls' time.  2M empties a core's\n"
    "                 own caches on most machines; 64M the shared one too\n"
    "  --threads      a thread per trace stream issues that stream's events\n"
    "                 (allocations on it, frees on it), in trace order, as a\n"
    "                 server's threads do; a free waits for its allocation.\n"
    "                 Every allocator; not with --lag, --csv or --evict.  The\n"
    "                 threads are kept from pass to pass.  ns_per_event is the\n"
    "                 pass's wall time over its events (waits and hand-offs\n"
    "                 between threads included), and peak_live the peak in the\n"
    "                 order the events happened\n"
    "  --window N     --threads: an event starts only once every event more\n"
    "                 than N before it in the trace is done (default 256; 0:\n"
    "                 the trace's own order, one event at a time)\n"
    "  -h, --help     this text\n"
    "B takes a suffix K, M or G (powers of 1024), or is plain bytes.\n";

static void usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "magpool-replay: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n%s", usage_text);
  exit(2);
}

/* A decimal number from 1 to max, else a usage error (msg names it). */
static long parse_count(const char *s, long max, const char *msg) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || errno != 0 || v < 1 || v > max) usage_error(msg, s);
  return v;
}

/* Bytes with an optional K, M or G suffix; -1 if s is not one. */
static int parse_bytes(const char *s, size_t *out) {
  if (*s < '0' || *s > '9') return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0) return -1;
  unsigned shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10, end++;
  else if (*end == 'M' || *end == 'm') shift = 20, end++;
  else if (*end == 'G' || *end == 'g') shift = 30, end++;
  if (*end != '\0') return -1;
  if (shift && v > ((unsigned long long)SIZE_MAX >> shift)) return -1;
  *out = (size_t)(v << shift);
  return 0;
}

static double ratio(const replay_result *r) {
  return r->peak_live ? (double)r->peak_reserved / (double)r->peak_live : 0.0;
}

static double ns_per_event(const replay_result *r) {
  return r->events ? (double)r->ns / (double)r->events : 0.0;
}

static void print_result(char *buf, size_t len, const replay_result *r) {
  switch (r->status) {
    case REPLAY_COMPLETED: snprintf(buf, len, "completed"); break;
    case REPLAY_OOM: snprintf(buf, len, "oom@%zu", r->fail_event); break;
    case REPLAY_SKIPPED: snprintf(buf, len, "skipped"); break;
    default: snprintf(buf, len, "error@%zu", r->fail_event); break;
  }
}

typedef int (*runner_fn)(const replay_trace *, const replay_opts *, enum replay_mode,
                         replay_result *);
static const runner_fn runners[REPLAY_NALLOCS] = {replay_run_magpool,
                                                  replay_run_cuda_malloc_async,
                                                  replay_run_cuda_malloc, replay_run_cub};

int main(int argc, char **argv) {
  replay_opts o = {
      .kind = REPLAY_HOST, .pool_size = 64u << 20, .cap = 0, .passes = 2, .window = 256};
  int kind_given = 0, all = 0, window_given = 0;
  enum replay_mode mode = REPLAY_SYNC;
  enum replay_alloc alloc = REPLAY_MAGPOOL;
  const char *csv_path = NULL;

  static const struct option longopts[] = {
      {"kind", required_argument, NULL, 'k'},      {"mode", required_argument, NULL, 'm'},
      {"allocator", required_argument, NULL, 'a'}, {"pool-size", required_argument, NULL, 's'},
      {"cap", required_argument, NULL, 'c'},       {"passes", required_argument, NULL, 'p'},
      {"csv", required_argument, NULL, 'o'},       {"help", no_argument, NULL, 'h'},
      {"stats", no_argument, NULL, 'S'},         {"lag", required_argument, NULL, 'L'},
      {"evict", required_argument, NULL, 'E'},   {"threads", no_argument, NULL, 'T'},
      {"window", required_argument, NULL, 'W'},  {NULL, 0, NULL, 0}};
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
      case 'k':
        kind_given = 1;
        if (strcmp(optarg, "host") == 0) o.kind = REPLAY_HOST;
        else if (strcmp(optarg, "device") == 0) o.kind = REPLAY_DEVICE;
        else if (strcmp(optarg, "pinned") == 0) o.kind = REPLAY_PINNED;
        else usage_error("--kind: `%s` is not host, device or pinned", optarg);
        break;
      case 'm':
        if (strcmp(optarg, "sync") == 0) mode = REPLAY_SYNC;
        else if (strcmp(optarg, "async") == 0) mode = REPLAY_ASYNC;
        else usage_error("--mode: `%s` is not sync or async", optarg);
        break;
      case 'a': {
        int found = 0;
        all = strcmp(optarg, "all") == 0;
        for (int k = 0; k < REPLAY_NALLOCS && !all; k++)
          if (strcmp(optarg, replay_alloc_names[k]) == 0) alloc = (enum replay_alloc)k, found = 1;
        if (!found && !all) usage_error("--allocator: unknown allocator `%s`", optarg);
        break;
      }
      case 's':
        if (parse_bytes(optarg, &o.pool_size) != 0 || o.pool_size == 0)
          usage_error("--pool-size: `%s` is not a size above 0", optarg);
        break;
      case 'c':
        if (parse_bytes(optarg, &o.cap) != 0) usage_error("--cap: `%s` is not a size", optarg);
        break;
      case 'p':
        o.passes = (int)parse_count(optarg, 1000, "--passes: `%s` is not a number from 1 to 1000");
        break;
      case 'o': csv_path = optarg; break;
      case 'S': o.stats = 1; break;
      case 'L':
        o.lag = (size_t)parse_count(optarg, 100000000, "--lag: `%s` is not a number from 1 to 100000000");
        break;
      case 'E':
        if (parse_bytes(optarg, &o.evict) != 0 || o.evict > ((size_t)1 << 34))
          usage_error("--evict: `%s` is not a size up to 16G", optarg);
        break;
      case 'T': o.threads = 1; break;
      case 'W':
        window_given = 1;
        o.window = strcmp(optarg, "0") == 0
                       ? 0
                       : (size_t)parse_count(optarg, 1000000000,
                                             "--window: `%s` is not a number from 0 to 1000000000");
        break;
      case 'h': fputs(usage_text, stdout); return 0;
      default:
        usage_error("bad option `%s`", argv[optind - 1 > 0 ? optind - 1 : 0]);
    }
  }
  if (optind >= argc) usage_error("%s", "no trace given");
  if (o.cap != 0 && o.cap < o.pool_size)
    usage_error("%s", "--cap is below --pool-size");
  if (!kind_given) o.kind = replay_cuda_present() ? REPLAY_DEVICE : REPLAY_HOST;
  if (o.lag != 0 && mode != REPLAY_ASYNC) usage_error("%s", "--lag needs --mode async");
  if (window_given && !o.threads) usage_error("%s", "--window needs --threads");
  if (o.threads && (o.lag != 0 || csv_path != NULL || o.evict != 0))
    usage_error("%s", "--threads does not go with --lag, --csv or --evict");
  if (o.kind != REPLAY_HOST) (void)replay_cuda_present(); /* device 0, its context */

  if (o.evict != 0 && (o.evict_buf = calloc(1, o.evict)) == NULL) {
    fprintf(stderr, "magpool-replay: --evict: cannot allocate %zu bytes\n", o.evict);
    return 1;
  }
  if (csv_path != NULL) {
    o.csv = fopen(csv_path, "w");
    if (o.csv == NULL) {
      fprintf(stderr, "magpool-replay: %s: %s\n", csv_path, strerror(errno));
      return 1;
    }
    fprintf(o.csv, "event,live_bytes,reserved_bytes,allocator,trace,pass\n");
  }

  const int ntraces = argc - optind;
  const int a0 = all ? 0 : (int)alloc, a1 = all ? REPLAY_NALLOCS : (int)alloc + 1;
  const int nalloc = a1 - a0;
  replay_result *res = calloc((size_t)ntraces * (size_t)nalloc * (size_t)o.passes, sizeof *res);
  char **names = calloc((size_t)ntraces, sizeof *names);
  int *ran = calloc((size_t)ntraces * (size_t)nalloc, sizeof *ran);
  if (res == NULL || names == NULL || ran == NULL) {
    fprintf(stderr, "magpool-replay: out of memory\n");
    return 1;
  }
  int status = 0;
  char rbuf[48];

  for (int ti = 0; ti < ntraces; ti++) {
    replay_trace t;
    if (replay_trace_load(argv[optind + ti], &t) != 0) {
      status = 1;
      continue;
    }
    names[ti] = strdup(t.name);
    for (int a = a0; a < a1; a++) {
      replay_result *r = &res[((size_t)ti * (size_t)nalloc + (size_t)(a - a0)) * (size_t)o.passes];
      if (runners[a](&t, &o, mode, r) != 0) {
        fprintf(stderr, "magpool-replay: %s: %s could not run\n", t.name, replay_alloc_names[a]);
        status = 1;
        continue;
      }
      ran[ti * nalloc + (a - a0)] = 1;
      for (int p = 0; p < o.passes; p++) {
        if (r[p].status == REPLAY_ERROR) status = 1;
        print_result(rbuf, sizeof rbuf, &r[p]);
        printf("REPLAY trace=%s allocator=%s mode=%s pass=%d peak_live=%llu "
               "peak_reserved=%llu ratio=%.3f ns_per_event=%.1f result=%s\n",
               t.name, replay_alloc_names[a], replay_mode_names[mode], p + 1,
               (unsigned long long)r[p].peak_live, (unsigned long long)r[p].peak_reserved,
               ratio(&r[p]), ns_per_event(&r[p]), rbuf);
        if (o.stats && a == REPLAY_MAGPOOL)
          printf("STATS trace=%s allocator=magpool mode=%s pass=%d grows=%llu chunk_maps=%llu "
                 "chunk_unmaps=%llu chunk_moves=%llu stream_batches=%llu pending_at_peak=%llu\n",
                 t.name, replay_mode_names[mode], p + 1, (unsigned long long)r[p].grows,
                 (unsigned long long)r[p].chunk_maps, (unsigned long long)r[p].chunk_unmaps,
                 (unsigned long long)r[p].chunk_moves, (unsigned long long)r[p].stream_batches,
                 (unsigned long long)r[p].pending_at_peak);
      }
      fflush(stdout);
    }
    replay_trace_free(&t);
  }

  /* SUMMARY: cold = pass 1, warm = the last pass (pass 2 by default). */
  for (int ti = 0; ti < ntraces; ti++)
    for (int a = a0; a < a1; a++) {
      if (!ran[ti * nalloc + (a - a0)]) continue;
      const replay_result *r =
          &res[((size_t)ti * (size_t)nalloc + (size_t)(a - a0)) * (size_t)o.passes];
      const replay_result *cold = &r[0], *warm = &r[o.passes - 1], *worst = NULL;
      uint64_t peak_live = 0;
      for (int p = 0; p < o.passes; p++) {
        if (r[p].status != REPLAY_COMPLETED && worst == NULL) worst = &r[p];
        if (r[p].peak_live > peak_live) peak_live = r[p].peak_live;
      }
      print_result(rbuf, sizeof rbuf, worst ? worst : cold);
      printf("SUMMARY trace=%s allocator=%s mode=%s peak_live=%llu ns_per_event=%.1f "
             "ratio_cold=%.3f ratio_warm=%.3f result=%s\n",
             names[ti], replay_alloc_names[a], replay_mode_names[mode],
             (unsigned long long)peak_live, ns_per_event(warm), ratio(cold), ratio(warm), rbuf);
    }

  if (o.csv != NULL && fclose(o.csv) != 0) {
    fprintf(stderr, "magpool-replay: %s: write error\n", csv_path);
    status = 1;
  }
  for (int ti = 0; ti < ntraces; ti++) free(names[ti]);
  free(names);
  free(ran);
  free(res);
  free((void *)o.evict_buf);
  return status;
}
