#!/usr/bin/env bash
# The accuracy rows beside the low-precision speed rows (issue 32): a fine-tuned sequence classifier evaluated on
# the first ROWS rows of an SST-2 style TSV at fp32, bf16 and int8 by bertlua (recipes/predict.lua, its own bf16
# and int8 paths) and by today's peers (tools/peers/accuracy_peers.py), each quantizing its own way.
# usage: bash tools/peers/accuracy_delta.sh MODEL_DIR DEV_TSV [ROWS=200] [THREADS=2]
#   BERTLUA (default build/bertlua), BL_PEER_PYTHON (default .venv-peers/bin/python) pick the programs.
# e.g. a MiniLM fine-tuned on SST-2 rows 601-872 by recipes/glue.lua (BENCHMARKS.md), evaluated on rows 1-200.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
[ $# -ge 2 ] || { echo "usage: bash tools/peers/accuracy_delta.sh MODEL_DIR DEV_TSV [ROWS=200] [THREADS=2]" >&2; exit 2; }
MODEL=$1 TSV=$2 ROWS=${3:-200} THREADS=${4:-2}
EXE=${BERTLUA:-$ROOT/build/bertlua}
PY=${BL_PEER_PYTHON:-$ROOT/.venv-peers/bin/python}
[ -f "$MODEL/config.json" ] || { echo "accuracy_delta: $MODEL/config.json missing: give a fine-tuned model directory" >&2; exit 2; }
[ -f "$TSV" ] || { echo "accuracy_delta: $TSV missing: give GLUE SST-2's dev.tsv (or one like it)" >&2; exit 2; }
[ -x "$EXE" ] || { echo "accuracy_delta: no bertlua at $EXE: build it (bash scripts/build.sh) or set BERTLUA" >&2; exit 2; }
[ -x "$PY" ] || { echo "accuracy_delta: no $PY: make today's peers (bash scripts/peers.sh) or set BL_PEER_PYTHON" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
head -n $((ROWS + 1)) "$TSV" > "$TMP/dev.tsv"
ours=""
for p in fp32 bf16 int8; do
  "$EXE" "$ROOT/recipes/predict.lua" --model="$MODEL" --task=glue-sst2 --input="$TMP/dev.tsv" --split=dev \
    --output="$TMP/pred_$p.tsv" --precision=$p --threads="$THREADS" --max-seq-length=128 > "$TMP/log_$p" 2>&1 \
    || { cat "$TMP/log_$p" >&2; echo "accuracy_delta: bertlua predict --precision=$p failed (above)" >&2; exit 1; }
  a=$(grep -o '"acc":[0-9.eE+-]*' "$TMP/log_$p" | cut -d: -f2) \
    || { cat "$TMP/log_$p" >&2; echo "accuracy_delta: no accuracy in bertlua's output (above)" >&2; exit 1; }
  ours="$ours${ours:+,}$p=$a"
done
exec "$PY" "$ROOT/tools/peers/accuracy_peers.py" --model "$MODEL" --tsv "$TSV" --rows "$ROWS" --threads "$THREADS" \
  --seq 128 --ours "$ours"
