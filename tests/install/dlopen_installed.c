/* dlopen_installed.c - loads the installed libmagpool.so with dlopen()
 * into this running program (which does not link it), after starting a
 * thread of its own, and uses it through dlsym:
 *   - a HOST pool: allocations on two threads, stats, destroy;
 *   - magpool_config_parse, good and bad input;
 *   - a DEVICE pool: created and used if a GPU is present, else it must
 *     fail cleanly with MAGPOOL_ENODEV (or MAGPOOL_ECUDA).
 *   dlopen_installed /path/to/libmagpool.so
 * Exit 0 on success, 1 on failure.
 */
#define _GNU_SOURCE
#include <magpool.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                   \
  do {                                                             \
    if (!(c)) {                                                    \
      fprintf(stderr, "dlopen_installed: %s:%d: %s\n", __FILE__,   \
              __LINE__, #c);                                       \
      exit(1);                                                     \
    }                                                              \
  } while (0)

static struct {
  void (*config_init)(magpool_config_t *);
  int (*config_parse)(magpool_config_t *, const char *);
  const char *(*config_error)(void);
  int (*create)(const magpool_config_t *, magpool_t **);
  int (*destroy)(magpool_t *);
  void *(*alloc)(magpool_t *, size_t);
  int (*free)(magpool_t *, void *);
  int (*get_stats)(magpool_t *, magpool_stats_t *);
  int (*version)(void);
} mp;

static void *sym(void *h, const char *name) {
  void *f = dlsym(h, name);
  if (f == NULL) {
    fprintf(stderr, "dlopen_installed: no symbol %s: %s\n", name, dlerror());
    exit(1);
  }
  return f;
}

static void *worker(void *arg) {
  magpool_t *pool = arg;
  for (int i = 0; i < 10000; i++) {
    void *p = mp.alloc(pool, (size_t)(i % 4096) + 1);
    if (p == NULL || mp.free(pool, p) != 0) return (void *)1;
  }
  return NULL;
}

static void *idle(void *arg) { return arg; }

int main(int argc, char **argv) {
  CHECK(argc == 2);
  /* A running process: a thread exists before the load. */
  pthread_t t0;
  CHECK(pthread_create(&t0, NULL, idle, NULL) == 0);
  pthread_join(t0, NULL);

  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "dlopen_installed: dlopen(%s): %s\n", argv[1], dlerror());
    return 1;
  }
  *(void **)&mp.config_init = sym(h, "magpool_config_init");
  *(void **)&mp.config_parse = sym(h, "magpool_config_parse");
  *(void **)&mp.config_error = sym(h, "magpool_config_error");
  *(void **)&mp.create = sym(h, "magpool_create");
  *(void **)&mp.destroy = sym(h, "magpool_destroy");
  *(void **)&mp.alloc = sym(h, "magpool_alloc");
  *(void **)&mp.free = sym(h, "magpool_free");
  *(void **)&mp.get_stats = sym(h, "magpool_get_stats");
  *(void **)&mp.version = sym(h, "magpool_version");
  CHECK(mp.version() == MAGPOOL_VERSION);

  magpool_config_t cfg;
  mp.config_init(&cfg);
  CHECK(mp.config_parse(&cfg, "pool_size=16M,thread_cache_bytes=1M,kind=host") == 0);
  CHECK(cfg.pool_size == ((size_t)16 << 20));
  CHECK(mp.config_parse(&cfg, "pool_size=16X") == MAGPOOL_EINVAL);
  CHECK(strstr(mp.config_error(), "16X") != NULL);
  CHECK(cfg.pool_size == ((size_t)16 << 20));

  magpool_t *pool = NULL;
  CHECK(mp.create(&cfg, &pool) == 0);
  pthread_t th[2];
  for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, worker, pool) == 0);
  for (int i = 0; i < 2; i++) {
    void *r;
    pthread_join(th[i], &r);
    CHECK(r == NULL);
  }
  magpool_stats_t st;
  CHECK(mp.get_stats(pool, &st) == 0);
  CHECK(st.alloc_count == 20000 && st.free_count == 20000 && st.used_bytes == 0);
  CHECK(mp.destroy(pool) == 0);

  mp.config_init(&cfg);
  cfg.kind = MAGPOOL_MEM_DEVICE;
  cfg.pool_size = (size_t)16 << 20;
  int rc = mp.create(&cfg, &pool);
  if (rc == 0) {
    void *p = mp.alloc(pool, 1000);
    CHECK(p != NULL);
    CHECK(mp.free(pool, p) == 0);
    CHECK(mp.destroy(pool) == 0);
    printf("dlopen_installed: DEVICE pool created and used\n");
  } else {
    CHECK(rc == MAGPOOL_ENODEV || rc == MAGPOOL_ECUDA);
    printf("dlopen_installed: no GPU: DEVICE pool refused cleanly (%d)\n", rc);
  }
  CHECK(dlclose(h) == 0);
  printf("dlopen_installed: OK (%s)\n", argv[1]);
  return 0;
}
