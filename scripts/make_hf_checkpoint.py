#!/usr/bin/env python3
"""Writes a Hugging Face Llama checkpoint holding the weights of a llama GGUF with F32 tensors.

Needs the tooling venv (.venv: gguf, numpy, safetensors). Used by scripts/python_checks.sh to test
kiln-quantize's safetensors input against llama.cpp; nothing here downloads anything.

    make_hf_checkpoint.py stories260K.gguf OUT_DIR

OUT_DIR gets config.json, model.safetensors (F32, transformers' tensor names) and tokenizer.model (a
SentencePiece ModelProto with the GGUF's pieces, scores and types). The q_proj / k_proj rows are put back
into transformers' rotate_half order: the inverse of convert_hf_to_gguf.py's LlamaModel.permute,
    permute(w, n_head) = w.reshape(n_head, 2, hd // 2, *rest).swapaxes(1, 2).reshape(w.shape)
so converting OUT_DIR with kiln-quantize must give back the GGUF's own tensors.
"""
import json
import os
import struct
import sys

import numpy as np
from gguf import GGUFReader
from safetensors.numpy import save_file


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def varint(v):
    out = b""
    while v >= 0x80:
        out += bytes([(v & 0x7F) | 0x80])
        v >>= 7
    return out + bytes([v])


def sentencepiece_model(tokens, scores, types):
    out = b""
    for piece, score, typ in zip(tokens, scores, types):
        p = piece.encode("utf-8")
        sp = b"\x0a" + varint(len(p)) + p + b"\x15" + struct.pack("<f", score)
        if typ != 1:
            sp += b"\x18" + varint(int(typ))
        out += b"\x0a" + varint(len(sp)) + sp
    return out


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    r = GGUFReader(sys.argv[1])
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)

    def field(k):
        return r.fields[k].contents()

    n_head, n_kv, n_layer = field("llama.attention.head_count"), field("llama.attention.head_count_kv"), field("llama.block_count")
    w = {t.name: np.array(t.data, dtype=np.float32) for t in r.tensors}
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    per_layer = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    hf = {}
    for name, x in w.items():
        if name in names:
            hf[names[name]] = x
            continue
        _, layer, kind, _ = name.split(".")
        if kind == "attn_q":
            x = unpermute(x, n_head)
        elif kind == "attn_k":
            x = unpermute(x, n_kv)
        hf[f"model.layers.{layer}.{per_layer[kind]}.weight"] = np.ascontiguousarray(x)
    save_file(hf, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": int(field("llama.embedding_length")), "intermediate_size": int(field("llama.feed_forward_length")),
        "num_hidden_layers": int(n_layer), "num_attention_heads": int(n_head), "num_key_value_heads": int(n_kv),
        "vocab_size": int(w["token_embd.weight"].shape[0]), "max_position_embeddings": int(field("llama.context_length")),
        "rms_norm_eps": float(np.float32(field("llama.attention.layer_norm_rms_epsilon"))), "rope_theta": 10000.0,
        "tie_word_embeddings": "output.weight" not in w, "bos_token_id": int(field("tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field("tokenizer.ggml.eos_token_id")), "torch_dtype": "float32"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(out, "tokenizer.model"), "wb") as f:
        f.write(sentencepiece_model(field("tokenizer.ggml.tokens"), field("tokenizer.ggml.scores"),
                                    field("tokenizer.ggml.token_type")))
    print(f"make_hf_checkpoint: {out}: {len(hf)} tensors, {len(field('tokenizer.ggml.tokens'))} pieces")


if __name__ == "__main__":
    main()
