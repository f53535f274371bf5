#!/usr/bin/env python3
"""kiln-perplexity against llama.cpp's llama-perplexity on the same GGUF files and text (scripts/llamacpp_newest.sh
builds llama.cpp; no Python packages needed):

    python3 scripts/check_perplexity_llamacpp.py [--kiln build/release/examples/kiln-perplexity]
            [--llama-bin /work/llamanewest/build/bin] [--models ~/.cache/kiln/models]

For SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M, over /usr/share/common-licenses/GPL-3 (Debian's
base-files: 35 KB of English on every Debian machine, no download), -c 128, 3 chunks, 2 threads:

 1. The same tokens: kiln's count of the text's tokens is llama.cpp's (llama-perplexity with -c just over half
    of kiln's count fails, printing its own count), and the same chunks of the same size.
 2. PPL. llama.cpp multiplies quantized weights with 8-bit activations (Q8_0/Q8_1 per 32 values) and keeps an
    f16 KV cache; kiln --precision fast8 rounds the same way (not to the same bits) and exact not at all. Such
    roundings move each token's NLL by a zero-mean amount that is not small (~1e-2 nats), so two engines'
    PPLs differ by a sampling error over the scored tokens, not by a fixed bound. kiln measures its size on the
    same tokens: ln(PPL(fast8) / PPL(exact)) = m +/- u (kiln-perplexity --kl-divergence against an exact base).
    llama.cpp passes when |ln(PPL(llama.cpp) / PPL(kiln exact))| <= |m| + 4u.
 3. SmolLM2 dequantized to F32 (llama-quantize --allow-requantize ... F32): no activation rounding on either side;
    kiln exact with an f32 KV cache against llama.cpp with -ctk f32 -ctv f32. Both compute f32 logits within
    1e-4 of the logit range of the reference (tests/model/test_hf_models.cpp's bound for kiln; llama.cpp's f32
    path the same arithmetic in another order), so each NLL is within 2 x 1e-4 x range and
    |ln(PPL ratio)| <= 2 x 2e-4 x the mean logit range kiln reports (both engines' errors added).
Takes about 35 s of CPU time (Xeon, family 6 model 207); writes its files to a temporary directory.
"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TEXT = "/usr/share/common-licenses/GPL-3"
CTX, CHUNKS, THREADS = 128, 3, 2
MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def kiln(args, exe):
    rc, out, err = run([exe, *args])
    if rc != 0:
        sys.exit(f"kiln-perplexity {' '.join(args)} failed:\n{err}")
    return out, err


def kiln_ppl(out):
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
    r = re.search(r"mean logit range ([0-9.]+)", out)
    return float(m.group(1)), float(r.group(1))


def llama_ppl(binary, model, extra=()):
    rc, out, err = run([binary, "-m", model, "-f", TEXT, "-c", str(CTX), "--chunks", str(CHUNKS), "-t", str(THREADS),
                        "-b", str(CTX), *extra])
    text = out + err
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", text)
    c = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)", text)
    if rc != 0 or not m or not c:
        sys.exit(f"llama-perplexity on {model} failed ({rc}):\n{text[-3000:]}")
    return float(m.group(1)), int(c.group(1)), int(c.group(2))


def llama_token_count(binary, model, half):
    # -c half: needs 2 * half tokens; with fewer it stops before any evaluation, printing its count.
    rc, out, err = run([binary, "-m", model, "-f", TEXT, "-c", str(half), "--chunks", "0", "-t", "1"])
    m = re.search(r"tokenizes to only (\d+) tokens", out + err)
    return int(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "release", "examples", "kiln-perplexity"))
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMACPP_NEWEST_BIN", "/work/llamanewest/build/bin"))
    ap.add_argument("--models", default=os.path.expanduser(os.environ.get("KILN_MODEL_DIR", "~/.cache/kiln/models")))
    a = ap.parse_args()
    lp = os.path.join(a.llama_bin, "llama-perplexity")
    lq = os.path.join(a.llama_bin, "llama-quantize")
    for f in [a.kiln, lp, lq, TEXT]:
        if not os.path.exists(f):
            sys.exit(f"check_perplexity_llamacpp: {f} is missing")
    bad = 0
    common = ["-f", TEXT, "-c", str(CTX), "--chunks", str(CHUNKS), "-t", str(THREADS)]
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            model = os.path.join(a.models, name)
            if not os.path.exists(model):
                sys.exit(f"check_perplexity_llamacpp: {model} is missing (scripts/fetch_models.sh)")
            base = os.path.join(tmp, name + ".kld")
            out, err = kiln(["-m", model, *common, "--precision", "exact", "--kl-divergence-base", base], a.kiln)
            ppl_exact, _ = kiln_ppl(out)
            m = re.search(r": (\d+) tokens, (\d+) chunks of (\d+)", err)
            n_tokens, chunks, ctx = int(m.group(1)), int(m.group(2)), int(m.group(3))
            out8, _ = kiln(["-m", model, "--kl-divergence-base", base, "--kl-divergence", "--precision", "fast8",
                            "-t", str(THREADS)], a.kiln)
            r8 = re.search(r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*(-?[0-9.]+) \+/-\s*([0-9.]+)", out8)
            m8, u8 = float(r8.group(1)), float(r8.group(2))
            count = llama_token_count(lp, model, n_tokens // 2 + 1)
            ppl_llama, l_chunks, l_ctx = llama_ppl(lp, model)
            d = abs(math.log(ppl_llama / ppl_exact))
            tol = abs(m8) + 4 * u8
            ok = count == n_tokens and (l_chunks, l_ctx) == (chunks, ctx) and d <= tol
            bad += not ok
            print(f"{name}: tokens kiln {n_tokens} llama.cpp {count}; chunks {chunks}x{ctx} / {l_chunks}x{l_ctx}; "
                  f"PPL kiln exact {ppl_exact:.4f}, llama.cpp {ppl_llama:.4f}: |ln ratio| {d:.4f} <= {tol:.4f} "
                  f"(kiln fast8 vs exact {m8:+.4f} +/- {u8:.4f}) {'ok' if ok else 'FAIL'}")
            if name.startswith("SmolLM2"):
                f32 = os.path.join(tmp, "smollm2-f32.gguf")
                rc, qo, qe = run([lq, "--allow-requantize", model, f32, "F32", "2"])
                if rc != 0:
                    sys.exit(f"llama-quantize to F32 failed:\n{qe[-2000:]}")
                out, _ = kiln(["-m", f32, *common, "--precision", "exact", "--kv", "f32"], a.kiln)
                ppl_k, rng = kiln_ppl(out)
                ppl_l, _, _ = llama_ppl(lp, f32, ["-ctk", "f32", "-ctv", "f32"])
                d = abs(math.log(ppl_l / ppl_k))
                tol = 2 * 2e-4 * rng
                ok = d <= tol
                bad += not ok
                print(f"{name} as F32: PPL kiln exact {ppl_k:.4f}, llama.cpp {ppl_l:.4f} (f32 KV caches): "
                      f"|ln ratio| {d:.2e} <= {tol:.2e} (mean logit range {rng:.2f}) {'ok' if ok else 'FAIL'}")
                os.remove(f32)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
