-- bertlua.data.corpus: corpus preparation stages used by recipes/prepare_wikipedia.lua,
-- recipes/prepare_bookcorpus.lua and recipes/shard.lua.
--
-- Document format between stages (plain UTF-8 text files):
--   one document per block, a blank line between blocks; the first line of a
--   block is the document's title, the following lines its paragraphs (one
--   per line). Sharded output: one sentence per line, a blank line between
--   documents, no title (google-research/bert create_pretraining_data.py input).
--
-- Every stage streams: memory stays bounded whatever the corpus size (the
-- Wikipedia reader by its page cap, the sharder by --memory-mb through an
-- external bucket pass). Outputs are written to NAME.tmp and renamed, so a
-- file that exists is complete; prepare_* skip existing outputs when re-run.
local core = require "bertlua.core"
local fs = require "bertlua.util.fs"
local C, ffi = core.C, core.ffi
local bit = require "bit"

local M = {}

-- user-facing errors: the message already names the stage, no Lua position
local function uerr(msg) error(msg, 0) end

-- an output directory inside an input one (or the same) makes a rerun read its own output
local function separate(recipe, input, output)
  if fs.inside(output, input) or fs.inside(input, output) then
    uerr(("%s: --output=%s overlaps --input=%s: a rerun would read its own output; use a separate directory")
      :format(recipe, output, input))
  end
end

M.FORMAT_HELP = [[
Document format between stages: plain UTF-8 text, one document per block,
a blank line between documents, first line of a document = its title, then
one paragraph per line. Sharded output: one sentence per line, a blank line
between documents, no title (the input of BERT's create_pretraining_data.py).]]

local charpp = ffi.typeof("char*[1]")
local sizep = ffi.typeof("size_t[1]")

---------------------------------------------------------------- small helpers
function M.now() return C.bl_corpus_now() end
function M.peak_rss_mb() return tonumber(C.bl_corpus_peak_rss_kb()) / 1024 end
function M.split_list(s)
  local t = {}
  for p in tostring(s):gmatch("[^,]+") do t[#t + 1] = p end
  return t
end

local function fmt_time(s)
  if not s or s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s >= 3600 then return ("%dh%02dm"):format(math.floor(s / 3600), math.floor((s % 3600) / 60)) end
  return ("%dm%02ds"):format(math.floor(s / 60), s % 60)
end
M.fmt_time = fmt_time

-- Progress line on stderr (only when it is a terminal): items/s, MB/s, ETA.
function M.progress(label, total_bytes)
  local p = { t0 = M.now(), last = 0, tty = C.bl_corpus_stderr_isatty() == 1 }
  function p.update(items, bytes, force)
    if not p.tty then return end
    local t = M.now()
    if not force and t - p.last < 0.5 then return end
    p.last = t
    local dt = math.max(t - p.t0, 1e-9)
    local eta = ""
    if total_bytes and total_bytes > 0 and bytes and bytes > 0 then
      eta = (" %5.1f%% ETA %s"):format(100 * bytes / total_bytes, fmt_time((total_bytes - bytes) * dt / bytes))
    end
    io.stderr:write(("\r%s: %d items, %.0f items/s, %.1f MB/s%s   "):format(label, items, items / dt,
      (bytes or 0) / dt / 1e6, eta))
    io.stderr:flush()
  end
  function p.done() if p.tty then io.stderr:write("\n") end end
  return p
end

---------------------------------------------------------------- text primitives
-- the cleaning flags from options {keep_headings=, keep_lists=} (both off: WikiExtractor's defaults)
local function wiki_flags(o)
  return bit.bor(o.keep_headings and C.BL_WIKI_KEEP_HEADINGS or 0, o.keep_lists and C.BL_WIKI_KEEP_LISTS or 0)
end

-- clean_wikitext(s [, {keep_headings=, keep_lists=}]) -> plain text (see src/bl_corpus.h)
function M.clean_wikitext(s, o)
  local out, len = charpp(), sizep()
  core.check(C.bl_wikitext_clean(s, #s, wiki_flags(o or {}), out, len))
  local r = ffi.string(out[0], len[0])
  C.bl_corpus_free(out[0])
  return r
end

local sp_out, sp_len, sp_cnt = charpp(), sizep(), sizep()
-- split_sentences(text) -> string with one sentence per line (each ending in "\n"), count
function M.split_sentences(text)
  core.check(C.bl_sent_split(text, #text, sp_out, sp_len, sp_cnt))
  local r = ffi.string(sp_out[0], sp_len[0])
  C.bl_corpus_free(sp_out[0])
  return r, tonumber(sp_cnt[0])
end

-- Iterator over the documents of a file in the inter-stage format:
-- for title, body in corpus.documents(path) do ... end (body: paragraphs joined by "\n")
function M.documents(path)
  local lines = fs.lines(path)
  return function()
    local title
    local body = {}
    while true do
      local l = lines()
      if not l then
        if title then return title, table.concat(body, "\n") end
        return nil
      end
      if l:match("^%s*$") then
        if title then return title, table.concat(body, "\n") end
      elseif not title then title = l
      else body[#body + 1] = l end
    end
  end
end

-- Writer of a document file (bertlua.util.fs: PATH appears complete at :close() or not at all).
function M.doc_writer(path)
  local f = fs.open(path)
  local w = { path = path, docs = 0, bytes = 0 }
  function w:write(title, body)
    title = title:gsub("[\r\n]+", " "):gsub("^%s+", "")
    if title == "" then title = "untitled" end
    f:write(title, "\n", body, "\n\n")
    self.docs = self.docs + 1
    self.bytes = self.bytes + #title + #body + 3
  end
  function w:close() f:commit() end
  function w:abort() f:abort() end
  return w
end

local function wiki_stats_table(r)
  local st = ffi.new("bl_wiki_stats")
  core.check(C.bl_wiki_get_stats(r, st))
  local t = {}
  for _, k in ipairs { "pages", "articles", "redirects", "other_ns", "docs", "skipped_large", "skipped_bad",
                       "skipped_seek", "warnings", "bytes_in", "bytes_xml", "bz2", "bz2_streams" } do
    t[k] = tonumber(st[k])
  end
  return t
end

-- Low-level reader: local r = corpus.wiki_open(path, {max_page_mb=64, keep_headings=false, keep_lists=false,
--   quiet=false})
-- r:next() -> {title=, text=, page_id=, article_index=, xml_offset=} or nil at the end
-- (raises on fatal errors); r:seek_article(i); r:stats(); r:last_warning(); r:close()
function M.wiki_open(path, o)
  o = o or {}
  local opts = ffi.new("bl_wiki_options")
  opts.max_page_bytes = math.floor((o.max_page_mb or 64) * 1048576)
  opts.flags = wiki_flags(o)
  opts.quiet = o.quiet and 1 or 0
  local pr = ffi.new("bl_wiki_reader*[1]")
  core.check(C.bl_wiki_open(path, opts, pr))
  local raw = ffi.gc(pr[0], C.bl_wiki_close)
  local doc = ffi.new("bl_wiki_doc")
  local r = { raw = raw }
  function r:next()
    local rc = C.bl_wiki_next(raw, doc)
    if rc < 0 then core.fail() end
    if rc == 0 then return nil end
    return { title = ffi.string(doc.title, doc.title_len), text = ffi.string(doc.text, doc.text_len),
             page_id = tonumber(doc.page_id), article_index = tonumber(doc.article_index),
             xml_offset = tonumber(doc.xml_offset) }
  end
  function r:seek_article(i) core.check(C.bl_wiki_seek_article(raw, i)) end
  function r:stats() return wiki_stats_table(raw) end
  function r:last_warning() return ffi.string(C.bl_wiki_last_warning(raw)) end
  function r:close() ffi.gc(raw, nil); C.bl_wiki_close(raw) end
  return r
end

-- Extract articles of one or more dumps into DIR/wiki_NNNNN.txt (one input) or
-- DIR/wiki_II_NNNNN.txt (several). File k of an input holds the articles with
-- article_index in [k*docs_per_file, (k+1)*docs_per_file) that pass min_chars,
-- so existing files can be skipped on a re-run without re-cleaning them.
-- Returns a summary table.
function M.prepare_wikipedia(o)
  local inputs = type(o.input) == "table" and o.input or M.split_list(o.input or "")
  if #inputs == 0 then uerr("prepare_wikipedia: --input is required") end
  if not o.output or o.output == "" then uerr("prepare_wikipedia: --output is required") end
  local N = math.floor(o.docs_per_file or 10000)
  if N < 1 then uerr("prepare_wikipedia: --docs-per-file must be >= 1") end
  fs.mkdir_p(o.output)
  local sum = { files_written = 0, files_existing = 0, docs = 0, short = 0, chars = 0, pages = 0, articles = 0,
                redirects = 0, other_ns = 0, skipped_bad = 0, skipped_large = 0, warnings = 0, bytes_in = 0,
                bytes_xml = 0 }
  local t0 = M.now()
  local total_in = 0
  for _, p in ipairs(inputs) do total_in = total_in + math.max(fs.file_size(p), 0) end
  local done_in = 0
  for ii, path in ipairs(inputs) do
    local function name(k)
      if #inputs == 1 then return ("%s/wiki_%05d.txt"):format(o.output, k) end
      return ("%s/wiki_%02d_%05d.txt"):format(o.output, ii - 1, k)
    end
    local function first_missing(k)
      while fs.exists(name(k)) do sum.files_existing = sum.files_existing + 1; k = k + 1 end
      return k
    end
    local r = M.wiki_open(path, o)
    local prog = M.progress("wiki " .. path:match("[^/]*$"), total_in)
    local k0 = first_missing(0)
    if k0 > 0 then r:seek_article(k0 * N) end
    local cur, w = -1, nil
    local ok, err = pcall(function()
      while true do
        local d = r:next()
        if not d then break end
        local k = math.floor(d.article_index / N)
        if k ~= cur then
          if w then w:close(); sum.files_written = sum.files_written + 1; w = nil end
          cur = k
          if fs.exists(name(k)) then
            local kn = first_missing(k)
            r:seek_article(kn * N)
            goto continue
          end
          w = M.doc_writer(name(k))
        end
        if #d.text < (o.min_chars or 0) or #d.text == 0 then
          sum.short = sum.short + 1
        else
          w:write(d.title, d.text)
          sum.docs = sum.docs + 1
          sum.chars = sum.chars + #d.text
        end
        if sum.docs % 64 == 0 then
          local st = r:stats()
          prog.update(sum.docs, done_in + st.bytes_in)
        end
        ::continue::
      end
    end)
    if not ok then
      if w then w:abort() end
      prog.done()
      error(err, 0)
    end
    if w then w:close(); sum.files_written = sum.files_written + 1 end
    local st = r:stats()
    r:close()
    prog.update(sum.docs, done_in + st.bytes_in, true)
    prog.done()
    done_in = done_in + st.bytes_in
    for _, key in ipairs { "pages", "articles", "redirects", "other_ns", "skipped_bad", "skipped_large",
                           "warnings", "bytes_in", "bytes_xml" } do
      sum[key] = sum[key] + st[key]
    end
  end
  sum.seconds = M.now() - t0
  sum.peak_rss_mb = M.peak_rss_mb()
  return sum
end

---------------------------------------------------------------- BookCorpus-style books
-- Turn one book's text into a title and paragraph lines: Gutenberg header and
-- footer (*** START OF ... *** / *** END OF ...) are cut when present; the
-- paragraphs (blocks separated by blank lines) become one line each.
function M.book_to_document(text, fallback_title)
  text = text:gsub("\r\n?", "\n")
  if text:sub(1, 3) == "\239\187\191" then text = text:sub(4) end
  local title = text:match("\nTitle:%s*([^\n]+)") or text:match("^Title:%s*([^\n]+)")
  local s = text:find("\n%*%*%*%s*START OF[^\n]*\n") or text:find("^%*%*%*%s*START OF[^\n]*\n")
  if s then
    local e = text:find("\n", s + 1, true)
    text = text:sub(e + 1)
  end
  local e = text:find("\n%*%*%*%s*END OF") or text:find("\nEnd of the Project Gutenberg") or
            text:find("\nEnd of Project Gutenberg")
  if e then text = text:sub(1, e) end
  local paras = {}
  for block in (text .. "\n\n"):gmatch("(.-)\n[ \t]*\n") do
    local p = block:gsub("%s+", " "):gsub("^ ", ""):gsub(" $", "")
    if p ~= "" and not p:match("^%[Illustration[^%]]*%]$") then paras[#paras + 1] = p end
  end
  title = (title or fallback_title or "untitled"):gsub("%s+$", "")
  return title, table.concat(paras, "\n"), #paras
end

-- Convert DIR_OF_TXT/*.txt into DIR/books_NNNNN.txt (docs_per_file books each).
function M.prepare_bookcorpus(o)
  if not o.input or not fs.is_dir(o.input) then uerr("prepare_bookcorpus: --input must be a directory, got "
    .. tostring(o.input)) end
  if not o.output or o.output == "" then uerr("prepare_bookcorpus: --output is required") end
  separate("prepare_bookcorpus", o.input, o.output)
  fs.mkdir_p(o.output)
  local files = fs.list_dir(o.input, "%.txt$")
  local N = math.floor(o.docs_per_file or 1000)
  if N < 1 then uerr("prepare_bookcorpus: --docs-per-file must be >= 1") end
  local sum = { books = 0, files_written = 0, files_existing = 0, empty = 0, paragraphs = 0, bytes_in = 0 }
  local total = 0
  for _, n in ipairs(files) do total = total + fs.file_size(o.input .. "/" .. n) end
  local prog = M.progress("books", total)
  local t0 = M.now()
  for k = 0, math.ceil(#files / N) - 1 do
    local out = ("%s/books_%05d.txt"):format(o.output, k)
    if fs.exists(out) then
      sum.files_existing = sum.files_existing + 1
    else
      local w = M.doc_writer(out)
      local ok, err = pcall(function()
        for i = k * N + 1, math.min((k + 1) * N, #files) do
          local path = o.input .. "/" .. files[i]
          local text = fs.read(fs.check_input(path, "book"))
          if not text then uerr("prepare_bookcorpus: cannot read " .. path) end
          sum.bytes_in = sum.bytes_in + #text
          local title, body, np = M.book_to_document(text, files[i]:gsub("%.txt$", ""))
          if np == 0 then sum.empty = sum.empty + 1
          else
            w:write(title, body)
            sum.books = sum.books + 1
            sum.paragraphs = sum.paragraphs + np
          end
          prog.update(sum.books, sum.bytes_in)
        end
      end)
      if not ok then w:abort(); error(err, 0) end
      w:close()
      sum.files_written = sum.files_written + 1
    end
  end
  prog.done()
  sum.seconds = M.now() - t0
  return sum
end

---------------------------------------------------------------- sharding
-- Min-heap of {bytes, index} for dealing documents to the least-filled shard.
local function heap_new(n)
  local h = {}
  for i = 1, n do h[i] = { 0, i } end
  return h
end
local function less(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end
local function heap_add_top(h, bytes)
  local top = h[1]
  top[1] = top[1] + bytes
  local i, n = 1, #h
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and less(h[l], h[m]) then m = l end
    if r <= n and less(h[r], h[m]) then m = r end
    if m == i then break end
    h[i], h[m] = h[m], h[i]
    i = m
  end
  return top[2]
end

-- shard{input=DIR[,DIR2] or table, output=DIR, num_shards=N, num_test_shards=M (-1 auto),
--       test_fraction=f, seed=s, memory_mb=m, keep_titles=false}
-- Pass 1 splits every document into sentences, gives it a key u = hash(seed, doc#)
-- and appends it to bucket floor(u*K) (K from the corpus size and memory_mb).
-- Pass 2 loads one bucket at a time, sorts it by key (buckets are key ranges,
-- so the global order does not depend on K) and deals each document to the
-- train or test shard holding the fewest bytes. Same seed -> same shards.
function M.shard(o)
  local dirs = type(o.input) == "table" and o.input or M.split_list(o.input or "")
  if #dirs == 0 then uerr("shard: --input is required") end
  if not o.output or o.output == "" then uerr("shard: --output is required") end
  local N = math.floor(o.num_shards or 0)
  if N < 1 then uerr("shard: --num-shards must be >= 1") end
  local frac = o.test_fraction or 0
  if frac < 0 or frac >= 1 then uerr("shard: --test-fraction must be in [0, 1)") end
  local NT = math.floor(o.num_test_shards or -1)
  if NT < 0 then NT = frac > 0 and math.max(1, math.floor(N * frac + 0.5)) or 0 end
  if frac > 0 and NT == 0 then uerr("shard: --test-fraction > 0 needs --num-test-shards >= 1") end
  local seed = math.floor(o.seed or 12345)
  local mem = (o.memory_mb or 1024) * 1048576
  if mem < 16384 then uerr("shard: --memory-mb must be at least 1/64 (16 KB)") end

  local files = {}
  local total = 0
  for _, d in ipairs(dirs) do
    if not fs.is_dir(d) then uerr("shard: input " .. d .. " is not a directory") end
    separate("shard", d, o.output)
    for _, n in ipairs(fs.list_dir(d, "%.txt$")) do
      local p = d .. "/" .. n
      files[#files + 1] = p
      total = total + fs.file_size(p)
    end
  end
  if #files == 0 then uerr("shard: no .txt files in " .. table.concat(dirs, ",")) end
  fs.mkdir_p(o.output)
  local tmpdir = o.output .. "/.shard_tmp"
  fs.mkdir_p(tmpdir)
  -- a bucket is held in memory as Lua strings plus per-document tables: budget 1/3 of memory_mb
  local K = math.max(1, math.ceil(total * 1.1 / (mem / 3)))
  if K > 1000 then uerr(("shard: %d buckets needed for %.0f MB with --memory-mb=%g; raise --memory-mb"):format(K,
    total / 1e6, o.memory_mb)) end
  local t0 = M.now()

  -- pass 1: split and spill
  local buckets = {}
  for b = 1, K do
    local p = ("%s/bucket_%04d.txt"):format(tmpdir, b - 1)
    buckets[b] = fs.open(p)
  end
  local ndocs, nsent, bytes_in, empty = 0, 0, 0, 0
  local prog = M.progress("shard pass 1", total)
  for _, p in ipairs(files) do
    for title, body in M.documents(p) do
      bytes_in = bytes_in + #title + #body + 2
      local text = o.keep_titles and (title .. "\n" .. body) or body
      local s, cnt = M.split_sentences(text)
      if cnt > 0 then
        local u = C.bl_corpus_hash_unit(seed, ndocs, 0)
        local test = (frac > 0 and C.bl_corpus_hash_unit(seed, ndocs, 1) < frac) and 1 or 0
        local b = math.min(K, math.floor(u * K) + 1)
        buckets[b]:write(("%.17g %d %d %d\n"):format(u, ndocs, test, cnt), s, "\n")
        nsent = nsent + cnt
      else
        empty = empty + 1
      end
      ndocs = ndocs + 1
      prog.update(ndocs, bytes_in)
    end
  end
  for b = 1, K do buckets[b]:commit() end
  prog.done()

  -- pass 2: order each bucket by key, deal to shards
  local function open_set(prefix, n)
    local set = { files = {}, docs = {}, sents = {}, bytes = {}, heap = heap_new(n), n = n }
    for i = 1, n do
      local path = ("%s/%s_%05d.txt"):format(o.output, prefix, i - 1)
      set.files[i] = { path = path, f = fs.open(path) }
      set.docs[i], set.sents[i], set.bytes[i] = 0, 0, 0
    end
    return set
  end
  local train = open_set("train", N)
  local test = NT > 0 and open_set("test", NT) or nil
  prog = M.progress("shard pass 2", nil)
  local dealt = 0
  for b = 1, K do
    local path = ("%s/bucket_%04d.txt"):format(tmpdir, b - 1)
    local docs = {}
    local cur
    for line in fs.lines(path, true) do
      if not cur then
        local u, idx, t = line:match("^(%S+) (%d+) (%d) (%d+)$")
        if not u then uerr("shard: corrupt bucket file " .. path) end
        cur = { tonumber(u), tonumber(idx), t == "1", {} }
      elseif line == "" then
        cur[4] = table.concat(cur[4], "\n")
        docs[#docs + 1] = cur
        cur = nil
      else
        local l = cur[4]
        l[#l + 1] = line
      end
    end
    table.sort(docs, function(x, y) return x[1] < y[1] or (x[1] == y[1] and x[2] < y[2]) end)
    for _, d in ipairs(docs) do
      local set = (d[3] and test) or train
      local sz = #d[4] + 2
      local i = heap_add_top(set.heap, sz)
      set.files[i].f:write(d[4], "\n\n")
      set.docs[i] = set.docs[i] + 1
      local _, c = d[4]:gsub("\n", "")
      set.sents[i] = set.sents[i] + c + 1
      set.bytes[i] = set.bytes[i] + sz
      dealt = dealt + 1
    end
    docs = nil  -- luacheck: ignore 311 (released before the next bucket is read)
    os.remove(path)
    collectgarbage()
    prog.update(dealt, nil)
  end
  prog.done()
  local function close_set(set)
    if not set then return end
    for i = 1, set.n do set.files[i].f:commit() end
  end
  close_set(train); close_set(test)
  os.remove(tmpdir)

  local function stats(set)
    if not set then return { shards = 0, docs = 0, sentences = 0, bytes = 0 } end
    local s = { shards = set.n, docs = 0, sentences = 0, bytes = 0, min_bytes = math.huge, max_bytes = 0,
                per_shard = {} }
    for i = 1, set.n do
      s.docs = s.docs + set.docs[i]; s.sentences = s.sentences + set.sents[i]; s.bytes = s.bytes + set.bytes[i]
      s.min_bytes = math.min(s.min_bytes, set.bytes[i]); s.max_bytes = math.max(s.max_bytes, set.bytes[i])
      s.per_shard[i] = { docs = set.docs[i], sentences = set.sents[i], bytes = set.bytes[i] }
    end
    return s
  end
  local sum = { input_docs = ndocs, empty_docs = empty, sentences = nsent, buckets = K,
                train = stats(train), test = stats(test), seconds = M.now() - t0, seed = seed }
  sum.peak_rss_mb = M.peak_rss_mb()
  -- manifest last: its presence means the shard set is complete
  local mf = fs.open(o.output .. "/shards.json")
  local function set_json(s)
    local parts = {}
    for i, p in ipairs(s.per_shard or {}) do
      parts[i] = ('{"docs":%d,"sentences":%d,"bytes":%d}'):format(p.docs, p.sentences, p.bytes)
    end
    return ('{"shards":%d,"docs":%d,"sentences":%d,"bytes":%d,"per_shard":[%s]}'):format(
      s.shards, s.docs, s.sentences, s.bytes, table.concat(parts, ","))
  end
  mf:write(('{"format":"one sentence per line, blank line between documents","seed":%d,"input_docs":%d,' ..
            '"empty_docs":%d,"train":%s,"test":%s}\n'):format(seed, ndocs, empty, set_json(sum.train),
              set_json(sum.test)))
  mf:commit()
  return sum
end

-- run_stage(name, o, fn): what the corpus recipes do around their stage: --input and --output are required
-- (exit 2), the options are printed, fn(o) runs and an error is one line on stderr (exit 1); returns fn's result
function M.run_stage(name, o, fn)
  if o.input == "" or o.output == "" then
    io.stderr:write(name .. ": --input and --output are required (see --help)\n")
    os.exit(2)
  end
  print(name .. " options:\n" .. require("bertlua.util.options").show(o, "  %-18s %s"))
  local ok, s = pcall(fn, o)
  if not ok then
    io.stderr:write(name .. ": error: ", tostring(s), "\n")
    os.exit(1)
  end
  return s
end

return M
