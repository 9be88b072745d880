-- A Lua script run on every rank of `mpirun` by the bertlua host (the tests of failing ranks).
--   local run = require("mpi_script")(T, "timeout 120 mpirun -np 2 ... ", prelude)
--   local out, rc = run(body[, env])   -- prelude .. body on every rank; env: "VAR=value ..." before the command
return function(T, mpirun, prelude)
  return function(body, env)
    local p = os.tmpname() .. ".lua"
    T.write_file(p, prelude .. body)
    local out, rc = T.sh((env or "") .. " " .. mpirun .. T.exe() .. " " .. p)
    os.remove(p)
    return out, rc
  end
end
