#!/usr/bin/env python3
"""Writes a synthetic ~1B-parameter Llama GGUF with random weights (fixed seed), for benchmarks only.

Needs: the tooling venv (.venv: gguf, numpy; scripts/python_env.sh). Output goes to ~/.cache/kiln/models/
(never into git):

    .venv/bin/python scripts/make_synthetic_model.py                 # synthetic-1b.F16.gguf
    .venv/bin/python scripts/make_synthetic_model.py --type q4_0     # + synthetic-1b.Q4_0.gguf
    .venv/bin/python scripts/make_synthetic_model.py --type q8_0 --type q4_0

Shape (the size class of TinyLlama / Llama 3.2 1B, kept plain multi-head to stay near 1B parameters):
    llama, dim 2048, 16 layers, ffn 5632, 32 heads, 32 KV heads (no GQA), head_dim 64, vocab 32000,
    context 2048, RoPE theta 10000, RMSNorm eps 1e-5, untied output. 0.95 B parameters:
    16 x (4 x 2048^2 + 3 x 2048 x 5632) + 2 x 32000 x 2048.

Weights: N(0, 0.02) (f32 from numpy's PCG64, seed 1234, one generator stream per tensor in file order),
rounded to f16; norm weights 1.0 (f32, as llama.cpp stores them). The F16 file is the source of every
quantized version, so all versions hold the same values up to their rounding.

Quantized versions (--type q8_0 / q4_0 / q4_1 / q5_0 / q5_1): every 2-D weight in that type (the token
embedding included) except output.weight, which is Q8_0 for the 4- and 5-bit types (kiln-quantize's default;
llama.cpp's quantizer would give it Q6_K); norms f32. Made by kiln's own `kiln-quantize IN OUT TYPE` when it is found
(--kiln-quantize PATH, or build/*/examples/kiln-quantize), else by gguf-py (gguf.quants.quantize, the
reference kiln-quantize is byte-identical with); the script says which it used.

Tokenizer: a minimal SentencePiece ("llama") vocabulary of 32000 pieces so that llama.cpp and kiln load it:
<unk> <s> </s>, the 256 byte pieces <0x00>..<0xFF>, then lowercase letter strings (a..z, aa..zz, aaa..)
with and without the word-start mark U+2581, scores -rank. Text tokenizes, but the model is noise.
"""
from __future__ import annotations

import argparse
import glob
import itertools
import os
import shutil
import string
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("make_synthetic_model: gguf-py not found: run with the tooling venv (.venv/bin/python; scripts/python_env.sh)")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = Path.home() / ".cache" / "kiln" / "models"

DIM, LAYERS, FFN, HEADS, KV_HEADS, VOCAB, CTX = 2048, 16, 5632, 32, 32, 32000, 2048
SEED = 1234
QTYPES = {
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
    "q5_1": gguf.GGMLQuantizationType.Q5_1,
}
FTYPES = {  # general.file_type (llama_ftype)
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    "q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
    "q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
}


def vocab(n: int = VOCAB,
          specials: tuple[tuple[bytes, int], ...] | None = None) -> tuple[list[bytes], list[float], list[int]]:
    """n pieces: the special pieces (default <unk> <s> </s>), the 256 byte pieces, then letter strings."""
    T = gguf.TokenType
    if specials is None:
        specials = ((b"<unk>", T.UNKNOWN), (b"<s>", T.CONTROL), (b"</s>", T.CONTROL))
    toks: list[bytes] = [t for t, _ in specials]
    types = [ty for _, ty in specials]
    for b in range(256):
        toks.append(f"<0x{b:02X}>".encode())
        types.append(T.BYTE)
    seen = set(toks)
    for length in itertools.count(1):
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            w = "".join(letters)
            for piece in ("\u2581" + w, w):
                p = piece.encode()
                if p not in seen and len(toks) < n:
                    seen.add(p)
                    toks.append(p)
                    types.append(T.NORMAL)
        if len(toks) >= n:
            break
    fixed = len(specials) + 256
    scores = [0.0] * fixed + [-float(i) for i in range(n - fixed)]
    assert len(toks) == len(scores) == len(types) == n
    return toks, scores, [int(t) for t in types]


def tensor_specs() -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) in file order; a matrix (rows = output features, cols = input features)."""
    hd = DIM // HEADS
    specs = [("token_embd.weight", (VOCAB, DIM))]
    for i in range(LAYERS):
        b = f"blk.{i}."
        specs += [
            (b + "attn_norm.weight", (DIM,)),
            (b + "attn_q.weight", (HEADS * hd, DIM)),
            (b + "attn_k.weight", (KV_HEADS * hd, DIM)),
            (b + "attn_v.weight", (KV_HEADS * hd, DIM)),
            (b + "attn_output.weight", (DIM, HEADS * hd)),
            (b + "ffn_norm.weight", (DIM,)),
            (b + "ffn_gate.weight", (FFN, DIM)),
            (b + "ffn_up.weight", (FFN, DIM)),
            (b + "ffn_down.weight", (DIM, FFN)),
        ]
    specs += [("output_norm.weight", (DIM,)), ("output.weight", (VOCAB, DIM))]
    return specs


def make_tensor(idx: int, shape: tuple[int, ...]) -> np.ndarray:
    if len(shape) == 1:
        return np.ones(shape, dtype=np.float32)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([SEED, idx])))
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).astype(np.float16)


def write_model(path: Path, type_name: str) -> None:
    """Writes the model with 2-D weights in `type_name` (f16 or a QTYPES key) using gguf-py only."""
    t0 = time.time()
    w = gguf.GGUFWriter(str(path) + ".tmp", "llama")
    w.add_name(f"kiln synthetic 1B ({type_name.upper()}, random weights, seed {SEED})")
    w.add_context_length(CTX)
    w.add_embedding_length(DIM)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(DIM // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_file_type(FTYPES[type_name])
    toks, scores, types = vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    for idx, (name, shape) in enumerate(tensor_specs()):
        a = make_tensor(idx, shape)
        if a.ndim == 2 and type_name in QTYPES:
            # kiln-quantize's default (and llama.cpp's habit of a wider output type): output.weight gets Q8_0
            # when the file type has 4 or 5 bits
            q = QTYPES["q8_0"] if name == "output.weight" and type_name != "q8_0" else QTYPES[type_name]
            w.add_tensor(name, gguf.quants.quantize(a.astype(np.float32), q), raw_dtype=q)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    os.replace(str(path) + ".tmp", path)
    print(f"make_synthetic_model: wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) with gguf-py in {time.time() - t0:.0f} s")


def find_kiln_quantize(explicit: str | None) -> str | None:
    if explicit:
        if not os.access(explicit, os.X_OK):
            sys.exit(f"make_synthetic_model: --kiln-quantize {explicit} is not an executable")
        return explicit
    found = sorted(glob.glob(str(ROOT / "build" / "*" / "examples" / "kiln-quantize")), key=os.path.getmtime)
    return found[-1] if found else shutil.which("kiln-quantize")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--type", action="append", choices=sorted(QTYPES), default=[],
                    help="also write a quantized version (repeatable); the F16 file is always made")
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--kiln-quantize", help="path of kiln-quantize (default: build/*/examples/kiln-quantize)")
    ap.add_argument("--gguf-py", action="store_true", help="quantize with gguf-py even when kiln-quantize exists")
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    args = ap.parse_args()

    args.out_dir.mkdir(parents=True, exist_ok=True)
    f16 = args.out_dir / "synthetic-1b.F16.gguf"
    if args.force or not f16.exists():
        write_model(f16, "f16")
    else:
        print(f"make_synthetic_model: {f16} exists (--force to rewrite)")
    kq = None if args.gguf_py else find_kiln_quantize(args.kiln_quantize)
    for t in args.type:
        out = args.out_dir / f"synthetic-1b.{t.upper()}.gguf"
        if out.exists() and not args.force:
            print(f"make_synthetic_model: {out} exists (--force to rewrite)")
            continue
        if kq:
            t0 = time.time()
            r = subprocess.run([kq, str(f16), str(out) + ".tmp", t])
            if r.returncode != 0:
                sys.exit(f"make_synthetic_model: {kq} {f16} {out} {t} failed (exit {r.returncode}); "
                         "rerun with --gguf-py to use gguf-py's quantizer")
            os.replace(str(out) + ".tmp", out)
            print(f"make_synthetic_model: wrote {out} ({out.stat().st_size / 2**20:.0f} MiB) with {kq} in {time.time() - t0:.0f} s")
        else:
            print(f"make_synthetic_model: kiln-quantize not found (build it: ninja -C build/<dir> kiln-quantize); "
                  f"quantizing {t.upper()} with gguf-py (gguf.quants.quantize)")
            write_model(out, t)


if __name__ == "__main__":
    main()
