-- glue_eval.lua: score GLUE predictions against a labelled TSV with the task's
-- metrics (CoLA mcc; STS-B pearson/spearmanr/corr; MRPC/QQP acc, f1, acc_and_f1;
-- others acc), printed as one JSON object.
--   bertlua recipes/glue_eval.lua --task=mrpc --data=glue/MRPC/dev.tsv --predictions=preds.tsv
-- Predictions: the GLUE submission format ("index\tprediction" with that header
-- line) or one prediction per line, in the order of the data file's rows;
-- labels as in the data (0/1, entailment, ...) or STS-B scores.
local options = require "bertlua.util.options"
local glue = require "bertlua.tasks.glue"
local metrics = require "bertlua.tasks.metrics"
local json = require "bertlua.util.json"

local spec = {
  { "task", "", "cola, sst-2, mrpc, sts-b, qqp, mnli, mnli-mm, qnli, rte, wnli" },
  { "data", "", "labelled TSV (e.g. dev.tsv)" },
  { "predictions", "", "predictions file" },
}
local ok, opt = pcall(options.parse, arg, spec,
  { usage = "usage: bertlua recipes/glue_eval.lua --task=T --data=DEV.tsv --predictions=P", name = "glue_eval" })
if not ok then io.stderr:write(tostring(opt), "\n"); os.exit(2) end
if opt.task == "" or opt.data == "" or opt.predictions == "" then
  io.stderr:write("glue_eval: --task, --data and --predictions are required (see --help)\n")
  os.exit(2)
end
io.stderr:write("glue_eval options:\n", options.show(opt), "\n")

local function run()
  local examples, rep = glue.read_examples(opt.task, opt.data, { set_type = "dev" })
  if rep.skipped > 0 then
    io.stderr:write(("glue_eval: %d malformed rows skipped in %s\n"):format(rep.skipped, opt.data))
  end
  local preds = {}
  for line, lineno in require("bertlua.util.fs").lines(opt.predictions) do
    local header = lineno == 1 and line:lower():match("^index\tprediction")   -- GLUE submission header
    if not header and line ~= "" then
      local cols = glue.split_tsv_line(line)
      local v = cols[#cols]
      if glue.is_regression(opt.task) then
        local n = tonumber(v)
        if not n then error(("%s:%d: prediction '%s' is not a number"):format(opt.predictions, lineno, v), 0) end
        v = n
      elseif glue.label_id(opt.task, v) == nil then
        error(("%s:%d: unknown label '%s'"):format(opt.predictions, lineno, v), 0)
      end
      preds[#preds + 1] = v
    end
  end
  if #preds ~= #examples then
    error(("%d predictions for %d examples in %s"):format(#preds, #examples, opt.data), 0)
  end
  local labels = {}
  for i, e in ipairs(examples) do labels[i] = e.label end
  io.write(json.dumps(metrics.glue(opt.task, preds, labels)), "\n")
end

local rok, e = pcall(run)
if not rok then io.stderr:write("glue_eval: error: ", tostring(e), "\n"); os.exit(1) end
