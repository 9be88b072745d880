/* AMX tile set-up shared by the bf16 and int8 inference GEMMs (gemm_bf16.c,
 * gemm_int8.c): eight tiles of 16 rows x 64 bytes (palette 1). Their 32 x 32
 * C block is four accumulator tiles (0-3: rows 0-15 / 16-31 x columns 0-15 /
 * 16-31), two A tiles (4, 5: 16 rows x 64 bytes of k, row-major) and two B
 * tiles (6, 7: 16 rows of k groups x 16 columns, read from the weight's
 * 32-column panels with a row stride of 128 bytes). Tile state is per thread:
 * every thread that runs tile instructions loads the configuration first and
 * releases the tiles when done. Also shared: the prefetch of what the driver
 * reads next, run inside the tile loop (amx_pf), and the streaming of large
 * outputs (amx_stream). Only under OPX_MULTI_ISA (GCC, no sanitizer). */
#ifndef BL_OPS_AMX_H
#define BL_OPS_AMX_H
#include "base/vecmath.h"
#if OPX_MULTI_ISA
#include <immintrin.h>
#include <stdint.h>
#define AMX_TARGET __attribute__((target("arch=x86-64-v4,avx512bf16,avx512vnni,amx-tile,amx-bf16,amx-int8")))

/* AMX_KB: bytes of k per tile row; AMX_BIG_BYTES: an f32 A or C larger than this (twice a core's L2 here) is not
 * in L2: A's rows are prefetched (amx_pf), C is streamed (amx_stream) */
enum { AMX_KB = 64, AMX_BIG_BYTES = 4 << 20 };

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

/* A prefetch stream run inside a block's tile loop, `per_step` 64-byte lines per step of k, into L2: the f32 rows
 * of A the driver converts next, so that the conversion finds them in L2 instead of waiting on memory while the
 * tiles stand idle. `rows` rows of `bytes` bytes, `stride` bytes apart. (The next packed block of a later chunk
 * of B is better left to the hardware: prefetched too, it cost 6 % at 4096 x 768 x 3072.) */
typedef struct amx_pf {
  const char *p;
  int64_t stride, bytes, rows, r, off, per_step;
} amx_pf;

/* the stream spread over about `steps` steps */
static inline amx_pf amx_pf_of(const void *p, int64_t stride, int64_t bytes, int64_t rows, int64_t steps) {
  int64_t lines = rows * ((bytes + 63) / 64);
  return (amx_pf){ (const char *)p, stride, bytes, rows, 0, 0, steps > 0 ? lines / steps + 1 : lines };
}

static inline void amx_pf_step(amx_pf *f) {
  for (int64_t q = 0; q < f->per_step && f->r < f->rows; q++) {
    _mm_prefetch(f->p + f->r * f->stride + f->off, _MM_HINT_T1);
    f->off += 64;
    if (f->off >= f->bytes) f->off = 0, f->r++;
  }
}

/* Outputs past AMX_BIG_BYTES go out by non-temporal stores: through the caches, read for ownership, they push
 * out the B panels and A rows the next blocks read. A block streams when it is whole and its rows 64-byte
 * aligned. */
static inline int amx_streams(int stream, const float *c, int64_t ldc, int64_t rows, int64_t cols) {
  return stream && rows == 32 && cols == 32 && (uintptr_t)c % 64 == 0 && ldc % 16 == 0;
}

/* the 32 x 32 f32 block t (row stride 32) into c (row stride ldc), by non-temporal stores */
AMX_TARGET static inline void amx_stream(float *c, int64_t ldc, const float *t) {
  for (int64_t r = 0; r < 32; r++) {
    _mm512_stream_ps(c + r * ldc, _mm512_load_ps(t + r * 32));
    _mm512_stream_ps(c + r * ldc + 16, _mm512_load_ps(t + r * 32 + 16));
  }
}

/* name(kt, a0, a1, as, ars, b, c, ldc, pf): C (32 x 32 of CT, row stride ldc) = the A tiles from a0 (rows 0-15)
 * and a1 (16-31), tile t at a0 + t * as (32-bit words) with a row stride of ars bytes (a packed panel
 * [kt][16 rows][64 bytes]: as = 256, ars = 64; row-major rows of A: as = 16, ars = A's row bytes), x one
 * 32-column B panel b (row stride 128 bytes) over kt tiles of k, by
 * the tile product DP (_tile_dpbf16ps, _tile_dpbusd), with a step of pf (NULL: none) at each k. Each load comes
 * right after the last reader of its tile (a tile is not renamed: a load waits for them). */
#define AMX_BLOCK(name, DP, CT)                                                                            \
  AMX_TARGET static void name(int64_t kt, const uint32_t *a0, const uint32_t *a1, int64_t as, int64_t ars, \
                              const uint32_t *b, CT *c, int64_t ldc, amx_pf *pf) {                         \
    _tile_zero(0);                                                                                         \
    _tile_zero(1);                                                                                         \
    _tile_zero(2);                                                                                         \
    _tile_zero(3);                                                                                         \
    _tile_loadd(4, a0, ars);                                                                               \
    _tile_loadd(6, b, 128);                                                                                \
    _tile_loadd(7, b + 16, 128);                                                                           \
    _tile_loadd(5, a1, ars);                                                                               \
    for (int64_t t = 1; t < kt; t++) {                                                                     \
      DP(0, 4, 6);                                                                                         \
      DP(1, 4, 7);                                                                                         \
      _tile_loadd(4, a0 + t * as, ars);                                                                    \
      DP(2, 5, 6);                                                                                         \
      _tile_loadd(6, b + t * 16 * 32, 128);                                                                \
      DP(3, 5, 7);                                                                                         \
      _tile_loadd(5, a1 + t * as, ars);                                                                    \
      _tile_loadd(7, b + t * 16 * 32 + 16, 128);                                                           \
      if (pf) amx_pf_step(pf);                                                                             \
    }                                                                                                      \
    DP(0, 4, 6);                                                                                           \
    DP(1, 4, 7);                                                                                           \
    DP(2, 5, 6);                                                                                           \
    DP(3, 5, 7);                                                                                           \
    _tile_stored(0, c, ldc * 4);                                                                           \
    _tile_stored(1, c + 16, ldc * 4);                                                                      \
    _tile_stored(2, c + 16 * ldc, ldc * 4);                                                                \
    _tile_stored(3, c + 16 * ldc + 16, ldc * 4);                                                           \
  }
#endif
#endif
