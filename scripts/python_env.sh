#!/usr/bin/env bash
# Creates (or updates) the Python tooling environment at <repo>/.venv from scripts/requirements-tools.txt
# (gguf-py for GGUF fixtures, numpy). Idempotent: when .venv already matches the requirements file it
# only says so. Prints the venv's python path on its last line, so callers can do
#   PY=$(bash scripts/python_env.sh | tail -n1)
# The C++ build never needs this.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
REQ="$ROOT/scripts/requirements-tools.txt"
STAMP="$VENV/.kiln-requirements.sha256"

# Debian's interpreter first: install_deps.sh installs python3-venv for it.
PY_BOOT=/usr/bin/python3
[[ -x "$PY_BOOT" ]] || PY_BOOT="$(command -v python3 || true)"
if [[ -z "$PY_BOOT" ]]; then
  echo "python_env: ERROR: python3 not found. Run scripts/install_deps.sh first." >&2
  exit 1
fi

want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "python_env: $VENV is up to date with scripts/requirements-tools.txt." >&2
else
  if [[ ! -x "$VENV/bin/python" ]]; then
    echo "python_env: creating $VENV with $PY_BOOT" >&2
    if ! "$PY_BOOT" -m venv "$VENV"; then
      echo "python_env: ERROR: '$PY_BOOT -m venv' failed (Debian: apt-get install python3-venv, or run scripts/install_deps.sh)." >&2
      exit 1
    fi
  fi
  echo "python_env: installing pinned tools from scripts/requirements-tools.txt" >&2
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$REQ" >&2
  echo "$want" > "$STAMP"
  echo "python_env: done." >&2
fi
echo "$VENV/bin/python"
