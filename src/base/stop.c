/* Graceful stop on SIGINT/SIGTERM (contract in src/bl_base.h).
 *
 * Where the handler runs matters: oneDNN's generated sgemm kernels (Debian's libdnnl 2.x; oneDNN
 * issue #4845, fixed upstream in 3.x by PR #4855) point rsp at a heap workspace while they run, so
 * a signal delivered to a thread inside one wrote its signal frame into the heap ("corrupted size
 * vs. prev_size", "free(): invalid pointer" in runs stopped with a signal). The frame must never
 * go where rsp points: the main thread takes the signals on an alternate stack (SA_ONSTACK), and
 * the OpenMP workers, which run those kernels too, block them (bl_stop_guard_threads, again
 * whenever the team may grow). The loader's threads block every signal already. */
#define _GNU_SOURCE /* sigaltstack, SA_ONSTACK */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bl_base.h"
#include "internal.h"

static volatile sig_atomic_t pending = 0;
static int watching = 0;

static void on_signal(int sig) {
  if (pending == sig) { /* asked twice: stop now, the default way */
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  pending = sig;
}

static void stop_signals(sigset_t *s) {
  sigemptyset(s);
  sigaddset(s, SIGINT);
  sigaddset(s, SIGTERM);
}

void bl_stop_guard_threads(void) {
  if (!watching) return;
#ifdef _OPENMP
  sigset_t s, old;
  stop_signals(&s);
  /* workers made during the region inherit the blocked mask; those that exist block it themselves */
  pthread_sigmask(SIG_BLOCK, &s, &old);
#pragma omp parallel
  {
    if (omp_get_thread_num() != 0) pthread_sigmask(SIG_BLOCK, &s, NULL);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
#endif
}

int bl_stop_watch(void) {
  if (!watching) { /* the main thread's alternate signal stack, kept for the process's life */
    size_t n = 1 << 16;
    if (n < (size_t)MINSIGSTKSZ * 4) n = (size_t)MINSIGSTKSZ * 4;
    stack_t ss = { .ss_sp = malloc(n), .ss_size = n, .ss_flags = 0 };
    if (!ss.ss_sp) return bl_set_error(BL_ENOMEM, "stop: out of memory for the signal stack");
    if (sigaltstack(&ss, NULL) != 0) {
      free(ss.ss_sp);
      return bl_set_error(BL_EINVAL, "stop: cannot install the signal stack");
    }
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0)
    return bl_set_error(BL_EINVAL, "stop: cannot install the SIGINT/SIGTERM handlers");
  watching = 1;
  bl_stop_guard_threads();
  return 0;
}

int bl_stop_signal(void) { return (int)pending; }
