/* AMX tile set-up shared by the bf16 and int8 inference GEMMs (gemm_bf16.c,
 * gemm_int8.c): eight tiles of 16 rows x 64 bytes (palette 1). Their 32 x 32
 * C block is four accumulator tiles (0-3: rows 0-15 / 16-31 x columns 0-15 /
 * 16-31), two A tiles (4, 5: 16 rows x 64 bytes of k, row-major) and two B
 * tiles (6, 7: 16 rows of k groups x 16 columns, read from the weight's
 * 32-column panels with a row stride of 128 bytes). Tile state is per thread:
 * every thread that runs tile instructions loads the configuration first and
 * releases the tiles when done. Only under OPX_MULTI_ISA (GCC, no sanitizer). */
#ifndef BL_OPS_AMX_H
#define BL_OPS_AMX_H
#include "base/vecmath.h"
#if OPX_MULTI_ISA
#include <immintrin.h>
#include <stdint.h>
#define AMX_TARGET __attribute__((target("arch=x86-64-v4,avx512bf16,avx512vnni,amx-tile,amx-bf16,amx-int8")))

enum { AMX_KB = 64 /* bytes of k per tile row */ };

/* palette 1, tiles 0-7 of 16 rows x 64 bytes; a constant in memory (GCC 12 dropped the stores that built
 * it on the stack before ldtilecfg, which it does not see read them) */
static const struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_cfg __attribute__((aligned(64))) = {
  1, 0, { 0 }, { AMX_KB, AMX_KB, AMX_KB, AMX_KB, AMX_KB, AMX_KB, AMX_KB, AMX_KB }, { 16, 16, 16, 16, 16, 16, 16, 16 }
};

AMX_TARGET static inline void amx_tiles_on(void) { _tile_loadconfig(&amx_cfg); }

AMX_TARGET static inline void amx_tiles_off(void) { _tile_release(); }
#endif
#endif
