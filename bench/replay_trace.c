/* replay_trace.c - loading a trace into compact arrays, and small helpers.
 *
 * Format (one event a line; `#` lines and blank lines are skipped):
 *   a ID SIZE STREAM   allocate SIZE bytes on stream number STREAM
 *   f ID STREAM        free allocation ID on stream number STREAM
 *
 * IDs map to slots through an open-addressing hash table (linear probing,
 * deletion by backward shift), so loading is O(events) whatever the IDs
 * are.  An ID may be allocated again once it was freed.  A free of an ID
 * that is not live is dropped and counted (a recording that began while
 * allocations were live has such frees); an allocation of an ID that is
 * still live is an error.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "replay.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

uint64_t replay_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t replay_tick(void) {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return replay_now_ns();
#endif
}

void replay_evict(const replay_opts *o) {
  volatile unsigned char *b = o->evict_buf;
  for (size_t k = 0; k < o->evict; k += 64) b[k] = (unsigned char)(b[k] + 1);
}

void replay_clock_start(replay_clock *c) {
  c->ticks = 0;
  c->ns0 = replay_now_ns();
  c->tick0 = replay_tick();
}

uint64_t replay_clock_ns(const replay_opts *o, const replay_clock *c) {
  const uint64_t ns = replay_now_ns() - c->ns0;
  if (o->evict == 0) return ns;
  const uint64_t ticks = replay_tick() - c->tick0;
  return ticks == 0 ? 0 : (uint64_t)((double)c->ticks * (double)ns / (double)ticks);
}

void replay_csv_row(FILE *f, size_t event, uint64_t live, uint64_t reserved, const char *alloc,
                    const char *trace, int pass) {
  fprintf(f, "%zu,%llu,%llu,%s,%s,%d\n", event, (unsigned long long)live,
          (unsigned long long)reserved, alloc, trace, pass);
}

void replay_fill(replay_result *res, int passes, enum replay_status status) {
  for (int p = 0; p < passes; p++) {
    memset(&res[p], 0, sizeof res[p]);
    res[p].status = status;
  }
}

/* ------------------------------------------------------------------ */
/* ID -> slot                                                         */
/* ------------------------------------------------------------------ */

typedef struct idmap {
  uint64_t *key;
  uint32_t *val;
  unsigned char *used;
  size_t cap, n; /* cap a power of two; n <= cap / 2 */
} idmap;

static size_t id_hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return (size_t)x;
}

static int idmap_init(idmap *m, size_t cap) {
  m->cap = cap;
  m->n = 0;
  m->key = malloc(cap * sizeof *m->key);
  m->val = malloc(cap * sizeof *m->val);
  m->used = calloc(cap, 1);
  return (m->key && m->val && m->used) ? 0 : -1;
}

static void idmap_fini(idmap *m) {
  free(m->key);
  free(m->val);
  free(m->used);
}

/* The index where key is, or the empty index where it would go. */
static size_t idmap_find(const idmap *m, uint64_t key) {
  size_t mask = m->cap - 1, i = id_hash(key) & mask;
  while (m->used[i] && m->key[i] != key) i = (i + 1) & mask;
  return i;
}

static int idmap_grow(idmap *m) {
  idmap big;
  if (idmap_init(&big, m->cap * 2) != 0) {
    idmap_fini(&big);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->used[i]) {
      size_t j = idmap_find(&big, m->key[i]);
      big.used[j] = 1, big.key[j] = m->key[i], big.val[j] = m->val[i];
    }
  big.n = m->n;
  idmap_fini(m);
  *m = big;
  return 0;
}

/* Removes the entry at i (backward-shift deletion keeps probes short and
 * needs no tombstones). */
static void idmap_erase(idmap *m, size_t i) {
  size_t mask = m->cap - 1, j = i;
  m->used[i] = 0;
  m->n--;
  for (;;) {
    j = (j + 1) & mask;
    if (!m->used[j]) return;
    size_t home = id_hash(m->key[j]) & mask;
    /* Move j back to i unless its home lies cyclically in (i, j]. */
    int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    m->key[i] = m->key[j], m->val[i] = m->val[j], m->used[i] = 1;
    m->used[j] = 0;
    i = j;
  }
}

/* ------------------------------------------------------------------ */
/* Loading                                                            */
/* ------------------------------------------------------------------ */

static char *trace_name(const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t n = strlen(base);
  static const char *const suffixes[] = {".trace.gz", ".gz", ".trace"};
  for (size_t k = 0; k < sizeof suffixes / sizeof suffixes[0]; k++) {
    size_t s = strlen(suffixes[k]);
    if (n > s && strcmp(base + n - s, suffixes[k]) == 0) {
      n -= s;
      break;
    }
  }
  char *name = malloc(n + 1);
  if (name) memcpy(name, base, n), name[n] = '\0';
  return name;
}

static int is_gzip(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return -1;
  unsigned char m[2] = {0, 0};
  size_t got = fread(m, 1, 2, f);
  fclose(f);
  return got == 2 && m[0] == 0x1f && m[1] == 0x8b;
}

/* popen's command for `gzip -dc -- PATH`, PATH single-quoted. */
static char *gzip_command(const char *path) {
  size_t n = strlen(path), len = sizeof "gzip -dc -- ''" + 4 * n;
  char *cmd = malloc(len), *w = cmd;
  if (cmd == NULL) return NULL;
  w += sprintf(w, "gzip -dc -- '");
  for (const char *r = path; *r; r++) {
    if (*r == '\'') w += sprintf(w, "'\\''");
    else *w++ = *r;
  }
  *w++ = '\'';
  *w = '\0';
  return cmd;
}

/* Parses an unsigned decimal at *p, then skips blanks.  -1 if none. */
static int parse_u64(char **p, uint64_t *out) {
  char *s = *p;
  while (*s == ' ' || *s == '\t') s++;
  if (*s < '0' || *s > '9') return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0) return -1;
  while (*end == ' ' || *end == '\t') end++;
  *p = end;
  *out = v;
  return 0;
}

typedef struct grow_buf {
  void *p;
  size_t n, cap, elem;
} grow_buf;

static void *grow_push(grow_buf *b) {
  if (b->n == b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    void *q = realloc(b->p, cap * b->elem);
    if (q == NULL) return NULL;
    b->p = q, b->cap = cap;
  }
  return (char *)b->p + b->elem * b->n++;
}

int replay_trace_load(const char *path, replay_trace *out) {
  memset(out, 0, sizeof *out);
  int gz = is_gzip(path);
  if (gz < 0) {
    fprintf(stderr, "magpool-replay: %s: %s\n", path, strerror(errno));
    return -1;
  }
  FILE *f;
  if (gz) {
    char *cmd = gzip_command(path);
    f = cmd ? popen(cmd, "r") : NULL;
    free(cmd);
  } else {
    f = fopen(path, "r");
  }
  if (f == NULL) {
    fprintf(stderr, "magpool-replay: %s: cannot open: %s\n", path, strerror(errno));
    return -1;
  }

  grow_buf ev = {NULL, 0, 0, sizeof(replay_event)};
  grow_buf sz = {NULL, 0, 0, sizeof(uint64_t)};
  idmap ids;
  int rc = -1;
  char *line = NULL;
  size_t linecap = 0, lineno = 0;
  uint64_t live = 0, peak = 0, maxstream = 0;
  if (idmap_init(&ids, 1024) != 0) goto oom;

  while (getline(&line, &linecap, f) >= 0) {
    lineno++;
    char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '#' || *p == '\n' || *p == '\r' || *p == '\0') continue;
    char op = *p++;
    uint64_t id, size = 0, stream;
    if ((op != 'a' && op != 'f') || (*p != ' ' && *p != '\t') || parse_u64(&p, &id) != 0 ||
        (op == 'a' && parse_u64(&p, &size) != 0) || parse_u64(&p, &stream) != 0 ||
        (*p != '\n' && *p != '\r' && *p != '\0')) {
      fprintf(stderr, "magpool-replay: %s:%zu: not `a ID SIZE STREAM` or `f ID STREAM`\n", path,
              lineno);
      goto out;
    }
    if (stream >= REPLAY_MAX_STREAMS) {
      fprintf(stderr, "magpool-replay: %s:%zu: stream number %llu (at most %u)\n", path, lineno,
              (unsigned long long)stream, REPLAY_MAX_STREAMS - 1);
      goto out;
    }
    if (size > (uint64_t)SIZE_MAX / 2) {
      fprintf(stderr, "magpool-replay: %s:%zu: size %llu too large\n", path, lineno,
              (unsigned long long)size);
      goto out;
    }
    size_t i = idmap_find(&ids, id);
    if (op == 'a') {
      if (ids.used[i]) {
        fprintf(stderr, "magpool-replay: %s:%zu: ID %llu allocated while still live\n", path,
                lineno, (unsigned long long)id);
        goto out;
      }
      if (sz.n >= REPLAY_MAX_SLOTS) {
        fprintf(stderr, "magpool-replay: %s: more than %u allocations\n", path,
                REPLAY_MAX_SLOTS);
        goto out;
      }
      uint32_t slot = (uint32_t)sz.n;
      uint64_t *s = grow_push(&sz);
      replay_event *e = grow_push(&ev);
      if (s == NULL || e == NULL) goto oom;
      *s = size;
      e->op_stream = (uint32_t)stream;
      e->slot = slot;
      ids.used[i] = 1, ids.key[i] = id, ids.val[i] = slot, ids.n++;
      if (ids.n * 2 > ids.cap && idmap_grow(&ids) != 0) goto oom;
      live += size;
      if (live > peak) peak = live;
    } else {
      if (!ids.used[i]) {
        out->unknown_frees++;
        continue;
      }
      replay_event *e = grow_push(&ev);
      if (e == NULL) goto oom;
      e->op_stream = (uint32_t)stream | REPLAY_FREE_BIT;
      e->slot = ids.val[i];
      live -= ((uint64_t *)sz.p)[ids.val[i]];
      idmap_erase(&ids, i);
    }
    if (stream > maxstream) maxstream = stream;
  }
  if (ferror(f)) {
    fprintf(stderr, "magpool-replay: %s: read error\n", path);
    goto out;
  }
  rc = 0;
  goto out;
oom:
  fprintf(stderr, "magpool-replay: %s: out of memory loading the trace\n", path);
out:
  free(line);
  idmap_fini(&ids);
  if (gz) {
    int st = pclose(f);
    if (rc == 0 && st != 0) {
      fprintf(stderr, "magpool-replay: %s: gzip -dc failed (status %d)\n", path, st);
      rc = -1;
    }
  } else {
    fclose(f);
  }
  if (rc == 0 && ev.n == 0) {
    fprintf(stderr, "magpool-replay: %s: no events\n", path);
    rc = -1;
  }
  if (rc != 0) {
    free(ev.p);
    free(sz.p);
    return -1;
  }
  out->path = strdup(path);
  out->name = trace_name(path);
  out->ev = ev.p;
  out->nevents = ev.n;
  out->size = sz.p;
  out->nslots = sz.n;
  out->nstreams = (uint32_t)maxstream + 1;
  out->peak_live = peak;
  if (out->path == NULL || out->name == NULL) {
    replay_trace_free(out);
    fprintf(stderr, "magpool-replay: %s: out of memory\n", path);
    return -1;
  }
  if (out->unknown_frees)
    fprintf(stderr, "magpool-replay: %s: %zu frees of IDs that were not live were dropped\n",
            path, out->unknown_frees);
  return 0;
}

void replay_trace_free(replay_trace *t) {
  free(t->path);
  free(t->name);
  free(t->ev);
  free(t->size);
  memset(t, 0, sizeof *t);
}
