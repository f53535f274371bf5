#!/usr/bin/env python3
"""Writes a synthetic Gemma-3-27B-shaped GGUF with random Q4_0 weights (fixed seed), for benchmarks only.

Needs: the tooling venv (.venv: gguf, numpy). Output goes to ~/.cache/kiln/models/ (never into git); the
file is about 14.2 GiB (check the free disk first) and is written tensor by tensor, so the script's memory
stays near the largest tensor (peak RSS 0.85 GiB; 2.9 GiB and a minute more with --embd f16):

    .venv/bin/python scripts/make_synthetic_gemma3.py              # synthetic-gemma3-27b.Q4_0.gguf
    .venv/bin/python scripts/make_synthetic_gemma3.py --embd f16   # synthetic-gemma3-27b-f16embd.Q4_0.gguf
    .venv/bin/python scripts/make_synthetic_gemma3.py --layers 2   # synthetic-gemma3-27b-2l.Q4_0.gguf

Shape (general.architecture gemma3, the text decoder of google/gemma-3-27b-it's config.json): dim 5376,
62 layers, 32 query heads and 16 KV heads of 128, ffn 21504 (GELU-tanh gated), vocab 262144, tied
embeddings, q/k norms and the four norms per layer, RMSNorm eps 1e-6, sliding window 1024 on five of every
six layers (layer l is global when (l + 1) % 6 == 0: llama.cpp's and kiln's default for gemma3, so the file
needs no pattern key), RoPE base 1e6 with linear scaling 8 on the global layers, 10000 on the sliding ones
(llama.cpp and kiln hard-code it; the released GGUFs carry no key for it), context 131072. The attention
scale follows from the layer count: both engines use 1 / sqrt(dim / heads) = 1 / sqrt(168) for 62 layers.
Parameters: 62 x 412.9 M + 262144 x 5376 (1.41 B) = 27.0 B.

Weights: every matrix Q4_0, as in google/gemma-3-27b-it-qat-q4_0-gguf (Google's QAT file, 17.2 GB), except
the token embedding, which Google keeps in F16; the default here is the Q4_0 embedding of the re-packed
"-small" variant of that file (15.6 GB: the tied embedding is also the classifier, read in full for every
decoded token, so its type changes the decode speed); --embd f16 writes Google's layout. Random blocks as
in make_synthetic_moe.py: the 4-bit values uniform from numpy's PCG64 (seed 1234, one stream per tensor),
each block's scale 2 / sqrt(cols) / 8 as f16; the F16 embedding N(0, 1 / dim). Norm weights 1.0 (f32; a
GGUF's Gemma norms already hold 1 + w). The file is noise with the byte layout of a real 27B Q4_0 model,
which is all a bandwidth benchmark reads.

Tokenizer: a SentencePiece ("llama") vocabulary of 262144 pieces so that llama.cpp and kiln tokenize text
(make_synthetic_model.vocab): <pad> <eos> <bos> <unk> at Gemma's ids 0..3, the 256 byte pieces, then
letter strings with and without U+2581; add_bos, no space prefix (as Gemma's GGUFs). No chat template.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("make_synthetic_gemma3: gguf-py not found: run with the tooling venv (.venv/bin/python)")

from make_synthetic_model import vocab
from make_synthetic_moe import QK, SEED, q4_0_blocks, write_streamed

DEFAULT_DIR = Path.home() / ".cache" / "kiln" / "models"
DIM, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 5376, 62, 32, 16, 128, 21504, 262144
WINDOW, CTX, ROPE_BASE, ROPE_LINEAR, EPS = 1024, 131072, 1e6, 8.0, 1e-6
Q4_BYTES = 18
CHUNK_ROWS = 8192  # rows generated at a time (the random draws' temporaries stay small)


def tensor_specs(layers: int, embd: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape outermost first, 'q4', 'f16' or 'norm') in file order."""
    s = [("token_embd.weight", (VOCAB, DIM), "q4" if embd == "q4_0" else "f16")]
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for l in range(layers):
        p = f"blk.{l}."
        s += [(p + "attn_norm.weight", (DIM,), "norm"), (p + "attn_q.weight", (q, DIM), "q4"),
              (p + "attn_k.weight", (kv, DIM), "q4"), (p + "attn_v.weight", (kv, DIM), "q4"),
              (p + "attn_q_norm.weight", (HEAD_DIM,), "norm"), (p + "attn_k_norm.weight", (HEAD_DIM,), "norm"),
              (p + "attn_output.weight", (DIM, q), "q4"), (p + "post_attention_norm.weight", (DIM,), "norm"),
              (p + "ffn_norm.weight", (DIM,), "norm"), (p + "ffn_gate.weight", (FFN, DIM), "q4"),
              (p + "ffn_up.weight", (FFN, DIM), "q4"), (p + "ffn_down.weight", (DIM, FFN), "q4"),
              (p + "post_ffw_norm.weight", (DIM,), "norm")]
    s.append(("output_norm.weight", (DIM,), "norm"))  # no output.weight: tied to token_embd
    return s


def make_tensor(i: int, shape: tuple[int, ...], kind: str) -> np.ndarray:
    """Tensor i of the file: Q4_0 bytes (rows, cols / 32 * 18), f16 (rows, cols) or f32 ones."""
    if kind == "norm":
        return np.ones(shape, dtype=np.float32)
    rng = np.random.default_rng([SEED, i])
    rows, cols = shape
    if kind == "q4":
        out = np.empty((rows, cols // QK * Q4_BYTES), dtype=np.uint8)
        for r in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - r)
            out[r:r + n] = q4_0_blocks(rng, n, cols)
    else:
        out = np.empty((rows, cols), dtype=np.float16)
        for r in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - r)
            out[r:r + n] = rng.standard_normal((n, cols), dtype=np.float32) / np.float32(np.sqrt(cols))
    return out


def write_header(w: "gguf.GGUFWriter", layers: int, embd: str) -> None:
    a = "gemma3"
    w.add_name(f"kiln synthetic Gemma 3 27B shape ({layers} layers, Q4_0, embedding {embd.upper()}, seed {SEED})")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_uint32(f"{a}.context_length", CTX)
    w.add_uint32(f"{a}.embedding_length", DIM)
    w.add_uint32(f"{a}.block_count", layers)
    w.add_uint32(f"{a}.feed_forward_length", FFN)
    w.add_uint32(f"{a}.attention.head_count", HEADS)
    w.add_uint32(f"{a}.attention.head_count_kv", KV_HEADS)
    w.add_uint32(f"{a}.attention.key_length", HEAD_DIM)
    w.add_uint32(f"{a}.attention.value_length", HEAD_DIM)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", EPS)
    w.add_uint32(f"{a}.attention.sliding_window", WINDOW)
    w.add_float32(f"{a}.rope.freq_base", ROPE_BASE)
    w.add_string(f"{a}.rope.scaling.type", "linear")
    w.add_float32(f"{a}.rope.scaling.factor", ROPE_LINEAR)
    T = gguf.TokenType
    toks, scores, types = vocab(VOCAB, ((b"<pad>", T.CONTROL), (b"<eos>", T.CONTROL), (b"<bos>", T.CONTROL),
                                        (b"<unk>", T.UNKNOWN)))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_pad_token_id(0)
    w.add_eos_token_id(1)
    w.add_bos_token_id(2)
    w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=LAYERS, help=f"default {LAYERS} (Gemma 3 27B)")
    ap.add_argument("--embd", choices=["q4_0", "f16"], default="q4_0",
                    help="token embedding (= classifier) type: q4_0 (default) or f16 (Google's QAT file)")
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--force", action="store_true", help="rewrite the file if it exists")
    args = ap.parse_args()
    if args.layers < 1:
        sys.exit(f"make_synthetic_gemma3: --layers {args.layers} must be at least 1")
    name = "synthetic-gemma3-27b" + ("" if args.layers == LAYERS else f"-{args.layers}l")
    path = args.out_dir / (name + ("" if args.embd == "q4_0" else "-f16embd") + ".Q4_0.gguf")
    if path.exists() and not args.force:
        print(f"make_synthetic_gemma3: {path} exists (--force rewrites it)")
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tmp = str(path) + ".tmp"
    w = gguf.GGUFWriter(tmp, "gemma3")
    write_header(w, args.layers, args.embd)
    specs = tensor_specs(args.layers, args.embd)
    write_streamed(w, specs, {"q4": (gguf.GGMLQuantizationType.Q4_0, Q4_BYTES)}, make_tensor)
    os.replace(tmp, path)
    total = sum(int(np.prod(s)) for _, s, _ in specs)
    print(f"make_synthetic_gemma3: wrote {path} ({path.stat().st_size / 2**30:.2f} GiB, {total / 1e9:.2f} B "
          f"parameters) in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
