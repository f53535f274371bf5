#!/usr/bin/env bash
# scripts/python_checks.sh - cross-checks that need the Python tooling venv (scripts/python_env.sh):
# the committed GGUF/safetensors reader fixtures must be exactly what their generator produces with the
# pinned gguf-py and safetensors (so a fixture can't drift from the script that made it).
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
