/* bertlua — the one way the C core opens a file to read it (src/base/open.h). Its own file so that the
 * fuzz targets, which link single readers, link it too. */
#include "base/open.h"
#include "bl_base.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *bl_file_kind(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

int bl_open_regular(const char *path, const char *what, int64_t *size) {
  if (!what) what = "file";
  if (!path || !*path) return bl_set_error(BL_EINVAL, "%s: empty path", what), -1;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return bl_set_error(BL_EIO, "%s: cannot open %s: %s", what, path, strerror(errno)), -1;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return bl_set_error(BL_EIO, "%s: cannot stat %s: %s", what, path, strerror(e)), -1;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return bl_set_error(BL_EIO, "%s: %s is %s, not a regular file", what, path, bl_file_kind(st.st_mode)), -1;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    int e = errno;
    close(fd);
    return bl_set_error(BL_EIO, "%s: cannot clear O_NONBLOCK on %s: %s", what, path, strerror(e)), -1;
  }
  if (size) *size = (int64_t)st.st_size;
  return fd;
}
