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
  if (t == 0) t = ++r->next_tag;
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
