// attention: the tiled kernel on every target against a double-precision scalar reference (causal, sliding
// window, soft-cap, attention sinks, decode rows, f32 and f16 keys and values, head slices of wider rows, head sizes
// with tails; Q8_0 blocks: the bits of f32 K/V holding their values), rows independent of the rows beside them (bit
// for bit), query heads sharing K and V in one call (each head's bits alone), NaN and empty cases, and errors.
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "kiln/ops/attention.hpp"
#include "kiln/quant/dequant.hpp"
#include "test_util.hpp"

using namespace kiln;

namespace {

constexpr double kU = 0x1p-24;  // f32 unit roundoff

struct Case {
  const char* name;
  std::size_t rows, kv_len, hd;
  AttentionOptions opt;
  float qmax;  // q elements in [-qmax, qmax): large values spread the scores (many online rescales)
};

std::vector<Case> cases() {
  return {
      {"prompt", 37, 37, 64, {.scale = 0.125f, .causal = true}, 1.f},
      {"prompt after a cache", 33, 183, 64, {.scale = 0.125f, .causal = true, .pos0 = 150}, 1.f},
      {"wide scores", 70, 300, 64, {.scale = 0.125f, .causal = true, .pos0 = 230}, 8.f},
      {"sliding window", 40, 140, 32, {.scale = 0.17f, .causal = true, .pos0 = 100, .window = 50}, 2.f},
      {"window larger than the past", 20, 20, 16, {.scale = 0.25f, .causal = true, .window = 64}, 2.f},
      {"softcap", 35, 200, 64, {.scale = 0.5f, .softcap = 5.f, .causal = true, .pos0 = 165}, 3.f},
      {"softcap and window",
       9,
       160,
       256,
       {.scale = 0.0625f, .softcap = 50.f, .causal = true, .pos0 = 151, .window = 70},
       4.f},
      {"head size with a tail", 21, 90, 6, {.scale = 0.4f, .causal = true, .pos0 = 69}, 2.f},
      {"head size 17", 5, 130, 17, {.scale = 0.25f, .causal = true, .pos0 = 125}, 2.f},
      {"decode group (GQA)", 3, 300, 64, {.scale = 0.125f}, 4.f},
      {"decode one row, window", 1, 500, 64, {.scale = 0.125f, .window = 100}, 4.f},
      {"decode rows, softcap", 4, 129, 128, {.scale = 0.09f, .softcap = 20.f}, 4.f},
      {"sink", 37, 37, 64, {.scale = 0.125f, .causal = true, .sink = 0.7f}, 1.f},
      {"sink above every score, window",
       40,
       140,
       32,
       {.scale = 0.17f, .causal = true, .pos0 = 100, .window = 50, .sink = 6.f},
       2.f},
      {"sink, decode group", 3, 300, 64, {.scale = 0.125f, .sink = -2.f}, 4.f},
  };
}

// The error bound for row r of a case (see the top of kiln/ops/attention.hpp), from the reference's own
// double-precision quantities: with w_c = p_c / l the weights, v* = max |v| over the row's positions,
//   |out - ref| <= v* (2 dy + (R + 2 t + 8) u + (n + 2) u)
//   dy = scale (hd + 1) u max_c sum_d |q_d k_cd| + u max |y| (+ 8 u cap with a soft-cap): a score's error,
//        shifting both its weight and the sum (2 dy);
//   R = max y - min y over the row (the rounded exp arguments y - m and the rescale factors' arguments),
//   t = the tiles of 64 positions the row spans (1 ulp per rescale factor and per product by it);
//   n = the row's positions (f32 sums of p and of p v in order: n u worst case);
//   a sink s adds e^(s - m) to the sum: its argument's rounding and the exp's (|s - max y| + 1) u, the add's u.
// A wrong mask, scale, cap or rescale is off by about v* / n or more: orders of magnitude above this.
template <class T>
double row_bound(const float* q, const T* k, const T* v, std::size_t hd, std::size_t kv_len, std::size_t r,
                 const AttentionOptions& opt) {
  auto val = [](T x) {
    if constexpr (std::is_same_v<T, f16>) return double(f16_bits_to_f32(x.bits));
    else return double(x);
  };
  const std::size_t p = opt.causal ? opt.pos0 + r : kv_len - 1;
  const std::size_t hi = std::min(kv_len, p + 1), lo = opt.window > 0 && p + 1 > opt.window ? p + 1 - opt.window : 0;
  double qk = 0, ymax = -1e300, ymin = 1e300, vmax = 0;
  for (std::size_t j = lo; j < hi; ++j) {
    double a = 0, s = 0;
    for (std::size_t d = 0; d < hd; ++d) {
      a += std::fabs(double(q[r * hd + d]) * val(k[j * hd + d]));
      s += double(q[r * hd + d]) * val(k[j * hd + d]);
      vmax = std::max(vmax, std::fabs(val(v[j * hd + d])));
    }
    s *= opt.scale;
    if (opt.softcap > 0) s = opt.softcap * std::tanh(s / opt.softcap);
    qk = std::max(qk, a);
    ymax = std::max(ymax, s);
    ymin = std::min(ymin, s);
  }
  const double n = double(hi - lo), tiles = double((hi + 63) / 64 - lo / 64);
  const double dy = double(opt.scale) * double(hd + 1) * kU * qk + kU * std::max(std::fabs(ymax), std::fabs(ymin)) +
                    (opt.softcap > 0 ? 8 * kU * opt.softcap : 0.0);
  const double sink = opt.sink > -std::numeric_limits<float>::infinity() ? (std::fabs(opt.sink - ymax) + 3) * kU : 0.0;
  return vmax * (2 * dy + (ymax - ymin + 2 * tiles + 8) * kU + (n + 2) * kU + sink);
}

template <class T>
std::vector<T> as_kv(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if constexpr (std::is_same_v<T, f16>) out[i] = f16::from_bits(f32_to_f16_bits(x[i]));
    else out[i] = x[i];
  }
  return out;
}

// q's rows sit `qpad` floats apart beyond head_dim (a head's slice of a (rows, heads * head_dim) matrix).
template <class T>
void check_case(const Case& c, std::uint32_t seed) {
  const std::size_t hd = c.hd, qs = hd + 11, os = hd + 5;
  const auto qv = test::random_floats(c.rows * hd, seed, -c.qmax, c.qmax);
  const auto k = as_kv<T>(test::random_floats(c.kv_len * hd, seed + 1, -1.f, 1.f));
  const auto v = as_kv<T>(test::random_floats(c.kv_len * hd, seed + 2, -1.f, 1.f));
  std::vector<float> qbuf(c.rows * qs, 7.f), obuf(c.rows * os, -3.f), want(c.rows * hd);
  for (std::size_t r = 0; r < c.rows; ++r) std::copy_n(&qv[r * hd], hd, &qbuf[r * qs]);
  const auto q = make_strided<const float, 2>(qbuf.data(), {c.rows, hd}, {std::ptrdiff_t(qs), 1});
  const auto out = make_strided<float, 2>(obuf.data(), {c.rows, hd}, {std::ptrdiff_t(os), 1});
  attention(q, make_tensor(k.data(), c.kv_len, hd), make_tensor(v.data(), c.kv_len, hd), out, c.opt);
  ref::attention(qv.data(), k.data(), v.data(), want.data(), c.rows, hd, c.kv_len, c.opt);
  for (std::size_t r = 0; r < c.rows; ++r) {
    CAPTURE(r);
    const double bound = row_bound(qv.data(), k.data(), v.data(), hd, c.kv_len, r, c.opt);
    double worst = 0;
    for (std::size_t d = 0; d < hd; ++d)
      worst = std::max(worst, std::fabs(double(obuf[r * os + d]) - want[r * hd + d]));
    INFO("worst error ", worst, ", bound ", bound);
    CHECK(worst <= bound);
    CHECK(obuf[r * os + hd] == -3.f);  // past the row: untouched
  }
}

}  // namespace

TEST_CASE("attention matches the double-precision reference on every target (f32 and f16 K/V, masks, soft-cap)") {
  test::for_each_target([](const std::string&) {
    std::uint32_t seed = 100;
    for (const auto& c : cases()) {
      const std::string name = c.name;
      CAPTURE(name);
      check_case<float>(c, seed);
      check_case<f16>(c, seed + 7);
      seed += 13;
    }
  });
}

// A q8_0 KV cache's K and V (rows of Q8_0 blocks): each tile is widened to d * q, exact in f32, so the output has
// the bits of f32 K and V holding the dequantized values (quant_traits<block_q8_0>::dequantize, the scalar
// reference), which the test above holds to the double-precision reference; every case with whole blocks of 32.
TEST_CASE("attention over Q8_0 blocks has the bits of f32 K/V holding their values, on every target") {
  test::for_each_target([](const std::string&) {
    std::uint32_t seed = 700;
    for (const auto& c : cases()) {
      if (c.hd % QK8_0 != 0) continue;
      const std::string name = c.name;
      CAPTURE(name);
      const std::size_t bpr = c.hd / QK8_0, qs = c.hd + 3;
      std::vector<block_q8_0> kq(c.kv_len * bpr), vq(c.kv_len * bpr);
      std::vector<float> kf(c.kv_len * c.hd), vf(c.kv_len * c.hd);
      for (auto [blocks, vals, sd] : {std::tuple{&kq, &kf, seed + 1}, std::tuple{&vq, &vf, seed + 2}}) {
        const auto x = test::random_floats(c.kv_len * c.hd, sd, -1.f, 1.f);
        for (std::size_t b = 0; b < blocks->size(); ++b) {
          std::vector<float> xb(x.begin() + std::ptrdiff_t(b * QK8_0), x.begin() + std::ptrdiff_t((b + 1) * QK8_0));
          for (float& e : xb) e *= float(1 + b % 5);  // blocks of different scales
          quant_traits<block_q8_0>::quantize(xb.data(), (*blocks)[b]);
          quant_traits<block_q8_0>::dequantize((*blocks)[b], vals->data() + b * QK8_0);
        }
      }
      const auto qv = test::random_floats(c.rows * qs, seed, -c.qmax, c.qmax);
      const auto q = make_strided<const float, 2>(qv.data(), {c.rows, c.hd}, {std::ptrdiff_t(qs), 1});
      std::vector<float> got(c.rows * c.hd, -1.f), want(c.rows * c.hd, -2.f);
      attention(q, make_tensor<const block_q8_0>(kq.data(), c.kv_len, bpr),
                make_tensor<const block_q8_0>(vq.data(), c.kv_len, bpr), make_tensor(got.data(), c.rows, c.hd), c.opt);
      attention(q, make_tensor<const float>(kf.data(), c.kv_len, c.hd),
                make_tensor<const float>(vf.data(), c.kv_len, c.hd), make_tensor(want.data(), c.rows, c.hd), c.opt);
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
      seed += 13;
    }
  });
}

TEST_CASE("attention: a row's result does not depend on the rows computed beside it (bit for bit)") {
  // The transformer splits a prompt's rows into chunks wherever a pass starts: the same row must come out
  // the same whether it is computed alone, in a chunk or in a larger call.
  test::for_each_target([](const std::string&) {
    const std::size_t hd = 64, kv_len = 200, rows = 45, pos0 = kv_len - rows;
    for (const std::size_t window : {std::size_t(0), std::size_t(70)}) {
      CAPTURE(window);
      const auto q = test::random_floats(rows * hd, 5, -3.f, 3.f);
      const auto k = as_kv<f16>(test::random_floats(kv_len * hd, 6));
      const auto v = as_kv<f16>(test::random_floats(kv_len * hd, 7));
      const auto K = make_tensor(k.data(), kv_len, hd), V = make_tensor(v.data(), kv_len, hd);
      const AttentionOptions opt{.scale = 0.125f, .causal = true, .pos0 = pos0, .window = window};
      std::vector<float> all(rows * hd), one(hd);
      attention(make_tensor(q.data(), rows, hd), K, V, make_tensor(all.data(), rows, hd), opt);
      for (std::size_t r = 0; r < rows; ++r) {
        CAPTURE(r);
        AttentionOptions o1 = opt;
        o1.pos0 = pos0 + r;
        attention(make_tensor(q.data() + r * hd, 1, hd), K, V, make_tensor(one.data(), 1, hd), o1);
        CHECK(std::equal(one.begin(), one.end(), all.begin() + std::ptrdiff_t(r * hd)));
      }
      // The last row as a decode step (non-causal, every row at kv_len - 1): the same bits.
      AttentionOptions dec{.scale = 0.125f, .window = window};
      attention(make_tensor(q.data() + (rows - 1) * hd, 1, hd), K, V, make_tensor(one.data(), 1, hd), dec);
      CHECK(std::equal(one.begin(), one.end(), all.begin() + std::ptrdiff_t((rows - 1) * hd)));
    }
  });
}

TEST_CASE("attention: NaN scores make only their rows NaN; no positions gives zeros") {
  test::for_each_target([](const std::string&) {
    const std::size_t hd = 16, kv_len = 100;
    auto q = test::random_floats(kv_len * hd, 8);
    auto k = test::random_floats(kv_len * hd, 9);
    const auto v = test::random_floats(kv_len * hd, 10);
    k[80 * hd + 3] = std::numeric_limits<float>::quiet_NaN();  // position 80's key
    std::vector<float> out(kv_len * hd);
    for (const float cap : {0.f, 10.f}) {
      attention(make_tensor(q.data(), kv_len, hd), make_tensor(k.data(), kv_len, hd), make_tensor(v.data(), kv_len, hd),
                make_tensor(out.data(), kv_len, hd), {.scale = 0.25f, .softcap = cap, .causal = true, .window = 10});
      for (std::size_t r = 0; r < kv_len; ++r) {
        CAPTURE(r);
        const bool sees = r >= 80 && r < 90;
        CHECK(std::isnan(out[r * hd]) == sees);
      }
    }
    k[0] = 0.5f;
    q[0] = std::numeric_limits<float>::infinity();  // +inf score: row 0 NaN (as softmax)
    attention(make_tensor(q.data(), 1, hd), make_tensor(k.data(), 1, hd), make_tensor(v.data(), 1, hd),
              make_tensor(out.data(), 1, hd), {.causal = true});
    CHECK(std::isnan(out[0]));
    std::fill(out.begin(), out.end(), 5.f);
    attention(make_tensor(q.data(), 2, hd), make_tensor(k.data(), 0, hd), make_tensor(v.data(), 0, hd),
              make_tensor(out.data(), 2, hd));
    CHECK(out[0] == 0.f);
    CHECK(out[2 * hd - 1] == 0.f);
  });
}

TEST_CASE("attention: bad shapes, scale, scratch and element types are errors naming the argument") {
  std::vector<float> q(4 * 8), k(10 * 8), v(10 * 8), o(4 * 8), small(10);
  const auto Q = make_tensor(q.data(), 4, 8), K = make_tensor(k.data(), 10, 8), V = make_tensor(v.data(), 10, 8);
  const auto O = make_tensor(o.data(), 4, 8);
  CHECK_THROWS_WITH_AS(attention(Q, K, make_tensor(v.data(), 9, 8), O), doctest::Contains("kv_len"), ShapeError);
  CHECK_THROWS_WITH_AS(attention(Q, make_tensor(k.data(), 10, 7), V, O), doctest::Contains("head_dim"), ShapeError);
  CHECK_THROWS_WITH_AS(attention(Q, K, V, O, {.scale = 0.f}), doctest::Contains("scale"), Error);
  CHECK_THROWS_WITH_AS(attention(Q, K, V, O, {.scale = 1.f, .softcap = -1.f}), doctest::Contains("softcap"), Error);
  CHECK_THROWS_WITH_AS(attention(Q, K, V, O, {.scratch = small}), doctest::Contains("attention_scratch_floats"), Error);
  CHECK_THROWS_WITH_AS(attention(Q, K, V, O, {.heads = 0}), doctest::Contains("heads = 0"), Error);
  CHECK_THROWS_WITH_AS(attention(Q, make_tensor(k.data(), 10, 4), make_tensor(v.data(), 10, 4), O, {.heads = 3}),
                       doctest::Contains("3 head(s)"), ShapeError);
  const std::vector<float> sinks2{0.5f, 1.f}, bad_sink{0.5f, std::nanf("")};
  const auto K4 = make_tensor(k.data(), 10, 4), V4 = make_tensor(v.data(), 10, 4);
  CHECK_THROWS_WITH_AS(attention(Q, K4, V4, O, {.heads = 2, .sinks = std::span<const float>(sinks2.data(), 1)}),
                       doctest::Contains("1 sinks for 2 heads"), Error);
  CHECK_THROWS_WITH_AS(attention(Q, K4, V4, O, {.heads = 2, .sinks = bad_sink}), doctest::Contains("sink nan"), Error);
  std::vector<float> sc(attention_scratch_floats(8));
  attention(Q, K, V, O, {.scratch = sc});
  std::vector<float> want(4 * 8);
  ref::attention(q.data(), k.data(), v.data(), want.data(), 4, 8, 10, {});
  test::check_close(o.data(), want.data(), o.size(), 1e-5f, 1e-6f, "with caller's scratch");
}

TEST_CASE("attention: query heads sharing k and v in one call give each head's bits as a call of its own") {
  test::for_each_target([&](const std::string&) {
    for (const bool f16kv : {false, true}) {
      CAPTURE(f16kv);
      const std::size_t heads = 3, hd = 32, rows = 40, kv_len = 140;
      const auto q = test::random_floats(rows * heads * hd, 31, -2.f, 2.f);
      const auto kf = test::random_floats(kv_len * hd, 32), vf = test::random_floats(kv_len * hd, 33);
      std::vector<f16> kh(kv_len * hd), vh(kv_len * hd);
      for (std::size_t i = 0; i < kf.size(); ++i) {
        kh[i] = f16::from_bits(f32_to_f16_bits(kf[i]));
        vh[i] = f16::from_bits(f32_to_f16_bits(vf[i]));
      }
      const std::vector<float> sinks{0.3f, -std::numeric_limits<float>::infinity(), 2.f};
      const AttentionOptions opt{.scale = 0.17f, .causal = true, .pos0 = kv_len - rows, .window = 50};
      std::vector<float> all(rows * heads * hd, std::nanf("")), one(rows * heads * hd, std::nanf(""));
      auto call = [&](const auto& k, const auto& v) {
        AttentionOptions o = opt;
        o.heads = heads;
        o.sinks = sinks;
        attention(make_tensor(q.data(), rows, heads * hd), make_tensor(k.data(), kv_len, hd),
                  make_tensor(v.data(), kv_len, hd), make_tensor(all.data(), rows, heads * hd), o);
        for (std::size_t h = 0; h < heads; ++h) {
          o.heads = 1;
          o.sinks = {};
          o.sink = sinks[h];
          const auto qh = make_strided<const float, 2>(q.data() + h * hd, {rows, hd}, {std::ptrdiff_t(heads * hd), 1});
          const auto oh = make_strided<float, 2>(one.data() + h * hd, {rows, hd}, {std::ptrdiff_t(heads * hd), 1});
          attention(qh, make_tensor(k.data(), kv_len, hd), make_tensor(v.data(), kv_len, hd), oh, o);
        }
      };
      if (f16kv) call(kh, vh);
      else call(kf, vf);
      CHECK(std::memcmp(all.data(), one.data(), all.size() * sizeof(float)) == 0);
    }
  });
}
