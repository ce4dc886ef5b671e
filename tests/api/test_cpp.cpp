// test_cpp.cpp - the C++ RAII header (include/magpool.hpp) and the C header
// compiled as C++.  A plain program: each CHECK that fails prints and makes
// the exit status non-zero.
#include <magpool.hpp>

#include <cstdio>
#include <cstring>
#include <utility>

static int failures = 0;
#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                 \
      failures++;                                                          \
    }                                                                      \
  } while (0)

static magpool_config_t small_config() {
  magpool_config_t c;
  magpool_config_init(&c);
  c.pool_size = std::size_t(16) << 20;
  return c;
}

static void touch(void *p) { std::memset(p, 0x5a, 1024); }

int main() {
  // pool: create, move, destroy.
  {
    magpool::pool p(small_config());
    CHECK(p);
    magpool::pool q(std::move(p));
    CHECK(!p && q);
    void *x = q.alloc(100);
    CHECK(x != nullptr);
    CHECK(q.free(x) == 0);
    CHECK(q.free(x) == MAGPOOL_EINVAL); // double free
  }
  // Constructor errors throw magpool::error with the code.
  {
    magpool_config_t bad = small_config();
    bad.min_block = 3;
    bool thrown = false;
    try {
      magpool::pool p(bad);
    } catch (const magpool::error &e) {
      thrown = e.code() == MAGPOOL_EINVAL;
    }
    CHECK(thrown);
    int rc = 0;
    magpool::pool n = magpool::pool::try_create(bad, &rc);
    CHECK(!n && rc == MAGPOOL_EINVAL);
  }
  // unique_block frees on scope exit; used_bytes comes back to 0.
  {
    magpool::pool p(small_config());
    {
      magpool::unique_block b(p, 1000);
      CHECK(b && magpool_usable_size(p.get(), b.get()) == 1024);
      touch(b.get());
      CHECK(p.stats().used_bytes == 1024);
      magpool::unique_block c(std::move(b));
      CHECK(!b && c);
    }
    CHECK(p.stats().used_bytes == 0);
    // An allocation that cannot fit throws ENOMEM and the pool still works.
    bool thrown = false;
    try {
      magpool::unique_block huge(p, std::size_t(1) << 40);
    } catch (const magpool::error &e) {
      thrown = e.code() == MAGPOOL_ENOMEM;
    }
    CHECK(thrown);
    magpool::unique_block ok(p, 64);
    CHECK(ok);
  }
  // scope: everything allocated through it is freed at its end.
  {
    magpool::pool p(small_config());
    {
      magpool::scope s(p);
      for (int i = 0; i < 100; i++) CHECK(s.alloc(std::size_t(64) << (i % 8)) != nullptr);
      void *x = s.alloc(4096);
      CHECK(magpool_free(p.get(), x) == MAGPOOL_EINVAL); // scope blocks are the scope's
      CHECK(s.free(x) == 0);
      CHECK(p.stats().live_count == 100);
    }
    CHECK(p.stats().used_bytes == 0);
    CHECK(p.trim() == 0);
    CHECK(magpool_check(p.get()) == 0);
  }
  // host_stream + async block: freed on its stream by the destructor.
  {
    magpool::pool p(small_config());
    magpool::host_stream hs;
    {
      magpool::unique_block b(p, 1024, hs.get());
      CHECK(hs.launch(touch, b.get()) == 0);
    }
    CHECK(hs.sync() == 0);
    CHECK(magpool_stream_release(p.get(), hs.get()) == 0);
    CHECK(hs.sync() == 0);
    CHECK(p.trim() == 0);
    magpool_stats_t st = p.stats();
    CHECK(st.used_bytes == 0 && st.pending_bytes == 0 && st.cached_bytes == 0);
    CHECK(st.largest_free_block == (std::size_t(16) << 20));
  }
  if (failures == 0) std::printf("test_cpp: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
