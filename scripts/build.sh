#!/usr/bin/env bash
# Configure and build. usage: scripts/build.sh [BUILD_DIR] [extra cmake args]
# The CUDA backend is built when nvcc is found (CUDA toolkit in /usr/local/cuda
# or on PATH); pass -DBERTLUA_CUDA=OFF for a CPU-only build.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
shift || true
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@" >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
