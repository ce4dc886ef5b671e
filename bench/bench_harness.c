/* bench_harness.c - the helpers every row's loop calls (bench.h): the
 * clock, the error note, the start gate, the CPU count.
 *
 * The calls run one way: bench.c (driver) -> rows_*.c (rows) -> here.
 * Nothing here calls a row or the driver.
 */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

uint64_t bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

BENCH_COLD void bench_note_error(bench_thread *t, int code) {
  if (t->nerrors++ == 0) t->first_error = code;
}

void bench_wait_start(bench_thread *t) {
  bench_run *run = t->run;
  pthread_mutex_lock(&run->gate_mu);
  run->ready++;
  pthread_cond_broadcast(&run->gate_cv);
  while (!run->go) pthread_cond_wait(&run->gate_cv, &run->gate_mu);
  pthread_mutex_unlock(&run->gate_mu);
}

int bench_ncpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}
