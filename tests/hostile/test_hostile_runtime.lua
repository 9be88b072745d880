-- Hostile-input suite, round two, runtime half (issue 33): long lines, option
-- values and stray arguments, unclear errors, the Lua API, duplicate SQuAD
-- ids, signals at random moments, ranks that disagree. The fixtures, the
-- classifier and the report live in harness.lua beside this file.
package.path = arg[0]:gsub("[^/]*$", "") .. "?.lua;" .. package.path
local H = require "harness"

local fx, case, R = H.fx, H.case, H.R

-- ---------------------------------------------------------------- giant inputs
-- truncate_pair removed tokens from the front with table.remove: 1 MB took 26 s, 4 MB over 300 s (quadratic);
-- linear, the 50 MB line takes seconds, far inside the limit
case { class = "giant input", name = "create_pretraining_data.lua: one line of 50 MB", timeout = 150,
  setup = function(d)
    os.execute("mkdir -p " .. d .. "/in")
    local f = assert(io.open(d .. "/in/train_0.txt", "wb"))
    f:write("a title\n")
    local piece = H.big_text(50000) .. " "
    for _ = 1, math.ceil(50e6 / #piece) do f:write(piece) end
    f:write("\n\nanother document\nthe river trade.\n")
    f:close()
    return ("%screate_pretraining_data.lua --input=%s/in --vocab=%s --output=%s/out --dupe-factor=1 "
      .. "--max-seq-length=64 --max-predictions=10"):format(R, d, fx.vocab, d)
  end,
  check = function(d, out)
    return io.open(d .. "/out/train_0.blshard") ~= nil and out:find("instances", 1, true) ~= nil, "no shard written"
  end }

H.report("hostile inputs, round two (runtime): no hang, no crash, no silent wrong result")
