-- GLUE TSV readers: the real dev files (counts from shared/data/SOURCES.md),
-- every task's layout on small hand-made files, and malformed rows.
local T = require "testing"
local glue = require "bertlua.tasks.glue"

local tmp = os.tmpname(); os.remove(tmp); os.execute("mkdir -p " .. tmp)
T.at_exit(function() os.execute("rm -rf " .. tmp) end)
local function write(name, text)
  local p = tmp .. "/" .. name
  local f = assert(io.open(p, "wb")); f:write(text); f:close()
  return p
end

local function glue_dir()
  local d = T.shared_data("glue")
  if not d then T.skip("shared data not found (set BL_SHARED_DATA)") end
  return d
end

local function count(ex, label)
  local n = 0
  for _, e in ipairs(ex) do if e.label == label then n = n + 1 end end
  return n
end

T.test("MRPC dev: BOM header, 408 rows, 279 label 1, quotes kept as text", function()
  local ex, rep = glue.read_split("mrpc", glue_dir() .. "/MRPC", "dev", { quiet = true })
  T.eq(#ex, 408); T.eq(rep.skipped, 0); T.eq(count(ex, "1"), 279)
  T.eq(ex[1].guid, "dev-1"); T.eq(ex[1].label, "1")
  T.eq(ex[1].text_a, "He said the foodservice pie business doesn't fit the company's long-term growth strategy.")
  T.eq(ex[1].text_b:sub(1, 20), "\"The foodservice pie")   -- quotechar=None: the quote is text
end)

T.test("CoLA dev: no header, no final newline, 1043 rows, 721 label 1", function()
  local ex, rep = glue.read_split("CoLA", glue_dir() .. "/CoLA", "dev", { quiet = true })
  T.eq(#ex, 1043); T.eq(rep.skipped, 0); T.eq(count(ex, "1"), 721)
  T.eq(ex[1].text_a, "The sailors rode the breeze clear of the rocks."); T.eq(ex[1].text_b, nil)
  T.eq(ex[1].guid, "dev-0")
  T.truthy(ex[#ex].text_a:find("himself%.$"), ex[#ex].text_a)
end)

T.test("SST-2 dev: header, 872 rows, 444 positive", function()
  local ex, rep = glue.read_split("sst2", glue_dir() .. "/SST-2", "dev", { quiet = true })
  T.eq(#ex, 872); T.eq(rep.skipped, 0); T.eq(count(ex, "1"), 444)
  T.eq(ex[1].text_a, "it 's a charming and often affecting journey . ")
end)

T.test("every task's layout (train/dev/test), CRLF, labels", function()
  local mnli_head = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t" ..
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
  local p = write("mnli_dev.tsv", mnli_head ..
    "7\t1\t2\tgov\tb1\tb2\tp1\tp2\tThe new rights are nice.\tEveryone loves " ..
      "them.\tneutral\tneutral\tx\ty\tz\tneutral\r\n" ..
    "8\t1\t2\tgov\tb1\tb2\tp1\tp2\tA\tB\tentailment\tx\tx\tx\tx\tcontradiction\r\n")
  local ex = glue.read_examples("mnli-mm", p, { quiet = true })
  T.eq(#ex, 2); T.eq(ex[1].guid, "dev-7"); T.eq(ex[1].text_b, "Everyone loves them."); T.eq(ex[2].label,
    "contradiction")
  T.eq(glue.split_file("mnli-mm", "dev"), "dev_mismatched.tsv"); T.eq(glue.split_file("MNLI", "dev"), "dev_matched.tsv")
  p = write("stsb.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n" ..
    "0\tmain\tf\t2012\t1\tnone\tnone\tA plane is taking off.\tAn air plane is taking off.\t5.000\n" ..
    "1\tmain\tf\t2012\t4\tnone\tnone\tA man.\tA woman.\tabc\n" ..
    "2\tmain\tf\t2012\t5\tnone\tnone\tA dog.\tA cat.\t1e999\n" ..
    "3\tmain\tf\t2012\t6\tnone\tnone\tA dog.\tA cat.\t-inf\n")
  local ex2, rep2 = glue.read_examples("sts-b", p, { quiet = true })
  T.eq(#ex2, 1); T.eq(ex2[1].label, 5.0); T.eq(rep2.skipped, 3)
  T.truthy(rep2.problems[1]:find("stsb.tsv:3: label 'abc' is not a number", 1, true), rep2.problems[1])
  T.truthy(rep2.problems[2]:find("stsb.tsv:4: label '1e999' is not a finite number", 1, true), rep2.problems[2])
  T.truthy(rep2.problems[3]:find("stsb.tsv:5: label '-inf' is not a finite number", 1, true), rep2.problems[3])
  T.eq(glue.is_regression("stsb"), true); T.eq(glue.num_labels("sts-b"), 1)
  p = write("qnli.tsv", "index\tquestion\tsentence\tlabel\n0\tWhat?\tThis.\tnot_entailment\n")
  ex = glue.read_examples("qnli", p); T.eq(ex[1].label, "not_entailment"); T.eq(ex[1].text_a, "What?")
  p = write("rte.tsv", "index\tsentence1\tsentence2\tlabel\n0\tA\tB\tentailment\n")
  ex = glue.read_examples("rte", p); T.eq(ex[1].label, "entailment")
  p = write("qqp.tsv",
    "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n5\t1\t2\tHow?\tWhy?\t1\n6\t3\t4\tonly one\n")
  local ex3, rep3 = glue.read_examples("qqp", p, { quiet = true })
  T.eq(#ex3, 1); T.eq(ex3[1].guid, "dev-5"); T.eq(ex3[1].text_b, "Why?")
  T.truthy(rep3.problems[1]:find("qqp.tsv:3: 4 columns, expected 6", 1, true), rep3.problems[1])
  p = write("wnli.tsv", "index\tsentence1\tsentence2\tlabel\n0\tA\tB\t0\n")
  T.eq(glue.read_examples("wnli", p)[1].label, "0")
  p = write("sst_test.tsv", "index\tsentence\n0\tgreat movie\n1\tbad\n")
  ex = glue.read_examples("sst-2", p, { set_type = "test" })
  T.eq(#ex, 2); T.eq(ex[2].text_a, "bad"); T.eq(ex[2].label, nil); T.eq(ex[2].guid, "test-1")
  T.eq(glue.label_id("mnli", "neutral"), 2); T.eq(glue.label_id("mrpc", "2"), nil)
  T.eq(#glue.labels("qnli"), 2)
end)

T.test("malformed rows are reported with file:line and skipped", function()
  local p = write("cola_bad.tsv", "gj04\t1\t\tGood sentence.\n" ..
    "gj04\t7\t\tBad label.\n" ..
    "gj04\t0\tToo many\tcolumns\there\n" ..
    "\n" ..
    "gj04\t0\t*\tLast one.")
  local lines = {}
  local ex, rep = glue.read_examples("cola", p, { quiet = true })
  T.eq(#ex, 2); T.eq(rep.rows, 5); T.eq(rep.skipped, 3)
  for _, l in ipairs(rep.problems) do lines[#lines + 1] = l end
  local all = table.concat(lines, "\n")
  for _, want in ipairs { p .. ":2: unknown label '7' (expected 0/1) (skipped)",
    p .. ":3: 5 columns, expected 4 (skipped)", p .. ":4: empty line (skipped)" } do
    T.truthy(all:find(want, 1, true), "missing: " .. want .. "\n" .. all)
  end
  T.raises(function() glue.read_examples("cola", tmp .. "/none.tsv") end, "glue: cannot open")
  T.raises(function() glue.read_examples("squad", p) end, "glue: unknown task 'squad'")
  T.raises(function() glue.read_examples("mrpc", write("empty.tsv", "")) end, "is empty")
  T.raises(function() glue.split_file("mrpc", "validation") end, "split must be train, dev or test")
end)

T.test("recipes/glue_eval.lua on MRPC dev", function()
  local exe = (os.getenv("BL_BUILD_DIR") or "build") .. "/bertlua"
  local ex = glue.read_split("mrpc", glue_dir() .. "/MRPC", "dev", { quiet = true })
  -- flip every 4th label: tp/fp/fn countable by hand from the data
  local lines, preds, labels = { "index\tprediction" }, {}, {}
  for i, e in ipairs(ex) do
    local p = (i % 4 == 0) and (e.label == "1" and "0" or "1") or e.label
    lines[#lines + 1] = (i - 1) .. "\t" .. p
    preds[i], labels[i] = p, e.label
  end
  local pf = write("mrpc_preds.tsv", table.concat(lines, "\n") .. "\n")
  local h = io.popen(exe .. " recipes/glue_eval.lua --task=mrpc --data=" .. glue_dir()
    .. "/MRPC/dev.tsv --predictions=" .. pf .. " 2>/dev/null")
  local out = h:read("*a"); h:close()
  local r = require("cjson").decode(out)
  T.near(r.acc, 306 / 408, 1e-15)   -- 102 of 408 flipped
  local tp, fp, fn = 0, 0, 0
  for i = 1, #preds do
    if preds[i] == "1" and labels[i] == "1" then tp = tp + 1 elseif preds[i] == "1" then fp = fp + 1
    elseif labels[i] == "1" then fn = fn + 1 end
  end
  T.near(r.f1, 2 * tp / (2 * tp + fp + fn), 1e-15)
  T.truthy(r.f1 > 0.5 and r.f1 < 0.95)
  local bad = write("bad_preds.tsv", "1\n0\n")
  h = io.popen(exe .. " recipes/glue_eval.lua --task=mrpc --data=" .. glue_dir() .. "/MRPC/dev.tsv --predictions="
    .. bad .. " 2>&1; echo rc=$?")
  out = h:read("*a"); h:close()
  T.truthy(out:find("2 predictions for 408 examples", 1, true) and out:find("rc=1", 1, true), out)
end)

T.run()
