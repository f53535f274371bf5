#!/usr/bin/env bash
# The demo: installs dependencies, builds kiln in release, and runs the kernel benchmarks briefly
# (each benchmark for a short minimum time), ending with kiln-bench's summary table (throughput next
# to the machine's measured memory bandwidth). A few minutes on 2 cores.
#   scripts/demo.sh                      # the short default run
#   scripts/demo.sh --benchmark_filter=rms_norm   # any kiln-bench / Google Benchmark arguments instead
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

echo "=== demo: dependencies ==="
bash scripts/install_deps.sh

echo "=== demo: build (release, kiln-bench only) ==="
bash scripts/build.sh release --target kiln-bench

BENCH="$ROOT/build/release/bench/kiln-bench"
if [[ ! -x "$BENCH" ]]; then
  echo "demo: ERROR: $BENCH was not built (is bench/ in this checkout?)" >&2
  exit 1
fi

if [[ $# -gt 0 ]]; then
  args=("$@")
else
  args=(--benchmark_min_time=0.05)
fi
echo "=== demo: kiln-bench ${args[*]} ==="
"$BENCH" "${args[@]}"
