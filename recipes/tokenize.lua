-- tokenize.lua: BERT WordPiece-tokenize text from stdin to stdout.
--   bertlua recipes/tokenize.lua --vocab=vocab.txt [--cased] [--ids] [--basic] < text > tokens
-- One output line per input line ("\n"-separated): its tokens (or vocab ids
-- with --ids, or the basic tokens before WordPiece with --basic) separated by
-- single spaces. An empty or all-whitespace line gives an empty line; control
-- characters (NUL included) are dropped like the reference does; invalid UTF-8
-- is dropped too and counted on stderr. Exact to Hugging Face's slow
-- BertTokenizer (see lua/bertlua/data/tokenizer.lua). Options go to stderr, so
-- stdout carries only the tokens.
local options = require "bertlua.util.options"
local Tok = require "bertlua.data.tokenizer"

local spec = {
  { "vocab", "", "vocab.txt of the model (required)" },
  { "cased", false, "cased model: no lowercasing or accent stripping" },
  { "ids", false, "print vocab ids instead of tokens" },
  { "basic", false, "print the basic tokens (before WordPiece)" },
  { "chunk_mb", 4, "input read per step, in MB", int = false },
  { "quiet", false, "do not print options and totals on stderr" },
}
local opt = options.parse(arg, spec, { usage = "bertlua recipes/tokenize.lua --vocab=FILE [--cased] [--ids] < text" })
if opt.vocab == "" then
  io.stderr:write("tokenize: --vocab is required (see --help)\n")
  os.exit(2)
end
if not opt.quiet then io.stderr:write("tokenize options:\n", options.show(opt), "\n") end

local ok, tok = pcall(Tok.load, opt.vocab, { lower = not opt.cased })
if not ok then
  io.stderr:write("tokenize: ", tostring(tok), "\n")
  os.exit(1)
end
local mode = opt.basic and "basic" or (opt.ids and "ids" or "tokens")
local chunk = math.max(1, math.floor(opt.chunk_mb * 1024 * 1024))
local stdin, stdout = io.stdin, io.stdout
stdout:setvbuf("full", 1048576)
local carry, lines, bytes, invalid = "", 0, 0, 0
local t0 = os.clock()
while true do
  local block = stdin:read(chunk)
  if not block then break end
  bytes = bytes + #block
  -- tokenize whole lines only; a line split by the block boundary waits
  local cut = block:find("\n[^\n]*$")
  local text
  if cut then
    text = carry .. block:sub(1, cut)
    carry = block:sub(cut + 1)
  else
    carry = carry .. block
  end
  if text then
    local out, inv = tok:format(text, mode)
    invalid = invalid + inv
    stdout:write(out)
    local _, k = text:gsub("\n", "")
    lines = lines + k
  end
end
if #carry > 0 then
  local out, inv = tok:format(carry, mode)
  invalid = invalid + inv
  stdout:write(out)
  lines = lines + 1
end
stdout:flush()
if not opt.quiet then
  local dt = os.clock() - t0
  io.stderr:write(("tokenize: %d lines, %.1f MB in %.2f s CPU (%.1f MB/s), %d invalid UTF-8 sequences dropped\n")
  :format(
    lines, bytes / 1e6, dt, dt > 0 and bytes / 1e6 / dt or 0, invalid))
end
