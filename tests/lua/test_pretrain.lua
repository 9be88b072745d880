-- recipes/pretrain.lua end to end on a tiny generated corpus: the loss falls,
-- the saved model reloads with the same outputs, 2 ranks x 1 micro-batch equal
-- 1 rank x 2 micro-batches, a SIGKILLed run resumes with the same losses, fp16
-- and bf16 track fp32, the held-out evaluation is logged; the notebook plots the log.
local T = require "testing"
local cjson = require "cjson"
local fx = require("pretrain_fixture").make(T)
local tmp, sh, pretrain, losses = fx.tmp, T.sh, fx.pretrain, fx.losses
local MPIRUN = "mpirun -np 2 --oversubscribe --allow-run-as-root "
local function need_mpirun()
  if not sh("command -v mpirun"):find("/", 1, true) then T.skip("mpirun not installed") end
end
-- the same 6 steps of batch 16 on 1 rank (2 micro-batches of 8) into tmp/ref and on
-- 2 ranks (1 micro-batch each; extra: more options) into tmp/two; both must succeed
local function one_and_two_ranks(ref, two, extra)
  need_mpirun()
  local out1, rc1 = pretrain(tmp .. "/" .. ref, "--batch1=16 --micro-batch=8 --steps1=6")
  T.eq(rc1, 0, out1)
  local out2, rc2 = pretrain(tmp .. "/" .. two, "--batch1=16 --micro-batch=8 --steps1=6" .. (extra or ""), MPIRUN)
  T.eq(rc2, 0, out2)
end
T.test("loss falls, the model is saved and reloads with the same outputs", function()
  local out, rc = pretrain(tmp .. "/run", "--batch1=16 --micro-batch=16 --steps1=100 --eval-batches=4")
  T.eq(rc, 0, out)
  local l = losses(tmp .. "/run")
  local first = (l[1] + l[2] + l[3]) / 3
  local last = (l[98] + l[99] + l[100]) / 3
  T.truthy(last < first - 1.0, ("loss %.3f -> %.3f"):format(first, last))
  local pretrained = require "bertlua.pretrained"
  local m = pretrained.from_pretrained(tmp .. "/run/phase1", { head = "pretraining" })
  local pd = require "bertlua.data.loader"
  local loader = pd.Loader{ dir = tmp .. "/data", split = "test", batch_size = 4, max_seq_length = 32,
    max_predictions = 5, shuffle = false }
  local batch = loader:next()
  m:eval()
  local a = m:forward(batch).mlm_loss
  local m2 = pretrained.from_pretrained(tmp .. "/run/phase1", { head = "pretraining" })
  m2:eval()
  T.eq(m2:forward(batch).mlm_loss, a)
  T.truthy(out:find("eval phase 1 step 100: MLM loss [%d.]+, MLM accuracy [%d.]+ %(%d+ predictions%), NSP loss "
    .. "[%d.]+, NSP accuracy [%d.]+ %(%d+ sequences%)"), out)
  local ev   -- the log's last held-out evaluation: MLM and NSP
  for line in io.lines(tmp .. "/run/log.jsonl") do
    local r = cjson.decode(line)
    if r.event == "eval" then ev = r end
  end
  T.truthy(ev and ev.step == 100 and ev.phase == 1 and ev.eval_mlm_loss > 0 and ev.eval_mlm_acc > 0
    and ev.eval_nsp_loss > 0 and ev.eval_nsp_acc >= 0 and ev.eval_nsp_acc <= 1, cjson.encode(ev))
  loader:close()
end)

T.test("2 ranks x 1 micro-batch == 1 rank x 2 micro-batches", function()
  one_and_two_ranks("one", "two")
  local a, b = losses(tmp .. "/one"), losses(tmp .. "/two")
  for s = 1, 6 do T.near(b[s], a[s], 1e-6) end
  local st = require "bertlua.io.safetensors"
  local wa = st.load(tmp .. "/one/phase1/model.safetensors")
  local wb = st.load(tmp .. "/two/phase1/model.safetensors")
  local worst = 0
  for name, t in pairs(wa) do
    -- the key bias has a zero true gradient (softmax ignores a constant shift), so its values are rounding noise
    -- (~1e-8 after 6 steps; unpadded training sums its column over T rows): measure it against the weights' init
    -- scale (0.02), the other tensors against their own
    local d = (t - wb[name]):abs():max() / math.max(t:abs():max(), name:find("key%.bias$") and 0.02 or 1e-3)
    if d > worst then worst = d end
  end
  T.truthy(worst <= 1e-6, ("largest relative weight difference %.3g"):format(worst))
end)

T.test("a 2-rank checkpoint resumes on 1 rank (accumulation 2) with the same losses", function()
  one_and_two_ranks("ws_ref", "ws", " --max-steps=3")
  -- a different cut of the global batch into data slices is refused, naming the field
  local bad, rc3 = pretrain(tmp .. "/ws", "--batch1=16 --micro-batch=4 --steps1=6 --resume")
  T.truthy(rc3 ~= 0 and bad:find("data_slices", 1, true), bad)
  local out2, rc4 = pretrain(tmp .. "/ws", "--batch1=16 --micro-batch=8 --steps1=6 --resume")
  T.eq(rc4, 0, out2)
  T.truthy(out2:find("resumed from", 1, true), out2)
  local a, b = losses(tmp .. "/ws_ref"), losses(tmp .. "/ws")
  for s = 1, 6 do T.near(b[s], a[s], 1e-6) end
end)

T.test("SIGKILL mid-run, --resume: the same loss at every later step", function()
  local _, rc = pretrain(tmp .. "/ref", "--batch1=32 --micro-batch=32 --steps1=40")
  T.eq(rc, 0)
  local ref = losses(tmp .. "/ref")
  -- kill the run after its step-10 checkpoint appears (checkpoints every 5 steps)
  local kill_at = 7 + (os.time() % 15)   -- some step after the first checkpoint
  local n = fx.kill_at(tmp .. "/killed", "--batch1=32 --micro-batch=32 --steps1=40", kill_at)
  T.truthy(n < 40, "the run was killed before it finished (at step " .. n .. ")")
  local out, rc2 = pretrain(tmp .. "/killed", "--batch1=32 --micro-batch=32 --steps1=40 --resume")
  T.eq(rc2, 0, out)
  T.truthy(out:find("resumed from", 1, true), out)
  local got = losses(tmp .. "/killed")
  for s = 1, 40 do T.eq(got[s], ref[s], "step " .. s) end
end)

T.test("fp16 (loss scaling) and bf16 track the fp32 loss curve", function()
  local curves = {}
  for _, p in ipairs({ "fp32", "fp16", "bf16" }) do
    local out, rc = pretrain(tmp .. "/p_" .. p, "--batch1=16 --micro-batch=16 --steps1=30 --precision=" .. p)
    T.eq(rc, 0, out)
    curves[p] = losses(tmp .. "/p_" .. p)
  end
  local function tail(c) return (c[28] + c[29] + c[30]) / 3 end
  T.near(tail(curves.fp16), tail(curves.fp32), 0.03)
  T.near(tail(curves.bf16), tail(curves.fp32), 0.05)
  local scale
  for line in io.lines(tmp .. "/p_fp16/log.jsonl") do
    local r = cjson.decode(line)
    if r.loss_scale then scale = r.loss_scale end
  end
  T.truthy(scale and scale > 1, "fp16 ran with a loss scale")
end)

T.test("--optimizer=adam trains with AdamW and resumes its moments exactly; --log-format=dllogger", function()
  local args = "--batch1=16 --micro-batch=16 --steps1=6 --optimizer=adam --lr1=1e-3 --checkpoint-interval=3"
  local out, rc = pretrain(tmp .. "/adam", args)
  T.eq(rc, 0, out)
  T.truthy(out:find("summary: 6 steps, [%d.]+ sequences/s %(96 sequences in"), out)
  -- stopped after 3 steps, resumed: the moments come back from the checkpoint, so every later loss is the same
  local out1, rc1 = pretrain(tmp .. "/adam_resumed", args .. " --max-steps=3")
  T.eq(rc1, 0, out1)
  local out2, rc2 = pretrain(tmp .. "/adam_resumed", args .. " --resume")
  T.eq(rc2, 0, out2)
  local a, b = losses(tmp .. "/adam"), losses(tmp .. "/adam_resumed")
  for s = 1, 6 do T.eq(b[s], a[s], "step " .. s) end
  -- the checkpoint holds AdamW's state, and LAMB from the same start takes another path
  local state = cjson.decode(T.slurp(tmp .. "/adam/checkpoints/phase1/ckpt-00000006/state.json"))
  T.eq(state.identity.optimizer, "adam")
  local out3, rc3 = pretrain(tmp .. "/lamb6", "--batch1=16 --micro-batch=16 --steps1=6 --lr1=1e-3")
  T.eq(rc3, 0, out3)
  T.truthy(losses(tmp .. "/lamb6")[2] ~= a[2], "LAMB and Adam gave the same step 2")
  -- the same run logged the DLLogger way: DLLL lines, the config as PARAMETER, [phase, step], the summary as []
  local out4, rc4 = pretrain(tmp .. "/adam_dll", args .. " --log-format=dllogger")
  T.eq(rc4, 0, out4)
  local recs = {}
  for line in io.lines(tmp .. "/adam_dll/dllogger.json") do
    T.eq(line:sub(1, 5), "DLLL ", line)
    recs[#recs + 1] = cjson.decode(line:sub(6))
  end
  T.eq(recs[1].step, "PARAMETER")
  T.eq(recs[1].data.config.options.optimizer, "adam")
  T.eq(recs[2].type, "LOG"); T.eq(recs[2].step[1], 1); T.eq(recs[2].step[2], 1)
  T.near(recs[2].data.loss, a[1], 1e-12)
  T.truthy(tonumber(recs[2].elapsedtime) and tonumber(recs[2].timestamp), "times as numbers in strings")
  local last = recs[#recs]
  T.eq(type(last.step), "table"); T.eq(#last.step, 0)
  T.eq(last.data.steps, 6); T.eq(last.data.sequences, 96)
  T.near(last.data.final_loss, a[6], 1e-12)
  -- a bad value is one line before anything runs
  local bad, rcb = pretrain(tmp .. "/bad", "--steps1=2 --log-format=csv")
  T.truthy(rcb ~= 0 and bad:find("pretrain: unknown --log-format 'csv' (jsonl or dllogger)", 1, true), bad)
  bad, rcb = pretrain(tmp .. "/bad", "--steps1=2 --optimizer=sgd")
  T.truthy(rcb ~= 0 and bad:find("pretrain: unknown --optimizer 'sgd' (lamb or adam)", 1, true), bad)
  bad, rcb = pretrain(tmp .. "/bad", "--steps1=2 --allreduce-dtype=fp16")
  T.truthy(rcb ~= 0 and bad:find("pretrain: --allreduce-dtype=fp16 needs --precision=fp16", 1, true), bad)
end)

T.test("the pre-training notebook plots the log", function()
  local _, has = sh("command -v jupyter")
  if has ~= 0 then T.skip("jupyter (jupyter-nbconvert) not installed") end
  local out, rc = sh(("BL_LOG=%s/run/log.jsonl BL_NB_OUT=%s/nb jupyter nbconvert --to notebook --execute " ..
    "notebooks/pretraining.ipynb --output-dir=%s/nb")
    :format(tmp, tmp, tmp))
  T.eq(rc, 0, out)
  T.truthy(io.open(tmp .. "/nb/pretraining_curves.png"), "the plot was written")
  -- two runs of two phases each, one resumed (its steps 3-4 logged twice): one curve per run and phase,
  -- the resumed steps' last records kept
  local function log_of(name, resumed)
    local recs = { cjson.encode { event = "config", config = { output = name } } }
    local function steps(phase, from, to, loss0)
      for st = from, to do recs[#recs + 1] = cjson.encode { step = st, phase = phase, loss = loss0 - st / 10 } end
    end
    steps(1, 1, 4, 10)
    if resumed then steps(1, 3, 6, 9) else steps(1, 5, 6, 10) end
    recs[#recs + 1] = cjson.encode { event = "eval", phase = 1, step = 6, eval_mlm_acc = 0.25 }
    steps(2, 1, 3, 5)
    os.execute("mkdir -p " .. tmp .. "/" .. name)
    T.write_file(tmp .. "/" .. name .. "/log.jsonl", table.concat(recs, "\n") .. "\n")
    return tmp .. "/" .. name .. "/log.jsonl"
  end
  local logs = log_of("nb_a", false) .. "," .. log_of("nb_b", true)
  out, rc = sh(("BL_LOG=%s BL_NB_OUT=%s/nb2 jupyter nbconvert --to notebook --execute notebooks/pretraining.ipynb "
    .. "--output-dir=%s/nb2"):format(logs, tmp, tmp))
  T.eq(rc, 0, out)
  local text = T.slurp(tmp .. "/nb2/pretraining.ipynb")
  T.truthy(text:find("4 curves (run x phase)", 1, true), "one curve per run and phase")
  T.truthy(text:find("nb_b/log.jsonl: phase 1: 6 steps, 1 evaluations, phase 2: 3 steps", 1, true),
    "a resumed step counted once")
  T.truthy(text:find("nb_b phase 1: loss 9.900 -> 8.400 over steps 1-6", 1, true), "resumed steps: the last records")
  T.truthy(text:find("nb_a phase 2: loss 4.900 -> 4.700 over steps 1-3", 1, true), "phase 2 on its own")
  T.truthy(text:find("held-out MLM accuracy 0.2500 at step 6", 1, true), "the evaluation")
end)

T.test("--phase=2 alone needs --init, a phase-1 model in --output, or --init-random", function()
  local p2 = (" --phase=2 --data-phase2=%s --seq2=32 --pred2=5 --batch2=16 --micro-batch=16 --steps2=2 --lr2=1e-2")
    :format(fx.data)
  local out, rc = pretrain(tmp .. "/p2", p2)
  T.eq(rc, 1, out)
  T.truthy(out:find(("bertlua: pretrain: --phase=2 starts from phase 1's model: pass --init=DIR (or run phase 1 "
    .. "into --output=%s/p2 first); --init-random trains phase 2 from random weights\n"):format(tmp), 1, true), out)
  T.truthy(not out:find("traceback", 1, true) and not io.open(tmp .. "/p2/phase2/model.safetensors"), out)
  out, rc = pretrain(tmp .. "/p2", p2 .. " --init-random")
  T.eq(rc, 0, out)
  T.truthy(not out:find("initialised from", 1, true), out)
  -- phase 1 run into the same --output first: phase 2 starts from it
  fx.run("p2_after", "--batch1=16 --micro-batch=16 --steps1=2")
  out, rc = pretrain(tmp .. "/p2_after", p2)
  T.eq(rc, 0, out)
  T.truthy(out:find("initialised from " .. tmp .. "/p2_after/phase1", 1, true), out)
  out, rc = pretrain(tmp .. "/p2", p2 .. " --init-random --init=" .. tmp .. "/p2_after/phase1")
  T.truthy(rc == 1 and out:find("--init and --init-random exclude each other", 1, true), out)
end)

T.test("--init from a torch.save pytorch_model.bin, --warmup-steps1 and a fixed --loss-scale reach the run", function()
  local src = tmp .. "/run/phase1"  -- the first test's model, re-saved by torch as pytorch_model.bin
  local bin = tmp .. "/bin_init"
  local out, rc = sh(("%s -c \"import os, torch, shutil; from safetensors.torch import load_file; "
    .. "os.makedirs('%s', exist_ok=True); torch.save(load_file('%s/model.safetensors'), '%s/pytorch_model.bin'); "
    .. "shutil.copy('%s/config.json', '%s')\""):format(os.getenv("BL_PYTHON") or "/usr/bin/python3", bin, src, bin,
    src, bin))
  if rc ~= 0 then T.skip("torch/safetensors not importable: " .. out) end
  out, rc = pretrain(tmp .. "/init_bin", ("--init=%s --batch1=16 --micro-batch=16 --steps1=8 --warmup-steps1=4 "
    .. "--precision=fp16 --loss-scale=1024"):format(bin))
  T.eq(rc, 0, out)
  T.truthy(out:find("initialised from " .. bin, 1, true), out)
  local lr, scale = {}, {}
  for line in io.lines(tmp .. "/init_bin/log.jsonl") do
    local r = cjson.decode(line)
    if r.step and r.lr then lr[r.step], scale[r.step] = r.lr, r.loss_scale end
  end
  -- poly_warmup: lr = lr1 * step / warmup_steps during warmup
  T.near(lr[2], 1e-2 * 2 / 4, 1e-9)
  T.near(lr[3], 1e-2 * 3 / 4, 1e-9)
  for s = 1, 8 do T.eq(scale[s], 1024, "fixed loss scale at step " .. s) end
  -- initialised, not random: the first loss is near where the first run ended, far below a fresh model's
  local first = losses(tmp .. "/run")
  T.truthy(losses(tmp .. "/init_bin")[1] < first[1] - 0.5, "starts from the trained weights")
end)

T.run()
