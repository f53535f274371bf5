#!/usr/bin/env bash
# kiln on 64-bit Arm, from an x86-64 Debian 12 host: cross-compiles the tests for aarch64 (Highway's NEON
# target) and runs them under user-mode QEMU. What it does, each step skipped when already done:
#   1. apt: g++-aarch64-linux-gnu (with its C library) and qemu-user;
#   2. Debian's arm64 packages of Highway (libhwy1, libhwy-dev) and the header-only test dependencies,
#      fetched through a temporary apt source (removed again) and unpacked into $BUILD/sysroot;
#   3. cmake with cmake/toolchains/aarch64-linux-gnu.cmake, build, ctest (each test under qemu-aarch64).
# QEMU runs the code 20-50x slower than the host, so the run leaves out, by name:
#   - model.hf* and model.kv cache: SmolLM2*: forward passes of the real models against transformers
#     (SmolLM2, Gemma 3: over 10 minutes each here); the tiny stories260K model, the synthetic and the
#     tiny random HF models still run end to end, and the real models' tokenizers and chat templates;
#   - the two huge-page checks (io.MappedFile ... huge pages, io.kiln::set_huge_pages): QEMU's
#     /proc/self/smaps does not report the guest's transparent-huge-page eligibility;
#   - package.*: the install / add_subdirectory consumer builds configure a fresh project with the host's
#     package search, not this toolchain's; packaging is the same on every CPU and the x86 suite runs them;
#   - examples.kiln-quantize* and examples.kiln_chat*: they start the Arm example programs as child
#     processes, which the x86 host cannot execute directly (examples.custom_arch runs). Instead the script
#     ends by generating text with kiln-generate under QEMU (stories260K from ../shared/models).
# Timing under QEMU means nothing: speed on Arm needs Arm hardware.
#
# Environment: BUILD (default build/aarch64), JOBS (default nproc), CTEST_ARGS (extra ctest arguments),
# AARCH64_CXXFLAGS (e.g. -march=armv8.2-a+dotprod: the quantized products then have only the sdot kernels,
# which QEMU runs; give it its own BUILD). The default (baseline Armv8.0) build has both kernel sets and picks
# at run time: the script ends by checking that choice on an emulated CPU without the dot product and on
# one with it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build/aarch64}"
JOBS="${JOBS:-$(nproc)}"
SYSROOT="$BUILD/sysroot"
mkdir -p "$BUILD"

if [[ $(id -u) -eq 0 ]]; then SUDO=(); elif command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else SUDO=(false); fi
export DEBIAN_FRONTEND=noninteractive

# 1. Cross compiler and QEMU.
if ! command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1; then
  echo "cross_aarch64: installing g++-aarch64-linux-gnu and qemu-user"
  "${SUDO[@]}" apt-get install -y --no-install-recommends g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user || {
    echo "cross_aarch64: ERROR: could not install g++-aarch64-linux-gnu / qemu-user (root or sudo needed)" >&2
    exit 1
  }
fi

# 2. arm64 Highway and the header-only dependencies, unpacked (never installed into the host).
if [[ ! -f "$SYSROOT/usr/include/hwy/highway.h" || ! -f "$SYSROOT/usr/lib/aarch64-linux-gnu/libhwy.so" ]]; then
  echo "cross_aarch64: fetching Debian's arm64 Highway into $SYSROOT"
  list=/etc/apt/sources.list.d/kiln-cross-arm64.list
  suite="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
  restore() { "${SUDO[@]}" rm -f "$list"; "${SUDO[@]}" apt-get update -qq >/dev/null 2>&1 || true; }
  trap restore EXIT
  echo "deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" |
    "${SUDO[@]}" tee "$list" >/dev/null
  apt_arm64=(-o APT::Architectures::=amd64 -o APT::Architectures::=arm64)
  "${SUDO[@]}" apt-get "${apt_arm64[@]}" update -qq
  debs="$BUILD/debs"
  rm -rf "$debs" && mkdir -p "$debs"
  (cd "$debs" && apt-get "${apt_arm64[@]}" download libhwy1:arm64 libhwy-dev:arm64 doctest-dev libeigen3-dev \
    nlohmann-json3-dev)
  rm -rf "$SYSROOT" && mkdir -p "$SYSROOT"
  for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$SYSROOT"; done
  restore
  trap - EXIT
  [[ -f "$SYSROOT/usr/lib/aarch64-linux-gnu/libhwy.so" ]] || { echo "cross_aarch64: ERROR: no arm64 libhwy.so" >&2; exit 1; }
fi

# 3. Configure, build, test.
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/toolchains/aarch64-linux-gnu.cmake" \
  -DKILN_AARCH64_SYSROOT="$SYSROOT" -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_EXAMPLES=ON \
  -DCMAKE_CXX_FLAGS="${AARCH64_CXXFLAGS:-}"
cmake --build "$BUILD" -j"$JOBS"
# shellcheck disable=SC2086
ctest --test-dir "$BUILD" --output-on-failure -j"$JOBS" \
  -E '^model\.hf|^model\.kv cache: SmolLM2|huge pages|set_huge_pages|^package\.|^examples\.kiln' ${CTEST_ARGS:-}

# The run-time choice of the sdot kernels (a baseline build: core/config.hpp's KILN_ARM_RUNTIME_DOTPROD)
# against what the emulated CPU offers: an Armv8.0 core without the dot product, and QEMU's "max" with it.
# (ctest above ran on "max": every test on both engines, through the targets NEON_DOTPROD and NEON.)
if [[ "${AARCH64_CXXFLAGS:-}" != *dotprod* && "${AARCH64_CXXFLAGS:-}" != *mcpu* ]]; then
  for cpu_expect in cortex-a57:0 max:1; do
    cpu="${cpu_expect%%:*}"
    echo "cross_aarch64: run-time dotprod detection on QEMU's $cpu"
    qemu-aarch64 -cpu "$cpu" -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH="$SYSROOT/usr/lib/aarch64-linux-gnu" \
      -E KILN_TEST_EXPECT_DOTPROD="${cpu_expect##*:}" "$BUILD/tests/kiln_test_core" -tc='simd:*'
  done
  echo "cross_aarch64: the quantized products on an Armv8.0 CPU (cortex-a57: the 16-bit engine only)"
  qemu-aarch64 -cpu cortex-a57 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH="$SYSROOT/usr/lib/aarch64-linux-gnu" \
    "$BUILD/tests/kiln_test_ops" -tc='qmatmul q4_0*,qmatmul q6_K*'
fi

stories="$ROOT/../shared/models/stories260K.gguf"
if [[ -f "$stories" ]]; then
  echo "cross_aarch64: kiln-generate on aarch64 (QEMU), stories260K, greedy:"
  qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH="$SYSROOT/usr/lib/aarch64-linux-gnu" \
    "$BUILD/examples/kiln-generate" -m "$stories" -p "Once upon a time" -n 48 --temp 0
fi
