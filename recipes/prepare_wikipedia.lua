-- prepare_wikipedia.lua: extract plain-text articles from a Wikipedia dump.
--   bertlua recipes/prepare_wikipedia.lua --input=enwiki-latest-pages-articles.xml.bz2 --output=data/wiki
-- Reads .xml, .xml.bz2 (single or multi-stream) or "-" (stdin), streaming with
-- bounded memory; keeps namespace-0 pages that are not redirects, strips the
-- wiki markup (templates, tables, refs, files, categories, headings, list items...) and
-- writes DIR/wiki_NNNNN.txt, docs_per_file articles each, atomically
-- (NAME.tmp then rename). Re-running skips the files that already exist.
-- Several dumps: --input=a.xml.bz2,b.xml.bz2 (files DIR/wiki_II_NNNNN.txt).
local corpus = require "bertlua.data.corpus"
local options = require "bertlua.util.options"

local o = options.parse(arg, {
  { "input", "", "dump path(s), comma-separated" },
  { "output", "", "output directory" },
  { "docs_per_file", 10000, "articles per output file (by article index)" },
  { "min_chars", 0, "drop articles whose cleaned text is shorter" },
  { "keep_headings", false, "keep section titles as their own line (WikiExtractor drops them)" },
  { "keep_lists", false, "keep the text of list items (* # ;) (WikiExtractor, NVIDIA's extractor, drops them)" },
  { "max_page_mb", 64, "pages larger than this are skipped with a warning", int = false },
  { "quiet", false, "do not print per-page warnings (they are still counted)" },
}, { name = "prepare_wikipedia",
  usage = "usage: bertlua recipes/prepare_wikipedia.lua --input=DUMP.xml[.bz2][,DUMP2...] --output=DIR",
  description = "Extracts Wikipedia articles (namespace 0, no redirects) as plain text.\n" .. corpus.FORMAT_HELP })
local s = corpus.run_stage("prepare_wikipedia", o, corpus.prepare_wikipedia)
print(("pages %d, articles %d, redirects %d, other namespaces %d"):format(s.pages, s.articles, s.redirects, s.other_ns))
print(("documents written %d (%.1f M chars), too short %d, bad pages %d, too large %d, warnings %d")
  :format(s.docs, s.chars / 1e6, s.short, s.skipped_bad, s.skipped_large, s.warnings))
print(("files written %d, already present %d"):format(s.files_written, s.files_existing))
print(("%.1f s, %.1f MB/s of XML (%.1f MB/s of input), peak RSS %.0f MB"):format(s.seconds,
  s.bytes_xml / 1e6 / math.max(s.seconds, 1e-9), s.bytes_in / 1e6 / math.max(s.seconds, 1e-9), s.peak_rss_mb))
