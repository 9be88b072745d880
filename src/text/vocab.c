/* WordPiece vocabulary: loading vocab.txt and token <-> id lookups.
 * Contract: bl_tokenizer_load reads the whole file once; line i (0-based) is
 * token id i; line ends are LF, CRLF or a lone CR (Python's universal newlines,
 * as HF's load_vocab reads it); a duplicate token maps to its last line (HF's
 * dict assignment) while both ids keep their string; a leading UTF-8 BOM is
 * skipped. The five special tokens must be present. After loading the
 * tokenizer is immutable. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bl_base.h"
#include "bl_tokenizer.h"
#include "text_internal.h"
#include "base/open.h"

const char *const bl_tok_special_names[BL_TOK_NUM_SPECIAL] = { "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]" };

/* strict UTF-8 validation (Unicode table 3-7): returns the offset of the first
 * invalid byte or n */
static size_t utf8_valid_prefix(const unsigned char *s, size_t n) {
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
    if (i + k >= n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t j = 2; j <= k; j++)
      if (s[i + j] < 0x80 || s[i + j] > 0xBF) return i;
    i += k + 1;
  }
  return n;
}

static int table_build(bl_tokenizer *t, bl_tok_table *tab, int skip, int count) {
  uint32_t cap = 16;
  while (cap < (uint32_t)count * 2u + 16u) cap <<= 1;
  tab->slots = malloc(sizeof(bl_tok_slot) * cap);
  if (!tab->slots) return bl_set_error(BL_ENOMEM, "tokenizer: out of memory for the vocab hash table (%s)", t->path);
  for (uint32_t i = 0; i < cap; i++) tab->slots[i].id = -1;
  tab->mask = cap - 1;
  tab->max_len = 0;
  for (int id = 0; id < t->size; id++) {
    const char *s = t->blob + t->off[id];
    size_t n = t->len[id];
    if (skip) {
      if (n < 2 || s[0] != '#' || s[1] != '#') continue;
      s += 2;
      n -= 2;
    }
    uint32_t h = bl_tok_hash(s, n);
    uint32_t i = h & tab->mask;
    for (;; i = (i + 1) & tab->mask) {
      bl_tok_slot *sl = &tab->slots[i];
      if (sl->id < 0) {
        sl->hash = h;
        sl->id = id;
        break;
      }
      if (sl->hash == h && t->len[sl->id] - (uint32_t)skip == n && memcmp(t->blob + t->off[sl->id] + skip, s, n) == 0) {
        sl->id = id;
        break;
      } /* last wins */
    }
    if ((int)n > tab->max_len) tab->max_len = (int)n;
  }
  return 0;
}

void bl_tokenizer_free(bl_tokenizer *t) {
  if (!t) return;
  free(t->blob);
  free(t->off);
  free(t->len);
  free(t->full.slots);
  free(t->cont.slots);
  free(t);
}

int bl_tokenizer_load(const char *path, int lower_case, bl_tokenizer **out) {
  if (!out) return bl_set_error(BL_EINVAL, "tokenizer_load: out is NULL");
  *out = NULL;
  if (!path) return bl_set_error(BL_EINVAL, "tokenizer_load: vocab path is NULL");
  int fd = bl_open_regular(path, "tokenizer_load: vocab file", NULL);
  if (fd < 0) return BL_EIO;
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    return bl_set_error(BL_EIO, "tokenizer_load: cannot open vocab file %s: %s", path, strerror(errno));
  }
  bl_tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    fclose(f);
    return bl_set_error(BL_ENOMEM, "tokenizer_load: out of memory (%s)", path);
  }
  snprintf(t->path, sizeof t->path, "%s", path);
  t->lower = lower_case ? 1 : 0;
  /* read all: vocabularies are a few hundred KB */
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  int rc = 0;
  if (!buf) {
    rc = bl_set_error(BL_ENOMEM, "tokenizer_load: out of memory reading %s", path);
    goto fail;
  }
  for (;;) {
    if (n == cap) {
      if (cap > ((size_t)1 << 31)) {
        rc = bl_set_error(BL_EFORMAT, "tokenizer_load: vocab file %s is larger than 2 GB", path);
        goto fail;
      }
      char *nb = realloc(buf, cap * 2 + 1);
      if (!nb) {
        rc = bl_set_error(BL_ENOMEM, "tokenizer_load: out of memory reading %s", path);
        goto fail;
      }
      buf = nb;
      cap *= 2;
    }
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0) {
      if (ferror(f)) {
        rc = bl_set_error(BL_EIO, "tokenizer_load: read error on vocab file %s", path);
        goto fail;
      }
      break;
    }
  }
  fclose(f);
  f = NULL;
  /* a UTF-8 byte order mark (an editor's) is not part of the first token, which would lose its name */
  if (n >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0) memmove(buf, buf + 3, n -= 3);
  if (n == 0) {
    rc = bl_set_error(BL_EFORMAT, "tokenizer_load: vocab file %s is empty", path);
    goto fail;
  }
  size_t bad = utf8_valid_prefix((const unsigned char *)buf, n);
  if (bad != n) {
    size_t line = 1;
    for (size_t i = 0; i < bad; i++) line += buf[i] == '\n';
    rc = bl_set_error(BL_EFORMAT, "tokenizer_load: vocab file %s: invalid UTF-8 at byte %zu (line %zu)", path, bad,
                      line);
    goto fail;
  }
  if (memchr(buf, 0, n)) {
    rc = bl_set_error(BL_EFORMAT, "tokenizer_load: vocab file %s contains a NUL byte", path);
    goto fail;
  }
  /* count lines: a terminator ends a line; text after the last one is a line too */
  size_t lines = 0;
  for (size_t i = 0; i < n; i++) {
    if (buf[i] == '\n')
      lines++;
    else if (buf[i] == '\r') {
      lines++;
      if (i + 1 < n && buf[i + 1] == '\n') i++;
    }
  }
  if (buf[n - 1] != '\n' && buf[n - 1] != '\r') lines++;
  if (lines > (size_t)INT32_MAX - 1) {
    rc = bl_set_error(BL_EFORMAT, "tokenizer_load: vocab file %s has too many lines", path);
    goto fail;
  }
  t->size = (int)lines;
  t->off = malloc(sizeof(uint32_t) * lines);
  t->len = malloc(sizeof(uint32_t) * lines);
  if (!t->off || !t->len) {
    rc = bl_set_error(BL_ENOMEM, "tokenizer_load: out of memory (%s)", path);
    goto fail;
  }
  /* turn terminators into NULs in place: the buffer becomes the blob */
  size_t id = 0, start = 0;
  for (size_t i = 0; i <= n; i++) {
    if (i == n) {
      if (start < n) {
        t->off[id] = (uint32_t)start;
        t->len[id] = (uint32_t)(n - start);
        id++;
      }
      break;
    }
    if (buf[i] == '\n' || buf[i] == '\r') {
      t->off[id] = (uint32_t)start;
      t->len[id] = (uint32_t)(i - start);
      id++;
      int crlf = buf[i] == '\r' && i + 1 < n && buf[i + 1] == '\n';
      buf[i] = 0;
      if (crlf) i++;
      start = i + 1;
    }
  }
  buf[n] = 0;
  t->blob = buf;
  buf = NULL;
  if ((rc = table_build(t, &t->full, 0, t->size)) != 0) goto fail;
  if ((rc = table_build(t, &t->cont, 2, t->size)) != 0) goto fail;
  char missing[64] = "";
  for (int k = 0; k < BL_TOK_NUM_SPECIAL; k++) {
    const char *s = bl_tok_special_names[k];
    t->special[k] = bl_tok_lookup(t, &t->full, 0, s, strlen(s));
    if (t->special[k] < 0) {
      strcat(missing, " ");
      strcat(missing, s);
    }
  }
  if (missing[0]) {
    rc = bl_set_error(BL_EFORMAT, "tokenizer_load: vocab file %s lacks the special token(s)%s (%d lines read)", path,
                      missing, t->size);
    goto fail;
  }
  *out = t;
  return 0;
fail:
  if (f) fclose(f);
  free(buf);
  bl_tokenizer_free(t);
  return rc;
}

int bl_tokenizer_vocab_size(const bl_tokenizer *t) { return t ? t->size : 0; }
int bl_tokenizer_lower_case(const bl_tokenizer *t) { return t ? t->lower : 0; }

int bl_tokenizer_id_n(const bl_tokenizer *t, const char *s, size_t n) {
  if (!t || !s) return -1;
  return bl_tok_lookup(t, &t->full, 0, s, n);
}

int bl_tokenizer_id(const bl_tokenizer *t, const char *s) {
  if (!s) return -1;
  return bl_tokenizer_id_n(t, s, strlen(s));
}

const char *bl_tokenizer_token(const bl_tokenizer *t, int id) {
  if (!t || id < 0 || id >= t->size) return NULL;
  return t->blob + t->off[id];
}

int bl_tokenizer_special_id(const bl_tokenizer *t, int which) {
  if (!t || which < 0 || which >= BL_TOK_NUM_SPECIAL)
    return bl_set_error(BL_EINVAL, "tokenizer_special_id: which must be 0..4, got %d", which);
  return t->special[which];
}
