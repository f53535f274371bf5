// kiln/model/arch/qwen3moe.hpp - the Qwen3-MoE architecture (Qwen3-30B-A3B, Qwen3-235B-A22B).
//
// Qwen3's block (qk_norm, head_dim from the file, neox RoPE) with every layer's MLP a mixture of experts
// (model/moe.hpp): softmax router, top-k experts, their weights renormalised (norm_topk_prob).
//   GGUF: general.architecture "qwen3moe"; {arch}.expert_count, expert_used_count,
//   expert_feed_forward_length (each expert's hidden size); blk.N.ffn_gate_inp.weight (the router) and
//   the stacked blk.N.ffn_{gate,up,down}_exps.weight (n_expert, rows, cols).
//   Hugging Face: model_type "qwen3_moe"; num_experts (transformers 5: num_local_experts),
//   num_experts_per_tok, moe_intermediate_size,
//   norm_topk_prob; model.layers.N.mlp.gate.weight and mlp.experts.E.{gate,up,down}_proj.weight (what
//   transformers' save_pretrained writes). Dense layers among the sparse ones (decoder_sparse_step > 1,
//   mlp_only_layers) are refused with an error.
#pragma once

#include <string_view>

#include "kiln/model/arch/qwen2.hpp"  // qwen_adjust_hf_sliding_window
#include "kiln/model/config.hpp"

namespace kiln {

struct Qwen3Moe : ArchDefaults {
  static constexpr std::string_view name = "qwen3moe";
  static constexpr std::string_view hf_model_types[] = {"qwen3_moe"};
  static constexpr bool qk_norm = true;
  /// Hugging Face config.json: the sliding window of use_sliding_window (model/arch/qwen2.hpp).
  template <class HF>
  static void adjust_hf_hparams(HParams& hp, const HF& c) {
    qwen_adjust_hf_sliding_window(hp, c);
  }
};
static_assert(ArchConfig<Qwen3Moe>, "kiln::Qwen3Moe must satisfy ArchConfig");

}  // namespace kiln
