#!/usr/bin/env bash
# Creates (or updates) the llama.cpp reference environment used only by the side-by-side benchmark
# (bench/compare.sh). Tooling only: the kiln build and test suite never need it.
#
#   bash scripts/llamacpp_env.sh            # -> $LLAMACPP_ENV (default: /work/llamaenv, else <repo>/../llamaenv)
#
# It installs llama-cpp-python (pinned below) from PyPI, built from source here (llama.cpp is vendored
# in its sdist) as a fair Release build for this CPU: -O3 (CMAKE_BUILD_TYPE=Release), -march=native
# (GGML_NATIVE=ON), OpenMP threads (ggml's default), no BLAS, no GPU backends, no multimodal library.
# The CMake build directory is kept in the venv (build/), so a rerun rebuilds only what changed.
# Idempotent: when the venv already holds this version built with these flags it only says so.
# Prints the venv's python path on its last line:  PY=$(bash scripts/llamacpp_env.sh | tail -n1)
# Environment: LLAMACPP_ENV (venv path), JOBS (build parallelism, default 2), LOG (build log file).
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36   # vendors llama.cpp; the exact llama.cpp commit is printed at the end
GGUF_VERSION=0.19.0               # gguf-py, to read tensor sizes in bench/compare_llamacpp.py

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${LLAMACPP_ENV:-}" ]]; then VENV="$LLAMACPP_ENV"
elif [[ -d /work ]]; then VENV=/work/llamaenv
else VENV="$(cd "$ROOT/.." && pwd)/llamaenv"; fi
JOBS="${JOBS:-2}"
LOG="${LOG:-$VENV/build.log}"

# Release, -march=native, no accelerator backends, no llava/mtmd (not needed for text models).
CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
want="llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION gguf==$GGUF_VERSION $CMAKE_FLAGS"
STAMP="$VENV/.kiln-llamacpp.stamp"

PY_BOOT=/usr/bin/python3
[[ -x "$PY_BOOT" ]] || PY_BOOT="$(command -v python3 || true)"
[[ -n "$PY_BOOT" ]] || { echo "llamacpp_env: ERROR: python3 not found (scripts/install_deps.sh)." >&2; exit 1; }

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] \
   && "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "llamacpp_env: $VENV already has llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (native Release build)." >&2
else
  for tool in cmake c++ cc; do
    command -v "$tool" >/dev/null || { echo "llamacpp_env: ERROR: '$tool' not found (scripts/install_deps.sh installs it)." >&2; exit 1; }
  done
  if [[ ! -x "$VENV/bin/python" ]]; then
    echo "llamacpp_env: creating $VENV" >&2
    "$PY_BOOT" -m venv "$VENV" || { echo "llamacpp_env: ERROR: '$PY_BOOT -m venv $VENV' failed (apt-get install python3-venv)." >&2; exit 1; }
  fi
  "$VENV/bin/python" -m pip install -q "gguf==$GGUF_VERSION" >&2
  echo "llamacpp_env: building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from source with -j$JOBS" \
       "(15-30 minutes on 2 cores); log: $LOG" >&2
  mkdir -p "$VENV/build"
  if ! CMAKE_ARGS="$CMAKE_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" FORCE_CMAKE=1 \
       "$VENV/bin/python" -m pip install -v --no-binary llama-cpp-python \
       --config-settings=build-dir="$VENV/build" \
       "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" > "$LOG" 2>&1; then
    echo "llamacpp_env: ERROR: building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION failed. Last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
  if ! "$VENV/bin/python" -c "import llama_cpp" >&2; then
    echo "llamacpp_env: ERROR: llama-cpp-python installed but 'import llama_cpp' fails (see above; log: $LOG)." >&2
    exit 1
  fi
  echo "$want" > "$STAMP"
  echo "llamacpp_env: done." >&2
fi
"$VENV/bin/python" - >&2 <<'EOF'
import llama_cpp, pathlib
lib = pathlib.Path(llama_cpp.__file__).parent / "lib"
print(f"llamacpp_env: llama-cpp-python {llama_cpp.__version__}; libraries: {sorted(p.name for p in lib.glob('*.so*'))}")
print("llamacpp_env: llama.cpp system info:", llama_cpp.llama_print_system_info().decode().strip())
EOF
echo "$VENV/bin/python"
