// Quantization: byte-identical with gguf-py's quantizer (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4 from f32, f16 and
// bf16 input; F16 and BF16 from f32) over tests/fixtures/quant/quantize_*.bin, and round-trip error
// bounds, derived per format below, for every quantizer including Q4_K and Q8_K (which gguf-py lacks).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant_fixture.hpp"

using namespace kiln;

namespace {

template <class B, class X>
void check_quantize_fixture(const char* in_tag) {
  constexpr std::size_t bs = dtype_traits<B>::block_size;
  const std::string stem = "quantize_" + std::string(dtype_name<B>) + "_" + in_tag;
  INFO("fixture ", stem);
  const auto rec = test::read_records(stem, bs * sizeof(X), sizeof(B));
  std::vector<X> x(rec.n * bs);
  std::memcpy(x.data(), rec.in.data(), rec.in.size());
  std::vector<B> got(rec.n);
  std::memset(static_cast<void*>(got.data()), 0xAB, got.size() * sizeof(B));
  quantize_row(x.data(), got.data(), x.size());
  const auto* g = reinterpret_cast<const uint8_t*>(got.data());
  for (std::size_t i = 0; i < rec.n; ++i) {
    INFO("block ", rec.note(i));
    CHECK(std::memcmp(g + i * sizeof(B), rec.out.data() + i * sizeof(B), sizeof(B)) == 0);
  }
  // The Tensor API and the pool give the same bytes.
  std::vector<B> t(rec.n);
  ThreadPool pool(2);
  quantize(make_tensor<const X>(x.data(), rec.n, bs), make_tensor(t.data(), rec.n, std::size_t(1)), &pool);
  CHECK(std::memcmp(t.data(), got.data(), got.size() * sizeof(B)) == 0);
}

template <class B>
void check_all_inputs() {
  check_quantize_fixture<B, float>("f32");
  check_quantize_fixture<B, f16>("f16");
  check_quantize_fixture<B, bf16>("bf16");
}

template <class S>
void check_scalar_quantize_fixture() {
  const std::string stem = "quantize_" + std::string(dtype_name<S>) + "_f32";
  INFO("fixture ", stem);
  const auto rec = test::read_records(stem, 4, 2);
  const auto x = test::as_floats(rec.in.data(), rec.n);
  std::vector<S> got(rec.n);
  quantize_row(x.data(), got.data(), rec.n);
  for (std::size_t i = 0; i < rec.n; ++i) {
    uint16_t want;
    std::memcpy(&want, rec.out.data() + 2 * i, 2);
    if (got[i].bits != want) {
      CHECK_MESSAGE(false, "x = ", x[i], " (bits ", std::bit_cast<uint32_t>(x[i]), "): got ", got[i].bits, " want ",
                    want);
      break;
    }
  }
}

/// Blocks of normal data at several scales, plus the edge cases of the fixtures.
std::vector<float> round_trip_inputs(std::size_t bs, std::size_t n_blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(bs * n_blocks);
  for (std::size_t b = 0; b < n_blocks; ++b) {
    const float scale = std::pow(10.f, float(int(b % 9) - 4));  // 1e-4 .. 1e4
    for (std::size_t j = 0; j < bs; ++j) x[b * bs + j] = nd(rng) * scale;
    if (b % 5 == 1) x[b * bs + (b * 7) % bs] *= 50.f;  // an outlier
    if (b % 7 == 3)
      std::fill(x.begin() + std::ptrdiff_t(b * bs), x.begin() + std::ptrdiff_t((b + 1) * bs), 0.75f);  // constant
    if (b % 11 == 4)
      std::fill(x.begin() + std::ptrdiff_t(b * bs), x.begin() + std::ptrdiff_t((b + 1) * bs), 0.f);  // zero
  }
  return x;
}

}  // namespace

TEST_CASE("quantize into Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 is byte-identical with gguf-py (f32, f16, bf16 input)") {
  check_all_inputs<block_q4_0>();
  check_all_inputs<block_q4_1>();
  check_all_inputs<block_q5_0>();
  check_all_inputs<block_q5_1>();
  check_all_inputs<block_q8_0>();
}

TEST_CASE("quantize into MXFP4 is byte-identical with gguf-py (f32, f16, bf16 input)") {
  check_all_inputs<block_mxfp4>();
}

TEST_CASE("f32 -> F16 and f32 -> BF16 rows are bit-identical with gguf-py (round to nearest even)") {
  check_scalar_quantize_fixture<f16>();
  check_scalar_quantize_fixture<bf16>();
}

// Symmetric formats (Q8_0, Q4_0, Q5_0): with d the f32 scale the quantizer divides by and dh = f16(d) the
// stored one, |x - dh*q| <= |x - d*q| + |d - dh|*|q|. The first term is d/2 for a rounding quantizer (Q8_0)
// and d/2 for truncation of x/d + 8.5 as well, except at the clamped top level, where x/d may reach +8
// (x = -max) but q - 8 stops at 7: an error of d. So the bound is d * (top ? 1 : 0.5) + |d - dh| * qmax,
// plus 1e-6 relative slack for the f32 roundings of x * (1/d) (a few ulp of values <= qmax * d).
TEST_CASE("symmetric quantizers round-trip within their step (Q8_0, Q4_0, Q5_0)") {
  auto run = [](auto tag, float levels, float top_err, float qmax) {
    using B = decltype(tag);
    constexpr std::size_t bs = dtype_traits<B>::block_size;
    const auto x = round_trip_inputs(bs, 90, 7);
    std::vector<B> q(x.size() / bs);
    std::vector<float> y(x.size());
    quantize_row(x.data(), q.data(), x.size());
    dequantize_row(q.data(), y.data(), y.size());
    for (std::size_t b = 0; b < q.size(); ++b) {
      float amax = 0;
      for (std::size_t j = 0; j < bs; ++j) amax = std::max(amax, std::fabs(x[b * bs + j]));
      const float d = amax / levels, dh = std::fabs(float(q[b].d));
      const float bound = d * top_err + std::fabs(d - dh) * qmax + 1e-6f * amax;
      for (std::size_t j = 0; j < bs; ++j) {
        INFO(dtype_name<B>, " block ", b, " element ", j, " x ", x[b * bs + j], " y ", y[b * bs + j]);
        CHECK(std::fabs(x[b * bs + j] - y[b * bs + j]) <= bound);
      }
    }
  };
  run(block_q8_0{}, 127.f, 0.5f, 127.f);
  run(block_q4_0{}, 8.f, 1.0f, 8.f);
  run(block_q5_0{}, 16.f, 1.0f, 16.f);
}

// Min-offset formats (Q4_1, Q5_1): q = trunc((x - min)/d + 0.5) is round-to-nearest on [0, qmax], so
// |x - (d*q + min)| <= d/2; storing d and m as f16 adds |d - dh|*qmax + |min - mh|.
TEST_CASE("min-offset quantizers round-trip within half a step (Q4_1, Q5_1)") {
  auto run = [](auto tag, float qmax) {
    using B = decltype(tag);
    constexpr std::size_t bs = dtype_traits<B>::block_size;
    const auto x = round_trip_inputs(bs, 90, 11);
    std::vector<B> q(x.size() / bs);
    std::vector<float> y(x.size());
    quantize_row(x.data(), q.data(), x.size());
    dequantize_row(q.data(), y.data(), y.size());
    for (std::size_t b = 0; b < q.size(); ++b) {
      const float* xb = x.data() + b * bs;
      const float mn = *std::min_element(xb, xb + bs), mx = *std::max_element(xb, xb + bs);
      const float d = (mx - mn) / qmax;
      const float bound = d * 0.5f + std::fabs(d - float(q[b].d)) * qmax + std::fabs(mn - float(q[b].m)) +
                          1e-6f * std::max(std::fabs(mn), std::fabs(mx));
      for (std::size_t j = 0; j < bs; ++j) {
        INFO(dtype_name<B>, " block ", b, " element ", j);
        CHECK(std::fabs(xb[j] - y[b * bs + j]) <= bound);
      }
    }
  };
  run(block_q4_1{}, 15.f);
  run(block_q5_1{}, 31.f);
}

// Q8_K: q = nearest(x * 127/|m|) exactly as ggml (ties to even), d = |m|/127 kept in f32, so the error is
// at most d/2 plus f32 rounding of d*q (1 ulp of |x| <= |m|, hence 1e-6 * |m|). bsums are the group sums.
TEST_CASE("Q8_K round-trips within half a step and its bsums are the group sums") {
  const auto x = round_trip_inputs(QK_K, 20, 3);
  std::vector<block_q8_K> q(x.size() / QK_K);
  std::vector<float> y(x.size());
  quantize_row(x.data(), q.data(), x.size());
  dequantize_row(q.data(), y.data(), y.size());
  for (std::size_t b = 0; b < q.size(); ++b) {
    float amax = 0;
    for (std::size_t j = 0; j < QK_K; ++j) amax = std::max(amax, std::fabs(x[b * QK_K + j]));
    CHECK(std::fabs(q[b].d) == doctest::Approx(amax / 127.f).epsilon(1e-6));
    for (std::size_t j = 0; j < QK_K; ++j)
      CHECK(std::fabs(x[b * QK_K + j] - y[b * QK_K + j]) <= amax / 254.f + 1e-6f * amax);
    for (std::size_t g = 0; g < QK_K / 16; ++g) {
      int s = 0;
      for (std::size_t l = 0; l < 16; ++l) s += q[b].qs[g * 16 + l];
      CHECK(q[b].bsums[g] == s);
    }
  }
}

// Q4_K: the final step requantizes every value against the stored scales, L = clamp(nearest((x + dm)/dl),
// 0, 15) with dl = d*sc and dm = dmin*mn of its sub-block. So each reconstruction is the nearest of the 16
// levels dl*L - dm: |x - y| <= dl/2 inside [-dm, 15*dl - dm], and outside it y is the nearer end level.
// (Up to 2 ulp of slack for the f32 divisions and products.) On top, the fitted scales must be good: the
// rms error over normal data stays below 0.11 of the rms of x, which a 4-bit grid spanning the sub-block's
// range (~4.3 sigma for 32 normal values, step ~0.29 sigma, rms error step/sqrt(12) ~ 0.083 sigma)
// achieves; a wrong scale packing or sub-block order would be far above it.
TEST_CASE("Q4_K quantization picks the nearest level of its stored scales and fits normal data") {
  const auto x = round_trip_inputs(QK_K, 27, 5);
  std::vector<block_q4_K> q(x.size() / QK_K);
  std::vector<float> y(x.size());
  quantize_row(x.data(), q.data(), x.size());
  dequantize_row(q.data(), y.data(), y.size());
  for (std::size_t b = 0; b < q.size(); ++b) {
    double se = 0, sx = 0;
    for (std::size_t s = 0; s < 8; ++s) {
      uint8_t sc, mn;
      detail::get_scale_min_k4(s, q[b].scales, sc, mn);
      const float dl = float(q[b].d) * sc, dm = float(q[b].dmin) * mn;
      for (std::size_t l = 0; l < 32; ++l) {
        const std::size_t e = b * QK_K + s * 32 + l;
        se += double(x[e] - y[e]) * (x[e] - y[e]);
        sx += double(x[e]) * x[e];
        const float slack = 2.4e-7f * (std::fabs(x[e]) + 15 * dl + dm);
        INFO("block ", b, " sub-block ", s, " element ", l, " x ", x[e], " y ", y[e], " dl ", dl, " dm ", dm);
        if (dl == 0.f) continue;  // a sub-block whose scale quantized to 0: values keep the fit's levels
        if (x[e] < -dm) CHECK(y[e] == -dm);
        else if (x[e] > 15 * dl - dm) CHECK(std::fabs(y[e] - (15 * dl - dm)) <= slack);
        else CHECK(std::fabs(x[e] - y[e]) <= dl * 0.5f + slack);
      }
    }
    const bool normal = b % 7 != 3 && b % 11 != 4;  // constant / zero blocks: checked for exactness below
    if (normal) CHECK(std::sqrt(se / sx) < 0.11);
    else CHECK(se <= 1e-6 * sx + 1e-30);
  }
  // One value must come back exactly when it is on the grid: all zero -> all zero.
  std::vector<float> z(QK_K, 0.f), zy(QK_K, 1.f);
  block_q4_K zb;
  quant_traits<block_q4_K>::quantize(z.data(), zb);
  quant_traits<block_q4_K>::dequantize(zb, zy.data());
  CHECK(std::all_of(zy.begin(), zy.end(), [](float v) { return v == 0.f; }));
}

TEST_CASE("quantize rejects partial blocks and mismatched shapes") {
  std::vector<float> x(64);
  std::vector<block_q4_0> q(2);
  CHECK_THROWS_WITH_AS(quantize_row(x.data(), q.data(), 48), doctest::Contains("not a whole number of q4_0 blocks"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(quantize(make_tensor<const float>(x.data(), 2, 32), make_tensor(q.data(), 1, 2)),
                       doctest::Contains("kiln::quantize: out q4_0(1, 2) must have x's shape f32(2, 32)"), ShapeError);
}
