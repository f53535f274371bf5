// kiln/ops/qmatmul-inl.h - Highway bodies of ops/qmatmul.hpp, compiled once per target by the
// KILN_IMPLEMENTATION translation unit (see kiln/implementation.hpp). Not for direct inclusion.
//
// This file holds the activation quantizer and the per-target entry points. The kernels:
//   qmatmul_scalar-inl.h     plain integer code (SSE4, SSSE3, EMU128/SCALAR), and the row decoder to
//                            unsigned bytes that the others share for tails and packing
//   qmatmul_avx2-inl.h       vpmaddubsw kernels (AVX2 and AVX3 targets)
//   qmatmul_vnni-inl.h       vpdpbusd GEMV kernels (AVX3_DL)
//   qmatmul_vnni_gemm-inl.h  vpdpbusd GEMM: row-interleaved panels and the register-blocked kernel (AVX3_DL)

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_OPS_QMATMUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_OPS_QMATMUL_INL_H_
#undef KILN_OPS_QMATMUL_INL_H_
#else
#define KILN_OPS_QMATMUL_INL_H_
#endif

#include <cmath>
#include <cstring>

#include <hwy/highway.h>

#include "kiln/ops/qmatmul.hpp"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {
namespace hn = hwy::HWY_NAMESPACE;

using ::kiln::detail::QActLayout;

// Q4_K/Q5_K: physical position of logical sub-block s within a super-block (and back: an involution).
inline constexpr uint8_t kKPerm[8] = {0, 2, 1, 3, 4, 6, 5, 7};

// The per-row arrays of the activation scratch (see QActLayout).
struct ActRow {
  const int8_t* q;
  const float* dx;
  const int32_t* sum;
  const int32_t* corr;
  const int32_t* ginit;
  const float* gdxs;
  const float* dxr;
  const float* dxsr;
  const int16_t* lsum16;
  const int32_t* corrT;
  const float* dxT;
  const float* gdxsT;
};
HWY_INLINE ActRow GetActRow(const uint8_t* row, const QActLayout& L) {
  ActRow a;
  a.q = reinterpret_cast<const int8_t*>(row);
  a.dx = reinterpret_cast<const float*>(row + L.o_dx);
  a.sum = reinterpret_cast<const int32_t*>(row + L.o_sum);
  a.corr = reinterpret_cast<const int32_t*>(row + L.o_corr);
  a.ginit = reinterpret_cast<const int32_t*>(row + L.o_ginit);
  a.gdxs = reinterpret_cast<const float*>(row + L.o_gdxs);
  a.dxr = reinterpret_cast<const float*>(row + L.o_dxr);
  a.dxsr = reinterpret_cast<const float*>(row + L.o_dxsr);
  a.lsum16 = reinterpret_cast<const int16_t*>(row + L.o_lsum16);
  a.corrT = reinterpret_cast<const int32_t*>(row + L.o_corrT);
  a.dxT = reinterpret_cast<const float*>(row + L.o_dxT);
  a.gdxsT = reinterpret_cast<const float*>(row + L.o_gdxsT);
  return a;
}

// q[0, n) = nearest_even(x * (127 / amax)), natural order; s16[i] = sum of q[16 i, 16 i + 16); returns
// dx = amax / 127. Exactly ref::qmm_quantize_act: the product is one f32 multiply and cvtps2dq rounds to
// nearest even (Highway's portable NearestInt rounds x + 0.5, which differs near halves, so EMU128/SCALAR
// use std::nearbyint).
HWY_INLINE float QuantizeGroup(const float* HWY_RESTRICT x, size_t n, int8_t* HWY_RESTRICT q, int32_t* s16) {
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128 || !HWY_ARCH_X86
  float amax = 0;
  for (size_t i = 0; i < n; ++i) amax = HWY_MAX(amax, std::fabs(x[i]));
  const float id = amax > 0 ? 127.0f / amax : 0.0f;
  for (size_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::nearbyint(x[i] * id));
  for (size_t c = 0; c < n / 16; ++c) {
    int32_t t = 0;
    for (size_t i = 0; i < 16; ++i) t += q[16 * c + i];
    s16[c] = t;
  }
  return amax / 127.0f;
#else
  const hn::ScalableTag<float> d;
  const hn::Rebind<int32_t, decltype(d)> di;
  const hn::Rebind<int8_t, decltype(d)> d8;
  constexpr size_t N = hn::MaxLanes(d);  // 4, 8 or 16: divides 16
  auto vmax = hn::Zero(d);
  for (size_t i = 0; i < n; i += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(d, x + i)));
  const float amax = hn::GetLane(hn::MaxOfLanes(d, vmax));
  const float id = amax > 0 ? 127.0f / amax : 0.0f;
  const auto vid = hn::Set(d, id);
  for (size_t c = 0; c < n; c += 16) {
    auto sum = hn::Zero(di);
    for (size_t i = c; i < c + 16; i += N) {
      const auto qi = hn::NearestInt(hn::Mul(hn::LoadU(d, x + i), vid));
      sum = hn::Add(sum, qi);
      hn::StoreU(hn::DemoteTo(d8, qi), d8, q + i);
    }
    s16[c / 16] = hn::GetLane(hn::SumOfLanes(di, sum));
  }
  return amax / 127.0f;
#endif
}

// One row of x into the activation layout (see QActLayout in qmatmul.hpp).
inline void QuantizeRow(const float* HWY_RESTRICT x, const QActLayout& L, uint8_t* HWY_RESTRICT row) {
  auto* q = reinterpret_cast<int8_t*>(row);
  auto* dx = reinterpret_cast<float*>(row + L.o_dx);
  auto* sum = reinterpret_cast<int32_t*>(row + L.o_sum);
  auto* corr = reinterpret_cast<int32_t*>(row + L.o_corr);
  auto* ginit = reinterpret_cast<int32_t*>(row + L.o_ginit);
  auto* gdxs = reinterpret_cast<float*>(row + L.o_gdxs);
  auto* lsum16 = reinterpret_cast<int16_t*>(row + L.o_lsum16);
  const int off4 = L.offset / 4;  // off is 0, 8, 16, 32 or 128: off * S / 4 is exact
  auto set_group = [&](size_t g, int32_t s, float d) {
    sum[g] = s;
    for (size_t l = 0; l < 4; ++l) corr[4 * g + l] = -off4 * s;
    ginit[g] = ::kiln::detail::kQmmMagic - L.offset * s;
    gdxs[g] = d * static_cast<float>(s);
  };
  if (!::kiln::detail::qmm_is_kquant(L.type)) {
    auto* dxr = reinterpret_cast<float*>(row + L.o_dxr);
    auto* dxsr = reinterpret_cast<float*>(row + L.o_dxsr);
    auto* corrT = reinterpret_cast<int32_t*>(row + L.o_corrT);
    auto* dxT = reinterpret_cast<float*>(row + L.o_dxT);
    auto* gdxsT = reinterpret_cast<float*>(row + L.o_gdxsT);
    const size_t nb = L.k / 32;
    HWY_ALIGN int8_t t[32];
    int32_t s16[2];
    for (size_t b = 0; b < L.ns; ++b) {
      float d = 0;
      int32_t s = 0;
      if (b < nb) {
        d = QuantizeGroup(x + 32 * b, 32, t, s16);
        s = s16[0] + s16[1];
      } else {
        std::memset(t, 0, sizeof t);
      }
      int8_t* grp = q + 128 * (b / 4) + 16 * (b % 4);
      std::memcpy(grp, t, 16);
      std::memcpy(grp + 64, t + 16, 16);
      dx[b] = d;
      set_group(b, s, d);
      lsum16[b] = static_cast<int16_t>(s);
      for (size_t l = 0; l < 4; ++l) {
        dxr[4 * b + l] = d;
        dxsr[4 * b + l] = gdxs[b] * 0.25f;  // exact: a power of two
      }
      // Block c of group G of a unit of 16 blocks sits in lane 4c + G of the GEMV's reduced sums.
      const size_t t = 16 * (b / 16) + 4 * (b % 4) + (b % 16) / 4;
      corrT[t] = -L.offset * s;
      dxT[t] = d;
      gdxsT[t] = gdxs[b];
    }
    return;
  }
  HWY_ALIGN int8_t t[256];
  int32_t s16[16];
  const bool q6 = L.type == ggml_type_id::Q6_K;
  for (size_t sb = 0; sb < L.nd; ++sb) {
    const float d = QuantizeGroup(x + 256 * sb, 256, t, s16);
    dx[sb] = d;
    int8_t* dst = q + 256 * sb;
    if (q6) {
      std::memcpy(dst, t, 256);
      for (size_t p = 0; p < 16; ++p) {
        const int32_t s = s16[p];
        set_group(16 * sb + p, s, d);
        lsum16[16 * sb + p] = static_cast<int16_t>(s);
      }
    } else {
      for (size_t p = 0; p < 8; ++p) {
        const size_t s = kKPerm[p];
        std::memcpy(dst + 32 * p, t + 32 * s, 32);
        const int32_t sm = s16[2 * s] + s16[2 * s + 1];
        set_group(8 * sb + p, sm, d);
        lsum16[8 * sb + s] = static_cast<int16_t>(sm);
      }
    }
  }
}

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#include "kiln/ops/qmatmul_scalar-inl.h"
#include "kiln/ops/qmatmul_avx2-inl.h"
#include "kiln/ops/qmatmul_vnni-inl.h"
#include "kiln/ops/qmatmul_vnni_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {

void QmatmulQuantize(uint32_t type, const float* x, ptrdiff_t ldx, size_t m, size_t k, void* act) {
  const ::kiln::detail::QActLayout L = ::kiln::detail::qact_layout(type, k);
  for (size_t i = 0; i < m; ++i)
    qmm::QuantizeRow(x + static_cast<ptrdiff_t>(i) * ldx, L, static_cast<uint8_t*>(act) + i * L.row_bytes);
}

void QmatmulRows(uint32_t type, const void* act, size_t m, size_t k, const void* w, ptrdiff_t ldw, size_t n,
                 float* y, ptrdiff_t ldy, unsigned flags) {
  const ::kiln::detail::QActLayout L = ::kiln::detail::qact_layout(type, k);
  const auto* a = static_cast<const uint8_t*>(act);
  const auto* wb = static_cast<const uint8_t*>(w);
  const bool gemm = (flags & ::kiln::detail::kQmmGemm) != 0;
#if HWY_TARGET == HWY_AVX3_DL
  if (gemm) qmm::GemmVnni(L, a, m, wb, ldw, n, y, ldy);
  else qmm::GemvVnni(L, a, m, wb, ldw, n, y, ldy);
#elif HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
  qmm::RowsAvx2(L, a, m, wb, ldw, n, y, ldy, gemm);
#else
  (void)gemm;
  qmm::RowsScalar(L, a, m, wb, ldw, n, y, ldy);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
HWY_EXPORT(QmatmulQuantize);
HWY_EXPORT(QmatmulRows);
}  // namespace kiln

KILN_DISPATCH_BEGIN
void qmatmul_quantize(uint32_t type, const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k, void* act) {
  HWY_DYNAMIC_DISPATCH(::kiln::QmatmulQuantize)(type, x, ldx, m, k, act);
}
void qmatmul_rows(uint32_t type, const void* act, std::size_t m, std::size_t k, const void* w, std::ptrdiff_t ldw,
                  std::size_t n, float* y, std::ptrdiff_t ldy, unsigned flags) {
  HWY_DYNAMIC_DISPATCH(::kiln::QmatmulRows)(type, act, m, k, w, ldw, n, y, ldy, flags);
}
KILN_DISPATCH_END
#endif  // HWY_ONCE

#endif  // per-target include guard
