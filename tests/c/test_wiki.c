/* Wikipedia extraction: wikitext cleaning on hand-written cases, the XML
 * reader on plain / single-stream / two-stream bz2 input made here, truncated
 * bz2, malformed XML, invalid UTF-8, the page-size cap, seeking, and the real
 * dump sample in $BL_SHARED_DATA/wikipedia (skipped when absent). */
#include <bzlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bertlua.h"
#include "bl_corpus.h"

#include "check.h"

static void clean_case(const char *in, const char *want, int flags) {
  char *out = NULL;
  size_t n = 0;
  int rc = bl_wikitext_clean(in, strlen(in), flags, &out, &n);
  CHECK(rc == 0, "clean rc %d: %s", rc, bl_last_error());
  if (rc) return;
  CHECK(strlen(want) == n && !memcmp(out, want, n), "clean(%s)\n  got  [%.*s]\n  want [%s]", in, (int)n, out, want);
  bl_corpus_free(out);
}

static void test_clean(void) {
  clean_case("'''Anarchism''' is a [[political philosophy]].", "Anarchism is a political philosophy.", 0);
  clean_case("A [[Paris|city]] and [[Rome]]s.", "A city and Romes.", 0);
  clean_case("X{{Infobox|a={{nested|b}}|c=d}} y.", "X y.", 0);
  clean_case("Before\n{| class=\"wikitable\"\n|-\n| cell {{t|x}} || cell2\n|}\nAfter", "Before\nAfter", 0);
  clean_case("Fact.<ref name=\"a\">{{cite web|url=x}}</ref> More<ref name=b/>, text.", "Fact. More, text.", 0);
  clean_case("a<!-- hidden [[x]] -->b", "ab", 0);
  clean_case("[[File:Foo.jpg|thumb|A caption with [[link]] and [[x|y]].]]Text here.", "Text here.", 0);
  clean_case("[[Category:Anarchism]]\n[[de:Anarchismus]]\nBody text.", "Body text.", 0);
  clean_case("See [http://example.com the site] and [https://x.org].", "See the site and.", 0);
  clean_case("== History ==\nFirst para.\n\n=== Sub ===\n* item one\n# item two\n: indented", "First para.\nindented",
             0);
  clean_case("Intro.\n* item one\n#item two\n; term\n:: indented\n*: under an item", "Intro.\nindented", 0);
  clean_case("Intro.\n* item one\n# item two\n: indented", "Intro.\nitem one\nitem two\nindented", BL_WIKI_KEEP_LISTS);
  clean_case("== History ==\nText.", "History\nText.", BL_WIKI_KEEP_HEADINGS);
  clean_case("__TOC__\nA&nbsp;B &ndash; C &amp; D&mdash;E &#65;&#x42; &lt;b&gt;",
             "A B \xE2\x80\x93 C & D\xE2\x80\x94"
             "E AB <b>",
             0);
  clean_case("The <b>bold</b> and <math>x^{2}</math> go.", "The bold and go.", 0);
  clean_case("<gallery>\nA.jpg|cap\n</gallery>\nKept.", "Kept.", 0);
  clean_case("Anarchism ({{IPA|/x/}}) is ( ; a) thing.", "Anarchism is (a) thing.", 0);
  clean_case("''italic'' and '''''both''''' l''''x", "italic and both l'x", 0);
  clean_case("Unclosed {{template and text", "Unclosed template and text", 0);
  clean_case("Unclosed [[link", "Unclosed link", 0);
  clean_case("{{{{a}}}} b {{{param|def}}} c", "b c", 0);
  clean_case("[[:Category:Foo]] is shown", "Category:Foo is shown", 0);
  clean_case("Pipe trick [[Paris (France)|]] ok", "Pipe trick Paris ok", 0);
  clean_case(
      "a\x01"
      "b\tc\x7f"
      "d",
      "a b c d", 0);
  clean_case("", "", 0);
  clean_case("{{only template}}", "", 0);
  char *o = NULL;
  size_t n = 0;
  CHECK(bl_wikitext_clean(NULL, 3, 0, &o, &n) == BL_EINVAL, "NULL src must be EINVAL");
}

static const char *PAGE_FMT =
    "  <page>\n    <title>%s</title>\n    <ns>%d</ns>\n    <id>%d</id>\n%s"
    "    <revision>\n      <id>1</id>\n      <text xml:space=\"preserve\">%s</text>\n    </revision>\n  </page>\n";

static char *make_xml(int npages, size_t *len) {
  size_t cap = 1 << 20, n = 0;
  char *b = malloc(cap);
  n += (size_t)snprintf(b + n, cap - n,
                        "<mediawiki xmlns=\"http://www.mediawiki.org/xml/export-0.10/\">\n  "
                        "<siteinfo><sitename>W</sitename></siteinfo>\n");
  for (int i = 0; i < npages; i++) {
    char title[64], text[256];
    snprintf(title, sizeof title, "Page %d &amp; co", i);
    int redirect = i % 5 == 4, ns = i % 7 == 6 ? 4 : 0;
    snprintf(text, sizeof text,
             "'''Page %d''' is about [[topic %d|things]].&lt;ref&gt;cite&lt;/ref&gt; {{tmpl|%d}}Done.", i, i, i);
    n +=
        (size_t)snprintf(b + n, cap - n, PAGE_FMT, title, ns, i + 10,
                         redirect ? "    <redirect title=\"Other\" />\n" : "", redirect ? "#REDIRECT [[Other]]" : text);
  }
  n += (size_t)snprintf(b + n, cap - n, "</mediawiki>\n");
  *len = n;
  return b;
}

static char *bz(const char *s, size_t n, unsigned *outn) {
  unsigned cap = (unsigned)(n + n / 100 + 1024);
  char *o = malloc(cap);
  int rc = BZ2_bzBuffToBuffCompress(o, &cap, (char *)s, (unsigned)n, 9, 0, 0);
  if (rc != BZ_OK) {
    printf("bz2 compress failed\n");
    exit(1);
  }
  *outn = cap;
  return o;
}

static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n) {
    printf("cannot write %s\n", path);
    exit(1);
  }
  fclose(f);
}

/* Read all docs; returns count or the negative status. */
static int read_all(const char *path, int *articles, bl_wiki_stats *st, int quiet, char *first_text, size_t ftcap) {
  bl_wiki_reader *r = NULL;
  bl_wiki_options o = { 0, 0, quiet };
  int rc = bl_wiki_open(path, &o, &r);
  if (rc) return rc;
  bl_wiki_doc d;
  int n = 0;
  while ((rc = bl_wiki_next(r, &d)) == 1) {
    if (n == 0 && first_text)
      snprintf(first_text, ftcap, "%.*s|%.*s", (int)d.title_len, d.title, (int)d.text_len, d.text);
    n++;
  }
  bl_wiki_get_stats(r, st);
  if (articles) *articles = (int)st->articles;
  bl_wiki_close(r);
  return rc < 0 ? rc : n;
}

static void test_reader(const char *dir) {
  size_t xn;
  char *xml = make_xml(40, &xn);
  /* expected: redirects i%5==4 (8), ns4 pages i%7==6 and not redirect: 6,13,20,27,(34 -> 34%5==4 redirect) => 4 */
  int want_docs = 40 - 8 - 4;
  char p_xml[512], p_bz[512], p_bz2s[512], p_trunc[512], p_bad[512], p_utf[512], p_garb[512];
  snprintf(p_xml, sizeof p_xml, "%s/a.xml", dir);
  snprintf(p_bz, sizeof p_bz, "%s/a.xml.bz2", dir);
  snprintf(p_bz2s, sizeof p_bz2s, "%s/two.xml.bz2", dir);
  snprintf(p_trunc, sizeof p_trunc, "%s/trunc.xml.bz2", dir);
  snprintf(p_bad, sizeof p_bad, "%s/bad.xml", dir);
  snprintf(p_utf, sizeof p_utf, "%s/utf.xml", dir);
  snprintf(p_garb, sizeof p_garb, "%s/garb.xml.bz2", dir);
  write_file(p_xml, xml, xn);
  unsigned bn;
  char *b = bz(xml, xn, &bn);
  write_file(p_bz, b, bn);

  bl_wiki_stats st;
  int arts = 0;
  char first[512];
  int n = read_all(p_xml, &arts, &st, 0, first, sizeof first);
  CHECK(n == want_docs, "plain xml: %d docs, want %d (%s)", n, want_docs, n < 0 ? bl_last_error() : "");
  CHECK(st.pages == 40 && st.redirects == 8 && st.other_ns == 4, "stats pages %lld redirects %lld other %lld",
        (long long)st.pages, (long long)st.redirects, (long long)st.other_ns);
  CHECK(!strcmp(first, "Page 0 & co|Page 0 is about things. Done."), "first doc [%s]", first);
  n = read_all(p_bz, &arts, &st, 0, NULL, 0);
  CHECK(n == want_docs && st.bz2 == 1 && st.bz2_streams == 1, "bz2: %d docs, %d streams", n, st.bz2_streams);

  /* two streams: split the XML in the middle of a page, compress halves, concatenate */
  size_t half = xn / 2;
  unsigned b1n, b2n;
  char *b1 = bz(xml, half, &b1n), *b2 = bz(xml + half, xn - half, &b2n);
  char *cat = malloc(b1n + b2n);
  memcpy(cat, b1, b1n);
  memcpy(cat + b1n, b2, b2n);
  write_file(p_bz2s, cat, b1n + b2n);
  n = read_all(p_bz2s, &arts, &st, 0, NULL, 0);
  CHECK(n == want_docs && st.bz2_streams == 2, "two-stream bz2: %d docs (want %d), %d streams", n, want_docs,
        st.bz2_streams);

  /* garbage after the last stream is an error naming the offset */
  char *g = malloc(bn + 16);
  memcpy(g, b, bn);
  memcpy(g + bn, "GARBAGE-GARBAGE!", 16);
  write_file(p_garb, g, bn + 16);
  n = read_all(p_garb, &arts, &st, 1, NULL, 0);
  CHECK(n == BL_EFORMAT && strstr(bl_last_error(), "offset") && strstr(bl_last_error(), "garb.xml.bz2"),
        "trailing garbage: rc %d msg %s", n, bl_last_error());

  /* truncated bz2: fatal, names the file and the offset, no hang */
  write_file(p_trunc, b, bn * 2 / 3);
  n = read_all(p_trunc, &arts, &st, 1, NULL, 0);
  CHECK(n == BL_EFORMAT, "truncated bz2 rc %d", n);
  CHECK(strstr(bl_last_error(), "trunc.xml.bz2") && strstr(bl_last_error(), "offset") &&
            strstr(bl_last_error(), "truncated"),
        "truncated message: %s", bl_last_error());

  /* malformed XML: a page without </page>, a page without <title>, a page
   * with an unterminated <text>, then a good page; and input ending inside a page */
  const char *bad =
      "<mediawiki><page><title>Broken</title><ns>0</ns><revision><text>abc</text></revision>\n"
      "<page><ns>0</ns><revision><text>no title</text></revision></page>\n"
      "<page><title>NoEnd</title><ns>0</ns><revision><text>never closed</revision></page>\n"
      "<page><title>Good</title><ns>0</ns><revision><text>Good ''text''.</text></revision></page>\n"
      "<page><title>Cut</title><ns>0</ns><revision><text>cut off";
  write_file(p_bad, bad, strlen(bad));
  n = read_all(p_bad, &arts, &st, 1, first, sizeof first);
  CHECK(n == 1 && !strcmp(first, "Good|Good text."), "malformed: %d docs, first [%s]", n, first);
  CHECK(st.skipped_bad == 4, "malformed: skipped_bad %lld, want 4", (long long)st.skipped_bad);

  /* invalid UTF-8 in one page: that page is skipped with a warning naming it */
  const char *utf =
      "<mediawiki><page><title>Bad bytes</title><ns>0</ns><revision><text>a\xff\xfe b</text></revision></page>"
      "<page><title>Fine</title><ns>0</ns><revision><text>caf\xc3\xa9.</text></revision></page></mediawiki>";
  write_file(p_utf, utf, strlen(utf));
  bl_wiki_reader *r = NULL;
  bl_wiki_options qo = { 0, 0, 1 };
  CHECK(bl_wiki_open(p_utf, &qo, &r) == 0, "open utf");
  bl_wiki_doc d;
  int rc = bl_wiki_next(r, &d);
  CHECK(rc == 1 && d.title_len == 4 && !memcmp(d.title, "Fine", 4) && d.article_index == 1, "utf: rc %d", rc);
  CHECK(strstr(bl_wiki_last_warning(r), "Bad bytes") && strstr(bl_wiki_last_warning(r), "UTF-8"), "warning: %s",
        bl_wiki_last_warning(r));
  CHECK(bl_wiki_next(r, &d) == 0, "utf: end");
  bl_wiki_close(r);

  /* page cap: pages over max_page_bytes are skipped and counted */
  bl_wiki_options small = { 200, 0, 1 };
  CHECK(bl_wiki_open(p_xml, &small, &r) == 0, "open small");
  int got = 0;
  while ((rc = bl_wiki_next(r, &d)) == 1) got++;
  bl_wiki_get_stats(r, &st);
  CHECK(rc == 0 && got == 0 && st.skipped_large == want_docs, "cap: %d docs, %lld large", got,
        (long long)st.skipped_large);
  bl_wiki_close(r);

  /* seek: resume at article 10 */
  CHECK(bl_wiki_open(p_bz, &qo, &r) == 0, "open seek");
  bl_wiki_seek_article(r, 10);
  rc = bl_wiki_next(r, &d);
  CHECK(rc == 1 && d.article_index == 10, "seek: rc %d index %lld", rc, (long long)d.article_index);
  bl_wiki_close(r);

  /* bad arguments and files */
  CHECK(bl_wiki_open("/nonexistent/x.xml", NULL, &r) == BL_EIO && strstr(bl_last_error(), "/nonexistent/x.xml"),
        "missing file");
  write_file(p_bad, "hello world", 11);
  CHECK(bl_wiki_open(p_bad, NULL, &r) == BL_EFORMAT, "not xml: %s", bl_last_error());
  write_file(p_bad, "", 0);
  CHECK(bl_wiki_open(p_bad, NULL, &r) == BL_EFORMAT, "empty file");
  CHECK(bl_wiki_next(NULL, &d) == BL_EINVAL, "NULL reader");
  free(xml);
  free(b);
  free(b1);
  free(b2);
  free(cat);
  free(g);
}

static void test_real_dump(void) {
  const char *base = getenv("BL_SHARED_DATA");
  char path[1024];
  snprintf(path, sizeof path, "%s/wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
           base ? base : "../shared/data");
  if (access(path, R_OK)) {
    printf("note: %s absent, real-dump checks skipped\n", path);
    return;
  }
  bl_wiki_reader *r = NULL;
  CHECK(bl_wiki_open(path, NULL, &r) == 0, "open real dump: %s", bl_last_error());
  if (!r) return;
  bl_wiki_doc d;
  int rc, found = 0, n = 0;
  while ((rc = bl_wiki_next(r, &d)) == 1) {
    n++;
    if (d.title_len == 9 && !memcmp(d.title, "Anarchism", 9)) {
      found = 1;
      char *t = malloc(d.text_len + 1);
      memcpy(t, d.text, d.text_len);
      t[d.text_len] = 0;
      CHECK(!strstr(t, "{{") && !strstr(t, "[[") && !strstr(t, "|}") && !strstr(t, "<ref") && !strstr(t, "]]"),
            "Anarchism still has markup");
      CHECK(!strncmp(t, "Anarchism is a political philosophy that advocates self-governed societies", 74),
            "Anarchism starts [%.80s]", t);
      CHECK(d.text_len > 50000, "Anarchism too short: %zu", d.text_len);
      free(t);
    }
  }
  bl_wiki_stats st;
  bl_wiki_get_stats(r, &st);
  /* 206 pages: 100 redirects (the one ns-4 page is among them), 106 articles */
  CHECK(rc == 0 && found, "real dump: rc %d found %d", rc, found);
  CHECK(st.pages == 206 && st.redirects == 100 && st.articles == 106 && st.other_ns == 0 && n == 106,
        "real dump stats: pages %lld redirects %lld articles %lld other %lld docs %d", (long long)st.pages,
        (long long)st.redirects, (long long)st.articles, (long long)st.other_ns, n);
  bl_wiki_close(r);
}

int main(void) {
  char dir[] = "/tmp/bl_test_wiki_XXXXXX";
  if (!mkdtemp(dir)) {
    printf("mkdtemp failed\n");
    return 1;
  }
  test_clean();
  test_reader(dir);
  test_real_dump();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) {}
  if (failures) {
    printf("%d failures\n", failures);
    return 1;
  }
  printf("all wiki tests passed\n");
  return 0;
}
