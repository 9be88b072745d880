#!/usr/bin/env bash
# The first hour on a real GPU, in stages that answer the questions cheapest and most informative first. Each
# stage has its own time box (its steps get what is left of it), and each step a line in ONE markdown report a user
# can paste into an issue ($OUT/gpu_report.md, else out/gpu_check/; full logs in gpu_logs.txt beside it):
#   0 environment  nvidia-smi -q (clocks, power limit, ECC, driver/CUDA), build for the detected architecture
#   1 smoke        test_ptx: every kernels/ptx.cuh wrapper on the device against a host reference, lane by lane;
#                  test_cuda_ops: every kernel family against its CPU twin
#   2 headline     BERT-large bf16 phase 1 (S=128 B=64 x 128) and phase 2 (S=512 B=16 x 256) at NVIDIA's
#                  accumulation, without and with --cuda-graph: measured seq/s beside the step-time model's range
#   3 per class    one phase 1 step with CUDA events around every launch: measured ms per launch class beside
#                  the model's (what calibrates the model's assumptions)
#   4 GPU suite    the emulated CI selection (cuda|^emu_|test_tensor|^mpi_, NCCL included), 6 in parallel; each test
#                  limited to its emulated-device time (tests/emu/suite_times.txt) x BL_GPU_SUITE_FACTOR
#   5 sanitizers   compute-sanitizer memcheck, racecheck, synccheck on the short tests
# --quick runs stages 0-3 in 10 minutes, the full run all of them in 60, by construction: `--budget` prints the
# table of time boxes and exits. The check fails when a step fails, times out, or when every test skipped.
#
#   bash scripts/gpu_check.sh [--quick]           on the GPU machine
#   bash scripts/gpu_check.sh --quick --emulated  dry run on the emulated device (BL_GPU_CHECK_FAKE=1): the build
#       in BL_BUILD_DIR (build-emu, -DBERTLUA_CUDA_EMU=ON), the hardware steps faked (nvidia-smi, compute-sanitizer,
#       timings), the benchmarks as model-only dry runs; the stage timings show what a run would cost
#   bash scripts/gpu_check.sh --budget [--quick]  the time boxes, nothing run
#   bash scripts/gpu_check.sh --fetch-debs DIR    on a machine with apt: the Debian build dependencies as .deb files
#       in DIR, for a GPU image that lacks them (carry DIR, default .gpu_debs; unpacked into /tmp/bl_deps there)
# Environment: BL_BUILD_DIR (build-gpu), BL_CUDA_ARCHS (the detected one), BL_GPU_SUITE_FACTOR (1.5),
# BL_GPU_SUITE_JOBS (6), BL_GPU_SUITE_TIMES (tests/emu/suite_times.txt: ctest's CTestCostData.txt of an emulated
# run), BL_GPU_SUITE_RE (the selection), BL_PYTHON, BL_DEPS_DEBS (.gpu_debs).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1

DEB_PKGS="libluajit2-5.1-dev libluajit2-5.1-2 lua-cjson-dev lua-cjson
  libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5 libquadmath0
  libutf8proc-dev libutf8proc2 libedit-dev libedit2 libbsd0 libmd0 libbz2-dev
  libopenmpi-dev libopenmpi3 openmpi-common openmpi-bin libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
  libpmix2 libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libpsm2-2
  libpsm-infinipath1 libnuma1 libmunge2 libpciaccess0 pkgconf pkgconf-bin libpkgconf3"

MODE=full FAKE="${BL_GPU_CHECK_FAKE:-0}" BUDGET_ONLY=0 ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) MODE=quick ;;
    --stages=*) ONLY=",${1#--stages=}," ;;
    --emulated) FAKE=1 ;;
    --budget) BUDGET_ONLY=1 ;;
    --fetch-debs)
      dir="${2:-.gpu_debs}"
      mkdir -p "$dir"
      grep -qx "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >> .git/info/exclude
      # shellcheck disable=SC2086
      (cd "$dir" && apt-get download $DEB_PKGS)
      du -sh "$dir"
      echo "carry '$dir' to the GPU machine (run tool: carry=[\"$dir\"])"
      exit 0 ;;
    *) echo "gpu_check: unknown option '$1' (use --quick, --emulated, --stages=N,M, --budget or --fetch-debs DIR)" >&2
       exit 2 ;;
  esac
  shift
done

# ---------------------------------------------------------------- time boxes (seconds) per stage: quick full
# Stage 4's box is derived below from the per-test limits; quick mode skips stages 4 and 5.
# shellcheck disable=SC2034  # read through the nameref BOX
declare -A BOX_quick=([0]=240 [1]=60 [2]=270 [3]=30 [4]=0 [5]=0)
declare -A BOX_full=([0]=420 [1]=60 [2]=540 [3]=120 [4]=0 [5]=840)
STAGE_NAME=([0]="environment and build" [1]="hardware smoke test" [2]="headline benchmarks"
  [3]="per-class timing" [4]="GPU test suite" [5]="compute-sanitizer")
FULL_LIMIT=3600 QUICK_LIMIT=600
SUITE_RE="${BL_GPU_SUITE_RE:-cuda|^emu_|test_tensor|^mpi_}"
SUITE_EXCLUDE='emu_test_emu_race'   # a deliberate race, for the TSan build only (.ci/run)
FACTOR="${BL_GPU_SUITE_FACTOR:-1.5}"
JOBS="${BL_GPU_SUITE_JOBS:-6}"
TIMES="${BL_GPU_SUITE_TIMES:-$ROOT/tests/emu/suite_times.txt}"
SUITE_MIN=30   # no test gets less, whatever its emulated time

# suite_limits: "name limit" per test of the emulated table (ctest's CTestCostData.txt format: name runs seconds),
# limit = max(SUITE_MIN, emulated seconds x FACTOR); then "# box B" = sum / JOBS + the largest (list scheduling
# of independent tests on JOBS lanes never takes longer), so the stage fits its box by construction.
suite_limits() {
  awk -v f="$FACTOR" -v j="$JOBS" -v m="$SUITE_MIN" '
    /^---/ { exit } /^#/ { next } NF == 3 { l = int($3 * f + 0.999); if (l < m) l = m; print $1, l; s += l; if (l > mx) mx = l }
    END { printf "# box %d\n", s / j + mx + 0.999 }' "$TIMES"
}
SUITE_BOX=$( [ -f "$TIMES" ] && suite_limits | sed -n 's/^# box //p' )
# shellcheck disable=SC2034
BOX_full[4]=${SUITE_BOX:-1500}
MODE_BOX="BOX_$MODE"
declare -n BOX="$MODE_BOX"

print_budget() {
  local total=0 s
  echo "time boxes ($MODE mode, seconds):"
  for s in 0 1 2 3 4 5; do
    printf '  stage %d %-24s %5d\n' "$s" "${STAGE_NAME[$s]}" "${BOX[$s]}"
    total=$((total + ${BOX[$s]}))
  done
  local lim=$FULL_LIMIT; [ "$MODE" = quick ] && lim=$QUICK_LIMIT
  printf '  total %31d of %d\n' "$total" "$lim"
  [ -f "$TIMES" ] && echo "  stage 4: $(suite_limits | grep -vc '^#') tests, limit = max($SUITE_MIN s, emulated time x $FACTOR), $JOBS in parallel, box = sum / $JOBS + largest ($TIMES)"
  [ "$total" -le "$lim" ]
}
if [ "$BUDGET_ONLY" = 1 ]; then print_budget; exit $?; fi
if ! print_budget > /dev/null; then print_budget; echo "gpu_check: the time boxes exceed the mode's limit" >&2; exit 2; fi

OUTDIR="${OUT:-$ROOT/out/gpu_check}"
mkdir -p "$OUTDIR"
RES="$OUTDIR/gpu_report.md"
LOG="$OUTDIR/gpu_logs.txt"
: > "$LOG"
if [ "$FAKE" = 1 ]; then BUILD="${BL_BUILD_DIR:-$ROOT/build-emu}"; else BUILD="${BL_BUILD_DIR:-$ROOT/build-gpu}"; fi
export PATH="/usr/local/cuda/bin:$PATH"
export BL_PYTHON="${BL_PYTHON:-$(command -v python3 || echo /usr/bin/python3)}"
# The emulated dry run's benchmarks record 2 micro-batches of a small model at 1/32 of the batch
# (BL_GPU_CHECK_FAKE_MODEL, tiny: BERT-large takes minutes to record on the emulator) and time nothing: they check
# the plumbing, not the figures.
MODEL=large DIV=1 PROFILE=h100
[ "$FAKE" = 1 ] && MODEL="${BL_GPU_CHECK_FAKE_MODEL:-tiny}" DIV=32
T0=$SECONDS
# the whole run ends 30 s inside its mode's limit whatever the boxes left over, so the report is always written
DEADLINE=$((T0 + FULL_LIMIT - 30)); [ "$MODE" = quick ] && DEADLINE=$((T0 + QUICK_LIMIT - 30))
ROWS=() NOTES=() HEAD=() ENV_LINES=()
LAST_OUT="" STAGE=0 STAGE_END=0
PASSED=0 SKIPPED=0 FAILED=0   # tests, over every stage

# stage N: opens stage N's box; false when --stages leaves it out (its steps are then skipped, not counted)
stage() {
  STAGE=$1
  if [ -n "$ONLY" ] && [[ "$ONLY" != *",$1,"* ]]; then ROWS+=("| $1 | ${STAGE_NAME[$1]} | left out (--stages) | - | - |"); return 1; fi
  STAGE_END=$((SECONDS + BOX[$1]))
  echo "===== stage $1: ${STAGE_NAME[$1]} (box ${BOX[$1]} s)" >> "$LOG"
  echo "gpu_check: stage $1 ${STAGE_NAME[$1]} (box ${BOX[$1]} s)"
}
# step NAME MAX CMD...: runs CMD with a limit of min(MAX, what is left of the stage's box), logs its output and
# adds a row. Exit 77 counts as skipped. Returns CMD's status (99: not run, no time left in the box).
step() {
  local name="$1" max="$2"; shift 2
  local lim=$((STAGE_END - SECONDS))
  [ $((DEADLINE - SECONDS)) -lt "$lim" ] && lim=$((DEADLINE - SECONDS))
  [ "$lim" -gt "$max" ] && lim=$max
  if [ "$lim" -lt 5 ]; then ROWS+=("| $STAGE | $name | not run (stage box spent) | - | - |"); LAST_OUT=""; return 99; fi
  echo "----- $name (limit ${lim}s): $*" >> "$LOG"
  local t=$SECONDS out rc
  out="$(timeout --kill-after=10 "$lim" "$@" 2>&1)"; rc=$?
  printf '%s\n' "$out" >> "$LOG"
  local st="ok"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then st="TIMED OUT"
  elif [ $rc -eq 77 ]; then st="skipped"
  elif [ $rc -ne 0 ]; then st="FAILED (exit $rc)"; fi
  ROWS+=("| $STAGE | $name | $st | $((SECONDS - t)) s | $lim s |")
  LAST_OUT="$out"
  return $rc
}
fake() { ROWS+=("| $STAGE | $1 | faked (emulated dry run) | - | - |"); }
# test_step NAME MAX CMD...: a step that is a test: counted as passed, skipped or failed.
test_step() {
  step "$@"; local rc=$?
  case $rc in 0) PASSED=$((PASSED + 1)) ;; 77) SKIPPED=$((SKIPPED + 1)) ;; 99) ;; *) FAILED=$((FAILED + 1)) ;; esac
  return $rc
}

write_report() {
  local verdict="PASSED"
  [ "$FAILED" -gt 0 ] && verdict="FAILED"
  grep -q "TIMED OUT\|FAILED" <<< "$(printf '%s\n' "${ROWS[@]}")" && verdict="FAILED"
  [ "$PASSED" -eq 0 ] && verdict="FAILED (no test passed: $SKIPPED skipped)"
  {
    echo "# bertlua GPU check ($MODE$([ "$FAKE" = 1 ] && echo ', EMULATED dry run: hardware steps faked, no GPU timing'))"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' + local changes'), total $((SECONDS - T0)) s; **$verdict**: tests $PASSED passed, $SKIPPED skipped, $FAILED failed"
    echo
    echo '```'
    printf '%s\n' "${ENV_LINES[@]}"
    echo '```'
    echo
    if [ ${#HEAD[@]} -gt 0 ]; then
      echo "| headline (BERT-$MODEL bf16) | measured seq/s | model ($PROFILE) slow / expected / fast | measured / expected |"
      echo "|---|---|---|---|"
      printf '%s\n' "${HEAD[@]}"
      echo
    fi
    echo "| stage | step | result | time | limit |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    for n in "${NOTES[@]}"; do printf '%s\n\n' "$n"; done
    echo "Full output: gpu_logs.txt"
  } > "$RES"
  echo "gpu_check: $verdict; report $RES"
  case "$verdict" in PASSED) return 0 ;; *) return 1 ;; esac
}
trap 'write_report; exit $?' EXIT

CMAKE_EXTRA=()
deps() {
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
      # mpirun must match the carried libmpi, and its PMIx the carried plugins (an image's own pmix2 in the same
      # /usr/lib path fails with "undefined symbol: pmix_output_info"); pkg-config for an image without one
      export PATH="$P/usr/bin:$PATH" PMIX_MCA_mca_base_component_path="$L/pmix2/lib/pmix"
      export OPAL_PREFIX="$P/usr"
      # Debian's alternatives links (libmpi.so, openblas.pc in /usr/lib) are not in
      # the .debs: point at the real files (openblas-pthread/, openmpi/lib)
      mpilib=$(ls "$L"/openmpi/lib/libmpi.so "$L"/openmpi/lib/libmpi.so.* 2>/dev/null | head -1)
      mpiinc="$L/openmpi/include"
      export BL_MPI_ARGS="set"
      CMAKE_EXTRA+=("-DMPI_SKIP_COMPILER_WRAPPER=ON" "-DMPI_C_HEADER_DIR=$mpiinc" "-DMPI_C_LIB_NAMES=mpi"
        "-DMPI_mpi_LIBRARY=$mpilib"
        "-DCJSON_LIB=$L/liblua5.1-cjson.a" "-DBZIP2_INCLUDE_DIR=$P/usr/include" "-DBZIP2_LIBRARY_RELEASE=$L/libbz2.so")
      [ -e "$L/libbz2.so" ] || ln -sf /lib/x86_64-linux-gnu/libbz2.so.1.0 "$L/libbz2.so" 2>/dev/null
      NOTES+=("Build dependencies unpacked from $(ls "$debs"/*.deb | wc -l) carried .deb files into $P.")
    fi
    if ! have_deps; then
      ROWS+=("| 0 | dependencies | MISSING: LuaJIT/cjson/OpenBLAS/utf8proc/libedit/bz2/MPI dev files | - | - |")
      NOTES+=("The build needs the Debian packages of scripts/deps.sh. This image has no network: on a machine with apt run \`bash scripts/gpu_check.sh --fetch-debs .gpu_debs\` and carry .gpu_debs.")
      exit 1
    fi
  fi
}

# ---------------------------------------------------------------- stage 0: environment and build
if stage 0; then
  if [ "$FAKE" = 1 ]; then
    ENV_LINES+=("nvidia-smi: faked (emulated device)" "nvcc: not used (emulated build in $BUILD)")
    ARCH=90
    fake "nvidia-smi -q"
    step "build (emulated, incremental)" 600 cmake --build "$BUILD" -j"$(nproc)" || exit 1
  else
    if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -q > "$OUTDIR/nvidia-smi.txt" 2>&1; then
      ROWS+=("| 0 | nvidia-smi -q | FAILED: no GPU or no driver | - | - |"); exit 1
    fi
    # what decides a timing: product, driver and CUDA, clocks now and at most, power, ECC, persistence
    q=name,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,power.limit
    q=$q,power.max_limit,ecc.mode.current,persistence_mode,temperature.gpu,compute_cap
    mapfile -t ENV_LINES < <(nvidia-smi --query-gpu="$q" --format=csv 2>&1;
      grep -m1 -E 'CUDA Version' "$OUTDIR/nvidia-smi.txt" | sed 's/^ *//')
    ENV_LINES+=("nvcc: $(nvcc --version 2>/dev/null | tail -1)")
    ARCH="${BL_CUDA_ARCHS:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')}"
    # the step-time model's profile for this GPU (recipes/benchmark.lua --model-time)
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
      *H200*) PROFILE=h200 ;; *A100*) PROFILE=a100 ;; *) PROFILE=h100 ;;
    esac
    ENV_LINES+=("step-time model profile: $PROFILE")
    ENV_LINES+=("compute capability: $ARCH (the build's CUDA architecture)")
    ROWS+=("| 0 | nvidia-smi -q | ok (nvidia-smi.txt) | - | - |")
    deps || exit 1
    # an image with ninja but no make
    if ! command -v make >/dev/null && command -v ninja >/dev/null && [ ! -f "$BUILD/CMakeCache.txt" ]; then CMAKE_EXTRA+=(-G Ninja); fi
    step "configure (CUDA arch $ARCH)" 60 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
      "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" "${CMAKE_EXTRA[@]}" || exit 1
    grep -q "CUDA backend ON" <<< "$LAST_OUT" || { NOTES+=("CMake did not enable the CUDA backend:"$'\n```\n'"$(tail -20 <<< "$LAST_OUT")"$'\n```'); exit 1; }
    # quick: only what stages 1-3 run
    targets=(); [ "$MODE" = quick ] && targets=(--target bertlua_host test_ptx test_cuda_ops)
    step "build (-j$(nproc)${targets:+, ${targets[*]:1}})" 600 cmake --build "$BUILD" -j"$(nproc)" "${targets[@]}" || {
      NOTES+=("Build errors:"$'\n```\n'"$(grep -E 'error|Error' <<< "$LAST_OUT" | head -20)"$'\n```'); exit 1; }
    NOTES+=("Build warnings: $(grep -c "warning" <<< "$LAST_OUT").")
  fi
  ENV_LINES+=("bertlua: $("$BUILD/bertlua" --version 2>&1 | head -1)")
fi

# ---------------------------------------------------------------- stage 1: hardware smoke test
if stage 1; then
  # test_ptx pinpoints a fragment-layout mismatch (wrapper, lane, register); test_cuda_ops every kernel family
  test_step "test_ptx (ptx.cuh wrappers vs host reference)" 20 "$BUILD/test_ptx"
  NOTES+=("test_ptx:"$'\n```\n'"$(tail -12 <<< "$LAST_OUT")"$'\n```')
  test_step "test_cuda_ops (every kernel family vs its CPU twin)" 60 "$BUILD/test_cuda_ops"
  NOTES+=("test_cuda_ops:"$'\n```\n'"$(grep -E 'FAIL|checks,|skip' <<< "$LAST_OUT" | head -12)"$'\n```')
fi

# ---------------------------------------------------------------- stage 2: headline benchmarks
if stage 2; then
  # bench LABEL SEQ BATCH ACCUM MASKED GRAPH: one configuration; its measured-vs-model line becomes a headline row.
  bench() {
    local label="$1" seq="$2" b="$3" acc="$4" masked="$5" graph="$6" steps=2 max=150
    [ "$MODE" = quick ] && steps=1 && max=80
    [ "$seq" = 512 ] && max=$((max * 3 / 2))
    [ "$FAKE" = 1 ] && acc=2
    local args=(--model="$MODEL" --device=cuda:0 --precision=bf16 --seq="$seq" --batch="$(( (b + DIV - 1) / DIV ))" --accum="$acc"
      --masked="$masked" --steps="$steps" --warmup=3 --model-time="$PROFILE")
    [ "$graph" = 1 ] && args+=(--cuda-graph)
    step "$label" "$max" "$BUILD/bertlua" recipes/benchmark.lua "${args[@]}"
    local m; m=$(grep '^measured vs model' <<< "$LAST_OUT")
    local range; range=$(grep -m1 'model range:' <<< "$LAST_OUT" | sed 's/.*model range: //; s/ seq\/s.*//')
    local recipe; recipe=$(grep -m1 'MODEL at accumulation.*NVIDIA' <<< "$LAST_OUT" | sed 's/.*: \([0-9]* \/ [0-9]* \/ [0-9]*\) seq\/s.*/\1/')
    if [ -n "$m" ]; then
      HEAD+=("| $label | $(sed 's/.*: \([0-9]*\) seq\/s measured.*/\1/' <<< "$m") | $range | $(sed 's/.*measured \/ expected \([0-9.]*\).*/\1/' <<< "$m") |")
    else
      HEAD+=("| $label | $([ "$FAKE" = 1 ] && echo 'not timed (emulated)' || echo 'none (see log)') | ${recipe:-?} at NVIDIA's accumulation | - |")
    fi
    NOTES+=("**$label** (\`${args[*]}\`):"$'\n```\n'"$(grep -E '^(model:|bertlua:|measured vs model)|model range|MODEL at accumulation|error|Error' <<< "$LAST_OUT" | head -12)"$'\n```')
  }
  bench "phase 1, S=128 B=64 x 128" 128 64 128 20 0
  bench "phase 1, S=128 B=64 x 128, CUDA graph" 128 64 128 20 1
  bench "phase 2, S=512 B=16 x 256" 512 16 256 80 0
  # a phase-2 step takes ~20 s on an H200: warm-up, capture, the model's recording and the timed step take more
  # than the quick box leaves (seen: 84 s, timed out)
  if [ "$MODE" = full ]; then bench "phase 2, S=512 B=16 x 256, CUDA graph" 512 16 256 80 1
  else ROWS+=("| 2 | phase 2, S=512 B=16 x 256, CUDA graph | not in --quick | - | - |"); fi
fi

# ---------------------------------------------------------------- stage 3: per-class timing
if stage 3; then
  # (emulated: the events time the emulator, which only checks the plumbing)
  step "per-class timing, phase 1 S=128 B=64" 120 "$BUILD/bertlua" recipes/benchmark.lua --model="$MODEL" --device=cuda:0 \
    --precision=bf16 --seq=128 --batch=$(( (64 + DIV - 1) / DIV )) --masked=20 --steps=1 --warmup=2 --model-time="$PROFILE" --class-times
  NOTES+=("Per launch class, measured (CUDA events around each launch$([ "$FAKE" = 1 ] && echo ': EMULATOR time, not a GPU')) beside the model (expected scenario):"$'\n```\n'"$(sed -n '/^step-time MODEL/,/model range/p' <<< "$LAST_OUT" | head -30)"$'\n```')
fi

# ---------------------------------------------------------------- stage 4: the GPU test suite
if stage 4; then
  if [ "$MODE" = quick ]; then
    ROWS+=("| 4 | GPU test suite | not in --quick | - | - |")
  elif [ ! -d "$BUILD" ] || ! (cd "$BUILD" && ctest -N -R "$SUITE_RE" -E "$SUITE_EXCLUDE" > "$OUTDIR/suite.list"); then
    ROWS+=("| 4 | GPU test suite | FAILED: ctest -N | - | - |")
  else
    declare -A LIM
    while read -r n l; do LIM[$n]=$l; done < <(suite_limits | grep -v '^#')
    mkdir -p "$OUTDIR/suite"
    # longest first; a test without an emulated time gets the longest limit
    sed -n 's/^ *Test *#[0-9]*: *//p' "$OUTDIR/suite.list" | while read -r n; do
      echo "${LIM[$n]:-$(suite_limits | grep -v '^#' | sort -k2,2n | tail -1 | cut -d' ' -f2)} $n"; done \
      | sort -rn > "$OUTDIR/suite.plan"
    t=$SECONDS
    # shellcheck disable=SC2016
    timeout --kill-after=10 "${BOX[4]}" xargs -P "$JOBS" -L 1 bash -c 'cd "$0" && timeout --kill-after=10 "$1" \
      ctest -R "^$2\$" --output-on-failure > "$3/suite/$2.log" 2>&1; echo "$2 $? $1" >> "$3/suite.rc"' "$BUILD" \
      < <(awk -v o="$OUTDIR" '{ print $1, $2, o }' "$OUTDIR/suite.plan")
    : >> "$OUTDIR/suite.rc"
    np=0 ns=0 nf=0
    while read -r lim n; do
      log="$OUTDIR/suite/$n.log" rc=$(awk -v n="$n" '$1 == n { print $2 }' "$OUTDIR/suite.rc")
      if [ -z "$rc" ]; then st="not run (stage box spent)"
      elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then st="TIMED OUT"; nf=$((nf + 1))
      elif grep -q "Skipped\|Not Run" "$log"; then st="skipped"; ns=$((ns + 1))
      elif [ "$rc" = 0 ]; then st="ok"; np=$((np + 1))
      else st="FAILED (exit $rc)"; nf=$((nf + 1)); cat "$log" >> "$LOG"; fi
      ROWS+=("| 4 | $n | $st | $(grep -o '[0-9.]* sec' "$log" 2>/dev/null | tail -1) | $lim s |")
    done < "$OUTDIR/suite.plan"
    PASSED=$((PASSED + np)) SKIPPED=$((SKIPPED + ns)) FAILED=$((FAILED + nf))
    NOTES+=("GPU test suite: $np passed, $ns skipped, $nf failed of $(wc -l < "$OUTDIR/suite.plan") in $((SECONDS - t)) s ($JOBS in parallel); logs in suite/.")
  fi
fi

# ---------------------------------------------------------------- stage 5: compute-sanitizer
if stage 5; then
  if [ "$MODE" = quick ]; then
    ROWS+=("| 5 | compute-sanitizer | not in --quick | - | - |")
  elif [ "$FAKE" = 1 ]; then
    fake "compute-sanitizer memcheck / racecheck / synccheck"
  elif ! command -v compute-sanitizer >/dev/null; then
    ROWS+=("| 5 | compute-sanitizer | not found | - | - |")
  else
    # memcheck without leak checking: the caching allocator keeps its blocks until exit by design
    for t in test_ptx test_cuda_ops test_cuda_attention; do
      test_step "memcheck $t" 240 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 "$BUILD/$t"
      NOTES+=("memcheck $t: $(grep -E 'ERROR SUMMARY' <<< "$LAST_OUT" | tail -1)")
    done
    for tool in racecheck synccheck; do
      for t in test_ptx test_cuda_attention; do
        test_step "$tool $t" 240 compute-sanitizer --tool "$tool" --error-exitcode 3 "$BUILD/$t"
        NOTES+=("$tool $t: $(grep -E 'SUMMARY' <<< "$LAST_OUT" | tail -1)")
      done
    done
  fi
fi

exit 0
