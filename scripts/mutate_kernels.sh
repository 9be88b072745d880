#!/usr/bin/env bash
# Mutation check of the emulated CUDA device: does the CUDA op test suite, run on the emulator, notice a missing
# barrier, an off-by-one tile bound or a grid-stride loop cut to one pass? Deletes each __syncthreads() of kernels/
# in turn (and applies a few off-by-one bounds, fragment indices and one-pass grid-stride loops), rebuilds the
# emulated library in a private copy of the tree, runs tests/c/test_cuda_ops.c and test_cuda_attention.c, and
# test_cuda_ops.c again with BL_CUDA_MAX_GRID=2 (as CI does), and counts the mutants they kill (wrong result,
# emulator report or fault; a timeout counts as killed too).
# usage: scripts/mutate_kernels.sh [WORK_DIR]      (default /tmp/bertlua-mutants; the checkout is not modified)
#   BL_MUTANT_TSAN=1 also runs each surviving mutant under the ThreadSanitizer build.
#   BL_MUTANT_ONLY=REGEX keeps the mutants whose file matches (e.g. attention_tc).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-/tmp/bertlua-mutants}"
SRC="$WORK/src"
rm -rf "$SRC" && mkdir -p "$SRC"
# the working tree as it is (tracked and new files), without build directories
(cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 tar -cf - ) | tar -xf - -C "$SRC"
flags=(-DBERTLUA_CUDA_EMU=ON)
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" >/dev/null
TESTS=(test_cuda_ops test_cuda_attention)
cmake --build "$WORK/build" -j"$(nproc)" --target "${TESTS[@]}" >/dev/null
if [ "${BL_MUTANT_TSAN:-0}" = 1 ]; then
  cmake -S "$SRC" -B "$WORK/build-tsan" -DCMAKE_BUILD_TYPE=Release -DBERTLUA_CUDA_EMU_TSAN=ON >/dev/null
  cmake --build "$WORK/build-tsan" -j"$(nproc)" --target test_cuda_ops >/dev/null
fi
run_tests() {   # 0: the suites pass (mutant survives); the op tests also with grids capped, as CI runs them
  local t
  for t in "${TESTS[@]}"; do
    (cd "$SRC" && BL_SHARED_DATA="$ROOT/../shared/data" timeout 600 "$1/$t" >"$WORK/last.log" 2>&1) || return 1
  done
  (cd "$SRC" && BL_CUDA_MAX_GRID=2 timeout 600 "$1/test_cuda_ops" >"$WORK/last.log" 2>&1)
}
run_tsan() {    # 0: the TSan build compiles and reports no race
  cmake --build "$WORK/build-tsan" -j"$(nproc)" --target test_cuda_ops >/dev/null 2>&1 &&
    (cd "$SRC" && OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS=exitcode=66 \
      BL_SHARED_DATA="$ROOT/../shared/data" timeout 1800 "$WORK/build-tsan/test_cuda_ops" >"$WORK/tsan.log" 2>&1)
}
run_tests "$WORK/build" || { echo "the unmutated suite fails: see $WORK/last.log"; exit 1; }

# Mutants: "file<TAB>occurrence<TAB>text<TAB>replacement" (occurrence counts matches of text in the file from 1).
mutants="$WORK/mutants.tsv"
: >"$mutants"
for f in "$SRC"/kernels/*.cu "$SRC"/kernels/*.cuh; do
  n=$(grep -o "__syncthreads()" "$f" | wc -l || true)
  for ((i = 1; i <= n; i++)); do printf '%s\t%d\t%s\t%s\n' "$f" "$i" '__syncthreads();' ';' >>"$mutants"; done
done
cat >>"$mutants" <<TSV
$SRC/kernels/attention.cu	1	if (kj < S) {	if (kj <= S) {
$SRC/kernels/attention.cu	1	if (qi < S) {	if (qi <= S) {
$SRC/kernels/attention.cu	2	if (kj < S) {	if (kj + 1 < S) {
$SRC/kernels/attention.cu	1	idx < total;	idx <= total;
$SRC/kernels/attention.cu	1	k0 < S; k0 += BK	k0 + 1 < S; k0 += BK
$SRC/kernels/layernorm.cu	1	j < h; j += step	j < h - 1; j += step
$SRC/kernels/softmax.cu	1	j < n; j += blockDim.x	j <= n; j += blockDim.x
$SRC/kernels/attention_tc.cu	1	if (key < S) x =	if (key <= S) x =
$SRC/kernels/attention_tc.cu	1	b0 = { { r[0], r[1] } }	b0 = { { r[1], r[0] } }
$SRC/kernels/attention_tc.cu	1	z[2] = keep_z(odd ? r.z : o0, a);	z[2] = keep_z(odd ? r.z : o1, a);
$SRC/kernels/attention_tc.cu	1	c < a.d; c += 32	c < a.d - 1; c += 32
$SRC/kernels/attention_tc.cu	1	x1 += acc[1];	;
$SRC/kernels/attention_tc.cu	1	(r0 + r < S)	(r0 + r < S - 1)
$SRC/kernels/attention_tc.cu	1	bl_philox_lane(r, j ^ 2), 8)	bl_philox_lane(r, j ^ 1), 8)
$SRC/kernels/dropout.cu	1	i < n; i += (int64_t)gridDim.x * blockDim.x	i < n; i = n
$SRC/kernels/elementwise.cu	1	i < it.n; i += (int64_t)gridDim.x * blockDim.x	i < it.n; i = it.n
$SRC/kernels/optim.cu	1	i < n; i += (int64_t)gridDim.x * blockDim.x	i < n; i = n
$SRC/kernels/layernorm.cu	1	r < rows; r += gridDim.x	r < rows; r = rows
$SRC/kernels/cross_entropy.cu	1	i < n; i += gridDim.x	i < n; i = n
TSV
if [ -n "${BL_MUTANT_ONLY:-}" ]; then
  grep -E "^[^	]*(${BL_MUTANT_ONLY})" "$mutants" >"$mutants.only" || true
  mv "$mutants.only" "$mutants"
fi

killed=0; total=0
while IFS=$'\t' read -r file occ text repl; do
  total=$((total + 1))
  cp "$file" "$file.orig"
  line=$(python3 - "$file" "$occ" "$text" "$repl" <<'PY'
import sys
path, occ, text, repl = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = open(path).read()
pos = -1
for _ in range(occ):
    pos = s.find(text, pos + 1)
    if pos < 0:
        sys.exit("no occurrence %d of %r in %s" % (occ, text, path))
open(path, "w").write(s[:pos] + repl + s[pos + len(text):])
print(s.count("\n", 0, pos) + 1)
PY
)
  what="${file#$SRC/}:$line: '$text' -> '$repl'"
  if ! cmake --build "$WORK/build" -j"$(nproc)" --target "${TESTS[@]}" >"$WORK/build.log" 2>&1; then
    verdict="killed (does not compile)"
  elif ! run_tests "$WORK/build"; then
    verdict="killed ($(grep -m1 -E 'FAIL|emulated CUDA' "$WORK/last.log" | cut -c1-150))"
  elif [ "${BL_MUTANT_TSAN:-0}" = 1 ] && ! run_tsan; then
    verdict="killed by ThreadSanitizer ($(grep -m1 -A3 'WARNING: ThreadSanitizer' "$WORK/tsan.log" \
      | grep -m1 'kernels/' | sed 's/^ *//' | cut -c1-120))"
  else
    verdict="SURVIVED"
  fi
  case "$verdict" in killed*) killed=$((killed + 1)) ;; esac
  echo "$what: $verdict"
  mv "$file.orig" "$file"
  touch "$file"
done <"$mutants"
echo "killed $killed of $total mutants"
