#!/usr/bin/env bash
# The test suite's guard for 64-bit Arm (a hook of scripts/test.sh): compiles kiln's three implementation
# translation units (cmake/kiln_impl*.cpp: every kernel, the model code) with Debian's aarch64 cross
# compiler, -Wall -Wextra -Werror, once for Armv8.0 (NEON, the 16-bit qmatmul engine) and once for
# Armv8.2 + dotprod (the sdot engine). Highway's headers are the host's (the same 1.0.3 on every
# architecture). Compiling only (no arm64 libhwy to link against); scripts/cross_aarch64.sh builds and runs
# the whole test suite under QEMU.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CXX=aarch64-linux-gnu-g++
command -v "$CXX" >/dev/null 2>&1 || {
  echo "check_aarch64_compile: ERROR: $CXX not found (scripts/install_deps.sh installs g++-aarch64-linux-gnu)" >&2
  exit 1
}
OUT="${BUILD:-$ROOT/build}/aarch64-compile"
mkdir -p "$OUT/include"
# Only Highway and nlohmann-json from the host's /usr/include: never its x86 C library headers.
ln -sfn /usr/include/hwy "$OUT/include/hwy"
ln -sfn /usr/include/nlohmann "$OUT/include/nlohmann"
status=0
for march in armv8-a armv8.2-a+dotprod; do
  pids=()
  for tu in kiln_impl kiln_impl_quant kiln_impl_model; do
    "$CXX" -std=c++20 -O1 -march="$march" -Wall -Wextra -Werror -c -I"$ROOT/include" -isystem "$OUT/include" \
      -DHWY_WANT_AVX3_DL=1 "-DHWY_DISABLED_TARGETS=(HWY_SVE|HWY_SVE2|HWY_SVE_256|HWY_SVE2_128|HWY_RVV)" \
      -DKILN_EXTERN_ARCHITECTURES=1 "$ROOT/cmake/$tu.cpp" -o "$OUT/$tu.$march.o" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  if [[ $status -ne 0 ]]; then
    echo "check_aarch64_compile: FAILED for -march=$march" >&2
    exit 1
  fi
  echo "check_aarch64_compile: kiln compiles for aarch64 -march=$march"
done
# The sdot engine is in the dotprod objects, and only there. (grep -c on a file: no pipe to break early.)
aarch64-linux-gnu-objdump -d "$OUT/kiln_impl_quant.armv8.2-a+dotprod.o" > "$OUT/quant.dotprod.s"
aarch64-linux-gnu-objdump -d "$OUT/kiln_impl_quant.armv8-a.o" > "$OUT/quant.armv8.s"
n_dot="$(grep -c 'sdot' "$OUT/quant.dotprod.s" || true)"
n_v8="$(grep -c 'sdot' "$OUT/quant.armv8.s" || true)"
if [[ "$n_dot" -eq 0 ]]; then
  echo "check_aarch64_compile: ERROR: no sdot instruction in the dotprod build of the quantized kernels" >&2
  exit 1
fi
if [[ "$n_v8" -ne 0 ]]; then
  echo "check_aarch64_compile: ERROR: $n_v8 sdot in the Armv8.0 build (it would not run on an Armv8.0 CPU)" >&2
  exit 1
fi
echo "check_aarch64_compile: $n_dot sdot instructions in the dotprod build, none in the Armv8.0 one"
echo "check_aarch64_compile: OK"
