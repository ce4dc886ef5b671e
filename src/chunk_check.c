/* chunk_check.c - the chunk map's checker (C1-C6, types.h: struct
 * mp_chunks) and the counts the pool's checker and stats read, on a
 * quiescent pool (relaxed reads, no lock); and the empty mapped chunks
 * the tree's placement asks for (under the map's lock).  Layer 2, beside
 * chunk.c. */
#include "runs.h"

#include <pthread.h>

int mp_chunks_check(magpool_t *pool) {
  mp_chunks *c = pool->chunks;
  uint64_t mapped = 0, busy = 0, rbusy = 0, bits = 0;
  for (uint64_t i = 0; i < c->n; i++) {
    uint8_t st = mp_load_relaxed(&c->state[i]);
    uint32_t b = mp_load_relaxed(&c->busy[i]);
    bool bit = (mp_load_relaxed(&c->mapped[i / 64]) >> (i % 64)) & 1;
    if (st == MP_CHUNK_UNMAPPING || bit != (st == MP_CHUNK_MAPPED)) return MAGPOOL_EINVAL;
    if (b != 0 && st != MP_CHUNK_MAPPED) return MAGPOOL_EINVAL;           /* C1 */
    if (b > ((uint64_t)1 << (c->shift - pool->min_shift))) return MAGPOOL_EINVAL;
    if (st == MP_CHUNK_MAPPED) { /* C6 */
      uint64_t g = c->gfirst[i];
      if (g > i || c->gfirst[g] != g) return MAGPOOL_EINVAL;
      uint64_t n = c->glen[g];
      if (n == 0 || n > MP_CHUNK_GROUP || i >= g + n ||
          g / MP_CHUNK_GROUP != (g + n - 1) / MP_CHUNK_GROUP)
        return MAGPOOL_EINVAL;
      for (uint64_t k = g; k < g + n; k++)
        if (mp_load_relaxed(&c->state[k]) != MP_CHUNK_MAPPED) return MAGPOOL_EINVAL;
    }
    mapped += st == MP_CHUNK_MAPPED;
    bits += bit;
    busy += b != 0 && i < c->run0;
    rbusy += b != 0 && i >= c->run0;
  }
  if (mapped != mp_load_relaxed(&c->nmapped) || mapped != bits || mapped > c->cap)
    return MAGPOOL_EINVAL;                                                /* C2 */
  uint64_t solo = mp_load_relaxed(&c->runs.nsolo); /* busy, not counted (runs.h) */
  if (busy != mp_load_relaxed(&c->nbusy) || rbusy != mp_load_relaxed(&c->runs.rbusy) + solo ||
      busy + rbusy - solo > mp_load_relaxed(&c->hwm))
    return MAGPOOL_EINVAL;                                                /* C3 */
  if (mp_load_relaxed(&pool->reserved) != mapped * c->chunk) return MAGPOOL_EINVAL;   /* C5 */
  return 0;
}

uint64_t mp_chunks_out_bytes(const magpool_t *pool) {
  const mp_chunks *c = pool->chunks;
  uint64_t units = 0;
  for (uint64_t i = 0; i < c->n; i++) units += mp_load_relaxed(&c->busy[i]);
  return units << pool->min_shift;
}

bool mp_chunks_busy(const magpool_t *pool, uint64_t chunk) {
  return mp_load_relaxed(&pool->chunks->busy[chunk]) != 0;
}

unsigned mp_chunks_empty_low(magpool_t *pool, uint64_t *out, unsigned max) {
  mp_chunks *c = pool->chunks;
  unsigned k = 0;
  pthread_mutex_lock((pthread_mutex_t *)c->lock);
  for (uint64_t wi = 0; wi < c->run0 / 64 && k < max; wi++)
    for (uint64_t w = mp_load_relaxed(&c->mapped[wi]); w != 0 && k < max; w &= w - 1) {
      uint64_t i = wi * 64 + mp_ctz64(w);
      if (mp_load_relaxed(&c->busy[i]) == 0) out[k++] = i;
    }
  pthread_mutex_unlock((pthread_mutex_t *)c->lock);
  return k;
}
