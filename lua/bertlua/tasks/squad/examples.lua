-- bertlua.tasks.squad.examples: reading SQuAD files into examples, as
-- run_squad.py's read_squad_examples (answer positions in words of the context).
local pystr = require "bertlua.util.pystr"
local json = require "bertlua.util.json"
local evaluate = require "bertlua.tasks.squad.evaluate"

local fs = require "bertlua.util.fs"
local M = {}
local chars, is_array = pystr.chars, json.is_array

local function read_file(path) return fs.read_text(path, "squad") end
M.read_file = read_file

-- load_json(path) -> decoded value (cjson); a clear error names the file.
function M.load_json(path)
  local cjson = require "cjson"
  local text = read_file(path)
  local ok, v = pcall(cjson.decode, text)
  if not ok then
    error(("squad: %s is not valid JSON (%s)"):format(path, tostring(v):gsub("^.-: ", "")), 0)
  end
  return v, text
end

-- run_squad.py's is_whitespace (note U+202F, and not the other Unicode spaces)
local DOC_SPACE = { [" "] = true, ["\t"] = true, ["\r"] = true, ["\n"] = true, ["\226\128\175"] = true }

-- split a context into doc_tokens and char_to_word_offset (code points)
function M.split_context(text)
  local cs = chars(text)
  local doc_tokens, offset = {}, {}
  -- a word's characters are collected and joined once at its end: appending to a string per character
  -- was quadratic (minutes for a 1 MB context without spaces)
  local word, n = {}, 0
  local function flush()
    if #word > 0 then doc_tokens[n] = table.concat(word); word = {} end
  end
  for i = 1, #cs do
    local c = cs[i]
    if DOC_SPACE[c] then
      flush()
    else
      if #word == 0 then n = n + 1 end
      word[#word + 1] = c
    end
    offset[i] = n - 1
  end
  flush()
  return doc_tokens, offset, cs
end

-- read_examples(path_or_dataset, opts) -> examples, report
--   opts.is_training (false): compute answer positions and skip questions
--     whose answer cannot be recovered from the context (as the reference).
--   opts.version_2_with_negative (auto from the file): read is_impossible.
--   opts.strict_answers (false): also skip when the context at answer_start is
--     not exactly the answer text (the reference only checks the word span).
--   opts.quiet: do not print problems to stderr (they are in report.problems).
-- report = { questions, examples, skipped, warnings, problems = {strings}, version }
-- Each example: qas_id, question_text, doc_tokens, char_to_word_offset,
-- orig_answer_text, start_position, end_position (0-based word indices,
-- -1 for impossible), is_impossible, answers ({text, answer_start} as given).
function M.read_examples(src, opts)
  opts = opts or {}
  local name, dataset = "squad", src
  if type(src) == "string" then name = src; dataset = M.load_json(src) end
  if type(dataset) ~= "table" or not is_array(dataset.data) then
    error(name .. ": not a SQuAD file (no 'data' array)", 0)
  end
  local v2 = opts.version_2_with_negative
  if v2 == nil then v2 = evaluate.dataset_version(dataset) == "2.0" end
  local training = opts.is_training or false
  local report = { questions = 0, examples = 0, skipped = 0, warnings = 0, problems = {},
    version = v2 and "2.0" or "1.1" }
  local function problem(loc, msg, skipped)
    local line = ("%s: %s: %s%s"):format(name, loc, msg, skipped and " (skipped)" or "")
    report.problems[#report.problems + 1] = line
    if skipped then report.skipped = report.skipped + 1 else report.warnings = report.warnings + 1 end
    if not opts.quiet then io.stderr:write(line, "\n") end
  end
  local examples, seen = {}, {}   -- seen[id]: where the id was first used
  for ai, article in ipairs(dataset.data) do
    local paragraphs = type(article) == "table" and article.paragraphs
    if not is_array(paragraphs) then
      problem(("article %d"):format(ai), "no 'paragraphs' array", true)
      paragraphs = {}
    end
    for pi, p in ipairs(paragraphs) do
      local qas = type(p) == "table" and p.qas
      local context = type(p) == "table" and p.context
      local ploc = ("article %d paragraph %d"):format(ai, pi)
      if not is_array(qas) then
        problem(ploc, "no 'qas' array", true)
      elseif type(context) ~= "string" then
        report.questions = report.questions + #qas
        problem(ploc, ("'context' is missing or not a string, %d question(s)"):format(#qas), true)
        report.skipped = report.skipped + #qas - 1
      else
        local doc_tokens, c2w, cs = M.split_context(context)
        if #doc_tokens == 0 then
          report.questions = report.questions + #qas
          problem(ploc, ("empty context, %d question(s)"):format(#qas), true)
          report.skipped = report.skipped + #qas - 1
          qas = {}
        end
        for qi, qa in ipairs(qas) do
          report.questions = report.questions + 1
          local ok_q = true
          local id = type(qa) == "table" and qa.id or nil
          local loc = evaluate.where(ai, pi, qi, id)
          local function bad(msg) problem(loc, msg, true); ok_q = false end
          if type(qa) ~= "table" then bad("not an object")
          elseif type(id) ~= "string" then bad("'id' is missing or not a string")
          elseif seen[id] then  -- predictions are keyed by id: the second would silently replace the first
            error(("%s: %s and %s share the id %q; question ids must be unique"):format(name, seen[id], loc, id), 0)
          elseif type(qa.question) ~= "string" then bad("'question' is missing or not a string")
          elseif qa.answers ~= nil and not is_array(qa.answers) then bad("'answers' is not an array")
          end
          if type(id) == "string" then seen[id] = loc end
          local ex
          if ok_q then
            local answers = qa.answers or {}
            local is_impossible = false
            if v2 then
              if qa.is_impossible == nil then is_impossible = #answers == 0
              elseif type(qa.is_impossible) == "boolean" then is_impossible = qa.is_impossible
              else bad("'is_impossible' is not a boolean") end
            end
            ex = { qas_id = id, question_text = qa.question, doc_tokens = doc_tokens,
              char_to_word_offset = c2w, is_impossible = is_impossible, answers = {},
              start_position = nil, end_position = nil, orig_answer_text = nil }
            -- check every answer; in training only the first one is used
            for k, a in ipairs(answers) do
              if not ok_q then break end
              local aloc_bad = function(msg)
                if training and k == 1 and not is_impossible then bad(msg)
                else problem(loc, msg, false) end
              end
              if type(a) ~= "table" or type(a.text) ~= "string" then
                aloc_bad(("answer %d has no 'text' string"):format(k))
              elseif type(a.answer_start) ~= "number" or a.answer_start ~= math.floor(a.answer_start) then
                aloc_bad(("answer %d has no integer 'answer_start'"):format(k))
              else
                local text, start = a.text, a.answer_start
                local alen = #chars(text)
                ex.answers[#ex.answers + 1] = { text = text, answer_start = start }
                local first = training and k == 1 and not is_impossible
                if alen == 0 then
                  aloc_bad(("answer %d is empty"):format(k))
                elseif start < 0 or start + alen > #cs then
                  aloc_bad(("answer %d at %d+%d is outside the context (%d characters)"):format(k, start, alen, #cs))
                else
                  local at = table.concat(cs, "", start + 1, start + alen)
                  local sp, ep = c2w[start + 1], c2w[start + alen]
                  if k == 1 and not is_impossible then
                    ex.orig_answer_text, ex.start_position, ex.end_position = text, sp, ep
                  end
                  -- the reference's test: the answer's words must appear in the word span
                  local found = true
                  if first then
                    local actual = table.concat(doc_tokens, " ", sp + 1, ep + 1)
                    local cleaned = table.concat(pystr.split(text), " ")
                    found = actual:find(cleaned, 1, true) ~= nil
                  end
                  if not found then
                    bad(("could not find answer %q in the words at %d (%q)"):format(text, start, at))
                  elseif at ~= text then
                    local msg = ("answer %d text %q does not match the context at %d (%q)"):format(k, text, start, at)
                    if first and opts.strict_answers then bad(msg)
                    else problem(loc, msg .. (first and "; its words are in the span, kept" or ""), false) end
                  end
                end
              end
            end
            if ok_q and training and not is_impossible and #answers ~= 1 then
              bad(("has %d answers; for training, each question should have exactly 1"):format(#answers))
            end
            if ok_q and is_impossible then
              ex.start_position, ex.end_position, ex.orig_answer_text = -1, -1, ""
            end
          end
          if ok_q then examples[#examples + 1] = ex end
        end
      end
    end
  end
  report.examples = #examples
  return examples, report
end

------------------------------------------------------------------ features


return M
