/* TensorFlow TensorBundle reader (tf.train.Saver / tf.train.Checkpoint V2 format).
 *
 * PREFIX.index is a LevelDB-style SSTable: data blocks of key/value entries
 * (keys delta-encoded against the previous key, a restart-point array and its
 * count at the end), each block followed by a 5-byte trailer (compression
 * type, masked crc32c of block + type); an index block whose values are the
 * data blocks' handles; a 48-byte footer (metaindex and index handles as
 * varints, padding, the table magic). Key "" holds the BundleHeaderProto, the
 * other keys are tensor names with a BundleEntryProto each. Protobufs are
 * parsed by hand from the wire format; unknown fields are skipped. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt_internal.h"

#define WHAT            "tf checkpoint"
#define TABLE_MAGIC     0xdb4775248b80fb57ull
#define MAX_INDEX_BYTES (1ll << 30)
#define MAX_SHARDS      100000
#define MASK_DELTA      0xa282ead8u

typedef struct {
  bl_ckpt *c;
  const char *ipath; /* the .index path */
  const uint8_t *buf;
  int64_t size;
  int num_shards; /* -1 until the header is seen */
  char *prev_key;
  size_t prev_len;
  int have_prev;
} tf_reader;

static uint32_t unmask(uint32_t m) {
  uint32_t r = m - MASK_DELTA;
  return (r >> 17) | (r << 15);
}
static uint32_t le32(const uint8_t *p) {
  return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* varint at *p (< end): 0 ok, -1 truncated or longer than 10 bytes */
static int varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  uint64_t r = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*p >= end) return -1;
    uint8_t b = *(*p)++;
    r |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = r;
      return 0;
    }
  }
  return -1;
}

static int ferr(tf_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int ferr(tf_reader *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = bl_ckpt_vfail_(WHAT, r->ipath, fmt, ap);
  va_end(ap);
  return rc;
}

/* One protobuf field: number, wire type, and its value (varint/fixed) or bytes. */
typedef struct {
  uint32_t num;
  int wire;
  uint64_t v;
  const uint8_t *data;
  uint64_t len;
} pb_field;

/* 1: a field was read, 0: end of message, -1: malformed */
static int pb_next(const uint8_t **p, const uint8_t *end, pb_field *f) {
  if (*p == end) return 0;
  uint64_t key;
  if (varint(p, end, &key) || key >> 32) return -1;
  f->num = (uint32_t)(key >> 3);
  f->wire = (int)(key & 7);
  switch (f->wire) {
    case 0: return varint(p, end, &f->v) ? -1 : 1;
    case 1:
      if (end - *p < 8) return -1;
      f->v = (uint64_t)le32(*p) | (uint64_t)le32(*p + 4) << 32;
      *p += 8;
      return 1;
    case 5:
      if (end - *p < 4) return -1;
      f->v = le32(*p);
      *p += 4;
      return 1;
    case 2:
      if (varint(p, end, &f->len) || f->len > (uint64_t)(end - *p)) return -1;
      f->data = *p;
      *p += f->len;
      return 1;
    default: return -1; /* groups are not used by these messages */
  }
}

static int parse_header(tf_reader *r, const uint8_t *p, const uint8_t *end) {
  pb_field f;
  int k, endian = 0;
  int64_t shards = 1;
  while ((k = pb_next(&p, end, &f)) == 1) {
    if (f.num == 1 && f.wire == 0)
      shards = (int64_t)f.v;
    else if (f.num == 2 && f.wire == 0)
      endian = (int)f.v;
  }
  if (k < 0) return ferr(r, "the bundle header (key \"\") is not a valid BundleHeaderProto");
  if (endian != 0) return ferr(r, "the tensors are stored big-endian (%d); only little-endian is read", endian);
  if (shards < 1 || shards > MAX_SHARDS) return ferr(r, "the header says %lld data shards", (long long)shards);
  r->num_shards = (int)shards;
  return 0;
}

static void set_dtype(bl_ckpt_item *it, uint64_t dt) {
  static const struct {
    int tf;
    int bl;
    const char *name;
  } map[] = {
    { 1, BL_F32, "DT_FLOAT" },   { 2, BL_F64, "DT_DOUBLE" }, { 3, BL_I32, "DT_INT32" },      { 4, BL_U8, "DT_UINT8" },
    { 5, -1, "DT_INT16" },       { 6, -1, "DT_INT8" },       { 7, -1, "DT_STRING" },         { 8, -1, "DT_COMPLEX64" },
    { 9, BL_I64, "DT_INT64" },   { 10, BL_BOOL, "DT_BOOL" }, { 14, BL_BF16, "DT_BFLOAT16" }, { 17, -1, "DT_UINT16" },
    { 18, -1, "DT_COMPLEX128" }, { 19, BL_F16, "DT_HALF" },  { 20, -1, "DT_RESOURCE" },      { 21, -1, "DT_VARIANT" },
    { 22, -1, "DT_UINT32" },     { 23, -1, "DT_UINT64" },
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if ((uint64_t)map[i].tf == dt) {
      it->dtype = map[i].bl;
      snprintf(it->src_dtype, sizeof it->src_dtype, "%s", map[i].name);
      return;
    }
  it->dtype = -1;
  snprintf(it->src_dtype, sizeof it->src_dtype, "DataType %llu", (unsigned long long)dt);
}

static int terr(tf_reader *r, const bl_ckpt_item *it, const char *msg) {
  return bl_set_error(BL_EFORMAT, WHAT ": %s: tensor '%s': %s", r->ipath, it->name, msg);
}

static int parse_shape(tf_reader *r, bl_ckpt_item *it, const uint8_t *p, const uint8_t *end) {
  pb_field f, g;
  int k;
  while ((k = pb_next(&p, end, &f)) == 1) {
    if (f.num == 3 && f.wire == 0 && f.v) return terr(r, it, "shape has unknown rank");
    if (f.num != 2 || f.wire != 2) continue;
    if (it->ndim == BL_MAX_DIMS) return terr(r, it, "shape has more than 8 dims");
    const uint8_t *q = f.data, *qe = f.data + f.len;
    int64_t size = 0;
    int kk;
    while ((kk = pb_next(&q, qe, &g)) == 1)
      if (g.num == 1 && g.wire == 0) size = (int64_t)g.v;
    if (kk < 0) return terr(r, it, "malformed shape dimension");
    if (size < 0) return terr(r, it, "shape has a negative (unknown) dimension");
    it->shape[it->ndim++] = size;
  }
  return k < 0 ? terr(r, it, "malformed shape") : 0;
}

typedef struct {
  uint64_t shard, offset, size;
} tf_loc;

static int parse_entry(tf_reader *r, bl_ckpt_item *it, tf_loc *loc, const uint8_t *p, const uint8_t *end) {
  pb_field f;
  int k, have_crc = 0;
  set_dtype(it, 0);
  while ((k = pb_next(&p, end, &f)) == 1) {
    if (f.num == 1 && f.wire == 0)
      set_dtype(it, f.v);
    else if (f.num == 2 && f.wire == 2)
      BL_CHECK(parse_shape(r, it, f.data, f.data + f.len));
    else if (f.num == 3 && f.wire == 0)
      loc->shard = f.v;
    else if (f.num == 4 && f.wire == 0)
      loc->offset = f.v;
    else if (f.num == 5 && f.wire == 0)
      loc->size = f.v;
    else if (f.num == 6 && f.wire == 5) {
      it->crc = unmask((uint32_t)f.v);
      have_crc = 1;
    } else if (f.num == 7 && f.wire == 2)
      return terr(r, it, "is a partitioned (sliced) variable; re-save the checkpoint without partitioning");
  }
  if (k < 0) return terr(r, it, "malformed BundleEntryProto");
  it->crc_kind = have_crc ? BL_CRC_32C : BL_CRC_NONE;
  int64_t s = 1; /* row-major strides */
  for (int d = it->ndim - 1; d >= 0; d--) {
    it->stride[d] = s;
    s *= it->shape[d] ? it->shape[d] : 1;
  }
  return 0;
}

/* The block at handle (offset, size): checks the trailer; *out and *n: its contents. */
static int read_block(tf_reader *r, uint64_t off, uint64_t size, const uint8_t **out, int64_t *n) {
  if (off > (uint64_t)r->size || size > (uint64_t)r->size - off || (uint64_t)r->size - off - size < 5)
    return ferr(r, "a block handle (offset %llu, %llu bytes) points past the end of the file: truncated index?",
                (unsigned long long)off, (unsigned long long)size);
  const uint8_t *b = r->buf + off;
  uint8_t type = b[size];
  uint32_t want = unmask(le32(b + size + 1));
  uint32_t got = bl_crc32c(bl_crc32c(0, b, size), &type, 1);
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION /* the fuzz targets skip it to reach the parser */
  if (got != want)
    return ferr(r, "block at offset %llu fails its crc32c check: the index is corrupt", (unsigned long long)off);
#else
  (void)got;
  (void)want;
#endif
  if (type != 0)
    return ferr(r, "block at offset %llu is compressed; TensorFlow writes bundles uncompressed",
                (unsigned long long)off);
  *out = b;
  *n = (int64_t)size;
  return 0;
}

typedef int (*entry_fn)(tf_reader *r, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen);

/* Calls fn for every key/value of a block, rebuilding delta-encoded keys. */
static int walk_block(tf_reader *r, const uint8_t *b, int64_t n, int64_t at, entry_fn fn) {
  if (n < 4) return ferr(r, "block at offset %lld is too short for its restart count", (long long)at);
  uint32_t restarts = le32(b + n - 4);
  if ((uint64_t)restarts + 1 > (uint64_t)n / 4)
    return ferr(r, "block at offset %lld has an impossible restart count", (long long)at);
  const uint8_t *p = b, *end = b + n - 4 * ((int64_t)restarts + 1);
  char *key = NULL;
  size_t klen = 0;
  int rc = 0;
  while (p < end && rc == 0) {
    uint64_t shared, nonshared, vlen;
    if (varint(&p, end, &shared) || varint(&p, end, &nonshared) || varint(&p, end, &vlen) || shared > klen ||
        nonshared > (uint64_t)(end - p) || vlen > (uint64_t)(end - p) - nonshared) {
      rc = ferr(r, "malformed entry in the block at offset %lld", (long long)at);
      break;
    }
    char *nk = realloc(key, shared + nonshared + 1);
    if (!nk) {
      rc = bl_set_error(BL_ENOMEM, WHAT ": %s: out of memory", r->ipath);
      break;
    }
    key = nk;
    memcpy(key + shared, p, nonshared);
    klen = shared + nonshared;
    p += nonshared;
    rc = fn(r, (const uint8_t *)key, klen, p, vlen);
    p += vlen;
  }
  free(key);
  return rc;
}

static int on_tensor(tf_reader *r, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen) {
  /* keys must be strictly increasing, as in any SSTable: a cheap check against corruption */
  if (r->have_prev) {
    size_t m = klen < r->prev_len ? klen : r->prev_len;
    int cmp = memcmp(key, r->prev_key, m);
    if (cmp < 0 || (cmp == 0 && klen <= r->prev_len))
      return ferr(r, "keys are out of order after '%s': the index is corrupt", r->prev_key);
  }
  char *pk = realloc(r->prev_key, klen + 1);
  if (!pk) return bl_set_error(BL_ENOMEM, WHAT ": %s: out of memory", r->ipath);
  memcpy(pk, key, klen);
  pk[klen] = 0;
  r->prev_key = pk;
  r->prev_len = klen;
  r->have_prev = 1;
  if (klen == 0) return parse_header(r, val, val + vlen);
  if (r->num_shards < 0) return ferr(r, "no bundle header before the first tensor");
  if (memchr(key, 0, klen)) return ferr(r, "a tensor name contains a NUL byte");
  bl_ckpt_item *it = bl_ckpt_add_(r->c, (const char *)key, klen);
  if (!it) return BL_ENOMEM;
  tf_loc loc = { 0, 0, 0 };
  BL_CHECK(parse_entry(r, it, &loc, val, val + vlen));
  if (loc.shard >= (uint64_t)r->num_shards) return terr(r, it, "shard id is beyond the header's shard count");
  it->file = (int)loc.shard;
  if (loc.offset > (uint64_t)INT64_MAX || loc.size > (uint64_t)INT64_MAX) return terr(r, it, "absurd offset or size");
  it->region_off = (int64_t)loc.offset;
  it->region_len = (int64_t)loc.size;
  if (it->dtype >= 0) {
    int64_t numel = bl_ckpt_numel_(it->ndim, it->shape), nb;
    if (numel < 0 || __builtin_mul_overflow(numel, (int64_t)bl_dtype_size(it->dtype), &nb) || nb != it->region_len) {
      char msg[160];
      snprintf(msg, sizeof msg, "its shape and %s need %lld bytes but the entry says %lld", it->src_dtype,
               numel < 0 ? -1ll : (long long)numel * bl_dtype_size(it->dtype), (long long)it->region_len);
      return terr(r, it, msg);
    }
  }
  return 0;
}

static int on_index(tf_reader *r, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen) {
  (void)key;
  (void)klen;
  const uint8_t *p = val, *end = val + vlen;
  uint64_t off, size;
  if (varint(&p, end, &off) || varint(&p, end, &size)) return ferr(r, "malformed block handle in the index block");
  const uint8_t *b;
  int64_t n;
  BL_CHECK(read_block(r, off, size, &b, &n));
  return walk_block(r, b, n, (int64_t)off, on_tensor);
}

static int check_shards(tf_reader *r, const char *prefix) {
  bl_ckpt *c = r->c;
  size_t n = strlen(prefix) + 40;
  char *path = malloc(n);
  if (!path) return bl_set_error(BL_ENOMEM, WHAT ": out of memory");
  int rc = 0;
  for (int s = 0; s < r->num_shards && rc == 0; s++) {
    snprintf(path, n, "%s.data-%05d-of-%05d", prefix, s, r->num_shards);
    rc = bl_ckpt_add_file_(c, path);
    if (rc) {
      char why[600];
      snprintf(why, sizeof why, "%s", bl_last_error());
      rc = bl_set_error(rc, WHAT ": %s: data shard %d of %d is missing or unreadable: %s", r->ipath, s, r->num_shards,
                        why);
    }
  }
  free(path);
  for (int64_t i = 0; i < c->n && rc == 0; i++) {
    bl_ckpt_item *it = &c->items[i];
    int64_t fsize;
    bl_file_size(c->files[it->file], &fsize);
    if (it->region_off > fsize || it->region_len > fsize - it->region_off) {
      char msg[200];
      snprintf(msg, sizeof msg, "bytes [%lld, %lld) are beyond the end of its shard (%lld bytes): truncated data file?",
               (long long)it->region_off, (long long)(it->region_off + it->region_len), (long long)fsize);
      rc = bl_set_error(BL_EFORMAT, WHAT ": %s: tensor '%s': %s", bl_file_path(c->files[it->file]), it->name, msg);
    }
  }
  return rc;
}

static int open_tf(bl_ckpt *c, const char *prefix, const char *ipath) {
  bl_file *f = NULL;
  BL_CHECK(bl_file_open_read(ipath, &f));
  int64_t size = 0;
  bl_file_size(f, &size);
  tf_reader r = { c, ipath, NULL, size, -1, NULL, 0, 0 };
  int rc = 0;
  uint8_t *buf = NULL;
  if (size < 48)
    rc = ferr(&r, "%lld bytes is too short for a table footer (48 bytes): truncated index?", (long long)size);
  else if (size > MAX_INDEX_BYTES)
    rc = ferr(&r, "%lld bytes is too large for a checkpoint index", (long long)size);
  else if (!(buf = malloc((size_t)size)))
    rc = bl_set_error(BL_ENOMEM, WHAT ": %s: out of memory", ipath);
  else
    rc = bl_file_read_at(f, 0, buf, size);
  bl_file_close(f);
  r.buf = buf;
  if (rc == 0) {
    const uint8_t *foot = buf + size - 48, *p = foot;
    uint64_t moff, msize, ioff, isize;
    uint64_t magic = (uint64_t)le32(foot + 40) | (uint64_t)le32(foot + 44) << 32;
    if (magic != TABLE_MAGIC)
      rc = ferr(&r, "no table magic at the end: not a TensorFlow checkpoint index, or truncated");
    else if (varint(&p, foot + 40, &moff) || varint(&p, foot + 40, &msize) || varint(&p, foot + 40, &ioff) ||
             varint(&p, foot + 40, &isize))
      rc = ferr(&r, "malformed table footer");
    else {
      const uint8_t *b;
      int64_t n;
      rc = read_block(&r, ioff, isize, &b, &n);
      if (rc == 0) rc = walk_block(&r, b, n, (int64_t)ioff, on_index);
    }
  }
  if (rc == 0 && r.num_shards < 0) rc = ferr(&r, "no bundle header (key \"\"): not a TensorBundle index");
  if (rc == 0) rc = check_shards(&r, prefix);
  free(buf);
  free(r.prev_key);
  return rc;
}

int bl_ckpt_open_tf(const char *prefix, bl_ckpt **res) {
  if (!prefix || !res) return bl_set_error(BL_EINVAL, WHAT ": NULL argument");
  *res = NULL;
  size_t n = strlen(prefix);
  char *pre = strdup(prefix), *ipath = malloc(n + 8);
  if (!pre || !ipath) {
    free(pre);
    free(ipath);
    return bl_set_error(BL_ENOMEM, WHAT ": out of memory");
  }
  if (n > 6 && strcmp(pre + n - 6, ".index") == 0) pre[n - 6] = 0;
  snprintf(ipath, n + 8, "%s.index", pre);
  bl_ckpt *c = bl_ckpt_new_(ipath, WHAT);
  int rc = c ? open_tf(c, pre, ipath) : BL_ENOMEM;
  free(pre);
  free(ipath);
  if (rc) {
    bl_ckpt_close(c);
    return rc;
  }
  *res = c;
  return 0;
}
