/* The checked atomic writer and the byte-exact line reader (src/bl_stream.h):
 * random bytes written in random-sized pieces come back identical; a write
 * that fails (file size limit, as on a full disk) leaves the old file intact,
 * no temporary behind, and an error naming the file; lines with NUL bytes,
 * CRLF, no final newline and lines longer than the buffer split exactly like
 * an independent memchr split; FIFOs and directories are refused, not waited on. */
#define _GNU_SOURCE /* mkdtemp */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bertlua.h"
#include "base/open.h"
#include <fcntl.h>

static int failures = 0;
#define CHECK(cond, ...)                          \
  do {                                            \
    if (!(cond)) {                                \
      failures++;                                 \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                        \
      printf("\n");                               \
    }                                             \
  } while (0)

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
  rs ^= rs >> 12;
  rs ^= rs << 25;
  rs ^= rs >> 27;
  return (uint32_t)((rs * 0x2545F4914F6CDD1DULL) >> 33) % n;
}

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long k = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)k + 1);
  *n = fread(b, 1, (size_t)k, f);
  fclose(f);
  return b;
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

static int write_all(const char *path, const char *data, size_t n) {
  bl_writer *w = NULL;
  BL_CHECK(bl_writer_open(path, &w));
  for (size_t i = 0; i < n;) {
    size_t k = 1 + rnd(rnd(4) ? 100 : 200000); /* pieces across the buffer size */
    if (k > n - i) k = n - i;
    int rc = bl_writer_write(w, data + i, (int64_t)k);
    if (rc) {
      bl_writer_abort(w);
      return rc;
    }
    i += k;
  }
  CHECK(bl_writer_bytes(w) == (int64_t)n, "bytes counted");
  return bl_writer_commit(w);
}

static void test_writer(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/out.bin", dir);
  size_t n = 1000003;
  char *data = malloc(n);
  for (size_t i = 0; i < n; i++) data[i] = (char)rnd(256);
  CHECK(write_all(path, data, n) == 0, "write: %s", bl_last_error());
  size_t got_n = 0;
  char *got = slurp(path, &got_n);
  CHECK(got && got_n == n && memcmp(got, data, n) == 0, "round trip of %zu bytes", n);
  free(got);
  CHECK(count_entries(dir) == 1, "no temporary left");

  /* a failing write (RLIMIT_FSIZE gives EFBIG, like ENOSPC on a full disk) keeps the old file */
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit old, lim;
  getrlimit(RLIMIT_FSIZE, &old);
  lim = old;
  lim.rlim_cur = 300000;
  CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
  int rc = write_all(path, data + 1, n - 1);
  setrlimit(RLIMIT_FSIZE, &old);
  CHECK(rc != 0, "the oversized write fails");
  CHECK(strstr(bl_last_error(), path) && strstr(bl_last_error(), "not written"), "message: %s", bl_last_error());
  got = slurp(path, &got_n);
  CHECK(got && got_n == n && memcmp(got, data, n) == 0, "the old content is intact");
  free(got);
  CHECK(count_entries(dir) == 1, "no temporary left after the failure");

  /* a failure is sticky: later writes and the commit report it */
  bl_writer *w = NULL;
  CHECK(bl_writer_open(path, &w) == 0, "open");
  setrlimit(RLIMIT_FSIZE, &lim);
  int r1 = bl_writer_write(w, data, 400000);
  setrlimit(RLIMIT_FSIZE, &old);
  int r2 = bl_writer_write(w, "x", 1);
  int r3 = bl_writer_commit(w);
  CHECK(r1 != 0 && r2 != 0 && r3 != 0 && strstr(bl_last_error(), path), "sticky: %d %d %d %s", r1, r2, r3,
        bl_last_error());

  /* an empty file is written too; a directory as destination is refused */
  snprintf(path, sizeof path, "%s/empty.txt", dir);
  CHECK(write_all(path, "", 0) == 0, "empty file");
  struct stat st;
  CHECK(stat(path, &st) == 0 && st.st_size == 0 && (st.st_mode & 0044), "empty, readable file");
  unlink(path);
  CHECK(bl_writer_open(dir, &w) != 0 && strstr(bl_last_error(), "directory"), "directory: %s", bl_last_error());
  snprintf(path, sizeof path, "%s/no/such/dir/x", dir);
  CHECK(bl_writer_open(path, &w) != 0 && strstr(bl_last_error(), path), "missing dir: %s", bl_last_error());
  free(data);
  snprintf(path, sizeof path, "%s/out.bin", dir);
  unlink(path);
}

/* the reference split: memchr for "\n", optional "\r" strip, a last line without "\n" counts */
static void check_lines(const char *path, const char *data, size_t n, int strip_cr) {
  bl_lines *r = NULL;
  CHECK(bl_lines_open(path, strip_cr, &r) == 0, "open: %s", bl_last_error());
  if (!r) return;
  size_t pos = 0;
  int64_t want_no = 0;
  for (;;) {
    const char *line;
    int64_t len, no;
    int rc = bl_lines_next(r, &line, &len, &no);
    if (pos == n) {
      CHECK(rc == 0, "end of file after line %lld", (long long)want_no);
      break;
    }
    CHECK(rc == 1, "line %lld: rc %d", (long long)want_no + 1, rc);
    if (rc != 1) break;
    const char *nl = memchr(data + pos, '\n', n - pos);
    size_t wlen = nl ? (size_t)(nl - (data + pos)) : n - pos;
    const char *wline = data + pos;
    pos += wlen + (nl != NULL);
    if (strip_cr && wlen > 0 && wline[wlen - 1] == '\r') wlen--;
    want_no++;
    CHECK(no == want_no && len == (int64_t)wlen && memcmp(line, wline, wlen) == 0, "line %lld differs",
          (long long)want_no);
  }
  bl_lines_close(r);
}

static void test_lines(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/in.txt", dir);
  const char alphabet[] = { 'a', 'b', '\0', '\r', '\n', '\n', ' ', '\xff' };
  for (int trial = 0; trial < 40; trial++) {
    size_t n = trial == 0 ? 0 : trial < 4 ? (size_t)trial : rnd(trial < 30 ? 3000 : 400000);
    char *data = malloc(n + 1);
    int long_lines = trial >= 30; /* lines longer than the 64 KB buffer */
    for (size_t i = 0; i < n; i++) data[i] = long_lines && rnd(200000) ? 'x' : alphabet[rnd(sizeof alphabet)];
    CHECK(write_all(path, data, n) == 0, "write: %s", bl_last_error());
    check_lines(path, data, n, 0);
    check_lines(path, data, n, 1);
    free(data);
  }
  unlink(path);
  snprintf(path, sizeof path, "%s/fifo", dir);
  CHECK(mkfifo(path, 0600) == 0, "mkfifo");
  bl_lines *r = NULL;
  alarm(10);
  int rc = bl_lines_open(path, 0, &r);
  alarm(0);
  CHECK(rc != 0 && !r && strstr(bl_last_error(), "FIFO") && strstr(bl_last_error(), path), "%s", bl_last_error());
  CHECK(bl_check_regular(path, "input", 1) != 0 && strstr(bl_last_error(), "FIFO"), "%s", bl_last_error());
  unlink(path);
  CHECK(bl_lines_open(dir, 0, &r) != 0 && strstr(bl_last_error(), "directory"), "%s", bl_last_error());
  CHECK(bl_check_regular(dir, "input", 1) != 0 && strstr(bl_last_error(), "directory"), "%s", bl_last_error());
  snprintf(path, sizeof path, "%s/absent", dir);
  CHECK(bl_lines_open(path, 0, &r) != 0 && strstr(bl_last_error(), path), "%s", bl_last_error());
  CHECK(bl_check_regular(path, "output", 0) == 0, "an absent output is fine");
}

/* bl_open_regular, the readers' open: a FIFO or a directory is refused at once naming it; a regular file
 * opens blocking, with its size */
static void test_open_regular(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/fifo", dir);
  CHECK(mkfifo(path, 0600) == 0, "mkfifo");
  alarm(10);
  int fd = bl_open_regular(path, "vocab file", NULL);
  alarm(0);
  CHECK(fd < 0 && strstr(bl_last_error(), "vocab file: ") && strstr(bl_last_error(), path) &&
            strstr(bl_last_error(), "is a FIFO, not a regular file"),
        "%s", bl_last_error());
  unlink(path);
  CHECK(bl_open_regular(dir, "input", NULL) < 0 && strstr(bl_last_error(), "is a directory"), "%s", bl_last_error());
  snprintf(path, sizeof path, "%s/absent", dir);
  CHECK(bl_open_regular(path, "input", NULL) < 0 && strstr(bl_last_error(), "cannot open"), "%s", bl_last_error());
  snprintf(path, sizeof path, "%s/plain", dir);
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite("12345", 1, 5, f) == 5 && fclose(f) == 0, "write %s", path);
  int64_t size = -1;
  fd = bl_open_regular(path, "input", &size);
  CHECK(fd >= 0 && size == 5, "open %s: fd %d size %lld", path, fd, (long long)size);
  CHECK(fd >= 0 && !(fcntl(fd, F_GETFL) & O_NONBLOCK), "O_NONBLOCK is cleared");
  if (fd >= 0) close(fd);
  unlink(path);
}

int main(void) {
  char dir[] = "/tmp/bl_test_stream_XXXXXX";
  if (!mkdtemp(dir)) {
    printf("mkdtemp failed\n");
    return 1;
  }
  test_writer(dir);
  test_lines(dir);
  test_open_regular(dir);
  rmdir(dir);
  if (failures) {
    printf("%d failures\n", failures);
    return 1;
  }
  printf("all stream checks passed\n");
  return 0;
}
