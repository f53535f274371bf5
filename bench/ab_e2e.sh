#!/usr/bin/env bash
# A/B of kiln builds on one model: runs each kiln-bench-e2e binary in turn, ROUNDS times (alternating, so
# drift on a shared machine hits all of them alike). Usage:
#   bash bench/ab_e2e.sh MODEL.gguf THREADS ROUNDS BIN1 BIN2 ... [-- extra kiln-bench-e2e options]
# TEST=pp (default): prompt speed; per binary the best pp128 / pp512 tok/s over all its repetitions (the best,
#   not the median: on a noisy VM the fastest run is the one least disturbed), and the tokens per CPU second
#   (best over the repetitions of P / the process's CPU time during the prompt, all threads: kiln-bench-e2e's
#   cpu_s), which other work on the machine disturbs less.
# TEST=tg: decode speed; each round one run of GEN (default 128) tokens after a DEPTH-token prompt (default
#   16), 3 repetitions; per binary the median tok/s and the median CPU time per token (kiln-bench-e2e's
#   cpu_ms_per_tok: all threads, the pool's spinning included).
# e.g. (old build copied aside first):
#   bash bench/ab_e2e.sh ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf 1 3 /tmp/old-e2e build/release/bench/kiln-bench-e2e
#   TEST=tg bash bench/ab_e2e.sh ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf 2 5 /tmp/old-e2e build/release/bench/kiln-bench-e2e
# Options after -- follow the defaults (a later -p wins: every prompt size is reported), e.g. long prompts:
#   bash bench/ab_e2e.sh MODEL.gguf 1 2 /tmp/old-e2e build/release/bench/kiln-bench-e2e -- -p 512,8192 -r 1
# A BIN may carry options of its own after spaces (one quoted argument), e.g. AMX against VNNI:
#   bash bench/ab_e2e.sh MODEL.gguf 1 5 "build/release/bench/kiln-bench-e2e --no-amx" "build/release/bench/kiln-bench-e2e --amx"
set -euo pipefail
if [[ $# -lt 4 ]]; then sed -n 2,18p "$0" >&2; exit 2; fi
model=$1 threads=$2 rounds=$3
shift 3
bins=()
while [[ $# -gt 0 && $1 != -- ]]; do bins+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
test=${TEST:-pp}
[[ $test == pp || $test == tg ]] || { echo "ab_e2e: TEST=$test: need pp or tg" >&2; exit 2; }
[[ -f $model ]] || { echo "ab_e2e: no model file $model" >&2; exit 1; }
for b in "${bins[@]}"; do
  read -r -a cmd <<< "$b"
  [[ -x ${cmd[0]} ]] || { echo "ab_e2e: ${cmd[0]} is not an executable" >&2; exit 1; }
done
if [[ $test == pp ]]; then args=(-p 128,512 -n 0 -r 5); else args=(-p "${DEPTH:-16}" -n "${GEN:-128}" -r 3); fi
for ((r = 0; r < rounds; ++r)); do
  for b in "${bins[@]}"; do
    read -r -a cmd <<< "$b"
    "${cmd[@]}" -m "$model" --load read -t "$threads" "${args[@]}" "$@" 2>/dev/null | sed "s|^|$b\t|"
  done
done | TEST=$test python3 -c '
import json, os, statistics, sys
test = os.environ["TEST"]
best, cpu, runs, order = {}, {}, {}, []
for line in sys.stdin:
    b, js = line.rstrip("\n").split("\t", 1)
    j = json.loads(js)
    if j.get("test") != test: continue
    if b not in order: order.append(b)
    if test == "tg":
        runs.setdefault(b, []).append((j["tok_s"], j.get("cpu_ms_per_tok", float("nan"))))
        continue
    k = (b, j["n_prompt"])
    best[k] = max(best.get(k, 0.0), j["tok_s"])
    if j.get("cpu_s", 0) > 0: cpu[k] = max(cpu.get(k, 0.0), j["n_prompt"] / j["cpu_s"])
if not order: sys.exit("ab_e2e: no %s results (did kiln-bench-e2e fail?)" % test)
base = order[0]
if test == "tg":
    med = {b: (statistics.median(t for t, _ in runs[b]), statistics.median(c for _, c in runs[b])) for b in order}
    for b in order:
        t, c = med[b]
        print("%s tg %.1f tok/s (%.3fx), %.3f CPU ms/token (%.3fx less), %d runs"
              % (b, t, t / med[base][0], c, med[base][1] / c, len(runs[b])))
    sys.exit(0)
for b in order:
    cells = []
    for n in sorted({k[1] for k in best if k[0] == b}):
        v = best.get((b, n))
        if v is None: continue
        r = v / best[(base, n)] if best.get((base, n)) else float("nan")
        cell = "pp%d %.1f tok/s (%.3fx)" % (n, v, r)
        c, c0 = cpu.get((b, n)), cpu.get((base, n))
        if c and c0: cell += ", %.1f tok per CPU s (%.3fx)" % (c, c / c0)
        cells.append(cell)
    print(b, " | ".join(cells))
'
