/* test_config_parse.c - magpool_config_parse, magpool_config_error and
 * the environment that magpool_config_init applies (MAGPOOL_CONF,
 * MAGPOOL_TRACE).  Each Criterion test runs in its own process, so
 * setenv here reaches no other test.
 */
#define _GNU_SOURCE /* setenv, mkdtemp, stream_util.h */
#include <magpool.h>

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static magpool_config_t fresh(void) {
  unsetenv("MAGPOOL_CONF");
  unsetenv("MAGPOOL_TRACE");
  magpool_config_t c;
  magpool_config_init(&c);
  return c;
}

Test(config_parse, every_field) {
  magpool_config_t c = fresh();
  int rc = magpool_config_parse(
      &c, "pool_size=1G,allow_growth=1,max_pool_size=4G,min_block=256,kind=pinned,"
          "device=3,thread_cache_bytes=4M,cache_max_block=512K,stream_cache_bytes=2MiB,"
          "capture_check=off,chunk_size=64KB,release_threshold=max,trace_path=/tmp/x.trace,"
          "chunk_groups=0,cross_stream_reuse=yes");
  cr_assert_eq(rc, 0, "%s", magpool_config_error());
  cr_assert_eq(c.pool_size, (size_t)1 << 30);
  cr_assert_eq(c.allow_growth, 1);
  cr_assert_eq(c.max_pool_size, (size_t)4 << 30);
  cr_assert_eq(c.min_block, 256);
  cr_assert_eq(c.kind, MAGPOOL_MEM_PINNED);
  cr_assert_eq(c.device, 3);
  cr_assert_eq(c.thread_cache_bytes, 4 * MiB);
  cr_assert_eq(c.cache_max_block, 512 * KiB);
  cr_assert_eq(c.stream_cache_bytes, 2 * MiB);
  cr_assert_eq(c.capture_check, 0);
  cr_assert_eq(c.chunk_size, 64 * KiB);
  cr_assert_eq(c.release_threshold, SIZE_MAX);
  cr_assert_str_eq(c.trace_path, "/tmp/x.trace");
  cr_assert_eq(c.chunk_groups, 0);
  cr_assert_eq(c.cross_stream_reuse, 1);
  cr_assert_eq(c.struct_size, sizeof c);
}

Test(config_parse, spellings) {
  magpool_config_t c = fresh();
  cr_assert_eq(magpool_config_parse(&c, " pool_size = 12345 , , kind=1,allow_growth=YES,"), 0);
  cr_assert_eq(c.pool_size, 12345);
  cr_assert_eq(c.kind, MAGPOOL_MEM_DEVICE);
  cr_assert_eq(c.allow_growth, 1);
  cr_assert_eq(magpool_config_parse(&c, "kind=host,pool_size=2k,pool_size=3kb,allow_growth=false"), 0);
  cr_assert_eq(c.kind, MAGPOOL_MEM_HOST);
  cr_assert_eq(c.pool_size, 3 * KiB, "the last of a repeated key wins");
  cr_assert_eq(c.allow_growth, 0);
  cr_assert_eq(magpool_config_parse(&c, "pool_size=1T,trace_path="), 0);
  cr_assert_eq(c.pool_size, (size_t)1 << 40);
  cr_assert_null(c.trace_path);
  cr_assert_eq(magpool_config_parse(&c, ""), 0, "the empty string sets nothing");
  cr_assert_eq(c.pool_size, (size_t)1 << 40);
}

/* Each bad string: EINVAL, *cfg unchanged (also the items before the bad
 * one), and the message names the offending text. */
Test(config_parse, bad_input_changes_nothing) {
  static const struct {
    const char *conf, *named;
  } bad[] = {
      {"pool_sise=1G", "pool_sise"},
      {"pool_size=1G,allow_growth", "allow_growth"},
      {"thread_cache_bytes=4M,pool_size=12Q", "12Q"},
      {"pool_size=-1", "-1"},
      {"pool_size=", "pool_size"},
      {"pool_size=99999999999999999999", "99999999999999999999"},
      {"pool_size=17179869184T", "17179869184T"},
      {"kind=gpu", "gpu"},
      {"kind=3", "3"},
      {"allow_growth=2", "2"},
      {"device=-1", "-1"},
      {"device=4294967296", "4294967296"},
      {"min_block=64,struct_size=8", "struct_size"},
      {"=5", "unknown key"},
      {"pool_size=1Mi", "1Mi"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    magpool_config_t c = fresh(), before = c;
    int rc = magpool_config_parse(&c, bad[i].conf);
    cr_assert_eq(rc, MAGPOOL_EINVAL, "'%s' gave %d", bad[i].conf, rc);
    cr_assert_eq(memcmp(&c, &before, sizeof c), 0, "'%s' changed the config", bad[i].conf);
    cr_assert_not_null(strstr(magpool_config_error(), bad[i].named),
                       "'%s': message '%s' does not name '%s'", bad[i].conf,
                       magpool_config_error(), bad[i].named);
  }
  magpool_config_t c = fresh();
  cr_assert_eq(magpool_config_parse(NULL, "pool_size=1"), MAGPOOL_EINVAL);
  cr_assert_eq(magpool_config_parse(&c, NULL), MAGPOOL_EINVAL);
}

/* A program built against an older header: fields past its struct_size
 * are unknown keys there, and nothing past it is written. */
Test(config_parse, older_struct) {
  magpool_config_t c = fresh();
  c.struct_size = offsetof(magpool_config_t, trace_path);
  c.trace_path = (const char *)0x1;
  cr_assert_eq(magpool_config_parse(&c, "pool_size=1M"), 0);
  cr_assert_eq(c.pool_size, MiB);
  cr_assert_eq(magpool_config_parse(&c, "trace_path=/tmp/y"), MAGPOOL_EINVAL);
  cr_assert_not_null(strstr(magpool_config_error(), "trace_path"));
  cr_assert_eq(c.trace_path, (const char *)0x1);
}

Test(config_parse, env_over_defaults_program_wins) {
  setenv("MAGPOOL_CONF", "pool_size=8M,allow_growth=1,thread_cache_bytes=1M", 1);
  unsetenv("MAGPOOL_TRACE");
  magpool_config_t c;
  magpool_config_init(&c);
  cr_assert_eq(c.pool_size, 8 * MiB);
  cr_assert_eq(c.allow_growth, 1);
  cr_assert_eq(c.thread_cache_bytes, MiB);
  cr_assert_eq(c.min_block, 64, "fields the variable does not name keep their default");
  c.pool_size = 4 * MiB; /* the program's own setting, after init */
  magpool_t *pool = NULL;
  cr_assert_eq(magpool_create(&c, &pool), 0);
  magpool_stats_t st;
  cr_assert_eq(magpool_get_stats(pool, &st), 0);
  cr_assert_eq(st.reserved_bytes, 4 * MiB, "the program's setting wins");
  cr_assert_eq(magpool_destroy(pool), 0);
}

Test(config_parse, bad_env_is_ignored_whole) {
  setenv("MAGPOOL_CONF", "pool_size=8M,allow_growth=maybe", 1);
  unsetenv("MAGPOOL_TRACE");
  magpool_config_t c;
  magpool_config_init(&c);
  cr_assert_eq(c.pool_size, 256 * MiB, "nothing half-applied");
  cr_assert_eq(c.allow_growth, 0);
}

Test(config_parse, trace_env) {
  unsetenv("MAGPOOL_CONF");
  setenv("MAGPOOL_TRACE", "/tmp/from-env.trace", 1);
  magpool_config_t c;
  magpool_config_init(&c);
  cr_assert_str_eq(c.trace_path, "/tmp/from-env.trace");
  setenv("MAGPOOL_CONF", "trace_path=/tmp/from-conf.trace", 1);
  magpool_config_init(&c);
  cr_assert_str_eq(c.trace_path, "/tmp/from-conf.trace", "MAGPOOL_CONF's trace_path wins");
}

Test(config_parse, create_fails_on_unwritable_trace) {
  magpool_config_t c = fresh();
  c.pool_size = MiB;
  c.trace_path = "/nonexistent-dir-magpool/x.trace";
  magpool_t *pool = (magpool_t *)0x1;
  cr_assert_eq(magpool_create(&c, &pool), MAGPOOL_EINVAL);
  cr_assert_eq(pool, (magpool_t *)0x1, "*out unchanged");
}
