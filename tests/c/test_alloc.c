/* The CPU block cache (src/tensor/alloc.c): a freed large tensor's block is
 * reused by the next tensor of its size class without a new mapping, the free
 * blocks stay under the limit (oldest unmapped first), release gives them all
 * back, every byte of a tensor is usable, and concurrent allocation from
 * OpenMP threads keeps the books straight. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bertlua.h"
#include "check.h"

#define MIB ((int64_t)1 << 20)

static bl_cpu_cache_stats stats(void) {
  bl_cpu_cache_stats s;
  bl_cpu_cache_get_stats(&s);
  return s;
}

static bl_tensor *bytes_tensor(int64_t n) {
  bl_tensor *t = NULL;
  OK(bl_tensor_empty(1, &n, BL_U8, -1, &t));
  return t;
}

/* fills every byte with a pattern of (seed, index) and checks it back */
static int pattern_ok(bl_tensor *t, unsigned seed) {
  uint8_t *p = t->data;
  for (int64_t i = 0; i < t->numel; i++) p[i] = (uint8_t)(i * 131 + seed);
  for (int64_t i = 0; i < t->numel; i++)
    if (p[i] != (uint8_t)(i * 131 + seed)) return 0;
  return ((uintptr_t)t->data & 63) == 0;
}

static void test_reuse(void) {
  OK(bl_cpu_cache_set_limit(64 * MIB));
  bl_cpu_cache_stats s0 = stats();
  bl_tensor *a = bytes_tensor(4 * MIB), *small = bytes_tensor(1000);
  CHECK(pattern_ok(a, 1) && pattern_ok(small, 2), "every byte of a large and a small tensor is usable");
  bl_cpu_cache_stats s1 = stats();
  CHECK(s1.maps == s0.maps + 1, "one mapping for the large tensor, none for the small: %lld",
        (long long)(s1.maps - s0.maps));
  void *pa = a->data;
  bl_tensor_free(a);
  bl_tensor_free(small);
  CHECK(stats().cached_bytes == s0.cached_bytes + 4 * MIB, "the freed 4 MiB block is cached");
  /* 4,160,000 bytes lie in the class of 4 MiB (3.5 MiB < n <= 4 MiB): the same block comes back */
  bl_tensor *b = bytes_tensor(4160000);
  bl_cpu_cache_stats s2 = stats();
  CHECK(b->data == pa && s2.maps == s1.maps && s2.hits == s1.hits + 1, "same class reuses the block");
  CHECK(pattern_ok(b, 3), "reused block usable");
  /* 3 MiB is another class: a new mapping, and the 4 MiB block stays cached for its class */
  bl_tensor *c = bytes_tensor(3 * MIB);
  CHECK(stats().maps == s2.maps + 1 && c->data != pa, "another class maps its own block");
  bl_tensor_free(b);
  bl_tensor_free(c);
  CHECK(bl_cpu_cache_release() == 7 * MIB, "release gives back both free blocks");
  bl_cpu_cache_stats s3 = stats();
  CHECK(s3.cached_bytes == 0 && s3.mapped_bytes == s0.mapped_bytes - s0.cached_bytes,
        "nothing cached or mapped after release: %lld / %lld", (long long)s3.cached_bytes, (long long)s3.mapped_bytes);
}

static void test_limit(void) {
  bl_cpu_cache_release();
  OK(bl_cpu_cache_set_limit(10 * MIB));
  bl_tensor *t[6];
  for (int i = 0; i < 6; i++) t[i] = bytes_tensor(4 * MIB);
  bl_cpu_cache_stats s0 = stats();
  for (int i = 0; i < 6; i++) bl_tensor_free(t[i]);
  bl_cpu_cache_stats s1 = stats();
  CHECK(s1.cached_bytes == 8 * MIB && s1.unmaps == s0.unmaps + 4,
        "10 MiB bound: two 4 MiB blocks kept, four unmapped (cached %lld, unmapped %lld)", (long long)s1.cached_bytes,
        (long long)(s1.unmaps - s0.unmaps));
  bl_tensor *big = bytes_tensor(16 * MIB);
  bl_tensor_free(big);
  CHECK(stats().cached_bytes == 8 * MIB, "a block larger than the bound is unmapped at once");
  OK(bl_cpu_cache_set_limit(4 * MIB));
  CHECK(stats().cached_bytes == 4 * MIB, "lowering the bound trims the cache");
  OK(bl_cpu_cache_set_limit(0));
  CHECK(stats().cached_bytes == 0, "bound 0 caches nothing");
  bl_tensor *u = bytes_tensor(4 * MIB);
  bl_tensor_free(u);
  CHECK(stats().cached_bytes == 0, "bound 0: a freed block is unmapped");
  CHECK(bl_cpu_cache_set_limit(-1) != 0 && strstr(bl_last_error(), "cpu_cache_set_limit"),
        "a negative bound is an error naming the call");
}

/* classes from 256 KiB to 64 MiB: sizes just above, at and below class edges all hold their bytes */
static void test_classes(void) {
  OK(bl_cpu_cache_set_limit(256 * MIB));
  int bad = 0;
  for (int64_t n = 256 << 10; n <= 64 * MIB; n = n * 5 / 4 + 4093) {
    int64_t sizes[3] = { n - 1, n, n + 1 };
    for (int j = 0; j < 3; j++) {
      bl_tensor *t = bytes_tensor(sizes[j]);
      if (!t || !pattern_ok(t, (unsigned)j)) bad++;
      bl_tensor_free(t);
    }
  }
  CHECK(bad == 0, "%d sizes not fully usable", bad);
  bl_cpu_cache_release();
}

static void test_threads(void) {
  OK(bl_cpu_cache_set_limit(48 * MIB));
  int64_t before = bl_storage_bytes_in_use();
  int bad = 0;
#pragma omp parallel for reduction(+ : bad) num_threads(4)
  for (int i = 0; i < 200; i++) {
    bl_tensor *t = NULL;
    int64_t n = (int64_t)(256 << 10) * (1 + i % 7);
    if (bl_tensor_empty(1, &n, BL_U8, -1, &t) != 0) {
      bad++;
      continue;
    }
    if (!pattern_ok(t, (unsigned)i)) bad++;
    bl_tensor_free(t);
  }
  CHECK(bad == 0, "%d concurrent allocations failed or were corrupted", bad);
  bl_cpu_cache_stats s = stats();
  CHECK(bl_storage_bytes_in_use() == before, "bytes in use back to where they were");
  CHECK(s.cached_bytes <= s.limit_bytes && s.cached_bytes <= s.mapped_bytes, "books consistent after threads");
  bl_cpu_cache_release();
  CHECK(stats().mapped_bytes == 0, "every block unmapped after release: %lld", (long long)stats().mapped_bytes);
}

int main(void) {
  test_reuse();
  test_limit();
  test_classes();
  test_threads();
  if (!failures) printf("ok\n");
  return failures != 0;
}
