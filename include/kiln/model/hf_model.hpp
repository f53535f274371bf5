// kiln/model/hf_model.hpp - Hugging Face checkpoints (config.json + safetensors) as Transformer<Config>.
//
//   read_hf_hparams<C>(cfg)              config.json -> HParams (C::adjust_hf_hparams for the rest)
//   load_hf_weights<C>(ckpt, cfg, hp)    transformers' tensor names -> ModelWeights, zero-copy views
//   detail::make_hf_model<C>(dir, ...)   both, plus the tokenizer, as a ModelImpl
// kiln::load(dir) (model/model.hpp) picks C from config.json's model_type (C::hf_model_types).
//
// Names: the Config's hf_names (model/config.hpp's TensorNames; transformers' by default), under the prefix
// "model." for *ForCausalLM, "model.language_model." or "language_model.model." for the text decoder of a
// multimodal checkpoint, found from where the token embedding is:
//   embed_tokens.weight -> tok_embd      norm.weight -> output_norm      lm_head.weight -> output
//   layers.N.input_layernorm -> attn_norm            self_attn.{q,k,v,o}_proj.{weight,bias} -> wq.. bq..
//   layers.N.self_attn.{q,k}_norm -> q_norm, k_norm  mlp.{gate,up,down}_proj -> w_gate, w_up, w_down
//   layers.N.post_attention_layernorm -> ffn_norm (Llama, Qwen: the norm before the MLP; Gemma's tables name
//     it post_attn_norm, with pre_feedforward_layernorm -> ffn_norm, as llama.cpp's converter maps them)
//   layers.N.post_feedforward_layernorm -> post_ffw_norm; self_attn.sinks -> attn_sinks; the experts:
//   load_hf_experts (or the Config's hf_experts hook).
// The output weight is the embedding when tie_word_embeddings is true, or when the file has no lm_head
// and the config does not say false (transformers ties then, and drops lm_head when saving).
//
// Storage: F32, F16 and BF16 matrices are views of the mapped file (a tensor whose data is not aligned
// to its element size is copied into owned memory); norm and bias vectors stored as f16/bf16 are
// widened into owned f32 buffers, and norms of a Config with hf_norm_plus_one get 1 added (in f32, as
// HF's (1.0 + w.float())). RoPE pairs are rotate_half (HParams::rope_style = neox) for every
// architecture: transformers never permutes q/k. Every shape is checked against config.json and every
// missing tensor named.
//
// The tokenizer is tokenizer.json beside config.json (text/hf_tokenizer.hpp); without one the model has
// an empty tokenizer and runs on token ids. Needs nlohmann-json (io/hf_config.hpp, io/safetensors.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/io/hf_config.hpp"
#include "kiln/io/safetensors.hpp"
#include "kiln/model/config.hpp"
#include "kiln/model/transformer.hpp"
#include "kiln/model/weights.hpp"
#include "kiln/text/tokenizer.hpp"

namespace kiln {

/// True when config.json model_type `t` is one of C::hf_model_types.
template <class C>
constexpr bool hf_accepts(std::string_view t) {
  if constexpr (requires { C::hf_model_types; }) {
    for (std::string_view m : C::hf_model_types)
      if (m == t) return true;
  }
  return false;
}

namespace detail {

template <class C>
constexpr bool hf_norm_plus_one() {
  if constexpr (requires { C::hf_norm_plus_one; }) return C::hf_norm_plus_one;
  else return false;
}

class HFWeightReader {
 public:
  HFWeightReader(const io::SafetensorsCheckpoint& ck, std::string source, ModelWeights& w)
      : ck_(ck), source_(std::move(source)), w_(w) {}

  const io::SafetensorsTensor* find(const std::string& name) const { return ck_.find_tensor(name); }

  /// A (rows, cols) matrix; an empty WeightRef when absent and not required.
  WeightRef matrix(const std::string& name, std::size_t rows, std::size_t cols, bool required = true) {
    const auto* t = find(name);
    if (!t) {
      if (required) missing(name);
      return {};
    }
    if (t->rank() != 2 || t->extent(0) != rows || t->extent(1) != cols)
      error("tensor '", name, "' has shape ", t->shape.str(), " but config.json needs (", rows, ", ", cols, ")");
    io::GGMLType type = io::GGMLType::F32;
    std::size_t esize = 4;
    switch (t->dtype) {
      case io::SafetensorsDType::F32:
        break;
      case io::SafetensorsDType::F16:
        type = io::GGMLType::F16;
        esize = 2;
        break;
      case io::SafetensorsDType::BF16:
        type = io::GGMLType::BF16;
        esize = 2;
        break;
      default:
        error("tensor '", name, "' has dtype ", io::safetensors_dtype_info(t->dtype).name,
              "; kiln reads F32, F16 and BF16 weights");
    }
    const std::byte* data = t->data.data();
    if (reinterpret_cast<std::uintptr_t>(data) % esize != 0) data = own_copy(data, t->data.size());
    return {data, type, rows, cols, cols * esize, name};
  }

  /// A vector of n values as f32 (zero-copy when the file holds aligned f32 and nothing is added).
  VecRef vector(const std::string& name, std::size_t n, bool plus_one = false, bool required = true) {
    const auto* t = find(name);
    if (!t) {
      if (required) missing(name);
      return {};
    }
    if (t->rank() != 1 || t->extent(0) != n)
      error("tensor '", name, "' has shape ", t->shape.str(), " but config.json needs (", n, ")");
    const auto d = t->dtype;
    if (d != io::SafetensorsDType::F32 && d != io::SafetensorsDType::F16 && d != io::SafetensorsDType::BF16)
      error("tensor '", name, "' has dtype ", io::safetensors_dtype_info(d).name, "; kiln reads F32, F16 and BF16");
    const std::byte* p = t->data.data();
    if (d == io::SafetensorsDType::F32 && !plus_one && reinterpret_cast<std::uintptr_t>(p) % alignof(float) == 0)
      return {reinterpret_cast<const float*>(p), n};
    Buffer<float> buf(n);
    for (std::size_t i = 0; i < n; ++i) {
      float v;
      if (d == io::SafetensorsDType::F32) {
        std::memcpy(&v, p + 4 * i, 4);
      } else {
        uint16_t bits;
        std::memcpy(&bits, p + 2 * i, 2);
        v = d == io::SafetensorsDType::F16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
      }
      buf[i] = plus_one ? 1.0f + v : v;
    }
    const float* out = buf.data();
    w_.owned.push_back(std::move(buf));
    return {out, n};
  }

  template <class... A>
  [[noreturn]] void error(const A&... args) const {
    fail<FormatError>("kiln: Hugging Face checkpoint '", source_, "': ", args...);
  }
  [[noreturn]] void missing(const std::string& name) const { error("tensor '", name, "' not found"); }

  /// The (rows, k) f32 matrices of a 3-D (n, k, m) tensor of x @ W slices (transformers' fused experts), owned:
  /// matrix e's row i is column offset + i * step of slice e (rows = m / step).
  std::vector<WeightRef> transposed_slices(const std::string& name, std::size_t n, std::size_t k, std::size_t m,
                                           std::size_t step, std::size_t offset) {
    const auto* t = find(name);
    if (!t) missing(name);
    if (t->rank() != 3 || t->extent(0) != n || t->extent(1) != k || t->extent(2) != m)
      error("tensor '", name, "' has shape ", t->shape.str(), " but config.json needs (", n, ", ", k, ", ", m, ")");
    const std::size_t rows = m / step;
    std::vector<WeightRef> out(n);
    for (std::size_t e = 0; e < n; ++e) {
      Buffer<float> buf(rows * k);
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t c = 0; c < k; ++c) buf[i * k + c] = element(*t, name, (e * k + c) * m + offset + i * step);
      out[e] = {reinterpret_cast<const std::byte*>(buf.data()),
                io::GGMLType::F32,
                rows,
                k,
                k * sizeof(float),
                name + "[" + std::to_string(e) + "]"};
      w_.owned.push_back(std::move(buf));
    }
    return out;
  }

  /// The n vectors of a 2-D (n, m) tensor, vector e holding elements offset, offset + step, ... of row e, as
  /// owned f32 (transformers' fused expert biases).
  std::vector<VecRef> strided_rows(const std::string& name, std::size_t n, std::size_t m, std::size_t step,
                                   std::size_t offset) {
    const auto* t = find(name);
    if (!t) missing(name);
    if (t->rank() != 2 || t->extent(0) != n || t->extent(1) != m)
      error("tensor '", name, "' has shape ", t->shape.str(), " but config.json needs (", n, ", ", m, ")");
    const std::size_t len = m / step;
    std::vector<VecRef> out(n);
    for (std::size_t e = 0; e < n; ++e) {
      Buffer<float> buf(len);
      for (std::size_t i = 0; i < len; ++i) buf[i] = element(*t, name, e * m + offset + i * step);
      out[e] = {buf.data(), len};
      w_.owned.push_back(std::move(buf));
    }
    return out;
  }

 private:
  const std::byte* own_copy(const std::byte* src, std::size_t bytes) {
    Buffer<float> buf((bytes + sizeof(float) - 1) / sizeof(float));
    std::memcpy(buf.data(), src, bytes);
    const auto* out = reinterpret_cast<const std::byte*>(buf.data());
    w_.owned.push_back(std::move(buf));
    return out;
  }

  // Element i of an F32, F16 or BF16 tensor, as f32.
  float element(const io::SafetensorsTensor& t, const std::string& name, std::size_t i) const {
    const std::byte* p = t.data.data();
    switch (t.dtype) {
      case io::SafetensorsDType::F32: {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        return v;
      }
      case io::SafetensorsDType::F16:
      case io::SafetensorsDType::BF16: {
        uint16_t bits;
        std::memcpy(&bits, p + 2 * i, 2);
        return t.dtype == io::SafetensorsDType::F16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
      }
      default:
        error("tensor '", name, "' has dtype ", io::safetensors_dtype_info(t.dtype).name,
              "; kiln reads F32, F16 and BF16 weights");
    }
  }

  const io::SafetensorsCheckpoint& ck_;
  std::string source_;
  ModelWeights& w_;
};

/// Part `part` (0: q, 1: k, 2: v) of layer p's attention input: wq/wk/wv (self_attn.{q,k,v}_proj.weight), or
/// for a fused_qkv Config rows of wqkv (self_attn.qkv_proj.weight: Phi-3).
template <class C>
WeightRef hf_qkv(HFWeightReader& r, const std::string& p, int part, const HParams& hp) {
  const TensorNames& N = hf_names<C>();
  const std::size_t q = hp.q_dim(), kv = hp.kv_dim(), rows = part == 0 ? q : kv;
  if constexpr (fused_qkv<C>()) return fused_qkv_part(r.matrix(tensor_name(p, N.wqkv), q + 2 * kv, hp.dim), part, hp);
  return r.matrix(tensor_name(p, part == 0 ? N.wq : part == 1 ? N.wk : N.wv), rows, hp.dim);
}
/// The MLP's gate (part 0) or up (part 1) of layer p: w_gate/w_up (mlp.{gate,up}_proj.weight), or for a
/// fused_gate_up Config rows [0, ffn_dim) and [ffn_dim, 2 ffn_dim) of w_gate_up (mlp.gate_up_proj.weight:
/// Phi-3's chunk(2)).
template <class C>
WeightRef hf_gate_up(HFWeightReader& r, const std::string& p, int part, const HParams& hp) {
  const TensorNames& N = hf_names<C>();
  if constexpr (fused_gate_up<C>())
    return fused_gate_up_part(r.matrix(tensor_name(p, N.w_gate_up), 2 * hp.ffn_dim, hp.dim), part, hp);
  return r.matrix(tensor_name(p, part == 0 ? N.w_gate : N.w_up), hp.ffn_dim, hp.dim);
}

/// Layer L's router and experts (model/moe.hpp) under p = "...layers.N.", by the Config's hf_names: one tensor
/// per expert, as transformers' save_pretrained writes them (router, then experts + "E." + exp_gate / exp_up /
/// exp_down: Qwen3-MoE, Qwen2-MoE and OLMoE's mlp.gate and mlp.experts.E.{gate,up,down}_proj; Mixtral's and
/// MiniMax-M2's block_sparse_moe.gate and block_sparse_moe.experts.E.{w1,w3,w2}), the router's correction bias
/// when the file has one (MiniMax-M2's e_score_correction_bias), a shared expert (Qwen2-MoE's
/// mlp.shared_expert.{gate,up,down}_proj and mlp.shared_expert_gate). A Config whose experts are stored otherwise
/// loads them in its hf_experts hook (gpt-oss's fused 3-D experts: model/arch/gpt_oss.hpp).
template <class C>
void load_hf_experts(HFWeightReader& r, LayerWeights& L, const HParams& hp, const std::string& p) {
  if constexpr (requires { C::hf_experts(r, L, hp, p); }) {
    C::hf_experts(r, L, hp, p);
  } else {
    const TensorNames& N = hf_names<C>();
    const std::size_t d = hp.dim, ff = hp.ffn_dim;
    const std::string x = p + std::string(N.experts);
    if (r.find(x + "gate_up_proj") || r.find(x + "down_proj"))
      r.error("tensor '", x,
              "gate_up_proj' (experts fused into 3-D tensors) is not supported: kiln reads one tensor per "
              "expert (",
              x, "0.", N.exp_gate, ".weight, ...)");
    L.ffn_gate_inp = r.matrix(tensor_name(p, N.router), hp.n_expert, d);
    L.exp_gate.resize(hp.n_expert);
    L.exp_up.resize(hp.n_expert);
    L.exp_down.resize(hp.n_expert);
    for (std::size_t e = 0; e < hp.n_expert; ++e) {
      const std::string xe = x + std::to_string(e) + ".";
      L.exp_gate[e] = r.matrix(tensor_name(xe, N.exp_gate), ff, d);
      L.exp_up[e] = r.matrix(tensor_name(xe, N.exp_up), ff, d);
      L.exp_down[e] = r.matrix(tensor_name(xe, N.exp_down), d, ff);
    }
    if (!N.exp_probs_b.empty())
      L.exp_probs_b = r.vector(tensor_name(p, N.exp_probs_b, ""), hp.n_expert, /*plus_one=*/false, /*required=*/false);
    if (const std::size_t sf = hp.shexp_ffn_dim) {
      L.shexp_gate_inp = r.matrix(tensor_name(p, N.shexp_gate_inp), 1, d);
      L.shexp_gate = r.matrix(tensor_name(p, N.shexp_gate), sf, d);
      L.shexp_up = r.matrix(tensor_name(p, N.shexp_up), sf, d);
      L.shexp_down = r.matrix(tensor_name(p, N.shexp_down), d, sf);
    }
  }
}

/// The prefix of the decoder's tensors: where the token embedding (tok_embd: embed_tokens.weight) is.
inline std::string hf_prefix(const HFWeightReader& r, std::string_view tok_embd) {
  const std::string e = tensor_name("", tok_embd);
  for (const char* p : {"model.", "model.language_model.", "language_model.model."})
    if (r.find(std::string(p) + e)) return p;
  r.error("tensor 'model.", e, "' not found (nor under model.language_model. or language_model.model.)");
}

}  // namespace detail

namespace detail {
/// rope_type "yarn" as transformers' _compute_yarn_parameters reads it: factor (absent: max_position_embeddings
/// / original_max_position_embeddings), beta_fast / beta_slow (32 / 1 when absent or 0), truncate (true), and
/// the attention factor: attention_factor, else from mscale and mscale_all_dim, else 0.1 ln(factor) + 1.
template <class E>
void read_hf_yarn(HParams& hp, const io::HFConfig& c, const io::RopeScaling& rs, const E& error) {
  const auto num = [&](const char* k) -> std::optional<double> {
    const auto it = rs.raw.find(k);
    if (it == rs.raw.end() || it->is_null()) return std::nullopt;
    return io::detail::json_as<double>(*it, c.source, std::string("rope_scaling.") + k);
  };
  const auto orig = rs.original_max_position_embeddings;
  if (!orig || *orig <= 0) error("rope scaling type 'yarn' needs a positive original_max_position_embeddings");
  const double factor = num("factor") ? rs.factor : double(hp.ctx_train) / double(*orig);
  if (!(factor >= 1) || !std::isfinite(factor)) error("rope scaling 'yarn': factor ", factor, " must be >= 1");
  const auto get_mscale = [](double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; };
  const auto attention = num("attention_factor"), mscale = num("mscale"), mscale_all = num("mscale_all_dim");
  hp.rope_mscale = float(attention ? *attention
                         : mscale && mscale_all && *mscale && *mscale_all
                             ? get_mscale(factor, *mscale) / get_mscale(factor, *mscale_all)
                             : get_mscale(factor, 1.0));
  bool truncate = true;
  if (const auto it = rs.raw.find("truncate"); it != rs.raw.end() && !it->is_null())
    truncate = io::detail::json_as<bool>(*it, c.source, "rope_scaling.truncate");
  hp.rope_freq_factors = rope_yarn_factors(hp.rope_theta, hp.rope_dim,
                                           {.factor = factor,
                                            .original_ctx = double(*orig),
                                            .beta_fast = num("beta_fast").value_or(0) ? *num("beta_fast") : 32.0,
                                            .beta_slow = num("beta_slow").value_or(0) ? *num("beta_slow") : 1.0,
                                            .truncate = truncate});
}

/// rope_type "longrope" as transformers' _compute_longrope_parameters reads it: short_factor and long_factor
/// (rope_dim / 2 numbers each), original_max_position_embeddings (Phi3Config's top-level key first, as
/// transformers prefers it), factor (absent: max_position_embeddings / original_max_position_embeddings)
/// and attention_factor (absent: rope_longrope_attention_factor). HF chooses the set by the length of each
/// forward pass (long past original_max_position_embeddings); kiln by the context size, as llama.cpp does
/// (HParams::rope_long_factors).
template <class E>
void read_hf_longrope(HParams& hp, const io::HFConfig& c, const io::RopeScaling& rs, const E& error) {
  const auto factors = [&](const char* k) {
    const auto it = rs.raw.find(k);
    if (it == rs.raw.end() || it->is_null()) error("rope scaling type 'longrope' needs ", k);
    const auto v = io::detail::json_as<std::vector<double>>(*it, c.source, std::string("rope_scaling.") + k);
    if (v.size() != hp.rope_dim / 2)
      error("rope_scaling.", k, " has ", v.size(), " values for a rotary dimension of ", hp.rope_dim, " (need ",
            hp.rope_dim / 2, ")");
    std::vector<float> f(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!(v[i] > 0) || !std::isfinite(v[i]))
        error("rope_scaling.", k, "[", i, "] = ", v[i], " must be positive and finite");
      f[i] = float(v[i]);
    }
    return f;
  };
  hp.rope_freq_factors = factors("short_factor");
  hp.rope_long_factors = factors("long_factor");
  const auto orig = c.template find<int64_t>("original_max_position_embeddings")
                        .value_or(rs.original_max_position_embeddings.value_or(0));
  if (orig <= 0) error("rope scaling type 'longrope' needs a positive original_max_position_embeddings");
  hp.rope_orig_ctx = std::size_t(orig);
  const auto num = [&](const char* k) -> std::optional<double> {
    const auto it = rs.raw.find(k);
    if (it == rs.raw.end() || it->is_null()) return std::nullopt;
    return io::detail::json_as<double>(*it, c.source, std::string("rope_scaling.") + k);
  };
  const double factor = num("factor").value_or(double(hp.ctx_train) / double(orig));
  const double attention = num("attention_factor").value_or(rope_longrope_attention_factor(factor, double(orig)));
  if (!(attention > 0) || !std::isfinite(attention))
    error("rope scaling 'longrope': attention factor ", attention, " must be positive and finite");
  hp.rope_mscale = float(attention);
}
}  // namespace detail

namespace detail {
/// Mixture of experts (model/moe.hpp) from config.json: num_experts or num_local_experts,
/// num_experts_per_tok, moe_intermediate_size (each expert's hidden size; Mixtral's is
/// intermediate_size), norm_topk_prob (Mixtral always renormalises), shared_expert_intermediate_size (Qwen2-MoE's
/// sigmoid-gated shared expert). Only checkpoints whose every layer is sparse load: decoder_sparse_step > 1
/// or a non-empty mlp_only_layers is refused.
template <class E>
void read_hf_experts(HParams& hp, const io::HFConfig& c, const E& error) {
  const bool mixtral = c.model_type == "mixtral";
  // transformers 5 writes num_local_experts for Qwen3-MoE too; the released checkpoints say num_experts
  const auto local = c.template find<int64_t>("num_local_experts"), plain = c.template find<int64_t>("num_experts");
  if (local && plain && *local != *plain)
    error("num_local_experts = ", *local, " and num_experts = ", *plain, " disagree");
  const char* count_key = local ? "num_local_experts" : "num_experts";
  const int64_t n = local ? *local : plain.value_or(0);
  if (n < 0) error(count_key, " = ", n, " is negative");
  if (n == 0) {
    if (mixtral) error(count_key, " is missing or 0");
    return;
  }
  hp.n_expert = std::size_t(n);
  const int64_t k = c.template find<int64_t>("num_experts_per_tok").value_or(0);
  if (k <= 0 || k > n) error("num_experts_per_tok = ", k, " must be within 1 and ", count_key, " = ", n);
  hp.n_expert_used = std::size_t(k);
  if (const auto f = c.template find<int64_t>("moe_intermediate_size")) {
    if (*f <= 0) error("moe_intermediate_size = ", *f, " must be positive");
    hp.ffn_dim = std::size_t(*f);
  }
  hp.expert_weights_norm = mixtral || c.template find<bool>("norm_topk_prob").value_or(false);
  if (const auto step = c.template find<int64_t>("decoder_sparse_step"); step && *step != 1)
    error("decoder_sparse_step = ", *step, " (dense MLP layers among the expert layers) is not supported");
  if (const auto dense = c.template find<std::vector<int64_t>>("mlp_only_layers"); dense && !dense->empty())
    error("mlp_only_layers lists ", dense->size(), " layers (dense MLP layers among the expert layers): not supported");
  if (const auto v = c.template find<int64_t>("shared_expert_intermediate_size"); v && *v != 0) {
    if (*v < 0) error("shared_expert_intermediate_size = ", *v, " is negative");
    hp.shexp_ffn_dim = std::size_t(*v);
  }
  if (const auto groups = c.template find<int64_t>("n_group"); groups && *groups > 1)
    error("n_group = ", *groups, " (experts chosen within groups) is not supported");
  for (const char* key : {"n_shared_experts", "num_shared_experts"})  // DeepSeek's ungated ones
    if (const auto v = c.template find<int64_t>(key); v && *v > 0)
      error(key, " = ", *v, ": ungated shared experts are not supported");
}
}  // namespace detail

/// Hyper-parameters of a Config architecture from a config.json.
template <ArchConfig C>
HParams read_hf_hparams(const io::HFConfig& c) {
  const auto error = [&](const auto&... args) {
    fail<FormatError>("kiln: config.json file '", c.source, "' (", C::name, "): ", args...);
  };
  HParams hp;
  hp.arch = std::string(C::name);
  hp.dim = std::size_t(c.hidden_size);
  hp.n_layers = std::size_t(c.num_hidden_layers);
  hp.n_heads = std::size_t(c.num_attention_heads);
  hp.n_kv_heads = std::size_t(c.num_key_value_heads);
  hp.head_dim = std::size_t(c.head_dim);
  hp.ffn_dim = std::size_t(c.intermediate_size);
  hp.vocab = std::size_t(c.vocab_size);
  hp.ctx_train = std::size_t(c.max_position_embeddings);
  // Partial rotary (Phi-4-mini): partial_rotary_factor at the top level or in rope_parameters (transformers 5);
  // HF rotates the first int(head_dim * factor) elements of each head.
  double rotary = c.template find<double>("partial_rotary_factor").value_or(1.0);
  if (const io::json* rp = c.find_json("rope_parameters");
      rp && rp->is_object() && !c.contains("partial_rotary_factor"))
    if (const auto it = rp->find("partial_rotary_factor"); it != rp->end() && !it->is_null())
      rotary = io::detail::json_as<double>(*it, c.source, "rope_parameters.partial_rotary_factor");
  if (!(rotary > 0 && rotary <= 1)) error("partial_rotary_factor ", rotary, " must be within (0, 1]");
  hp.rope_dim = std::size_t(double(hp.head_dim) * rotary);
  hp.rope_style = RopeStyle::neox;  // transformers' rotate_half, whatever the architecture
  hp.rope_theta = float(c.rope_theta);
  if (c.rope_scaling && c.rope_scaling->type != "default") {
    const io::RopeScaling& rs = *c.rope_scaling;
    if (rs.type == "linear") {
      hp.rope_linear_factor = float(rs.factor);
    } else if (rs.type == "llama3") {  // per-frequency factors, as llama.cpp's converter writes them
      if (!rs.low_freq_factor || !rs.high_freq_factor || !rs.original_max_position_embeddings)
        error("rope scaling type 'llama3' needs low_freq_factor, high_freq_factor, ",
              "original_max_position_embeddings");
      if (!(*rs.low_freq_factor > 0) || !(*rs.high_freq_factor > *rs.low_freq_factor) ||
          *rs.original_max_position_embeddings <= 0)
        error("rope scaling 'llama3': low_freq_factor ", *rs.low_freq_factor, ", high_freq_factor ",
              *rs.high_freq_factor, " and original_max_position_embeddings ", *rs.original_max_position_embeddings,
              " need 0 < low < high and a positive context");
      hp.rope_freq_factors =
          rope_llama3_factors(hp.rope_theta, hp.rope_dim, float(rs.factor), float(*rs.low_freq_factor),
                              float(*rs.high_freq_factor), float(*rs.original_max_position_embeddings));
    } else if (rs.type == "longrope" || rs.type == "su" || (rs.type == "yarn" && c.model_type == "phi3")) {
      detail::read_hf_longrope(hp, c, rs, error);  // Phi3Config renames "su" and "yarn" to longrope
    } else if (rs.type == "yarn") {
      detail::read_hf_yarn(hp, c, rs, error);
    } else {
      error("rope scaling type '", rs.type, "' is not supported (supported: default, linear, llama3, yarn, longrope)");
    }
  }
  hp.norm_eps = float(c.rms_norm_eps);
  hp.attn_scale = float(1.0 / std::sqrt(double(hp.head_dim)));
  // The activation the Config computes must be the file's.
  constexpr std::string_view act = C::activation == Activation::silu        ? "silu"
                                   : C::activation == Activation::gelu_tanh ? "gelu_pytorch_tanh"
                                                                            : "gelu";
  for (const char* key : {"hidden_act", "hidden_activation"})
    if (const auto a = c.template find<std::string>(key);
        a && *a != act && !(act == "silu" && *a == "swish") && !(act == "gelu_pytorch_tanh" && *a == "gelu_tanh"))
      error(key, " '", *a, "' is not the ", C::name, " activation '", act, "'");
  // Biases the Config has no place for.
  if (c.template find<bool>("attention_bias").value_or(false) && !C::qkv_bias)
    error("attention_bias = true is not supported for ", C::name);
  if (c.template find<bool>("mlp_bias").value_or(false) && !C::mlp_bias)
    error("mlp_bias = true is not supported for ", C::name);
  // Sliding-window layers: layer_types when listed; C::adjust_hf_hparams may fill them in otherwise (Qwen's
  // use_sliding_window: model/arch/qwen2.hpp; Mistral's, Phi-3's, Gemma's sliding_window).
  if (const auto types = c.template find<std::vector<std::string>>("layer_types")) {
    if (types->size() != hp.n_layers) error("layer_types has ", types->size(), " entries for ", hp.n_layers, " layers");
    hp.sliding_layers.resize(hp.n_layers);
    for (std::size_t l = 0; l < hp.n_layers; ++l) {
      if ((*types)[l] != "sliding_attention" && (*types)[l] != "full_attention")
        error("layer_types[", l, "] is '", (*types)[l], "'; supported: full_attention, sliding_attention");
      hp.sliding_layers[l] = (*types)[l] == "sliding_attention";
    }
    if (const auto w = c.template find<int64_t>("sliding_window"))
      hp.sliding_window = std::size_t(std::max<int64_t>(*w, 0));
  }
  detail::read_hf_experts(hp, c, error);
  if constexpr (requires(HParams & h) { C::adjust_hf_hparams(h, c); }) C::adjust_hf_hparams(hp, c);
  if (hp.sliding_layers.empty() && c.template find<bool>("use_sliding_window").value_or(false))
    error("use_sliding_window = true is not supported for ", C::name,
          " (no layer_types, and its Config does not read the window)");
  if (std::any_of(hp.sliding_layers.begin(), hp.sliding_layers.end(), [](bool b) { return b; }) &&
      hp.sliding_window == 0)
    error("layers use sliding-window attention but sliding_window is absent or 0");
  hp.validate(c.source);
  return hp;
}

/// The weights of a Config architecture from a Hugging Face checkpoint, by the Config's hf_names (transformers'
/// by default; see the top of this file).
template <ArchConfig C>
ModelWeights load_hf_weights(const io::SafetensorsCheckpoint& ck, const io::HFConfig& c, const HParams& hp,
                             const std::string& source) {
  ModelWeights w;
  detail::HFWeightReader r(ck, source, w);
  const TensorNames& N = detail::hf_names<C>();
  using detail::tensor_name;
  const std::size_t d = hp.dim, q = hp.q_dim(), kv = hp.kv_dim(), ff = hp.ffn_dim;
  constexpr bool p1 = detail::hf_norm_plus_one<C>();
  static_assert(C::norm_kind == NormKind::rms, "kiln::load_hf_weights: only RMSNorm architectures so far");
  static_assert(!C::mlp_bias, "kiln::load_hf_weights: MLP biases are not mapped yet");
  if (C::post_attn_norm && N.post_attn_norm.empty())
    r.error("the Config '", C::name, "' has post_attn_norm but no Hugging Face name for it (hf_names.post_attn_norm)");
  const std::string m = detail::hf_prefix(r, N.tok_embd);
  w.tok_embd = r.matrix(tensor_name(m, N.tok_embd), hp.vocab, d);
  w.output_norm = r.vector(tensor_name(m, N.output_norm), d, p1);
  const auto tie = c.template find<bool>("tie_word_embeddings");
  std::string head = tensor_name("", N.output);
  if (!r.find(head) && m == "language_model.model.") head = "language_model." + head;
  if (tie.value_or(false) || (!r.find(head) && !tie)) {
    w.output = w.tok_embd;
  } else {
    if (!r.find(head)) r.error("tensor '", head, "' not found (config.json says tie_word_embeddings = false)");
    w.output = r.matrix(head, hp.vocab, d);
  }
  // Each layer has several tensors: more layers than the checkpoint has tensors is a broken config.json
  // (and would otherwise size the layer table first: std::bad_alloc for 2^31 - 1).
  if (hp.n_layers > ck.size())
    r.error("num_hidden_layers = ", hp.n_layers, " but the checkpoint has only ", ck.size(), " tensors");
  w.layers.resize(hp.n_layers);
  for (std::size_t l = 0; l < hp.n_layers; ++l) {
    LayerWeights& L = w.layers[l];
    const std::string p = m + "layers." + std::to_string(l) + ".";
    const auto weight = [&](std::string_view role) { return tensor_name(p, role); };
    const auto bias = [&](std::string_view role) { return tensor_name(p, role, ".bias"); };
    L.attn_norm = r.vector(weight(N.attn_norm), d, p1);
    L.wq = detail::hf_qkv<C>(r, p, 0, hp);
    L.wk = detail::hf_qkv<C>(r, p, 1, hp);
    L.wv = detail::hf_qkv<C>(r, p, 2, hp);
    L.wo = r.matrix(weight(N.wo), d, q);
    if constexpr (C::qkv_bias) {
      L.bq = r.vector(bias(N.wq), q);
      L.bk = r.vector(bias(N.wk), kv);
      L.bv = r.vector(bias(N.wv), kv);
    }
    if constexpr (C::o_bias) L.bo = r.vector(bias(N.wo), d);
    if constexpr (detail::attn_sinks<C>()) {
      const std::string sinks = tensor_name(p, N.attn_sinks, "");
      L.attn_sinks = r.vector(sinks, hp.n_heads);
      for (std::size_t h = 0; h < hp.n_heads; ++h)  // a NaN or inf sink has no meaning (kiln::attention refuses it)
        if (!std::isfinite(L.attn_sinks.data[h]))
          r.error("tensor '", sinks, "' holds ", L.attn_sinks.data[h], " for head ", h,
                  "; attention sinks must be finite");
    }
    if constexpr (C::qk_norm) {
      constexpr bool whole = detail::qk_norm_whole<C>();
      L.q_norm = r.vector(weight(N.q_norm), whole ? q : hp.head_dim, p1);
      L.k_norm = r.vector(weight(N.k_norm), whole ? kv : hp.head_dim, p1);
    }
    if constexpr (C::post_attn_norm) L.post_attn_norm = r.vector(weight(N.post_attn_norm), d, p1);
    // A block hook uses the norms it wants (a parallel block has no ffn_norm), as the GGUF loader allows.
    L.ffn_norm = r.vector(weight(N.ffn_norm), d, p1, /*required=*/!detail::has_block<C>());
    if constexpr (C::post_ffw_norm) L.post_ffw_norm = r.vector(weight(N.post_ffw_norm), d, p1);
    if (hp.n_expert) {
      detail::load_hf_experts<C>(r, L, hp, p);
    } else {
      L.w_gate = detail::hf_gate_up<C>(r, p, 0, hp);
      L.w_up = detail::hf_gate_up<C>(r, p, 1, hp);
      L.w_down = r.matrix(weight(N.w_down), d, ff);
    }
  }
  return w;
}

namespace detail {

/// sqrt(dim) as transformers' Gemma computes it: a float32 tensor cast to the embedding's dtype.
inline float hf_embed_scale(std::size_t dim, io::GGMLType embedding_type) {
  const float s = std::sqrt(float(dim));
  if (embedding_type == io::GGMLType::BF16) return float(bf16(s));
  if (embedding_type == io::GGMLType::F16) return float(f16(s));
  return s;
}

/// The tokenizer beside a checkpoint: tokenizer.json (Tokenizer::from_hf_json; a tokenizer it cannot
/// read is an error), or, when the directory has none, an empty tokenizer (the model runs on token ids).
inline Tokenizer hf_tokenizer(const std::filesystem::path& dir) {
  const auto p = dir / "tokenizer.json";
  return std::filesystem::exists(p) ? Tokenizer::from_hf_json(p) : Tokenizer();
}

template <class C>
std::shared_ptr<const ModelImpl> make_hf_model(const std::filesystem::path& dir, const io::HFConfig& cfg,
                                               std::shared_ptr<io::SafetensorsCheckpoint> ck, bool pack) {
  HParams hp = read_hf_hparams<C>(cfg);
  ModelWeights w = load_hf_weights<C>(*ck, cfg, hp, dir.string());
  for (auto& f : ck->files()) {
    if (pack) pack_weights(w, f.mapped_file());              // f16/bf16 matrices into packed rows (LoadOptions::pack)
    advise_sparse_tensors(f.tensors(), w, f.mapped_file());  // mapped only
  }
  if constexpr (C::embed_scale == EmbedScale::sqrt_dim) hp.embed_scale = hf_embed_scale(hp.dim, w.tok_embd.type);
  Tokenizer tok = hf_tokenizer(dir);
  if (tok.size() > hp.vocab)
    fail<FormatError>("kiln: Hugging Face checkpoint '", dir.string(), "': the tokenizer has ", tok.size(),
                      " tokens but the embedding only ", hp.vocab, " rows");
  std::optional<ChatTemplate> chat;  // as for a GGUF file (model.hpp): a reason instead of a failed load
  std::string why_not;
  try {
    chat = ChatTemplate::from_hf_dir(dir);
  } catch (const Error& e) {
    why_not = e.what();
  }
  auto impl = std::make_shared<Transformer<C>>(std::move(hp), std::move(w), std::move(tok), std::move(ck));
  impl->set_chat_template(std::move(chat), std::move(why_not));
  return impl;
}

}  // namespace detail
}  // namespace kiln
