-- build_vocab.lua: learn a WordPiece vocab.txt from a text corpus.
--   bertlua recipes/build_vocab.lua --input=FILE_OR_DIR[,...] --output=vocab.txt --size=30522 [--cased]
-- Algorithm (that of Hugging Face's WordPieceTrainer, which is BPE with a
-- "##" continuation prefix): the corpus is split into basic tokens exactly as
-- BERT's BasicTokenizer does (bertlua.data.tokenizer, so lowercasing/accents match
-- the model that will use the vocab); every word starts as its characters
-- (first "c", then "##c"); the most frequent adjacent symbol pair (weighted by
-- word count) is merged, repeatedly, until the vocab has --size entries or no
-- pair occurs --min-frequency times. Ties go to the lexicographically smallest
-- pair, so the output is deterministic. Output order: [PAD], --unused
-- [unusedN] entries, [UNK] [CLS] [SEP] [MASK], the alphabet (by frequency),
-- then merges in the order they were made. Memory: one entry per distinct word.
local options = require "bertlua.util.options"
local Tok = require "bertlua.data.tokenizer"
local fs = require "bertlua.util.fs"
local shell = require "bertlua.util.shell"

local spec = {
  { "input", "", "text file(s) or directories of *.txt, comma-separated" },
  { "output", "vocab.txt", "where to write the vocab" },
  { "size", 30522, "vocab size (including special and unused tokens)", int = true, min = 6 },
  { "cased", false, "keep case and accents" },
  { "min_frequency", 2, "a pair must occur this often to be merged", int = true, min = 1 },
  { "unused", 0, "number of [unusedN] placeholders after [PAD] (BERT has 994)", int = true, min = 0 },
  { "limit_alphabet", 1000, "keep at most this many initial characters (most frequent)", int = true, min = 1 },
}
local opt = options.parse(arg, spec,
  { usage = "bertlua recipes/build_vocab.lua --input=PATH --output=vocab.txt --size=N" })
print("build_vocab options:\n" .. options.show(opt))
if opt.input == "" then error("build_vocab: --input is required", 0) end

local function files_of(path)
  if not fs.is_dir(path) then return { path } end
  local out = {}
  -- find has no "--": a path starting with "-" gets "./"
  local found = shell.read { "find", (path:gsub("^%-", "./-")), "-type", "f", "-name", "*.txt", "-print0" }
  for l in found:gmatch("([^%z]+)%z") do out[#out + 1] = l end
  table.sort(out)  -- byte order, as LC_ALL=C sort
  return out
end

-- a vocab with only the special tokens gives the basic tokenizer
local tmpv = os.tmpname()
fs.write_atomic(tmpv, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
local basic = Tok.load(tmpv, { lower = not opt.cased })
os.remove(tmpv)
local special = { ["[PAD]"] = true, ["[UNK]"] = true, ["[CLS]"] = true, ["[SEP]"] = true, ["[MASK]"] = true }

local counts, nbytes = {}, 0
for p in opt.input:gmatch("[^,]+") do
  for _, file in ipairs(files_of(p)) do
    fs.check_output("build_vocab", { "--output", opt.output }, { { "--input", file } })
    local ok, ierr = pcall(fs.check_input, file, "input")   -- a FIFO would block the open
    if not ok then error("build_vocab: " .. ierr, 0) end
    local f, err = io.open(file, "rb")
    if not f then error("build_vocab: cannot open " .. file .. ": " .. tostring(err), 0) end
    while true do
      local block = f:read(4194304)
      if not block then break end
      local more = f:read("*l")  -- finish the line
      if more then block = block .. more .. "\n" end
      nbytes = nbytes + #block
      for w in basic:format(block, "basic"):gmatch("[^ \n]+") do
        if not special[w] then counts[w] = (counts[w] or 0) + 1 end
      end
    end
    f:close()
  end
end

-- words as symbol arrays
local words, wfreq, charfreq = {}, {}, {}
for w, c in pairs(counts) do
  local syms = {}
  for ch in w:gmatch("[%z\1-\127\194-\244][\128-\191]*") do
    syms[#syms + 1] = (#syms == 0) and ch or ("##" .. ch)
  end
  words[#words + 1] = syms
  wfreq[#words] = c
  for _, s in ipairs(syms) do charfreq[s] = (charfreq[s] or 0) + c end
end
print(("corpus: %.1f MB, %d distinct words"):format(nbytes / 1e6, #words))

local vocab, have = {}, {}
local function add(t) if not have[t] then have[t] = true; vocab[#vocab + 1] = t end end
add("[PAD]")
for i = 0, opt.unused - 1 do add("[unused" .. i .. "]") end
for _, t in ipairs { "[UNK]", "[CLS]", "[SEP]", "[MASK]" } do add(t) end
local alphabet = {}
for s in pairs(charfreq) do alphabet[#alphabet + 1] = s end
table.sort(alphabet, function(a, b)
  if charfreq[a] ~= charfreq[b] then return charfreq[a] > charfreq[b] end
  return a < b
end)
local kept = {}
for i = 1, math.min(#alphabet, opt.limit_alphabet) do kept[alphabet[i]] = true; add(alphabet[i]) end
-- symbols outside the kept alphabet block merges through them
for _, syms in ipairs(words) do
  for i, s in ipairs(syms) do if not kept[s] then syms[i] = false end end
end

-- pair statistics with a lazy max-heap (count desc, then key asc)
local SEP = "\0"
local pc, where = {}, {}   -- pair -> count, pair -> set of word indices
local heap = {}
local function better(a, b) return a[1] > b[1] or (a[1] == b[1] and a[2] < b[2]) end
local function push(item)
  heap[#heap + 1] = item
  local i = #heap
  while i > 1 do
    local p = math.floor(i / 2)
    if better(heap[i], heap[p]) then heap[i], heap[p] = heap[p], heap[i]; i = p else break end
  end
end
local function pop()
  local top = heap[1]
  heap[1] = heap[#heap]; heap[#heap] = nil
  local i, n = 1, #heap
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and better(heap[l], heap[m]) then m = l end
    if r <= n and better(heap[r], heap[m]) then m = r end
    if m == i then break end
    heap[i], heap[m] = heap[m], heap[i]; i = m
  end
  return top
end
local function addpair(a, b, c, wi)
  if not a or not b then return end
  local k = a .. SEP .. b
  pc[k] = (pc[k] or 0) + c
  if c > 0 then
    local s = where[k]; if not s then s = {}; where[k] = s end
    s[wi] = true
  end
end
for wi, syms in ipairs(words) do
  for i = 1, #syms - 1 do addpair(syms[i], syms[i + 1], wfreq[wi], wi) end
end
for k, c in pairs(pc) do push({ c, k }) end

local merges = 0
while #vocab < opt.size and #heap > 0 do
  local top = pop()
  local k, c = top[2], top[1]
  if pc[k] == c and c > 0 then
    if c < opt.min_frequency then break end
    local a, b = k:match("^(.-)%z(.*)$")
    local new = a .. (b:sub(1, 2) == "##" and b:sub(3) or b)
    add(new)
    merges = merges + 1
    local touched = {}
    for wi in pairs(where[k]) do
      local syms, f = words[wi], wfreq[wi]
      local i, out = 1, {}
      -- remove this word's pairs, merge, add them back
      for j = 1, #syms - 1 do addpair(syms[j], syms[j + 1], -f, wi) end
      while i <= #syms do
        if i < #syms and syms[i] == a and syms[i + 1] == b then out[#out + 1] = new; i = i + 2
        else out[#out + 1] = syms[i]; i = i + 1 end
      end
      words[wi] = out
      for j = 1, #out - 1 do
        addpair(out[j], out[j + 1], f, wi)
        if out[j] and out[j + 1] then touched[out[j] .. SEP .. out[j + 1]] = true end
      end
    end
    where[k] = nil
    pc[k] = 0
    local tk = {}
    for t in pairs(touched) do tk[#tk + 1] = t end
    table.sort(tk)
    for _, t in ipairs(tk) do if pc[t] > 0 then push({ pc[t], t }) end end
  elseif pc[k] and pc[k] > 0 and pc[k] ~= c then
    push({ pc[k], k })  -- stale entry: requeue with the current count
  end
end

fs.write_atomic(opt.output, table.concat(vocab, "\n"), "\n")
print(("wrote %s: %d tokens (%d alphabet, %d merges)"):format(opt.output, #vocab, math.min(#alphabet,
  opt.limit_alphabet), merges))
