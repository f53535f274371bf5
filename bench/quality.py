#!/usr/bin/env python3
"""What quantization and precision cost in quality, measured with kiln-perplexity: a markdown table of PPL and
KL divergence against a base, for docs/benchmarks.md#quality-what-quantization-and-precision-cost.

    python3 bench/quality.py [--ctx 512] [--chunks 4] [-t 2] [--text /usr/share/common-licenses/GPL-3]

Rows (models from $KILN_MODEL_DIR, default ~/.cache/kiln/models):
  * precisions: SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M at fast and fast8 against the same file at
    exact (the base);
  * quantization: SmolLM2's Q4_1 weights dequantized to F32 (llama-quantize --allow-requantize ... F32, from
    $LLAMACPP_NEWEST_BIN or /work/llamanewest/build/bin), run at exact as the base, and kiln-quantize's Q8_0,
    Q4_0 and Q4_1 of that F32 file at fast. (The F32 file holds the Q4_1 model's values: the rows measure
    what re-quantizing them costs, not what the original BF16 model lost.)
Needs build/release/examples/kiln-perplexity and kiln-quantize. Prints the table; keeps nothing.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def run(cmd):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return p.stdout, time.time() - t0


def grab(pattern, text):
    m = re.search(pattern, text)
    if not m:
        sys.exit(f"no {pattern!r} in:\n{text}")
    return m.groups()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--models", default=os.path.expanduser(os.environ.get("KILN_MODEL_DIR", "~/.cache/kiln/models")))
    a = ap.parse_args()
    ppl = os.environ.get("KILN_PERPLEXITY", os.path.join(ROOT, "build", "release", "examples", "kiln-perplexity"))
    quant = os.environ.get("KILN_QUANTIZE", os.path.join(ROOT, "build", "release", "examples", "kiln-quantize"))
    llama_q = os.path.join(os.environ.get("LLAMACPP_NEWEST_BIN", "/work/llamanewest/build/bin"), "llama-quantize")
    common = ["-c", str(a.ctx), "--chunks", str(a.chunks), "-t", str(a.threads)]
    rows = []

    def base(model, path, extra):
        out, s = run([ppl, "-m", model, "-f", a.text, *common, "--kl-divergence-base", path, *extra])
        p, u = grab(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
        return p, u, s

    def compare(label, weights, precision, model, path):
        out, s = run([ppl, "-m", model, "--kl-divergence-base", path, "--kl-divergence", "--precision", precision,
                      "-t", str(a.threads)])
        p, u = grab(r"Mean PPL\(Q\)\s*:\s*([0-9.]+) \+/-\s*([0-9.]+)", out)
        lr, lru = grab(r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*(-?[0-9.]+) \+/-\s*([0-9.]+)", out)
        k, ku = grab(r"Mean\s+KLD:\s*([-+0-9.e]+) \+/-\s*([-+0-9.e]+)", out)
        med, = grab(r"Median\s+KLD:\s*([-+0-9.e]+)", out)
        p99, = grab(r"99\.0%\s+KLD:\s*([-+0-9.e]+)", out)
        top, topu = grab(r"Same top p:\s*([0-9.]+) \+/-\s*([0-9.]+)", out)
        rows.append(f"| {label} | {weights} | {precision} | {p} +/- {u} | {lr} +/- {lru} | {k} +/- {ku} | {med} | "
                    f"{p99} | {top} +/- {topu} % | {s:.0f} |")

    with tempfile.TemporaryDirectory() as tmp:
        for label, fname in [("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct.Q4_1.gguf"),
                             ("Gemma 3 270M", "gemma-3-270m-q4_k_m.gguf")]:
            model = os.path.join(a.models, fname)
            path = os.path.join(tmp, fname + ".kld")
            p, u, s = base(model, path, ["--precision", "exact"])
            rows.append(f"| {label} | {fname.split('.')[-2] if 'SmolLM2' in fname else 'Q4_K_M'} | exact (base) | "
                        f"{p} +/- {u} | | | | | | {s:.0f} |")
            for prec in ["fast", "fast8"]:
                compare(label, "", prec, model, path)
        if os.path.exists(llama_q):
            src = os.path.join(a.models, "SmolLM2-135M-Instruct.Q4_1.gguf")
            f32 = os.path.join(tmp, "smollm2-f32.gguf")
            run([llama_q, "--allow-requantize", src, f32, "F32", str(a.threads)])
            path = os.path.join(tmp, "f32.kld")
            p, u, s = base(f32, path, ["--precision", "exact"])
            rows.append(f"| SmolLM2 (Q4_1 values as F32) | F32 | exact (base) | {p} +/- {u} | | | | | | {s:.0f} |")
            for t in ["q8_0", "q4_1", "q4_0"]:
                q = os.path.join(tmp, f"smollm2-{t}.gguf")
                run([quant, f32, q, t, "-t", str(a.threads)])
                compare("SmolLM2 (Q4_1 values as F32)", f"kiln-quantize {t.upper()}", "fast", q, path)
                os.remove(q)
        else:
            print(f"quality.py: SKIPPED the kiln-quantize rows: {llama_q} missing (scripts/llamacpp_newest.sh)",
                  file=sys.stderr)
    print(f"kiln-perplexity -f {a.text} -c {a.ctx} --chunks {a.chunks} -t {a.threads}\n")
    print("| model | weights | precision | PPL | ln(PPL/PPL base) | mean KLD | median KLD | 99% KLD | same top | s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
