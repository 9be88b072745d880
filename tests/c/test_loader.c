/* Shard reader and loader from C: every single-byte corruption and every
 * truncation of a shard is either refused with "shard PATH: ..." or leaves
 * all records inside the file; the prefetching loader gives the same bytes as
 * the synchronous one under random next/set_state interleavings; open/close
 * races with the thread. Run under the ASan build for memory errors and leaks
 * (ASAN_OPTIONS=detect_leaks=1 ./test_loader). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, nanosleep */
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bertlua.h"

static int failures = 0;
#define CHECK(cond, ...)                          \
  do {                                            \
    if (!(cond)) {                                \
      failures++;                                 \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                        \
      printf("\n");                               \
    }                                             \
  } while (0)

static void sleep_us(long us) {
  struct timespec ts = { 0, us * 1000 };
  nanosleep(&ts, NULL);
}

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
  rs ^= rs >> 12;
  rs ^= rs << 25;
  rs ^= rs >> 27;
  return (uint32_t)((rs * 0x2545F4914F6CDD1DULL) >> 33) % n;
}

#define VOCAB 1000
#define CLS   101
#define SEP   102
#define MASK  103

/* a valid shard of n records, 2-byte ids, into a malloc'd buffer */
static uint8_t *make_shard(int n, int dynamic, size_t *size) {
  size_t cap = 80 + 8 * (size_t)(n + 1) + (size_t)n * (8 + 64 * 2 + 10 * 4);
  uint8_t *buf = calloc(1, cap);
  uint64_t *offs = (uint64_t *)(buf + 80);
  uint8_t *data = buf + 80 + 8 * (size_t)(n + 1);
  size_t d = 0;
  for (int k = 0; k < n; k++) {
    offs[k] = d;
    uint16_t L = (uint16_t)(4 + rnd(60)), la = (uint16_t)(2 + rnd(L - 3)),
             M = dynamic ? 0 : (uint16_t)(1 + rnd(L - 2 < 10 ? L - 2 : 10));
    uint16_t hdr[3] = { L, la, M };
    memcpy(data + d, hdr, 6);
    data[d + 6] = (uint8_t)rnd(2);
    data[d + 7] = 0;
    d += 8;
    for (int i = 0; i < L; i++) {
      uint16_t id = i == 0 ? CLS : (i == la - 1 || i == L - 1) ? SEP : (uint16_t)(200 + rnd(VOCAB - 200));
      memcpy(data + d, &id, 2);
      d += 2;
    }
    for (int j = 0; j < M; j++) {
      uint16_t p = (uint16_t)(1 + rnd(L - 2));
      memcpy(data + d, &p, 2);
      d += 2;
    }
    for (int j = 0; j < M; j++) {
      uint16_t t = (uint16_t)rnd(VOCAB);
      memcpy(data + d, &t, 2);
      d += 2;
    }
  }
  offs[n] = d;
  bl_shard_header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, "BLSHARD1", 8);
  h.version = 1;
  h.header_bytes = 80;
  h.vocab_hash = 42;
  h.vocab_size = VOCAB;
  h.max_seq_length = 64;
  h.max_predictions = 10;
  h.flags = dynamic ? 1 : 0;
  h.masked_lm_prob = 0.15f;
  h.token_bytes = 2;
  h.num_instances = (uint64_t)n;
  h.data_bytes = d;
  memcpy(buf, &h, 80);
  *size = 80 + 8 * (size_t)(n + 1) + d;
  return buf;
}

static void fix_checksum(uint8_t *buf, size_t size) {
  uint64_t ck = bl_fnv1a64(buf + 80, size - 80, 14695981039346656037ULL);
  memcpy(buf + 72, &ck, 8);
}

static void write_file(const char *path, const uint8_t *buf, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, size, f) != size) {
    printf("cannot write %s\n", path);
    exit(1);
  }
  fclose(f);
}

/* open: refused with a message naming the file, or every record within the file */
static int open_checked(const char *path, size_t size) {
  bl_shard *s = NULL;
  int rc = bl_shard_open(path, NULL, &s);
  if (rc != 0) {
    char want[600];
    snprintf(want, sizeof want, "shard %s: ", path);
    CHECK(strncmp(bl_last_error(), want, strlen(want)) == 0, "message names the file: %s", bl_last_error());
    CHECK(s == NULL, "no shard on failure");
    return 0;
  }
  const uint8_t *base = (const uint8_t *)bl_shard_get_header(s), *end = base + size;
  const bl_shard_header *h = bl_shard_get_header(s);
  for (int64_t k = 0; k < bl_shard_count(s); k++) {
    bl_shard_record r;
    CHECK(bl_shard_get_record(s, k, &r) == 0, "record %lld", (long long)k);
    const uint8_t *t = r.tokens;
    const uint8_t *last = (const uint8_t *)r.labels + (size_t)r.num_masked * h->token_bytes;
    CHECK(t >= base + 80 && last <= end, "record %lld inside the file", (long long)k);
    CHECK(r.length >= 1 && (uint32_t)r.length <= h->max_seq_length && r.len_a <= r.length, "record %lld lengths",
          (long long)k);
    for (int j = 0; j < r.num_masked; j++) CHECK(r.positions[j] < r.length, "position in range");
  }
  bl_shard_record r;
  CHECK(bl_shard_get_record(s, bl_shard_count(s), &r) != 0, "record past the end refused");
  bl_shard_close(s);
  return 1;
}

static void test_corruption(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/c.blshard", dir);
  size_t size;
  uint8_t *good = make_shard(40, 0, &size);
  fix_checksum(good, size);
  write_file(path, good, size);
  CHECK(open_checked(path, size) == 1, "the valid shard opens: %s", bl_last_error());
  uint8_t *b = malloc(size);
  int refused = 0, opened = 0;
  for (size_t i = 0; i < size; i++) {
    for (int v = 0; v < 2; v++) {
      memcpy(b, good, size);
      b[i] = v ? (uint8_t)(b[i] ^ 0x5a) : 0xff;
      if (b[i] == good[i]) continue;
      if (i < 72 || i >= 80) fix_checksum(b, size); /* reach the checks behind the checksum */
      write_file(path, b, size);
      if (open_checked(path, size))
        opened++;
      else
        refused++;
    }
  }
  for (size_t n = 0; n < size; n += 1 + n / 16) {
    write_file(path, good, n);
    CHECK(open_checked(path, n) == 0, "truncated to %zu bytes is refused", n);
  }
  printf("corruptions: %d refused, %d still valid\n", refused, opened);
  CHECK(refused > (int)size, "most corruptions are refused");
  free(b);
  free(good);
  unlink(path);
}

static void expect_refused(const char *path, const char *what) {
  bl_shard *s = NULL;
  alarm(10); /* a FIFO that blocks the open fails the test instead of hanging it */
  int rc = bl_shard_open(path, NULL, &s);
  alarm(0);
  CHECK(rc != 0 && s == NULL, "%s is refused", path);
  CHECK(strstr(bl_last_error(), path) && strstr(bl_last_error(), what), "message names %s and '%s': %s", path, what,
        bl_last_error());
  bl_shard_close(s);
}

/* What is not a shard, or a shard whose labels or masking would go wrong mid-training, fails at open. */
static void test_hostile_files(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/fifo.blshard", dir);
  CHECK(mkfifo(path, 0600) == 0, "mkfifo");
  expect_refused(path, "FIFO");
  unlink(path);
  snprintf(path, sizeof path, "%s/dir.blshard", dir);
  CHECK(mkdir(path, 0700) == 0, "mkdir");
  expect_refused(path, "directory");
  rmdir(path);
  snprintf(path, sizeof path, "%s/bad.blshard", dir);
  size_t size;
  uint8_t *buf = make_shard(5, 0, &size);
  uint64_t off3;
  memcpy(&off3, buf + 80 + 8 * 3, 8);
  uint8_t *rec3 = buf + 80 + 8 * 6 + off3;
  rec3[6] = 2; /* next-sentence label */
  fix_checksum(buf, size);
  write_file(path, buf, size);
  expect_refused(path, "next-sentence label 2");
  rec3[6] = 1;
  bl_shard_header h;
  memcpy(&h, buf, 80);
  h.max_predictions = 0; /* every record masks at least one position */
  memcpy(buf, &h, 80);
  fix_checksum(buf, size);
  write_file(path, buf, size);
  expect_refused(path, "max_predictions");
  h.max_predictions = 10;
  h.masked_lm_prob = NAN;
  memcpy(buf, &h, 80);
  fix_checksum(buf, size);
  write_file(path, buf, size);
  expect_refused(path, "masked_lm_prob");
  free(buf);
  unlink(path);
}

static int same_batch(const bl_loader_batch *a, const bl_loader_batch *b) {
  const bl_tensor *x[6] = { a->input_ids,           a->token_type_ids,   a->attention_mask,
                            a->masked_lm_positions, a->masked_lm_labels, a->next_sentence_labels };
  const bl_tensor *y[6] = { b->input_ids,           b->token_type_ids,   b->attention_mask,
                            b->masked_lm_positions, b->masked_lm_labels, b->next_sentence_labels };
  for (int i = 0; i < 6; i++)
    if (x[i]->numel != y[i]->numel || x[i]->shape[0] != y[i]->shape[0] ||
        memcmp(x[i]->data, y[i]->data, (size_t)x[i]->numel * 4) != 0)
      return 0;
  return a->epoch == b->epoch && a->pos == b->pos;
}
static void free_batch(bl_loader_batch *b) {
  bl_tensor_free(b->input_ids);
  bl_tensor_free(b->token_type_ids);
  bl_tensor_free(b->attention_mask);
  bl_tensor_free(b->masked_lm_positions);
  bl_tensor_free(b->masked_lm_labels);
  bl_tensor_free(b->next_sentence_labels);
}

static void test_prefetch(const char *dir) {
  char p0[512], p1[512];
  snprintf(p0, sizeof p0, "%s/train_0.blshard", dir);
  snprintf(p1, sizeof p1, "%s/train_1.blshard", dir);
  for (int dyn = 0; dyn < 2; dyn++) {
    size_t size;
    uint8_t *buf = make_shard(57, dyn, &size);
    fix_checksum(buf, size);
    write_file(p0, buf, size);
    free(buf);
    buf = make_shard(31, dyn, &size);
    fix_checksum(buf, size);
    write_file(p1, buf, size);
    free(buf);
    const char *paths[2] = { p0, p1 };
    bl_loader_options o;
    memset(&o, 0, sizeof o);
    o.batch_size = 3;
    o.rank = 1;
    o.world_size = 2;
    o.seed = 77;
    o.shuffle = 1;
    o.max_predictions = 10;
    o.cls_id = CLS;
    o.sep_id = SEP;
    o.mask_id = MASK;
    o.vocab_size = VOCAB;
    o.bin_window = dyn ? 0 : 4;
    bl_loader *sync = NULL, *pre = NULL;
    o.prefetch = 0;
    CHECK(bl_loader_open(paths, 2, &o, &sync) == 0, "open: %s", bl_last_error());
    o.prefetch = 3;
    CHECK(bl_loader_open(paths, 2, &o, &pre) == 0, "open: %s", bl_last_error());
    if (!sync || !pre) return;
    bl_loader_info info;
    bl_loader_get_info(pre, &info);
    CHECK(info.total == 88 && info.steps_per_epoch == 14, "total %lld steps %lld", (long long)info.total,
          (long long)info.steps_per_epoch);
    int mismatches = 0;
    for (int op = 0; op < 3000; op++) {
      if (rnd(10) == 0) {
        int64_t e = rnd(4), p = rnd((uint32_t)info.steps_per_epoch + 1);
        CHECK(bl_loader_set_state(pre, e, p) == 0 && bl_loader_set_state(sync, e, p) == 0, "set_state");
        if (rnd(3) == 0) sleep_us(200); /* let the thread be anywhere: waiting, building, full */
      } else {
        bl_loader_batch a, b;
        CHECK(bl_loader_next(pre, &a) == 0 && bl_loader_next(sync, &b) == 0, "next: %s", bl_last_error());
        if (!same_batch(&a, &b)) mismatches++;
        free_batch(&a);
        free_batch(&b);
      }
      int64_t e1, p1_, e2, p2;
      bl_loader_get_state(pre, &e1, &p1_);
      bl_loader_get_state(sync, &e2, &p2);
      if (e1 != e2 || p1_ != p2) mismatches++;
    }
    CHECK(mismatches == 0, "prefetching loader == synchronous loader (%d mismatches, dynamic %d)", mismatches, dyn);
    bl_loader_stats st;
    bl_loader_get_stats(pre, &st);
    CHECK(st.batches > 2000 && st.padded >= st.tokens, "stats");
    CHECK(bl_loader_set_state(pre, 0, info.steps_per_epoch + 1) != 0, "out-of-range state refused");
    bl_loader_close(pre);
    bl_loader_close(sync);
    /* open/close races: close right after open, after one batch, with a full ring */
    for (int i = 0; i < 200; i++) {
      o.prefetch = 1 + i % 4;
      bl_loader *l = NULL;
      CHECK(bl_loader_open(paths, 2, &o, &l) == 0, "open: %s", bl_last_error());
      if (i % 3 == 1) {
        bl_loader_batch a;
        bl_loader_next(l, &a);
        free_batch(&a);
      }
      if (i % 3 == 2) sleep_us(100);
      bl_loader_close(l);
    }
  }
  /* dynamic shards without a vocabulary; a batch too big for the data */
  bl_loader_options o;
  memset(&o, 0, sizeof o);
  o.batch_size = 2;
  o.world_size = 1;
  o.mask_id = -1;
  const char *paths[1] = { p0 };
  bl_loader *l = NULL;
  CHECK(bl_loader_open(paths, 1, &o, &l) != 0 && strstr(bl_last_error(), "need vocab"), "%s", bl_last_error());
  o.batch_size = 1000;
  o.mask_id = MASK;
  o.vocab_size = VOCAB;
  CHECK(bl_loader_open(paths, 1, &o, &l) != 0 && strstr(bl_last_error(), "not enough"), "%s", bl_last_error());
  o.batch_size = 2;
  o.rank = 2;
  CHECK(bl_loader_open(paths, 1, &o, &l) != 0 && strstr(bl_last_error(), "rank 2"), "%s", bl_last_error());
  CHECK(l == NULL, "no loader on failure");
  bl_loader_close(NULL);
  unlink(p0);
  unlink(p1);
}

int main(void) {
  char dir[] = "/tmp/bl_test_loader_XXXXXX";
  if (!mkdtemp(dir)) {
    printf("mkdtemp failed\n");
    return 1;
  }
  test_corruption(dir);
  test_hostile_files(dir);
  test_prefetch(dir);
  rmdir(dir);
  if (failures) {
    printf("%d failures\n", failures);
    return 1;
  }
  printf("all loader checks passed\n");
  return 0;
}
