/* Internal pieces of the shard reader and the loader (src/data/). */
#ifndef BL_DATA_INTERNAL_H
#define BL_DATA_INTERNAL_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "bl_base.h"
#include "bl_loader.h"

struct bl_shard {
  char *path;
  const uint8_t *base; /* the mapping */
  size_t size;
  const bl_shard_header *h;
  const uint64_t *offs; /* N + 1 */
  const uint8_t *data;
  int64_t n;
  int32_t tb;         /* token bytes: 2 or 4 */
  int32_t max_length; /* longest record */
};

/* Record k without checks (bl_shard_open validated every record). */
static inline void bl_shard_rec(const struct bl_shard *s, int64_t k, bl_shard_record *r) {
  const uint8_t *p = s->data + s->offs[k];
  uint16_t hdr[3];
  memcpy(hdr, p, sizeof hdr);
  r->length = hdr[0];
  r->len_a = hdr[1];
  r->num_masked = hdr[2];
  r->next_sentence_label = p[6];
  r->tokens = p + 8;
  r->positions = (const uint16_t *)(p + 8 + (size_t)r->length * (size_t)s->tb);
  r->labels = p + 8 + (size_t)r->length * (size_t)s->tb + (size_t)r->num_masked * 2;
}

static inline uint32_t bl_shard_token(const void *p, int tb, int64_t i) {
  if (tb == 2) {
    uint16_t v;
    memcpy(&v, (const uint8_t *)p + 2 * i, 2);
    return v;
  }
  uint32_t v;
  memcpy(&v, (const uint8_t *)p + 4 * i, 4);
  return v;
}

/* The loader's generator, specified in bl_loader.h (bl_xrng). */
typedef struct bl_xrng {
  uint64_t s;
} bl_xrng;

static inline void bl_xrng_seed(bl_xrng *r, uint64_t seed) { r->s = 0x9E3779B97F4A7C15ULL + seed * 0x100000001B3ULL; }
static inline double bl_xrng_unit(bl_xrng *r) {
  uint64_t x = r->s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  r->s = x;
  return (double)((x * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}
/* r(n) of the Lua rng: floor(u * n) + 1, in 1..n */
static inline int64_t bl_xrng_int1(bl_xrng *r, int64_t n) { return (int64_t)floor(bl_xrng_unit(r) * (double)n) + 1; }

/* A Lua number used as a uint64 seed: LuaJIT converts through int64 below
 * 2^63 (so negative seeds wrap) and directly above. */
static inline uint64_t bl_num_to_u64(double d) {
  if (d != d) return 0;
  if (d >= 9223372036854775808.0) return d < 18446744073709551616.0 ? (uint64_t)d : UINT64_MAX;
  if (d <= -9223372036854775808.0) return (uint64_t)INT64_MIN;
  return (uint64_t)(int64_t)d;
}

/* a*b+c in double with two roundings, never fused into an FMA (the Lua
 * reference rounds twice; an FMA could give other seeds). */
static inline double bl_mul_add(double a, double b, double c) {
  volatile double p = a * b;
  return p + c;
}

/* order.c: the instance order of one epoch */
typedef struct bl_order_params {
  int64_t total, batch, world, steps;
  double seed;
  int shuffle;
  int32_t bin_window;
  const uint16_t *lengths; /* [total], for binning */
} bl_order_params;
/* Scratch entries (uint64) bl_order_epoch needs: 0 without binning. */
int64_t bl_order_scratch_size(const bl_order_params *p);
/* perm[total] <- the epoch's order (instance indices). */
void bl_order_epoch(const bl_order_params *p, int64_t epoch, uint32_t *perm, uint64_t *scratch);

/* masking.c: dynamic masking of one sequence, as pretraining_data.mask */
typedef struct bl_mask_params {
  int32_t cls_id, sep_id, mask_id, vocab_size, max_predictions;
  double masked_lm_prob;
  const uint8_t *is_continuation; /* [vocab_size] or NULL: whole-word masking when set */
} bl_mask_params;
typedef struct bl_mask_scratch {
  int32_t *idx, *gstart, *gorder; /* candidate positions, group starts, shuffled groups */
  uint8_t *covered;
  int64_t cap;
} bl_mask_scratch;
int bl_mask_scratch_init(bl_mask_scratch *s, int64_t max_len);
void bl_mask_scratch_free(bl_mask_scratch *s);
/* tokens[L] -> out[L] (L <= the scratch's max_len); writes the first P masked
 * positions and their original tokens, by position; returns how many were masked. */
int32_t bl_mask_sequence(const bl_mask_params *p, bl_mask_scratch *s, bl_xrng *r, const int32_t *tokens, int32_t L,
                         int32_t *out, int32_t *pos, int32_t *lab, int32_t P);
#endif
