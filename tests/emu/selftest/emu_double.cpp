// TEST DOUBLE (see emu_double.h); never linked into the emulated library.
#include "emu_double.h"
#include <stdio.h>
#include <stdlib.h>
#include <map>
#include <mutex>
#include "emu_internal.h"

namespace {
std::mutex g_mu;
std::map<const char *, size_t> g_blocks; // start -> bytes
} // namespace

void emu_double_register(const void *p, size_t bytes) {
  std::lock_guard<std::mutex> g(g_mu);
  g_blocks[(const char *)p] = bytes;
}
void emu_double_unregister(const void *p) {
  std::lock_guard<std::mutex> g(g_mu);
  g_blocks.erase((const char *)p);
}
void emu_stream_enqueue(cudaStream_t, const char *, std::function<void()> fn) { fn(); }
bool emu_is_device_range(int dev, const void *p, size_t bytes) {
  std::lock_guard<std::mutex> g(g_mu);
  const char *c = (const char *)p;
  auto it = g_blocks.upper_bound(c);
  if (dev != 0 || it == g_blocks.begin()) return false;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second;
}
int emu_current_device() { return 0; }
// Warp collectives need the fiber device; no library self-test reaches them.
void emu_warp_gather(const void *, void *, size_t, const char *where) {
  fprintf(stderr, "emu test double: warp collective at %s needs the emulated device\n", where);
  abort();
}
int emu_lane_id() { return 0; }
