/* Shared by the checkpoint-reader fuzz targets: what the readers need from
 * src/base when linked alone, a scratch file per input, and the checks that
 * hold for any input: open fails with a message naming the file, or every
 * entry has a sane shape and reads or fails cleanly. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bl_ckpt.h"

#ifdef BL_FUZZ_STANDALONE
static char fuzz_err[1024];
int bl_set_error(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(fuzz_err, sizeof fuzz_err, fmt, ap);
  va_end(ap);
  return status ? status : BL_EINVAL;
}
const char *bl_last_error(void) { return fuzz_err; }
int bl_dtype_size(int d) {
  static const int sizes[BL_NUM_DTYPES] = { 4, 8, 2, 2, 4, 8, 1, 1 };
  return d >= 0 && d < BL_NUM_DTYPES ? sizes[d] : 0;
}
#endif

#define DIE(...)                  \
  do {                            \
    fprintf(stderr, __VA_ARGS__); \
    fprintf(stderr, "\n");        \
    abort();                      \
  } while (0)

static void write_file(const char *path, const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(p, 1, n, f) != n)) DIE("cannot write %s", path);
  fclose(f);
}

/* open result rc/c for the file `named`: check the invariants, read every entry, close */
static void check_ckpt(int rc, bl_ckpt *c, const char *named) {
  if (rc != 0) {
    if (rc >= 0 || c) DIE("failed open returned %d with a checkpoint", rc);
    if (!strstr(bl_last_error(), named)) DIE("error does not name %s: %s", named, bl_last_error());
    return;
  }
  for (int64_t i = 0; i < bl_ckpt_count(c); i++) {
    const char *name;
    int dtype, ndim;
    int64_t shape[8];
    if (bl_ckpt_entry(c, i, &name, &dtype, &ndim, shape)) DIE("entry %lld", (long long)i);
    if (ndim < 0 || ndim > 8) DIE("ndim %d", ndim);
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
      if (shape[d] < 0) DIE("negative dim");
      if (shape[d] && numel > (1 << 24) / shape[d]) {
        numel = -1;
        break;
      }
      numel *= shape[d];
    }
    if (dtype < 0 || numel < 0) continue; /* too big to bother reading */
    int64_t nb = numel * bl_dtype_size(dtype);
    void *buf = malloc(nb ? (size_t)nb : 1);
    if (bl_ckpt_read(c, i, buf, nb) != 0 && !strstr(bl_last_error(), name))
      DIE("read error does not name '%s': %s", name, bl_last_error());
    free(buf);
  }
  bl_ckpt_close(c);
}
