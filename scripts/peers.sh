#!/usr/bin/env bash
# Makes .venv-peers/: an isolated Python with today's CPU peers for recipes/benchmark.lua
# (--compare=openvino|onnxruntime|torch|torch-compile), pinned so every run compares the same
# versions. Isolated because Debian's python3-torch/numpy (the older peers, /usr/bin/python3) stay.
# Everything comes from PyPI. PyPI's torch is the CUDA build (its nvidia-* wheels add ~3 GB); it
# runs on CPU unchanged. Idempotent: reruns only install what differs from the pins.
# usage: bash scripts/peers.sh [VENV_DIR]   (default: .venv-peers in the repository root)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$ROOT/.venv-peers}"
PINS=(torch==2.15.0 onnxruntime==1.32.0 openvino==2026.4.1 nncf==3.4.0
      transformers==5.24.0 onnx==1.23.2 numpy==2.4.6)
PY=/usr/bin/python3
[ -x "$PY" ] || PY="$(command -v python3)" || { echo "peers.sh: no python3; install Debian's python3 python3-venv" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" || { echo "peers.sh: '$PY -m venv' failed; install Debian's python3-venv" >&2; exit 1; }
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "${PINS[@]}"
"$VENV/bin/python" - <<'PY'
import torch, onnxruntime, openvino, nncf, transformers, onnx, numpy
print("peers.sh: ready:", ", ".join(f"{m.__name__} {m.__version__}" for m in
      (torch, onnxruntime, openvino, nncf, transformers, onnx, numpy)))
PY
echo "peers.sh: use it with recipes/benchmark.lua (found automatically) or --python=$VENV/bin/python"
