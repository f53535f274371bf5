#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` for the side-by-side serving benchmark (bench/serve_compare.sh), from
# the llama.cpp sources that llama-cpp-python's sdist vendors (the version scripts/llamacpp_env.sh pins,
# so both benchmarks measure the same llama.cpp). Tooling only: the kiln build and tests never need it.
#
#   bash scripts/llamaserver_build.sh      # prints the llama-server path on its last line
#
# The build: Release, ggml's x86 kernels for this CPU's instruction sets but AMX (below), OpenMP threads
# (ggml's default), no BLAS, no GPU backends, static libraries, no web UI (no npm, no download: the server runs without its page), only the
# llama-server target. Directory: $LLAMASERVER_DIR (default /work/llamaserver, else <repo>/../llamaserver),
# outside the repository. Idempotent (a stamp records version and flags). Environment: JOBS (default 2).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="$(sed -n 's/^LLAMA_CPP_PYTHON_VERSION=\([0-9.]*\).*/\1/p' "$ROOT/scripts/llamacpp_env.sh")"
[[ -n "$VERSION" ]] || { echo "llamaserver_build: ERROR: no LLAMA_CPP_PYTHON_VERSION in scripts/llamacpp_env.sh" >&2; exit 1; }
if [[ -n "${LLAMASERVER_DIR:-}" ]]; then DIR="$LLAMASERVER_DIR"
elif [[ -d /work ]]; then DIR=/work/llamaserver
else DIR="$(cd "$ROOT/.." && pwd)/llamaserver"; fi
JOBS="${JOBS:-2}"
SRC="$DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$DIR/build"
LOG="$BUILD/build.log"
# ggml's x86 kernels for what this CPU has (GGML_NATIVE=ON's -march=native, option by option), but never AMX:
# built with Debian 12's GCC 12, llama-server stopped with SIGILL at its first AMX tile instruction (GCC 12
# miscompiles llama.cpp's tile configuration; docs/benchmarks.md). On an AMX CPU this slows its prompts:
# scripts/llamacpp_newest.sh builds llama.cpp with its AMX kernels (clang 14) where the CPU grants the tile
# state, and bench/serve_compare.sh uses that build unless LLAMA=pinned.
cpu="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
ISA=""
for pair in sse4_2:SSE42 f16c:F16C fma:FMA bmi2:BMI2 avx:AVX avx2:AVX2 avx_vnni:AVX_VNNI avx512f:AVX512 \
            avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
  if [[ " $cpu " == *" ${pair%%:*} "* ]]; then ISA+=" -DGGML_${pair#*:}=ON"; else ISA+=" -DGGML_${pair#*:}=OFF"; fi
done
ISA+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
FLAGS="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF$ISA -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF"
STAMP="$BUILD/.kiln-llamaserver.stamp"
EXE="$BUILD/bin/llama-server"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$VERSION $FLAGS" && -x "$EXE" ]]; then
  echo "llamaserver_build: $EXE is llama-cpp-python $VERSION's llama.cpp, already built." >&2
else
  for tool in cmake c++ cc; do
    command -v "$tool" >/dev/null || { echo "llamaserver_build: ERROR: '$tool' not found (scripts/install_deps.sh)" >&2; exit 1; }
  done
  if [[ ! -f "$SRC/tools/server/CMakeLists.txt" ]]; then
    mkdir -p "$DIR/src"
    tarball="$DIR/src/llama_cpp_python-$VERSION.tar.gz"
    if [[ ! -f "$tarball" ]]; then
      echo "llamaserver_build: fetching the llama-cpp-python $VERSION sdist from PyPI" >&2
      # --no-binary only for this package: its build requirements (needed to read its metadata) come as wheels.
      python3 -m pip download -q --no-binary llama-cpp-python --no-deps "llama-cpp-python==$VERSION" -d "$DIR/src" >&2 \
        || { echo "llamaserver_build: ERROR: 'pip download llama-cpp-python==$VERSION' failed" >&2; exit 1; }
    fi
    tar -xzf "$tarball" -C "$DIR/src"
  fi
  [[ -f "$SRC/tools/server/CMakeLists.txt" ]] || { echo "llamaserver_build: ERROR: no tools/server in $SRC" >&2; exit 1; }
  mkdir -p "$BUILD"
  echo "llamaserver_build: building llama-server with -j$JOBS (10-20 minutes on 2 cores); log: $LOG" >&2
  # shellcheck disable=SC2086
  if ! { cmake -S "$SRC" -B "$BUILD" $FLAGS && cmake --build "$BUILD" -j"$JOBS" --target llama-server; } > "$LOG" 2>&1; then
    echo "llamaserver_build: ERROR: the build failed. Last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
  [[ -x "$EXE" ]] || { echo "llamaserver_build: ERROR: no $EXE after the build" >&2; exit 1; }
  echo "$VERSION $FLAGS" > "$STAMP"
fi
"$EXE" --version >&2 2>&1 || true
echo "$EXE"
