// The AMX bf16 GEMM of f16 and bf16 weights (kernels/matmul/amx_bf16-inl.h, MatmulOptions::amx_bf16) against a
// double-precision scalar reference, within the bound docs/kernels.md derives from the arithmetic (x split into
// two bf16 parts, f16 weights into two, bf16 products exact in f32, f32 sums of K and 2K terms): random data
// over a wide dynamic range with zeros and f16 subnormals, M, N, K off the 16 / 32 / 256 tile and block sizes,
// row-major and packed weights, C = and C +=, 1 and 2 threads. With AMX switched off (or absent) the option
// changes nothing: the f32 GEMM's bits. On a CPU without usable AMX-BF16 the tile cases say
// "skipped: no AMX" and the fallback is checked.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kiln/core/amx.hpp"
#include "kiln/ops/matmul.hpp"
#include "amx_test_util.hpp"
#include "test_util.hpp"

using namespace kiln;

namespace amxbf_test {

ThreadPool& pool2() {
  static ThreadPool p(2);
  return p;
}

using amx_test::SwitchGuard;
using amx_test::wide;
bool usable_or_skip() { return amx_test::bf16_usable_or_skip("the f32 GEMM"); }

// gamma_n = n u / (1 - n u), u = 2^-24: the bound on n f32 additions in a row.
double gamma(double n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1 - n * u);
}

template <class T>
void check_type(bool packed) {
  constexpr bool kF16 = std::is_same_v<T, f16>;
  // The bound per output, relative to sum |x w| (docs/kernels.md): the parts' representation error (x: 2^-16;
  // f16 w: the dropped x_lo w_lo, < 2^-8 2^-7), the main sum (K terms <= (1 + 2^-8) |x w|), the corrections'
  // sum (2K terms <= (2^-7 (1 + 2^-8) + 2^-8) |x w|; bf16: K terms <= 2^-8 |x w|) and the final main + corr
  // (and + C) rounding.
  auto bound = [&](std::size_t k) {
    const double rep = kF16 ? 3 * std::ldexp(1.0, -16) : std::ldexp(1.0, -16);
    const double corr =
        kF16 ? gamma(2.0 * double(k)) * (std::ldexp(1.0, -7) * (1 + std::ldexp(1.0, -8)) + std::ldexp(1.0, -8))
             : gamma(double(k)) * std::ldexp(1.0, -8);
    return rep + gamma(double(k)) * (1 + std::ldexp(1.0, -8)) + corr + 2 * std::ldexp(1.0, -24);
  };
  struct Shape {
    std::size_t m, n, k;
  };
  SwitchGuard guard;
  uint32_t seed = packed ? 900 : 700;
  for (const Shape sh : {Shape{5, 16, 32}, Shape{16, 16, 32}, Shape{17, 33, 37}, Shape{50, 70, 300},
                         Shape{129, 64, 513}, Shape{40, 300, 64}, Shape{33, 129, 1000}}) {
    const std::size_t m = sh.m, n = sh.n, k = sh.k;
    CAPTURE(dtype_name<T>);
    CAPTURE(packed);
    CAPTURE(m);
    CAPTURE(n);
    CAPTURE(k);
    // w: f16 from its subnormals (2^-24) to 2^8, bf16 over 2^-40 .. 2^30; x over 2^-20 .. 2^20.
    const auto wf = kF16 ? wide(n * k, ++seed, -26, 8) : wide(n * k, ++seed, -40, 30);
    std::vector<T> w(n * k);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = T(wf[i]);
    std::vector<T> wp(n * k);
    const auto wt = make_tensor<const T>(w.data(), n, k);
    const auto pv = pack_rows(wt, wp.data());
    const auto x = wide(m * k, ++seed, -20, 20);
    const auto c0 = wide(m * n, ++seed, -4, 4);  // C's start for C +=
    const auto xt = make_tensor(x.data(), m, k);
    for (const bool acc : {false, true}) {
      std::vector<double> ref(m * n), abs_terms(m * n);
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) {
          double s = 0, a = 0;
          for (std::size_t p = 0; p < k; ++p) {
            const double t = double(x[i * k + p]) * double(to_f32(w[j * k + p]));
            s += t;
            a += std::fabs(t);
          }
          ref[i * n + j] = s + (acc ? double(c0[i * n + j]) : 0.0);
          abs_terms[i * n + j] = a;
        }
      std::vector<float> y1;  // the 1-thread result: 2 threads give its bits (threads split N or M)
      for (const std::size_t threads : {1, 2}) {
        CAPTURE(acc);
        CAPTURE(threads);
        ThreadPool* pool = threads == 2 ? &pool2() : nullptr;
        auto run = [&](bool amx_on, bool option) {
          set_amx_enabled({.enabled = amx_on});
          std::vector<float> y = acc ? c0 : std::vector<float>(m * n, std::nanf(""));
          const MatmulOptions opt{.accumulate = acc, .amx_bf16 = option};
          if (packed) matmul(xt, pv, make_tensor(y.data(), m, n), opt, pool);
          else matmul(xt, wt, make_tensor(y.data(), m, n), opt, pool);
          return y;
        };
        const auto f32 = run(true, false);  // the f32 GEMM
        unsigned long before = detail::amx_gemm_calls().load();
        const auto off = run(false, true);
        CHECK(detail::amx_gemm_calls().load() == before);  // switched off: no tile call, the f32 GEMM's bits
        CHECK(std::memcmp(off.data(), f32.data(), f32.size() * sizeof(float)) == 0);
        if (!amx_support().usable_bf16()) continue;
        before = detail::amx_gemm_calls().load();
        const auto y = run(true, true);
        CHECK(detail::amx_gemm_calls().load() > before);
        if (threads == 1) y1 = y;
        else CHECK(std::memcmp(y.data(), y1.data(), y.size() * sizeof(float)) == 0);
        const double b = bound(k);
        double worst = 0, worst_rel = 0;
        std::size_t at = 0;
        for (std::size_t i = 0; i < m * n; ++i) {
          const double scale = abs_terms[i] + (acc ? std::fabs(double(c0[i])) : 0.0);
          const double err = std::fabs(double(y[i]) - ref[i]);
          const double r = err / (b * scale + 1e-30);
          if (r > worst || std::isnan(r)) {
            worst = std::isnan(r) ? 1e9 : r;
            at = i;
          }
          worst_rel = std::max(worst_rel, err / (scale + 1e-30));
        }
        INFO("worst |AMX - double reference| / bound: ", worst, " at (", at / n, ", ", at % n, "): ", y[at], " vs ",
             ref[at], "; worst error / sum |x w|: ", worst_rel, " (bound ", b, ")");
        CHECK(worst <= 1.0);
      }
    }
  }
}

}  // namespace amxbf_test

TEST_CASE("AMX bf16 GEMM: f16 weights (row-major and packed) within the derived bound of the double product") {
  if (!amxbf_test::usable_or_skip()) {
    amxbf_test::check_type<f16>(false);  // the fallback still checked
    return;
  }
  amxbf_test::check_type<f16>(false);
  amxbf_test::check_type<f16>(true);
}

TEST_CASE("AMX bf16 GEMM: bf16 weights (row-major and packed) within the derived bound of the double product") {
  if (!amxbf_test::usable_or_skip()) {
    amxbf_test::check_type<bf16>(false);
    return;
  }
  amxbf_test::check_type<bf16>(false);
  amxbf_test::check_type<bf16>(true);
}

TEST_CASE(
    "AMX bf16 GEMM: an infinite f16 weight gives non-finite outputs, the option is ignored by the GEMV and "
    "Bf16Mode::fast") {
  amxbf_test::SwitchGuard guard;
  set_amx_enabled({.enabled = true});
  const std::size_t m = 20, n = 16, k = 64;
  std::vector<f16> w(n * k, f16(0.5f));
  w[3 * k + 5] = f16(INFINITY);
  const std::vector<float> x(m * k, 1.0f);
  std::vector<float> y(m * n);
  matmul(make_tensor(x.data(), m, k), make_tensor<const f16>(w.data(), n, k), make_tensor(y.data(), m, n),
         MatmulOptions{.amx_bf16 = true});
  for (std::size_t i = 0; i < m; ++i) {
    CHECK_FALSE(std::isfinite(y[i * n + 3]));  // inf (f32 GEMM) or NaN (tiles: 0 * inf in the corrections)
    CHECK(y[i * n + 0] == 32.0f);              // 64 x 0.5, exact either way
  }
  // Rows of x <= 4 (the GEMV) and Bf16Mode::fast take their own kernels: no tile call.
  const unsigned long before = detail::amx_gemm_calls().load();
  matmul(make_tensor(x.data(), 4, k), make_tensor<const f16>(w.data(), n, k), make_tensor(y.data(), 4, n),
         MatmulOptions{.amx_bf16 = true});
  std::vector<bf16> wb(n * k, bf16(0.25f));
  matmul(make_tensor(x.data(), m, k), make_tensor<const bf16>(wb.data(), n, k), make_tensor(y.data(), m, n),
         MatmulOptions{.bf16 = Bf16Mode::fast, .amx_bf16 = true});
  CHECK(detail::amx_gemm_calls().load() == before);
  CHECK(y[0] == 16.0f);
}
