local T = require "testing"
local options = require "bertlua.util.options"

local spec = {
  { "lr", 6e-3, "learning rate" },
  { "max_steps", 100, "steps" },
  { "phase", "both", "phase" },
  { "resume", false, "resume" },
  { "name", nil, "free text" },
}

T.test("defaults, --a=b, --a b, flags and --no-flag", function()
  local o = options.parse({ "--lr=1e-4", "--max-steps", "7", "--resume", "pos1", "--name=x=y" }, spec,
    { positional = true })
  T.eq(o.lr, 1e-4); T.eq(o.max_steps, 7); T.eq(o.resume, true); T.eq(o.phase, "both"); T.eq(o.name, "x=y")
  T.eq(o._positional[1], "pos1")
  T.eq(options.parse({ "--no-resume" }, spec).resume, false)
end)

T.test("bad values and unknown options are errors", function()
  T.raises(function() options.parse({ "--lr=fast" }, spec) end, "--lr expects a number, got 'fast'")
  T.raises(function() options.parse({ "--bogus=1" }, spec) end, "unknown option --bogus")
  T.raises(function() options.parse({ "--resume=maybe" }, spec) end, "expects true or false")
end)

T.test("typed options: ranges, integers, finite numbers, --threads, single dashes, --debug", function()
  local typed = {
    { "batch", 32, "sequences", int = true, min = 1 },
    { "lr", 2e-5, "learning rate", min = 0, above = true },
    { "warmup", 0.1, "proportion", min = 0, max = 1 },
    { "seed", 42, "seed" },
    { "threads", 0, "threads" },
  }
  local function bad(args, words) T.raises(function() options.parse(args, typed, { name = "r" }) end, words) end
  bad({ "--batch=0" }, "r: option --batch=0: must be >= 1")
  bad({ "--batch=-3" }, "--batch=-3: must be >= 1")
  bad({ "--batch=2.5" }, "--batch=2.5: must be an integer")
  bad({ "--lr=0" }, "--lr=0: must be > 0")
  bad({ "--lr=1e999" }, "--lr=inf: must be a finite number")
  bad({ "--seed=1e999" }, "--seed=inf: must be a finite number")
  bad({ "--seed=-1e999" }, "--seed=-inf: must be a finite number")
  bad({ "--warmup=1.5" }, "--warmup=1.5: must be <= 1")
  bad({ "--threads=100000" }, "--threads=100000: must be an integer from 0 to")
  bad({ "-lr=3" }, "-lr=3: options start with two dashes (--lr=3)")
  bad({ "--config=" .. T.tmpdir() .. "/none.json" }, "cannot open config file")
  -- an integer default makes an integer option (int = false: a real one); a value without its option
  bad({ "--seed=2.5" }, "--seed=2.5: must be an integer")
  T.eq(options.parse({ "--secs=2.5" }, { { "secs", 0, "seconds", int = false } }).secs, 2.5)
  bad({ "stray" }, "r: stray argument 'stray': options are --name=VALUE")
  T.raises(function() options.parse({ "--name", "=", "x" }, spec, { name = "r" }) end,
    "r: '--name =': write --name=VALUE without spaces")
  T.raises(function() options.parse({ "--name" }, spec, { name = "r" }) end, "r: option --name needs a value")
  T.raises(function() options.parse({ "--phase", "--resume" }, spec, { name = "r" }) end, "--phase needs a value")
  local phase = { { "phase", "both", "1, 2 or both", choices = { "1", "2", "both" } } }
  T.raises(function() options.parse({ "--phase=3" }, phase, { name = "r" }) end,
    "r: option --phase=3: must be 1, 2, both")
  T.eq(options.parse({ "--phase=2" }, phase).phase, "2")
  local o = options.parse({ "--batch=8", "--debug", "--lr", "0.5" }, typed)
  T.eq(o.batch, 8); T.eq(o.lr, 0.5); T.eq(o.debug, nil)
  -- a config file's values are checked like the command line's
  local dir = T.tmpdir()
  T.write_file(dir .. "/c.json", '{"batch": 0}')
  bad({ "--config=" .. dir .. "/c.json" }, "--batch=0: must be >= 1")
  T.write_file(dir .. "/o.json", '{"name": {}}')
  T.raises(function() options.parse({ "--config=" .. dir .. "/o.json" }, spec, { name = "r" }) end,
    "r: option --name expects a string, got a JSON object or array")
end)

T.test("config files, JSON and Lua; command line wins", function()
  local p = os.tmpname() .. ".json"
  local f = io.open(p, "w"); f:write('{"lr": 0.5, "phase": "1"}'); f:close()
  local o = options.parse({ "--config=" .. p, "--phase=2" }, spec)
  T.eq(o.lr, 0.5); T.eq(o.phase, "2")
  os.remove(p)
  p = os.tmpname() .. ".lua"
  f = io.open(p, "w"); f:write('return { max_steps = 3, bogus = 1 }'); f:close()
  T.raises(function() options.parse({ "--config", p }, spec) end, "unknown option 'bogus'")
  os.remove(p)
  T.raises(function() options.parse({ "--config=/nonexistent.lua" }, spec) end, "cannot open config file")
  -- a model's config.json given as --config is named as such; no recipe may declare its own --config
  p = os.tmpname() .. ".json"
  f = io.open(p, "w"); f:write('{"vocab_size": 30522, "hidden_size": 768, "num_attention_heads": 12}'); f:close()
  T.raises(function() options.parse({ "--config=" .. p }, spec) end,
    "is a model configuration, but --config takes a file of option values: give the model's directory")
  os.remove(p)
  T.raises(function() options.parse({}, { { "config", "", "a model config" } }) end, "--config is reserved")
end)

T.test("help text lists every option", function()
  local h = options.help(spec, { usage = "usage: x" })
  T.truthy(h:find("--max-steps", 1, true) and h:find("default 100", 1, true), h)
  T.truthy(h:find("a Lua or JSON file of option values (not a model's config.json)", 1, true), h)
end)

T.run()
