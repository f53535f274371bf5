#!/usr/bin/env bash
# scripts/fuzz.sh - builds kiln's fuzz targets (tests/fuzz: the GGUF and safetensors readers) with clang++
# -fsanitize=fuzzer,address,undefined into build/fuzz, then runs each for a bounded time on a seed corpus
# and fails on any crash, sanitizer report, leak, timeout, out-of-memory or unexpected exception.
#
#   scripts/fuzz.sh                       # 30 s, every target at once
#   KILN_FUZZ_SECONDS=600 scripts/fuzz.sh # longer
#   scripts/fuzz.sh gguf                  # one target
#
# Seeds: files written by build/fuzz/kiln_fuzz_seeds, the committed fixtures in tests/fixtures/io, and
# ../shared/models/stories260K.gguf when present (referenced, never copied into the repo). New inputs
# found accumulate in build/fuzz/corpus/<target>; crashing inputs land in build/fuzz/artifacts/.
# Reproduce one with: build/fuzz/fuzz_gguf build/fuzz/artifacts/gguf-crash-<hash>
# Environment: KILN_FUZZ_SECONDS (default 30), KILN_FUZZ_CXX (default clang++), KILN_JOBS or JOBS (build
# jobs, default 2).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
secs="${KILN_FUZZ_SECONDS:-30}"
cxx="${KILN_FUZZ_CXX:-clang++}"
build="$root/build/fuzz"
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(gguf safetensors)

die() { echo "fuzz.sh: error: $*" >&2; exit 1; }
command -v "$cxx" >/dev/null || die "$cxx not found (apt-get install clang libclang-rt-dev)"
[[ "$secs" =~ ^[0-9]+$ ]] || die "KILN_FUZZ_SECONDS must be a whole number of seconds, got '$secs'"

cmake -S "$root/tests/fuzz" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null \
  || die "configuring tests/fuzz failed"
cmake --build "$build" -j"${KILN_JOBS:-${JOBS:-2}}" || die "building the fuzzers failed"

seeds="$build/seeds"
rm -rf "$seeds"
"$build/kiln_fuzz_seeds" "$seeds"
cp "$root"/tests/fixtures/io/*.gguf "$seeds/gguf/"
cp "$root"/tests/fixtures/io/*.safetensors "$seeds/safetensors/"
stories="$root/../shared/models/stories260K.gguf"
if [ -f "$stories" ]; then
  ln -sf "$(cd "$(dirname "$stories")" && pwd)/stories260K.gguf" "$seeds/gguf/stories260K.gguf"
else
  echo "fuzz.sh: note: $stories not found; fuzzing GGUF without it" >&2
fi
mkdir -p "$build/artifacts"

for t in "${targets[@]}"; do
  [ -x "$build/fuzz_$t" ] || die "unknown fuzz target '$t' (have: gguf safetensors)"
done
# The targets run side by side (one process each: CI's 2 cores fuzz both at once, the run takes `secs`
# instead of `secs` per target), each logging to its own file.
pids=()
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  echo "== fuzz_$t: ${secs}s"
  # -max_len covers stories260K.gguf whole; -rss_limit_mb also caps any single allocation (malloc_limit_mb
  # defaults to it), so parsing that allocates in proportion to a hostile count is caught.
  "$build/fuzz_$t" "$corpus" "$seeds/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -max_len=1300000 -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" 2>"$build/fuzz_$t.log" &
  pids+=($!)
done
status=0
for i in "${!targets[@]}"; do
  t="${targets[$i]}"
  if ! wait "${pids[$i]}"; then
    status=1
    echo "fuzz.sh: fuzz_$t FAILED; log: $build/fuzz_$t.log" >&2
    tail -n 60 "$build/fuzz_$t.log" >&2
  else
    echo "== fuzz_$t:"
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb|cov: " "$build/fuzz_$t.log" | tail -n 3
  fi
done
[ $status -eq 0 ] && echo "fuzz.sh: all targets ran ${secs}s without findings"
exit $status
