/* Sentence segmentation: abbreviations, initials, decimals, ellipses,
 * quotes and brackets after the terminator, ?! runs, CJK, line breaks,
 * determinism, and bad arguments. Expected outputs are written by hand:
 * sentences joined with " | ". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bertlua.h"
#include "bl_corpus.h"

static int failures = 0;

static void sent_case(const char *in, const char *want) {
  char *out = NULL;
  size_t n = 0, cnt = 0;
  int rc = bl_sent_split(in, strlen(in), &out, &n, &cnt);
  if (rc) {
    failures++;
    printf("FAIL rc %d for [%s]: %s\n", rc, in, bl_last_error());
    return;
  }
  /* join lines with " | " */
  char got[4096];
  size_t g = 0;
  size_t lines = 0;
  for (size_t i = 0; i < n && g + 4 < sizeof got; i++) {
    if (out[i] == '\n') {
      lines++;
      if (i + 1 < n) {
        memcpy(got + g, " | ", 3);
        g += 3;
      }
    } else
      got[g++] = out[i];
  }
  got[g] = 0;
  if (strcmp(got, want) || lines != cnt || (n && out[n - 1] != '\n')) {
    failures++;
    printf("FAIL split [%s]\n  got  [%s] (%zu sentences)\n  want [%s]\n", in, got, cnt, want);
  }
  bl_corpus_free(out);
}

int main(void) {
  sent_case("Hello world. This is a test.", "Hello world. | This is a test.");
  sent_case("Mr. Smith went to Washington. He arrived.", "Mr. Smith went to Washington. | He arrived.");
  sent_case("Dr. Jones and Mrs. Brown met at St. Paul's.", "Dr. Jones and Mrs. Brown met at St. Paul's.");
  sent_case("Use e.g. apples, i.e. fruit. Then stop.", "Use e.g. apples, i.e. fruit. | Then stop.");
  sent_case("He moved to the U.S. in 1990. It was cold.", "He moved to the U.S. in 1990. | It was cold.");
  sent_case("J. R. R. Tolkien wrote it. It sold well.", "J. R. R. Tolkien wrote it. | It sold well.");
  sent_case("Pi is 3.14 roughly. Really.", "Pi is 3.14 roughly. | Really.");
  sent_case("\"He left.\" She cried.", "\"He left.\" | She cried.");
  sent_case("\xE2\x80\x9CHe left.\xE2\x80\x9D She cried.", "\xE2\x80\x9CHe left.\xE2\x80\x9D | She cried.");
  sent_case("(This is aside.) Next one.", "(This is aside.) | Next one.");
  sent_case("Really?! Yes! No? maybe.", "Really?! | Yes! | No? maybe.");
  sent_case("\"Where?\" she asked.", "\"Where?\" she asked.");
  sent_case("Wait... Then go. Well... maybe not.", "Wait... | Then go. | Well... maybe not.");
  sent_case("He paused\xE2\x80\xA6 Then spoke.", "He paused\xE2\x80\xA6 | Then spoke.");
  sent_case("See No. 5 and pp. 12-14. Done.", "See No. 5 and pp. 12-14. | Done.");
  sent_case("It ended in 1990. 1991 was new.", "It ended in 1990. | 1991 was new.");
  sent_case("He said so. \"Why?\" asked Ann.", "He said so. | \"Why?\" asked Ann.");
  sent_case("Roe v. Wade was decided. It matters.", "Roe v. Wade was decided. | It matters.");
  sent_case("Smith et al. (2005) found it. Good.", "Smith et al. (2005) found it. | Good.");
  sent_case("Apples, pears, etc. The end.", "Apples, pears, etc. | The end.");
  sent_case(
      "\xC3\x89t\xC3\xA9 arrive. \xC3\x89norme. \xC3\xA9"
      "crit ici.",
      "\xC3\x89t\xC3\xA9 arrive. | \xC3\x89norme. \xC3\xA9"
      "crit ici.");
  sent_case("\xE6\x88\x91\xE6\x9D\xA5\xE4\xBA\x86\xE3\x80\x82\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x81",
            "\xE6\x88\x91\xE6\x9D\xA5\xE4\xBA\x86\xE3\x80\x82 | \xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x81");
  sent_case("Line one without stop\nLine two. Three.", "Line one without stop | Line two. | Three.");
  sent_case("  spaced   out.   Next  ", "spaced   out. | Next");
  sent_case("www.example.com is a site. Ok.", "www.example.com is a site. | Ok.");
  sent_case("", "");
  sent_case("\n\n  \n", "");
  sent_case("...", "...");
  sent_case("Trailing space after stop. ", "Trailing space after stop.");

  /* determinism: same input, same bytes */
  const char *t = "A. B. C. Dr. X said \"Hi.\" Then? Yes! 3.5 is it... Go.";
  char *o1, *o2;
  size_t n1, n2, c1, c2;
  if (bl_sent_split(t, strlen(t), &o1, &n1, &c1) || bl_sent_split(t, strlen(t), &o2, &n2, &c2) || n1 != n2 ||
      c1 != c2 || memcmp(o1, o2, n1)) {
    failures++;
    printf("FAIL determinism\n");
  } else {
    bl_corpus_free(o1);
    bl_corpus_free(o2);
  }

  /* invalid UTF-8 must not crash and must keep every non-space byte */
  const char bad[] = "Bad \xff\xfe bytes. Next \xc3 one.";
  char *o;
  size_t n, c;
  if (bl_sent_split(bad, sizeof bad - 1, &o, &n, &c) || c != 2) {
    failures++;
    printf("FAIL invalid utf8 (%zu)\n", c);
  } else
    bl_corpus_free(o);

  if (bl_sent_split(NULL, 4, &o, &n, &c) != BL_EINVAL) {
    failures++;
    printf("FAIL NULL text accepted\n");
  }
  if (failures) {
    printf("%d failures\n", failures);
    return 1;
  }
  printf("all sentence tests passed\n");
  return 0;
}
