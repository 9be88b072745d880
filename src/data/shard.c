/* BLSHARD1 reader: memory-map a shard and validate all of it once, so that the
 * loader's hot path can read records without any check (see bl_loader.h for
 * the list of what is checked). Messages follow "shard PATH: what failed". */
#define _POSIX_C_SOURCE 200809L /* O_CLOEXEC, strdup */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_internal.h"
#include "base/open.h"

#define HDR_BYTES 80
#define FNV0      14695981039346656037ULL

_Static_assert(sizeof(bl_shard_header) == HDR_BYTES, "the shard header is 80 bytes");

static int bad(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const char *path, const char *fmt, ...) {
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return bl_set_error(BL_EFORMAT, "shard %s: %s", path, what);
}

/* Every record inside its slot, and its lengths, positions and ids in range. */
static int check_records(bl_shard *s) {
  const bl_shard_header *h = s->h;
  const int tb = s->tb;
  for (int64_t k = 0; k < s->n; k++) {
    uint64_t slot = s->offs[k + 1] - s->offs[k];
    if (slot < 8) return bad(s->path, "record %lld overruns its slot", (long long)k);
    bl_shard_record r;
    bl_shard_rec(s, k, &r);
    uint64_t need = 8 + (uint64_t)r.length * (uint64_t)tb + (uint64_t)r.num_masked * (2u + (uint64_t)tb);
    if (need > slot) return bad(s->path, "record %lld overruns its slot", (long long)k);
    if (r.length < 1 || (uint32_t)r.length > h->max_seq_length)
      return bad(s->path, "record %lld has length %d, outside 1..%u", (long long)k, r.length, h->max_seq_length);
    if (r.len_a > r.length || r.num_masked > r.length)
      return bad(s->path, "record %lld: segment A (%d) or masked count (%d) exceeds its length %d", (long long)k,
                 r.len_a, r.num_masked, r.length);
    if ((uint32_t)r.num_masked > h->max_predictions)
      return bad(s->path, "record %lld has %d masked positions, more than the header's max_predictions %u",
                 (long long)k, r.num_masked, h->max_predictions);
    if (r.next_sentence_label != 0 && r.next_sentence_label != 1)
      return bad(s->path, "record %lld: next-sentence label %d is not 0 or 1", (long long)k, r.next_sentence_label);
    for (int32_t i = 0; i < r.length; i++) {
      uint32_t id = bl_shard_token(r.tokens, tb, i);
      if (id >= h->vocab_size)
        return bad(s->path, "record %lld: token id %u at %d is outside the vocabulary of %u", (long long)k, id, i,
                   h->vocab_size);
    }
    for (int32_t j = 0; j < r.num_masked; j++) {
      uint16_t p;
      memcpy(&p, r.positions + j, 2);
      uint32_t lab = bl_shard_token(r.labels, tb, j);
      if (p >= r.length)
        return bad(s->path, "record %lld: masked position %u is past its length %d", (long long)k, p, r.length);
      if (lab >= h->vocab_size)
        return bad(s->path, "record %lld: masked label %u is outside the vocabulary", (long long)k, lab);
    }
    if (r.length > s->max_length) s->max_length = r.length;
  }
  return 0;
}

static int validate(bl_shard *s, const bl_shard_expect *ex) {
  const char *path = s->path;
  if (s->size < HDR_BYTES)
    return bad(path, "truncated: %zu bytes, smaller than the %d-byte header", s->size, HDR_BYTES);
  const bl_shard_header *h = s->h;
  if (memcmp(h->magic, "BLSHARD1", 8) != 0) return bad(path, "not a bertlua shard (wrong magic)");
  if (h->version != 1) return bad(path, "format version %u, this bertlua reads version 1", h->version);
  if (h->header_bytes != HDR_BYTES) return bad(path, "header size %u is wrong", h->header_bytes);
  /* header + 8 (N + 1) + data_bytes == size, without overflowing on a corrupt N */
  uint64_t room = (uint64_t)s->size - HDR_BYTES;
  if (h->num_instances >= room / 8 || h->data_bytes != room - 8 * (h->num_instances + 1)) {
    double need = (double)HDR_BYTES + 8.0 * ((double)h->num_instances + 1) + (double)h->data_bytes;
    return bad(path, "truncated or corrupt: header promises %.0f bytes, the file has %zu", need, s->size);
  }
  if (h->token_bytes != 2 && h->token_bytes != 4) return bad(path, "token width %u is invalid", h->token_bytes);
  if (!(h->masked_lm_prob >= 0 && h->masked_lm_prob <= 1)) /* NaN fails too */
    return bad(path, "masked_lm_prob %g is not in [0, 1]", (double)h->masked_lm_prob);
  if (bl_fnv1a64(s->base + HDR_BYTES, s->size - HDR_BYTES, FNV0) != h->checksum)
    return bad(path, "checksum mismatch: the file is corrupt");
  if (ex && ex->vocab_hash && h->vocab_hash != ex->vocab_hash)
    return bad(path, "was made with another vocabulary than %s", ex->vocab_name ? ex->vocab_name : "the one given");
  if (ex && ex->max_seq_length > 0 && h->max_seq_length > (uint32_t)ex->max_seq_length)
    return bad(path, "holds sequences of up to %u tokens, more than the %d asked for", h->max_seq_length,
               ex->max_seq_length);
  s->n = (int64_t)h->num_instances;
  s->tb = (int32_t)h->token_bytes;
  s->offs = (const uint64_t *)(s->base + HDR_BYTES);
  s->data = s->base + HDR_BYTES + 8 * (h->num_instances + 1);
  uint64_t prev = 0;
  for (int64_t k = 0; k <= s->n; k++) {
    uint64_t o = s->offs[k];
    if (o < prev || o > h->data_bytes)
      return bad(path, "offset %llu of record %lld is out of range", (unsigned long long)o, (long long)k);
    prev = o;
  }
  return check_records(s);
}

int bl_shard_open(const char *path, const bl_shard_expect *expect, bl_shard **out) {
  if (!path || !out) return bl_set_error(BL_EINVAL, "shard: path and out are required");
  *out = NULL;
  int64_t size;
  int fd = bl_open_regular(path, "shard", &size);
  if (fd < 0) return BL_EIO;
  bl_shard *s = calloc(1, sizeof *s);
  if (!s || !(s->path = strdup(path))) {
    free(s);
    close(fd);
    return bl_set_error(BL_ENOMEM, "shard %s: out of memory", path);
  }
  s->size = (size_t)size;
  if (s->size >= HDR_BYTES) {
    void *p = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      close(fd);
      free(s->path);
      free(s);
      return bl_set_error(BL_EIO, "shard %s: mmap failed: %s", path, strerror(e));
    }
    s->base = p;
    s->h = (const bl_shard_header *)p;
  }
  close(fd); /* the mapping keeps the file */
  int rc = validate(s, expect);
  if (rc != 0) {
    bl_shard_close(s);
    return rc;
  }
  *out = s;
  return 0;
}

const bl_shard_header *bl_shard_get_header(const bl_shard *s) { return s ? s->h : NULL; }
int64_t bl_shard_count(const bl_shard *s) { return s ? s->n : 0; }

int bl_shard_get_record(const bl_shard *s, int64_t k, bl_shard_record *rec) {
  if (!s || !rec) return bl_set_error(BL_EINVAL, "shard: record of a NULL shard");
  if (k < 0 || k >= s->n)
    return bl_set_error(BL_EINVAL, "shard %s: record %lld out of range 0..%lld", s->path, (long long)k,
                        (long long)s->n - 1);
  bl_shard_rec(s, k, rec);
  return 0;
}

void bl_shard_close(bl_shard *s) {
  if (!s) return;
  if (s->base) munmap((void *)s->base, s->size);
  free(s->path);
  free(s);
}
