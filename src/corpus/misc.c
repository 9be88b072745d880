/* Process helpers for the corpus recipes' progress lines (isatty, peak RSS,
 * a monotonic clock) and the deterministic hash their shuffles use. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bl_corpus.h"

int bl_corpus_stderr_isatty(void) { return isatty(2); }

int64_t bl_corpus_peak_rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t kb = -1;
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "VmHWM:", 6)) { kb = strtoll(line + 6, NULL, 10); break; }
  }
  fclose(f);
  return kb;
}

double bl_corpus_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double bl_corpus_hash_unit(uint64_t seed, uint64_t index, uint32_t stream) {
  uint64_t h = splitmix64(splitmix64(seed ^ ((uint64_t)stream << 56)) ^ index);
  return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}
