/* test_adopt.c - cross_stream_reuse: at a new peak, an allocation on
 * stream T may take runs that another stream S freed and has not yet
 * passed, once T waits for S's work (include/magpool.h,
 * magpool_config_t.cross_stream_reuse; src/stream_cache.c,
 * mp_streams_adopt; src/runs.h, mp_adopt).
 *
 * S is a host stream held by a gate, so nothing freed on it can pass while
 * the test looks; the pool is 16 MiB (8 chunks of 2 MiB), growing.
 *
 *   adopt::another_stream_takes_a_fenced_run_behind_a_wait   8 MiB freed
 *        on held S; T's 8 MiB request gets that run, the pool maps
 *        nothing, and a task queued on T after the allocation runs only
 *        once S's gate is open (it is given 200 ms to run too early)
 *   adopt::off_by_default_the_run_waits_for_its_stream   the same with
 *        the default: T's request maps new memory and T does not wait
 *   adopt::the_owner_passes_before_the_take   the window between the wait
 *        and the take (MP_HOOK_ADOPT_TAKE): S passes and its batch is
 *        drained; the take finds the run free, as any run
 *   adopt::a_run_fenced_after_the_tag_is_not_taken   the window between
 *        the tag's read and the wait (MP_HOOK_ADOPT): another thread frees
 *        a run on S then, with a newer tag; T's request may use the run
 *        freed before, never that one
 *
 * Internal headers: links the static archive (the hooks).
 */
#define _GNU_SOURCE
#include "internal.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>

#include "flag.h"
#include "stream_util.h"
#include "test_util.h"

#define PS (16 * MiB)

static magpool_t *pool_of(int reuse) {
  return mpt_pool(&(mpt_cfg){.pool_size = PS, .growth = 1, .cross_reuse = reuse});
}

/* A task on T that notes whether S's gate was open when it ran. */
typedef struct probe {
  gate *g;
  _Atomic int ran, saw_open;
} probe;

static void probe_task(void *arg) {
  probe *p = arg;
  pthread_mutex_lock(&p->g->mu);
  int open = p->g->open;
  pthread_mutex_unlock(&p->g->mu);
  atomic_store(&p->saw_open, open);
  atomic_store(&p->ran, 1);
}

static bool overlaps(const void *a, size_t na, const void *b, size_t nb) {
  return (const char *)a < (const char *)b + nb && (const char *)b < (const char *)a + na;
}

/* The end: S's gate opened, T synchronised, y (on T) and fill freed,
 * trimmed, both streams finished. */
static void done(magpool_t *pool, gate *gs, magpool_stream_t S, magpool_stream_t T, void *y,
                 void *fill) {
  gate_release(gs, S);
  cr_assert_eq(magpool_host_stream_sync(T), 0);
  mpt_assert_conserved(pool);
  cr_assert_eq(magpool_free_async(pool, y, T), 0);
  cr_assert_eq(magpool_free(pool, fill), 0);
  cr_assert_eq(magpool_host_stream_sync(T), 0);
  cr_assert_eq(magpool_trim(pool), 0);
  magpool_stream_t s[] = {S, T};
  finish(pool, PS, s, 2);
}

/* fill (8 MiB, sync) and x (8 MiB on held S, freed there): the pool's
 * 8 chunks are busy or fenced, so an 8 MiB request on T is a new peak. */
static void *setup(magpool_t *pool, gate *gs, magpool_stream_t S, void **fill) {
  gate_hold(gs, S);
  *fill = magpool_alloc(pool, PS - 8 * MiB);
  void *x = magpool_alloc_async(pool, 8 * MiB, S);
  cr_assert(*fill != NULL && x != NULL);
  cr_assert_eq(magpool_free_async(pool, x, S), 0);
  return x;
}

/* setup, then T's 8 MiB request; `grew`: what the pool mapped for it. */
typedef struct scene {
  magpool_t *pool;
  magpool_stream_t S, T;
  gate gs;
  void *fill, *x, *y;
  size_t grew;
} scene;

static void scene_take(scene *c, int reuse) {
  c->pool = pool_of(reuse);
  c->S = stream_new();
  c->T = stream_new();
  c->x = setup(c->pool, &c->gs, c->S, &c->fill);
  size_t res = mpt_stats(c->pool).reserved_bytes;
  c->y = magpool_alloc_async(c->pool, 8 * MiB, c->T);
  cr_assert_not_null(c->y);
  c->grew = mpt_stats(c->pool).reserved_bytes - res;
}

Test(adopt, another_stream_takes_a_fenced_run_behind_a_wait, .timeout = 60) {
  scene c;
  scene_take(&c, 1);
  cr_assert_eq(c.y, c.x, "T's request at a new peak did not take the run freed on S");
  cr_assert_eq(c.grew, 0, "the pool mapped %zu bytes more", c.grew);
  /* The probe must not run while S is held: give a T that did not wait
   * 200 ms to show it (a worker wakes in microseconds). */
  probe pr = {.g = &c.gs};
  launch(c.T, probe_task, &pr);
  for (int i = 0; i < 200 && !atomic_load(&pr.ran); i++) usleep(1000);
  cr_assert_eq(atomic_load(&pr.ran), 0,
               "work queued on T after it took S's run ran while S was held");
  done(c.pool, &c.gs, c.S, c.T, c.y, c.fill);
  cr_assert(atomic_load(&pr.ran));
  cr_assert_eq(atomic_load(&pr.saw_open), 1);
}

Test(adopt, off_by_default_the_run_waits_for_its_stream, .timeout = 60) {
  scene c;
  scene_take(&c, 0);
  cr_assert(!overlaps(c.y, 8 * MiB, c.x, 8 * MiB),
            "T got memory freed on S, which has not passed the free");
  cr_assert_eq(c.grew, 8 * MiB);
  probe pr = {.g = &c.gs};
  launch(c.T, probe_task, &pr);
  cr_assert_eq(magpool_host_stream_sync(c.T), 0); /* T does not wait for S */
  cr_assert_eq(atomic_load(&pr.saw_open), 0);
  done(c.pool, &c.gs, c.S, c.T, c.y, c.fill);
}

/* ------------------------------------------------------------- windows -- */

static _Atomic int hook_point;
static _Thread_local int hook_mine;
static void (*hook_action)(void);

static void adopt_hook(int point, void *arg) {
  (void)arg;
  if (!hook_mine || point != atomic_load(&hook_point)) return;
  hook_mine = 0;
  hook_action();
}

static void hook_on(int point, void (*action)(void)) {
  atomic_store(&hook_point, point);
  hook_action = action;
  hook_mine = 1;
  mp_hook_set(adopt_hook);
}

static void hook_off(void) {
  mp_hook_set(NULL);
  hook_mine = 0;
}

static magpool_t *win_pool;
static gate win_gate;
static magpool_stream_t win_S;

/* S passes its frees and a stats read drains its batch: the run is
 * unfenced, free for anyone. */
static void let_s_pass(void) {
  gate_open(&win_gate);
  cr_assert_eq(magpool_host_stream_sync(win_S), 0);
  magpool_stats_t st = mpt_stats(win_pool);
  cr_assert_eq(st.pending_bytes, 0);
}

Test(adopt, the_owner_passes_before_the_take, .timeout = 60) {
  magpool_t *pool = win_pool = pool_of(1);
  magpool_stream_t S = win_S = stream_new(), T = stream_new();
  void *fill, *x = setup(pool, &win_gate, S, &fill);
  size_t res = mpt_stats(pool).reserved_bytes;
  hook_on(MP_HOOK_ADOPT_TAKE, let_s_pass);
  void *y = magpool_alloc_async(pool, 8 * MiB, T);
  hook_off();
  cr_assert_eq(y, x, "the run S passed meanwhile did not serve T's request");
  cr_assert_eq(mpt_stats(pool).reserved_bytes, res);
  done(pool, &win_gate, S, T, y, fill);
}

/* A thread that allocated b on S (its slot for S exists, so its free
 * takes no entry lock) frees it when told: from the hook, while the
 * adopting thread holds S's entry lock. */
static void *b_ptr;
static flag b_ready = FLAG_INIT, free_b = FLAG_INIT, b_done = FLAG_INIT;

static void *b_owner(void *arg) {
  (void)arg;
  b_ptr = magpool_alloc_async(win_pool, 4 * MiB, win_S);
  flag_set(&b_ready);
  flag_wait(&free_b);
  int rc = magpool_free_async(win_pool, b_ptr, win_S);
  flag_set(&b_done);
  return (void *)(intptr_t)rc;
}

static void free_b_now(void) {
  flag_set(&free_b);
  flag_wait(&b_done);
}

Test(adopt, a_run_fenced_after_the_tag_is_not_taken, .timeout = 60) {
  magpool_t *pool = win_pool = pool_of(1);
  magpool_stream_t S = win_S = stream_new(), T = stream_new();
  gate_hold(&win_gate, S);
  void *fill = magpool_alloc(pool, PS - 8 * MiB);
  void *a = magpool_alloc_async(pool, 4 * MiB, S);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, b_owner, NULL), 0);
  flag_wait(&b_ready);
  cr_assert(fill != NULL && a != NULL && b_ptr != NULL);
  cr_assert_eq(magpool_free_async(pool, a, S), 0);
  hook_on(MP_HOOK_ADOPT, free_b_now);
  void *y = magpool_alloc_async(pool, 8 * MiB, T);
  hook_off();
  void *ret;
  cr_assert_eq(pthread_join(th, &ret), 0);
  cr_assert_eq((intptr_t)ret, 0, "the free of b on S failed");
  cr_assert_not_null(y);
  cr_assert(!overlaps(y, 8 * MiB, b_ptr, 4 * MiB),
            "T took the run freed on S after the tag was read: [%p, +8 MiB) meets b %p", y,
            b_ptr);
  done(pool, &win_gate, S, T, y, fill);
}
