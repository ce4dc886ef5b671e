/* chunk_unmap.c - the chunk map's unmap side (chunk.h): empty groups
 * found, marked UNMAPPING in rows, their busy counts re-read after every
 * running thread's barrier, and unmapped a row a source call; and the
 * reserved-bytes count.  Layer 2, beside chunk.c, which calls it.  The
 * take's side and the argument: chunk.c, "Ordering". */
#include "asym.h"
#include "chunk.h"

void mp_chunks_reserved_add(magpool_t *pool, int64_t chunks) {
  mp_chunks *c = pool->chunks;
  int64_t d = chunks * (int64_t)c->chunk;
  size_t now = mp_fetch_add_relaxed(&pool->reserved, (size_t)d) + (size_t)d;
  if (d > 0 && mp_max_relaxed_size(&pool->peak_reserved, now) == now) /* a new peak */
    mp_store_relaxed(&pool->pending_at_peak,
                     mp_load_relaxed(&pool->retire.pending_bytes) +
                         (int64_t)mp_runs_fenced_bytes(pool, true));
}

/* Group g (its first chunk) busy: seq_cst loads, the handshake's re-read.
 * A free solo run's chunks keep their busy counts (runs.h), so they count
 * busy here while their stream may still use them. */
static bool group_busy(const mp_chunks *c, uint64_t g) {
  for (uint64_t k = g; k < g + c->glen[g]; k++)
    if (mp_load_seq_cst(&c->busy[k]) != 0) return true;
  return false;
}

/* [a, b), whole groups marked UNMAPPING: unmaps each row group_busy finds empty with one
 * source call (keep: for the move's maps, drop_kept frees the rest); a busy group, or a row
 * the source refuses, is MAPPED again.  Lock held.  Returns the chunks unmapped. */
static uint64_t unmap_span(magpool_t *pool, uint64_t a, uint64_t b, int keep) {
  mp_chunks *c = pool->chunks;
  uint64_t got = 0;
  for (uint64_t g = a, s = a; s < b;) { /* [s, g): empty, then g busy (or b) */
    while (g < b && !group_busy(c, g)) g += c->glen[g];
    bool ok = g > s && pool->src->unmap(pool->src_ctx, c->base + (s << c->shift),
                                        (g - s) << c->shift, keep) == 0;
    uint64_t e = g < b ? g + c->glen[g] : b; /* with the busy group */
    for (uint64_t k = s; k < e; k++) {
      mp_store_seq_cst(&c->state[k], ok && k < g ? MP_CHUNK_UNMAPPED : MP_CHUNK_MAPPED);
      if (ok && k < g) mp_chunks_bit_put(c, k, false);
    }
    got += ok ? g - s : 0;
    s = g = e;
  }
  if (got == 0) return 0;
  mp_store_relaxed(&c->nmapped, mp_load_relaxed(&c->nmapped) - got);
  mp_fetch_add_relaxed(&c->unmaps, got);
  mp_chunks_reserved_add(pool, -(int64_t)got);
  return got;
}

/* Rows marked UNMAPPING at most before their busy counts are re-read. */
#define MP_UNMAP_ROWS 16

/* The nr marked rows row[j] = [start, end): every running thread's full
 * barrier (the run-space takes' StoreLoad: chunk.c, "Ordering"), then
 * unmap_span each.  Lock held.  Returns the chunks unmapped. */
static uint64_t unmap_rows(magpool_t *pool, uint64_t (*row)[2], unsigned *nr, int keep) {
  uint64_t got = 0;
  if (*nr != 0) mp_asym_heavy();
  for (unsigned j = 0; j < *nr; j++) got += unmap_span(pool, row[j][0], row[j][1], keep);
  *nr = 0;
  return got;
}

/* Unmaps empty groups in [lo, hi), highest first, until `want` chunks are
 * gone, `floor` left: marks rows of adjacent ones for unmap_rows; a second
 * scan replaces any found busy.  Lock held.  Returns the chunks unmapped. */
static uint64_t unmap_down(magpool_t *pool, uint64_t lo, uint64_t hi, uint64_t want, int keep,
                           uint64_t floor) {
  mp_chunks *c = pool->chunks;
  uint64_t got = 0;
  for (int scan = 0; scan < 2 && got < want && hi > lo; scan++) {
    uint64_t row[MP_UNMAP_ROWS][2], marked = 0, before = got;
    uint64_t pend = 0; /* marked, not yet re-read */
    unsigned nr = 0;
    for (uint64_t wi = (hi - 1) / 64 + 1; wi-- > lo / 64 && got + pend < want;)
      for (uint64_t w = mp_load_relaxed(&c->mapped[wi]); w != 0 && got + pend < want;) {
        uint64_t i = wi * 64 + 63 - mp_clz64(w), g = c->gfirst[i], n = c->glen[g];
        w &= ~((uint64_t)1 << (i % 64));
        if (i < lo || i >= hi || mp_load_relaxed(&c->state[i]) != MP_CHUNK_MAPPED ||
            mp_load_relaxed(&c->nmapped) < floor + n + pend || group_busy(c, g))
          continue;
        if (nr == 0 || g + n != row[nr - 1][0]) { /* a new row */
          if (nr == MP_UNMAP_ROWS) got += unmap_rows(pool, row, &nr, keep), pend = 0;
          row[nr][1] = g + n;
          nr++;
        }
        row[nr - 1][0] = g;
        for (uint64_t k = g; k < g + n; k++) mp_store_seq_cst(&c->state[k], MP_CHUNK_UNMAPPING);
        marked += n, pend += n;
        MP_HOOK(MP_HOOK_CHUNK_UNMAP, c->base + (i << c->shift));
      }
    got += unmap_rows(pool, row, &nr, keep);
    if (got - before == marked) break;
  }
  return got;
}

uint64_t mp_chunks_unmap_highest(magpool_t *pool, uint64_t want, int keep, uint64_t floor) {
  mp_chunks *c = pool->chunks;
  uint64_t got = unmap_down(pool, c->run0, mp_load_relaxed(&c->run_top), want, keep, floor);
  return got >= want ? got : got + unmap_down(pool, 0, mp_load_relaxed(&c->tree_top), want - got, keep, floor);
}

uint64_t mp_chunks_count_empty(mp_chunks *c, uint64_t enough) {
  uint64_t k = 0;
  for (uint64_t wi = 0; wi < (c->n + 63) / 64 && k < enough; wi++)
    for (uint64_t w = mp_load_relaxed(&c->mapped[wi]); w != 0 && k < enough; w &= w - 1)
      k += mp_load_relaxed(&c->busy[wi * 64 + mp_ctz64(w)]) == 0;
  return k;
}
