-- luacheck configuration (Debian package lua-check), run by .ci/run over
-- lua/, recipes/ and tests/ with warnings as errors.
std = "luajit"
max_line_length = 120
-- Python and shell programs embedded in long strings (tests' references)
max_string_line_length = false
-- methods and callbacks keep their full signatures
unused_args = false
-- `not (a < b)` reads better than its inversion where NaN must fail the test
ignore = { "581" }
