// matmul (C = A * B^T, B f32 / f16 / bf16): SIMD on every target against the scalar reference (double
// accumulation) and against Eigen (f32, zero-copy Maps), over GEMV and GEMM shapes, tails, misaligned and
// row-strided operands, accumulate, both bf16 modes, and 1 vs 2 threads; B row-major and column-major
// (transpose() of a row-major (K, N): the KV cache's values_t, its own GEMV kernel and GEMM packing).
//
// Tolerances, per output element, in units of S = sum_k |a_k b_k| (+ |c0| when accumulating):
//   f32 summation (any order, any blocking) of K + 2 terms (K products, c0, one final add) has
//   |error| <= (K + 2) u S, u = 2^-24 (Higham, Accuracy and Stability, 3.1). That bound is rigorous but
//   for large K so loose that a wrong term would pass, so for K + 2 > 64 we use the probabilistic bound
//   of Higham & Mary (SIAM J. Sci. Comput. 2019): |error| <= lambda sqrt(K + 2) u S with probability
//   >= 1 - 2 exp(-lambda^2 / 2); lambda = 8 makes that 2.5e-14 per element. bound(K) = u min(K + 2,
//   8 sqrt(K + 2)); for K = 4097 that is 3e-5 S, far below one product (~ S / K = 2.4e-4 S).
//   f16 / bf16 B widen exactly, so the same bound holds.
//   Against Eigen: both results are within bound(K) of the exact value, so 2 bound(K).
//   Bf16Mode::fast rounds A to bf16 (|delta a| <= 2^-8 |a|) and multiplies exactly (8-bit x 8-bit
//   significands fit f32): within bound(K) of the reference that rounds A the same way, and within
//   bound(K) + 2^-8 of the exact product.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <Eigen/Core>

#include "kiln/ops/matmul.hpp"
#include "kiln/quant/dequant.hpp"
#include "test_util.hpp"

using namespace kiln;

namespace {

constexpr double kU = 1.0 / 16777216.0;  // f32 unit roundoff 2^-24
constexpr double kBf16Rel = 1.0 / 256;   // bf16 (8 significant bits) rounding: relative error <= 2^-8

double sum_bound(std::size_t k) {
  const double n = double(k) + 2;
  return kU * std::min(n, 8 * std::sqrt(n));
}

#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
constexpr bool kSlowBuild = true;  // Debug / sanitizer builds: fewer, smaller shapes
#else
constexpr bool kSlowBuild = false;
#endif

template <class TB>
TB from_f32(float v) {
  if constexpr (std::is_same_v<TB, float>) return v;
  else return TB(v);
}

// One product's operands with padded (row-strided) or packed rows, at misaligned addresses.
template <class TB>
struct Problem {
  std::size_t m, n, k;
  std::ptrdiff_t lda, ldb, ldc;
  std::vector<float> a_store, c_store, c0;
  std::vector<TB> b_store;
  float* a;
  TB* b;
  float* c;
  std::vector<float> bf;  // B widened to f32 (exact), (n, k) packed, for Eigen
  bool col_major;         // B[j, p] at b[p * ldb + j] (B^T (k, n) row-major, ldb >= n)

  Problem(std::size_t m_, std::size_t n_, std::size_t k_, bool strided, std::uint32_t seed, bool col_major_ = false)
      : m(m_),
        n(n_),
        k(k_),
        lda(std::ptrdiff_t(k_ + (strided ? 3 : 0))),
        ldb(std::ptrdiff_t((col_major_ ? n_ : k_) + (strided ? 5 : 0))),
        ldc(std::ptrdiff_t(n_ + (strided ? 7 : 0))),
        col_major(col_major_) {
    // Offsets of 1 element from the allocation (itself 16-byte aligned): misaligned for every vector width.
    a_store.assign(m * lda + 16, 0.f);
    b_store.assign((col_major ? k : n) * ldb + 16, TB{});
    c_store.assign(m * ldc + 16, 0.f);
    a = a_store.data() + 1;
    b = b_store.data() + 1;
    c = c_store.data() + 3;
    const auto av = test::random_floats(m * k, seed), bv = test::random_floats(n * k, seed + 1);
    bf.resize(n * k);
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t p = 0; p < k; ++p) a[i * lda + p] = av[i * k + p];
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t p = 0; p < k; ++p) {
        TB& e = col_major ? b[p * ldb + j] : b[j * ldb + p];
        e = from_f32<TB>(bv[j * k + p]);
        bf[j * k + p] = to_f32(e);
      }
    c0 = test::random_floats(m * n, seed + 2);
  }

  void reset_c(bool accumulate) {
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) c[i * ldc + j] = accumulate ? c0[i * n + j] : 12345.f;  // poison
  }
  std::vector<float> c_packed() const {
    std::vector<float> out(m * n);
    for (std::size_t i = 0; i < m; ++i) std::copy_n(c + i * ldc, n, out.begin() + i * n);
    return out;
  }
  void run(const MatmulOptions& opt, ThreadPool* pool = nullptr) {
    const auto bv =
        col_major ? make_strided<const TB, 2>(b, {n, k}, {1, ldb}) : make_strided<const TB, 2>(b, {n, k}, {ldb, 1});
    matmul(make_strided<const float, 2>(a, {m, k}, {lda, 1}), bv, make_strided<float, 2>(c, {m, n}, {ldc, 1}), opt,
           pool);
  }
  // Scalar reference (double) into a packed (m, n) vector (column-major: over bf, B's exact f32 values).
  std::vector<float> reference(bool accumulate, bool fast_bf16) {
    reset_c(accumulate);
    if (col_major) ref::matmul(a, lda, bf.data(), std::ptrdiff_t(k), c, ldc, m, n, k, {.accumulate = accumulate});
    else
      ref::matmul(a, lda, b, ldb, c, ldc, m, n, k,
                  {.accumulate = accumulate, .bf16 = fast_bf16 ? Bf16Mode::fast : Bf16Mode::exact});
    return c_packed();
  }
  // S = sum_k |a_k b_k| (+ |c0|) per element.
  std::vector<double> abs_sums(bool accumulate) const {
    std::vector<double> s(m * n);
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        double t = accumulate ? std::fabs(double(c0[i * n + j])) : 0.0;
        for (std::size_t p = 0; p < k; ++p) t += std::fabs(double(a[i * lda + p]) * double(bf[j * k + p]));
        s[i * n + j] = t;
      }
    return s;
  }
  // Eigen: C = A * B^T in f32 (A a zero-copy strided Map; B the widened copy), + c0.
  std::vector<float> eigen(bool accumulate) const {
    using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<const RowMat, 0, Eigen::OuterStride<>> ea(a, Eigen::Index(m), Eigen::Index(k),
                                                         Eigen::OuterStride<>(lda));
    Eigen::Map<const RowMat> eb(bf.data(), Eigen::Index(n), Eigen::Index(k));
    std::vector<float> out(m * n);
    Eigen::Map<RowMat> ec(out.data(), Eigen::Index(m), Eigen::Index(n));
    ec.noalias() = ea * eb.transpose();
    if (accumulate)
      for (std::size_t i = 0; i < m * n; ++i) out[i] += c0[i];
    return out;
  }
};

// max |got - want| / (rel * S) <= 1, reporting the worst element.
void check_within(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& s,
                  double rel, const char* what) {
  std::size_t worst = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const double ratio = err / (rel * s[i] + 1e-30);
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }  // NaN counts as worst
  }
  INFO(what, ": worst at ", worst, " of ", got.size(), ": got ", got[worst], ", want ", want[worst], ", allowed ",
       rel * s[worst]);
  CHECK(worst_ratio <= 1.0);
}

// Checks one product on every target, in every mode that applies to TB.
template <class TB>
void check_product(std::size_t m, std::size_t n, std::size_t k, bool strided, bool accumulate, std::uint32_t seed,
                   bool col_major = false) {
  CAPTURE(m);
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(strided);
  CAPTURE(accumulate);
  CAPTURE(col_major);
  INFO("B dtype ", dtype_name<TB>);
  Problem<TB> pr(m, n, k, strided, seed, col_major);
  const auto want = pr.reference(accumulate, false);
  const auto s = pr.abs_sums(accumulate);
  const auto eig = pr.eigen(accumulate);
  const double tol = sum_bound(k);
  std::vector<float> want_fast;
  if constexpr (std::is_same_v<TB, bf16>) want_fast = pr.reference(accumulate, true);
  test::for_each_target([&](const std::string&) {
    pr.reset_c(accumulate);
    pr.run({.accumulate = accumulate});
    const auto got = pr.c_packed();
    check_within(got, want, s, tol, "vs scalar reference");
    check_within(got, eig, s, 2 * tol, "vs Eigen");
    if constexpr (std::is_same_v<TB, bf16>) {
      if (col_major) return;  // Bf16Mode::fast: row-major B only (refused: the shape errors below)
      pr.reset_c(accumulate);
      pr.run({.accumulate = accumulate, .bf16 = Bf16Mode::fast});
      const auto fast = pr.c_packed();
      check_within(fast, want_fast, s, tol * (1 + kBf16Rel), "fast bf16 vs reference with A rounded to bf16");
      check_within(fast, want, s, tol + kBf16Rel, "fast bf16 vs exact reference");
      check_within(fast, eig, s, 2 * tol + kBf16Rel, "fast bf16 vs Eigen");
    }
  });
}

template <class TB>
void check_gemv_shapes() {
  // M <= 4 is the GEMV path; every kernel size for K (tails around 16 and 64 lanes), N tails around the
  // 4-row groups.
  std::uint32_t seed = 1;
  for (std::size_t m : {1, 2, 3, 4}) {
    for (std::size_t k : test::kernel_sizes()) {
      if (kSlowBuild && k > 1000 && m > 1) continue;
      for (std::size_t n : {1, 3, 17, 64, 67}) {
        if (kSlowBuild && k >= 1000 && n > 17) continue;
        ++seed;
        check_product<TB>(m, n, k, seed % 2 == 0, seed % 3 == 0, seed * 101);
      }
    }
  }
}

template <class TB>
void check_gemm_shapes() {
  // M > 4 is the blocked GEMM path: M around the 6- and 12-row tiles, N around the 16/32-column panels,
  // K across the K blocks (256 f32 / 512 bf16 pairs on AVX-512, 512 on AVX2, 1024 on SSE4 / EMU128).
  std::uint32_t seed = 1000;
  for (std::size_t m : {5, 8, 17, 64, 130}) {
    for (std::size_t n : {1, 17, 33, 100}) {
      for (std::size_t k : {1, 17, 64, 300, 1100}) {
        if (kSlowBuild && (m * n * k > 300000 || (m > 17 && n > 17))) continue;
        ++seed;
        check_product<TB>(m, n, k, seed % 2 == 0, seed % 3 == 0, seed * 7);
      }
    }
  }
  check_product<TB>(600, 40, 20, true, true, 99);  // M past one 516-row M block
}

}  // namespace

// Column-major B: GEMV (M <= 4: N around its 1-4 vector passes, the padded last columns, and rows shorter
// than a vector (N = 2, 4, 8 unpadded: several positions per vector on wide targets); K from 1) and GEMM
// (M around the tiles, N around the panels, K across K blocks), every dtype.
template <class TB>
void check_col_major_shapes() {
  std::uint32_t seed = 5000;
  for (std::size_t m : {1, 2, 3, 4, 5, 13, 40})
    for (std::size_t n : {1, 2, 4, 7, 8, 16, 33, 64, 100, 256})
      for (std::size_t k : {1, 2, 17, 130, 600}) {
        if (kSlowBuild && m * n * k > 200000) continue;
        ++seed;
        check_product<TB>(m, n, k, seed % 2 == 0, seed % 3 == 0, seed * 13, true);
      }
}

TEST_CASE("matmul with a column-major B (transpose of a row-major K x N) matches the reference and Eigen") {
  check_col_major_shapes<float>();
  check_col_major_shapes<f16>();
  check_col_major_shapes<bf16>();
}

TEST_CASE("matmul GEMV (M <= 4) matches the reference and Eigen: f32 weights") { check_gemv_shapes<float>(); }
TEST_CASE("matmul GEMV (M <= 4) matches the reference and Eigen: f16 weights") { check_gemv_shapes<f16>(); }
TEST_CASE("matmul GEMV (M <= 4) matches the reference and Eigen: bf16 weights, exact and fast") {
  check_gemv_shapes<bf16>();
}
TEST_CASE("matmul GEMM (M > 4) matches the reference and Eigen: f32 weights") { check_gemm_shapes<float>(); }
TEST_CASE("matmul GEMM (M > 4) matches the reference and Eigen: f16 weights") { check_gemm_shapes<f16>(); }
TEST_CASE("matmul GEMM (M > 4) matches the reference and Eigen: bf16 weights, exact and fast") {
  check_gemm_shapes<bf16>();
}

template <class TB>
void check_threads(std::size_t m, std::size_t n, std::size_t k, Bf16Mode mode, bool col_major = false) {
  CAPTURE(m);
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(col_major);
  INFO("B dtype ", dtype_name<TB>, mode == Bf16Mode::fast ? " fast" : "");
  Problem<TB> pr(m, n, k, true, std::uint32_t(m * 31 + n), col_major);
  ThreadPool pool(2);
  pr.reset_c(false);
  pr.run({.bf16 = mode});
  const auto one = pr.c_packed();
  pr.reset_c(false);
  pr.run({.bf16 = mode}, &pool);
  const auto two = pr.c_packed();
  CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
}

TEST_CASE("matmul gives bit-identical results on 1 and 2 threads") {
  // GEMV split over N, GEMM split over N, GEMM split over M (N below two 64-column units).
  const std::size_t shapes[][3] = {{1, 300, 1000}, {3, 257, 517}, {64, 256, 300}, {130, 40, 600}, {37, 129, 260}};
  for (const auto& s : shapes) {
    check_threads<float>(s[0], s[1], s[2], Bf16Mode::exact);
    check_threads<f16>(s[0], s[1], s[2], Bf16Mode::exact);
    check_threads<bf16>(s[0], s[1], s[2], Bf16Mode::exact);
    check_threads<bf16>(s[0], s[1], s[2], Bf16Mode::fast);
    check_threads<float>(s[0], s[1], s[2], Bf16Mode::exact, true);
    check_threads<f16>(s[0], s[1], s[2], Bf16Mode::exact, true);
  }
}

// Rows of B shorter than a vector, stored back to back (ldb == k): attention's scores for head_dim 4 or 8,
// 16 / k rows per vector on AVX-512 (GemvTinyK). N around the 16-row groups and the repeated last row;
// K = 2 and 12 (and a padded ldb) take the general kernel. Each output depends only on its rows, so the
// results for the first rows are the same bits whatever N is, and on 1 or 2 threads.
template <class TB>
void check_tiny_k() {
  std::uint32_t seed = 9000;
  for (std::size_t k : {2, 4, 8, 12})
    for (std::size_t m : {1, 2, 3, 4})
      for (std::size_t n : {1, 5, 15, 16, 17, 31, 33, 100, 300}) {
        ++seed;
        check_product<TB>(m, n, k, false, seed % 2 == 0, seed * 17);
      }
  for (std::size_t k : {4, 8}) {
    CAPTURE(k);
    INFO("B dtype ", dtype_name<TB>);
    test::for_each_target([&](const std::string&) {
      Problem<TB> big(3, 300, k, false, 77), small(3, 17, k, false, 77);  // same seed: small's rows are big's first
      ThreadPool pool(2);
      big.reset_c(false);
      big.run({}, &pool);
      small.reset_c(false);
      small.run({});
      const auto two = big.c_packed();
      big.reset_c(false);
      big.run({});
      const auto one = big.c_packed(), few = small.c_packed();
      CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
      for (std::size_t i = 0; i < 3; ++i) CHECK(std::memcmp(&one[i * 300], &few[i * 17], 17 * sizeof(float)) == 0);
    });
  }
}

TEST_CASE("matmul GEMV over rows of B shorter than a vector (head_dim 4 / 8 scores) matches the reference") {
  check_tiny_k<float>();
  check_tiny_k<f16>();
}

// Decoding attention's scores (M = 1-4 query heads, K = head_dim 64 / 128 / 256, the 16-row kernel on AVX-512):
// each output the same bits as GemvM's order of operations, emulated here in scalar code: per lane l < L a
// chain of fused multiply-adds over p = l, l + L, ..., then SumOfLanes4 (per 128-bit block b: (x0 + x2) +
// (x1 + x3) of its lanes 4b .. 4b + 3; the blocks left to right), then + c when accumulating. So a row's
// scores do not depend on which rows share the call (a decode step splits a KV head's query heads across
// tasks). The AVX-512 (L = 16) and AVX2 (L = 8) targets, whose MulAdd is one fused operation; the others are
// held to the reference's bound by the tests above.
template <class TB>
void check_scores_order() {
  auto lane_sum = [](const float* a, const TB* b, std::size_t k, std::size_t L) {
    std::vector<float> acc(L, 0.0f);
    for (std::size_t p = 0; p < k; ++p) acc[p % L] = std::fma(a[p], float(b[p]), acc[p % L]);
    float s = 0.0f;
    for (std::size_t blk = 0; blk < L; blk += 4) {
      const float t = (acc[blk] + acc[blk + 2]) + (acc[blk + 1] + acc[blk + 3]);
      s = blk == 0 ? t : s + t;
    }
    return s;
  };
  test::for_each_target([&](const std::string& t) {
    const std::size_t L = t.rfind("AVX3", 0) == 0 ? 16 : t == "AVX2" ? 8 : 0;
    if (L == 0) return;
    std::uint32_t seed = 300;
    for (std::size_t k : {64, 128, 256})
      for (std::size_t m : {1, 2, 3, 4})
        for (std::size_t n : {1, 5, 16, 17, 40, 100})
          for (const bool acc : {false, true}) {
            CAPTURE(k);
            CAPTURE(m);
            CAPTURE(n);
            CAPTURE(acc);
            const std::size_t ldb = k + (seed % 3 == 0 ? 8 : 0);  // some rows padded, as a cache's stride
            const auto a = test::random_floats(m * k, ++seed);
            const auto bf = test::random_floats(n * ldb, ++seed);
            const std::vector<TB> b(bf.begin(), bf.end());
            auto c = test::random_floats(m * n, ++seed);
            const auto c0 = c;
            matmul(make_tensor<const float>(a.data(), m, k),
                   make_strided<const TB, 2>(b.data(), {n, k}, {std::ptrdiff_t(ldb), 1}), make_tensor(c.data(), m, n),
                   {.accumulate = acc});
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < m; ++i)
              for (std::size_t j = 0; j < n; ++j) {
                float want = lane_sum(&a[i * k], &b[j * ldb], k, L);
                if (acc) want = c0[i * n + j] + want;
                wrong += std::memcmp(&want, &c[i * n + j], sizeof(float)) != 0;
              }
            CHECK(wrong == 0);
          }
  });
}

TEST_CASE("matmul GEMV over rows of head_dim 64 / 128 / 256 (decoding scores) adds in GemvM's order on every row") {
  check_scores_order<float>();
  check_scores_order<f16>();
}

// dispatch::matmul_q8_0 (a q8_0 KV cache's decoding products: scores q K^T over rows of Q8_0 blocks, values s V
// with V's positions as rows of blocks): every output has the bits of matmul_f32's GEMV over the dequantized
// blocks (quant_traits<block_q8_0>::dequantize, the scalar reference), at head sizes with and without a
// GemvShortK kernel, more rows than one pass takes, padded rows and accumulation, on every target; and the
// scores are within the f32 bound of a double product (gamma_k sum |a b|, doubled for the lane sums).
TEST_CASE("matmul_q8_0 (a q8_0 KV cache's products) has the bits of the f32 GEMV over the dequantized blocks") {
  test::for_each_target([&](const std::string& t) {
    CAPTURE(t);
    std::uint32_t seed = 900;
    for (std::size_t k : {32, 64, 96, 128, 256})
      for (std::size_t m : {1, 3, 4, 6})
        for (std::size_t n : {1, 17, 40, 100})
          for (const bool acc : {false, true}) {
            CAPTURE(k);
            CAPTURE(m);
            CAPTURE(n);
            CAPTURE(acc);
            const std::size_t bpr = k / QK8_0, ldb = bpr + (seed % 3 == 0 ? 1 : 0);  // blocks; some rows padded
            std::vector<block_q8_0> b(n * ldb);
            std::vector<float> deq(n * k);
            const auto x = test::random_floats(n * k, ++seed, -2.f, 2.f);
            for (std::size_t j = 0; j < n; ++j)
              for (std::size_t q = 0; q < bpr; ++q) {
                quant_traits<block_q8_0>::quantize(&x[j * k + q * QK8_0], b[j * ldb + q]);
                quant_traits<block_q8_0>::dequantize(b[j * ldb + q], &deq[j * k + q * QK8_0]);
              }
            const unsigned f = acc ? detail::kMatmulAccumulate : 0u;
            // Scores: c (m, n) = a (m, k) B^T.
            const auto a = test::random_floats(m * k, ++seed);
            auto c = test::random_floats(m * n, ++seed);
            auto want = c;
            dispatch::matmul_q8_0(a.data(), std::ptrdiff_t(k), b.data(), std::ptrdiff_t(ldb), c.data(),
                                  std::ptrdiff_t(n), m, n, k, f);
            dispatch::matmul_f32(a.data(), std::ptrdiff_t(k), deq.data(), std::ptrdiff_t(k), want.data(),
                                 std::ptrdiff_t(n), m, n, k, f);
            CHECK(std::memcmp(c.data(), want.data(), c.size() * sizeof(float)) == 0);
            if (!acc)
              for (std::size_t i = 0; i < m; ++i)
                for (std::size_t j = 0; j < n; ++j) {
                  double s = 0, mag = 0;
                  for (std::size_t p = 0; p < k; ++p) {
                    s += double(a[i * k + p]) * deq[j * k + p];
                    mag += std::fabs(double(a[i * k + p]) * deq[j * k + p]);
                  }
                  CHECK(std::fabs(c[i * n + j] - s) <= 2.0 * double(k) * 0x1p-24 * mag + 1e-30);
                }
            // Values: c (m, k) = s (m, n) V, V (n positions, k) as rows of blocks.
            const auto sv = test::random_floats(m * n, ++seed, 0.f, 1.f);
            auto cv = test::random_floats(m * k, ++seed);
            auto wantv = cv;
            dispatch::matmul_q8_0(sv.data(), std::ptrdiff_t(n), b.data(), std::ptrdiff_t(ldb), cv.data(),
                                  std::ptrdiff_t(k), m, k, n, f | detail::kMatmulColMajorB);
            dispatch::matmul_f32(sv.data(), std::ptrdiff_t(n), deq.data(), std::ptrdiff_t(k), wantv.data(),
                                 std::ptrdiff_t(k), m, k, n, f | detail::kMatmulColMajorB);
            CHECK(std::memcmp(cv.data(), wantv.data(), cv.size() * sizeof(float)) == 0);
          }
  });
}

TEST_CASE("matmul takes batched and rank-1 views, and K = 0") {
  const std::size_t batch = 2, seq = 3, n = 5, k = 7;
  auto x = test::random_floats(batch * seq * k, 1), w = test::random_floats(n * k, 2);
  std::vector<float> y(batch * seq * n), want(batch * seq * n);
  matmul(make_tensor<const float>(x.data(), batch, seq, k), make_tensor<const float>(w.data(), n, k),
         make_tensor(y.data(), batch, seq, n));
  ref::matmul(x.data(), std::ptrdiff_t(k), w.data(), std::ptrdiff_t(k), want.data(), std::ptrdiff_t(n), batch * seq, n,
              k);
  test::check_close(y.data(), want.data(), y.size(), 1e-6f, 1e-6f, "batched");  // K = 7: error <= 9 u S

  std::vector<float> v(n);
  matmul(make_tensor<const float>(x.data(), k), make_tensor<const float>(w.data(), n, k), make_tensor(v.data(), n));
  test::check_close(v.data(), want.data(), n, 1e-6f, 1e-6f, "rank 1");

  std::vector<float> z(6, 1.f);
  matmul(make_tensor<const float>(x.data(), 2, 0), make_tensor<const float>(w.data(), 3, 0),
         make_tensor(z.data(), 2, 3));
  CHECK(std::all_of(z.begin(), z.end(), [](float f) { return f == 0.f; }));
  std::fill(z.begin(), z.end(), 1.f);
  matmul(make_tensor<const float>(x.data(), 2, 0), make_tensor<const float>(w.data(), 3, 0),
         make_tensor(z.data(), 2, 3), {.accumulate = true});
  CHECK(std::all_of(z.begin(), z.end(), [](float f) { return f == 1.f; }));
}

TEST_CASE("matmul shape errors name the op and the shapes") {
  std::vector<float> a(64), b(64), c(64);
  std::vector<bf16> bb(64);
  auto av = make_tensor<const float>(a.data(), 2, 4);
  CHECK_THROWS_WITH_AS(matmul(av, make_tensor<const float>(b.data(), 3, 5), make_tensor(c.data(), 2, 3)),
                       doctest::Contains("kiln::matmul: a f32(2, 4), b f32(3, 5) and c f32(2, 3) do not fit"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(matmul(av, make_tensor<const bf16>(bb.data(), 3, 4), make_tensor(c.data(), 2, 5)),
                       doctest::Contains("b bf16(3, 4) and c f32(2, 5) do not fit"), ShapeError);
  CHECK_THROWS_WITH_AS(matmul(make_tensor<const float>(a.data(), 2, 2, 4), make_tensor<const float>(b.data(), 3, 4),
                              make_tensor(c.data(), 2, 3, 3)),
                       doctest::Contains("do not fit"), ShapeError);
  // Neither row- nor column-major: refused. (A transpose of a row-major matrix is column-major: taken.)
  const auto b2 = make_strided<const float, 2>(b.data(), {3, 4}, {2, 6});
  CHECK_THROWS_WITH_AS(matmul(av, b2, make_tensor(c.data(), 2, 3)),
                       doctest::Contains("kiln::matmul: b f32(3, 4) strides (2, 6) must be contiguous in its last"),
                       ShapeError);
  const auto bbt = transpose(make_tensor<const bf16>(bb.data(), 4, 3));  // (3, 4), column-major
  CHECK_THROWS_WITH_AS(matmul(av, bbt, make_tensor(c.data(), 2, 3), {.bf16 = Bf16Mode::fast}),
                       doctest::Contains("Bf16Mode::fast is not implemented for a column-major b"), ShapeError);
  CHECK_THROWS_WITH_AS(matmul(av, transpose(make_tensor<const float>(b.data(), 4, 3)), make_tensor(b.data() + 2, 2, 3)),
                       doctest::Contains("overlaps"), ShapeError);
  CHECK_THROWS_WITH_AS(matmul(av, make_tensor<const float>(b.data(), 3, 4), make_tensor(a.data() + 4, 2, 3)),
                       doctest::Contains("overlaps"), ShapeError);
}
