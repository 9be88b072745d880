-- Download the data sets and vocabularies bertlua recipes use, with resume
-- (curl -C -) and checksum checks where the source publishes one.
--
--   bertlua recipes/download.lua --dataset=squad --output=data/squad
--   bertlua recipes/download.lua --dataset=wikipedia --output=data/wikipedia
--
-- Offline (or when a source refuses), it prints what to fetch and where to put it.
local options = require "bertlua.util.options"
local shell = require "bertlua.util.shell"
local fs = require "bertlua.util.fs"

local opt = options.parse(arg, {
  { "dataset", "squad", "wikipedia | bookcorpus | squad | glue | vocab" },
  { "output", "data", "directory to write into" },
  { "base_url", nil, "fetch every file from this mirror (same file names) instead of the official host" },
  { "retries", 3, "curl retries per file" },
  { "timeout", 30, "connect timeout in seconds", int = false },
  { "lang", "en", "Wikipedia language code" },
}, { usage = "usage: bertlua recipes/download.lua --dataset=NAME --output=DIR", name = "download" })

-- name, url, checksum {algo, hex} or checksum file {algo, url, name in it}
local function wiki(lang)
  local base = ("https://dumps.wikimedia.org/%swiki/latest/"):format(lang)
  local file = ("%swiki-latest-pages-articles.xml.bz2"):format(lang)
  return { { file = file, url = base .. file,
    checksum_file = { algo = "md5", url = base .. ("%swiki-latest-md5sums.txt"):format(lang) } } }
end

local SQUAD = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"
local DATASETS = {
  wikipedia = function() return wiki(opt.lang) end,
  squad = function() return {
    { file = "train-v1.1.json", url = SQUAD .. "train-v1.1.json" },
    { file = "dev-v1.1.json", url = SQUAD .. "dev-v1.1.json",
      sha256 = "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9" },
    { file = "train-v2.0.json", url = SQUAD .. "train-v2.0.json" },
    { file = "dev-v2.0.json", url = SQUAD .. "dev-v2.0.json" },
  } end,
  glue = function()
    local t = {}
    for _, task in ipairs({ "CoLA", "SST-2", "MRPC", "QQP", "STS-B", "MNLI", "QNLI", "RTE", "WNLI" }) do
      t[#t + 1] = { file = task .. ".zip", url = "https://dl.fbaipublicfiles.com/glue/data/" .. task .. ".zip",
        unzip = true }
    end
    return t
  end,
  vocab = function() return {
    { file = "bert-base-uncased-vocab.txt", url = "https://huggingface.co/bert-base-uncased/resolve/main/vocab.txt",
      sha256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3" },
    { file = "bert-base-cased-vocab.txt", url = "https://huggingface.co/bert-base-cased/resolve/main/vocab.txt",
      sha256 = "eeaa9875b23b04b4c54ef759d03db9d1ba1554838f8fb26c5d96fa551df93d02" },
  } end,
  bookcorpus = function() return nil end,
}

local function exists(p) local f = io.open(p, "rb"); if f then f:close() return true end return false end

local function digest(algo, path)
  return shell.read({ algo == "md5" and "md5sum" or "sha256sum", "--", path }, { stderr = "/dev/null" })
    :match("^(%x+)")
end

local function offline_help(files, why)
  io.stderr:write("download: " .. why .. "\n")
  io.stderr:write("Fetch these files yourself and put them in " .. opt.output .. "/ (then run this again to verify):\n")
  for _, f in ipairs(files) do
    io.stderr:write(("  %s\n      from %s%s\n"):format(f.file, f.url,
      f.sha256 and ("\n      sha256 " .. f.sha256) or ""))
  end
end

if opt.dataset == "bookcorpus" then
  print([[BookCorpus has no official download any more. Use your own copy of the books
(one .txt per book), or the public-domain stand-in that NVIDIA's scripts also accept:
Project Gutenberg books as plain UTF-8 text. Put the .txt files in one directory, then:
  bertlua recipes/prepare_bookcorpus.lua --input=DIR_OF_TXT --output=]] .. opt.output .. "/bookcorpus")
  os.exit(0)
end
local make = DATASETS[opt.dataset]
if not make then error("download: unknown dataset '" .. tostring(opt.dataset)
  .. "' (wikipedia, bookcorpus, squad, glue, vocab)", 0) end
local files = make()
print(options.show(opt))
fs.mkdir_p(opt.output)
if not shell.run({ "sh", "-c", "command -v curl" }, { stdout = "/dev/null", stderr = "stdout" }) then
  offline_help(files, "curl is not installed (apt-get install curl)")
  os.exit(1)
end

local function fetch(url, part)
  -- -C - resumes a partial file; a server without range support answers 33: start over
  local base = { "curl", "-fsSL", "--retry", tostring(opt.retries), "--connect-timeout", tostring(opt.timeout), "-o",
    part }
  local ok, code = shell.run { base, "-C", "-", "--", url }
  if not ok and code == 33 then
    os.remove(part)
    ok, code = shell.run { base, "--", url }
  end
  return ok, code
end

local failed = 0
for _, f in ipairs(files) do
  local url = opt.base_url and (opt.base_url:gsub("/$", "") .. "/" .. f.file) or f.url
  local dest = opt.output .. "/" .. f.file
  local expect_algo, expect = f.sha256 and "sha256", f.sha256
  if f.checksum_file then
    local sums = shell.read({ "curl", "-fsSL", "--connect-timeout", tostring(opt.timeout), "--",
      opt.base_url and (opt.base_url:gsub("/$", "") .. "/" .. f.checksum_file.url:match("[^/]+$"))
      or f.checksum_file.url }, { stderr = "/dev/null" })
    for line in sums:gmatch("[^\n]+") do
      local hex, name = line:match("^(%x+)%s+%*?(%S+)$")
      if name == f.file then expect_algo, expect = f.checksum_file.algo, hex end
    end
  end
  if exists(dest) and (not expect or digest(expect_algo, dest) == expect) then
    print(("  %s: already there%s"):format(f.file, expect and (", " .. expect_algo .. " ok") or ""))
  else
    if exists(dest) then os.rename(dest, dest .. ".part") end  -- a bad full file: resume/replace it
    io.stderr:write(("  %s <- %s\n"):format(f.file, url))
    local ok, code = fetch(url, dest .. ".part")
    if not ok then
      failed = failed + 1
      offline_help({ f }, ("could not fetch %s (curl exit %s)"):format(url, tostring(code)))
    else
      local got = expect and digest(expect_algo, dest .. ".part")
      if expect and got ~= expect then
        failed = failed + 1
        os.remove(dest .. ".part")
        io.stderr:write(("download: %s: %s checksum mismatch (expected %s, got %s); the file was removed\n")
          :format(f.file, expect_algo, expect, tostring(got)))
      else
        os.rename(dest .. ".part", dest)
        print(("  %s: done%s"):format(f.file, expect and (", " .. expect_algo .. " ok") or " (no published checksum)"))
        -- unzip has no "--": a path starting with "-" gets "./"
        if f.unzip then
          shell.run { "unzip", "-qo", (dest:gsub("^%-", "./-")), "-d", (opt.output:gsub("^%-", "./-")) }
        end
      end
    end
  end
end
if failed > 0 then
  io.stderr:write(("download: %d file(s) failed\n"):format(failed))
  os.exit(1)
end
