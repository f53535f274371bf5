// kiln/model/arch/phi3.hpp - the Phi-3 architecture (Phi-3 / Phi-3.5 mini and medium, Phi-4, Phi-4-mini:
// Phi3ForCausalLM, and their GGUFs).
//
// Llama's block (RMSNorm, SwiGLU, no biases, untied output) with fused projections in the files:
//   q, k, v = rows [0, q_dim), [q_dim, q_dim + kv_dim), [q_dim + kv_dim, q_dim + 2 kv_dim) of one matrix
//   gate, up = rows [0, ffn_dim), [ffn_dim, 2 ffn_dim) of one matrix (HF: gate, up = chunk(2); llama.cpp's
//              fused SwiGLU takes the first half as the gate)
// kiln keeps them fused in the file and views each part's rows (zero-copy: rows are independent in every
// storage type), then multiplies them as separate weights (linear_multi reads x once for them all).
// RoPE: rotate_half pairs (RopeStyle::neox; llama.cpp LLAMA_ROPE_TYPE_NEOX, q/k not permuted) over the
// first rope_dim elements of each head: partial_rotary_factor (Phi-4-mini: 0.75; HF rope_parameters or the
// top level) gives rope_dim = int(head_dim * factor), GGUF {arch}.rope.dimension_count.
//   GGUF: general.architecture "phi3"; blk.N.attn_qkv.weight, blk.N.ffn_up.weight (2 ffn_dim rows: gate
//   then up), no ffn_gate. llama.cpp disables Phi-3's sliding window ({arch}.attention.sliding_window is
//   read and ignored), and so does kiln for GGUF files.
//   Hugging Face: model_type "phi3"; self_attn.qkv_proj, mlp.gate_up_proj. A non-null sliding_window
//   (Phi-3-mini-4k: 2047) slides on every layer (HF's create_sliding_window_causal_mask).
// LongRoPE (Phi-3 / Phi-3.5 128k, Phi-4-mini: rope_type "longrope", or "su" / "yarn", which Phi3Config
// renames to longrope; GGUF rope_factors_long/short.weight) is read by both loaders for any architecture
// (HParams::rope_long_factors): the long factors apply to a context longer than
// original_max_position_embeddings, as llama.cpp chooses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/core/error.hpp"
#include "kiln/model/config.hpp"

namespace kiln {

struct Phi3 : ArchDefaults {
  static constexpr std::string_view name = "phi3";
  static constexpr std::string_view hf_model_types[] = {"phi3"};
  static constexpr bool tied_embeddings = false;
  static constexpr bool fused_qkv = true;      ///< one q/k/v matrix in the file (model/weights.hpp)
  static constexpr bool fused_gate_up = true;  ///< one gate/up matrix in the file

  /// Hugging Face config.json (Phi3Config): the sliding window of every layer, when not null.
  template <class HF>
  static void adjust_hf_hparams(HParams& hp, const HF& c) {
    const auto w = c.template find<int64_t>("sliding_window");
    if (!w || !hp.sliding_layers.empty()) return;
    if (*w <= 0) fail<FormatError>("kiln: config.json file '", c.source, "': sliding_window ", *w, " must be positive");
    hp.sliding_window = std::size_t(*w);
    hp.sliding_layers.assign(hp.n_layers, true);
  }
};
static_assert(ArchConfig<Phi3>, "kiln::Phi3 must satisfy ArchConfig");

}  // namespace kiln
