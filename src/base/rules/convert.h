/* Conversions of a double to the integer dtypes, as bl_store (src/base/internal.h) and the kernels' generic store
 * (kernels/elementwise.cu) write them: out-of-range values saturate and NaN becomes 0, instead of the undefined
 * behaviour of a C cast. */
#ifndef BL_RULES_CONVERT_H
#define BL_RULES_CONVERT_H
#include <stdint.h>
#include "hd.h"

BL_HD int32_t bl_d2i32(double v) {
  return v != v ? 0 : v >= 2147483647.0 ? INT32_MAX : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
}
BL_HD int64_t bl_d2i64(double v) {
  return v != v ? 0 : v >= 9.2233720368547758e18 ? INT64_MAX : v <= -9.2233720368547758e18 ? INT64_MIN : (int64_t)v;
}
BL_HD uint8_t bl_d2u8(double v) { return v != v ? 0 : v >= 255.0 ? 255 : v <= 0 ? 0 : (uint8_t)v; }
#endif
