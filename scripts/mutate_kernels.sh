#!/usr/bin/env bash
# Mutation check of the emulated CUDA device: does the CUDA op test suite, run on the emulator, notice a missing
# barrier, an off-by-one tile bound, a grid-stride loop cut to one pass or a cross-block atomic turned into a plain
# read-modify-write? Deletes each __syncthreads() of kernels/ in turn (and applies a few off-by-one bounds, fragment
# indices, one-pass grid-stride loops and atomics made plain), rebuilds the emulated library in a private copy of the
# tree, runs tests/c/test_cuda_ops.c, test_cuda_attention.c and test_cuda_native.c, and the ops and native tests again
# with BL_CUDA_MAX_GRID=2 (as CI does), and counts the mutants they kill (wrong result, emulator report or fault; a
# timeout counts as killed too).
# usage: scripts/mutate_kernels.sh [WORK_DIR]      (default /tmp/bertlua-mutants; the checkout is not modified)
#   BL_MUTANT_TSAN=1 also runs each surviving mutant under the ThreadSanitizer build (test_cuda_native and
#     test_cuda_ops, or the tests named in BL_MUTANT_TSAN_TESTS, with two blocks in flight, BL_EMU_BLOCKS=2, as CI
#     runs them): a plain += between blocks is seen there only.
#   BL_MUTANT_ONLY=REGEX keeps the mutants whose file and text match (e.g. attention_tc, or 'atomic').
#   BL_MUTANT_TESTS="test_cuda_native ..." runs only these of the three (quicker, for mutants of kernels they cover).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-/tmp/bertlua-mutants}"
SRC="$WORK/src"
rm -rf "$SRC" && mkdir -p "$SRC"
# the working tree as it is (tracked and new files), without build directories
(cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 tar -cf - ) | tar -xf - -C "$SRC"
# a run stopped during a mutant left that kernel's objects mutated (the copy keeps the old mtime): rebuild them
if [ -f "$WORK/mutating" ]; then touch "$SRC/$(cat "$WORK/mutating")"; rm -f "$WORK/mutating"; fi
flags=(-DBERTLUA_CUDA_EMU=ON)
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" >/dev/null
read -r -a TESTS <<<"${BL_MUTANT_TESTS:-test_cuda_ops test_cuda_native test_cuda_attention}"
read -r -a TSAN_TESTS <<<"${BL_MUTANT_TSAN_TESTS:-test_cuda_native test_cuda_ops}"
cmake --build "$WORK/build" -j"$(nproc)" --target "${TESTS[@]}" >/dev/null
if [ "${BL_MUTANT_TSAN:-0}" = 1 ]; then
  cmake -S "$SRC" -B "$WORK/build-tsan" -DCMAKE_BUILD_TYPE=Release -DBERTLUA_CUDA_EMU_TSAN=ON >/dev/null
  cmake --build "$WORK/build-tsan" -j"$(nproc)" --target "${TSAN_TESTS[@]}" >/dev/null
fi
run_tests() {   # 0: the suites pass (mutant survives); the op tests also with grids capped, as CI runs them
  local t
  for t in "${TESTS[@]}"; do
    (cd "$SRC" && BL_SHARED_DATA="$ROOT/../shared/data" timeout 600 "$1/$t" >"$WORK/last.log" 2>&1) || return 1
  done
  for t in "${TESTS[@]}"; do
    [ "$t" = test_cuda_attention ] && continue
    (cd "$SRC" && BL_CUDA_MAX_GRID=2 BL_SHARED_DATA="$ROOT/../shared/data" timeout 600 "$1/$t" >"$WORK/last.log" 2>&1) ||
      return 1
  done
}
run_tsan() {    # 0: the TSan build compiles and reports no race
  local t
  cmake --build "$WORK/build-tsan" -j"$(nproc)" --target "${TSAN_TESTS[@]}" >/dev/null 2>&1 || return 1
  for t in "${TSAN_TESTS[@]}"; do
    (cd "$SRC" && BL_EMU_BLOCKS=2 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="exitcode=66 halt_on_error=1" \
      BL_SHARED_DATA="$ROOT/../shared/data" timeout 1800 "$WORK/build-tsan/$t" >"$WORK/tsan.log" 2>&1) || return 1
  done
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
$SRC/kernels/softmax.cu	1	r < rows; r += gridDim.x	r < rows; r = rows
$SRC/kernels/accuracy.cu	1	r < rows; r += gridDim.x	r < rows; r = rows
$SRC/kernels/embedding.cu	1	r < rows; r += gridDim.x	r < rows; r = rows
$SRC/kernels/activation.cu	1	i < n; i += (int64_t)gridDim.x * blockDim.x	i < n; i = n
$SRC/kernels/attention.cu	1	w < rows; w += ((int64_t)gridDim.x * blockDim.x) >> 5	w < rows; w = rows
$SRC/kernels/accuracy.cu	1	atomicAdd(&res[1], 1ull);	res[1] += 1ull;
$SRC/kernels/accuracy.cu	1	atomicAdd(&res[0], 1ull);	res[0] += 1ull;
$SRC/kernels/cross_entropy.cu	1	else atomicAdd(&res[1], 1ull);	else res[1] += 1ull;
$SRC/kernels/cross_entropy.cu	1	atomicAdd(cnt, 1ull);	*cnt += 1ull;
$SRC/kernels/cross_entropy.cu	1	atomicMin(&res[0], (unsigned long long)i);	res[0] = min(res[0], (unsigned long long)i);
$SRC/kernels/deferred.cu	1	atomicMin(&r->cand, (unsigned long long)i);	r->cand = min(r->cand, (unsigned long long)i);
$SRC/kernels/embedding.cu	1	atomicMin(first_bad, (unsigned long long)i);	*first_bad = min(*first_bad, (unsigned long long)i);
$SRC/kernels/optim.cu	1	atomicOr(flag, 1);	*flag |= 1;
$SRC/kernels/attention.cu	1	atomicAdd(rec, (int)n);	*rec += (int)n;
$SRC/kernels/attention.cu	1	atomicMax(&last, mine);	last = max(last, mine);
$SRC/kernels/embedding.cu	1	atomicAdd(&hist[(keys[base + k] >> shift) & (kDigits - 1)], 1);	hist[(keys[base + k] >> shift) & (kDigits - 1)] += 1;
TSV
if [ -n "${BL_MUTANT_ONLY:-}" ]; then
  grep -E "${BL_MUTANT_ONLY}" "$mutants" >"$mutants.only" || true
  mv "$mutants.only" "$mutants"
fi

killed=0; total=0
while IFS=$'\t' read -r file occ text repl; do
  total=$((total + 1))
  cp "$file" "$file.orig"
  echo "${file#"$SRC"/}" >"$WORK/mutating"
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
  rm -f "$WORK/mutating"
done <"$mutants"
echo "killed $killed of $total mutants"
