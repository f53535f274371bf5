// kiln/model/arch/qwen2moe.hpp - the Qwen2-MoE architecture (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B).
//
// Qwen2's block (q/k/v biases, neox RoPE) with every layer's MLP a mixture of experts (model/moe.hpp):
// softmax router, top-k experts, their weights not renormalised (norm_topk_prob false in the released
// models), plus a shared expert that every token uses, scaled by sigmoid(h . w) (shared_expert_gate).
//   GGUF: general.architecture "qwen2moe"; {arch}.expert_count, expert_used_count,
//   expert_feed_forward_length, expert_shared_feed_forward_length; blk.N.ffn_gate_inp.weight (the router),
//   the stacked blk.N.ffn_{gate,up,down}_exps.weight, blk.N.ffn_{gate,up,down}_shexp.weight and the shared
//   expert's gate blk.N.ffn_gate_inp_shexp.weight. llama.cpp never renormalises qwen2moe's expert weights
//   (its converter writes no key for norm_topk_prob): kiln neither, unless the file says
//   {arch}.expert_weights_norm = true.
//   Hugging Face: model_type "qwen2_moe"; num_experts, num_experts_per_tok, moe_intermediate_size,
//   shared_expert_intermediate_size, norm_topk_prob, qkv_bias; model.layers.N.mlp.gate.weight,
//   mlp.experts.E.{gate,up,down}_proj.weight, mlp.shared_expert.{gate,up,down}_proj.weight and
//   mlp.shared_expert_gate.weight (1, hidden). Dense layers among the sparse ones (decoder_sparse_step > 1,
//   mlp_only_layers) and qkv_bias = false are refused with an error.
#pragma once

#include <string>
#include <string_view>

#include "kiln/core/error.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/model/arch/qwen2.hpp"  // qwen_adjust_hf_sliding_window
#include "kiln/model/config.hpp"

namespace kiln {

struct Qwen2Moe : ArchDefaults {
  static constexpr std::string_view name = "qwen2moe";
  static constexpr std::string_view hf_model_types[] = {"qwen2_moe"};
  static constexpr bool qkv_bias = true;

  /// GGUF: llama.cpp's LLM_ARCH_QWEN2MOE (build_moe_ffn with norm_w false; the shared expert required).
  static void adjust_hparams(HParams& hp, const io::GGUFFile& f) {
    hp.expert_weights_norm = f.get_or<bool>(std::string(name) + ".expert_weights_norm", false);
    if (!hp.n_expert || !hp.shexp_ffn_dim)
      fail<FormatError>("kiln: GGUF file '", f.name(), "': a qwen2moe model needs experts (", name,
                        ".expert_count) and a shared expert (blk.0.ffn_up_shexp.weight)");
  }

  /// Hugging Face config.json (Qwen2MoeConfig).
  template <class HF>
  static void adjust_hf_hparams(HParams& hp, const HF& c) {
    if (!c.template find<bool>("qkv_bias").value_or(true))
      fail<FormatError>("kiln: config.json file '", c.source, "': qkv_bias = false is not supported for ", name);
    if (!hp.n_expert || !hp.shexp_ffn_dim)
      fail<FormatError>("kiln: config.json file '", c.source, "': a ", name,
                        " model needs num_experts and shared_expert_intermediate_size");
    qwen_adjust_hf_sliding_window(hp, c);  // model/arch/qwen2.hpp
  }
};
static_assert(ArchConfig<Qwen2Moe>, "kiln::Qwen2Moe must satisfy ArchConfig");

}  // namespace kiln
