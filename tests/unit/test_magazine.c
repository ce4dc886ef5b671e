/* test_magazine.c - unit tests of the per-thread magazines, the depots and
 * the lock-free stack under them (src/magazine.c), through src/internal.h.
 *
 *   stack     mp_stack: LIFO order, the version tag in the head, and a
 *             4-thread pop/push torture with ownership marks
 *   give      mp_blocks_give: a batch of buddies merges into its parent
 *   refill    carving on a refill miss and the per-thread hoarding bound
 *   exit      a thread's cache goes back to the tree when it exits
 *   depot     full magazines past loaded + previous go to the depot
 *   share     many live threads split the caches' budgets (mp_cache_share)
 *
 * Each Criterion test runs in its own process, so the thread-local memo
 * (mp_tls_last) starts empty in every test.
 */
#define _POSIX_C_SOURCE 200809L /* pthread_barrier_t */

#include "thread.h" /* internal.h and the thread record */

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* ------------------------------------------------------------------ */
/* helpers                                                            */
/* ------------------------------------------------------------------ */

static uint64_t cached_of(const mp_tcache *tc) {
  return mp_load_relaxed(&tc->st.cached);
}

static int64_t depot_total(magpool_t *pool) {
  int64_t d = 0;
  for (unsigned k = 0; k < MP_MAX_CLASSES; k++)
    d += mp_load_relaxed(&pool->depot[k].bytes);
  return d;
}

static unsigned order_of(magpool_t *pool, size_t size) {
  unsigned o = 0;
  cr_assert_eq(mp_size_order(pool, size, &o), 0);
  return o;
}

/* mpt_assert_one_block, and the tree of the (one) region agrees: its
 * root is free and is the largest free block. */
static void assert_one_block(magpool_t *pool) {
  mpt_assert_one_block(pool);
  mp_tree *t = &pool->regions[0]->tree;
  cr_assert_eq(mp_tree_largest_free_order(t), (int)t->top);
  cr_assert(mp_tree_is_free(t, 0, t->top));
}

/* ------------------------------------------------------------------ */
/* mp_stack                                                           */
/* ------------------------------------------------------------------ */

#define NSTACK_MAGS 12

Test(stack, lifo_single_thread) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB, .thread_cache = 1 * MiB});
  mp_stack s;
  memset(&s, 0, sizeof s);
  cr_assert(((uintptr_t)&s & (MP_CACHELINE - 1)) == 0);
  cr_assert_null(mp_stack_pop_mpmc(pool, &s), "pop of an empty stack");

  mp_mag *m[NSTACK_MAGS];
  for (int i = 0; i < NSTACK_MAGS; i++) {
    m[i] = mp_mag_new(pool, 0);
    cr_assert_not_null(m[i]);
    cr_assert(((uintptr_t)m[i] & 63) == 0, "magazine %p not 64-byte aligned",
              (void *)m[i]);
    for (int j = 0; j < i; j++) cr_assert_neq(m[i], m[j]);
  }
  for (int i = 0; i < NSTACK_MAGS; i++) mp_stack_push_mpmc(pool, &s, m[i]);
  for (int i = NSTACK_MAGS - 1; i >= 0; i--) {
    mp_mag *x = mp_stack_pop_mpmc(pool, &s);
    cr_assert_eq(x, m[i], "pop %d: got %p, expected %p (LIFO)", i, (void *)x,
                 (void *)m[i]);
  }
  cr_assert_null(mp_stack_pop_mpmc(pool, &s));

  /* Interleaved: push 0, 1; pop -> 1; push 2; pop -> 2, 0. */
  mp_stack_push_mpmc(pool, &s, m[0]);
  mp_stack_push_mpmc(pool, &s, m[1]);
  cr_assert_eq(mp_stack_pop_mpmc(pool, &s), m[1]);
  mp_stack_push_mpmc(pool, &s, m[2]);
  cr_assert_eq(mp_stack_pop_mpmc(pool, &s), m[2]);
  cr_assert_eq(mp_stack_pop_mpmc(pool, &s), m[0]);
  cr_assert_null(mp_stack_pop_mpmc(pool, &s));

  /* The version tag: the same magazine pushed again after a pop gives a
   * different head word (this is what rejects an ABA'd CAS). */
  mp_stack_push_mpmc(pool, &s, m[3]);
  uint64_t h1 = mp_load_relaxed(&s.head);
  cr_assert_eq(mp_stack_pop_mpmc(pool, &s), m[3]);
  uint64_t h_empty = mp_load_relaxed(&s.head);
  mp_stack_push_mpmc(pool, &s, m[3]);
  uint64_t h2 = mp_load_relaxed(&s.head);
  cr_assert_neq(h1, h2, "same head word %#llx after pop + push of the same "
                "magazine: no ABA version", (unsigned long long)h1);
  cr_assert_neq(h_empty, 0, "empty head after a pop carries no version");
  cr_assert_eq(mp_stack_pop_mpmc(pool, &s), m[3]);
  cr_assert_null(mp_stack_pop_mpmc(pool, &s));

  for (int i = 0; i < NSTACK_MAGS; i++) mp_mag_free(pool, m[i]);
  cr_assert_eq(magpool_destroy(pool), 0);
}

#define TORTURE_THREADS 4
#define TORTURE_ITERS 1000000

typedef struct torture {
  magpool_t *pool;
  mp_stack *s;
  mp_mag **mags;
  _Atomic int owner[NSTACK_MAGS]; /* 0 free, else thread id + 1 */
  pthread_barrier_t start;
  _Atomic long double_pops;      /* a magazine popped while owned */
  _Atomic long bad_ptr;          /* a pop returned a foreign pointer */
  _Atomic long corrupted;        /* its payload changed while owned */
  _Atomic long pops;
} torture;

typedef struct torture_arg {
  torture *t;
  int id;
} torture_arg;

static int mag_index(torture *t, mp_mag *m) {
  /* m->order carries the index (set by the test); check it against the
   * table so a garbage pointer is caught, not dereferenced further. */
  for (int i = 0; i < NSTACK_MAGS; i++)
    if (t->mags[i] == m) return i;
  return -1;
}

/* Claims m for thread `id`; returns its index or -1. */
static int torture_claim(torture *t, mp_mag *m, int id) {
  int i = mag_index(t, m);
  if (i < 0) {
    atomic_fetch_add(&t->bad_ptr, 1);
    return -1;
  }
  int prev = atomic_exchange(&t->owner[i], id + 1);
  if (prev != 0) atomic_fetch_add(&t->double_pops, 1);
  /* Payload: write our id, read it back after a pause. */
  m->count = (uint32_t)id;
  return i;
}

static void torture_release(torture *t, mp_mag *m, int i, int id) {
  if (m->count != (uint32_t)id || m->order != (uint32_t)i)
    atomic_fetch_add(&t->corrupted, 1);
  /* Ownership ends before the push: another thread may pop it at once. */
  int prev = atomic_exchange(&t->owner[i], 0);
  if (prev != id + 1) atomic_fetch_add(&t->double_pops, 1);
  mp_stack_push_mpmc(t->pool, t->s, m);
}

static void *torture_worker(void *vp) {
  torture_arg *a = vp;
  torture *t = a->t;
  int id = a->id;
  mpt_rng r = mpt_rng_seed(1000 + (uint64_t)id);
  pthread_barrier_wait(&t->start);
  for (long it = 0; it < TORTURE_ITERS; it++) {
    mp_mag *x = mp_stack_pop_mpmc(t->pool, t->s);
    if (x == NULL) {
      sched_yield();
      continue;
    }
    atomic_fetch_add_explicit(&t->pops, 1, memory_order_relaxed);
    int ix = torture_claim(t, x, id);
    if (ix < 0) return NULL; /* reported; do not push garbage */
    /* Half the time hold a second one: pop A, pop B, push A, push B is the
     * pattern that makes a stale CAS see its old head again (ABA). */
    mp_mag *y = NULL;
    int iy = -1;
    if (mpt_below(&r, 2)) {
      y = mp_stack_pop_mpmc(t->pool, t->s);
      if (y != NULL) {
        atomic_fetch_add_explicit(&t->pops, 1, memory_order_relaxed);
        iy = torture_claim(t, y, id);
        if (iy < 0) return NULL;
      }
    }
    if (mpt_below(&r, 64) == 0) sched_yield();
    if (y != NULL && mpt_below(&r, 2)) {
      torture_release(t, y, iy, id);
      torture_release(t, x, ix, id);
    } else {
      torture_release(t, x, ix, id);
      if (y != NULL) torture_release(t, y, iy, id);
    }
  }
  return NULL;
}

Test(stack, four_thread_torture, .timeout = 300) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB, .thread_cache = 1 * MiB});
  mp_stack *s = aligned_alloc(MP_CACHELINE, sizeof *s);
  cr_assert_not_null(s);
  memset(s, 0, sizeof *s);
  mp_mag *mags[NSTACK_MAGS];
  torture *t = calloc(1, sizeof *t);
  cr_assert_not_null(t);
  t->pool = pool;
  t->s = s;
  t->mags = mags;
  for (int i = 0; i < NSTACK_MAGS; i++) {
    mags[i] = mp_mag_new(pool, 0);
    cr_assert_not_null(mags[i]);
    mags[i]->order = (uint32_t)i; /* the index, checked on every release */
    mp_stack_push_mpmc(pool, s, mags[i]);
  }
  cr_assert_eq(pthread_barrier_init(&t->start, NULL, TORTURE_THREADS), 0);
  pthread_t th[TORTURE_THREADS];
  torture_arg args[TORTURE_THREADS];
  for (int i = 0; i < TORTURE_THREADS; i++) {
    args[i].t = t;
    args[i].id = i;
    cr_assert_eq(pthread_create(&th[i], NULL, torture_worker, &args[i]), 0);
  }
  for (int i = 0; i < TORTURE_THREADS; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&t->start);

  cr_assert_eq(atomic_load(&t->bad_ptr), 0, "%ld pops returned a pointer "
               "that is no magazine of the set", atomic_load(&t->bad_ptr));
  cr_assert_eq(atomic_load(&t->double_pops), 0,
               "%ld times a magazine was popped while another thread owned it",
               atomic_load(&t->double_pops));
  cr_assert_eq(atomic_load(&t->corrupted), 0,
               "%ld owned magazines changed under their owner",
               atomic_load(&t->corrupted));
  cr_assert_gt(atomic_load(&t->pops), TORTURE_ITERS,
               "only %ld pops: the torture did not run",
               atomic_load(&t->pops));

  /* Every magazine is in the stack exactly once, and nothing else is. */
  int seen[NSTACK_MAGS] = {0};
  int n = 0;
  mp_mag *m;
  while ((m = mp_stack_pop_mpmc(pool, s)) != NULL) {
    int i = mag_index(t, m);
    cr_assert_geq(i, 0, "stack holds a foreign pointer %p", (void *)m);
    cr_assert_eq(seen[i], 0, "magazine %d is in the stack twice", i);
    seen[i] = 1;
    cr_assert_lt(++n, 2 * NSTACK_MAGS, "the stack has a cycle");
  }
  cr_assert_eq(n, NSTACK_MAGS, "%d magazines in the stack, expected %d", n,
               NSTACK_MAGS);
  for (int i = 0; i < NSTACK_MAGS; i++) {
    cr_assert_eq(atomic_load(&t->owner[i]), 0);
    mp_mag_free(pool, mags[i]);
  }
  free(t);
  free(s);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* ------------------------------------------------------------------ */
/* mp_blocks_give                                                     */
/* ------------------------------------------------------------------ */

/* 1 MiB pool, 64 B units (top 14), caching off: every block below goes
 * straight between the test and the tree. */
Test(give, buddies_merge_into_parent) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB, .thread_cache = MPT_ZERO});
  mp_tcache *tc = mp_tcache_get(pool);
  cr_assert_not_null(tc);
  cr_assert_eq(tc->nclasses, 0, "caching should be off");
  mp_region *r = pool->regions[0];
  mp_tree *t = &r->tree;
  cr_assert_eq(t->top, 14);
  const unsigned o = 2; /* 256-byte blocks */
  const size_t bs = mp_block_bytes(pool, o);

  /* 16 blocks from a fresh tree: lowest address first, so blocks 0..15. */
  void *b[16];
  for (unsigned i = 0; i < 16; i++) {
    b[i] = mp_region_take(pool, &tc->acct, o, 0);
    cr_assert_not_null(b[i]);
    cr_assert_eq((char *)b[i], r->base + i * bs, "take %u at offset %td", i,
                 (char *)b[i] - r->base);
  }
  uint64_t fu = 0;
  cr_assert_eq(mp_tree_check(t, &fu), 0);
  cr_assert_eq(fu, t->nunits - (16u << o));

  mpt_rng rng = mpt_rng_seed(42);

  /* Blocks 0..7, shuffled: one block of order o+3 at offset 0, which
   * cannot merge further (its buddy, blocks 8..15, is still taken). */
  void *batch[8];
  memcpy(batch, b, sizeof batch);
  mpt_shuffle(&rng, batch, 8, sizeof batch[0]);
  mp_blocks_give(pool, &tc->acct, batch, 8, o);
  cr_assert(mp_tree_is_free(t, 0, o + 3), "blocks 0..7 did not merge into "
            "their order-%u parent", o + 3);
  for (unsigned i = 0; i < 8; i++)
    cr_assert(!mp_tree_is_free(t, (uint64_t)i << o, o),
              "child %u still free on its own after the merge", i);
  cr_assert(!mp_tree_is_free(t, 0, o + 4), "merged past a taken buddy");
  cr_assert_eq(mp_tree_check(t, &fu), 0);
  cr_assert_eq(fu, t->nunits - (8u << o));

  /* A batch with a hole: 8, 9, 10, 11, 13, 14, 15 (not 12).  Expect 8..11
   * as one order o+2 block, 13 alone, 14..15 as one order o+1 block. */
  void *holey[7] = {b[8], b[9], b[10], b[11], b[13], b[14], b[15]};
  mpt_shuffle(&rng, holey, 7, sizeof holey[0]);
  mp_blocks_give(pool, &tc->acct, holey, 7, o);
  cr_assert(mp_tree_is_free(t, 8u << o, o + 2), "8..11 not merged");
  cr_assert(mp_tree_is_free(t, 13u << o, o), "13 not free");
  cr_assert(mp_tree_is_free(t, 14u << o, o + 1), "14..15 not merged");
  cr_assert(!mp_tree_is_free(t, 12u << o, o), "12 is still taken");
  cr_assert(!mp_tree_is_free(t, 12u << o, o + 1));
  cr_assert(!mp_tree_is_free(t, 8u << o, o + 3));
  cr_assert_eq(mp_tree_check(t, &fu), 0);
  cr_assert_eq(fu, t->nunits - (1u << o));

  /* The last one completes every merge, up to the whole tree (the fresh
   * tree's splits left the buddies of orders o+4 .. top free). */
  void *last[1] = {b[12]};
  mp_blocks_give(pool, &tc->acct, last, 1, o);
  cr_assert(mp_tree_is_free(t, 0, t->top), "tree not one block again");
  cr_assert_eq(mp_tree_largest_free_order(t), (int)t->top);
  cr_assert_eq(mp_tree_check(t, &fu), 0);
  cr_assert_eq(fu, t->nunits);

  /* A full batch of 64 blocks of one order, shuffled: one block of order
   * o+6 and then, again, the whole tree. */
  void *many[64];
  for (unsigned i = 0; i < 64; i++) {
    many[i] = mp_region_take(pool, &tc->acct, o, 0);
    cr_assert_eq((char *)many[i], r->base + i * bs);
  }
  mpt_shuffle(&rng, many, 64, sizeof many[0]);
  mp_blocks_give(pool, &tc->acct, many, 64, o);
  cr_assert(mp_tree_is_free(t, 0, t->top));
  cr_assert_eq(mp_tree_check(t, &fu), 0);
  cr_assert_eq(fu, t->nunits);

  mp_acct_flush(pool, &tc->acct);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.used_bytes, 0);
  cr_assert_eq(s.largest_free_block, 1 * MiB);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* Blocks that are adjacent without being buddies must not merge. */
Test(give, adjacent_non_buddies_stay_apart) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB, .thread_cache = MPT_ZERO});
  mp_tcache *tc = mp_tcache_get(pool);
  mp_region *r = pool->regions[0];
  mp_tree *t = &r->tree;
  const unsigned o = 3;
  const size_t bs = mp_block_bytes(pool, o);
  void *b[4];
  for (unsigned i = 0; i < 4; i++) {
    b[i] = mp_region_take(pool, &tc->acct, o, 0);
    cr_assert_eq((char *)b[i], r->base + i * bs);
  }
  /* 1 and 2 are adjacent but not buddies (1's buddy is 0, 2's is 3). */
  void *mid[2] = {b[2], b[1]};
  mp_blocks_give(pool, &tc->acct, mid, 2, o);
  cr_assert(mp_tree_is_free(t, 1u << o, o));
  cr_assert(mp_tree_is_free(t, 2u << o, o));
  cr_assert(!mp_tree_is_free(t, 0, o + 1));
  cr_assert(!mp_tree_is_free(t, 2u << o, o + 1));
  uint64_t fu;
  cr_assert_eq(mp_tree_check(t, &fu), 0);
  cr_assert_eq(fu, t->nunits - (2u << o));
  void *ends[2] = {b[3], b[0]};
  mp_blocks_give(pool, &tc->acct, ends, 2, o);
  cr_assert(mp_tree_is_free(t, 0, t->top));
  cr_assert_eq(mp_tree_check(t, &fu), 0);
  cr_assert_eq(fu, t->nunits);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* ------------------------------------------------------------------ */
/* refill carving and the hoarding bound                              */
/* ------------------------------------------------------------------ */

/* The expected carve of a refill miss (design.md, "Refill"): the class's
 * magazine capacity, halved while n - 1 blocks do not fit in what the
 * thread may still cache. */
static uint32_t expected_carve(magpool_t *pool, const mp_tcache *tc,
                               unsigned order) {
  size_t bs = mp_block_bytes(pool, order);
  size_t c = cached_of(tc);
  size_t room = c < tc->limit ? tc->limit - c : 0;
  uint32_t n = pool->mag_cap[order];
  while (n > 1 && (size_t)(n - 1) * bs > room) n /= 2;
  if (pool->chunks != NULL) /* and at most chunk >> MP_CARVE_CHUNK_SHIFT */
    while (n > 1 && (size_t)n * bs > pool->chunks->chunk >> MP_CARVE_CHUNK_SHIFT) n /= 2;
  return n;
}

/* Is the next allocation of this class a refill miss?  (Nothing in the
 * loaded or previous magazine, nothing in the class's depot.) */
static bool is_refill_miss(magpool_t *pool, const mp_tcache *tc,
                           unsigned order) {
  if (order >= tc->nclasses) return false;
  const mp_tclass *c = &tc->cls[order];
  if (c->loaded != NULL && c->loaded->count != 0) return false;
  if (c->prev != NULL && c->prev->count != 0) return false;
  return mp_load_relaxed(&pool->depot[order].bytes) == 0;
}

/* After a refill that handed out p: the carved block is p and its n - 1
 * successors, aligned to n blocks within the region, all of them now in
 * the loaded magazine. */
static void assert_carved(magpool_t *pool, const mp_tcache *tc,
                          unsigned order, const char *p, uint32_t n) {
  size_t bs = mp_block_bytes(pool, order);
  mp_region *r = mp_region_of(pool, p);
  cr_assert_not_null(r);
  size_t off = (size_t)(p - r->base);
  cr_assert_eq(off % ((size_t)n * bs), 0,
               "carve of %u x %zu B at offset %zu is not aligned", n, bs, off);
  if (n == 1) return;
  const mp_mag *m = tc->cls[order].loaded;
  cr_assert_not_null(m);
  cr_assert_eq(m->count, n - 1);
  uint64_t seen = 0;
  for (uint32_t i = 0; i < m->count; i++) {
    const char *q = m->slot[i];
    cr_assert(q > p && q < p + (size_t)n * bs && (size_t)(q - p) % bs == 0,
              "slot %u (%p) is not a block of the carve at %p", i,
              (const void *)q, (const void *)p);
    unsigned j = (unsigned)((size_t)(q - p) / bs);
    cr_assert(!(seen & ((uint64_t)1 << j)), "block %u cached twice", j);
    seen |= (uint64_t)1 << j;
  }
}

/* One allocation with the refill checks when it is a refill miss. */
static void *alloc_checked(magpool_t *pool, mp_tcache *tc, size_t size,
                           uint32_t *carved) {
  unsigned o = order_of(pool, size);
  bool miss = is_refill_miss(pool, tc, o);
  uint32_t want = miss ? expected_carve(pool, tc, o) : 0;
  uint64_t before = cached_of(tc);
  void *p = magpool_alloc(pool, size);
  cr_assert_not_null(p, "alloc(%zu) failed: %d", size, magpool_last_error());
  uint64_t after = cached_of(tc);
  cr_assert_leq(after, tc->limit, "cached %llu > limit %zu after alloc(%zu)",
                (unsigned long long)after, tc->limit, size);
  if (miss) {
    size_t bs = mp_block_bytes(pool, o);
    cr_assert_eq(after - before, (uint64_t)(want - 1) * bs,
                 "refill of %zu-byte class: cached grew by %llu, expected "
                 "(%u - 1) x %zu", bs, (unsigned long long)(after - before),
                 want, bs);
    assert_carved(pool, tc, o, p, want);
    if (carved) *carved = want;
  }
  return p;
}

static void free_checked(magpool_t *pool, mp_tcache *tc, void *p) {
  cr_assert_eq(magpool_free(pool, p), 0);
  uint64_t c = cached_of(tc);
  cr_assert_leq(c, tc->limit, "cached %llu > limit %zu after a free",
                (unsigned long long)c, tc->limit);
}

/* Exact carves with tcb = 1 MiB (classes 64 B .. 512 KiB; magazine caps
 * min(64, 256 KiB / block)), as the cache fills up. */
Test(refill, carve_shrinks_with_room) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 64 * MiB, .thread_cache = 1 * MiB});
  mp_tcache *tc = mp_tcache_get(pool);
  cr_assert_not_null(tc);
  cr_assert_eq(tc->limit, 1 * MiB);
  cr_assert_eq(tc->nclasses, 14, "classes 64 B .. 512 KiB");
  uint32_t n = 0;

  /* 1 KiB from an empty cache: 64 blocks carved from one 64 KiB block. */
  void *k1 = alloc_checked(pool, tc, 1 * KiB, &n);
  cr_assert_eq(n, 64);
  cr_assert_eq(cached_of(tc), 63 * KiB);
  /* The next 63 are exactly the carved ones, all hits, no refill. */
  void *rest[63];
  for (int i = 0; i < 63; i++) {
    rest[i] = magpool_alloc(pool, 1 * KiB);
    cr_assert_gt((char *)rest[i], (char *)k1);
    cr_assert_lt((char *)rest[i], (char *)k1 + 64 * KiB);
  }
  cr_assert_eq(cached_of(tc), 0);
  for (int i = 0; i < 63; i++) free_checked(pool, tc, rest[i]);
  free_checked(pool, tc, k1);
  cr_assert_eq(cached_of(tc), 64 * KiB);
  cr_assert_eq(magpool_trim(pool), 0); /* empty cache again */
  cr_assert_eq(cached_of(tc), 0);

  /* Fill: one 512 KiB block cached (cap 1), one 256 KiB (cap 1). */
  void *a = alloc_checked(pool, tc, 512 * KiB, &n);
  cr_assert_eq(n, 1);
  free_checked(pool, tc, a);
  void *b = alloc_checked(pool, tc, 256 * KiB, &n);
  cr_assert_eq(n, 1);
  free_checked(pool, tc, b);
  cr_assert_eq(cached_of(tc), 768 * KiB);
  /* 128 KiB (cap 2), room 256 KiB: 2 would fit the room, but a refill
   * of a chunked pool carves at most a sixteenth of a chunk (128 KiB of
   * 2 MiB): 1.  Freed, it stays cached. */
  cr_assert_not_null(pool->chunks);
  cr_assert_eq(pool->chunks->chunk >> MP_CARVE_CHUNK_SHIFT, 128 * KiB);
  void *c = alloc_checked(pool, tc, 128 * KiB, &n);
  cr_assert_eq(n, 1);
  free_checked(pool, tc, c);
  cr_assert_eq(cached_of(tc), 896 * KiB);
  /* 16 KiB (cap 16), room 128 KiB: 15 x 16 KiB does not fit, 7 does. */
  void *d = alloc_checked(pool, tc, 16 * KiB, &n);
  cr_assert_eq(n, 8);
  cr_assert_eq(cached_of(tc), 1008 * KiB);
  /* 4 KiB (cap 64), room 16 KiB: carve 4. */
  void *e = alloc_checked(pool, tc, 4 * KiB, &n);
  cr_assert_eq(n, 4);
  cr_assert_eq(cached_of(tc), 1020 * KiB);
  /* 64 B (cap 64), room 4 KiB: 63 x 64 = 4032 fits, carve 64. */
  void *f = alloc_checked(pool, tc, 64, &n);
  cr_assert_eq(n, 64);
  cr_assert_eq(cached_of(tc), 1020 * KiB + 4032);
  /* 128 B, room 64 B: no carve at all. */
  void *g = alloc_checked(pool, tc, 128, &n);
  cr_assert_eq(n, 1);
  cr_assert_eq(cached_of(tc), 1020 * KiB + 4032);

  /* Frees into a full cache: each one stays within the limit. */
  void *live[] = {d, e, f, g};
  for (size_t i = 0; i < sizeof live / sizeof live[0]; i++)
    free_checked(pool, tc, live[i]);
  assert_one_block(pool);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* Random mixed classes (64 B .. 2 MiB, so also uncached sizes): the bound
 * after every call, and the refill rule at every refill miss. */
Test(refill, mixed_classes_bound, .timeout = 300) {
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 256 * MiB, .thread_cache = 1 * MiB});
  mp_tcache *tc = mp_tcache_get(pool);
  cr_assert_not_null(tc);
  mp_tree *t = &pool->regions[0]->tree;
  enum { LIVE = 64, STEPS = 60000 };
  void *live[LIVE];
  int nlive = 0;
  mpt_rng rng = mpt_rng_seed(7);
  long refills = 0, exact = 0;
  uint64_t max_cached = 0;
  for (long step = 0; step < STEPS; step++) {
    bool do_free = nlive == LIVE || (nlive > 0 && mpt_below(&rng, 2));
    if (do_free) {
      int i = (int)mpt_below(&rng, (uint64_t)nlive);
      free_checked(pool, tc, live[i]);
      live[i] = live[--nlive];
    } else {
      unsigned o = (unsigned)mpt_below(&rng, 16); /* 64 B .. 2 MiB */
      size_t size = (size_t)mpt_range(&rng, 1, (uint64_t)64 << o);
      unsigned order = order_of(pool, size);
      bool miss = is_refill_miss(pool, tc, order);
      uint32_t want = miss ? expected_carve(pool, tc, order) : 0;
      /* The exact carve is only promised when the tree has a block of
       * that size; the test is single-threaded, so it knows. */
      bool tree_has = miss && mp_tree_largest_free_order(t) >=
                                  (int)(order + mpt_floor_log2(want));
      uint64_t before = cached_of(tc);
      void *p = magpool_alloc(pool, size);
      cr_assert_not_null(p, "step %ld: alloc(%zu) failed", step, size);
      uint64_t after = cached_of(tc);
      cr_assert_leq(after, tc->limit, "step %ld: cached %llu > limit", step,
                    (unsigned long long)after);
      if (miss) {
        size_t bs = mp_block_bytes(pool, order);
        refills++;
        const mp_mag *m = tc->cls[order].loaded;
        uint32_t got = (m != NULL ? m->count : 0) + 1;
        cr_assert(mpt_is_pow2(got), "step %ld: carved %u blocks", step, got);
        cr_assert_eq(after - before, (uint64_t)(got - 1) * bs,
                     "step %ld: cached grew by %llu after carving %u x %zu",
                     step, (unsigned long long)(after - before), got, bs);
        cr_assert_leq(got, want);
        if (tree_has) {
          cr_assert_eq(got, want, "step %ld: carved %u, expected %u (class "
                       "%zu B)", step, got, want, bs);
          exact++;
        }
        assert_carved(pool, tc, order, p, got);
      }
      if (after > max_cached) max_cached = after;
      live[nlive++] = p;
    }
  }
  cr_log_info("refill: %ld refill misses, %ld checked exactly, max cached "
              "%llu", refills, exact, (unsigned long long)max_cached);
  cr_assert_geq(exact, 1000, "only %ld exact refill checks", exact);
  cr_assert_gt(max_cached, tc->limit / 2, "the cache never filled: the "
               "bound was not exercised");
  while (nlive > 0) free_checked(pool, tc, live[--nlive]);
  assert_one_block(pool);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* ------------------------------------------------------------------ */
/* thread exit                                                        */
/* ------------------------------------------------------------------ */

typedef struct exit_arg {
  magpool_t *pool;
  mp_tcache *tc;
  uint64_t cached_before_exit;
  int64_t depot_before_exit;
  int failed;
} exit_arg;

static void *exit_worker(void *vp) {
  exit_arg *a = vp;
  a->tc = mp_tcache_get(a->pool);
  enum { N = 600 };
  static const size_t sizes[] = {64, 1024, 4096, 65536};
  void *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = magpool_alloc(a->pool, sizes[i % 4]);
    if (p[i] == NULL) a->failed = 1;
  }
  for (int i = 0; i < N; i++)
    if (p[i] && magpool_free(a->pool, p[i]) != 0) a->failed = 1;
  a->cached_before_exit = mp_load_relaxed(&a->tc->st.cached);
  a->depot_before_exit = depot_total(a->pool);
  return NULL;
}

Test(exit, cache_returns_to_tree) {
  /* tcb 4 MiB: class caps min(64, 1 MiB / block); 150 frees of one class
   * overflow loaded + previous, so the depots get magazines too. */
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 64 * MiB, .thread_cache = 4 * MiB});
  exit_arg a = {.pool = pool};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, exit_worker, &a), 0);
  cr_assert_eq(pthread_join(th, NULL), 0);
  cr_assert_eq(a.failed, 0);
  cr_assert_not_null(a.tc);
  cr_assert_gt(a.cached_before_exit, 0, "the thread cached nothing");
  cr_assert_leq(a.cached_before_exit, 4 * MiB);
  cr_assert_gt(a.depot_before_exit, 0, "nothing reached a depot");

  /* The record outlives its thread (it is reused by later threads). */
  cr_assert_eq(mp_load_acquire(&a.tc->state), MP_TC_FREE);
  cr_assert_eq(mp_load_relaxed(&a.tc->st.cached), 0,
               "record still counts %llu cached bytes after its thread "
               "exited", (unsigned long long)mp_load_relaxed(&a.tc->st.cached));
  for (unsigned k = 0; k < MP_MAX_CLASSES; k++) {
    cr_assert_null(a.tc->cls[k].loaded);
    cr_assert_null(a.tc->cls[k].prev);
  }
  /* The main thread has no record and there are no streams: the stats'
   * cached bytes are the depots alone (exit does not drain depots). */
  magpool_stats_t s = mpt_stats(pool);
  int64_t dep = depot_total(pool);
  cr_assert_eq((int64_t)s.cached_bytes, dep, "cached %zu != depots %lld",
               s.cached_bytes, (long long)dep);
  cr_assert_eq(dep, a.depot_before_exit);
  cr_assert_eq(s.used_bytes, 0);
  cr_assert_eq(magpool_check(pool), 0);
  assert_one_block(pool);
  /* The trim made the main thread's record: it adopted the freed one. */
  cr_assert_eq(mp_tcache_get(pool), a.tc,
               "the exited thread's record was not reused");

  /* Another thread: a new record, and again nothing cached after exit. */
  exit_arg b = {.pool = pool};
  cr_assert_eq(pthread_create(&th, NULL, exit_worker, &b), 0);
  cr_assert_eq(pthread_join(th, NULL), 0);
  cr_assert_eq(b.failed, 0);
  cr_assert_neq(b.tc, a.tc);
  cr_assert_gt(b.cached_before_exit, 0);
  cr_assert_eq(mp_load_acquire(&b.tc->state), MP_TC_FREE);
  cr_assert_eq(mp_load_relaxed(&b.tc->st.cached), 0);
  s = mpt_stats(pool);
  cr_assert_eq((int64_t)s.cached_bytes,
               depot_total(pool) + (int64_t)mp_load_relaxed(&a.tc->st.cached));
  assert_one_block(pool);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* ------------------------------------------------------------------ */
/* depot                                                              */
/* ------------------------------------------------------------------ */

/* Pops every magazine of a depot, checks it, and pushes them back in the
 * same order.  Returns how many there were. */
static unsigned depot_inspect(magpool_t *pool, unsigned order) {
  mp_mag *m[256];
  unsigned n = 0;
  int64_t bytes = 0;
  while ((m[n] = mp_stack_pop_mpmc(pool, &pool->depot[order])) != NULL) {
    cr_assert_eq(m[n]->order, order);
    cr_assert_eq(m[n]->count, m[n]->cap, "depot magazine not full (%u/%u)",
                 m[n]->count, m[n]->cap);
    bytes += (int64_t)m[n]->count * (int64_t)mp_block_bytes(pool, order);
    n++;
    cr_assert_lt(n, 256);
  }
  cr_assert_eq(bytes, mp_load_relaxed(&pool->depot[order].bytes),
               "depot holds %lld bytes, counts %lld", (long long)bytes,
               (long long)mp_load_relaxed(&pool->depot[order].bytes));
  while (n > 0) mp_stack_push_mpmc(pool, &pool->depot[order], m[--n]);
  return (unsigned)(bytes / ((int64_t)pool->mag_cap[order] *
                             (int64_t)mp_block_bytes(pool, order)));
}

Test(depot, overflow_drain_and_trim) {
  /* 16 MiB pool, tcb 256 KiB: the 1 KiB class has 64-slot magazines
   * (64 KiB each), the depot limit is min(2 x 256 KiB, 16 MiB / 16) =
   * 512 KiB per class. */
  magpool_t *pool =
      mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB, .thread_cache = 256 * KiB});
  mp_tcache *tc = mp_tcache_get(pool);
  cr_assert_not_null(tc);
  const unsigned o = order_of(pool, 1 * KiB);
  cr_assert_eq(pool->mag_cap[o], 64);
  cr_assert_eq(pool->depot_limit, 512 * KiB);
  enum { N = 1024 };
  void **p = calloc(N, sizeof *p);
  for (int i = 0; i < N; i++) {
    p[i] = magpool_alloc(pool, 1 * KiB);
    cr_assert_not_null(p[i]);
  }
  cr_assert_eq(depot_total(pool), 0);
  int64_t max_depot = 0;
  for (int i = 0; i < N; i++) {
    cr_assert_eq(magpool_free(pool, p[i]), 0);
    uint64_t c = cached_of(tc);
    int64_t d = mp_load_relaxed(&pool->depot[o].bytes);
    cr_assert_leq(c, tc->limit);
    cr_assert_leq(c, 2 * 64 * KiB, "one class holds at most loaded + "
                  "previous in the thread");
    cr_assert_leq(d, (int64_t)pool->depot_limit);
    if (d > max_depot) max_depot = d;
    if (i < 128)
      cr_assert_eq(d, 0, "free %d: a magazine went to the depot before "
                   "loaded and previous were full", i);
    magpool_stats_t s = mpt_stats(pool);
    cr_assert_eq(s.cached_bytes, (size_t)c + (size_t)depot_total(pool),
                 "free %d: stats cached %zu != thread %llu + depots %lld", i,
                 s.cached_bytes, (unsigned long long)c,
                 (long long)depot_total(pool));
  }
  /* 1024 frees: 128 stay in the thread, 8 full magazines fill the depot
   * to its limit, the other 6 x 64 blocks went to the tree. */
  cr_assert_eq(cached_of(tc), 128 * KiB);
  cr_assert_eq(max_depot, 512 * KiB);
  cr_assert_eq(mp_load_relaxed(&pool->depot[o].bytes), 512 * KiB);
  cr_assert_eq(depot_inspect(pool, o), 8);
  magpool_stats_t s = mpt_stats(pool);
  cr_assert_eq(s.cached_bytes, 640 * KiB);
  cr_assert_eq(s.used_bytes, 0);
  cr_assert_eq(magpool_check(pool), 0);

  /* Allocations drain loaded, then previous, then pop a full magazine
   * from the depot. */
  for (int i = 0; i < 128; i++) {
    p[i] = magpool_alloc(pool, 1 * KiB);
    cr_assert_not_null(p[i]);
  }
  cr_assert_eq(cached_of(tc), 0);
  cr_assert_eq(mp_load_relaxed(&pool->depot[o].bytes), 512 * KiB);
  p[128] = magpool_alloc(pool, 1 * KiB);
  cr_assert_not_null(p[128]);
  cr_assert_eq(mp_load_relaxed(&pool->depot[o].bytes), 448 * KiB);
  cr_assert_eq(cached_of(tc), 63 * KiB);
  for (int i = 0; i <= 128; i++) cr_assert_eq(magpool_free(pool, p[i]), 0);
  free(p);

  /* Drain: the depots are empty, their blocks are in the tree. */
  int64_t dep = depot_total(pool);
  cr_assert_gt(dep, 0);
  size_t free_before = mpt_stats(pool).free_bytes;
  mp_depot_drain(pool, NULL);
  cr_assert_eq(depot_total(pool), 0);
  for (unsigned k = 0; k < MP_MAX_CLASSES; k++)
    cr_assert_null(mp_stack_pop_mpmc(pool, &pool->depot[k]), "depot %u not empty", k);
  s = mpt_stats(pool);
  cr_assert_eq(s.cached_bytes, (size_t)cached_of(tc));
  cr_assert_eq(s.free_bytes, free_before + (size_t)dep);
  cr_assert_eq(s.used_bytes, 0);
  cr_assert_eq(magpool_check(pool), 0);
  assert_one_block(pool);
  cr_assert_eq(magpool_destroy(pool), 0);
}

/* ------------------------------------------------------------------ */
/* share                                                              */
/* ------------------------------------------------------------------ */

enum { SHARE_THREADS = 31 };

typedef struct share_arg {
  magpool_t *pool;
  pthread_barrier_t *in, *out;
  int failed;
} share_arg;

/* A thread that uses the pool once (its record is LIVE), then waits. */
static void *share_worker(void *vp) {
  share_arg *a = vp;
  void *p = magpool_alloc(a->pool, 64);
  if (p == NULL || magpool_free(a->pool, p) != 0) a->failed = 1;
  pthread_barrier_wait(a->in);
  pthread_barrier_wait(a->out);
  return NULL;
}

/* Frees `n` blocks of 64 KiB allocated first, checking after each free
 * that the thread caches at most `bound`; returns the most it cached. */
static uint64_t share_round(magpool_t *pool, mp_tcache *tc, int n, uint64_t bound) {
  void *p[128];
  cr_assert_leq(n, 128);
  for (int i = 0; i < n; i++) cr_assert_not_null(p[i] = magpool_alloc(pool, 64 * 1024));
  uint64_t most = 0;
  for (int i = 0; i < n; i++) {
    cr_assert_eq(magpool_free(pool, p[i]), 0);
    uint64_t c = cached_of(tc);
    cr_assert_leq(c, bound, "free %d: the thread caches %llu bytes, its share is %llu", i,
                  (unsigned long long)c, (unsigned long long)bound);
    if (c > most) most = c;
  }
  return most;
}

Test(share, many_threads_split_the_budgets) {
  /* thread_cache_bytes = stream_cache_bytes = 8 MiB, 64 MiB reserved:
   * the caches of all threads keep max(4 x 8 MiB, 64 MiB / 8) = 32 MiB,
   * so each of 32 live threads 32 MiB / 32 = 1 MiB of each budget. */
  magpool_t *pool = mpt_pool(&(mpt_cfg){
      .pool_size = 64 * MiB, .thread_cache = 8 * MiB, .stream_cache = 8 * MiB});
  mp_tcache *tc = mp_tcache_get(pool);
  cr_assert_not_null(tc);
  cr_assert_eq(mp_load_relaxed(&pool->nthreads), 1);
  uint64_t alone = share_round(pool, tc, 96, 8 * MiB);
  cr_assert_gt(alone, 2 * MiB, "alone, the thread cached only %llu bytes",
               (unsigned long long)alone);

  pthread_barrier_t in, out;
  pthread_barrier_init(&in, NULL, SHARE_THREADS + 1);
  pthread_barrier_init(&out, NULL, SHARE_THREADS + 1);
  share_arg a = {.pool = pool, .in = &in, .out = &out};
  pthread_t th[SHARE_THREADS];
  for (int i = 0; i < SHARE_THREADS; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, share_worker, &a), 0);
  pthread_barrier_wait(&in);
  cr_assert_eq(a.failed, 0);
  cr_assert_eq(mp_load_relaxed(&pool->nthreads), SHARE_THREADS + 1);
  cr_assert_eq(mp_cache_share(pool, 8 * MiB), 1 * MiB);
  /* What the thread cached alone goes back at its next slow paths. */
  uint64_t shared = share_round(pool, tc, 96, 8 * MiB);
  cr_assert_eq(tc->limit, 1 * MiB);
  shared = share_round(pool, tc, 96, 1 * MiB);
  cr_assert_gt(shared, 0);
  /* A stream slot made now gets its share of the stream budget. */
  magpool_stream_t s = NULL;
  cr_assert_eq(magpool_host_stream_create(&s), 0);
  void *q = magpool_alloc_async(pool, 1024, s);
  cr_assert_not_null(q);
  cr_assert_eq(magpool_free_async(pool, q, s), 0);
  cr_assert_eq(tc->s_limit, (int64_t)(1 * MiB));

  pthread_barrier_wait(&out);
  for (int i = 0; i < SHARE_THREADS; i++) cr_assert_eq(pthread_join(th[i], NULL), 0);
  cr_assert_eq(mp_load_relaxed(&pool->nthreads), 1, "exited threads still counted");
  cr_assert_eq(mp_cache_share(pool, 8 * MiB), 8 * MiB);
  uint64_t again = share_round(pool, tc, 96, 8 * MiB);
  cr_assert_gt(again, 2 * MiB, "alone again, the thread cached only %llu bytes",
               (unsigned long long)again);
  /* A second slot: the thread's whole stream budget, split in two. */
  magpool_stream_t s2 = NULL;
  cr_assert_eq(magpool_host_stream_create(&s2), 0);
  q = magpool_alloc_async(pool, 1024, s2);
  cr_assert_not_null(q);
  cr_assert_eq(magpool_free_async(pool, q, s2), 0);
  cr_assert_eq(tc->s_limit, (int64_t)(4 * MiB));

  cr_assert_eq(magpool_host_stream_sync(s), 0);
  cr_assert_eq(magpool_host_stream_sync(s2), 0);
  cr_assert_eq(magpool_stream_release(pool, s), 0);
  cr_assert_eq(magpool_stream_release(pool, s2), 0);
  magpool_host_stream_destroy(s);
  magpool_host_stream_destroy(s2);
  pthread_barrier_destroy(&in);
  pthread_barrier_destroy(&out);
  cr_assert_eq(magpool_check(pool), 0);
  cr_assert_eq(magpool_destroy(pool), 0);
}
