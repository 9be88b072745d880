#!/usr/bin/env bash
# Static checks of the real CUDA build: compiles every kernels/*.cu for the
# shipped architectures (sm_80, sm_90) with ptxas' resource report and fails
# if any kernel spills registers or uses local memory (a stack frame: arrays
# indexed at run time, large-argument trig reductions, ...). Prints a table
# of registers, shared memory and stack per kernel and architecture. Then the tensor-core gate: the SASS of
# every attention kernel in kernels/attention_tc.cu must contain HMMA (cuobjdump + nvdisasm from PyPI,
# scripts/requirements-test.txt; where they are missing it falls back to mma.sync in the PTX and says so).
# usage: scripts/ptxas_check.sh [kernels/foo.cu ...]   (default: all)
# Needs nvcc (CUDA toolkit); exits 77 (skipped) without one.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
if [ ! -x "$NVCC" ]; then echo "ptxas_check: skipped, no nvcc"; exit 77; fi
ARCHS="${BL_PTXAS_ARCHS:-80 90}"
FILTER="$(command -v c++filt || echo cat)"
GENCODE=()
for a in $ARCHS; do GENCODE+=(-gencode "arch=compute_$a,code=sm_$a"); done
# ptx_wrappers.cu instantiates kernels/ptx.cuh (inline PTX no kernel may use yet).
if [ $# -gt 0 ]; then FILES=("$@"); else FILES=("$ROOT"/kernels/*.cu "$ROOT/scripts/ptx_wrappers.cu"); fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

status=0
for f in "${FILES[@]}"; do
  name="$(basename "$f")"
  # The Release flags of CMakeLists.txt (-O3 -DNDEBUG, relaxed constexpr).
  if ! "$NVCC" -c -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -I"$ROOT/src" -I"$ROOT/kernels" "${GENCODE[@]}" \
        -Xptxas -warn-spills,-warn-lmem-usage -res-usage -o "$TMP/$name.o" "$f" 2>"$TMP/$name.log"; then
    cat "$TMP/$name.log"; echo "ptxas_check: $name does not compile"; status=1; continue
  fi
  # One row per entry function and arch: file kernel arch regs smem stack spill_stores spill_loads
  awk -v file="$name" '
    /Compiling entry function/ { split($0, q, "'\''"); fn = q[2]; arch = q[4]; entry = 1; next }
    /Function properties for/  { split($0, w, "for "); if (w[2] != fn) entry = 0; next }
    entry && /bytes stack frame/   { stack = $1; sst = $5; sld = $9 }
    entry && /Used [0-9]+ registers/ {
      regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
      smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11)
      print file, fn, arch, regs, smem, stack, sst, sld; entry = 0
    }' "$TMP/$name.log" >> "$TMP/rows"
  if grep -E "Local memory used|spill" "$TMP/$name.log" | grep -v " 0 bytes spill stores, 0 bytes spill loads" \
       | grep -q .; then
    grep -E "Local memory used|[1-9][0-9]* bytes spill" "$TMP/$name.log" | "$FILTER" | sed "s/^/$name: /"
    status=1
  fi
done

printf '%-17s %-7s %5s %7s %6s %6s  %s\n' file arch regs smem_B stack spill kernel
sort -k1,1 -k3,3 -k2,2 "$TMP/rows" | while read -r file fn arch regs smem stack sst sld; do
  kernel="$(echo "$fn" | "$FILTER" | sed -E 's/^void //; s/\(anonymous namespace\):://g; s/\((int|long)\)//g; s/\(.*//; s/ //g')"
  printf '%-17s %-7s %5s %7s %6s %6s  %s\n' "$file" "$arch" "$regs" "$smem" "$stack" "$((sst + sld))" "$kernel"
  if [ "$stack" != 0 ] || [ "$sst" != 0 ] || [ "$sld" != 0 ]; then status=1; fi
done || status=1
# the while loop runs in a subshell: re-check the rows for the exit status
if awk '$6 != 0 || $7 != 0 || $8 != 0 { bad = 1 } END { exit !bad }' "$TMP/rows"; then status=1; fi

# Tensor-core gate: each attn_tc_* kernel (dsum aside: no product) must issue HMMA on every architecture.
TC="$ROOT/kernels/attention_tc.cu"
CUOBJDUMP="$(command -v cuobjdump || true)"
for sp in $(/usr/bin/python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
  for c in "$sp"/nvidia/cu*/bin/cuobjdump; do [ -z "$CUOBJDUMP" ] && [ -x "$c" ] && CUOBJDUMP="$c"; done
done
for a in $ARCHS; do
  if [ -n "$CUOBJDUMP" ]; then
    "$NVCC" -cubin -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -I"$ROOT/src" -I"$ROOT/kernels" -arch=sm_$a \
      -o "$TMP/tc_$a.cubin" "$TC"
    PATH="$(dirname "$CUOBJDUMP"):$PATH" "$CUOBJDUMP" -sass "$TMP/tc_$a.cubin" > "$TMP/tc_$a.sass"
    what=HMMA; pat='HMMA'; fn_pat='Function : '
  else
    echo "ptxas_check: no cuobjdump (pip install -r scripts/requirements-test.txt): checking the PTX for mma.sync"
    "$NVCC" -ptx -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -I"$ROOT/src" -I"$ROOT/kernels" -arch=sm_$a \
      -o "$TMP/tc_$a.sass" "$TC"
    what=mma.sync; pat='mma\.sync'; fn_pat='\.entry '
  fi
  # count per function: the text after the function marker names it, instructions follow until the next one
  awk -v fpat="$fn_pat" -v ipat="$pat" '
    $0 ~ fpat { fn = $0; sub(".*" fpat, "", fn); sub(/[( ].*/, "", fn); if (fn ~ /attn_tc_(fwd|bwd)/) n[fn] = 0; next }
    fn in n && $0 ~ ipat { n[fn]++ }
    END { for (f in n) print f, n[f] }' "$TMP/tc_$a.sass" > "$TMP/tc_$a.count"
  kernels=$(wc -l < "$TMP/tc_$a.count")
  if [ "$kernels" -lt 12 ] || awk '$2 == 0 { bad = 1 } END { exit !bad }' "$TMP/tc_$a.count"; then
    echo "ptxas_check: sm_$a: attention kernels without $what:"; "$FILTER" < "$TMP/tc_$a.count"; status=1
  else
    echo "ptxas_check: sm_$a: $what in all $kernels tensor-core attention kernels" \
      "($(awk '{ s += $2 } END { print s }' "$TMP/tc_$a.count") instructions)"
  fi
done

# Operand check of kernels/ptx.cuh (the probes of scripts/ptx_wrappers.cu): each HMMA's A, B, C registers hold the
# probe's constants in the order the wrapper names them (a.x[0..3], b.x[0..1], c.x[0..3]), D and each LDSM result are
# stored in register order. The emulated build never compiles the inline PTX, so this is what fails in CI when an asm
# operand list is out of order (the hardware check is test_ptx, scripts/gpu_check.sh stage 1).
if [ -n "$CUOBJDUMP" ]; then
  for a in $ARCHS; do
    "$NVCC" -cubin -O3 -DNDEBUG -std=c++17 -I"$ROOT/kernels" -arch=sm_$a -o "$TMP/probe_$a.cubin" \
      "$ROOT/scripts/ptx_wrappers.cu"
    PATH="$(dirname "$CUOBJDUMP"):$PATH" "$CUOBJDUMP" -sass "$TMP/probe_$a.cubin" > "$TMP/probe_$a.sass"
    if ! awk -v arch="sm_$a" -f - "$TMP/probe_$a.sass" <<'AWK'
function reg(s) { gsub(/[^0-9]/, "", s); return s + 0 }
function hex(s,   n, i) { n = 0; s = tolower(s); for (i = 3; i <= length(s); i++) n = 16 * n + index("0123456789abcdef", substr(s, i, 1)) - 1; return n }
function want(r, v, what) {
  if (imm[r] != v) { printf "ptxas_check: %s %s: %s is R%d = %s, want %s\n", arch, fn, what, r, imm[r], v; bad = 1 }
}
/Function : / { fn = $NF; delete imm; base = -1; if (fn ~ /probe/) seen[fn] = 0; next }
fn !~ /probe/ { next }
/ (MOV|IMAD\.MOV\.U32) R[0-9]+, (RZ, RZ, )?0x[0-9a-f]+ ;/ {
  split($0, w, /[ ,;]+/); for (i in w) if (w[i] ~ /^(MOV|IMAD\.MOV\.U32)$/) { r = reg(w[i + 1]) }
  v = $0; sub(/ ;.*/, "", v); sub(/.* /, "", v); imm[r] = v
}
/ HMMA\.16816/ {
  split($0, w, /[ ,;]+/); for (i in w) if (w[i] ~ /^HMMA/) { d = reg(w[i + 1]); A = reg(w[i + 2]); B = reg(w[i + 3]); C = reg(w[i + 4]) }
  ty = (fn ~ /bf16/) ? "BF16" : ""; if ((ty == "BF16") != ($0 ~ /\.BF16 /)) { print "ptxas_check: " arch " " fn ": wrong HMMA type"; bad = 1 }
  for (k = 0; k < 4; k++) want(A + k, sprintf("0x%d%d%d%d%d%d%d%d", k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1), "A register " k)
  want(B, "0x55555555", "B register 0"); want(B + 1, "0x66666666", "B register 1")
  split("0x3f800000 0x40000000 0x40400000 0x40800000", cf, " ")
  for (k = 0; k < 4; k++) want(C + k, cf[k + 1], "C register " k)
  base = d; seen[fn]++
}
/ LDSM\.16\.M88\.4 / { split($0, w, /[ ,;]+/); for (i in w) if (w[i] ~ /^LDSM/) base = reg(w[i + 1]); seen[fn]++ }
/ STG\.E / && base >= 0 {
  off = 0; if (match($0, /\+0x[0-9a-f]+\]/)) off = hex(substr($0, RSTART + 1, RLENGTH - 2))
  v = $0; sub(/ ;.*/, "", v); sub(/.*, /, "", v)
  if (reg(v) != base + off / 4) { printf "ptxas_check: %s %s: the value stored at +%d is R%d, want R%d\n", arch, fn, off, reg(v), base + off / 4; bad = 1 }
  stores[fn]++
}
END {
  n = 0
  for (f in seen) { n++; if (seen[f] != 1 || stores[f] != 4) { print "ptxas_check: " arch " " f ": expected one HMMA/LDSM and 4 stores"; bad = 1 } }
  if (n < 3) { print "ptxas_check: " arch ": probes missing"; bad = 1 }
  exit bad
}
AWK
    then status=1
    else echo "ptxas_check: sm_$a: HMMA and LDSM operands in the order ptx.cuh's wrappers name them (3 probes)"; fi
  done
fi

if [ "$status" = 0 ]; then
  echo "ptxas_check: $(wc -l < "$TMP/rows") kernel builds, no spills, no local memory"
else
  echo "ptxas_check: FAILED (spills or local memory above)"
fi
exit $status
