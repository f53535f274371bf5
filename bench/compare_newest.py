#!/usr/bin/env python3
"""kiln-bench-e2e against the newest llama.cpp's llama-bench on the same GGUF files, side by side.

Run by bench/compare_newest.sh (which builds both); usable alone:
    python3 bench/compare_newest.py --kiln build/release/bench/kiln-bench-e2e \
        --llama-bench /work/llamanewest/build/bin/llama-bench model.gguf ...

For each model, round and thread count the two engines run one after the other, the order alternating
between rounds: prompts of --prompts tokens, --gen tokens decoded one at a time (kiln's after its first
prompt, llama-bench's from an empty cache: the row says depth 0 for both), and
for each depth in --depths (> 0) --gen tokens decoded after a prompt of that many tokens (llama-bench
-d DEPTH -fa 1: its flash attention, its best at depth). Medians over the rounds go to a markdown table on
stdout; every measurement to --jsonl. Each engine's own defaults otherwise: kiln's default precision, f16
KV caches on both sides, llama.cpp's repacked / AMX kernels as it picks them (the header line says whether
its AMX backend is live).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"compare_newest: {' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout


def kiln(exe, model, t, prompts, gen, depth):
    """{test name: tok/s} from kiln-bench-e2e's JSON lines."""
    sizes = [depth] if depth else prompts
    cmd = [exe, "-m", model, "-t", str(t), "-p", ",".join(map(str, sizes)), "-n", str(gen), "-r", "1"]
    out = {}
    for line in run(cmd).splitlines():
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if j.get("test") == "pp" and not depth:
            out[f"pp{j['n_prompt']}"] = j["tok_s"]
        elif j.get("test") == "tg":
            out[f"tg{gen}@d{j['depth'] if depth else 0}"] = j["tok_s"]
    return out


def llama(exe, model, t, prompts, gen, depth):
    """{test name: tok/s} from llama-bench's JSON lines, named as kiln's."""
    if depth:
        cmd = [exe, "-m", model, "-t", str(t), "-p", "0", "-n", str(gen), "-d", str(depth), "-fa", "1"]
    else:
        cmd = [exe, "-m", model, "-t", str(t), "-p", ",".join(map(str, prompts)), "-n", str(gen)]
    out = {}
    for line in run(cmd + ["-r", "1", "-o", "jsonl"]).splitlines():
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if j["n_gen"] == 0 and j["n_prompt"] > 0:
            out[f"pp{j['n_prompt']}"] = j["avg_ts"]
        elif j["n_gen"] > 0:
            # kiln decodes after its first prompt (depth = that prompt); llama-bench -n without -d from 0.
            out[f"tg{gen}@d{depth}"] = j["avg_ts"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--kiln", required=True, help="kiln-bench-e2e")
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompts", default="128,512")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--depths", default="0", help="decode depths, e.g. 0,4096,16384 (0: the prompt rows only)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jsonl", default=None)
    a = ap.parse_args()
    threads = [int(x) for x in a.threads.split(",")]
    prompts = [int(x) for x in a.prompts.split(",")]
    depths = [int(x) for x in a.depths.split(",")]
    for n, lo in [("--rounds", a.rounds), ("--gen", a.gen)] + [("--threads", t) for t in threads] + [
            ("--prompts", p) for p in prompts]:
        if lo < 1:
            sys.exit(f"compare_newest: {n} must be at least 1, not {lo}")
    if any(d < 0 for d in depths):
        sys.exit("compare_newest: --depths must be 0 or more")
    log = open(a.jsonl, "a") if a.jsonl else None
    res = {}  # (model, threads, test, engine) -> [tok/s]
    for model in a.models:
        if not os.path.isfile(model):
            sys.exit(f"compare_newest: no model file '{model}'")
        for r in range(a.rounds):
            for t in threads:
                for d in depths:
                    engines = [("kiln", kiln, a.kiln), ("llama.cpp", llama, a.llama_bench)]
                    for name, fn, exe in (engines if r % 2 == 0 else engines[::-1]):
                        for test, v in fn(exe, model, t, prompts, a.gen, d).items():
                            res.setdefault((model, t, test, name), []).append(v)
                            if log:
                                log.write(json.dumps({"model": model, "threads": t, "test": test, "engine": name,
                                                      "round": r, "tok_s": v}) + "\n")
                                log.flush()
    print("| model | threads | test | kiln tok/s | llama.cpp tok/s | kiln / llama.cpp |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    keys = sorted({k[:3] for k in res}, key=lambda k: (k[0], k[1], k[2]))
    for model, t, test in keys:
        kv, lv = res.get((model, t, test, "kiln")), res.get((model, t, test, "llama.cpp"))
        km = statistics.median(kv) if kv else float("nan")
        lm = statistics.median(lv) if lv else float("nan")
        print(f"| {os.path.basename(model)} | {t} | {test} | {km:.1f} | {lm:.1f} | {km / lm:.2f}x |")
    print(f"\nmedians of {a.rounds} alternating rounds; load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
