/* The exported f16/bf16 conversions (bl_tensor.h): the converter of half.h. */
#include "bl_tensor.h"
#include "base/half.h"

uint16_t bl_f32_to_bf16(float x) { return bl_half_f32_to_bf16(x); }
float bl_bf16_to_f32(uint16_t h) { return bl_half_bf16_to_f32(h); }
uint16_t bl_f32_to_f16(float x) { return bl_half_f32_to_f16(x); }
float bl_f16_to_f32(uint16_t h) { return bl_half_f16_to_f32(h); }
