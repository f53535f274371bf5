// kiln/model/arch/gpt_oss.hpp - OpenAI's gpt-oss architecture (gpt-oss-20b, gpt-oss-120b).
//
// Llama's pre-norm block with q/k/v/o biases, a learned attention sink per query head (attn_sinks: a logit
// that joins each softmax's denominator and is then dropped, so a head may attend to nothing), a sliding
// window (128 in the released models) on even layers and full attention on odd ones, YaRN RoPE (neox
// pairs) on every layer, and every layer's MLP a mixture of experts (model/moe.hpp):
//   z = h Wr^T + br                      the router, with a bias
//   E = the k largest z, w = softmax of z over E only (the same as a softmax over all, renormalised)
//   m = sum over e in E of w_e * (swiglu_oai(h Wg_e^T + bg_e, h Wu_e^T + bu_e) Wd_e^T + bd_e)
//   swiglu_oai(g, u) = g' sigmoid(alpha g') (u' + 1), g' = min(g, limit), u' = clamp(u, -limit, limit)
// with alpha 1.702 and limit 7 (HParams::swiglu_alpha, swiglu_limit).
//   GGUF: general.architecture "gpt-oss"; {arch}.expert_count, expert_used_count,
//   expert_feed_forward_length, attention.sliding_window; blk.N.attn_sinks.weight (n_heads),
//   blk.N.post_attention_norm.weight (the norm before the MLP: llama.cpp's name for HF's
//   post_attention_layernorm), blk.N.ffn_gate_inp.{weight,bias}, the stacked blk.N.ffn_{gate,up,down}_exps.weight
//   (F32, BF16, or MXFP4 as the released GGUFs) and their biases blk.N.ffn_{gate,up,down}_exps.bias
//   (n_expert, rows). llama.cpp fixes alpha and limit (no key), computes the sliding layers with the same
//   YaRN table as the others, and reads no expert_weights_norm: the chosen weights always sum to 1.
//   Hugging Face: model_type "gpt_oss"; num_local_experts, num_experts_per_tok, intermediate_size (each
//   expert's), swiglu_alpha, swiglu_limit, layer_types, sliding_window; model.layers.N.self_attn.sinks,
//   mlp.router.{weight,bias}, and the experts fused into 3-D parameters as transformers holds them:
//   mlp.experts.gate_up_proj (n_expert, hidden, 2 ffn: x @ W, gate and up interleaved in its columns: gate
//   the even ones, up the odd ones), gate_up_proj_bias (n_expert, 2 ffn), down_proj (n_expert, ffn, hidden)
//   and down_proj_bias (n_expert, hidden); kiln transposes them into owned (rows, hidden) f32 matrices at
//   load. The released safetensors store the experts as MXFP4 blocks (gate_up_proj_blocks / _scales):
//   refused, naming the tensor (convert them with llama.cpp's convert_hf_to_gguf.py, which keeps MXFP4).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/core/error.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/model/config.hpp"

namespace kiln {

struct GptOss : ArchDefaults {
  static constexpr std::string_view name = "gpt-oss";
  static constexpr std::string_view hf_model_types[] = {"gpt_oss"};
  static constexpr bool qkv_bias = true, o_bias = true;
  static constexpr bool tied_embeddings = false;
  static constexpr std::size_t sliding_window_pattern = 2;  // layers 0, 2, 4, ... slide
  static constexpr bool attn_sinks = true;                  // blk.N.attn_sinks.weight / self_attn.sinks
  /// GGUF: the norm before the MLP is blk.N.post_attention_norm.weight (llama.cpp's name for HF's
  /// post_attention_layernorm).
  static constexpr TensorNames gguf_names = [] {
    TensorNames n = kGgufTensorNames;
    n.ffn_norm = "post_attention_norm";
    return n;
  }();
  /// Hugging Face: the router is mlp.router (weight and bias); the experts are fused (hf_experts).
  static constexpr TensorNames hf_names = [] {
    TensorNames n = kHfTensorNames;
    n.router = "mlp.router";
    n.experts = "mlp.experts.";
    return n;
  }();
  /// The experts' biases and the router's (GGUF ffn_*_exps.bias, ffn_gate_inp.bias).
  static constexpr bool expert_bias = true;

  /// GGUF: llama.cpp's LLM_ARCH_OPENAI_MOE (build_moe_ffn with SOFTMAX_WEIGHT gating and SWIGLU_OAI_MOE).
  static void adjust_hparams(HParams& hp, const io::GGUFFile& f) {
    const std::string a = std::string(name) + ".";
    if (!hp.n_expert)
      fail<FormatError>("kiln: GGUF file '", f.name(), "': a gpt-oss model needs experts (", a, "expert_count)");
    if (hp.expert_gating != ExpertGating::softmax)
      fail<FormatError>("kiln: GGUF file '", f.name(), "': ", a, "expert_gating_func must be softmax (1) for gpt-oss");
    hp.expert_weights_norm = true;
    hp.swiglu_alpha = 1.702f;
    hp.swiglu_limit = 7.0f;
    // llama.cpp runs the sliding layers with the global layers' (YaRN-scaled) table, or with the file's own base
    // for them, which would need a second scaled table: refused.
    if (const auto swa = f.find<double>(a + "rope.freq_base_swa"); swa && float(*swa) != hp.rope_theta)
      fail<FormatError>("kiln: GGUF file '", f.name(), "': ", a, "rope.freq_base_swa = ", *swa, " differs from ", a,
                        "rope.freq_base = ", hp.rope_theta, ": not supported for gpt-oss");
  }

  /// Hugging Face: layer p's router and experts, which transformers holds fused into 3-D parameters (x @ W; see
  /// the top of this file): transposed into owned (rows, hidden) f32 matrices. R: the loader's
  /// detail::HFWeightReader, L: LayerWeights.
  template <class R, class L>
  static void hf_experts(R& r, L& layer, const HParams& hp, const std::string& p) {
    const std::size_t d = hp.dim, ff = hp.ffn_dim;
    const std::string m = p + std::string(hf_names.experts);
    for (const char* q : {"gate_up_proj_blocks", "down_proj_blocks"})
      if (r.find(m + q))
        r.error("tensor '", m, q,
                "': MXFP4 expert blocks in safetensors are not supported; convert the checkpoint with llama.cpp's "
                "convert_hf_to_gguf.py (which keeps them MXFP4) and load the GGUF");
    const std::string router = p + std::string(hf_names.router);
    layer.ffn_gate_inp = r.matrix(router + ".weight", hp.n_expert, d);
    layer.ffn_gate_inp_b = r.vector(router + ".bias", hp.n_expert);
    layer.exp_gate = r.transposed_slices(m + "gate_up_proj", hp.n_expert, d, 2 * ff, 2, 0);
    layer.exp_up = r.transposed_slices(m + "gate_up_proj", hp.n_expert, d, 2 * ff, 2, 1);
    layer.exp_down = r.transposed_slices(m + "down_proj", hp.n_expert, ff, d, 1, 0);
    layer.exp_gate_b = r.strided_rows(m + "gate_up_proj_bias", hp.n_expert, 2 * ff, 2, 0);
    layer.exp_up_b = r.strided_rows(m + "gate_up_proj_bias", hp.n_expert, 2 * ff, 2, 1);
    layer.exp_down_b = r.strided_rows(m + "down_proj_bias", hp.n_expert, d, 1, 0);
  }
  /// Hugging Face config.json (GptOssConfig).
  template <class HF>
  static void adjust_hf_hparams(HParams& hp, const HF& c) {
    if (!hp.n_expert)
      fail<FormatError>("kiln: config.json file '", c.source, "': a gpt_oss model needs num_local_experts");
    hp.expert_weights_norm = true;
    hp.swiglu_alpha = float(c.template find<double>("swiglu_alpha").value_or(1.702));
    hp.swiglu_limit = float(c.template find<double>("swiglu_limit").value_or(7.0));
    if (!(hp.swiglu_alpha > 0) || !(hp.swiglu_limit > 0))
      fail<FormatError>("kiln: config.json file '", c.source, "': swiglu_alpha = ", hp.swiglu_alpha,
                        " and swiglu_limit = ", hp.swiglu_limit, " must be positive");
    // without layer_types (older configs): even layers slide (sliding_window_pattern), by sliding_window
    if (hp.sliding_layers.empty())
      if (const auto w = c.template find<int64_t>("sliding_window"))
        hp.sliding_window = std::size_t(std::max<int64_t>(*w, 0));
  }
};
static_assert(ArchConfig<GptOss>, "kiln::GptOss must satisfy ArchConfig");

}  // namespace kiln
