// kiln/model/arch/gemma2.hpp - the Gemma 2 architecture (Gemma2ForCausalLM and its GGUFs).
//
// Gemma 3's block (model/arch/gemma3.hpp) without the q/k norms, with both soft-caps and one RoPE base:
//   h = norm(x) ; q, k, v = h Wq^T, h Wk^T, h Wv^T ; q, k = rope(q, k) (rotate_half pairs, rope_theta)
//   a = softmax(attn_softcap * tanh(q k^T * scale / attn_softcap), causal; sliding layers: the last
//       sliding_window positions, the query's own included) v
//   x = x + norm(a Wo^T)                                        (post_attention_layernorm)
//   x = x + norm(down(gelu_tanh(gate(norm(x))) * up(norm(x))))  (pre_ and post_feedforward_layernorm)
//   x0 = embedding * sqrt(hidden_size) ; logits = final_softcap * tanh(norm(x) Wemb^T / final_softcap)
// Even layers (0, 2, ...) slide, odd ones attend globally (HF layer_types; llama.cpp's swa pattern 2).
// Every RMSNorm multiplies by (1 + w): llama.cpp's converter adds the 1 (Gemma2Model.modify_tensors),
// kiln's HF loader too (hf_norm_plus_one).
//   GGUF: general.architecture "gemma2"; {arch}.attn_logit_softcapping, {arch}.final_logit_softcapping,
//   {arch}.attention.sliding_window (4096 when absent, as llama.cpp), {arch}.attention.key_length. The
//   converter writes no rope.freq_base (10000, llama.cpp's default). Attention scale: llama.cpp uses
//   1 / sqrt(head_dim), or 1 / sqrt(dim / heads) for the 46-layer 27B (GGUF has no query_pre_attn_scalar;
//   these equal it in every released Gemma 2).
//   Hugging Face: model_type "gemma2"; query_pre_attn_scalar^-0.5 (256 when absent), sliding_window 4096,
//   attn_logit_softcapping 50 and final_logit_softcapping 30 when absent (Gemma2Config's defaults), null:
//   none. HF's eager attention applies the attention soft-cap; its sdpa and flash paths do not (kiln
//   follows eager, what Gemma 2 was trained with).
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "kiln/core/error.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/model/config.hpp"

namespace kiln {

/// Hugging Face names of Gemma 2 and Gemma 3: post_attention_layernorm is the norm of the attention output,
/// pre_feedforward_layernorm the one before the MLP (llama.cpp's converter maps them so too).
inline constexpr TensorNames kGemmaHfTensorNames = [] {
  TensorNames n = kHfTensorNames;
  n.post_attn_norm = "post_attention_layernorm";
  n.ffn_norm = "pre_feedforward_layernorm";
  return n;
}();

struct Gemma2 : ArchDefaults {
  static constexpr std::string_view name = "gemma2";
  static constexpr std::string_view hf_model_types[] = {"gemma2"};
  static constexpr bool hf_norm_plus_one = true;
  static constexpr TensorNames hf_names = kGemmaHfTensorNames;
  static constexpr Activation activation = Activation::gelu_tanh;
  static constexpr bool post_attn_norm = true;
  static constexpr bool post_ffw_norm = true;
  static constexpr EmbedScale embed_scale = EmbedScale::sqrt_dim;
  static constexpr std::size_t sliding_window_pattern = 2;
  static constexpr bool attn_softcap = true;
  static constexpr bool final_softcap = true;

  /// GGUF: llama.cpp's LLM_ARCH_GEMMA2 (src/models/gemma2.cpp).
  static void adjust_hparams(HParams& hp, const io::GGUFFile& f) {
    if (!f.contains(hp.arch + ".attention.sliding_window")) hp.sliding_window = 4096;
    if (!f.contains(hp.arch + ".attn_logit_softcapping")) hp.attn_softcap = 50.0f;
    if (!f.contains(hp.arch + ".final_logit_softcapping")) hp.final_softcap = 30.0f;
    // llama.cpp runs the sliding layers at <arch>.rope.freq_base_swa where the file has it (default: the global
    // base), scaled as the global layers are; kiln's separate sliding-layer table is unscaled, so a different
    // base together with RoPE scaling is refused rather than run differently.
    if (const auto swa = f.find<double>(hp.arch + ".rope.freq_base_swa"); swa && float(*swa) != hp.rope_theta) {
      if (hp.rope_linear_factor != 1.0f || !hp.rope_freq_factors.empty() || hp.rope_mscale != 1.0f)
        fail<FormatError>("kiln: GGUF file '", f.name(), "': ", hp.arch, ".rope.freq_base_swa = ", *swa,
                          " differs from ", hp.arch, ".rope.freq_base = ", hp.rope_theta,
                          " together with RoPE scaling: not supported for Gemma 2");
      hp.rope_theta_swa = float(*swa);
    }
    hp.attn_scale =
        hp.n_layers == 46 ? 1.0f / std::sqrt(float(hp.dim / hp.n_heads)) : 1.0f / std::sqrt(float(hp.head_dim));
  }

  /// Hugging Face config.json (Gemma2Config).
  template <class HF>
  static void adjust_hf_hparams(HParams& hp, const HF& c) {
    hp.attn_scale = float(1.0 / std::sqrt(c.template find<double>("query_pre_attn_scalar").value_or(256.0)));
    // Absent: Gemma2Config's defaults; null: none (find() reads null as absent, so ask for the key itself).
    const auto cap = [&](const char* key, double dflt) {
      const auto* j = c.find_json(key);
      return !j ? float(dflt) : j->is_null() ? 0.0f : float(*c.template find<double>(key));
    };
    hp.attn_softcap = cap("attn_logit_softcapping", 50.0);
    hp.final_softcap = cap("final_logit_softcapping", 30.0);
    hp.sliding_window = std::size_t(c.template find<int64_t>("sliding_window").value_or(4096));
    if (hp.sliding_layers.empty()) {  // no layer_types: Gemma2Config's even-layers pattern
      hp.sliding_layers.resize(hp.n_layers);
      for (std::size_t l = 0; l < hp.n_layers; ++l) hp.sliding_layers[l] = (l + 1) % 2 != 0;
    }
    if (!(hp.attn_softcap >= 0) || !(hp.final_softcap >= 0))
      fail<FormatError>("kiln: config.json file '", c.source, "': soft-caps ", hp.attn_softcap, " and ",
                        hp.final_softcap, " must not be negative");
  }
};
static_assert(ArchConfig<Gemma2>, "kiln::Gemma2 must satisfy ArchConfig");

}  // namespace kiln
