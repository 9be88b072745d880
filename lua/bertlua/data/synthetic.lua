-- bertlua.data.synthetic: a small generated encyclopedia and a SQuAD-format QA set
-- about it, for the quickstart and end-to-end tests on machines without
-- downloads. The world is made of invented places and people with facts that
-- recur across documents, so masked-LM pre-training has something to learn
-- and extractive QA has answers that are spans of the context.
--
--   local syn = require "bertlua.data.synthetic"
--   local world = syn.world{ seed = 1, countries = 60 }
--   syn.write_corpus(world, "out/corpus")       -- documents, blank line between, title first
--   syn.write_squad(world, "out/qa-train.json", { split = "train" })
local fs = require "bertlua.util.fs"
local M = {}

-- small deterministic PRNG (xorshift64*), independent of math.random
local function rng(seed)
  local ffi = require "ffi"
  local s = ffi.new("uint64_t[1]", 0x9E3779B97F4A7C15ULL + seed * 0x100000001B3ULL)
  return function(n)
    local x = s[0]
    x = bit.bxor(x, bit.rshift(x, 12)); x = bit.bxor(x, bit.lshift(x, 25)); x = bit.bxor(x, bit.rshift(x, 27))
    s[0] = x
    local r = tonumber(bit.rshift(x * 0x2545F4914F6CDD1DULL, 11)) / 2 ^ 53
    if n then return math.floor(r * n) + 1 end
    return r
  end
end
M.rng = rng

local ONSETS = { "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "st", "gr", "th", "sh", "kr", "pl" }
local VOWELS = { "a", "e", "i", "o", "u", "ae", "ia", "ou", "ei" }
local CODAS = { "", "", "n", "r", "s", "l", "nd", "th", "m", "x" }

local function name(r, syll)
  local parts = {}
  for _ = 1, syll do
    parts[#parts + 1] = ONSETS[r(#ONSETS)] .. VOWELS[r(#VOWELS)]
  end
  local s = table.concat(parts) .. CODAS[r(#CODAS)]
  return s:sub(1, 1):upper() .. s:sub(2)
end

local function unique(r, used, syll)
  for _ = 1, 1000 do
    local n = name(r, syll)
    if not used[n] then used[n] = true return n end
  end
  error("synthetic: could not find a fresh name")
end

local TRADES = { "wool", "salt", "copper", "timber", "glass", "silk", "grain", "amber", "tin", "spices" }
local CLIMATES = { "cold", "mild", "dry", "humid", "windy", "rainy" }
local ANIMALS = { "heron", "lynx", "otter", "falcon", "stag", "wolf", "crane", "badger" }

function M.world(o)
  o = o or {}
  local r = rng(o.seed or 1)
  local used = {}
  local w = { countries = {} }
  for i = 1, o.countries or 40 do
    local c = {
      id = i,
      name = unique(r, used, 2),
      capital = unique(r, used, 2),
      river = unique(r, used, 2),
      founder = unique(r, used, 2) .. " " .. unique(r, used, 3),
      language = unique(r, used, 2) .. "ic",
      trade = TRADES[r(#TRADES)],
      climate = CLIMATES[r(#CLIMATES)],
      animal = ANIMALS[r(#ANIMALS)],
      year = 900 + r(900),
      population = (r(90) + 9) * 1000,
    }
    w.countries[i] = c
  end
  for i, c in ipairs(w.countries) do c.neighbour = w.countries[(i % #w.countries) + 1].name end
  return w
end

-- sentences about a country; each fact appears in several phrasings
local function sentences(c, r)
  local s = {
    ("%s is a %s country whose capital is %s."):format(c.name, c.climate, c.capital),
    ("The capital of %s is %s, a city on the river %s."):format(c.name, c.capital, c.river),
    ("%s was founded in %d by %s."):format(c.name, c.year, c.founder),
    ("People in %s speak %s, and the %s is the national animal."):format(c.name, c.language, c.animal),
    ("The economy of %s has long depended on %s."):format(c.name, c.trade),
    ("%s borders %s to the east."):format(c.name, c.neighbour),
    ("About %d people live in %s."):format(c.population, c.capital),
    ("The river %s flows through %s before it reaches the sea."):format(c.river, c.capital),
    ("%s, the founder of %s, is remembered every spring."):format(c.founder, c.name),
    ("Merchants from %s sell %s in the markets of %s."):format(c.name, c.trade, c.neighbour),
  }
  -- deterministic shuffle of all but the first sentence
  for i = #s, 3, -1 do local j = r(i - 1) + 1; s[i], s[j] = s[j], s[i] end
  return s
end

-- documents: { title, sentences } — `copies` variants per country with other orders
function M.documents(w, o)
  o = o or {}
  local r = rng((o.seed or 1) + 7)
  local docs = {}
  for copy = 1, o.copies or 3 do
    for _, c in ipairs(w.countries) do
      docs[#docs + 1] = { title = c.name .. (copy > 1 and (" (" .. copy .. ")") or ""), sentences = sentences(c, r) }
    end
  end
  return docs
end

-- Corpus in the sharded text format: one sentence per line, blank line between documents.
function M.write_corpus(w, dir, o)
  fs.mkdir_p(dir)
  local out = {}
  for _, d in ipairs(M.documents(w, o)) do
    for _, s in ipairs(d.sentences) do out[#out + 1] = s end
    out[#out + 1] = ""
  end
  local path = dir .. "/synthetic_corpus.txt"
  fs.write_atomic(path, table.concat(out, "\n"))
  return path
end

local QUESTIONS = {
  { "What is the capital of %s?", "capital" },
  { "Which river flows through %s?", "river", "capital" },
  { "Who founded %s?", "founder" },
  { "In which year was %s founded?", "year" },
  { "What language do people in %s speak?", "language" },
  { "What has the economy of %s depended on?", "trade" },
  { "Which country does %s border to the east?", "neighbour" },
  { "What is the national animal of %s?", "animal" },
}

-- SQuAD v1.1 JSON: one paragraph per country, questions whose answers are spans.
-- split "train" uses the first 80% of countries, "dev" the rest.
function M.squad(w, o)
  o = o or {}
  local r = rng((o.seed or 1) + 13)
  local n = #w.countries
  local cut = math.floor(n * 0.8)
  local lo, hi = 1, cut
  if o.split == "dev" then lo, hi = cut + 1, n end
  local data = {}
  for i = lo, hi do
    local c = w.countries[i]
    local context = table.concat(sentences(c, r), " ")
    local qas = {}
    for qi, q in ipairs(QUESTIONS) do
      local subject = q[3] and c[q[3]] or c.name
      local answer = tostring(c[q[2]])
      local start = context:find(answer, 1, true)
      if start then
        qas[#qas + 1] = { id = ("syn-%d-%d"):format(i, qi), question = q[1]:format(subject),
          answers = { { text = answer, answer_start = start - 1 } } }
      end
    end
    data[#data + 1] = { title = c.name, paragraphs = { { context = context, qas = qas } } }
  end
  return { version = "1.1", data = data }
end

function M.write_squad(w, path, o)
  fs.write_atomic(path, require("cjson").encode(M.squad(w, o)))
  return path
end

return M
