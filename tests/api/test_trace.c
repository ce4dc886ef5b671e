/* test_trace.c - trace recording (magpool_config_t.trace_path,
 * MAGPOOL_TRACE): the file's format, its events against what the program
 * did, the order across threads, and the peak of live bytes.
 *
 * The format (README, "Recording and replaying a trace"): '#' comment
 * lines, then "a ID SIZE STREAM" and "f ID STREAM"; IDs from 0 in order
 * of allocation; streams numbered densely from 0 in order of first use,
 * where a synchronous call's stream is the NULL stream.
 *
 *   trace::a_trim_keeps_recording   trims between the calls (as
 *        magpool_torch's out-of-memory retry makes): every event is in the
 *        file, and nothing is freed twice
 */
#define _GNU_SOURCE /* setenv, mkdtemp, stream_util.h */
#include <magpool.h>

#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stream_util.h"
#include "test_util.h"

typedef struct {
  char op; /* 'a' or 'f' */
  uint64_t id, size, stream;
} tev;

typedef struct {
  tev *ev;
  size_t n, cap;
} tevs;

static void push(tevs *v, tev e) {
  if (v->n == v->cap) {
    v->cap = v->cap ? 2 * v->cap : 1024;
    v->ev = realloc(v->ev, v->cap * sizeof *v->ev);
    cr_assert_not_null(v->ev);
  }
  v->ev[v->n++] = e;
}

/* Reads a trace, checking every line's syntax: comments only before and
 * after the events, IDs in allocation order. */
static tevs read_trace(const char *path) {
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "no trace at %s", path);
  tevs v = {0};
  char line[256];
  uint64_t next_id = 0;
  size_t lineno = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    lineno++;
    if (line[0] == '#') continue;
    tev e = {0};
    char tail;
    if (line[0] == 'a') {
      cr_assert_eq(sscanf(line, "a %lu %lu %lu%c", &e.id, &e.size, &e.stream, &tail), 4,
                   "line %zu: '%s'", lineno, line);
      cr_assert_eq(e.id, next_id, "line %zu: ID %lu, expected %lu", lineno, e.id, next_id);
      next_id++;
    } else {
      cr_assert_eq(line[0], 'f', "line %zu: '%s'", lineno, line);
      cr_assert_eq(sscanf(line, "f %lu %lu%c", &e.id, &e.stream, &tail), 3, "line %zu: '%s'",
                   lineno, line);
    }
    cr_assert_eq(tail, '\n', "line %zu: trailing text", lineno);
    e.op = line[0];
    push(&v, e);
  }
  fclose(f);
  return v;
}

static char *tmp_path(const char *tag) {
  char *p = malloc(256);
  snprintf(p, 256, "%s/magpool-test-%s-%ld.trace",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", tag, (long)getpid());
  return p;
}

static magpool_t *traced_pool(const char *path, size_t size) {
  unsetenv("MAGPOOL_CONF");
  unsetenv("MAGPOOL_TRACE");
  magpool_config_t c;
  magpool_config_init(&c);
  c.pool_size = size;
  c.trace_path = path;
  magpool_t *pool = NULL;
  cr_assert_eq(magpool_create(&c, &pool), 0);
  return pool;
}

/* One thread, sync and async calls on two host streams and a scope; the
 * expected trace is built alongside and must match the file exactly. */
Test(trace, exact_events_and_peak) {
  char *path = tmp_path("exact");
  magpool_t *pool = traced_pool(path, 64 * MiB);
  magpool_stream_t s[3] = {NULL, stream_new(), stream_new()};
  uint64_t snum[3];
  bool seen[3] = {false, false, false};
  uint64_t nstreams = 0;
#define SNUM(i) (seen[i] ? snum[i] : (seen[i] = true, snum[i] = nstreams++))
  enum { SLOTS = 64, OPS = 20000 };
  void *live[SLOTS] = {0};
  uint64_t id_of[SLOTS], size_of[SLOTS];
  int scoped[SLOTS] = {0};
  magpool_scope_t *scope = magpool_scope_begin(pool);
  cr_assert_not_null(scope);
  tevs want = {0};
  uint64_t next_id = 0, live_bytes = 0, peak = 0;
  mpt_rng r = mpt_rng_seed(7);
  for (int i = 0; i < OPS; i++) {
    unsigned k = (unsigned)mpt_below(&r, SLOTS);
    unsigned si = (unsigned)mpt_below(&r, 3);
    if (live[k] == NULL) {
      size_t size = (size_t)1 << mpt_below(&r, 16);
      size += mpt_below(&r, size);
      int use_scope = mpt_below(&r, 8) == 0;
      void *p = use_scope ? magpool_scope_alloc(scope, size)
                : si == 0 ? magpool_alloc(pool, size)
                          : magpool_alloc_async(pool, size, s[si]);
      cr_assert_not_null(p);
      live[k] = p;
      id_of[k] = next_id++;
      size_of[k] = size;
      scoped[k] = use_scope;
      push(&want, (tev){'a', id_of[k], size, SNUM(use_scope ? 0 : si)});
      live_bytes += size;
      if (live_bytes > peak) peak = live_bytes;
    } else {
      int rc = scoped[k] ? magpool_scope_free(scope, live[k])
               : si == 0 ? (mpt_below(&r, 2) ? magpool_free(pool, live[k])
                                              : magpool_free_sized(pool, live[k], size_of[k]))
                         : magpool_free_async(pool, live[k], s[si]);
      cr_assert_eq(rc, 0);
      push(&want, (tev){'f', id_of[k], 0, SNUM(scoped[k] ? 0 : si)});
      live_bytes -= size_of[k];
      live[k] = NULL;
    }
    if (i % 1000 == 0) { /* failures are not events */
      cr_assert_null(magpool_alloc(pool, SIZE_MAX / 2));
      char x;
      cr_assert_eq(magpool_free(pool, &x), MAGPOOL_EINVAL);
      cr_assert_eq(magpool_free(pool, NULL), 0);
    }
  }
  /* A few stay live at the end: the trace leaves them live. */
  for (int k = 0; k < SLOTS; k++)
    if (live[k] != NULL && scoped[k]) {
      cr_assert_eq(magpool_scope_free(scope, live[k]), 0);
      push(&want, (tev){'f', id_of[k], 0, SNUM(0)});
      live[k] = NULL;
    }
  cr_assert_eq(magpool_scope_end(scope), 0);
  for (int i = 1; i < 3; i++) {
    cr_assert_eq(magpool_stream_release(pool, s[i]), 0);
    cr_assert_eq(magpool_host_stream_sync(s[i]), 0);
  }
  cr_assert_eq(magpool_destroy(pool), 0);
  for (int i = 1; i < 3; i++) cr_assert_eq(magpool_host_stream_destroy(s[i]), 0);

  tevs got = read_trace(path);
  cr_assert_eq(got.n, want.n, "%zu events in the file, %zu made", got.n, want.n);
  for (size_t i = 0; i < want.n; i++) {
    const tev *a = &got.ev[i], *b = &want.ev[i];
    cr_assert(a->op == b->op && a->id == b->id && a->stream == b->stream &&
                  (a->op == 'f' || a->size == b->size),
              "event %zu: file %c %lu %lu %lu, made %c %lu %lu %lu", i, a->op, a->id, a->size,
              a->stream, b->op, b->id, b->size, b->stream);
  }
  /* The peak of live bytes, from the file alone. */
  uint64_t *sz = calloc(next_id, sizeof *sz);
  uint64_t cur = 0, fpeak = 0;
  for (size_t i = 0; i < got.n; i++) {
    if (got.ev[i].op == 'a') {
      sz[got.ev[i].id] = got.ev[i].size;
      cur += got.ev[i].size;
      if (cur > fpeak) fpeak = cur;
    } else {
      cur -= sz[got.ev[i].id];
    }
  }
  cr_assert_eq(fpeak, peak, "peak from the file %lu, the program's %lu", fpeak, peak);
  cr_assert_eq(nstreams, 3);
  free(sz);
  free(got.ev);
  free(want.ev);
  unlink(path);
  free(path);
#undef SNUM
}

/* Threads free what other threads allocated: every free must come after
 * its allocation in the file, each allocation freed once. */
enum { THREADS = 4, XSLOTS = 256, XOPS = 30000 };
static magpool_t *xpool;
static _Atomic(void *) xslot[XSLOTS];
static _Atomic uint64_t xallocs, xfrees;

static void *xworker(void *arg) {
  mpt_rng r = mpt_rng_seed((uint64_t)(uintptr_t)arg + 100);
  for (int i = 0; i < XOPS; i++) {
    void *p = magpool_alloc(xpool, 1 + mpt_below(&r, 8192));
    if (p == NULL) continue;
    atomic_fetch_add(&xallocs, 1);
    void *old = atomic_exchange(&xslot[mpt_below(&r, XSLOTS)], p);
    if (old != NULL && magpool_free(xpool, old) == 0) atomic_fetch_add(&xfrees, 1);
  }
  return NULL;
}

Test(trace, threads_free_after_alloc) {
  char *path = tmp_path("threads");
  xpool = traced_pool(path, 64 * MiB);
  pthread_t th[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, xworker, (void *)i), 0);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < XSLOTS; i++) {
    void *p = atomic_exchange(&xslot[i], NULL);
    if (p != NULL && magpool_free(xpool, p) == 0) atomic_fetch_add(&xfrees, 1);
  }
  cr_assert_eq(magpool_destroy(xpool), 0);
  tevs got = read_trace(path);
  uint64_t na = 0, nf = 0;
  uint64_t n = atomic_load(&xallocs);
  char *state = calloc(n + 1, 1); /* 0 never seen, 1 live, 2 freed */
  for (size_t i = 0; i < got.n; i++) {
    const tev *e = &got.ev[i];
    cr_assert_lt(e->id, n + 1);
    cr_assert_eq(e->stream, 0, "only synchronous calls here");
    if (e->op == 'a') {
      na++;
      state[e->id] = 1;
    } else {
      nf++;
      cr_assert_eq(state[e->id], 1, "event %zu frees ID %lu, which is not live", i, e->id);
      state[e->id] = 2;
    }
  }
  cr_assert_eq(na, n);
  cr_assert_eq(nf, atomic_load(&xfrees));
  cr_assert_eq(na, nf, "everything was freed");
  free(state);
  free(got.ev);
  unlink(path);
  free(path);
}

/* MAGPOOL_TRACE with %p, and a second pool on the same path getting a
 * file of its own. */
Test(trace, env_and_same_path) {
  char dir[] = "/tmp/magpool-trace-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char pattern[300], expect[300];
  snprintf(pattern, sizeof pattern, "%s/run-%%p.trace", dir);
  snprintf(expect, sizeof expect, "%s/run-%ld.trace", dir, (long)getpid());
  unsetenv("MAGPOOL_CONF");
  setenv("MAGPOOL_TRACE", pattern, 1);
  magpool_config_t c;
  magpool_config_init(&c);
  c.pool_size = 4 * MiB;
  magpool_t *a = NULL, *b = NULL;
  cr_assert_eq(magpool_create(&c, &a), 0);
  cr_assert_eq(magpool_create(&c, &b), 0);
  void *pa = magpool_alloc(a, 100), *pb = magpool_alloc(b, 200);
  cr_assert_eq(magpool_free(a, pa), 0);
  cr_assert_eq(magpool_destroy(a), 0);
  cr_assert_eq(magpool_destroy(b), 0);
  (void)pb; /* left live: the trace keeps it live */
  tevs ta = read_trace(expect);
  cr_assert_eq(ta.n, 2);
  cr_assert(ta.ev[0].op == 'a' && ta.ev[0].size == 100 && ta.ev[1].op == 'f');
  /* b's file: the same name plus ".N". */
  DIR *d = opendir(dir);
  struct dirent *de;
  int files = 0;
  char other[600] = "";
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.') continue;
    files++;
    if (strlen(de->d_name) > strlen(expect) - strlen(dir) - 1)
      snprintf(other, sizeof other, "%s/%s", dir, de->d_name);
  }
  closedir(d);
  cr_assert_eq(files, 2);
  tevs tb = read_trace(other);
  cr_assert_eq(tb.n, 1);
  cr_assert(tb.ev[0].op == 'a' && tb.ev[0].size == 200);
  unlink(expect);
  unlink(other);
  rmdir(dir);
  free(ta.ev);
  free(tb.ev);
}

/* One thread alternates between two traced pools (its buffer follows it
 * from one recorder to the other): each file holds exactly its own
 * pool's events. */
Test(trace, one_thread_two_pools) {
  char *pa = tmp_path("two-a"), *pb = tmp_path("two-b");
  magpool_t *a = traced_pool(pa, 4 * MiB), *b = traced_pool(pb, 4 * MiB);
  enum { N = 6000 };
  for (int i = 0; i < N; i++) {
    magpool_t *p = i % 3 == 0 ? a : b;
    void *x = magpool_alloc(p, p == a ? 100 : 200);
    cr_assert_not_null(x);
    cr_assert_eq(magpool_free(p, x), 0);
  }
  cr_assert_eq(magpool_destroy(a), 0);
  cr_assert_eq(magpool_destroy(b), 0);
  tevs ta = read_trace(pa), tb = read_trace(pb);
  cr_assert_eq(ta.n, 2 * (N / 3));
  cr_assert_eq(tb.n, 2 * (N - N / 3));
  for (size_t i = 0; i < ta.n; i += 2)
    cr_assert(ta.ev[i].op == 'a' && ta.ev[i].size == 100 && ta.ev[i + 1].op == 'f' &&
              ta.ev[i + 1].id == ta.ev[i].id);
  for (size_t i = 0; i < tb.n; i += 2)
    cr_assert(tb.ev[i].op == 'a' && tb.ev[i].size == 200 && tb.ev[i + 1].op == 'f' &&
              tb.ev[i + 1].id == tb.ev[i].id);
  unlink(pa);
  unlink(pb);
  free(pa);
  free(pb);
  free(ta.ev);
  free(tb.ev);
}

/* A traced pool trimmed between its calls, twice (magpool_torch trims
 * before it retries an allocation that ran out of memory): the trace goes
 * on recording, and the file written at destroy holds every event.  (A
 * trim that closed the trace freed it under the pool: the next event
 * wrote freed memory, the next trim freed it again.) */
Test(trace, a_trim_keeps_recording) {
  char *path = tmp_path("trim");
  magpool_t *pool = traced_pool(path, 4 * MiB);
  enum { N = 3 };
  for (int i = 0; i < N; i++) {
    void *x = magpool_alloc(pool, 1000 + (size_t)i);
    cr_assert_not_null(x);
    cr_assert_eq(magpool_trim(pool), 0);
    cr_assert_eq(magpool_free(pool, x), 0);
  }
  cr_assert_eq(magpool_trim(pool), 0);
  cr_assert_eq(magpool_destroy(pool), 0);
  tevs t = read_trace(path);
  cr_assert_eq(t.n, 2 * N, "%zu events in the file, %d made", t.n, 2 * N);
  for (size_t i = 0; i < t.n; i += 2)
    cr_assert(t.ev[i].op == 'a' && t.ev[i].size == 1000 + i / 2 && t.ev[i + 1].op == 'f' &&
              t.ev[i + 1].id == t.ev[i].id);
  unlink(path);
  free(path);
  free(t.ev);
}
