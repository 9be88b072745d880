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
#include "base/half.h"

/* A contiguous f32 image of a tensor. `owned` = scratch to free/store back. */
typedef struct opx_buf {
  float *p;
  int64_t n;
  int owned;
} opx_buf;

/* "[4,7]" into buf (n >= 96 is always enough). Returns buf. */
const char *opx_shape(const bl_tensor *t, char *buf, size_t n);
#define OPX_SHAPE(t) opx_shape((t), (char[96]){ 0 }, 96)

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
/* 0, or an error naming op when p > 0 and seed is a device seed slot (BL_SEED_SLOT, bl_ops.h): the CPU has none */
int opx_seed_check(const char *op, double p, uint64_t seed);
void opx_dropout_keep(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float p, uint8_t *keep);
int opx_check_p(const char *op, double p);
/* x *= s over n floats (one rounding each: the same bits on every ISA path) */
void opx_scale_row(int64_t n, float *x, float s);

/* Is t the argmax of the row x[0..c) (bl_argmax's rule: the first maximum, the first NaN when there is one)?
 * mx and sum: the row's max and sum of exp(x - mx) from the cross-entropy pass. A finite sum means a row without
 * NaN or +inf (either makes the sum NaN) and with a finite max, whose argmax is the first x[j] == mx: only the
 * elements before t are searched, and only when x[t] is the max; any other row is searched whole. */
int opx_is_argmax(int64_t c, const float *x, int64_t t, float mx, float sum);
/* 0, or an error naming op unless acc is a contiguous i64 [2] tensor {correct, count} on the logits' device */
int opx_check_counts(const char *op, const bl_tensor *acc, const bl_tensor *logits);

/* Packed sequences: offsets [B+1] (i32/i64) delimit B sequences in T tokens. opx_load_offsets checks they rise
 * from 0 to T and copies them (free with free()); *maxlen gets the longest sequence. opx_packed_rows gives each
 * token's row in the padded [B, seq] batch it came from (b*seq + its position, the row's real tokens being its
 * first ones), an error when a sequence is longer than seq. */
int opx_load_offsets(const char *op, const bl_tensor *o, int64_t T, int64_t **out, int64_t *maxlen);
int opx_packed_rows(const char *op, const bl_tensor *offsets, int64_t T, int64_t seq, int64_t **rows);

/* float <-> half / bfloat16: the core's one converter (base/half.h), inlined. */
static inline float opx_h2f(uint16_t h) { return bl_half_f16_to_f32(h); }
static inline uint16_t opx_f2h(float f) { return bl_half_f32_to_f16(f); }
static inline float opx_bf2f(uint16_t h) { return bl_half_bf16_to_f32(h); }
static inline uint16_t opx_f2bf(float f) { return bl_half_f32_to_bf16(f); }

#endif
