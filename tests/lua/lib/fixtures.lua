-- fixtures: data the tests make at run time, so the whole suite runs from the
-- repository alone (the files in ../shared/data are extras, not needs).
--
--   local fx = require "fixtures"
--   local vocab = fx.vocab(dir[, { size = 2000 }])   -- build_vocab.lua on the generated corpus
--   local dev = fx.glue(dir, "mrpc")                -- a GLUE dev.tsv in the task's own format
--   local cfg = fx.tiny_config()                    -- a 2-layer BERT config with odd vocab, 4 heads of 16
--   local bt = fx.pretrain_batch(vocab_size, B, S, P) -- a BertForPreTraining batch with padded rows
--
-- The texts come from bertlua.data.synthetic's invented world; labels follow
-- rules a small model can learn from the words (so "loss falls" holds).
local T = require "testing"
local syn = require "bertlua.data.synthetic"
local rng = require "bertlua.util.rng"

local M = {}

-- a fresh table each call (callers may change it)
function M.tiny_config()
  return { vocab_size = 211, hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 4,
    intermediate_size = 256, max_position_embeddings = 64, type_vocab_size = 2 }
end

-- A BertForPreTraining batch of B rows of S tokens (row b has S - b % 3 real ones, its second half type 1) and P
-- masked positions per row, the last one ignored (label -1); ids and labels below vocab_size.
function M.pretrain_batch(vocab_size, B, S, P)
  local bl = require "bertlua"
  local ids, tt, am, pos, lab, nsp = {}, {}, {}, {}, {}, {}
  for b = 1, B do
    ids[b], tt[b], am[b], pos[b], lab[b] = {}, {}, {}, {}, {}
    local len = S - (b % 3)
    for s = 1, S do
      ids[b][s] = s <= len and (7 * b + 13 * s) % vocab_size or 0
      tt[b][s] = s > len / 2 and s <= len and 1 or 0
      am[b][s] = s <= len and 1 or 0
    end
    for j = 1, P do
      pos[b][j] = (3 * j + b) % (len - 1) + 1
      lab[b][j] = j == P and -1 or (5 * j + b) % vocab_size
    end
    nsp[b] = b % 2
  end
  return {
    input_ids = bl.from(ids, { dtype = "i32" }), token_type_ids = bl.from(tt, { dtype = "i32" }),
    attention_mask = bl.from(am), masked_lm_positions = bl.from(pos, { dtype = "i32" }),
    masked_lm_labels = bl.from(lab, { dtype = "i32" }), next_sentence_labels = bl.from(nsp, { dtype = "i32" }),
  }
end

local function world() return syn.world { seed = 11, countries = 40 } end

function M.vocab(dir, o)
  o = o or {}
  local corpus = syn.write_corpus(world(), dir .. "/fixture_corpus")
  local path = dir .. "/fixture_vocab.txt"
  local out, rc = T.sh(("%s recipes/build_vocab.lua --input=%s --output=%s --size=%d"):format(T.exe(), corpus, path,
    o.size or 2000))
  if rc ~= 0 then error("fixture vocabulary: build_vocab.lua failed:\n" .. out, 2) end
  return path
end

-- every sentence of the world with its country, in a fixed shuffled order
local function sentences()
  local r, out = rng(5), {}
  for _, d in ipairs(syn.documents(world(), { copies = 2 })) do
    for _, s in ipairs(d.sentences) do out[#out + 1] = { text = s, doc = d.title:gsub(" %(%d+%)$", "") } end
  end
  for i = #out, 2, -1 do local j = r(i); out[i], out[j] = out[j], out[i] end
  return out
end

local GOOD = { wool = true, salt = true, copper = true, timber = true, glass = true, mild = true, heron = true,
  otter = true }
local function positive(s)
  for w in s:lower():gmatch("%a+") do if GOOD[w] then return 1 end end
  return 0
end

local function reversed(s)
  local w = {}
  for x in s:gsub("%.$", ""):gmatch("%S+") do table.insert(w, 1, x) end
  return table.concat(w, " ") .. "."
end

-- glue(dir, task) -> path of DIR/TASK.tsv with n rows (default: as many as the real dev file has at least)
--   sst2: "sentence\tlabel" (1 when the sentence names a GOOD word)
--   mrpc: "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String" (1 when the pair names a GOOD word)
--   cola: no header, "source\tlabel\t*\tsentence" (0: the words reversed)
function M.glue(dir, task, n)
  local s = sentences()
  local rows = {}
  if task == "sst2" then
    rows[1] = "sentence\tlabel"
    for i = 1, n or 872 do local x = s[(i - 1) % #s + 1].text; rows[#rows + 1] = x .. "\t" .. positive(x) end
  elseif task == "mrpc" then
    rows[1] = "\239\187\191Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    for i = 1, n or 408 do
      local a, b = s[(i - 1) % #s + 1].text, s[(i * 7) % #s + 1].text
      rows[#rows + 1] = ("%d\t%d\t%d\t%s\t%s"):format(positive(a .. " " .. b), 1000 + i, 2000 + i, a, b)
    end
  elseif task == "cola" then
    for i = 1, n or 1043 do
      local x = s[(i - 1) % #s + 1].text
      local ok = i % 3 ~= 0
      rows[#rows + 1] = ("gj04\t%d\t%s\t%s"):format(ok and 1 or 0, ok and "" or "*", ok and x or reversed(x))
    end
  else
    error("fixtures.glue: no generator for " .. tostring(task), 2)
  end
  local path = ("%s/%s.tsv"):format(dir, task)
  T.write_file(path, table.concat(rows, "\n") .. "\n")
  return path
end

return M
