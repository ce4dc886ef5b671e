/* mag.c - magazine objects: slabs they are carved from, the spare list,
 * and the lock-free stack (depots and the spare list use it).  Layer 2:
 * calls nothing above it.
 *
 * Concurrency contract:
 *   mp_stack_push_mpmc / mp_stack_pop_mpmc ... any thread, concurrently
 *                                              (versioned head, types.h)
 *   mp_mag_new / mp_mag_free ................. any thread (spare list)
 *   pool->mag_tab, mag_nslabs ................ slot k written once (RELEASE)
 *                                              by the thread that took k
 *                                              with a fetch_add; read by
 *                                              anyone; freed by destroy
 *   a magazine's count and slots ............. its current owner only
 */
#include "internal.h"

#include <stdlib.h>
#include <sys/mman.h>

/* ------------------------------------------------------------ slabs */

#define MP_MAG_BYTES \
  ((sizeof(mp_mag) + MP_MAG_SLOTS * sizeof(void *) + MP_CACHELINE - 1) & ~(size_t)(MP_CACHELINE - 1))
#define MP_MAG_PER_SLAB 64u
#define MP_MAG_SLAB_BYTES (MP_CACHELINE + MP_MAG_PER_SLAB * MP_MAG_BYTES)

/* The magazine with index idx (1-based: 0 is NULL).  Any thread holding an
 * index it read through a stack head (ACQUIRE) or from a magazine it owns:
 * the slab was published (RELEASE, mp_mag_new_cap) before any of its
 * magazines could reach a stack. */
static inline mp_mag *mag_at(magpool_t *pool, uint32_t idx) {
  if (idx == 0) return NULL;
  char *slab = mp_load_relaxed(&pool->mag_tab[(idx - 1) / MP_MAG_PER_SLAB]);
  return (mp_mag *)(slab + MP_CACHELINE + ((idx - 1) % MP_MAG_PER_SLAB) * MP_MAG_BYTES);
}

int mp_mags_init(magpool_t *pool) {
  size_t bytes = (size_t)MP_MAG_SLABS_MAX * sizeof(*pool->mag_tab);
  void *t = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (t == MAP_FAILED) return MAGPOOL_ENOMEM;
  pool->mag_tab = t;
  return 0;
}

void mp_mags_destroy(magpool_t *pool) {
  if (pool->mag_tab == NULL) return;
  uint32_t n = mp_load_acquire(&pool->mag_nslabs);
  if (n > MP_MAG_SLABS_MAX) n = MP_MAG_SLABS_MAX;
  for (uint32_t i = 0; i < n; i++) free(mp_load_relaxed(&pool->mag_tab[i]));
  munmap((void *)pool->mag_tab, (size_t)MP_MAG_SLABS_MAX * sizeof(*pool->mag_tab));
  pool->mag_tab = NULL;
}

/* ------------------------------------------------------------ the stack */

/* The head: (version << 32) | index.  Every successful push and pop bumps
 * the version, so a pop that stalls between reading the head (and the
 * head's next) and its CAS fails unless exactly a multiple of 2^32 pushes
 * and pops happened meanwhile. */
static inline uint64_t head_next(uint64_t h, uint32_t idx) {
  return (((h >> 32) + 1) << 32) | idx;
}

void mp_stack_push_mpmc(magpool_t *pool, mp_stack *s, mp_mag *m) {
  uint64_t h = mp_load_acquire(&s->head);
  do {
    mp_store_relaxed(&m->next, mag_at(pool, (uint32_t)h));
    /* RELEASE: the magazine's contents (slots, count) are written before
     * it becomes reachable; pairs with the ACQUIRE in mp_stack_pop_mpmc. */
  } while (!mp_cas_weak_acq_rel(&s->head, &h, head_next(h, m->idx)));
}

mp_mag *mp_stack_pop_mpmc(magpool_t *pool, mp_stack *s) {
  uint64_t h = mp_load_acquire(&s->head);
  for (;;) {
    mp_mag *m = mag_at(pool, (uint32_t)h);
    if (m == NULL) return NULL;
    /* m may be popped and reused by another thread right now: `next` is
     * atomic, and magazines are never unmapped while the pool lives, and
     * their index is immutable, so these reads are safe; the version in
     * the CAS rejects them if stale. */
    mp_mag *next = mp_load_relaxed(&m->next);
    uint32_t nidx = next != NULL ? next->idx : 0;
    MP_HOOK(MP_HOOK_STACK_POP, s);
    if (mp_cas_weak_acq_rel(&s->head, &h, head_next(h, nidx))) return m;
  }
}

/* ------------------------------------------------------------ magazines */

mp_mag *mp_mag_new(magpool_t *pool, unsigned order) {
  return mp_mag_new_cap(pool, order, pool->mag_cap[order < pool->nclasses ? order : 0]);
}

/* A new slab: its magazines but the first go to the spare list. */
static mp_mag *slab_new(magpool_t *pool) {
  uint32_t k = mp_fetch_add_relaxed(&pool->mag_nslabs, 1);
  if (k >= MP_MAG_SLABS_MAX) return NULL; /* 2^26 magazines: out of host memory */
  char *c = aligned_alloc(MP_CACHELINE, MP_MAG_SLAB_BYTES);
  if (c == NULL) {
    mp_store_release(&pool->mag_tab[k], NULL); /* stays empty; destroy frees NULL */
    return NULL;
  }
  for (unsigned i = 0; i < MP_MAG_PER_SLAB; i++) {
    mp_mag *x = (mp_mag *)(c + MP_CACHELINE + i * MP_MAG_BYTES);
    x->count = 0;
    x->cap = 0;
    x->idx = k * MP_MAG_PER_SLAB + i + 1;
  }
  /* RELEASE: the slab's magazines (their indices) are written before any
   * thread can map an index to them. */
  mp_store_release(&pool->mag_tab[k], c);
  for (unsigned i = 1; i < MP_MAG_PER_SLAB; i++)
    mp_stack_push_mpmc(pool, &pool->spare, (mp_mag *)(c + MP_CACHELINE + i * MP_MAG_BYTES));
  return (mp_mag *)(c + MP_CACHELINE);
}

mp_mag *mp_mag_new_cap(magpool_t *pool, unsigned order, uint32_t cap) {
  mp_mag *m = mp_stack_pop_mpmc(pool, &pool->spare);
  if (m == NULL && (m = slab_new(pool)) == NULL) return NULL;
  m->count = 0;
  m->cap = cap != 0 ? cap : 1;
  m->order = order;
  mp_store_relaxed(&m->next, NULL);
  return m;
}

void mp_mag_free(magpool_t *pool, mp_mag *m) {
  m->count = 0;
  mp_stack_push_mpmc(pool, &pool->spare, m);
}
