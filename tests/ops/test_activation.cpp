// Activations (silu, gelu tanh/erf), the gated products (swiglu, geglu) and the residual add: SIMD on
// every target against the double-precision scalar references.
#include <cmath>
#include <limits>

#include "kiln/ops/activation.hpp"
#include "test_util.hpp"

using namespace kiln;

namespace {

struct ActCase {
  Activation act;
  const char* name;
  float lo, hi;  // input range
  float rtol;    // relative tolerance against the exact value (see below)
};

// Tolerances (f32 ulp = 2^-23 relative, 1.2e-7):
//  silu: e^-|x| has an exact argument and is 1 ulp (ExpNonPos), then one add, at most one multiply,
//    a reciprocal (estimate + one Newton step, ~1 ulp) and a multiply: ~4 ulp; 5e-7 also covers the
//    targets without FMA. Range [-20, 20] reaches both saturated ends.
//  gelu_tanh: the kernel rounds u = sqrt(2/pi)(x + 0.044715 x^3) (about 2 ulp without FMA) and the
//    result x / (1 + exp(-2u)) has condition number |2u| in u, so the error is ~3 ulp + 2|u| * 2 ulp;
//    on [-5, 5] |u| <= 8.5, which gives ~37 ulp: 5e-6. (Any wrong constant shows up as >= 1e-3.)
//  gelu_erf: the erfc approximation is 1.2e-7 relative; the kernel keeps -x^2/2 exact (see
//    kernels/dense/activation-inl.h), so only its f32 evaluation and the two Exps (1 ulp each) add to it: measured
//    4.6e-7 on every target; 1e-6. Range [-8, 8]: erfc(5.7) = 1.6e-15, still normal.
//  Measured maxima on a dense grid: silu 2.8e-7, gelu_tanh 2.1e-6, gelu_erf 4.6e-7 (all targets).
// The gated forms multiply by up once more (0.5 ulp), inside the margins above.
const ActCase kCases[] = {
    {Activation::silu, "silu", -20.f, 20.f, 5e-7f},
    {Activation::gelu_tanh, "gelu_tanh", -5.f, 5.f, 5e-6f},
    {Activation::gelu_erf, "gelu_erf", -8.f, 8.f, 1e-6f},
};

// Runs the Tensor-level op for `act` (gated when up is given).
template <class X, class U, class O>
void run_op(Activation act, const X& x, const U* up, const O& out) {
  switch (act) {
    case Activation::silu:
      up ? swiglu(x, *up, out) : silu(x, out);
      break;
    case Activation::gelu_tanh:
      up ? geglu(x, *up, out) : gelu_tanh(x, out);
      break;
    case Activation::gelu_erf:
      up ? geglu(x, *up, out, Gelu::erf) : gelu_erf(x, out);
      break;
  }
}

}  // namespace

TEST_CASE("the activation references match independently known values") {
  // Known values: sigmoid(1) = 0.7310585786300049, Phi(1) = 0.8413447460685429, Phi(-3) = 0.001349898031630095
  // (normal CDF tables), and gelu_tanh(1) from its closed form.
  CHECK(ref::activation_exact(Activation::silu, 1.0) == doctest::Approx(0.7310585786300049).epsilon(1e-15));
  CHECK(ref::activation_exact(Activation::gelu_tanh, 1.0) == doctest::Approx(0.8411919906082768).epsilon(1e-15));
  CHECK(ref::activation_exact(Activation::gelu_erf, 1.0) == doctest::Approx(0.8413447460685429).epsilon(1e-15));
  CHECK(ref::activation_exact(Activation::gelu_erf, -3.0) == doctest::Approx(-0.004049694094890285).epsilon(1e-12));
}

TEST_CASE("silu, gelu_tanh, gelu_erf, swiglu and geglu match the references on every target, size and stride") {
  test::for_each_target([](const std::string&) {
    for (const ActCase& c : kCases) {
      for (bool gated : {false, true}) {
        for (std::size_t n : test::kernel_sizes()) {
          const std::string name = c.name;
          CAPTURE(name);
          CAPTURE(gated);
          CAPTURE(n);
          const std::size_t rows = 3, stride = n + 5;
          test::Misaligned xs(rows * stride, 1), us(rows * stride, 2), os(rows * stride, 3);
          auto xv = test::random_floats(rows * stride, 11 + n, c.lo, c.hi);
          auto uv = test::random_floats(rows * stride, 13 + n, -2.f, 2.f);
          std::copy(xv.begin(), xv.end(), xs.ptr);
          std::copy(uv.begin(), uv.end(), us.ptr);
          auto x = make_strided<const float, 2>(xs.ptr, {rows, n}, {std::ptrdiff_t(stride), 1});
          auto up = make_strided<const float, 2>(us.ptr, {rows, n}, {std::ptrdiff_t(stride), 1});
          auto out = make_strided<float, 2>(os.ptr, {rows, n}, {std::ptrdiff_t(stride), 1});
          run_op(c.act, x, gated ? &up : nullptr, out);
          std::vector<float> want(n);
          for (std::size_t r = 0; r < rows; ++r) {
            ref::activation(c.act, xs.ptr + r * stride, gated ? us.ptr + r * stride : nullptr, want.data(), n);
            // atol 1e-30: the saturated tails are exactly 0 in one and ~1e-38 in the other.
            test::check_close(os.ptr + r * stride, want.data(), n, c.rtol, 1e-30f, c.name);
          }
        }
      }
    }
  });
}

TEST_CASE("activations saturate cleanly at extreme inputs and propagate NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> xs{0.f, -0.f, 88.f, -88.f, 90.f, -90.f, 104.f, -104.f, 200.f, -200.f, 1e30f, -1e30f, 3e38f};
  test::for_each_target([&](const std::string&) {
    for (const ActCase& c : kCases) {
      const std::string name = c.name;
      CAPTURE(name);
      std::vector<float> got(xs.size()), want(xs.size());
      run_op(c.act, make_tensor(xs.data(), xs.size()), static_cast<const DenseTensor<float, 1>*>(nullptr),
             make_tensor(got.data(), got.size()));
      ref::activation(c.act, xs.data(), nullptr, want.data(), xs.size());
      for (std::size_t i = 0; i < xs.size(); ++i) {
        CAPTURE(xs[i]);
        CHECK(std::isfinite(got[i]));
        CHECK(std::fabs(got[i] - want[i]) <= 1e-30f + 1e-6f * std::fabs(want[i]));
      }
      std::vector<float> special{std::nanf(""), inf}, out(2);
      run_op(c.act, make_tensor(special.data(), 2), static_cast<const DenseTensor<float, 1>*>(nullptr),
             make_tensor(out.data(), 2));
      CHECK(std::isnan(out[0]));
      CHECK(out[1] == inf);  // every activation is x for large x
    }
  });
}

TEST_CASE("add is exact on every target, size and stride") {
  test::for_each_target([](const std::string&) {
    for (std::size_t n : test::kernel_sizes()) {
      CAPTURE(n);
      const std::size_t rows = 2, stride = n + 7;
      test::Misaligned as(rows * stride, 3), bs(rows * stride, 0), os(rows * stride, 1);
      auto av = test::random_floats(rows * stride, 17 + n, -100.f, 100.f);
      auto bv = test::random_floats(rows * stride, 19 + n);
      std::copy(av.begin(), av.end(), as.ptr);
      std::copy(bv.begin(), bv.end(), bs.ptr);
      add(make_strided<const float, 2>(as.ptr, {rows, n}, {std::ptrdiff_t(stride), 1}),
          make_strided<const float, 2>(bs.ptr, {rows, n}, {std::ptrdiff_t(stride), 1}),
          make_strided<float, 2>(os.ptr, {rows, n}, {std::ptrdiff_t(stride), 1}));
      std::vector<float> want(n);
      for (std::size_t r = 0; r < rows; ++r) {
        ref::add(as.ptr + r * stride, bs.ptr + r * stride, want.data(), n);
        CHECK(std::equal(want.begin(), want.end(), os.ptr + r * stride));  // one IEEE add: bit-exact
      }
    }
  });
}

TEST_CASE("activations in place and threaded equal out of place") {
  const std::size_t rows = 64, n = 1024;
  auto gv = test::random_floats(rows * n, 21, -6.f, 6.f), uv = test::random_floats(rows * n, 22);
  ThreadPool pool(2);
  auto gate = make_tensor<const float>(gv.data(), rows, n);
  auto up = make_tensor<const float>(uv.data(), rows, n);
  std::vector<float> a(rows * n), b = gv;
  swiglu(gate, up, make_tensor(a.data(), rows, n));
  auto bv = make_tensor(b.data(), rows, n);
  swiglu(bv, up, bv, &pool);  // out aliases gate
  CHECK(a == b);
  std::vector<float> c = uv;
  auto cv = make_tensor(c.data(), rows, n);
  add(gate, cv, cv, &pool);  // out aliases b
  for (std::size_t i = 0; i < c.size(); ++i) REQUIRE(c[i] == gv[i] + uv[i]);
  // Fused (rows, 2n) gate|up buffer, split into two strided views.
  std::vector<float> fused(rows * 2 * n);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < n; ++i) {
      fused[r * 2 * n + i] = gv[r * n + i];
      fused[r * 2 * n + n + i] = uv[r * n + i];
    }
  auto fv = make_tensor<const float>(fused.data(), rows, 2 * n);
  std::vector<float> d(rows * n);
  swiglu(slice<1>(fv, 0, n), slice<1>(fv, n, 2 * n), make_tensor(d.data(), rows, n), &pool);
  CHECK(a == d);
}

TEST_CASE("activation shape errors name the op and the shapes") {
  std::vector<float> x(12), u(12), o(12);
  auto xv = make_tensor<const float>(x.data(), 3, 4);
  CHECK_THROWS_WITH_AS(silu(xv, make_tensor(o.data(), 4, 3)),
                       doctest::Contains("kiln::silu: x f32(3, 4) and out f32(4, 3) must have the same shape"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(swiglu(xv, make_tensor<const float>(u.data(), 2, 6), make_tensor(o.data(), 3, 4)),
                       doctest::Contains("kiln::swiglu: gate f32(3, 4) and up f32(2, 6) must have the same shape"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(geglu(xv, make_tensor<const float>(u.data(), 3, 4), make_tensor(o.data(), 12)),
                       doctest::Contains("kiln::geglu: gate f32(3, 4) and out f32(12) must have the same shape"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(add(xv, make_tensor<const float>(u.data(), 4, 3), make_tensor(o.data(), 3, 4)),
                       doctest::Contains("kiln::add: a f32(3, 4) and b f32(4, 3) must have the same shape"),
                       ShapeError);
  auto xt = transpose(make_tensor<const float>(x.data(), 4, 3));  // last dim has stride 3
  CHECK_THROWS_WITH_AS(
      gelu_erf(xt, make_tensor(o.data(), 3, 4)),
      doctest::Contains("kiln::gelu_erf: x f32(3, 4) strides (1, 3) must be contiguous in its last dimension"),
      ShapeError);
}
