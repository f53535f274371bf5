#!/usr/bin/env bash
# kiln vs llama.cpp, side by side on the same GGUF files (one command):
#
#   bash bench/compare.sh                      # the default models (below)
#   bash bench/compare.sh model1.gguf ...      # these files
#
# What it does: sets up the llama.cpp venv (scripts/llamacpp_env.sh: llama-cpp-python built from source,
# Release, -march=native; 15-30 minutes the first time), builds kiln-bench-e2e (and kiln-quantize) in
# $KILN_BUILD_DIR, makes the synthetic 1B models (F16, Q8_0, Q4_0) if they are missing
# (scripts/make_synthetic_model.py, into ~/.cache/kiln/models), then runs bench/compare_llamacpp.py, which
# prints markdown tables for docs/benchmarks.md and keeps every measurement as JSON lines.
#
# Default models: ../shared/models/stories260K.gguf, ~/.cache/kiln/models/synthetic-1b.{F16,Q8_0,Q4_0}.gguf, and when
# present ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf and gemma-3-270m-q4_k_m.gguf
# (scripts/fetch_models.sh).
# Environment:
#   KILN_BUILD_DIR  build directory (default build/release, configured by scripts/build.sh release)
#   COMPARE_ARGS    extra options for compare_llamacpp.py, e.g. "--rounds 5 --reps 3 --threads 1,2 --modes read"
#   OUT             where results go (default build/compare): compare-<time>.md and .jsonl
#   COMPARE_TARGET  AVX2: both engines as on a CPU without AVX-512: kiln's AVX2 kernels (--kiln-target)
#                   against an AVX2-only build of the same llama.cpp (scripts/llamacpp_cpu.sh, --llama-lib);
#                   SSE4: kiln's SSE4 kernels (the portable 128-bit ones that NEON runs too) against an
#                   SSE4.2-only llama.cpp (its hand-written SSSE3 kernels)
# For figures worth publishing run it on a quiet machine (nothing else compiling), e.g. under
# `taskset -c 0,1`; the tables print the load average at the end of the run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODELS_DIR="${HOME}/.cache/kiln/models"
SHARED="$(cd "$ROOT/.." && pwd)/shared/models"

PY="$(bash scripts/llamacpp_env.sh | tail -n1)"

if [[ -n "${KILN_BUILD_DIR:-}" ]]; then
  BUILD_DIR="$KILN_BUILD_DIR"
  [[ -f "$BUILD_DIR/CMakeCache.txt" ]] || cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
  targets=(kiln-bench-e2e)
  [[ -f examples/kiln-quantize.cpp ]] && targets+=(kiln-quantize)
  cmake --build "$BUILD_DIR" -j"${JOBS:-$(nproc)}" --target "${targets[@]}"
else
  BUILD_DIR="$ROOT/build/release"
  targets=(kiln-bench-e2e)
  [[ -f examples/kiln-quantize.cpp ]] && targets+=(kiln-quantize)
  bash scripts/build.sh release --target "${targets[@]}"
fi
KILN_BIN="$BUILD_DIR/bench/kiln-bench-e2e"
[[ -x "$KILN_BIN" ]] || { echo "compare: ERROR: $KILN_BIN was not built" >&2; exit 1; }

models=("$@")
if [[ ${#models[@]} -eq 0 ]]; then
  [[ -f "$SHARED/stories260K.gguf" ]] && models+=("$SHARED/stories260K.gguf") \
    || echo "compare: warning: $SHARED/stories260K.gguf not found; left out" >&2
  # The synthetic 1B llama in F16, Q8_0 and Q4_0 (issue 5's table), made once.
  missing=()  # the script writes the F16 file whenever it is missing, then each --type from it
  for t in q8_0 q4_0; do
    [[ -f "$MODELS_DIR/synthetic-1b.${t^^}.gguf" ]] || missing+=(--type "$t")
  done
  if [[ ${#missing[@]} -gt 0 || ! -f "$MODELS_DIR/synthetic-1b.F16.gguf" ]]; then
    echo "compare: making the synthetic 1B model (scripts/make_synthetic_model.py ${missing[*]})" >&2
    VPY="$(bash scripts/python_env.sh | tail -n1)"
    kq=()
    [[ -x "$BUILD_DIR/examples/kiln-quantize" ]] && kq=(--kiln-quantize "$BUILD_DIR/examples/kiln-quantize")
    "$VPY" scripts/make_synthetic_model.py "${missing[@]}" "${kq[@]}" | { grep -v '^\[' || true; } >&2
  fi
  for t in F16 Q8_0 Q4_0; do models+=("$MODELS_DIR/synthetic-1b.$t.gguf"); done
  for m in SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf; do
    [[ -f "$MODELS_DIR/$m" ]] && models+=("$MODELS_DIR/$m")
  done
fi
for m in "${models[@]}"; do
  [[ -f "$m" ]] || { echo "compare: ERROR: model file not found: $m" >&2; exit 1; }
done

OUT="${OUT:-$ROOT/build/compare}"
mkdir -p "$OUT"
stamp="$(date +%Y%m%d-%H%M%S)"
read -r -a extra <<< "${COMPARE_ARGS:-}"
case "${COMPARE_TARGET:-}" in
  "") ;;
  AVX2 | SSE4) extra+=(--kiln-target "$COMPARE_TARGET" --llama-lib "$(bash scripts/llamacpp_cpu.sh "$COMPARE_TARGET" | tail -n1)") ;;
  *) echo "compare: ERROR: COMPARE_TARGET=${COMPARE_TARGET} (AVX2 and SSE4 have a matching llama.cpp build)" >&2; exit 1 ;;
esac
echo "compare: ${#models[@]} models; results in $OUT/compare-$stamp.{md,jsonl}" >&2
"$PY" bench/compare_llamacpp.py --kiln-bin "$KILN_BIN" --json-out "$OUT/compare-$stamp.jsonl" \
  --markdown-out "$OUT/compare-$stamp.md" "${extra[@]}" "${models[@]}"
