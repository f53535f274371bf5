#!/usr/bin/env bash
# Installs the system packages kiln's build, tests, benchmarks and examples need (Debian 12 / apt).
# Idempotent: when every package is already installed it says so and touches nothing.
# Python tooling (gguf, numpy) is separate: scripts/python_env.sh. The C++ build never needs Python.
set -euo pipefail

PACKAGES=(
  build-essential cmake g++ clang
  libclang-rt-14-dev      # clang's sanitizer and libFuzzer runtimes
  g++-aarch64-linux-gnu libc6-dev-arm64-cross  # the suite's aarch64 compile check
  libhwy-dev              # Highway: portable SIMD with run-time dispatch (the kernels)
  libeigen3-dev           # independent reference for the tests, and a baseline in the benchmarks
  doctest-dev             # unit tests
  libbenchmark-dev        # Google Benchmark (bench/)
  libcpp-httplib-dev      # HTTP server example
  chromium chromium-driver  # kiln-server's chat page in a headless browser (tests/serve/test_page.py)
  nlohmann-json3-dev      # config.json / tokenizer.json parsing
  nginx                   # kiln-server replicas behind a load balancer (tests/serve/test_scaleout.py)
  tmux                    # kiln-chat on a terminal: line editing and Ctrl-C (tests/examples/kiln_chat_tty.cmake)
  libopenblas-dev         # SGEMM baseline in the benchmarks
  python3 python3-pip python3-venv  # tooling only (scripts/python_env.sh)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if [[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)" != "ii " ]]; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install_deps: all ${#PACKAGES[@]} packages already installed; nothing to do."
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1; then
  SUDO=(sudo)
else
  echo "install_deps: ERROR: missing packages (${missing[*]}) and not root, and sudo is not available." >&2
  echo "install_deps: run this script as root, or install them: apt-get install ${missing[*]}" >&2
  exit 1
fi

echo "install_deps: installing ${#missing[@]} missing package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update
"${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
echo "install_deps: done."
