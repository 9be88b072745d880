#!/usr/bin/env bash
# Installs what bertlua needs to build and test, from Debian's packages.
# Idempotent: does nothing when everything is already there.
set -euo pipefail
PKGS=(build-essential cmake pkg-config
      libluajit2-5.1-dev lua-cjson-dev libopenmpi-dev openmpi-bin libopenblas-dev
      libbz2-dev libutf8proc-dev libedit-dev bzip2 curl time lua-check clang-format
      libblis-dev libdnnl-dev  # GEMM candidates measured against OpenBLAS by tools/bench_gemm.c
      python3 python3-numpy python3-torch
      jupyter-nbconvert python3-nbconvert python3-nbclient python3-ipykernel python3-matplotlib)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "bertlua: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
# Optional Python packages used as references by some tests (skipped when absent).
if [ -f "$(dirname "$0")/requirements-test.txt" ] && [ -s "$(dirname "$0")/requirements-test.txt" ]; then
  /usr/bin/python3 -m pip install -q --break-system-packages -r "$(dirname "$0")/requirements-test.txt" \
    || echo "bertlua: optional test references could not be installed; those tests will skip"
fi
