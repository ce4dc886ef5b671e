/* park_take.c - allocations on a stream take from its park (park.h):
 * one block of an order (mp_park_take; on a chunked pool the one of least
 * cost that covers the request) or a whole magazine for the caller's slot
 * (mp_park_take_mag).  Layer 4, beside park.c, which parks; both take the
 * park's lock (park_bits.h).
 */
#include "park_bits.h"

/* Most a reused block may cost over what the request needs: a run
 * backed for a larger request wastes its extra chunks while it is live,
 * and the run it could have served maps new ones.  An extent block: an
 * eighth, at least a granule. */
static size_t waste_max(const magpool_t *pool, size_t need) {
  const mp_chunks *c = pool->chunks;
  size_t w = need / 8, ch = c == NULL ? 0 : need >= c->chunk ? c->chunk : mp_block_bytes(pool, c->gord);
  return w > ch ? w : ch;
}

/* Under the lock: takes from the chain m of order o the block of least
 * cost at least `need` (and within waste_max of it unless `peak`), or
 * NULL. */
static void *pop_fit(const magpool_t *pool, mp_mag *m, unsigned o, size_t need, bool peak) {
  mp_mag *bm = NULL;
  uint32_t bi = 0;
  /* At a peak any cost serves (best starts at SIZE_MAX: none yet). */
  size_t best = SIZE_MAX, limit = peak ? SIZE_MAX - 1 : need + waste_max(pool, need);
  for (; m != NULL && best != need; m = mp_load_relaxed(&m->next))
    for (uint32_t i = m->count; i-- > 0;) {
      size_t c = mp_block_cost(pool, m->slot[i], o);
      if (c < need || c > limit || c >= best) continue;
      best = c, bm = m, bi = i;
      if (c == need) break;
    }
  if (bm == NULL) return NULL;
  void *p = bm->slot[bi];
  bm->slot[bi] = bm->slot[--bm->count];
  return p;
}

/* Under the lock: the order's head magazine (an empty one over full ones freed). */
static mp_mag *head_locked(magpool_t *pool, mp_park *k, unsigned order) {
  mp_mag *m = k->mags[order];
  if (m != NULL && m->count == 0 && mp_load_relaxed(&m->next) != NULL) {
    k->mags[order] = mp_load_relaxed(&m->next);
    mp_mag_free(pool, m);
    m = k->mags[order];
  }
  return m;
}

/* Under the lock: `cost` bytes of `order` left the park.  The empty head
 * stays for the next park unless full ones follow; an emptied magazine
 * further down stays until the order is retired. */
static void took_locked(magpool_t *pool, mp_park *k, unsigned order, int64_t cost) {
  set_bytes(k, pool, order, -cost);
  k->used[order] = ++k->clock;
  if (k->obytes[order] == 0)
    mp_store_relaxed(&k->mask, mp_load_relaxed(&k->mask) & ~((uint64_t)1 << order));
}

void *mp_park_take(magpool_t *pool, mp_sentry *e, unsigned order, size_t size, bool peak) {
  mp_park *k = &e->park;
  if ((mp_load_relaxed(&k->mask) >> order & 1) == 0) return NULL;
  size_t need = mp_request_cost(pool, order, size);
  park_lock(k);
  MP_HOOK(MP_HOOK_PARK_TAKE, k);
  void *p = NULL;
  mp_mag *m = head_locked(pool, k, order);
  /* A run parked for a smaller request is backed by fewer chunks than
   * this one needs: it stays parked, and another, or the tree, serves. */
  if (m != NULL) p = !partial(pool, order) && m->count != 0
                        ? m->slot[--m->count] /* every block of the order fits */
                        : pop_fit(pool, m, order, need, peak);
  if (p != NULL) took_locked(pool, k, order, (int64_t)mp_block_cost(pool, p, order));
  park_unlock(k);
  return p;
}

mp_mag *mp_park_take_mag(magpool_t *pool, mp_sentry *e, unsigned order, int64_t room) {
  mp_park *k = &e->park;
  if (!is_small(pool, order) || (mp_load_relaxed(&k->mask) >> order & 1) == 0) return NULL;
  park_lock(k);
  MP_HOOK(MP_HOOK_PARK_TAKE, k);
  mp_mag *m = head_locked(pool, k, order);
  int64_t b = m != NULL ? (int64_t)m->count * (int64_t)mp_block_bytes(pool, order) : 0;
  if (m != NULL && m->count > 1 && b <= room) {
    k->mags[order] = mp_load_relaxed(&m->next);
    mp_store_relaxed(&m->next, NULL);
    took_locked(pool, k, order, b);
  } else m = NULL;
  park_unlock(k);
  return m;
}
