local T = require "testing"
local syn = require "bertlua.data.synthetic"

T.test("deterministic world and documents", function()
  local a, b = syn.world{ seed = 3, countries = 10 }, syn.world{ seed = 3, countries = 10 }
  T.eq(a.countries[7].capital, b.countries[7].capital)
  T.truthy(syn.world{ seed = 4, countries = 10 }.countries[7].capital ~= a.countries[7].capital)
  local names = {}
  for _, c in ipairs(a.countries) do
    for _, k in ipairs({ "name", "capital", "river" }) do
      T.truthy(not names[c[k]], "names are unique: " .. c[k]); names[c[k]] = true
    end
  end
  T.eq(#syn.documents(a, { copies = 2 }), 20)
end)

T.test("QA answers are spans of their contexts; splits are disjoint", function()
  local w = syn.world{ seed = 1, countries = 20 }
  local train, dev = syn.squad(w, { split = "train" }), syn.squad(w, { split = "dev" })
  T.eq(#train.data, 16); T.eq(#dev.data, 4)
  local n = 0
  for _, art in ipairs(train.data) do
    for _, p in ipairs(art.paragraphs) do
      for _, qa in ipairs(p.qas) do
        local a = qa.answers[1]
        T.eq(p.context:sub(a.answer_start + 1, a.answer_start + #a.text), a.text)
        n = n + 1
      end
    end
  end
  T.truthy(n >= 16 * 6, "most questions have answers: " .. n)
end)

T.test("corpus file is in the sharded text format", function()
  local dir = os.tmpname(); os.remove(dir)
  local path = syn.write_corpus(syn.world{ seed = 1, countries = 4 }, dir, { copies = 1 })
  local text = io.open(path):read("*a")
  local docs = 0
  for _ in (text .. "\n\n"):gmatch("(.-)\n\n") do docs = docs + 1 end
  T.eq(docs, 4)
  os.execute("rm -rf " .. dir)
end)

T.run()
