#!/usr/bin/env python3
"""llama.cpp on the tiny GGUFs of tests/fixtures/models/ (scripts/fixtures/make_tiny_models.py) against
transformers' logits: checks that those GGUFs follow llama.cpp's conventions (names, keys, Llama q/k
permutation, Gemma norm + 1, Gemma 3's sliding window and RoPE bases), independently of kiln.

Needs llama-cpp-python (scripts/llamacpp_env.sh):  /work/llamaenv/bin/python scripts/check_tiny_models_llamacpp.py
f32 KV cache, no flash attention. Measured (llama-cpp-python 0.3.36): llama, qwen2, qwen3 within 1e-6 of
the logit range; gemma3 within 5e-4 (ggml's GELU goes through an f16 table); the tolerance is 2e-3.
"""
import json
import os
import sys

import numpy as np
from llama_cpp import Llama

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOL = 2e-3


def main():
    bad = 0
    for name in ["llama", "qwen2", "qwen3", "gemma3"]:
        d = os.path.join(ROOT, "tests", "fixtures", "models", name)
        meta = json.load(open(os.path.join(d, "reference.json")))
        n, v = meta["shape"]
        ref = np.fromfile(os.path.join(d, meta["logits"]), "<f4").reshape(n, v)
        m = Llama(os.path.join(d, "model.gguf"), n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=2,
                  type_k=0, type_v=0, flash_attn=False)  # GGML_TYPE_F32 KV cache
        m.eval(meta["tokens"])
        got = np.array(m.scores[:n], dtype=np.float32)
        err = (np.abs(got - ref).max(1) / (ref.max(1) - ref.min(1))).max()
        ok = err <= TOL and (got.argmax(1) == ref.argmax(1)).all()
        bad += not ok
        print(f"{name}: llama.cpp vs transformers, worst max |delta| / range {err:.2e} {'ok' if ok else 'FAIL'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
