// qmatmul: every weight type x every Highway target x GEMV/GEMM shapes, against two scalar references.
//
// (b) ref::qmatmul_int: the same activation quantization and the same exact integer block sums, scaled in
//     double. The kernels differ from it only by f32 rounding of the scaled partial sums: every partial a
//     kernel rounds (a lane of a block's integer sum times dx, then accumulated with a weight scale) is
//     bounded by abs_terms (see the reference), and each output sees at most ~150 roundings per lane in
//     these shapes (K <= 2304: the GEMM's 144 sequential FMAs per lane for Q6_K's 16-value groups, or 72
//     groups of two FMAs with a min term; plus the conversion, the scale product and the final 16-lane
//     reduction), so |got - want| <= 150 * 2^-24 * abs_terms < 1e-5 * abs_terms.
//     Any wrong nibble, scale, offset or min is an error of order one whole term, far above that.
// (a) ref::qmatmul_dequant: W dequantized (f32), dotted with the unquantized x in double. The kernels
//     compute exactly sum_i w_i * (dx q_i) with q_i = nearest(x_i * id), id = fl(127 / amax),
//     dx = fl(amax / 127). |x_i - dx q_i| <= |x_i| |1 - id dx| + dx |fl(x_i id) - x_i id| + dx / 2
//     <= dx (127 * 2.01 * 2^-24 + 127 * 2^-24 + 1/2) <= dx / 2 * (1 + 2^-14), so per block of the
//     activation quantization the error is <= sum_i |w_i| * dx / 2 * (1 + 2^-14). Add the f32 rounding
//     bound above and the f32 rounding of quant_traits' dequantization (<= 2^-23 |w_i| per weight, e.g.
//     Q4_1's d * q + m or Q6_K's (d * sc) * q), and |got - true| must stay under the sum.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kiln/ops/qmatmul.hpp"
#include "test_util.hpp"

using namespace kiln;

namespace {

// Test sizes; smaller under the sanitizers (each reference is O(M N K) scalar double code).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSmall = true;
#else
constexpr bool kSmall = false;
#endif

std::vector<std::size_t> test_ks(std::size_t bs) {
  if (bs == 32)
    return kSmall ? std::vector<std::size_t>{32, 96, 256, 1056, 2304}
                  : std::vector<std::size_t>{32, 96, 256, 512, 1056, 2304};
  return kSmall ? std::vector<std::size_t>{256, 2304} : std::vector<std::size_t>{256, 512, 2304};
}

struct MN {
  std::size_t m, n;
};
// Every M in {1, 2, 3, 7, 16, 33} (and the GEMV/GEMM boundary 4/5) with two of N in {1, 3, 17, 64, 129}.
std::vector<MN> test_mns() {
  if (kSmall) return {{1, 129}, {2, 3}, {3, 17}, {4, 1}, {5, 64}, {7, 3}, {16, 17}, {33, 64}};
  return {{1, 1},  {1, 129}, {2, 3}, {2, 64},   {3, 17},  {3, 129}, {4, 17},
          {5, 64}, {7, 64},  {7, 1}, {16, 129}, {16, 17}, {33, 3},  {33, 64}};
}

// Random weights: quantized random floats when quant_traits can quantize B (and !raw), else random bytes
// with finite random scales (every bit pattern of the quants and packed sub-block scales is valid).
template <class B>
std::vector<B> make_weights(std::size_t rows, std::size_t stride_blocks, std::size_t k, uint32_t seed, bool raw) {
  std::vector<B> w(rows * stride_blocks);
  std::mt19937 rng(seed);
  auto* bytes = reinterpret_cast<uint8_t*>(w.data());
  for (std::size_t i = 0; i < w.size() * sizeof(B); ++i) bytes[i] = uint8_t(rng());
  std::uniform_real_distribution<float> sc(-0.05f, 0.05f);
  if constexpr (Quantizable<B>) {
    if (!raw) {
      for (std::size_t r = 0; r < rows; ++r) {
        auto f = test::random_floats(k, seed * 31 + uint32_t(r), -1.f, 1.f);
        const float row_scale = 0.25f + float(r % 5);
        for (auto& v : f) v *= row_scale;
        quantize_row(f.data(), w.data() + r * stride_blocks, k);
      }
      return w;
    }
  }
  for (auto& b : w) {
    if constexpr (requires { b.e; }) {
      b.e = uint8_t(110 + rng() % 24);  // MXFP4: 2^-18 .. 2^5 (e8m0's ends: the case "MXFP4 scales ...")
    } else {
      b.d = f16(sc(rng));
      if constexpr (requires { b.m; }) b.m = f16(sc(rng));
      if constexpr (requires { b.dmin; }) b.dmin = f16(sc(rng) * 0.2f);
    }
  }
  return w;
}

// x rows: uniform with a different magnitude per 32 values, one all-zero block (amax = 0).
std::vector<float> make_x(std::size_t m, std::size_t ldx, std::size_t k, uint32_t seed) {
  auto x = test::random_floats(m * ldx, seed, -1.f, 1.f);
  const float mags[4] = {1.f, 1e-3f, 30.f, 0.2f};
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = 0; p < k; ++p) x[i * ldx + p] *= mags[(p / 32 + i) % 4];
  if (k >= 64)
    for (std::size_t p = 32; p < 64; ++p) x[p] = 0.f;  // row 0, block 1
  return x;
}

ThreadPool& pool2() {
  static ThreadPool p(2);
  return p;
}

template <class B>
void check_type() {
  constexpr std::size_t bs = block_size_v<B>;
  const std::size_t g = bs == 256 ? 256 : 32;  // activation quantization block
  uint32_t seed = 1;
  std::size_t case_no = 0;
  for (std::size_t k : test_ks(bs)) {
    for (const MN mn : test_mns()) {
      const std::size_t m = mn.m, n = mn.n, nbk = k / bs;
      ++case_no;
      const bool raw = !Quantizable<B> || case_no % 2 == 0;
      const std::size_t ldw = nbk + (case_no % 3 == 0 ? 3 : 0);  // row stride in blocks
      const std::size_t ldx = k + 5, ldy = n + 2;
      CAPTURE(dtype_name<B>);
      CAPTURE(k);
      CAPTURE(m);
      CAPTURE(n);
      CAPTURE(raw);
      const auto w = make_weights<B>(n, ldw, k, ++seed, raw);
      test::Misaligned xs(m * ldx, 1);
      const auto xv = make_x(m, ldx, k, ++seed);
      std::copy(xv.begin(), xv.end(), xs.ptr);

      // References.
      std::vector<float> yb(m * n), ya(m * n);
      std::vector<double> abs_terms(m * n), bound(m * n);
      ref::qmatmul_int(xs.ptr, std::ptrdiff_t(ldx), w.data(), std::ptrdiff_t(ldw), yb.data(), std::ptrdiff_t(n), m, n,
                       k, abs_terms.data());
      ref::qmatmul_dequant(xs.ptr, std::ptrdiff_t(ldx), w.data(), std::ptrdiff_t(ldw), ya.data(), std::ptrdiff_t(n), m,
                           n, k);
      {
        std::vector<int8_t> q(k);
        std::vector<float> dx(k / g), wf(k);
        for (std::size_t j = 0; j < n; ++j) {
          dequantize_row(w.data() + j * ldw, wf.data(), k);
          for (std::size_t i = 0; i < m; ++i) {
            const float* xi = xs.ptr + i * ldx;
            ref::qmm_quantize_act(xi, k, g, q.data(), dx.data());
            double e = 0, wx = 0;
            for (std::size_t b = 0; b < k / g; ++b) {
              double sw = 0;
              for (std::size_t t = b * g; t < (b + 1) * g; ++t) sw += std::fabs(double(wf[t]));
              e += sw * double(dx[b]) * 0.5 * (1.0 + std::ldexp(1.0, -14));
            }
            for (std::size_t t = 0; t < k; ++t) wx += std::fabs(double(wf[t]) * double(xi[t]));
            bound[i * n + j] = e + std::ldexp(wx, -22) + 1e-5 * abs_terms[i * n + j] + 1e-30;
          }
        }
      }

      const auto xt = make_strided<const float, 2>(xs.ptr, {m, k}, {std::ptrdiff_t(ldx), 1});
      const auto wt = make_strided<const B, 2>(w.data(), {n, nbk}, {std::ptrdiff_t(ldw), 1});
      std::vector<float> y(m * ldy), y_best;
      const auto yt = make_strided<float, 2>(y.data(), {m, n}, {std::ptrdiff_t(ldy), 1});
      test::for_each_target([&](const std::string& target) {
        std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
        qmatmul(xt, wt, yt);
        double worst_b = 0, worst_a = 0;
        std::size_t wb = 0, wa = 0;
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t j = 0; j < n; ++j) {
            const double got = y[i * ldy + j];
            const double rb = std::fabs(got - yb[i * n + j]) / (1e-5 * abs_terms[i * n + j] + 1e-30);
            const double ra = std::fabs(got - ya[i * n + j]) / bound[i * n + j];
            if (!(rb <= worst_b)) {
              worst_b = rb;
              wb = i * n + j;
            }
            if (!(ra <= worst_a)) {
              worst_a = ra;
              wa = i * n + j;
            }
          }
        INFO("vs integer reference: worst at (", wb / n, ", ", wb % n, "): got ", y[(wb / n) * ldy + wb % n], " want ",
             yb[wb], " abs_terms ", abs_terms[wb]);
        CHECK(worst_b <= 1.0);
        INFO("vs dequantized product: worst at (", wa / n, ", ", wa % n, "): got ", y[(wa / n) * ldy + wa % n],
             " want ", ya[wa], " bound ", bound[wa]);
        CHECK(worst_a <= 1.0);
        // Gaps in y's rows are untouched.
        for (std::size_t i = 0; i < m; ++i) CHECK(std::isnan(y[i * ldy + n]));
        if (y_best.empty()) {  // the best target, first: the same on 2 threads
          y_best = y;
          std::vector<float> y2(m * ldy, 0.f);
          qmatmul(xt, wt, make_strided<float, 2>(y2.data(), {m, n}, {std::ptrdiff_t(ldy), 1}), &pool2());
          bool same = true;
          for (std::size_t i = 0; i < m; ++i)
            same = same && std::memcmp(&y2[i * ldy], &y[i * ldy], n * sizeof(float)) == 0;
          INFO("target ", target, ": 1 and 2 threads differ");
          CHECK(same);
        }
      });
    }
  }
}

}  // namespace

// qmatmul_split_act: x = dx q + r with r itself rounded to 8 bits with the scale dx_r = dx / 2^s, s >= 8.
// r = fl(x - fl(dx q)) is within 127 * 2^-24 dx of x - dx q (the product's rounding; the subtraction is exact
// by Sterbenz or q = 0), so |r| <= dx / 2 (1 + 2^-13) and its rounding error is <= dx_r / 2 <= dx / 512, or
// <= dx / 252 where r * 256 / dx rounds to 128 and is clamped to 127 (ref::qmm_split_residual_act). The
// bound is sum_i |w_i| |x_i - (dx q_i + dx_r q_r,i)| per block (the two parts' representation error,
// each value checked <= dx / 252 too), plus twice the kernel's f32 rounding (two products), the
// dequantization rounding and the final addition: ~125-250x tighter than qmatmul's sum_i |w_i| dx / 2.
template <class B>
void check_split() {
  constexpr std::size_t bs = block_size_v<B>;
  const std::size_t g = bs == 256 ? 256 : 32, k = bs == 256 ? 512 : 256, nbk = k / bs;
  uint32_t seed = 100;
  for (std::size_t m : {1, 2, 3, 7}) {
    for (std::size_t n : {3, 64}) {
      CAPTURE(dtype_name<B>);
      CAPTURE(m);
      CAPTURE(n);
      const auto w = make_weights<B>(n, nbk, k, ++seed, !Quantizable<B>);
      const auto x = make_x(m, k, k, ++seed);
      std::vector<float> ya(m * n), yi(m * n), y(m * n);
      std::vector<double> abs_terms(m * n);
      ref::qmatmul_int(x.data(), std::ptrdiff_t(k), w.data(), std::ptrdiff_t(nbk), yi.data(), std::ptrdiff_t(n), m, n,
                       k, abs_terms.data());
      ref::qmatmul_dequant(x.data(), std::ptrdiff_t(k), w.data(), std::ptrdiff_t(nbk), ya.data(), std::ptrdiff_t(n), m,
                           n, k);
      for (std::size_t threads : {1, 2}) {
        kernels::qmatmul_split_act(make_tensor(x.data(), m, k), dtype_traits<B>::ggml_type, w.data(), n, 0,
                                   make_tensor(y.data(), m, n), threads == 2 ? &pool2() : nullptr);
        std::vector<int8_t> q(k), qr(k);
        std::vector<float> dx(k / g), dxr(k / g), wf(k);
        double worst = 0, worst8 = 0, worst_value = 0;
        for (std::size_t j = 0; j < n; ++j) {
          dequantize_row(w.data() + j * nbk, wf.data(), k);
          for (std::size_t i = 0; i < m; ++i) {
            ref::qmm_quantize_act(x.data() + i * k, k, g, q.data(), dx.data());
            ref::qmm_split_residual_act(x.data() + i * k, k, g, qr.data(), dxr.data());
            double e = 0, wx = 0;
            for (std::size_t t = 0; t < k; ++t) {
              const double xe =
                  std::fabs(double(x[i * k + t]) - (double(dx[t / g]) * q[t] + double(dxr[t / g]) * qr[t]));
              if (dx[t / g] > 0) worst_value = std::max(worst_value, xe / double(dx[t / g]));
              e += std::fabs(double(wf[t])) * xe;
            }
            for (std::size_t t = 0; t < k; ++t) wx += std::fabs(double(wf[t]) * double(x[i * k + t]));
            const double bound = e + std::ldexp(wx, -22) + 2e-5 * abs_terms[i * n + j] +
                                 std::ldexp(std::fabs(double(ya[i * n + j])), -22) + 1e-30;
            worst = std::max(worst, std::fabs(double(y[i * n + j]) - ya[i * n + j]) / bound);
            worst8 = std::max(worst8, std::fabs(double(yi[i * n + j]) - ya[i * n + j]) / bound);
          }
        }
        INFO("threads ", threads, ": worst |split - dequantized product| / bound ", worst,
             "; the one-part (qmatmul) error is up to ", worst8, " of it; worst activation error ", worst_value, " dx");
        CHECK(worst <= 1.0);
        CHECK(worst_value <= 1.0 / 252);
      }
    }
  }
}

TEST_CASE("qmatmul_split_act stays within its two-part activation bound for every weight type") {
  check_split<block_q8_0>();
  check_split<block_q4_0>();
  check_split<block_q4_1>();
  check_split<block_q5_0>();
  check_split<block_q5_1>();
  check_split<block_q4_K>();
  check_split<block_q5_K>();
  check_split<block_q6_K>();
  check_split<block_mxfp4>();
}

TEST_CASE("qmatmul q8_0 matches the integer and dequantized references on every target") { check_type<block_q8_0>(); }
TEST_CASE("qmatmul q4_0 matches the integer and dequantized references on every target") { check_type<block_q4_0>(); }
TEST_CASE("qmatmul q4_1 matches the integer and dequantized references on every target") { check_type<block_q4_1>(); }
TEST_CASE("qmatmul q5_0 matches the integer and dequantized references on every target") { check_type<block_q5_0>(); }
TEST_CASE("qmatmul q5_1 matches the integer and dequantized references on every target") { check_type<block_q5_1>(); }
TEST_CASE("qmatmul q4_K matches the integer and dequantized references on every target") { check_type<block_q4_K>(); }
TEST_CASE("qmatmul q5_K matches the integer and dequantized references on every target") { check_type<block_q5_K>(); }
TEST_CASE("qmatmul q6_K matches the integer and dequantized references on every target") { check_type<block_q6_K>(); }
TEST_CASE("qmatmul mxfp4 matches the integer and dequantized references on every target") { check_type<block_mxfp4>(); }

// Every e8m0 scale byte, 0 (2^-128 with the doubled values: an f32 subnormal) to 255 (2^127): each is one
// weight matrix of that scale, multiplied (GEMV: 1 row, GEMM: 9 rows, one and two activation parts) by x of
// magnitude 2^clamp(64 - e, -60, 60), so that the scale products dw * dx and the outputs stay normal f32 and
// the integer reference's bound (1e-5 abs_terms, as in check_type) applies. A scale read wrongly is off by a
// power of two at least.
TEST_CASE("qmatmul mxfp4: every e8m0 scale byte on every target") {
  constexpr std::size_t k = 96, n = 19, nbk = k / 32;
  for (const std::size_t m : {std::size_t{1}, std::size_t{9}}) {
    for (int e = 0; e < 256; ++e) {
      auto w = make_weights<block_mxfp4>(n, nbk, k, uint32_t(700 + e), true);
      for (auto& b : w) b.e = uint8_t(e);
      auto x = test::random_floats(m * k, uint32_t(900 + e), -1.f, 1.f);
      const float mag = std::ldexp(1.0f, std::clamp(64 - e, -60, 60));
      for (auto& v : x) v *= mag;
      std::vector<float> yi(m * n), ya(m * n);
      std::vector<double> abs_terms(m * n), bound2(m * n);
      ref::qmatmul_int(x.data(), std::ptrdiff_t(k), w.data(), std::ptrdiff_t(nbk), yi.data(), std::ptrdiff_t(n), m, n,
                       k, abs_terms.data());
      ref::qmatmul_dequant(x.data(), std::ptrdiff_t(k), w.data(), std::ptrdiff_t(nbk), ya.data(), std::ptrdiff_t(n), m,
                           n, k);
      {  // the two-part bound of check_split: x's two parts within dx / 252 of x per value
        std::vector<int8_t> q(k);
        std::vector<float> dx(k / 32), wf(k);
        for (std::size_t j = 0; j < n; ++j) {
          dequantize_row(w.data() + j * nbk, wf.data(), k);
          for (std::size_t i = 0; i < m; ++i) {
            ref::qmm_quantize_act(x.data() + i * k, k, 32, q.data(), dx.data());
            double b = 0, wx = 0;
            for (std::size_t t = 0; t < k; ++t) {
              b += std::fabs(double(wf[t])) * double(dx[t / 32]) / 252;
              wx += std::fabs(double(wf[t]) * double(x[i * k + t]));
            }
            bound2[i * n + j] = b + std::ldexp(wx, -22) + 2e-5 * abs_terms[i * n + j];
          }
        }
      }
      test::for_each_target([&](const std::string& target) {
        CAPTURE(target);
        CAPTURE(m);
        CAPTURE(e);
        std::vector<float> y(m * n, std::nanf("")), y2(m * n, std::nanf(""));
        qmatmul(make_tensor(x.data(), m, k), make_tensor(w.data(), n, nbk), make_tensor(y.data(), m, n));
        kernels::qmatmul_split_act(make_tensor(x.data(), m, k), ggml_type_id::MXFP4, w.data(), n, 0,
                                   make_tensor(y2.data(), m, n));
        double worst = 0, worst2 = 0;
        for (std::size_t i = 0; i < m * n; ++i) {
          worst = std::max(worst, std::fabs(double(y[i]) - yi[i]) / (1e-5 * abs_terms[i]));
          worst2 = std::max(worst2, std::fabs(double(y2[i]) - ya[i]) / bound2[i]);
        }
        CHECK(worst <= 1.0);
        CHECK(worst2 <= 1.0);
      });
    }
  }
}

TEST_CASE("qmatmul splits M or N over threads with bit-identical results") {
  // N = 16 (one GEMM panel): the pool splits M; N = 200: it splits N into ranges that are not multiples of 64.
  for (const MN mn : {MN{64, 16}, MN{40, 200}, MN{1, 200}, MN{3, 1000}}) {
    const std::size_t k = 512, m = mn.m, n = mn.n;
    CAPTURE(m);
    CAPTURE(n);
    const auto w = make_weights<block_q4_K>(n, k / 256, k, 7, true);
    const auto x = test::random_floats(m * k, 9);
    std::vector<float> y1(m * n), y2(m * n);
    const auto xt = make_tensor(x.data(), m, k);
    const auto wt = make_tensor(w.data(), n, k / 256);
    qmatmul(xt, wt, make_tensor(y1.data(), m, n));
    qmatmul(xt, wt, make_tensor(y2.data(), m, n), &pool2());
    CHECK(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("qmatmul takes batched, rank-1 and run-time typed weights") {
  const std::size_t k = 96, n = 5;
  const auto w = make_weights<block_q8_0>(n, k / 32, k, 3, false);
  const auto x = test::random_floats(2 * 3 * k, 4);
  std::vector<float> y(2 * 3 * n), y2(2 * 3 * n), y1(n);
  qmatmul(make_tensor(x.data(), 2, 3, k), make_tensor(w.data(), n, k / 32), make_tensor(y.data(), 2, 3, n));
  qmatmul(make_tensor(x.data(), 6, k), make_tensor(w.data(), n, k / 32), make_tensor(y2.data(), 6, n));
  CHECK(y == y2);
  // Rank 1 is one row (the GEMV path, like any M <= 4).
  std::vector<float> y1b(n);
  qmatmul(make_tensor(x.data() + k, k), make_tensor(w.data(), n, k / 32), make_tensor(y1.data(), n));
  qmatmul(make_tensor(x.data() + k, 1, k), make_tensor(w.data(), n, k / 32), make_tensor(y1b.data(), 1, n));
  CHECK(y1 == y1b);
  // Run-time typed: the same bytes through a type id and a pointer.
  std::fill(y2.begin(), y2.end(), 0.f);
  qmatmul(make_tensor(x.data(), 6, k), ggml_type_id::Q8_0, w.data(), n, 0, make_tensor(y2.data(), 6, n));
  CHECK(y == y2);
  // F32 weights forward to matmul.
  std::vector<float> wf(n * k);
  dequantize_row(w.data(), wf.data(), n * k);
  std::vector<float> yf(6 * n), yr(6 * n);
  qmatmul(make_tensor(x.data(), 6, k), ggml_type_id::F32, wf.data(), n, 0, make_tensor(yf.data(), 6, n));
  matmul(make_tensor<const float>(x.data(), 6, k), make_tensor<const float>(wf.data(), n, k),
         make_tensor(yr.data(), 6, n));
  CHECK(yf == yr);
  // K = 0 and N = 0.
  std::vector<float> z(4, 1.f);
  qmatmul(make_tensor(x.data(), 2, std::size_t(0)), make_tensor(w.data(), 2, std::size_t(0)),
          make_tensor(z.data(), 2, 2));
  CHECK(z == std::vector<float>(4, 0.f));
}

TEST_CASE("qmatmul shape errors name the op and the shapes") {
  const auto w = make_weights<block_q4_0>(4, 3, 96, 5, false);
  std::vector<float> x(2 * 100), y(2 * 8);
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const ShapeError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string not_multiple =
      msg([&] { qmatmul(make_tensor(x.data(), 2, 100), make_tensor(w.data(), 4, 3), make_tensor(y.data(), 2, 4)); });
  CHECK(not_multiple.find("kiln::qmatmul") != std::string::npos);
  CHECK(not_multiple.find("K = 100") != std::string::npos);
  CHECK(not_multiple.find("f32(2, 100)") != std::string::npos);
  const std::string mismatch =
      msg([&] { qmatmul(make_tensor(x.data(), 2, 96), make_tensor(w.data(), 4, 3), make_tensor(y.data(), 2, 5)); });
  CHECK(mismatch.find("kiln::qmatmul") != std::string::npos);
  CHECK(mismatch.find("q4_0(4, 3)") != std::string::npos);
  CHECK(mismatch.find("f32(2, 5)") != std::string::npos);
  const std::string k_mismatch =
      msg([&] { qmatmul(make_tensor(x.data(), 2, 64), make_tensor(w.data(), 4, 3), make_tensor(y.data(), 2, 4)); });
  CHECK(k_mismatch.find("do not fit") != std::string::npos);
  const std::string overlap =
      msg([&] { qmatmul(make_tensor(x.data(), 2, 96), make_tensor(w.data(), 4, 3), make_tensor(x.data() + 4, 2, 4)); });
  CHECK(overlap.find("overlaps") != std::string::npos);
  const std::string unsupported = msg(
      [&] { qmatmul(make_tensor(x.data(), 2, 256), ggml_type_id::Q2_K, w.data(), 1, 0, make_tensor(y.data(), 2, 1)); });
  CHECK(unsupported.find("not supported") != std::string::npos);
}
