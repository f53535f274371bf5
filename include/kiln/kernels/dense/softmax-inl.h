// kiln/kernels/dense/softmax-inl.h - Highway body of ops/softmax.hpp, compiled once per target by the
// KILN_IMPLEMENTATION translation unit (see kiln/implementation.hpp). Not for direct inclusion.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_DENSE_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_DENSE_SOFTMAX_INL_H_
#undef KILN_KERNELS_DENSE_SOFTMAX_INL_H_
#else
#define KILN_KERNELS_DENSE_SOFTMAX_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/ops/softmax.hpp"
#include "kiln/kernels/dense/activation-inl.h"  // ExpNonPos (per target, like the Highway headers)

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One row of softmax over its first `valid` columns (the rest become 0). Three passes over a row that
// stays in L1/L2 between them, so memory sees one read of x and one write of out:
//   1. max of y = scale * x (with a soft-cap, y is computed once and parked in out);
//   2. out = exp(y - max), summed;
//   3. out *= 1 / sum.
// exp is ExpNonPos (activation-inl.h; 1 ulp, arguments <= 0 here), tanh is built on it. The tail runs
// the same code on one lane. x may equal out (in place). A NaN logit (or +inf without a soft-cap) makes
// the row NaN, as in PyTorch.
template <bool kSoftcap>
HWY_INLINE void SoftmaxRow(const float* x, float* out, size_t n, size_t valid, float scale, float cap) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const size_t N = hn::Lanes(d);
  const float kNegInf = -std::numeric_limits<float>::infinity();

  // y = scale * x, soft-capped: cap * tanh(scale * x / cap), with tanh(a) = sign(a) (1 - e) / (1 + e),
  // e = exp(-2|a|). Its absolute error, ~2^-24 * cap, is that of rounding the capped logit itself.
  // Also returns the pre-tanh value, for the NaN check.
  auto transform = [&](auto dd, auto v, auto& pre) {
    if constexpr (kSoftcap) {
      pre = hn::Mul(v, hn::Set(dd, scale / cap));
      const auto e = ExpNonPos(dd, hn::Mul(hn::Abs(pre), hn::Set(dd, -2.0f)));
      const auto t = hn::Mul(hn::Sub(hn::Set(dd, 1.0f), e), Reciprocal(dd, hn::Add(hn::Set(dd, 1.0f), e)));
      return hn::Mul(hn::CopySignToAbs(t, pre), hn::Set(dd, cap));
    } else {
      pre = hn::Mul(v, hn::Set(dd, scale));
      return pre;
    }
  };

  // Pass 1: the maximum.
  auto m0 = hn::Set(d, kNegInf), m1 = m0;
  auto nan = hn::Lt(m0, m0);  // all false
  size_t i = 0;
  for (; i + 2 * N <= valid; i += 2 * N) {
    auto p0 = m0, p1 = m0;
    const auto y0 = transform(d, hn::LoadU(d, x + i), p0), y1 = transform(d, hn::LoadU(d, x + i + N), p1);
    if constexpr (kSoftcap) {
      hn::StoreU(y0, d, out + i);
      hn::StoreU(y1, d, out + i + N);
    }
    m0 = hn::Max(m0, y0);
    m1 = hn::Max(m1, y1);
    if constexpr (kSoftcap) nan = hn::Or(nan, hn::Or(hn::IsNaN(p0), hn::IsNaN(p1)));
    else nan = hn::Or(nan, hn::IsNaN(hn::Add(p0, p1)));  // NaN if either is, or +inf meets -inf (NaN anyway)
  }
  for (; i + N <= valid; i += N) {
    auto p = m0;
    const auto y = transform(d, hn::LoadU(d, x + i), p);
    if constexpr (kSoftcap) hn::StoreU(y, d, out + i);
    m0 = hn::Max(m0, y);
    nan = hn::Or(nan, hn::IsNaN(p));
  }
  // The lanes' maximum, reduced here: Highway 1.0.3's EMU128 MaxOfLanes (the target clang builds where
  // GCC builds SCALAR) starts from the lowest finite float, so a row of -inf logits would read -FLT_MAX
  // and turn into 0 / 0 instead of a masked row.
  HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(hn::Max(m0, m1), d, lanes);
  float m = lanes[0];
  for (size_t j = 1; j < N; ++j) m = std::max(m, lanes[j]);
  bool any_nan = !hn::AllFalse(d, nan);
  for (; i < valid; ++i) {
    auto p = hn::Zero(d1);
    const auto y = transform(d1, hn::LoadU(d1, x + i), p);
    if constexpr (kSoftcap) hn::StoreU(y, d1, out + i);
    m = std::max(m, hn::GetLane(y));
    any_nan |= std::isnan(hn::GetLane(p));
  }
  if (any_nan || m == -kNegInf) {  // NaN or +inf logits: NaN, as exp(y - max) is in PyTorch
    for (size_t j = 0; j < n; ++j) out[j] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  if (valid == 0 || m == kNegInf) {  // nothing to attend to: define the row as zeros
    for (size_t j = 0; j < n; ++j) out[j] = 0.0f;
    return;
  }

  // Pass 2: exp(y - m) and its sum. y - m is one FMA (scale * x - m) without a soft-cap. The sum runs in
  // f32 partial sums over blocks of 32 vectors (at most 16 terms per lane each), added up in double: the
  // error stays at a few ulp for any row length and target, for one add per vector.
  const float* src = kSoftcap ? out : x;
  const float s = kSoftcap ? 1.0f : scale;
  const auto vs = hn::Set(d, s), vm = hn::Set(d, m);
  constexpr size_t kBlock = 32;
  double sum = 0.0;
  i = 0;
  while (i + N <= valid) {
    const size_t end = std::min(valid, i + kBlock * N);
    auto s0 = hn::Zero(d), s1 = hn::Zero(d);
    for (; i + 2 * N <= end; i += 2 * N) {
      const auto e0 = ExpNonPos(d, hn::MulSub(hn::LoadU(d, src + i), vs, vm));
      const auto e1 = ExpNonPos(d, hn::MulSub(hn::LoadU(d, src + i + N), vs, vm));
      hn::StoreU(e0, d, out + i);
      hn::StoreU(e1, d, out + i + N);
      s0 = hn::Add(s0, e0);
      s1 = hn::Add(s1, e1);
    }
    for (; i + N <= end; i += N) {
      const auto e = ExpNonPos(d, hn::MulSub(hn::LoadU(d, src + i), vs, vm));
      hn::StoreU(e, d, out + i);
      s0 = hn::Add(s0, e);
    }
    sum += static_cast<double>(hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1))));
  }
  for (; i < valid; ++i) {
    const auto e = ExpNonPos(d1, hn::MulSub(hn::LoadU(d1, src + i), hn::Set(d1, s), hn::Set(d1, m)));
    hn::StoreU(e, d1, out + i);
    sum += static_cast<double>(hn::GetLane(e));
  }

  // Pass 3: normalise; masked columns are 0.
  const float inv = static_cast<float>(1.0 / sum);
  const auto vinv = hn::Set(d, inv);
  i = 0;
  for (; i + N <= valid; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, out + i), vinv), d, out + i);
  for (; i < valid; ++i) out[i] *= inv;
  for (; i < n; ++i) out[i] = 0.0f;
}

void SoftmaxF32(const float* x, ptrdiff_t xs, float* out, ptrdiff_t os, size_t rows, size_t n, float scale,
                float softcap, bool causal, size_t q_len, size_t row0, ptrdiff_t offset) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<ptrdiff_t>(r) * xs;
    float* o = out + static_cast<ptrdiff_t>(r) * os;
    const size_t valid = detail::softmax_valid(n, causal, causal ? (row0 + r) % q_len : 0, offset);
    if (softcap > 0.0f) SoftmaxRow<true>(xr, o, n, valid, scale, softcap);
    else SoftmaxRow<false>(xr, o, n, valid, scale, softcap);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
HWY_EXPORT(SoftmaxF32);
}  // namespace kiln

KILN_DISPATCH_BEGIN
void softmax_f32(const float* x, std::ptrdiff_t xs, float* out, std::ptrdiff_t os, std::size_t rows, std::size_t n,
                 float scale, float softcap, bool causal, std::size_t q_len, std::size_t row0, std::ptrdiff_t offset) {
  HWY_DYNAMIC_DISPATCH(SoftmaxF32)(x, xs, out, os, rows, n, scale, softcap, causal, q_len, row0, offset);
}
KILN_DISPATCH_END
#endif  // HWY_ONCE

#endif  // per-target include guard
