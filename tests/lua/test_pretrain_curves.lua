-- tools/pretrain_curves.lua at a tiny scale: data from ../shared/data, the tiny model for 4 + 2 steps on both sides
-- (bertlua and the PyTorch reference of NVIDIA's run_pretraining.py), every snapshot scored by bertlua's evaluator
-- and the phase ends by the reference's; the two evaluators give the same numbers on the same models.
local T = require "testing"
local shell = require "bertlua.util.shell"
local fs = require "bertlua.util.fs"
local cjson = require "cjson"

local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"
local _, has_torch = shell.read({ PY, "-c", "import torch, transformers" }, { stderr = "/dev/null" })
if not has_torch then T.skip_all(PY .. " cannot import torch and transformers (scripts/requirements-test.txt)") end
local shared = T.shared_data()
if not (shared and T.shared_data("books") and T.shared_data("wikipedia") and
  T.shared_data("vocab/bert-base-uncased-vocab.txt")) then
  T.skip_all("needs ../shared/data (wikipedia/*.bz2, books/, vocab/bert-base-uncased-vocab.txt) or $BL_SHARED_DATA")
end

local tmp = T.tmpdir()
local cfg = tmp .. "/tiny.lua"
T.write_file(cfg, [[return { model = "tiny", seq1 = 64, pred1 = 10, batch1 = 2, lr1 = 3e-3, warmup1 = 0.2843,
  steps1 = 4, seq2 = 128, pred2 = 20, batch2 = 2, lr2 = 2e-3, warmup2 = 0.128, steps2 = 2, micro_batch = 1 }]])

local function curves(extra)
  return shell.read({ T.exe(), "tools/pretrain_curves.lua", "--pretrain-config=" .. cfg, "--shared-data=" .. shared,
    "--output=" .. tmp .. "/out", "--seeds=1,2", "--ref-seeds=1", "--dupe1=1", "--dupe2=1", "--eval-every1=2",
    "--eval-every2=1", "--eval-instances1=16", "--eval-instances2=8", "--python=" .. PY, extra or {} },
    { stderr = "stdout" })
end

T.test("both sides' curves, scored by the same evaluators, which agree", function()
  -- the batches written without training are the ones pretrain.lua trains on (its run compares them)
  local out, ok = curves({ "--batches-only" })
  T.truthy(ok, out)
  local b2 = tmp .. "/out/seed2/batches/phase1/"
  T.truthy(fs.is_dir(b2), out)
  -- one of seed 2's batches changed: its run finds it
  T.write_file(b2 .. "000003_001.safetensors", T.slurp(b2 .. "000004_001.safetensors"))
  out, ok = curves()
  T.truthy(not ok and out:find("pretrain_curves: seed 2: batch phase1/000003_001.safetensors written by "
    .. "--batches-only differs from pretrain.lua's", 1, true), out)
  -- until the batches agree, every invocation says so
  out, ok = curves()
  T.truthy(not ok and out:find("seed 2: batch phase1/000003_001.safetensors", 1, true), out)
  -- the run's own batches replace the changed ones
  fs.remove_tree(tmp .. "/out/seed2/batches")
  T.truthy(os.rename(tmp .. "/out/seed2/batches.check", tmp .. "/out/seed2/batches"))
  out, ok = curves()
  T.truthy(ok, out)
  local rows = {}
  for line in T.slurp(tmp .. "/out/curves.csv"):gmatch("[^\n]+") do
    local ev, side, seed, phase, step = line:match("^(%a+),(%a+),(%d+),(%d+),(%d+),")
    if ev then rows[#rows + 1] = { ev, side, tonumber(seed), tonumber(phase), tonumber(step) } end
  end
  local count = {}
  for _, r in ipairs(rows) do
    local k = r[1] .. "/" .. r[2]
    count[k] = (count[k] or 0) + 1
  end
  -- bertlua's evaluator: steps 0, 2, 4 of phase 1 and 0, 1, 2 of phase 2, of 2 bertlua seeds and 1 reference seed
  T.eq(count["bertlua/bertlua"], 12)
  T.eq(count["bertlua/reference"], 6)
  -- the reference's evaluator: the phase ends (and both phases' step 0)
  T.eq(count["reference/bertlua"], 8)
  T.eq(count["reference/reference"], 4)
  local s = cjson.decode(T.slurp(tmp .. "/out/summary.json"))
  local a = s.evaluators_agree
  T.eq(a.snapshots, 12)
  T.truthy(a.count_mismatch == nil, tostring(a.count_mismatch))
  T.truthy(a.mlm_acc <= 1e-9 and a.nsp_acc <= 1e-9 and a.mlm_loss < 1e-4 and a.nsp_loss < 1e-4, cjson.encode(a))
  T.truthy(T.slurp(tmp .. "/out/summary.md"):find("| 2 | mlm_acc |", 1, true))
  -- a second invocation trains nothing again and scores nothing again
  out, ok = curves({ "--report-only" })
  T.truthy(ok and not out:find("bertlua seed", 1, true) and not out:find("evaluator,", 1, true), out)
end)

T.test("a reference run stopped by --max-steps resumes to the uninterrupted run, bit for bit", function()
  local function ref(extra)
    return shell.read({ T.exe(), "tools/pretrain_curves.lua", "--pretrain-config=" .. cfg, "--output=" .. tmp
      .. "/stopped", "--data=" .. tmp .. "/out/data", "--seeds=1", "--sides=reference", "--eval-every1=2",
      "--eval-every2=1", "--eval-instances1=16", "--eval-instances2=8", "--python=" .. PY, extra },
      { stderr = "stdout" })
  end
  fs.mkdir_p(tmp .. "/stopped/seed1")
  for _, d in ipairs { "init", "batches" } do
    T.truthy(shell.run({ "cp", "-r", tmp .. "/out/seed1/" .. d, tmp .. "/stopped/seed1/" .. d }))
  end
  local run = tmp .. "/stopped/seed1/reference"
  -- 3 steps (mid phase 1), then 2 (phase 1's end and phase 2's first), then the rest
  local out, ok = ref({ "--max-steps=3" })
  T.truthy(ok and fs.exists(run .. "/resume.pt") and not fs.exists(run .. "/phase1/model.safetensors"), out)
  out, ok = ref({ "--max-steps=2" })
  T.truthy(ok and fs.exists(run .. "/phase1/model.safetensors") and fs.exists(run .. "/phase2/step_000001")
    and not fs.exists(run .. "/phase2/model.safetensors"), out)
  T.truthy(T.slurp(tmp .. "/stopped/seed1/reference.log"):find("resumed from .* phase 1 step 3"), out)
  out, ok = ref({})
  T.truthy(ok, out)
  T.truthy(not fs.exists(run .. "/resume.pt"), "the finished run's checkpoint is removed")
  local whole = tmp .. "/out/seed1/reference"
  T.eq(T.slurp(run .. "/log.jsonl"), T.slurp(whole .. "/log.jsonl"))
  for _, f in ipairs { "phase1/model.safetensors", "phase2/model.safetensors",
    "phase1/step_000002/model.safetensors" } do
    T.truthy(T.slurp(run .. "/" .. f) == T.slurp(whole .. "/" .. f), f .. " differs from the uninterrupted run's")
  end
end)

T.test("downstream: every phase-2 model and the random one fine-tuned the same way", function()
  local function downstream(extra)
    return shell.read({ T.exe(), "tools/pretrain_downstream.lua", "--curves=" .. tmp .. "/out",
      "--shared-data=" .. shared, "--sst2-train=40", "--squad-train-articles=1", "--squad-train-per=8",
      "--squad-eval-articles=1", "--squad-eval-per=8", "--sst2-epochs=1", "--squad-epochs=1", "--batch=8",
      extra or {} },
      { stderr = "stdout" })
  end
  local out, ok = downstream({ "--tasks=sst2,glue" })
  T.truthy(not ok and out:find("pretrain_downstream: --tasks: sst2 and/or squad, got 'glue'", 1, true), out)
  out, ok = downstream()
  T.truthy(ok, out)
  local d = cjson.decode(T.slurp(tmp .. "/out/downstream.json"))
  -- 2 bertlua seeds, 1 reference seed, the random models (each seed's: no --init-seed here); per task
  T.eq(#d.rows, 10)
  for _, task in ipairs { "sst2", "squad" } do
    local s = d.summary[task]
    T.eq(s.bertlua.n, 2); T.eq(s.reference.n, 1); T.eq(s["random init"].n, 2)
    T.truthy(s.bertlua.min <= s.bertlua.mean and s.bertlua.mean <= s.bertlua.max, cjson.encode(s))
    T.near(s.bertlua.over_random, s.bertlua.mean - s["random init"].mean, 1e-9)
  end
  T.eq(d.summary.sst2.split.train, 40)
  T.eq(d.summary.squad.split.eval, 8)
  -- a second call fine-tunes nothing again
  out, ok = downstream()
  T.truthy(ok and not out:find("glue.lua", 1, true), out)
end)

T.test("notebooks/pretraining_vs_reference.ipynb plots both sides and the table", function()
  local _, has = shell.read({ "sh", "-c", "command -v jupyter" })
  if not has then T.skip("jupyter (jupyter-nbconvert) not installed") end
  T.truthy(fs.exists(tmp .. "/out/summary.json"), "the curves of the test above")
  local out, ok = shell.read({ "env", "BL_CURVES=" .. tmp .. "/out", "BL_NB_OUT=" .. tmp .. "/nb", "jupyter",
    "nbconvert", "--to", "notebook", "--execute", "notebooks/pretraining_vs_reference.ipynb",
    "--output-dir=" .. tmp .. "/nb" }, { stderr = "stdout" })
  T.truthy(ok, out)
  T.truthy(fs.exists(tmp .. "/nb/pretraining_vs_reference.png"), "the figure")
  local text = T.slurp(tmp .. "/nb/pretraining_vs_reference.ipynb")
  T.truthy(text:find("bertlua seeds [1, 2], reference seeds [1]", 1, true), "the runs read")
  -- phase 2's MLM accuracy row: both bertlua seeds, the reference's (one-seed) spread
  T.truthy(text:find('2     MLM accuracy  %d%.%d+ %d%.%d+%s+%d%.%d+%.%.%d%.%d+'), "the phase-end table")
  T.truthy(text:find("random init  mean +%d+%.%d%d  min%.%.max"), "the downstream table")
end)

T.test("a large-batch AdamW variant on the same data: batches, steps and rates scaled", function()
  local function variant(extra)
    return shell.read({ T.exe(), "tools/pretrain_curves.lua", "--pretrain-config=" .. cfg, "--output=" .. tmp
      .. "/large", "--seeds=1", "--sides=bertlua", "--eval-every1=1", "--eval-every2=1", "--eval-instances1=16",
      "--eval-instances2=8", extra }, { stderr = "stdout" })
  end
  local out, ok = variant({ "--data=" .. tmp .. "/nodata" })
  T.truthy(not ok and out:find("--data=" .. tmp .. "/nodata: no prepared data there", 1, true), out)
  out, ok = variant({ "--data=" .. tmp .. "/out/data", "--scale-batch=3" })
  T.truthy(not ok and out:find("--scale-batch=3: phase 1's 4 steps are not a multiple of it", 1, true), out)
  out, ok = variant({ "--data=" .. tmp .. "/out/data", "--optimizer=adam", "--sides=bertlua,reference" })
  T.truthy(not ok and out:find("the reference runs LAMB only", 1, true), out)
  out, ok = variant({ "--data=" .. tmp .. "/out/data", "--scale-batch=2", "--optimizer=adam", "--lr1=1e-3" })
  T.truthy(ok, out)
  T.truthy(not fs.exists(tmp .. "/large/data"), "the data is shared, not made again")
  local s = cjson.decode(T.slurp(tmp .. "/large/summary.json"))
  T.eq(s.config.batch1, 4); T.eq(s.config.steps1, 2); T.eq(s.config.steps2, 1); T.eq(s.config.optimizer, "adam")
  T.near(s.config.lr1, 1e-3 * math.sqrt(2), 1e-12)  -- summary.json keeps 14 digits
  -- what pretrain.lua ran with
  local log = T.slurp(tmp .. "/large/seed1/bertlua.log")
  T.truthy(log:find("global batch 4 = 1 ranks x 1 micro-batch x 4 accumulation, 2 steps", 1, true), log)
  T.truthy(s.phases[1].mlm_acc.bertlua[1].v >= 0, cjson.encode(s.phases[1]))
end)

T.test("a mixed-precision variant held against the fp32 runs' spread, with its loss-scale history", function()
  local function variant(extra)
    return shell.read({ T.exe(), "tools/pretrain_curves.lua", "--pretrain-config=" .. cfg, "--output=" .. tmp
      .. "/fp16", "--data=" .. tmp .. "/out/data", "--seeds=1,2", "--sides=bertlua", "--eval-every1=2",
      "--eval-every2=1", "--eval-instances1=16", "--eval-instances2=8", "--precision=fp16", extra },
      { stderr = "stdout" })
  end
  local out, ok = variant({ "--sides=bertlua,reference" })
  T.truthy(not ok and out:find("pretrain_curves: precision fp16: the reference runs fp32 only (--sides=bertlua for "
    .. "the other precisions)", 1, true), out)
  out, ok = variant({ "--baseline=" .. tmp .. "/none" })
  T.truthy(not ok and out:find("--baseline=" .. tmp .. "/none: no summary.json there", 1, true), out)
  out, ok = variant({ "--baseline=" .. tmp .. "/large" })  -- another run: batch 4, 2 steps
  T.truthy(not ok and out:find("--baseline=" .. tmp .. "/large: its steps1 is 2, this run's 4 (not the same run)",
    1, true), out)
  out, ok = variant({ "--baseline=" .. tmp .. "/out" })
  T.truthy(ok, out)
  T.truthy(T.slurp(tmp .. "/fp16/seed1/bertlua.log"):find("precision fp16", 1, true), "pretrain.lua ran fp16")
  local s = cjson.decode(T.slurp(tmp .. "/fp16/summary.json"))
  T.eq(s.config.precision, "fp16")
  T.eq(s.baseline.config.precision, "fp32")
  for p = 1, 2 do
    local m = s.baseline.phases[p].mlm_acc
    T.eq(#m.mine, 2); T.eq(#m.baseline, 2)
    T.truthy(m.within:match("^%d of 2$"), m.within)
  end
  -- the dynamic scale starts at 2^16; every logged step of both phases is in the history
  local h = s.loss_scale[1].phases[1]
  T.eq(h.first, 65536)
  T.truthy(h.lowest <= h.last and h.last <= h.highest and h.skipped >= 0, cjson.encode(h))
  T.truthy(T.slurp(tmp .. "/fp16/summary.md"):find("| seed | phase | first | lowest | highest | last | changes |", 1,
    true))
end)

T.test("a run the reference cannot reproduce is refused in one line", function()
  local bad = tmp .. "/bf16.lua"
  T.write_file(bad, T.slurp(cfg):gsub("micro_batch = 1", "micro_batch = 1, precision = \"bf16\""))
  local out, ok = shell.read({ T.exe(), "tools/pretrain_curves.lua", "--pretrain-config=" .. bad,
    "--output=" .. tmp .. "/bad" }, { stderr = "stdout" })
  T.truthy(not ok, out)
  T.truthy(out:find("pretrain_curves: precision bf16: the reference runs fp32 only", 1, true), out)
end)

T.run()
