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

--arch gpt-oss writes a gpt-oss-20b-shaped file instead (synthetic-gptoss-<layers>l.MXFP4.gguf; default 8 of
gpt-oss-20b's 24 layers, about 3.9 GiB): dim 2880, 64 query heads and 8 KV heads of 64 (q/k/v/o biases,
attention sinks, a sliding window of 128 on even layers, YaRN RoPE as the released GGUFs say), 32 experts of
hidden size 2880, top-4, with biases and a router bias; the experts MXFP4 as the released GGUFs store them
(e8m0 scale bytes 119..120, uniform random codes), attention, embedding and classifier
Q8_0 (scale 2 / sqrt(cols) / 127 per block, random bytes), vocab 32000 (gpt-oss's o200k vocabulary, 201088
tokens, would make the classifier the largest read of a decode step; the bench is about the experts).
Per token: 4 of 32 experts per layer are read, 3 x 2880 x 2880 x 17 / 32 bytes each (13.2 MB): 52.9 MB per
layer.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

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


# gpt-oss-20b (config.json of openai/gpt-oss-20b), the vocabulary cut to VOCAB.
G_DIM, G_HEADS, G_KV, G_HD, G_EXP, G_USED, G_EFFN, G_WIN = 2880, 64, 8, 64, 32, 4, 2880, 128
Q8_BYTES, MX_BYTES = 34, 17


def q8_0_blocks(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """(rows, cols / 32 * 34) bytes of Q8_0 blocks: random bytes, scale 2 / sqrt(cols) / 127."""
    nb = cols // QK
    out = np.empty((rows, nb, Q8_BYTES), dtype=np.uint8)
    out[:, :, :2] = np.frombuffer(np.float16(2.0 / np.sqrt(cols) / 127.0).tobytes(), dtype=np.uint8)
    out[:, :, 2:] = rng.integers(0, 256, size=(rows, nb, 32), dtype=np.uint8)
    return out.reshape(rows, nb * Q8_BYTES)


def mxfp4_blocks(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """(rows, cols / 32 * 17) bytes of MXFP4 blocks: random codes, e8m0 bytes 119..120 (2^-9, 2^-8 with the
    doubled values, whose mean magnitude is 4.5: mean |w| ~ 1 / sqrt(cols) at cols = 2880)."""
    nb = cols // QK
    out = np.empty((rows, nb, MX_BYTES), dtype=np.uint8)
    out[:, :, 0] = rng.integers(119, 121, size=(rows, nb), dtype=np.uint8)
    out[:, :, 1:] = rng.integers(0, 256, size=(rows, nb, 16), dtype=np.uint8)
    return out.reshape(rows, nb * MX_BYTES)


def gptoss_specs(layers: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape outermost first, 'q8', 'mx', 'f32', 'bias', 'sink' or 'norm')."""
    s = [("token_embd.weight", (VOCAB, G_DIM), "q8"), ("output_norm.weight", (G_DIM,), "norm"),
         ("output.weight", (VOCAB, G_DIM), "q8")]
    q, kv = G_HEADS * G_HD, G_KV * G_HD
    for l in range(layers):
        p = f"blk.{l}."
        s += [(p + "attn_norm.weight", (G_DIM,), "norm"), (p + "attn_q.weight", (q, G_DIM), "q8"),
              (p + "attn_q.bias", (q,), "bias"), (p + "attn_k.weight", (kv, G_DIM), "q8"),
              (p + "attn_k.bias", (kv,), "bias"), (p + "attn_v.weight", (kv, G_DIM), "q8"),
              (p + "attn_v.bias", (kv,), "bias"), (p + "attn_output.weight", (G_DIM, q), "q8"),
              (p + "attn_output.bias", (G_DIM,), "bias"), (p + "attn_sinks.weight", (G_HEADS,), "sink"),
              (p + "post_attention_norm.weight", (G_DIM,), "norm"),
              (p + "ffn_gate_inp.weight", (G_EXP, G_DIM), "f32"), (p + "ffn_gate_inp.bias", (G_EXP,), "bias"),
              (p + "ffn_gate_exps.weight", (G_EXP, G_EFFN, G_DIM), "mx"),
              (p + "ffn_gate_exps.bias", (G_EXP, G_EFFN), "bias"),
              (p + "ffn_up_exps.weight", (G_EXP, G_EFFN, G_DIM), "mx"),
              (p + "ffn_up_exps.bias", (G_EXP, G_EFFN), "bias"),
              (p + "ffn_down_exps.weight", (G_EXP, G_DIM, G_EFFN), "mx"),
              (p + "ffn_down_exps.bias", (G_EXP, G_DIM), "bias")]
    return s


def gptoss_header(w: "gguf.GGUFWriter", layers: int) -> None:
    a = "gpt-oss"
    w.add_name("kiln synthetic gpt-oss-20b shape")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_uint32(f"{a}.context_length", 131072)
    w.add_uint32(f"{a}.embedding_length", G_DIM)
    w.add_uint32(f"{a}.block_count", layers)
    w.add_uint32(f"{a}.feed_forward_length", G_EFFN)
    w.add_uint32(f"{a}.expert_feed_forward_length", G_EFFN)
    w.add_uint32(f"{a}.expert_count", G_EXP)
    w.add_uint32(f"{a}.expert_used_count", G_USED)
    w.add_uint32(f"{a}.attention.head_count", G_HEADS)
    w.add_uint32(f"{a}.attention.head_count_kv", G_KV)
    w.add_uint32(f"{a}.attention.key_length", G_HD)
    w.add_uint32(f"{a}.attention.value_length", G_HD)
    w.add_uint32(f"{a}.attention.sliding_window", G_WIN)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{a}.rope.freq_base", 150000.0)
    w.add_string(f"{a}.rope.scaling.type", "yarn")
    w.add_float32(f"{a}.rope.scaling.factor", 32.0)
    w.add_uint32(f"{a}.rope.scaling.original_context_length", 4096)


def write_streamed(w: "gguf.GGUFWriter", specs: list[tuple[str, tuple[int, ...], str]],
                   quant: dict[str, tuple["gguf.GGMLQuantizationType", int]],
                   make: Callable[[int, tuple[int, ...], str], np.ndarray]) -> None:
    """Writes w's header, every tensor's info, then each tensor's data as make(index, shape, kind) returns
    it, so that one tensor at a time is in memory (a 27B-shaped file does not fit it), and closes w.
    quant maps a kind to its GGML type and bytes per 32-value block; "f16" is float16; any other kind f32."""
    for tname, shape, kind in specs:
        if kind in quant:
            qt, block_bytes = quant[kind]
            byte_shape = (*shape[:-1], shape[-1] // QK * block_bytes)  # gguf-py takes a quantized tensor's byte shape
            w.add_tensor_info(tname, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qt)
        elif kind == "f16":
            w.add_tensor_info(tname, shape, np.dtype(np.float16), int(np.prod(shape)) * 2)
        else:
            w.add_tensor_info(tname, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (_, shape, kind) in enumerate(specs):
        w.write_tensor_data(make(i, shape, kind))
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["qwen3moe", "gpt-oss"], default="qwen3moe")
    ap.add_argument("--layers", type=int, default=None, help="default: 16 (qwen3moe), 8 (gpt-oss)")
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--force", action="store_true", help="rewrite the file if it exists")
    args = ap.parse_args()
    gptoss = args.arch == "gpt-oss"
    if args.layers is None:
        args.layers = 8 if gptoss else 16
    if gptoss:
        name = f"synthetic-gptoss-{args.layers}l.MXFP4.gguf"
    else:
        name = "synthetic-moe-16x" + ("" if args.layers == 16 else f"-{args.layers}l") + ".Q4_0.gguf"
    path = args.out_dir / name
    if path.exists() and not args.force:
        print(f"{path} exists (--force rewrites it)")
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), args.arch)
    if gptoss:
        gptoss_header(w, args.layers)
    else:
        qwen3moe_header(w, args.layers)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([1] * VOCAB)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    specs = gptoss_specs(args.layers) if gptoss else tensor_specs(args.layers)
    blocks = {"q4": (gguf.GGMLQuantizationType.Q4_0, 18, q4_0_blocks),
              "q8": (gguf.GGMLQuantizationType.Q8_0, Q8_BYTES, q8_0_blocks),
              "mx": (gguf.GGMLQuantizationType.MXFP4, MX_BYTES, mxfp4_blocks)}
    def make(i: int, shape: tuple[int, ...], kind: str) -> np.ndarray:
        rng = np.random.default_rng([SEED, i])
        if kind in blocks:
            rows = int(np.prod(shape[:-1]))
            return blocks[kind][2](rng, rows, shape[-1]).reshape(*shape[:-1], -1)
        if kind == "f32":
            return (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))).astype(np.float32)
        if kind == "bias":
            return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)).astype(np.float32)
        if kind == "sink":
            return rng.standard_normal(shape, dtype=np.float32)
        return np.ones(shape, dtype=np.float32)

    write_streamed(w, specs, {k: v[:2] for k, v in blocks.items()}, make)
    total = sum(int(np.prod(s)) for _, s, _ in specs)
    print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB, {total / 1e9:.2f} B parameters)")


def qwen3moe_header(w: "gguf.GGUFWriter", layers: int) -> None:
    w.add_name("kiln synthetic MoE 16x top-2")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_context_length(CTX)
    w.add_embedding_length(DIM)
    w.add_block_count(layers)
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


if __name__ == "__main__":
    main()
