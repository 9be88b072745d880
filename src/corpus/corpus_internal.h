/* Internal helpers shared by the src/corpus sources: a growable byte buffer that
 * records allocation failure instead of crashing, entity decoding, UTF-8
 * validation and the reusable wikitext cleaner. Not part of the FFI. */
#ifndef BL_CORPUS_INTERNAL_H
#define BL_CORPUS_INTERNAL_H
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct bl_cbuf {
  char *p;
  size_t n, cap;
  int oom; /* sticky: set when a growth failed; later writes are dropped */
} bl_cbuf;

static inline int bl_cbuf_reserve(bl_cbuf *b, size_t extra) {
  if (b->oom) return -1;
  if (b->n + extra + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->n + extra + 1) {
    if (cap > ((size_t)-1) / 2) {
      b->oom = 1;
      return -1;
    }
    cap *= 2;
  }
  char *p = (char *)realloc(b->p, cap);
  if (!p) {
    b->oom = 1;
    return -1;
  }
  b->p = p;
  b->cap = cap;
  return 0;
}
static inline void bl_cbuf_put(bl_cbuf *b, const char *s, size_t n) {
  if (n == 0 || bl_cbuf_reserve(b, n)) return;
  memcpy(b->p + b->n, s, n);
  b->n += n;
}
static inline void bl_cbuf_putc(bl_cbuf *b, char c) {
  if (b->n + 2 <= b->cap || !bl_cbuf_reserve(b, 1)) b->p[b->n++] = c;
}
static inline void bl_cbuf_free(bl_cbuf *b) {
  free(b->p);
  b->p = NULL;
  b->n = b->cap = 0;
  b->oom = 0;
}

/* Decode &name; &#NNN; &#xHH; in s[0..n) appending to out. `html`: also the
 * common HTML named entities (wikitext), else only the five XML ones.
 * Unknown or malformed entities are copied verbatim. */
void bl_corpus_decode_entities(const char *s, size_t n, int html, bl_cbuf *out);
/* Append the UTF-8 encoding of code point cp (invalid -> U+FFFD). */
void bl_corpus_put_utf8(bl_cbuf *out, uint32_t cp);
/* Offset of the first invalid UTF-8 byte, or n when s is valid. */
size_t bl_corpus_utf8_check(const char *s, size_t n);

typedef struct bl_wikitext_cleaner {
  bl_cbuf a, b;  /* ping-pong buffers between passes */
  bl_cbuf ivals; /* removal intervals (size_t pairs) */
  bl_cbuf stack; /* nesting stack */
} bl_wikitext_cleaner;
/* Clean src into c's buffers; *out points inside c (valid until next call). */
int bl_wikitext_clean_into(bl_wikitext_cleaner *c, const char *src, size_t len, int flags, const char **out,
                           size_t *out_len);
void bl_wikitext_cleaner_free(bl_wikitext_cleaner *c);

#endif
