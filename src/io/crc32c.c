/* CRC-32C (TensorFlow/LevelDB checksums) and CRC-32 (zip). Both are the
 * reflected CRC with init/final xor 0xffffffff; only the polynomial differs.
 * Software path: slicing-by-8 tables (about 1-2 GB/s, so checking a
 * BERT-large checkpoint costs well under a second). CRC-32C uses the SSE4.2
 * crc32 instruction when the CPU has it. */
#include <pthread.h>
#include <string.h>
#include "ckpt_internal.h"
#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#define POLY_CRC32C 0x82f63b78u
#define POLY_CRC32  0xedb88320u

static uint32_t tab_c[8][256], tab_z[8][256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void fill(uint32_t t[8][256], uint32_t poly) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (poly & (0u - (c & 1)));
    t[0][i] = c;
  }
  for (int s = 1; s < 8; s++)
    for (int i = 0; i < 256; i++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
}

static void init_tables(void) {
  fill(tab_c, POLY_CRC32C);
  fill(tab_z, POLY_CRC32);
}

static uint32_t slice8(uint32_t t[8][256], uint32_t crc, const unsigned char *p, size_t n) {
  crc = ~crc;
  while (n >= 8) {
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
    lo ^= crc; /* little-endian hosts only (x86-64, aarch64), as the rest of bertlua */
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][hi & 0xff] ^
          t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) {
  uint64_t c = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = (uint32_t)c;
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}
#endif

uint32_t bl_crc32c_sw(uint32_t crc, const void *data, size_t n) {
  pthread_once(&tables_once, init_tables);
  return slice8(tab_c, crc, data, n);
}

uint32_t bl_crc32c(uint32_t crc, const void *data, size_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return crc32c_hw(crc, data, n);
#endif
  return bl_crc32c_sw(crc, data, n);
}

uint32_t bl_crc32(uint32_t crc, const void *data, size_t n) {
  pthread_once(&tables_once, init_tables);
  return slice8(tab_z, crc, data, n);
}
