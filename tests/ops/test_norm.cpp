// RMSNorm and LayerNorm: SIMD (every target) against the scalar reference (double accumulation).
// Tolerance: rtol 2e-6, atol 1e-6. Float accumulation of n <= 4097 squares in 4 x lanes partial sums has
// relative error well under n * 2^-24 / lanes, and each output is one product away from it; 2e-6
// (~ 34 ulp) covers that with margin while still catching any wrong formula (errors >= 1e-3).
#include "test_util.hpp"

using namespace kiln;

TEST_CASE("rms_norm matches the scalar reference on every target, size, alignment and stride") {
  test::for_each_target([](const std::string&) {
    for (std::size_t n : test::kernel_sizes()) {
      for (bool one_plus : {false, true}) {
        CAPTURE(n);
        CAPTURE(one_plus);
        const std::size_t rows = 3, stride = n + 5;  // non-contiguous rows
        test::Misaligned xs(rows * stride, 1), os(rows * stride, 3);
        auto xv = test::random_floats(rows * stride, 42 + n, -3.f, 3.f);
        std::copy(xv.begin(), xv.end(), xs.ptr);
        auto w = test::random_floats(n, 7 + n, 0.5f, 1.5f);
        auto x = make_strided<const float, 2>(xs.ptr, {rows, n}, {std::ptrdiff_t(stride), 1});
        auto out = make_strided<float, 2>(os.ptr, {rows, n}, {std::ptrdiff_t(stride), 1});
        rms_norm(x, make_tensor<const float>(w.data(), n), out, 1e-5f,
                 one_plus ? NormWeight::one_plus : NormWeight::plain);
        std::vector<float> want(n);
        for (std::size_t r = 0; r < rows; ++r) {
          ref::rms_norm(xs.ptr + r * stride, w.data(), want.data(), n, 1e-5f, one_plus);
          test::check_close(os.ptr + r * stride, want.data(), n, 2e-6f, 1e-6f, "rms_norm");
        }
      }
    }
  });
}

TEST_CASE("layer_norm matches the scalar reference on every target, size, alignment and stride") {
  test::for_each_target([](const std::string&) {
    for (std::size_t n : test::kernel_sizes()) {
      CAPTURE(n);
      const std::size_t rows = 2, stride = n + 3;
      test::Misaligned xs(rows * stride, 2), os(rows * stride, 1);
      auto xv = test::random_floats(rows * stride, 3 + n, 1.f, 5.f);  // non-zero mean
      std::copy(xv.begin(), xv.end(), xs.ptr);
      auto w = test::random_floats(n, 5 + n, 0.5f, 1.5f), b = test::random_floats(n, 9 + n);
      auto x = make_strided<const float, 2>(xs.ptr, {rows, n}, {std::ptrdiff_t(stride), 1});
      auto out = make_strided<float, 2>(os.ptr, {rows, n}, {std::ptrdiff_t(stride), 1});
      layer_norm(x, make_tensor<const float>(w.data(), n), make_tensor<const float>(b.data(), n), out, 1e-5f);
      std::vector<float> want(n);
      for (std::size_t r = 0; r < rows; ++r) {
        ref::layer_norm(xs.ptr + r * stride, w.data(), b.data(), want.data(), n, 1e-5f);
        // n == 1: x - mean is exactly 0 so out == b; otherwise same bound as rms_norm (normalised x is O(1)).
        test::check_close(os.ptr + r * stride, want.data(), n, 2e-6f, 2e-6f, "layer_norm");
      }
    }
  });
}

TEST_CASE("rms_norm in place and threaded gives the same result as out of place") {
  const std::size_t rows = 64, n = 1024;
  auto xv = test::random_floats(rows * n, 1);
  auto w = test::random_floats(n, 2);
  std::vector<float> a(rows * n), b = xv;
  ThreadPool pool(2);
  rms_norm(make_tensor<const float>(xv.data(), rows, n), make_tensor<const float>(w.data(), n),
           make_tensor(a.data(), rows, n), 1e-6f);
  auto bv = make_tensor(b.data(), rows, n);
  rms_norm(bv, make_tensor<const float>(w.data(), n), bv, 1e-6f, NormWeight::plain, &pool);
  CHECK(a == b);
}

TEST_CASE("norm shape errors name the op and the shapes") {
  std::vector<float> x(12), w(5), o(12);
  auto xv = make_tensor<const float>(x.data(), 3, 4);
  CHECK_THROWS_WITH_AS(rms_norm(xv, make_tensor<const float>(w.data(), 5), make_tensor(o.data(), 3, 4), 1e-5f),
                       doctest::Contains("kiln::rms_norm: w f32(5) must be contiguous of length 4"), ShapeError);
  CHECK_THROWS_WITH_AS(rms_norm(xv, make_tensor<const float>(w.data(), 4), make_tensor(o.data(), 4, 3), 1e-5f),
                       doctest::Contains("x f32(3, 4) and out f32(4, 3) must have the same shape"), ShapeError);
  auto xt = transpose(make_tensor<const float>(x.data(), 4, 3));  // last dim has stride 3
  CHECK_THROWS_WITH_AS(rms_norm(xt, make_tensor<const float>(w.data(), 4), make_tensor(o.data(), 3, 4), 1e-5f),
                       doctest::Contains("must be contiguous in its last dimension"), ShapeError);
}
