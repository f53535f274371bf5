// kiln/model/config.hpp - what makes one decoder-only Transformer architecture differ from another.
//
// Two halves:
//   * compile-time traits (a Config struct): the shape of the computation. A new architecture is a
//     struct deriving from ArchDefaults and overriding what differs (model/arch/llama.hpp is one);
//     Transformer<Config> compiles only the branches its traits select.
//   * run-time hyper-parameters (HParams): sizes and constants read from the model file.
//
// Traits and the block they shape (x: the residual stream; [..] only when the trait says so):
//   h = norm(x) ; q, k, v = h Wq^T [+bq], h Wk^T [+bk], h Wv^T [+bv] ;
//   [q, k = rms_norm per head (qk_norm), or of the whole q and k (qk_norm_whole)]
//   q, k = rope(q, k) (rope_style) ; a = softmax(q k^T * attn_scale [softcap], causal [sliding window]) v
//   o = a Wo^T [+bo] ; [o = norm(o) (post_attn_norm)] ; x = x + o [* residual_scale]
//   h = norm(x) ; m = (act(h Wg^T [+bg]) * (h Wu^T [+bu])) Wd^T [+bd] ; [m = norm(m) (post_ffw_norm)] ;
//   x = x + m [* residual_scale]
//   logits = norm(x) Wout^T [/ logit_scale] [final softcap], Wout = the token embedding when the file has no
//   output weight (tied) ; x0 = embedding [* sqrt(dim) or the file's multiplier (embed_scale)].
// GPT-2-style traits: rope = false skips the rotation; gated_mlp = false makes m = act(h Wu^T [+bu]) Wd^T [+bd];
// learned_positions adds row pos of a learned position table to x0.
// (residual_scale, logit_scale: HParams, 1 unless the file says otherwise: Granite.)
// norm = RMSNorm or LayerNorm (norm_kind) with weight w or (1 + w) (norm_weight).
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/ops/activation.hpp"
#include "kiln/ops/norm.hpp"
#include "kiln/ops/rope.hpp"

namespace kiln {

enum class NormKind { rms, layer };
enum class EmbedScale { none, sqrt_dim, multiplier };  // multiplier: HParams::embed_scale (Granite)
/// How a mixture of experts' router turns its logits into the experts' weights (model/moe.hpp): a softmax
/// over all experts, or each expert's own sigmoid (GGUF expert_gating_func 1 and 2).
enum class ExpertGating { softmax, sigmoid };

/// The names of a model's tensors in one file format, by role: data an architecture overrides in its own file
/// (ArchDefaults::gguf_names, hf_names). The loaders append ".weight" to a matrix or norm and ".bias" to a bias
/// (wq "attn_q": attn_q.weight and attn_q.bias) except for the roles marked "whole name". Layer roles follow the
/// layer's prefix (GGUF "blk.N.", Hugging Face "<decoder>layers.N."); an empty name: the format has no such
/// tensor. Errors name the tensor as the file does.
struct TensorNames {
  // The model (Hugging Face: under the decoder's prefix, except `output`).
  std::string_view tok_embd, output_norm, output, pos_embd;
  // Each layer's attention: its norm, q, k, v (or one fused qkv matrix: Config::fused_qkv), o, the q and k norms,
  // the norm of its output (post_attn_norm), the sinks (a whole name).
  std::string_view attn_norm, wq, wk, wv, wqkv, wo, q_norm, k_norm, post_attn_norm, attn_sinks;
  // Each layer's MLP: the norm before it, after it, gate, up, down, or gate and up fused (Config::fused_gate_up).
  std::string_view ffn_norm, post_ffw_norm, w_gate, w_up, w_down, w_gate_up;
  // Mixture of experts (model/moe.hpp): the router, each expert's gate, up and down (GGUF: the stacked
  // (n_expert, rows, cols) tensors; Hugging Face: expert E's under `experts` + "E."), the router's correction
  // bias (a whole name), the shared expert's gate weight, gate, up and down.
  std::string_view router, experts, exp_gate, exp_up, exp_down, exp_probs_b;
  std::string_view shexp_gate_inp, shexp_gate, shexp_up, shexp_down;
};

/// llama.cpp's tensor names (src/llama-arch.cpp), the GGUF defaults.
inline constexpr TensorNames kGgufTensorNames{.tok_embd = "token_embd",
                                              .output_norm = "output_norm",
                                              .output = "output",
                                              .pos_embd = "position_embd",
                                              .attn_norm = "attn_norm",
                                              .wq = "attn_q",
                                              .wk = "attn_k",
                                              .wv = "attn_v",
                                              .wqkv = "attn_qkv",
                                              .wo = "attn_output",
                                              .q_norm = "attn_q_norm",
                                              .k_norm = "attn_k_norm",
                                              .post_attn_norm = "post_attention_norm",
                                              .attn_sinks = "attn_sinks.weight",
                                              .ffn_norm = "ffn_norm",
                                              .post_ffw_norm = "post_ffw_norm",
                                              .w_gate = "ffn_gate",
                                              .w_up = "ffn_up",
                                              .w_down = "ffn_down",
                                              .w_gate_up = "ffn_up",  // llama.cpp's fused SwiGLU: gate rows first
                                              .router = "ffn_gate_inp",
                                              .experts = "",
                                              .exp_gate = "ffn_gate_exps",
                                              .exp_up = "ffn_up_exps",
                                              .exp_down = "ffn_down_exps",
                                              .exp_probs_b = "exp_probs_b.bias",
                                              .shexp_gate_inp = "ffn_gate_inp_shexp",
                                              .shexp_gate = "ffn_gate_shexp",
                                              .shexp_up = "ffn_up_shexp",
                                              .shexp_down = "ffn_down_shexp"};

/// transformers' names (LlamaForCausalLM, Qwen2MoeForCausalLM, ...), the Hugging Face defaults.
inline constexpr TensorNames kHfTensorNames{.tok_embd = "embed_tokens",
                                            .output_norm = "norm",
                                            .output = "lm_head",
                                            .pos_embd = "",
                                            .attn_norm = "input_layernorm",
                                            .wq = "self_attn.q_proj",
                                            .wk = "self_attn.k_proj",
                                            .wv = "self_attn.v_proj",
                                            .wqkv = "self_attn.qkv_proj",
                                            .wo = "self_attn.o_proj",
                                            .q_norm = "self_attn.q_norm",
                                            .k_norm = "self_attn.k_norm",
                                            .post_attn_norm = "",
                                            .attn_sinks = "self_attn.sinks",
                                            .ffn_norm = "post_attention_layernorm",
                                            .post_ffw_norm = "post_feedforward_layernorm",
                                            .w_gate = "mlp.gate_proj",
                                            .w_up = "mlp.up_proj",
                                            .w_down = "mlp.down_proj",
                                            .w_gate_up = "mlp.gate_up_proj",
                                            .router = "mlp.gate",
                                            .experts = "mlp.experts.",
                                            .exp_gate = "gate_proj",
                                            .exp_up = "up_proj",
                                            .exp_down = "down_proj",
                                            .exp_probs_b = "mlp.e_score_correction_bias",
                                            .shexp_gate_inp = "mlp.shared_expert_gate",
                                            .shexp_gate = "mlp.shared_expert.gate_proj",
                                            .shexp_up = "mlp.shared_expert.up_proj",
                                            .shexp_down = "mlp.shared_expert.down_proj"};

/// The defaults: a plain pre-norm Llama-style block. Architectures derive from this.
struct ArchDefaults {
  /// Tensor names per role in GGUF files and Hugging Face checkpoints. An architecture whose files name a role
  /// otherwise overrides the table: `static constexpr TensorNames hf_names = [] { auto n = kHfTensorNames;
  /// n.ffn_norm = "pre_feedforward_layernorm"; return n; }();` (model/arch/gemma2.hpp).
  static constexpr TensorNames gguf_names = kGgufTensorNames;
  static constexpr TensorNames hf_names = kHfTensorNames;
  static constexpr NormKind norm_kind = NormKind::rms;
  static constexpr NormWeight norm_weight = NormWeight::plain;
  static constexpr Activation activation = Activation::silu;  ///< of the gate, multiplied by up
  static constexpr RopeStyle rope_style = RopeStyle::neox;
  static constexpr bool qkv_bias = false;
  static constexpr bool o_bias = false;
  static constexpr bool mlp_bias = false;
  static constexpr bool qk_norm = false;  ///< RMSNorm of each q and k head before RoPE (Qwen3, Gemma 3)
  /// With qk_norm: one RMSNorm over each token's whole q (q_dim weights) and whole k (kv_dim) instead of each
  /// head (OLMoE).
  static constexpr bool qk_norm_whole = false;
  static constexpr bool post_attn_norm = false;  ///< norm of the attention output before the residual add (Gemma)
  static constexpr bool post_ffw_norm = false;   ///< norm of the MLP output before the residual add (Gemma)
  static constexpr EmbedScale embed_scale = EmbedScale::none;
  static constexpr bool tied_embeddings = true;  ///< no output weight in the file: use the token embedding
  /// 0: every layer attends globally. n > 0: layer l uses the file's sliding window unless
  /// (l + 1) % n == 0 (Gemma 3: 6, five local layers then one global). HParams::sliding_layers, when
  /// the file lists the layers (config.json layer_types), overrides it.
  static constexpr std::size_t sliding_window_pattern = 0;
  static constexpr bool attn_softcap = false;   ///< read {arch}.attn_logit_softcapping (Gemma 2)
  static constexpr bool final_softcap = false;  ///< read {arch}.final_logit_softcapping (Gemma 2)
  // GPT-2-style blocks (examples/custom_arch.cpp; from GGUF files):
  static constexpr bool rope = true;       ///< false: q and k are not rotated (positions come from learned_positions)
  static constexpr bool gated_mlp = true;  ///< false: m = act(h Wu^T [+bu]) Wd^T [+bd], no gate (GGUF: no ffn_gate)
  static constexpr bool learned_positions = false;  ///< x0 += position_embd[pos] (GGUF position_embd.weight)
};

namespace detail {
/// The traits a Config may leave out (one not deriving from ArchDefaults): their ArchDefaults values.
template <class C>
constexpr bool uses_rope() {
  if constexpr (requires { C::rope; }) return C::rope;
  else return true;
}
template <class C>
constexpr bool gated_mlp() {
  if constexpr (requires { C::gated_mlp; }) return C::gated_mlp;
  else return true;
}
template <class C>
constexpr bool qk_norm_whole() {
  if constexpr (requires { C::qk_norm_whole; }) return C::qk_norm_whole;
  else return false;
}
template <class C>
constexpr bool learned_positions() {
  if constexpr (requires { C::learned_positions; }) return C::learned_positions;
  else return false;
}
/// attn_sinks: a learned logit per query head (LayerWeights::attn_sinks) joins each softmax's denominator
/// (gpt-oss).
template <class C>
constexpr bool attn_sinks() {
  if constexpr (requires { C::attn_sinks; }) return C::attn_sinks;
  else return false;
}
/// expert_bias: the router and each expert's gate, up and down have biases (gpt-oss).
template <class C>
constexpr bool expert_bias() {
  if constexpr (requires { C::expert_bias; }) return C::expert_bias;
  else return false;
}
/// The Config's tensor names (ArchDefaults' tables for one that has none).
template <class C>
constexpr const TensorNames& gguf_names() {
  if constexpr (requires { C::gguf_names; }) return C::gguf_names;
  else return kGgufTensorNames;
}
template <class C>
constexpr const TensorNames& hf_names() {
  if constexpr (requires { C::hf_names; }) return C::hf_names;
  else return kHfTensorNames;
}
}  // namespace detail

/// A Config is a struct of the traits above plus `name`, its GGUF general.architecture string.
/// Optional members (model/weights.hpp, model/hf_model.hpp):
///   hf_model_types            string_views of the config.json model_type values it loads
///   hf_norm_plus_one          true: HF checkpoints store norm weights w for a (1 + w) the Config computes
///                             as a plain w (Gemma: llama.cpp's converter adds the 1; kiln's HF loader too)
///   gguf_names, hf_names      TensorNames: the files' tensor names per role (ArchDefaults: llama.cpp's, transformers')
///   hf_experts(r, L, hp, p)   loads layer prefix p's router and experts from a Hugging Face checkpoint that
///                             stores them otherwise than one tensor per expert (gpt-oss)
///   adjust_hparams(hp, gguf)  fixes up HParams read from GGUF metadata
///   adjust_hf_hparams(hp, c)  fixes up HParams read from config.json (a template on the config type)
///   mlp(const MlpArgs&)       a static function that computes each layer's dense MLP instead of the traits'
///                             (model/block.hpp's MlpArgs: input, output, scratch, weights); an MLP the
///                             traits cannot express, from public pieces (linear, add_bias, activations, norms)
///   block(const BlockArgs&)   a static function that computes each whole layer instead of default_block<C>
///                             (model/block.hpp: norm, attention, MLP and residual pieces over the pass's views)
class BlockArgs;  // model/block.hpp

namespace detail {
/// The Config has a block hook (static void block(const BlockArgs&)).
template <class C>
constexpr bool has_block() {
  return requires(const BlockArgs& b) { C::block(b); };
}
}  // namespace detail

template <class C>
concept ArchConfig = requires {
  { C::name } -> std::convertible_to<std::string_view>;
  { C::norm_kind } -> std::convertible_to<NormKind>;
  { C::norm_weight } -> std::convertible_to<NormWeight>;
  { C::activation } -> std::convertible_to<Activation>;
  { C::rope_style } -> std::convertible_to<RopeStyle>;
  { C::qkv_bias } -> std::convertible_to<bool>;
  { C::o_bias } -> std::convertible_to<bool>;
  { C::mlp_bias } -> std::convertible_to<bool>;
  { C::qk_norm } -> std::convertible_to<bool>;
  { C::post_attn_norm } -> std::convertible_to<bool>;
  { C::post_ffw_norm } -> std::convertible_to<bool>;
  { C::embed_scale } -> std::convertible_to<EmbedScale>;
  { C::tied_embeddings } -> std::convertible_to<bool>;
  { C::sliding_window_pattern } -> std::convertible_to<std::size_t>;
  { C::attn_softcap } -> std::convertible_to<bool>;
  { C::final_softcap } -> std::convertible_to<bool>;
};

/// The largest trained context length a model file may state (GGUF {arch}.context_length, config.json
/// max_position_embeddings): 2^32 positions, far beyond any real model; more is a corrupt file.
inline constexpr std::size_t kMaxContextLength = std::size_t(1) << 32;

/// Sizes and constants of one model, from its file.
struct HParams {
  std::string arch;     ///< general.architecture
  std::size_t dim = 0;  ///< d_model (embedding_length)
  std::size_t n_layers = 0;
  std::size_t n_heads = 0;
  std::size_t n_kv_heads = 0;  ///< < n_heads: grouped-query attention (n_heads / n_kv_heads queries per KV head)
  std::size_t head_dim = 0;
  std::size_t ffn_dim = 0;  ///< the MLP's hidden size; with experts, each expert's
  std::size_t vocab = 0;
  /// Mixture of experts (model/moe.hpp): n_expert > 0 makes every layer's MLP n_expert experts of which
  /// each token uses n_expert_used (GGUF {arch}.expert_count / expert_used_count), their weights
  /// renormalised to sum 1 when expert_weights_norm.
  std::size_t n_expert = 0, n_expert_used = 0;
  bool expert_weights_norm = false;
  ExpertGating expert_gating = ExpertGating::softmax;
  /// > 0: each MoE layer also has a shared expert of this hidden size that every token uses, its output
  /// scaled by sigmoid(h_t . w) (Qwen2-MoE's shared_expert and shared_expert_gate; model/moe.hpp).
  std::size_t shexp_ffn_dim = 0;
  /// > 0: the experts' activation is OpenAI's clamped SwiGLU (gpt-oss, model/moe.hpp): g' = min(g, limit),
  /// u' = clamp(u, -limit, limit), g' sigmoid(swiglu_alpha g') (u' + 1). 0: the Config's activation.
  float swiglu_limit = 0.0f;
  float swiglu_alpha = 1.702f;
  std::size_t ctx_train = 0;  ///< the context length the model was trained with
  std::size_t rope_dim = 0;   ///< rotated elements of each head (== head_dim unless partial rotary)
  float rope_theta = 10000.0f;
  float rope_linear_factor = 1.0f;
  /// Divisors of each RoPE inverse frequency (rope_dim / 2 values; empty: none), as llama.cpp's tensor
  /// rope_freqs.weight holds them: Llama 3.x's "llama3" scaling (config.json rope_scaling, which the HF
  /// loader turns into these factors as llama.cpp's converter does), and YaRN's blend of interpolated and
  /// extrapolated frequencies (rope_yarn_factors). The global layers' table only.
  std::vector<float> rope_freq_factors;
  /// LongRoPE (Phi-3 / Phi-3.5 128k, Phi-4-mini): the divisors for long contexts (rope_dim / 2 values, HF
  /// long_factor, GGUF rope_factors_long.weight; empty: none). A context of more than rope_orig_ctx
  /// positions uses them in place of rope_freq_factors, which then hold the short set (short_factor,
  /// rope_factors_short.weight): llama.cpp's rule, by the context size (RopeTableOptions).
  std::vector<float> rope_long_factors;
  std::size_t rope_orig_ctx = 0;  ///< LongRoPE's switch point (original_max_position_embeddings)
  /// Multiplies RoPE's cos and sin (YaRN's attention factor, 0.1 ln(factor) + 1 by default; LongRoPE's,
  /// rope_longrope_attention_factor; 1: none).
  float rope_mscale = 1.0f;
  float norm_eps = 1e-5f;
  float attn_scale = 0.0f;     ///< multiplies q k^T; 1 / sqrt(head_dim) unless the architecture says otherwise
  float attn_softcap = 0.0f;   ///< 0: none
  float final_softcap = 0.0f;  ///< 0: none
  std::size_t sliding_window = 0;
  /// Which layers use the sliding window (n_layers entries). Empty: the Config's sliding_window_pattern.
  std::vector<bool> sliding_layers;
  /// RoPE base of the sliding-window layers, which never use rope_linear_factor (Gemma 3: 10000 while
  /// global layers use rope_theta = 1e6 and the linear scaling). 0: the global layers' table.
  float rope_theta_swa = 0.0f;
  /// RoPE pairing of this file's q/k weights; unset: the Config's rope_style (its GGUF convention).
  /// It depends on the source: llama.cpp permutes q/k rows of LLM_ARCH_LLAMA GGUFs (gptj pairs), while
  /// Hugging Face checkpoints of every architecture use rotate_half (neox pairs).
  std::optional<RopeStyle> rope_style;
  /// Multiplies the embeddings when the Config's embed_scale is sqrt_dim; 0: sqrt(dim) in f32 (llama.cpp).
  /// Hugging Face Gemma rounds sqrt(dim) to the checkpoint's dtype first (a bf16 checkpoint: bf16).
  /// EmbedScale::multiplier: the file's multiplier (Granite's embedding_multiplier), 0 read as 1.
  float embed_scale = 0.0f;
  /// Multiplies each block's attention and MLP output before the residual add (Granite's residual_multiplier).
  float residual_scale = 1.0f;
  /// Divides the logits (Granite's logits_scaling).
  float logit_scale = 1.0f;

  std::size_t q_dim() const { return n_heads * head_dim; }
  std::size_t kv_dim() const { return n_kv_heads * head_dim; }

  /// Throws FormatError unless the sizes are consistent.
  void validate(std::string_view file) const {
    auto bad = [&](auto... why) { fail<FormatError>("kiln: model '", file, "' (", arch, "): ", why...); };
    if (!dim || !n_layers || !n_heads || !n_kv_heads || !head_dim || !ffn_dim || !vocab)
      bad("a size is zero: dim ", dim, ", n_layers ", n_layers, ", n_heads ", n_heads, ", n_kv_heads ", n_kv_heads,
          ", head_dim ", head_dim, ", ffn_dim ", ffn_dim, ", vocab ", vocab);
    if (n_heads % n_kv_heads != 0) bad("n_heads ", n_heads, " is not a multiple of n_kv_heads ", n_kv_heads);
    if (rope_dim == 0 || rope_dim > head_dim || rope_dim % 2 != 0)
      bad("rope dimension ", rope_dim, " must be even and within head_dim ", head_dim);
    if (!(rope_theta > 0) || !(rope_linear_factor > 0) || !(norm_eps >= 0) || !(attn_scale > 0) ||
        !std::isfinite(rope_theta) || !(rope_theta_swa >= 0) || !std::isfinite(rope_theta_swa) || !(embed_scale >= 0) ||
        !std::isfinite(embed_scale))
      bad("rope theta ", rope_theta, " (sliding layers ", rope_theta_swa, "), rope scaling ", rope_linear_factor,
          ", norm epsilon ", norm_eps, ", attention scale ", attn_scale, " or embedding scale ", embed_scale,
          " out of range");
    if (!rope_freq_factors.empty() && rope_freq_factors.size() != rope_dim / 2)
      bad(rope_freq_factors.size(), " RoPE frequency factors for a rotary dimension of ", rope_dim, " (need ",
          rope_dim / 2, ")");
    for (const float f : rope_freq_factors)
      if (!(f > 0) || !std::isfinite(f)) bad("RoPE frequency factor ", f, " must be positive and finite");
    if (!rope_long_factors.empty() &&
        (rope_long_factors.size() != rope_dim / 2 || rope_freq_factors.empty() || rope_orig_ctx == 0))
      bad(rope_long_factors.size(), " LongRoPE long factors for a rotary dimension of ", rope_dim, " (need ",
          rope_dim / 2, ", with ", rope_freq_factors.size(), " short ones and an original context ", rope_orig_ctx,
          " > 0)");
    for (const float f : rope_long_factors)
      if (!(f > 0) || !std::isfinite(f)) bad("LongRoPE long factor ", f, " must be positive and finite");
    if (!(residual_scale > 0) || !std::isfinite(residual_scale) || !(logit_scale > 0) || !std::isfinite(logit_scale))
      bad("residual scale ", residual_scale, " or logit scale ", logit_scale, " out of range");
    if (!(rope_mscale > 0) || !std::isfinite(rope_mscale)) bad("RoPE attention factor ", rope_mscale, " out of range");
    if (n_expert && (n_expert_used == 0 || n_expert_used > n_expert))
      bad(n_expert_used, " experts per token, which must be within 1 and the ", n_expert, " experts");
    if (shexp_ffn_dim && !n_expert) bad("a shared expert (hidden size ", shexp_ffn_dim, ") without experts");
    if (swiglu_limit != 0 &&
        (!(swiglu_limit > 0) || !(swiglu_alpha > 0) || !std::isfinite(swiglu_limit) || !std::isfinite(swiglu_alpha)))
      bad("SwiGLU limit ", swiglu_limit, " or alpha ", swiglu_alpha, " out of range");
    if (!sliding_layers.empty() && sliding_layers.size() != n_layers)
      bad(sliding_layers.size(), " sliding-window layer flags for ", n_layers, " layers");
  }
};

}  // namespace kiln
