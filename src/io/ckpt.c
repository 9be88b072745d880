/* The entry table both checkpoint readers fill, and reading an entry:
 * checksum of the region it lives in, then a (possibly strided) copy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt_internal.h"

bl_ckpt *bl_ckpt_new_(const char *path, const char *what) {
  bl_ckpt *c = calloc(1, sizeof *c);
  if (c) c->path = strdup(path);
  if (!c || !c->path) {
    free(c);
    bl_set_error(BL_ENOMEM, "%s: out of memory opening %s", what, path);
    return NULL;
  }
  c->what = what;
  return c;
}

bl_ckpt_item *bl_ckpt_add_(bl_ckpt *c, const char *name, size_t n) {
  if (c->n == c->cap) {
    int64_t cap = c->cap ? c->cap * 2 : 64;
    bl_ckpt_item *it = realloc(c->items, (size_t)cap * sizeof *it);
    if (!it) {
      bl_set_error(BL_ENOMEM, "%s: %s: out of memory", c->what, c->path);
      return NULL;
    }
    c->items = it;
    c->cap = cap;
  }
  bl_ckpt_item *it = &c->items[c->n];
  memset(it, 0, sizeof *it);
  if (!(it->name = malloc(n + 1))) {
    bl_set_error(BL_ENOMEM, "%s: %s: out of memory", c->what, c->path);
    return NULL;
  }
  memcpy(it->name, name, n);
  it->name[n] = 0;
  c->n++;
  return it;
}

int bl_ckpt_add_file_(bl_ckpt *c, const char *path) {
  bl_file **fs = realloc(c->files, (size_t)(c->nfiles + 1) * sizeof *fs);
  if (!fs) return bl_set_error(BL_ENOMEM, "%s: %s: out of memory", c->what, c->path);
  c->files = fs;
  c->files[c->nfiles] = NULL;
  BL_CHECK(bl_file_open_read(path, &c->files[c->nfiles]));
  c->nfiles++;
  return 0;
}

int bl_ckpt_vfail_(const char *what, const char *path, const char *fmt, va_list ap) {
  char msg[800];
  vsnprintf(msg, sizeof msg, fmt, ap);
  return bl_set_error(BL_EFORMAT, "%s: %s: %s", what, path, msg);
}

int64_t bl_ckpt_numel_(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 0 || __builtin_mul_overflow(n, shape[d], &n)) return -1;
  return n;
}

void bl_ckpt_close(bl_ckpt *c) {
  if (!c) return;
  for (int64_t i = 0; i < c->n; i++) free(c->items[i].name);
  for (int i = 0; i < c->nfiles; i++) bl_file_close(c->files[i]);
  free(c->files);
  free(c->items);
  free(c->path);
  free(c);
}

int64_t bl_ckpt_count(const bl_ckpt *c) { return c ? c->n : 0; }

int bl_ckpt_entry(const bl_ckpt *c, int64_t i, const char **name, int *dtype, int *ndim, int64_t *shape) {
  if (!c || i < 0 || i >= c->n) return bl_set_error(BL_EINVAL, "checkpoint: entry %lld out of range", (long long)i);
  const bl_ckpt_item *it = &c->items[i];
  if (name) *name = it->name;
  if (dtype) *dtype = it->dtype;
  if (ndim) *ndim = it->ndim;
  if (shape) memcpy(shape, it->shape, (size_t)it->ndim * sizeof *shape);
  return 0;
}

const char *bl_ckpt_source_dtype(const bl_ckpt *c, int64_t i) {
  return c && i >= 0 && i < c->n ? c->items[i].src_dtype : "";
}

static int is_dense(const bl_ckpt_item *it) {
  int64_t want = 1;
  for (int d = it->ndim - 1; d >= 0; d--) {
    if (it->shape[d] != 1 && it->stride[d] != want) return 0;
    want *= it->shape[d];
  }
  return 1;
}

/* row-major copy of a strided view: esize-byte elements */
static void gather(const bl_ckpt_item *it, const char *src, char *dst, int esize) {
  int64_t idx[BL_MAX_DIMS] = { 0 };
  int64_t numel = bl_ckpt_numel_(it->ndim, it->shape);
  for (int64_t k = 0; k < numel; k++) {
    int64_t off = 0;
    for (int d = 0; d < it->ndim; d++) off += idx[d] * it->stride[d];
    memcpy(dst + k * esize, src + off * esize, (size_t)esize);
    for (int d = it->ndim - 1; d >= 0; d--) {
      if (++idx[d] < it->shape[d]) break;
      idx[d] = 0;
    }
  }
}

int bl_ckpt_read(bl_ckpt *c, int64_t i, void *dst, int64_t nbytes) {
  if (!c || i < 0 || i >= c->n) return bl_set_error(BL_EINVAL, "checkpoint: entry %lld out of range", (long long)i);
  const bl_ckpt_item *it = &c->items[i];
  if (it->dtype < 0)
    return bl_set_error(BL_EUNSUPPORTED, "%s: %s: tensor '%s': dtype %s is not supported", c->what, c->path, it->name,
                        it->src_dtype);
  int esize = bl_dtype_size(it->dtype);
  int64_t want = bl_ckpt_numel_(it->ndim, it->shape) * esize;
  if (nbytes != want || (!dst && nbytes > 0))
    return bl_set_error(BL_EINVAL, "%s: %s: tensor '%s' has %lld bytes, the destination %lld", c->what, c->path,
                        it->name, (long long)want, (long long)nbytes);
  int direct = it->elem_off == 0 && it->region_len == nbytes && is_dense(it);
  char *buf = direct ? dst : malloc(it->region_len ? (size_t)it->region_len : 1);
  if (!buf)
    return bl_set_error(BL_ENOMEM, "%s: %s: tensor '%s': out of memory (%lld bytes)", c->what, c->path, it->name,
                        (long long)it->region_len);
  int rc = bl_file_read_at(c->files[it->file], it->region_off, buf, it->region_len);
  if (rc != 0) {
    char why[512];
    snprintf(why, sizeof why, "%s", bl_last_error());
    rc = bl_set_error(rc, "%s: %s: tensor '%s': %s", c->what, c->path, it->name, why);
  } else if (it->crc_kind != BL_CRC_NONE) {
    uint32_t got = it->crc_kind == BL_CRC_32C ? bl_crc32c(0, buf, (size_t)it->region_len)
                                              : bl_crc32(0, buf, (size_t)it->region_len);
    if (got != it->crc)
      rc =
          bl_set_error(BL_EFORMAT, "%s: %s: tensor '%s': %s mismatch (stored %08x, data has %08x): the file is corrupt",
                       c->what, bl_file_path(c->files[it->file]), it->name,
                       it->crc_kind == BL_CRC_32C ? "crc32c" : "zip CRC-32", it->crc, got);
  }
  if (rc == 0 && !direct) gather(it, buf + it->elem_off * esize, dst, esize);
  if (!direct) free(buf);
  return rc;
}
