#!/usr/bin/env bash
# Builds a llama.cpp (libllama.so and its ggml libraries) limited to one x86 instruction-set level, of the
# same version as the reference environment of scripts/llamacpp_env.sh, for comparing kiln and llama.cpp
# as they run on an older CPU (bench/compare.sh with COMPARE_TARGET=AVX2 or SSE4; kiln's side runs the
# kernels of that target through kiln-bench-e2e --target). Tooling only: the kiln build and test suite
# never need it.
#
#   bash scripts/llamacpp_cpu.sh [AVX2|SSE4]   # default AVX2; prints the library directory on its last line
#
# The source is llama-cpp-python's sdist (it vendors llama.cpp), fetched from PyPI once into the venv. The
# build: Release, GGML_NATIVE=OFF, shared libraries, no BLAS and no GPU backends, and
#   AVX2: AVX, AVX2, FMA, F16C and BMI2 on (no AVX-512, no AVX-VNNI): llama.cpp's x86-64-v3 release builds;
#   SSE4: SSE4.2 only (no AVX, FMA or F16C): x86-64-v2, the x86 stand-in for a 128-bit SIMD CPU.
# The CPU backend's system info is checked (AVX2 = 1 and AVX512 = 0, or SSE3 = 1 and AVX = 0).
# Idempotent (a stamp records the flags). Environment: JOBS (build parallelism, default 2).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/scripts/llamacpp_env.sh" | tail -n1)"
VENV="$(cd "$(dirname "$PY")/.." && pwd)"
VERSION="$(sed -n 's/^LLAMA_CPP_PYTHON_VERSION=\([0-9.]*\).*/\1/p' "$ROOT/scripts/llamacpp_env.sh")"
[[ -n "$VERSION" ]] || { echo "llamacpp_cpu: ERROR: no LLAMA_CPP_PYTHON_VERSION in scripts/llamacpp_env.sh" >&2; exit 1; }
JOBS="${JOBS:-2}"
LEVEL="${1:-AVX2}"
SRC="$VENV/src/llama_cpp_python-$VERSION"
COMMON="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DBUILD_SHARED_LIBS=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
case "$LEVEL" in
  AVX2) BUILD="$VENV/avx2-build"
        FLAGS="$COMMON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
        CHECK='"AVX2 = 1" in info and "AVX512 = 1" not in info' ;;
  SSE4) BUILD="$VENV/sse4-build"
        FLAGS="$COMMON -DGGML_SSE42=ON -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF"
        CHECK='"SSE3 = 1" in info and "AVX = 1" not in info' ;;
  *) echo "llamacpp_cpu: ERROR: level '$LEVEL' (AVX2 or SSE4)" >&2; exit 1 ;;
esac
STAMP="$BUILD/.kiln-level.stamp"
LOG="$BUILD/build.log"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$VERSION $FLAGS" && -f "$BUILD/bin/libllama.so" ]]; then
  echo "llamacpp_cpu: $BUILD/bin already has the $LEVEL build of llama-cpp-python $VERSION's llama.cpp." >&2
else
  if [[ ! -d "$SRC/vendor/llama.cpp" ]]; then
    mkdir -p "$VENV/src"
    if [[ ! -f "$VENV/src/llama_cpp_python-$VERSION.tar.gz" ]]; then
      echo "llamacpp_cpu: fetching the llama-cpp-python $VERSION sdist from PyPI" >&2
      "$PY" -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$VENV/src" >&2 \
        || { echo "llamacpp_cpu: ERROR: 'pip download llama-cpp-python==$VERSION' failed" >&2; exit 1; }
    fi
    tar -xzf "$VENV/src/llama_cpp_python-$VERSION.tar.gz" -C "$VENV/src"
  fi
  [[ -d "$SRC/vendor/llama.cpp" ]] || { echo "llamacpp_cpu: ERROR: $SRC/vendor/llama.cpp missing after unpacking" >&2; exit 1; }
  mkdir -p "$BUILD"
  echo "llamacpp_cpu: building llama.cpp ($LEVEL only) with -j$JOBS (5-10 minutes on 2 cores); log: $LOG" >&2
  # shellcheck disable=SC2086
  if ! { cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" $FLAGS && cmake --build "$BUILD" -j"$JOBS" --target llama; } \
       > "$LOG" 2>&1; then
    echo "llamacpp_cpu: ERROR: the build failed. Last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
  [[ -f "$BUILD/bin/libllama.so" ]] || { echo "llamacpp_cpu: ERROR: no $BUILD/bin/libllama.so after the build" >&2; exit 1; }
  echo "$VERSION $FLAGS" > "$STAMP"
fi
LLAMA_CPP_LIB_PATH="$BUILD/bin" "$PY" - "$LEVEL" "$CHECK" >&2 <<'EOF'
import sys
import llama_cpp
info = llama_cpp.llama_print_system_info().decode().strip()
print("llamacpp_cpu: system info:", info)
if not eval(sys.argv[2]):
    raise SystemExit(f"llamacpp_cpu: ERROR: the loaded llama.cpp is not the {sys.argv[1]}-only build")
EOF
echo "$BUILD/bin"
