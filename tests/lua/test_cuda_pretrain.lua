-- recipes/pretrain.lua --device=cuda against --device=cpu on the tiny corpus of
-- pretrain_fixture (2 layers, hidden 64, S=32), same seed and data:
--  - fp32, 20 steps: every step's loss within 1e-5 relative (the kernels
--    compute in f32 like the CPU ops, with other summation orders: ~1e-6 per
--    step; test_cuda_ops bounds each op), and the saved models give the same
--    MLM loss on a held-out batch; bf16 and fp16 within 1e-3 (see below);
--  - a run SIGKILLed on cuda and resumed on cuda gives the uninterrupted run's
--    losses bit for bit; the same checkpoint resumes on the cpu, and a cpu
--    checkpoint resumes on cuda; batches reach the GPU through the pinned,
--    copy-stream input pipeline (DeviceLoader);
--  - the cuda-trained model loads into transformers with the same outputs;
--  - the step stays on the device: from the emulated runtime's counters in the
--    log, no cudaMalloc/cudaFree after step 1 and at most one host wait per
--    logged step (fp32, bf16, fp16 with skipped steps, log every step or every
--    4th: test_cuda_step.lua); fp16 with overflows forced skips the same steps
--    as on the cpu.
--  (test_cuda_pretrain_dp: 2 ranks over NCCL equal 1 rank with accumulation 2.)
-- Needs a CUDA device (the emulated one in CI); skipped otherwise.
local T = require "testing"
local bl = require "bertlua"
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
  local bert = require "bertlua.bert"
  local loader = require("bertlua.data.loader").Loader{ dir = tmp .. "/data", split = "test", batch_size = 4,
    max_seq_length = 32, max_predictions = 5, shuffle = false }
  local batch = loader:next()
  loader:close()
  local function mlm(dir)
    local m = bert.from_pretrained(dir, { head = "pretraining" })
    m:eval()
    return m:forward(batch).mlm_loss
  end
  local a, b = mlm(tmp .. "/cpu/phase1"), mlm(tmp .. "/cuda/phase1")
  T.truthy(rel(b, a) <= 1e-5, ("held-out MLM loss of the saved models: cuda-trained %.9g cpu-trained %.9g")
    :format(b, a))
end)

-- bf16/fp16: the model computes from a half copy of the weights with half
-- activations on both devices; an f32 difference of one ulp upstream can flip
-- the rounding of an element to half (2^-9 relative for bf16, 2^-12 for fp16),
-- and the loss averages thousands of such elements: 1e-3 relative per step
-- bounds it (observed: 5e-6).
-- fp16 starts at the largest scale (2^24) and grows it after 3 clean steps, so that gradients overflow f16 at
-- several steps: the scaler, decided on the device, must skip exactly the steps the cpu skips. fp16 accumulates 2
-- micro-batches of 4 in the gradient buffer (the loss scale seeds both backward calls; the skip sees their sum).
T.test("bf16 and fp16 (loss scaling, forced overflows, accumulation 2): 20 steps on cuda track the cpu within 1e-3",
  function()
  for _, p in ipairs { "bf16", "fp16" } do
    local args = ("--batch1=8 --micro-batch=%d --steps1=20 --eval-batches=1 --checkpoint-interval=0 --precision=%s")
      :format(p == "fp16" and 4 or 8, p)
    if p == "fp16" then args = args .. " --loss-scale=dynamic:16777216:3" end
    run(p .. "_cpu", args .. " --device=cpu")
    run(p .. "_cuda", args .. " --device=cuda")
    local c, g = losses(tmp .. "/" .. p .. "_cpu"), losses(tmp .. "/" .. p .. "_cuda")
    for s = 1, 20 do
      T.truthy(g[s] and rel(g[s], c[s]) <= 1e-3, ("%s step %d: cuda %.9g cpu %.9g"):format(p, s, g[s] or 0 / 0, c[s]))
    end
    local rc, rg, skips = records(tmp .. "/" .. p .. "_cpu"), records(tmp .. "/" .. p .. "_cuda"), 0
    for i, r in ipairs(rc) do
      T.eq(rg[i].skipped, r.skipped, ("%s step %d: skipped on cuda / cpu"):format(p, r.step))
      T.eq(rg[i].loss_scale, r.loss_scale, ("%s step %d: loss scale on cuda / cpu"):format(p, r.step))
      skips = skips + (r.skipped or 0)
    end
    if p == "fp16" then T.truthy(skips >= 2 and skips < 20, "fp16 skipped " .. skips .. " of 20 steps") end
    step_stays_on_device(tmp .. "/" .. p .. "_cuda", p)
  end
end)

T.test("SIGKILL on cuda, --resume: the same losses bit for bit; the checkpoint resumes on cpu", function()
  local args = "--batch1=8 --micro-batch=8 --steps1=10 --device=cuda"
  run("full", args)
  -- killed at some step after the step-5 checkpoint: steps from there on are recomputed
  local n = fx.kill_at(tmp .. "/part", args, 6 + os.time() % 3)
  T.truthy(n >= 6 and n < 10, "killed at step " .. n)
  os.execute(("cp -r %s/part %s/part_cpu"):format(tmp, tmp))
  local out = run("part", args .. " --resume")
  T.truthy(out:find("resumed from", 1, true), out)
  local full, resumed = losses(tmp .. "/full"), losses(tmp .. "/part")
  for s = 1, 10 do T.eq(resumed[s], full[s], "step " .. s) end
  run("part_cpu", "--batch1=8 --micro-batch=8 --steps1=10 --device=cpu --resume")
  local on_cpu = losses(tmp .. "/part_cpu")
  for s = 6, 10 do
    T.truthy(rel(on_cpu[s], full[s]) <= 1e-5, ("step %d: resumed on cpu %.9g, cuda %.9g"):format(s, on_cpu[s], full[s]))
  end
  -- and the other way: a checkpoint made on the cpu resumes on cuda
  local cargs = "--batch1=8 --micro-batch=8 --steps1=10 --device=cpu"
  run("full_cpu", cargs)
  T.truthy(fx.kill_at(tmp .. "/part_from_cpu", cargs, 6) >= 6)
  run("part_from_cpu", "--batch1=8 --micro-batch=8 --steps1=10 --device=cuda --resume")
  local fc, on_cuda = losses(tmp .. "/full_cpu"), losses(tmp .. "/part_from_cpu")
  for s = 6, 10 do
    T.truthy(rel(on_cuda[s], fc[s]) <= 1e-5, ("step %d: resumed on cuda %.9g, cpu %.9g"):format(s, on_cuda[s], fc[s]))
  end
end)

-- The model trained on cuda in the fp32 test, saved as a Hugging Face directory, loaded by transformers
-- (BertForPreTraining): the same last hidden state, MLM and NSP logits as bertlua's on a fixed batch.
-- Both compute in f32 with other summation orders: 1e-5 relative to the largest value (test_safetensors).
T.test("the cuda-trained model loads into transformers with the same outputs", function()
  local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"
  local _, prc = T.sh(PY .. " -c 'import transformers, torch'")
  if prc ~= 0 then T.skip("transformers not importable by " .. PY .. " (scripts/requirements-test.txt)") end
  if not io.open(tmp .. "/cuda/phase1/model.safetensors") then
    run("cuda", "--batch1=8 --micro-batch=8 --steps1=20 --eval-batches=1 --device=cuda")
  end
  local st, bert = require "bertlua.io.safetensors", require "bertlua.bert"
  local b = { input_ids = bl.from({ { 2, 14, 27, 90, 3, 55, 61, 3 }, { 2, 8, 9, 3, 40, 3, 0, 0 } }, { dtype = "i32" }),
    token_type_ids = bl.from({ { 0, 0, 0, 0, 0, 1, 1, 1 }, { 0, 0, 0, 0, 1, 1, 0, 0 } }, { dtype = "i32" }),
    attention_mask = bl.from({ { 1, 1, 1, 1, 1, 1, 1, 1 }, { 1, 1, 1, 1, 1, 1, 0, 0 } }, { dtype = "i32" }) }
  st.save(tmp .. "/cuda/batch.safetensors", b)
  local out, rc = T.sh(PY .. " recipes/peers/bert_reference.py hf_check '" .. tmp .. "/cuda/phase1'")
  if rc == 77 then T.skip(out) end
  T.eq(rc, 0, "transformers load failed: " .. out)
  local ref = st.load(tmp .. "/cuda/hf_out.safetensors")
  local m = bert.from_pretrained(tmp .. "/cuda/phase1", { head = "pretraining" })
  m:eval()
  local o = m:forward(b)
  local seq = o.sequence_output
  local V = m.bert.embeddings.word_embeddings.weight:size(1)
  local logits = m.cls.predictions:forward(seq:contiguous():view({ 16, seq:size(3) }),
    m.bert.embeddings.word_embeddings.weight):view({ 2, 8, V })
  local function chk(name, a, r)
    local err = (a:to("f64") - r:to("f64")):abs():max() / r:to("f64"):abs():max()
    T.truthy(err < 1e-5, ("%s differs from transformers: relative error %.3g"):format(name, err))
  end
  chk("last hidden state", seq, ref.last_hidden)
  chk("MLM logits", logits, ref.prediction_logits)
  chk("NSP logits", o.nsp_logits, ref.seq_relationship_logits)
end)

T.run()
