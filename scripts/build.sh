#!/usr/bin/env bash
# Configures and builds kiln (library, tests, benchmarks, examples) in one of three configurations:
#   scripts/build.sh release   -> build/release  (Release, -Werror)
#   scripts/build.sh asan      -> build/asan     (Debug, AddressSanitizer + UndefinedBehaviorSanitizer)
#   scripts/build.sh clang     -> build/clang    (Release with clang++, -Werror, UBSan incl. float-cast-overflow)
# Extra arguments after the configuration go to `cmake --build` (e.g. --target kiln_test_core).
# Environment: JOBS (default: nproc), CMAKE_ARGS (extra configure arguments, e.g. -DCMAKE_CXX_COMPILER=clang++).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
config="${1:-}"
shift || true
case "$config" in
  release) dir="$ROOT/build/release"; args=(-DCMAKE_BUILD_TYPE=Release -DKILN_WERROR=ON) ;;
  # The sanitizer build skips the benchmarks: no test runs them, and the release build compiles them.
  asan)    dir="$ROOT/build/asan";    args=(-DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON -DKILN_BUILD_BENCH=OFF) ;;
  # clang (the second compiler every kernel must build with) and UBSan with float-cast-overflow, at -O3.
  clang)   dir="$ROOT/build/clang";   args=(-DCMAKE_BUILD_TYPE=Release -DKILN_WERROR=ON -DKILN_UBSAN=ON
                                             -DKILN_BUILD_BENCH=OFF -DCMAKE_CXX_COMPILER=clang++) ;;
  *) echo "usage: scripts/build.sh <release|asan|clang> [cmake --build arguments...]" >&2; exit 2 ;;
esac

jobs="${JOBS:-$(nproc)}"
read -r -a extra <<< "${CMAKE_ARGS:-}"
echo "build: configuring $config in ${dir#"$ROOT"/}"
cmake -S "$ROOT" -B "$dir" "${args[@]}" "${extra[@]}"
echo "build: building $config with -j$jobs"
cmake --build "$dir" -j"$jobs" "$@"
