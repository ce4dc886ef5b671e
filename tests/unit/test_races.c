/* test_races.c - the points where two threads meet, opened on purpose.
 *
 * A torture run that passes proves little: these tests stop one thread at
 * an exact point with a test hook (src/base.h, MP_HOOK_*), run the other
 * side of the protocol into the window, and check the outcome.
 *
 *   races::stack_pop_stalls_across_2p23_ops   a pop stalled between reading
 *        head/next and its CAS, while exactly 2^23 operations bring the
 *        same magazine back to the head (the old 23-bit version wrapped)
 *   races::destroy_waits_for_an_exiting_thread   destroy vs thread exit:
 *        stream state is freed only after the exit flush is done
 *   races::slot_flush_holds_off_release   an owner's slot flush (at its
 *        exit) vs magpool_stream_release on another thread: the blocks go
 *        behind the blocked stream, never to the tree early
 *   races::ladder_takes_an_idle_threads_cache   an idle thread's magazines
 *        are reachable by another thread's out-of-memory ladder
 *   races::thief_waits_for_an_owner_inside   the ladder's thief meets an
 *        owner stopped inside its critical section: it waits, then steals
 *   races::a_close_counted_late_is_swept_later   a release stopped
 *        between closing a thread's slots and counting the close, while
 *        that thread moves among its streams: once counted, the thread's
 *        next lookup drops the closed slot
 *
 * Internal headers: links the static archive.
 */
#define _GNU_SOURCE
#include "thread.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "stream_util.h"
#include "flag.h"
#include "test_util.h"

/* ============================================================ stack ABA */

static mp_stack *aba_stack;
static _Thread_local int aba_stall_me;
static flag aba_stalled = FLAG_INIT, aba_resume = FLAG_INIT;

static void aba_hook(int point, void *arg) {
  if (point != MP_HOOK_STACK_POP || arg != aba_stack || !aba_stall_me) return;
  aba_stall_me = 0; /* once: the retry runs free */
  flag_set(&aba_stalled);
  flag_wait(&aba_resume);
}

typedef struct aba_pop {
  magpool_t *pool;
  mp_mag *got;
} aba_pop;

static void *aba_popper(void *arg) {
  aba_pop *a = arg;
  aba_stall_me = 1;
  a->got = mp_stack_pop_mpmc(a->pool, aba_stack);
  return NULL;
}

Test(races, stack_pop_stalls_across_2p23_ops, .timeout = 120) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
  aba_stack = aligned_alloc(MP_CACHELINE, sizeof *aba_stack);
  cr_assert_not_null(aba_stack);
  memset(aba_stack, 0, sizeof *aba_stack);
  mp_mag *A = mp_mag_new(pool, 0), *B = mp_mag_new(pool, 0), *C = mp_mag_new(pool, 0),
         *D = mp_mag_new(pool, 0);
  cr_assert(A && B && C && D);
  mp_stack_push_mpmc(pool, aba_stack, A);
  mp_stack_push_mpmc(pool, aba_stack, B); /* [B -> A] */
  mp_hook_set(aba_hook);

  /* The popper reads head B and next A, then stalls before its CAS. */
  aba_pop ap = {pool, NULL};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, aba_popper, &ap), 0);
  flag_wait(&aba_stalled);

  /* Exactly 2^23 operations that end with B at the head again, over C:
   * pop B, pop A (A is now ours), push C, push B: 4, plus 2^22 - 2 pairs
   * of push D / pop D.  A 23-bit version is back where the popper read
   * it; a CAS that trusted it would install the stale next, A. */
  cr_assert_eq(mp_stack_pop_mpmc(pool, aba_stack), B);
  cr_assert_eq(mp_stack_pop_mpmc(pool, aba_stack), A);
  for (uint32_t i = 0; i < (1u << 22) - 2; i++) {
    mp_stack_push_mpmc(pool, aba_stack, D);
    cr_assert_eq(mp_stack_pop_mpmc(pool, aba_stack), D);
  }
  mp_stack_push_mpmc(pool, aba_stack, C);
  mp_stack_push_mpmc(pool, aba_stack, B); /* [B -> C] */

  flag_set(&aba_resume);
  pthread_join(th, NULL);
  mp_hook_set(NULL);
  cr_assert_eq(ap.got, B, "the stalled pop returned %p, expected B %p", (void *)ap.got,
               (void *)B);
  mp_mag *next = mp_stack_pop_mpmc(pool, aba_stack);
  cr_assert_eq(next, C, "after the stalled pop the head is %p (A = %p, owned by the test), "
                        "expected C %p", (void *)next, (void *)A, (void *)C);
  cr_assert_null(mp_stack_pop_mpmc(pool, aba_stack), "the stack holds more than it should");
  mp_mag_free(pool, A);
  mp_mag_free(pool, B);
  mp_mag_free(pool, C);
  mp_mag_free(pool, D);
  free(aba_stack);
  mpt_pool_done(pool);
}

/* ===================================================== destroy vs exit */

static _Thread_local int exit_is_target;
static _Atomic int exit_done, destroy_waited, streams_freed_early;
static flag exit_in_flush = FLAG_INIT, exit_go = FLAG_INIT;

static void exit_hook(int point, void *arg) {
  (void)arg;
  switch (point) {
  case MP_HOOK_EXIT_FLUSH:
    if (!exit_is_target) return;
    flag_set(&exit_in_flush);
    flag_wait(&exit_go);
    break;
  case MP_HOOK_EXIT_DONE:
    if (exit_is_target) atomic_store(&exit_done, 1);
    break;
  case MP_HOOK_DESTROY_WAIT: /* fixed order: destroy waits for the exit */
    atomic_store(&destroy_waited, 1);
    flag_set(&exit_go);
    break;
  case MP_HOOK_DESTROY_STREAMS:
    if (!atomic_load(&exit_done)) atomic_store(&streams_freed_early, 1);
    flag_set(&exit_go); /* broken order: let the exit run into freed slots */
    break;
  default:
    break;
  }
}

typedef struct exit_arg {
  magpool_t *pool;
  magpool_stream_t *s;
  int n;
} exit_arg;

/* Frees one block on each of n streams (so its record owns n slots, each
 * holding a block), then exits. */
static void *exit_worker(void *arg) {
  exit_arg *a = arg;
  for (int i = 0; i < a->n; i++) {
    void *p = magpool_alloc_async(a->pool, 256, a->s[i]);
    cr_assert_not_null(p);
    cr_assert_eq(magpool_free_async(a->pool, p, a->s[i]), 0);
  }
  exit_is_target = 1;
  return NULL;
}

static void *destroyer(void *arg) {
  cr_assert_eq(magpool_destroy(arg), 0);
  return NULL;
}

Test(races, destroy_waits_for_an_exiting_thread, .timeout = 60) {
  enum { NS = 8 };
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 16 * MiB});
  magpool_stream_t s[NS];
  for (int i = 0; i < NS; i++) s[i] = stream_new();
  mp_hook_set(exit_hook);
  exit_arg ea = {pool, s, NS};
  pthread_t w, d;
  cr_assert_eq(pthread_create(&w, NULL, exit_worker, &ea), 0);
  flag_wait(&exit_in_flush); /* the worker's record is EXITING, slots unread */
  for (int i = 0; i < NS; i++) cr_assert_eq(magpool_host_stream_sync(s[i]), 0);
  /* The destroyer either waits for the exiting record (and the hook lets
   * the exit go on) or frees the stream state first (and the hook records
   * it, then lets the exit walk into freed slots). */
  cr_assert_eq(pthread_create(&d, NULL, destroyer, pool), 0);
  pthread_join(w, NULL);
  pthread_join(d, NULL);
  mp_hook_set(NULL);
  cr_assert_eq(atomic_load(&exit_done), 1, "the exit flush never finished");
  cr_assert_eq(atomic_load(&destroy_waited), 1, "destroy never waited for the exiting thread");
  cr_assert_eq(atomic_load(&streams_freed_early), 0,
               "destroy freed the stream slots while a thread was walking them "
               "in its exit flush");
  for (int i = 0; i < NS; i++) cr_assert_eq(magpool_host_stream_destroy(s[i]), 0);
}

/* ==================================================== slot flush vs release */

static _Thread_local int flush_is_owner, release_is_thief;
static flag flush_holds = FLAG_INIT, flush_go = FLAG_INIT, release_waits = FLAG_INIT;

static void flush_hook(int point, void *arg) {
  (void)arg;
  if (point == MP_HOOK_SLOT_FLUSH && flush_is_owner) {
    flush_is_owner = 0;
    flag_set(&flush_holds);
    flag_wait(&flush_go);
  } else if (point == MP_HOOK_ENTRY_WAIT && release_is_thief) {
    release_is_thief = 0;
    flag_set(&release_waits);
  }
}

typedef struct flush_arg {
  magpool_t *pool;
  magpool_stream_t s;
  void *blk[16];
} flush_arg;

/* Frees 16 blocks on s into its slot, then exits: the exit flushes the
 * slot, as the first call after a trim would. */
static void *flush_owner(void *arg) {
  flush_arg *a = arg;
  for (int i = 0; i < 16; i++) a->blk[i] = magpool_alloc_async(a->pool, 4096, a->s);
  for (int i = 0; i < 16; i++) cr_assert_eq(magpool_free_async(a->pool, a->blk[i], a->s), 0);
  flush_is_owner = 1;
  return NULL;
}

typedef struct release_arg {
  magpool_t *pool;
  magpool_stream_t s;
} release_arg;

static void *releaser(void *arg) {
  release_arg *r = arg;
  release_is_thief = 1;
  cr_assert_eq(magpool_stream_release(r->pool, r->s), 0);
  return NULL;
}

Test(races, slot_flush_holds_off_release, .timeout = 60) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB, .thread_cache = MPT_ZERO});
  magpool_stream_t s = stream_new();
  gate g;
  gate_init(&g);
  launch(s, gate_task, &g);
  gate_wait_entered(&g);
  mp_hook_set(flush_hook);

  flush_arg fa = {.pool = pool, .s = s};
  pthread_t ow, rl;
  cr_assert_eq(pthread_create(&ow, NULL, flush_owner, &fa), 0);
  flag_wait(&flush_holds); /* the owner holds the entry lock, stream read */

  release_arg ra = {pool, s};
  cr_assert_eq(pthread_create(&rl, NULL, releaser, &ra), 0);
  flag_wait(&release_waits); /* the release waits for the entry lock */
  flag_set(&flush_go);
  pthread_join(ow, NULL);
  pthread_join(rl, NULL);
  mp_hook_set(NULL);

  /* s is still blocked: the 16 blocks are pending behind it, and none of
   * them may be handed out. */
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_geq(st.pending_bytes, 16 * 4096,
                "pending_bytes %zu: blocks freed on a blocked stream left it early",
                st.pending_bytes);
  void *q[256];
  int nq = 0;
  for (; nq < 256; nq++) {
    q[nq] = magpool_alloc(pool, 4096);
    cr_assert_not_null(q[nq]);
    for (int i = 0; i < 16; i++)
      cr_assert_neq(q[nq], fa.blk[i], "a block freed on the blocked stream was handed out");
    if (mpt_stats(pool).free_bytes < 4096) break;
  }
  for (int i = 0; i <= nq && i < 256; i++) cr_assert_eq(magpool_free(pool, q[i]), 0);
  gate_open(&g);
  cr_assert_eq(magpool_host_stream_sync(s), 0);
  gate_done(&g);
  cr_assert_eq(magpool_host_stream_destroy(s), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  mpt_assert_one_block(pool);
  mpt_pool_done(pool);
}

/* ============================================= idle threads' magazines */

typedef struct idle_arg {
  magpool_t *pool;
  size_t bs;
  int n;
  flag cached, done;
} idle_arg;

/* Fills its magazines (allocates n blocks, frees them: they stay in its
 * cache), then sleeps without calling magpool until told, then uses the
 * pool again. */
static void *idle_worker(void *arg) {
  idle_arg *a = arg;
  void *p[64];
  for (int i = 0; i < a->n; i++) cr_assert_not_null(p[i] = magpool_alloc(a->pool, a->bs));
  for (int i = 0; i < a->n; i++) cr_assert_eq(magpool_free(a->pool, p[i]), 0);
  flag_set(&a->cached);
  flag_wait(&a->done);
  for (int i = 0; i < a->n; i++) cr_assert_not_null(p[i] = magpool_alloc(a->pool, a->bs));
  for (int i = 0; i < a->n; i++) cr_assert_eq(magpool_free(a->pool, p[i]), 0);
  return NULL;
}

Test(races, ladder_takes_an_idle_threads_cache, .timeout = 60) {
  const size_t PS = 8 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .thread_cache = 1 * MiB});
  idle_arg ia = {.pool = pool, .bs = 64 * KiB, .n = 8, .cached = FLAG_INIT, .done = FLAG_INIT};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, idle_worker, &ia), 0);
  flag_wait(&ia.cached);
  magpool_stats_t st = mpt_stats(pool);
  cr_assert_geq(st.cached_bytes, 4 * ia.bs, "the idle thread caches %zu bytes", st.cached_bytes);
  /* The whole pool, while the idle thread's cache holds part of it. */
  void *all = magpool_alloc(pool, PS);
  cr_assert_not_null(all, "ENOMEM (%s) with %zu bytes cached by an idle thread",
                     magpool_strerror(magpool_last_error()), st.cached_bytes);
  cr_assert_eq(magpool_free(pool, all), 0);
  flag_set(&ia.done); /* the owner finds its magazines emptied, and works */
  pthread_join(th, NULL);
  cr_assert_eq(magpool_trim(pool), 0);
  mpt_assert_one_block(pool);
  mpt_pool_done(pool);
}

static _Thread_local int refill_is_owner;
static flag refill_inside = FLAG_INIT, refill_go = FLAG_INIT;
static _Atomic int thief_waited;

static void refill_hook(int point, void *arg) {
  (void)arg;
  if (point == MP_HOOK_REFILL && refill_is_owner) {
    refill_is_owner = 0;
    flag_set(&refill_inside);
    flag_wait(&refill_go);
  } else if (point == MP_HOOK_REVOKE_WAIT && !atomic_exchange(&thief_waited, 1)) {
    flag_set(&refill_go); /* the thief waits for the owner: let it out */
  }
}

typedef struct refill_arg {
  magpool_t *pool;
  void *p[4];
  flag cached;
} refill_arg;

static void *refill_owner(void *arg) {
  refill_arg *a = arg;
  /* Something cached first, so the thief has a reason to come. */
  void *c = magpool_alloc(a->pool, 128 * KiB);
  cr_assert_not_null(c);
  cr_assert_eq(magpool_free(a->pool, c), 0);
  refill_is_owner = 1;
  a->p[0] = magpool_alloc(a->pool, 1024); /* a miss: refill, inside */
  cr_assert_not_null(a->p[0]);
  memset(a->p[0], 0x5A, 1024);
  return NULL;
}

Test(races, thief_waits_for_an_owner_inside, .timeout = 60) {
  const size_t PS = 4 * MiB;
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = PS, .thread_cache = 512 * KiB});
  mp_hook_set(refill_hook);
  refill_arg ra = {.pool = pool, .cached = FLAG_INIT};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, refill_owner, &ra), 0);
  flag_wait(&refill_inside);
  /* The owner is stopped inside its critical section.  A request for the
   * whole pool makes this thread's ladder steal: it must wait for the
   * owner (which the hook then lets out) and never touch the magazines
   * under it; the request then fails, since the owner holds a block. */
  void *big = magpool_alloc(pool, PS);
  pthread_join(th, NULL);
  mp_hook_set(NULL);
  cr_assert_eq(atomic_load(&thief_waited), 1, "the thief never waited for the owner");
  cr_assert_null(big, "the whole pool, while the owner holds a live block");
  cr_assert_eq(magpool_last_error(), MAGPOOL_ENOMEM);
  cr_assert_eq(magpool_usable_size(pool, ra.p[0]), 1024, "the owner's block is not live");
  cr_assert_eq(((unsigned char *)ra.p[0])[1023], 0x5A);
  cr_assert_eq(magpool_free(pool, ra.p[0]), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  mpt_assert_one_block(pool);
  mpt_pool_done(pool);
}

/* ================================ a release's closes vs an owner's lookup */

static _Thread_local int closes_is_releaser;
static flag closes_stopped = FLAG_INIT, closes_go = FLAG_INIT;

static void closes_hook(int point, void *arg) {
  (void)arg;
  if (point != MP_HOOK_SLOTS_CLOSED || !closes_is_releaser) return;
  closes_is_releaser = 0;
  flag_set(&closes_stopped);
  flag_wait(&closes_go);
}

static void *closes_releaser(void *arg) {
  release_arg *r = arg;
  closes_is_releaser = 1;
  cr_assert_eq(magpool_stream_release(r->pool, r->s), 0);
  return NULL;
}

/* A block allocated and freed on s: the calling thread's slot for s. */
static void use_stream(magpool_t *pool, magpool_stream_t s) {
  void *p = magpool_alloc_async(pool, 4096, s);
  cr_assert_not_null(p);
  cr_assert_eq(magpool_free_async(pool, p, s), 0);
}

Test(races, a_close_counted_late_is_swept_later, .timeout = 60) {
  magpool_t *pool = mpt_pool(&(mpt_cfg){.pool_size = 1 * MiB, .thread_cache = MPT_ZERO});
  magpool_stream_t s = stream_new(), t = stream_new(), u = stream_new();
  use_stream(pool, s);
  use_stream(pool, t);
  mp_tcache *tc = mp_tls_last;
  cr_assert(tc != NULL && tc->pool == pool);
  cr_assert_eq(tc->s_nslots, 2);

  mp_hook_set(closes_hook);
  release_arg ra = {pool, s};
  pthread_t rl;
  cr_assert_eq(pthread_create(&rl, NULL, closes_releaser, &ra), 0);
  flag_wait(&closes_stopped); /* s's slots closed, the close not counted */
  /* Lookups in the window: a new stream, and the released one (its closed
   * slot is found again and refused by the enter). */
  use_stream(pool, u);
  use_stream(pool, s);
  cr_assert_eq(tc->s_nslots, 3,
               "the window was not open: a lookup swept the closed slot before "
               "the release counted its close (%u slots)",
               tc->s_nslots);
  flag_set(&closes_go);
  pthread_join(rl, NULL);
  mp_hook_set(NULL);

  /* Counted now: the next move to another stream drops the closed slot. */
  use_stream(pool, t);
  cr_assert_eq(tc->s_nslots, 2,
               "a closed slot outlived the count of its close: %u slots on the "
               "thread's list, 2 open",
               tc->s_nslots);
  cr_assert_eq(magpool_stream_release(pool, t), 0);
  cr_assert_eq(magpool_stream_release(pool, u), 0);
  magpool_stream_t all[] = {s, t, u};
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(magpool_host_stream_sync(all[i]), 0);
    cr_assert_eq(magpool_host_stream_destroy(all[i]), 0);
  }
  cr_assert_eq(magpool_trim(pool), 0);
  mpt_assert_one_block(pool);
  mpt_pool_done(pool);
}
