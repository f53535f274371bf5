#!/usr/bin/env bash
# scripts/python_checks.sh - cross-checks that need the Python tooling venv (scripts/python_env.sh):
# the committed GGUF/safetensors reader fixtures must be exactly what their generator produces with the
# pinned gguf-py and safetensors (so a fixture can't drift from the script that made it); kiln-quantize's
# outputs against gguf-py's quantizers, and against llama.cpp when llama-cpp-python is installed.
# Environment: KILN_QUANTIZE (default build/release/examples/kiln-quantize), LLAMACPP_ENV, KILN_PERPLEXITY
# (default build/release/examples/kiln-perplexity), LLAMACPP_NEWEST_BIN (llama-perplexity's directory).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
[[ -x "$PY" ]] || { echo "python_checks.sh: $PY missing: run scripts/python_env.sh first" >&2; exit 1; }
t="$(mktemp -d)"
trap 'rm -rf "$t"' EXIT
"$PY" tests/fixtures/make_io_fixtures.py --out "$t"
diff -r "$t" tests/fixtures/io
echo "python_checks.sh: io fixtures match their generator"

# kiln-quantize (examples/kiln-quantize.cpp) against gguf-py: stories260K (F32) to Q8_0, Q4_0 and Q4_1, and a
# Hugging Face checkpoint of the same weights (scripts/make_hf_checkpoint.py) to Q8_0; every quantized tensor
# must be byte-identical to gguf-py's quantizer and within the type's error bound, the metadata copied.
QBIN="${KILN_QUANTIZE:-$ROOT/build/release/examples/kiln-quantize}"
[[ -x "$QBIN" ]] || { echo "python_checks.sh: $QBIN missing: build it first (scripts/build.sh release)" >&2; exit 1; }
STORIES="$ROOT/../shared/models/stories260K.gguf"
[[ -f "$STORIES" ]] || { echo "python_checks.sh: $STORIES missing (the shared models folder)" >&2; exit 1; }
mkdir -p "$t/quant"
for type in q8_0 q4_0 q4_1; do
  "$QBIN" "$STORIES" "$t/quant/stories-$type.gguf" "$type" 2> "$t/quant/$type.log" \
    || { cat "$t/quant/$type.log" >&2; exit 1; }
done
"$PY" scripts/make_hf_checkpoint.py "$STORIES" "$t/quant/hf"
"$QBIN" "$t/quant/hf" "$t/quant/hf-q8_0.gguf" q8_0 2> "$t/quant/hf.log" || { cat "$t/quant/hf.log" >&2; exit 1; }
"$PY" scripts/check_quantize.py "$STORIES" "$t"/quant/stories-{q8_0,q4_0,q4_1}.gguf
"$PY" scripts/check_quantize.py --tensors-only "$STORIES" "$t/quant/hf-q8_0.gguf"

# When llama-cpp-python is installed (scripts/llamacpp_env.sh: $LLAMACPP_ENV, /work/llamaenv or ../llamaenv),
# llama.cpp loads the same files and generates from them too.
LLAMA_PY=""
for py in ${LLAMACPP_ENV:+"$LLAMACPP_ENV/bin/python"} /work/llamaenv/bin/python "$ROOT/../llamaenv/bin/python"; do
  if [[ -x "$py" ]] && "$py" -c "import llama_cpp" 2>/dev/null; then LLAMA_PY="$py"; break; fi
done
if [[ -n "$LLAMA_PY" ]]; then
  "$LLAMA_PY" scripts/check_quantize_llamacpp.py "$ROOT/../shared/models/stories260K.greedy100.llamacpp.txt" \
    --exact "$t/quant/stories-q8_0.gguf" "$t/quant/hf-q8_0.gguf" --prefix "$t"/quant/stories-{q4_0,q4_1}.gguf
else
  echo "python_checks.sh: SKIPPED the llama.cpp check of kiln-quantize's outputs: no python with the llama_cpp" \
       "module (llama-cpp-python) in \$LLAMACPP_ENV, /work/llamaenv or ../llamaenv (scripts/llamacpp_env.sh installs it)"
fi
echo "python_checks.sh: kiln-quantize outputs match gguf-py${LLAMA_PY:+ and load and generate in llama.cpp}"

# kiln-perplexity against llama-perplexity when the newest llama.cpp is built (scripts/llamacpp_newest.sh):
# the same tokens and chunks, PPL within the tolerance scripts/check_perplexity_llamacpp.py derives.
LLAMA_BIN="${LLAMACPP_NEWEST_BIN:-}"
for d in ${LLAMA_BIN:+"$LLAMA_BIN"} /work/llamanewest/build/bin "$ROOT/../llamanewest/build/bin"; do
  if [[ -x "$d/llama-perplexity" && -x "$d/llama-quantize" ]]; then LLAMA_BIN="$d"; break; fi
done
PBIN="${KILN_PERPLEXITY:-$ROOT/build/release/examples/kiln-perplexity}"
if [[ -x "$LLAMA_BIN/llama-perplexity" ]]; then
  [[ -x "$PBIN" ]] || { echo "python_checks.sh: $PBIN missing: build it first (scripts/build.sh release)" >&2; exit 1; }
  python3 scripts/check_perplexity_llamacpp.py --kiln "$PBIN" --llama-bin "$LLAMA_BIN"
else
  echo "python_checks.sh: SKIPPED kiln-perplexity against llama-perplexity: no llama-perplexity in" \
       "\$LLAMACPP_NEWEST_BIN, /work/llamanewest/build/bin or ../llamanewest/build/bin (scripts/llamacpp_newest.sh builds it)"
fi
