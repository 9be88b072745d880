/* The zip side of the torch.save reader: contract in torch_zip.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "torch_zip.h"

#define WHAT         TZIP_WHAT
#define MAX_CD_BYTES (256ll << 20)

int tzip_err(zip_reader *z, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = bl_ckpt_vfail_(WHAT, z->c->path, fmt, ap);
  va_end(ap);
  return rc;
}

/* zip64 extended information: the fields whose 32-bit value is all ones, in this order */
static int zip64_extra(const uint8_t *x, size_t xlen, zip_entry *e, int need_u, int need_c, int need_o) {
  while (xlen >= 4) {
    uint16_t id = le16(x), n = le16(x + 2);
    if ((size_t)n > xlen - 4) return -1;
    if (id == 1) {
      const uint8_t *p = x + 4, *end = p + n;
      if (need_u) {
        if (end - p < 8) return -1;
        e->usize = le64(p);
        p += 8;
      }
      if (need_c) {
        if (end - p < 8) return -1;
        e->csize = le64(p);
        p += 8;
      }
      if (need_o) {
        if (end - p < 8) return -1;
        e->lho = le64(p);
      }
      return 0;
    }
    x += 4 + n;
    xlen -= 4 + (size_t)n;
  }
  return need_u || need_c || need_o ? -1 : 0;
}

static int zip_central(zip_reader *z, uint64_t cd_off, uint64_t cd_size, uint64_t count) {
  if (cd_off > (uint64_t)z->fsize || cd_size > (uint64_t)z->fsize - cd_off || cd_size > MAX_CD_BYTES)
    return tzip_err(z, "the zip central directory (offset %llu, %llu bytes) is outside the file: truncated?",
                    (unsigned long long)cd_off, (unsigned long long)cd_size);
  if (count > cd_size / 46)
    return tzip_err(z, "the zip directory claims %llu entries in %llu bytes", (unsigned long long)count,
                    (unsigned long long)cd_size);
  uint8_t *cd = malloc(cd_size ? cd_size : 1);
  z->ents = calloc(count ? count : 1, sizeof *z->ents);
  if (!cd || !z->ents) {
    free(cd);
    return bl_set_error(BL_ENOMEM, WHAT ": %s: out of memory", z->c->path);
  }
  int rc = bl_file_read_at(z->f, (int64_t)cd_off, cd, (int64_t)cd_size);
  const uint8_t *p = cd, *end = cd + cd_size;
  for (uint64_t i = 0; i < count && rc == 0; i++) {
    if (end - p < 46 || le32(p) != 0x02014b50) {
      rc = tzip_err(z, "zip directory entry %llu is malformed", (unsigned long long)i);
      break;
    }
    zip_entry *e = &z->ents[i];
    e->flags = le16(p + 8);
    e->method = le16(p + 10);
    e->crc = le32(p + 16);
    e->csize = le32(p + 20);
    e->usize = le32(p + 24);
    size_t nlen = le16(p + 28), xlen = le16(p + 30), clen = le16(p + 32);
    e->lho = le32(p + 42);
    if ((size_t)(end - p) - 46 < nlen + xlen + clen) {
      rc = tzip_err(z, "zip directory entry %llu is truncated", (unsigned long long)i);
      break;
    }
    if (!(e->name = malloc(nlen + 1))) {
      rc = bl_set_error(BL_ENOMEM, WHAT ": out of memory");
      break;
    }
    memcpy(e->name, p + 46, nlen);
    e->name[nlen] = 0;
    z->nents = (int64_t)i + 1;
    if (zip64_extra(p + 46 + nlen, xlen, e, e->usize == 0xffffffffu, e->csize == 0xffffffffu, e->lho == 0xffffffffu))
      rc = tzip_err(z, "zip entry '%s' has a malformed zip64 extra field", e->name);
    p += 46 + nlen + xlen + clen;
  }
  free(cd);
  return rc;
}

int tzip_open(zip_reader *z) {
  BL_CHECK(bl_file_size(z->f, &z->fsize));
  int64_t tail = z->fsize < 65557 ? z->fsize : 65557; /* EOCD (22) + the longest comment */
  if (tail < 22) return tzip_err(z, "%lld bytes is too short for a zip archive: truncated?", (long long)z->fsize);
  uint8_t *t = malloc((size_t)tail);
  if (!t) return bl_set_error(BL_ENOMEM, WHAT ": out of memory");
  int rc = bl_file_read_at(z->f, z->fsize - tail, t, tail);
  int64_t at = -1;
  for (int64_t i = tail - 22; rc == 0 && i >= 0; i--)
    if (le32(t + i) == 0x06054b50) {
      at = i;
      break;
    }
  uint64_t count = 0, cd_size = 0, cd_off = 0;
  if (rc == 0 && at < 0) rc = tzip_err(z, "no zip end-of-directory record: truncated, or not a torch.save zip file");
  if (rc == 0) {
    count = le16(t + at + 10);
    cd_size = le32(t + at + 12);
    cd_off = le32(t + at + 16);
    if (count == 0xffff || cd_size == 0xffffffffu || cd_off == 0xffffffffu) {
      uint8_t loc[20], e64[56];
      int64_t lpos = z->fsize - tail + at - 20;
      if (lpos < 0 || bl_file_read_at(z->f, lpos, loc, 20) || le32(loc) != 0x07064b50)
        rc = tzip_err(z, "zip64 archive without a zip64 end-of-directory locator");
      else if (le64(loc + 8) > (uint64_t)z->fsize - 56 || bl_file_read_at(z->f, (int64_t)le64(loc + 8), e64, 56) ||
               le32(e64) != 0x06064b50)
        rc = tzip_err(z, "the zip64 end-of-directory record is missing or outside the file");
      else {
        count = le64(e64 + 32);
        cd_size = le64(e64 + 40);
        cd_off = le64(e64 + 48);
      }
    }
  }
  free(t);
  if (rc == 0) rc = zip_central(z, cd_off, cd_size, count);
  return rc;
}

zip_entry *tzip_find(zip_reader *z, const char *prefix, const char *rest) {
  size_t pl = strlen(prefix);
  for (int64_t i = 0; i < z->nents; i++) {
    const char *n = z->ents[i].name;
    if (strncmp(n, prefix, pl) == 0 && n[pl] == '/' && strcmp(n + pl + 1, rest) == 0) return &z->ents[i];
  }
  return NULL;
}

/* Offset of e's bytes (after its local header), checked to lie inside the file. */
int tzip_data(zip_reader *z, const zip_entry *e, int64_t *off) {
  uint8_t h[30];
  if (e->flags & 1) return tzip_err(z, "zip entry '%s' is encrypted", e->name);
  if (e->method != 0 || e->csize != e->usize)
    return tzip_err(z, "zip entry '%s' is compressed (method %d); torch.save writes stored entries", e->name,
                    e->method);
  if (e->lho > (uint64_t)z->fsize - 30 || z->fsize < 30 || bl_file_read_at(z->f, (int64_t)e->lho, h, 30) ||
      le32(h) != 0x04034b50)
    return tzip_err(z, "zip entry '%s': no local header at offset %llu: truncated or corrupt archive", e->name,
                    (unsigned long long)e->lho);
  uint64_t d = e->lho + 30 + le16(h + 26) + le16(h + 28);
  if (d > (uint64_t)z->fsize || e->usize > (uint64_t)z->fsize - d)
    return tzip_err(z,
                    "zip entry '%s' (%llu bytes at offset %llu) runs past the end of the file (%lld bytes): truncated?",
                    e->name, (unsigned long long)e->usize, (unsigned long long)d, (long long)z->fsize);
  *off = (int64_t)d;
  return 0;
}

void tzip_free(zip_reader *z) {
  for (int64_t i = 0; i < z->nents; i++) free(z->ents[i].name);
  free(z->ents);
  free(z->prefix);
}
