/* flag.h - a one-shot signal between two threads, for the tests that stop
 * one thread at a hook (MP_HOOK_*) and run another into the window. */
#ifndef MAGPOOL_TEST_FLAG_H
#define MAGPOOL_TEST_FLAG_H

#include <pthread.h>

typedef struct flag {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int set;
} flag;
#define FLAG_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0}

static inline void flag_set(flag *f) {
  pthread_mutex_lock(&f->mu);
  f->set = 1;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

static inline void flag_wait(flag *f) {
  pthread_mutex_lock(&f->mu);
  while (!f->set) pthread_cond_wait(&f->cv, &f->mu);
  pthread_mutex_unlock(&f->mu);
}

#endif /* MAGPOOL_TEST_FLAG_H */
