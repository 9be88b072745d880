#!/usr/bin/env bash
# The README's second command: install dependencies, build, run the whole test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
bash "$ROOT/scripts/deps.sh"
bash "$ROOT/scripts/build.sh" "$ROOT/build"
cd "$ROOT/build" && ctest --output-on-failure -j2 "$@"
