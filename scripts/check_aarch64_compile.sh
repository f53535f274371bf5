#!/usr/bin/env bash
# The test suite's guard for 64-bit Arm (a hook of scripts/test.sh): compiles kiln's six implementation
# translation units (cmake/kiln_impl*.cpp: every kernel, the model code) with Debian's aarch64 cross
# compiler, -Wall -Wextra -Werror, once for Armv8.0 (NEON: the 16-bit qmatmul engine, plus the sdot engine
# compiled under GCC's target pragma for CPUs that have it, chosen at run time) and once for Armv8.2 + dotprod
# (the sdot engine only); the quantized kernels also for -mcpu=cortex-a72, armv8-a+crypto and with
# -DKILN_NO_RUNTIME_DOTPROD. Highway's headers are the host's (the same 1.0.3 on every
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
# compile NAME FLAGS TU: object $OUT/TU.NAME.o. All the configurations' objects are compiled through one
# queue of $JOBS at a time (each configuration waiting for its own was ~35% slower on 2 cores: the
# one-file configurations ran alone).
compile() {
  local name="$1" flags="$2" tu="$3"
  # shellcheck disable=SC2086  # FLAGS is a list of flags
  if ! "$CXX" -std=c++20 -O1 $flags -Wall -Wextra -Werror -c -I"$ROOT/include" -isystem "$OUT/include" \
      -DHWY_WANT_AVX3_DL=1 "-DHWY_DISABLED_TARGETS=(HWY_SVE|HWY_SVE2|HWY_SVE_256|HWY_SVE2_128|HWY_RVV)" \
      -DKILN_EXTERN_ARCHITECTURES=1 "$ROOT/cmake/$tu.cpp" -o "$OUT/$tu.$name.o"; then
    echo "check_aarch64_compile: FAILED: $tu for $flags" >&2
    return 1
  fi
  echo "check_aarch64_compile: $tu compiles for aarch64 $flags"
}
export -f compile
export CXX ROOT OUT
# NAME|FLAGS|TU, one per line.
jobs_list() {
  for tu in kiln_impl kiln_impl_matmul kiln_impl_quant kiln_impl_dequant kiln_impl_i16 kiln_impl_model; do
    echo "armv8-a|-march=armv8-a|$tu"
    echo "armv8.2-a+dotprod|-march=armv8.2-a+dotprod|$tu"
  done
  # The quantized kernels also under flags a user may build with (the run-time copy's pragma must cover
  # them), and with the run-time copy turned off.
  echo "cortex-a72|-mcpu=cortex-a72|kiln_impl_quant"
  echo "crypto|-march=armv8-a+crypto|kiln_impl_quant"
  echo "no-rt|-march=armv8-a -DKILN_NO_RUNTIME_DOTPROD|kiln_impl_quant"
}
rm -f "$OUT"/*.o
if ! jobs_list | xargs -P "${JOBS:-$(nproc)}" -I{} bash -c 'IFS="|" read -r n f t <<< "{}"; compile "$n" "$f" "$t"'; then
  echo "check_aarch64_compile: FAILED" >&2
  exit 1
fi
# sdot instructions in an object: "in the dotprod copy / elsewhere" (functions of namespace portable_dp
# and RowsPortableDotprod are the run-time copy of the byte engine; grep on a file: no pipe to break early).
count_sdot() {
  aarch64-linux-gnu-objdump -d "$1" > "$1.s"
  awk '/^[0-9a-f]+ <.*>:$/ { dp = ($0 ~ /portable_dp|RowsPortableDotprod/) } /\tsdot\t/ { if (dp) a++; else b++ }
       END { printf "%d %d\n", a, b }' "$1.s"
}
read -r dot_in dot_out < <(count_sdot "$OUT/kiln_impl_quant.armv8.2-a+dotprod.o")
read -r v8_in v8_out < <(count_sdot "$OUT/kiln_impl_quant.armv8-a.o")
read -r nort_in nort_out < <(count_sdot "$OUT/kiln_impl_quant.no-rt.o")
if [[ $((dot_in + dot_out)) -eq 0 ]]; then
  echo "check_aarch64_compile: ERROR: no sdot instruction in the dotprod build of the quantized kernels" >&2
  exit 1
fi
if [[ "$v8_in" -eq 0 || "$v8_out" -ne 0 ]]; then
  echo "check_aarch64_compile: ERROR: the Armv8.0 build has $v8_in sdot in its run-time dotprod copy (want some) and $v8_out elsewhere (want none: they would run on CPUs without it)" >&2
  exit 1
fi
if [[ $((nort_in + nort_out)) -ne 0 ]]; then
  echo "check_aarch64_compile: ERROR: $((nort_in + nort_out)) sdot with -DKILN_NO_RUNTIME_DOTPROD" >&2
  exit 1
fi
echo "check_aarch64_compile: sdot instructions: $((dot_in + dot_out)) in the dotprod build; $v8_in in the Armv8.0 build's run-time copy and none elsewhere; none with KILN_NO_RUNTIME_DOTPROD"
echo "check_aarch64_compile: OK"
