#!/usr/bin/env bash
# CI: bertlua.util.shell (lua/bertlua/util/shell.lua) is the only place in lua/ and
# recipes/ that starts a command: it quotes every argument, so a file name cannot
# smuggle in $(...), backticks or ';'. Any other io.popen/os.execute fails here.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
hits=$(grep -rnE 'io\.popen|os\.execute' --include='*.lua' lua recipes \
  | grep -v '^lua/bertlua/util/shell\.lua:' | grep -vE '^[^:]+:[0-9]+:[[:space:]]*--' || true)
if [ -n "$hits" ]; then
  echo "check_shell: start commands through bertlua.util.shell (shell.run/read/popen with an argv list), not:"
  echo "$hits"
  exit 1
fi
echo "check_shell: io.popen/os.execute only in lua/bertlua/util/shell.lua"
