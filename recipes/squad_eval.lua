-- squad_eval.lua: the official SQuAD v1.1 / v2.0 evaluation, same numbers and
-- same output as evaluate-v1.1.py / evaluate-v2.0.py.
--   bertlua recipes/squad_eval.lua dev-v1.1.json predictions.json
--   bertlua recipes/squad_eval.lua dev-v2.0.json predictions.json --na-prob=null_odds.json
-- The version comes from the data's "version" field (or is_impossible
-- fields); --version=1.1|2.0 forces it. Prints the metrics as JSON on stdout
-- (v1.1: one line; v2.0: indent=2) or writes them to --out-file; options and
-- the official warnings go to stderr.
local options = require "bertlua.util.options"
local squad = require "bertlua.tasks.squad"
local json = require "bertlua.util.json"

local spec = {
  { "na_prob", "", "JSON file qid -> probability of no answer (v2.0; null_odds.json)" },
  { "na_prob_file", "", "same as --na-prob (the official script's name)" },
  { "na_prob_thresh", 1.0, "predict \"\" when the no-answer probability exceeds this (v2.0)", int = false },
  { "out_file", "", "write the metrics JSON here instead of stdout" },
  { "version", "auto", "auto, 1.1 or 2.0" },
}
local usage = "usage: bertlua recipes/squad_eval.lua DATA.json PREDICTIONS.json [options]"
local ok, opt = pcall(options.parse, arg, spec, { usage = usage, name = "squad_eval", positional = true })
if not ok then io.stderr:write(tostring(opt), "\n"); os.exit(2) end
local pos = opt._positional
if #pos ~= 2 then
  io.stderr:write(usage, "\n(see --help)\n")
  os.exit(2)
end
io.stderr:write("squad_eval options:\n", options.show(opt), "\n")

local function run()
  if opt.out_file ~= "" then
    require("bertlua.util.fs").check_output("squad_eval", { "--out-file", opt.out_file },
      { { "the data file", pos[1] }, { "the predictions", pos[2] }, { "--na-prob", opt.na_prob },
        { "--na-prob-file", opt.na_prob_file } })
  end
  local dataset = squad.load_json(pos[1])
  if type(dataset) ~= "table" or type(dataset.data) ~= "table" then
    error(pos[1] .. ": not a SQuAD file (no 'data' array)", 0)
  end
  local preds = squad.load_json(pos[2])
  if type(preds) ~= "table" then error(pos[2] .. ": predictions must be a JSON object (id -> text)", 0) end
  local version = opt.version
  if version == "auto" then version = squad.dataset_version(dataset) end
  if version == "1.1" and dataset.version ~= nil and dataset.version ~= "1.1" then
    io.stderr:write("Evaluation expects v-1.1, but got dataset with v-" .. tostring(dataset.version), "\n")
  end
  local na_file = opt.na_prob ~= "" and opt.na_prob or (opt.na_prob_file ~= "" and opt.na_prob_file or nil)
  local eopts = { version = version, na_prob_thresh = opt.na_prob_thresh, name = "squad_eval" }
  if na_file then
    if version ~= "2.0" then io.stderr:write("squad_eval: --na-prob is only used by the v2.0 evaluation\n") end
    local na, text = squad.load_json(na_file)
    if type(na) ~= "table" then error(na_file .. ": must be a JSON object (id -> probability)", 0) end
    eopts.na_probs = na
    eopts.na_prob_keys, eopts.na_prob_ints = json.object_keys(text, na_file)
  end
  local result = squad.evaluate(dataset, preds, eopts)
  if opt.out_file ~= "" then
    require("bertlua.util.fs").write_atomic(opt.out_file, squad.format_eval(result, version, true))
  else
    io.write(squad.format_eval(result, version, false), "\n")
  end
end

local rok, err = pcall(run)
if not rok then
  io.stderr:write("squad_eval: error: ", tostring(err), "\n")
  os.exit(1)
end
