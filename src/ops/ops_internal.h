/* Internal helpers shared by the CPU op implementations in src/ops/ (one file per op family)
 * (not part of the public API, not seen by the FFI).
 *
 * The CPU ops compute in f32. A tensor that is already f32 and contiguous is
 * used in place; anything else (f16/bf16/f64 storage, strided views) goes
 * through a contiguous f32 scratch copy, converted on load and on store.
 * This keeps every hot loop a plain float loop with no per-element dispatch.
 */
#ifndef BL_OPS_INTERNAL_H
#define BL_OPS_INTERNAL_H
#include <stdint.h>
#include <string.h>
#include "bl_base.h"
#include "bl_tensor.h"

/* A contiguous f32 image of a tensor. `owned` = scratch to free/store back. */
typedef struct opx_buf {
  float *p;
  int64_t n;
  int owned;
} opx_buf;

/* "[4,7]" into buf (n >= 96 is always enough). Returns buf. */
const char *opx_shape(const bl_tensor *t, char *buf, size_t n);
#define OPX_SHAPE(t) opx_shape((t), (char[96]){0}, 96)

/* Tensor present and not released. `name` names the argument in messages. */
int opx_check(const char *op, const bl_tensor *t, const char *name);
/* Like opx_check plus a floating dtype (f32/f64/f16/bf16). */
int opx_check_float(const char *op, const bl_tensor *t, const char *name);
/* Integer index tensor (i32/i64). */
int opx_check_index(const char *op, const bl_tensor *t, const char *name);

/* Device of the first non-NULL tensor among ts[0..n) into *dev: -1 (CPU)
 * or N >= 0 (cuda:N); all must agree, else an error naming both devices.
 * The caller then dispatches (src/device/dispatch.h). */
int opx_device(const char *op, int n, const bl_tensor *const *ts, int *dev);

/* Product of all dims but the last (rows) and the last dim (cols). */
int64_t opx_rows(const bl_tensor *t);
int64_t opx_cols(const bl_tensor *t);
int opx_same_shape(const bl_tensor *a, const bl_tensor *b);

/* Contiguous f32 read view (in place when possible). */
int opx_load(const char *op, const bl_tensor *t, opx_buf *b);
/* Writable f32 buffer for output t; when `keep` the current values are
 * loaded (accumulating outputs). Call opx_store afterwards. */
int opx_out(const char *op, bl_tensor *t, opx_buf *b, int keep);
/* Writes an owned scratch back into t (converting) and frees it. */
void opx_store(bl_tensor *t, opx_buf *b);
void opx_free(opx_buf *b);

/* Index tensor (i32/i64, any strides) as a contiguous int64 array (always
 * owned: free with free()). */
int opx_load_ids(const char *op, const bl_tensor *t, int64_t **ids);

/* Philox dropout: element i of a stream uses block (offset + i/4), lane i%4,
 * u = (x >> 8) * 2^-24, keep = u >= p. Fills keep[0..n) (1 keep, 0 drop)
 * for elements start..start+n of the stream. */
void opx_dropout_keep(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float p, uint8_t *keep);
int opx_check_p(const char *op, double p);

/* float <-> half / bfloat16, round-to-nearest-even. */
static inline float opx_h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) bits = sign;
    else {  /* subnormal: renormalise */
      int e = -1;
      do { man <<= 1; e++; } while (!(man & 0x400));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
  else bits = sign | ((exp + 112) << 23) | (man << 13);
  float f; memcpy(&f, &bits, 4); return f;
}
static inline uint16_t opx_f2h(float f) {
  uint32_t x; memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  /* rounds to >= 65520: inf */
  if (ax < 0x38800000u) {  /* subnormal half or zero */
    if (ax < 0x33000000u) return (uint16_t)sign;
    uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000, shift = 126 - e;
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ax + 0xfffu + ((ax >> 13) & 1);  /* round to nearest even */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}
static inline float opx_bf2f(uint16_t h) { uint32_t b = (uint32_t)h << 16; float f; memcpy(&f, &b, 4); return f; }
static inline uint16_t opx_f2bf(float f) {
  uint32_t x; memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

#endif
