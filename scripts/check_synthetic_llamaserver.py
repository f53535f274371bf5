#!/usr/bin/env python3
"""kiln-server against llama.cpp's llama-server on one GGUF: the same greedy tokens and top log-probabilities.

For the synthetic benchmark files (scripts/make_synthetic_gemma3.py, make_synthetic_moe.py), which have no
Hugging Face twin to compare with: an independent check that kiln reads such a file as llama.cpp does
(keys, shapes, the architecture's constants such as Gemma 3 27B's attention scale, sliding layers, RoPE).

    python3 scripts/check_synthetic_llamaserver.py KILN_SERVER LLAMA_SERVER MODEL.gguf [--tokens 3] [--top 8]

The two servers run one after the other (a 27B file's memory is held once), each with 2 threads, one slot
and a 64-position context; the prompt "hello world" goes to /v1/completions at temperature 0 with
`logprobs: TOP`. Passes when every step picks the same token and every token both engines list has
log-probabilities within --tol of each other; a token only one of them lists must be within --tol of the
other's cut-off (a near-tie at the edge of the list). Why --tol 0.05: llama.cpp rounds each activation
vector to 8 bits per block of 32 (Q8_0) before every product and keeps K/V in f16, kiln's default keeps
two 8-bit parts (about 16 bits); on these files' O(1) logits that moves log-probabilities by about 0.01
(0.0063 at most on synthetic-gemma3-27b.Q4_0.gguf, 3 tokens). What it catches: a file the two read
differently in its tokenizer, shapes, types, norms or scales, which moves a 262144-token list far more. What
it cannot: a random model attends almost uniformly, so position-dependent readings (RoPE bases, sliding
windows) hardly show in a short prompt (a 6-layer file whose gemma3.rope.freq_base_swa says 100, which
llama.cpp reads and kiln does not, passes): a reading check, not an accuracy test. Exits 1 on a difference,
printing both lists.
"""
import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def top_lists(body: dict) -> tuple[list[str], list[dict[str, float]]]:
    """(chosen tokens, [{token: logprob}] per step) from OpenAI's legacy completions logprobs (kiln) or
    llama-server's `content` list."""
    lp = body["choices"][0]["logprobs"]
    if "content" in lp:
        return ([c["token"] for c in lp["content"]],
                [{t["token"]: t["logprob"] for t in c["top_logprobs"]} for c in lp["content"]])
    return lp["tokens"], lp["top_logprobs"]


def ask(cmd: list[str], port: int, tokens: int, top: int, timeout: float) -> tuple[list[str], list[dict]]:
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + timeout
        while True:
            if p.poll() is not None:
                sys.exit(f"check_synthetic_llamaserver: {cmd[0]} exited ({p.returncode}):\n{p.stderr.read()[-2000:]}")
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200:
                    break
            except Exception:
                pass
            if time.time() > deadline:
                sys.exit(f"check_synthetic_llamaserver: {cmd[0]} not ready after {timeout:.0f} s")
            time.sleep(1)
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", headers={"Content-Type": "application/json"},
            data=json.dumps({"prompt": "hello world", "max_tokens": tokens, "temperature": 0,
                             "logprobs": top}).encode())
        return top_lists(json.load(urllib.request.urlopen(req, timeout=timeout)))
    finally:
        p.terminate()
        p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kiln_server")
    ap.add_argument("llama_server")
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=3)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--tol", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=600, help="seconds for a server to load and answer")
    a = ap.parse_args()
    common = ["-m", a.model, "-t", "2", "-c", "64", "-np", "1"]
    pk, pl = free_port(), free_port()
    k_tok, k_top = ask([a.kiln_server, *common, "--port", str(pk)], pk, a.tokens, a.top, a.timeout)
    l_tok, l_top = ask([a.llama_server, *common, "--port", str(pl)], pl, a.tokens, a.top, a.timeout)
    bad, worst = 0, 0.0
    for i, (kt, lt, K, L) in enumerate(zip(k_tok, l_tok, k_top, l_top)):
        problems = [] if kt == lt else [f"chosen {kt!r} (kiln) vs {lt!r} (llama.cpp)"]
        for t in K.keys() | L.keys():
            if t in K and t in L:
                worst = max(worst, abs(K[t] - L[t]))
                if abs(K[t] - L[t]) > a.tol:
                    problems.append(f"{t!r}: {K[t]:.4f} vs {L[t]:.4f}")
            else:
                mine, other = (K, L) if t in K else (L, K)
                if mine[t] > min(other.values()) + a.tol:
                    problems.append(f"{t!r} ({mine[t]:.4f}) listed by {'kiln' if mine is K else 'llama.cpp'} only")
        if problems or len(k_tok) != len(l_tok):
            bad += 1
            print(f"step {i}: " + "; ".join(problems))
            print("  kiln:     ", sorted(K.items(), key=lambda x: -x[1]))
            print("  llama.cpp:", sorted(L.items(), key=lambda x: -x[1]))
    if len(k_tok) != len(l_tok) or len(k_tok) != a.tokens:
        print(f"token counts: kiln {len(k_tok)}, llama.cpp {len(l_tok)}, asked {a.tokens}")
        bad += 1
    print(f"check_synthetic_llamaserver: {a.model}: {'OK' if not bad else 'DIFFERENT'}: {len(k_tok)} tokens "
          f"{k_tok}, top {a.top} log-probabilities within {worst:.4f} (tolerance {a.tol})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
