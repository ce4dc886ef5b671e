/* runs.h - runs of chunks for large blocks (runs.c; data: types.h,
 * mp_runs), layer 2: region.c, chunk.c, retire.c and the checkers call
 * it.  Any thread (one mutex).  Run-space chunk numbers.
 *
 * Fenced free runs.  A run freed on a stream S that has not passed the
 * free goes back to the free runs at once, *fenced*: each of its chunks
 * carries the tag of the retire batch that will pass it and the key of
 * S's entry, and keeps its busy count (so it stays mapped: S's work may
 * still touch it).  Free runs coalesce whatever their fences.
 *   - A take for S (mp_acct.fence_owner == S's key) may use chunks fenced
 *     by S and unfenced ones; any other take only unfenced ones.  Stream
 *     order makes S's fenced chunks S's at once, as a parked block is.
 *   - The batch's drain (retire.c, after its stream callback) unfences
 *     the chunks still carrying its tag: those still free go to busy 0
 *     (RELEASE: S's last use happens before an unmap that reads 0);
 *     those S took meanwhile only lose the tag.
 *   - A take removes its window's fenced chunks from fbits (their busy
 *     count stays up, so no unmap can slip in) but leaves their tags:
 *     if the take fails (mp_chunks_acquire), mp_runs_putback fences the
 *     chunks whose tag is still there again and counts down the others.
 *   - Statistics: a fenced chunk whose batch is still open (the park's
 *     open fence batch, park.c) is cached, as a parked block is; once the
 *     batch is retired behind S (rbits), pending.
 * Invariants (mp_runs_check, quiescent): fbits ⊆ free chunks, and a chunk
 * in fbits has a tag and a busy count; a free chunk outside fbits has
 * tag 0 and busy 0; nfenced == |fbits|, nretired == |fbits & rbits|;
 * `sole`, if not 0, is the owner of every chunk in fbits (set by the
 * first fence after fbits was empty, 0 once another owner fences): a take
 * by that owner looks at whole free runs, as when nothing is fenced.
 *
 * Solo runs.  A stream that makes every run take (a training loop's;
 * park.c decides) gives its runs back as a synchronous free does, with
 * no fence, no batch and no question to the stream: the chunks carry
 * MP_TAG_SOLO and owner S, sbits marks those free, and they leave rbusy
 * (the budget's count) but keep their busy counts, so no unmap takes
 * them while S's work may still use them.  What keeps them S's:
 *   - every run take by another owner is refused (-2) while `solo` is set;
 *   - S's own take of a window of free solo chunks only needs its
 *     high-water mark (mp_chunks_acquire_held): its chunks were busy all
 *     along, so mapped;
 *   - every take that would map a chunk is refused (-2 here, MP_ESOLO
 *     from mp_chunks_acquire) so that the caller ends the solo first, and
 *     what S has passed can move instead of new memory being mapped.
 * The refused caller ends the solo (mp_streams_end_solo) and takes again.
 * The end holds the park's fence lock (no solo free of S), then ours:
 * every free solo chunk is fenced for S (fbits, back in rbusy; its busy
 * count as it is) with the tag of S's open fence batch, every other
 * chunk still carrying MP_TAG_SOLO (taken back since) gets that tag, and
 * the batch notes one range that holds them all.  From there they are
 * fenced runs as any.  A drop (S has passed everything) sets the free
 * ones to busy 0 instead.
 * Free solo chunks count as cached in the statistics, as fenced ones in
 * an open batch do: not free to others yet.
 * Invariants (mp_runs_check, quiescent): a chunk with MP_TAG_SOLO has
 * owner `solo` and lies in [solo_lo, solo_hi); with `solo` 0 none has;
 * sbits: free chunks with MP_TAG_SOLO, busy a whole chunk's units, not
 * in fbits; nsolo == |sbits|. */
#ifndef MAGPOOL_RUNS_H
#define MAGPOOL_RUNS_H

#include "internal.h"

/* Other streams' fenced chunks a take may use too (cross_stream_reuse:
 * alloc_async.c, stream_cache.c): owner[i]'s chunks whose tag is at most
 * tag[i] (wrapping), read before owner[i]'s open fence batch was retired
 * and before the taking stream was made to wait for owner[i]'s stream. */
#define MP_ADOPT_MAX 8
typedef struct mp_adopt {
  uint32_t n, tag[MP_ADOPT_MAX];
  uint64_t owner[MP_ADOPT_MAX];
} mp_adopt;

/* Is p a run, a block in the run space (the upper half of the chunked
 * pool's addresses)? */
static inline bool mp_is_run(const magpool_t *pool, const void *p) {
  const mp_chunks *c = pool->chunks;
  return c != NULL && (size_t)((const char *)p - c->base) >= c->va_bytes / 2;
}

/* Busy chunks, both halves (C3): a hint (relaxed), exact when quiescent. */
static inline uint64_t mp_chunks_nbusy(const mp_chunks *c) {
  return mp_load_relaxed(&c->nbusy) + mp_load_relaxed(&c->runs.rbusy);
}

int mp_runs_init(magpool_t *pool, uint32_t n);
void mp_runs_fini(magpool_t *pool);
/* The tag of solo runs (runs.h): never a batch's. */
#define MP_TAG_SOLO UINT32_MAX

/* A free run of m chunks (placement: runs.c) that may use the chunks
 * fenced by `owner` (0: none) and those `ad` names (NULL: none), or -1;
 * -2: refused, a solo is there (another owner's, or the owner's and the
 * run would map chunks: runs.h).  *held: every chunk of it was a free
 * solo chunk, busy all along (mp_chunks_acquire_held, not
 * mp_chunks_acquire, counts the take). */
int64_t mp_runs_alloc(magpool_t *pool, uint32_t m, uint64_t owner, const mp_adopt *ad,
                      bool *held);
/* mp_chunks_acquire (chunk.c) for a run whose chunks were busy all along
 * (a window of free solo chunks): notes the run's extent and raises the
 * high-water mark, as that would; MP_EGROW where it would refuse that. */
int mp_chunks_acquire_held(magpool_t *pool, char *p, unsigned order, size_t need, int grow);
/* Back to the free runs: [s, s + m) of a block given back (busy 0
 * already; stale tags are cleared). */
void mp_runs_free(magpool_t *pool, uint32_t s, uint32_t m);
/* Back to the free runs after a failed mp_chunks_acquire of a window
 * mp_runs_alloc gave: chunks with a batch's tag are fenced again, a
 * solo's go to sbits (busy kept), the others to busy 0; all but the
 * fenced ones out of rbusy. */
void mp_runs_putback(magpool_t *pool, uint32_t s, uint32_t m);
/* A solo run's give (runs.h): makes `owner` the solo, tags [s, s + m),
 * takes its chunks out of rbusy (their busy counts stay) and puts it
 * back among the free runs, in sbits.  false (nothing done): another
 * owner's solo is there. */
bool mp_runs_solo_give(magpool_t *pool, uint32_t s, uint32_t m, uint64_t owner);
/* The owner of the solo runs, 0 if none (relaxed: a hint). */
uint64_t mp_runs_solo(magpool_t *pool);
/* Bytes in free solo chunks (statistics: cached).  Relaxed. */
uint64_t mp_runs_solo_bytes(const magpool_t *pool);
/* Ends `owner`'s solo (runs.h): its free chunks fenced with `tag`, the
 * others carrying MP_TAG_SOLO retagged; range[0..1] holds them all.
 * false (nothing done): owner has none.  The caller holds the park's
 * fence lock. */
bool mp_runs_solo_end(magpool_t *pool, uint64_t owner, uint32_t tag, uint32_t *range);
/* Drops `owner`'s solo once its stream has passed everything: the free
 * chunks stay free (busy 0 now), the tags go.  false: owner has none. */
bool mp_runs_solo_drop(magpool_t *pool, uint64_t owner);
/* The chunk map's lock (chunk.c): held around mp_chunks_unmap_highest. */
void mp_chunks_lock(magpool_t *pool);
void mp_chunks_unlock(magpool_t *pool);
/* A fresh batch tag (never 0 or MP_TAG_SOLO); the newest one given (mp_adopt). */
uint32_t mp_runs_tag(magpool_t *pool);
uint32_t mp_runs_tag_now(magpool_t *pool);
/* Back to the free runs, fenced by (tag, owner): [s, s + m) of a run
 * freed on owner's stream, busy counts kept; `retired`: its batch is
 * behind the stream already (else mp_runs_retire says so later).  true
 * if every chunk of it carried `tag` already: a run of that batch, taken
 * back by its stream and freed again, which the batch has noted. */
bool mp_runs_fence(magpool_t *pool, uint32_t s, uint32_t m, uint32_t tag, uint64_t owner,
                   bool retired);
/* The batch `tag` (n ranges in fr) goes behind its stream: its fenced
 * chunks count as pending from now on, no longer as cached. */
void mp_runs_retire(magpool_t *pool, const uint32_t *fr, uint32_t n, uint32_t tag);
/* The batch `tag` has passed: unfences the chunks of its n ranges
 * (start, length pairs in fr) that still carry it. */
void mp_runs_unfence(magpool_t *pool, const uint32_t *fr, uint32_t n, uint32_t tag);
/* Bytes in fenced free runs, all of them or (`retired`) those whose batch
 * is behind its stream (statistics: those are pending, the others
 * cached, as parked blocks are).  Relaxed. */
uint64_t mp_runs_fenced_bytes(const magpool_t *pool, bool retired);
/* The run invariants on a quiescent pool: 0 or MAGPOOL_EINVAL. */
int mp_runs_check(magpool_t *pool);

#endif /* MAGPOOL_RUNS_H */
