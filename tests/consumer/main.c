/* A minimal program using an installed magpool: a host pool, a few
 * allocations, frees, stats.  Prints "OK" and exits 0 only if all went as
 * the header promises. */
#include <magpool.h>

#include <stdio.h>
#include <string.h>

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "consumer: %s:%d: check failed: %s\n", __FILE__,       \
              __LINE__, #cond);                                              \
      return 1;                                                              \
    }                                                                        \
  } while (0)

int main(void) {
  CHECK(magpool_version() == MAGPOOL_VERSION);

  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.pool_size = (size_t)16 << 20;
  magpool_t *pool = NULL;
  int rc = magpool_create(&cfg, &pool);
  if (rc != 0) {
    fprintf(stderr, "consumer: magpool_create: %s\n", magpool_strerror(rc));
    return 1;
  }

  void *a = magpool_alloc(pool, 1000);
  void *b = magpool_alloc(pool, (size_t)1 << 20);
  CHECK(a != NULL && b != NULL && a != b);
  CHECK(magpool_usable_size(pool, a) == 1024);
  memset(a, 0x5A, 1000);
  memset(b, 0xA5, (size_t)1 << 20);

  magpool_stats_t st;
  CHECK(magpool_get_stats(pool, &st) == 0);
  CHECK(st.live_count == 2);
  CHECK(st.used_bytes == 1024 + ((size_t)1 << 20));

  CHECK(magpool_free(pool, a) == 0);
  CHECK(magpool_free_sized(pool, b, (size_t)1 << 20) == 0);
  CHECK(magpool_free(pool, a) == MAGPOOL_EINVAL); /* double free */
  CHECK(magpool_trim(pool) == 0);
  CHECK(magpool_get_stats(pool, &st) == 0);
  CHECK(st.live_count == 0 && st.used_bytes == 0);
  CHECK(st.free_bytes == cfg.pool_size);
  CHECK(magpool_check(pool) == 0);
  CHECK(magpool_destroy(pool) == 0);

  printf("OK magpool %d.%d.%d\n", magpool_version() / 10000,
         magpool_version() / 100 % 100, magpool_version() % 100);
  return 0;
}
