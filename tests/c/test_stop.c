/* Graceful stop: after bl_stop_watch a SIGTERM or SIGINT is recorded, not fatal. */
#include <signal.h>
#include <stdio.h>

#include "bertlua.h"

int main(void) {
  int fails = 0;
  if (bl_stop_signal() != 0) { printf("FAIL: a signal pending before any\n"); fails++; }
  if (bl_stop_watch() != 0) { printf("FAIL: watch: %s\n", bl_last_error()); return 1; }
  raise(SIGTERM);
  if (bl_stop_signal() != SIGTERM) { printf("FAIL: SIGTERM not recorded (%d)\n", bl_stop_signal()); fails++; }
  raise(SIGINT);
  if (bl_stop_signal() != SIGINT) { printf("FAIL: SIGINT not recorded (%d)\n", bl_stop_signal()); fails++; }
  if (!fails) printf("stop signals recorded, process alive\n");
  return fails ? 1 : 0;
}
