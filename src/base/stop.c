/* Graceful stop on SIGINT/SIGTERM (contract in src/bl_base.h). */
#define _POSIX_C_SOURCE 200809L  /* sigaction */
#include <signal.h>
#include <string.h>

#include "bl_base.h"

static volatile sig_atomic_t pending = 0;

static void on_signal(int sig) {
  if (pending == sig) {  /* asked twice: stop now, the default way */
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  pending = sig;
}

int bl_stop_watch(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0)
    return bl_set_error(BL_EINVAL, "stop: cannot install the SIGINT/SIGTERM handlers");
  return 0;
}

int bl_stop_signal(void) { return (int)pending; }
