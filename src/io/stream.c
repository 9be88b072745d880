/* Checked atomic writer and byte-exact line reader. Contract in src/bl_stream.h. */
#define _GNU_SOURCE
#include "bl_stream.h"
#include "base/open.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WBUF (1 << 16)

struct bl_writer {
  int fd;
  int err;       /* sticky status of the first failure, 0 while healthy */
  char msg[512]; /* its message, repeated by later calls */
  int64_t bytes; /* accepted so far */
  size_t used;
  char *path, *tmp;
  char buf[WBUF];
};

int bl_check_regular(const char *path, const char *what, int must_exist) {
  if (!path || !*path) return bl_set_error(BL_EINVAL, "%s: empty path", what ? what : "file");
  struct stat st;
  if (stat(path, &st) != 0) {
    if (errno == ENOENT && !must_exist) return 0;
    return bl_set_error(BL_EIO, "%s %s: %s", what ? what : "file", path, strerror(errno));
  }
  if (!S_ISREG(st.st_mode))
    return bl_set_error(BL_EIO, "%s %s is %s, not a regular file", what ? what : "file", path,
                        bl_file_kind(st.st_mode));
  return 0;
}

int bl_writer_open(const char *path, bl_writer **res) {
  if (!path || !*path || !res) return bl_set_error(BL_EINVAL, "write: empty path");
  *res = NULL;
  BL_CHECK(bl_check_regular(path, "write: destination", 0));
  bl_writer *w = calloc(1, sizeof *w);
  size_t n = strlen(path) + 16;
  if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(n))) {
    if (w) free(w->path);
    free(w);
    return bl_set_error(BL_ENOMEM, "write %s: out of memory", path);
  }
  snprintf(w->tmp, n, "%s.tmp.XXXXXX", path);
  w->fd = mkostemp(w->tmp, O_CLOEXEC);
  if (w->fd < 0) {
    int e = errno;
    free(w->tmp);
    free(w->path);
    free(w);
    return bl_set_error(BL_EIO, "write %s: cannot create its temporary file: %s", path, strerror(e));
  }
  /* mkostemp makes 0600; outputs are ordinary files for the user's umask */
  mode_t um = umask(0);
  umask(um);
  if (fchmod(w->fd, 0666 & ~um) != 0) { /* harmless: the file is still the user's */
  }
  *res = w;
  return 0;
}

static int fail(bl_writer *w, int e, const char *step) {
  if (!w->err) {
    w->err = bl_set_error(BL_EIO, "write %s: %s failed after %lld bytes: %s; the file was not written", w->path, step,
                          (long long)w->bytes, strerror(e));
    snprintf(w->msg, sizeof w->msg, "%s", bl_last_error());
  }
  return bl_set_error(w->err, "%s", w->msg);
}

static int flush(bl_writer *w) {
  const char *p = w->buf;
  size_t n = w->used;
  while (n > 0) {
    ssize_t k = write(w->fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return fail(w, k < 0 ? errno : ENOSPC, "write");
    p += k;
    n -= (size_t)k;
  }
  w->used = 0;
  return 0;
}

int bl_writer_write(bl_writer *w, const void *src, int64_t n) {
  if (!w || n < 0 || (!src && n > 0)) return bl_set_error(BL_EINVAL, "write: bad arguments");
  if (w->err) return bl_set_error(w->err, "%s", w->msg);
  const char *p = src;
  while (n > 0) {
    size_t k = WBUF - w->used;
    if ((int64_t)k > n) k = (size_t)n;
    memcpy(w->buf + w->used, p, k);
    w->used += k;
    w->bytes += (int64_t)k;
    p += k;
    n -= (int64_t)k;
    if (w->used == WBUF) BL_CHECK(flush(w));
  }
  return 0;
}

static void fsync_dir_of(const char *path) {
  char *d = strdup(path);
  if (!d) return;
  char *slash = strrchr(d, '/');
  const char *dir = slash == d ? "/" : slash ? (*slash = 0, d) : ".";
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  } /* some filesystems refuse a directory fsync */
  free(d);
}

int bl_writer_commit(bl_writer *w) {
  if (!w) return bl_set_error(BL_EINVAL, "write: NULL writer");
  int rc = w->err ? bl_set_error(w->err, "%s", w->msg) : flush(w);
  if (rc == 0 && fsync(w->fd) != 0 && errno != EINVAL) rc = fail(w, errno, "fsync");
  int fd = w->fd;
  w->fd = -1;
  if (close(fd) != 0 && rc == 0) rc = fail(w, errno, "close");
  if (rc == 0 && rename(w->tmp, w->path) != 0) rc = fail(w, errno, "rename of the temporary");
  if (rc == 0) {
    fsync_dir_of(w->path);
    free(w->tmp);
    w->tmp = NULL;
  }
  bl_writer_abort(w);
  return rc;
}

void bl_writer_abort(bl_writer *w) {
  if (!w) return;
  if (w->fd >= 0) close(w->fd);
  if (w->tmp) unlink(w->tmp);
  free(w->tmp);
  free(w->path);
  free(w);
}

int64_t bl_writer_bytes(const bl_writer *w) { return w ? w->bytes : 0; }
const char *bl_writer_path(const bl_writer *w) { return w ? w->path : ""; }

/* ------------------------------------------------------------ line reader */

struct bl_lines {
  int fd, strip_cr, eof;
  int64_t lineno;
  char *path;
  char *buf; /* [start, end) unread bytes */
  size_t start, end, cap;
};

int bl_lines_open(const char *path, int strip_cr, bl_lines **res) {
  if (!path || !res) return bl_set_error(BL_EINVAL, "read: NULL path");
  *res = NULL;
  int fd = bl_open_regular(path, "read", NULL);
  if (fd < 0) return BL_EIO;
  bl_lines *r = calloc(1, sizeof *r);
  if (!r || !(r->path = strdup(path)) || !(r->buf = malloc(WBUF))) {
    if (r) free(r->path);
    free(r);
    close(fd);
    return bl_set_error(BL_ENOMEM, "read %s: out of memory", path);
  }
  r->fd = fd;
  r->strip_cr = strip_cr;
  r->cap = WBUF;
  *res = r;
  return 0;
}

/* Moves the unread bytes to the front, grows the buffer when it is full, reads more. */
static int refill(bl_lines *r) {
  if (r->start > 0) {
    memmove(r->buf, r->buf + r->start, r->end - r->start);
    r->end -= r->start;
    r->start = 0;
  }
  if (r->end == r->cap) {
    if (r->cap > ((size_t)1 << 40))
      return bl_set_error(BL_EFORMAT, "read %s: line %lld is over 1 TB", r->path, (long long)r->lineno + 1);
    char *nb = realloc(r->buf, r->cap * 2);
    if (!nb)
      return bl_set_error(BL_ENOMEM, "read %s: out of memory for line %lld (%zu bytes)", r->path,
                          (long long)r->lineno + 1, r->cap);
    r->buf = nb;
    r->cap *= 2;
  }
  for (;;) {
    ssize_t k = read(r->fd, r->buf + r->end, r->cap - r->end);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0)
      return bl_set_error(BL_EIO, "read %s: error after line %lld: %s", r->path, (long long)r->lineno, strerror(errno));
    if (k == 0) r->eof = 1;
    r->end += (size_t)k;
    return 0;
  }
}

int bl_lines_next(bl_lines *r, const char **line, int64_t *len, int64_t *lineno) {
  if (!r || !line || !len) return bl_set_error(BL_EINVAL, "read: NULL argument");
  size_t scanned = 0; /* bytes after start known to hold no "\n" */
  for (;;) {
    char *nl = memchr(r->buf + r->start + scanned, '\n', r->end - r->start - scanned);
    if (nl || (r->eof && r->end > r->start)) {
      char *b = r->buf + r->start;
      size_t n = nl ? (size_t)(nl - b) : r->end - r->start;
      r->start += nl ? n + 1 : n;
      if (r->strip_cr && n > 0 && b[n - 1] == '\r') n--;
      *line = b;
      *len = (int64_t)n;
      r->lineno++;
      if (lineno) *lineno = r->lineno;
      return 1;
    }
    if (r->eof) return 0;
    scanned = r->end - r->start;
    BL_CHECK(refill(r));
  }
}

void bl_lines_close(bl_lines *r) {
  if (!r) return;
  close(r->fd);
  free(r->buf);
  free(r->path);
  free(r);
}
