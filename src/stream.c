/* stream.c - stream-ordered allocation (placeholder until the per-stream
 * caches land): on a HOST pool, a NULL stream means "no stream". */
#include "internal.h"

int mp_streams_init(magpool_t *pool) { (void)pool; return 0; }
void mp_streams_destroy(magpool_t *pool) { (void)pool; }
size_t mp_streams_drain_ready(magpool_t *pool, mp_tcache *tc) { (void)pool; (void)tc; return 0; }
void mp_streams_flush_caches(magpool_t *pool, mp_tcache *tc) { (void)pool; (void)tc; }
size_t mp_streams_wait_pending(magpool_t *pool, mp_tcache *tc) { (void)pool; (void)tc; return 0; }
void mp_streams_trim(magpool_t *pool, mp_tcache *tc) { (void)pool; (void)tc; }
void mp_streams_stats(magpool_t *pool, size_t *cached, size_t *pending) {
  (void)pool;
  *cached = 0;
  *pending = 0;
}

void *magpool_alloc_async(magpool_t *pool, size_t size, magpool_stream_t s) {
  if (pool == NULL) return mp_fail(MAGPOOL_EINVAL);
  if (s == NULL && pool->cfg.kind == MAGPOOL_MEM_HOST) return magpool_alloc(pool, size);
  return mp_fail(MAGPOOL_ENOTSUP);
}

int magpool_free_async(magpool_t *pool, void *ptr, magpool_stream_t s) {
  if (pool == NULL) return MAGPOOL_EINVAL;
  if (s == NULL && pool->cfg.kind == MAGPOOL_MEM_HOST) return magpool_free(pool, ptr);
  return MAGPOOL_ENOTSUP;
}

int magpool_stream_release(magpool_t *pool, magpool_stream_t s) {
  (void)s;
  return pool == NULL ? MAGPOOL_EINVAL : 0;
}
