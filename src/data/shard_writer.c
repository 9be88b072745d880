/* BLSHARD1 writer (format and contract in bl_loader.h). The header and the
 * offsets table come before the records and the checksum covers both, so the
 * records are gathered in memory and the file is written in one go on commit,
 * through the checked atomic writer. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bl_stream.h"
#include "data_internal.h"

#define FNV0 14695981039346656037ULL

struct bl_shard_writer {
  char *path;
  bl_shard_header h;
  uint8_t *data; /* the records */
  size_t used, cap;
  uint64_t *offsets; /* offsets[k] = start of record k; one more slot for the end */
  size_t count, offsets_cap;
};

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 1024;
  while (c < need) c *= 2;
  void *q = realloc(*p, c * elem);
  if (!q) return -1;
  *p = q;
  *cap = c;
  return 0;
}

int bl_shard_writer_open(const char *path, const bl_shard_header *meta, bl_shard_writer **res) {
  if (!res) return bl_set_error(BL_EINVAL, "shard writer: no result pointer");
  *res = NULL;
  if (!path || !*path || !meta) return bl_set_error(BL_EINVAL, "shard writer: empty path or no header");
  if (meta->vocab_size == 0) return bl_set_error(BL_EINVAL, "shard %s: vocab_size is 0", path);
  bl_shard_writer *w = calloc(1, sizeof *w);
  if (!w || !(w->path = strdup(path))) {
    free(w);
    return bl_set_error(BL_ENOMEM, "shard %s: out of memory", path);
  }
  w->h = *meta;
  memcpy(w->h.magic, "BLSHARD1", 8);
  w->h.version = 1;
  w->h.header_bytes = sizeof(bl_shard_header);
  w->h.token_bytes = meta->vocab_size <= 65535 ? 2 : 4;
  *res = w;
  return 0;
}

static void put(bl_shard_writer *w, const void *src, size_t n) {
  memcpy(w->data + w->used, src, n);
  w->used += n;
}

static void put_ids(bl_shard_writer *w, const int32_t *ids, int32_t n) {
  for (int32_t i = 0; i < n; i++) {
    if (w->h.token_bytes == 2) {
      uint16_t v = (uint16_t)ids[i];
      put(w, &v, 2);
    } else {
      uint32_t v = (uint32_t)ids[i];
      put(w, &v, 4);
    }
  }
}

static int bad_ids(const bl_shard_writer *w, const char *what, const int32_t *ids, int32_t n, int64_t limit) {
  for (int32_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= limit)
      return bl_set_error(BL_EINVAL, "shard %s: record %zu: %s[%d] = %d is outside [0, %lld)", w->path, w->count, what,
                          i, ids[i], (long long)limit);
  return 0;
}

int bl_shard_writer_add(bl_shard_writer *w, int32_t length, int32_t len_a, int32_t next_sentence_label,
                        const int32_t *tokens, int32_t num_masked, const int32_t *positions, const int32_t *labels) {
  if (!w) return bl_set_error(BL_EINVAL, "shard writer: NULL writer");
  int32_t max_len = (int32_t)(w->h.max_seq_length && w->h.max_seq_length < 65535 ? w->h.max_seq_length : 65535);
  if (length < 1 || length > max_len || len_a < 0 || len_a > length || num_masked < 0 || num_masked > length)
    return bl_set_error(BL_EINVAL, "shard %s: record %zu: length %d, len_a %d, %d masked do not fit (length 1..%d)",
                        w->path, w->count, length, len_a, num_masked, max_len);
  if ((length && !tokens) || (num_masked && (!positions || !labels)))
    return bl_set_error(BL_EINVAL, "shard %s: record %zu: missing token, position or label array", w->path, w->count);
  BL_CHECK(bad_ids(w, "token", tokens, length, w->h.vocab_size));
  BL_CHECK(bad_ids(w, "position", positions, num_masked, length));
  BL_CHECK(bad_ids(w, "label", labels, num_masked, w->h.vocab_size));
  size_t tb = w->h.token_bytes, bytes = 8 + tb * (size_t)length + (2 + tb) * (size_t)num_masked;
  if (grow((void **)&w->data, &w->cap, w->used + bytes, 1) ||
      grow((void **)&w->offsets, &w->offsets_cap, w->count + 2, sizeof *w->offsets))
    return bl_set_error(BL_ENOMEM, "shard %s: out of memory at record %zu", w->path, w->count);
  w->offsets[w->count++] = w->used;
  uint16_t head[3] = { (uint16_t)length, (uint16_t)len_a, (uint16_t)num_masked };
  uint8_t nsp[2] = { (uint8_t)next_sentence_label, 0 };
  put(w, head, sizeof head);
  put(w, nsp, 2);
  put_ids(w, tokens, length);
  for (int32_t i = 0; i < num_masked; i++) {
    uint16_t p = (uint16_t)positions[i];
    put(w, &p, 2);
  }
  put_ids(w, labels, num_masked);
  return 0;
}

static void release(bl_shard_writer *w) {
  free(w->data);
  free(w->offsets);
  free(w->path);
  free(w);
}

void bl_shard_writer_abort(bl_shard_writer *w) {
  if (w) release(w);
}

int bl_shard_writer_commit(bl_shard_writer *w) {
  if (!w) return bl_set_error(BL_EINVAL, "shard writer: NULL writer");
  if (grow((void **)&w->offsets, &w->offsets_cap, w->count + 1, sizeof *w->offsets)) {
    release(w);
    return bl_set_error(BL_ENOMEM, "shard: out of memory");
  }
  w->offsets[w->count] = w->used;
  size_t table = 8 * (w->count + 1);
  w->h.num_instances = w->count;
  w->h.data_bytes = w->used;
  w->h.checksum = bl_fnv1a64(w->data, w->used, bl_fnv1a64(w->offsets, table, FNV0));
  bl_writer *out = NULL;
  int rc = bl_writer_open(w->path, &out);
  if (rc == 0 && (rc = bl_writer_write(out, &w->h, sizeof w->h)) == 0 &&
      (rc = bl_writer_write(out, w->offsets, (int64_t)table)) == 0 &&
      (rc = bl_writer_write(out, w->data, (int64_t)w->used)) == 0)
    rc = bl_writer_commit(out);
  else if (rc != 0 && out)
    bl_writer_abort(out);
  release(w);
  return rc;
}
