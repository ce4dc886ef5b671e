/* hdr.h - the block-header word: the one place that knows its bits.
 *
 * One uint32 per unit of a region (region->hdr; in a chunked pool's run
 * space, one group of words per chunk: mp_region_hdr_at).  The word of a live
 * block's first unit encodes it; every other word reads as "no block":
 *   bits 0..5   order + 1 (0 = not the start of a live block)
 *   bit  6      the block belongs to a scope (MP_HDR_SCOPE)
 *   bits 7..31  slack = block bytes - requested bytes, when < MP_HDR_BIG;
 *               else MP_HDR_BIG, and the slack is kept in the next two
 *               words (their order bits are 0, so they still read as "no
 *               block")
 *
 * Invariant: hdr[u] has nonzero order bits <=> a live block starts at u.
 * Every free moves the word from live to 0 before the block goes anywhere
 * (cache or tree); that is what detects double, interior and foreign
 * frees.  Cached blocks have header 0: to the API they are free.
 *
 * Ordering: all accesses are relaxed.  A header is written by the
 * allocation that hands a block out and read by the free of that block,
 * which the program orders after the allocation (it must hold the pointer
 * to free it); the block's hand-over between owners is ordered by the
 * tree, the magazines or the stream callbacks, never by the header.
 */
#ifndef MAGPOOL_HDR_H
#define MAGPOOL_HDR_H

#include "atomic.h"
#include "base.h"

#define MP_HDR_ORDER_MASK 0x3fu
#define MP_HDR_SCOPE 0x40u
#define MP_HDR_SLACK_SHIFT 7
#define MP_HDR_BIG 0x1ffffffu

/* The word for a live block whose slack is below MP_HDR_BIG (every cached
 * block: they are at most 16 MiB).  The fast paths use this form. */
MP_INLINE uint32_t mp_hdr_make_small(unsigned order, size_t slack, uint32_t flags) {
  return (uint32_t)(order + 1) | ((uint32_t)slack << MP_HDR_SLACK_SHIFT) | flags;
}

/* Marks a block live: writes its word, and the two slack words first
 * when the slack is big.  flags: 0 or MP_HDR_SCOPE. */
MP_INLINE void mp_hdr_set(_Atomic uint32_t *h, unsigned order, size_t slack, uint32_t flags) {
  if (MP_UNLIKELY(slack >= MP_HDR_BIG)) {
    mp_store_relaxed(&h[1], (uint32_t)(slack & MP_HDR_BIG) << MP_HDR_SLACK_SHIFT);
    mp_store_relaxed(&h[2], (uint32_t)((slack >> 25) & MP_HDR_BIG) << MP_HDR_SLACK_SHIFT);
    slack = MP_HDR_BIG;
  }
  mp_store_relaxed(h, mp_hdr_make_small(order, slack, flags));
}

/* Marks a block free (the claim of a free). */
MP_INLINE void mp_hdr_clear(_Atomic uint32_t *h) { mp_store_relaxed(h, 0); }

/* The word now. */
MP_INLINE uint32_t mp_hdr_read(const _Atomic uint32_t *h) { return mp_load_relaxed(h); }

/* Order of a word; ~0u when it is not the start of a live block, so one
 * unsigned compare (order < nclasses) also rejects "not live". */
MP_INLINE unsigned mp_hdr_order(uint32_t w) { return (w & MP_HDR_ORDER_MASK) - 1u; }

MP_INLINE bool mp_hdr_live(uint32_t w) { return (w & MP_HDR_ORDER_MASK) != 0; }

MP_INLINE bool mp_hdr_scoped(uint32_t w) { return (w & MP_HDR_SCOPE) != 0; }

/* Slack of a word whose slack is small (the fast paths' form). */
MP_INLINE size_t mp_hdr_slack_small(uint32_t w) { return w >> MP_HDR_SLACK_SHIFT; }

/* Slack of the live block whose word w was read from h. */
MP_INLINE size_t mp_hdr_slack(const _Atomic uint32_t *h, uint32_t w) {
  size_t s = w >> MP_HDR_SLACK_SHIFT;
  if (MP_LIKELY(s < MP_HDR_BIG)) return s;
  size_t lo = mp_load_relaxed(&h[1]) >> MP_HDR_SLACK_SHIFT;
  size_t hi = mp_load_relaxed(&h[2]) >> MP_HDR_SLACK_SHIFT;
  return lo | (hi << 25);
}

#endif /* MAGPOOL_HDR_H */
