-- Corpus stages: wikitext cleaning and sentence splitting through the FFI,
-- prepare_wikipedia (real dump sample, resume, truncated input),
-- prepare_bookcorpus (Gutenberg boilerplate, real books) and shard
-- (determinism, exactly-once, balance, spill == no spill, bad options).
local T = require "testing"
local corpus = require "bertlua.data.corpus"
local fs = require "bertlua.util.fs"

local function tmpdir()
  local p = os.tmpname()
  os.remove(p)
  fs.mkdir_p(p)
  return p
end

local function rm_rf(dir) os.execute("rm -rf '" .. dir .. "'") end

local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local WIKI = "wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"

T.test("clean_wikitext and split_sentences via FFI", function()
  T.eq(corpus.clean_wikitext("'''Bold''' [[a|b]] {{t|x}}c.<ref>r</ref>"), "Bold b c.")
  T.eq(corpus.clean_wikitext("== H ==\nx", { keep_headings = true }), "H\nx")
  T.eq(corpus.clean_wikitext("x\n* item\n: indent"), "x\nindent")
  T.eq(corpus.clean_wikitext("x\n* item\n: indent", { keep_lists = true }), "x\nitem\nindent")
  local s, n = corpus.split_sentences("Mr. Smith came. He sat.\nNew line")
  T.eq(s, "Mr. Smith came.\nHe sat.\nNew line\n")
  T.eq(n, 3)
  local e, n0 = corpus.split_sentences("")
  T.eq(e, ""); T.eq(n0, 0)
end)

T.test("prepare_wikipedia on the dump sample, resumable", function()
  local data = T.shared_data(WIKI)
  if not data then T.skip("shared data " .. WIKI .. " absent") end
  local dir = tmpdir()
  local s = corpus.prepare_wikipedia { input = data, output = dir, docs_per_file = 50, quiet = true }
  T.eq(s.pages, 206); T.eq(s.redirects, 100); T.eq(s.articles, 106); T.eq(s.other_ns, 0)
  -- list items are dropped as WikiExtractor drops them: "List of anthropologists" is all list, so empty
  T.eq(s.docs, 105); T.eq(s.short, 1); T.eq(s.files_written, 3)
  local names = fs.list_dir(dir)
  T.eq(table.concat(names, ","), "wiki_00000.txt,wiki_00001.txt,wiki_00002.txt")
  local titles, anarchism = {}, nil
  for _, n in ipairs(names) do
    for title, body in corpus.documents(dir .. "/" .. n) do
      titles[#titles + 1] = title
      if title == "Anarchism" then anarchism = body end
    end
  end
  T.eq(#titles, 105)
  T.eq(titles[1], "Anarchism")
  T.truthy(anarchism and #anarchism > 50000, "Anarchism body present")
  for _, bad in ipairs { "{{", "}}", "[[", "]]", "|}", "<ref", "&nbsp;", "'''" } do
    T.truthy(not anarchism:find(bad, 1, true), "Anarchism still contains " .. bad)
  end
  T.truthy(not anarchism:find("\n\n", 1, true), "no blank line inside a document")
  -- resume: remove the middle file, re-run, identical result and the others untouched
  local before = {}
  for _, n in ipairs(names) do before[n] = slurp(dir .. "/" .. n) end
  os.remove(dir .. "/wiki_00001.txt")
  local s2 = corpus.prepare_wikipedia { input = data, output = dir, docs_per_file = 50, quiet = true }
  T.eq(s2.files_written, 1); T.eq(s2.files_existing, 2); T.eq(s2.docs + s2.short, 50)
  for _, n in ipairs(names) do T.eq(slurp(dir .. "/" .. n) == before[n], true, n .. " differs after resume") end
  -- min_chars filters short articles
  local dir2 = tmpdir()
  local s3 = corpus.prepare_wikipedia { input = data, output = dir2, docs_per_file = 1000, min_chars = 5000,
    quiet = true }
  T.truthy(s3.short > 0 and s3.docs + s3.short == 106, "min_chars split: " .. s3.docs .. "+" .. s3.short)
  -- keep_lists keeps the list items' text: every article has text, and more of it
  local dir3 = tmpdir()
  local s4 = corpus.prepare_wikipedia { input = data, output = dir3, docs_per_file = 1000, keep_lists = true,
    quiet = true }
  T.eq(s4.docs, 106)
  T.truthy(s4.chars > s.chars * 1.05, ("keep_lists: %d chars, %d without"):format(s4.chars, s.chars))
  rm_rf(dir); rm_rf(dir2); rm_rf(dir3)
end)

T.test("prepare_wikipedia: truncated bz2 is an error naming file and offset, no partial output", function()
  local data = T.shared_data(WIKI)
  if not data then T.skip("shared data " .. WIKI .. " absent") end
  local dir = tmpdir()
  local bz = slurp(data)
  local cut = dir .. "/cut.xml.bz2"
  write(cut, bz:sub(1, 900000))
  local err = T.raises(function()
    corpus.prepare_wikipedia { input = cut, output = dir .. "/out", docs_per_file = 1000, quiet = true }
  end, "truncated")
  T.truthy(err:find("cut.xml.bz2", 1, true) and err:find("offset", 1, true), err)
  T.eq(#fs.list_dir(dir .. "/out"), 0)
  T.raises(function() corpus.prepare_wikipedia { input = dir .. "/missing.bz2", output = dir .. "/o2" } end,
    "missing.bz2")
  rm_rf(dir)
end)

T.test("book_to_document strips Gutenberg boilerplate and joins paragraphs", function()
  local book = "The Project Gutenberg eBook of X\r\nTitle: A Tale\r\n\r\n*** START OF THE PROJECT GUTENBERG EBOOK " ..
    "A TALE ***\r\n\r\n" ..
    "CHAPTER I.\r\n\r\nIt was a dark\r\nand stormy night.\r\n\r\n\r\n[Illustration]\r\n\r\nThe end.\r\n" ..
    "*** END OF THE PROJECT GUTENBERG EBOOK A TALE ***\r\nLicense text here.\r\n"
  local title, body, n = corpus.book_to_document(book, "fallback")
  T.eq(title, "A Tale")
  T.eq(body, "CHAPTER I.\nIt was a dark and stormy night.\nThe end.")
  T.eq(n, 3)
  local t2, b2 = corpus.book_to_document("Just one\nparagraph.\n", "name")
  T.eq(t2, "name"); T.eq(b2, "Just one paragraph.")
end)

T.test("prepare_bookcorpus on the shared books", function()
  local books = T.shared_data("books")
  if not books then T.skip("shared data books/ absent") end
  local dir = tmpdir()
  local s = corpus.prepare_bookcorpus { input = books, output = dir }
  T.eq(s.books, 3); T.eq(s.files_written, 1)
  local n, alice = 0, nil
  for title, body in corpus.documents(dir .. "/books_00000.txt") do
    n = n + 1
    if title == "pg11-0" then alice = body end
  end
  T.eq(n, 3)
  T.truthy(alice and alice:find("Alice was beginning to get very tired of sitting by her sister on the bank, and " ..
    "of having nothing to do:", 1, true), "Alice paragraph joined")
  local s2 = corpus.prepare_bookcorpus { input = books, output = dir }
  T.eq(s2.files_existing, 1); T.eq(s2.files_written, 0)
  T.raises(function() corpus.prepare_bookcorpus { input = dir .. "/nope", output = dir } end, "must be a directory")
  rm_rf(dir)
end)

-- synthetic corpus: unique documents with random sentence counts and lengths
local function make_corpus(dir, ndocs, nfiles)
  fs.mkdir_p(dir)
  local rng = 12345
  local function rand(n) rng = (rng * 1103515245 + 12345) % 2147483648; return rng % n end
  local words = { "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma" }
  local docs = {}
  local per = math.ceil(ndocs / nfiles)
  for fi = 1, nfiles do
    local w = corpus.doc_writer(("%s/part_%02d.txt"):format(dir, fi))
    for d = (fi - 1) * per + 1, math.min(fi * per, ndocs) do
      local paras = {}
      local sents = {}
      for p = 1, 1 + rand(3) do
        local line = {}
        for s = 1, 1 + rand(4) do
          local ws = { "Doc" .. d, "para" .. p, "sent" .. s }
          for _ = 1, 2 + rand(12) do ws[#ws + 1] = words[1 + rand(#words)] end
          local sent = table.concat(ws, " ") .. "."
          line[#line + 1] = sent
          sents[#sents + 1] = sent
        end
        paras[#paras + 1] = table.concat(line, " ")
      end
      w:write("Title " .. d, table.concat(paras, "\n"))
      docs[#docs + 1] = table.concat(sents, "\n")
    end
    w:close()
  end
  return docs
end

local function read_shards(dir, prefix)
  local out = {}
  for _, n in ipairs(fs.list_dir(dir, "^" .. prefix .. "_%d+%.txt$")) do
    local s = slurp(dir .. "/" .. n)
    local docs = {}
    for block in s:gmatch("(.-)\n\n") do docs[#docs + 1] = block end
    out[#out + 1] = { name = n, text = s, docs = docs, bytes = #s }
  end
  return out
end

T.test("shard: exactly once, deterministic, balanced, spill-independent", function()
  local root = tmpdir()
  local docs = make_corpus(root .. "/in1", 300, 3)
  local docs2 = make_corpus(root .. "/in2", 40, 1)  -- same generator: duplicates of in1's first 40 docs
  local opts = { input = root .. "/in1," .. root .. "/in2", output = root .. "/a", num_shards = 5,
                 test_fraction = 0.2, seed = 7, memory_mb = 512 }
  local s = corpus.shard(opts)
  T.eq(s.input_docs, 340); T.eq(s.buckets, 1)
  T.eq(s.train.shards, 5); T.eq(s.test.shards, 1)
  local train, test = read_shards(root .. "/a", "train"), read_shards(root .. "/a", "test")
  T.eq(#train, 5); T.eq(#test, 1)
  -- every input document exactly once across train + test (in2 duplicates in1[1..40])
  local want = {}
  for _, d in ipairs(docs) do want[d] = (want[d] or 0) + 1 end
  for _, d in ipairs(docs2) do want[d] = (want[d] or 0) + 1 end
  local seen, ntest = {}, 0
  for _, set in ipairs { train, test } do
    for _, sh in ipairs(set) do
      for _, d in ipairs(sh.docs) do seen[d] = (seen[d] or 0) + 1 end
      if set == test then ntest = ntest + #sh.docs end
    end
  end
  for d, c in pairs(want) do T.eq(seen[d], c, "document count for " .. d:sub(1, 30)) end
  for d, c in pairs(seen) do T.eq(want[d], c, "unexpected document " .. d:sub(1, 30)) end
  T.truthy(ntest > 340 * 0.1 and ntest < 340 * 0.3, "test fraction: " .. ntest .. "/340")
  -- shuffled: the first train shard does not follow input order
  T.truthy(not train[1].docs[1]:find("^Doc1 para1"), "documents are shuffled")
  -- balanced: shard sizes within one largest document of each other
  local maxdoc = 0
  for _, d in ipairs(docs) do maxdoc = math.max(maxdoc, #d + 2) end
  local mn, mx = math.huge, 0
  for _, sh in ipairs(train) do mn = math.min(mn, sh.bytes); mx = math.max(mx, sh.bytes) end
  T.truthy(mx - mn <= maxdoc, ("balance: min %d max %d maxdoc %d"):format(mn, mx, maxdoc))
  T.eq(s.train.min_bytes, mn); T.eq(s.train.max_bytes, mx)
  -- same seed, tiny memory budget (forces many buckets) -> identical shards
  opts.output = root .. "/b"; opts.memory_mb = 0.02
  local s2 = corpus.shard(opts)
  T.truthy(s2.buckets > 1, "spill expected, got " .. s2.buckets .. " bucket(s)")
  local train2, test2 = read_shards(root .. "/b", "train"), read_shards(root .. "/b", "test")
  for i = 1, 5 do T.eq(train2[i].text == train[i].text, true, "train shard " .. i .. " differs with spill") end
  T.eq(test2[1].text == test[1].text, true, "test shard differs with spill")
  T.truthy(slurp(root .. "/b/shards.json"):find('"input_docs":340', 1, true), "manifest")
  -- a different seed gives a different order
  opts.output = root .. "/c"; opts.seed = 8
  corpus.shard(opts)
  T.eq(read_shards(root .. "/c", "train")[1].text == train[1].text, false, "seed has no effect")
  -- no leftovers from the bucket pass
  T.eq(fs.is_dir(root .. "/a/.shard_tmp"), false)
  rm_rf(root)
end)

T.test("shard: bad options", function()
  local root = tmpdir()
  make_corpus(root .. "/in", 5, 1)
  T.raises(function() corpus.shard { input = root .. "/in", output = root .. "/o", num_shards = 0 } end, "--num-shards")
  T.raises(function() corpus.shard { input = root .. "/nope", output = root .. "/o", num_shards = 2 } end,
    "not a directory")
  T.raises(function() corpus.shard { input = root .. "/in", output = root .. "/o", num_shards = 2,
    test_fraction = 1.5 } end, "--test-fraction")
  fs.mkdir_p(root .. "/empty")
  T.raises(function() corpus.shard { input = root .. "/empty", output = root .. "/o", num_shards = 2 } end,
    "no .txt files")
  rm_rf(root)
end)

T.run()
