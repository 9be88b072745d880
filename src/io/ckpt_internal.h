/* Shared by the checkpoint readers (tf_checkpoint.c, torch_checkpoint.c, ckpt.c); not public. */
#ifndef BL_CKPT_INTERNAL_H
#define BL_CKPT_INTERNAL_H
#include <stdarg.h>
#include "bl_ckpt.h"
#include "bl_io.h"

enum { BL_CRC_NONE = 0, BL_CRC_32C = 1, BL_CRC_ZIP = 2 };

typedef struct {
  char *name;
  int dtype; /* BL_* or -1 (not a bertlua dtype) */
  char src_dtype[48];
  int ndim;
  int64_t shape[BL_MAX_DIMS];
  int64_t stride[BL_MAX_DIMS];    /* in elements */
  int file;                       /* index into bl_ckpt.files */
  int64_t region_off, region_len; /* the bytes the checksum covers: TF: the tensor; torch: its storage */
  int64_t elem_off;               /* element 0's offset inside the region, in elements */
  int crc_kind;
  uint32_t crc; /* unmasked */
} bl_ckpt_item;

struct bl_ckpt {
  char *path;       /* as opened, for messages */
  const char *what; /* "tf checkpoint" / "torch checkpoint" */
  int nfiles;
  bl_file **files;
  bl_ckpt_item *items;
  int64_t n, cap;
};

bl_ckpt *bl_ckpt_new_(const char *path, const char *what);
/* Appends a zeroed item owning a copy of name (n bytes); NULL (error set) when out of memory. */
bl_ckpt_item *bl_ckpt_add_(bl_ckpt *c, const char *name, size_t n);
int bl_ckpt_add_file_(bl_ckpt *c, const char *path);
/* numel of shape with overflow check: -1 when it overflows int64 */
int64_t bl_ckpt_numel_(int ndim, const int64_t *shape);
uint32_t bl_crc32c_sw(uint32_t crc, const void *data, size_t n);
/* BL_EFORMAT with "what: path: message" (message from fmt/ap) */
int bl_ckpt_vfail_(const char *what, const char *path, const char *fmt, va_list ap);

#endif
