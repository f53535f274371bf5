// kiln/model/arch/granite.hpp - the Granite architecture (IBM Granite 3.x dense models and their GGUFs).
//
// Llama's block with four multipliers from the file:
//   x0 = embedding * embedding_multiplier            (EmbedScale::multiplier: HParams::embed_scale)
//   a = softmax(q k^T * attention_multiplier) v      (HParams::attn_scale, instead of 1 / sqrt(head_dim))
//   x = x + o * residual_multiplier, after attention and after the MLP   (HParams::residual_scale)
//   logits = norm(x) Wout^T / logits_scaling          (HParams::logit_scale)
//   GGUF: general.architecture "granite"; {arch}.embedding_scale, {arch}.attention.scale,
//   {arch}.residual_scale, {arch}.logit_scale (llama.cpp's converter renames the multipliers so; an
//   absent attention.scale means 1 / sqrt(head_dim) there, as in llama.cpp). q/k rows are permuted as for
//   Llama (the converter's GraniteModel is a LlamaModel) and llama.cpp rotates adjacent pairs
//   (LLAMA_ROPE_TYPE_NORM): RopeStyle::gptj, as Llama.
//   Hugging Face: model_type "granite" (GraniteConfig: each multiplier 1.0 when absent, attention included,
//   as transformers' GraniteAttention uses config.attention_multiplier as its scale).
// The converter drops a config.json head_dim ("Ignoring head_dim") and llama.cpp uses hidden / heads; kiln
// reads the GGUF's key_length when present, as for every architecture.
#pragma once

#include <cmath>
#include <string_view>

#include "kiln/io/gguf.hpp"
#include "kiln/model/config.hpp"

namespace kiln {

struct Granite : ArchDefaults {
  static constexpr std::string_view name = "granite";
  static constexpr std::string_view hf_model_types[] = {"granite"};
  static constexpr RopeStyle rope_style = RopeStyle::gptj;
  static constexpr EmbedScale embed_scale = EmbedScale::multiplier;

  /// GGUF: llama.cpp's keys for LLM_ARCH_GRANITE (src/models/granite.cpp).
  static void adjust_hparams(HParams& hp, const io::GGUFFile& f) {
    const auto get = [&](const char* key) { return f.find<double>(hp.arch + "." + key); };
    hp.embed_scale = float(get("embedding_scale").value_or(1.0));
    hp.residual_scale = float(get("residual_scale").value_or(1.0));
    hp.logit_scale = float(get("logit_scale").value_or(1.0));
    if (const auto s = get("attention.scale"); s && *s != 0) hp.attn_scale = float(*s);
  }

  /// Hugging Face config.json (GraniteConfig).
  template <class HF>
  static void adjust_hf_hparams(HParams& hp, const HF& c) {
    const auto get = [&](const char* key) { return c.template find<double>(key).value_or(1.0); };
    hp.embed_scale = float(get("embedding_multiplier"));
    hp.residual_scale = float(get("residual_multiplier"));
    hp.logit_scale = float(get("logits_scaling"));
    hp.attn_scale = float(get("attention_multiplier"));
  }
};
static_assert(ArchConfig<Granite>, "kiln::Granite must satisfy ArchConfig");

}  // namespace kiln
