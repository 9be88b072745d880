-- recipes/download.lua against a loopback HTTP server with range support:
-- fresh download, resume of a partial file, checksum mismatch, offline help.
local T = require "testing"
local exe = (os.getenv("BL_BUILD_DIR") or "build") .. "/bertlua"
local py = os.getenv("BL_PYTHON") or "python3"

local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = f:read("*a"); f:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end
if select(2, sh("command -v curl")) ~= 0 then T.skip_all("curl not installed") end

local tmp = os.tmpname(); os.remove(tmp); os.execute("mkdir -p " .. tmp .. "/srv " .. tmp .. "/out")
-- a 'vocab' file with the real name and a matching checksum is what the manifest expects;
-- we serve other bytes, so the sha256 check must fail for it: a good test of the mismatch path
local f = io.open(tmp .. "/srv/dev-v1.1.json", "wb")
local payload = string.rep("0123456789abcdef", 40000)
f:write(payload); f:close()
local portfile = tmp .. "/port"
os.execute(py .. " tests/py/range_http_server.py " .. tmp .. "/srv " .. portfile .. " > " .. tmp .. "/server.log 2>&1 &")
local port
for _ = 1, 100 do
  local pf = io.open(portfile); if pf then port = pf:read("*a"); pf:close(); break end
  os.execute("sleep 0.1")
end
if not port then T.skip_all("could not start the loopback HTTP server") end
local base = "http://127.0.0.1:" .. port

T.test("checksum mismatch removes the file and fails clearly", function()
  local out, rc = sh(exe .. " recipes/download.lua --dataset=squad --output=" .. tmp .. "/out --base-url=" .. base)
  T.eq(rc, 1)
  T.truthy(out:find("dev-v1.1.json: sha256 checksum mismatch", 1, true), out)
  T.truthy(out:find("could not fetch", 1, true), "missing files are reported: " .. out)
  local g = io.open(tmp .. "/out/dev-v1.1.json"); T.truthy(g == nil, "bad file must not be left")
end)

T.test("resume of a partial download gives the whole file", function()
  -- train-v1.1.json has no published checksum: served bytes are accepted
  local src = io.open(tmp .. "/srv/train-v1.1.json", "wb"); src:write(payload); src:close()
  -- the partial file holds different bytes, so a resumed file (and not a fresh one) is recognisable
  local head = string.rep("X", 100000)
  local part = io.open(tmp .. "/out/train-v1.1.json.part", "wb"); part:write(head); part:close()
  local out = sh(exe .. " recipes/download.lua --dataset=squad --output=" .. tmp .. "/out --base-url=" .. base)
  local g = io.open(tmp .. "/out/train-v1.1.json", "rb")
  T.truthy(g, "file present: " .. out)
  local got = g:read("*a"); g:close()
  T.eq(#got, #payload); T.truthy(got == head .. payload:sub(100001), "the download continued after the partial bytes")
end)

T.test("unreachable source prints what to fetch and where", function()
  local out, rc = sh(exe .. " recipes/download.lua --dataset=vocab --output=" .. tmp .. "/out2 --base-url=http://127.0.0.1:9 --retries=0 --timeout=2")
  T.eq(rc, 1)
  T.truthy(out:find("Fetch these files yourself", 1, true) and out:find("bert-base-uncased-vocab.txt", 1, true), out)
end)

T.test("bookcorpus explains the manual route; unknown dataset is an error", function()
  local out, rc = sh(exe .. " recipes/download.lua --dataset=bookcorpus --output=" .. tmp .. "/bc")
  T.eq(rc, 0); T.truthy(out:find("prepare_bookcorpus", 1, true), out)
  out, rc = sh(exe .. " recipes/download.lua --dataset=nope")
  T.eq(rc, 1); T.truthy(out:find("unknown dataset 'nope'", 1, true), out)
end)

T.at_exit(function() os.remove(portfile); os.execute("rm -rf " .. tmp) end)
T.run()
