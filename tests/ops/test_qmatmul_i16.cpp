// qmatmul_i16 (ops/qmatmul_i16.hpp: x rounded to 16 bits per block of 32, integer block dots):
//   - the 16-bit rounding itself: |q| <= 32767, |q dx - x| <= dx / 2, zero blocks;
//   - against kiln::ref::qmatmul_i16 (reference dequantization, double sums) within f32 rounding, for every
//     supported type, W row-major (strided rows) and 16-row interleaved, x and y strided, shapes with tails
//     in every loop (M around the 6-row panels and the 252-row pass, N around groups of 16 and the 64-row
//     thread split, K across the 256-value panels), 1 and 2 threads;
//   - bit-identical on every target (AVX2's vpmaddwd kernel and quantizer against the plain C++ of the
//     others) and for any thread count;
//   - within the 16-bit rounding's bound of the true product (ref::qmatmul_dequant);
//   - errors: unsupported types, K not whole blocks, shapes, overlapping output.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/ops/qmatmul.hpp"
#include "kiln/ops/qmatmul_i16.hpp"
#include "kiln/quant/interleave.hpp"
#include "test_util.hpp"
#include "weights_util.hpp"

using namespace kiln;

namespace {

ThreadPool& i16_pool2() {
  static ThreadPool p(2);
  return p;
}

constexpr uint32_t kI16Types[] = {ggml_type_id::Q4_0, ggml_type_id::Q4_1, ggml_type_id::Q5_0,
                                  ggml_type_id::Q5_1, ggml_type_id::Q8_0, ggml_type_id::Q4_K};

std::size_t i16_block(uint32_t t) { return t == ggml_type_id::Q4_K ? 256 : 32; }

std::string i16_type_name(uint32_t t) { return std::string(io::ggml_type_name(io::GGMLType(t))); }

// W (n rows of k values, contiguous) interleaved in 16-row groups.
std::vector<uint8_t> i16_interleaved(uint32_t type, const std::vector<uint8_t>& w, std::size_t n, std::size_t k) {
  std::vector<uint8_t> out(w.size());
  visit_ggml_type(type, [&]<class B>(B*) {
    if constexpr (kernels::qmm_interleavable_v<B>)
      kernels::qmm_interleave_rows(reinterpret_cast<const B*>(w.data()), n, k / block_size_v<B>,
                                   reinterpret_cast<B*>(out.data()));
  });
  return out;
}

// Rows of x with a spread of block magnitudes, a zero block and a block with one large outlier.
std::vector<float> i16_inputs(std::size_t m, std::size_t ldx, std::size_t k, uint32_t seed) {
  auto x = test::random_floats(m * ldx, seed);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t b = 0; b < k / 32; ++b) {
      float* xb = x.data() + i * ldx + 32 * b;
      const float s = float(1 + (i + 3 * b) % 5) * (b % 7 == 3 ? 1e-3f : 1.0f);
      for (int e = 0; e < 32; ++e) xb[e] *= s;
      if ((i + b) % 11 == 4) std::fill_n(xb, 32, 0.0f);
      if ((i + b) % 13 == 5) xb[(i + b) % 32] = 40.0f;
    }
  return x;
}

}  // namespace

TEST_CASE("qmatmul_i16: the 16-bit rounding of a block") {
  auto x = test::random_floats(32 * 50, 7);
  for (std::size_t b = 0; b < 50; ++b) {
    float* xb = x.data() + 32 * b;
    const float s = std::ldexp(1.0f, int(b % 21) - 10);
    for (int e = 0; e < 32; ++e) xb[e] *= s;
    if (b == 3) std::fill_n(xb, 32, 0.0f);
    if (b == 4) xb[5] = -s;  // the largest magnitude negative: q = -32767
    int16_t q[32];
    const float dx = detail::qmm_i16_quantize_block(xb, q);
    float amax = 0;
    for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(xb[e]));
    CAPTURE(b);
    if (amax == 0) {
      CHECK(dx == 0.0f);
      for (int e = 0; e < 32; ++e) CHECK(q[e] == 0);
      continue;
    }
    CHECK(dx == amax / 32767.0f);
    int big = 0;
    for (int e = 0; e < 32; ++e) {
      CHECK(std::abs(int(q[e])) <= 32767);
      CHECK(std::fabs(double(q[e]) * dx - xb[e]) <= 0.5 * double(dx) * (1 + 1e-5));
      big = std::max(big, std::abs(int(q[e])));
    }
    CHECK(big == 32767);
  }
}

TEST_CASE("qmatmul_i16: against the reference, every type, layout, target and thread count") {
  struct Shape {
    std::size_t m, n, k;
  };
  // M: 1, tails of 6-row panels, 258 (a second 252-row pass); N: below one group, tails around 16 and 64;
  // K: one block, 8 blocks (one panel), 9 and 17 blocks (tails of the 256-value panels); Q4_K takes the
  // multiples of 256.
  const Shape shapes[] = {{1, 16, 32},   {5, 17, 64},    {7, 33, 288},   {13, 64, 256}, {6, 15, 544},
                          {37, 100, 96}, {258, 40, 288}, {64, 130, 544}, {7, 33, 512},  {258, 40, 768}};
  for (const uint32_t type : kI16Types) {
    for (std::size_t si = 0; si < std::size(shapes); ++si) {
      const std::size_t m = shapes[si].m, n = shapes[si].n, k = shapes[si].k;  // (clang 14: lambdas below use them)
      if (k % i16_block(type) != 0) continue;
      const std::size_t row = ggml_row_bytes(type, k);
      const std::size_t ldx = k + 5, ldy = n + 3, pad = si % 2 ? 0 : 2 * ggml_row_bytes(type, i16_block(type));
      const auto x = i16_inputs(m, ldx, k, uint32_t(100 + si));
      const auto wc = test::random_weights(type, n, k, uint32_t(7 * si + type));  // contiguous rows
      std::vector<uint8_t> ws(n * (row + pad));                                   // the same rows, strided
      for (std::size_t j = 0; j < n; ++j) std::memcpy(ws.data() + j * (row + pad), wc.data() + j * row, row);
      const auto wi = i16_interleaved(type, wc, n, k);
      std::vector<float> want(m * ldy, -7.0f);
      ref::qmatmul_i16(x.data(), ldx, m, k, type, wc.data(), n, row, want.data(), ldy);
      // |sum of the block terms| bounds for the f32 rounding: sum |w - mn| |q dx| + |mn sx|, about sum |w x|.
      std::vector<float> wrow(k);
      std::vector<double> mag(m * n, 0.0);
      for (std::size_t j = 0; j < n; ++j) {
        dequantize_row(type, wc.data() + j * row, wrow.data(), k);
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t e = 0; e < k; ++e) mag[i * n + j] += std::fabs(double(wrow[e]) * x[i * ldx + e]);
      }
      const auto xt = make_strided<const float, 2>(x.data(), {m, k}, {std::ptrdiff_t(ldx), 1});
      std::vector<float> first;
      test::for_each_target([&](const std::string&) {
        for (const bool inter : {false, true}) {
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &i16_pool2()}) {
            CAPTURE(i16_type_name(type));
            CAPTURE(m);
            CAPTURE(n);
            CAPTURE(k);
            CAPTURE(inter);
            CAPTURE(pool != nullptr);
            std::vector<float> y(m * ldy, -7.0f);
            const auto yt = make_strided<float, 2>(y.data(), {m, n}, {std::ptrdiff_t(ldy), 1});
            if (inter) kernels::qmatmul_i16(xt, type, wi.data(), n, 0, yt, pool, {.interleaved = true});
            else kernels::qmatmul_i16(xt, type, ws.data(), n, row + pad, yt, pool);
            double worst = 0;
            for (std::size_t i = 0; i < m; ++i)
              for (std::size_t j = 0; j < n; ++j) {
                const double err = std::fabs(double(y[i * ldy + j]) - double(want[i * ldy + j]));
                worst = std::max(worst, err / (1e-5 * mag[i * n + j] + 1e-30));
              }
            CHECK(worst <= 1.0);
            for (std::size_t i = 0; i < m; ++i)  // the padding between rows of y is untouched
              for (std::size_t j = n; j < ldy; ++j) REQUIRE(y[i * ldy + j] == -7.0f);
            if (first.empty()) first = y;
            else CHECK(std::memcmp(first.data(), y.data(), y.size() * sizeof(float)) == 0);
          }
        }
      });
    }
  }
}

TEST_CASE("qmatmul_i16: the GEMV (1-4 rows of x) gives the GEMM's rows bit for bit, every layout and split") {
  // 1-4 rows of x take the GEMV where dispatch::qmatmul_i16_gemv_rows says so (AVX2: Q8_0; its kernels for
  // interleaved groups and for row-major rows 8 at a time: W row-major with rows an odd number of bytes
  // apart, and an interleaved W's rows past its last group); rows inside a 40-row x take the GEMM.
  // N: below a group and 8 rows, tails, many groups (several per thread); K: 1 to 64 blocks.
  struct Shape {
    std::size_t n, k;
  };
  const Shape shapes[] = {{16, 32}, {5, 64}, {17, 256}, {40, 288}, {100, 512}, {1000, 2048}, {130, 768}};
  std::size_t gemv_cases = 0;
  for (const uint32_t type : kI16Types) {
    for (std::size_t si = 0; si < std::size(shapes); ++si) {
      const std::size_t n = shapes[si].n, k = shapes[si].k;  // (clang 14: lambdas below use them)
      if (k % i16_block(type) != 0) continue;
      const std::size_t m = 40, row = ggml_row_bytes(type, k);
      const auto x = i16_inputs(m, k, k, uint32_t(300 + si));
      const auto wc = test::random_weights(type, n, k, uint32_t(11 * si + type));
      const auto wi = i16_interleaved(type, wc, n, k);
      const std::size_t lds = row + 3;  // the same rows, an odd number of bytes apart
      std::vector<uint8_t> ws(n * lds);
      for (std::size_t j = 0; j < n; ++j) std::memcpy(ws.data() + j * lds, wc.data() + j * row, row);
      test::for_each_target([&](const std::string& target) {
        const std::size_t gemv_rows = dispatch::qmatmul_i16_gemv_rows(type);
        CHECK(gemv_rows == (target == "AVX2" && type == ggml_type_id::Q8_0 ? 4u : 0u));
        gemv_cases += gemv_rows > 0;
        for (const bool inter : {false, true}) {
          const uint8_t* w = inter ? wi.data() : ws.data();
          const std::size_t ldw = inter ? row : lds;
          std::vector<float> gemm(m * n);
          kernels::qmatmul_i16(make_tensor(x.data(), m, k), type, w, n, ldw, make_tensor(gemm.data(), m, n), nullptr,
                               {.interleaved = inter});
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &i16_pool2()}) {
            for (const std::size_t rows : {1u, 2u, 3u, 4u}) {
              for (const std::size_t i : {std::size_t(0), std::size_t(7), m - rows}) {
                CAPTURE(i16_type_name(type));
                CAPTURE(n);
                CAPTURE(k);
                CAPTURE(inter);
                CAPTURE(pool != nullptr);
                CAPTURE(rows);
                CAPTURE(i);
                const std::size_t ldy = n + 1;
                std::vector<float> y(rows * ldy, -7.0f);
                kernels::qmatmul_i16(make_tensor(x.data() + i * k, rows, k), type, w, n, ldw,
                                     make_strided<float, 2>(y.data(), {rows, n}, {std::ptrdiff_t(ldy), 1}), pool,
                                     {.interleaved = inter});
                for (std::size_t r = 0; r < rows; ++r) {
                  CHECK(std::memcmp(y.data() + r * ldy, gemm.data() + (i + r) * n, n * sizeof(float)) == 0);
                  CHECK(y[r * ldy + n] == -7.0f);  // nothing past the row
                }
              }
            }
          }
        }
      });
    }
  }
  const auto t = test::targets();
  if (std::find(t.begin(), t.end(), "AVX2") != t.end()) CHECK(gemv_cases == std::size(shapes));  // Q8_0's shapes
}

TEST_CASE("qmatmul_i16: within the 16-bit rounding's bound of the true product") {
  const std::size_t m = 9, n = 40, k = 512;
  const auto x = i16_inputs(m, k, k, 3);
  for (const uint32_t type : kI16Types) {
    CAPTURE(i16_type_name(type));
    const auto w = test::random_weights(type, n, k, 11);
    const std::size_t row = ggml_row_bytes(type, k);
    std::vector<float> y(m * n), wrow(k);
    kernels::qmatmul_i16(make_tensor(x.data(), m, k), type, w.data(), n, 0, make_tensor(y.data(), m, n));
    for (std::size_t j = 0; j < n; ++j) {
      dequantize_row(type, w.data() + j * row, wrow.data(), k);
      for (std::size_t i = 0; i < m; ++i) {
        double exact = 0, bound = 0, mag = 0;
        for (std::size_t b = 0; b < k / 32; ++b) {
          float amax = 0;
          for (std::size_t e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[i * k + 32 * b + e]));
          for (std::size_t e = 32 * b; e < 32 * b + 32; ++e) {
            exact += double(wrow[e]) * x[i * k + e];
            bound += std::fabs(double(wrow[e])) * double(amax) / 32767.0 / 2.0;
            mag += std::fabs(double(wrow[e]) * x[i * k + e]);
          }
        }
        CHECK(std::fabs(double(y[i * n + j]) - exact) <= bound + 1e-5 * mag);
      }
    }
  }
}

TEST_CASE("qmatmul_i16: errors name what is wrong") {
  const std::size_t m = 8, n = 16, k = 64;
  std::vector<float> x(m * k, 0.5f), y(m * n);
  const auto w = test::random_weights(ggml_type_id::Q8_0, n, k, 1);
  const auto xt = make_tensor(x.data(), m, k);
  const auto yt = make_tensor(y.data(), m, n);
  CHECK_THROWS_WITH_AS(kernels::qmatmul_i16(xt, ggml_type_id::Q6_K, w.data(), n, 0, yt), doctest::Contains("q4_0"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(
      kernels::qmatmul_i16(make_tensor(x.data(), m, std::size_t(48)), ggml_type_id::Q8_0, w.data(), n, 0, yt),
      doctest::Contains("multiple of the block size"), ShapeError);
  CHECK_THROWS_WITH_AS(kernels::qmatmul_i16(xt, ggml_type_id::Q8_0, w.data(), n + 1, 0, yt),
                       doctest::Contains("do not fit"), ShapeError);
  CHECK_THROWS_WITH_AS(kernels::qmatmul_i16(xt, ggml_type_id::Q8_0, w.data(), n, 10, yt), doctest::Contains("shorter"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(
      kernels::qmatmul_i16(xt, ggml_type_id::Q8_0, w.data(), n, ggml_row_bytes(ggml_type_id::Q8_0, k) + 4, yt, nullptr,
                           {.interleaved = true}),
      doctest::Contains("contiguous"), ShapeError);
  CHECK_THROWS_WITH_AS(kernels::qmatmul_i16(make_tensor(x.data(), std::size_t(2), k), ggml_type_id::Q8_0, w.data(), n,
                                            0, make_tensor(x.data() + 8, std::size_t(2), n)),
                       doctest::Contains("overlaps"), ShapeError);
}
