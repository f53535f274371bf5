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
// Dispatch: the tokens of a pass are grouped by expert (a counting sort of the n * k choices); the experts
// chosen by at least one token go in chunks of consecutive ids (all of a decode step's, about k chunks of a
// prompt's), and each chunk gathers its tokens' rows of h, multiplies them by every expert's gate and up in
// one grouped product and by down in another (detail::moe_grouped_qmm: the same integer kernels as a dense
// MLP, the work items (expert, 16 weight rows) shared over the threads by cost; other types and precisions
// expert by expert through linear_multi and linear), and adds its rows back weighted. So a decode step (n = 1,
// or one token of each of several sequences) reads only the chosen experts' weights, a prompt reads each
// chosen expert's weights once per batch, and no thread waits on a serial step or on another's large expert.
// Experts are views: GGUF's stacked (n_expert, rows, cols) tensors give each expert a contiguous slice of
// whole rows, whatever the block type; Hugging Face checkpoints one tensor per expert.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/model/config.hpp"
#include "kiln/model/weights.hpp"
#include "kiln/ops/activation.hpp"
#include "kiln/ops/linear.hpp"

namespace kiln {

namespace detail {
/// Gathered rows the MoE dispatch holds at once (MoEScratch::xe): a pass's n * k (token, expert) rows up to
/// this many, so a decode step or a small batch multiplies all its experts in one fork/join per product; from
/// there on n rows (a prompt: the experts in about k chunks, so the scratch stays the dense MLP's size).
inline constexpr std::size_t kMoEAllRows = 64;
inline std::size_t moe_rows(std::size_t n, std::size_t k) { return std::max(n, std::min(n * k, kMoEAllRows)); }
}  // namespace detail

/// The arena views one pass's MoE layers work in (all empty for a dense model).
struct MoEScratch {
  DenseTensor<float, 2> logits;   // (n, n_expert): the router's logits, then probabilities
  DenseTensor<int32_t, 2> sel;    // (n, k): each token's experts, largest weight first
  DenseTensor<float, 2> weight;   // (n, k): their weights
  DenseTensor<int32_t, 1> start;  // (n_expert + 1): expert e's entries are [start[e], start[e + 1]) of:
  DenseTensor<int32_t, 1> entry;  // (n * k): token * k + slot, grouped by expert
  DenseTensor<float, 2> xe, ye;   // (detail::moe_rows, dim): a chunk of experts' gathered rows of h, their output rows
  DenseTensor<float, 2> eg, eu;   // (moe_rows, ffn_dim) where moe_rows > n (else the dense MLP's gate and up serve)
  DenseTensor<float, 2> sg, su;   // (n, shexp_ffn_dim): the shared expert's gate and up
  DenseTensor<float, 2> sw;       // (n, 1): the shared expert's gate logit, then weight
};

/// The scratch views of a pass of n tokens, from an Arena (or detail::ArenaCounter, to size one).
template <class A>
MoEScratch moe_scratch(A& arena, std::size_t n, const HParams& hp) {
  const std::size_t e = hp.n_expert, k = e ? hp.n_expert_used : 0, d = e ? hp.dim : 0;
  const std::size_t sf = e ? hp.shexp_ffn_dim : 0, rows = e ? detail::moe_rows(n, k) : 0;
  const std::size_t erows = rows > n ? rows : 0, f = e ? hp.ffn_dim : 0;
  return MoEScratch{.logits = arena.template alloc<float>(n, e),
                    .sel = arena.template alloc<int32_t>(n, k),
                    .weight = arena.template alloc<float>(n, k),
                    .start = arena.template alloc<int32_t>(e ? e + 1 : 0),
                    .entry = arena.template alloc<int32_t>(n * k),
                    .xe = arena.template alloc<float>(rows, d),
                    .ye = arena.template alloc<float>(rows, d),
                    .eg = arena.template alloc<float>(erows, f),
                    .eu = arena.template alloc<float>(erows, f),
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
/// g = swiglu_oai(g, u) on rows x n (row strides lg, lu): gpt-oss's clamped SwiGLU (HParams::swiglu_limit),
/// g' = min(g, limit), u' = clamp(u, -limit, limit), g' sigmoid(alpha g') (u' + 1), as transformers'
/// GptOssExperts and llama.cpp's ggml_swiglu_oai (a NaN stays NaN). The SIMD kernel's sigmoid is the one of
/// silu (ops/activation.hpp: 2.8e-7 relative).
inline void swiglu_oai(float* g, std::ptrdiff_t lg, const float* u, std::ptrdiff_t lu, std::size_t rows, std::size_t n,
                       float alpha, float limit) {
  dispatch::swiglu_oai_f32(g, lg, u, lu, g, lg, rows, n, alpha, limit);
}

/// One expert's products in a grouped call (moe_grouped_qmm): rows [r0, r0 + m) of the chunk's x, times one
/// or two weights (gate and up, or down) into their outputs (each QmmOutput's y at the group's first row).
struct MoEGroup {
  std::size_t r0 = 0, m = 0;
  QmmOutput out[2];
  std::size_t n_out = 0;
};

/// The integer products of a chunk of experts in one fork/join. x (rows, k; row stride ldx) is quantized once
/// in the activation layout of `type` (every group's weights share it; split: two 8-bit parts), then units of
/// 16 weight rows of every group's outputs are shared out over the threads by cost: a unit costs its group's
/// quantized rows plus a fixed share for decoding the weight panel, so an expert with 30 rows is not one
/// thread's while another thread has one with 3 (more tasks than threads, claimed as threads come free).
/// Each output is what qmatmul_multi_run computes for its group's rows alone: the same path (GEMV or GEMM,
/// from the group's own quantized row count and its W's layout), and the kernels compute every element alike
/// whatever range of rows of W a call covers, so neither the grouping nor the thread count moves a bit.
inline void moe_grouped_qmm(const float* x, std::ptrdiff_t ldx, std::size_t rows, std::size_t k, uint32_t type,
                            std::span<const MoEGroup> groups, bool split, ThreadPool* pool) {
  if (groups.empty() || rows == 0) return;
  const QActLayout lay = qact_layout(type, k);
  const std::size_t rb = lay.row_bytes, threads = pool ? pool->size() : 1;
  auto* act = static_cast<std::byte*>(qmm_scratch(0, (split ? 2 * rows : rows) * rb));
  auto quantize = [&](std::size_t r0, std::size_t r1) {
    const float* xr = x + std::ptrdiff_t(r0) * ldx;
    if (split)
      dispatch::qmatmul_quantize_split(type, xr, ldx, r1 - r0, k, act + 2 * r0 * rb, act + (2 * r0 + 1) * rb, 2 * rb);
    else dispatch::qmatmul_quantize(type, xr, ldx, r1 - r0, k, act + r0 * rb);
  };
  if (threads > 1 && rows >= 32) {
    pool->parallel_for(threads, [&](std::size_t t, std::size_t) {
      const auto [r0, r1] = split_range(rows, threads, t);
      if (r0 < r1) quantize(r0, r1);
    });
  } else {
    quantize(0, rows);
  }
  constexpr std::size_t kNGrain = 16, kPanelCost = 16;  // GEMM panel rows; a panel's decode, in rows of x
  const std::size_t gemv_rows[2] = {dispatch::qmatmul_gemv_max_rows(false), dispatch::qmatmul_gemv_max_rows(true)};
  auto qrows = [&](const MoEGroup& g) { return split ? 2 * g.m : g.m; };
  uint64_t total = 0;
  double ops = 0;
  std::size_t units = 0;
  for (const MoEGroup& g : groups)
    for (std::size_t i = 0; i < g.n_out; ++i) {
      const std::size_t u = (g.out[i].n + kNGrain - 1) / kNGrain;
      units += u;
      total += uint64_t(u) * (qrows(g) + kPanelCost);
      ops += 2.0 * double(qrows(g)) * double(g.out[i].n) * double(k);
    }
  // Units [u0, u1) of output i of group g.
  auto run = [&](const MoEGroup& g, std::size_t i, std::size_t u0, std::size_t u1) {
    const QmmOutput& o = g.out[i];
    const std::size_t n0 = u0 * kNGrain, n1 = std::min(o.n, u1 * kNGrain), qm = qrows(g);
    dispatch::qmatmul_rows(o.type, act + (split ? 2 * g.r0 : g.r0) * rb, qm, k, o.w + std::ptrdiff_t(n0) * o.ldw, o.ldw,
                           n1 - n0, o.y + std::ptrdiff_t(n0), o.ldy,
                           (qm > gemv_rows[o.interleaved] ? kQmmGemm : 0u) | (split ? kQmmPairs : 0u) |
                               (o.interleaved ? kQmmInterleaved : 0u));
  };
  constexpr double kMinOpsPerThread = 1 << 19;  // as qmatmul_multi_run
  const std::size_t tasks = std::min({threads * 4, units, std::size_t(ops / kMinOpsPerThread) + 1});
  if (tasks <= 1 || threads == 1) {
    for (const MoEGroup& g : groups)
      for (std::size_t i = 0; i < g.n_out; ++i) run(g, i, 0, (g.out[i].n + kNGrain - 1) / kNGrain);
    return;
  }
  // Task t: the units whose cost starts in [total t / tasks, total (t + 1) / tasks).
  pool->parallel_for(tasks, [&](std::size_t t, std::size_t) {
    const uint64_t c0 = total * t / tasks, c1 = total * (t + 1) / tasks;
    uint64_t cs = 0;  // cost before the current output
    for (const MoEGroup& g : groups) {
      const uint64_t uc = qrows(g) + kPanelCost;
      for (std::size_t i = 0; i < g.n_out && cs < c1; ++i) {
        const uint64_t u = (g.out[i].n + kNGrain - 1) / kNGrain;
        auto first_at = [&](uint64_t c) { return c <= cs ? uint64_t(0) : std::min(u, (c - cs + uc - 1) / uc); };
        const uint64_t u0 = first_at(c0), u1 = first_at(c1);
        if (u0 < u1) run(g, i, std::size_t(u0), std::size_t(u1));
        cs += u * uc;
      }
      if (cs >= c1) break;
    }
  });
}

/// Reused per thread: a chunk's groups (up to n_expert), so steady-state passes do not allocate.
inline std::vector<MoEGroup>& moe_groups() {
  thread_local std::vector<MoEGroup> g;
  return g;
}
}  // namespace detail

/// out (n, dim) = the MoE MLP of h (n, dim) with layer L's router and experts; gate and up (n >= rows,
/// ffn_dim) are the dense MLP's activations, which hold a chunk's rows when the scratch has no rows of its own
/// (MoEScratch::eg). trace, when not null, gets each token's chosen experts appended (k ids per token,
/// largest choosing score first).
///
/// The experts go in chunks of consecutive ids whose rows fit MoEScratch::xe (detail::moe_rows: all of a decode
/// step's, about 1/k of a prompt's), each in five steps over the pool: gather the rows of h; gate and up of
/// every expert of the chunk in one grouped product (detail::moe_grouped_qmm; types or precisions without the
/// integer path, expert by expert through linear_multi); biases and the activation over all rows; down, grouped
/// likewise; each output column range adding its rows' weighted results, expert by expert in id order. Every
/// value is computed as for one expert alone on one thread, so the thread count does not change a bit.
template <class H, class O, class G>
void moe_ffn(const H& h, const LayerWeights& L, const O& out, const MoEScratch& s, const G& gate, const G& up,
             const HParams& hp, Activation act, ThreadPool* pool, Precision precision, std::vector<int32_t>* trace) {
  const std::size_t n = h.extent(0), E = hp.n_expert, k = hp.n_expert_used, d = hp.dim, F = hp.ffn_dim;
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
  detail::for_rows(n, d, pool, [&](std::size_t t0, std::size_t t1) {
    for (std::size_t t = t0; t < t1; ++t) std::fill_n(&out(t, 0), d, 0.0f);
  });
  // A chunk's gate and up rows: the scratch's own (decode, small batches) or the dense MLP's.
  const bool own = s.eg.extent(0) > 0;
  float* const gp = own ? s.eg.data() : &gate(0, 0);
  float* const upp = own ? s.eu.data() : &up(0, 0);
  const std::ptrdiff_t lg = own ? std::ptrdiff_t(F) : gate.stride(0), lu = own ? std::ptrdiff_t(F) : up.stride(0);
  const std::size_t cap = s.xe.extent(0), threads = pool ? pool->size() : 1;
  const bool split = precision == Precision::fast;
  auto& groups = detail::moe_groups();
  const char* op = split ? "qmatmul_split_act" : "qmatmul";
  // Whether expert rows x (m rows) times w go through the grouped integer product with activation layout `type`.
  auto grouped = [&](const auto& x, const WeightRef& w, uint32_t& type) {
    const auto t = static_cast<uint32_t>(w.type);
    if (detail::linear_path(x, t, precision) != detail::LinearPath::int8) return false;
    if (type == UINT32_MAX) type = t;
    return detail::qmm_same_layout(type, t);
  };
  auto qw = [](const WeightRef& w) {
    return kernels::QmmWeight{static_cast<uint32_t>(w.type), w.data, w.rows, w.row_bytes, w.packed};
  };
  for (std::size_t e0 = 0; e0 < E;) {
    std::size_t e1 = e0, rows = 0;  // the chunk: experts [e0, e1), each at most n <= cap rows
    for (; e1 < E && rows + std::size_t(start[e1 + 1] - start[e1]) <= cap; ++e1)
      rows += std::size_t(start[e1 + 1] - start[e1]);
    const std::size_t b0 = std::size_t(start[e0]);
    auto r0_of = [&](std::size_t e) { return std::size_t(start[e]) - b0; };
    auto cnt = [&](std::size_t e) { return std::size_t(start[e + 1] - start[e]); };
    auto grows = [&](std::size_t e) {
      return make_strided<float, 2>(gp + std::ptrdiff_t(r0_of(e)) * lg, {cnt(e), F}, {lg, 1});
    };
    auto urows = [&](std::size_t e) {
      return make_strided<float, 2>(upp + std::ptrdiff_t(r0_of(e)) * lu, {cnt(e), F}, {lu, 1});
    };
    auto xrows = [&](std::size_t e) { return slice<0>(s.xe, r0_of(e), r0_of(e) + cnt(e)); };
    auto yrows = [&](std::size_t e) { return slice<0>(s.ye, r0_of(e), r0_of(e) + cnt(e)); };
    if (rows) {
      detail::for_rows(rows, d, pool, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i) std::copy_n(&h(std::size_t(s.entry(b0 + i)) / k, 0), d, &s.xe(i, 0));
      });
      // gate and up
      groups.clear();
      uint32_t type = UINT32_MAX;
      for (std::size_t e = e0; e < e1; ++e) {
        if (!cnt(e)) continue;
        const auto x = xrows(e);
        const auto g = grows(e), u = urows(e);
        if (grouped(x, L.exp_gate[e], type) && grouped(x, L.exp_up[e], type)) {
          detail::MoEGroup grp;
          grp.r0 = r0_of(e);
          grp.m = cnt(e);
          grp.n_out = 2;
          grp.out[0] = detail::qmm_output(op, x, qw(L.exp_gate[e]), g);
          grp.out[1] = detail::qmm_output(op, x, qw(L.exp_up[e]), u);
          groups.push_back(grp);
        } else {
          linear_multi(x, {&L.exp_gate[e], &L.exp_up[e]}, {g, u}, pool, precision);
        }
      }
      detail::moe_grouped_qmm(s.xe.data(), std::ptrdiff_t(d), rows, d, type, groups, split, pool);
      // biases and the activation
      detail::for_rows(rows, F, pool, [&](std::size_t i0, std::size_t i1) {
        if (!L.exp_gate_b.empty())
          for (std::size_t e = e0; e < e1; ++e)
            for (std::size_t i = std::max(i0, r0_of(e)); i < std::min(i1, r0_of(e) + cnt(e)); ++i) {
              float* gr = gp + std::ptrdiff_t(i) * lg;
              float* ur = upp + std::ptrdiff_t(i) * lu;
              for (std::size_t j = 0; j < L.exp_gate_b[e].n; ++j) gr[j] += L.exp_gate_b[e].data[j];
              for (std::size_t j = 0; j < L.exp_up_b[e].n; ++j) ur[j] += L.exp_up_b[e].data[j];
            }
        float* g = gp + std::ptrdiff_t(i0) * lg;
        const float* u = upp + std::ptrdiff_t(i0) * lu;
        if (hp.swiglu_limit > 0) detail::swiglu_oai(g, lg, u, lu, i1 - i0, F, hp.swiglu_alpha, hp.swiglu_limit);
        else dispatch::activation_f32(act, g, lg, u, lu, g, lg, i1 - i0, F);
      });
      // down
      groups.clear();
      type = UINT32_MAX;
      for (std::size_t e = e0; e < e1; ++e) {
        if (!cnt(e)) continue;
        const auto g = grows(e);
        const auto y = yrows(e);
        if (grouped(g, L.exp_down[e], type)) {
          detail::MoEGroup grp;
          grp.r0 = r0_of(e);
          grp.m = cnt(e);
          grp.n_out = 1;
          grp.out[0] = detail::qmm_output(op, g, qw(L.exp_down[e]), y);
          groups.push_back(grp);
        } else {
          linear(g, L.exp_down[e], y, pool, precision);
        }
      }
      detail::moe_grouped_qmm(gp, lg, rows, F, type, groups, split, pool);
      // each token's weighted results, expert by expert in id order, over column ranges of out
      const std::size_t tasks = threads > 1 && rows * d >= (std::size_t(1) << 15) ? threads : 1;
      auto scatter = [&](std::size_t t, std::size_t) {
        const auto [j0, j1] = split_range(d, tasks, t, 16);
        for (std::size_t e = e0; e < e1; ++e) {
          const float* bd = L.exp_down_b.empty() ? nullptr : L.exp_down_b[e].data;
          const std::size_t jb = bd ? std::min(j1, L.exp_down_b[e].n) : j0;  // the bias covers [j0, jb)
          for (std::size_t i = r0_of(e); i < r0_of(e) + cnt(e); ++i) {
            const std::size_t entry = std::size_t(s.entry(b0 + i)), tok = entry / k;
            const float w = s.weight.data()[entry];
            float* o = &out(tok, 0);
            float* yi = &s.ye(i, 0);
            for (std::size_t j = j0; j < jb; ++j) yi[j] += bd[j];
            for (std::size_t j = j0; j < j1; ++j) o[j] += w * yi[j];
          }
        }
      };
      if (tasks > 1) pool->parallel_for(tasks, scatter);
      else scatter(0, 0);
    }
    e0 = e1;
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
