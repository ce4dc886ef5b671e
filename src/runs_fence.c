/* runs_fence.c - fenced free runs (runs.h): the batch tags, a run's
 * fence at its async free, the batch's retire behind its stream and its
 * unfence once the stream has passed it.  Layer 2, beside runs.c, with
 * which it shares the lock and the free runs' lists (runs_bits.h).
 */
#include "runs_bits.h"

uint32_t mp_runs_tag(magpool_t *pool) {
  mp_runs *r = &pool->chunks->runs;
  runs_lock(r);
  uint32_t t = ++r->next_tag;
  while (t == 0 || t == MP_TAG_SOLO) t = ++r->next_tag;
  runs_unlock(r);
  return t;
}
uint32_t mp_runs_tag_now(magpool_t *pool) { /* the lock orders it after mp_runs_tag */
  mp_runs *r = &pool->chunks->runs;
  runs_lock(r);
  uint32_t t = r->next_tag;
  return runs_unlock(r), t;
}

/* A live run's chunks are never in fbits (mp_runs_alloc takes its window
 * out), so the range's bits are set a word at a time. */
bool mp_runs_fence(magpool_t *pool, uint32_t s, uint32_t m, uint32_t tag, uint64_t owner,
                   bool retired) {
  mp_runs *r = &pool->chunks->runs;
  bool again = true;
  runs_lock(r);
  for (uint32_t k = s; k < s + m; k++) {
    again &= r->tag[k] == tag;
    r->tag[k] = tag;
    r->owner[k] = owner;
  }
  sole_put(r, owner);
  for (uint32_t wi = s / 64; wi <= (s + m - 1) / 64; wi++) {
    uint64_t w = word_mask(s, s + m, wi);
    r->fbits[wi] |= w;
    r->rbits[wi] = retired ? r->rbits[wi] | w : r->rbits[wi] & ~w;
  }
  count_add(&r->nfenced, m);
  if (retired) count_add(&r->nretired, m);
  insert(r, s, m);
  runs_unlock(r);
  return again;
}

/* ------------------------------------------------------------- solo runs */

bool mp_runs_solo_give(magpool_t *pool, uint32_t s, uint32_t m, uint64_t owner) {
  mp_runs *r = &pool->chunks->runs;
  runs_lock(r);
  uint64_t o = mp_load_relaxed(&r->solo);
  if (o != 0 && o != owner) {
    runs_unlock(r);
    return false;
  }
  if (o == 0) r->solo_lo = s, r->solo_hi = s + m;
  if (s < r->solo_lo) r->solo_lo = s;
  if (s + m > r->solo_hi) r->solo_hi = s + m;
  if (o == 0) mp_store_relaxed(&r->solo, owner); /* read under the lock, or as a hint */
  /* The chunks' busy counts stay as the live run left them (runs.h): no
   * unmap takes them while the stream may still use them.  The fills
   * have no atomic in them, so the compiler may vectorise them. */
  for (uint32_t k = s; k < s + m; k++) r->tag[k] = MP_TAG_SOLO;
  for (uint32_t k = s; k < s + m; k++) r->owner[k] = owner;
  uint64_t gone = 0, dret = 0; /* stale retired bits of a live run (putback's) */
  bits_clear(r->rbits, r->fbits, s, s + m, &gone, &dret);
  count_add(&r->nretired, -dret);
  for (uint32_t wi = s / 64; wi <= (s + m - 1) / 64; wi++) r->sbits[wi] |= word_mask(s, s + m, wi);
  count_add(&r->nsolo, m);
  insert(r, s, m);
  count_add(&r->rbusy, -(uint64_t)m);
  runs_unlock(r);
  return true;
}

uint64_t mp_runs_solo(magpool_t *pool) {
  return pool->chunks != NULL ? mp_load_relaxed(&pool->chunks->runs.solo) : 0;
}

uint64_t mp_runs_solo_bytes(const magpool_t *pool) {
  const mp_chunks *c = pool->chunks;
  return c != NULL ? mp_load_relaxed(&c->runs.nsolo) << c->shift : 0;
}

/* Under the lock: owner's solo over.  tag 0: dropped, its stream has
 * passed everything, so the free chunks go to busy 0 (RELEASE: the
 * stream's last use happens before an unmap that reads it); else they
 * are fenced with `tag`, their busy counts as they are. */
static bool solo_end(magpool_t *pool, uint64_t owner, uint32_t tag, uint32_t *range) {
  mp_chunks *c = pool->chunks;
  mp_runs *r = &c->runs;
  if (mp_load_relaxed(&r->solo) != owner) return false;
  uint64_t fresh = 0;
  for (uint32_t k = r->solo_lo; k < r->solo_hi; k++) {
    if (r->tag[k] != MP_TAG_SOLO) continue;
    r->tag[k] = tag;
    if (!bit(r->sbits, k)) continue; /* taken back since: its taker counts it */
    bit_set(r->sbits, k, false);
    count(&r->nsolo, false);
    if (tag == 0) { /* dropped: free as it is */
      mp_store_release(&c->busy[c->run0 + k], 0);
      continue;
    }
    bit_set(r->rbits, k, false);
    fbit_put(r, k, true);
    fresh++;
  }
  count_add(&r->rbusy, fresh); /* fenced chunks count busy (C3) */
  if (range != NULL) range[0] = r->solo_lo, range[1] = r->solo_hi - r->solo_lo;
  r->solo_lo = r->solo_hi = 0;
  mp_store_relaxed(&r->solo, 0);
  return true;
}

bool mp_runs_solo_end(magpool_t *pool, uint64_t owner, uint32_t tag, uint32_t *range) {
  mp_runs *r = &pool->chunks->runs;
  runs_lock(r);
  bool mine = solo_end(pool, owner, tag, range);
  runs_unlock(r);
  return mine;
}

bool mp_runs_solo_drop(magpool_t *pool, uint64_t owner) {
  mp_runs *r = &pool->chunks->runs;
  runs_lock(r);
  bool mine = solo_end(pool, owner, 0, NULL);
  runs_unlock(r);
  return mine;
}

void mp_runs_unfence(magpool_t *pool, const uint32_t *fr, uint32_t n, uint32_t tag) {
  mp_chunks *c = pool->chunks;
  mp_runs *r = &c->runs;
  uint64_t down = 0, dret = 0;
  runs_lock(r);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t a = fr[2 * i], b = a + fr[2 * i + 1];
    for (uint32_t wi = a / 64; wi <= (b - 1) / 64; wi++) {
      uint64_t hit = 0; /* still carrying the tag (else taken and given again since) */
      for (uint32_t k = a > wi * 64 ? a : wi * 64, e = b < wi * 64 + 64 ? b : wi * 64 + 64; k < e;
           k++)
        if (r->tag[k] == tag) {
          r->tag[k] = 0;
          hit |= (uint64_t)1 << (k % 64);
        }
      uint64_t f = r->fbits[wi] & hit; /* the others were taken since: their takers count them */
      r->fbits[wi] &= ~f;
      /* RELEASE: the stream's last use happens before an unmap that
       * reads 0 (chunk.c). */
      for (uint64_t w = f; w != 0; w &= w - 1, down++) {
        dret += (r->rbits[wi] & w & -w) != 0;
        mp_store_release(&c->busy[c->run0 + wi * 64 + mp_ctz64(w)], 0);
      }
      r->rbits[wi] &= ~hit;
    }
  }
  count_add(&r->nfenced, -down);
  count_add(&r->nretired, -dret);
  count_add(&r->rbusy, -down);
  runs_unlock(r);
}

void mp_runs_retire(magpool_t *pool, const uint32_t *fr, uint32_t n, uint32_t tag) {
  mp_runs *r = &pool->chunks->runs;
  runs_lock(r);
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t k = fr[2 * i]; k < fr[2 * i] + fr[2 * i + 1]; k++)
      if (r->tag[k] == tag) rbit_put(r, k, true); /* taken ones too: a putback */
  runs_unlock(r);
}

uint64_t mp_runs_fenced_bytes(const magpool_t *pool, bool retired) {
  const mp_chunks *c = pool->chunks;
  if (c == NULL) return 0;
  return mp_load_relaxed(retired ? &c->runs.nretired : &c->runs.nfenced) << c->shift;
}
