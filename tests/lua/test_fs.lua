-- bertlua.util.fs: the run-directory lock, unique directories, same-file checks for outputs, realpath, and the
-- whole-file reader that refuses FIFOs.
local T = require "testing"
local fs = require "bertlua.util.fs"
local shell = require "bertlua.util.shell"

T.test("lock_dir: one holder per directory, named by pid; released, it can be taken again", function()
  local dir = T.tmpdir() .. "/run"
  local release = fs.lock_dir(dir, "pretrain")
  T.truthy(fs.is_dir(dir), "the directory is created")
  -- another open file description, in this process and in another one, is refused
  T.raises(function() fs.lock_dir(dir, "glue") end, "glue: " .. dir .. " is in use by another run (pid ")
  local code = ("local fs = require 'bertlua.util.fs'; fs.lock_dir(%q, 'squad')"):format(dir)
  local out, ok = shell.read({ T.exe(), "-e", code }, { stderr = "stdout" })
  T.eq(ok, false)
  T.truthy(out:find("is in use by another run (pid " .. require("ffi").C.getpid() .. ")", 1, true), out)
  release()
  local _, ok2 = shell.read({ T.exe(), "-e", code }, { stderr = "stdout" })
  T.eq(ok2, true)
end)

T.test("unique_dir: new, distinct, named prefix-PID-random", function()
  local base = T.tmpdir()
  local a, b = fs.unique_dir(base .. "/.tmp-x"), fs.unique_dir(base .. "/.tmp-x")
  T.truthy(a ~= b and fs.is_dir(a) and fs.is_dir(b), a .. " " .. b)
  T.truthy(a:match("/%.tmp%-x%-%d+%-%w+$"), a)
end)

T.test("same_file and check_output: symlinks, '..' and hard links are the same file", function()
  local d = T.tmpdir()
  T.write_file(d .. "/in.txt", "x\n")
  shell.run { "ln", "-s", "in.txt", d .. "/sym.txt" }
  shell.run { "ln", d .. "/in.txt", d .. "/hard.txt" }
  fs.mkdir_p(d .. "/sub")
  for _, p in ipairs { d .. "/sym.txt", d .. "/hard.txt", d .. "/sub/../in.txt" } do
    T.truthy(fs.same_file(p, d .. "/in.txt"), p)
    T.raises(function() fs.check_output("predict", { "--output", p }, { { "--input", d .. "/in.txt" } }) end,
      "predict: --output=" .. p .. " is the same file as --input=" .. d .. "/in.txt")
  end
  T.eq(fs.same_file(d .. "/absent", d .. "/in.txt"), false)
  T.eq(fs.check_output("x", { "--output", d .. "/out.txt" }, { { "--input", d .. "/in.txt" } }), d .. "/out.txt")
end)

T.test("realpath: symlinks and '..' resolved, a missing tail kept", function()
  local d = fs.realpath(T.tmpdir())
  shell.run { "ln", "-s", d, d .. "/link" }
  T.eq(fs.realpath(d .. "/link/a/../b"), d .. "/b")
  T.eq(fs.realpath(d .. "/new\nline/x"), d .. "/new\nline/x")
  T.truthy(fs.inside(d .. "/link/sub", d))
end)

T.test("read: a FIFO is refused at once, naming it; a file reads whole", function()
  local d = T.tmpdir()
  shell.run { "mkfifo", d .. "/fifo" }
  local text, err = fs.read(d .. "/fifo", "vocab")
  T.eq(text, nil)
  T.truthy(err:find("vocab " .. d .. "/fifo is a FIFO", 1, true), err)
  local big = ("0123456789"):rep(300000)
  T.write_file(d .. "/big", big)
  T.eq(fs.read(d .. "/big"), big)
  T.eq(select(2, fs.read(d .. "/absent")):find("No such file", 1, true) ~= nil, true)
  T.raises(function() fs.read_text(d .. "/fifo", "glue") end, "glue: data file " .. d .. "/fifo is a FIFO")
end)

T.run()
