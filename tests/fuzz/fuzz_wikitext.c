/* libFuzzer target for the corpus text code: the wikitext cleaner (with and
 * without headings), the sentence splitter on its output and on the raw
 * input, and the invariants every caller relies on: no crash, no hang
 * (every pass is linear), output never contains a NUL and is valid UTF-8 when
 * the input is, cleaned text has no blank lines.
 *
 * Build and run (about a minute; not part of ctest because it needs clang):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Isrc \
 *     tests/fuzz/fuzz_wikitext.c src/corpus/wikitext.c src/corpus/entities.c \
 *     src/corpus/sentences.c -DBL_FUZZ_STANDALONE -lutf8proc -o /tmp/fuzz_wikitext
 *   /tmp/fuzz_wikitext -max_total_time=60 -max_len=65536 -timeout=5
 */
#define _GNU_SOURCE /* memmem */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bl_corpus.h"
#include "../../src/corpus/corpus_internal.h"

#ifdef BL_FUZZ_STANDALONE
/* the fuzzer links only src/corpus text code, not the whole library */
int bl_set_error(int status, const char *fmt, ...) {
  static char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return status;
}
#endif

static void check_text(const char *s, size_t n, int input_valid, int cleaned) {
  if (memchr(s, 0, n)) {
    fprintf(stderr, "NUL in output\n");
    abort();
  }
  if (input_valid && bl_corpus_utf8_check(s, n) != n) {
    fprintf(stderr, "invalid UTF-8 produced\n");
    abort();
  }
  if (cleaned && n && (s[0] == '\n' || s[n - 1] == '\n' || memmem(s, n, "\n\n", 2))) {
    fprintf(stderr, "blank line in cleaned text\n");
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *in = (const char *)data;
  /* NUL bytes do not occur in XML text; the cleaner must still survive them */
  int valid = bl_corpus_utf8_check(in, size) == size && !memchr(in, 0, size);
  for (int flags = 0; flags <= 1; flags++) {
    char *out = NULL;
    size_t n = 0;
    if (bl_wikitext_clean(in, size, flags, &out, &n) != 0) continue;
    check_text(out, n, valid, 1);
    char *s = NULL;
    size_t sn = 0, cnt = 0;
    if (bl_sent_split(out, n, &s, &sn, &cnt) == 0) {
      check_text(s, sn, valid, 0);
      size_t lines = 0;
      for (size_t i = 0; i < sn; i++) lines += s[i] == '\n';
      if (lines != cnt) {
        fprintf(stderr, "sentence count mismatch\n");
        abort();
      }
      bl_corpus_free(s);
    }
    bl_corpus_free(out);
  }
  char *s = NULL;
  size_t sn = 0, cnt = 0;
  if (bl_sent_split(in, size, &s, &sn, &cnt) == 0) bl_corpus_free(s);
  return 0;
}
