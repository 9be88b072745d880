-- `cmake --install` gives a relocatable tree whose bertlua finds its Lua library.
local T = require "testing"
local build = os.getenv("BL_BUILD_DIR")
if not build then T.skip_all("BL_BUILD_DIR not set (run through ctest)") end

T.test("installed host runs with no environment", function()
  local prefix = os.tmpname(); os.remove(prefix)
  local f = io.popen("cmake --install " .. build .. " --prefix " .. prefix .. " >/dev/null 2>&1 && cd / && env -i "
    .. prefix .. "/bin/bertlua -e 'local bl = require \"bertlua\"; print(package.path:match(\"^[^;]+\"), " ..
      "bl.ones({3}):sum())' 2>&1")
  local out = f:read("*a"); f:close()
  -- the benchmark recipes find their peers at recipes/../tools/peers, installed or not
  local peer = io.open(prefix .. "/share/bertlua/recipes/../tools/peers/bench_bert_torch.py")
  if peer then peer:close() end
  os.execute("rm -rf " .. prefix)
  T.truthy(peer, "tools/peers/bench_bert_torch.py is installed beside the recipes")
  T.truthy(out:find(prefix .. "/bin/../share/bertlua/lua/?.lua", 1, true), out)
  T.truthy(out:find("\t3", 1, true), out)
end)

T.run()
