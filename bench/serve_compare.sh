#!/usr/bin/env bash
# kiln-server vs llama.cpp's llama-server on the same GGUF files, side by side (one command):
#
#   bash bench/serve_compare.sh                   # SmolLM2-135M and Gemma 3 270M (scripts/fetch_models.sh)
#   bash bench/serve_compare.sh model.gguf ...    # these files
#
# What it does: builds llama-server (LLAMA=newest, the default: scripts/llamacpp_newest.sh, the newest
# llama.cpp with its AMX kernels where the CPU has them; LLAMA=pinned: scripts/llamaserver_build.sh, the
# llama.cpp that llama-cpp-python's sdist vendors; both outside the repository) and kiln-server + kiln-generate (in
# $KILN_BUILD_DIR, default build/release), then for each model runs ROUNDS rounds; each round starts each
# server in turn (the order alternates between rounds) with the same flags (-np SLOTS, -c SLOTS x SLOT_CTX,
# -t THREADS) and drives it with bench/serve_bench.py: CLIENTS concurrent streaming chat clients (the same
# questions, TOKENS greedy tokens each, ignore_eos so lengths match), one client's completion of PROMPT
# (time to first token, decode tokens/s), a conversation's second turn with and without the first in the
# cache, the server's peak RSS; then kiln-generate on PROMPT (the same figures without HTTP) and its KV
# cache size at -c SLOTS x SLOT_CTX. The medians over the rounds go to $OUT/serve-<time>.md (markdown for
# docs/benchmarks.md), every figure to $OUT/serve-<time>.jsonl.
#
# Environment: LLAMA (newest), ROUNDS (3), SLOTS (4), SLOT_CTX (1024), THREADS (2), TOKENS (128), CLIENTS (1,2,4,8,16),
# SECONDS_PER_LEVEL (20), TURN2 (3), KILN_BUILD_DIR, KILN_BIN_DIR (a folder with kiln-server and
# kiln-generate already built: nothing is built), OUT (build/serve_compare), JOBS.
# For figures worth publishing run it on a quiet machine (nothing else compiling); the report ends with
# the CPU and the load average.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODELS_DIR="${KILN_MODEL_DIR:-$HOME/.cache/kiln/models}"
ROUNDS="${ROUNDS:-3}" SLOTS="${SLOTS:-4}" SLOT_CTX="${SLOT_CTX:-1024}" THREADS="${THREADS:-2}"
TOKENS="${TOKENS:-128}" CLIENTS="${CLIENTS:-1,2,4,8,16}" SECONDS_PER_LEVEL="${SECONDS_PER_LEVEL:-20}"
TURN2="${TURN2:-3}"
PROMPT="The history of the printing press began in the fifteenth century, when"

# LLAMA=newest (default): llama.cpp at its best on this CPU, AMX kernels included where the CPU grants them
# (scripts/llamacpp_newest.sh); LLAMA=pinned: llama-cpp-python's vendored llama.cpp without AMX
# (scripts/llamaserver_build.sh), the version bench/compare.sh measures.
case "${LLAMA:-newest}" in
  newest) LLAMA_SERVER="$(bash scripts/llamacpp_newest.sh | tail -n1)/llama-server" ;;
  pinned) LLAMA_SERVER="$(bash scripts/llamaserver_build.sh | tail -n1)" ;;
  *) echo "serve_compare: ERROR: LLAMA must be newest or pinned, not '${LLAMA}'" >&2; exit 2 ;;
esac
if [[ -n "${KILN_BIN_DIR:-}" ]]; then
  BIN_DIR="$KILN_BIN_DIR"  # kiln-server and kiln-generate as they are, nothing built
elif [[ -n "${KILN_BUILD_DIR:-}" ]]; then
  BIN_DIR="$KILN_BUILD_DIR/examples"
  cmake --build "$KILN_BUILD_DIR" -j"${JOBS:-2}" --target kiln-server kiln-generate
else
  BIN_DIR="$ROOT/build/release/examples"
  bash scripts/build.sh release --target kiln-server kiln-generate
fi
KILN_SERVER="$BIN_DIR/kiln-server"
KILN_GENERATE="$BIN_DIR/kiln-generate"
for exe in "$KILN_SERVER" "$KILN_GENERATE" "$LLAMA_SERVER"; do
  [[ -x "$exe" ]] || { echo "serve_compare: ERROR: $exe was not built" >&2; exit 1; }
done

models=("$@")
if [[ ${#models[@]} -eq 0 ]]; then
  models=("$MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODELS_DIR/gemma-3-270m-q4_k_m.gguf")
fi
for m in "${models[@]}"; do
  [[ -f "$m" ]] || { echo "serve_compare: ERROR: model file not found: $m (scripts/fetch_models.sh)" >&2; exit 1; }
done

OUT="${OUT:-$ROOT/build/serve_compare}"
mkdir -p "$OUT"
stamp="$(date +%Y%m%d-%H%M%S)"
JSONL="$OUT/serve-$stamp.jsonl"
echo "serve_compare: ${#models[@]} models x $ROUNDS rounds; results in $OUT/serve-$stamp.{md,jsonl}" >&2

bench() {  # server executable, model
  python3 bench/serve_bench.py --server "$1" --model "$2" --slots "$SLOTS" --slot-ctx "$SLOT_CTX" \
    --threads "$THREADS" --clients "$CLIENTS" --tokens "$TOKENS" --seconds "$SECONDS_PER_LEVEL" \
    --single-prompt "$PROMPT" --turn2 "$TURN2" --json-out "$JSONL"
}

generate() {  # model: kiln-generate on PROMPT, its figures as a JSON line
  local log
  log="$("$KILN_GENERATE" -m "$1" -p "$PROMPT" -n "$TOKENS" --temp 0 -t "$THREADS" -c $((SLOTS * SLOT_CTX)) 2>&1 >/dev/null)"
  python3 - "$1" "$JSONL" "$log" "$SLOTS" "$SLOT_CTX" "$THREADS" "$TOKENS" <<'EOF'
import json, os, re, sys, time
model, out, log, slots, slot_ctx, threads, tokens = sys.argv[1:]
ttft = float(re.search(r"time to first token ([\d.]+) ms", log).group(1))
g = re.search(r"generation\s+(\d+) tokens in\s+([\d.]+) ms \(\s*[\d.]+ tok/s over (\d+) decode steps", log)
kv = float(re.search(r"KV cache \w+ \(([\d.]+) MiB\)", log).group(1))
rss = float(re.search(r"peak RSS ([\d.]+) MiB", log).group(1))
base = dict(model=os.path.basename(model), kind="kiln-generate", slots=int(slots), slot_ctx=int(slot_ctx),
            threads=int(threads), tokens=int(tokens), time=time.time())
with open(out, "a") as f:
    f.write(json.dumps(dict(base, what="single", clients=1, ttft_ms=ttft, tokens=int(g.group(1)),
                            decode_tok_s=int(g.group(3)) / (float(g.group(2)) / 1000))) + "\n")
    f.write(json.dumps(dict(base, what="memory", kv_mib=kv, model_mib=os.path.getsize(model) / 2**20,
                            peak_rss_mib=rss)) + "\n")
EOF
}

for ((r = 1; r <= ROUNDS; r++)); do  # rounds outside: an interrupted run still has every model
  for m in "${models[@]}"; do
    echo "serve_compare: $(basename "$m") round $r/$ROUNDS" >&2
    if ((r % 2)); then order=("$KILN_SERVER" "$LLAMA_SERVER"); else order=("$LLAMA_SERVER" "$KILN_SERVER"); fi
    for s in "${order[@]}"; do bench "$s" "$m"; done
    generate "$m"
  done
done

{
  echo "Command: bench/serve_compare.sh (ROUNDS=$ROUNDS SLOTS=$SLOTS SLOT_CTX=$SLOT_CTX THREADS=$THREADS" \
       "TOKENS=$TOKENS CLIENTS=$CLIENTS SECONDS_PER_LEVEL=$SECONDS_PER_LEVEL); medians of $ROUNDS rounds."
  python3 bench/serve_bench.py --report "$JSONL"
  echo
  echo "CPU: $(lscpu | sed -n 's/^Model name:\s*//p'), $(nproc) cores; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "llama-server: $("$LLAMA_SERVER" --version 2>&1 | grep -m1 -i version || true)"
} | tee "$OUT/serve-$stamp.md"
