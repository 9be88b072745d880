/* libFuzzer target for the WordPiece tokenizer (src/text): both cases, every
 * entry point, and the invariants callers rely on: no crash, no hang, no
 * out-of-bounds (ASan), at most one token per input byte, ids in range, basic
 * token indices non-decreasing, byte spans inside the input and ordered, a
 * smaller output buffer gives the same count and prefix, text output has one
 * line per input line, is valid UTF-8 and contains no NUL.
 *
 * The vocab is $BL_FUZZ_VOCAB if set (e.g. shared/data/vocab/bert-base-uncased-vocab.txt),
 * else a small built-in one written to a temp file.
 * Build and run:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Isrc tests/fuzz/fuzz_tokenizer.c \
 *     src/text/tokenizer.c src/text/vocab.c src/base/open.c -DBL_FUZZ_STANDALONE -lutf8proc -o /tmp/fuzz_tokenizer
 *   BL_FUZZ_VOCAB=../shared/data/vocab/bert-base-uncased-vocab.txt \
 *     /tmp/fuzz_tokenizer -max_total_time=60 -max_len=65536 -timeout=5
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bl_base.h"
#include "bl_tokenizer.h"

#ifdef BL_FUZZ_STANDALONE
/* the fuzzer links only src/text, not the whole library */
int bl_set_error(int status, const char *fmt, ...) {
  static char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return status;
}
#endif

static bl_tokenizer *toks[2];

#define DIE(...)                  \
  do {                            \
    fprintf(stderr, __VA_ARGS__); \
    fprintf(stderr, "\n");        \
    abort();                      \
  } while (0)

static size_t utf8_valid(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t k;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
      k = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
      k = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      k = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else
      return i;
    if (i + k >= n || s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t j = 2; j <= k; j++)
      if (s[i + j] < 0x80 || s[i + j] > 0xBF) return i;
    i += k + 1;
  }
  return n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *path = getenv("BL_FUZZ_VOCAB");
  char tmp[] = "/tmp/bl_fuzz_vocab_XXXXXX";
  if (!path) {
    static const char v[] =
        "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\nab\n##a\n##b\n##ab\n.\n,\n\xc3\xa9\n##\xc3\xa9\n"
        "\xe4\xb8\xad\nhello\n##llo\nhe\n[\n]\ncls\n##s\n\xcf\x83\n\xea\xb0\x80\n";
    int fd = mkstemp(tmp);
    if (fd < 0) DIE("mkstemp");
    FILE *f = fdopen(fd, "wb");
    fwrite(v, 1, sizeof v - 1, f);
    fclose(f);
    path = tmp;
  }
  for (int c = 0; c < 2; c++)
    if (bl_tokenizer_load(path, c == 0, &toks[c]) != 0) DIE("cannot load vocab %s", path);
  if (path == tmp) remove(tmp);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *in = (const char *)data;
  size_t cap = size + 1;
  int32_t *ids = malloc(sizeof(int32_t) * cap), *word = malloc(sizeof(int32_t) * cap);
  int64_t *st = malloc(sizeof(int64_t) * cap), *en = malloc(sizeof(int64_t) * cap);
  int32_t *ids2 = malloc(sizeof(int32_t) * cap);
  size_t lines = 0;
  for (size_t i = 0; i < size; i++) lines += data[i] == '\n';
  if (size && data[size - 1] != '\n') lines++;
  for (int c = 0; c < 2; c++) {
    const bl_tokenizer *t = toks[c];
    int vs = bl_tokenizer_vocab_size(t);
    bl_tok_result r = { ids, word, st, en, (int)cap, 0, 0, 0 };
    if (bl_tokenizer_encode_full(t, in, size, &r) != 0) DIE("encode failed");
    if (r.n < 0 || (size_t)r.n > size) DIE("%d tokens from %zu bytes", r.n, size);
    if (r.invalid_utf8 < 0 || (size_t)r.invalid_utf8 > size) DIE("invalid count %lld", (long long)r.invalid_utf8);
    if ((r.invalid_utf8 == 0) != (utf8_valid(data, size) == size)) DIE("invalid count disagrees with validation");
    for (int i = 0; i < r.n; i++) {
      if (ids[i] < 0 || ids[i] >= vs) DIE("id %d out of range", ids[i]);
      if (st[i] < 0 || en[i] > (int64_t)size || st[i] >= en[i])
        DIE("bad span %lld..%lld", (long long)st[i], (long long)en[i]);
      if (word[i] < 0 || word[i] >= r.n_words) DIE("bad word index");
      if (i && (word[i] < word[i - 1] || st[i] < st[i - 1])) DIE("spans not ordered");
    }
    /* a smaller buffer: same count, same prefix, nothing written past cap */
    int n2 = 0, small = r.n / 2;
    ids2[small] = -12345;
    if (bl_tokenizer_encode(t, in, size, ids2, small, &n2) != 0 || n2 != r.n) DIE("count changed with cap");
    if (memcmp(ids, ids2, sizeof(int32_t) * (size_t)small) != 0 || ids2[small] != -12345) DIE("prefix/cap broken");
    for (int mode = 0; mode < 3; mode++) {
      size_t need = 0;
      if (bl_tokenizer_format(t, in, size, mode, NULL, 0, &need, NULL) != 0) DIE("format size failed");
      char *out = malloc(need + 1);
      size_t need2 = 0;
      if (bl_tokenizer_format(t, in, size, mode, out, need, &need2, NULL) != 0 || need2 != need) DIE("format failed");
      size_t ol = 0;
      for (size_t i = 0; i < need; i++) ol += out[i] == '\n';
      if (ol != lines) DIE("mode %d: %zu output lines for %zu input lines", mode, ol, lines);
      if (memchr(out, 0, need)) DIE("NUL in output");
      if (utf8_valid((const unsigned char *)out, need) != need) DIE("invalid UTF-8 in output mode %d", mode);
      free(out);
    }
    int nw = 0;
    if (bl_tokenizer_wordpiece(t, in, size, ids2, (int)cap, &nw) != 0 || nw < 0 || (size_t)nw > size) DIE("wordpiece");
    for (int i = 0; i < nw && i < (int)cap; i++)
      if (ids2[i] < 0 || ids2[i] >= vs) DIE("wordpiece id");
    if (size < 64) {
      char tokstr[64];
      memcpy(tokstr, in, size);
      tokstr[size] = 0;
      int id = bl_tokenizer_id(t, tokstr);
      if (id >= vs) DIE("lookup id");
    }
  }
  free(ids);
  free(word);
  free(st);
  free(en);
  free(ids2);
  return 0;
}
