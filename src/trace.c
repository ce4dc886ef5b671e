/* trace.c - recording a pool's allocations and frees (trace_path,
 * MAGPOOL_TRACE).  Layer 0: calls no other magpool file.
 *
 * Each event takes a number from the trace's one sequence counter: an
 * allocation after it succeeded (before the program has the pointer), a
 * free before it is made (while no other thread can have the block
 * back).  So an allocation's number is below its free's, and a free's
 * below the next allocation of the same address, whichever threads make
 * them.  The event goes into the calling thread's buffer; a full buffer
 * is appended to the trace's spill file (binary) under the trace's lock.
 * At close (magpool_destroy, or process exit) every buffer is collected,
 * the events are sorted by number, and the text file is written:
 * allocation IDs are given in order, addresses mapped to the live
 * allocation's ID, streams numbered densely in order of first use.
 *
 * Threads: a buffer belongs to one thread and records for one trace at a
 * time; switching traces, filling up and thread exit go through the
 * global lock.  `owner` is read without it by the buffer's thread only
 * and written under it (by that thread, or by a close of its trace, which
 * the pool contract keeps from overlapping the thread's calls on it).
 */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TB_EVENTS 4096 /* events a thread buffers before a spill: 128 KiB */
#define EV_FREE UINT64_MAX

typedef struct {
  uint64_t seq;
  uint64_t ptr;
  uint64_t size; /* EV_FREE for a free */
  uint64_t stream;
} trace_ev;

typedef struct tbuf {
  _Atomic(mp_trace *) owner;
  struct tbuf *next; /* in owner's list (global lock) */
  unsigned n;
  trace_ev ev[TB_EVENTS];
} tbuf;

struct mp_trace {
  _Atomic uint64_t seq;
  char *path;
  FILE *spill;       /* binary events of full buffers                  */
  uint64_t spilled;  /* events in it                                   */
  uint64_t lost;     /* events dropped (spill write failed, or late)   */
  tbuf *bufs;        /* buffers recording for this trace               */
  bool done;         /* written (at process exit): drop later events   */
  char header[256];  /* comment line: the pool's configuration         */
  mp_trace *next;    /* open traces (global lock)                      */
};

static pthread_mutex_t glock = PTHREAD_MUTEX_INITIALIZER;
static mp_trace *open_traces;
static pthread_key_t tb_key;
static bool tb_key_made;
static _Thread_local tbuf *tls_tb;

/* ----------------------------------------------------- buffers (glock) */

static void spill_locked(mp_trace *t, tbuf *b) {
  if (b->n == 0) return;
  if (t->done || t->spill == NULL || fwrite(b->ev, sizeof b->ev[0], b->n, t->spill) != b->n)
    t->lost += b->n;
  else
    t->spilled += b->n;
  b->n = 0;
}

static void detach_locked(tbuf *b) {
  mp_trace *t = mp_load_relaxed(&b->owner);
  if (t == NULL) return;
  spill_locked(t, b);
  for (tbuf **pp = &t->bufs; *pp != NULL; pp = &(*pp)->next)
    if (*pp == b) { *pp = b->next; break; }
  b->next = NULL;
  mp_store_relaxed(&b->owner, NULL);
}

static void tb_thread_exit(void *arg) {
  tbuf *b = arg;
  pthread_mutex_lock(&glock);
  detach_locked(b);
  pthread_mutex_unlock(&glock);
  if (tls_tb == b) tls_tb = NULL;
  free(b);
}

static MP_NOINLINE void record_slow(mp_trace *t, const trace_ev *e) {
  pthread_mutex_lock(&glock);
  tbuf *b = tls_tb;
  if (b == NULL) {
    b = calloc(1, sizeof *b);
    if (b == NULL || pthread_setspecific(tb_key, b) != 0) {
      free(b);
      t->lost++;
      pthread_mutex_unlock(&glock);
      return;
    }
    tls_tb = b;
  }
  if (mp_load_relaxed(&b->owner) != t) {
    detach_locked(b);
    b->next = t->bufs;
    t->bufs = b;
    mp_store_relaxed(&b->owner, t);
  }
  if (b->n == TB_EVENTS) spill_locked(t, b);
  b->ev[b->n++] = *e;
  pthread_mutex_unlock(&glock);
}

static inline void record(mp_trace *t, const trace_ev *e) {
  tbuf *b = tls_tb;
  if (MP_LIKELY(b != NULL && mp_load_relaxed(&b->owner) == t && b->n < TB_EVENTS))
    b->ev[b->n++] = *e;
  else
    record_slow(t, e);
}

uint64_t mp_trace_seq(mp_trace *t) { return mp_fetch_add_relaxed(&t->seq, 1); }

void mp_trace_alloc(mp_trace *t, const void *p, size_t size, const void *stream) {
  trace_ev e = {mp_fetch_add_relaxed(&t->seq, 1), (uint64_t)(uintptr_t)p, size,
                (uint64_t)(uintptr_t)stream};
  record(t, &e);
}

void mp_trace_free(mp_trace *t, uint64_t seq, const void *p, const void *stream) {
  trace_ev e = {seq, (uint64_t)(uintptr_t)p, EV_FREE, (uint64_t)(uintptr_t)stream};
  record(t, &e);
}

/* --------------------------------------------------------------- write */

static int ev_cmp(const void *a, const void *b) {
  uint64_t x = ((const trace_ev *)a)->seq, y = ((const trace_ev *)b)->seq;
  return x < y ? -1 : x > y;
}

/* Open addressing, keys are addresses (never 0 for a live block). */
typedef struct {
  uint64_t *key, *val;
  size_t cap;
} map;

static size_t map_slot(const map *m, uint64_t k) {
  size_t i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 17) & (m->cap - 1);
  while (m->key[i] != 0 && m->key[i] != k) i = (i + 1) & (m->cap - 1);
  return i;
}

static uint64_t stream_number(uint64_t *streams, size_t *nstreams, size_t cap, uint64_t s) {
  for (size_t i = 0; i < *nstreams; i++)
    if (streams[i] == s) return i;
  if (*nstreams < cap) streams[(*nstreams)++] = s;
  return *nstreams - 1;
}

/* Writes the text trace; glock held, every buffer of t spilled. */
static void write_locked(mp_trace *t) {
  trace_ev *ev = NULL;
  size_t n = (size_t)t->spilled;
  FILE *out = fopen(t->path, "w");
  if (out == NULL) {
    fprintf(stderr, "magpool: cannot write the trace %s\n", t->path);
    return;
  }
  if (n != 0 && t->spill != NULL && (ev = malloc(n * sizeof *ev)) != NULL) {
    fflush(t->spill);
    rewind(t->spill);
    n = fread(ev, sizeof *ev, n, t->spill);
  } else {
    n = 0;
  }
  if (n > 1) qsort(ev, n, sizeof *ev, ev_cmp);
  map m = {NULL, NULL, 64};
  while (m.cap < 2 * n) m.cap *= 2;
  m.key = calloc(m.cap, sizeof *m.key);
  m.val = calloc(m.cap, sizeof *m.val);
  enum { MAX_STREAMS = 4096 };
  uint64_t *streams = malloc(MAX_STREAMS * sizeof *streams);
  size_t nstreams = 0;
  uint64_t next_id = 0, unmatched = 0;
  fprintf(out, "# magpool trace: a ID SIZE STREAM / f ID STREAM\n# %s\n", t->header);
  if (m.key == NULL || m.val == NULL || streams == NULL) n = 0;
  for (size_t i = 0; i < n; i++) {
    const trace_ev *e = &ev[i];
    uint64_t sn = stream_number(streams, &nstreams, MAX_STREAMS, e->stream);
    size_t k = map_slot(&m, e->ptr);
    if (e->size != EV_FREE) {
      m.key[k] = e->ptr;
      m.val[k] = next_id;
      fprintf(out, "a %llu %llu %llu\n", (unsigned long long)next_id++,
              (unsigned long long)e->size, (unsigned long long)sn);
    } else if (m.key[k] == e->ptr) {
      fprintf(out, "f %llu %llu\n", (unsigned long long)m.val[k], (unsigned long long)sn);
      /* Delete, keeping the probe chains whole: re-insert the run after. */
      m.key[k] = 0;
      for (size_t j = (k + 1) & (m.cap - 1); m.key[j] != 0; j = (j + 1) & (m.cap - 1)) {
        uint64_t kk = m.key[j], vv = m.val[j];
        m.key[j] = 0;
        size_t s = map_slot(&m, kk);
        m.key[s] = kk;
        m.val[s] = vv;
      }
    } else {
      unmatched++;
    }
  }
  fprintf(out, "# end: %llu allocations, %zu streams", (unsigned long long)next_id, nstreams);
  if (t->lost != 0 || unmatched != 0)
    fprintf(out, ", %llu events lost, %llu frees unmatched", (unsigned long long)t->lost,
            (unsigned long long)unmatched);
  fprintf(out, "\n");
  if (fclose(out) != 0) fprintf(stderr, "magpool: error writing the trace %s\n", t->path);
  free(streams);
  free(m.key);
  free(m.val);
  free(ev);
}

static void finish_locked(mp_trace *t) {
  if (t->done) return;
  while (t->bufs != NULL) detach_locked(t->bufs);
  write_locked(t);
  t->done = true;
  if (t->spill != NULL) fclose(t->spill);
  t->spill = NULL;
}

/* Process exit: pools still open (a PyTorch process never destroys its
 * pools) get their trace written now; later events are dropped. */
static void trace_atexit(void) {
  pthread_mutex_lock(&glock);
  for (mp_trace *t = open_traces; t != NULL; t = t->next) finish_locked(t);
  pthread_mutex_unlock(&glock);
}

/* ---------------------------------------------------------- open/close */

static char *expand_path(const char *path, uint64_t uid, bool *taken) {
  size_t len = strlen(path) + 64;
  char *s = malloc(len);
  if (s == NULL) return NULL;
  size_t o = 0;
  for (const char *p = path; *p != '\0' && o + 24 < len; p++) {
    if (p[0] == '%' && p[1] == 'p') {
      o += (size_t)snprintf(s + o, len - o, "%ld", (long)getpid());
      p++;
    } else {
      s[o++] = *p;
    }
  }
  s[o] = '\0';
  *taken = false;
  for (mp_trace *t = open_traces; t != NULL; t = t->next)
    if (strcmp(t->path, s) == 0) *taken = true;
  if (*taken) snprintf(s + o, len - o, ".%llu", (unsigned long long)uid);
  return s;
}

int mp_trace_open(mp_trace **out, const char *path, uint64_t uid, const char *header) {
  mp_trace *t = calloc(1, sizeof *t);
  if (t == NULL) return MAGPOOL_ENOMEM;
  pthread_mutex_lock(&glock);
  if (!tb_key_made) {
    if (pthread_key_create(&tb_key, tb_thread_exit) != 0) {
      pthread_mutex_unlock(&glock);
      free(t);
      return MAGPOOL_ENOMEM;
    }
    tb_key_made = true;
    atexit(trace_atexit);
  }
  bool taken;
  t->path = expand_path(path, uid, &taken);
  FILE *probe = t->path != NULL ? fopen(t->path, "a") : NULL;
  t->spill = probe != NULL ? tmpfile() : NULL;
  if (t->spill == NULL) {
    pthread_mutex_unlock(&glock);
    if (probe != NULL) fclose(probe);
    free(t->path);
    free(t);
    return MAGPOOL_EINVAL;
  }
  fclose(probe);
  snprintf(t->header, sizeof t->header, "%s", header != NULL ? header : "");
  t->next = open_traces;
  open_traces = t;
  pthread_mutex_unlock(&glock);
  *out = t;
  return 0;
}

void mp_trace_close(mp_trace *t) {
  if (t == NULL) return;
  pthread_mutex_lock(&glock);
  finish_locked(t);
  for (mp_trace **pp = &open_traces; *pp != NULL; pp = &(*pp)->next)
    if (*pp == t) { *pp = t->next; break; }
  pthread_mutex_unlock(&glock);
  free(t->path);
  free(t);
}
