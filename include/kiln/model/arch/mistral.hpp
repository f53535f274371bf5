// kiln/model/arch/mistral.hpp - Mistral (Mistral 7B v0.1-v0.3, Mistral Nemo, Ministral-style dense
// checkpoints): Llama's block, so the Llama Config (model/arch/llama.hpp) runs it; this file holds what
// differs in the files.
//   GGUF: llama.cpp's converter writes Mistral as general.architecture "llama" (q/k rows permuted as for
//   every Llama; {arch}.attention.key_length from an explicit head_dim). llama.cpp applies no sliding
//   window to it, and neither does kiln for GGUF files.
//   Hugging Face: model_type "mistral". head_dim may differ from hidden_size / heads (Nemo: 128 for 5120 /
//   32). sliding_window, when not null (Mistral 7B v0.1: 4096), makes every layer attend to the last
//   sliding_window positions, the query's own included (HF's create_sliding_window_causal_mask); null
//   (v0.2 and later): full causal attention.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/core/error.hpp"
#include "kiln/model/config.hpp"

namespace kiln {

/// config.json of model_type "mistral": a non-null sliding_window slides on every layer.
template <class HF>
void mistral_adjust_hf_hparams(HParams& hp, const HF& c) {
  const auto w = c.template find<int64_t>("sliding_window");
  if (!w || !hp.sliding_layers.empty()) return;  // null, or layer_types said which layers
  if (*w <= 0) fail<FormatError>("kiln: config.json file '", c.source, "': sliding_window ", *w, " must be positive");
  hp.sliding_window = std::size_t(*w);
  hp.sliding_layers.assign(hp.n_layers, true);
}

}  // namespace kiln
