#!/usr/bin/env bash
# A/B of kiln builds on one model's prompt speed: runs each kiln-bench-e2e binary in turn, ROUNDS times
# (alternating, so drift on a shared machine hits all of them alike), and prints per binary the best
# pp128 / pp512 tok/s over all its repetitions (the best, not the median: on a noisy VM the fastest run is
# the one least disturbed). Usage:
#   bash bench/ab_e2e.sh MODEL.gguf THREADS ROUNDS BIN1 BIN2 ... [-- extra kiln-bench-e2e options]
# e.g. (old build copied aside first):
#   bash bench/ab_e2e.sh ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf 1 3 /tmp/old-e2e build/release/bench/kiln-bench-e2e
# A BIN may carry options of its own after spaces (one quoted argument), e.g. AMX against VNNI:
#   bash bench/ab_e2e.sh MODEL.gguf 1 5 "build/release/bench/kiln-bench-e2e --no-amx" "build/release/bench/kiln-bench-e2e --amx"
# Each cell also gives the tokens per CPU second (best over the repetitions of P / the process's CPU time
# during the prompt, all threads: kiln-bench-e2e's cpu_s), which other work on the machine disturbs less.
set -euo pipefail
if [[ $# -lt 4 ]]; then sed -n 2,13p "$0" >&2; exit 2; fi
model=$1 threads=$2 rounds=$3
shift 3
bins=()
while [[ $# -gt 0 && $1 != -- ]]; do bins+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
[[ -f $model ]] || { echo "ab_e2e: no model file $model" >&2; exit 1; }
for b in "${bins[@]}"; do
  read -r -a cmd <<< "$b"
  [[ -x ${cmd[0]} ]] || { echo "ab_e2e: ${cmd[0]} is not an executable" >&2; exit 1; }
done
for ((r = 0; r < rounds; ++r)); do
  for b in "${bins[@]}"; do
    read -r -a cmd <<< "$b"
    "${cmd[@]}" -m "$model" --load read -t "$threads" -p 128,512 -n 0 -r 5 "$@" 2>/dev/null | sed "s|^|$b\t|"
  done
done | python3 -c '
import json, sys
best, cpu, order = {}, {}, []
for line in sys.stdin:
    b, js = line.rstrip("\n").split("\t", 1)
    j = json.loads(js)
    if j.get("test") != "pp": continue
    if b not in order: order.append(b)
    k = (b, j["n_prompt"])
    best[k] = max(best.get(k, 0.0), j["tok_s"])
    if j.get("cpu_s", 0) > 0: cpu[k] = max(cpu.get(k, 0.0), j["n_prompt"] / j["cpu_s"])
if not order: sys.exit("ab_e2e: no pp results (did kiln-bench-e2e fail?)")
base = order[0]
for b in order:
    cells = []
    for n in (128, 512):
        v = best.get((b, n))
        if v is None: continue
        r = v / best[(base, n)] if best.get((base, n)) else float("nan")
        cell = "pp%d %.1f tok/s (%.3fx)" % (n, v, r)
        c, c0 = cpu.get((b, n)), cpu.get((base, n))
        if c and c0: cell += ", %.1f tok per CPU s (%.3fx)" % (c, c / c0)
        cells.append(cell)
    print(b, " | ".join(cells))
'
