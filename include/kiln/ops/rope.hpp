// kiln/ops/rope.hpp - rotary position embedding (RoPE) of queries and keys.
//
// Each head vector's first rot_dim elements are rotated in pairs by angle pos * inv_freq[i],
//   inv_freq[i] = 1 / theta^(2i / rot_dim),  i < rot_dim / 2;
// elements past rot_dim (partial rotary, e.g. Phi, GPT-NeoX) are left as they are. Pairing:
//   RopeStyle::neox  pairs (i, i + rot_dim/2): HF rotate_half (Llama, Qwen, Gemma, SmolLM2, GPT-NeoX);
//                    GGUF llama-arch weights are permuted at conversion so that this applies to them too
//   RopeStyle::gptj  pairs (2i, 2i + 1): interleaved (GPT-J; llama.cpp's "normal" rope mode)
// and (a, b) -> (a cos - b sin, b cos + a sin).
//
// Numerics (what kiln chose): inv_freq is computed like HF's _compute_default_rope_parameters, in
// float32: e = float(2i) / float(rot_dim), p = float32(theta^e) (correctly rounded; HF's float pow is
// within 1 ulp of it), inv_freq = 1.0f / p; linear scaling ("linear" rope_type) divides it by the factor
// in float32 as HF does (equivalent to pos / factor). The angle pos * inv_freq and its cos/sin are then
// computed in double and rounded once to float, so cos/sin are the correctly rounded values for HF's
// frequencies at every position; HF itself rounds the angle to float32 first, which at position p
// perturbs it by up to ulp(p * inv_freq)/2 (~1e-4 rad around p = 4096), so the two agree to ~1 ulp for
// short contexts and to that angle error for long ones. cos/sin are computed once per token per call
// and shared by all heads.
//
// A RopeTable holds cos/sin for positions [0, ctx) computed the same way once (with llama3/YaRN/LongRoPE
// per-frequency factors and an attention factor when a model has them); rope(x, positions, out, table,
// style) reads it instead of recomputing angles (a model's forward pass: the built-in transformer). Its
// rotation is fl(fl(a cos) - fl(b sin)) and fl(fl(b cos) + fl(a sin)) on every target (no FMA
// contraction), the bits of the scalar loop written out in C++.
//
// x, out: (n_tokens, n_heads, head_dim), last dimension contiguous, any strides for the first two (so
// q and k can be views into a fused QKV buffer); out may alias x. positions: (n_tokens) int32.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/core/check.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/kernels/dispatch.hpp"

namespace kiln {

enum class RopeStyle { neox, gptj };

struct RopeConfig {
  RopeStyle style = RopeStyle::neox;
  float theta = 10000.0f;      ///< frequency base (rope_theta)
  float linear_factor = 1.0f;  ///< linear position scaling: angles use pos / linear_factor
  std::size_t rot_dim = 0;     ///< rotated leading elements of each head; 0 = the whole head
};

/// HF's inverse frequencies (float32, see above) for a rotary dimension, divided by linear_factor.
inline std::vector<float> rope_inv_freq(float theta, std::size_t rot_dim, float linear_factor = 1.0f) {
  std::vector<float> f(rot_dim / 2);
  for (std::size_t i = 0; i < f.size(); ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rot_dim);
    const float p = static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(e)));
    f[i] = 1.0f / p;
    if (linear_factor != 1.0f) f[i] /= linear_factor;
  }
  return f;
}

/// Llama 3.x's "llama3" RoPE scaling as per-frequency divisors of rope_inv_freq(theta, rot_dim), computed
/// as llama.cpp's convert_hf_to_gguf.py writes them into rope_freqs.weight (float32): 1 for wavelengths
/// under original_ctx / high_freq_factor, `factor` above original_ctx / low_freq_factor, and between them
/// 1 / ((1 - s) / factor + s), s = (original_ctx / wavelength - low_freq_factor) / (high_freq_factor -
/// low_freq_factor). Hugging Face's _compute_llama3_parameters multiplies the frequencies by the same
/// amounts (the middle band's products round differently, by an ulp).
inline std::vector<float> rope_llama3_factors(float theta, std::size_t rot_dim, float factor, float low_freq_factor,
                                              float high_freq_factor, float original_ctx) {
  const auto inv = rope_inv_freq(theta, rot_dim);
  const float low_wavelen = original_ctx / low_freq_factor, high_wavelen = original_ctx / high_freq_factor;
  std::vector<float> f(inv.size());
  for (std::size_t i = 0; i < inv.size(); ++i) {
    const float wavelen = static_cast<float>(2 * 3.141592653589793) / inv[i];
    if (wavelen < high_wavelen) {
      f[i] = 1.0f;
    } else if (wavelen > low_wavelen) {
      f[i] = factor;
    } else {
      const float s = (original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      f[i] = 1.0f / ((1.0f - s) / factor + s);
    }
  }
  return f;
}

/// YaRN as per-frequency divisors of rope_inv_freq(theta, rot_dim): frequency i is the blend
/// e * extrapolated + (1 - e) * interpolated (divided by factor), e = 1 - clamp((i - low) / (high - low), 0, 1),
/// low and high the dimensions where original_ctx positions turn beta_fast and beta_slow times,
/// d(b) = rot_dim ln(original_ctx / (2 pi b)) / (2 ln theta) (floor and ceil of them when truncate; clamped
/// to [0, rot_dim - 1]): the divisor is 1 / (e + (1 - e) / factor). Hugging Face's _compute_yarn_parameters
/// and llama.cpp's rope_yarn (ext_factor 1) compute these frequencies. The attention factor that goes with
/// them (cos and sin multiplied by it) is the caller's.
struct YarnParams {
  double factor = 1;        ///< context extension (rope_scaling factor)
  double original_ctx = 0;  ///< the trained context (original_max_position_embeddings)
  double beta_fast = 32, beta_slow = 1;
  bool truncate = true;  ///< floor / ceil of the correction dimensions (HF's default; llama.cpp always)
};
inline std::vector<float> rope_yarn_factors(float theta, std::size_t rot_dim, const YarnParams& y) {
  const double pi = 3.141592653589793, dim = double(rot_dim);
  auto corr = [&](double rotations) {
    return dim * std::log(y.original_ctx / (rotations * 2 * pi)) / (2 * std::log(double(theta)));
  };
  double low = corr(y.beta_fast), high = corr(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // as both do
  std::vector<float> f(rot_dim / 2);
  for (std::size_t i = 0; i < f.size(); ++i) {
    const float ramp = static_cast<float>(std::clamp((double(i) - low) / (high - low), 0.0, 1.0));
    const float e = 1.0f - ramp;  // the extrapolated share
    f[i] = 1.0f / (e + (1.0f - e) / static_cast<float>(y.factor));
  }
  return f;
}

/// LongRoPE's attention factor (Phi-3 / Phi-3.5 128k, Phi-4-mini), as transformers'
/// _compute_longrope_parameters and llama.cpp's converter compute it when the file gives none:
/// sqrt(1 + ln(factor) / ln(original_ctx)) for factor > 1 (factor: max_position_embeddings /
/// original_max_position_embeddings unless rope_scaling says), else 1.
inline float rope_longrope_attention_factor(double factor, double original_ctx) {
  return factor > 1 ? float(std::sqrt(1 + std::log(factor) / std::log(original_ctx))) : 1.0f;
}

/// How a RopeTable's angles are scaled.
struct RopeTableOptions {
  float linear_factor = 1.0f;                ///< linear position scaling: angles use pos / linear_factor
  std::span<const float> freq_factors = {};  ///< rot_dim / 2 divisors of the frequencies (llama3, YaRN), or empty
  float attention_factor = 1.0f;             ///< cos and sin multiplied by it (YaRN's; HF: cos() * attention_scaling)
  /// LongRoPE: rot_dim / 2 divisors for long contexts (HF long_factor; GGUF rope_factors_long.weight), or
  /// empty. A table of more than original_ctx positions uses them in place of freq_factors (the short set:
  /// short_factor, rope_factors_short.weight), as llama.cpp chooses by the context size.
  std::span<const float> long_freq_factors = {};
  std::size_t original_ctx = 0;  ///< LongRoPE's switch point (original_max_position_embeddings)
};

/// cos and sin of pos * inv_freq[i] for positions [0, ctx) and i < rot_dim / 2: inv_freq is
/// rope_inv_freq(theta, rot_dim, linear_factor) divided by freq_factors[i] (or long_freq_factors[i] when
/// ctx > original_ctx) in float32 (as llama.cpp divides its angles by rope_freqs), the angle and its
/// cos/sin in double rounded once to float, then times attention_factor in float. Memory: 2 ctx
/// (rot_dim / 2) floats.
class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(std::size_t ctx, float theta, std::size_t rot_dim, const RopeTableOptions& opt = {})
      : ctx_(ctx), half_(rot_dim / 2) {
    if (rot_dim == 0 || rot_dim % 2 != 0) fail("kiln::RopeTable: rot_dim ", rot_dim, " must be even and positive");
    if (!(theta > 0.0f) || !(opt.linear_factor > 0.0f) || !std::isfinite(theta) || !std::isfinite(opt.linear_factor))
      fail("kiln::RopeTable: theta ", theta, " and linear_factor ", opt.linear_factor, " must be positive and finite");
    const auto check_factors = [&](std::span<const float> factors, const char* what) {
      if (!factors.empty() && factors.size() != half_)
        fail("kiln::RopeTable: ", factors.size(), " ", what, "s for a rotary dimension of ", rot_dim, " (need ", half_,
             ")");
      for (const float f : factors)
        if (!(f > 0.0f) || !std::isfinite(f)) fail("kiln::RopeTable: ", what, " ", f, " must be positive and finite");
    };
    check_factors(opt.freq_factors, "frequency factor");
    check_factors(opt.long_freq_factors, "long-context frequency factor");
    if (!opt.long_freq_factors.empty() && (opt.freq_factors.empty() || opt.original_ctx == 0))
      fail("kiln::RopeTable: long-context frequency factors need the short ones (freq_factors) and original_ctx > 0");
    if (!(opt.attention_factor > 0.0f) || !std::isfinite(opt.attention_factor))
      fail("kiln::RopeTable: attention_factor ", opt.attention_factor, " must be positive and finite");
    long_ = !opt.long_freq_factors.empty() && ctx > opt.original_ctx;
    const std::span<const float> factors = long_ ? opt.long_freq_factors : opt.freq_factors;
    auto inv = rope_inv_freq(theta, rot_dim, opt.linear_factor);
    for (std::size_t i = 0; i < factors.size(); ++i) inv[i] /= factors[i];
    cos_ = Buffer<float>(ctx * half_);
    sin_ = Buffer<float>(ctx * half_);
    for (std::size_t p = 0; p < ctx; ++p)
      for (std::size_t i = 0; i < half_; ++i) {
        const double a = double(p) * double(inv[i]);
        cos_[p * half_ + i] = float(std::cos(a)) * opt.attention_factor;
        sin_[p * half_ + i] = float(std::sin(a)) * opt.attention_factor;
      }
  }

  std::size_t ctx() const { return ctx_; }
  std::size_t rot_dim() const { return 2 * half_; }
  bool empty() const { return half_ == 0; }
  /// Whether LongRoPE's long-context factors were used (ctx > original_ctx).
  bool long_factors() const { return long_; }
  /// Position pos's rot_dim / 2 values (pos < ctx()).
  const float* cos(std::size_t pos) const { return cos_.data() + pos * half_; }
  const float* sin(std::size_t pos) const { return sin_.data() + pos * half_; }
  std::size_t bytes() const { return 2 * ctx_ * half_ * sizeof(float); }

 private:
  std::size_t ctx_ = 0, half_ = 0;
  bool long_ = false;
  Buffer<float> cos_, sin_;
};

}  // namespace kiln

KILN_DISPATCH_BEGIN
// x: n_tokens x n_heads x head_dim with token stride xts and head stride xhs; out likewise. pos: n_tokens;
// inv_freq: rot_dim / 2.
void rope_f32(const float* x, std::ptrdiff_t xts, std::ptrdiff_t xhs, float* out, std::ptrdiff_t ots,
              std::ptrdiff_t ohs, std::size_t n_tokens, std::size_t n_heads, std::size_t head_dim, std::size_t rot_dim,
              const std::int32_t* pos, const float* inv_freq, bool neox);
// The same with cos/sin from a table: position p's rot_dim / 2 values at cos + p * rot_dim / 2.
void rope_table_f32(const float* x, std::ptrdiff_t xts, std::ptrdiff_t xhs, float* out, std::ptrdiff_t ots,
                    std::ptrdiff_t ohs, std::size_t n_tokens, std::size_t n_heads, std::size_t head_dim,
                    std::size_t rot_dim, const std::int32_t* pos, const float* cos, const float* sin, bool neox);
KILN_DISPATCH_END

namespace kiln {

namespace detail {
/// The arguments both kiln::rope overloads take: dtypes, ranks, x and out of one shape and contiguous in
/// their last dimension, one contiguous position per token.
template <class X, class P, class O>
void check_rope_args(const X& x, const P& positions, const O& out) {
  KILN_REQUIRE_DTYPE(X, float, "rope", "x");
  KILN_REQUIRE_DTYPE(P, std::int32_t, "rope", "positions");
  KILN_REQUIRE_DTYPE(O, float, "rope", "out");
  KILN_REQUIRE_WRITABLE(O, "rope", "out");
  static_assert(X::rank() == 3, "kiln::rope: x must be rank 3 (n_tokens, n_heads, head_dim)");
  static_assert(P::rank() == 1, "kiln::rope: positions must be rank 1 (n_tokens)");
  detail::require_same_shape(x, out, "rope", "x", "out");
  const std::size_t n_tokens = x.extent(0), head_dim = x.extent(2);
  if (head_dim > 1 && (x.stride(2) != 1 || out.stride(2) != 1))
    fail<ShapeError>("kiln::rope: x ", detail::shape_str(x), " and out ", detail::shape_str(out),
                     " must be contiguous in their last dimension");
  if (positions.extent(0) != n_tokens || (n_tokens > 1 && positions.stride(0) != 1))
    fail<ShapeError>("kiln::rope: positions ", detail::shape_str(positions), " must be contiguous of length ", n_tokens,
                     " (x is ", detail::shape_str(x), ")");
}
}  // namespace detail

/// out = rope(x) at the given positions. Shapes: x, out (n_tokens, n_heads, head_dim); positions (n_tokens).
template <class X, class P, class O>
void rope(const X& x, const P& positions, const O& out, const RopeConfig& cfg, ThreadPool* pool = nullptr) {
  detail::check_rope_args(x, positions, out);
  const std::size_t n_tokens = x.extent(0), n_heads = x.extent(1), head_dim = x.extent(2);
  const std::size_t rot_dim = cfg.rot_dim ? cfg.rot_dim : head_dim;
  if (rot_dim > head_dim || rot_dim % 2 != 0 || rot_dim == 0)
    fail<ShapeError>("kiln::rope: rot_dim ", rot_dim, " must be even, positive and <= head_dim (x is ",
                     detail::shape_str(x), ")");
  if (!(cfg.theta > 0.0f) || !(cfg.linear_factor > 0.0f) || !std::isfinite(cfg.theta) ||
      !std::isfinite(cfg.linear_factor))
    fail("kiln::rope: theta ", cfg.theta, " and linear_factor ", cfg.linear_factor, " must be positive and finite");
  if (n_tokens == 0 || n_heads == 0) return;
  const std::vector<float> inv_freq = rope_inv_freq(cfg.theta, rot_dim, cfg.linear_factor);
  detail::for_rows(n_tokens, n_heads * head_dim, pool, [&](std::size_t b, std::size_t e) {
    dispatch::rope_f32(x.data() + static_cast<std::ptrdiff_t>(b) * x.stride(0), x.stride(0), x.stride(1),
                       out.data() + static_cast<std::ptrdiff_t>(b) * out.stride(0), out.stride(0), out.stride(1), e - b,
                       n_heads, head_dim, rot_dim, positions.data() + b, inv_freq.data(), cfg.style == RopeStyle::neox);
  });
}

/// In place: x = rope(x).
template <class X, class P>
void rope(const X& x, const P& positions, const RopeConfig& cfg, ThreadPool* pool = nullptr) {
  rope(x, positions, x, cfg, pool);
}

/// out = rope(x) with cos/sin from `table` (its rot_dim rotated, paired as `style`): positions must lie in
/// [0, table.ctx()). Allocates nothing.
template <class X, class P, class O>
void rope(const X& x, const P& positions, const O& out, const RopeTable& table, RopeStyle style,
          ThreadPool* pool = nullptr) {
  detail::check_rope_args(x, positions, out);
  const std::size_t n_tokens = x.extent(0), n_heads = x.extent(1), head_dim = x.extent(2);
  const std::size_t rot_dim = table.rot_dim();
  if (table.empty() || rot_dim > head_dim)
    fail<ShapeError>("kiln::rope: a table of rot_dim ", rot_dim, " for x ", detail::shape_str(x),
                     " (need 0 < rot_dim <= head_dim)");
  for (std::size_t t = 0; t < n_tokens; ++t)
    if (positions.data()[t] < 0 || std::size_t(positions.data()[t]) >= table.ctx())
      fail("kiln::rope: position ", positions.data()[t], " (token ", t, ") outside the table's [0, ", table.ctx(), ")");
  if (n_tokens == 0 || n_heads == 0) return;
  detail::for_rows(n_tokens, n_heads * head_dim, pool, [&](std::size_t b, std::size_t e) {
    dispatch::rope_table_f32(x.data() + static_cast<std::ptrdiff_t>(b) * x.stride(0), x.stride(0), x.stride(1),
                             out.data() + static_cast<std::ptrdiff_t>(b) * out.stride(0), out.stride(0), out.stride(1),
                             e - b, n_heads, head_dim, rot_dim, positions.data() + b, table.cos(0), table.sin(0),
                             style == RopeStyle::neox);
  });
}

namespace ref {
/// Scalar reference for one head vector, in double (angle, cos, sin and the rotation).
inline void rope(const float* x, float* out, std::size_t head_dim, std::size_t rot_dim, std::int32_t pos,
                 const float* inv_freq, RopeStyle style) {
  const std::size_t h = rot_dim / 2;
  for (std::size_t i = 0; i < h; ++i) {
    const double a = double(pos) * double(inv_freq[i]), c = std::cos(a), s = std::sin(a);
    const std::size_t j0 = style == RopeStyle::neox ? i : 2 * i, j1 = style == RopeStyle::neox ? i + h : 2 * i + 1;
    const double x0 = x[j0], x1 = x[j1];
    out[j0] = float(x0 * c - x1 * s);
    out[j1] = float(x1 * c + x0 * s);
  }
  for (std::size_t j = rot_dim; j < head_dim; ++j) out[j] = x[j];
}
}  // namespace ref

}  // namespace kiln
