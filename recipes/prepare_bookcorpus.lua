-- prepare_bookcorpus.lua: turn a directory of books (.txt, e.g. BookCorpus or
-- Project Gutenberg) into the inter-stage document format.
--   bertlua recipes/prepare_bookcorpus.lua --input=books/ --output=data/books
-- One book = one document (title from a "Title:" line, else the file name);
-- paragraphs (separated by blank lines) are joined into single lines; the
-- Gutenberg header/footer (*** START OF ... *** / *** END OF ...) is cut when
-- present. Writes DIR/books_NNNNN.txt atomically; existing files are skipped.
local corpus = require "bertlua.data.corpus"
local options = require "bertlua.util.options"

local o = options.parse(arg, {
  { "input", "", "directory of .txt books" },
  { "output", "", "output directory" },
  { "docs_per_file", 1000, "books per output file" },
}, { name = "prepare_bookcorpus",
  usage = "usage: bertlua recipes/prepare_bookcorpus.lua --input=DIR_OF_TXT --output=DIR",
  description = corpus.FORMAT_HELP })
local s = corpus.run_stage("prepare_bookcorpus", o, corpus.prepare_bookcorpus)
print(("books %d (%d paragraphs, %.1f MB read), empty %d, files written %d, already present %d, %.2f s")
  :format(s.books, s.paragraphs, s.bytes_in / 1e6, s.empty, s.files_written, s.files_existing, s.seconds))
