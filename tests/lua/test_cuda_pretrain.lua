-- recipes/pretrain.lua --device=cuda against --device=cpu on the tiny corpus of
-- pretrain_fixture (2 layers, hidden 64, S=32), same seed and data:
--  - fp32, 20 steps: every step's loss within 1e-5 relative (the kernels
--    compute in f32 like the CPU ops, with other summation orders: ~1e-6 per
--    step; test_cuda_ops bounds each op), and the saved models give the same
--    MLM loss on a held-out batch; bf16 and fp16 within a bound (see below);
--  - a bf16 run SIGKILLed on cuda and resumed on cuda gives the uninterrupted
--    run's losses bit for bit; the same checkpoint resumes on the cpu, and a cpu
--    checkpoint resumes on cuda; batches reach the GPU through the pinned,
--    copy-stream input pipeline (DeviceLoader);
--  - the cuda-trained models (fp32, bf16) load into transformers with the same outputs;
--  - the step stays on the device: from the emulated runtime's counters in the
--    log, no cudaMalloc/cudaFree after step 1 and at most one host wait per
--    logged step (fp32, bf16, fp16 with skipped steps, log every step or every
--    4th: test_cuda_step.lua);
--  - bf16/fp16 on cuda train on the half compute copy (tensor-core GEMMs, no
--    rounding pass), an fp16 overflow there is skipped with both copies of the
--    weights untouched and the scale backed off; bf16/fp16 losses on cuda stay
--    within a bound from an error analysis of the cpu's, and a bf16 checkpoint
--    made on cuda resumes on the cpu and the other way round.
--  (test_cuda_pretrain_dp: 2 ranks over NCCL equal 1 rank with accumulation 2.)
-- Needs a CUDA device (the emulated one in CI); skipped otherwise.
local T = require "testing"
local bl = require "bertlua"
local amp = require "bertlua.train.amp"
local fixture = require "pretrain_fixture"
local fx = fixture.make(T, { need_cuda = true })
local tmp, losses, run, rel = fx.tmp, fx.losses, fx.run, fixture.rel
local records, step_stays_on_device = fx.records, fx.step_stays_on_device

T.test("fp32: 20 steps on cuda track the cpu within 1e-5 per step; saved models agree", function()
  local args = "--batch1=8 --micro-batch=8 --steps1=20 --eval-batches=1 --checkpoint-interval=0"
  run("cpu", args .. " --device=cpu")
  local out = run("cuda", args .. " --device=cuda")
  T.truthy(out:find("device cuda:0", 1, true), "the startup line names the device: " .. out)
  local c, g = losses(tmp .. "/cpu"), losses(tmp .. "/cuda")
  for s = 1, 20 do
    T.truthy(g[s] and rel(g[s], c[s]) <= 1e-5, ("step %d: cuda %.9g cpu %.9g"):format(s, g[s] or 0 / 0, c[s]))
  end
  step_stays_on_device(tmp .. "/cuda", "fp32")
  local pretrained = require "bertlua.pretrained"
  local loader = require("bertlua.data.loader").Loader{ dir = tmp .. "/data", split = "test", batch_size = 4,
    max_seq_length = 32, max_predictions = 5, shuffle = false }
  local batch = loader:next()
  loader:close()
  local function mlm(dir)
    local m = pretrained.from_pretrained(dir, { head = "pretraining" })
    m:eval()
    return m:forward(batch).mlm_loss
  end
  local a, b = mlm(tmp .. "/cpu/phase1"), mlm(tmp .. "/cuda/phase1")
  T.truthy(rel(b, a) <= 1e-5, ("held-out MLM loss of the saved models: cuda-trained %.9g cpu-trained %.9g")
    :format(b, a))
end)

-- bf16/fp16: on cuda the model trains on its half compute copy (half activations, tensor-core GEMMs with f32
-- accumulation), on the cpu on the emulation (f32 activations on rounded weights and gradients). The error analysis
-- (README, "Precision on a GPU and on the CPU"): a half activation carries a relative rounding error of at most
-- u = 2^-8 (bf16) or 2^-11 (fp16) that the cpu does not make; there are r = 4 + 9L = 22 of them on the path to a
-- logit of this 2-layer model, and a cross-entropy moves by at most twice its largest logit change: worst case
-- 2 r u max|logit| (0.17 for bf16, 0.02 for fp16, the logits staying below 1 here). The errors are independent and
-- unbiased (round to nearest even): sqrt(r) u / sqrt(3) per logit, averaged over the ~40 masked tokens of a batch,
-- about 1e-4 of the loss (~7) for bf16 and 1.3e-5 for fp16. The weights drift apart after step 1 by LAMB's
-- normalised update of a gradient with that relative error: at most lr = 1e-2 of it per step, smaller still.
-- Tolerances, per step, relative: 1e-3 bf16, 2e-4 fp16 (measured: 5.6e-5 and 7.9e-6, in the ratio of their u).
-- fp16 at the default scale 2^16 overflows on neither device here, so both step every time (checked) and the
-- losses compare; overflows, skips and backoff on the compute copy are checked below and in test_cuda_step.
-- fp16 accumulates 2 micro-batches of 4 in the gradient buffer (the loss scale seeds both backward calls).
local HALF_TOL = { bf16 = 1e-3, fp16 = 2e-4 }
T.test("bf16 and fp16: 20 steps on cuda (compute copy) track the cpu (emulation) per step within the bound",
  function()
  for _, p in ipairs { "bf16", "fp16" } do
    local args = ("--batch1=8 --micro-batch=%d --steps1=20 --eval-batches=1 --checkpoint-interval=0 --precision=%s")
      :format(p == "fp16" and 4 or 8, p)
    run(p .. "_cpu", args .. " --device=cpu")
    local out = run(p .. "_cuda", args .. " --device=cuda")
    local path = amp.path(0, p)
    T.truthy(out:find("training path: " .. path, 1, true), ("the run names its path '%s': %s"):format(path, out))
    local c, g = losses(tmp .. "/" .. p .. "_cpu"), losses(tmp .. "/" .. p .. "_cuda")
    for s = 1, 20 do
      T.truthy(g[s] and rel(g[s], c[s]) <= HALF_TOL[p], ("%s step %d: cuda %.9g cpu %.9g"):format(p, s, g[s] or 0 / 0,
        c[s]))
    end
    local rc, rg = records(tmp .. "/" .. p .. "_cpu"), records(tmp .. "/" .. p .. "_cuda")
    for i, r in ipairs(rc) do
      T.eq(rg[i].skipped, r.skipped, ("%s step %d: skipped on cuda / cpu"):format(p, r.step))
      T.eq(rg[i].loss_scale, r.loss_scale, ("%s step %d: loss scale on cuda / cpu"):format(p, r.step))
    end
    step_stays_on_device(tmp .. "/" .. p .. "_cuda", p)
  end
end)

-- in bf16: the checkpoint holds the f32 master weights, from which a resumed cuda run makes its compute copy again
-- (the copy the optimizer wrote: the same rounding), and a cpu run its emulation
T.test("bf16, SIGKILL on cuda, --resume: the same losses bit for bit; the checkpoint resumes on cpu", function()
  -- a real GPU logs a step of 8 sequences faster than kill_at polls the log: there a step accumulates 64
  -- micro-batches (the emulated runtime counts graph kernels; a real one reports -1)
  local B = bl.cuda_counters(0).graph_kernels >= 0 and 8 or 512
  local args = ("--batch1=%d --micro-batch=8 --steps1=10 --precision=bf16 --device=cuda"):format(B)
  run("full", args)
  -- killed at some step after the step-5 checkpoint: steps from there on are recomputed
  local n = fx.kill_at(tmp .. "/part", args, 6 + os.time() % 3)
  T.truthy(n >= 6 and n < 10, "killed at step " .. n)
  os.execute(("cp -r %s/part %s/part_cpu"):format(tmp, tmp))
  local out = run("part", args .. " --resume")
  T.truthy(out:find("resumed from", 1, true), out)
  local full, resumed = losses(tmp .. "/full"), losses(tmp .. "/part")
  for s = 1, 10 do T.eq(resumed[s], full[s], "step " .. s) end
  run("part_cpu", args:gsub("cuda", "cpu") .. " --resume")
  local on_cpu = losses(tmp .. "/part_cpu")
  for s = 6, 10 do
    T.truthy(rel(on_cpu[s], full[s]) <= HALF_TOL.bf16, ("step %d: resumed on cpu %.9g, cuda %.9g"):format(s,
      on_cpu[s], full[s]))
  end
  -- and the other way: a checkpoint made on the cpu resumes on cuda
  local cargs = "--batch1=8 --micro-batch=8 --steps1=10 --precision=bf16 --device=cpu"
  run("full_cpu", cargs)
  T.truthy(fx.kill_at(tmp .. "/part_from_cpu", cargs, 6) >= 6)
  run("part_from_cpu", "--batch1=8 --micro-batch=8 --steps1=10 --precision=bf16 --device=cuda --resume")
  local fc, on_cuda = losses(tmp .. "/full_cpu"), losses(tmp .. "/part_from_cpu")
  for s = 6, 10 do
    T.truthy(rel(on_cuda[s], fc[s]) <= HALF_TOL.bf16, ("step %d: resumed on cuda %.9g, cpu %.9g"):format(s,
      on_cuda[s], fc[s]))
  end
end)

-- The fast path, not the emulation: pretrain.lua's set-up (amp.model_to, MixedPrecision, bertlua.train.step) on cuda in
-- bf16 and fp16 records a step whose GEMMs all run on the half tensor-core engine, with no rounding pass (cast) and
-- no master-weight copy (d2d); the emulation (the f32 model) makes only f32 GEMMs, 4 casts and 2 copies per step.
T.test("bf16/fp16 on cuda train on the half compute copy: tensor-core GEMMs, no rounding passes", function()
  local bert, optim = require "bertlua.bert", require "bertlua.train.optim"
  local stepmodel = require "bertlua.stepmodel"
  local tstep = require "bertlua.train.step"
  local loader = require("bertlua.data.loader").Loader{ dir = tmp .. "/data", split = "train", batch_size = 4,
    max_seq_length = 32, max_predictions = 5, shuffle = false }
  local batch = loader:next()
  loader:close()
  local function launches(p, emulate)
    local model = bert.BertForPreTraining(bert.config.load(tmp .. "/cfg.json"), { seed = 1 })
    if emulate then model:to{ device = 0 } else amp.model_to(model, 0, p) end
    local mp = amp.MixedPrecision{ model = model, precision = p }
    T.eq(mp.compute, not emulate, p .. ": MixedPrecision's mode")
    local s = tstep.Step{ model = model, optimizer = optim.LAMB{ model = model, lr = 1e-3 }, amp = mp, dev = 0,
      loss = tstep.pretraining_loss() }
    s:run(1, function() return batch end, 1e-3)
    s:read()
    local n = { gemm = 0, tc16 = 0, cast = 0, d2d = 0 }
    for _, l in ipairs(stepmodel.record(0, function() s:run(2, function() return batch end, 1e-3) end)) do
      if l.cls == "gemm" then n.gemm, n.tc16 = n.gemm + 1, n.tc16 + (l.engine == "tc16" and 1 or 0) end
      if l.cls == "cast" then n.cast = n.cast + 1 end
      if l.name == "cudaMemcpy d2d" then n.d2d = n.d2d + 1 end
    end
    return n, model
  end
  for _, p in ipairs { "bf16", "fp16" } do
    local n, model = launches(p)
    T.eq(model.compute_dtype, amp.storage_dtype(p), p .. ": the model's compute dtype")
    T.truthy(n.gemm > 0 and n.tc16 == n.gemm, ("%s: %d of %d GEMMs on tensor cores"):format(p, n.tc16, n.gemm))
    T.eq(n.cast + n.d2d, 0, p .. ": rounding passes and master copies in a step")
  end
  -- fp16 at a loss scale of 2^24: the scaled gradients overflow the f16 activations of the backward; the step is
  -- skipped on the device, the scale backs off to 2^23, and neither the f32 master weights nor their f16 copy
  -- change (GradScaler's skip)
  local model = bert.BertForPreTraining(bert.config.load(tmp .. "/cfg.json"), { seed = 1 })
  amp.model_to(model, 0, "fp16")
  local mp = amp.MixedPrecision{ model = model, precision = "fp16", scaler = { init_scale = 2 ^ 24 } }
  local s = tstep.Step{ model = model, optimizer = optim.LAMB{ model = model, lr = 1e-3 }, amp = mp, dev = 0,
    loss = tstep.pretraining_loss() }
  local w0, h0 = model.flat_params:to("cpu"), model.flat_compute:to("cpu")
  s:run(1, function() return batch end, 1e-3)
  local r = mp:read(s:read().amp)
  T.truthy(r.last_skipped and r.skipped == 1, "fp16 at scale 2^24: the step is skipped")
  T.eq(r.loss_scale, 2 ^ 23, "the loss scale after the skipped step")
  T.eq((model.flat_params:to("cpu") - w0):abs():max(), 0, "master weights after the skipped step")
  T.eq((model.flat_compute:to("cpu"):to("f32") - h0:to("f32")):abs():max(), 0, "f16 copy after the skipped step")
  -- the same counts see the emulation, which the test would meet if training fell back to it
  local e = launches("bf16", true)
  T.truthy(e.tc16 == 0 and e.cast > 0 and e.d2d > 0, ("emulation: %d tensor-core GEMMs, %d casts, %d copies")
    :format(e.tc16, e.cast, e.d2d))
end)

-- The models trained on cuda in the fp32 and bf16 tests (bf16: the f32 master weights are saved), as Hugging Face
-- directories, loaded by transformers (BertForPreTraining): the same last hidden state, MLM and NSP logits as
-- bertlua's on a fixed batch. Both compute in f32 with other summation orders: 1e-5 relative to the largest value
-- (test_safetensors).
T.test("the cuda-trained models (fp32, bf16) load into transformers with the same outputs", function()
  local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"
  local _, prc = T.sh(PY .. " -c 'import transformers, torch'")
  if prc ~= 0 then T.skip("transformers not importable by " .. PY .. " (scripts/requirements-test.txt)") end
  local st, pretrained = require "bertlua.io.safetensors", require "bertlua.pretrained"
  local b = { input_ids = bl.from({ { 2, 14, 27, 90, 3, 55, 61, 3 }, { 2, 8, 9, 3, 40, 3, 0, 0 } }, { dtype = "i32" }),
    token_type_ids = bl.from({ { 0, 0, 0, 0, 0, 1, 1, 1 }, { 0, 0, 0, 0, 1, 1, 0, 0 } }, { dtype = "i32" }),
    attention_mask = bl.from({ { 1, 1, 1, 1, 1, 1, 1, 1 }, { 1, 1, 1, 1, 1, 1, 0, 0 } }, { dtype = "i32" }) }
  for _, p in ipairs { "fp32", "bf16" } do
    local name = p == "fp32" and "cuda" or "bf16_cuda"
    local dir = tmp .. "/" .. name
    if not io.open(dir .. "/phase1/model.safetensors") then
      run(name, "--batch1=8 --micro-batch=8 --steps1=20 --eval-batches=1 --device=cuda --precision=" .. p)
    end
    st.save(dir .. "/batch.safetensors", b)
    local out, rc = T.sh(PY .. " tools/peers/bert_reference.py hf_check '" .. dir .. "/phase1'")
    if rc == 77 then T.skip(out) end
    T.eq(rc, 0, "transformers load failed: " .. out)
    local ref = st.load(dir .. "/hf_out.safetensors")
    local m = pretrained.from_pretrained(dir .. "/phase1", { head = "pretraining" })
    m:eval()
    local o = m:forward(b)
    local seq = o.sequence_output
    local V = m.bert.embeddings.word_embeddings.weight:size(1)
    local logits = m.cls.predictions:forward(seq:contiguous():view({ 16, seq:size(3) }),
      m.bert.embeddings.word_embeddings.weight):view({ 2, 8, V })
    local function chk(what, a, r)
      local err = (a:to("f64") - r:to("f64")):abs():max() / r:to("f64"):abs():max()
      T.truthy(err < 1e-5, ("%s, %s differs from transformers: relative error %.3g"):format(p, what, err))
    end
    chk("last hidden state", seq, ref.last_hidden)
    chk("MLM logits", logits, ref.prediction_logits)
    chk("NSP logits", o.nsp_logits, ref.seq_relationship_logits)
  end
end)

T.run()
