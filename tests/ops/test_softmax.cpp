// softmax: SIMD on every target against the double-precision scalar reference, with scale, soft-cap and
// causal masking; fully masked rows; in place and threaded.
#include <cmath>
#include <limits>
#include <numeric>

#include "kiln/ops/softmax.hpp"
#include "test_util.hpp"

using namespace kiln;

namespace {

struct SoftmaxCase {
  const char* name;
  float lo, hi;  // logits range
  SoftmaxOptions opt;
};

// Tolerance, relative per element: exp(y - max) is evaluated at an argument rounded to ~|y - max| *
// 2^-24 (|y - max| <= 8 in every case below: 5e-7), the exp itself is 1 ulp, the soft-cap's tanh ~2
// ulp of the cap (1.2e-6 absolute in the exponent for cap 5); the sum is f32 over blocks of at most 16
// terms per lane, added in double (a few ulp), and 1/sum is one more rounding. Measured worst on every
// target: 4.6e-7 without and 1.2e-6 with the soft-cap. 3e-6 keeps a margin; a wrong max, scale, cap or
// mask is off by orders of magnitude more.
constexpr float kRtol = 3e-6f;

std::vector<SoftmaxCase> cases() {
  SoftmaxOptions plain, scaled, capped;
  scaled.scale = 0.088f;  // ~ 1 / sqrt(128)
  capped.scale = 0.5f;
  capped.softcap = 5.0f;  // Gemma 2 uses 50 for attention, 30 for the final logits; a small cap bites here
  return {{"plain", -4.f, 4.f, plain}, {"scaled", -40.f, 40.f, scaled}, {"softcap", -30.f, 30.f, capped}};
}

// The number of unmasked columns of query row r, written out independently of the kernel's helper.
std::size_t kept(std::size_t n, std::size_t r, std::ptrdiff_t offset) {
  std::ptrdiff_t k = std::ptrdiff_t(r) + offset + 1;
  return std::size_t(std::clamp<std::ptrdiff_t>(k, 0, std::ptrdiff_t(n)));
}

}  // namespace

TEST_CASE("softmax matches the scalar reference on every target, size, alignment, stride and mask") {
  test::for_each_target([](const std::string&) {
    for (const auto& c : cases()) {
      for (int mask = 0; mask < 3; ++mask) {  // none, causal with offset n - rows, causal with offset -1
        for (std::size_t n : test::kernel_sizes()) {
          const std::string name = c.name;
          CAPTURE(name);
          CAPTURE(mask);
          CAPTURE(n);
          const std::size_t rows = 3, stride = n + 5;
          SoftmaxOptions opt = c.opt;
          opt.causal = mask != 0;
          opt.causal_offset = mask == 1 ? std::ptrdiff_t(n) - std::ptrdiff_t(rows) : -1;
          test::Misaligned xs(rows * stride, 1), os(rows * stride, 2);
          auto xv = test::random_floats(rows * stride, 31 + n, c.lo, c.hi);
          std::copy(xv.begin(), xv.end(), xs.ptr);
          softmax(make_strided<const float, 2>(xs.ptr, {rows, n}, {std::ptrdiff_t(stride), 1}),
                  make_strided<float, 2>(os.ptr, {rows, n}, {std::ptrdiff_t(stride), 1}), opt);
          std::vector<float> want(n);
          for (std::size_t r = 0; r < rows; ++r) {
            const std::size_t valid = opt.causal ? kept(n, r, opt.causal_offset) : n;
            ref::softmax(xs.ptr + r * stride, want.data(), n, opt.scale, opt.softcap, valid);
            const float* got = os.ptr + r * stride;
            test::check_close(got, want.data(), n, kRtol, 1e-30f, "softmax");
            for (std::size_t j = valid; j < n; ++j) REQUIRE(got[j] == 0.0f);
            if (valid > 0) CHECK(std::accumulate(got, got + n, 0.0) == doctest::Approx(1.0).epsilon(1e-5));
          }
        }
      }
    }
  });
}

TEST_CASE("softmax: fully masked rows are zeros, -inf logits are masked, NaN propagates") {
  const float inf = std::numeric_limits<float>::infinity();
  test::for_each_target([&](const std::string&) {
    for (std::size_t n : {std::size_t(1), std::size_t(5), std::size_t(40)}) {
      CAPTURE(n);
      // (q_len = 4, n): offset -2 masks rows 0 and 1 entirely.
      std::vector<float> x = test::random_floats(4 * n, 3), out(4 * n, 123.f);
      SoftmaxOptions opt;
      opt.causal = true;
      opt.causal_offset = -2;
      softmax(make_tensor<const float>(x.data(), 4, n), make_tensor(out.data(), 4, n), opt);
      for (std::size_t j = 0; j < 2 * n; ++j) REQUIRE(out[j] == 0.0f);
      CHECK(out[2 * n] == 1.0f);  // row 2 keeps column 0 only
      // All logits -inf (an additive mask): zeros, not NaN. Partly -inf: those columns are exactly 0.
      std::vector<float> y(n, -inf), o(n, 123.f);
      softmax(make_tensor<const float>(y.data(), n), make_tensor(o.data(), n));
      for (float v : o) REQUIRE(v == 0.0f);
      y[n - 1] = 2.0f;
      softmax(make_tensor<const float>(y.data(), n), make_tensor(o.data(), n));
      for (std::size_t j = 0; j + 1 < n; ++j) REQUIRE(o[j] == 0.0f);
      CHECK(o[n - 1] == 1.0f);
      // A NaN logit makes the row NaN (as PyTorch does) instead of silently vanishing.
      std::vector<float> z = test::random_floats(n, 4);
      z[n / 2] = std::nanf("");
      softmax(make_tensor<const float>(z.data(), n), make_tensor(o.data(), n));
      for (float v : o) REQUIRE(std::isnan(v));
    }
  });
}

TEST_CASE("softmax in place, threaded, on (heads, q_len, kv_len) equals the single-threaded result") {
  const std::size_t heads = 8, q_len = 16, kv = 300;
  auto xv = test::random_floats(heads * q_len * kv, 5, -8.f, 8.f);
  SoftmaxOptions opt;
  opt.scale = 0.3f;
  opt.softcap = 10.0f;
  opt.causal = true;
  opt.causal_offset = std::ptrdiff_t(kv - q_len);
  std::vector<float> a(xv.size()), b = xv;
  softmax(make_tensor<const float>(xv.data(), heads, q_len, kv), make_tensor(a.data(), heads, q_len, kv), opt);
  ThreadPool pool(2);
  auto bv = make_tensor(b.data(), heads, q_len, kv);
  softmax(bv, bv, opt, &pool);
  CHECK(a == b);
  // The causal row index restarts at every head.
  std::vector<float> want(kv);
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t r = 0; r < q_len; ++r) {
      const std::size_t off = (h * q_len + r) * kv;
      ref::softmax(xv.data() + off, want.data(), kv, opt.scale, opt.softcap, kept(kv, r, opt.causal_offset));
      test::check_close(a.data() + off, want.data(), kv, kRtol, 1e-30f, "softmax 3d");
    }
}

TEST_CASE("softmax errors name the op and the shapes") {
  std::vector<float> x(12), o(12);
  auto xv = make_tensor<const float>(x.data(), 3, 4);
  CHECK_THROWS_WITH_AS(softmax(xv, make_tensor(o.data(), 4, 3)),
                       doctest::Contains("kiln::softmax: x f32(3, 4) and out f32(4, 3) must have the same shape"),
                       ShapeError);
  auto xt = transpose(make_tensor<const float>(x.data(), 4, 3));
  CHECK_THROWS_WITH_AS(
      softmax(xt, make_tensor(o.data(), 3, 4)),
      doctest::Contains("kiln::softmax: x f32(3, 4) strides (1, 3) must be contiguous in its last dimension"),
      ShapeError);
  SoftmaxOptions bad;
  bad.softcap = -1.0f;
  CHECK_THROWS_WITH_AS(softmax(xv, make_tensor(o.data(), 3, 4), bad),
                       doctest::Contains("kiln::softmax: softcap -1 must be >= 0"), Error);
}
