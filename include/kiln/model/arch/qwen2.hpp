// kiln/model/arch/qwen2.hpp - the Qwen2 architecture (Qwen2, Qwen2.5, and their GGUFs).
//
// Llama's block with biases on the q, k and v projections (none on o or the MLP), RoPE rotate_half
// pairs (RopeStyle::neox: llama.cpp uses LLAMA_ROPE_TYPE_NEOX for qwen2 and does not permute q/k at
// conversion, so GGUF and Hugging Face files pair alike), usually tied embeddings (Qwen2-0.5B/1.5B).
//   GGUF: general.architecture "qwen2", blk.N.attn_{q,k,v}.bias.
//   Hugging Face: model_type "qwen2", model.layers.N.self_attn.{q,k,v}_proj.bias. A config with
//   use_sliding_window (layers >= max_window_layers attend within sliding_window) or layer_types is
//   honoured; llama.cpp ignores both, and so does kiln for GGUF files.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/model/config.hpp"

namespace kiln {

/// config.json of the Qwen family (Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE): use_sliding_window makes the layers from
/// max_window_layers on attend within sliding_window (0 when absent). layer_types, when listed, decides instead.
template <class HF>
void qwen_adjust_hf_sliding_window(HParams& hp, const HF& c) {
  if (!hp.sliding_layers.empty() || !c.template find<bool>("use_sliding_window").value_or(false)) return;
  const auto w = c.template find<int64_t>("sliding_window");
  const auto from = c.template find<int64_t>("max_window_layers").value_or(0);
  hp.sliding_window = w ? std::size_t(std::max<int64_t>(*w, 0)) : 0;
  hp.sliding_layers.resize(hp.n_layers);
  for (std::size_t l = 0; l < hp.n_layers; ++l) hp.sliding_layers[l] = int64_t(l) >= from;
}

struct Qwen2 : ArchDefaults {
  static constexpr std::string_view name = "qwen2";
  static constexpr std::string_view hf_model_types[] = {"qwen2"};
  static constexpr bool qkv_bias = true;
  /// Hugging Face config.json: the sliding window of use_sliding_window.
  template <class HF>
  static void adjust_hf_hparams(HParams& hp, const HF& c) {
    qwen_adjust_hf_sliding_window(hp, c);
  }
};
static_assert(ArchConfig<Qwen2>, "kiln::Qwen2 must satisfy ArchConfig");

}  // namespace kiln
