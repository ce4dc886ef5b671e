/* fuzz_api.c - libFuzzer harness: sequences of public API calls decoded
 * from the input, each checked against a reference model of the contracts
 * in include/magpool.h.  Public header only.
 *
 * One input is one run: a HOST pool created from a config taken from the
 * first bytes, then up to MAX_OPS operations, then teardown.  The model
 * keeps every live block as [ptr, ptr + usable) with its requested size,
 * its scope and its tag, and after each operation compares:
 *
 *   - no two live blocks overlap; each is aligned to its block size and
 *     lies in the pool; its first word (a serial number written at
 *     allocation) is intact when it is freed;
 *   - requested_bytes, live_count, alloc_count and free_count, exactly;
 *     used_bytes (the sum of live block sizes) and the conservation
 *     used + cached + pending + free == reserved once every host stream
 *     the pool uses has been synchronised (their callbacks run on the
 *     streams' own threads, so the stats are exact only then);
 *   - every error code: NULL arguments, bad configs, foreign, interior,
 *     dead and scope-owned pointers, wrong sizes - MAGPOOL_EINVAL, and
 *     the stats identical before and after;
 *   - the out-of-memory promise: a request that fits in region 0 (the
 *     model knows which aligned ranges no live block covers) must succeed,
 *     one that fits nowhere must fail with MAGPOOL_ENOMEM;
 *   - magpool_check on the quiescent pool; and after everything is freed,
 *     the streams are drained and the pool trimmed, the pool is one free
 *     block per region again (a power-of-two pool allocates its whole
 *     reserved size as one block);
 *   - tracking: leak_check reports exactly the live blocks, with their
 *     requested sizes and tags, whenever tracking is on;
 *   - stream order: a gate task can hold a host stream; a block freed on
 *     it meanwhile must not reach any other allocation (another stream,
 *     the synchronous API, a scope) before the gate opens;
 *   - half the runs record a trace (trace_path), so that ASan sees the
 *     recorder through every trim and call until destroy writes it.
 *
 * Any violation prints what was expected and abort()s.  Determinism: no
 * clock and no randomness but the input; the only thing that varies from
 * run to run is when host-stream callbacks run, and every check that
 * depends on it waits for the streams first.
 *
 * Input format: a byte stream read front to back; a read past the end
 * gives 0.  Config bytes first (decode_config), then operations: one byte
 * selects the operation (the table `ops` at the end, modulo its length),
 * and the bytes after it are that operation's arguments.  The seeds in
 * corpus/ come from make_corpus.py.
 *
 * Environment: MAGPOOL_FUZZ_TRACE=1 prints each operation;
 * MAGPOOL_FUZZ_LAX_EINVAL=1 relaxes the EINVAL-changes-nothing check
 * (probe_end).
 */
#include <magpool.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#define MAX_OPS 256
#define MAX_LIVE 512
#define MAX_DEAD 32
#define MAX_POOL (64 * MiB) /* largest pool, growth included */
#define NSTREAMS 2
#define NSCOPES 2
#define MAX_SPANS 1024 /* blocks freed on streams, not yet settled */

/* ------------------------------------------------------------------ */
/* failure reports                                                    */
/* ------------------------------------------------------------------ */

static unsigned cur_step;
static const char *cur_op = "create";

static void fail(int line, const char *cond, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "\nfuzz_api.c:%d: model violation at step %u (%s): %s\n  ", line, cur_step,
          cur_op, cond);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  abort();
}

#define CHECK(cond, ...)                                                                     \
  do {                                                                                       \
    if (!(cond)) fail(__LINE__, #cond, __VA_ARGS__);                                         \
  } while (0)

/* ------------------------------------------------------------------ */
/* input                                                              */
/* ------------------------------------------------------------------ */

typedef struct rd {
  const uint8_t *p;
  size_t n;
} rd;

static uint8_t u8(rd *r) {
  if (r->n == 0) return 0;
  r->n--;
  return *r->p++;
}

static uint16_t u16(rd *r) {
  uint16_t lo = u8(r);
  return (uint16_t)(lo | (uint16_t)u8(r) << 8);
}

static uint32_t u32(rd *r) {
  uint32_t lo = u16(r);
  return lo | (uint32_t)u16(r) << 16;
}

static uint64_t u64(rd *r) {
  uint64_t lo = u32(r);
  return lo | (uint64_t)u32(r) << 32;
}

/* ------------------------------------------------------------------ */
/* size arithmetic                                                    */
/* ------------------------------------------------------------------ */

static bool is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

static size_t top_bit(size_t x) { /* x > 0 */
  size_t b = 1;
  while (x >> 1 >= b) b <<= 1;
  return b;
}

static size_t next_pow2(size_t x) { /* x <= 2^62 */
  size_t b = 1;
  while (b < x) b <<= 1;
  return b;
}

/* ------------------------------------------------------------------ */
/* the model                                                          */
/* ------------------------------------------------------------------ */

/* A block freed on a stream that may not be back in the tree yet: in the
 * thread's cache for the stream, retired behind it, or ready.  `fenced`:
 * freed while the stream was held behind a gate, so the stream has not
 * passed the free - no allocation but the same block again on the same
 * stream may overlap it until the gate opens. */
typedef struct span {
  char *p;
  size_t n;
  int s;
  bool fenced;
  bool retired; /* a trim or release since: behind the stream for sure */
} span;

typedef struct blk {
  char *p;
  size_t req, usable;
  uint64_t serial;
  int scope;       /* index into M.scope, or -1 */
  const char *tag; /* tag at allocation, when tracked */
} blk;

static struct model {
  magpool_t *pool;
  size_t mb;         /* min_block */
  size_t S;          /* region 0: pool_size rounded down to min_block */
  int growth;
  size_t max;        /* max_pool_size (0: none) */
  uintptr_t base;    /* region 0's base, learned at create */
  blk live[MAX_LIVE];
  size_t nlive;
  void *dead[MAX_DEAD]; /* freed pointers, for double frees */
  unsigned ndead, dead_next;
  uint64_t allocs, frees, serial;
  bool tracking;
  const char *tag;
  magpool_scope_t *scope[NSCOPES];
  bool stream_used[NSTREAMS]; /* the pool has seen this stream since its release */
  bool unsynced;              /* a release may have left callbacks in flight */
  span spans[MAX_SPANS];
  size_t nspans;
  bool spans_lost;            /* spans overflowed: assume the worst */
  size_t peak;                /* peak_used_bytes last seen */
} M;

/* Host streams: made on first use, kept across pools and inputs (released
 * from each pool before it is destroyed); stream_recycle destroys one. */
static magpool_stream_t streams[NSTREAMS];

/* A buffer no pool owns, for foreign frees (and a fake stream handle:
 * readable memory that is not a host stream). */
static _Alignas(4096) char foreign_buf[64 * KiB];

static const char *const tags[] = {NULL, "fuzz-a", "fuzz-b"};

static size_t model_used(void) {
  size_t s = 0;
  for (size_t i = 0; i < M.nlive; i++) s += M.live[i].usable;
  return s;
}

static size_t model_requested(void) {
  size_t s = 0;
  for (size_t i = 0; i < M.nlive; i++) s += M.live[i].req;
  return s;
}

static long find_live(const void *p) {
  for (size_t i = 0; i < M.nlive; i++)
    if (M.live[i].p == p) return (long)i;
  return -1;
}

static bool any_stream_used(void) {
  for (int i = 0; i < NSTREAMS; i++)
    if (M.stream_used[i]) return true;
  return false;
}

/* No stream callback can be in flight, nor start during the next call:
 * the stats are exact. */
static bool streams_quiet(void) { return !any_stream_used() && !M.unsynced; }

/* Block size for a request; 0 if no block could ever hold it. */
static size_t block_for(size_t size) {
  if (size <= M.mb) return M.mb;
  if (size > ((size_t)1 << 62)) return 0;
  return next_pow2(size);
}

static int cmp_iv(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

/* Does an aligned block of B bytes fit in region 0 next to the live
 * blocks?  Region 0 is [base, base + S) with base aligned past S, and its
 * tree places a block of B bytes at any B-aligned offset inside it. */
static bool fits_region0(size_t B, bool spans_too) {
  if (B == 0 || B > M.S) return false;
  static uintptr_t iv[MAX_LIVE + MAX_SPANS][2];
  size_t n = 0;
  for (size_t i = 0; i < M.nlive; i++) {
    uintptr_t off = (uintptr_t)M.live[i].p - M.base;
    if (off < M.S) {
      iv[n][0] = off;
      iv[n][1] = off + M.live[i].usable;
      n++;
    }
  }
  for (size_t i = 0; spans_too && i < M.nspans; i++) {
    uintptr_t off = (uintptr_t)M.spans[i].p - M.base;
    if (off < M.S) {
      iv[n][0] = off;
      iv[n][1] = off + M.spans[i].n;
      n++;
    }
  }
  qsort(iv, n, sizeof iv[0], cmp_iv);
  uintptr_t cur = 0;
  for (size_t i = 0; i <= n; i++) {
    uintptr_t end = i < n ? iv[i][0] : M.S;
    uintptr_t x = (cur + B - 1) & ~(uintptr_t)(B - 1);
    if (x + B <= end) return true;
    if (i < n && iv[i][1] > cur) cur = iv[i][1];
  }
  return false;
}

static void model_add(char *p, size_t req, size_t usable, int scope) {
  CHECK(M.nlive < MAX_LIVE, "model full");
  blk *b = &M.live[M.nlive++];
  b->p = p;
  b->req = req;
  b->usable = usable;
  b->serial = ++M.serial;
  b->scope = scope;
  b->tag = M.tracking ? M.tag : NULL;
  memcpy(p, &b->serial, sizeof b->serial); /* every block is >= 16 bytes */
  M.allocs++;
}

static void model_remove(size_t i) {
  blk *b = &M.live[i];
  uint64_t s;
  memcpy(&s, b->p, sizeof s);
  CHECK(s == b->serial,
        "block %p (serial %llu) was overwritten while live: first word %llu", (void *)b->p,
        (unsigned long long)b->serial, (unsigned long long)s);
  M.dead[M.dead_next] = b->p;
  M.dead_next = (M.dead_next + 1) % MAX_DEAD;
  if (M.ndead < MAX_DEAD) M.ndead++;
  M.live[i] = M.live[--M.nlive];
  M.frees++;
}

/* ------------------------------------------------------------------ */
/* streams                                                            */
/* ------------------------------------------------------------------ */

static magpool_stream_t stream_get(int i) {
  if (streams[i] == NULL) {
    int rc = magpool_host_stream_create(&streams[i]);
    CHECK(rc == 0 && streams[i] != NULL, "magpool_host_stream_create = %d", rc);
  }
  return streams[i];
}

/* Gates: a task that holds a host stream until the harness opens it, so
 * that "s has not passed the free" is known, not guessed.  While a gate
 * is closed, nothing may wait for its stream: not the harness (quiesce
 * skips it) and not the out-of-memory ladder, whose third rung waits for
 * every pending batch - so allocations that might need that rung are not
 * made (gated_alloc_ok). */
typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open;   /* what the tasks see */
  bool closed; /* the model: a gate task may be holding the stream */
} gate;

static gate gates[NSTREAMS] = {
  {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, true, false},
  {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, true, false},
};

static void gate_task(void *arg) {
  gate *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static bool any_gate_closed(void) {
  for (int i = 0; i < NSTREAMS; i++)
    if (gates[i].closed) return true;
  return false;
}

static void spans_settle(int i);

/* The stream is synchronised first: nothing runs ahead of the gate task,
 * so the stream is frozen from here on (quiesce may skip it). */
static void gate_close(int i) {
  gate *g = &gates[i];
  int rc = magpool_host_stream_sync(stream_get(i));
  CHECK(rc == 0, "magpool_host_stream_sync = %d", rc);
  spans_settle(i);
  pthread_mutex_lock(&g->mu);
  g->open = false;
  pthread_mutex_unlock(&g->mu);
  rc = magpool_host_stream_launch(stream_get(i), gate_task, g);
  CHECK(rc == 0, "magpool_host_stream_launch = %d", rc);
  g->closed = true;
}

static void gate_open(int i) {
  gate *g = &gates[i];
  if (!g->closed) return;
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  g->closed = false;
  /* Callbacks queued behind the gate run from now on: the stats are not
   * exact before the next quiesce, and the stream may pass its frees at
   * any moment. */
  M.unsynced = true;
  for (size_t k = 0; k < M.nspans; k++)
    if (M.spans[k].s == i) M.spans[k].fenced = false;
}

static void gates_open(void) {
  for (int i = 0; i < NSTREAMS; i++) gate_open(i);
}

/* A block freed on stream i. */
static void span_add(char *p, size_t n, int i) {
  if (M.nspans == MAX_SPANS) {
    M.spans_lost = true;
    return;
  }
  span *sp = &M.spans[M.nspans++];
  sp->p = p;
  sp->n = n;
  sp->s = i;
  sp->fenced = gates[i].closed;
  sp->retired = false;
}

/* A trim or release: blocks freed on the stream (every stream: -1) are
 * retired behind it now. */
static void spans_retire(int i) {
  for (size_t k = 0; k < M.nspans; k++)
    if (i < 0 || M.spans[k].s == i) M.spans[k].retired = true;
}

/* Stream i was synchronised: its retired blocks are ready (a later call
 * drains them) or in the tree. */
static void spans_settle(int i) {
  for (size_t k = M.nspans; k-- > 0;)
    if (M.spans[k].s == i && M.spans[k].retired) M.spans[k] = M.spans[--M.nspans];
}

/* Waits for every host stream not held by a gate: afterwards no callback
 * is in flight (gated streams run nothing) and the stats are exact. */
static void quiesce(void) {
  for (int i = 0; i < NSTREAMS; i++)
    if (streams[i] != NULL && !gates[i].closed) {
      int rc = magpool_host_stream_sync(streams[i]);
      CHECK(rc == 0, "magpool_host_stream_sync = %d", rc);
      spans_settle(i);
    }
  M.unsynced = false;
}

static void release_stream(int i) {
  if (streams[i] == NULL) return;
  int rc = magpool_stream_release(M.pool, streams[i]);
  CHECK(rc == 0, "magpool_stream_release(stream %d) = %d", i, rc);
  if (M.stream_used[i]) M.unsynced = true;
  M.stream_used[i] = false;
  spans_retire(i);
}

/* ------------------------------------------------------------------ */
/* checks                                                             */
/* ------------------------------------------------------------------ */

static magpool_stats_t stats_now(void) {
  magpool_stats_t st;
  memset(&st, 0xA5, sizeof st);
  int rc = magpool_get_stats(M.pool, &st);
  CHECK(rc == 0, "magpool_get_stats = %d", rc);
  return st;
}

/* The fields that say what is allocated. */
static bool stats_equal_live(const magpool_stats_t *a, const magpool_stats_t *b) {
  return a->used_bytes == b->used_bytes && a->requested_bytes == b->requested_bytes &&
         a->reserved_bytes == b->reserved_bytes && a->alloc_count == b->alloc_count &&
         a->free_count == b->free_count && a->live_count == b->live_count &&
         a->grow_count == b->grow_count;
}

/* All of them: where the free memory is, too. */
static bool stats_equal(const magpool_stats_t *a, const magpool_stats_t *b) {
  return stats_equal_live(a, b) && a->peak_used_bytes == b->peak_used_bytes &&
         a->cached_bytes == b->cached_bytes && a->pending_bytes == b->pending_bytes &&
         a->free_bytes == b->free_bytes && a->largest_free_block == b->largest_free_block;
}

static void print_stats(const char *what, const magpool_stats_t *s) {
  fprintf(stderr,
          "  %s: used %zu requested %zu reserved %zu peak %zu cached %zu pending %zu free %zu "
          "largest %zu allocs %llu frees %llu live %llu grows %llu\n",
          what, s->used_bytes, s->requested_bytes, s->reserved_bytes, s->peak_used_bytes,
          s->cached_bytes, s->pending_bytes, s->free_bytes, s->largest_free_block,
          (unsigned long long)s->alloc_count, (unsigned long long)s->free_count,
          (unsigned long long)s->live_count, (unsigned long long)s->grow_count);
}

/* What holds at any time on this single-threaded program's pool. */
static void check_counters(const magpool_stats_t *st) {
  CHECK(st->requested_bytes == model_requested(), "requested_bytes %zu, model %zu",
        st->requested_bytes, model_requested());
  CHECK(st->live_count == M.nlive, "live_count %llu, model %zu",
        (unsigned long long)st->live_count, M.nlive);
  CHECK(st->alloc_count == M.allocs && st->free_count == M.frees,
        "alloc_count %llu free_count %llu, model %llu %llu", (unsigned long long)st->alloc_count,
        (unsigned long long)st->free_count, (unsigned long long)M.allocs,
        (unsigned long long)M.frees);
  if (st->grow_count == 0)
    CHECK(st->reserved_bytes == M.S, "reserved %zu without growth, pool %zu", st->reserved_bytes,
          M.S);
  else
    CHECK(M.growth && st->reserved_bytes > M.S && (M.max == 0 || st->reserved_bytes <= M.max),
          "reserved %zu after %llu growths (growth %d, pool %zu, max %zu)", st->reserved_bytes,
          (unsigned long long)st->grow_count, M.growth, M.S, M.max);
}

/* The exact checks, valid once no stream callback is in flight. */
static void check_quiescent_stats(const magpool_stats_t *st) {
  CHECK(st->used_bytes == model_used(), "used_bytes %zu, model %zu", st->used_bytes,
        model_used());
  if (!any_gate_closed())
    CHECK(st->pending_bytes == 0, "pending_bytes %zu with every stream synchronised",
          st->pending_bytes);
  CHECK(st->used_bytes + st->cached_bytes + st->pending_bytes + st->free_bytes ==
            st->reserved_bytes,
        "used %zu + cached %zu + pending %zu + free %zu != reserved %zu", st->used_bytes,
        st->cached_bytes, st->pending_bytes, st->free_bytes, st->reserved_bytes);
  CHECK(st->largest_free_block <= st->free_bytes, "largest free block %zu > free %zu",
        st->largest_free_block, st->free_bytes);
  CHECK(st->peak_used_bytes >= st->used_bytes + st->cached_bytes,
        "peak %zu < used %zu + cached %zu", st->peak_used_bytes, st->used_bytes,
        st->cached_bytes);
  size_t fb = 0, tb = 0;
  int rc = magpool_mem_info(M.pool, &fb, &tb);
  CHECK(rc == 0, "magpool_mem_info = %d", rc);
  CHECK(fb == st->free_bytes + st->cached_bytes && tb == st->reserved_bytes,
        "mem_info free %zu total %zu; stats free %zu + cached %zu, reserved %zu", fb, tb,
        st->free_bytes, st->cached_bytes, st->reserved_bytes);
}

/* leak_check callback: every report is a live block, once, as allocated. */
typedef struct leak_ctx {
  bool seen[MAX_LIVE];
  long n;
} leak_ctx;

static void leak_cb(void *ptr, size_t size, const char *tag, void *arg) {
  leak_ctx *c = arg;
  long i = find_live(ptr);
  CHECK(i >= 0, "leak_check reports %p (size %zu), not a live block", ptr, size);
  CHECK(!c->seen[i], "leak_check reports %p twice", ptr);
  c->seen[i] = true;
  CHECK(M.live[i].req == size, "leak_check: %p size %zu, allocated with %zu", ptr, size,
        M.live[i].req);
  CHECK(M.live[i].tag == tag, "leak_check: %p tag %s, allocated under %s", ptr,
        tag ? tag : "(null)", M.live[i].tag ? M.live[i].tag : "(null)");
  c->n++;
}

static void check_leaks(void) {
  leak_ctx c;
  memset(&c, 0, sizeof c);
  long n = magpool_leak_check(M.pool, leak_cb, &c);
  if (!M.tracking) {
    CHECK(n < 0, "leak_check = %ld with tracking off", n);
    return;
  }
  CHECK(n == (long)M.nlive && c.n == n, "leak_check = %ld (%ld reported), %zu live", n, c.n,
        M.nlive);
  long n2 = magpool_leak_check(M.pool, NULL, NULL);
  CHECK(n2 == n, "leak_check without a callback = %ld, with one %ld", n2, n);
}

/* After every operation. */
static void check_light(void) {
  magpool_stats_t st = stats_now();
  check_counters(&st);
  CHECK(st.peak_used_bytes >= M.peak, "peak_used_bytes fell from %zu to %zu", M.peak,
        st.peak_used_bytes);
  M.peak = st.peak_used_bytes;
  if (streams_quiet()) check_quiescent_stats(&st);
  if (M.tracking) check_leaks();
}

/* Synchronise the streams, then everything, magpool_check included. */
static void check_full(void) {
  quiesce();
  magpool_stats_t st = stats_now();
  check_counters(&st);
  check_quiescent_stats(&st);
  int rc = magpool_check(M.pool);
  if (rc != 0) print_stats("stats", &st);
  CHECK(rc == 0, "magpool_check = %d on a quiescent pool", rc);
  check_leaks();
}

/* A call that must fail with MAGPOOL_EINVAL and change nothing. */
typedef struct einval_probe {
  magpool_stats_t before;
} einval_probe;

static void probe_begin(einval_probe *pr) {
  quiesce();
  pr->before = stats_now();
}

/* Found by this harness, and fixed (77c82fc): after the trim epoch moved
 * under the calling thread (magpool_tracking_enable, or a trim on another
 * thread), magpool_free_async and magpool_alloc_async on a stream returned
 * the thread's cache to the pool and only then found the pointer or the
 * stream invalid: MAGPOOL_EINVAL, with cached_bytes and free_bytes
 * changed.  The check is exact again; MAGPOOL_FUZZ_LAX_EINVAL=1 compares
 * only the fields of what is allocated. */
static void probe_end(einval_probe *pr, int rc, const char *call) {
  static int lax = -1;
  if (lax < 0) lax = getenv("MAGPOOL_FUZZ_LAX_EINVAL") != NULL;
  CHECK(rc == MAGPOOL_EINVAL, "%s = %d, want MAGPOOL_EINVAL", call, rc);
  quiesce();
  magpool_stats_t after = stats_now();
  bool same = lax ? stats_equal_live(&pr->before, &after) : stats_equal(&pr->before, &after);
  if (!same) {
    print_stats("before", &pr->before);
    print_stats("after ", &after);
  }
  CHECK(same, "%s failed with MAGPOOL_EINVAL but changed the stats", call);
}

/* ------------------------------------------------------------------ */
/* pool life                                                          */
/* ------------------------------------------------------------------ */

/* A valid config from the input (growth capped at MAX_POOL). */
static void decode_config(rd *r, magpool_config_t *cfg) {
  magpool_config_init(cfg);
  uint8_t a = u8(r), b = u8(r), c = u8(r), d = u8(r), e = u8(r), f = u8(r);
  size_t mb = (size_t)16 << (a % 13); /* 16 .. 65536 */
  size_t units;
  switch (b % 4) {
  case 0: units = (size_t)1 << (c % 12); break;                 /* power of two */
  case 1: units = 1 + (size_t)(c | (size_t)(b >> 2) << 8) % 4096; break; /* any */
  case 2: units = ((size_t)1 << (c % 10)) + 1; break;           /* just over */
  default: units = 1 + c % 64; break;                           /* tiny */
  }
  while (units > 1 && mb * units > MAX_POOL / 4) units >>= 1;
  cfg->min_block = mb;
  cfg->pool_size = mb * units + (d & 1 ? (size_t)(d >> 1) % mb : 0); /* rounded down */
  cfg->allow_growth = e & 1;
  size_t pool = cfg->pool_size;
  switch ((e >> 1) % 5) {
  case 0: cfg->max_pool_size = cfg->allow_growth ? MAX_POOL : 0; break;
  case 1: cfg->max_pool_size = pool; break;
  case 2: cfg->max_pool_size = 2 * pool; break;
  case 3: cfg->max_pool_size = pool + mb * (1 + f % 64); break;
  default: cfg->max_pool_size = MAX_POOL; break;
  }
  if (cfg->max_pool_size > MAX_POOL) cfg->max_pool_size = MAX_POOL;
  switch (f % 5) {
  case 0: cfg->thread_cache_bytes = 0; break;
  case 1: break; /* default 8 MiB, lowered to pool / 8 */
  case 2: cfg->thread_cache_bytes = mb * (1 + (f >> 3)); break;
  case 3: cfg->thread_cache_bytes = pool / 8; break;
  default: cfg->thread_cache_bytes = 4 * mb; break;
  }
  switch ((e >> 4) % 4) {
  case 0: cfg->stream_cache_bytes = 0; break;
  case 1: break; /* default 8 MiB */
  case 2: cfg->stream_cache_bytes = mb * (1 + (d >> 4)); break;
  default: cfg->stream_cache_bytes = 2 * mb; break;
  }
  switch ((a >> 4) % 4) {
  case 0: break; /* default 1 MiB */
  case 1: cfg->cache_max_block = mb; break;
  case 2: cfg->cache_max_block = 8 * mb; break;
  default: cfg->cache_max_block = 32 * MiB; break; /* lowered to 16 MiB */
  }
  cfg->capture_check = (a >> 6) & 1;
  /* Half the runs record a trace (trace.c), written at destroy: the
   * recorder must outlive every trim and take every call's event. */
  static char trace[256];
  if ((a >> 7) & 1) {
    const char *dir = getenv("TMPDIR");
    snprintf(trace, sizeof trace, "%s/magpool-fuzz-%%p.trace", dir != NULL ? dir : "/tmp");
    cfg->trace_path = trace;
  }
}

static void pool_create(rd *r) {
  magpool_config_t cfg;
  decode_config(r, &cfg);
  /* The model is of whole-region pools (block = power of two, aligned to
   * itself, inside region 0): a chunk larger than the pool and than
   * MAX_POOL keeps the pool unchunked (a growing pool rounds pool_size up
   * to whole chunks only within its max_pool_size, another rounds it down
   * only to 64 chunks or more).  Chunked pools are checked by tests/unit/test_chunks.c,
   * the replay tests and the stress harness. */
  cfg.chunk_size = (size_t)1 << 30;
  magpool_t *pool = NULL;
  int rc = magpool_create(&cfg, &pool);
  CHECK(rc == 0 && pool != NULL, "magpool_create(pool %zu, min_block %zu, max %zu) = %d",
        cfg.pool_size, cfg.min_block, cfg.max_pool_size, rc);
  memset(&M, 0, sizeof M);
  M.pool = pool;
  M.mb = cfg.min_block;
  M.S = cfg.pool_size & ~(cfg.min_block - 1);
  M.growth = cfg.allow_growth;
  M.max = cfg.max_pool_size;
  M.tag = NULL;
  magpool_set_tag(NULL);
  for (int i = 0; i < NSCOPES; i++) M.scope[i] = NULL;

  magpool_stats_t st = stats_now();
  CHECK(st.reserved_bytes == M.S && st.free_bytes == M.S && st.used_bytes == 0 &&
            st.largest_free_block == top_bit(M.S),
        "fresh pool of %zu: reserved %zu free %zu used %zu largest %zu", M.S, st.reserved_bytes,
        st.free_bytes, st.used_bytes, st.largest_free_block);
  /* The largest piece of region 0 starts at its base: learn the base. */
  void *p = magpool_alloc(pool, top_bit(M.S));
  CHECK(p != NULL, "fresh pool of %zu: alloc(%zu) failed (%d)", M.S, top_bit(M.S),
        magpool_last_error());
  uintptr_t align = next_pow2(M.S) < 4096 ? 4096 : next_pow2(M.S);
  M.base = (uintptr_t)p & ~(align - 1);
  CHECK((uintptr_t)p == M.base, "largest piece at %p, region base %p", p, (void *)M.base);
  rc = magpool_free(pool, p);
  CHECK(rc == 0, "free of the largest piece = %d", rc);
  M.allocs = M.frees = 1;
}

static void pool_teardown(void) {
  gates_open();
  for (int i = 0; i < NSCOPES; i++) {
    if (M.scope[i] == NULL) continue;
    int rc = magpool_scope_end(M.scope[i]);
    CHECK(rc == 0, "magpool_scope_end = %d", rc);
    for (size_t k = M.nlive; k-- > 0;)
      if (M.live[k].scope == i) model_remove(k);
    M.scope[i] = NULL;
  }
  /* Destroy wants every stream the pool used synchronised or released:
   * half the runs (by the parity of their allocation count) release,
   * the others only synchronise (check_full), so destroy meets live
   * stream entries too. */
  if (M.allocs & 1)
    for (int i = 0; i < NSTREAMS; i++) release_stream(i);
  check_full();
  /* Live blocks are allowed: destroy gives them back too. */
  int rc = magpool_destroy(M.pool);
  CHECK(rc == 0, "magpool_destroy = %d", rc);
  M.pool = NULL;
  char trace[256]; /* decode_config's path, %p expanded as the recorder does */
  const char *dir = getenv("TMPDIR");
  snprintf(trace, sizeof trace, "%s/magpool-fuzz-%ld.trace", dir != NULL ? dir : "/tmp",
           (long)getpid());
  (void)unlink(trace);
}

/* ------------------------------------------------------------------ */
/* operations                                                         */
/* ------------------------------------------------------------------ */

static size_t decode_size(rd *r) {
  uint8_t k = u8(r);
  switch (k % 12) {
  case 0: return 0;
  case 1: return 1 + u8(r) % (2 * M.mb);
  case 2: return 1 + (size_t)u16(r);
  case 3: return (size_t)1 << (u8(r) % 27);
  case 4: {
    size_t x = (size_t)1 << (u8(r) % 27);
    return (k >> 4) & 1 ? x + 1 : x - 1;
  }
  case 5: {
    size_t cands[] = {M.S, M.S - 1, M.S + 1, M.S / 2, M.S / 2 + 1, top_bit(M.S), M.max,
                      M.max + 1};
    return cands[u8(r) % (sizeof cands / sizeof cands[0])];
  }
  case 6: {
    size_t cands[] = {SIZE_MAX,
                      SIZE_MAX - 1,
                      SIZE_MAX / 2,
                      SIZE_MAX / 2 + 1,
                      (size_t)1 << 62,
                      ((size_t)1 << 62) + 1,
                      (size_t)1 << 40,
                      MAX_POOL + 1,
                      SIZE_MAX - M.mb + 1};
    return cands[u8(r) % (sizeof cands / sizeof cands[0])];
  }
  case 7: return u32(r) % (MAX_POOL + 1);
  default: return 1 + u8(r);
  }
}

enum alloc_via { VIA_SYNC, VIA_ASYNC_NULL, VIA_ASYNC_S0, VIA_ASYNC_S1, VIA_SCOPE0, VIA_SCOPE1 };

/* One allocation through any entry point, checked against the model. */
static void *do_alloc(size_t size, int via) {
  if (M.nlive == MAX_LIVE) return NULL;
  int scope = -1;
  if (via == VIA_SCOPE0 || via == VIA_SCOPE1) {
    scope = via - VIA_SCOPE0;
    if (M.scope[scope] == NULL) via = VIA_SYNC, scope = -1;
  }
  size_t B = block_for(size);
  magpool_stats_t before = stats_now();
  size_t room = 0;
  if (M.growth) {
    size_t cap = M.max != 0 ? M.max : MAX_POOL;
    room = cap > before.reserved_bytes ? (cap - before.reserved_bytes) & ~(M.mb - 1) : 0;
  }
  bool must_fit = B != 0 && (fits_region0(B, false) || (M.growth && room >= B));
  bool must_fail = B == 0 || (!M.growth && !fits_region0(B, false)) ||
                   (M.growth && M.max != 0 && B > M.max);
  /* A gate holds a stream: only requests that are served without waiting
   * for pending frees (the ladder's third rung would wait for the gated
   * stream forever).  B == 0 fails before any rung. */
  if (any_gate_closed() && B != 0 && (M.spans_lost || !fits_region0(B, true))) return NULL;
  int err0 = magpool_last_error();

  void *p;
  switch (via) {
  case VIA_SYNC: p = magpool_alloc(M.pool, size); break;
  case VIA_ASYNC_NULL: p = magpool_alloc_async(M.pool, size, NULL); break;
  case VIA_ASYNC_S0:
  case VIA_ASYNC_S1: {
    int s = via - VIA_ASYNC_S0;
    p = magpool_alloc_async(M.pool, size, stream_get(s));
    M.stream_used[s] = true;
    break;
  }
  default: p = magpool_scope_alloc(M.scope[scope], size); break;
  }

  if (p == NULL) {
    int err = magpool_last_error();
    if (must_fit) {
      print_stats("before", &before);
      magpool_stats_t after = stats_now();
      print_stats("after ", &after);
    }
    CHECK(!must_fit, "alloc(%zu) failed (%d) but a block of %zu fits (pool %zu, %zu live)",
          size, err, B, M.S, M.nlive);
    CHECK(err == MAGPOOL_ENOMEM, "alloc(%zu) failed with %d, want MAGPOOL_ENOMEM", size, err);
    return NULL;
  }
  CHECK(!must_fail, "alloc(%zu) = %p, but no block of %zu can fit", size, p, B);
  CHECK(magpool_last_error() == err0, "successful alloc changed last_error %d -> %d", err0,
        magpool_last_error());
  uintptr_t x = (uintptr_t)p;
  CHECK(x % B == 0, "alloc(%zu) = %p not aligned to its block size %zu", size, p, B);
  for (size_t i = 0; i < M.nlive; i++) {
    uintptr_t lo = (uintptr_t)M.live[i].p;
    CHECK(x + B <= lo || lo + M.live[i].usable <= x,
          "alloc(%zu) = [%p, +%zu) overlaps live block [%p, +%zu) (serial %llu)", size, p, B,
          (void *)M.live[i].p, M.live[i].usable, (unsigned long long)M.live[i].serial);
  }
  magpool_stats_t after = stats_now();
  if (after.grow_count == before.grow_count && before.grow_count == 0)
    CHECK(x - M.base < M.S && x - M.base + B <= M.S,
          "alloc(%zu) = %p outside region 0 [%p, +%zu) with no growth", size, p,
          (void *)M.base, M.S);
  size_t us = magpool_usable_size(M.pool, p);
  CHECK(us == B, "usable_size(%p) = %zu after alloc(%zu), want %zu", p, us, size, B);
  /* Stream order: a block freed on a gated stream comes back only as
   * itself, on that stream. */
  int on = via == VIA_ASYNC_S0 || via == VIA_ASYNC_S1 ? via - VIA_ASYNC_S0 : -1;
  for (size_t k = M.nspans; k-- > 0;) {
    span *sp = &M.spans[k];
    uintptr_t lo = (uintptr_t)sp->p;
    if (x + B <= lo || lo + sp->n <= x) continue;
    CHECK(!sp->fenced || (on == sp->s && x == lo && B == sp->n),
          "alloc(%zu) via %d = [%p, +%zu) overlaps [%p, +%zu), freed on stream %d which has "
          "not passed the free (held by a gate)",
          size, via, p, B, (void *)sp->p, sp->n, sp->s);
    *sp = M.spans[--M.nspans];
  }
  model_add(p, size, B, scope);
  return p;
}

static void op_alloc(rd *r, int via) { do_alloc(decode_size(r), via); }

/* A live block that is not a scope's (or any, with any_kind), or -1. */
static long pick_live(rd *r, bool any_kind) {
  if (M.nlive == 0) return -1;
  size_t start = u16(r) % M.nlive;
  for (size_t k = 0; k < M.nlive; k++) {
    size_t i = (start + k) % M.nlive;
    if (any_kind || M.live[i].scope < 0) return (long)i;
  }
  return -1;
}

enum free_via { FREE_PLAIN, FREE_SIZED, FREE_ASYNC_NULL, FREE_ASYNC_S0, FREE_ASYNC_S1 };

static int free_via(void *p, size_t size, int via) {
  switch (via) {
  case FREE_PLAIN: return magpool_free(M.pool, p);
  case FREE_SIZED: return magpool_free_sized(M.pool, p, size);
  case FREE_ASYNC_NULL: return magpool_free_async(M.pool, p, NULL);
  default: {
    int s = via - FREE_ASYNC_S0;
    M.stream_used[s] = true;
    return magpool_free_async(M.pool, p, stream_get(s));
  }
  }
}

/* The model's side of a successful free through free_via. */
static void freed_via(size_t i, int via) {
  if (via == FREE_ASYNC_S0 || via == FREE_ASYNC_S1)
    span_add(M.live[i].p, M.live[i].usable, via - FREE_ASYNC_S0);
  model_remove(i);
}

static void op_free(rd *r, int via) {
  long i = pick_live(r, false);
  if (i < 0) return;
  int rc = free_via(M.live[i].p, M.live[i].req, via);
  CHECK(rc == 0, "free (via %d) of live %p = %d", via, (void *)M.live[i].p, rc);
  freed_via((size_t)i, via);
}

/* A pointer that is not a live allocation: foreign, interior, dead, or
 * just outside the pool.  NULL if the input picks none available. */
static void *bad_pointer(rd *r) {
  uint8_t k = u8(r);
  uint16_t v = u16(r);
  void *p = NULL;
  switch (k % 6) {
  case 0: p = foreign_buf + (v % (sizeof foreign_buf / 16)) * 16; break;
  case 1:
  case 2: { /* interior */
    if (M.nlive == 0) return NULL;
    blk *b = &M.live[v % M.nlive];
    size_t off = k % 6 == 1 ? 1 + (size_t)(k >> 3) % (M.mb - 1) /* unaligned */
                            : M.mb * (1 + (size_t)(k >> 3) % (b->usable / M.mb));
    if (off >= b->usable) off = b->usable / 2 + 1;
    p = b->p + off;
    break;
  }
  case 3: /* dead: freed, maybe reused */
    if (M.ndead == 0) return NULL;
    p = M.dead[v % M.ndead];
    break;
  case 4: p = (char *)M.base + M.S; break;
  default: p = (char *)M.base + ((size_t)v * M.mb) % M.S; break; /* free or cached */
  }
  if (find_live(p) >= 0) return NULL; /* a live start after all: not bad */
  return p;
}

/* Invalid frees through every entry point: MAGPOOL_EINVAL, nothing
 * changes, and usable_size says 0. */
static void bad_free_at(void *p, uint8_t how, size_t sz) {
  CHECK(magpool_usable_size(M.pool, p) == 0, "usable_size(%p) = %zu, not a live block", p,
        magpool_usable_size(M.pool, p));
  einval_probe pr;
  probe_begin(&pr);
  int rc;
  if (how % 6 == 5) {
    int s = (how >> 3) % NSCOPES;
    if (M.scope[s] == NULL) return;
    rc = magpool_scope_free(M.scope[s], p);
    probe_end(&pr, rc, "magpool_scope_free(bad pointer)");
    return;
  }
  rc = free_via(p, sz, how % 5);
  probe_end(&pr, rc, "free(bad pointer)");
}

static void op_bad_free(rd *r) {
  void *p = bad_pointer(r);
  uint8_t how = u8(r);
  size_t sz = u16(r);
  if (p == NULL) return;
  if (p != foreign_buf) {
    bad_free_at(p, how, sz);
    return;
  }
  void *heap = malloc(4 * M.mb); /* a malloc'd buffer instead */
  CHECK(heap != NULL, "malloc");
  bad_free_at(heap, how, sz);
  free(heap);
}

/* free_sized with a size other than the one asked for. */
static void op_free_wrong_size(rd *r) {
  long i = pick_live(r, false);
  if (i < 0) return;
  blk *b = &M.live[i];
  size_t cands[] = {b->req + 1, b->req - 1, b->usable, 0, b->usable + 1, SIZE_MAX};
  size_t sz = cands[u8(r) % (sizeof cands / sizeof cands[0])];
  if (sz == b->req) return;
  einval_probe pr;
  probe_begin(&pr);
  int rc = magpool_free_sized(M.pool, b->p, sz);
  probe_end(&pr, rc, "magpool_free_sized(wrong size)");
}

/* Scope blocks belong to their scope: every other free refuses them. */
static void op_free_scoped(rd *r) {
  if (M.nlive == 0) return;
  size_t start = u16(r) % M.nlive;
  uint8_t how = u8(r);
  for (size_t k = 0; k < M.nlive; k++) {
    blk *b = &M.live[(start + k) % M.nlive];
    if (b->scope < 0) continue;
    einval_probe pr;
    probe_begin(&pr);
    int rc;
    if (how % 6 == 5) {
      magpool_scope_t *other = M.scope[1 - b->scope];
      if (other == NULL) return;
      rc = magpool_scope_free(other, b->p);
    } else {
      rc = free_via(b->p, b->req, how % 5);
    }
    probe_end(&pr, rc, "free of a scope's block outside its scope");
    return;
  }
}

/* A non-scope block freed through a scope is refused too. */
static void op_scope_free(rd *r) {
  uint8_t s = u8(r) % NSCOPES;
  if (M.scope[s] == NULL) return;
  if (u8(r) & 1) {
    int rc = magpool_scope_free(M.scope[s], NULL);
    CHECK(rc == 0, "magpool_scope_free(NULL) = %d", rc);
    return;
  }
  long i = pick_live(r, true);
  if (i < 0) return;
  if (M.live[i].scope != s) {
    einval_probe pr;
    probe_begin(&pr);
    int rc = magpool_scope_free(M.scope[s], M.live[i].p);
    probe_end(&pr, rc, "magpool_scope_free(block of another owner)");
    return;
  }
  int rc = magpool_scope_free(M.scope[s], M.live[i].p);
  CHECK(rc == 0, "magpool_scope_free(own live block) = %d", rc);
  model_remove((size_t)i);
}

static void op_scope_begin(rd *r) {
  uint8_t s = u8(r) % NSCOPES;
  if (M.scope[s] != NULL) return;
  M.scope[s] = magpool_scope_begin(M.pool);
  CHECK(M.scope[s] != NULL, "magpool_scope_begin failed (%d)", magpool_last_error());
}

static void op_scope_end(rd *r) {
  uint8_t s = u8(r) % NSCOPES;
  if (M.scope[s] == NULL) return;
  int rc = magpool_scope_end(M.scope[s]);
  CHECK(rc == 0, "magpool_scope_end = %d", rc);
  for (size_t k = M.nlive; k-- > 0;)
    if (M.live[k].scope == s) model_remove(k);
  M.scope[s] = NULL;
}

static void op_sync(rd *r) {
  uint8_t s = u8(r) % (NSTREAMS + 1);
  if (s == NSTREAMS) {
    check_full();
  } else if (streams[s] != NULL && !gates[s].closed) {
    int rc = magpool_host_stream_sync(streams[s]);
    CHECK(rc == 0, "magpool_host_stream_sync = %d", rc);
    spans_settle(s);
  }
}

/* Close the stream's gate, or open it. */
static void op_gate(rd *r) {
  uint8_t s = u8(r) % NSTREAMS;
  if (gates[s].closed) gate_open(s);
  else gate_close(s);
}

static void op_release(rd *r) {
  uint8_t s = u8(r) % NSTREAMS;
  /* Released streams may be used again; a pool that never saw s says 0. */
  if (streams[s] == NULL) stream_get(s);
  release_stream(s);
}

/* Release a host stream from the pool, destroy it, and let the next use
 * create a new one (whose handle may be the old one's address). */
static void op_stream_recycle(rd *r) {
  uint8_t s = u8(r) % NSTREAMS;
  if (streams[s] == NULL) return;
  release_stream(s);
  gate_open(s); /* destroy runs everything queued */
  int rc = magpool_host_stream_destroy(streams[s]);
  CHECK(rc == 0, "magpool_host_stream_destroy = %d", rc);
  streams[s] = NULL;
}

static void op_trim(rd *r) {
  (void)r;
  int rc = magpool_trim(M.pool);
  CHECK(rc == 0, "magpool_trim = %d", rc);
  spans_retire(-1);
  if (streams_quiet()) {
    /* Nothing on streams: trim left nothing cached. */
    magpool_stats_t st = stats_now();
    CHECK(st.cached_bytes == 0, "cached_bytes %zu after trim (no streams)", st.cached_bytes);
  }
}

static void op_tracking(rd *r) {
  bool on = u8(r) & 1;
  int rc = magpool_tracking_enable(M.pool, on);
  if (!on) {
    CHECK(rc == 0, "tracking_enable(0) = %d", rc);
    M.tracking = false;
  } else if (M.tracking) {
    CHECK(rc == 0, "tracking_enable(1) while on = %d", rc);
  } else if (M.nlive != 0) {
    CHECK(rc == MAGPOOL_EBUSY, "tracking_enable(1) with %zu live = %d, want MAGPOOL_EBUSY",
          M.nlive, rc);
  } else {
    CHECK(rc == 0, "tracking_enable(1) with nothing live = %d", rc);
    M.tracking = true;
  }
  check_leaks();
}

static void op_tag(rd *r) {
  M.tag = tags[u8(r) % 3];
  magpool_set_tag(M.tag);
}

static void op_usable(rd *r) {
  long i = pick_live(r, true);
  if (i < 0) return;
  size_t us = magpool_usable_size(M.pool, M.live[i].p);
  CHECK(us == M.live[i].usable, "usable_size(%p) = %zu, want %zu", (void *)M.live[i].p, us,
        M.live[i].usable);
}

/* Free everything, drain the streams, trim: the pool is one free block
 * per region again, and allocates its largest piece (its whole reserved
 * size when that is one power of two and it never grew). */
static void op_free_all_trim(rd *r) {
  uint8_t how = u8(r);
  gates_open();
  for (int i = 0; i < NSCOPES; i++) {
    if (M.scope[i] == NULL) continue;
    int rc = magpool_scope_end(M.scope[i]);
    CHECK(rc == 0, "magpool_scope_end = %d", rc);
    for (size_t k = M.nlive; k-- > 0;)
      if (M.live[k].scope == i) model_remove(k);
    M.scope[i] = NULL;
  }
  while (M.nlive > 0) {
    size_t i = M.nlive - 1;
    int rc = free_via(M.live[i].p, M.live[i].req, (how >> 1) % 5);
    CHECK(rc == 0, "free of live %p = %d", (void *)M.live[i].p, rc);
    freed_via(i, (how >> 1) % 5);
  }
  if (how & 1) { /* release the streams first */
    for (int i = 0; i < NSTREAMS; i++) release_stream(i);
    quiesce();
  } else { /* trim retires the stream caches; the second trim drains them */
    quiesce();
    int rc = magpool_trim(M.pool);
    CHECK(rc == 0, "magpool_trim = %d", rc);
    spans_retire(-1);
    quiesce();
  }
  int rc = magpool_trim(M.pool);
  CHECK(rc == 0, "magpool_trim = %d", rc);
  spans_retire(-1);
  magpool_stats_t st = stats_now();
  check_counters(&st);
  check_quiescent_stats(&st);
  if (st.used_bytes != 0 || st.cached_bytes != 0 || st.free_bytes != st.reserved_bytes)
    print_stats("stats", &st);
  CHECK(st.used_bytes == 0 && st.cached_bytes == 0 && st.pending_bytes == 0 &&
            st.free_bytes == st.reserved_bytes,
        "everything freed and trimmed, but not all free");
  size_t want = top_bit(M.S);
  if (st.grow_count == 0)
    CHECK(st.largest_free_block == want, "largest free block %zu, want %zu (pool %zu)",
          st.largest_free_block, want, M.S);
  else
    CHECK(st.largest_free_block >= want, "largest free block %zu < region 0's %zu",
          st.largest_free_block, want);
  rc = magpool_check(M.pool);
  CHECK(rc == 0, "magpool_check = %d after free-all + trim", rc);
  size_t whole = st.grow_count == 0 && is_pow2(M.S) ? st.reserved_bytes : st.largest_free_block;
  void *p = do_alloc(whole, VIA_SYNC);
  CHECK(p != NULL || M.nlive == MAX_LIVE, "alloc(%zu) failed after free-all + trim (%d)", whole,
        magpool_last_error());
  magpool_stats_t st2 = stats_now();
  CHECK(st2.grow_count == st.grow_count, "alloc(%zu) of a free block grew the pool", whole);
  if (st.grow_count == 0) CHECK((uintptr_t)p == M.base, "whole block at %p, base %p", p, (void *)M.base);
  rc = magpool_free(M.pool, p);
  CHECK(rc == 0, "free of the whole block = %d", rc);
  model_remove((size_t)find_live(p));
}

/* Calls whose arguments are wrong in a way the header names. */
static void op_null_args(rd *r) {
  uint8_t k = u8(r);
  int rc;
  void *p;
  switch (k % 16) {
  case 0:
    p = magpool_alloc(NULL, 16);
    CHECK(p == NULL && magpool_last_error() == MAGPOOL_EINVAL, "alloc(NULL pool)");
    break;
  case 1:
    p = magpool_alloc_async(NULL, 16, NULL);
    CHECK(p == NULL && magpool_last_error() == MAGPOOL_EINVAL, "alloc_async(NULL pool)");
    break;
  case 2:
    CHECK(magpool_free(NULL, foreign_buf) == MAGPOOL_EINVAL, "free(NULL pool)");
    CHECK(magpool_free_sized(NULL, foreign_buf, 1) == MAGPOOL_EINVAL, "free_sized(NULL pool)");
    CHECK(magpool_free_async(NULL, foreign_buf, NULL) == MAGPOOL_EINVAL, "free_async(NULL)");
    break;
  case 3:
    CHECK(magpool_free(M.pool, NULL) == 0, "free(NULL pointer)");
    CHECK(magpool_free_sized(M.pool, NULL, k) == 0, "free_sized(NULL pointer)");
    CHECK(magpool_free_async(M.pool, NULL, NULL) == 0, "free_async(NULL pointer)");
    break;
  case 4:
    CHECK(magpool_trim(NULL) == MAGPOOL_EINVAL, "trim(NULL)");
    CHECK(magpool_check(NULL) == MAGPOOL_EINVAL, "check(NULL)");
    CHECK(magpool_destroy(NULL) == MAGPOOL_EINVAL, "destroy(NULL)");
    break;
  case 5: {
    magpool_stats_t st;
    CHECK(magpool_get_stats(NULL, &st) == MAGPOOL_EINVAL, "get_stats(NULL pool)");
    CHECK(magpool_get_stats(M.pool, NULL) == MAGPOOL_EINVAL, "get_stats(NULL out)");
    CHECK(magpool_mem_info(NULL, NULL, NULL) == MAGPOOL_EINVAL, "mem_info(NULL)");
    CHECK(magpool_mem_info(M.pool, NULL, NULL) == 0, "mem_info(pool, NULL, NULL)");
    break;
  }
  case 6:
    CHECK(magpool_usable_size(NULL, foreign_buf) == 0, "usable_size(NULL pool)");
    CHECK(magpool_usable_size(M.pool, NULL) == 0, "usable_size(NULL)");
    CHECK(magpool_usable_size(M.pool, foreign_buf) == 0, "usable_size(foreign)");
    break;
  case 7:
    p = magpool_scope_begin(NULL);
    CHECK(p == NULL && magpool_last_error() == MAGPOOL_EINVAL, "scope_begin(NULL)");
    p = magpool_scope_alloc(NULL, 16);
    CHECK(p == NULL && magpool_last_error() == MAGPOOL_EINVAL, "scope_alloc(NULL)");
    CHECK(magpool_scope_free(NULL, foreign_buf) == MAGPOOL_EINVAL, "scope_free(NULL)");
    CHECK(magpool_scope_end(NULL) == MAGPOOL_EINVAL, "scope_end(NULL)");
    break;
  case 8:
    CHECK(magpool_tracking_enable(NULL, 1) == MAGPOOL_EINVAL, "tracking_enable(NULL)");
    CHECK(magpool_leak_check(NULL, NULL, NULL) == MAGPOOL_EINVAL, "leak_check(NULL)");
    CHECK(magpool_stream_release(NULL, NULL) == MAGPOOL_EINVAL, "stream_release(NULL)");
    CHECK(magpool_stream_release(M.pool, NULL) == 0, "stream_release(host pool, NULL)");
    break;
  case 9: { /* a handle that is no host stream */
    magpool_stream_t fake = (magpool_stream_t)(void *)foreign_buf;
    einval_probe pr;
    probe_begin(&pr);
    p = magpool_alloc_async(M.pool, 16, fake);
    CHECK(p == NULL && magpool_last_error() == MAGPOOL_EINVAL,
          "alloc_async(not a stream) = %p (%d)", p, magpool_last_error());
    probe_end(&pr, MAGPOOL_EINVAL, "alloc_async(not a stream)");
    long i = pick_live(r, false);
    if (i >= 0) {
      probe_begin(&pr);
      rc = magpool_free_async(M.pool, M.live[i].p, fake);
      probe_end(&pr, rc, "free_async(not a stream)");
    }
    rc = magpool_stream_release(M.pool, fake);
    CHECK(rc == 0 || rc == MAGPOOL_EINVAL, "stream_release(not a stream) = %d", rc);
    CHECK(magpool_host_stream_sync(fake) == MAGPOOL_EINVAL, "host_stream_sync(not a stream)");
    CHECK(magpool_host_stream_sync(NULL) == MAGPOOL_EINVAL, "host_stream_sync(NULL)");
    break;
  }
  case 10: { /* magpool_align_up against arithmetic */
    size_t n = (size_t)u64(r);
    uint8_t a = u8(r);
    size_t align = a < 64 ? (size_t)1 << a : (size_t)a * 3;
    size_t got = magpool_align_up(n, align), want;
    if (!is_pow2(align) || n > SIZE_MAX - (align - 1)) want = 0;
    else want = (n + align - 1) & ~(align - 1);
    CHECK(got == want, "align_up(%zu, %zu) = %zu, want %zu", n, align, got, want);
    CHECK(magpool_align_up(n, 0) == 0, "align_up(n, 0)");
    break;
  }
  case 11: {
    static const int codes[] = {0, MAGPOOL_EINVAL, MAGPOOL_ENOMEM, MAGPOOL_ENOTSUP,
                                MAGPOOL_ENODEV, MAGPOOL_ECUDA, MAGPOOL_ECAPTURE, MAGPOOL_EBUSY,
                                -99, 1, -2147483647 - 1};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
      CHECK(magpool_strerror(codes[i]) != NULL, "strerror(%d) is NULL", codes[i]);
    CHECK(magpool_version() == MAGPOOL_VERSION, "version %d", magpool_version());
    break;
  }
  default: { /* bad configs: EINVAL (ENODEV for CUDA kinds), *out untouched */
    magpool_config_t cfg;
    decode_config(r, &cfg);
    int want = MAGPOOL_EINVAL;
    switch (u8(r) % 9) {
    case 0: cfg.min_block = 8; break;
    case 1: cfg.min_block = 48; break;
    case 2: cfg.min_block = 131072; break;
    case 3: cfg.pool_size = cfg.min_block - 1; cfg.max_pool_size = 0; break;
    case 4: cfg.pool_size = 0; cfg.max_pool_size = 0; break;
    case 5: cfg.max_pool_size = cfg.pool_size - 1; if (cfg.max_pool_size == 0) return; break;
    case 6: cfg.struct_size = sizeof(size_t); break;
    case 7: cfg.kind = MAGPOOL_MEM_DEVICE; want = MAGPOOL_ENODEV; break;
    default: cfg.kind = MAGPOOL_MEM_PINNED; want = MAGPOOL_ENODEV; break;
    }
    magpool_t *sentinel = (magpool_t *)(void *)foreign_buf, *out = sentinel;
    rc = magpool_create(&cfg, &out);
    if (rc == 0 && out != sentinel) magpool_destroy(out);
    CHECK(rc == want && out == sentinel, "create(bad config: pool %zu min_block %zu max %zu "
          "kind %d) = %d, want %d; out %s", cfg.pool_size, cfg.min_block, cfg.max_pool_size,
          (int)cfg.kind, rc, want, out == sentinel ? "unchanged" : "changed");
    CHECK(magpool_create(NULL, &out) == MAGPOOL_EINVAL, "create(NULL config)");
    CHECK(magpool_create(&cfg, NULL) == MAGPOOL_EINVAL, "create(NULL out)");
    break;
  }
  }
}

static void op_leak_check(rd *r) {
  (void)r;
  check_leaks();
}

/* ------------------------------------------------------------------ */
/* the driver                                                         */
/* ------------------------------------------------------------------ */

typedef struct op {
  const char *name;
  void (*fn)(rd *r, int arg);
  int arg;
} op;

static void w_alloc(rd *r, int a) { op_alloc(r, a); }
static void w_free(rd *r, int a) { op_free(r, a); }
static void w_nop(rd *r, int a) {
  (void)a;
  (void)r;
}

/* A new pool in place of the current one. */
static void w_create(rd *r, int a) {
  (void)a;
  pool_teardown();
  pool_create(r);
}

#define W(fn)                                                                                \
  static void w_##fn(rd *r, int a) {                                                         \
    (void)a;                                                                                 \
    op_##fn(r);                                                                              \
  }
W(bad_free)
W(free_wrong_size)
W(free_scoped)
W(scope_free)
W(scope_begin)
W(scope_end)
W(sync)
W(release)
W(stream_recycle)
W(gate)
W(trim)
W(tracking)
W(tag)
W(usable)
W(free_all_trim)
W(null_args)
W(leak_check)
#undef W

static const op ops[] = {
  {"alloc", w_alloc, VIA_SYNC},
  {"alloc", w_alloc, VIA_SYNC},
  {"alloc_async(NULL)", w_alloc, VIA_ASYNC_NULL},
  {"alloc_async(s0)", w_alloc, VIA_ASYNC_S0},
  {"alloc_async(s1)", w_alloc, VIA_ASYNC_S1},
  {"scope_alloc(0)", w_alloc, VIA_SCOPE0},
  {"scope_alloc(1)", w_alloc, VIA_SCOPE1},
  {"free", w_free, FREE_PLAIN},
  {"free", w_free, FREE_PLAIN},
  {"free_sized", w_free, FREE_SIZED},
  {"free_async(NULL)", w_free, FREE_ASYNC_NULL},
  {"free_async(s0)", w_free, FREE_ASYNC_S0},
  {"free_async(s1)", w_free, FREE_ASYNC_S1},
  {"bad_free", w_bad_free, 0},
  {"free_wrong_size", w_free_wrong_size, 0},
  {"free_scoped", w_free_scoped, 0},
  {"scope_free", w_scope_free, 0},
  {"scope_begin", w_scope_begin, 0},
  {"scope_end", w_scope_end, 0},
  {"sync", w_sync, 0},
  {"release", w_release, 0},
  {"stream_recycle", w_stream_recycle, 0},
  {"trim", w_trim, 0},
  {"tracking", w_tracking, 0},
  {"tag", w_tag, 0},
  {"usable", w_usable, 0},
  {"free_all_trim", w_free_all_trim, 0},
  {"null_args", w_null_args, 0},
  {"leak_check", w_leak_check, 0},
  {"create", w_create, 0},
  {"nop", w_nop, 0},
  {"gate", w_gate, 0},
};
#define NOPS (sizeof ops / sizeof ops[0])

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int trace = -1; /* MAGPOOL_FUZZ_TRACE=1: one line per operation */
  if (trace < 0) trace = getenv("MAGPOOL_FUZZ_TRACE") != NULL;
  rd r = {data, size};
  cur_step = 0;
  cur_op = "create";
  pool_create(&r);
  if (trace)
    fprintf(stderr, "pool %zu min_block %zu growth %d max %zu\n", M.S, M.mb, M.growth, M.max);
  check_full();
  for (unsigned n = 0; n < MAX_OPS && r.n > 0; n++) {
    size_t k = u8(&r) % NOPS;
    cur_step = n + 1;
    cur_op = ops[k].name;
    if (trace) fprintf(stderr, "%3u %-18s live %zu\n", cur_step, cur_op, M.nlive);
    ops[k].fn(&r, ops[k].arg);
    check_light();
  }
  cur_op = "teardown";
  pool_teardown();
  /* The host streams stay for the next input (a thread each: creating
   * them per input would cost more than most inputs); every pool that
   * used them has released them. */
  return 0;
}
