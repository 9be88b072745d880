/* The order in which one epoch visits the instances: a seeded Fisher-Yates
 * shuffle bit-identical to the Lua reference loader, optionally followed by
 * length binning (see bl_loader.h). */
#include <stdlib.h>

#include "data_internal.h"

static int64_t window_entries(const bl_order_params *p) { return (int64_t)p->bin_window * p->batch * p->world; }

int64_t bl_order_scratch_size(const bl_order_params *p) {
  if (p->bin_window <= 0) return 0;
  int64_t used = p->steps * p->batch * p->world;
  int64_t win = window_entries(p);
  if (win > used) win = used;
  return 2 * win + p->bin_window;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Sort each window of the used part of the epoch by length, then shuffle the
 * window's steps, so that batches are homogeneous in length but long and
 * short batches still alternate through the epoch. */
static void bin_lengths(const bl_order_params *p, int64_t epoch, uint32_t *perm, uint64_t *scratch) {
  const int64_t step = p->batch * p->world; /* entries of one step, all ranks */
  const int64_t used = p->steps * step;
  int64_t win = window_entries(p);
  if (win > used) win = used;
  uint64_t *keys = scratch;
  uint64_t *ids = scratch + win;
  uint64_t *blocks = scratch + 2 * win;
  uint64_t base = bl_num_to_u64(bl_mul_add(p->seed, 1000003.0, (double)epoch));
  int64_t widx = 0;
  for (int64_t w0 = 0; w0 < used; w0 += win, widx++) {
    int64_t wn = used - w0 < win ? used - w0 : win; /* a multiple of step */
    /* length in the high bits, place in the window as the tie-break: a total order */
    for (int64_t i = 0; i < wn; i++) keys[i] = ((uint64_t)p->lengths[perm[w0 + i]] << 32) | (uint64_t)i;
    qsort(keys, (size_t)wn, sizeof *keys, cmp_u64);
    for (int64_t i = 0; i < wn; i++) ids[i] = perm[w0 + (int64_t)(keys[i] & 0xffffffffu)];
    int64_t nb = wn / step;
    for (int64_t b = 0; b < nb; b++) blocks[b] = (uint64_t)b;
    bl_xrng r;
    bl_xrng_seed(&r, base * 0x9E3779B97F4A7C15ULL + (uint64_t)widx + 0x42494E53ULL);
    for (int64_t i = nb - 1; i >= 1; i--) {
      int64_t j = bl_xrng_int1(&r, i + 1) - 1;
      uint64_t t = blocks[i];
      blocks[i] = blocks[j];
      blocks[j] = t;
    }
    for (int64_t b = 0; b < nb; b++)
      for (int64_t t = 0; t < step; t++) perm[w0 + b * step + t] = (uint32_t)ids[(int64_t)blocks[b] * step + t];
  }
}

void bl_order_epoch(const bl_order_params *p, int64_t epoch, uint32_t *perm, uint64_t *scratch) {
  const int64_t n = p->total;
  for (int64_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
  if (p->shuffle) {
    bl_xrng r;
    bl_xrng_seed(&r, bl_num_to_u64(bl_mul_add(p->seed, 1000003.0, (double)epoch)));
    for (int64_t i = n - 1; i >= 1; i--) {
      int64_t j = bl_xrng_int1(&r, i + 1) - 1;
      uint32_t t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
  }
  if (p->bin_window > 0 && scratch) bin_lengths(p, epoch, perm, scratch);
}
