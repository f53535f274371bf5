// kiln/model/arch/minimax_m2.hpp - the MiniMax-M2 architecture (MiniMax-M2, M2.1).
//
// Llama's block with RMSNorms of the q and k projections over a token's whole q and whole k
// (qk_norm_whole, as OLMoE), partial rotary (rotary_dim of head_dim, neox pairs), and every layer's MLP a
// mixture of experts (model/moe.hpp) with sigmoid gating: each expert's weight is sigmoid(logit), the k
// experts are chosen by weight + a per-expert correction bias (DeepSeek-V3's e_score_correction_bias; it
// only chooses), and the chosen weights are renormalised to sum 1.
//   GGUF: general.architecture "minimax-m2"; {arch}.expert_count, expert_used_count,
//   expert_feed_forward_length, expert_gating_func (2, sigmoid: required, as llama.cpp has no default for
//   it), rope.dimension_count; blk.N.attn_{q,k}_norm.weight, blk.N.ffn_gate_inp.weight, the stacked
//   blk.N.ffn_{gate,up,down}_exps.weight and the correction bias blk.N.exp_probs_b.bias.
//   Hugging Face: model_type "minimax_m2"; num_local_experts, num_experts_per_tok, intermediate_size (each
//   expert's), rotary_dim or partial_rotary_factor; model.layers.N.self_attn.{q,k}_norm.weight,
//   block_sparse_moe.gate.weight, block_sparse_moe.experts.E.{w1,w3,w2}.weight and
//   block_sparse_moe.e_score_correction_bias (what transformers' save_pretrained writes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/core/error.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/model/arch/llama.hpp"  // kMixtralHfTensorNames
#include "kiln/model/config.hpp"

namespace kiln {

struct MiniMaxM2 : ArchDefaults {
  static constexpr std::string_view name = "minimax-m2";
  static constexpr std::string_view hf_model_types[] = {"minimax_m2"};
  static constexpr bool qk_norm = true, qk_norm_whole = true;
  /// Hugging Face: Mixtral's expert names (block_sparse_moe.*) and the sigmoid router's
  /// block_sparse_moe.e_score_correction_bias.
  static constexpr TensorNames hf_names = kMixtralHfTensorNames;

  /// GGUF: llama.cpp's LLM_ARCH_MINIMAX_M2 (build_moe_ffn with norm_w true and the file's gating function).
  static void adjust_hparams(HParams& hp, const io::GGUFFile& f) {
    const std::string a = std::string(name) + ".";
    if (!hp.n_expert || !f.contains(a + "expert_gating_func"))
      fail<FormatError>("kiln: GGUF file '", f.name(), "': a minimax-m2 model needs experts (", a,
                        "expert_count) and their gating function (", a, "expert_gating_func)");
  }

  /// Hugging Face config.json (MiniMaxM2Config; the released checkpoints' rotary_dim).
  template <class HF>
  static void adjust_hf_hparams(HParams& hp, const HF& c) {
    if (!hp.n_expert)
      fail<FormatError>("kiln: config.json file '", c.source, "': a minimax_m2 model needs num_local_experts");
    hp.expert_gating = ExpertGating::sigmoid;
    hp.expert_weights_norm = true;
    const auto* rp = c.find_json("rope_parameters");
    const bool factor =
        c.contains("partial_rotary_factor") ||
        (rp && rp->is_object() && rp->contains("partial_rotary_factor") && !rp->at("partial_rotary_factor").is_null());
    if (const auto rd = c.template find<int64_t>("rotary_dim"); rd && !factor) {
      if (*rd <= 0 || std::size_t(*rd) > hp.head_dim || *rd % 2 != 0)
        fail<FormatError>("kiln: config.json file '", c.source, "': rotary_dim = ", *rd,
                          " must be even and within head_dim ", hp.head_dim);
      hp.rope_dim = std::size_t(*rd);
    }
  }
};
static_assert(ArchConfig<MiniMaxM2>, "kiln::MiniMaxM2 must satisfy ArchConfig");

}  // namespace kiln
