/* Entity decoding (XML's five plus the common HTML named entities that
 * wikitext uses), numeric references, UTF-8 encoding and validation.
 * Spacing entities (&nbsp; &thinsp; ...) decode to a plain space and
 * invisible ones (&shy; &zwj; &lrm; ...) to nothing: the text feeds a
 * tokenizer that would treat them as whitespace or drop them anyway. */
#include "corpus_internal.h"

typedef struct {
  const char *name;
  uint32_t cp;
} ent;
/* sorted by strcmp for bsearch; cp 0 = decode to nothing */
static const ent k_entities[] = {
  { "AElig", 198 },   { "Aacute", 193 },  { "Acirc", 194 },   { "Agrave", 192 },  { "Alpha", 913 },
  { "Aring", 197 },   { "Atilde", 195 },  { "Auml", 196 },    { "Beta", 914 },    { "Ccedil", 199 },
  { "Chi", 935 },     { "Dagger", 8225 }, { "Delta", 916 },   { "ETH", 208 },     { "Eacute", 201 },
  { "Ecirc", 202 },   { "Egrave", 200 },  { "Epsilon", 917 }, { "Eta", 919 },     { "Euml", 203 },
  { "Gamma", 915 },   { "Iacute", 205 },  { "Icirc", 206 },   { "Igrave", 204 },  { "Iota", 921 },
  { "Iuml", 207 },    { "Kappa", 922 },   { "Lambda", 923 },  { "Mu", 924 },      { "Ntilde", 209 },
  { "Nu", 925 },      { "OElig", 338 },   { "Oacute", 211 },  { "Ocirc", 212 },   { "Ograve", 210 },
  { "Omega", 937 },   { "Omicron", 927 }, { "Oslash", 216 },  { "Otilde", 213 },  { "Ouml", 214 },
  { "Phi", 934 },     { "Pi", 928 },      { "Prime", 8243 },  { "Psi", 936 },     { "Rho", 929 },
  { "Scaron", 352 },  { "Sigma", 931 },   { "THORN", 222 },   { "Tau", 932 },     { "Theta", 920 },
  { "Uacute", 218 },  { "Ucirc", 219 },   { "Ugrave", 217 },  { "Upsilon", 933 }, { "Uuml", 220 },
  { "Xi", 926 },      { "Yacute", 221 },  { "Yuml", 376 },    { "Zeta", 918 },    { "aacute", 225 },
  { "acirc", 226 },   { "acute", 180 },   { "aelig", 230 },   { "agrave", 224 },  { "alpha", 945 },
  { "amp", 38 },      { "and", 8743 },    { "apos", 39 },     { "aring", 229 },   { "asymp", 8776 },
  { "atilde", 227 },  { "auml", 228 },    { "bdquo", 8222 },  { "beta", 946 },    { "brvbar", 166 },
  { "bull", 8226 },   { "cap", 8745 },    { "ccedil", 231 },  { "cedil", 184 },   { "cent", 162 },
  { "chi", 967 },     { "circ", 710 },    { "clubs", 9827 },  { "copy", 169 },    { "cup", 8746 },
  { "curren", 164 },  { "dagger", 8224 }, { "darr", 8595 },   { "deg", 176 },     { "delta", 948 },
  { "diams", 9830 },  { "divide", 247 },  { "eacute", 233 },  { "ecirc", 234 },   { "egrave", 232 },
  { "empty", 8709 },  { "emsp", 32 },     { "ensp", 32 },     { "epsilon", 949 }, { "equiv", 8801 },
  { "eta", 951 },     { "eth", 240 },     { "euml", 235 },    { "euro", 8364 },   { "exist", 8707 },
  { "fnof", 402 },    { "forall", 8704 }, { "frac12", 189 },  { "frac14", 188 },  { "frac34", 190 },
  { "frasl", 8260 },  { "gamma", 947 },   { "ge", 8805 },     { "gt", 62 },       { "hArr", 8660 },
  { "hairsp", 32 },   { "harr", 8596 },   { "hearts", 9829 }, { "hellip", 8230 }, { "hyphen", 8208 },
  { "iacute", 237 },  { "icirc", 238 },   { "iexcl", 161 },   { "igrave", 236 },  { "infin", 8734 },
  { "int", 8747 },    { "iota", 953 },    { "iquest", 191 },  { "isin", 8712 },   { "iuml", 239 },
  { "kappa", 954 },   { "lArr", 8656 },   { "lambda", 955 },  { "laquo", 171 },   { "larr", 8592 },
  { "ldquo", 8220 },  { "le", 8804 },     { "loz", 9674 },    { "lrm", 0 },       { "lsaquo", 8249 },
  { "lsquo", 8216 },  { "lt", 60 },       { "macr", 175 },    { "mdash", 8212 },  { "micro", 181 },
  { "middot", 183 },  { "minus", 8722 },  { "mu", 956 },      { "nabla", 8711 },  { "nbhy", 8209 },
  { "nbsp", 32 },     { "ndash", 8211 },  { "ne", 8800 },     { "not", 172 },     { "notin", 8713 },
  { "ntilde", 241 },  { "nu", 957 },      { "numsp", 32 },    { "oacute", 243 },  { "ocirc", 244 },
  { "oelig", 339 },   { "ograve", 242 },  { "oline", 8254 },  { "omega", 969 },   { "omicron", 959 },
  { "or", 8744 },     { "ordf", 170 },    { "ordm", 186 },    { "oslash", 248 },  { "otilde", 245 },
  { "ouml", 246 },    { "para", 182 },    { "part", 8706 },   { "permil", 8240 }, { "phi", 966 },
  { "pi", 960 },      { "plusmn", 177 },  { "pound", 163 },   { "prime", 8242 },  { "prod", 8719 },
  { "psi", 968 },     { "quot", 34 },     { "rArr", 8658 },   { "radic", 8730 },  { "raquo", 187 },
  { "rarr", 8594 },   { "rdquo", 8221 },  { "reg", 174 },     { "rho", 961 },     { "rlm", 0 },
  { "rsaquo", 8250 }, { "rsquo", 8217 },  { "sbquo", 8218 },  { "scaron", 353 },  { "sdot", 8901 },
  { "sect", 167 },    { "shy", 0 },       { "sigma", 963 },   { "sigmaf", 962 },  { "sim", 8764 },
  { "spades", 9824 }, { "sub", 8834 },    { "sum", 8721 },    { "sup", 8835 },    { "sup1", 185 },
  { "sup2", 178 },    { "sup3", 179 },    { "szlig", 223 },   { "tau", 964 },     { "theta", 952 },
  { "thinsp", 32 },   { "thorn", 254 },   { "tilde", 732 },   { "times", 215 },   { "trade", 8482 },
  { "uacute", 250 },  { "uarr", 8593 },   { "ucirc", 251 },   { "ugrave", 249 },  { "uml", 168 },
  { "upsilon", 965 }, { "uuml", 252 },    { "xi", 958 },      { "yacute", 253 },  { "yen", 165 },
  { "yuml", 255 },    { "zeta", 950 },    { "zwj", 0 },       { "zwnj", 0 },
};

static int ent_cmp(const void *key, const void *e) { return strcmp((const char *)key, ((const ent *)e)->name); }

void bl_corpus_put_utf8(bl_cbuf *o, uint32_t cp) {
  char t[4];
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
  if (cp < 0x80) {
    bl_cbuf_putc(o, (char)cp);
    return;
  }
  if (cp < 0x800) {
    t[0] = (char)(0xC0 | (cp >> 6));
    t[1] = (char)(0x80 | (cp & 63));
    bl_cbuf_put(o, t, 2);
    return;
  }
  if (cp < 0x10000) {
    t[0] = (char)(0xE0 | (cp >> 12));
    t[1] = (char)(0x80 | ((cp >> 6) & 63));
    t[2] = (char)(0x80 | (cp & 63));
    bl_cbuf_put(o, t, 3);
    return;
  }
  t[0] = (char)(0xF0 | (cp >> 18));
  t[1] = (char)(0x80 | ((cp >> 12) & 63));
  t[2] = (char)(0x80 | ((cp >> 6) & 63));
  t[3] = (char)(0x80 | (cp & 63));
  bl_cbuf_put(o, t, 4);
}

/* Decode one entity at s[i] == '&'. Returns bytes consumed (0: not an entity). */
static size_t decode_one(const char *s, size_t n, size_t i, int html, bl_cbuf *o) {
  size_t j = i + 1;
  if (j < n && s[j] == '#') {
    j++;
    int hex = 0;
    if (j < n && (s[j] == 'x' || s[j] == 'X')) {
      hex = 1;
      j++;
    }
    uint32_t cp = 0;
    size_t digits = 0;
    while (j < n && digits < 8) {
      char c = s[j];
      int d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (hex && c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (hex && c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        break;
      cp = cp * (hex ? 16u : 10u) + (uint32_t)d;
      digits++;
      j++;
    }
    if (digits == 0 || j >= n || s[j] != ';') return 0;
    if (cp == 0xA0 || cp == 0x2009 || cp == 0x2002 || cp == 0x2003) cp = ' ';
    if (cp == 0xAD || cp == 0x200B || cp == 0x200C || cp == 0x200D || cp == 0x200E || cp == 0x200F) return j + 1 - i;
    if (cp == 0) cp = 0xFFFD;
    bl_corpus_put_utf8(o, cp);
    return j + 1 - i;
  }
  char name[16];
  size_t k = 0;
  while (j < n && k < sizeof name - 1 &&
         ((s[j] >= 'a' && s[j] <= 'z') || (s[j] >= 'A' && s[j] <= 'Z') || (s[j] >= '0' && s[j] <= '9')))
    name[k++] = s[j++];
  if (k == 0 || j >= n || s[j] != ';') return 0;
  name[k] = 0;
  if (!html) {
    static const char *xml[] = { "amp", "lt", "gt", "quot", "apos" };
    static const char xc[] = { '&', '<', '>', '"', '\'' };
    for (int t = 0; t < 5; t++)
      if (!strcmp(name, xml[t])) {
        bl_cbuf_putc(o, xc[t]);
        return j + 1 - i;
      }
    return 0;
  }
  const ent *e = (const ent *)bsearch(name, k_entities, sizeof k_entities / sizeof k_entities[0], sizeof(ent), ent_cmp);
  if (!e) return 0;
  if (e->cp) bl_corpus_put_utf8(o, e->cp);
  return j + 1 - i;
}

void bl_corpus_decode_entities(const char *s, size_t n, int html, bl_cbuf *o) {
  size_t i = 0;
  while (i < n) {
    const char *amp = (const char *)memchr(s + i, '&', n - i);
    size_t stop = amp ? (size_t)(amp - s) : n;
    bl_cbuf_put(o, s + i, stop - i);
    i = stop;
    if (i >= n) break;
    size_t used = decode_one(s, n, i, html, o);
    if (used)
      i += used;
    else {
      bl_cbuf_putc(o, '&');
      i++;
    }
  }
}

size_t bl_corpus_utf8_check(const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else
      return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += len;
  }
  return n;
}
