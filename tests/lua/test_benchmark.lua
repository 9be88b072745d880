-- recipes/benchmark.lua's comparison with a CPU peer, --rounds: ours and the peer's timed blocks alternate through
-- one peer process, each round's ratio and their median are printed; a peer that stops early or is skipped.
-- The peers here are stand-ins (shell scripts passed as --python) that speak the protocol of
-- tools/peers/bert_reference.py's time_rounds with known rates, so the arithmetic is checked exactly and no
-- torch is needed; test_benchmark_peers below runs the real torch peer when it is there.
local T = require "testing"

local exe = T.exe()
local tmp = T.tmpdir("bench")
local common = "--model=tiny --seq=32 --batch=4 --steps=2 --warmup=1 --threads=2"

-- a stand-in peer: prints its arguments and "ready", then one result per "go" from `rates` ({seq/s, p50 ms} pairs)
-- until they run out; `rounds1`: no protocol, one result at once (--rounds=1)
local function fake_peer(name, rates, opts)
  opts = opts or {}
  local lines, label = { "#!/bin/sh", 'echo "peer args: $*"' }, opts.label or "torch"
  if opts.skip then
    lines[#lines + 1] = 'echo "skipped: torch not importable (stand-in)"; exit 77'
  elseif opts.rounds1 then
    lines[#lines + 1] = ('echo "torch: %.2f seq/s (1.0 ms/step, p50 %.1f ms, 2 threads)"'):format(rates[1][1],
      rates[1][2])
  else
    lines[#lines + 1] = "echo ready"
    for _, r in ipairs(rates) do
      lines[#lines + 1] = 'read line || exit 0; [ "$line" = go ] || exit 0'
      lines[#lines + 1] = ('echo "%s: %.2f seq/s (1.0 ms/step, p50 %.1f ms, 2 threads)"'):format(label, r[1], r[2])
    end
    if opts.dies then lines[#lines + 1] = "exit 3" end
  end
  local path = tmp .. "/bench/" .. name
  T.write_file(path, table.concat(lines, "\n") .. "\n")
  os.execute("chmod +x " .. path)
  return path
end

-- recipe: another copy of benchmark.lua (its tree decides where the peers and .venv-peers are)
local function run(extra, recipe)
  return T.sh(("%s %s %s %s 2>&1"):format(exe, recipe or "recipes/benchmark.lua", common, extra))
end
local function ours_blocks(out)
  local t = {}
  for rate, p50 in out:gmatch("\nbertlua: ([%d%.]+) seq/s %([%d%.]+ ms/step, p50 ([%d%.]+) ms") do
    t[#t + 1] = { tonumber(rate), tonumber(p50) }
  end
  return t
end
local function median(t)
  table.sort(t)
  return #t % 2 == 1 and t[(#t + 1) / 2] or (t[#t / 2] + t[#t / 2 + 1]) / 2
end
local function round2(x) return math.floor(x * 100 + 0.5) / 100 end

T.test("--rounds=3 alternates ours and the peer's blocks and prints the median ratio", function()
  local theirs = { { 10, 100 }, { 40, 25 }, { 20, 50 } }
  local out, rc = run("--rounds=3 --compare=torch --python=" .. fake_peer("peer3", theirs))
  T.eq(rc, 0, out)
  T.truthy(out:find("--rounds 3", 1, true) and out:find("--steps 2", 1, true), out)
  -- the order: the peer's setup, then ours, the peer's, the round's ratio, three times
  local order = {}
  for line in out:gmatch("[^\n]+") do
    local tag = line:match("^(bertlua):") or line:match("^(torch):") or line:match("^(round) %d") or
      (line == "ready" and "ready")
    if tag then order[#order + 1] = tag end
  end
  T.eq(table.concat(order, " "), "ready bertlua torch round bertlua torch round bertlua torch round", out)
  local ours = ours_blocks(out)
  T.eq(#ours, 3, out)
  local ratios, by_p50 = {}, {}
  for r = 1, 3 do
    ratios[r] = ours[r][1] / theirs[r][1]
    by_p50[r] = theirs[r][2] / ours[r][2]
    local line = out:match("round " .. r .. ": ratio bertlua/torch ([%d%.]+)x")
    -- printed rounding of our rate (2 decimals) and of the ratio: within 1 in the last printed digit
    T.truthy(line and math.abs(tonumber(line) - ratios[r]) <= 0.011, ("round %d: %s vs %g"):format(r,
      tostring(line), ratios[r]))
  end
  local med = tonumber(out:match("ratio bertlua/torch: ([%d%.]+)x, the median of 3 alternating rounds"))
  T.truthy(med and math.abs(med - round2(median(ratios))) <= 0.011, out)
  local med50 = tonumber(out:match("by p50 latency ([%d%.]+)x"))
  T.truthy(med50 and math.abs(med50 - round2(median(by_p50))) <= 0.011, out)
end)

T.test("a peer that stops after one round: the ratio of the rounds it ran, and a clean exit", function()
  local out, rc = run("--rounds=3 --compare=torch --python=" .. fake_peer("peer_dies", { { 10, 100 } },
    { dies = true }))
  T.eq(rc, 0, out)
  T.truthy(out:find("the median of 1 alternating rounds", 1, true), out)
  T.eq(#ours_blocks(out), 2, out)   -- round 2's block ran before the peer was found gone
end)

T.test("a skipped peer: said so, ours still timed", function()
  local out, rc = run("--rounds=2 --compare=torch --python=" .. fake_peer("peer_skip", {}, { skip = true }))
  T.eq(rc, 0, out)
  T.truthy(out:find("torch comparison failed or skipped", 1, true), out)
  T.eq(#ours_blocks(out), 1, out)
end)

T.test("--rounds=1: one peer call after our block, ratio and p50 ratio", function()
  local out, rc = run("--compare=torch --python=" .. fake_peer("peer1", { { 10, 100 } }, { rounds1 = true }))
  T.eq(rc, 0, out)
  T.truthy(not out:find("--rounds", 1, true), out)
  local ours = ours_blocks(out)
  T.eq(#ours, 1, out)
  local ratio = tonumber(out:match("ratio bertlua/torch: ([%d%.]+)x; by p50 latency"))
  T.truthy(ratio and math.abs(ratio - ours[1][1] / 10) <= 0.011, out)
end)

T.test("--peer-precision: our fp32 training step against the peer's bf16", function()
  local out, rc = run("--compare=torch --peer-precision=bf16 --python=" .. fake_peer("peer_bf16", { { 10, 100 } },
    { rounds1 = true }))
  T.eq(rc, 0, out)
  T.truthy(out:find("peer precision: bf16 (bertlua: fp32)", 1, true), out)
  T.truthy(out:find("--precision bf16", 1, true) and out:find(", cpu, fp32\n"), out)
  T.truthy(out:find("ratio bertlua/torch: [%d%.]+x"), out)
end)

T.test("--rounds without a peer: blocks and their median", function()
  local out, rc = run("--rounds=3")
  T.eq(rc, 0, out)
  local ours = ours_blocks(out)
  T.eq(#ours, 3, out)
  local rates = {}
  for i, r in ipairs(ours) do rates[i] = r[1] end
  local med = tonumber(out:match("bertlua over 3 blocks: median ([%d%.]+) seq/s"))
  T.truthy(med and math.abs(med - median(rates)) <= 0.011, out)
end)

T.test("--checkpoint-activations: the step recomputes the layers", function()
  T.truthy(run(""):find("activations: every layer's kept", 1, true), "without it")
  local out = run("--checkpoint-activations")
  T.truthy(out:find("activations: each layer's recomputed in the backward", 1, true), out)
  T.truthy(out:find("bertlua: [%d.]+ seq/s"), out)
end)

T.test("bad options: one line each, before any work", function()
  for _, c in ipairs({
    { "--rounds=0", "--rounds=0: must be >= 1" },
    { "--compare=tensorflow", "--compare must be torch, torch-compile, onnxruntime, openvino or empty" },
    { "--compare=onnxruntime", "--compare=onnxruntime times inference on the cpu" },
    { "--compare=openvino", "--compare=openvino times inference on the cpu" },
    { "--infer --compare=torch --precision=int8", "--compare=torch has no int8 on the cpu (it has fp32, bf16); "
      .. "--peer-precision picks another" },
    { "--infer --compare=onnxruntime --precision=bf16", "--compare=onnxruntime has no bf16 on the cpu (it has "
      .. "fp32, int8)" },
    { "--compare=torch --peer-precision=int8", "--compare=torch has no int8 on the cpu (it has fp32, bf16)" },
    { "--peer-precision=bf16", "--peer-precision is for a cpu --compare" },
    { "--precision=bf16 --compare=torch", "a cpu training step is fp32, --peer-precision=bf16 times it" },
  }) do
    local out, rc = run(c[1])
    T.truthy(rc ~= 0 and out:find(c[2], 1, true), c[1] .. ": " .. out)
    T.truthy(not out:find("traceback", 1, true) and not out:find("bertlua: [%d%.]+ seq/s"), out)
  end
end)

-- a copy of the recipe in a tree of its own, with a stand-in .venv-peers/bin/python when `venv_peer` is given
local function recipe_tree(name, venv_peer)
  local root = tmp .. "/" .. name
  os.execute(("mkdir -p %s/recipes %s/.venv-peers/bin && cp recipes/benchmark.lua %s/recipes/"):format(root, root,
    root))
  if venv_peer then os.execute(("cp %s %s/.venv-peers/bin/python"):format(venv_peer, root)) end
  return root .. "/recipes/benchmark.lua"
end

T.test("today's peers: .venv-peers found beside the recipes, or one line saying how to make it", function()
  T.truthy(not os.getenv("BL_PEER_PYTHON"), "BL_PEER_PYTHON set: it overrides the default this checks")
  for _, c in ipairs({ "--compare=torch-compile", "--infer --compare=openvino" }) do
    local out, rc = run(c, recipe_tree("novenv"))
    T.truthy(rc ~= 0 and out:find("needs today's peers: make them with 'bash scripts/peers.sh' (.venv-peers/) or "
      .. "pass --python=PATH", 1, true), c .. ": " .. out)
    T.truthy(not out:find("traceback", 1, true) and not out:find("bertlua: [%d%.]+ seq/s"), out)
  end
  -- the venv's python is the default; a peer name with a '-' is read back (ratio printed)
  local out, rc = run("--rounds=2 --lengths=full --compare=torch-compile", recipe_tree("venv", fake_peer("venv_peer",
    { { 10, 100 }, { 20, 50 } }, { label = "torch-compile" })))
  T.eq(rc, 0, out)
  T.truthy(out:find("--compile --precision fp32", 1, true) and out:find("bert_reference.py bench", 1, true), out)
  T.truthy(out:find("--lengths 32,32,32,32", 1, true), out)   -- the same rows
  T.truthy(out:find("ratio bertlua/torch%-compile: [%d%.]+x, the median of 2 alternating rounds"), out)
end)

T.test("the real torch peer alternates with us (skipped without torch)", function()
  local out, rc = run("--rounds=2 --compare=torch")
  if out:find("torch comparison failed or skipped", 1, true) and out:find("skipped:", 1, true) then
    T.skip("torch not importable by " .. (os.getenv("BL_PYTHON") or "/usr/bin/python3"))
  end
  T.eq(rc, 0, out)
  T.truthy(out:find("round 2: ratio bertlua/torch [%d%.]+x, by p50 [%d%.]+x"), out)
  T.truthy(out:find("ratio bertlua/torch: [%d%.]+x, the median of 2 alternating rounds"), out)
end)

T.run()
