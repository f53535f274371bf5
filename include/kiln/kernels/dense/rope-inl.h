// kiln/kernels/dense/rope-inl.h - Highway body of ops/rope.hpp, compiled once per target by the
// KILN_IMPLEMENTATION translation unit (see kiln/implementation.hpp). Not for direct inclusion.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_DENSE_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_DENSE_ROPE_INL_H_
#undef KILN_KERNELS_DENSE_ROPE_INL_H_
#else
#define KILN_KERNELS_DENSE_ROPE_INL_H_
#endif

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/ops/rope.hpp"
#include "kiln/quant/dequant.hpp"  // detail::rounded

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// cos_out[i], sin_out[i] = cos, sin of pos * inv_freq[i] (i < h), computed in double and rounded once.
// Highway's double Cos/Sin are 3 ulp but only valid for |a| <= 39000, so the angle is first reduced
// modulo 2 pi (Cody-Waite, 2 pi = c1 + c2 + c3 with c1, c2 of 22 significant bits: k * c1 and k * c2
// are exact for |k| < 2^31 without FMA, and a - k * c1 is exact too), leaving |r| <= pi with an
// absolute error ~1e-16 for every int32 position.
HWY_INLINE void CosSin(int32_t pos, const double* HWY_RESTRICT inv_freq, size_t h, float* HWY_RESTRICT cos_out,
                       float* HWY_RESTRICT sin_out) {
  size_t i = 0;
#if HWY_HAVE_FLOAT64
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const size_t ND = hn::Lanes(dd);
  const auto vpos = hn::Set(dd, static_cast<double>(pos));
  const auto inv_two_pi = hn::Set(dd, 0.15915494309189535);
  const auto c1 = hn::Set(dd, 6.283185958862305), c2 = hn::Set(dd, -6.516827397717861e-07),
             c3 = hn::Set(dd, 2.1561211432632476e-14);
  for (; i + ND <= h; i += ND) {
    const auto a = hn::Mul(vpos, hn::LoadU(dd, inv_freq + i));  // exact for |pos| < 2^29
    const auto k = hn::Round(hn::Mul(a, inv_two_pi));
    auto r = hn::NegMulAdd(k, c1, a);  // a - k c1
    r = hn::NegMulAdd(k, c2, r);
    r = hn::NegMulAdd(k, c3, r);
    hn::StoreU(hn::DemoteTo(df, hn::Cos(dd, r)), df, cos_out + i);
    hn::StoreU(hn::DemoteTo(df, hn::Sin(dd, r)), df, sin_out + i);
  }
#endif
  for (; i < h; ++i) {
    const double a = static_cast<double>(pos) * inv_freq[i];
    cos_out[i] = static_cast<float>(std::cos(a));
    sin_out[i] = static_cast<float>(std::sin(a));
  }
}

// v unchanged but opaque to the optimiser: a product passed through it is rounded to f32 before the add
// that follows (GCC contracts a * b - c * d into an FMA on targets that have one: -ffp-contract=fast is its
// default, and Highway's Mul/Sub are plain vector operators), so every target computes the bits of the
// scalar loop (the scalar tails use detail::rounded, quant/dequant.hpp).
template <class V>
HWY_INLINE V Rounded(V v) {
#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128 && (defined(__GNUC__) || defined(__clang__))
#if HWY_ARCH_X86
  asm("" : "+v"(v.raw));
#elif HWY_ARCH_ARM_A64 && !HWY_HAVE_SCALABLE
  asm("" : "+w"(v.raw));
#endif
#endif
  return v;
}

// (a, b) -> (a cos - b sin, b cos + a sin) for the pairs (i, i + h) of one head, each product rounded.
HWY_INLINE void RotateNeox(const float* x, float* out, size_t h, const float* HWY_RESTRICT c,
                           const float* HWY_RESTRICT s) {
  using ::kiln::detail::rounded;
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= h; i += N) {
    const auto x0 = hn::LoadU(d, x + i), x1 = hn::LoadU(d, x + h + i);
    const auto vc = hn::LoadU(d, c + i), vs = hn::LoadU(d, s + i);
    const auto o0 = hn::Sub(Rounded(hn::Mul(x0, vc)), Rounded(hn::Mul(x1, vs)));
    const auto o1 = hn::Add(Rounded(hn::Mul(x1, vc)), Rounded(hn::Mul(x0, vs)));
    hn::StoreU(o0, d, out + i);
    hn::StoreU(o1, d, out + h + i);
  }
  for (; i < h; ++i) {
    const float x0 = x[i], x1 = x[h + i];
    out[i] = rounded(x0 * c[i]) - rounded(x1 * s[i]);
    out[h + i] = rounded(x1 * c[i]) + rounded(x0 * s[i]);
  }
}

// The same for the pairs (2i, 2i + 1) of rot elements: out = x * cd + swap_pairs(x) * ss with
// cd = (c0, c0, c1, c1, ...) and ss = (-s0, s0, -s1, s1, ...) (a + (-b) rounds as a - b).
HWY_INLINE void RotateGptj(const float* x, float* out, size_t rot, const float* HWY_RESTRICT cd,
                           const float* HWY_RESTRICT ss) {
  using ::kiln::detail::rounded;
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);  // even, so vectors hold whole pairs
  for (; i + N <= rot; i += N) {
    const auto v = hn::LoadU(d, x + i);
    const auto a = Rounded(hn::Mul(v, hn::LoadU(d, cd + i)));
    hn::StoreU(hn::Add(a, Rounded(hn::Mul(hn::Reverse2(d, v), hn::LoadU(d, ss + i)))), d, out + i);
  }
#endif
  for (; i < rot; i += 2) {
    const float x0 = x[i], x1 = x[i + 1];
    out[i] = rounded(x0 * cd[i]) + rounded(x1 * ss[i]);
    out[i + 1] = rounded(x1 * cd[i + 1]) + rounded(x0 * ss[i + 1]);
  }
}

void RopeF32(const float* x, ptrdiff_t xts, ptrdiff_t xhs, float* out, ptrdiff_t ots, ptrdiff_t ohs, size_t n_tokens,
             size_t n_heads, size_t head_dim, size_t rot_dim, const int32_t* pos, const float* inv_freq, bool neox) {
  const size_t h = rot_dim / 2;
  std::vector<double> invd(inv_freq, inv_freq + h);
  std::vector<float> scratch(2 * h + 2 * rot_dim);
  float* cosv = scratch.data();
  float* sinv = cosv + h;
  float* cd = sinv + h;      // gptj: cos per element
  float* ss = cd + rot_dim;  // gptj: signed sin per element
  for (size_t t = 0; t < n_tokens; ++t) {
    CosSin(pos[t], invd.data(), h, cosv, sinv);
    if (!neox) {
      for (size_t i = 0; i < h; ++i) {
        cd[2 * i] = cd[2 * i + 1] = cosv[i];
        ss[2 * i] = -sinv[i];
        ss[2 * i + 1] = sinv[i];
      }
    }
    const float* xt = x + static_cast<ptrdiff_t>(t) * xts;
    float* ot = out + static_cast<ptrdiff_t>(t) * ots;
    for (size_t hd = 0; hd < n_heads; ++hd) {
      const float* xh = xt + static_cast<ptrdiff_t>(hd) * xhs;
      float* oh = ot + static_cast<ptrdiff_t>(hd) * ohs;
      if (neox) RotateNeox(xh, oh, h, cosv, sinv);
      else RotateGptj(xh, oh, rot_dim, cd, ss);
      if (oh != xh)
        for (size_t j = rot_dim; j < head_dim; ++j) oh[j] = xh[j];  // the unrotated part
    }
  }
}

// RopeF32 with position p's cos/sin at cos + p * rot_dim / 2 (a RopeTable). Interleaved pairs take the
// expanded cos and signed sin of up to kPairs pairs at a time from a stack buffer (no allocation).
void RopeTableF32(const float* x, ptrdiff_t xts, ptrdiff_t xhs, float* out, ptrdiff_t ots, ptrdiff_t ohs,
                  size_t n_tokens, size_t n_heads, size_t head_dim, size_t rot_dim, const int32_t* pos,
                  const float* cos, const float* sin, bool neox) {
  const size_t h = rot_dim / 2;
  constexpr size_t kPairs = 64;
  HWY_ALIGN float cd[2 * kPairs], ss[2 * kPairs];
  for (size_t t = 0; t < n_tokens; ++t) {
    const float* c = cos + static_cast<size_t>(pos[t]) * h;
    const float* s = sin + static_cast<size_t>(pos[t]) * h;
    const float* xt = x + static_cast<ptrdiff_t>(t) * xts;
    float* ot = out + static_cast<ptrdiff_t>(t) * ots;
    if (neox) {
      for (size_t hd = 0; hd < n_heads; ++hd)
        RotateNeox(xt + static_cast<ptrdiff_t>(hd) * xhs, ot + static_cast<ptrdiff_t>(hd) * ohs, h, c, s);
    } else {
      for (size_t i0 = 0; i0 < h; i0 += kPairs) {
        const size_t np = std::min(kPairs, h - i0);
        for (size_t i = 0; i < np; ++i) {
          cd[2 * i] = cd[2 * i + 1] = c[i0 + i];
          ss[2 * i] = -s[i0 + i];
          ss[2 * i + 1] = s[i0 + i];
        }
        for (size_t hd = 0; hd < n_heads; ++hd)
          RotateGptj(xt + static_cast<ptrdiff_t>(hd) * xhs + 2 * i0, ot + static_cast<ptrdiff_t>(hd) * ohs + 2 * i0,
                     2 * np, cd, ss);
      }
    }
    for (size_t hd = 0; hd < n_heads; ++hd) {
      const float* xh = xt + static_cast<ptrdiff_t>(hd) * xhs;
      float* oh = ot + static_cast<ptrdiff_t>(hd) * ohs;
      if (oh != xh)
        for (size_t j = rot_dim; j < head_dim; ++j) oh[j] = xh[j];  // the unrotated part
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
HWY_EXPORT(RopeF32);
HWY_EXPORT(RopeTableF32);
}  // namespace kiln

KILN_DISPATCH_BEGIN
void rope_f32(const float* x, std::ptrdiff_t xts, std::ptrdiff_t xhs, float* out, std::ptrdiff_t ots,
              std::ptrdiff_t ohs, std::size_t n_tokens, std::size_t n_heads, std::size_t head_dim, std::size_t rot_dim,
              const std::int32_t* pos, const float* inv_freq, bool neox) {
  HWY_DYNAMIC_DISPATCH(RopeF32)(x, xts, xhs, out, ots, ohs, n_tokens, n_heads, head_dim, rot_dim, pos, inv_freq, neox);
}
void rope_table_f32(const float* x, std::ptrdiff_t xts, std::ptrdiff_t xhs, float* out, std::ptrdiff_t ots,
                    std::ptrdiff_t ohs, std::size_t n_tokens, std::size_t n_heads, std::size_t head_dim,
                    std::size_t rot_dim, const std::int32_t* pos, const float* cos, const float* sin, bool neox) {
  HWY_DYNAMIC_DISPATCH(RopeTableF32)
  (x, xts, xhs, out, ots, ohs, n_tokens, n_heads, head_dim, rot_dim, pos, cos, sin, neox);
}
KILN_DISPATCH_END
#endif  // HWY_ONCE

#endif  // per-target include guard
