#!/usr/bin/env bash
# The README's first command: install dependencies, build, run the quickstart.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
bash "$ROOT/scripts/deps.sh"
bash "$ROOT/scripts/build.sh" "$ROOT/build"
cd "$ROOT" && ./build/bertlua recipes/quickstart.lua "$@"
