// kiln/model/arch/llama.hpp - the Llama architecture (Llama 1/2/3, TinyLlama, llama2.c models, ...).
//
// Pre-norm RMSNorm blocks, SwiGLU MLP, no biases, grouped-query attention, RoPE, optionally tied
// embeddings. The GGUF tensor names are llama.cpp's (blk.N.attn_q.weight, ...; see model/weights.hpp).
//
// RoPE pairing. HF checkpoints rotate (i, i + d/2) (rotate_half). llama.cpp's convert_hf_to_gguf.py
// permutes the rows of attn_q / attn_k back to Meta's original interleaved order for LLM_ARCH_LLAMA,
// and llama.cpp then applies LLAMA_ROPE_TYPE_NORM, which rotates adjacent pairs (2i, 2i + 1). llama2.c
// checkpoints (and GGUFs converted from them) were trained with adjacent pairs in the first place. So for
// GGUF llama and llama2.c .bin files the pairing is RopeStyle::gptj (the trait below). Hugging Face
// safetensors Llamas are not permuted: kiln's HF loader (model/hf_model.hpp) sets HParams::rope_style
// to neox for them, and the same Config runs both.
//
// Mixtral is this Config with experts (model/moe.hpp: softmax router, top-2, weights renormalised): GGUF
// general.architecture "llama" with {arch}.expert_count > 0 and the stacked blk.N.ffn_*_exps tensors
// (older conversions with one tensor per expert, blk.N.ffn_gate.E.weight, are refused); Hugging Face
// model_type "mixtral" (num_local_experts, num_experts_per_tok; block_sparse_moe.gate and
// block_sparse_moe.experts.E.{w1,w3,w2}: gate, up, down).
//
// Mistral (Hugging Face model_type "mistral"; GGUF "llama") is this Config too: model/arch/mistral.hpp.
// Llama 3.x's RoPE scaling (rope_scaling rope_type "llama3"; GGUF tensor rope_freqs.weight) is
// HParams::rope_freq_factors, read by both loaders for any architecture.
#pragma once

#include <string_view>

#include "kiln/model/arch/mistral.hpp"
#include "kiln/model/config.hpp"

namespace kiln {

/// Hugging Face names of Mixtral's experts (MixtralForCausalLM; MiniMax-M2 uses them too): block_sparse_moe.gate,
/// block_sparse_moe.experts.E.{w1,w3,w2} (gate, up, down).
inline constexpr TensorNames kMixtralHfTensorNames = [] {
  TensorNames n = kHfTensorNames;
  n.router = "block_sparse_moe.gate";
  n.experts = "block_sparse_moe.experts.";
  n.exp_gate = "w1";
  n.exp_up = "w3";
  n.exp_down = "w2";
  n.exp_probs_b = "block_sparse_moe.e_score_correction_bias";
  n.shexp_gate_inp = "block_sparse_moe.shared_expert_gate";
  n.shexp_gate = "block_sparse_moe.shared_expert.gate_proj";
  n.shexp_up = "block_sparse_moe.shared_expert.up_proj";
  n.shexp_down = "block_sparse_moe.shared_expert.down_proj";
  return n;
}();

struct Llama : ArchDefaults {
  static constexpr std::string_view name = "llama";
  static constexpr std::string_view hf_model_types[] = {"llama", "mistral", "mixtral"};
  static constexpr RopeStyle rope_style = RopeStyle::gptj;
  /// Hugging Face: Mixtral's experts (the only checkpoints of this Config with experts).
  static constexpr TensorNames hf_names = kMixtralHfTensorNames;

  /// Hugging Face config.json: Mistral's sliding window (model/arch/mistral.hpp).
  template <class HF>
  static void adjust_hf_hparams(HParams& hp, const HF& c) {
    if (c.model_type == "mistral") mistral_adjust_hf_hparams(hp, c);
  }
};
static_assert(ArchConfig<Llama>, "kiln::Llama must satisfy ArchConfig");

}  // namespace kiln
