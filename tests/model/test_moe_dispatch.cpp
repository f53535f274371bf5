// The mixture-of-experts dispatch (model/moe.hpp) at shapes where its steps split over threads: moe_ffn against
// the expert-by-expert computation it replaces (each expert's rows through linear_multi and linear alone, the
// weighted results added in expert order), bit for bit, at 1, 2 and 3 threads, over MXFP4 and Q4_0 experts,
// with gpt-oss's biases and clamped SwiGLU or plain SwiGLU, at fast, fast8 and exact; gpt-oss's clamped SwiGLU
// kernel against a double reference on every target; and the gpt-oss fixture's logits at 1, 2 and 3 threads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kiln/model/model.hpp"
#include "kiln/quant/convert.hpp"
#include "test_util.hpp"

namespace kiln::test::moe_dispatch_test {

// The clamped SwiGLU's kernel (dispatch::swiglu_oai_f32) against double arithmetic on its f32 inputs: the
// clamps are exact, alpha g' is rounded in f32 as transformers computes it (so the reference takes that f32
// product), then the sigmoid as silu's (ExpNonPos 1 ulp, an add, the reciprocal's estimate and Newton step
// ~1 ulp, a multiply: ~4 ulp, tests/ops/test_activation.cpp), u' + 1 rounded once (0.5 ulp) and one more
// multiply (0.5 ulp): ~5 ulp, so 1e-6 relative; an absolute 1e-30 for the underflowing tail.
TEST_CASE("moe: gpt-oss's clamped SwiGLU kernel matches the double reference on every target, NaN kept") {
  const float alpha = 1.702f, limit = 7.0f, nan = std::numeric_limits<float>::quiet_NaN();
  const std::size_t n = 203;  // not a whole number of vectors: the one-lane tail too
  std::vector<float> g = test::random_floats(n, 5, -12.f, 12.f), u = test::random_floats(n, 6, -12.f, 12.f);
  const float edges[] = {7.0f, -7.0f, 6.9999995f, 7.0000005f, -100.f, 100.f, -1.0f, 0.0f, -0.0f, 1e-30f, -60.f, 1e30f};
  for (std::size_t i = 0; i < std::size(edges); ++i) {
    g[i] = edges[i];
    u[n - 1 - i] = edges[i];
    g[20 + i] = edges[i];
    u[20 + i] = edges[std::size(edges) - 1 - i];
  }
  std::vector<float> want(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float x = std::min(g[i], limit), y = std::clamp(u[i], -limit, limit), a = alpha * x;
    want[i] = float(double(x) / (1.0 + std::exp(-double(a))) * (double(y) + 1.0));
  }
  test::for_each_target([&](const std::string&) {
    std::vector<float> out(n);
    dispatch::swiglu_oai_f32(g.data(), 0, u.data(), 0, out.data(), 0, 1, n, alpha, limit);
    test::check_close(out.data(), want.data(), n, 1e-6f, 1e-30f, "swiglu_oai");
    // in place, as moe_ffn runs it, with a NaN in each input
    std::vector<float> gi = g, ui = u;
    gi[3] = nan;
    ui[4] = nan;
    dispatch::swiglu_oai_f32(gi.data(), 0, ui.data(), 0, gi.data(), 0, 1, n, alpha, limit);
    CHECK(std::isnan(gi[3]));
    CHECK(std::isnan(gi[4]));
    for (std::size_t i = 0; i < n; ++i)
      if (i != 3 && i != 4) CHECK(gi[i] == out[i]);
  });
}

namespace {

/// A layer of n_expert random experts of `type` (MXFP4 or Q4_0), a random f32 router and, with biases, random
/// expert biases; the storage it points into.
struct RandomMoELayer {
  HParams hp;
  LayerWeights L;
  std::vector<float> router, bias;
  std::vector<std::vector<std::byte>> experts;

  RandomMoELayer(io::GGMLType type, std::size_t d, std::size_t f, std::size_t E, std::size_t k, bool oai) {
    hp.dim = d;
    hp.ffn_dim = f;
    hp.n_expert = E;
    hp.n_expert_used = k;
    hp.expert_weights_norm = true;
    if (oai) {
      hp.swiglu_alpha = 1.702f;
      hp.swiglu_limit = 7.0f;
    }
    router = test::random_floats(E * d, 1, -1.f, 1.f);
    L.ffn_gate_inp = WeightRef::f32(router.data(), E, d, "router");
    bias = test::random_floats(E * (2 * f + d), 2, -0.5f, 0.5f);
    auto matrix = [&](std::size_t rows, std::size_t cols, uint32_t seed, const std::string& name) {
      const auto w = test::random_floats(rows * cols, seed, -1.f, 1.f);
      std::vector<std::byte> q;
      std::size_t row_bytes = 0;
      visit_ggml_type(uint32_t(type), [&]<class B>(B*) {
        if constexpr (Quantizable<B>) {
          row_bytes = cols / dtype_traits<B>::block_size * sizeof(B);
          q.resize(rows * row_bytes);
          quantize_row(w.data(), reinterpret_cast<B*>(q.data()), rows * cols);
        }
      });
      REQUIRE(row_bytes);
      experts.push_back(std::move(q));
      return WeightRef{experts.back().data(), type, rows, cols, row_bytes, name};
    };
    experts.reserve(3 * E);
    for (std::size_t e = 0; e < E; ++e) {
      L.exp_gate.push_back(matrix(f, d, uint32_t(10 + 3 * e), "gate" + std::to_string(e)));
      L.exp_up.push_back(matrix(f, d, uint32_t(11 + 3 * e), "up" + std::to_string(e)));
      L.exp_down.push_back(matrix(d, f, uint32_t(12 + 3 * e), "down" + std::to_string(e)));
      if (oai) {
        const float* b = bias.data() + e * (2 * f + d);
        L.exp_gate_b.push_back({b, f});
        L.exp_up_b.push_back({b + f, f});
        L.exp_down_b.push_back({b + 2 * f, d});
      }
    }
  }
};

/// moe_ffn of h (n, dim) on `threads` threads.
std::vector<float> run_moe(const RandomMoELayer& m, const std::vector<float>& h, std::size_t n, std::size_t threads,
                           Precision precision) {
  const HParams& hp = m.hp;
  detail::ArenaCounter count;
  (void)moe_scratch(count, n, hp);
  Arena arena(count.bytes + 2 * Arena::bytes_for<float>(n * hp.ffn_dim) + 4096);
  const MoEScratch s = moe_scratch(arena, n, hp);
  const auto gate = arena.alloc<float>(n, hp.ffn_dim), up = arena.alloc<float>(n, hp.ffn_dim);
  std::vector<float> out(n * hp.dim, -1.0f);
  ThreadPool pool(threads);
  moe_ffn(make_tensor(h.data(), n, hp.dim), m.L, make_tensor(out.data(), n, hp.dim), s, gate, up, hp, Activation::silu,
          &pool, precision, nullptr);
  return out;
}

/// The expert-by-expert computation: each expert's rows of h gathered, linear_multi (gate, up) and linear
/// (down) on them alone on one thread, biases, the activation, and the weighted rows added in expert order.
std::vector<float> reference_moe(const RandomMoELayer& m, const std::vector<float>& h, std::size_t n,
                                 Precision precision) {
  const HParams& hp = m.hp;
  const std::size_t d = hp.dim, f = hp.ffn_dim, E = hp.n_expert, k = hp.n_expert_used;
  detail::ArenaCounter count;
  (void)moe_scratch(count, n, hp);
  Arena arena(count.bytes + 4096);
  const MoEScratch s = moe_scratch(arena, n, hp);
  linear(make_tensor(h.data(), n, d), m.L.ffn_gate_inp, slice<0>(s.logits, 0, n), nullptr, precision);
  moe_route(s, n, hp);
  std::vector<float> out(n * d, 0.0f);
  for (std::size_t e = 0; e < E; ++e) {
    std::vector<std::size_t> entries;  // token * k + slot
    for (std::size_t i = 0; i < n * k; ++i)
      if (s.sel.data()[i] == int32_t(e)) entries.push_back(i);
    const std::size_t c = entries.size();
    if (!c) continue;
    std::vector<float> x(c * d), g(c * f), u(c * f), y(c * d);
    for (std::size_t i = 0; i < c; ++i) std::copy_n(h.data() + entries[i] / k * d, d, x.data() + i * d);
    const auto xv = make_tensor(x.data(), c, d), gv = make_tensor(g.data(), c, f), uv = make_tensor(u.data(), c, f);
    linear_multi(xv, {&m.L.exp_gate[e], &m.L.exp_up[e]}, {gv, uv}, nullptr, precision);
    if (!m.L.exp_gate_b.empty()) {
      add_bias(gv, m.L.exp_gate_b[e]);
      add_bias(uv, m.L.exp_up_b[e]);
    }
    if (hp.swiglu_limit > 0)
      dispatch::swiglu_oai_f32(g.data(), f, u.data(), f, g.data(), f, c, f, hp.swiglu_alpha, hp.swiglu_limit);
    else swiglu(gv, uv, gv);
    const auto yv = make_tensor(y.data(), c, d);
    linear(gv, m.L.exp_down[e], yv, nullptr, precision);
    if (!m.L.exp_down_b.empty()) add_bias(yv, m.L.exp_down_b[e]);
    for (std::size_t i = 0; i < c; ++i) {
      const float w = s.weight.data()[entries[i]];
      float* o = out.data() + entries[i] / k * d;
      for (std::size_t j = 0; j < d; ++j) o[j] += w * y[i * d + j];
    }
  }
  return out;
}

}  // namespace

TEST_CASE("moe: the grouped dispatch equals the expert-by-expert products bit for bit at 1, 2 and 3 threads") {
  // 8 experts, top 2, dim 512, hidden 768: n = 72 tokens (144 rows: chunks of at most 72 rows, the dense MLP's
  // gate and up), 5 (10 rows: all in the scratch's own rows) and 1 (a decode step). Large enough that the
  // gather, the quantization, the grouped products, the activation and the weighted sums all split over threads.
  const std::size_t d = 512, f = 768, E = 8, k = 2;
  for (const io::GGMLType type : {io::GGMLType::MXFP4, io::GGMLType::Q4_0}) {
    for (const bool oai : {true, false}) {
      const RandomMoELayer m(type, d, f, E, k, oai);
      for (const std::size_t n : {std::size_t(72), std::size_t(5), std::size_t(1)}) {
        const std::vector<float> h = test::random_floats(n * d, uint32_t(100 + n), -2.f, 2.f);
        for (const Precision p : {Precision::fast, Precision::fast8, Precision::exact}) {
          INFO(io::ggml_type_name(type), oai ? " gpt-oss" : " swiglu", " n ", n, " precision ", int(p));
          const std::vector<float> want = reference_moe(m, h, n, p);
          for (const std::size_t threads : {std::size_t(1), std::size_t(2), std::size_t(3)}) {
            INFO("threads ", threads);
            const std::vector<float> got = run_moe(m, h, n, threads, p);
            std::size_t differ = 0;
            for (std::size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
            CHECK(differ == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("moe: gpt-oss with MXFP4 experts gives the same logits at 1, 2 and 3 threads") {
  const std::string path = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/models/gpt-oss/model-mxfp4.gguf";
  const Model m = load(path);
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 7, 3, 11, 4, 8, 6, 10, 12};
  std::vector<float> first;
  for (const std::size_t threads : {std::size_t(1), std::size_t(2), std::size_t(3)}) {
    auto st = m.impl().make_state(tokens.size(), tokens.size(), threads, KVType::f32);
    std::vector<float> z(m.hparams().vocab);
    m.impl().forward(*st, std::span<const int32_t>(tokens), 0, z.data());
    if (first.empty()) first = z;
    INFO("threads ", threads);
    CHECK(std::memcmp(z.data(), first.data(), z.size() * sizeof(float)) == 0);
  }
}

}  // namespace kiln::test::moe_dispatch_test
