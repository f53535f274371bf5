// kiln/model/arch/gemma3.hpp - the Gemma 3 architecture (text decoder: Gemma3ForCausalLM, the language
// model of Gemma3ForConditionalGeneration, and their GGUFs).
//
// Per layer (HF Gemma3DecoderLayer):
//   h = norm(x) ; q, k, v = h Wq^T, h Wk^T, h Wv^T ; q, k = rms_norm per head (q_norm, k_norm)
//   q, k = rope(q, k) (rotate_half pairs; sliding layers base 10000, global layers rope_theta = 1e6 and
//          the linear scaling, when there is one, for global layers only)
//   a = softmax(q k^T * query_pre_attn_scalar^-0.5, causal; sliding layers: the last sliding_window
//       positions, the query's own included) v
//   x = x + norm(a Wo^T)                      (post_attention_layernorm)
//   x = x + norm(down(gelu_tanh(gate(norm(x))) * up(norm(x))))   (pre_ and post_feedforward_layernorm)
//   x0 = embedding * sqrt(hidden_size) ; logits = norm(x) Wemb^T (tied) [final soft-cap, none in Gemma 3]
//   (no attention soft-cap: HF's Gemma3Attention ignores attn_logit_softcapping)
// head_dim (256) is not hidden_size / heads. Layer l is global when (l + 1) % 6 == 0 unless the file
// lists the layers (config.json layer_types, or sliding_window_pattern in older configs).
//
// Norm weights. Every Gemma RMSNorm multiplies by (1 + w). llama.cpp's convert_hf_to_gguf.py adds the 1
// when it writes the GGUF (checked on gemma-3-270m-q4_k_m.gguf: post_attention_norm holds values down to
// exactly 0.0 and output_norm up to 301, i.e. 1 + w), so the Config computes a plain w and kiln's HF
// loader adds the 1 in f32 when it reads a checkpoint (hf_norm_plus_one), as HF's (1.0 + w.float()) does.
//
// Where the two sources differ (kiln follows each file's own runtime):
//   * attention scale: HF uses query_pre_attn_scalar^-0.5; GGUF has no key for it and llama.cpp uses
//     1/sqrt(head_dim), or 1/sqrt(dim / heads) for the 62-layer 27B (equal to query_pre_attn_scalar in
//     every released Gemma 3).
//   * the sliding layers' RoPE base: HF rope_local_base_freq / rope_parameters.sliding_attention; GGUF
//     gemma3.rope.freq_base_swa (llama.cpp's converter writes it from rope_parameters), else 10000, llama.cpp's
//     default and what every released Gemma 3 uses.
//   * embedding scale: llama.cpp multiplies by sqrtf(dim); HF multiplies by sqrt(dim) cast to the
//     checkpoint's dtype (25.25 instead of 25.298 for a bf16 hidden size of 640): the HF loader sets
//     HParams::embed_scale accordingly.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/model/arch/gemma2.hpp"  // kGemmaHfTensorNames
#include "kiln/model/config.hpp"

namespace kiln {

struct Gemma3 : ArchDefaults {
  static constexpr std::string_view name = "gemma3";
  static constexpr std::string_view hf_model_types[] = {"gemma3_text", "gemma3"};
  static constexpr bool hf_norm_plus_one = true;
  static constexpr TensorNames hf_names = kGemmaHfTensorNames;  // model/arch/gemma2.hpp
  static constexpr Activation activation = Activation::gelu_tanh;
  static constexpr bool qk_norm = true;
  static constexpr bool post_attn_norm = true;
  static constexpr bool post_ffw_norm = true;
  static constexpr EmbedScale embed_scale = EmbedScale::sqrt_dim;
  static constexpr std::size_t sliding_window_pattern = 6;
  // attn_logit_softcapping is in Gemma3TextConfig but HF's Gemma3Attention never passes it to the
  // attention (and llama.cpp's converter asserts it is null): not applied. final_logit_softcapping is
  // applied by Gemma3ForCausalLM when set (null for every released Gemma 3).
  static constexpr bool final_softcap = true;

  /// GGUF: llama.cpp's constants for LLM_ARCH_GEMMA3 (src/llama-model.cpp).
  static void adjust_hparams(HParams& hp, const io::GGUFFile& f) {
    // rope_freq_base_train_swa: the file's key where the converter wrote one; sliding layers are never rope-scaled
    hp.rope_theta_swa = float(f.find<double>(std::string(name) + ".rope.freq_base_swa").value_or(10000.0));
    hp.attn_scale =
        hp.n_layers == 62 ? 1.0f / std::sqrt(float(hp.dim / hp.n_heads)) : 1.0f / std::sqrt(float(hp.head_dim));
  }

  /// Hugging Face config.json (Gemma3TextConfig; the older and the transformers 5 layouts).
  template <class HF>
  static void adjust_hf_hparams(HParams& hp, const HF& c) {
    hp.attn_scale = float(1.0 / std::sqrt(c.template find<double>("query_pre_attn_scalar").value_or(256.0)));
    // rope_parameters per layer type (transformers 5), else rope_theta / rope_scaling for the global
    // layers and rope_local_base_freq for the sliding ones.
    const auto global = c.rope_params("full_attention"), local = c.rope_params("sliding_attention", false);
    hp.rope_theta = float(global.theta ? *global.theta : c.template find<double>("rope_theta").value_or(1e6));
    hp.rope_theta_swa =
        float(local.theta ? *local.theta : c.template find<double>("rope_local_base_freq").value_or(10000.0));
    hp.rope_linear_factor = 1.0f;
    if (global.scaling && global.scaling->type != "default") {
      if (global.scaling->type != "linear")
        fail<FormatError>("kiln: config.json file '", c.source, "': Gemma 3 rope type '", global.scaling->type,
                          "' for global layers is not supported (supported: default, linear)");
      hp.rope_linear_factor = float(global.scaling->factor);
    }
    if (local.scaling && local.scaling->type != "default")
      fail<FormatError>("kiln: config.json file '", c.source, "': Gemma 3 sliding layers with rope type '",
                        local.scaling->type, "' are not supported (supported: default)");
    if (c.template find<bool>("use_bidirectional_attention").value_or(false))
      fail<FormatError>("kiln: config.json file '", c.source,
                        "': use_bidirectional_attention (an encoder) is not supported; kiln runs causal decoders");
    hp.sliding_window = std::size_t(c.template find<int64_t>("sliding_window").value_or(4096));
    if (hp.sliding_layers.empty()) {  // no layer_types: the older sliding_window_pattern (6 when absent)
      const auto pattern = c.template find<int64_t>("sliding_window_pattern").value_or(6);
      if (pattern < 1)
        fail<FormatError>("kiln: config.json file '", c.source, "': sliding_window_pattern ", pattern,
                          " must be positive");
      hp.sliding_layers.resize(hp.n_layers);
      for (std::size_t l = 0; l < hp.n_layers; ++l) hp.sliding_layers[l] = (l + 1) % std::size_t(pattern) != 0;
    }
    hp.final_softcap = float(c.template find<double>("final_logit_softcapping").value_or(0.0));
  }
};
static_assert(ArchConfig<Gemma3>, "kiln::Gemma3 must satisfy ArchConfig");

}  // namespace kiln
