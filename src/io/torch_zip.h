/* The zip side of the torch.save reader (torch_checkpoint.c): the
 * end-of-central-directory record (zip64 when the sizes need it), then the
 * central directory; entries must be stored (torch never compresses) and lie
 * inside the file. Internal to src/io. */
#ifndef BL_TORCH_ZIP_H
#define BL_TORCH_ZIP_H
#include <stdint.h>
#include "ckpt_internal.h"

#define TZIP_WHAT "torch checkpoint"

typedef struct {
  char *name;
  uint64_t lho, csize, usize;
  uint32_t crc;
  int method, flags;
} zip_entry;

typedef struct {
  bl_ckpt *c;
  bl_file *f;
  int64_t fsize;
  zip_entry *ents;
  int64_t nents;
  char *prefix; /* "archive" for archive/data.pkl */
} zip_reader;

static inline uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t le32(const uint8_t *p) {
  return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

/* BL_EFORMAT "torch checkpoint: PATH: message" */
int tzip_err(zip_reader *z, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reads the end-of-central-directory record and the central directory of z->f into z->ents. */
int tzip_open(zip_reader *z);
/* The entry named prefix/rest, or NULL. */
zip_entry *tzip_find(zip_reader *z, const char *prefix, const char *rest);
/* *off = the file offset of e's (stored) data, after checking it lies inside the file. */
int tzip_data(zip_reader *z, const zip_entry *e, int64_t *off);
void tzip_free(zip_reader *z);

#endif
