// kiln/model/arch/qwen3.hpp - the Qwen3 architecture (dense Qwen3 models and their GGUFs).
//
// Llama's block plus an RMSNorm of every q and k head before RoPE (qk_norm, weights of head_dim), no
// biases, head_dim from the file (config.json head_dim, GGUF {arch}.attention.key_length: 128 for
// every Qwen3, so q_dim != dim for some sizes), RoPE rotate_half pairs (RopeStyle::neox in GGUF and
// Hugging Face files alike), tied embeddings for the small sizes.
//   GGUF: general.architecture "qwen3", blk.N.attn_{q,k}_norm.weight.
//   Hugging Face: model_type "qwen3", model.layers.N.self_attn.{q,k}_norm.weight. attention_bias = true
//   (no released Qwen3 uses it) is refused with an error.
#pragma once

#include <string_view>

#include "kiln/model/arch/qwen2.hpp"  // qwen_adjust_hf_sliding_window
#include "kiln/model/config.hpp"

namespace kiln {

struct Qwen3 : ArchDefaults {
  static constexpr std::string_view name = "qwen3";
  static constexpr std::string_view hf_model_types[] = {"qwen3"};
  static constexpr bool qk_norm = true;
  /// Hugging Face config.json: the sliding window of use_sliding_window (model/arch/qwen2.hpp).
  template <class HF>
  static void adjust_hf_hparams(HParams& hp, const HF& c) {
    qwen_adjust_hf_sliding_window(hp, c);
  }
};
static_assert(ArchConfig<Qwen3>, "kiln::Qwen3 must satisfy ArchConfig");

}  // namespace kiln
