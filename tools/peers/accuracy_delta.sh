#!/usr/bin/env bash
# The accuracy rows beside the low-precision speed rows (issue 32): a fine-tuned model evaluated at fp32, bf16 and
# int8 by bertlua (recipes/predict.lua, its own bf16 and int8 paths) and by today's peers
# (tools/peers/accuracy_peers.py), each quantizing its own way.
# usage: bash tools/peers/accuracy_delta.sh MODEL_DIR EVAL_FILE [ROWS=200] [THREADS=2] [CALIB_FILE]
#   EVAL_FILE *.tsv: a sequence classifier, SST-2 accuracy on the file's first ROWS rows (S=128);
#   EVAL_FILE *.json: a QA model, SQuAD v1.1 F1 on every question (S=192, windows 96 apart; ROWS unused).
#   CALIB_FILE: training rows (same format) that calibrate OpenVINO's int8 (SST-2 default: the rows after ROWS).
#   BERTLUA (default build/bertlua), BL_PEER_PYTHON (default .venv-peers/bin/python) pick the programs.
# e.g. the MiniLMs fine-tuned by tests/lua/glue_accuracy.lua and squad_accuracy.lua (BENCHMARKS.md), on their
# held-out eval files, calibrated on their train files.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
USAGE="usage: bash tools/peers/accuracy_delta.sh MODEL_DIR EVAL_FILE(.tsv|.json) [ROWS=200] [THREADS=2] [CALIB_FILE]"
[ $# -ge 2 ] || { echo "$USAGE" >&2; exit 2; }
MODEL=$1 EVAL=$2 ROWS=${3:-200} THREADS=${4:-2} CALIB=${5:-}
EXE=${BERTLUA:-$ROOT/build/bertlua}
PY=${BL_PEER_PYTHON:-$ROOT/.venv-peers/bin/python}
[ -f "$MODEL/config.json" ] || { echo "accuracy_delta: $MODEL/config.json missing: give a fine-tuned model directory" >&2; exit 2; }
[ -f "$EVAL" ] || { echo "accuracy_delta: $EVAL missing: give SST-2's dev.tsv (or one like it) or a SQuAD v1.1 json" >&2; exit 2; }
[ -z "$CALIB" ] || [ -f "$CALIB" ] || { echo "accuracy_delta: calibration file $CALIB missing" >&2; exit 2; }
[ -x "$EXE" ] || { echo "accuracy_delta: no bertlua at $EXE: build it (bash scripts/build.sh) or set BERTLUA" >&2; exit 2; }
[ -x "$PY" ] || { echo "accuracy_delta: no $PY: make today's peers (bash scripts/peers.sh) or set BL_PEER_PYTHON" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
case "$EVAL" in
  *.json) [ -n "$CALIB" ] || { echo "accuracy_delta: a SQuAD run needs CALIB_FILE (training questions)" >&2; exit 2; }
          input=$EVAL key=f1 seq=192
          task=(--task=squad --max-seq-length=192 --doc-stride=96)
          peer=(--squad "$EVAL" --seq 192 --stride 96 --calib-file "$CALIB") ;;
  *)      head -n $((ROWS + 1)) "$EVAL" > "$TMP/dev.tsv"
          input=$TMP/dev.tsv key=acc seq=128
          task=(--task=glue-sst2 --split=dev --max-seq-length=128)
          peer=(--tsv "$EVAL" --rows "$ROWS" --seq 128 ${CALIB:+--calib-file "$CALIB"}) ;;
esac
ours=""
for p in fp32 bf16 int8; do
  "$EXE" "$ROOT/recipes/predict.lua" --model="$MODEL" --input="$input" "${task[@]}" --output="$TMP/pred_$p" \
    --precision=$p --threads="$THREADS" > "$TMP/log_$p" 2>&1 \
    || { cat "$TMP/log_$p" >&2; echo "accuracy_delta: bertlua predict --precision=$p failed (above)" >&2; exit 1; }
  a=$(grep -o "\"$key\": *[0-9.eE+-]*" "$TMP/log_$p" | head -n 1 | cut -d: -f2 | tr -d " ") || a=""
  [ -n "$a" ] || { cat "$TMP/log_$p" >&2; echo "accuracy_delta: no $key in bertlua's output (above)" >&2; exit 1; }
  ours="$ours${ours:+,}$p=$a"
done
echo "accuracy_delta: bertlua at S=$seq: $ours"
exec "$PY" "$ROOT/tools/peers/accuracy_peers.py" --model "$MODEL" "${peer[@]}" --threads "$THREADS" --ours "$ours"
