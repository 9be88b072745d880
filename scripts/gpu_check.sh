#!/usr/bin/env bash
# GPU check in ONE call of at most 10 minutes on a machine with an NVIDIA GPU
# and no network: build for sm_80;sm_90, the CUDA tests (ctest -R cuda),
# compute-sanitizer memcheck on test_cuda_ops, and the BERT-large benchmarks
# side by side with PyTorch (bf16 autocast, recipes/peers/bench_bert_torch.py):
#   pre-training phase 1  S=128 B=64 20 masked positions per sequence
#   pre-training phase 2  S=512 B=$BL_P2_BATCH (16) 80 masked positions
#   inference             S=384 B=32, and latency at B=1 S=128
# The training benchmarks also print the step-time model (--model-time=h100: a
# lower bound from the launches the step makes, at H100 SXM figures) next to
# the measured step time.
# Results (a table of steps, seq/s, ratio to torch, MFU) go to
# $OUT/gpu_results.md when OUT is set (else out/gpu_check/), the full logs to
# gpu_logs.txt beside it. Every step has a time limit taken from what is left
# of BL_GPU_CHECK_BUDGET seconds (570): a slow step is cut, later steps still
# run, and the results say what was cut. (memcheck runs without leak checking:
# the caching allocator keeps its blocks until exit by design.)
#
#   bash scripts/gpu_check.sh                      on the GPU machine
#   bash scripts/gpu_check.sh --fetch-debs DIR     on a machine with apt: the
#       Debian build dependencies (LuaJIT, cjson, OpenBLAS, utf8proc, libedit,
#       bz2, OpenMPI) as .deb files in DIR, for a GPU image that lacks them.
#       Carry DIR (default .gpu_debs, ignored by git through .git/info/exclude)
#       to the GPU machine; there they are unpacked into a private prefix
#       (/tmp/bl_deps, never into /) when pkg-config does not find the
#       libraries.
# Environment: BL_GPU_CHECK_BUDGET (570), BL_BUILD_DIR (build-gpu), BL_P2_BATCH (16), BL_BENCH_STEPS
# (10), BL_CUDA_ARCHS ("80;90"), BL_PYTHON (python3 on PATH: the one with
# torch), BL_DEPS_DEBS (.gpu_debs), BL_GPU_CHECK_EXTRA=1 (phase 1 also in
# tf32 and fp32 when time is left).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1

DEB_PKGS="libluajit2-5.1-dev libluajit2-5.1-2 lua-cjson-dev lua-cjson
  libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5 libquadmath0
  libutf8proc-dev libutf8proc2 libedit-dev libedit2 libbsd0 libmd0 libbz2-dev
  libopenmpi-dev libopenmpi3 openmpi-common libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
  libpmix2 libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libpsm2-2
  libpsm-infinipath1 libnuma1 libmunge2 libpciaccess0"

if [ "${1:-}" = "--fetch-debs" ]; then
  dir="${2:-.gpu_debs}"
  mkdir -p "$dir"
  grep -qx "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >> .git/info/exclude
  # shellcheck disable=SC2086
  (cd "$dir" && apt-get download $DEB_PKGS)
  du -sh "$dir"
  echo "carry '$dir' to the GPU machine (run tool: carry=[\"$dir\"])"
  exit 0
fi

OUTDIR="${OUT:-$ROOT/out/gpu_check}"
mkdir -p "$OUTDIR"
RES="$OUTDIR/gpu_results.md"
LOG="$OUTDIR/gpu_logs.txt"
: > "$LOG"
BUDGET="${BL_GPU_CHECK_BUDGET:-570}"
STEPS="${BL_BENCH_STEPS:-10}"
P2B="${BL_P2_BATCH:-16}"
ARCHS="${BL_CUDA_ARCHS:-80;90}"
BUILD="${BL_BUILD_DIR:-$ROOT/build-gpu}"
export PATH="/usr/local/cuda/bin:$PATH"
export BL_PYTHON="${BL_PYTHON:-$(command -v python3 || echo /usr/bin/python3)}"
T0=$SECONDS
left() { echo $(( BUDGET - (SECONDS - T0) )); }

ROWS=()
NOTES=()
LAST_OUT=""
# step NAME MAX_SECONDS CMD... : runs CMD with a limit of min(MAX, time left),
# appends its output to the log and keeps its last lines for the results.
step() {
  local name="$1" max="$2"; shift 2
  local lim; lim=$(left)
  [ "$lim" -gt "$max" ] && lim=$max
  if [ "$lim" -lt 15 ]; then ROWS+=("| $name | not run (time budget spent) | - |"); LAST_OUT=""; return 99; fi
  echo "===== $name (limit ${lim}s): $*" >> "$LOG"
  local t=$SECONDS out rc
  out="$(timeout --kill-after=10 "$lim" "$@" 2>&1)"; rc=$?
  printf '%s\n' "$out" >> "$LOG"
  local st="ok"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then st="TIMED OUT after ${lim}s"
  elif [ $rc -eq 77 ]; then st="skipped"
  elif [ $rc -ne 0 ]; then st="FAILED (exit $rc)"; fi
  ROWS+=("| $name | $st | $((SECONDS - t)) s |")
  LAST_OUT="$out"
  return $rc
}

write_results() {
  {
    echo "# bertlua GPU check"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' + local changes'), total $((SECONDS - T0)) s"
    echo
    echo '```'
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    echo "python: $BL_PYTHON ($("$BL_PYTHON" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo 'no torch'))"
    echo '```'
    echo
    echo "| step | result | time |"
    echo "|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    for n in "${NOTES[@]}"; do printf '%s\n\n' "$n"; done
    echo "Full output: gpu_logs.txt"
  } > "$RES"
}
trap write_results EXIT

# ---------------------------------------------------------------- dependencies
have_deps() {
  pkg-config --exists luajit openblas libutf8proc libedit 2>/dev/null || return 1
  { ls /usr/lib/x86_64-linux-gnu/liblua5.1-cjson.a || ls "${BL_DEPS_PREFIX:-/nonexistent}"/usr/lib/x86_64-linux-gnu/liblua5.1-cjson.a; } >/dev/null 2>&1 || return 1
  [ -e /usr/include/bzlib.h ] || [ -e "${BL_DEPS_PREFIX:-/nonexistent}/usr/include/bzlib.h" ] || return 1
  command -v mpicc >/dev/null || [ -n "${BL_MPI_ARGS:-}" ] || return 1
}
CMAKE_EXTRA=()
if ! have_deps; then
  debs="${BL_DEPS_DEBS:-$ROOT/.gpu_debs}"
  if ls "$debs"/*.deb >/dev/null 2>&1; then
    P=/tmp/bl_deps
    mkdir -p "$P"
    for f in "$debs"/*.deb; do dpkg -x "$f" "$P"; done
    L="$P/usr/lib/x86_64-linux-gnu"
    export BL_DEPS_PREFIX="$P"
    export PKG_CONFIG_PATH="$L/pkgconfig:$L/openblas-pthread/pkgconfig:$P/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export PKG_CONFIG_SYSROOT_DIR="$P"
    export CMAKE_PREFIX_PATH="$P/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    export CPATH="$P/usr/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$L:$L/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$L:$L/openblas-pthread:$L/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export OPAL_PREFIX="$P/usr"
    # Debian's alternatives links (libmpi.so, openblas.pc in /usr/lib) are not in
    # the .debs: point at the real files (openblas-pthread/, openmpi/lib)
    mpilib=$(ls "$L"/openmpi/lib/libmpi.so "$L"/openmpi/lib/libmpi.so.* 2>/dev/null | head -1)
    mpiinc="$L/openmpi/include"
    export BL_MPI_ARGS="set"
    CMAKE_EXTRA+=("-DMPI_SKIP_COMPILER_WRAPPER=ON" "-DMPI_C_HEADER_DIR=$mpiinc" "-DMPI_C_LIB_NAMES=mpi"
      "-DMPI_mpi_LIBRARY=$mpilib"
      "-DCJSON_LIB=$L/liblua5.1-cjson.a" "-DBZIP2_INCLUDE_DIR=$P/usr/include" "-DBZIP2_LIBRARIES=$L/libbz2.so")
    [ -e "$L/libbz2.so" ] || ln -sf /lib/x86_64-linux-gnu/libbz2.so.1.0 "$L/libbz2.so" 2>/dev/null
    NOTES+=("Build dependencies unpacked from $(ls "$debs"/*.deb | wc -l) carried .deb files into $P.")
  fi
  if ! have_deps; then
    ROWS+=("| dependencies | MISSING: LuaJIT/cjson/OpenBLAS/utf8proc/libedit/bz2/MPI dev files not found | - |")
    NOTES+=("The build needs the Debian packages of scripts/deps.sh. This image has no network: on a machine with apt run \`bash scripts/gpu_check.sh --fetch-debs .gpu_debs\` and carry .gpu_debs.")
    exit 1
  fi
fi

# ---------------------------------------------------------------- build
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi >/dev/null 2>&1; then NOTES+=("nvidia-smi failed: is there a GPU?"); fi
step "configure (CUDA archs $ARCHS)" 120 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" "${CMAKE_EXTRA[@]}" || exit 1
grep -q "CUDA backend ON" <<< "$LAST_OUT" || { NOTES+=("CMake did not enable the CUDA backend:"$'\n```\n'"$(tail -20 <<< "$LAST_OUT")"$'\n```'); exit 1; }
step "build (-j$(nproc))" 330 cmake --build "$BUILD" -j"$(nproc)" || {
  NOTES+=("Build errors:"$'\n```\n'"$(grep -E 'error|Error' <<< "$LAST_OUT" | head -20)"$'\n```'); exit 1; }
warnings=$(grep -c "warning" <<< "$LAST_OUT")
NOTES+=("Build warnings: $warnings.")
"$BUILD/bertlua" --version >> "$LOG" 2>&1

# ---------------------------------------------------------------- tests
step "ctest -R cuda" 150 bash -c "cd '$BUILD' && ctest -R cuda --output-on-failure"
NOTES+=("ctest -R cuda:"$'\n```\n'"$(grep -E 'tests passed|tests failed|Test +#|checks,|FAIL|skipped' <<< "$LAST_OUT" | head -30)"$'\n```')
if command -v compute-sanitizer >/dev/null; then
  step "compute-sanitizer memcheck test_cuda_ops" 150 compute-sanitizer --tool memcheck --leak-check no \
    --error-exitcode 3 "$BUILD/test_cuda_ops"
  NOTES+=("memcheck:"$'\n```\n'"$(grep -E 'ERROR SUMMARY|LEAK SUMMARY|checks,|Invalid|FAIL' <<< "$LAST_OUT" | head -20)"$'\n```')
  # the tensor-core attention: out-of-bounds accesses and shared-memory races (cp.async, ldmatrix) on the hardware
  step "compute-sanitizer memcheck test_cuda_attention" 300 compute-sanitizer --tool memcheck --leak-check no \
    --error-exitcode 3 "$BUILD/test_cuda_attention"
  NOTES+=("memcheck attention:"$'\n```\n'"$(grep -E 'ERROR SUMMARY|Invalid|FAIL' <<< "$LAST_OUT" | head -20)"$'\n```')
  step "compute-sanitizer racecheck test_cuda_attention" 600 compute-sanitizer --tool racecheck \
    --error-exitcode 3 "$BUILD/test_cuda_attention"
  NOTES+=("racecheck attention:"$'\n```\n'"$(grep -E 'RACECHECK SUMMARY|hazard|FAIL' <<< "$LAST_OUT" | head -20)"$'\n```')
else
  ROWS+=("| compute-sanitizer | not found | - |")
fi

# ---------------------------------------------------------------- benchmarks
bench() {  # bench NAME MAX ARGS...
  local name="$1" max="$2"; shift 2
  step "$name" "$max" "$BUILD/bertlua" recipes/benchmark.lua --model=large --device=cuda:0 --threads=8 \
    --compare=torch --python="$BL_PYTHON" "$@"
  local keep='^(model|bertlua|torch|ratio|measured vs model)|^  model (step|bound)|error|Error'
  NOTES+=("**$name** (\`$*\`):"$'\n```\n'"$(grep -E "$keep" <<< "$LAST_OUT" | head -16)"$'\n```')
}
bench "BERT-large phase 1 training (S=128 B=64, bf16)" 150 --seq=128 --batch=64 --masked=20 --precision=bf16 \
  --steps="$STEPS" --warmup=3 --model-time=h100
bench "BERT-large phase 1 training as a CUDA graph (S=128 B=64, bf16)" 150 --seq=128 --batch=64 --masked=20 \
  --precision=bf16 --steps="$STEPS" --warmup=3 --model-time=h100 --cuda-graph
bench "BERT-large inference (S=384 B=32, bf16)" 100 --seq=384 --batch=32 --infer --precision=bf16 \
  --steps="$STEPS" --warmup=3
bench "BERT-large latency (S=128 B=1, bf16)" 80 --seq=128 --batch=1 --infer --precision=bf16 --steps=50 --warmup=5
bench "BERT-large phase 2 training (S=512 B=$P2B, bf16)" 150 --seq=512 --batch="$P2B" --masked=80 --precision=bf16 \
  --steps="$STEPS" --warmup=2 --model-time=h100
if [ "${BL_GPU_CHECK_EXTRA:-0}" = "1" ]; then
  bench "BERT-large phase 1 training (S=128 B=64, tf32)" 150 --seq=128 --batch=64 --masked=20 --precision=tf32 \
    --steps="$STEPS" --warmup=2
  bench "BERT-large phase 1 training (S=128 B=64, fp32)" 150 --seq=128 --batch=64 --masked=20 --precision=fp32 \
    --steps="$STEPS" --warmup=2
fi
exit 0
