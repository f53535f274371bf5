// kiln/kernels/dense/norm-inl.h - Highway bodies of ops/norm.hpp, compiled once per target by the
// KILN_IMPLEMENTATION translation unit (see kiln/implementation.hpp). Not for direct inclusion.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_DENSE_NORM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_DENSE_NORM_INL_H_
#undef KILN_KERNELS_DENSE_NORM_INL_H_
#else
#define KILN_KERNELS_DENSE_NORM_INL_H_
#endif

#include <hwy/highway.h>

#include "kiln/ops/norm.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sum of x[i]^2 (sq) or x[i] (plain) over n floats, four independent accumulators.
template <bool kSquare>
HWY_INLINE float SumRow(const float* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto v0 = hn::LoadU(d, x + i), v1 = hn::LoadU(d, x + i + N);
    const auto v2 = hn::LoadU(d, x + i + 2 * N), v3 = hn::LoadU(d, x + i + 3 * N);
    if constexpr (kSquare) {
      a0 = hn::MulAdd(v0, v0, a0);
      a1 = hn::MulAdd(v1, v1, a1);
      a2 = hn::MulAdd(v2, v2, a2);
      a3 = hn::MulAdd(v3, v3, a3);
    } else {
      a0 = hn::Add(a0, v0);
      a1 = hn::Add(a1, v1);
      a2 = hn::Add(a2, v2);
      a3 = hn::Add(a3, v3);
    }
  }
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, x + i);
    a0 = kSquare ? hn::MulAdd(v, v, a0) : hn::Add(a0, v);
  }
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) s += kSquare ? x[i] * x[i] : x[i];
  return s;
}

// Sum of (x[i] - mean)^2: the two-pass variance (numerically safer than E[x^2] - E[x]^2).
HWY_INLINE float SumSqDev(const float* HWY_RESTRICT x, size_t n, float mean) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, mean);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto v0 = hn::Sub(hn::LoadU(d, x + i), vm), v1 = hn::Sub(hn::LoadU(d, x + i + N), vm);
    a0 = hn::MulAdd(v0, v0, a0);
    a1 = hn::MulAdd(v1, v1, a1);
  }
  for (; i + N <= n; i += N) {
    const auto v = hn::Sub(hn::LoadU(d, x + i), vm);
    a0 = hn::MulAdd(v, v, a0);
  }
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
  for (; i < n; ++i) s += (x[i] - mean) * (x[i] - mean);
  return s;
}

void RmsNormF32(const float* x, ptrdiff_t xs, const float* w, float* out, ptrdiff_t os, size_t rows, size_t n,
                float eps, bool one_plus) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto one = hn::Set(d, one_plus ? 1.0f : 0.0f);
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<ptrdiff_t>(r) * xs;
    float* o = out + static_cast<ptrdiff_t>(r) * os;
    const float inv = 1.0f / std::sqrt(SumRow<true>(xr, n) / static_cast<float>(n) + eps);
    const auto vinv = hn::Set(d, inv);
    size_t i = 0;
    for (; i + N <= n; i += N) {
      const auto wv = hn::Add(hn::LoadU(d, w + i), one);  // (1 + w) or w
      hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, xr + i), vinv), wv), d, o + i);
    }
    for (; i < n; ++i) o[i] = xr[i] * inv * (one_plus ? 1.0f + w[i] : w[i]);
  }
}

void LayerNormF32(const float* x, ptrdiff_t xs, const float* w, const float* b, float* out, ptrdiff_t os, size_t rows,
                  size_t n, float eps) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<ptrdiff_t>(r) * xs;
    float* o = out + static_cast<ptrdiff_t>(r) * os;
    const float mean = SumRow<false>(xr, n) / static_cast<float>(n);
    const float inv = 1.0f / std::sqrt(SumSqDev(xr, n, mean) / static_cast<float>(n) + eps);
    const auto vm = hn::Set(d, mean), vinv = hn::Set(d, inv);
    size_t i = 0;
    for (; i + N <= n; i += N) {
      const auto xn = hn::Mul(hn::Sub(hn::LoadU(d, xr + i), vm), vinv);
      hn::StoreU(hn::MulAdd(xn, hn::LoadU(d, w + i), hn::LoadU(d, b + i)), d, o + i);
    }
    for (; i < n; ++i) o[i] = (xr[i] - mean) * inv * w[i] + b[i];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
HWY_EXPORT(RmsNormF32);
HWY_EXPORT(LayerNormF32);
}  // namespace kiln

KILN_DISPATCH_BEGIN
void rms_norm_f32(const float* x, std::ptrdiff_t xs, const float* w, float* out, std::ptrdiff_t os, std::size_t rows,
                  std::size_t n, float eps, bool one_plus) {
  HWY_DYNAMIC_DISPATCH(RmsNormF32)(x, xs, w, out, os, rows, n, eps, one_plus);
}
void layer_norm_f32(const float* x, std::ptrdiff_t xs, const float* w, const float* b, float* out, std::ptrdiff_t os,
                    std::size_t rows, std::size_t n, float eps) {
  HWY_DYNAMIC_DISPATCH(LayerNormF32)(x, xs, w, b, out, os, rows, n, eps);
}
KILN_DISPATCH_END
#endif  // HWY_ONCE

#endif  // per-target include guard
