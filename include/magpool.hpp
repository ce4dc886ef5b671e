// magpool.hpp - optional C++ RAII wrappers over magpool.h (C++11 or later).
//
// Header-only; nothing here is compiled into the library.  Every wrapper
// owns exactly one magpool object and gives it back in its destructor:
//
//   magpool::pool          a magpool_t *              -> magpool_destroy
//   magpool::unique_block  one block of a pool        -> magpool_free
//   magpool::scope         a magpool_scope_t *        -> magpool_scope_end
//   magpool::host_stream   a host stream              -> magpool_host_stream_destroy
//
// Errors: constructors that can fail throw magpool::error (which carries
// the MAGPOOL_E* code) unless the nothrow factory (try_create) is used.
// Destructors never throw; they ignore the code of the call they make.
#ifndef MAGPOOL_HPP
#define MAGPOOL_HPP

#include <cstddef>
#include <stdexcept>
#include <utility>

#include "magpool.h"

namespace magpool {

// A failed magpool call; code() is the MAGPOOL_E* value.
class error : public std::runtime_error {
 public:
  explicit error(int code) : std::runtime_error(magpool_strerror(code)), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

// Owns one pool.  Movable, not copyable.
class pool {
 public:
  // Creates a pool with the given configuration (magpool_config_init's
  // defaults when none is given).  Throws magpool::error on failure.
  pool() : pool(defaults()) {}
  explicit pool(const magpool_config_t &cfg) {
    int rc = magpool_create(&cfg, &p_);
    if (rc != 0) throw error(rc);
  }
  // Nothrow: returns a pool that owns nothing (get() == nullptr) and stores
  // the code in *rc on failure.
  static pool try_create(const magpool_config_t &cfg, int *rc) noexcept {
    pool out(nullptr);
    int r = magpool_create(&cfg, &out.p_);
    if (rc != nullptr) *rc = r;
    return out;
  }
  ~pool() { reset(); }
  pool(pool &&o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  pool &operator=(pool &&o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      o.p_ = nullptr;
    }
    return *this;
  }
  pool(const pool &) = delete;
  pool &operator=(const pool &) = delete;

  magpool_t *get() const noexcept { return p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  // Gives up ownership without destroying.
  magpool_t *release() noexcept {
    magpool_t *p = p_;
    p_ = nullptr;
    return p;
  }
  void reset() noexcept {
    if (p_ != nullptr) magpool_destroy(p_);
    p_ = nullptr;
  }

  // Thin forwards; see magpool.h for the contracts.
  void *alloc(std::size_t n) noexcept { return magpool_alloc(p_, n); }
  int free(void *ptr) noexcept { return magpool_free(p_, ptr); }
  int trim() noexcept { return magpool_trim(p_); }
  magpool_stats_t stats() const {
    magpool_stats_t s;
    int rc = magpool_get_stats(p_, &s);
    if (rc != 0) throw error(rc);
    return s;
  }

 private:
  explicit pool(std::nullptr_t) noexcept : p_(nullptr) {}
  static magpool_config_t defaults() noexcept {
    magpool_config_t c;
    magpool_config_init(&c);
    return c;
  }
  magpool_t *p_ = nullptr;
};

// Owns one block: freed with magpool_free (or magpool_free_async on the
// stream given at construction) when it goes out of scope.
class unique_block {
 public:
  unique_block() noexcept = default;
  // Allocates n bytes from p (synchronous API).  Throws on failure.
  unique_block(pool &p, std::size_t n) : pool_(p.get()), ptr_(magpool_alloc(p.get(), n)) {
    if (ptr_ == nullptr) throw error(magpool_last_error());
  }
  // Allocates n bytes for use on stream s; the destructor frees on s.
  unique_block(pool &p, std::size_t n, magpool_stream_t s)
      : pool_(p.get()), ptr_(magpool_alloc_async(p.get(), n, s)), stream_(s), async_(true) {
    if (ptr_ == nullptr) throw error(magpool_last_error());
  }
  ~unique_block() { reset(); }
  unique_block(unique_block &&o) noexcept
      : pool_(o.pool_), ptr_(o.ptr_), stream_(o.stream_), async_(o.async_) {
    o.ptr_ = nullptr;
  }
  unique_block &operator=(unique_block &&o) noexcept {
    if (this != &o) {
      reset();
      pool_ = o.pool_;
      ptr_ = o.ptr_;
      stream_ = o.stream_;
      async_ = o.async_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  unique_block(const unique_block &) = delete;
  unique_block &operator=(const unique_block &) = delete;

  void *get() const noexcept { return ptr_; }
  template <class T> T *as() const noexcept { return static_cast<T *>(ptr_); }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }
  // Gives up ownership: the caller frees the block.
  void *release() noexcept {
    void *p = ptr_;
    ptr_ = nullptr;
    return p;
  }
  void reset() noexcept {
    if (ptr_ != nullptr) {
      if (async_) magpool_free_async(pool_, ptr_, stream_);
      else magpool_free(pool_, ptr_);
    }
    ptr_ = nullptr;
  }

 private:
  magpool_t *pool_ = nullptr;
  void *ptr_ = nullptr;
  magpool_stream_t stream_ = nullptr;
  bool async_ = false;
};

// A task scope: every block allocated through it is freed when it ends.
class scope {
 public:
  explicit scope(pool &p) : s_(magpool_scope_begin(p.get())) {
    if (s_ == nullptr) throw error(magpool_last_error());
  }
  ~scope() {
    if (s_ != nullptr) magpool_scope_end(s_);
  }
  scope(scope &&o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  scope &operator=(scope &&) = delete;
  scope(const scope &) = delete;
  scope &operator=(const scope &) = delete;

  void *alloc(std::size_t n) noexcept { return magpool_scope_alloc(s_, n); }
  int free(void *ptr) noexcept { return magpool_scope_free(s_, ptr); }
  magpool_scope_t *get() const noexcept { return s_; }

 private:
  magpool_scope_t *s_;
};

// An in-order host executor (magpool_host_stream_*).
class host_stream {
 public:
  host_stream() {
    int rc = magpool_host_stream_create(&s_);
    if (rc != 0) throw error(rc);
  }
  ~host_stream() {
    if (s_ != nullptr) magpool_host_stream_destroy(s_);
  }
  host_stream(host_stream &&o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  host_stream &operator=(host_stream &&) = delete;
  host_stream(const host_stream &) = delete;
  host_stream &operator=(const host_stream &) = delete;

  magpool_stream_t get() const noexcept { return s_; }
  int launch(void (*fn)(void *), void *arg) noexcept {
    return magpool_host_stream_launch(s_, fn, arg);
  }
  int sync() noexcept { return magpool_host_stream_sync(s_); }

 private:
  magpool_stream_t s_ = nullptr;
};

}  // namespace magpool

#endif  // MAGPOOL_HPP
