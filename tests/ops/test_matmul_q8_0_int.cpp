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
#include <doctest/doctest.h>

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
