// dispatch::matmul_q8_0_int: a q8_0 KV cache's decoding scores s = q K^T with q rounded per block of 32 to one
// or two 8-bit parts (fast8's and fast's rounding of activations: ref::qmm_quantize_act,
// ref::qmm_split_residual_act) and integer dot products with the keys' int8 values (AVX3_DL).
//   - Where it runs (AVX3_DL, one or two parts, head sizes up to 128, finite q: it returns true), every score
//     is within the f32 rounding of the exact integer reference sum_b d_b (dx_b X_b + dxr_b R_b), X_b and R_b
//     the parts' integer sums of block b: the kernel converts the exact 2^s X + R once, multiplies d by the
//     part scale and accumulates over blocks with FMAs, (nb + 3) roundings of at most sum_b |term_b| 2^-24.
//   - Where it does not (other targets, parts 0, head_dim 256 or 544, a NaN in q: it returns false), the bits of
//     matmul_q8_0 (q in f32).
//   - Either way, within the rounding of q of the f32 scores: |q - q~| <= dx / 252 a value with two parts,
//     dx / 2 with one (dx = the block's max |q| / 127), times sum |d k| over the block.
//   - A sub-range of keys gives the same bits as the whole call; C += with kMatmulAccumulate.
// With kMatmulColMajorB, the values c = s V over positions (Q8_0 rows):
//   - On AVX3_DL with one or two parts and head sizes up to 256, within the f32 rounding of the exact integer
//     reference sum_g scale_g X_g (per group g of 256 positions, w = s d rounded to W = round(w 32767 /
//     max|w|), X_g = sum W v, scale_g = max|w| / 32767), and within the weights' rounding (scale_g / 2 a
//     weight, times sum |v|) of the f32 values; elsewhere the bits of matmul_q8_0.
//   - A row's bits do not depend on the rows beside it; a row with a NaN or an infinity in its weights goes
//     through the f32 kernel alone and carries it, the other rows keep the integer kernel's bits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kiln/ops/matmul.hpp"
#include "kiln/ops/qmatmul_ref.hpp"
#include "kiln/quant/dequant.hpp"
#include "test_util.hpp"

using namespace kiln;

namespace {

struct Rounded {
  std::vector<int8_t> q, r;    // (m, k): the parts' values
  std::vector<float> dx, dxr;  // (m, k / 32): their scales
};

Rounded round_rows(const std::vector<float>& a, std::size_t m, std::size_t k, unsigned parts) {
  Rounded o{std::vector<int8_t>(m * k), std::vector<int8_t>(m * k, 0), std::vector<float>(m * k / 32),
            std::vector<float>(m * k / 32, 0.f)};
  for (std::size_t i = 0; i < m; ++i) {
    ref::qmm_quantize_act(&a[i * k], k, 32, &o.q[i * k], &o.dx[i * k / 32]);
    if (parts == 2) ref::qmm_split_residual_act(&a[i * k], k, 32, &o.r[i * k], &o.dxr[i * k / 32]);
  }
  return o;
}

}  // namespace

TEST_CASE("matmul_q8_0_int: integer scores over Q8_0 keys within f32 rounding of the exact integer sums") {
  test::for_each_target([&](const std::string& t) {
    CAPTURE(t);
    std::uint32_t seed = 4100;
    for (std::size_t k : {32, 64, 96, 128, 256, 544})
      for (std::size_t m : {1, 3, 8, 11})
        for (std::size_t n : {1, 17, 40})
          for (unsigned parts : {0u, 1u, 2u}) {
            CAPTURE(k);
            CAPTURE(m);
            CAPTURE(n);
            CAPTURE(parts);
            const std::size_t nb = k / QK8_0, ldb = nb + (seed % 3 == 0 ? 1 : 0);  // blocks; some rows padded
            const bool acc = seed % 2 == 0;
            std::vector<block_q8_0> b(n * ldb);
            std::vector<float> deq(n * k);
            const auto x = test::random_floats(n * k, ++seed, -2.f, 2.f);
            for (std::size_t j = 0; j < n; ++j)
              for (std::size_t q = 0; q < nb; ++q) {
                block_q8_0& blk = b[j * ldb + q];
                quant_traits<block_q8_0>::quantize(&x[j * k + q * QK8_0], blk);
                if ((j + q) % 5 == 0) blk.qs[(j + 3 * q) % 32] = -128;  // the extreme a file may hold
                quant_traits<block_q8_0>::dequantize(blk, &deq[j * k + q * QK8_0]);
              }
            auto a = test::random_floats(m * k, ++seed);
            for (std::size_t p = 0; p < 32; ++p) a[p] = 0.f;  // a zero block (dx = 0)
            if (k >= 64) a[m * k - 7] = 40.f;                 // an outlier: residual shifts above 8
            const Rounded rq = round_rows(a, m, k, parts);
            const auto c0 = test::random_floats(m * n, ++seed);
            auto c = c0, want = c0;
            const unsigned f = acc ? detail::kMatmulAccumulate : 0u;
            const bool ran = dispatch::matmul_q8_0_int(a.data(), std::ptrdiff_t(k), b.data(), std::ptrdiff_t(ldb),
                                                       c.data(), std::ptrdiff_t(n), m, n, k, parts, f);
            CHECK(ran == (t == "AVX3_DL" && parts != 0 && k <= 128));
            dispatch::matmul_q8_0(a.data(), std::ptrdiff_t(k), b.data(), std::ptrdiff_t(ldb), want.data(),
                                  std::ptrdiff_t(n), m, n, k, f);
            if (!ran) CHECK(std::memcmp(c.data(), want.data(), c.size() * sizeof(float)) == 0);
            std::size_t over_int = 0, over_f32 = 0;
            for (std::size_t i = 0; i < m; ++i)
              for (std::size_t j = 0; j < n; ++j) {
                double s_int = 0, mag_int = 0, s = 0, mag = 0, rnd = 0;
                for (std::size_t q = 0; q < nb; ++q) {
                  const block_q8_0& blk = b[j * ldb + q];
                  const double d = f16_bits_to_f32(blk.d.bits);
                  long long X = 0, R = 0, ksum = 0;
                  for (std::size_t p = 0; p < 32; ++p) {
                    X += (long long)rq.q[i * k + 32 * q + p] * blk.qs[p];
                    R += (long long)rq.r[i * k + 32 * q + p] * blk.qs[p];
                    ksum += std::abs(int(blk.qs[p]));
                    s += double(a[i * k + 32 * q + p]) * deq[j * k + 32 * q + p];
                    mag += std::fabs(double(a[i * k + 32 * q + p]) * deq[j * k + 32 * q + p]);
                  }
                  const double term =
                      d * (double(rq.dx[i * nb + q]) * double(X) + double(rq.dxr[i * nb + q]) * double(R));
                  s_int += term;
                  mag_int += std::fabs(term);
                  // q's rounding error a value: dx / 252 with two parts (ref::qmm_quantize_residual), dx / 2 with one.
                  rnd += std::fabs(d) * double(ksum) * double(rq.dx[i * nb + q]) * (parts == 2 ? 1.0 / 252 : 0.5);
                }
                const double base = acc ? double(c0[i * n + j]) : 0.0;
                const double got = double(c[i * n + j]) - base;  // the add of acc: one more rounding below
                const double add = acc ? std::fabs(double(c[i * n + j])) * 0x1p-24 : 0.0;
                if (ran && !(std::fabs(got - s_int) <= double(nb + 3) * 0x1p-24 * mag_int + add + 1e-30)) ++over_int;
                const double tol_f32 = (parts ? rnd * (1 + 0x1p-10) : 0.0) + 2.0 * double(k + 8) * 0x1p-24 * mag + add;
                if (!(std::fabs(got - s) <= tol_f32 + 1e-30)) ++over_f32;
              }
            CHECK(over_int == 0);
            CHECK(over_f32 == 0);
            // Keys [5, n) alone: the same bits as the whole call's.
            if (n > 5) {
              std::vector<float> part(m * n, 0.f), whole(m * n, 0.f);
              dispatch::matmul_q8_0_int(a.data(), std::ptrdiff_t(k), b.data(), std::ptrdiff_t(ldb), whole.data(),
                                        std::ptrdiff_t(n), m, n, k, parts, 0);
              dispatch::matmul_q8_0_int(a.data(), std::ptrdiff_t(k), b.data() + 5 * ldb, std::ptrdiff_t(ldb),
                                        part.data() + 5, std::ptrdiff_t(n), m, n - 5, k, parts, 0);
              std::size_t differ = 0;
              for (std::size_t i = 0; i < m; ++i)
                differ += std::memcmp(&part[i * n + 5], &whole[i * n + 5], (n - 5) * sizeof(float)) != 0;
              CHECK(differ == 0);
            }
          }
  });
}

TEST_CASE("matmul_q8_0_int: a NaN or an infinity in q goes through the f32 kernel and reaches the scores") {
  test::for_each_target([&](const std::string& t) {
    CAPTURE(t);
    const std::size_t k = 64, m = 3, n = 20, nb = k / QK8_0;
    std::vector<block_q8_0> b(n * nb);
    const auto x = test::random_floats(n * k, 77, -2.f, 2.f);
    for (std::size_t j = 0; j < n * nb; ++j) quant_traits<block_q8_0>::quantize(&x[j * QK8_0], b[j]);
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      auto a = test::random_floats(m * k, 78);
      a[k + 40] = bad;  // row 1
      std::vector<float> c(m * n), want(m * n);
      CHECK_FALSE(dispatch::matmul_q8_0_int(a.data(), std::ptrdiff_t(k), b.data(), std::ptrdiff_t(nb), c.data(),
                                            std::ptrdiff_t(n), m, n, k, 2, 0));
      dispatch::matmul_q8_0(a.data(), std::ptrdiff_t(k), b.data(), std::ptrdiff_t(nb), want.data(), std::ptrdiff_t(n),
                            m, n, k, 0);
      CHECK(std::memcmp(c.data(), want.data(), c.size() * sizeof(float)) == 0);
      std::size_t finite = 0;
      for (std::size_t j = 0; j < n; ++j) finite += std::isfinite(c[n + j]);
      CHECK(finite < n);  // row 1's scores carry it (a zero key would give NaN for infinity: not all finite)
    }
  });
}

namespace {

// The reference of the integer values kernel for row i: its groups' integer sums, scales and the magnitude
// sum_g |scale_g X_g| per value, and the weights' rounding bound sum_g scale_g / 2 sum |v| per value.
struct ValuesRef {
  std::vector<double> sum, mag, rnd;
};

ValuesRef values_ref(const float* s, const std::vector<block_q8_0>& v, std::size_t ldb, std::size_t n, std::size_t k) {
  const std::size_t nb = n / QK8_0;
  ValuesRef o{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  for (std::size_t g0 = 0; g0 < k; g0 += 256) {
    const std::size_t g1 = std::min(k, g0 + 256);
    for (std::size_t q = 0; q < nb; ++q) {
      float amax = 0.f;
      for (std::size_t t = g0; t < g1; ++t)
        amax = std::max(amax, std::fabs(s[t] * f16_bits_to_f32(v[t * ldb + q].d.bits)));
      const float inv = amax > 0.f ? 32767.0f / amax : 0.f, scale = amax / 32767.0f;
      for (std::size_t j = 0; j < QK8_0; ++j) {
        long long X = 0, vabs = 0;
        for (std::size_t t = g0; t < g1; ++t) {
          const float w = s[t] * f16_bits_to_f32(v[t * ldb + q].d.bits);
          X += (long long)std::nearbyint(w * inv) * v[t * ldb + q].qs[j];
          vabs += std::abs(int(v[t * ldb + q].qs[j]));
        }
        o.sum[32 * q + j] += double(scale) * double(X);
        o.mag[32 * q + j] += std::fabs(double(scale) * double(X));
        o.rnd[32 * q + j] += double(scale) * (0.5 + 0x1p-6) * double(vabs);
      }
    }
  }
  return o;
}

}  // namespace

TEST_CASE("matmul_q8_0_int: integer values s V over Q8_0 rows within f32 rounding of the exact integer sums") {
  test::for_each_target([&](const std::string& t) {
    CAPTURE(t);
    std::uint32_t seed = 5200;
    for (std::size_t n : {32, 64, 128, 256, 288})
      for (std::size_t m : {1, 3, 8, 11})
        for (std::size_t k : {1, 2, 17, 256, 300, 600})
          for (unsigned parts : {0u, 1u, 2u}) {
            if (k == 600 && m > 3) continue;  // the long case at a few rows
            CAPTURE(n);
            CAPTURE(m);
            CAPTURE(k);
            CAPTURE(parts);
            const std::size_t nb = n / QK8_0, ldb = nb + (seed % 3 == 0 ? 1 : 0);
            const bool acc = seed % 2 == 0;
            std::vector<block_q8_0> v(k * ldb);
            std::vector<float> deq(k * n);
            const auto x = test::random_floats(k * n, ++seed, -2.f, 2.f);
            for (std::size_t p = 0; p < k; ++p)
              for (std::size_t q = 0; q < nb; ++q) {
                block_q8_0& blk = v[p * ldb + q];
                quant_traits<block_q8_0>::quantize(&x[p * n + q * QK8_0], blk);
                if ((p + q) % 5 == 0) blk.qs[(p + 3 * q) % 32] = -128;
                if (p % 13 == 4) blk = block_q8_0{};  // a zero block (d = 0)
                quant_traits<block_q8_0>::dequantize(blk, &deq[p * n + q * QK8_0]);
              }
            // The weights: softmax-like (0, 1] with zeros and a large one; row 0 all zero.
            auto s = test::random_floats(m * k, ++seed, 0.f, 1.f);
            for (std::size_t p = 0; p < k; ++p) s[p] = 0.f;
            for (std::size_t i = 1; i < m; ++i) {
              s[i * k + (i * 7) % k] = 30.f;
              if (k > 3) s[i * k + 3] = 0.f;
            }
            const auto c0 = test::random_floats(m * n, ++seed);
            auto c = c0, want = c0;
            const unsigned f = (acc ? detail::kMatmulAccumulate : 0u) | detail::kMatmulColMajorB;
            const bool ran = dispatch::matmul_q8_0_int(s.data(), std::ptrdiff_t(k), v.data(), std::ptrdiff_t(ldb),
                                                       c.data(), std::ptrdiff_t(n), m, n, k, parts, f);
            CHECK(ran == (t == "AVX3_DL" && parts != 0 && n <= 256));
            dispatch::matmul_q8_0(s.data(), std::ptrdiff_t(k), v.data(), std::ptrdiff_t(ldb), want.data(),
                                  std::ptrdiff_t(n), m, n, k, f);
            if (!ran) CHECK(std::memcmp(c.data(), want.data(), c.size() * sizeof(float)) == 0);
            std::size_t over_int = 0, over_f32 = 0;
            for (std::size_t i = 0; i < m; ++i) {
              const ValuesRef r = values_ref(&s[i * k], v, ldb, n, k);
              const double groups = double((k + 255) / 256);
              for (std::size_t j = 0; j < n; ++j) {
                double ex = 0, mag = 0;
                for (std::size_t p = 0; p < k; ++p) {
                  ex += double(s[i * k + p]) * deq[p * n + j];
                  mag += std::fabs(double(s[i * k + p]) * deq[p * n + j]);
                }
                const double base = acc ? double(c0[i * n + j]) : 0.0;
                const double got = double(c[i * n + j]) - base;
                const double add = acc ? std::fabs(double(c[i * n + j])) * 0x1p-24 : 0.0;
                // The conversion and the FMA of each group: two roundings of at most the running sum.
                const double tol_int = 2.0 * (groups + 1) * 0x1p-24 * r.mag[j] + add + 1e-30;
                if (ran && !(std::fabs(got - r.sum[j]) <= tol_int)) ++over_int;
                const double tol_f32 = (ran ? r.rnd[j] + tol_int : 0.0) + 2.0 * double(k + 8) * 0x1p-24 * mag + add;
                if (!(std::fabs(got - ex) <= tol_f32 + 1e-30)) ++over_f32;
              }
            }
            CHECK(over_int == 0);
            CHECK(over_f32 == 0);
            // Each row alone: the same bits as in the whole call.
            if (m > 1) {
              std::vector<float> whole(m * n, 0.f), alone(n, 0.f);
              dispatch::matmul_q8_0_int(s.data(), std::ptrdiff_t(k), v.data(), std::ptrdiff_t(ldb), whole.data(),
                                        std::ptrdiff_t(n), m, n, k, parts, detail::kMatmulColMajorB);
              const std::size_t i = m - 1;
              dispatch::matmul_q8_0_int(&s[i * k], std::ptrdiff_t(k), v.data(), std::ptrdiff_t(ldb), alone.data(),
                                        std::ptrdiff_t(n), 1, n, k, parts, detail::kMatmulColMajorB);
              CHECK(std::memcmp(&whole[i * n], alone.data(), n * sizeof(float)) == 0);
            }
          }
  });
}

TEST_CASE("matmul_q8_0_int: values with a NaN or an infinity in a row's weights: that row by the f32 kernel") {
  test::for_each_target([&](const std::string& t) {
    CAPTURE(t);
    const std::size_t n = 64, m = 3, k = 40, nb = n / QK8_0;
    std::vector<block_q8_0> v(k * nb);
    const auto x = test::random_floats(k * n, 79, -2.f, 2.f);
    for (std::size_t j = 0; j < k * nb; ++j) quant_traits<block_q8_0>::quantize(&x[j * QK8_0], v[j]);
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      const auto s = [&] {
        auto r = test::random_floats(m * k, 80, 0.f, 1.f);
        r[k + 21] = bad;  // row 1
        return r;
      }();
      std::vector<float> c(m * n), want(m * n);
      const unsigned f = detail::kMatmulColMajorB;
      CHECK_FALSE(dispatch::matmul_q8_0_int(s.data(), std::ptrdiff_t(k), v.data(), std::ptrdiff_t(nb), c.data(),
                                            std::ptrdiff_t(n), m, n, k, 2, f));
      dispatch::matmul_q8_0(s.data(), std::ptrdiff_t(k), v.data(), std::ptrdiff_t(nb), want.data(), std::ptrdiff_t(n),
                            m, n, k, f);
      // Row 1: the f32 kernel's bits, not finite; rows 0 and 2: what they give without row 1 beside them.
      CHECK(std::memcmp(&c[n], &want[n], n * sizeof(float)) == 0);
      std::size_t finite = 0;
      for (std::size_t j = 0; j < n; ++j) finite += std::isfinite(c[n + j]);
      CHECK(finite < n);
      for (std::size_t i : {std::size_t{0}, std::size_t{2}}) {
        std::vector<float> alone(n);
        dispatch::matmul_q8_0_int(&s[i * k], std::ptrdiff_t(k), v.data(), std::ptrdiff_t(nb), alone.data(),
                                  std::ptrdiff_t(n), 1, n, k, 2, f);
        CHECK(std::memcmp(&c[i * n], alone.data(), n * sizeof(float)) == 0);
      }
    }
  });
}
