/* BERT tokenization (BasicTokenizer + WordPiece) in one pass over UTF-8 bytes.
 * The contract and the exact pipeline are in src/bl_tokenizer.h.
 *
 * How one pass can reproduce the reference's whole-string steps (clean, CJK
 * spacing, split, lower, NFD, strip accents, punctuation split):
 * cleaned code points are grouped into "segments": a segment starts at a code
 * point that no normalization can merge with what precedes it (combining
 * class 0, not the second half of a canonical composition, not a Hangul
 * V/T jamo, and not decomposing into something that starts with a combining
 * mark). Normalizing each segment separately gives exactly the normalization
 * of the whole word, and every normalized code point inherits its segment's
 * byte span in the input, which is how offsets survive normalization.
 * ASCII is always a segment start, so plain ASCII text takes a fast path.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "bl_base.h"
#include "bl_tokenizer.h"
#include "text_internal.h"

/* ------------------------------------------------------------ character classes */
enum { A_WORD = 0, A_WS = 1, A_CTRL = 2, A_PUNCT = 3 };
static unsigned char ascii_class[128];
static unsigned char ascii_lower[128];
static int tables_ready;

static void init_tables(void) {
  /* idempotent and identical in every thread: a benign race at worst */
  if (__atomic_load_n(&tables_ready, __ATOMIC_ACQUIRE)) return;
  for (int c = 0; c < 128; c++) {
    unsigned char k = A_WORD;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
      k = A_WS;
    else if (c < 32 || c == 127)
      k = A_CTRL;
    else if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126))
      k = A_PUNCT;
    ascii_class[c] = k;
    ascii_lower[c] = (unsigned char)((c >= 'A' && c <= 'Z') ? c + 32 : c);
  }
  __atomic_store_n(&tables_ready, 1, __ATOMIC_RELEASE);
}

static inline int is_chinese(int32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

static inline int is_punct(int32_t cp) {
  if (cp < 128) return ascii_class[cp] == A_PUNCT;
  int c = utf8proc_category(cp);
  return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

/* may this code point start a normalization segment? (see the file comment) */
static int is_boundary(int32_t cp) {
  if (cp < 0x300) return 1; /* nothing below U+0300 combines with what precedes it */
  if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2)) return 0; /* Hangul V, T */
  const utf8proc_property_t *p = utf8proc_get_property(cp);
  if (p->combining_class != 0) return 0;
  if (p->comb_index != UINT16_MAX && (p->comb_index & 0x8000)) return 0; /* second of a pair */
  if (p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) {
    int32_t d[8];
    utf8proc_ssize_t k = utf8proc_decompose_char(cp, d, 8, UTF8PROC_DECOMPOSE, NULL);
    if (k >= 1 && k <= 8 && d[0] != cp) return is_boundary(d[0]);
  }
  return 1;
}

/* strict UTF-8 decode of one code point; on an invalid sequence returns -1 and
 * sets *adv to the length of its maximal subpart (Python's "replace" unit) */
static inline int32_t decode(const unsigned char *s, size_t n, size_t *adv) {
  unsigned c = s[0];
  size_t k;
  unsigned lo = 0x80, hi = 0xBF;
  int32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    k = 1;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    k = 2;
    cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    k = 3;
    cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *adv = 1;
    return -1;
  }
  for (size_t j = 1; j <= k; j++) {
    if (j >= n) {
      *adv = j;
      return -1;
    }
    unsigned b = s[j];
    if (j == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) {
      *adv = j;
      return -1;
    }
    cp = (cp << 6) | (int32_t)(b & 0x3F);
  }
  *adv = k + 1;
  return cp;
}

static inline int encode_utf8(int32_t cp, char *o) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* ------------------------------------------------------------ output sinks */
enum { SINK_RESULT = -1, SINK_TOKENS = 0, SINK_IDS = 1, SINK_BASIC = 2 };

typedef struct sink {
  int mode;
  bl_tok_result *res; /* SINK_RESULT */
  int n, n_words;
  char *out;
  size_t cap, len; /* text modes */
  int line_has_tok;
} sink;

typedef struct sink_mark {
  int n, n_words, line_has_tok;
  size_t len;
} sink_mark;

static inline void put_bytes(sink *sk, const char *s, size_t k) {
  if (sk->len + k <= sk->cap) memcpy(sk->out + sk->len, s, k);
  sk->len += k;
}
static inline void put_sep(sink *sk) {
  if (sk->line_has_tok) put_bytes(sk, " ", 1);
  sk->line_has_tok = 1;
}

/* ------------------------------------------------------------ engine */
#define SEG_STACK  64
#define NORM_STACK 256
#define TB_CAP     (BL_TOK_MAX_WORD_CHARS * 4 + 8)

typedef struct eng {
  const bl_tokenizer *tok;
  sink *sk;
  int lower;
  int status;
  /* current basic token */
  int tactive, tchars, tlen;
  int64_t tstart, tend;
  char tb[TB_CAP];
  int cpos[BL_TOK_MAX_WORD_CHARS + 2];
  /* current whitespace word (cased mode compares it with the special tokens) */
  int wactive, wlen;
  int64_t wstart, wend;
  char wb[16];
  sink_mark wmark;
  /* pending normalization segment */
  int32_t *seg;
  int seglen, segcap;
  int64_t segstart, segend;
  int32_t segstack[SEG_STACK];
  int32_t *norm;
  int normcap;
  int32_t normstack[NORM_STACK];
  int64_t invalid;
} eng;

static void eng_init(eng *e, const bl_tokenizer *tok, sink *sk) {
  e->tok = tok;
  e->sk = sk;
  e->lower = tok->lower;
  e->status = 0;
  e->tactive = 0;
  e->wactive = 0;
  e->seg = e->segstack;
  e->seglen = 0;
  e->segcap = SEG_STACK;
  e->norm = e->normstack;
  e->normcap = NORM_STACK;
  e->invalid = 0;
}

static void eng_release(eng *e) {
  if (e->seg != e->segstack) free(e->seg);
  if (e->norm != e->normstack) free(e->norm);
  e->seg = e->segstack;
  e->segcap = SEG_STACK;
  e->norm = e->normstack;
  e->normcap = NORM_STACK;
}

static inline sink_mark sink_get_mark(const sink *sk) {
  sink_mark m = { sk->n, sk->n_words, sk->line_has_tok, sk->len };
  return m;
}
static inline void sink_rollback(sink *sk, sink_mark m) {
  sk->n = m.n;
  sk->n_words = m.n_words;
  sk->line_has_tok = m.line_has_tok;
  sk->len = m.len;
}

/* one WordPiece token of the current basic token */
static inline void emit_piece(eng *e, int id, int word, int64_t s, int64_t t) {
  sink *sk = e->sk;
  if (sk->mode == SINK_RESULT) {
    bl_tok_result *r = sk->res;
    if (sk->n < r->cap) {
      if (r->ids) r->ids[sk->n] = id;
      if (r->word) r->word[sk->n] = word;
      if (r->start) r->start[sk->n] = s;
      if (r->end) r->end[sk->n] = t;
    }
  } else if (sk->mode == SINK_TOKENS) {
    put_sep(sk);
    put_bytes(sk, e->tok->blob + e->tok->off[id], e->tok->len[id]);
  } else if (sk->mode == SINK_IDS) {
    char num[16];
    int k = snprintf(num, sizeof num, "%d", id);
    put_sep(sk);
    put_bytes(sk, num, (size_t)k);
  }
  sk->n++;
}

/* greedy longest-match-first over tb[0..tlen) with char offsets cpos */
static void wordpiece(eng *e, const char *tb, const int *cpos, int nchars, int over, int word, int64_t s, int64_t t) {
  const bl_tokenizer *tok = e->tok;
  int unk = tok->special[1];
  if (over || nchars > BL_TOK_MAX_WORD_CHARS) {
    emit_piece(e, unk, word, s, t);
    return;
  }
  sink_mark m = sink_get_mark(e->sk);
  int start = 0;
  while (start < nchars) {
    const bl_tok_table *tab = start == 0 ? &tok->full : &tok->cont;
    int skip = start == 0 ? 0 : 2;
    int end = nchars, id = -1;
    while (end > start && cpos[end] - cpos[start] > tab->max_len) end--;
    for (; end > start; end--) {
      id = bl_tok_lookup(tok, tab, skip, tb + cpos[start], (size_t)(cpos[end] - cpos[start]));
      if (id >= 0) break;
    }
    if (id < 0) {
      sink_rollback(e->sk, m);
      emit_piece(e, unk, word, s, t);
      return;
    }
    emit_piece(e, id, word, s, t);
    start = end;
  }
}

static inline void tok_begin(eng *e, int64_t s) {
  e->tactive = 1;
  e->tchars = 0;
  e->tlen = 0;
  e->tstart = s;
  e->cpos[0] = 0;
  if (e->sk->mode == SINK_BASIC) put_sep(e->sk);
}

static inline void tok_put(eng *e, int32_t cp, int64_t t) {
  e->tend = t;
  if (e->sk->mode == SINK_BASIC) {
    char u[4];
    put_bytes(e->sk, u, (size_t)encode_utf8(cp, u));
    e->tchars++;
    return;
  }
  if (e->tchars < BL_TOK_MAX_WORD_CHARS + 1) {
    e->tlen += encode_utf8(cp, e->tb + e->tlen);
    e->cpos[e->tchars + 1] = e->tlen;
  }
  e->tchars++;
}

static void tok_end(eng *e) {
  if (!e->tactive) return;
  e->tactive = 0;
  int word = e->sk->n_words++;
  if (e->sk->mode == SINK_BASIC) return; /* already streamed out */
  wordpiece(e, e->tb, e->cpos, e->tchars, e->tchars > BL_TOK_MAX_WORD_CHARS, word, e->tstart, e->tend);
}

/* a normalized code point of the current word, with its segment's span */
static inline void feed(eng *e, int32_t cp, int64_t s, int64_t t) {
  if (e->wlen >= 0) { /* cased: remember the word's first bytes (specials are <= 6) */
    if (e->wlen <= 8)
      e->wlen += encode_utf8(cp, e->wb + e->wlen);
    else
      e->wlen = -1;
  }
  e->wend = t;
  if (is_punct(cp)) {
    tok_end(e);
    tok_begin(e, s);
    tok_put(e, cp, t);
    tok_end(e);
  } else {
    if (!e->tactive) tok_begin(e, s);
    tok_put(e, cp, t);
  }
}

static inline void word_begin(eng *e, int64_t s) {
  e->wactive = 1;
  e->wstart = s;
  e->wend = s;
  e->wlen = e->lower ? -1 : 0; /* uncased: the slow tokenizer lowercases before its never_split test */
  e->wmark = sink_get_mark(e->sk);
}

static int grow(eng *e, int32_t **buf, int *cap, int32_t *stack, int need) {
  if (need <= *cap) return 0;
  int nc = *cap;
  while (nc < need) {
    if (nc > INT_MAX / 2) {
      e->status = bl_set_error(BL_ENOMEM, "tokenizer: normalization run too long");
      return -1;
    }
    nc *= 2;
  }
  int32_t *nb = *buf == stack ? malloc(sizeof(int32_t) * (size_t)nc) : realloc(*buf, sizeof(int32_t) * (size_t)nc);
  if (!nb) {
    e->status = bl_set_error(BL_ENOMEM, "tokenizer: out of memory normalizing %d code points", need);
    return -1;
  }
  if (*buf == stack) memcpy(nb, stack, sizeof(int32_t) * (size_t)*cap);
  *buf = nb;
  *cap = nc;
  return 0;
}

/* canonical ordering: stable sort of each run of non-starters by combining class */
static void reorder(int32_t *b, int n) {
  for (int i = 0; i < n;) {
    if (utf8proc_get_property(b[i])->combining_class == 0) {
      i++;
      continue;
    }
    int j = i;
    while (j < n && utf8proc_get_property(b[j])->combining_class != 0) j++;
    /* insertion sort: runs are short in real text; a long adversarial run is
     * bounded by 255 distinct classes, so use buckets for those */
    if (j - i <= 32) {
      for (int a = i + 1; a < j; a++) {
        int32_t x = b[a];
        int cx = utf8proc_get_property(x)->combining_class;
        int k = a - 1;
        while (k >= i && utf8proc_get_property(b[k])->combining_class > cx) {
          b[k + 1] = b[k];
          k--;
        }
        b[k + 1] = x;
      }
    } else {
      /* stable counting sort by class */
      int m = j - i;
      int32_t *tmp = malloc(sizeof(int32_t) * (size_t)m + (size_t)m);
      if (tmp) {
        unsigned char *cls = (unsigned char *)(tmp + m);
        int count[257] = { 0 };
        for (int a = 0; a < m; a++) {
          cls[a] = (unsigned char)utf8proc_get_property(b[i + a])->combining_class;
          count[cls[a] + 1]++;
        }
        for (int c = 1; c < 257; c++) count[c] += count[c - 1];
        for (int a = 0; a < m; a++) tmp[count[cls[a]]++] = b[i + a];
        memcpy(b + i, tmp, sizeof(int32_t) * (size_t)m);
        free(tmp);
      }
    }
    i = j;
  }
}

/* normalize the pending segment and feed its code points */
static void seg_flush(eng *e) {
  int k = e->seglen;
  if (!k) return;
  e->seglen = 0;
  int64_t s = e->segstart, t = e->segend;
  int32_t c0 = e->seg[0];
  if (k == 1 && c0 < 128) {
    feed(e, e->lower ? ascii_lower[c0] : c0, s, t);
    return;
  }
  if (!e->lower) { /* cased: no normalization, as Google's tokenization.py and HF tokenizers */
    for (int i = 0; i < k; i++) feed(e, e->seg[i], s, t);
    return;
  }
  /* uncased: lowercase, decompose, drop the accents */
  int n = 0;
  for (int i = 0; i < k; i++) {
    int32_t low[2];
    int nl = 1;
    low[0] = e->seg[i];
    if (low[0] == 0x130) {
      low[0] = 'i';
      low[1] = 0x307;
      nl = 2;
    } /* Python's full lowercase of U+0130 */
    else
      low[0] = utf8proc_tolower(low[0]);
    for (int j = 0; j < nl; j++) {
      if (grow(e, &e->norm, &e->normcap, e->normstack, n + 8)) return;
      utf8proc_ssize_t d = utf8proc_decompose_char(low[j], e->norm + n, e->normcap - n, UTF8PROC_DECOMPOSE, NULL);
      if (d > e->normcap - n) {
        if (grow(e, &e->norm, &e->normcap, e->normstack, n + (int)d)) return;
        d = utf8proc_decompose_char(low[j], e->norm + n, e->normcap - n, UTF8PROC_DECOMPOSE, NULL);
      }
      if (d < 0) {
        e->norm[n] = low[j];
        d = 1;
      }
      n += (int)d;
    }
  }
  reorder(e->norm, n);
  for (int i = 0; i < n; i++)
    if (utf8proc_category(e->norm[i]) != UTF8PROC_CATEGORY_MN) feed(e, e->norm[i], s, t);
}

static inline void seg_push(eng *e, int32_t cp, int64_t s, int64_t t) {
  if (e->seglen == 0)
    e->segstart = s;
  else if (e->seglen == e->segcap && grow(e, &e->seg, &e->segcap, e->segstack, e->seglen + 1))
    return;
  e->seg[e->seglen++] = cp;
  e->segend = t;
}

static void emit_special(eng *e, int which, int64_t s, int64_t t) {
  int word = e->sk->n_words++;
  if (e->sk->mode == SINK_BASIC) {
    put_sep(e->sk);
    put_bytes(e->sk, bl_tok_special_names[which], strlen(bl_tok_special_names[which]));
    e->sk->n++;
  } else {
    emit_piece(e, e->tok->special[which], word, s, t);
  }
}

static void word_end(eng *e) {
  seg_flush(e);
  tok_end(e);
  if (!e->wactive) return;
  e->wactive = 0;
  if (e->wlen >= 5) { /* cased: a word that is a special token after cleaning stays whole */
    for (int k = 0; k < BL_TOK_NUM_SPECIAL; k++) {
      const char *sp = bl_tok_special_names[k];
      if ((int)strlen(sp) == e->wlen && memcmp(sp, e->wb, (size_t)e->wlen) == 0) {
        sink_rollback(e->sk, e->wmark);
        emit_special(e, k, e->wstart, e->wend);
        break;
      }
    }
  }
}

static inline int special_at(const char *s, size_t n) {
  if (n < 5 || s[0] != '[') return -1;
  for (int k = 0; k < BL_TOK_NUM_SPECIAL; k++) {
    const char *sp = bl_tok_special_names[k];
    size_t l = strlen(sp);
    if (n >= l && memcmp(s, sp, l) == 0) return k;
  }
  return -1;
}

/* the whole pipeline over text[0..len); offsets are reported relative to base */
static int run(eng *e, const char *text, size_t len, int64_t base) {
  const unsigned char *u = (const unsigned char *)text;
  size_t i = 0;
  while (i < len && e->status == 0) {
    unsigned c = u[i];
    if (c < 0x80) {
      int k = ascii_class[c];
      if (k == A_WS) {
        word_end(e);
        i++;
        continue;
      }
      if (k == A_CTRL) {
        i++;
        continue;
      }
      if (c == '[') {
        int sp = special_at(text + i, len - i);
        if (sp >= 0) {
          word_end(e);
          size_t l = strlen(bl_tok_special_names[sp]);
          emit_special(e, sp, base + (int64_t)i, base + (int64_t)(i + l));
          i += l;
          continue;
        }
      }
      if (!e->wactive) word_begin(e, base + (int64_t)i);
      seg_flush(e);
      /* a following printable ASCII byte (or the end) closes this segment now */
      if (i + 1 == len || (u[i + 1] < 0x80 && ascii_class[u[i + 1]] != A_CTRL)) {
        feed(e, e->lower ? ascii_lower[c] : (int32_t)c, base + (int64_t)i, base + (int64_t)i + 1);
      } else {
        seg_push(e, (int32_t)c, base + (int64_t)i, base + (int64_t)i + 1);
      }
      i++;
      continue;
    }
    size_t adv;
    int32_t cp = decode(u + i, len - i, &adv);
    int64_t s = base + (int64_t)i, t = base + (int64_t)(i + adv);
    i += adv;
    if (cp < 0) {
      e->invalid++;
      continue;
    } /* U+FFFD, then cleaned away */
    if (cp == 0xFFFD) continue;
    int cat = utf8proc_category(cp);
    if (cat == UTF8PROC_CATEGORY_ZS || cp == 0x2028 || cp == 0x2029) {
      word_end(e);
      continue;
    }
    if (cat == UTF8PROC_CATEGORY_CN || cat >= UTF8PROC_CATEGORY_CC) continue; /* Cc Cf Cs Co Cn */
    if (is_chinese(cp)) {
      word_end(e);
      word_begin(e, s);
      seg_push(e, cp, s, t);
      word_end(e);
      continue;
    }
    if (!e->wactive) word_begin(e, s);
    if (is_boundary(cp)) seg_flush(e);
    seg_push(e, cp, s, t);
  }
  word_end(e);
  return e->status;
}

/* ------------------------------------------------------------ public entry points */
static int check_args(const bl_tokenizer *tok, const char *text, size_t len, const char *op) {
  if (!tok) return bl_set_error(BL_EINVAL, "%s: tokenizer is NULL", op);
  if (!text && len) return bl_set_error(BL_EINVAL, "%s: text is NULL with length %zu", op, len);
  if (len > (size_t)INT32_MAX) return bl_set_error(BL_EINVAL, "%s: text of %zu bytes is over the 2 GB limit", op, len);
  init_tables();
  return 0;
}

int bl_tokenizer_encode_full(const bl_tokenizer *tok, const char *text, size_t len, bl_tok_result *res) {
  BL_CHECK(check_args(tok, text, len, "tokenizer_encode"));
  if (!res) return bl_set_error(BL_EINVAL, "tokenizer_encode: result is NULL");
  if (res->cap < 0) return bl_set_error(BL_EINVAL, "tokenizer_encode: negative capacity %d", res->cap);
  sink sk = { 0 };
  sk.mode = SINK_RESULT;
  sk.res = res;
  eng e;
  eng_init(&e, tok, &sk);
  int rc = run(&e, text, len, 0);
  eng_release(&e);
  res->n = sk.n;
  res->n_words = sk.n_words;
  res->invalid_utf8 = e.invalid;
  return rc;
}

int bl_tokenizer_encode(const bl_tokenizer *tok, const char *text, size_t len, int32_t *ids, int cap, int *n) {
  bl_tok_result r = { 0 };
  r.ids = ids;
  r.cap = ids ? cap : 0;
  int rc = bl_tokenizer_encode_full(tok, text, len, &r);
  if (n) *n = r.n;
  return rc;
}

int bl_tokenizer_wordpiece(const bl_tokenizer *tok, const char *word, size_t len, int32_t *ids, int cap, int *n) {
  BL_CHECK(check_args(tok, word, len, "tokenizer_wordpiece"));
  if (cap < 0) return bl_set_error(BL_EINVAL, "tokenizer_wordpiece: negative capacity %d", cap);
  bl_tok_result r = { 0 };
  r.ids = ids;
  r.cap = ids ? cap : 0;
  sink sk = { 0 };
  sk.mode = SINK_RESULT;
  sk.res = &r;
  eng e;
  eng_init(&e, tok, &sk);
  /* like the reference WordpieceTokenizer: split on whitespace, then pieces;
   * a character is a UTF-8 lead byte and its continuation bytes */
  char tb[TB_CAP];
  int cpos[BL_TOK_MAX_WORD_CHARS + 2];
  size_t i = 0;
  while (i < len) {
    while (i < len && (word[i] == ' ' || (word[i] >= '\t' && word[i] <= '\r'))) i++;
    if (i == len) break;
    size_t j = i;
    int nchars = 0, over = 0, tl = 0;
    cpos[0] = 0;
    while (j < len && !(word[j] == ' ' || (word[j] >= '\t' && word[j] <= '\r'))) {
      size_t k = j + 1;
      while (k < len && ((unsigned char)word[k] & 0xC0) == 0x80 && k - j < 4) k++;
      if (nchars < BL_TOK_MAX_WORD_CHARS) {
        memcpy(tb + tl, word + j, k - j);
        tl += (int)(k - j);
        cpos[nchars + 1] = tl;
      } else {
        over = 1;
      }
      nchars++;
      j = k;
    }
    wordpiece(&e, tb, cpos, nchars, over, sk.n_words++, (int64_t)i, (int64_t)j);
    i = j;
  }
  eng_release(&e);
  if (n) *n = sk.n;
  return 0;
}

int bl_tokenizer_format(const bl_tokenizer *tok, const char *text, size_t len, int mode, char *out, size_t cap,
                        size_t *need, int64_t *invalid_utf8) {
  if (!tok) return bl_set_error(BL_EINVAL, "tokenizer_format: tokenizer is NULL");
  if (!text && len) return bl_set_error(BL_EINVAL, "tokenizer_format: text is NULL with length %zu", len);
  if (mode < 0 || mode > 2)
    return bl_set_error(BL_EINVAL, "tokenizer_format: mode must be 0 (tokens), 1 (ids) or 2 (basic), got %d", mode);
  if (!out) cap = 0;
  init_tables();
  sink sk = { 0 };
  sk.mode = mode;
  sk.out = out;
  sk.cap = cap;
  eng e;
  eng_init(&e, tok, &sk);
  int rc = 0;
  size_t i = 0;
  int64_t inv = 0;
  while (i < len) {
    const char *nl = memchr(text + i, '\n', len - i);
    size_t l = nl ? (size_t)(nl - (text + i)) : len - i;
    if (l > (size_t)INT32_MAX) {
      rc = bl_set_error(BL_EINVAL, "tokenizer_format: a line of %zu bytes is over the 2 GB limit", l);
      break;
    }
    sk.line_has_tok = 0;
    e.invalid = 0;
    rc = run(&e, text + i, l, (int64_t)i);
    inv += e.invalid;
    if (rc) break;
    put_bytes(&sk, "\n", 1);
    i += l + (nl ? 1 : 0);
  }
  eng_release(&e);
  if (need) *need = sk.len;
  if (invalid_utf8) *invalid_utf8 = inv;
  return rc;
}
