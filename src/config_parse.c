/* config_parse.c - magpool_config_parse: "key=value,..." strings over a
 * magpool_config_t, and the environment (MAGPOOL_CONF, MAGPOOL_TRACE) that
 * magpool_config_init applies.  Layer 0: calls no other magpool file.
 *
 * One table names every field: its key, offset, width and value type.  A
 * new config field is one line of it.  A string is parsed into a copy of
 * the caller's struct, which is written back only when every item
 * parsed: nothing is half-applied.
 */
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { F_SIZE, F_INT, F_BOOL, F_KIND, F_STR } field_type;

typedef struct {
  const char *name;
  size_t off;
  field_type type;
} field;

#define FIELD(name, type) {#name, offsetof(magpool_config_t, name), type}

static const field fields[] = {
    FIELD(pool_size, F_SIZE),
    FIELD(allow_growth, F_BOOL),
    FIELD(max_pool_size, F_SIZE),
    FIELD(min_block, F_SIZE),
    FIELD(kind, F_KIND),
    FIELD(device, F_INT),
    FIELD(thread_cache_bytes, F_SIZE),
    FIELD(cache_max_block, F_SIZE),
    FIELD(stream_cache_bytes, F_SIZE),
    FIELD(capture_check, F_BOOL),
    FIELD(chunk_size, F_SIZE),
    FIELD(release_threshold, F_SIZE),
    FIELD(trace_path, F_STR),
    FIELD(chunk_groups, F_INT),
    FIELD(cross_stream_reuse, F_BOOL),
};
#define NFIELDS (sizeof fields / sizeof fields[0])

static size_t field_width(field_type t) {
  switch (t) {
  case F_SIZE: return sizeof(size_t);
  case F_KIND: return sizeof(magpool_mem_kind_t);
  case F_STR: return sizeof(const char *);
  default: return sizeof(int);
  }
}

/* ------------------------------------------------------------ messages */

static _Thread_local char parse_error[160];

const char *magpool_config_error(void) { return parse_error; }

static int fail(const char *what, const char *s, size_t n, const char *key, size_t kn) {
  if (n > 64) n = 64;
  if (kn > 64) kn = 64;
  if (key != NULL)
    snprintf(parse_error, sizeof parse_error, "%s '%.*s' for key '%.*s'", what, (int)n, s,
             (int)kn, key);
  else
    snprintf(parse_error, sizeof parse_error, "%s '%.*s'", what, (int)n, s);
  return MAGPOOL_EINVAL;
}

/* --------------------------------------------------------------- values */

static bool word_is(const char *s, size_t n, const char *w) {
  return strlen(w) == n && strncasecmp(s, w, n) == 0;
}

static int parse_size(const char *s, size_t n, size_t *out) {
  if (word_is(s, n, "max")) {
    *out = SIZE_MAX;
    return 0;
  }
  size_t i = 0;
  uint64_t v = 0;
  if (n == 0 || !isdigit((unsigned char)s[0])) return -1;
  for (; i < n && isdigit((unsigned char)s[i]); i++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
  }
  /* Suffix: "", "B", or K/M/G/T followed by "", "B" or "iB". */
  const char *rest = s + i;
  size_t rn = n - i;
  unsigned shift = 0;
  if (rn != 0) {
    switch (toupper((unsigned char)rest[0])) {
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    default: break;
    }
    if (shift != 0) { rest++; rn--; }
    if (!(rn == 0 || word_is(rest, rn, "B") || (shift != 0 && word_is(rest, rn, "iB"))))
      return -1;
  }
  if (shift != 0 && v > (UINT64_MAX >> shift)) return -1;
  v <<= shift;
  if (v > SIZE_MAX) return -1;
  *out = (size_t)v;
  return 0;
}

static int parse_int(const char *s, size_t n, int *out) {
  if (n == 0 || n > 10) return -1;
  long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isdigit((unsigned char)s[i])) return -1;
    v = v * 10 + (s[i] - '0');
  }
  if (v > 0x7fffffffL) return -1;
  *out = (int)v;
  return 0;
}

static int parse_bool(const char *s, size_t n, int *out) {
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  for (unsigned i = 0; i < 4; i++) {
    if (word_is(s, n, yes[i])) { *out = 1; return 0; }
    if (word_is(s, n, no[i])) { *out = 0; return 0; }
  }
  return -1;
}

static int parse_kind(const char *s, size_t n, magpool_mem_kind_t *out) {
  if (word_is(s, n, "host") || word_is(s, n, "0")) *out = MAGPOOL_MEM_HOST;
  else if (word_is(s, n, "device") || word_is(s, n, "1")) *out = MAGPOOL_MEM_DEVICE;
  else if (word_is(s, n, "pinned") || word_is(s, n, "2")) *out = MAGPOOL_MEM_PINNED;
  else return -1;
  return 0;
}

/* Strings named by a parsed config outlive the call (the config holds a
 * pointer): each distinct one is copied once and kept for the life of
 * the process. */
typedef struct interned {
  struct interned *next;
  char s[];
} interned;
static pthread_mutex_t intern_lock = PTHREAD_MUTEX_INITIALIZER;
static interned *intern_list;

static const char *intern(const char *s, size_t n) {
  pthread_mutex_lock(&intern_lock);
  interned *it;
  for (it = intern_list; it != NULL; it = it->next)
    if (strlen(it->s) == n && memcmp(it->s, s, n) == 0) break;
  if (it == NULL && (it = malloc(sizeof *it + n + 1)) != NULL) {
    memcpy(it->s, s, n);
    it->s[n] = '\0';
    it->next = intern_list;
    intern_list = it;
  }
  pthread_mutex_unlock(&intern_lock);
  return it != NULL ? it->s : NULL;
}

/* ---------------------------------------------------------------- parse */

static void trim(const char **s, size_t *n) {
  while (*n > 0 && isspace((unsigned char)**s)) { (*s)++; (*n)--; }
  while (*n > 0 && isspace((unsigned char)(*s)[*n - 1])) (*n)--;
}

/* One "key=value" item (already trimmed, not empty) into *cfg, of which
 * the first `have` bytes exist. */
static int parse_item(magpool_config_t *cfg, size_t have, const char *it, size_t n) {
  const char *eq = memchr(it, '=', n);
  if (eq == NULL) return fail("no '=' in item", it, n, NULL, 0);
  const char *key = it, *val = eq + 1;
  size_t kn = (size_t)(eq - it), vn = n - kn - 1;
  trim(&key, &kn);
  trim(&val, &vn);
  const field *f = NULL;
  for (size_t i = 0; i < NFIELDS; i++)
    if (strlen(fields[i].name) == kn && memcmp(fields[i].name, key, kn) == 0) f = &fields[i];
  if (f == NULL || f->off + field_width(f->type) > have) return fail("unknown key", key, kn, NULL, 0);
  char *dst = (char *)cfg + f->off;
  int bad = 0;
  switch (f->type) {
  case F_SIZE: {
    size_t v;
    if (!(bad = parse_size(val, vn, &v))) memcpy(dst, &v, sizeof v);
    break;
  }
  case F_INT: {
    int v;
    if (!(bad = parse_int(val, vn, &v))) memcpy(dst, &v, sizeof v);
    break;
  }
  case F_BOOL: {
    int v;
    if (!(bad = parse_bool(val, vn, &v))) memcpy(dst, &v, sizeof v);
    break;
  }
  case F_KIND: {
    magpool_mem_kind_t v;
    if (!(bad = parse_kind(val, vn, &v))) memcpy(dst, &v, sizeof v);
    break;
  }
  case F_STR: {
    const char *v = vn == 0 ? NULL : intern(val, vn);
    if (vn != 0 && v == NULL) return fail("out of memory for value", val, vn, key, kn);
    memcpy(dst, &v, sizeof v);
    break;
  }
  }
  if (bad) return fail("bad value", val, vn, key, kn);
  return 0;
}

int magpool_config_parse(magpool_config_t *cfg, const char *conf) {
  if (cfg == NULL || conf == NULL) {
    snprintf(parse_error, sizeof parse_error, "NULL %s", cfg == NULL ? "config" : "string");
    return MAGPOOL_EINVAL;
  }
  size_t have = cfg->struct_size < sizeof(magpool_config_t) ? cfg->struct_size
                                                             : sizeof(magpool_config_t);
  if (have < offsetof(magpool_config_t, pool_size)) {
    snprintf(parse_error, sizeof parse_error, "struct_size %zu too small", cfg->struct_size);
    return MAGPOOL_EINVAL;
  }
  magpool_config_t tmp;
  memcpy(&tmp, cfg, have);
  const char *p = conf;
  while (*p != '\0') {
    const char *end = strchr(p, ',');
    size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
    const char *it = p;
    trim(&it, &n);
    if (n != 0) {
      int rc = parse_item(&tmp, have, it, n);
      if (rc != 0) return rc;
    }
    if (end == NULL) break;
    p = end + 1;
  }
  memcpy(cfg, &tmp, have);
  return 0;
}

/* ---------------------------------------------------------- environment */

static _Atomic int env_warned;

void mp_config_apply_env(magpool_config_t *cfg) {
  const char *trace = getenv("MAGPOOL_TRACE");
  if (trace != NULL && trace[0] != '\0') cfg->trace_path = trace;
  const char *conf = getenv("MAGPOOL_CONF");
  if (conf == NULL || conf[0] == '\0') return;
  if (magpool_config_parse(cfg, conf) != 0 && mp_xchg_acquire(&env_warned, 1) == 0)
    fprintf(stderr, "magpool: MAGPOOL_CONF ignored: %s\n", magpool_config_error());
}
