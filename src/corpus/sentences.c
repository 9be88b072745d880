/* Rule-based sentence segmentation (contract in src/bl_corpus.h).
 *
 * A boundary candidate is a run of terminators (. ? ! …, possibly mixed:
 * "?!", "..."), followed by closing quotes/brackets, followed by whitespace.
 * The candidate is rejected when the next word starts with a lowercase
 * letter (Unicode category Ll), or, for a single '.', when the word before
 * it is a known abbreviation (Mr, Dr, e.g., vs, ...), contains an inner
 * period (U.S., Ph.D., e.g.), is a single capital (initials: J. R. R.
 * Tolkien), or is a numbering abbreviation followed by a number (No. 5,
 * pp. 12). CJK full stops 。！？ end a sentence without needing a space.
 * Line breaks are hard boundaries. The same input always gives the same
 * output: no statistics, no state.
 */
#include <utf8proc.h>

#include "bl_corpus.h"
#include "corpus_internal.h"

static const char *const k_abbrev[] = {
  "Mr",   "Mrs",  "Ms",   "Dr",   "Prof", "Sr",  "Jr",    "St",   "Mt",   "Ft",   "Rev",    "Hon", "Gen",   "Col",
  "Lt",   "Sgt",  "Capt", "Cmdr", "Adm",  "Maj", "Gov",   "Sen",  "Rep",  "Pres", "Supt",   "Det", "Insp",  "Messrs",
  "Mme",  "Mlle", "Msgr", "Fr",   "Br",   "Mx",  "vs",    "v",    "cf",   "viz",  "approx", "ca",  "c",     "al",
  "Bros", "Gens", "Sens", "Reps", "Esq",  "Hr",  "Dept",  "Univ", "Assn", "Ave",  "Blvd",   "Rd",  "Mssrs", "Ph",
  "Ibid", "ibid", "Op",   "Nr",   "ed",   "eds", "trans", "esp",  "incl", "resp"
};
static const char *const k_num_abbrev[] = { "No",  "Nos", "no",   "nos",  "Vol",  "Vols", "vol", "vols", "pp",
                                            "p",   "Fig", "Figs", "fig",  "figs", "Art",  "art", "Ch",   "ch",
                                            "Sec", "sec", "para", "op",   "Jan",  "Feb",  "Mar", "Apr",  "Jun",
                                            "Jul", "Aug", "Sep",  "Sept", "Oct",  "Nov",  "Dec", "Nr",   "nr",
                                            "Ex",  "ex",  "Eq",   "eq",   "Tab",  "tab" };

static int in_list(const char *w, size_t n, const char *const *list, size_t count) {
  for (size_t k = 0; k < count; k++)
    if (strlen(list[k]) == n && !memcmp(list[k], w, n)) return 1;
  return 0;
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/* Decode the code point at s[i] (len bytes consumed); invalid bytes count as one unit. */
static int32_t cp_at(const char *s, size_t n, size_t i, size_t *len) {
  utf8proc_int32_t cp;
  utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
  if (k <= 0) {
    *len = 1;
    return -1;
  }
  *len = (size_t)k;
  return cp;
}

static int is_closer(int32_t cp) {
  return cp == '"' || cp == '\'' || cp == ')' || cp == ']' || cp == '}' || cp == 0x201D || cp == 0x2019 || cp == 0xBB ||
         cp == 0x300D || cp == 0x300F || cp == 0x203A || cp == 0xFF09;
}
static int is_opener(int32_t cp) {
  return cp == '"' || cp == '\'' || cp == '(' || cp == '[' || cp == 0x201C || cp == 0x2018 || cp == 0xAB ||
         cp == 0xBF || cp == 0xA1 || cp == 0x2039 || cp == 0x300C || cp == 0x300E;
}

static void emit(bl_cbuf *o, const char *s, size_t a, size_t b, size_t *count) {
  while (a < b && is_ws((unsigned char)s[a])) a++;
  while (b > a && is_ws((unsigned char)s[b - 1])) b--;
  if (a == b) return;
  bl_cbuf_put(o, s + a, b - a);
  bl_cbuf_putc(o, '\n');
  (*count)++;
}

/* Should the single '.' at s[dot] end a sentence whose next word starts at s[next]? */
static int period_breaks(const char *s, size_t ls, size_t dot, size_t next, size_t le) {
  size_t w = dot;
  while (w > ls && !is_ws((unsigned char)s[w - 1])) w--;
  /* strip leading openers from the word */
  while (w < dot) {
    size_t l;
    int32_t cp = cp_at(s, le, w, &l);
    if (!is_opener(cp)) break;
    w += l;
  }
  size_t wl = dot - w;
  const char *word = s + w;
  if (wl == 0) return 1;
  if (in_list(word, wl, k_abbrev, sizeof k_abbrev / sizeof k_abbrev[0])) return 0;
  if (memchr(word, '.', wl)) {
    /* U.S. / e.g. / Ph.D. — but not "end...Next" style runs inside the word */
    int letters = 0;
    for (size_t k = 0; k < wl; k++) letters += ((word[k] | 32) >= 'a' && (word[k] | 32) <= 'z');
    if (letters) return 0;
  }
  if (wl == 1 && word[0] >= 'A' && word[0] <= 'Z') return 0; /* initial */
  if (next < le && s[next] >= '0' && s[next] <= '9' &&
      in_list(word, wl, k_num_abbrev, sizeof k_num_abbrev / sizeof k_num_abbrev[0]))
    return 0;
  return 1;
}

static void split_line(const char *s, size_t ls, size_t le, bl_cbuf *o, size_t *count) {
  size_t start = ls, i = ls;
  while (i < le) {
    unsigned char c = (unsigned char)s[i];
    size_t l;
    int32_t cp;
    if (c < 0x80) {
      cp = c;
      l = 1;
    } else
      cp = cp_at(s, le, i, &l);
    if (cp == 0x3002 || cp == 0xFF01 || cp == 0xFF1F) { /* CJK: no space follows */
      size_t j = i + l;
      for (;;) {
        size_t l2;
        int32_t c2 = j < le ? cp_at(s, le, j, &l2) : -1;
        if (c2 == 0x3002 || c2 == 0xFF01 || c2 == 0xFF1F || (c2 >= 0 && is_closer(c2)))
          j += l2;
        else
          break;
      }
      emit(o, s, start, j, count);
      start = i = j;
      continue;
    }
    if (cp != '.' && cp != '?' && cp != '!' && cp != 0x2026) {
      i += l;
      continue;
    }
    size_t first = i, j = i;
    int periods = 0, others = 0;
    for (;;) { /* terminator run */
      size_t l2;
      int32_t c2 = j < le ? cp_at(s, le, j, &l2) : -1;
      if (c2 == '.')
        periods++;
      else if (c2 == '?' || c2 == '!' || c2 == 0x2026)
        others++;
      else
        break;
      j += l2;
    }
    for (;;) { /* closing quotes and brackets belong to this sentence */
      size_t l2;
      int32_t c2 = j < le ? cp_at(s, le, j, &l2) : -1;
      if (c2 >= 0 && is_closer(c2))
        j += l2;
      else
        break;
    }
    if (j >= le) {
      i = j;
      break;
    }
    if (!is_ws((unsigned char)s[j])) {
      i = j;
      continue;
    } /* 3.14, U.S.A, "x.y" */
    size_t m = j;
    while (m < le && is_ws((unsigned char)s[m])) m++;
    if (m >= le) {
      i = m;
      break;
    }
    /* look through opening quotes/brackets at the first letter of the next word */
    size_t q = m, lq;
    int32_t nc = cp_at(s, le, q, &lq);
    while (nc >= 0 && is_opener(nc) && q + lq < le) {
      q += lq;
      nc = cp_at(s, le, q, &lq);
    }
    int brk = !(nc >= 0 && utf8proc_category(nc) == UTF8PROC_CATEGORY_LL);
    if (brk && periods == 1 && others == 0) brk = period_breaks(s, ls, first, q, le);
    if (brk) {
      emit(o, s, start, j, count);
      start = m;
    }
    i = m;
  }
  emit(o, s, start, le, count);
}

int bl_sent_split(const char *text, size_t len, char **out, size_t *out_len, size_t *count) {
  if (!out || !out_len || (!text && len)) return bl_set_error(BL_EINVAL, "sent_split: NULL argument");
  *out = NULL;
  *out_len = 0;
  size_t cnt = 0;
  bl_cbuf o = { 0 };
  bl_cbuf_reserve(&o, len + 16);
  size_t i = 0;
  while (i < len) {
    const char *nl = (const char *)memchr(text + i, '\n', len - i);
    size_t e = nl ? (size_t)(nl - text) : len;
    split_line(text, i, e, &o, &cnt);
    i = e + 1;
  }
  if (o.oom) {
    bl_cbuf_free(&o);
    return bl_set_error(BL_ENOMEM, "sent_split: out of memory (%zu bytes)", len);
  }
  if (bl_cbuf_reserve(&o, 1)) {
    bl_cbuf_free(&o);
    return bl_set_error(BL_ENOMEM, "sent_split: out of memory");
  }
  o.p[o.n] = 0;
  *out = o.p;
  *out_len = o.n;
  if (count) *count = cnt;
  return 0;
}
