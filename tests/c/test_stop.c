/* Graceful stop: after bl_stop_watch a SIGTERM or SIGINT is recorded, not fatal; it is taken on an alternate
 * stack by the main thread and blocked in the OpenMP workers (oneDNN's GEMM kernels point rsp into the heap:
 * src/base/stop.c), also in workers made after a bl_set_num_threads. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bertlua.h"

/* threads of an OpenMP team of n that do not block SIGINT and SIGTERM, master excluded; -1: no OpenMP */
static int workers_taking_signals(int n) {
#ifdef _OPENMP
  int open = 0, size = 0;
#pragma omp parallel num_threads(n) reduction(+ : open)
  {
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    if (omp_get_thread_num() != 0) open += !sigismember(&cur, SIGINT) || !sigismember(&cur, SIGTERM);
#pragma omp master
    size = omp_get_num_threads();
  }
  return size == n ? open : -2;
#else
  (void)n;
  return -1;
#endif
}

int main(void) {
  int fails = 0;
  if (bl_stop_signal() != 0) {
    printf("FAIL: a signal pending before any\n");
    fails++;
  }
  bl_set_num_threads(2);
  if (bl_stop_watch() != 0) {
    printf("FAIL: watch: %s\n", bl_last_error());
    return 1;
  }
  raise(SIGTERM);
  if (bl_stop_signal() != SIGTERM) {
    printf("FAIL: SIGTERM not recorded (%d)\n", bl_stop_signal());
    fails++;
  }
  raise(SIGINT);
  if (bl_stop_signal() != SIGINT) {
    printf("FAIL: SIGINT not recorded (%d)\n", bl_stop_signal());
    fails++;
  }

  stack_t ss;
  if (sigaltstack(NULL, &ss) != 0 || (ss.ss_flags & SS_DISABLE)) {
    printf("FAIL: no alternate signal stack\n");
    fails++;
  }
  const int sigs[2] = { SIGINT, SIGTERM };
  for (int i = 0; i < 2; i++) {
    struct sigaction sa;
    if (sigaction(sigs[i], NULL, &sa) != 0 || !(sa.sa_flags & SA_ONSTACK)) {
      printf("FAIL: signal %d is not taken on the alternate stack\n", sigs[i]);
      fails++;
    }
  }
  sigset_t cur;
  pthread_sigmask(SIG_BLOCK, NULL, &cur);
  if (sigismember(&cur, SIGINT) || sigismember(&cur, SIGTERM)) {
    printf("FAIL: the main thread blocks them\n");
    fails++;
  }
  int open = workers_taking_signals(2);
  if (open > 0) {
    printf("FAIL: %d OpenMP worker(s) of 2 threads take SIGINT/SIGTERM\n", open);
    fails++;
  }
  bl_set_num_threads(4); /* a larger team: its new workers too */
  open = workers_taking_signals(4);
  if (open > 0) {
    printf("FAIL: %d OpenMP worker(s) of 4 threads take SIGINT/SIGTERM\n", open);
    fails++;
  }
  if (open == -1) printf("(no OpenMP: the worker checks did not run)\n");
  if (!fails) printf("stop signals recorded on an alternate stack, workers block them, process alive\n");
  return fails ? 1 : 0;
}
