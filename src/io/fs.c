/* File-system helpers LuaJIT lacks (directory listing, mkdir -p, stat), behind
 * bertlua.util.fs. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <stdlib.h>

#include "bl_io.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static void free_names(char **v, size_t n) {
  for (size_t k = 0; k < n; k++) free(v[k]);
  free(v);
}

int bl_fs_list_dir(const char *dir, int what, char **out, size_t *out_len) {
  if (!dir || !out || !out_len) return bl_set_error(BL_EINVAL, "list_dir: NULL argument");
  *out = NULL;
  *out_len = 0;
  DIR *d = opendir(dir);
  if (!d) return bl_set_error(BL_EIO, "list_dir: cannot open directory %s: %s", dir, strerror(errno));
  char **v = NULL;
  size_t cnt = 0, cap = 0, total = 0;
  struct dirent *e;
  char path[4096];
  while ((e = readdir(d)) != NULL) {
    const char *nm = e->d_name;
    if (nm[0] == '.' && (!(what & BL_FS_HIDDEN) || !nm[1] || (nm[1] == '.' && !nm[2]))) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (stat(path, &st)) continue;
    if (!((what & BL_FS_FILES) && S_ISREG(st.st_mode)) && !((what & BL_FS_DIRS) && S_ISDIR(st.st_mode))) continue;
    if (cnt == cap) {
      cap = cap ? 2 * cap : 64;
      char **nv = realloc(v, cap * sizeof *v);
      if (!nv) break;
      v = nv;
    }
    if (!(v[cnt] = strdup(e->d_name))) break;
    total += strlen(v[cnt++]) + 1;
  }
  int oom = e != NULL;
  closedir(d);
  char *res = oom ? NULL : malloc(total + 1);
  if (!res) {
    free_names(v, cnt);
    return bl_set_error(BL_ENOMEM, "list_dir: out of memory");
  }
  if (cnt > 1) qsort(v, cnt, sizeof *v, cmp_str); /* v is NULL for an empty directory */
  size_t n = 0;
  for (size_t k = 0; k < cnt; k++) {
    size_t len = strlen(v[k]);
    memcpy(res + n, v[k], len);
    res[n + len] = '\n';
    n += len + 1;
  }
  res[n] = 0;
  free_names(v, cnt);
  *out = res;
  *out_len = n;
  return 0;
}

void bl_fs_free(void *p) { free(p); }

int bl_fs_mkdir_p(const char *path) {
  if (!path || !*path) return bl_set_error(BL_EINVAL, "mkdir_p: empty path");
  char buf[4096];
  size_t n = strlen(path);
  if (n >= sizeof buf) return bl_set_error(BL_EINVAL, "mkdir_p: path too long");
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] == '/' || buf[i] == 0) {
      char c = buf[i];
      buf[i] = 0;
      if (mkdir(buf, 0777) && errno != EEXIST)
        return bl_set_error(BL_EIO, "mkdir_p: cannot create %s: %s", buf, strerror(errno));
      buf[i] = c;
    }
  }
  struct stat st;
  if (stat(path, &st) || !S_ISDIR(st.st_mode))
    return bl_set_error(BL_EIO, "mkdir_p: %s exists and is not a directory", path);
  return 0;
}

int bl_fs_is_dir(const char *path) {
  struct stat st;
  return path && !stat(path, &st) && S_ISDIR(st.st_mode);
}

int64_t bl_fs_file_size(const char *path) {
  struct stat st;
  if (!path || stat(path, &st)) return -1;
  return (int64_t)st.st_size;
}
