// kiln/model/moe.hpp - mixture-of-experts MLPs: the router and the expert dispatch.
//
// A layer whose HParams::n_expert > 0 replaces the dense MLP by n_expert SwiGLU experts and a router
// (LayerWeights::ffn_gate_inp, (n_expert, dim)). For each token t (the normed residual h_t):
//   p = softmax(h_t Wr^T)                           over the n_expert experts, in f32, or with
//                                                   ExpertGating::sigmoid each expert's sigmoid (MiniMax-M2)
//   E_t = the n_expert_used largest p [+ b] (b: LayerWeights::exp_probs_b, the correction bias that only
//         chooses; ties: the lower expert id), w_e = p_e, divided by the sum of the chosen p when
//         HParams::expert_weights_norm (Mixtral, MiniMax-M2; Qwen3-MoE's norm_topk_prob)
//   m_t = sum over e in E_t of w_e * (act(h_t Wg_e^T) * (h_t Wu_e^T)) Wd_e^T
//         (gpt-oss: a router bias added to h_t Wr^T, biases after each expert product, and OpenAI's clamped
//         SwiGLU, HParams::swiglu_limit > 0, for act(g) * u)
//   [m_t += sigmoid(h_t . w_s) * (act(h_t Ws_g^T) * (h_t Ws_u^T)) Ws_d^T]  with a shared expert
//         (HParams::shexp_ffn_dim > 0: LayerWeights::shexp_*), which every token uses
// which is transformers' Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock / OlmoeSparseMoeBlock /
// Qwen2MoeSparseMoeBlock and llama.cpp's build_moe_ffn with softmax gating (plus qwen2moe's shared expert).
//
// Dispatch: the tokens of a pass are grouped by expert (a counting sort of the n * k choices); each
// expert chosen by at least one token gathers its tokens' rows of h, multiplies them by its weights
// (linear_multi for gate and up, linear for down: the same kernels, quantized or not, as a dense MLP) and
// adds its rows back weighted. So a decode step (n = 1, or one token of each of several sequences) reads
// only the chosen experts' weights, and a prompt reads each chosen expert's weights once per batch.
// Experts are views: GGUF's stacked (n_expert, rows, cols) tensors give each expert a contiguous slice of
// whole rows, whatever the block type; Hugging Face checkpoints one tensor per expert.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/model/config.hpp"
#include "kiln/model/weights.hpp"
#include "kiln/ops/activation.hpp"

namespace kiln {

/// The arena views one pass's MoE layers work in (all empty for a dense model).
struct MoEScratch {
  DenseTensor<float, 2> logits;   // (n, n_expert): the router's logits, then probabilities
  DenseTensor<int32_t, 2> sel;    // (n, k): each token's experts, largest weight first
  DenseTensor<float, 2> weight;   // (n, k): their weights
  DenseTensor<int32_t, 1> start;  // (n_expert + 1): expert e's entries are [start[e], start[e + 1]) of:
  DenseTensor<int32_t, 1> entry;  // (n * k): token * k + slot, grouped by expert
  DenseTensor<float, 2> xe, ye;   // (n, dim): one expert's gathered rows of h, and its output rows
  DenseTensor<float, 2> sg, su;   // (n, shexp_ffn_dim): the shared expert's gate and up
  DenseTensor<float, 2> sw;       // (n, 1): the shared expert's gate logit, then weight
};

/// The scratch views of a pass of n tokens, from an Arena (or detail::ArenaCounter, to size one).
template <class A>
MoEScratch moe_scratch(A& arena, std::size_t n, const HParams& hp) {
  const std::size_t e = hp.n_expert, k = e ? hp.n_expert_used : 0, d = e ? hp.dim : 0;
  const std::size_t sf = e ? hp.shexp_ffn_dim : 0;
  return MoEScratch{.logits = arena.template alloc<float>(n, e),
                    .sel = arena.template alloc<int32_t>(n, k),
                    .weight = arena.template alloc<float>(n, k),
                    .start = arena.template alloc<int32_t>(e ? e + 1 : 0),
                    .entry = arena.template alloc<int32_t>(n * k),
                    .xe = arena.template alloc<float>(n, d),
                    .ye = arena.template alloc<float>(n, d),
                    .sg = arena.template alloc<float>(n, sf),
                    .su = arena.template alloc<float>(n, sf),
                    .sw = arena.template alloc<float>(n, sf ? 1 : 0)};
}

/// The router's choice for rows [0, n) of s.logits (the router's logits in, weights out): s.sel and
/// s.weight (see the top of this file), each token's experts by their choosing score (p [+ b]), largest first.
inline void moe_route(const MoEScratch& s, std::size_t n, const HParams& hp, const VecRef& bias = {}) {
  const std::size_t E = hp.n_expert, k = hp.n_expert_used;
  const float* b = bias ? bias.data : nullptr;
  for (std::size_t t = 0; t < n; ++t) {
    float* p = &s.logits(t, 0);
    if (hp.expert_gating == ExpertGating::sigmoid) {
      for (std::size_t e = 0; e < E; ++e) p[e] = 1.0f / (1.0f + std::exp(-p[e]));
    } else {
      const float mx = *std::max_element(p, p + E);
      float sum = 0;
      for (std::size_t e = 0; e < E; ++e) sum += (p[e] = std::exp(p[e] - mx));
      for (std::size_t e = 0; e < E; ++e) p[e] /= sum;
    }
    auto score = [&](std::size_t e) { return b ? p[e] + b[e] : p[e]; };
    // top k by selection: k is small (2, 8), E up to a few hundred
    float chosen = 0;
    for (std::size_t j = 0; j < k; ++j) {
      std::size_t best = E;
      for (std::size_t e = 0; e < E; ++e) {
        bool taken = false;
        for (std::size_t i = 0; i < j; ++i) taken = taken || s.sel(t, i) == int32_t(e);
        if (!taken && (best == E || score(e) > score(best))) best = e;
      }
      s.sel(t, j) = int32_t(best);
      s.weight(t, j) = p[best];
      chosen += p[best];
    }
    if (hp.expert_weights_norm)
      for (std::size_t j = 0; j < k; ++j) s.weight(t, j) /= chosen;
  }
}

namespace detail {
/// g = act(g) * u, the activation of the Config (SwiGLU for every MoE architecture kiln runs).
template <class G>
void moe_gated_act(const G& g, const G& u, Activation act, ThreadPool* pool) {
  if (act == Activation::silu) swiglu(g, u, g, pool);
  else if (act == Activation::gelu_tanh) geglu(g, u, g, Gelu::tanh, pool);
  else geglu(g, u, g, Gelu::erf, pool);
}
/// g = swiglu_oai(g, u) (gpt-oss; HParams::swiglu_limit): g' = min(g, limit), u' = clamp(u, -limit, limit),
/// g' sigmoid(alpha g') (u' + 1), as transformers' GptOssExperts and llama.cpp's ggml_swiglu_oai (a NaN
/// stays NaN). Scalar: a token's experts have a few thousand values, next to millions of weight products.
template <class G>
void swiglu_oai(const G& g, const G& u, float alpha, float limit) {
  for (std::size_t r = 0; r < g.extent(0); ++r) {
    float* gr = &g(r, 0);
    const float* ur = &u(r, 0);
    for (std::size_t j = 0; j < g.extent(1); ++j) {
      const float x = std::min(gr[j], limit), y = std::clamp(ur[j], -limit, limit);
      gr[j] = x / (1.0f + std::exp(-alpha * x)) * (y + 1.0f);
    }
  }
}
}  // namespace detail

/// out (n, dim) = the MoE MLP of h (n, dim) with layer L's router and experts; gate and up (n >= rows,
/// ffn_dim) are the dense MLP's activations, reused for each expert's rows. trace, when not null, gets
/// each token's chosen experts appended (k ids per token, largest choosing score first).
template <class H, class O, class G>
void moe_ffn(const H& h, const LayerWeights& L, const O& out, const MoEScratch& s, const G& gate, const G& up,
             const HParams& hp, Activation act, ThreadPool* pool, Precision precision, std::vector<int32_t>* trace) {
  const std::size_t n = h.extent(0), E = hp.n_expert, k = hp.n_expert_used, d = hp.dim;
  linear(h, L.ffn_gate_inp, slice<0>(s.logits, 0, n), pool, precision);
  if (L.ffn_gate_inp_b) add_bias(slice<0>(s.logits, 0, n), L.ffn_gate_inp_b);
  moe_route(s, n, hp, L.exp_probs_b);
  if (trace) trace->insert(trace->end(), s.sel.data(), s.sel.data() + n * k);
  // counting sort of the n * k choices by expert
  int32_t* start = s.start.data();
  std::fill(start, start + E + 1, 0);
  for (std::size_t i = 0; i < n * k; ++i) ++start[s.sel.data()[i] + 1];
  for (std::size_t e = 0; e < E; ++e) start[e + 1] += start[e];
  for (std::size_t i = 0; i < n * k; ++i) s.entry(std::size_t(start[s.sel.data()[i]]++)) = int32_t(i);
  for (std::size_t e = E; e > 0; --e) start[e] = start[e - 1];  // back to the groups' starts
  start[0] = 0;
  for (std::size_t t = 0; t < n; ++t) std::fill_n(&out(t, 0), d, 0.0f);
  for (std::size_t e = 0; e < E; ++e) {
    const std::size_t b = std::size_t(start[e]), c = std::size_t(start[e + 1]) - b;
    if (!c) continue;
    for (std::size_t i = 0; i < c; ++i) std::copy_n(&h(std::size_t(s.entry(b + i)) / k, 0), d, &s.xe(i, 0));
    const auto x = slice<0>(s.xe, 0, c), y = slice<0>(s.ye, 0, c);
    const auto g = slice<0>(gate, 0, c), u = slice<0>(up, 0, c);
    linear_multi(x, {&L.exp_gate[e], &L.exp_up[e]}, {g, u}, pool, precision);
    if (!L.exp_gate_b.empty()) {
      add_bias(g, L.exp_gate_b[e]);
      add_bias(u, L.exp_up_b[e]);
    }
    if (hp.swiglu_limit > 0) detail::swiglu_oai(g, u, hp.swiglu_alpha, hp.swiglu_limit);
    else detail::moe_gated_act(g, u, act, pool);
    linear(g, L.exp_down[e], y, pool, precision);
    if (!L.exp_down_b.empty()) add_bias(y, L.exp_down_b[e]);
    for (std::size_t i = 0; i < c; ++i) {
      const std::size_t entry = std::size_t(s.entry(b + i)), t = entry / k;
      const float w = s.weight.data()[entry];
      float* o = &out(t, 0);
      const float* yi = &s.ye(i, 0);
      for (std::size_t j = 0; j < d; ++j) o[j] += w * yi[j];
    }
  }
  if (!hp.shexp_ffn_dim) return;
  // the shared expert, on every row of h
  const auto g = slice<0>(s.sg, 0, n), u = slice<0>(s.su, 0, n), y = slice<0>(s.ye, 0, n), sw = slice<0>(s.sw, 0, n);
  linear_multi(h, {&L.shexp_gate, &L.shexp_up}, {g, u}, pool, precision);
  detail::moe_gated_act(g, u, act, pool);
  linear(g, L.shexp_down, y, pool, precision);
  linear(h, L.shexp_gate_inp, sw, pool, precision);
  for (std::size_t t = 0; t < n; ++t) {
    const float w = 1.0f / (1.0f + std::exp(-sw(t, 0)));
    float* o = &out(t, 0);
    const float* yt = &y(t, 0);
    for (std::size_t j = 0; j < d; ++j) o[j] += w * yt[j];
  }
}

}  // namespace kiln
