/* Bounds-checked positional reads. Contract in src/bl_io.h. */
#define _GNU_SOURCE
#include "bl_io.h"
#include "base/open.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct bl_file {
  int fd;
  int64_t size; /* read mode: size at open time */
  char *path;
};

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *r = malloc(n);
  if (r) memcpy(r, s, n);
  return r;
}

int bl_file_open_read(const char *path, bl_file **res) {
  if (!path || !res) return bl_set_error(BL_EINVAL, "file: NULL path");
  *res = NULL;
  int64_t size;
  int fd = bl_open_regular(path, "file", &size);
  if (fd < 0) return BL_EIO;
  bl_file *f = calloc(1, sizeof *f);
  if (!f || !(f->path = dup_str(path))) {
    free(f);
    close(fd);
    return bl_set_error(BL_ENOMEM, "file: out of memory opening %s", path);
  }
  f->fd = fd;
  f->size = size;
  *res = f;
  return 0;
}

int bl_file_size(const bl_file *f, int64_t *size) {
  if (!f || !size) return bl_set_error(BL_EINVAL, "file: NULL argument");
  *size = f->size;
  return 0;
}

const char *bl_file_path(const bl_file *f) { return f ? f->path : ""; }

int bl_file_read_at(bl_file *f, int64_t offset, void *dst, int64_t n) {
  if (!f || (!dst && n > 0)) return bl_set_error(BL_EINVAL, "file: NULL argument");
  if (offset < 0 || n < 0 || offset > f->size || n > f->size - offset)
    return bl_set_error(BL_EFORMAT, "file: %s: range [%lld, %lld) is outside the file (%lld bytes)", f->path,
                        (long long)offset, (long long)offset + (long long)n, (long long)f->size);
  char *p = dst;
  while (n > 0) {
    ssize_t r = pread(f->fd, p, (size_t)(n > (1 << 30) ? (1 << 30) : n), (off_t)offset);
    if (r < 0) {
      if (errno == EINTR) continue;
      return bl_set_error(BL_EIO, "file: read error in %s at offset %lld: %s", f->path, (long long)offset,
                          strerror(errno));
    }
    if (r == 0) /* the file shrank under us */
      return bl_set_error(BL_EFORMAT, "file: %s ended early at offset %lld", f->path, (long long)offset);
    p += r;
    offset += r;
    n -= r;
  }
  return 0;
}

void bl_file_close(bl_file *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  free(f->path);
  free(f);
}
