/* FNV-1a 64: the checksum of shard files and the identity of vocab files. */
#include "internal.h"

uint64_t bl_fnv1a64(const void *data, size_t n, uint64_t h) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}
