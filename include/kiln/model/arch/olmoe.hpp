// kiln/model/arch/olmoe.hpp - the OLMoE architecture (OLMoE-1B-7B).
//
// Llama's block with RMSNorms of the q and k projections (before RoPE), each over a token's whole q
// (q_dim weights) and whole k (kv_dim), not per head (qk_norm_whole), neox RoPE, and every layer's MLP a
// mixture of experts (model/moe.hpp): softmax router, top-k (8 of 64 in OLMoE-1B-7B), weights not
// renormalised (norm_topk_prob false).
//   GGUF: general.architecture "olmoe"; {arch}.expert_count, expert_used_count; blk.N.attn_{q,k}_norm.weight,
//   blk.N.ffn_gate_inp.weight and the stacked blk.N.ffn_{gate,up,down}_exps.weight (each expert's hidden
//   size is feed_forward_length). llama.cpp never renormalises olmoe's expert weights: kiln neither, unless
//   the file says {arch}.expert_weights_norm = true. llama.cpp's converter writes the RMSNorm epsilon as
//   1e-5 whatever config.json says (OLMoE's own value). A q/k/v clamp ({arch}.attention.clamp_kqv) is refused.
//   Hugging Face: model_type "olmoe"; num_experts, num_experts_per_tok, norm_topk_prob;
//   model.layers.N.self_attn.{q,k}_norm.weight, mlp.gate.weight, mlp.experts.E.{gate,up,down}_proj.weight.
//   clip_qkv other than null is refused.
#pragma once

#include <string>
#include <string_view>

#include "kiln/core/error.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/model/config.hpp"

namespace kiln {

struct Olmoe : ArchDefaults {
  static constexpr std::string_view name = "olmoe";
  static constexpr std::string_view hf_model_types[] = {"olmoe"};
  static constexpr bool qk_norm = true, qk_norm_whole = true;

  /// GGUF: llama.cpp's LLM_ARCH_OLMOE (build_moe_ffn with norm_w false).
  static void adjust_hparams(HParams& hp, const io::GGUFFile& f) {
    const std::string a = std::string(name) + ".";
    hp.expert_weights_norm = f.get_or<bool>(a + "expert_weights_norm", false);
    if (f.contains(a + "attention.clamp_kqv"))
      fail<FormatError>("kiln: GGUF file '", f.name(), "': ", a,
                        "attention.clamp_kqv (clipping q, k, v) is not supported");
    if (!hp.n_expert)
      fail<FormatError>("kiln: GGUF file '", f.name(), "': an olmoe model needs experts (", a, "expert_count)");
  }

  /// Hugging Face config.json (OlmoeConfig).
  template <class HF>
  static void adjust_hf_hparams(HParams& hp, const HF& c) {
    if (c.template find<double>("clip_qkv"))
      fail<FormatError>("kiln: config.json file '", c.source, "': clip_qkv (clipping q, k, v) is not supported");
    if (!hp.n_expert) fail<FormatError>("kiln: config.json file '", c.source, "': an olmoe model needs num_experts");
  }
};
static_assert(ArchConfig<Olmoe>, "kiln::Olmoe must satisfy ArchConfig");

}  // namespace kiln
