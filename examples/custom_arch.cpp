// custom_arch: a GPT-2-style decoder built from kiln's ops, in one file - the way to run an architecture
// that kiln::Transformer<Config> does not cover. It differs from Llama everywhere that matters:
//
//   x     = wte[ids] + wpe[positions]                       learned absolute positions, no RoPE
//   block:  h = LayerNorm(x)                                LayerNorm with a bias
//           q, k, v = h Wqkv^T + bqkv                       one fused projection, with bias
//           a = softmax(q k^T / sqrt(head_dim), causal) v   per head, K and V from a KV cache
//           x = x + (a Wo^T + bo)
//           h = LayerNorm(x)
//           x = x + (gelu(h W1^T + b1) W2^T + b2)           GELU MLP (tanh form), no gate
//   logits = LayerNorm(x) wte^T                             tied embeddings
//
// The weights are random (fixed seed), the vocabulary 96 printable ASCII characters. It generates a few
// tokens greedily with the KV cache (the prompt in one pass, then one token per step), prints them, and
// checks itself twice, exiting 1 on a mismatch:
//   1. the logits of every step == a full recompute of the whole sequence in one pass (no cache reuse);
//   2. that full pass == the same model written as naive scalar loops in double (reference_logits).
// Every op writes into a destination view; activations come from one Arena, reset per forward pass.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"
#include "kiln/model/kv_cache.hpp"

using kiln::DenseTensor;
using kiln::Storage;

struct Config {
  std::size_t vocab = 96, ctx = 32, dim = 64, n_heads = 4, n_layers = 2, ffn = 256;
  float eps = 1e-5f;
  std::size_t head_dim() const { return dim / n_heads; }
};

// Linear weights in PyTorch layout: (out_features, in_features).
struct Layer {
  Storage<float, 1> ln1_w, ln1_b;  // (dim)
  Storage<float, 2> w_qkv;         // (3 dim, dim): rows [0, dim) make q, [dim, 2 dim) k, [2 dim, 3 dim) v
  Storage<float, 1> b_qkv;         // (3 dim)
  Storage<float, 2> w_o;           // (dim, dim)
  Storage<float, 1> b_o;           // (dim)
  Storage<float, 1> ln2_w, ln2_b;  // (dim)
  Storage<float, 2> w_up;          // (ffn, dim)
  Storage<float, 1> b_up;          // (ffn)
  Storage<float, 2> w_down;        // (dim, ffn)
  Storage<float, 1> b_down;        // (dim)
};

struct Weights {
  Storage<float, 2> wte;  // (vocab, dim): token embedding, also the output projection (tied)
  Storage<float, 2> wpe;  // (ctx, dim): position embedding
  std::vector<Layer> layers;
  Storage<float, 1> lnf_w, lnf_b;  // (dim): final LayerNorm
};

Weights random_weights(const Config& c, uint32_t seed) {
  std::mt19937 rng(seed);
  auto fill = [&](auto& s, float mean, float sd) {
    std::normal_distribution<float> d(mean, sd);
    for (std::size_t i = 0; i < s.size(); ++i) s.data()[i] = d(rng);
  };
  Weights w{Storage<float, 2>(c.vocab, c.dim),
            Storage<float, 2>(c.ctx, c.dim),
            {},
            Storage<float, 1>(c.dim),
            Storage<float, 1>(c.dim)};
  fill(w.wte, 0, 0.1f), fill(w.wpe, 0, 0.1f), fill(w.lnf_w, 1, 0.1f), fill(w.lnf_b, 0, 0.1f);
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    Layer L{Storage<float, 1>(c.dim),     Storage<float, 1>(c.dim),        Storage<float, 2>(3 * c.dim, c.dim),
            Storage<float, 1>(3 * c.dim), Storage<float, 2>(c.dim, c.dim), Storage<float, 1>(c.dim),
            Storage<float, 1>(c.dim),     Storage<float, 1>(c.dim),        Storage<float, 2>(c.ffn, c.dim),
            Storage<float, 1>(c.ffn),     Storage<float, 2>(c.dim, c.ffn), Storage<float, 1>(c.dim)};
    fill(L.ln1_w, 1, 0.1f), fill(L.ln1_b, 0, 0.1f), fill(L.ln2_w, 1, 0.1f), fill(L.ln2_b, 0, 0.1f);
    fill(L.w_qkv, 0, 0.15f), fill(L.b_qkv, 0, 0.1f), fill(L.w_o, 0, 0.3f), fill(L.b_o, 0, 0.1f);
    fill(L.w_up, 0, 0.15f), fill(L.b_up, 0, 0.1f), fill(L.w_down, 0, 0.2f), fill(L.b_down, 0, 0.1f);
    w.layers.push_back(std::move(L));
  }
  return w;
}

// b (n) seen as (rows, n) with row stride 0: adding a bias to every row is one kiln::add.
kiln::StridedTensor<const float, 2> broadcast(const Storage<float, 1>& b, std::size_t rows) {
  return kiln::make_strided<const float, 2>(b.data(), {rows, b.size()}, {0, 1});
}

// logits (n, vocab) for tokens ids (n) at positions [past, past + n); appends their keys and values to
// the cache, whose first `past` positions must hold the earlier tokens'.
void forward(const Config& c, const Weights& w, kiln::KVCache& cache, std::span<const int32_t> ids, std::size_t past,
             DenseTensor<float, 2> logits, kiln::Arena& arena, kiln::ThreadPool* pool) {
  using kiln::slice;
  const std::size_t n = ids.size(), hd = c.head_dim(), kv_len = past + n;
  arena.reset();
  auto x = arena.alloc<float>(n, c.dim);        // (n, dim) the residual stream
  auto h = arena.alloc<float>(n, c.dim);        // (n, dim) normed input / projection output
  auto qkv = arena.alloc<float>(n, 3 * c.dim);  // (n, 3 dim) q | k | v
  auto att = arena.alloc<float>(n, c.dim);      // (n, dim) attention output, heads side by side
  auto scores = arena.alloc<float>(n, kv_len);  // (n, kv_len) one head's attention weights
  auto up = arena.alloc<float>(n, c.ffn);       // (n, ffn) MLP hidden

  kiln::embedding(w.wte.view(), kiln::make_tensor(ids.data(), n), x, pool);  // x = wte[ids]
  kiln::add(x, slice<0>(w.wpe.view(), past, kv_len), x, pool);               // x += wpe[past : past + n]

  for (std::size_t l = 0; l < c.n_layers; ++l) {
    const Layer& L = w.layers[l];
    // Attention.
    kiln::layer_norm(x, L.ln1_w.view(), L.ln1_b.view(), h, c.eps, pool);
    kiln::matmul(h, L.w_qkv.view(), qkv, pool);  // (n, dim) x (3 dim, dim)^T
    kiln::add(qkv, broadcast(L.b_qkv, n), qkv, pool);
    cache.store(l, past, n, &qkv(0, c.dim), 3 * c.dim, &qkv(0, 2 * c.dim), 3 * c.dim);
    for (std::size_t hh = 0; hh < c.n_heads; ++hh) {
      const auto q = slice<1>(qkv, hh * hd, (hh + 1) * hd);  // (n, hd), rows 3 dim apart
      const auto k = cache.keys(l, hh, kv_len);              // (kv_len, hd)
      const auto vt = cache.values_t(l, hh, kv_len);         // (hd, kv_len): V transposed (column-major)
      kiln::matmul(q, k, scores, pool);                      // scores = q k^T
      kiln::softmax(scores, scores,
                    {.scale = 1.0f / std::sqrt(float(hd)), .causal = true, .causal_offset = std::ptrdiff_t(past)},
                    pool);
      kiln::matmul(scores, vt, slice<1>(att, hh * hd, (hh + 1) * hd), pool);  // att[:, head] = scores V
    }
    kiln::matmul(att, L.w_o.view(), h, pool);  // (n, dim) x (dim, dim)^T
    kiln::add(h, broadcast(L.b_o, n), h, pool);
    kiln::add(x, h, x, pool);
    // MLP.
    kiln::layer_norm(x, L.ln2_w.view(), L.ln2_b.view(), h, c.eps, pool);
    kiln::matmul(h, L.w_up.view(), up, pool);  // (n, dim) x (ffn, dim)^T
    kiln::add(up, broadcast(L.b_up, n), up, pool);
    kiln::gelu_tanh(up, up, pool);
    kiln::matmul(up, L.w_down.view(), h, pool);  // (n, ffn) x (dim, ffn)^T
    kiln::add(h, broadcast(L.b_down, n), h, pool);
    kiln::add(x, h, x, pool);
  }
  kiln::layer_norm(x, w.lnf_w.view(), w.lnf_b.view(), h, c.eps, pool);
  kiln::matmul(h, w.wte.view(), logits, pool);  // (n, dim) x (vocab, dim)^T: tied
}

// The same model as plain loops in double, for all positions at once: logits (n, vocab), row-major.
std::vector<double> reference_logits(const Config& c, const Weights& w, const std::vector<int32_t>& ids) {
  const std::size_t n = ids.size(), d = c.dim, hd = c.head_dim();
  auto linear = [](const std::vector<double>& in, std::size_t rows, std::size_t k, const Storage<float, 2>& W,
                   const Storage<float, 1>* b) {
    const std::size_t m = W.extent(0);
    std::vector<double> out(rows * m);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < m; ++j) {
        double s = b ? b->data()[j] : 0.0;
        for (std::size_t i = 0; i < k; ++i) s += in[r * k + i] * W.data()[j * k + i];
        out[r * m + j] = s;
      }
    return out;
  };
  auto layer_norm = [&](const std::vector<double>& in, const Storage<float, 1>& g, const Storage<float, 1>& b) {
    std::vector<double> out(in.size());
    for (std::size_t r = 0; r < n; ++r) {
      double mean = 0, var = 0;
      for (std::size_t i = 0; i < d; ++i) mean += in[r * d + i] / double(d);
      for (std::size_t i = 0; i < d; ++i) var += (in[r * d + i] - mean) * (in[r * d + i] - mean) / double(d);
      for (std::size_t i = 0; i < d; ++i)
        out[r * d + i] = (in[r * d + i] - mean) / std::sqrt(var + c.eps) * g.data()[i] + b.data()[i];
    }
    return out;
  };
  std::vector<double> x(n * d);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t i = 0; i < d; ++i) x[t * d + i] = double(w.wte.data()[ids[t] * d + i]) + w.wpe.data()[t * d + i];
  for (const Layer& L : w.layers) {
    const auto qkv = linear(layer_norm(x, L.ln1_w, L.ln1_b), n, d, L.w_qkv, &L.b_qkv);  // (n, 3d)
    std::vector<double> att(n * d, 0.0);
    for (std::size_t hh = 0; hh < c.n_heads; ++hh)
      for (std::size_t t = 0; t < n; ++t) {
        std::vector<double> p(t + 1);  // causal: positions 0..t
        double mx = -1e300, sum = 0;
        for (std::size_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (std::size_t i = 0; i < hd; ++i) dot += qkv[t * 3 * d + hh * hd + i] * qkv[s * 3 * d + d + hh * hd + i];
          mx = std::max(mx, p[s] = dot / std::sqrt(double(hd)));
        }
        for (auto& v : p) sum += (v = std::exp(v - mx));
        for (std::size_t s = 0; s <= t; ++s)
          for (std::size_t i = 0; i < hd; ++i)
            att[t * d + hh * hd + i] += p[s] / sum * qkv[s * 3 * d + 2 * d + hh * hd + i];
      }
    const auto o = linear(att, n, d, L.w_o, &L.b_o);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    auto hidden = linear(layer_norm(x, L.ln2_w, L.ln2_b), n, d, L.w_up, &L.b_up);  // (n, ffn)
    for (auto& v : hidden) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
    const auto m = linear(hidden, n, c.ffn, L.w_down, &L.b_down);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += m[i];
  }
  return linear(layer_norm(x, w.lnf_w, w.lnf_b), n, d, w.wte, nullptr);
}

// max |a - b| over n values, relative to max(1, max |b|).
double rel_diff(const float* a, const double* b, std::size_t n) {
  double err = 0, scale = 1;
  for (std::size_t i = 0; i < n; ++i)
    err = std::max(err, std::fabs(a[i] - b[i])), scale = std::max(scale, std::fabs(b[i]));
  return err / scale;
}

int main() {
  const Config c;
  const Weights w = random_weights(c, 1234);
  kiln::ThreadPool pool(2);
  kiln::Arena arena(1 << 20);
  auto tok = [](char ch) { return int32_t(ch - 32); };  // printable ASCII: id = character - 32
  const std::string prompt = "kiln";
  const std::size_t n_gen = 12;

  // Generate: the prompt in one pass, then one token per step through the KV cache.
  std::vector<int32_t> ids;
  for (char ch : prompt) ids.push_back(tok(ch));
  kiln::KVCache cache(c.n_layers, c.n_heads, c.head_dim(), c.ctx);
  Storage<float, 2> step_logits(c.ctx, c.vocab);  // (ctx, vocab): the logits each pass returned
  forward(c, w, cache, ids, 0, kiln::slice<0>(step_logits.view(), 0, ids.size()), arena, &pool);
  for (std::size_t i = 0; i < n_gen; ++i) {
    const float* last = &step_logits.view()(ids.size() - 1, 0);
    ids.push_back(int32_t(std::max_element(last, last + c.vocab) - last));  // greedy
    if (i + 1 == n_gen) break;
    const std::size_t pos = ids.size() - 1;  // the new token's position; the cache holds 0..pos-1
    forward(c, w, cache, std::span(ids).last(1), pos, kiln::slice<0>(step_logits.view(), pos, pos + 1), arena, &pool);
  }
  std::string text;
  for (int32_t id : ids) text += char(id + 32);
  std::printf("custom_arch: GPT-2-style, %zu layers, dim %zu, %zu heads, vocab %zu (random weights, seed 1234)\n",
              c.n_layers, c.dim, c.n_heads, c.vocab);
  std::printf("custom_arch: prompt \"%s\" -> greedy \"%s\"\n", prompt.c_str(), text.substr(prompt.size()).c_str());

  // Check 1: the same sequence (minus the last token) in one pass with an empty cache.
  const std::size_t n = ids.size() - 1;
  kiln::KVCache fresh(c.n_layers, c.n_heads, c.head_dim(), c.ctx);
  Storage<float, 2> full(n, c.vocab);  // (n, vocab)
  forward(c, w, fresh, std::span(ids).first(n), 0, full.view(), arena, &pool);
  const auto ref = reference_logits(c, w, std::vector<int32_t>(ids.begin(), ids.begin() + long(n)));  // (n, vocab)
  double worst_cache = 0, worst_ref = 0;
  for (std::size_t t = 0; t < n; ++t) {  // every row the generation passes computed
    std::vector<double> row(full.data() + t * c.vocab, full.data() + (t + 1) * c.vocab);
    worst_cache = std::max(worst_cache, rel_diff(step_logits.data() + t * c.vocab, row.data(), c.vocab));
  }
  // Check 2: every position of the full pass against the scalar double reference.
  worst_ref = rel_diff(full.data(), ref.data(), n * c.vocab);
  // f32 kernels (FMA, other summation orders, vectorised exp/tanh) against double: ~1e-6 relative here;
  // 1e-4 leaves room for other SIMD targets, while mistakes land above it (measured: the erf GELU instead
  // of the tanh one 2e-4, a causal mask without the cache offset 1.1).
  const double tol = 1e-4;
  std::printf(
      "custom_arch: cached decode vs full recompute: %.2e; full pass vs scalar double reference: %.2e "
      "(relative, tolerance %.0e)\n",
      worst_cache, worst_ref, tol);
  if (!(worst_cache <= tol && worst_ref <= tol)) {
    std::printf("custom_arch: MISMATCH\n");
    return 1;
  }
  std::printf("custom_arch: OK\n");
  return 0;
}
