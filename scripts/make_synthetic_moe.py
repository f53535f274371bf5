#!/usr/bin/env python3
"""Writes a synthetic Qwen3-MoE-shaped GGUF with random Q4_0 weights (fixed seed), for benchmarks only.

Needs: the tooling venv (.venv: gguf, numpy). Output goes to ~/.cache/kiln/models/ (never into git):

    .venv/bin/python scripts/make_synthetic_moe.py            # synthetic-moe-16x.Q4_0.gguf
    .venv/bin/python scripts/make_synthetic_moe.py --layers 4 # a smaller one (same shapes per layer)

Shape (general.architecture qwen3moe): dim 2048, 16 layers, 16 query heads and 4 KV heads of 128, 16 experts
of hidden size 2816, top-2 (renormalised, as llama.cpp computes every qwen3moe), vocab 32000 (untied
output), context 4096, RoPE theta 1e6. Parameters: 16 x 16 x 3 x 2048 x 2816 = 4.43 B in experts, of which
2 of 16 are active per token (0.55 B) plus attention (16 x 10.5 M) and the classifier (65.5 M): about
0.79 B active of 4.7 B.

Weights: every matrix Q4_0 (the router and norms f32, as llama.cpp keeps them) with random blocks:
the 4-bit values uniform from numpy's PCG64 (seed 1234, one stream per tensor), each block's scale
2 / sqrt(cols) / 8 as f16, so that activations stay O(1); the router N(0, 1 / dim) f32, so that tokens
spread over the experts. The blocks are written directly (no f32 model is made first): the file is noise
with the byte layout of a real Q4_0 model, which is all a bandwidth benchmark reads.

Tokenizer: a placeholder "llama" vocabulary ("t0".."t31999"); kiln-bench-e2e feeds token ids.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("make_synthetic_moe: gguf-py not found: run with the tooling venv (.venv/bin/python)")

DEFAULT_DIR = Path.home() / ".cache" / "kiln" / "models"
DIM, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, USED, EFFN, VOCAB, CTX = 2048, 16, 4, 128, 16, 2, 2816, 32000, 4096
SEED = 1234
QK = 32  # Q4_0 block: f16 scale + 16 bytes of 4-bit values


def q4_0_blocks(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """(rows, cols / 32 * 18) bytes of Q4_0 blocks: random nibbles, scale 2 / sqrt(cols) / 8."""
    nb = cols // QK
    out = np.empty((rows, nb, 18), dtype=np.uint8)
    out[:, :, :2] = np.frombuffer(np.float16(2.0 / np.sqrt(cols) / 8.0).tobytes(), dtype=np.uint8)
    out[:, :, 2:] = rng.integers(0, 256, size=(rows, nb, 16), dtype=np.uint8)
    return out.reshape(rows, nb * 18)


def tensor_specs(layers: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape outermost first, 'q4' or 'f32' or 'norm')."""
    s = [("token_embd.weight", (VOCAB, DIM), "q4"), ("output_norm.weight", (DIM,), "norm"),
         ("output.weight", (VOCAB, DIM), "q4")]
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for l in range(layers):
        p = f"blk.{l}."
        s += [(p + "attn_norm.weight", (DIM,), "norm"), (p + "attn_q.weight", (q, DIM), "q4"),
              (p + "attn_k.weight", (kv, DIM), "q4"), (p + "attn_v.weight", (kv, DIM), "q4"),
              (p + "attn_output.weight", (DIM, q), "q4"), (p + "attn_q_norm.weight", (HEAD_DIM,), "norm"),
              (p + "attn_k_norm.weight", (HEAD_DIM,), "norm"), (p + "ffn_norm.weight", (DIM,), "norm"),
              (p + "ffn_gate_inp.weight", (EXPERTS, DIM), "f32"),
              (p + "ffn_gate_exps.weight", (EXPERTS, EFFN, DIM), "q4"),
              (p + "ffn_up_exps.weight", (EXPERTS, EFFN, DIM), "q4"),
              (p + "ffn_down_exps.weight", (EXPERTS, DIM, EFFN), "q4")]
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--force", action="store_true", help="rewrite the file if it exists")
    args = ap.parse_args()
    name = "synthetic-moe-16x" + ("" if args.layers == 16 else f"-{args.layers}l") + ".Q4_0.gguf"
    path = args.out_dir / name
    if path.exists() and not args.force:
        print(f"{path} exists (--force rewrites it)")
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_name("kiln synthetic MoE 16x top-2")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_context_length(CTX)
    w.add_embedding_length(DIM)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(EFFN)
    w.add_expert_feed_forward_length(EFFN)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(USED)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([1] * VOCAB)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    specs = tensor_specs(args.layers)
    q4 = gguf.GGMLQuantizationType.Q4_0
    for tname, shape, kind in specs:  # infos first: the data is streamed below
        if kind == "q4":
            byte_shape = (*shape[:-1], shape[-1] // QK * 18)  # gguf-py takes a quantized tensor's byte shape
            w.add_tensor_info(tname, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=q4)
        else:
            w.add_tensor_info(tname, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (tname, shape, kind) in enumerate(specs):
        rng = np.random.default_rng([SEED, i])
        if kind == "q4":
            a = q4_0_blocks(rng, int(np.prod(shape[:-1])), shape[-1]).reshape(*shape[:-1], -1)
        elif kind == "f32":
            a = (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))).astype(np.float32)
        else:
            a = np.ones(shape, dtype=np.float32)
        w.write_tensor_data(a)
    w.close()
    total = sum(int(np.prod(s)) for _, s, _ in specs)
    print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB, {total / 1e9:.2f} B parameters)")


if __name__ == "__main__":
    main()
