-- bertlua.tasks.glue: GLUE task files (the TSVs download_glue_data.py writes) ->
-- examples {guid, text_a, text_b, label}, as the reference processors of
-- google-research/bert run_classifier.py / Hugging Face glue.py read them:
-- tab-separated with no quoting (csv quotechar=None: a leading '"' is text),
-- UTF-8 with or without BOM, header line or not (CoLA train/dev have none),
-- LF or CRLF, last line with or without a newline.
--
--   local glue = require "bertlua.tasks.glue"
--   local ex, rep = glue.read_examples("mrpc", "glue/MRPC/dev.tsv", { set_type = "dev" })
--   local ex = glue.read_split("mnli-mm", "glue/MNLI", "dev")   -- dev_mismatched.tsv
--   glue.labels("mnli")          -- {"contradiction", "entailment", "neutral"}
--   glue.label_id("mnli", "neutral") -- 0-based class id (2); STS-B: nil (regression)
--
-- Malformed rows (wrong number of columns, unknown label, STS-B score not a
-- number) are reported as "FILE:LINE: what" (stderr unless opts.quiet; also in
-- report.problems) and skipped; report = {rows, examples, skipped, problems}.
local fs = require "bertlua.util.fs"
local M = {}

-- cols: 1-based column of each field; header: first line is a header;
-- ncols: columns of a data row (train/dev); guid: column for the id (else the line index).
local TASKS = {
  cola = { labels = { "0", "1" }, header = false, ncols = 4, text_a = 4, label = 2,
    test = { header = true, ncols = 2, text_a = 2, guid = 1 } },
  ["sst-2"] = { labels = { "0", "1" }, header = true, ncols = 2, text_a = 1, label = 2,
    test = { header = true, ncols = 2, text_a = 2, guid = 1 } },
  mrpc = { labels = { "0", "1" }, header = true, ncols = 5, text_a = 4, text_b = 5, label = 1,
    test = { header = true, ncols = 5, text_a = 4, text_b = 5 } },
  ["sts-b"] = { labels = nil, header = true, ncols = 10, text_a = 8, text_b = 9, label = 10, guid = 1,
    test = { header = true, ncols = 9, text_a = 8, text_b = 9, guid = 1 } },
  qqp = { labels = { "0", "1" }, header = true, ncols = 6, text_a = 4, text_b = 5, label = 6, guid = 1,
    test = { header = true, ncols = 3, text_a = 2, text_b = 3, guid = 1 } },
  -- train.tsv has 12 columns, dev_*.tsv 16 (label1..label5 + gold_label): the label is the last
  mnli = { labels = { "contradiction", "entailment", "neutral" }, header = true, ncols = "header",
    text_a = 9, text_b = 10, label = -1, guid = 1,
    test = { header = true, ncols = "header", text_a = 9, text_b = 10, guid = 1 } },
  qnli = { labels = { "entailment", "not_entailment" }, header = true, ncols = 4, text_a = 2, text_b = 3,
    label = -1, guid = 1, test = { header = true, ncols = 3, text_a = 2, text_b = 3, guid = 1 } },
  rte = { labels = { "entailment", "not_entailment" }, header = true, ncols = 4, text_a = 2, text_b = 3,
    label = -1, guid = 1, test = { header = true, ncols = 3, text_a = 2, text_b = 3, guid = 1 } },
  wnli = { labels = { "0", "1" }, header = true, ncols = 4, text_a = 2, text_b = 3, label = -1, guid = 1,
    test = { header = true, ncols = 3, text_a = 2, text_b = 3, guid = 1 } },
}

local ALIASES = { sst2 = "sst-2", stsb = "sts-b", ["mnli-m"] = "mnli", ["mnli-mm"] = "mnli",
  mnli_mm = "mnli", mnli_m = "mnli", sst_2 = "sst-2", sts_b = "sts-b" }

local function task_spec(task)
  local t = tostring(task):lower()
  t = ALIASES[t] or t
  local spec = TASKS[t]
  if not spec then
    local names = {}
    for k in pairs(TASKS) do names[#names + 1] = k end
    table.sort(names)
    error(("glue: unknown task '%s' (one of %s)"):format(tostring(task), table.concat(names, ", ")), 3)
  end
  return spec, t
end

M.tasks = {}
for k in pairs(TASKS) do M.tasks[#M.tasks + 1] = k end
table.sort(M.tasks)

-- labels(task) -> list of label strings (nil for STS-B, a regression task)
function M.labels(task) return (task_spec(task)).labels end

function M.num_labels(task)
  local l = task_spec(task).labels
  return l and #l or 1
end

function M.is_regression(task) return task_spec(task).labels == nil end

-- label_id(task, label) -> 0-based class index, or nil when unknown
function M.label_id(task, label)
  local spec = task_spec(task)
  if not spec.labels then return nil end
  for i, l in ipairs(spec.labels) do if l == label then return i - 1 end end
  return nil
end

-- split_tsv_line(line): fields separated by tabs, no quoting.
local function split_tabs(line)
  local out, pos = {}, 1
  while true do
    local j = line:find("\t", pos, true)
    if not j then out[#out + 1] = line:sub(pos); return out end
    out[#out + 1] = line:sub(pos, j - 1)
    pos = j + 1
  end
end
M.split_tsv_line = split_tabs

-- read_examples(task, path[, opts]) -> examples, report
--   opts.set_type: "train" / "dev" (default) / "test" (test files: other columns, no labels)
--   opts.quiet: do not print problems
function M.read_examples(task, path, opts)
  opts = opts or {}
  local spec, tname = task_spec(task)
  local set_type = opts.set_type or "dev"
  local layout = spec
  if set_type == "test" then layout = spec.test end
  local text = fs.read_text(path, "glue")
  local report = { rows = 0, examples = 0, skipped = 0, problems = {}, task = tname, file = path }
  local function problem(lineno, msg)
    local line = ("%s:%d: %s (skipped)"):format(path, lineno, msg)
    report.problems[#report.problems + 1] = line
    report.skipped = report.skipped + 1
    if not opts.quiet then io.stderr:write(line, "\n") end
  end
  local lines = {}
  for line in (text .. "\n"):gmatch("(.-)\r?\n") do lines[#lines + 1] = line end
  -- the split appends one empty line when the file ends with a newline
  if #lines > 0 and lines[#lines] == "" then lines[#lines] = nil end
  local ncols = layout.ncols
  local first = 1
  if layout.header then
    if #lines == 0 then error("glue: " .. path .. " is empty (expected a header line)", 2) end
    if ncols == "header" then ncols = #split_tabs(lines[1]) end
    first = 2
  end
  local examples = {}
  for i = first, #lines do
    local line = lines[i]
    report.rows = report.rows + 1
    local cols = split_tabs(line)
    if line == "" then
      problem(i, "empty line")
    elseif #cols ~= ncols then
      problem(i, ("%d columns, expected %d"):format(#cols, ncols))
    else
      local function col(k) if k < 0 then return cols[#cols + 1 + k] end return cols[k] end
      -- index: the row's own identity (its index column, else its place among the file's data rows,
      -- counting the malformed ones), so a skipped row does not shift the others
      local index = layout.guid and cols[layout.guid] or tostring(i - first)
      local ex = { guid = ("%s-%s"):format(set_type, layout.guid and index or tostring(i - 1)), index = index,
        text_a = col(layout.text_a), text_b = layout.text_b and col(layout.text_b) or nil }
      local ok = true
      if layout.label then
        local label = col(layout.label)
        if spec.labels then
          if M.label_id(tname, label) == nil then
            problem(i, ("unknown label '%s' (expected %s)"):format(label, table.concat(spec.labels, "/")))
            ok = false
          else
            ex.label = label
          end
        else
          local v = tonumber(label)
          if not v or v ~= v then problem(i, ("label '%s' is not a number"):format(label)); ok = false
          elseif v == math.huge or v == -math.huge then  -- it would make every gradient non-finite
            problem(i, ("label '%s' is not a finite number"):format(label)); ok = false
          else ex.label = v end
        end
      end
      if ok then examples[#examples + 1] = ex end
    end
  end
  report.examples = #examples
  return examples, report
end

-- file name of a split in a GLUE task directory
function M.split_file(task, split)
  local _, t = task_spec(task)
  local raw = tostring(task):lower():gsub("_", "-")
  if split == "dev" and t == "mnli" then
    return raw == "mnli-mm" and "dev_mismatched.tsv" or "dev_matched.tsv"
  end
  if split == "test" and t == "mnli" then
    return raw == "mnli-mm" and "test_mismatched.tsv" or "test_matched.tsv"
  end
  if split ~= "train" and split ~= "dev" and split ~= "test" then
    error("glue: split must be train, dev or test, got " .. tostring(split), 2)
  end
  return split .. ".tsv"
end

-- read_split(task, data_dir, split[, opts]): read DATA_DIR/<split file>
function M.read_split(task, data_dir, split, opts)
  opts = opts or {}
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.set_type = split
  return M.read_examples(task, data_dir .. "/" .. M.split_file(task, split), o)
end

return M
