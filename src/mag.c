/* mag.c - magazine objects: slabs they are carved from, the spare list,
 * and the lock-free stack (depots and the spare list use it).  Layer 2:
 * calls nothing above it.
 *
 * Concurrency contract:
 *   mp_stack_push_mpmc / mp_stack_pop_mpmc ... any thread, concurrently
 *                                              (versioned head, types.h)
 *   mp_mag_new / mp_mag_free ................. any thread (spare list)
 *   pool->mag_chunks ......................... push-only (CAS); walked by
 *                                              destroy
 *   a magazine's count and slots ............. its current owner only
 */
#include "internal.h"

#include <stdlib.h>

/* ------------------------------------------------------------ the stack */

#define MP_STACK_PTR_BITS 41
#define MP_STACK_PTR_MASK (((uint64_t)1 << MP_STACK_PTR_BITS) - 1)

static inline mp_mag *stack_ptr(uint64_t h) {
  return (mp_mag *)(uintptr_t)((h & MP_STACK_PTR_MASK) << 6);
}
static inline uint64_t stack_pack(mp_mag *m, uint64_t h_old) {
  uint64_t ver = (h_old >> MP_STACK_PTR_BITS) + 1;
  return ((uint64_t)(uintptr_t)m >> 6) | (ver << MP_STACK_PTR_BITS);
}

void mp_stack_push_mpmc(mp_stack *s, mp_mag *m) {
  uint64_t h = mp_load_acquire(&s->head);
  do {
    mp_store_relaxed(&m->next, stack_ptr(h));
    /* RELEASE: the magazine's contents (slots, count) are written before
     * it becomes reachable; pairs with the ACQUIRE in mp_stack_pop_mpmc. */
  } while (!mp_cas_weak_acq_rel(&s->head, &h, stack_pack(m, h)));
}

mp_mag *mp_stack_pop_mpmc(mp_stack *s) {
  uint64_t h = mp_load_acquire(&s->head);
  for (;;) {
    mp_mag *m = stack_ptr(h);
    if (m == NULL) return NULL;
    /* m may be popped and reused by another thread right now: `next` is
     * atomic and magazines are never unmapped while the pool lives, so
     * this read is safe; the version in the CAS rejects it if stale. */
    mp_mag *next = mp_load_relaxed(&m->next);
    if (mp_cas_weak_acq_rel(&s->head, &h, stack_pack(next, h))) return m;
  }
}

/* ------------------------------------------------------------ magazines */

#define MP_MAG_BYTES \
  ((sizeof(mp_mag) + MP_MAG_SLOTS * sizeof(void *) + MP_CACHELINE - 1) & ~(size_t)(MP_CACHELINE - 1))
#define MP_MAG_CHUNK_MAGS 64u

/* Magazine slabs: a list of chunks freed at pool destroy. */
typedef struct mag_chunk {
  struct mag_chunk *next;
} mag_chunk;

mp_mag *mp_mag_new(magpool_t *pool, unsigned order) {
  return mp_mag_new_cap(pool, order, pool->mag_cap[order < pool->nclasses ? order : 0]);
}

mp_mag *mp_mag_new_cap(magpool_t *pool, unsigned order, uint32_t cap) {
  mp_mag *m = mp_stack_pop_mpmc(&pool->spare);
  if (m == NULL) {
    size_t bytes = MP_CACHELINE + MP_MAG_CHUNK_MAGS * MP_MAG_BYTES;
    char *c = aligned_alloc(MP_CACHELINE, bytes);
    if (c == NULL) return NULL;
    mag_chunk *ch = (mag_chunk *)c;
    void *head = mp_load_relaxed(&pool->mag_chunks);
    do {
      ch->next = head;
      /* RELEASE: the slab's link is written before destroy's walk (ACQUIRE
       * in mp_mags_destroy) can reach it. */
    } while (!mp_cas_weak_release(&pool->mag_chunks, &head, ch));
    char *first = c + MP_CACHELINE;
    for (unsigned i = 1; i < MP_MAG_CHUNK_MAGS; i++) {
      mp_mag *x = (mp_mag *)(first + i * MP_MAG_BYTES);
      x->count = 0;
      x->cap = 0;
      mp_stack_push_mpmc(&pool->spare, x);
    }
    m = (mp_mag *)first;
  }
  m->count = 0;
  m->cap = cap != 0 ? cap : 1;
  m->order = order;
  mp_store_relaxed(&m->next, NULL);
  return m;
}

void mp_mag_free(magpool_t *pool, mp_mag *m) {
  m->count = 0;
  mp_stack_push_mpmc(&pool->spare, m);
}

void mp_mags_destroy(magpool_t *pool) {
  mag_chunk *c = mp_load_acquire(&pool->mag_chunks);
  while (c != NULL) {
    mag_chunk *n = c->next;
    free(c);
    c = n;
  }
  pool->mag_chunks = NULL;
}
