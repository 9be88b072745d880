-- bertlua.data.pretraining: BERT pre-training instances (their shard files are
-- bertlua.data.shards, the batch loader bertlua.data.loader).
--
-- Instances are made as google-research/bert's create_pretraining_data.py makes
-- them (segment pairs up to a target length, 50% random next sentence from
-- another document with unused segments put back, truncation from a random
-- end of the longer side, 15% masking capped at max_predictions, never
-- [CLS]/[SEP], 80% [MASK] / 10% random token / 10% unchanged, optional whole
-- word masking, dupe_factor passes). The random stream is our own xorshift64*
-- seeded by --seed and the input file, not Python's: the same distributions,
-- reproducible bit for bit here.
local rng = require "bertlua.util.rng"
local slice = require("bertlua.util.list").slice

local M = {}

-- instances -------------------------------------------------------------------------
local function randint(r, a, b) return a + r(b - a + 1) - 1 end
local function shuffle(r, t) for i = #t, 2, -1 do local j = r(i); t[i], t[j] = t[j], t[i] end end

-- the reference's truncation (the longer side loses its first or last token at random, same draws) on index
-- ranges, then one copy: table.remove(t, 1) per token was quadratic in a long sentence
local function truncate_pair(a, b, max_tokens, r)
  local a1, a2, b1, b2 = 1, #a, 1, #b
  while (a2 - a1 + 1) + (b2 - b1 + 1) > max_tokens do
    local front = r() < 0.5
    if a2 - a1 > b2 - b1 then
      if front then a1 = a1 + 1 else a2 = a2 - 1 end
    elseif front then b1 = b1 + 1 else b2 = b2 - 1 end
  end
  return slice(a, a1, a2), slice(b, b1, b2)
end

-- masked LM on a token list (0-based ids); returns output ids, positions (0-based), labels
function M.mask(tokens, o, r)
  local cand = {}
  for i, id in ipairs(tokens) do
    if id ~= o.cls_id and id ~= o.sep_id then
      if o.whole_word and #cand > 0 and o.is_continuation[id] then
        local last = cand[#cand]; last[#last + 1] = i
      else
        cand[#cand + 1] = { i }
      end
    end
  end
  shuffle(r, cand)
  local out = slice(tokens)
  local want = math.min(o.max_predictions, math.max(1, math.floor(#tokens * o.masked_lm_prob + 0.5)))
  local lms, covered = {}, {}
  for _, set in ipairs(cand) do
    if #lms >= want then break end
    if #lms + #set <= want then
      local hit = false
      for _, i in ipairs(set) do if covered[i] then hit = true end end
      if not hit then
        for _, i in ipairs(set) do
          covered[i] = true
          local m
          if r() < 0.8 then m = o.mask_id
          elseif r() < 0.5 then m = tokens[i]
          else m = randint(r, 0, o.vocab_size - 1) end
          out[i] = m
          lms[#lms + 1] = { i - 1, tokens[i] }
        end
      end
    end
  end
  table.sort(lms, function(x, y) return x[1] < y[1] end)
  local pos, lab = {}, {}
  for k, e in ipairs(lms) do pos[k], lab[k] = e[1], e[2] end
  return out, pos, lab
end

-- One document's instances (create_instances_from_document).
local function from_document(docs, di, o, r, emit)
  local doc = docs[di]
  local max_tokens = o.max_seq_length - 3
  local target = max_tokens
  if r() < o.short_seq_prob then target = randint(r, 2, max_tokens) end
  local chunk, len, i = {}, 0, 1
  while i <= #doc do
    local seg = doc[i]
    chunk[#chunk + 1] = seg
    len = len + #seg
    if i == #doc or len >= target then
      if #chunk > 0 then
        local a_end = 1
        if #chunk >= 2 then a_end = randint(r, 1, #chunk - 1) end
        local a = {}
        for j = 1, a_end do for _, t in ipairs(chunk[j]) do a[#a + 1] = t end end
        local b, random_next = {}, false
        if #chunk == 1 or r() < 0.5 then
          random_next = true
          local target_b = target - #a
          local rd = di
          for _ = 1, 10 do
            rd = randint(r, 1, #docs)
            if rd ~= di then break end
          end
          local rdoc = docs[rd]
          for j = randint(r, 1, #rdoc), #rdoc do
            for _, t in ipairs(rdoc[j]) do b[#b + 1] = t end
            if #b >= target_b then break end
          end
          i = i - (#chunk - a_end)   -- put the unused segments back
        else
          for j = a_end + 1, #chunk do for _, t in ipairs(chunk[j]) do b[#b + 1] = t end end
        end
        a, b = truncate_pair(a, b, max_tokens, r)
        if #a >= 1 and #b >= 1 then
          local tokens = { o.cls_id }
          for _, t in ipairs(a) do tokens[#tokens + 1] = t end
          tokens[#tokens + 1] = o.sep_id
          local len_a = #tokens
          for _, t in ipairs(b) do tokens[#tokens + 1] = t end
          tokens[#tokens + 1] = o.sep_id
          local pos, lab = {}, {}
          if not o.dynamic_masking then tokens, pos, lab = M.mask(tokens, o, r) end
          emit(tokens, len_a, pos, lab, random_next and 1 or 0)
        end
      end
      chunk, len = {}, 0
    end
    i = i + 1
  end
end

-- read documents from the sharded text format: one sentence per line, blank line between documents
function M.read_documents(path, tok, stats)
  local docs, doc = {}, {}
  for line in require("bertlua.util.fs").lines(path) do
    if line:match("^%s*$") then
      if #doc > 0 then docs[#docs + 1] = doc; doc = {} end
    else
      local ids = tok:encode(line)
      if #ids > 0 then doc[#doc + 1] = ids end
      if stats then stats.sentences = stats.sentences + 1 end
    end
  end
  if #doc > 0 then docs[#docs + 1] = doc end
  return docs
end

-- create(docs, opts) -> list of records; opts: tokenizer ids and the parameters
function M.create(docs, o)
  local r = rng(o.seed)
  local out = {}
  local order = {}
  for i = 1, #docs do order[i] = docs[i] end
  shuffle(r, order)
  for _ = 1, o.dupe_factor do
    for di = 1, #order do
      from_document(order, di, o, r, function(tokens, len_a, pos, lab, nsp)
        out[#out + 1] = { tokens = tokens, len_a = len_a, pos = pos, lab = lab, nsp = nsp }
      end)
    end
  end
  shuffle(r, out)
  return out
end

return M
