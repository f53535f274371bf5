#!/usr/bin/env python3
"""llama.cpp's llama-server on the tiny GGUFs of tests/fixtures/models/ (scripts/fixtures/make_tiny_models.py, and
make_moe_models.py's mixtures of experts: qwen3moe mixtral qwen2moe olmoe minimax-m2 gpt-oss):
16 greedy tokens after the fixture's first 8, and the chosen tokens' log-probabilities, against transformers
on the same model's safetensors checkpoint (up to transformers' first end-of-sequence token, when it picks one:
llama-server's ignore_eos bans that token). An independent check that the GGUFs follow llama.cpp's
conventions (names, keys, q/k permutation, norm + 1, RoPE scaling, soft-caps, fused tensors).

    /work/refenv/bin/python scripts/check_tiny_models_llamaserver.py /path/to/llama-server NAME...
(scripts/llamaserver_build.sh builds llama-server). f32 KV cache, no flash attention. Exits 1 unless every
greedy sequence is identical.
"""
import json, os, shutil, subprocess, sys, tempfile, time, urllib.request
import torch, transformers
SERVER = sys.argv[1]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "models")
TMP = tempfile.mkdtemp(prefix="kiln-llamaserver-")
bad = 0
N_PROMPT, N_GEN = 8, 16
port = 18940
for name in sys.argv[2:]:
    d = os.path.join(ROOT, name)
    ref = json.load(open(os.path.join(d, "reference.json")))
    prompt = ref["tokens"][:N_PROMPT]
    port += 1
    gguf_path = os.path.join(d, "model.gguf")
    data = open(gguf_path, "rb").read()
    if b"kiln tiny phi3" in data:  # llama.cpp special-cases vocabularies of models named phi3
        gguf_path = os.path.join(TMP, name + ".gguf")
        open(gguf_path, "wb").write(data.replace(b"kiln tiny phi3", b"kiln tiny pXi3"))
    p = subprocess.Popen([SERVER, "-m", gguf_path, "--port", str(port), "-c", "128", "-t", "1",
                          "-np", "1", "-ctk", "f32", "-ctv", "f32", "-fa", "off"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health"); break
            except Exception:
                time.sleep(0.2)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(
            {"prompt": prompt, "n_predict": N_GEN, "temperature": 0, "n_probs": 1, "cache_prompt": False,
             "ignore_eos": True}).encode(), headers={"Content-Type": "application/json"})
        out = json.load(urllib.request.urlopen(req))
    finally:
        p.terminate(); p.wait()
    cp = out["completion_probabilities"]
    ll_ids = [c["id"] for c in cp]
    ll_lp = [c["logprob"] for c in cp]
    m = transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
    ids = list(prompt); hf_lp = []
    with torch.no_grad():
        for _ in range(N_GEN):
            lp = torch.log_softmax(m(torch.tensor([ids])).logits[0, -1].double(), -1)
            t = int(lp.argmax()); ids.append(t); hf_lp.append(float(lp[t]))
    hf_ids = ids[N_PROMPT:]
    eos = m.config.eos_token_id
    if isinstance(eos, int) and eos in hf_ids:
        n = hf_ids.index(eos)
        print(f"{name}: transformers picks the end-of-sequence token {eos} as token {n}: comparing the {n} before it")
        hf_ids, hf_lp, ll_ids, ll_lp = hf_ids[:n], hf_lp[:n], ll_ids[:n], ll_lp[:n]
    same = hf_ids == ll_ids
    dlp = max(abs(a - b) for a, b in zip(hf_lp, ll_lp)) if same else float("nan")
    print(f"{name}: greedy {'identical' if same else 'DIFFERENT'} over {len(hf_ids)} tokens; max |logprob llama.cpp - HF| {dlp:.2e}")
    if not same:
        bad += 1
        print("  hf   ", hf_ids); print("  llama", ll_ids)
shutil.rmtree(TMP, ignore_errors=True)
sys.exit(1 if bad else 0)
