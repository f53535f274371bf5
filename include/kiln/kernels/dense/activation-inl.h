// kiln/kernels/dense/activation-inl.h - Highway bodies of ops/activation.hpp, compiled once per target by the
// KILN_IMPLEMENTATION translation unit (see kiln/implementation.hpp). Not for direct inclusion.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_DENSE_ACTIVATION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_DENSE_ACTIVATION_INL_H_
#undef KILN_KERNELS_DENSE_ACTIVATION_INL_H_
#else
#define KILN_KERNELS_DENSE_ACTIVATION_INL_H_
#endif

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "kiln/ops/activation.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// e^x for x <= 0: x = n ln2 + r with |r| <= ln2/2 (Cody-Waite), Highway's degree-7 polynomial for e^r
// (1 ulp), and 2^n added straight into the exponent bits. Results that would fall below e^-87 (where
// that bit trick leaves the normal range) are 0, -inf gives 0; a NaN input gives an unspecified value.
// ~16 operations against ~25 for hn::Exp, which also covers x > 0 and subnormal results. Shared with
// softmax-inl.h.
template <class D, class V>
HWY_INLINE V ExpNonPos(D d, V x) {
  const hn::RebindToUnsigned<D> du;
  const V magic = hn::Set(d, 12582912.0f);  // 1.5 * 2^23: the low mantissa bits of t hold round(x / ln2)
  const V t = hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), magic);
  const V n = hn::Sub(t, magic);
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693145751953125f), x);  // x - n ln2, ln2 in two parts
  r = hn::NegMulAdd(n, hn::Set(d, 1.428606765330187045e-06f), r);
  V p = hn::Set(d, 0.000198527617612853646278381f);  // e^r, Horner
  p = hn::MulAdd(p, r, hn::Set(d, 0.00139304355252534151077271f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.00833336077630519866943359f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.0416664853692054748535156f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.166666671633720397949219f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  const V y = hn::BitCast(d, hn::Add(hn::BitCast(du, p), hn::ShiftLeft<23>(hn::BitCast(du, t))));  // p * 2^n
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.0f)), y);
}

// 1 / b to ~1 ulp: the hardware estimate (14 bits on AVX-512, 12 on SSE/AVX2) and one Newton step,
// 3 operations of full throughput instead of a divide (one per 8-10 cycles for 16 lanes on x86). NEON's
// estimate (vrecpe) has 8 bits: two steps (8 -> 16 -> 32).
template <class D, class V>
HWY_INLINE V Reciprocal(D /*d*/, V b) {
  V r = hn::ApproximateReciprocal(b);
#if HWY_ARCH_ARM
  r = hn::MulAdd(r, hn::NegMulAdd(b, r, hn::Set(D(), 1.0f)), r);
#endif
  return hn::MulAdd(r, hn::NegMulAdd(b, r, hn::Set(D(), 1.0f)), r);  // r + r (1 - b r)
}

// x * sigmoid(a) = x / (1 + e^-a), through e = e^-|a| <= 1 only: x / (1 + e) for a >= 0 and
// x e / (1 + e) below, so neither side overflows and the negative tail keeps its relative accuracy.
template <class D, class V>
HWY_INLINE V MulSigmoid(D d, V x, V a) {
  const V e = ExpNonPos(d, hn::Neg(hn::Abs(a)));
  const V num = hn::IfThenElse(hn::Lt(a, hn::Zero(d)), hn::Mul(x, e), x);
  return hn::Mul(num, Reciprocal(d, hn::Add(hn::Set(d, 1.0f), e)));
}

// erfc(a / sqrt(2)) for a in [0, 14.85]: Numerical Recipes' erfcc, erfc(z) = t exp(-z^2 + P(t)),
// t = 1 / (1 + z/2), relative error 1.2e-7 for every z >= 0. The exponent is where f32 loses accuracy:
// erfc's relative sensitivity to z is 2z^2, so neither z = a / sqrt(2) nor z^2 may be rounded. Hence
// exp(-a^2/2) is taken as exp(-ah^2/2) exp((ah - a)(ah + a)/2) with ah = a rounded to 12 significant
// bits, so ah^2 is exact without FMA (Cody's trick). Measured error: 5e-7 relative up to z = 10.
template <class D, class V>
HWY_INLINE V ErfcHalfSqrt2(D d, V a) {
  const hn::RebindToUnsigned<D> du;
  const V z = hn::Mul(a, hn::Set(d, 0.70710678118654752f));
  const V t = hn::Div(hn::Set(d, 1.0f), hn::MulAdd(z, hn::Set(d, 0.5f), hn::Set(d, 1.0f)));
  V p = hn::Set(d, 0.17087277f);
  p = hn::MulAdd(p, t, hn::Set(d, -0.82215223f));
  p = hn::MulAdd(p, t, hn::Set(d, 1.48851587f));
  p = hn::MulAdd(p, t, hn::Set(d, -1.13520398f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.27886807f));
  p = hn::MulAdd(p, t, hn::Set(d, -0.18628806f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.09678418f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.37409196f));
  p = hn::MulAdd(p, t, hn::Set(d, 1.00002368f));
  p = hn::MulAdd(p, t, hn::Set(d, -1.26551223f));
  const V half = hn::Set(d, 0.5f);
  const V ah = hn::BitCast(d, hn::And(hn::BitCast(du, a), hn::Set(du, 0xFFFFF000u)));
  const V small = hn::MulAdd(hn::Mul(hn::Sub(ah, a), half), hn::Add(ah, a), p);  // (ah^2 - a^2) / 2 + P(t)
  const V big = hn::Mul(hn::Mul(ah, ah), hn::Set(d, -0.5f));                     // -ah^2 / 2, exact
  return hn::Mul(hn::Mul(t, hn::Exp(d, big)), hn::Exp(d, small));
}

template <Activation A, class D, class V>
HWY_INLINE V Act(D d, V x) {
  if constexpr (A == Activation::silu) {
    return MulSigmoid(d, x, x);  // x / (1 + exp(-x))
  } else if constexpr (A == Activation::gelu_tanh) {
    // 0.5 x (1 + tanh(u)) = x sigmoid(2u); 2u = x (k0 + k1 x^2), k0 = 2 sqrt(2/pi), k1 = k0 * 0.044715.
    const V two_u = hn::Mul(x, hn::MulAdd(hn::Mul(x, x), hn::Set(d, 0.0713548162726f), hn::Set(d, 1.5957691216057f)));
    return MulSigmoid(d, x, two_u);
  } else {
    // 0.5 x (1 + erf(z)), z = x / sqrt(2): 1 + erf(z) is 2 - erfc(z) for z >= 0 and erfc(-z) below, so
    // the negative tail keeps its relative accuracy. |x| is capped at 14.85 (z = 10.5): erfc is 0 there.
    const V c = ErfcHalfSqrt2(d, hn::Min(hn::Abs(x), hn::Set(d, 14.85f)));
    const V one_plus_erf = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), c, hn::Sub(hn::Set(d, 2.0f), c));
    return hn::Mul(hn::Mul(x, hn::Set(d, 0.5f)), one_plus_erf);
  }
}

template <Activation A, bool kGated>
HWY_NOINLINE void ActRows(const float* x, ptrdiff_t xs, const float* up, ptrdiff_t us, float* out, ptrdiff_t os,
                          size_t rows, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;  // the tail, one lane at a time with the same code
  const size_t N = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<ptrdiff_t>(r) * xs;
    const float* ur = kGated ? up + static_cast<ptrdiff_t>(r) * us : nullptr;
    float* o = out + static_cast<ptrdiff_t>(r) * os;
    size_t i = 0;
    for (; i + N <= n; i += N) {
      auto a = Act<A>(d, hn::LoadU(d, xr + i));
      if constexpr (kGated) a = hn::Mul(a, hn::LoadU(d, ur + i));
      hn::StoreU(a, d, o + i);
    }
    for (; i < n; ++i) {
      auto a = Act<A>(d1, hn::LoadU(d1, xr + i));
      if constexpr (kGated) a = hn::Mul(a, hn::LoadU(d1, ur + i));
      hn::StoreU(a, d1, o + i);
    }
  }
}

void ActivationF32(Activation act, const float* x, ptrdiff_t xs, const float* up, ptrdiff_t us, float* out,
                   ptrdiff_t os, size_t rows, size_t n) {
  switch (act) {
    case Activation::silu:
      return up ? ActRows<Activation::silu, true>(x, xs, up, us, out, os, rows, n)
                : ActRows<Activation::silu, false>(x, xs, up, us, out, os, rows, n);
    case Activation::gelu_tanh:
      return up ? ActRows<Activation::gelu_tanh, true>(x, xs, up, us, out, os, rows, n)
                : ActRows<Activation::gelu_tanh, false>(x, xs, up, us, out, os, rows, n);
    case Activation::gelu_erf:
      return up ? ActRows<Activation::gelu_erf, true>(x, xs, up, us, out, os, rows, n)
                : ActRows<Activation::gelu_erf, false>(x, xs, up, us, out, os, rows, n);
  }
}

// gpt-oss's clamped SwiGLU on one vector: g' = min(g, limit), u' = clamp(u, -limit, limit) (std::min and
// std::clamp's comparisons, so a NaN stays NaN), out = g' sigmoid(alpha g') (u' + 1).
template <class D>
HWY_INLINE void SwigluOaiStep(D d, const float* g, const float* u, float* out, float alpha, float limit) {
  const auto lim = hn::Set(d, limit), nlim = hn::Set(d, -limit);
  auto x = hn::LoadU(d, g);
  x = hn::IfThenElse(hn::Lt(lim, x), lim, x);
  auto y = hn::LoadU(d, u);
  y = hn::IfThenElse(hn::Lt(y, nlim), nlim, hn::IfThenElse(hn::Lt(lim, y), lim, y));
  const auto a = MulSigmoid(d, x, hn::Mul(x, hn::Set(d, alpha)));
  hn::StoreU(hn::Mul(a, hn::Add(y, hn::Set(d, 1.0f))), d, out);
}

HWY_NOINLINE void SwigluOaiF32(const float* g, ptrdiff_t gs, const float* u, ptrdiff_t us, float* out, ptrdiff_t os,
                               size_t rows, size_t n, float alpha, float limit) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;  // the tail, one lane at a time with the same code
  const size_t N = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    const float* gr = g + static_cast<ptrdiff_t>(r) * gs;
    const float* ur = u + static_cast<ptrdiff_t>(r) * us;
    float* o = out + static_cast<ptrdiff_t>(r) * os;
    size_t i = 0;
    for (; i + N <= n; i += N) SwigluOaiStep(d, gr + i, ur + i, o + i, alpha, limit);
    for (; i < n; ++i) SwigluOaiStep(d1, gr + i, ur + i, o + i, alpha, limit);
  }
}

void AddF32(const float* a, ptrdiff_t as, const float* b, ptrdiff_t bs, float* out, ptrdiff_t os, size_t rows,
            size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    const float* ar = a + static_cast<ptrdiff_t>(r) * as;
    const float* br = b + static_cast<ptrdiff_t>(r) * bs;
    float* o = out + static_cast<ptrdiff_t>(r) * os;
    size_t i = 0;
    for (; i + N <= n; i += N) hn::StoreU(hn::Add(hn::LoadU(d, ar + i), hn::LoadU(d, br + i)), d, o + i);
    for (; i < n; ++i) o[i] = ar[i] + br[i];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
HWY_EXPORT(ActivationF32);
HWY_EXPORT(AddF32);
HWY_EXPORT(SwigluOaiF32);
}  // namespace kiln

KILN_DISPATCH_BEGIN
void activation_f32(::kiln::Activation act, const float* x, std::ptrdiff_t xs, const float* up, std::ptrdiff_t us,
                    float* out, std::ptrdiff_t os, std::size_t rows, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(ActivationF32)(act, x, xs, up, us, out, os, rows, n);
}
void add_f32(const float* a, std::ptrdiff_t as, const float* b, std::ptrdiff_t bs, float* out, std::ptrdiff_t os,
             std::size_t rows, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(AddF32)(a, as, b, bs, out, os, rows, n);
}
void swiglu_oai_f32(const float* g, std::ptrdiff_t gs, const float* u, std::ptrdiff_t us, float* out, std::ptrdiff_t os,
                    std::size_t rows, std::size_t n, float alpha, float limit) {
  HWY_DYNAMIC_DISPATCH(SwigluOaiF32)(g, gs, u, us, out, os, rows, n, alpha, limit);
}
KILN_DISPATCH_END
#endif  // HWY_ONCE

#endif  // per-target include guard
