-- Checkpoints: atomic layout, keep-last-N, partial saves ignored, identity checks,
-- checksums (a bit flip is found) and falling back to the previous complete one.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local ckpt = require "bertlua.train.checkpoint"

local cfg = { vocab_size = 50, hidden_size = 16, num_hidden_layers = 1, num_attention_heads = 2,
  intermediate_size = 32, max_position_embeddings = 16 }
local dir = os.tmpname(); os.remove(dir)
T.at_exit(function() os.execute("rm -rf " .. dir) end)

T.test("save, list, latest and keep the last N", function()
  local m = bert.BertForPreTraining(cfg, { seed = 1 })
  local mom = bl.randn({ 10 }, { seed = 3 })
  for step = 10, 50, 10 do
    ckpt.save(dir, { step = step, model = m, tensors = { ["opt.m"] = mom },
      state = { phase = 1, rng = { seed = 1, offset = step * 1000 } }, identity = { optimizer = "lamb",
        world_size = 1 } }, { keep = 3 })
  end
  local l = ckpt.list(dir)
  T.eq(#l, 3); T.eq(l[1].step, 30); T.eq(l[3].step, 50)
  T.truthy(ckpt.latest(dir):find("ckpt%-00000050$"))
  local m2 = bert.BertForPreTraining(cfg, { seed = 2 })
  local c = ckpt.load(ckpt.latest(dir), { model = m2, identity = { optimizer = "lamb", world_size = 1 } })
  T.eq(c.step, 50); T.eq(c.state.rng.offset, 50000)
  T.eq((m2.flat_params - m.flat_params):abs():max(), 0)
  T.eq((c.tensors["opt.m"] - mom):abs():max(), 0)
end)

T.test("a partial checkpoint left by a crash is ignored and cleaned", function()
  os.execute("mkdir -p " .. dir .. "/.tmp-ckpt-00000060-1 " .. dir .. "/ckpt-00000070")  -- 70: no state.json
  T.truthy(ckpt.latest(dir):find("00000050$"), "newest complete one wins")
  local m = bert.BertForPreTraining(cfg, { seed = 1 })
  ckpt.save(dir, { step = 80, model = m }, { keep = 5 })
  local f = io.popen("ls -a " .. dir); local s = f:read("*a"); f:close()
  T.truthy(not s:find(".tmp-ckpt", 1, true), "temporary directories are removed: " .. s)
end)

T.test("mismatched identity or config is a clear error", function()
  local m = bert.BertForPreTraining(cfg, { seed = 1 })
  local path = dir .. "/ckpt-00000050"
  T.raises(function() ckpt.load(path, { identity = { optimizer = "adamw" } }) end,
    "made with optimizer = lamb, this run has adamw")
  T.raises(function() ckpt.load(path, { identity = { world_size = 4 } }) end, "world_size = 1, this run has 4")
  local other = bert.BertForPreTraining({ vocab_size = 50, hidden_size = 32, num_hidden_layers = 1,
    num_attention_heads = 2,
    intermediate_size = 32, max_position_embeddings = 16 }, { seed = 1 })
  T.raises(function() ckpt.load(path, { model = other }) end, "model.safetensors")
  local f = io.open(path .. "/state.json", "w"); f:write("{not json"); f:close()
  T.raises(function() ckpt.load(path, { model = m }) end, "not valid JSON")
  T.raises(function() ckpt.load(dir .. "/nope") end, "not a complete checkpoint")
end)

T.test("a bit flip in the newest checkpoint is found; load_latest falls back to the previous one", function()
  local d = dir .. "/flip"
  local m = bert.BertForPreTraining(cfg, { seed = 1 })
  local id = { optimizer = "lamb" }
  ckpt.save(d, { step = 1, model = m, identity = id }, { keep = 3 })
  local m2 = bert.BertForPreTraining(cfg, { seed = 9 })
  ckpt.save(d, { step = 2, model = m2, identity = id }, { keep = 3 })
  local newest = d .. "/ckpt-00000002/model.safetensors"
  local f = assert(io.open(newest, "r+b"))
  local size = f:seek("end")
  f:seek("set", size - 5)
  local b = f:read(1)
  f:seek("set", size - 5)
  f:write(string.char((b:byte() + 1) % 256))
  f:close()
  T.raises(function() ckpt.load(d .. "/ckpt-00000002", { model = m2, identity = id }) end, "is corrupt")
  local into = bert.BertForPreTraining(cfg, { seed = 5 })
  local c = ckpt.load_latest(d, { model = into, identity = id })
  T.eq(c.step, 1)
  T.eq((into.flat_params - m.flat_params):abs():max(), 0)
  -- another run's checkpoint is an error, not a reason to go back
  T.raises(function() ckpt.load_latest(d, { model = into, identity = { optimizer = "adamw" } }) end, "was made with")
  T.eq(ckpt.load_latest(dir .. "/none", { model = into }), nil)
end)

T.test("a checkpoint whose state the run cannot restore (a loader position past the data) falls back", function()
  local d = dir .. "/restore"
  local m = bert.BertForPreTraining(cfg, { seed = 1 })
  local id = { optimizer = "lamb" }
  ckpt.save(d, { step = 1, model = m, identity = id, state = { loader = { pos = 1 } } }, { keep = 3 })
  ckpt.save(d, { step = 2, model = m, identity = id, state = { loader = { pos = 1e12 } } }, { keep = 3 })
  local restored = {}
  local function restore(c)
    if c.state.loader.pos > 100 then error("data: loader state epoch 0 pos 1e12 is out of range", 2) end
    restored[#restored + 1] = c.step
  end
  T.raises(function() ckpt.load(d .. "/ckpt-00000002", { restore = restore }) end,
    "checkpoint: " .. d .. "/ckpt-00000002 cannot be restored: data: loader state epoch 0 pos 1e12 is out of range")
  local into = bert.BertForPreTraining(cfg, { seed = 5 })
  local c = ckpt.load_latest(d, { model = into, identity = id, restore = restore })
  T.eq(c.step, 1)
  T.eq(#restored, 1)
end)

T.test("a state.json without checksums is not trusted", function()
  local d = dir .. "/nosums"
  local m = bert.BertForPreTraining(cfg, { seed = 1 })
  local path = ckpt.save(d, { step = 1, model = m }, { keep = 3 })
  local cjson = require "cjson"
  local meta = cjson.decode(T.slurp(path .. "/state.json"))
  meta.checksums = nil
  T.write_file(path .. "/state.json", cjson.encode(meta))
  T.raises(function() ckpt.load(path, { model = m }) end, "has no checksums")
  meta.checksums = {}
  T.write_file(path .. "/state.json", cjson.encode(meta))
  T.raises(function() ckpt.load(path, { model = m }) end, "no checksum for model.safetensors")
end)

T.test("claim: another run's checkpoints are refused, naming what differs; the same run needs --resume", function()
  local d = dir .. "/claim"
  local m = bert.BertForPreTraining(cfg, { seed = 1 })
  local id = { optimizer = "lamb", run = { lr = 1e-3, steps = 10, data = "123" } }
  ckpt.claim(d, id, false, "pretrain")   -- nothing there yet
  ckpt.save(d, { step = 4, model = m, identity = id }, { keep = 3 })
  local ok, err = pcall(ckpt.claim, d, { optimizer = "lamb", run = { lr = 2e-3, steps = 10, data = "9" } }, true,
    "pretrain")
  T.eq(ok, false)
  T.truthy(err:find("holds checkpoints of another run", 1, true) and err:find("data = 123 there, 9 now", 1, true)
    and err:find("lr = 0.001 there, 0.002 now", 1, true), err)
  T.raises(function() ckpt.claim(d, id, false, "pretrain") end, "--resume continues it")
  ckpt.claim(d, id, true, "pretrain")
end)

T.run()
