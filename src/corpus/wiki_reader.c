/* Streaming reader for MediaWiki XML dumps (.xml, .xml.bz2 single- or
 * multi-stream, "-" = stdin). Contract in src/bl_corpus.h.
 *
 * Design: a sliding window of decompressed bytes feeds a tolerant tag
 * scanner that only looks at '<' (inside <text> the markup is escaped, so a
 * raw '<' is always a tag); everything between <page> and </page> goes to a
 * page buffer capped at max_page_bytes, which is then parsed for title, ns,
 * redirect, id and text. Memory is a window, a few page-sized buffers and
 * the cleaner's buffers: flat whatever the dump size. No DOM.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include <bzlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "bl_corpus.h"
#include "corpus_internal.h"
#include "base/open.h"

#define WIN_CAP              (1u << 20)
#define IN_CAP               (1u << 16)
#define MAX_PRINTED_WARNINGS 20

struct bl_wiki_reader {
  char path[512];
  FILE *f;
  int own_f;
  int bz2, bz_active, eof_in, eof_out;
  int failed_rc;
  char failed_msg[1100];
  bz_stream bz; /* for plain XML only next_in/avail_in are used (peeked bytes) */
  char *inbuf;
  char *win; /* decompressed window [win_pos, win_len) unconsumed */
  size_t win_len, win_pos;
  uint64_t win_off; /* XML offset of win[0] */
  uint64_t file_read;
  bl_cbuf page, title, text;
  int in_page, page_over;
  uint64_t page_off;
  bl_wikitext_cleaner cl;
  size_t max_page;
  int flags, quiet;
  int64_t seek;
  bl_wiki_stats st;
  char warn[768];
};

static void warn(bl_wiki_reader *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->warn, sizeof r->warn, fmt, ap);
  va_end(ap);
  r->st.warnings++;
  if (!r->quiet) {
    if (r->st.warnings <= MAX_PRINTED_WARNINGS)
      fprintf(stderr, "warning: %s: %s\n", r->path, r->warn);
    else if (r->st.warnings == MAX_PRINTED_WARNINGS + 1)
      fprintf(stderr, "warning: %s: further warnings are counted but not printed\n", r->path);
  }
}

static int fail(bl_wiki_reader *r, int status, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  r->failed_rc = status;
  snprintf(r->failed_msg, sizeof r->failed_msg, "wiki_read: %s: %s", r->path, msg);
  return bl_set_error(status, "%s", r->failed_msg);
}

static int read_input(bl_wiki_reader *r) {
  if (r->eof_in) return 0;
  size_t k = fread(r->inbuf, 1, IN_CAP, r->f);
  if (k == 0) {
    if (ferror(r->f)) return fail(r, BL_EIO, "read error at byte offset %llu", (unsigned long long)r->file_read);
    r->eof_in = 1;
    return 0;
  }
  r->file_read += k;
  r->st.bytes_in = r->file_read;
  r->bz.next_in = r->inbuf;
  r->bz.avail_in = (unsigned)k;
  return (int)k;
}

static const char *bz_err_name(int ret) {
  switch (ret) {
    case BZ_DATA_ERROR: return "corrupt data (CRC or block error)";
    case BZ_DATA_ERROR_MAGIC: return "bad magic (not bzip2 data)";
    case BZ_MEM_ERROR: return "out of memory";
    case BZ_PARAM_ERROR: return "parameter error";
    default: return "decompression error";
  }
}

/* Decompressed bytes into dst: >0 count, 0 end of input, <0 fatal status. */
static long produce(bl_wiki_reader *r, char *dst, size_t cap) {
  if (!r->bz2) {
    if (r->bz.avail_in) { /* bytes peeked by open */
      size_t k = r->bz.avail_in < cap ? r->bz.avail_in : cap;
      memcpy(dst, r->bz.next_in, k);
      r->bz.next_in += k;
      r->bz.avail_in -= (unsigned)k;
      return (long)k;
    }
    if (r->eof_in) return 0;
    size_t k = fread(dst, 1, cap, r->f);
    if (k == 0) {
      if (ferror(r->f)) return fail(r, BL_EIO, "read error at byte offset %llu", (unsigned long long)r->file_read);
      r->eof_in = 1;
      return 0;
    }
    r->file_read += k;
    r->st.bytes_in = r->file_read;
    return (long)k;
  }
  for (;;) {
    if (!r->bz_active) {
      if (r->bz.avail_in == 0) {
        int k = read_input(r);
        if (k < 0) return k;
        if (k == 0) return 0; /* clean end: the last stream was complete */
      }
      char *ni = r->bz.next_in;
      unsigned ai = r->bz.avail_in;
      memset(&r->bz, 0, sizeof r->bz);
      r->bz.next_in = ni;
      r->bz.avail_in = ai;
      if (BZ2_bzDecompressInit(&r->bz, 0, 0) != BZ_OK) return fail(r, BL_ENOMEM, "cannot initialise bzip2");
      r->bz_active = 1;
      r->st.bz2_streams++;
    }
    r->bz.next_out = dst;
    r->bz.avail_out = (unsigned)cap;
    int ret = BZ2_bzDecompress(&r->bz);
    size_t got = cap - r->bz.avail_out;
    unsigned long long off = (unsigned long long)(r->file_read - r->bz.avail_in);
    if (ret == BZ_STREAM_END) {
      BZ2_bzDecompressEnd(&r->bz);
      r->bz_active = 0;
      if (got) return (long)got;
      continue;
    }
    if (ret != BZ_OK) {
      BZ2_bzDecompressEnd(&r->bz);
      r->bz_active = 0;
      if (ret == BZ_DATA_ERROR_MAGIC && r->st.bz2_streams > 1)
        return fail(r, BL_EFORMAT, "data after bz2 stream %d at byte offset %llu is not a bzip2 stream",
                    r->st.bz2_streams - 1, off);
      return fail(r, ret == BZ_MEM_ERROR ? BL_ENOMEM : BL_EFORMAT,
                  "bz2 stream %d: %s near compressed byte offset %llu (decompressed offset %llu)", r->st.bz2_streams,
                  bz_err_name(ret), off, (unsigned long long)(r->win_off + r->win_len + got));
    }
    if (got) return (long)got;
    if (r->bz.avail_in == 0) {
      int k = read_input(r);
      if (k < 0) return k;
      if (k == 0)
        return fail(r, BL_EFORMAT,
                    "truncated bz2: the file ends inside bz2 stream %d at byte offset %llu "
                    "(decompressed offset %llu); re-download it",
                    r->st.bz2_streams, (unsigned long long)r->file_read, (unsigned long long)(r->win_off + r->win_len));
    }
  }
}

/* Slide the window and append more bytes. >0 added, 0 end, <0 fatal. */
static long fill(bl_wiki_reader *r) {
  if (r->win_pos) {
    memmove(r->win, r->win + r->win_pos, r->win_len - r->win_pos);
    r->win_off += r->win_pos;
    r->win_len -= r->win_pos;
    r->win_pos = 0;
  }
  long got = produce(r, r->win + r->win_len, WIN_CAP - r->win_len);
  if (got > 0) {
    r->win_len += (size_t)got;
    r->st.bytes_xml += (uint64_t)got;
  }
  return got;
}

int bl_wiki_open(const char *path, const bl_wiki_options *opts, bl_wiki_reader **out) {
  if (!path || !out) return bl_set_error(BL_EINVAL, "wiki_open: NULL argument");
  *out = NULL;
  bl_wiki_reader *r = (bl_wiki_reader *)calloc(1, sizeof *r);
  if (!r) return bl_set_error(BL_ENOMEM, "wiki_open: out of memory");
  snprintf(r->path, sizeof r->path, "%s", path);
  r->max_page = opts && opts->max_page_bytes ? opts->max_page_bytes : (size_t)64 << 20;
  r->flags = opts ? opts->flags : 0;
  r->quiet = opts ? opts->quiet : 0;
  r->inbuf = (char *)malloc(IN_CAP);
  r->win = (char *)malloc(WIN_CAP);
  if (!r->inbuf || !r->win) {
    bl_wiki_close(r);
    return bl_set_error(BL_ENOMEM, "wiki_open: out of memory");
  }
  if (!strcmp(path, "-"))
    r->f = stdin;
  else {
    int fd = bl_open_regular(path, "wiki_open: input", NULL);
    if (fd < 0) {
      bl_wiki_close(r);
      return BL_EIO;
    }
    r->f = fdopen(fd, "rb");
    if (!r->f) {
      close(fd);
      bl_wiki_close(r);
      return bl_set_error(BL_EIO, "wiki_open: cannot open %s", path);
    }
    r->own_f = 1;
  }
  int k = read_input(r);
  if (k < 0) {
    int rc = r->failed_rc;
    bl_wiki_close(r);
    return rc;
  }
  const unsigned char *b = (const unsigned char *)r->inbuf;
  if (k == 0) {
    bl_wiki_close(r);
    return bl_set_error(BL_EFORMAT, "wiki_open: %s is empty", path);
  }
  if (k >= 3 && b[0] == 'B' && b[1] == 'Z' && b[2] == 'h')
    r->bz2 = 1;
  else {
    int i = 0;
    if (k >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF) i = 3;
    while (i < k && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t')) i++;
    if (i < k && b[i] != '<') {
      const char *what = (k >= 2 && b[0] == 0x1f && b[1] == 0x8b)
                             ? " (gzip is not supported: use the .bz2 dump or decompress it)"
                             : "";
      bl_wiki_close(r);
      return bl_set_error(BL_EFORMAT, "wiki_open: %s is neither MediaWiki XML nor bzip2%s", path, what);
    }
  }
  r->st.bz2 = r->bz2;
  *out = r;
  return 0;
}

void bl_wiki_close(bl_wiki_reader *r) {
  if (!r) return;
  if (r->bz_active) BZ2_bzDecompressEnd(&r->bz);
  if (r->f && r->own_f) fclose(r->f);
  free(r->inbuf);
  free(r->win);
  bl_cbuf_free(&r->page);
  bl_cbuf_free(&r->title);
  bl_cbuf_free(&r->text);
  bl_wikitext_cleaner_free(&r->cl);
  free(r);
}

int bl_wiki_seek_article(bl_wiki_reader *r, int64_t index) {
  if (!r || index < 0) return bl_set_error(BL_EINVAL, "wiki_seek_article: bad argument");
  r->seek = index;
  return 0;
}

int bl_wiki_get_stats(const bl_wiki_reader *r, bl_wiki_stats *st) {
  if (!r || !st) return bl_set_error(BL_EINVAL, "wiki_get_stats: NULL argument");
  *st = r->st;
  return 0;
}

const char *bl_wiki_last_warning(const bl_wiki_reader *r) { return r ? r->warn : ""; }

static void page_append(bl_wiki_reader *r, const char *s, size_t k) {
  if (r->page_over) return;
  if (r->page.n + k > r->max_page) {
    k = r->max_page - r->page.n;
    r->page_over = 1;
  }
  bl_cbuf_put(&r->page, s, k);
}

/* Content between <tag> and </tag> inside [s, s+n). */
static int element(const char *s, size_t n, const char *open, const char *close, const char **v, size_t *vl) {
  const char *a = (const char *)memmem(s, n, open, strlen(open));
  if (!a) return 0;
  a += strlen(open);
  const char *e = (const char *)memmem(a, n - (size_t)(a - s), close, strlen(close));
  if (!e) return 0;
  *v = a;
  *vl = (size_t)(e - a);
  return 1;
}

/* 1: doc filled, 0: page consumed without a doc, <0: fatal. */
static int handle_page(bl_wiki_reader *r, bl_wiki_doc *doc) {
  const char *p = r->page.p;
  size_t n = r->page.n;
  unsigned long long off = (unsigned long long)r->page_off;
  if (r->page.oom) {
    r->page.oom = 0;
    return fail(r, BL_ENOMEM, "out of memory buffering the page at offset %llu", off);
  }
  /* the header is everything before <text; searching it alone keeps this O(header) */
  const char *tt = NULL;
  for (const char *q = p; (q = (const char *)memmem(q, n - (size_t)(q - p), "<text", 5)) != NULL; q += 5) {
    char c = (size_t)(q - p) + 5 < n ? q[5] : 0;
    if (c == '>' || c == ' ' || c == '/' || c == '\t' || c == '\n') {
      tt = q;
      break;
    }
  }
  size_t hn = tt ? (size_t)(tt - p) : n;
  const char *v;
  size_t vl;
  r->title.n = 0;
  if (!element(p, hn, "<title>", "</title>", &v, &vl)) {
    r->st.skipped_bad++;
    warn(r, "page at offset %llu has no <title>, skipped", off);
    return 0;
  }
  bl_corpus_decode_entities(v, vl, 0, &r->title);
  bl_cbuf_putc(&r->title, 0);
  r->title.n--;
  const char *title = r->title.oom ? "?" : r->title.p;
  long ns = 0;
  if (element(p, hn, "<ns>", "</ns>", &v, &vl)) {
    char tmp[24];
    size_t k = vl < sizeof tmp - 1 ? vl : sizeof tmp - 1;
    memcpy(tmp, v, k);
    tmp[k] = 0;
    ns = strtol(tmp, NULL, 10);
  }
  int64_t page_id = -1;
  if (element(p, hn, "<id>", "</id>", &v, &vl)) {
    char tmp[24];
    size_t k = vl < sizeof tmp - 1 ? vl : sizeof tmp - 1;
    memcpy(tmp, v, k);
    tmp[k] = 0;
    page_id = strtoll(tmp, NULL, 10);
  }
  int redirect = memmem(p, hn, "<redirect", 9) != NULL;
  const char *text = NULL;
  size_t tl = 0;
  int text_ok = 0;
  if (tt) {
    const char *gt = (const char *)memchr(tt, '>', n - (size_t)(tt - p));
    if (gt && gt[-1] == '/') {
      text = gt;
      tl = 0;
      text_ok = 1;
    } else if (gt) {
      const char *e = (const char *)memmem(gt + 1, n - (size_t)(gt + 1 - p), "</text>", 7);
      if (e) {
        text = gt + 1;
        tl = (size_t)(e - text);
        text_ok = 1;
      }
    }
  }
  if (text_ok && !redirect) {
    const char *q = text;
    size_t ql = tl;
    while (ql && (*q == ' ' || *q == '\n' || *q == '\t' || *q == '\r')) {
      q++;
      ql--;
    }
    if (ql >= 9 && !strncasecmp(q, "#REDIRECT", 9)) redirect = 1;
  }
  if (redirect) {
    r->st.redirects++;
    return 0;
  }
  if (ns != 0) {
    r->st.other_ns++;
    return 0;
  }
  int64_t index = r->st.articles++;
  if (r->page_over) {
    r->st.skipped_large++;
    warn(r, "page '%s' (offset %llu) is larger than the %zu-byte limit, skipped", title, off, r->max_page);
    return 0;
  }
  if (!text_ok) {
    r->st.skipped_bad++;
    warn(r, "page '%s' (offset %llu) has no well-formed <text> element, skipped", title, off);
    return 0;
  }
  if (index < r->seek) {
    r->st.skipped_seek++;
    return 0;
  }
  r->text.n = 0;
  bl_corpus_decode_entities(text, tl, 0, &r->text);
  if (r->text.oom) {
    r->text.oom = 0;
    return fail(r, BL_ENOMEM, "out of memory decoding page '%s'", title);
  }
  size_t badt = bl_corpus_utf8_check(r->title.p, r->title.n);
  size_t bad = bl_corpus_utf8_check(r->text.p, r->text.n);
  if (badt != r->title.n || bad != r->text.n) {
    r->st.skipped_bad++;
    if (badt != r->title.n)
      warn(r, "page at offset %llu has an invalid UTF-8 title, skipped", off);
    else
      warn(r, "page '%s' (offset %llu) has invalid UTF-8 at text byte %zu, skipped", title, off, bad);
    return 0;
  }
  const char *clean;
  size_t cl;
  int rc = bl_wikitext_clean_into(&r->cl, r->text.p ? r->text.p : "", r->text.n, r->flags, &clean, &cl);
  if (rc) return fail(r, rc, "cleaning page '%s' (offset %llu): out of memory", title, off);
  doc->title = r->title.p;
  doc->title_len = r->title.n;
  doc->text = clean;
  doc->text_len = cl;
  doc->page_id = page_id;
  doc->article_index = index;
  doc->xml_offset = r->page_off;
  r->st.docs++;
  return 1;
}

static int starts(const char *s, size_t n, const char *pat) {
  size_t l = strlen(pat);
  return n >= l && !memcmp(s, pat, l);
}

int bl_wiki_next(bl_wiki_reader *r, bl_wiki_doc *doc) {
  if (!r || !doc) return bl_set_error(BL_EINVAL, "wiki_next: NULL argument");
  if (r->failed_rc) return bl_set_error(r->failed_rc, "%s", r->failed_msg);
  memset(doc, 0, sizeof *doc);
  for (;;) {
    if (r->win_len - r->win_pos < 16 && !r->eof_out) {
      long got = fill(r);
      if (got < 0) return (int)got;
      if (got == 0) r->eof_out = 1;
    }
    size_t avail = r->win_len - r->win_pos;
    if (avail == 0) {
      if (r->in_page) {
        r->in_page = 0;
        r->st.skipped_bad++;
        warn(r, "input ends inside the <page> at offset %llu (truncated XML)", (unsigned long long)r->page_off);
      }
      return 0;
    }
    char *s = r->win + r->win_pos;
    char *lt = (char *)memchr(s, '<', avail);
    if (!lt) {
      if (r->in_page) page_append(r, s, avail);
      r->win_pos += avail;
      continue;
    }
    size_t k = (size_t)(lt - s);
    if (r->in_page) page_append(r, s, k);
    r->win_pos += k;
    if (r->win_len - r->win_pos < 8 && !r->eof_out) {
      long got = fill(r);
      if (got < 0) return (int)got;
      if (got == 0) r->eof_out = 1;
      continue;
    }
    s = r->win + r->win_pos;
    avail = r->win_len - r->win_pos;
    if (avail >= 6 && !memcmp(s, "<page", 5) && (s[5] == '>' || s[5] == ' ' || s[5] == '\n' || s[5] == '\t')) {
      if (r->in_page) {
        r->st.skipped_bad++;
        warn(r, "<page> at offset %llu starts before the previous page (offset %llu) ended; that page is skipped",
             (unsigned long long)(r->win_off + r->win_pos), (unsigned long long)r->page_off);
      }
      r->in_page = 1;
      r->page_over = 0;
      r->page.n = 0;
      r->page_off = r->win_off + r->win_pos;
      r->st.pages++;
      page_append(r, s, 5);
      r->win_pos += 5;
      continue;
    }
    if (r->in_page && starts(s, avail, "</page>")) {
      page_append(r, s, 7);
      r->win_pos += 7;
      r->in_page = 0;
      int rc = handle_page(r, doc);
      if (rc != 0) return rc;
      continue;
    }
    if (r->in_page) page_append(r, s, 1);
    r->win_pos += 1;
  }
}
