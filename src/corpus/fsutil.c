/* Small POSIX helpers the corpus recipes need and LuaJIT lacks: directory
 * listing, mkdir -p, file size, isatty(stderr), peak RSS. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bl_corpus.h"
#include "corpus_internal.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

int bl_corpus_list_dir(const char *dir, char **out, size_t *out_len) {
  if (!dir || !out || !out_len) return bl_set_error(BL_EINVAL, "list_dir: NULL argument");
  *out = NULL; *out_len = 0;
  DIR *d = opendir(dir);
  if (!d) return bl_set_error(BL_EIO, "list_dir: cannot open directory %s: %s", dir, strerror(errno));
  bl_cbuf names = {0}, ptrs = {0};
  struct dirent *e;
  char path[4096];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode)) continue;
    size_t off = names.n;
    bl_cbuf_put(&names, e->d_name, strlen(e->d_name) + 1);
    bl_cbuf_put(&ptrs, (const char *)&off, sizeof off);
  }
  closedir(d);
  if (names.oom || ptrs.oom) { bl_cbuf_free(&names); bl_cbuf_free(&ptrs); return bl_set_error(BL_ENOMEM, "list_dir: out of memory"); }
  size_t cnt = ptrs.n / sizeof(size_t);
  const char **v = (const char **)malloc((cnt ? cnt : 1) * sizeof *v);
  if (!v) { bl_cbuf_free(&names); bl_cbuf_free(&ptrs); return bl_set_error(BL_ENOMEM, "list_dir: out of memory"); }
  for (size_t k = 0; k < cnt; k++) { size_t off; memcpy(&off, ptrs.p + k * sizeof off, sizeof off); v[k] = names.p + off; }
  qsort(v, cnt, sizeof *v, cmp_str);
  bl_cbuf res = {0};
  bl_cbuf_reserve(&res, names.n + 1);
  for (size_t k = 0; k < cnt; k++) { bl_cbuf_put(&res, v[k], strlen(v[k])); bl_cbuf_putc(&res, '\n'); }
  free(v); bl_cbuf_free(&names); bl_cbuf_free(&ptrs);
  if (res.oom) { bl_cbuf_free(&res); return bl_set_error(BL_ENOMEM, "list_dir: out of memory"); }
  res.p[res.n] = 0;
  *out = res.p; *out_len = res.n;
  return 0;
}

int bl_corpus_mkdir_p(const char *path) {
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
  if (stat(path, &st) || !S_ISDIR(st.st_mode)) return bl_set_error(BL_EIO, "mkdir_p: %s exists and is not a directory", path);
  return 0;
}

int bl_corpus_is_dir(const char *path) {
  struct stat st;
  return path && !stat(path, &st) && S_ISDIR(st.st_mode);
}

int64_t bl_corpus_file_size(const char *path) {
  struct stat st;
  if (!path || stat(path, &st)) return -1;
  return (int64_t)st.st_size;
}

int bl_corpus_stderr_isatty(void) { return isatty(2); }

int64_t bl_corpus_peak_rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t kb = -1;
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "VmHWM:", 6)) { kb = strtoll(line + 6, NULL, 10); break; }
  }
  fclose(f);
  return kb;
}

double bl_corpus_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double bl_corpus_hash_unit(uint64_t seed, uint64_t index, uint32_t stream) {
  uint64_t h = splitmix64(splitmix64(seed ^ ((uint64_t)stream << 56)) ^ index);
  return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}
