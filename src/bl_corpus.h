/* bertlua — corpus preparation: Wikipedia dump extraction, wikitext
 * cleaning, sentence segmentation and small file-system helpers used by the
 * data recipes (recipes/prepare_wikipedia.lua, prepare_bookcorpus.lua,
 * shard.lua through lua/bertlua/data/corpus.lua).
 *
 * Document format between stages (plain UTF-8 text files):
 *   - one document per block, blocks separated by one blank line;
 *   - the first line of a block is the document title, the following lines
 *     are its paragraphs (one paragraph per line, no blank lines inside);
 *   - after sharding: one sentence per line, a blank line between documents,
 *     no title line (the input format of google-research/bert's
 *     create_pretraining_data.py).
 *
 * Wikipedia reader contract: bl_wiki_open accepts `pages-articles*.xml`,
 * `.xml.bz2` (single or multi-stream, i.e. concatenated bz2 streams) or "-"
 * for stdin. It streams: memory is bounded by max_page_bytes (a few buffers
 * of that size) whatever the dump size. bl_wiki_next returns 1 and fills
 * `doc` with the next article (namespace 0, not a redirect) as cleaned plain
 * text, 0 at the end of the input, or a negative status on a fatal problem
 * (I/O error, corrupt or truncated bz2: the message names the file and the
 * byte offset). Bad pages (malformed XML, invalid UTF-8, text over
 * max_page_bytes) are skipped with a warning naming the title and byte
 * offset, and counted in bl_wiki_stats. doc's pointers stay valid until the
 * next bl_wiki_next/bl_wiki_close.
 *
 * Cleaning (like WikiExtractor's defaults): templates {{...}} and
 * parameters {{{...}}} (nested), tables {|...|}, comments, <ref>, <math>,
 * <gallery>, <timeline> and similar blocks are dropped; File:/Image:/
 * Category: and interlanguage links are dropped (captions included);
 * [[target|anchor]] -> anchor, [[target]] -> target, [http://x anchor] ->
 * anchor; other HTML tags are removed, keeping their text; bold/italic
 * quotes, magic words (__TOC__) and table-remnant lines are removed; list
 * items (lines starting with * # ;) are dropped and indented lines (:) keep
 * their text, as WikiExtractor does by default (BL_WIKI_KEEP_LISTS keeps the
 * items' text); section headings are dropped (BL_WIKI_KEEP_HEADINGS keeps
 * them as their own line); entities (&amp; &nbsp; &ndash; &#NNN;
 * &#xHH; ...) are decoded. Output: one paragraph per line, no empty lines,
 * no trailing newline.
 */
#ifndef BL_CORPUS_H
#define BL_CORPUS_H
#include "bl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BL_CDEF_BEGIN */
enum { BL_WIKI_KEEP_HEADINGS = 1, BL_WIKI_KEEP_LISTS = 2 };

typedef struct bl_wiki_reader bl_wiki_reader;

typedef struct bl_wiki_options {
  size_t max_page_bytes; /* pages whose XML is larger are skipped; 0 = 64 MiB */
  int32_t flags;         /* BL_WIKI_KEEP_HEADINGS | BL_WIKI_KEEP_LISTS */
  int32_t quiet;         /* 1: do not print warnings on stderr (still counted) */
} bl_wiki_options;

typedef struct bl_wiki_doc {
  const char *title;
  size_t title_len;
  const char *text; /* cleaned plain text, may be empty */
  size_t text_len;
  int64_t page_id;
  int64_t article_index; /* 0-based index among ns-0 non-redirect pages (bad ones included) */
  uint64_t xml_offset;   /* byte offset of <page> in the decompressed XML */
} bl_wiki_doc;

typedef struct bl_wiki_stats {
  int64_t pages;    /* <page> elements seen */
  int64_t articles; /* ns 0, not a redirect */
  int64_t redirects;
  int64_t other_ns;      /* pages in a namespace other than 0 (not redirects) */
  int64_t docs;          /* articles returned by bl_wiki_next */
  int64_t skipped_large; /* pages over max_page_bytes */
  int64_t skipped_bad;   /* malformed XML or invalid UTF-8 */
  int64_t skipped_seek;  /* articles skipped by bl_wiki_seek_article */
  int64_t warnings;
  uint64_t bytes_in;   /* bytes read from the file (compressed size for .bz2) */
  uint64_t bytes_xml;  /* decompressed XML bytes scanned */
  int32_t bz2;         /* 1 when the input is bzip2 */
  int32_t bz2_streams; /* bz2 streams decoded (multi-stream dumps have many) */
} bl_wiki_stats;

int bl_wiki_open(const char *path, const bl_wiki_options *opts, bl_wiki_reader **out);
int bl_wiki_next(bl_wiki_reader *r, bl_wiki_doc *doc);
/* Articles with article_index < index are skipped without being cleaned
 * (used to resume: the XML still has to be read and decompressed). */
int bl_wiki_seek_article(bl_wiki_reader *r, int64_t index);
int bl_wiki_get_stats(const bl_wiki_reader *r, bl_wiki_stats *st);
const char *bl_wiki_last_warning(const bl_wiki_reader *r);
void bl_wiki_close(bl_wiki_reader *r);

/* Clean one page of wikitext (already XML-decoded). *out is allocated
 * (release with bl_corpus_free). */
int bl_wikitext_clean(const char *src, size_t len, int32_t flags, char **out, size_t *out_len);

/* Sentence segmentation. Splits `text` (UTF-8, lines are hard breaks) into
 * sentences written to *out one per line, each ending with '\n', trimmed,
 * empty ones dropped. Handles abbreviations (Mr., Dr., e.g., i.e., U.S.,
 * initials J. R. R.), decimals, ellipses, closing quotes/brackets after the
 * terminator, ?! runs and CJK full stops. Deterministic.
 * *out is allocated (bl_corpus_free); *count receives the sentence count. */
int bl_sent_split(const char *text, size_t len, char **out, size_t *out_len, size_t *count);

void bl_corpus_free(void *p);

/* Process helpers for progress lines (file-system helpers: bl_io.h). */
int bl_corpus_stderr_isatty(void);
int64_t bl_corpus_peak_rss_kb(void); /* VmHWM from /proc/self/status, -1 if unknown */
double bl_corpus_now(void);          /* monotonic wall clock, seconds */
/* Deterministic uniform number in [0, 1) (53 bits) from (seed, index, stream):
 * splitmix64 mixing, so shuffles and splits do not depend on Lua's RNG. */
double bl_corpus_hash_unit(uint64_t seed, uint64_t index, uint32_t stream);
/* BL_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif
