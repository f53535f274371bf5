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

#include <string_view>

#include "kiln/model/config.hpp"

namespace kiln {

struct Qwen2 : ArchDefaults {
  static constexpr std::string_view name = "qwen2";
  static constexpr std::string_view hf_model_types[] = {"qwen2"};
  static constexpr bool qkv_bias = true;
};
static_assert(ArchConfig<Qwen2>, "kiln::Qwen2 must satisfy ArchConfig");

}  // namespace kiln
