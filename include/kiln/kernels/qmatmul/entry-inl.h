// kiln/kernels/qmatmul/entry-inl.h - Highway bodies of ops/qmatmul.hpp, compiled once per target by the
// KILN_IMPLEMENTATION translation unit (see kiln/implementation.hpp). Not for direct inclusion.
//
// This file holds the activation quantizer and the per-target entry points. The kernels:
//   generic/scalar-inl.h     plain integer code (HWY_SCALAR, one lane)
//   generic/portable-inl.h   portable Highway code on 128-bit vectors (NEON, SSE4, SSSE3, EMU128, ...)
//   x86/avx2-inl.h       vpmaddubsw kernels (AVX2 and AVX3 targets)
//   x86/vnni-inl.h       vpdpbusd GEMV kernels (AVX3_DL)
//   x86/vnni_gemm-inl.h  vpdpbusd GEMM: row-interleaved panels and the register-blocked kernel (AVX3_DL)
//   x86/amx_gemm-inl.h   the same GEMM's kernel on AMX int8 tiles where core/amx.hpp finds them usable

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_QMATMUL_ENTRY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_QMATMUL_ENTRY_INL_H_
#undef KILN_KERNELS_QMATMUL_ENTRY_INL_H_
#else
#define KILN_KERNELS_QMATMUL_ENTRY_INL_H_
#endif

#include <cmath>
#include <cstring>
#include <vector>

#include <hwy/cache_control.h>  // hwy::Prefetch (the AVX2 kernels)
#include <hwy/highway.h>

#include "kiln/kernels/x86/common.hpp"

#include "kiln/core/amx.hpp"
#include "kiln/ops/qmatmul.hpp"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

// Targets without a hand-written x86 kernel (and wider than one lane) run generic/portable-inl.h.
#undef KILN_QMM_PORTABLE
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SCALAR
#define KILN_QMM_PORTABLE 0
#else
#define KILN_QMM_PORTABLE 1
#endif

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {
namespace hn = hwy::HWY_NAMESPACE;

using ::kiln::detail::QActLayout;

// Q4_K/Q5_K: physical position of logical sub-block s within a super-block (and back: an involution).
inline constexpr uint8_t kKPerm[8] = {0, 2, 1, 3, 4, 6, 5, 7};

// 16-row interleaved weights (quant/interleave.hpp; the AVX3_DL and AVX2 kernels): offset in a row of
// x's physical order (QActLayout) of the 4 activation bytes that step s of block b meets: 4-bit types, low
// nibbles (hi = false) values 4s.., high nibbles 16 + 4s..; Q8_0 steps 0..7 are values 4s.. in order.
HWY_INLINE size_t X16ActOffset(size_t b, size_t s, bool hi) {
  const size_t o = 128 * (b / 4) + 16 * (b % 4);
  return s < 4 ? o + 4 * s + (hi ? 64 : 0) : o + 64 + 4 * (s - 4);
}

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
  const int32_t* pinit;  // residual rows of QuantizeRowSplit only
  const int32_t* pshift;
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
  a.pinit = reinterpret_cast<const int32_t*>(row + L.o_pinit);
  a.pshift = reinterpret_cast<const int32_t*>(row + L.o_pshift);
  a.dxT = reinterpret_cast<const float*>(row + L.o_dxT);
  a.gdxsT = reinterpret_cast<const float*>(row + L.o_gdxsT);
  return a;
}

// Keeps a product apart from the subtraction that follows it: GCC contracts a - b * c into one FMA on
// targets that have one (-ffp-contract=fast is its default for GNU C++, and Highway's Mul/Sub are plain
// vector operators), but the residual must be fl(x - fl(dx * q)), what qmatmul_split_act has always
// computed (ref::qmm_split_residual). An empty asm statement is opaque to the optimizer and costs nothing
// (scalar floats: ::kiln::detail::rounded, quant/dequant.hpp).
template <class V>
HWY_INLINE V NoContract(V v) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128 && (defined(__GNUC__) || defined(__clang__))
  asm("" : "+v"(v.raw));
#endif
  return v;
}

#if !(HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128 || !HWY_ARCH_X86)
// s16[c] = sum of the int8 q[16 c, 16 c + 16) for c < n / 16: psadbw of the bytes flipped to unsigned
// (q + 128) against zero sums each half of 8; minus 16 * 128. Cheaper than a cross-lane sum of 16 int32.
HWY_INLINE void SumBytes16(const int8_t* HWY_RESTRICT q, size_t n, int32_t* s16) {
  const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80));
  for (size_t c = 0; c < n / 16; ++c) {
    const __m128i v = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * c)), flip);
    const __m128i sad = _mm_sad_epu8(v, _mm_setzero_si128());
    s16[c] = _mm_cvtsi128_si32(_mm_add_epi64(sad, _mm_unpackhi_epi64(sad, sad))) - 16 * 128;
  }
}
#endif

// q[0, n) = nearest_even(clamp(x * id, -127, 127)), id = 127 / amax (0 when amax = 0), natural order;
// s16[i] = sum of q[16 i, 16 i + 16); returns dx = amax / 127. amax is max |x[0, n)| (the clamp changes
// nothing then) or, for the residual part, the x part's amax / 2^s (ref::qmm_split_residual_act). Exactly
// ref::qmm_quantize_act: the product is one f32 multiply and cvtps2dq rounds to nearest even (Highway's
// portable NearestInt rounds x + 0.5, which differs near halves, so EMU128/SCALAR use std::nearbyint).
HWY_INLINE float QuantizeGroupAmax(const float* HWY_RESTRICT x, size_t n, float amax, int8_t* HWY_RESTRICT q,
                                   int32_t* s16) {
  const float id = amax > 0 ? 127.0f / amax : 0.0f;
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128 || !HWY_ARCH_X86
  for (size_t i = 0; i < n; ++i)
    q[i] = static_cast<int8_t>(std::nearbyint(HWY_MIN(HWY_MAX(x[i] * id, -127.0f), 127.0f)));
  for (size_t c = 0; c < n / 16; ++c) {
    int32_t t = 0;
    for (size_t i = 0; i < 16; ++i) t += q[16 * c + i];
    s16[c] = t;
  }
#else
  const hn::ScalableTag<float> d;
  const hn::Rebind<int8_t, decltype(d)> d8;
  constexpr size_t N = hn::MaxLanes(d);  // 4, 8 or 16: divides 16
  const auto vid = hn::Set(d, id), lo = hn::Set(d, -127.0f), hi = hn::Set(d, 127.0f);
  for (size_t i = 0; i < n; i += N)
    hn::StoreU(hn::DemoteTo(d8, hn::NearestInt(hn::Min(hn::Max(hn::Mul(hn::LoadU(d, x + i), vid), lo), hi))), d8,
               q + i);
  SumBytes16(q, n, s16);
#endif
  return amax / 127.0f;
}

// max |x[0, n)| (n a multiple of 16).
HWY_INLINE float GroupAmax(const float* HWY_RESTRICT x, size_t n) {
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128 || !HWY_ARCH_X86
  float amax = 0;
  for (size_t i = 0; i < n; ++i) amax = HWY_MAX(amax, std::fabs(x[i]));
  return amax;
#else
  const hn::ScalableTag<float> d;
  constexpr size_t N = hn::MaxLanes(d);
  auto vmax = hn::Zero(d);
  for (size_t i = 0; i < n; i += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(d, x + i)));
  return hn::GetLane(hn::MaxOfLanes(d, vmax));
#endif
}

// One scale group of x (n values) quantized: see QuantizeGroupAmax.
HWY_INLINE float QuantizeGroup(const float* HWY_RESTRICT x, size_t n, int8_t* HWY_RESTRICT q, int32_t* s16) {
  return QuantizeGroupAmax(x, n, GroupAmax(x, n), q, s16);
}

// QuantizeGroup of x, and in the same pass the residual r[i] = x[i] - dx * nearbyint(x[i] * id) in f32 (one
// product, one subtraction: ref::qmm_split_residual exactly). Returns dx; amax = max |x|.
HWY_INLINE float QuantizeGroupSplit(const float* HWY_RESTRICT x, size_t n, int8_t* HWY_RESTRICT q, int32_t* s16,
                                    float* HWY_RESTRICT r, float& amax) {
  amax = GroupAmax(x, n);
  const float id = amax > 0 ? 127.0f / amax : 0.0f;
  const float dx = amax / 127.0f;
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128 || !HWY_ARCH_X86
  for (size_t i = 0; i < n; ++i) {
    const float qf = std::nearbyint(x[i] * id);
    q[i] = static_cast<int8_t>(qf);
    r[i] = x[i] - ::kiln::detail::rounded(dx * qf);
  }
  for (size_t c = 0; c < n / 16; ++c) {
    int32_t t = 0;
    for (size_t i = 0; i < 16; ++i) t += q[16 * c + i];
    s16[c] = t;
  }
#else
  const hn::ScalableTag<float> d;
  const hn::Rebind<int8_t, decltype(d)> d8;
  constexpr size_t N = hn::MaxLanes(d);
  const auto vid = hn::Set(d, id), vdx = hn::Set(d, dx);
  for (size_t i = 0; i < n; i += N) {
    const auto xv = hn::LoadU(d, x + i);
    const auto p = hn::Mul(xv, vid);
    hn::StoreU(hn::DemoteTo(d8, hn::NearestInt(p)), d8, q + i);
    // Round(p) is nearbyint(p) (roundps, nearest even; SSSE3 emulates it, at worst giving +0 for -0,
    // which only flips the sign of a zero residual: the same quantized bytes).
    hn::StoreU(hn::Sub(xv, NoContract(hn::Mul(vdx, hn::Round(p)))), d, r + i);
  }
  SumBytes16(q, n, s16);
#endif
  return dx;
}

// The per-sum-group fields of a row: S, corr = -off * S / 4 (4x), ginit, gdxs = d * S.
HWY_INLINE void SetSumGroup(const QActLayout& L, uint8_t* HWY_RESTRICT row, size_t g, int32_t s, float d) {
  const int off4 = L.offset / 4;  // off is 0, 8, 16, 32 or 128: off * S / 4 is exact
  reinterpret_cast<int32_t*>(row + L.o_sum)[g] = s;
  auto* corr = reinterpret_cast<int32_t*>(row + L.o_corr);
  for (size_t l = 0; l < 4; ++l) corr[4 * g + l] = -off4 * s;
  reinterpret_cast<int32_t*>(row + L.o_ginit)[g] = ::kiln::detail::kQmmMagic - L.offset * s;
  reinterpret_cast<float*>(row + L.o_gdxs)[g] = d * static_cast<float>(s);
}

// 2^-s as f32 (0 <= s < 127): multiplying by it is exact for normal results.
HWY_INLINE float Pow2Neg(int s) {
  const uint32_t bits = static_cast<uint32_t>(127 - s) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The residual part's scale exponent s (dx_r = dx / 2^s) of a group with max |x| = amax and max |r| =
// ramax: 8, raised while s < 12 and rho * 2^(s+1) <= 127 (no residual clamped at s + 1), rho = ramax *
// (127 / amax) in f32, compared with 127 / 2^(s+1) (exact steps; ref::qmm_residual_shift); 8 when amax < 2^-96.
HWY_INLINE int ResidualShift(float amax, float ramax) {
  if (!(amax >= 0x1p-96f)) return 8;
  const float rho = ramax * (127.0f / amax);
  int s = 8;
  for (float lim = 127.0f / 512; s < 12 && rho <= lim; lim *= 0.5f) ++s;
  return s;
}

// Sum groups [g0, g1) of a residual row with scale exponent s: pshift = s, pinit = ginit - (2^s + 1) M
// (mod 2^32; see QActLayout). Written after the groups' ginit.
HWY_INLINE void SetPairFields(const QActLayout& L, uint8_t* HWY_RESTRICT row, size_t g0, size_t g1, int s) {
  const auto* ginit = reinterpret_cast<const int32_t*>(row + L.o_ginit);
  auto* pinit = reinterpret_cast<int32_t*>(row + L.o_pinit);
  auto* pshift = reinterpret_cast<int32_t*>(row + L.o_pshift);
  const uint32_t adj = ((1u << s) + 1u) * static_cast<uint32_t>(::kiln::detail::kQmmMagic);
  for (size_t g = g0; g < g1; ++g) {
    pshift[g] = s;
    pinit[g] = static_cast<int32_t>(static_cast<uint32_t>(ginit[g]) - adj);
  }
}

// Block b of a 32-value layout (see QActLayout in qmatmul.hpp): t its 32 quantized values (natural order),
// s their sum, d its scale (zeros and 0 for the blocks that pad a row to whole groups of 4).
HWY_INLINE void StoreBlock32(const QActLayout& L, uint8_t* HWY_RESTRICT row, size_t b, const int8_t* t, int32_t s,
                             float d) {
  auto* q = reinterpret_cast<int8_t*>(row);
  auto* gdxs = reinterpret_cast<float*>(row + L.o_gdxs);
  auto* dxr = reinterpret_cast<float*>(row + L.o_dxr);
  auto* dxsr = reinterpret_cast<float*>(row + L.o_dxsr);
  reinterpret_cast<float*>(row + L.o_dx)[b] = d;
  int8_t* grp = q + 128 * (b / 4) + 16 * (b % 4);
  std::memcpy(grp, t, 16);
  std::memcpy(grp + 64, t + 16, 16);
  SetSumGroup(L, row, b, s, d);
  reinterpret_cast<int16_t*>(row + L.o_lsum16)[b] = static_cast<int16_t>(s);
  for (size_t l = 0; l < 4; ++l) {
    dxr[4 * b + l] = d;
    dxsr[4 * b + l] = gdxs[b] * 0.25f;  // exact: a power of two
  }
  // Block c of group G of a unit of 16 blocks sits in lane 4c + G of the GEMV's reduced sums.
  const size_t tt = 16 * (b / 16) + 4 * (b % 4) + (b % 16) / 4;
  reinterpret_cast<int32_t*>(row + L.o_corrT)[tt] = -L.offset * s;
  reinterpret_cast<float*>(row + L.o_dxT)[tt] = d;
  reinterpret_cast<float*>(row + L.o_gdxsT)[tt] = gdxs[b];
}

// Super-block sb of a K-quant layout: t its 256 quantized values (natural order), s16 the sums per 16.
HWY_INLINE void StoreSuperBlock(const QActLayout& L, uint8_t* HWY_RESTRICT row, size_t sb, const int8_t* t,
                                const int32_t* s16, float d) {
  auto* lsum16 = reinterpret_cast<int16_t*>(row + L.o_lsum16);
  reinterpret_cast<float*>(row + L.o_dx)[sb] = d;
  int8_t* dst = reinterpret_cast<int8_t*>(row) + 256 * sb;
  if (L.type == ggml_type_id::Q6_K) {
    std::memcpy(dst, t, 256);
    for (size_t p = 0; p < 16; ++p) {
      SetSumGroup(L, row, 16 * sb + p, s16[p], d);
      lsum16[16 * sb + p] = static_cast<int16_t>(s16[p]);
    }
  } else {
    for (size_t p = 0; p < 8; ++p) {
      const size_t s = kKPerm[p];
      std::memcpy(dst + 32 * p, t + 32 * s, 32);
      const int32_t sm = s16[2 * s] + s16[2 * s + 1];
      SetSumGroup(L, row, 8 * sb + p, sm, d);
      lsum16[8 * sb + s] = static_cast<int16_t>(sm);
    }
  }
}

// Scale group gi of a row (L.dg values: t, s16, d as QuantizeGroup leaves them) into the layout.
HWY_INLINE void StoreGroup(const QActLayout& L, uint8_t* HWY_RESTRICT row, size_t gi, const int8_t* t,
                           const int32_t* s16, float d) {
  if (::kiln::detail::qmm_is_kquant(L.type)) StoreSuperBlock(L, row, gi, t, s16, d);
  else StoreBlock32(L, row, gi, t, s16[0] + s16[1], d);
}

// The zero blocks that pad a 32-value row from L.k to L.kp values (none for K-quants).
HWY_INLINE void StorePadding(const QActLayout& L, uint8_t* HWY_RESTRICT row) {
  static constexpr int8_t kZeros[32] = {};
  if (::kiln::detail::qmm_is_kquant(L.type)) return;
  for (size_t b = L.k / 32; b < L.ns; ++b) StoreBlock32(L, row, b, kZeros, 0, 0.0f);
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// 32-value layouts on AVX-512, 16 blocks (a unit: the blocks of corrT/dxT/gdxsT) at a time: per block, its
// max, scale and sum are one lane of a 16-lane vector, and every per-block field of StoreBlock32 is stored
// as whole vectors (per block, the scalar path spent more on those ~20 stores and on reducing 16 lanes
// than on the values). The same bytes as QuantizeGroup(Split) + StoreBlock32 block by block.

KILN_X86_DIAGNOSTICS_PUSH

// "T order": block j of a unit in lane 4 (j % 4) + j / 4 (corrT's order; a 4x4 transpose, its own inverse).
HWY_INLINE __m512i UnitTPerm() { return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15); }

// v[j] reduced over its 16 lanes by op (max or add) into lane 4 (j % 4) + j / 4 of the result: 4 levels
// of 128-bit-lane, then in-lane, shuffles (45 instructions for 16 reductions).
template <class Op>
HWY_INLINE __m512 Reduce16T(const __m512* v, Op op) {
  __m512 c[8], e[4], f[2];
  for (size_t i = 0; i < 8; ++i)  // c[i] lanes: v[2i] (l0 op l2, l1 op l3), v[2i+1] (the same)
    c[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (size_t i = 0; i < 4; ++i)  // e[i] 128-bit lane L: v[4i + L] reduced to 4 floats
    e[i] = op(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88), _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
  for (size_t i = 0; i < 2; ++i)  // f[i] lane L: v[8i + L] to 2 floats, then v[8i + 4 + L]
    f[i] = op(_mm512_shuffle_ps(e[2 * i], e[2 * i + 1], 0x44), _mm512_shuffle_ps(e[2 * i], e[2 * i + 1], 0xEE));
  return op(_mm512_shuffle_ps(f[0], f[1], 0x88), _mm512_shuffle_ps(f[0], f[1], 0xDD));  // lane 4L + t: v[4t + L]
}
HWY_INLINE __m512 MaxF(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
HWY_INLINE __m512 AddI(__m512 a, __m512 b) {
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

// max |x| of each of 16 blocks of 32 values (T order).
HWY_INLINE __m512 UnitAmax(const float* HWY_RESTRICT x) {
  __m512 m[16];
  for (size_t j = 0; j < 16; ++j)
    m[j] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * j)), _mm512_abs_ps(_mm512_loadu_ps(x + 32 * j + 16)));
  return Reduce16T(m, MaxF);
}

// Blocks b0 .. b0 + 15 (b0 % 16 == 0) of row from their 512 values x, amaxT their max |x| (T order; or the
// x part's / 2^s for a residual part: hence the clamp, as QuantizeGroupAmax). With r: the residuals
// x - dx * q (two roundings, as QuantizeGroupSplit) into r[0, 512).
HWY_INLINE void QuantizeUnit16(const float* HWY_RESTRICT x, __m512 amaxT, const QActLayout& L,
                               uint8_t* HWY_RESTRICT row, size_t b0, float* HWY_RESTRICT r) {
  const __m512i tp = UnitTPerm();
  const __m512 idT = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amaxT, _mm512_setzero_ps(), _CMP_GT_OQ),
                                         _mm512_set1_ps(127.0f), amaxT);  // 127 / amax, 0 where amax = 0
  const __m512 dT = _mm512_div_ps(amaxT, _mm512_set1_ps(127.0f));
  HWY_ALIGN float id[16], dd[16];
  _mm512_store_ps(id, _mm512_permutexvar_ps(tp, idT));
  const __m512 dN = _mm512_permutexvar_ps(tp, dT);
  _mm512_store_ps(dd, dN);
  auto* q = reinterpret_cast<int8_t*>(row);
  __m512 sums[16];
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (size_t j = 0; j < 16; ++j) {
    const __m512 vid = _mm512_set1_ps(id[j]);
    const __m512 x0 = _mm512_loadu_ps(x + 32 * j), x1 = _mm512_loadu_ps(x + 32 * j + 16);
    const __m512 p0 = _mm512_mul_ps(x0, vid), p1 = _mm512_mul_ps(x1, vid);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(p0, lo), hi));  // nearest even
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(p1, lo), hi));
    int8_t* grp = q + 128 * ((b0 + j) / 4) + 16 * (j % 4);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(grp), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(grp + 64), _mm512_cvtsepi32_epi8(q1));
    sums[j] = _mm512_castsi512_ps(_mm512_add_epi32(q0, q1));
    if (r) {
      const __m512 vdx = _mm512_set1_ps(dd[j]);
      __m512 t0 = _mm512_mul_ps(vdx, _mm512_roundscale_ps(p0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      __m512 t1 = _mm512_mul_ps(vdx, _mm512_roundscale_ps(p1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      asm("" : "+v"(t0), "+v"(t1));  // no FMA contraction (NoContract, on raw registers)
      const __m512 r0 = _mm512_sub_ps(x0, t0), r1 = _mm512_sub_ps(x1, t1);
      _mm512_storeu_ps(r + 32 * j, r0);
      _mm512_storeu_ps(r + 32 * j + 16, r1);
    }
  }
  // The fields (StoreBlock32, SetSumGroup), 16 blocks per store; T order for corrT, dxT, gdxsT.
  const __m512i sT = _mm512_castps_si512(Reduce16T(sums, AddI));
  const __m512i sN = _mm512_permutexvar_epi32(tp, sT);
  const __m512 gT = _mm512_mul_ps(dT, _mm512_cvtepi32_ps(sT)), gN = _mm512_permutexvar_ps(tp, gT);  // d * S
  const __m512i off = _mm512_set1_epi32(L.offset);
  auto f32 = [&](size_t o, size_t i) { return reinterpret_cast<float*>(row + o) + i; };
  auto i32 = [&](size_t o, size_t i) { return reinterpret_cast<int32_t*>(row + o) + i; };
  _mm512_storeu_ps(f32(L.o_dx, b0), dN);
  _mm512_storeu_si512(i32(L.o_sum, b0), sN);
  _mm512_storeu_si512(i32(L.o_ginit, b0),
                      _mm512_sub_epi32(_mm512_set1_epi32(::kiln::detail::kQmmMagic), _mm512_mullo_epi32(off, sN)));
  _mm512_storeu_ps(f32(L.o_gdxs, b0), gN);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(reinterpret_cast<int16_t*>(row + L.o_lsum16) + b0),
                      _mm512_cvtepi32_epi16(sN));
  const __m512i corrN = _mm512_mullo_epi32(_mm512_set1_epi32(-(L.offset / 4)), sN);  // -off * S / 4, exact
  const __m512 dxsN = _mm512_mul_ps(gN, _mm512_set1_ps(0.25f));
  for (size_t c = 0; c < 4; ++c) {  // 4x repeated: blocks 4c .. 4c + 3
    const __m512i rep =
        _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(4 * c)),
                         _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2));
    _mm512_storeu_si512(i32(L.o_corr, 4 * b0 + 16 * c), _mm512_permutexvar_epi32(rep, corrN));
    _mm512_storeu_ps(f32(L.o_dxr, 4 * b0 + 16 * c), _mm512_permutexvar_ps(rep, dN));
    _mm512_storeu_ps(f32(L.o_dxsr, 4 * b0 + 16 * c), _mm512_permutexvar_ps(rep, dxsN));
  }
  _mm512_storeu_si512(i32(L.o_corrT, b0), _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_mullo_epi32(off, sT)));
  _mm512_storeu_ps(f32(L.o_dxT, b0), dT);
  _mm512_storeu_ps(f32(L.o_gdxsT, b0), gT);
}
// ResidualShift of 16 blocks (T order).
HWY_INLINE __m512i UnitResidualShift(__m512 amaxT, __m512 ramaxT) {
  const __m512 rho = _mm512_mul_ps(ramaxT, _mm512_div_ps(_mm512_set1_ps(127.0f), amaxT));
  const __mmask16 big = _mm512_cmp_ps_mask(amaxT, _mm512_set1_ps(0x1p-96f), _CMP_GE_OQ);
  __m512i s = _mm512_set1_epi32(8);
  float lim = 127.0f / 512;
  for (int t = 0; t < 4; ++t, lim *= 0.5f) {  // rho <= lim at step t implies it at every earlier step
    const __mmask16 m = big & _mm512_cmp_ps_mask(rho, _mm512_set1_ps(lim), _CMP_LE_OQ);
    s = _mm512_mask_add_epi32(s, m, s, _mm512_set1_epi32(1));
  }
  return s;
}

// The residual part of blocks b0 .. b0 + 15 (their residuals r[0, 512), amaxT the x part's max |x|, T order):
// QuantizeUnit16 with amax / 2^s (exact), then SetPairFields' pshift and pinit.
HWY_INLINE void QuantizeUnit16Residual(const float* HWY_RESTRICT r, __m512 amaxT, const QActLayout& L,
                                       uint8_t* HWY_RESTRICT row, size_t b0) {
  const __m512i sT = UnitResidualShift(amaxT, UnitAmax(r));
  const __m512 pow2T = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(127), sT), 23));
  QuantizeUnit16(r, _mm512_mul_ps(amaxT, pow2T), L, row, b0, nullptr);
  const __m512i sN = _mm512_permutexvar_epi32(UnitTPerm(), sT);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i adj = _mm512_mullo_epi32(_mm512_add_epi32(_mm512_sllv_epi32(one, sN), one),
                                         _mm512_set1_epi32(::kiln::detail::kQmmMagic));  // mod 2^32
  const __m512i ginit = _mm512_loadu_si512(reinterpret_cast<const int32_t*>(row + L.o_ginit) + b0);
  _mm512_storeu_si512(reinterpret_cast<int32_t*>(row + L.o_pinit) + b0, _mm512_sub_epi32(ginit, adj));
  _mm512_storeu_si512(reinterpret_cast<int32_t*>(row + L.o_pshift) + b0, sN);
}
KILN_X86_DIAGNOSTICS_POP
#endif

// How many blocks at the start of a row QuantizeRow(Split) quantize 16 at a time (QuantizeUnit16: AVX-512,
// 32-value layouts, whole units of 16 blocks); the rest of the row goes group by group.
HWY_INLINE size_t UnitBlocks(const QActLayout& L) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  return ::kiln::detail::qmm_is_kquant(L.type) ? 0 : L.k / 512 * 16;
#else
  (void)L;
  return 0;
#endif
}

// One row of x into the activation layout (see QActLayout in qmatmul.hpp).
inline void QuantizeRow(const float* HWY_RESTRICT x, const QActLayout& L, uint8_t* HWY_RESTRICT row) {
  HWY_ALIGN int8_t t[256];
  int32_t s16[16];
  const size_t g0 = UnitBlocks(L);
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  for (size_t b = 0; b < g0; b += 16) QuantizeUnit16(x + 32 * b, UnitAmax(x + 32 * b), L, row, b, nullptr);
#endif
  for (size_t g = g0; g < L.k / L.dg; ++g) StoreGroup(L, row, g, t, s16, QuantizeGroup(x + L.dg * g, L.dg, t, s16));
  StorePadding(L, row);
}

// One row of x as two quantized rows in one pass: x's 8-bit rounding into row_x, and the rounding of its
// residual (x - dx * q per scale group, f32) into row_r, with the scale dx / 2^s (as if its amax were the
// x part's / 2^s; s = ResidualShift: with s = 8 its values reach 128 and are clamped to 127, larger s only
// where nothing clamps: ref::qmm_split_residual_act). The power-of-two ratio lets the AVX3_DL GEMM add the
// two parts' integer sums as 2^s X + R before converting (pinit, pshift).
// The residual of a group lives in a stack buffer only while the group is quantized.
inline void QuantizeRowSplit(const float* HWY_RESTRICT x, const QActLayout& L, uint8_t* HWY_RESTRICT row_x,
                             uint8_t* HWY_RESTRICT row_r) {
  HWY_ALIGN int8_t t[256];
  HWY_ALIGN float r[512];
  int32_t s16[16];
  const size_t g0 = UnitBlocks(L);
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  for (size_t b = 0; b < g0; b += 16) {
    const __m512 amaxT = UnitAmax(x + 32 * b);
    QuantizeUnit16(x + 32 * b, amaxT, L, row_x, b, r);
    QuantizeUnit16Residual(r, amaxT, L, row_r, b);
  }
#endif
  for (size_t g = g0; g < L.k / L.dg; ++g) {
    float amax = 0;
    const float d = QuantizeGroupSplit(x + L.dg * g, L.dg, t, s16, r, amax);
    StoreGroup(L, row_x, g, t, s16, d);
    const int sh = ResidualShift(amax, GroupAmax(r, L.dg));
    StoreGroup(L, row_r, g, t, s16, QuantizeGroupAmax(r, L.dg, amax * Pow2Neg(sh), t, s16));
    SetPairFields(L, row_r, g * L.dg / L.sg, (g + 1) * L.dg / L.sg, sh);
  }
  StorePadding(L, row_x);
  StorePadding(L, row_r);
  SetPairFields(L, row_r, L.k / L.sg, L.ns, 8);  // the zero blocks (any s)
}

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#include "kiln/kernels/qmatmul/generic/scalar-inl.h"
#include "kiln/kernels/qmatmul/generic/portable-inl.h"
#include "kiln/kernels/qmatmul/x86/avx2-inl.h"
#include "kiln/kernels/qmatmul/x86/avx2_x16-inl.h"
#include "kiln/kernels/qmatmul/x86/vnni-inl.h"
#include "kiln/kernels/qmatmul/x86/vnni_x16-inl.h"
#include "kiln/kernels/qmatmul/x86/vnni_gemm-inl.h"
#include "kiln/kernels/qmatmul/x86/vnni_kv-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {

void QmatmulQuantize(uint32_t type, const float* x, ptrdiff_t ldx, size_t m, size_t k, void* act) {
  const ::kiln::detail::QActLayout L = ::kiln::detail::qact_layout(type, k);
  for (size_t i = 0; i < m; ++i)
    qmm::QuantizeRow(x + static_cast<ptrdiff_t>(i) * ldx, L, static_cast<uint8_t*>(act) + i * L.row_bytes);
}

void QmatmulQuantizeSplit(uint32_t type, const float* x, ptrdiff_t ldx, size_t m, size_t k, void* act_x, void* act_r,
                          size_t ld_act) {
  const ::kiln::detail::QActLayout L = ::kiln::detail::qact_layout(type, k);
  for (size_t i = 0; i < m; ++i)
    qmm::QuantizeRowSplit(x + static_cast<ptrdiff_t>(i) * ldx, L, static_cast<uint8_t*>(act_x) + i * ld_act,
                          static_cast<uint8_t*>(act_r) + i * ld_act);
}

bool MatmulQ8_0Int(const float* a, ptrdiff_t lda, const block_q8_0* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc, size_t m,
                   size_t n, size_t k, unsigned parts, unsigned flags) {
  const unsigned acc = flags & ::kiln::detail::kMatmulAccumulate;
  const unsigned values = flags & ::kiln::detail::kMatmulColMajorB;
#if HWY_TARGET == HWY_AVX3_DL
  if (values) {
    // A row with a weight that is not finite goes through matmul_q8_0 inside (false), other shapes below.
    if (parts == 1 || parts == 2) {
      const size_t nb = n / 32;
      if (n % 32 == 0 && nb >= 1 && nb <= qmm::kvq8::kMaxValueBlocks && k > 0 && ldb >= static_cast<ptrdiff_t>(nb))
        return qmm::ValuesQ8_0Int(a, lda, b, ldb, c, ldc, m, n, k, acc != 0);
    }
  } else if ((parts == 1 || parts == 2) && qmm::ScoresQ8_0Int(a, lda, b, ldb, c, ldc, m, n, k, int(parts), acc != 0)) {
    return true;
  }
#else
  (void)parts;
#endif
  ::kiln::dispatch::matmul_q8_0(a, lda, b, ldb, c, ldc, m, n, k, acc | values);
  return false;
}

size_t QmatmulGemvMaxRows(bool all_interleaved) {
#if HWY_TARGET == HWY_AVX3_DL
  return all_interleaved ? ::kiln::detail::kQmmGemvMaxRowsX16 : ::kiln::detail::kQmmGemvMaxRows;
#else
  (void)all_interleaved;
  return ::kiln::detail::kQmmGemvMaxRows;
#endif
}

size_t QmatmulSplitF32MinRows(uint32_t type, size_t k) {
#if HWY_TARGET == HWY_AVX2
  namespace id = ::kiln::ggml_type_id;
  if (type == id::Q8_0 || type == id::Q6_K) return ::kiln::detail::kQmmSplitF32MinRows;
  if ((type == id::Q4_0 || type == id::Q4_1 || type == id::Q5_0 || type == id::Q5_1 || type == id::Q4_K) &&
      k < ::kiln::detail::kQmmSplitF32MaxK4)
    return ::kiln::detail::kQmmSplitF32MinRows;
#else
  (void)type;
  (void)k;
#endif
  return SIZE_MAX;
}

bool QmatmulInterleavedNative(uint32_t type) {
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
  return kernels::qmm_interleavable(type);  // x86/vnni_x16-inl.h, x86/avx2_x16-inl.h
#else
  (void)type;
  return false;
#endif
}

namespace qmm {

// Whether this target's kernels add the row pairs of kQmmPairs themselves (at their final store): AVX3_DL's
// GEMM, and its GEMV over interleaved groups of a type whose kernel adds them (vnni::GemvX16Pairs; the rows
// past the last group are row-major, and QmatmulRows gives them to the row-major GEMV, which does not);
// AVX2/AVX3's interleaved kernel, GEMV and GEMM (X16Avx2Pairs; the row-major rows likewise).
HWY_INLINE bool NativePairs(uint32_t type, unsigned flags) {
#if HWY_TARGET == HWY_AVX3_DL
  if (flags & ::kiln::detail::kQmmGemm) return true;
  return (flags & ::kiln::detail::kQmmInterleaved) && vnni::GemvX16Pairs(type);
#elif HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
  return (flags & ::kiln::detail::kQmmInterleaved) && X16Avx2Pairs(type);  // GEMV and GEMM alike
#else
  (void)type;
  (void)flags;
  return false;
#endif
}

}  // namespace qmm

// QmatmulRows without kQmmPairs, or with it where NativePairs.
void QmatmulRowsOnce(uint32_t type, const void* act, size_t m, size_t k, const void* w, ptrdiff_t ldw, size_t n,
                     float* y, ptrdiff_t ldy, unsigned flags) {
  const ::kiln::detail::QActLayout L = ::kiln::detail::qact_layout(type, k);
  const auto* a = static_cast<const uint8_t*>(act);
  const auto* wb = static_cast<const uint8_t*>(w);
  const bool gemm = (flags & ::kiln::detail::kQmmGemm) != 0;
  // Interleaved W: whole groups of 16 rows, then row-major rows (quant/interleave.hpp).
  const size_t x16_rows =
      (flags & ::kiln::detail::kQmmInterleaved) ? n / kernels::kQmmInterleaveRows * kernels::kQmmInterleaveRows : 0;
#if HWY_TARGET == HWY_AVX3_DL
  if (gemm) {
    const bool amx_x = (flags & ::kiln::detail::kQmmAmxX) != 0;  // act: amx::RepackBlocks' form
    HWY_DASSERT(!amx_x || ::kiln::amx_active());
    qmm::GemmVnni(L, amx_x ? nullptr : a, m, wb, ldw, n, y, ldy, x16_rows, (flags & ::kiln::detail::kQmmPairs) != 0,
                  amx_x || ::kiln::amx_active(), amx_x ? a : nullptr);
  } else {
    const bool pairs = (flags & ::kiln::detail::kQmmPairs) != 0;  // NativePairs: then x16_rows == n (QmatmulRows)
    HWY_DASSERT(!pairs || x16_rows == n);
    if (x16_rows) qmm::vnni::GemvVnniX16(L, a, m, wb, x16_rows / kernels::kQmmInterleaveRows, y, ldy, pairs);
    if (x16_rows < n)
      qmm::GemvVnni(L, a, m, wb + static_cast<ptrdiff_t>(x16_rows) * ldw, ldw, n - x16_rows, y + x16_rows, ldy);
  }
#else
  auto rows = [&](const uint8_t* w0, size_t n0, float* y0) {
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
    qmm::RowsAvx2(L, a, m, w0, ldw, n0, y0, ldy, gemm);
#elif KILN_QMM_PORTABLE
    qmm::RowsPortable(L, a, m, w0, ldw, n0, y0, ldy, gemm);
#else
    (void)gemm;
    qmm::RowsScalar(L, a, m, w0, ldw, n0, y0, ldy);
#endif
  };
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
  const bool x16_native = x16_rows && QmatmulInterleavedNative(type);  // x86/avx2_x16-inl.h
  const bool pairs = (flags & ::kiln::detail::kQmmPairs) != 0;         // NativePairs: then x16_rows == n (QmatmulRows)
  HWY_DASSERT(!pairs || (x16_native && x16_rows == n));
  if (x16_native) qmm::RowsX16Avx2(L, a, m, wb, x16_rows / kernels::kQmmInterleaveRows, y, ldy, pairs);
#else
  constexpr bool x16_native = false;
#endif
  if (x16_rows && !x16_native) {  // no interleaved kernel for this type here: groups back to row-major first
    // Scratch slot 3: RowsScalar takes 1 and 2, RowsPortable 1, RowsAvx2 1 (Q6_K panels), RowsX16Avx2 2.
    auto* tmp =
        static_cast<uint8_t*>(::kiln::detail::qmm_scratch(3, kernels::kQmmInterleaveRows * static_cast<size_t>(ldw)));
    qmm::VisitType(type, [&](auto* tag) {
      using B = std::remove_pointer_t<decltype(tag)>;
      if constexpr (kernels::qmm_interleavable_v<B>) {
        for (size_t j = 0; j < x16_rows; j += kernels::kQmmInterleaveRows) {
          const auto* grp = reinterpret_cast<const std::byte*>(wb + static_cast<ptrdiff_t>(j) * ldw);
          for (size_t r = 0; r < kernels::kQmmInterleaveRows; ++r)
            ::kiln::detail::qmm_x16_row<B>(grp, r, L.k / dtype_traits<B>::block_size,
                                           reinterpret_cast<B*>(tmp + r * static_cast<size_t>(ldw)));
          rows(tmp, kernels::kQmmInterleaveRows, y + j);
        }
      }
    });
  }
  if (x16_rows < n) rows(wb + static_cast<ptrdiff_t>(x16_rows) * ldw, n - x16_rows, y + x16_rows);
#endif
}

size_t QmatmulAmxXBytes(uint32_t type, size_t m, size_t k) {
#if HWY_TARGET == HWY_AVX3_DL
  if (!::kiln::amx_active()) return 0;
  const auto G = qmm::amx::GetGeometry(::kiln::detail::qact_layout(type, k));
  return (m + qmm::amx::kMT - 1) / qmm::amx::kMT * G.block_bytes;
#else
  (void)type;
  (void)m;
  (void)k;
  return 0;
#endif
}

void QmatmulQuantizeAmx(uint32_t type, const float* x, ptrdiff_t ldx, size_t m, size_t k, bool pairs, size_t b0,
                        size_t b1, void* dst) {
#if HWY_TARGET == HWY_AVX3_DL
  // Each block's 16 quantized rows go through a per-thread buffer that stays in cache, repacked from there:
  // the rows are what QmatmulQuantize(Split) writes, so the blocks are what RepackBlocks makes of them.
  const ::kiln::detail::QActLayout L = ::kiln::detail::qact_layout(type, k);
  const auto G = qmm::amx::GetGeometry(L);
  constexpr size_t kMT = qmm::amx::kMT;
  auto* tmp = static_cast<uint8_t*>(::kiln::detail::qmm_scratch(1, kMT * L.row_bytes));
  const size_t rows = pairs ? 2 * m : m;
  for (size_t b = b0; b < b1; ++b) {
    const size_t q0 = b * kMT, nq = HWY_MIN(kMT, rows - q0);
    if (pairs)
      QmatmulQuantizeSplit(type, x + static_cast<ptrdiff_t>(q0 / 2) * ldx, ldx, nq / 2, k, tmp, tmp + L.row_bytes,
                           2 * L.row_bytes);
    else QmatmulQuantize(type, x + static_cast<ptrdiff_t>(q0) * ldx, ldx, nq, k, tmp);
    qmm::amx::RepackBlocks(L, tmp, nq, 0, 1, pairs, static_cast<uint8_t*>(dst) + b * G.block_bytes);
  }
#else
  (void)type;
  (void)x;
  (void)ldx;
  (void)m;
  (void)k;
  (void)pairs;
  (void)b0;
  (void)b1;
  (void)dst;
  HWY_ASSERT(false);  // qmatmul_amx_x_bytes said 0
#endif
}

void QmatmulRows(uint32_t type, const void* act, size_t m, size_t k, const void* w, ptrdiff_t ldw, size_t n, float* y,
                 ptrdiff_t ldy, unsigned flags) {
  using ::kiln::detail::kQmmPairs;
  HWY_DASSERT(!(flags & kQmmPairs) || m % 2 == 0);  // whole pairs (the kernels' tiles are even)
  if (!(flags & kQmmPairs)) return QmatmulRowsOnce(type, act, m, k, w, ldw, n, y, ldy, flags);
  if (qmm::NativePairs(type, flags)) {
    using ::kiln::detail::kQmmInterleaved;
#if HWY_TARGET == HWY_AVX3_DL
    if (flags & ::kiln::detail::kQmmGemm) return QmatmulRowsOnce(type, act, m, k, w, ldw, n, y, ldy, flags);
#endif
    // The interleaved kernels (AVX3_DL: the GEMV; AVX2/AVX3: GEMV and GEMM): whole groups here, the
    // row-major rows after them as a row-major W (so a row's bits never depend on which thread's share
    // holds it).
    const size_t x16_rows = n / kernels::kQmmInterleaveRows * kernels::kQmmInterleaveRows;
    if (x16_rows) QmatmulRowsOnce(type, act, m, k, w, ldw, x16_rows, y, ldy, flags);
    if (x16_rows < n)
      QmatmulRows(type, act, m, k, static_cast<const uint8_t*>(w) + static_cast<ptrdiff_t>(x16_rows) * ldw, ldw,
                  n - x16_rows, y + x16_rows, ldy, flags & ~kQmmInterleaved);
    return;
  }
  // Both rows of each pair into scratch, kChunk columns at a time (a multiple of 16: whole interleaved
  // groups; the scratch stays in L2), then y = (x part) + (residual part).
  constexpr size_t kChunk = 256;
  float* tmp = ::kiln::detail::qmm_split_scratch(m * HWY_MIN(n, kChunk));
  for (size_t c0 = 0; c0 < n; c0 += kChunk) {
    const size_t cw = HWY_MIN(kChunk, n - c0);
    QmatmulRowsOnce(type, act, m, k, static_cast<const uint8_t*>(w) + static_cast<ptrdiff_t>(c0) * ldw, ldw, cw, tmp,
                    static_cast<ptrdiff_t>(cw), flags & ~kQmmPairs);
    for (size_t r = 0; r < m / 2; ++r)
      ::kiln::detail::qmm_add_halves(y + static_cast<ptrdiff_t>(r) * ldy + static_cast<ptrdiff_t>(c0), tmp + 2 * r * cw,
                                     tmp + (2 * r + 1) * cw, cw);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
HWY_EXPORT(QmatmulQuantize);
HWY_EXPORT(QmatmulQuantizeSplit);
HWY_EXPORT(QmatmulRows);
HWY_EXPORT(QmatmulInterleavedNative);
HWY_EXPORT(QmatmulGemvMaxRows);
HWY_EXPORT(QmatmulSplitF32MinRows);
HWY_EXPORT(QmatmulAmxXBytes);
HWY_EXPORT(QmatmulQuantizeAmx);
HWY_EXPORT(MatmulQ8_0Int);
}  // namespace kiln

KILN_DISPATCH_BEGIN
void qmatmul_quantize(uint32_t type, const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k, void* act) {
  HWY_DYNAMIC_DISPATCH(QmatmulQuantize)(type, x, ldx, m, k, act);
}
void qmatmul_quantize_split(uint32_t type, const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k,
                            void* act_x, void* act_r, std::size_t ld_act) {
  HWY_DYNAMIC_DISPATCH(QmatmulQuantizeSplit)(type, x, ldx, m, k, act_x, act_r, ld_act);
}
void qmatmul_rows(uint32_t type, const void* act, std::size_t m, std::size_t k, const void* w, std::ptrdiff_t ldw,
                  std::size_t n, float* y, std::ptrdiff_t ldy, unsigned flags) {
  HWY_DYNAMIC_DISPATCH(QmatmulRows)(type, act, m, k, w, ldw, n, y, ldy, flags);
}
bool qmatmul_interleaved_native(uint32_t type) { return HWY_DYNAMIC_DISPATCH(QmatmulInterleavedNative)(type); }
std::size_t qmatmul_gemv_max_rows(bool all_interleaved) {
  return HWY_DYNAMIC_DISPATCH(QmatmulGemvMaxRows)(all_interleaved);
}
std::size_t qmatmul_split_f32_min_rows(uint32_t type, std::size_t k) {
  return HWY_DYNAMIC_DISPATCH(QmatmulSplitF32MinRows)(type, k);
}
std::size_t qmatmul_amx_x_bytes(uint32_t type, std::size_t m, std::size_t k) {
  return HWY_DYNAMIC_DISPATCH(QmatmulAmxXBytes)(type, m, k);
}
void qmatmul_quantize_amx(uint32_t type, const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k, bool pairs,
                          std::size_t b0, std::size_t b1, void* dst) {
  HWY_DYNAMIC_DISPATCH(QmatmulQuantizeAmx)(type, x, ldx, m, k, pairs, b0, b1, dst);
}
bool matmul_q8_0_int(const float* a, std::ptrdiff_t lda, const ::kiln::block_q8_0* b, std::ptrdiff_t ldb, float* c,
                     std::ptrdiff_t ldc, std::size_t m, std::size_t n, std::size_t k, unsigned parts, unsigned flags) {
  return HWY_DYNAMIC_DISPATCH(MatmulQ8_0Int)(a, lda, b, ldb, c, ldc, m, n, k, parts, flags);
}
KILN_DISPATCH_END
#endif  // HWY_ONCE

#endif  // per-target include guard
