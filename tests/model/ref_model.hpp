// tests/model/ref_model.hpp - an independent, naive reference of the decoder forward pass.
//
// Written from the maths in kiln/model/config.hpp, not from transformer.hpp: one position at a time, in
// double, with plain loops, a per-position KV history and run-time trait flags. Used to check
// Transformer<Config> (batched, f32, SIMD kernels, arena, KV cache layout) on stories260K and on small
// random models that switch on every trait. ref_forward(..., f16_kv = true) is the reference of an f16 KV
// cache.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kiln/io/gguf.hpp"
#include "kiln/model/config.hpp"
#include "kiln/model/weights.hpp"

namespace kiln::test {

struct RefTraits {
  bool layer_norm = false, one_plus = false;
  Activation act = Activation::silu;
  bool neox = false;
  bool qkv_bias = false, o_bias = false, mlp_bias = false, qk_norm = false;
  bool qk_norm_whole = false;  // with qk_norm: one norm over a token's whole q, and one over its whole k
  bool post_attn_norm = false, post_ffw_norm = false, embed_scale = false;
  std::size_t swa_pattern = 0;
};

using Vec = std::vector<float>;

struct RefLayer {
  Vec attn_norm, attn_norm_b, wq, wk, wv, wo, bq, bk, bv, bo, q_norm, k_norm, post_attn_norm, post_ffw_norm;
  Vec ffn_norm, ffn_norm_b, gate, up, down, b_gate, b_up, b_down;
};

struct RefModel {
  RefTraits t;
  HParams hp;
  Vec emb, out_norm, out_norm_b, output;  // output empty: tied
  std::vector<RefLayer> layers;
};

namespace ref_detail {
using D = std::vector<double>;

inline D matvec(const Vec& w, std::size_t rows, std::size_t cols, const D& x) {  // w (rows, cols) x
  D y(rows, 0.0);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) y[r] += double(w[r * cols + c]) * x[c];
  return y;
}
inline void add_vec(D& y, const Vec& b) {
  for (std::size_t i = 0; i < y.size(); ++i) y[i] += b[i];
}
inline D norm(const RefTraits& t, const D& x, const Vec& w, const Vec& b, double eps, std::size_t off = 0,
              std::size_t n = 0) {
  if (!n) n = x.size();
  D y(x.begin() + std::ptrdiff_t(off), x.begin() + std::ptrdiff_t(off + n));
  double mean = 0, var = 0;
  if (t.layer_norm) {
    for (double v : y) mean += v;
    mean /= double(n);
  }
  for (double v : y) var += (v - mean) * (v - mean);
  var /= double(n);
  const double inv = 1.0 / std::sqrt(var + eps);
  for (std::size_t i = 0; i < n; ++i) {
    const double g = t.one_plus ? 1.0 + w[i] : double(w[i]);
    y[i] = (y[i] - mean) * inv * g + (t.layer_norm ? double(b[i]) : 0.0);
  }
  return y;
}
inline double act(Activation a, double x) {
  switch (a) {
    case Activation::silu:
      return x / (1.0 + std::exp(-x));
    case Activation::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case Activation::gelu_erf:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  }
  return x;
}
inline void rope(D& v, std::size_t off, std::size_t hd, std::size_t rot, double theta, std::size_t pos, bool neox) {
  (void)hd;
  for (std::size_t i = 0; i < rot / 2; ++i) {
    const double a = double(pos) / std::pow(theta, double(2 * i) / double(rot));
    const std::size_t j0 = off + (neox ? i : 2 * i), j1 = off + (neox ? i + rot / 2 : 2 * i + 1);
    const double x0 = v[j0], x1 = v[j1];
    v[j0] = x0 * std::cos(a) - x1 * std::sin(a);
    v[j1] = x1 * std::cos(a) + x0 * std::sin(a);
  }
}
}  // namespace ref_detail

/// x rounded to the nearest IEEE binary16 value (ties to even), as a double: +-inf from 65520 up (the
/// largest finite value is 65504), subnormals in steps of 2^-24, NaN stays NaN. Written from the
/// definition (the grid spacing at |x|, in double arithmetic), independently of kiln::f32_to_f16_bits.
inline double ref_round_f16(double x) {
  if (std::isnan(x)) return x;
  const double a = std::fabs(x);
  int e = 0;
  (void)std::frexp(a, &e);                                         // a in [2^(e-1), 2^e)
  const double step = std::ldexp(1.0, std::max(e - 1, -14) - 10);  // 10 fraction bits; subnormal below 2^-14
  const double q = a / step;                                       // exact (a power of two)
  double r = std::floor(q);
  if (q - r > 0.5 || (q - r == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
  double v = r * step;
  if (v > 65504.0) v = INFINITY;
  return std::copysign(v, x);
}

/// x (n values, n a multiple of 32) through GGUF Q8_0 as ggml defines it, from the definition in double: per block of
/// 32, d = max|x| / 127, q = x / d rounded half away from zero, stored d rounded to f16; the value is f16(d) q.
inline void ref_round_q8_0(double* x, std::size_t n) {
  for (std::size_t b = 0; b < n; b += 32) {
    double amax = 0;
    for (std::size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const double d = amax / 127, dh = ref_round_f16(d);
    for (std::size_t i = b; i < b + 32; ++i) x[i] = d == 0 ? 0.0 : dh * std::round(x[i] / d);
  }
}

/// Logits (vocab) after each token of `tokens`, positions 0, 1, ... With kv = KVType::f16, every key (after
/// RoPE) and value is rounded to f16 (ref_round_f16) before attention reads it, as an f16 KV cache does; with
/// KVType::q8_0, each KV head's key and value go through Q8_0 blocks (ref_round_q8_0), as a q8_0 cache does.
inline std::vector<std::vector<double>> ref_forward(const RefModel& m, const std::vector<int32_t>& tokens,
                                                    KVType kv = KVType::f32) {
  using namespace ref_detail;
  const HParams& hp = m.hp;
  const RefTraits& t = m.t;
  const std::size_t d = hp.dim, hd = hp.head_dim, H = hp.n_heads, KV = hp.n_kv_heads, qd = H * hd, kvd = KV * hd;
  std::vector<std::vector<D>> K(hp.n_layers), V(hp.n_layers);  // [layer][pos] (kv_dim)
  std::vector<std::vector<double>> out;
  for (std::size_t pos = 0; pos < tokens.size(); ++pos) {
    D x(d);
    for (std::size_t i = 0; i < d; ++i)
      x[i] = m.emb[std::size_t(tokens[pos]) * d + i] * (t.embed_scale ? std::sqrt(double(d)) : 1.0);
    for (std::size_t l = 0; l < hp.n_layers; ++l) {
      const RefLayer& L = m.layers[l];
      D h = norm(t, x, L.attn_norm, L.attn_norm_b, hp.norm_eps);
      D q = matvec(L.wq, qd, d, h), k = matvec(L.wk, kvd, d, h), v = matvec(L.wv, kvd, d, h);
      if (t.qkv_bias) {
        add_vec(q, L.bq);
        add_vec(k, L.bk);
        add_vec(v, L.bv);
      }
      if (t.qk_norm && t.qk_norm_whole) {
        RefTraits rms = t;
        rms.layer_norm = false;
        q = norm(rms, q, L.q_norm, {}, hp.norm_eps);
        k = norm(rms, k, L.k_norm, {}, hp.norm_eps);
      } else if (t.qk_norm) {
        RefTraits rms = t;
        rms.layer_norm = false;
        for (std::size_t hh = 0; hh < H; ++hh) {
          const D y = norm(rms, q, L.q_norm, {}, hp.norm_eps, hh * hd, hd);
          for (std::size_t i = 0; i < hd; ++i) q[hh * hd + i] = y[i];
        }
        for (std::size_t g = 0; g < KV; ++g) {
          const D y = norm(rms, k, L.k_norm, {}, hp.norm_eps, g * hd, hd);
          for (std::size_t i = 0; i < hd; ++i) k[g * hd + i] = y[i];
        }
      }
      for (std::size_t hh = 0; hh < H; ++hh) rope(q, hh * hd, hd, hp.rope_dim, hp.rope_theta, pos, t.neox);
      for (std::size_t g = 0; g < KV; ++g) rope(k, g * hd, hd, hp.rope_dim, hp.rope_theta, pos, t.neox);
      if (kv == KVType::f16)
        for (std::size_t i = 0; i < kvd; ++i) {
          k[i] = ref_round_f16(k[i]);
          v[i] = ref_round_f16(v[i]);
        }
      if (kv == KVType::q8_0) {
        ref_round_q8_0(k.data(), kvd);  // kvd = KV whole heads of whole blocks
        ref_round_q8_0(v.data(), kvd);
      }
      K[l].push_back(k);
      V[l].push_back(v);
      const bool sliding = t.swa_pattern && hp.sliding_window && (l + 1) % t.swa_pattern != 0;
      const std::size_t lo = sliding && pos + 1 > hp.sliding_window ? pos + 1 - hp.sliding_window : 0;
      D att(qd, 0.0);
      for (std::size_t hh = 0; hh < H; ++hh) {
        const std::size_t g = hh / (H / KV);
        D s(pos + 1, -INFINITY);
        double mx = -INFINITY;
        for (std::size_t j = lo; j <= pos; ++j) {
          double dot = 0;
          for (std::size_t i = 0; i < hd; ++i) dot += q[hh * hd + i] * K[l][j][g * hd + i];
          dot *= hp.attn_scale;
          if (hp.attn_softcap > 0) dot = hp.attn_softcap * std::tanh(dot / hp.attn_softcap);
          s[j] = dot;
          mx = std::max(mx, dot);
        }
        double sum = 0;
        for (std::size_t j = lo; j <= pos; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (std::size_t j = lo; j <= pos; ++j)
          for (std::size_t i = 0; i < hd; ++i) att[hh * hd + i] += s[j] / sum * V[l][j][g * hd + i];
      }
      D o = matvec(L.wo, d, qd, att);
      if (t.o_bias) add_vec(o, L.bo);
      if (t.post_attn_norm) o = norm(t, o, L.post_attn_norm, {}, hp.norm_eps);
      for (std::size_t i = 0; i < d; ++i) x[i] += o[i];
      h = norm(t, x, L.ffn_norm, L.ffn_norm_b, hp.norm_eps);
      D g = matvec(L.gate, hp.ffn_dim, d, h), u = matvec(L.up, hp.ffn_dim, d, h);
      if (t.mlp_bias) {
        add_vec(g, L.b_gate);
        add_vec(u, L.b_up);
      }
      for (std::size_t i = 0; i < hp.ffn_dim; ++i) g[i] = act(t.act, g[i]) * u[i];
      D m2 = matvec(L.down, d, hp.ffn_dim, g);
      if (t.mlp_bias) add_vec(m2, L.b_down);
      if (t.post_ffw_norm) m2 = norm(t, m2, L.post_ffw_norm, {}, hp.norm_eps);
      for (std::size_t i = 0; i < d; ++i) x[i] += m2[i];
    }
    const D h = norm(t, x, m.out_norm, m.out_norm_b, hp.norm_eps);
    D logits = matvec(m.output.empty() ? m.emb : m.output, hp.vocab, d, h);
    if (hp.final_softcap > 0)
      for (double& z : logits) z = hp.final_softcap * std::tanh(z / hp.final_softcap);
    out.push_back(logits);
  }
  return out;
}

/// The reference model of a Llama GGUF file, read tensor by tensor with io::GGUFFile (not through
/// kiln's model loader).
inline RefModel ref_from_gguf(const io::GGUFFile& f) {
  RefModel m;
  auto vec = [&](const std::string& name) {
    const auto v = f.view<float, 1>(name);
    return Vec(v.data(), v.data() + v.size());
  };
  auto mat = [&](const std::string& name) {
    const auto v = f.view<float, 2>(name);
    return Vec(v.data(), v.data() + v.size());
  };
  HParams& hp = m.hp;
  hp.dim = f.get<uint32_t>("llama.embedding_length");
  hp.n_layers = f.get<uint32_t>("llama.block_count");
  hp.n_heads = f.get<uint32_t>("llama.attention.head_count");
  hp.n_kv_heads = f.get<uint32_t>("llama.attention.head_count_kv");
  hp.ffn_dim = f.get<uint32_t>("llama.feed_forward_length");
  hp.head_dim = hp.dim / hp.n_heads;
  hp.rope_dim = hp.head_dim;
  hp.rope_theta = 10000.0f;
  hp.norm_eps = f.get<float>("llama.attention.layer_norm_rms_epsilon");
  hp.attn_scale = float(1.0 / std::sqrt(double(hp.head_dim)));
  hp.vocab = f.tensor("token_embd.weight").rows();
  m.emb = mat("token_embd.weight");
  m.out_norm = vec("output_norm.weight");
  m.output = mat("output.weight");
  for (std::size_t l = 0; l < hp.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    RefLayer L;
    L.attn_norm = vec(p + "attn_norm.weight");
    L.ffn_norm = vec(p + "ffn_norm.weight");
    L.wq = mat(p + "attn_q.weight");
    L.wk = mat(p + "attn_k.weight");
    L.wv = mat(p + "attn_v.weight");
    L.wo = mat(p + "attn_output.weight");
    L.gate = mat(p + "ffn_gate.weight");
    L.up = mat(p + "ffn_up.weight");
    L.down = mat(p + "ffn_down.weight");
    m.layers.push_back(std::move(L));
  }
  return m;
}

/// Views of a RefModel's arrays as kiln ModelWeights (the RefModel must outlive them).
inline ModelWeights weights_of(const RefModel& m) {
  const HParams& hp = m.hp;
  const std::size_t d = hp.dim;
  auto vr = [](const Vec& v) { return v.empty() ? VecRef{} : VecRef{v.data(), v.size()}; };
  ModelWeights w;
  w.tok_embd = WeightRef::f32(m.emb.data(), hp.vocab, d, "emb");
  w.output = m.output.empty() ? w.tok_embd : WeightRef::f32(m.output.data(), hp.vocab, d, "output");
  w.output_norm = vr(m.out_norm);
  w.output_norm_b = vr(m.out_norm_b);
  for (const RefLayer& R : m.layers) {
    LayerWeights L;
    L.attn_norm = vr(R.attn_norm);
    L.attn_norm_b = vr(R.attn_norm_b);
    L.ffn_norm = vr(R.ffn_norm);
    L.ffn_norm_b = vr(R.ffn_norm_b);
    L.wq = WeightRef::f32(R.wq.data(), hp.q_dim(), d, "wq");
    L.wk = WeightRef::f32(R.wk.data(), hp.kv_dim(), d, "wk");
    L.wv = WeightRef::f32(R.wv.data(), hp.kv_dim(), d, "wv");
    L.wo = WeightRef::f32(R.wo.data(), d, hp.q_dim(), "wo");
    L.w_gate = WeightRef::f32(R.gate.data(), hp.ffn_dim, d, "gate");
    L.w_up = WeightRef::f32(R.up.data(), hp.ffn_dim, d, "up");
    L.w_down = WeightRef::f32(R.down.data(), d, hp.ffn_dim, "down");
    L.bq = vr(R.bq);
    L.bk = vr(R.bk);
    L.bv = vr(R.bv);
    L.bo = vr(R.bo);
    L.q_norm = vr(R.q_norm);
    L.k_norm = vr(R.k_norm);
    L.post_attn_norm = vr(R.post_attn_norm);
    L.post_ffw_norm = vr(R.post_ffw_norm);
    L.b_gate = vr(R.b_gate);
    L.b_up = vr(R.b_up);
    L.b_down = vr(R.b_down);
    w.layers.push_back(L);
  }
  return w;
}

/// A random model with the given traits and sizes (weights ~ U(-scale, scale); norm weights around 1,
/// or around 0 for (1 + w) norms).
inline RefModel random_model(const RefTraits& t, const HParams& hp, uint32_t seed) {
  std::mt19937 rng(seed);
  auto rnd = [&](std::size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    Vec v(n);
    for (auto& x : v) x = u(rng);
    return v;
  };
  const float s = 0.3f;
  auto nw = [&](std::size_t n) { return t.one_plus ? rnd(n, -0.2f, 0.2f) : rnd(n, 0.8f, 1.2f); };
  RefModel m;
  m.t = t;
  m.hp = hp;
  const std::size_t d = hp.dim;
  m.emb = rnd(hp.vocab * d, -1.0f, 1.0f);
  m.out_norm = nw(d);
  if (t.layer_norm) m.out_norm_b = rnd(d, -s, s);
  for (std::size_t l = 0; l < hp.n_layers; ++l) {
    RefLayer L;
    L.attn_norm = nw(d);
    L.ffn_norm = nw(d);
    if (t.layer_norm) {
      L.attn_norm_b = rnd(d, -s, s);
      L.ffn_norm_b = rnd(d, -s, s);
    }
    L.wq = rnd(hp.q_dim() * d, -s, s);
    L.wk = rnd(hp.kv_dim() * d, -s, s);
    L.wv = rnd(hp.kv_dim() * d, -s, s);
    L.wo = rnd(d * hp.q_dim(), -s, s);
    L.gate = rnd(hp.ffn_dim * d, -s, s);
    L.up = rnd(hp.ffn_dim * d, -s, s);
    L.down = rnd(d * hp.ffn_dim, -s, s);
    if (t.qkv_bias) {
      L.bq = rnd(hp.q_dim(), -s, s);
      L.bk = rnd(hp.kv_dim(), -s, s);
      L.bv = rnd(hp.kv_dim(), -s, s);
    }
    if (t.o_bias) L.bo = rnd(d, -s, s);
    if (t.mlp_bias) {
      L.b_gate = rnd(hp.ffn_dim, -s, s);
      L.b_up = rnd(hp.ffn_dim, -s, s);
      L.b_down = rnd(d, -s, s);
    }
    if (t.qk_norm) {
      L.q_norm = nw(t.qk_norm_whole ? hp.q_dim() : hp.head_dim);
      L.k_norm = nw(t.qk_norm_whole ? hp.kv_dim() : hp.head_dim);
    }
    if (t.post_attn_norm) L.post_attn_norm = nw(d);
    if (t.post_ffw_norm) L.post_ffw_norm = nw(d);
    m.layers.push_back(std::move(L));
  }
  return m;
}

}  // namespace kiln::test
