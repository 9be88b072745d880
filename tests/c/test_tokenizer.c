/* C tests of the WordPiece tokenizer (src/text): hand-checked tokenizations on
 * a small vocab, offsets, vocab file errors, bad input (invalid UTF-8, NUL,
 * a 1 MB word, 1 MB of combining marks), and concurrent encoding from several
 * threads against the single-thread result. The exactness tests against the
 * Hugging Face reference on real text are in tests/lua/test_tokenizer.lua. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bertlua.h"

static int failures = 0;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      failures++;                                          \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
    }                                                      \
  } while (0)

static char tmpdir[256];

static const char *write_file(const char *name, const char *content, size_t n) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fwrite(content, 1, n, f);
  fclose(f);
  return path;
}

/* tokens of text as one space-separated string (mode 0) */
static char *fmt(const bl_tokenizer *t, const char *text, int mode) {
  size_t need = 0;
  int rc = bl_tokenizer_format(t, text, strlen(text), mode, NULL, 0, &need, NULL);
  if (rc) {
    fprintf(stderr, "format: %s\n", bl_last_error());
    return strdup("<error>");
  }
  char *o = malloc(need + 1);
  bl_tokenizer_format(t, text, strlen(text), mode, o, need, &need, NULL);
  if (need && o[need - 1] == '\n') need--;
  o[need] = 0;
  return o;
}

static void expect(const bl_tokenizer *t, const char *text, int mode, const char *want) {
  char *got = fmt(t, text, mode);
  CHECK(strcmp(got, want) == 0, "tokenize(\"%s\") mode %d: got \"%s\", want \"%s\"", text, mode, got, want);
  free(got);
}

static const char small_vocab[] =
    "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nun\n##aff\n##able\nhello\n,\nworld\n!\nnaive\n.\n"
    "a\n##b\n##c\nab\n中\n文\ncafe\ncafé\n[\n]\n##s\ncl\nσ\n##\xcc\x81\n";

static void test_small(void) {
  bl_tokenizer *lo = NULL, *ca = NULL;
  const char *p = write_file("small.txt", small_vocab, sizeof small_vocab - 1);
  CHECK(bl_tokenizer_load(p, 1, &lo) == 0, "load: %s", bl_last_error());
  CHECK(bl_tokenizer_load(p, 0, &ca) == 0, "load cased: %s", bl_last_error());
  if (!lo || !ca) return;
  CHECK(bl_tokenizer_vocab_size(lo) == 28, "size %d", bl_tokenizer_vocab_size(lo));
  CHECK(bl_tokenizer_id(lo, "[UNK]") == 1 && bl_tokenizer_id(lo, "##able") == 7, "ids");
  CHECK(bl_tokenizer_id(lo, "nope") == -1, "absent id");
  CHECK(strcmp(bl_tokenizer_token(lo, 8), "hello") == 0, "token(8)");
  CHECK(bl_tokenizer_token(lo, 28) == NULL && bl_tokenizer_token(lo, -1) == NULL, "token out of range");
  CHECK(bl_tokenizer_special_id(lo, 4) == 4 && bl_tokenizer_special_id(lo, 2) == 2, "special ids");

  expect(lo, "UNaffable", 0, "un ##aff ##able");
  expect(lo, "Hello,World!", 0, "hello , world !");
  expect(lo, "NAÏVE", 0, "naive");
  expect(lo, "Café", 0, "cafe");
  expect(ca, "café", 0, "café");
  /* cased text is not normalized (Google's tokenization.py, HF tokenizers): e + U+0301 stays two */
  expect(ca, "cafe\xcc\x81", 0, "cafe ##\xcc\x81");
  expect(lo, "abc abx", 0, "ab ##c [UNK]"); /* greedy longest first; "##x" fails -> whole word [UNK] */
  expect(lo, "中文", 0, "中 文");
  expect(lo,
         "a\xe4\xb8\xad"
         "b",
         0, "a 中 [UNK]"); /* "b" alone is not a whole-word token */
  expect(lo, "[CLS] hello [SEP]", 0, "[CLS] hello [SEP]");
  expect(lo, "hello[MASK]world", 0, "hello [MASK] world");
  expect(lo, "[cls]", 0, "[ cl ##s ]"); /* specials are case-sensitive */
  expect(ca, "[CL\x01S]", 0, "[CLS]");  /* cased: a word that is a special after cleaning */
  expect(lo, "", 0, "");
  expect(lo, " \t \r ", 0, "");
  expect(lo, "\xce\xa3", 0, "σ");                         /* Σ lowercases per character: never final ς */
  expect(lo, "hello\xe2\x80\xa8world", 0, "hello world"); /* U+2028 separates words */
  expect(lo, "hello\xc2\xa0world", 0, "hello world");     /* NBSP (Zs) */
  expect(lo, "hel\xe2\x80\x8blo", 0, "hello");            /* ZWSP (Cf) is dropped, does not split */
  expect(lo, "Hello\n\nworld\n", 0, "hello\n\nworld");
  expect(lo, "Hello, world", 1, "8 9 10");
  expect(lo, "Héllo,wörld!", 2, "hello , world !");
  expect(ca, "Héllo,wörld!", 2, "Héllo , wörld !");

  /* wordpiece alone */
  int32_t ids[8];
  int n = 0;
  CHECK(bl_tokenizer_wordpiece(lo, "unaffable", 9, ids, 8, &n) == 0 && n == 3 && ids[0] == 5 && ids[1] == 6 &&
            ids[2] == 7,
        "wordpiece unaffable n=%d", n);
  CHECK(bl_tokenizer_wordpiece(lo, "unaffablex", 10, ids, 8, &n) == 0 && n == 1 && ids[0] == 1, "wordpiece -> [UNK]");

  /* offsets: basic tokens UNaff | , | café; byte spans in the original text */
  const char *text = "  UNaff, café";
  int32_t wid[16], word[16];
  int64_t st[16], en[16];
  bl_tok_result r = { wid, word, st, en, 16, 0, 0, 0 };
  CHECK(bl_tokenizer_encode_full(lo, text, strlen(text), &r) == 0, "encode_full");
  CHECK(r.n == 4 && r.n_words == 3, "n=%d words=%d", r.n, r.n_words);
  if (r.n == 4) {
    CHECK(wid[0] == 5 && wid[1] == 6 && wid[2] == 9 && wid[3] == 20, "ids %d %d %d %d", wid[0], wid[1], wid[2], wid[3]);
    CHECK(word[0] == 0 && word[1] == 0 && word[2] == 1 && word[3] == 2, "word index");
    CHECK(st[0] == 2 && en[0] == 7 && st[1] == 2 && en[1] == 7, "span of UNaff: %lld..%lld", (long long)st[0],
          (long long)en[0]);
    CHECK(st[2] == 7 && en[2] == 8, "span of ,");
    CHECK(st[3] == 9 && en[3] == 14, "span of café (5 bytes): %lld..%lld", (long long)st[3], (long long)en[3]);
  }
  /* capacity smaller than the result: n is the full count, nothing past cap written */
  int32_t small[2] = { -7, -7 };
  CHECK(bl_tokenizer_encode(lo, "hello , world !", 15, small, 1, &n) == 0 && n == 4 && small[0] == 8 && small[1] == -7,
        "cap 1: n=%d", n);
  bl_tokenizer_free(lo);
  bl_tokenizer_free(ca);
}

static void test_vocab_errors(void) {
  bl_tokenizer *t = NULL;
  char missing[300];
  snprintf(missing, sizeof missing, "%s/no_such_vocab.txt", tmpdir);
  CHECK(bl_tokenizer_load(missing, 1, &t) == BL_EIO && t == NULL, "missing file");
  CHECK(strstr(bl_last_error(), "no_such_vocab.txt") != NULL, "message names the file: %s", bl_last_error());
  const char *p = write_file("empty.txt", "", 0);
  CHECK(bl_tokenizer_load(p, 1, &t) == BL_EFORMAT && strstr(bl_last_error(), "empty.txt") &&
            strstr(bl_last_error(), "empty"),
        "empty vocab: %s", bl_last_error());
  const char nounk[] = "[PAD]\n[CLS]\n[SEP]\n[MASK]\nhello\n";
  p = write_file("nounk.txt", nounk, sizeof nounk - 1);
  CHECK(bl_tokenizer_load(p, 1, &t) == BL_EFORMAT && strstr(bl_last_error(), "[UNK]") &&
            strstr(bl_last_error(), "nounk.txt"),
        "no [UNK]: %s", bl_last_error());
  const char bad[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nh\xffi\n";
  p = write_file("badutf8.txt", bad, sizeof bad - 1);
  CHECK(bl_tokenizer_load(p, 1, &t) == BL_EFORMAT && strstr(bl_last_error(), "line 6"), "bad UTF-8: %s",
        bl_last_error());
  /* CRLF and a last line without newline */
  const char crlf[] = "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[MASK]\r\nhello\r\nworld";
  p = write_file("crlf.txt", crlf, sizeof crlf - 1);
  CHECK(bl_tokenizer_load(p, 1, &t) == 0, "crlf: %s", bl_last_error());
  if (t) {
    CHECK(bl_tokenizer_vocab_size(t) == 7 && bl_tokenizer_id(t, "hello") == 5 && bl_tokenizer_id(t, "world") == 6,
          "crlf ids: size %d", bl_tokenizer_vocab_size(t));
    bl_tokenizer_free(t);
  }
  CHECK(bl_tokenizer_load(NULL, 1, &t) == BL_EINVAL, "NULL path");
}

static void test_bad_input(const char *vocab) {
  bl_tokenizer *t = NULL;
  if (bl_tokenizer_load(vocab, 1, &t)) {
    CHECK(0, "load %s: %s", vocab, bl_last_error());
    return;
  }
  /* invalid UTF-8 is dropped (joins its neighbours) and counted per maximal subpart */
  const char bad[] = "hel\xfflo w\xe4\xb8or\xed\xa0\x80ld \xc0\xaf!";
  int32_t ids[64];
  bl_tok_result r = { ids, NULL, NULL, NULL, 64, 0, 0, 0 };
  CHECK(bl_tokenizer_encode_full(t, bad, sizeof bad - 1, &r) == 0, "invalid utf8");
  /* \xff | \xe4\xb8 | \xed | \xa0 | \x80 | \xc0 | \xaf  = 7 replacements, like Python */
  CHECK(r.invalid_utf8 == 7, "invalid count %lld", (long long)r.invalid_utf8);
  CHECK(r.n == 3, "hello world ! -> 3 tokens, got %d", r.n);
  /* NUL bytes inside the length are control characters: dropped */
  const char nul[] = "hel\0lo\0 \0world";
  int n = 0;
  CHECK(bl_tokenizer_encode(t, nul, sizeof nul - 1, ids, 64, &n) == 0 && n == 2 && ids[0] == 7592 && ids[1] == 2088,
        "NUL: n=%d", n);
  /* a 1 MB word: one [UNK], quickly */
  size_t big = 1 << 20;
  char *w = malloc(big);
  for (size_t i = 0; i < big; i++) w[i] = (char)('a' + i % 26);
  CHECK(bl_tokenizer_encode(t, w, big, ids, 64, &n) == 0 && n == 1 && ids[0] == 100, "1 MB word: n=%d", n);
  /* 1 MB of "a." -> 2^20 tokens: needs a big buffer, and n reports it even when cap is small */
  for (size_t i = 0; i < big; i += 2) {
    w[i] = 'a';
    w[i + 1] = '.';
  }
  CHECK(bl_tokenizer_encode(t, w, big, ids, 64, &n) == 0 && n == (int)big, "a. x 512K: n=%d", n);
  /* 1 MB of combining marks after one letter, alternating classes (worst
   * case for canonical reordering): stripped in uncased mode */
  for (size_t i = 0; i + 1 < big; i += 2) {
    w[i] = (char)0xCC;
    w[i + 1] = (char)((i / 2) % 2 ? 0x81 : 0x96); /* U+0301 (230), U+0316 (220) */
  }
  w[0] = 'a';
  w[1] = ' ';
  memcpy(w, "hello ", 6);
  CHECK(bl_tokenizer_encode(t, w, big, ids, 64, &n) == 0 && n == 1 && ids[0] == 7592, "combining run: n=%d", n);
  bl_tokenizer_free(t);
  /* cased: the run stays, one [UNK] for the over-long word */
  const char *cv = getenv("BL_TEST_CASED_VOCAB");
  if (cv && bl_tokenizer_load(cv, 0, &t) == 0) {
    CHECK(bl_tokenizer_encode(t, w, big, ids, 64, &n) == 0 && n == 2 && ids[1] == 100, "cased combining run: n=%d", n);
    bl_tokenizer_free(t);
  }
  free(w);
  CHECK(bl_tokenizer_encode(NULL, "x", 1, ids, 4, &n) == BL_EINVAL, "NULL tokenizer");
}

typedef struct {
  const bl_tokenizer *t;
  const char *text;
  size_t len;
  int32_t *ids;
  int n;
  int rc;
} job;

static void *worker(void *arg) {
  job *j = arg;
  for (int rep = 0; rep < 3 && j->rc == 0; rep++)
    j->rc = bl_tokenizer_encode(j->t, j->text, j->len, j->ids, (int)j->len + 1, &j->n);
  return NULL;
}

static void test_threads(const char *vocab, const char *text_path) {
  bl_tokenizer *t = NULL;
  if (bl_tokenizer_load(vocab, 1, &t)) return;
  FILE *f = fopen(text_path, "rb");
  if (!f) {
    bl_tokenizer_free(t);
    return;
  }
  size_t cap = 300000;
  char *text = malloc(cap);
  size_t len = fread(text, 1, cap, f);
  fclose(f);
  int32_t *want = malloc(sizeof(int32_t) * (len + 1));
  int nwant = 0;
  CHECK(bl_tokenizer_encode(t, text, len, want, (int)len + 1, &nwant) == 0 && nwant > 1000, "single thread n=%d",
        nwant);
  enum { NT = 4 };
  job jobs[NT];
  pthread_t th[NT];
  for (int k = 0; k < NT; k++) {
    jobs[k] = (job){ t, text, len, malloc(sizeof(int32_t) * (len + 1)), 0, 0 };
    pthread_create(&th[k], NULL, worker, &jobs[k]);
  }
  for (int k = 0; k < NT; k++) {
    pthread_join(th[k], NULL);
    CHECK(jobs[k].rc == 0 && jobs[k].n == nwant && memcmp(jobs[k].ids, want, sizeof(int32_t) * (size_t)nwant) == 0,
          "thread %d differs", k);
    free(jobs[k].ids);
  }
  free(want);
  free(text);
  bl_tokenizer_free(t);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/bl_test_tokenizer_XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_small();
  test_vocab_errors();
  const char *base = getenv("BL_SHARED_DATA");
  char vocab[512], cased[512], book[512];
  snprintf(vocab, sizeof vocab, "%s/vocab/bert-base-uncased-vocab.txt", base ? base : "../shared/data");
  snprintf(cased, sizeof cased, "%s/vocab/bert-base-cased-vocab.txt", base ? base : "../shared/data");
  snprintf(book, sizeof book, "%s/books/pg1342-0.txt", base ? base : "../shared/data");
  FILE *f = fopen(vocab, "rb");
  if (f) {
    fclose(f);
    setenv("BL_TEST_CASED_VOCAB", cased, 1);
    test_bad_input(vocab);
    test_threads(vocab, book);
  } else {
    printf("note: %s absent, real-vocab tests not run\n", vocab);
  }
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  if (failures) {
    printf("%d failures\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
