/* Wikitext -> plain text, in the spirit of WikiExtractor's defaults (see
 * src/bl_corpus.h for the list of what is kept and dropped).
 *
 * The cleaner is a fixed sequence of linear passes over ping-pong buffers:
 *   A  comments and whole blocks whose content is not prose (<ref>, <math>,
 *      <gallery>, <timeline>, <pre>, ...);
 *   B  templates {{...}}, parameters {{{...}}} and tables {|...|}, nested;
 *   C  internal links (nested, File:/Category: dropped) and external links;
 *   D  remaining HTML tags (text kept), bold/italic quotes;
 *   E  entity decoding;
 *   F  per line: headings, lists, table remnants, magic words, stray
 *      brackets, empty "( )" left by removed templates, whitespace.
 * Every pass is O(n) (amortised) so hostile input cannot make it hang, and
 * unbalanced markup degrades to literal text rather than swallowing the
 * rest of the page.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include <ctype.h>
#include <strings.h>

#include "bl_corpus.h"
#include "corpus_internal.h"

/* ------------------------------------------------------------------ tags */
/* Blocks dropped with their content. */
static const char *const k_drop_tags[] = { "ref",       "references", "math",         "chem",         "ce",
                                           "score",     "gallery",    "timeline",     "imagemap",     "syntaxhighlight",
                                           "source",    "pre",        "includeonly",  "table",        "graph",
                                           "hiero",     "mapframe",   "maplink",      "templatedata", "templatestyles",
                                           "indicator", "inputbox",   "categorytree", "charinsert" };
#define N_DROP ((int)(sizeof k_drop_tags / sizeof k_drop_tags[0]))
/* Tags removed while keeping their text. */
static const char *const k_keep_tags[] = {
  "b",     "i",    "u",         "s",         "strike",     "em",   "strong",      "span",      "font", "big",
  "small", "sub",  "sup",       "center",    "blockquote", "div",  "p",           "abbr",      "cite", "code",
  "tt",    "kbd",  "var",       "samp",      "nowiki",     "poem", "onlyinclude", "noinclude", "br",   "hr",
  "wbr",   "del",  "ins",       "mark",      "q",          "dfn",  "bdi",         "bdo",       "ruby", "rb",
  "rp",    "rt",   "h1",        "h2",        "h3",         "h4",   "h5",          "h6",        "ul",   "ol",
  "li",    "dl",   "dt",        "dd",        "section",    "a",    "tr",          "td",        "th",   "caption",
  "time",  "data", "translate", "languages", "tvar",       "big",  "var"
};
#define N_KEEP ((int)(sizeof k_keep_tags / sizeof k_keep_tags[0]))

static int is_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }
static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/* At s[i] == '<': parse "<name" or "</name" followed by space, '>' or '/'.
 * Writes the lower-cased name; returns its length (0: not a tag). */
static size_t tag_name(const char *s, size_t n, size_t i, int *closing, char name[32]) {
  size_t j = i + 1, k = 0;
  *closing = 0;
  if (j < n && s[j] == '/') {
    *closing = 1;
    j++;
  }
  while (j < n && k < 31 && is_alnum(s[j])) {
    name[k++] = (char)tolower((unsigned char)s[j]);
    j++;
  }
  name[k] = 0;
  if (k == 0 || j >= n) return 0;
  char c = s[j];
  if (!(c == '>' || c == '/' || is_space(c) || c == '\n')) return 0;
  return k;
}

static int tag_index(const char *name, const char *const *list, int count) {
  for (int t = 0; t < count; t++)
    if (!strcmp(name, list[t])) return t;
  return -1;
}

/* Find "</name" (case-insensitive, followed by a non-name char) from `from`. */
static size_t find_closing(const char *s, size_t n, size_t from, const char *name) {
  size_t ln = strlen(name);
  size_t i = from;
  while (i < n) {
    const char *lt = (const char *)memchr(s + i, '<', n - i);
    if (!lt) return (size_t)-1;
    i = (size_t)(lt - s);
    if (i + 2 + ln <= n && s[i + 1] == '/' && !strncasecmp(s + i + 2, name, ln) &&
        (i + 2 + ln == n || !is_alnum(s[i + 2 + ln])))
      return i;
    i++;
  }
  return (size_t)-1;
}

static const char *find_bytes(const char *s, size_t n, size_t from, const char *pat, size_t lp) {
  if (from >= n) return NULL;
  return (const char *)memmem(s + from, n - from, pat, lp);
}

/* Pass A: comments and dropped blocks. */
static void pass_blocks(const char *s, size_t n, bl_cbuf *o) {
  size_t absent_from[32]; /* closing tag k is known absent from this offset on */
  for (int t = 0; t < 32; t++) absent_from[t] = (size_t)-1;
  size_t i = 0;
  while (i < n) {
    const char *lt = (const char *)memchr(s + i, '<', n - i);
    size_t p = lt ? (size_t)(lt - s) : n;
    bl_cbuf_put(o, s + i, p - i);
    if (p >= n) break;
    if (p + 4 <= n && !memcmp(s + p, "<!--", 4)) {
      const char *e = find_bytes(s, n, p + 4, "-->", 3);
      i = e ? (size_t)(e - s) + 3 : n; /* unterminated comment: MediaWiki hides the rest too */
      continue;
    }
    char name[32];
    int closing;
    int t = tag_name(s, n, p, &closing, name) ? tag_index(name, k_drop_tags, N_DROP) : -1;
    if (t < 0) {
      bl_cbuf_putc(o, '<');
      i = p + 1;
      continue;
    }
    const char *gt = (const char *)memchr(s + p, '>', n - p);
    if (!gt) {
      bl_cbuf_putc(o, '<');
      i = p + 1;
      continue;
    }
    size_t g = (size_t)(gt - s);
    if (closing || s[g - 1] == '/') {
      i = g + 1;
      continue;
    } /* stray closer or <ref name=x/> */
    size_t c = (size_t)-1;
    if (absent_from[t] == (size_t)-1 || g + 1 < absent_from[t]) {
      c = find_closing(s, n, g + 1, name);
      if (c == (size_t)-1 && (absent_from[t] == (size_t)-1 || g + 1 < absent_from[t])) absent_from[t] = g + 1;
    }
    if (c == (size_t)-1) {
      i = g + 1;
      continue;
    } /* unclosed: drop only the opening tag */
    const char *cg = (const char *)memchr(s + c, '>', n - c);
    i = cg ? (size_t)(cg - s) + 1 : n;
    bl_cbuf_putc(o, ' ');
  }
}

/* ------------------------------------------------------------ templates */
enum { OPEN_T = 1, OPEN_P = 2, OPEN_TB = 3 };
typedef struct {
  size_t pos;
  int kind;
} open_ent;
typedef struct {
  size_t a, b;
} ival;

static void add_ival(bl_cbuf *iv, size_t a, size_t b) {
  /* Intervals close inner-first, so a new one swallows every recorded one
   * starting inside it: the list stays sorted and disjoint in O(1) amortised. */
  while (iv->n >= sizeof(ival)) {
    ival *last = (ival *)(iv->p + iv->n - sizeof(ival));
    if (last->a >= a)
      iv->n -= sizeof(ival);
    else
      break;
  }
  ival v = { a, b };
  bl_cbuf_put(iv, (const char *)&v, sizeof v);
}

static void push_open(bl_cbuf *st, size_t pos, int kind) {
  open_ent e = { pos, kind };
  bl_cbuf_put(st, (const char *)&e, sizeof e);
}

static void pass_templates(const char *s, size_t n, bl_cbuf *o, bl_cbuf *iv, bl_cbuf *st) {
  iv->n = 0;
  st->n = 0;
  size_t i = 0;
  while (i < n) {
    char c = s[i];
    if (c == '{') {
      size_t k = 0;
      while (i + k < n && s[i + k] == '{') k++;
      if (k == 1) {
        if (i + 1 < n && s[i + 1] == '|') {
          push_open(st, i, OPEN_TB);
          i += 2;
          continue;
        }
        i++;
        continue;
      }
      size_t pos = i;
      while (k >= 2) {
        if (k == 3) {
          push_open(st, pos, OPEN_P);
          pos += 3;
          k = 0;
        } else {
          push_open(st, pos, OPEN_T);
          pos += 2;
          k -= 2;
        }
      }
      i = pos + k;
      if (k == 1 && i < n && s[i] == '|') {
        push_open(st, i - 1, OPEN_TB);
        i++;
      }
      continue;
    }
    if (c == '}' && st->n) {
      size_t m = 0;
      while (i + m < n && s[i + m] == '}') m++;
      size_t used = 0;
      while (st->n && m - used >= 2) {
        open_ent *top = (open_ent *)(st->p + st->n - sizeof(open_ent));
        if (top->kind == OPEN_T)
          used += 2;
        else if (top->kind == OPEN_P && m - used >= 3)
          used += 3;
        else
          break;
        add_ival(iv, top->pos, i + used);
        st->n -= sizeof(open_ent);
      }
      i += m;
      continue;
    }
    if (c == '|' && i + 1 < n && s[i + 1] == '}' && st->n) {
      open_ent *top = (open_ent *)(st->p + st->n - sizeof(open_ent));
      if (top->kind == OPEN_TB) {
        add_ival(iv, top->pos, i + 2);
        st->n -= sizeof(open_ent);
        i += 2;
        continue;
      }
    }
    i++;
  }
  /* copy everything outside the removal intervals */
  size_t from = 0;
  size_t count = iv->oom ? 0 : iv->n / sizeof(ival);
  const ival *v = (const ival *)iv->p;
  for (size_t t = 0; t < count; t++) {
    if (v[t].a > from) bl_cbuf_put(o, s + from, v[t].a - from);
    bl_cbuf_putc(o, ' '); /* keeps words on both sides apart */
    from = v[t].b;
  }
  if (from < n) bl_cbuf_put(o, s + from, n - from);
}

/* ---------------------------------------------------------------- links */
static int url_scheme(const char *s, size_t n) {
  static const char *const sch[] = { "http://", "https://", "ftp://",  "ftps://",   "//",      "mailto:",
                                     "news:",   "irc://",   "ircs://", "gopher://", "sftp://", "git://" };
  for (size_t t = 0; t < sizeof sch / sizeof sch[0]; t++) {
    size_t l = strlen(sch[t]);
    if (n >= l && !strncasecmp(s, sch[t], l)) return 1;
  }
  return 0;
}

static void trim(const char **p, size_t *n) {
  while (*n && (is_space(**p) || **p == '\n')) {
    (*p)++;
    (*n)--;
  }
  while (*n && (is_space((*p)[*n - 1]) || (*p)[*n - 1] == '\n')) (*n)--;
}

/* Replace the link text o[start..o->n) (starting with "[[") by what a reader sees. */
static void resolve_link(bl_cbuf *o, size_t start) {
  const char *c = o->p + start + 2;
  size_t L = o->n - start - 2;
  trim(&c, &L);
  int forced_visible = 0;
  if (L && c[0] == ':') {
    forced_visible = 1;
    c++;
    L--;
  }
  const char *pipe = (const char *)memchr(c, '|', L);
  size_t tl = pipe ? (size_t)(pipe - c) : L;
  const char *colon = (const char *)memchr(c, ':', tl);
  if (colon && !forced_visible) {
    const char *pre = c;
    size_t pl = (size_t)(colon - c);
    trim(&pre, &pl);
    static const char *const drop_ns[] = { "file", "image", "category", "media" };
    for (int t = 0; t < 4; t++)
      if (pl == strlen(drop_ns[t]) && !strncasecmp(pre, drop_ns[t], pl)) {
        o->n = start;
        return;
      }
    int lang = pl >= 2 && pl <= 12 && !pipe;
    for (size_t k = 0; k < pl && lang; k++) lang = (pre[k] >= 'a' && pre[k] <= 'z') || pre[k] == '-';
    if (lang) {
      o->n = start;
      return;
    } /* interlanguage link */
  }
  const char *vis = c;
  size_t vl = tl;
  if (pipe) {
    const char *a = pipe + 1;
    size_t al = L - tl - 1;
    trim(&a, &al);
    if (al) {
      vis = a;
      vl = al;
    } else { /* pipe trick: [[Paris (France)|]] -> Paris */
      const char *par = (const char *)memchr(c, '(', tl);
      if (par) vl = (size_t)(par - c);
    }
  }
  trim(&vis, &vl);
  /* vis lies inside o after start: move it down (memmove handles overlap) */
  memmove(o->p + start, vis, vl);
  o->n = start + vl;
}

static void pass_links(const char *s, size_t n, bl_cbuf *o, bl_cbuf *st) {
  st->n = 0;
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    while (j < n && s[j] != '[' && s[j] != ']') j++;
    bl_cbuf_put(o, s + i, j - i);
    i = j;
    if (i >= n) break;
    if (s[i] == '[' && i + 1 < n && s[i + 1] == '[') {
      size_t pos = o->n;
      bl_cbuf_put(st, (const char *)&pos, sizeof pos);
      bl_cbuf_put(o, "[[", 2);
      i += 2;
      continue;
    }
    if (s[i] == ']' && i + 1 < n && s[i + 1] == ']' && st->n >= sizeof(size_t) && !o->oom) {
      size_t start;
      memcpy(&start, st->p + st->n - sizeof(size_t), sizeof start);
      st->n -= sizeof(size_t);
      resolve_link(o, start);
      i += 2;
      continue;
    }
    if (s[i] == '[' && url_scheme(s + i + 1, n - i - 1)) {
      size_t e = i + 1;
      while (e < n && s[e] != ']' && s[e] != '\n' && s[e] != '[') e++;
      if (e < n && s[e] == ']') {
        size_t sp = i + 1;
        while (sp < e && s[sp] != ' ') sp++;
        if (sp < e) bl_cbuf_put(o, s + sp + 1, e - sp - 1);
        i = e + 1;
        continue;
      }
    }
    bl_cbuf_putc(o, s[i]);
    i++;
  }
}

/* ---------------------------------------------------- inline tags/quotes */
static void pass_inline(const char *s, size_t n, bl_cbuf *o) {
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    while (j < n && s[j] != '<' && s[j] != '\'') j++;
    bl_cbuf_put(o, s + i, j - i);
    i = j;
    if (i >= n) break;
    if (s[i] == '\'') {
      size_t k = 0;
      while (i + k < n && s[i + k] == '\'') k++;
      if (k == 1)
        bl_cbuf_putc(o, '\'');
      else if (k == 4)
        bl_cbuf_putc(o, '\''); /* '''' = apostrophe + bold */
      i += k;
      continue;
    }
    char name[32];
    int closing;
    if (tag_name(s, n, i, &closing, name) &&
        (tag_index(name, k_keep_tags, N_KEEP) >= 0 || tag_index(name, k_drop_tags, N_DROP) >= 0)) {
      size_t g = i + 1;
      while (g < n && s[g] != '>' && s[g] != '<' && g - i < 2048) g++;
      if (g < n && s[g] == '>') {
        if (!strcmp(name, "br") || !strcmp(name, "p") || !strcmp(name, "div") || !strcmp(name, "li"))
          bl_cbuf_putc(o, ' ');
        i = g + 1;
        continue;
      }
    }
    bl_cbuf_putc(o, '<');
    i++;
  }
}

/* ---------------------------------------------------------------- lines */
static int has_word_char(const char *p, size_t n) {
  for (size_t k = 0; k < n; k++) {
    unsigned char c = (unsigned char)p[k];
    if (c >= 0x80 || is_alnum((char)c)) return 1;
  }
  return 0;
}

/* In-place cleanup of one line; returns its new length. */
static size_t clean_line(char *p, size_t n) {
  size_t w = 0, r = 0;
  /* 1: whitespace, stray brackets, magic words */
  while (r < n) {
    char c = p[r];
    /* control characters (NUL included) are junk for a tokenizer: treat as space */
    if ((unsigned char)c < 0x20 || c == 0x7f) {
      if (w && p[w - 1] != ' ') p[w++] = ' ';
      r++;
      continue;
    }
    if (r + 1 < n && ((c == '[' && p[r + 1] == '[') || (c == ']' && p[r + 1] == ']') || (c == '{' && p[r + 1] == '{') ||
                      (c == '}' && p[r + 1] == '}'))) {
      r += 2;
      continue;
    }
    if (c == '_' && r + 1 < n && p[r + 1] == '_') {
      size_t e = r + 2;
      while (e < n && p[e] >= 'A' && p[e] <= 'Z') e++;
      if (e > r + 2 && e + 1 < n && p[e] == '_' && p[e + 1] == '_') {
        r = e + 2;
        continue;
      }
    }
    p[w++] = p[r++];
  }
  n = w;
  w = 0;
  r = 0;
  /* 2: "( )", "(, )", "(; )" left by removed templates; "(, text" -> "(text" */
  while (r < n) {
    if (p[r] == '(') {
      size_t e = r + 1;
      while (e < n && (p[e] == ' ' || p[e] == ',' || p[e] == ';')) e++;
      if (e < n && p[e] == ')') {
        r = e + 1;
        continue;
      }
      if (e > r + 1) {
        p[w++] = '(';
        r = e;
        continue;
      }
    }
    p[w++] = p[r++];
  }
  n = w;
  w = 0;
  r = 0;
  /* 3: collapse spaces again; no space before , . ; ) or after ( */
  while (r < n) {
    char c = p[r];
    if (c == ' ') {
      if (w == 0 || p[w - 1] == ' ' || p[w - 1] == '(') {
        r++;
        continue;
      }
      if (r + 1 < n && (p[r + 1] == ',' || p[r + 1] == '.' || p[r + 1] == ';' || p[r + 1] == ')' || p[r + 1] == ' ')) {
        r++;
        continue;
      }
    }
    p[w++] = c;
    r++;
  }
  while (w && p[w - 1] == ' ') w--;
  return w;
}

static void pass_lines(const char *s, size_t n, int flags, bl_cbuf *o) {
  size_t i = 0;
  while (i < n) {
    const char *nl = (const char *)memchr(s + i, '\n', n - i);
    size_t e = nl ? (size_t)(nl - s) : n;
    const char *l = s + i;
    size_t ln = e - i;
    i = e + 1;
    trim(&l, &ln);
    if (!ln) continue;
    int heading = 0;
    if (l[0] == '=' && l[ln - 1] == '=') {
      if (!(flags & BL_WIKI_KEEP_HEADINGS)) continue;
      while (ln && l[0] == '=') {
        l++;
        ln--;
      }
      while (ln && l[ln - 1] == '=') ln--;
      trim(&l, &ln);
      heading = 1;
    }
    if (!heading) {
      if (l[0] == '|' || l[0] == '!' || (ln >= 2 && l[0] == '{' && l[1] == '|')) continue;
      if (ln >= 4 && !memcmp(l, "----", 4)) continue;
      /* WikiExtractor drops list items and keeps indented (:) lines */
      if (!(flags & BL_WIKI_KEEP_LISTS) && (l[0] == '*' || l[0] == '#' || l[0] == ';')) continue;
      while (ln && (l[0] == '*' || l[0] == '#' || l[0] == ':' || l[0] == ';')) {
        l++;
        ln--;
      }
      trim(&l, &ln);
    }
    if (!ln) continue;
    size_t at = o->n;
    if (at) {
      bl_cbuf_putc(o, '\n');
      at = o->n;
    }
    bl_cbuf_put(o, l, ln);
    if (o->oom) return;
    size_t m = clean_line(o->p + at, ln);
    if (!m || !has_word_char(o->p + at, m)) {
      o->n = at ? at - 1 : 0;
      continue;
    }
    o->n = at + m;
  }
}

/* ---------------------------------------------------------------- driver */
int bl_wikitext_clean_into(bl_wikitext_cleaner *c, const char *src, size_t len, int flags, const char **out,
                           size_t *out_len) {
  bl_cbuf *a = &c->a, *b = &c->b;
  a->n = b->n = 0;
  a->oom = b->oom = c->ivals.oom = c->stack.oom = 0;
  if (bl_cbuf_reserve(a, len) || bl_cbuf_reserve(b, len))
    return bl_set_error(BL_ENOMEM, "wikitext_clean: cannot allocate %zu bytes", len);
  pass_blocks(src, len, a);
  pass_templates(a->p, a->n, b, &c->ivals, &c->stack);
  a->n = 0;
  pass_links(b->p, b->n, a, &c->stack);
  b->n = 0;
  pass_inline(a->p, a->n, b);
  a->n = 0;
  bl_corpus_decode_entities(b->p, b->n, 1, a);
  b->n = 0;
  pass_lines(a->p, a->n, flags, b);
  if (a->oom || b->oom || c->ivals.oom || c->stack.oom)
    return bl_set_error(BL_ENOMEM, "wikitext_clean: out of memory cleaning %zu bytes", len);
  bl_cbuf_reserve(b, 1);
  b->p[b->n] = 0;
  *out = b->p;
  *out_len = b->n;
  return 0;
}

void bl_wikitext_cleaner_free(bl_wikitext_cleaner *c) {
  bl_cbuf_free(&c->a);
  bl_cbuf_free(&c->b);
  bl_cbuf_free(&c->ivals);
  bl_cbuf_free(&c->stack);
}

int bl_wikitext_clean(const char *src, size_t len, int32_t flags, char **out, size_t *out_len) {
  if (!out || !out_len || (!src && len)) return bl_set_error(BL_EINVAL, "wikitext_clean: NULL argument");
  *out = NULL;
  *out_len = 0;
  bl_wikitext_cleaner c;
  memset(&c, 0, sizeof c);
  const char *res;
  size_t rl;
  int rc = bl_wikitext_clean_into(&c, src ? src : "", len, flags, &res, &rl);
  if (rc) {
    bl_wikitext_cleaner_free(&c);
    return rc;
  }
  /* hand the output buffer itself to the caller */
  *out = c.b.p;
  *out_len = rl;
  c.b.p = NULL;
  bl_wikitext_cleaner_free(&c);
  return 0;
}

void bl_corpus_free(void *p) { free(p); }
