// kiln/ops/qmatmul_portable-inl.h - qmatmul kernels in portable Highway operations on 128-bit vectors, for
// every target without a hand-written x86 kernel: NEON (64-bit Arm), SSE4, SSSE3, EMU128 and the others.
// HWY_SCALAR (one lane) keeps qmatmul_scalar-inl.h's RowsScalar. Included from qmatmul-inl.h only.
//
// Two engines, one per kind of target:
//   bytes (NEON built with dotprod: sdot; SSE4: pmaddubsw): one weight row at a time is decoded to
//     signed bytes, the block's offset subtracted, and dotted with x's bytes 16 at a time into 4 int32
//     lanes; K-quant sub-block sums are multiplied by their scales in 32 bits.
//   16-bit (NEON without dotprod, SSSE3, EMU128, others): the weights are decoded into 16-bit lanes, offset
//     subtracted and the K-quants' sub-block scales multiplied in, so that one widening multiply-add
//     (ReorderWidenMulAccumulate: vmlal on NEON) per 8 values gives each integer sum; the activation rows
//     are widened to 16 bits once per call (GEMV) or per 4 rows and 32 weight rows (GEMM), not once per
//     weight row. 16-bit ranges: |u - off| <= 128 for the 32-value types; Q4_K/Q5_K u * sc <= 31 * 63 =
//     1953; Q6_K |(u - 32) * sc| <= 32 * 128 = 4096.
// The products go straight to 32 bits, and a super-block's sum, at most 256 * 4096 * 127 < 2^31, cannot
// overflow.
// The integer sums equal every other path's; the f32 steps are those of qmatmul_avx2-inl.h (per block
// t = sum * dx, f += t * dw [+ dm * dx S]; per super-block f += sum * (d * dx)) on 4 lanes.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_OPS_QMATMUL_PORTABLE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_OPS_QMATMUL_PORTABLE_INL_H_
#undef KILN_OPS_QMATMUL_PORTABLE_INL_H_
#else
#define KILN_OPS_QMATMUL_PORTABLE_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {

#if KILN_QMM_PORTABLE

// Byte dots where the target has them: NEON's sdot (compiled with dotprod, e.g. -mcpu=native on an Armv8.2+
// CPU, -march=armv8.2-a+dotprod) and pmaddubsw on SSE4. There the weights are decoded to signed bytes
// (offset subtracted) and dotted with x's bytes as they are; elsewhere both go to 16 bits. (SSSE3 has
// pmaddubsw too, but runs the 16-bit engine: on x86 the test suite then covers both engines.)
#undef KILN_QMM_BYTES
#if HWY_TARGET == HWY_NEON && defined(__ARM_FEATURE_DOTPROD)
#define KILN_QMM_BYTES 1
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_SSE4
#define KILN_QMM_BYTES 1
#else
#define KILN_QMM_BYTES 0
#endif

namespace portable {

using DU8 = hn::Full128<uint8_t>;
using DI8 = hn::Full128<int8_t>;
using DH8 = hn::Full64<uint8_t>;
using DHI8 = hn::Full64<int8_t>;
using D16 = hn::Full128<int16_t>;
using D32 = hn::Full128<int32_t>;
using DF = hn::Full128<float>;
using VU8 = hn::Vec<DU8>;
using V16 = hn::Vec<D16>;
using V32 = hn::Vec<D32>;
using VF = hn::Vec<DF>;

// 16 unsigned bytes to two vectors of 8 int16 lanes, minus off.
HWY_INLINE void Widen(VU8 v, int16_t off, V16* out) {
  const D16 d16;
  out[0] = hn::Sub(hn::PromoteTo(d16, hn::LowerHalf(v)), hn::Set(d16, off));
  out[1] = hn::Sub(hn::PromoteTo(d16, hn::UpperHalf(DH8(), v)), hn::Set(d16, off));
}
// The same, times the sub-block scale sc (no offset).
HWY_INLINE void WidenScaled(VU8 v, int16_t sc, V16* out) {
  const D16 d16;
  out[0] = hn::Mul(hn::PromoteTo(d16, hn::LowerHalf(v)), hn::Set(d16, sc));
  out[1] = hn::Mul(hn::PromoteTo(d16, hn::UpperHalf(DH8(), v)), hn::Set(d16, sc));
}

// Byte j = 0x10 where bit (first + j) of the 32-bit qh is set, j < 16 (first 0 or 16): Q5's fifth bits.
HWY_INLINE VU8 FifthBits(uint32_t qh, size_t first) {
  const DU8 d8;
  alignas(16) static constexpr uint8_t kIdx[2][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
                                                      {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3}};
  alignas(16) static constexpr uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const VU8 bytes = hn::BitCast(d8, hn::Set(hn::Full128<uint32_t>(), qh));  // little-endian bytes of qh
  const VU8 sel = hn::TableLookupBytes(bytes, hn::Load(d8, kIdx[first / 16]));
  return hn::IfThenElseZero(hn::TestBit(sel, hn::Load(d8, kBit)), hn::Set(d8, 0x10));
}

// One 32-value block as 4 x 8 int16 (values 0..7, 8..15, 16..23, 24..31) minus the type's offset, and its
// scales: dw (of the integer sum) and dm (Q4_1/Q5_1's min, of dx * S).
HWY_INLINE void DecodeBlock(const block_q4_0& b, V16* w, float& dw, float& dm) {
  const DU8 d8;
  const VU8 v = hn::LoadU(d8, b.qs);
  Widen(hn::And(v, hn::Set(d8, 0x0F)), 8, w);
  Widen(hn::ShiftRight<4>(v), 8, w + 2);
  dw = f16_bits_to_f32(b.d.bits);
  dm = 0;
}
HWY_INLINE void DecodeBlock(const block_q4_1& b, V16* w, float& dw, float& dm) {
  const DU8 d8;
  const VU8 v = hn::LoadU(d8, b.qs);
  Widen(hn::And(v, hn::Set(d8, 0x0F)), 0, w);
  Widen(hn::ShiftRight<4>(v), 0, w + 2);
  dw = f16_bits_to_f32(b.d.bits);
  dm = f16_bits_to_f32(b.m.bits);
}
template <class B>
HWY_INLINE void DecodeQ5(const B& b, int16_t off, V16* w) {
  const DU8 d8;
  const VU8 v = hn::LoadU(d8, b.qs);
  const uint32_t qh = ::kiln::detail::load_u32_le(b.qh);
  Widen(hn::Or(hn::And(v, hn::Set(d8, 0x0F)), FifthBits(qh, 0)), off, w);
  Widen(hn::Or(hn::ShiftRight<4>(v), FifthBits(qh, 16)), off, w + 2);
}
HWY_INLINE void DecodeBlock(const block_q5_0& b, V16* w, float& dw, float& dm) {
  DecodeQ5(b, 16, w);
  dw = f16_bits_to_f32(b.d.bits);
  dm = 0;
}
HWY_INLINE void DecodeBlock(const block_q5_1& b, V16* w, float& dw, float& dm) {
  DecodeQ5(b, 0, w);
  dw = f16_bits_to_f32(b.d.bits);
  dm = f16_bits_to_f32(b.m.bits);
}
HWY_INLINE void DecodeBlock(const block_q8_0& b, V16* w, float& dw, float& dm) {
  const DI8 d8;
  const D16 d16;
  for (size_t h = 0; h < 2; ++h) {
    const auto v = hn::LoadU(d8, b.qs + 16 * h);
    w[2 * h] = hn::PromoteTo(d16, hn::LowerHalf(v));
    w[2 * h + 1] = hn::PromoteTo(d16, hn::UpperHalf(DHI8(), v));
  }
  dw = f16_bits_to_f32(b.d.bits);
  dm = 0;
}

// sum over n8 groups of 8 lanes of w[g] * x[8 g ...], exact in int32 (4 lanes).
template <size_t kN8>
HWY_INLINE V32 Dot16(const V16* w, const int16_t* HWY_RESTRICT x) {
  const D16 d16;
  const D32 d32;
  V32 s0 = hn::Zero(d32), s1 = hn::Zero(d32);
  HWY_UNROLL(8)
  for (size_t g = 0; g < kN8; ++g) s0 = hn::ReorderWidenMulAccumulate(d32, w[g], hn::LoadU(d16, x + 8 * g), s0, s1);
  return hn::Add(s0, s1);
}

// C outputs of each of n rows of 32-value blocks; x16[i]: row i of x widened (physical order).
template <class B, size_t C>
HWY_NOINLINE void Gemv32(const QActLayout& L, const ActRow* a, const int16_t* const* x16, const uint8_t* w,
                         ptrdiff_t ldw, size_t n, float* y, ptrdiff_t ldy) {
  constexpr bool kMin = std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_1>;
  const DF df;
  const size_t nb = L.k / 32;
  for (size_t j = 0; j < n; ++j) {
    const B* row = reinterpret_cast<const B*>(w + static_cast<ptrdiff_t>(j) * ldw);
    VF f[C];
    for (size_t i = 0; i < C; ++i) f[i] = hn::Zero(df);
    for (size_t b = 0; b < nb; ++b) {
      V16 wv[4];
      float dw, dm;
      DecodeBlock(row[b], wv, dw, dm);
      const size_t o = 128 * (b / 4) + 16 * (b % 4);
      for (size_t i = 0; i < C; ++i) {
        const V32 s = hn::Add(Dot16<2>(wv, x16[i] + o), Dot16<2>(wv + 2, x16[i] + o + 64));
        const VF t = hn::Mul(hn::ConvertTo(df, s), hn::LoadU(df, a[i].dxr + 4 * b));
        f[i] = hn::MulAdd(t, hn::Set(df, dw), f[i]);
        if constexpr (kMin) f[i] = hn::MulAdd(hn::Set(df, dm), hn::LoadU(df, a[i].dxsr + 4 * b), f[i]);
      }
    }
    for (size_t i = 0; i < C; ++i)
      y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = hn::GetLane(hn::SumOfLanes(df, f[i]));
  }
}

// Q4_K / Q5_K: 8 sub-blocks of 32 (logical s at physical 32 kKPerm[s] in x), u * sc in 16 bits; the mins
// term dmin * dx * sum_s mn_s S_s is scalar.
template <bool kQ5, size_t C>
HWY_NOINLINE void GemvQ45K(const QActLayout& L, const ActRow* a, const int16_t* const* x16, const uint8_t* w,
                           ptrdiff_t ldw, size_t n, float* y, ptrdiff_t ldy) {
  using B = std::conditional_t<kQ5, block_q5_K, block_q4_K>;
  const DU8 d8;
  const DF df;
  const D32 d32;
  const VU8 m4 = hn::Set(d8, 0x0F), m16 = hn::Set(d8, 0x10);
  for (size_t j = 0; j < n; ++j) {
    const B* row = reinterpret_cast<const B*>(w + static_cast<ptrdiff_t>(j) * ldw);
    VF f[C];
    float fmin[C];
    for (size_t i = 0; i < C; ++i) {
      f[i] = hn::Zero(df);
      fmin[i] = 0;
    }
    for (size_t sb = 0; sb < L.nd; ++sb) {
      const B& b = row[sb];
      uint8_t sc[8], mn[8];
      for (size_t s = 0; s < 8; ++s) ::kiln::detail::get_scale_min_k4(s, b.scales, sc[s], mn[s]);
      V32 acc[C];
      for (size_t i = 0; i < C; ++i) acc[i] = hn::Zero(d32);
      for (size_t s = 0; s < 8; ++s) {
        V16 wv[4];
        for (size_t h = 0; h < 2; ++h) {  // values 16 h .. 16 h + 15 of sub-block s
          const VU8 q = hn::LoadU(d8, b.qs + 32 * (s / 2) + 16 * h);
          VU8 u = s % 2 ? hn::ShiftRight<4>(q) : hn::And(q, m4);
          if constexpr (kQ5) {  // bit s of qh[l] -> 0x10
            const auto bit = hn::TestBit(hn::LoadU(d8, b.qh + 16 * h), hn::Set(d8, uint8_t(1u << s)));
            u = hn::Or(u, hn::IfThenElseZero(bit, m16));
          }
          WidenScaled(u, static_cast<int16_t>(sc[s]), wv + 2 * h);
        }
        for (size_t i = 0; i < C; ++i)
          acc[i] = hn::Add(acc[i], Dot16<4>(wv, x16[i] + 256 * sb + 32 * kKPerm[s]));
      }
      const float d = f16_bits_to_f32(b.d.bits), dmin = f16_bits_to_f32(b.dmin.bits);
      for (size_t i = 0; i < C; ++i) {
        int32_t imn = 0;
        for (size_t s = 0; s < 8; ++s) imn += mn[s] * a[i].lsum16[8 * sb + s];
        f[i] = hn::MulAdd(hn::ConvertTo(df, acc[i]), hn::Set(df, d * a[i].dx[sb]), f[i]);
        fmin[i] += (dmin * a[i].dx[sb]) * static_cast<float>(imn);
      }
    }
    for (size_t i = 0; i < C; ++i)
      y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = hn::GetLane(hn::SumOfLanes(df, f[i])) - fmin[i];
  }
}

// Q6_K: 16 sub-blocks of 16 (natural order), int8 scales; (u - 32) * sc in 16 bits.
template <size_t C>
HWY_NOINLINE void GemvQ6K(const QActLayout& L, const ActRow* a, const int16_t* const* x16, const uint8_t* w,
                          ptrdiff_t ldw, size_t n, float* y, ptrdiff_t ldy) {
  const DU8 d8;
  const D16 d16;
  const DF df;
  const D32 d32;
  const VU8 m4 = hn::Set(d8, 0x0F), m30 = hn::Set(d8, 0x30);
  for (size_t j = 0; j < n; ++j) {
    const block_q6_K* row = reinterpret_cast<const block_q6_K*>(w + static_cast<ptrdiff_t>(j) * ldw);
    VF f[C];
    for (size_t i = 0; i < C; ++i) f[i] = hn::Zero(df);
    for (size_t sb = 0; sb < L.nd; ++sb) {
      const block_q6_K& b = row[sb];
      V32 acc[C];
      for (size_t i = 0; i < C; ++i) acc[i] = hn::Zero(d32);
      for (size_t v = 0; v < 16; ++v) {  // values 16 v .. 16 v + 15: sub-block v
        const size_t h = v / 8, r = v % 8;  // half of the block; r: which quarter (v' = r / 2) and 16-byte part
        const size_t part = r % 2, quarter = r / 2;
        const VU8 l = hn::LoadU(d8, b.ql + 64 * h + 32 * (quarter % 2) + 16 * part);
        const VU8 qh = hn::LoadU(d8, b.qh + 32 * h + 16 * part);
        const VU8 lo = quarter < 2 ? hn::And(l, m4) : hn::ShiftRight<4>(l);
        VU8 hi;
        switch (quarter) {
          case 0: hi = hn::ShiftLeft<4>(qh); break;
          case 1: hi = hn::ShiftLeft<2>(qh); break;
          case 2: hi = qh; break;
          default: hi = hn::ShiftRight<2>(qh); break;
        }
        const VU8 u = hn::Or(lo, hn::And(hi, m30));
        const int16_t sc = static_cast<int16_t>(b.scales[v]);
        V16 wv[2];
        wv[0] = hn::Mul(hn::Sub(hn::PromoteTo(d16, hn::LowerHalf(u)), hn::Set(d16, 32)), hn::Set(d16, sc));
        wv[1] = hn::Mul(hn::Sub(hn::PromoteTo(d16, hn::UpperHalf(DH8(), u)), hn::Set(d16, 32)), hn::Set(d16, sc));
        for (size_t i = 0; i < C; ++i) acc[i] = hn::Add(acc[i], Dot16<2>(wv, x16[i] + 256 * sb + 16 * v));
      }
      const float d = f16_bits_to_f32(b.d.bits);
      for (size_t i = 0; i < C; ++i) f[i] = hn::MulAdd(hn::ConvertTo(df, acc[i]), hn::Set(df, d * a[i].dx[sb]), f[i]);
    }
    for (size_t i = 0; i < C; ++i)
      y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = hn::GetLane(hn::SumOfLanes(df, f[i]));
  }
}

#if KILN_QMM_BYTES
// ---- Byte engine. A 16-value run of weights as signed bytes (|w| <= 128) and, for pmaddubsw, |w|.
using VI8 = hn::Vec<DI8>;
struct WB {
  // User-provided constructors: an implicit one would be compiled without Highway's target attributes
  // and fail to inline the vectors' constructors (GCC on Arm with -march=...+dotprod).
  HWY_INLINE WB() {}
  HWY_INLINE WB(VI8 w_, VI8 a_) : w(w_), a(a_) {}
  VI8 w, a;
};
HWY_INLINE WB MakeWB(VI8 w) {
#if HWY_ARCH_X86
  return WB(w, VI8{_mm_abs_epi8(w.raw)});
#else
  return WB(w, w);
#endif
}
HWY_INLINE WB MakeWB(VU8 u, int8_t off) { return MakeWB(hn::Sub(hn::BitCast(DI8(), u), hn::Set(DI8(), off))); }

// acc + 4 sums of 4 products w x (exact). pmaddubsw: |w| times x with w's sign, pairs to 16 bits (at most
// 2 * 128 * 127 = 32512), then pairs to 32.
HWY_INLINE V32 DotBytes(V32 acc, const WB& w, const int8_t* HWY_RESTRICT x) {
#if HWY_ARCH_X86
  const __m128i xv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  const __m128i p = _mm_maddubs_epi16(w.a.raw, _mm_sign_epi8(xv, w.w.raw));
  return V32{_mm_add_epi32(acc.raw, _mm_madd_epi16(p, _mm_set1_epi16(1)))};
#else
  return V32{vdotq_s32(acc.raw, w.w.raw, vld1q_s8(x))};
#endif
}

// One 32-value block as two runs of 16 signed bytes (values 0..15, 16..31) and its scales.
template <class B>
HWY_INLINE void DecodeBlockB(const B& b, WB* w, float& dw, float& dm) {
  const DU8 d8;
  dw = f16_bits_to_f32(b.d.bits);
  dm = 0;
  if constexpr (std::is_same_v<B, block_q8_0>) {
    w[0] = MakeWB(hn::LoadU(DI8(), b.qs));
    w[1] = MakeWB(hn::LoadU(DI8(), b.qs + 16));
  } else {
    constexpr bool kQ5 = std::is_same_v<B, block_q5_0> || std::is_same_v<B, block_q5_1>;
    constexpr bool kMin = std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_1>;
    constexpr int8_t off = kMin ? 0 : kQ5 ? 16 : 8;
    const VU8 v = hn::LoadU(d8, b.qs);
    VU8 lo = hn::And(v, hn::Set(d8, 0x0F)), hi = hn::ShiftRight<4>(v);
    if constexpr (kQ5) {
      const uint32_t qh = ::kiln::detail::load_u32_le(b.qh);
      lo = hn::Or(lo, FifthBits(qh, 0));
      hi = hn::Or(hi, FifthBits(qh, 16));
    }
    w[0] = MakeWB(lo, off);
    w[1] = MakeWB(hi, off);
    if constexpr (kMin) dm = f16_bits_to_f32(b.m.bits);
  }
}

template <class B, size_t C>
HWY_NOINLINE void Gemv32B(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n, float* y,
                          ptrdiff_t ldy) {
  constexpr bool kMin = std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_1>;
  const DF df;
  const D32 d32;
  const size_t nb = L.k / 32;
  for (size_t j = 0; j < n; ++j) {
    const B* row = reinterpret_cast<const B*>(w + static_cast<ptrdiff_t>(j) * ldw);
    VF f[C];
    for (size_t i = 0; i < C; ++i) f[i] = hn::Zero(df);
    for (size_t b = 0; b < nb; ++b) {
      WB wv[2];
      float dw, dm;
      DecodeBlockB(row[b], wv, dw, dm);
      const size_t o = 128 * (b / 4) + 16 * (b % 4);
      for (size_t i = 0; i < C; ++i) {
        const V32 s = DotBytes(DotBytes(hn::Zero(d32), wv[0], a[i].q + o), wv[1], a[i].q + o + 64);
        const VF t = hn::Mul(hn::ConvertTo(df, s), hn::LoadU(df, a[i].dxr + 4 * b));
        f[i] = hn::MulAdd(t, hn::Set(df, dw), f[i]);
        if constexpr (kMin) f[i] = hn::MulAdd(hn::Set(df, dm), hn::LoadU(df, a[i].dxsr + 4 * b), f[i]);
      }
    }
    for (size_t i = 0; i < C; ++i)
      y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = hn::GetLane(hn::SumOfLanes(df, f[i]));
  }
}

// Q4_K / Q5_K: each sub-block's byte dot times its scale in 32 bits; mins as in GemvQ45K.
template <bool kQ5, size_t C>
HWY_NOINLINE void GemvQ45KB(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n, float* y,
                            ptrdiff_t ldy) {
  using B = std::conditional_t<kQ5, block_q5_K, block_q4_K>;
  const DU8 d8;
  const DF df;
  const D32 d32;
  const VU8 m4 = hn::Set(d8, 0x0F), m16 = hn::Set(d8, 0x10);
  for (size_t j = 0; j < n; ++j) {
    const B* row = reinterpret_cast<const B*>(w + static_cast<ptrdiff_t>(j) * ldw);
    VF f[C];
    float fmin[C];
    for (size_t i = 0; i < C; ++i) {
      f[i] = hn::Zero(df);
      fmin[i] = 0;
    }
    for (size_t sb = 0; sb < L.nd; ++sb) {
      const B& b = row[sb];
      uint8_t sc[8], mn[8];
      for (size_t s = 0; s < 8; ++s) ::kiln::detail::get_scale_min_k4(s, b.scales, sc[s], mn[s]);
      V32 acc[C];
      for (size_t i = 0; i < C; ++i) acc[i] = hn::Zero(d32);
      for (size_t s = 0; s < 8; ++s) {
        WB wv[2];
        for (size_t h = 0; h < 2; ++h) {
          const VU8 q = hn::LoadU(d8, b.qs + 32 * (s / 2) + 16 * h);
          VU8 u = s % 2 ? hn::ShiftRight<4>(q) : hn::And(q, m4);
          if constexpr (kQ5) {  // bit s of qh[l] -> 0x10
            const auto bit = hn::TestBit(hn::LoadU(d8, b.qh + 16 * h), hn::Set(d8, uint8_t(1u << s)));
            u = hn::Or(u, hn::IfThenElseZero(bit, m16));
          }
          wv[h] = MakeWB(u, 0);
        }
        const V32 vsc = hn::Set(d32, static_cast<int32_t>(sc[s]));
        for (size_t i = 0; i < C; ++i) {
          const int8_t* x = a[i].q + 256 * sb + 32 * kKPerm[s];
          acc[i] = hn::Add(acc[i], hn::Mul(DotBytes(DotBytes(hn::Zero(d32), wv[0], x), wv[1], x + 16), vsc));
        }
      }
      const float d = f16_bits_to_f32(b.d.bits), dmin = f16_bits_to_f32(b.dmin.bits);
      for (size_t i = 0; i < C; ++i) {
        int32_t imn = 0;
        for (size_t s = 0; s < 8; ++s) imn += mn[s] * a[i].lsum16[8 * sb + s];
        f[i] = hn::MulAdd(hn::ConvertTo(df, acc[i]), hn::Set(df, d * a[i].dx[sb]), f[i]);
        fmin[i] += (dmin * a[i].dx[sb]) * static_cast<float>(imn);
      }
    }
    for (size_t i = 0; i < C; ++i)
      y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = hn::GetLane(hn::SumOfLanes(df, f[i])) - fmin[i];
  }
}

// Q6_K: each 16-value sub-block's byte dot of (u - 32) times its int8 scale in 32 bits.
template <size_t C>
HWY_NOINLINE void GemvQ6KB(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n, float* y,
                           ptrdiff_t ldy) {
  const DU8 d8;
  const DF df;
  const D32 d32;
  const VU8 m4 = hn::Set(d8, 0x0F), m30 = hn::Set(d8, 0x30);
  for (size_t j = 0; j < n; ++j) {
    const block_q6_K* row = reinterpret_cast<const block_q6_K*>(w + static_cast<ptrdiff_t>(j) * ldw);
    VF f[C];
    for (size_t i = 0; i < C; ++i) f[i] = hn::Zero(df);
    for (size_t sb = 0; sb < L.nd; ++sb) {
      const block_q6_K& b = row[sb];
      V32 acc[C];
      for (size_t i = 0; i < C; ++i) acc[i] = hn::Zero(d32);
      for (size_t v = 0; v < 16; ++v) {  // as GemvQ6K
        const size_t h = v / 8, r = v % 8, part = r % 2, quarter = r / 2;
        const VU8 l = hn::LoadU(d8, b.ql + 64 * h + 32 * (quarter % 2) + 16 * part);
        const VU8 qh = hn::LoadU(d8, b.qh + 32 * h + 16 * part);
        const VU8 lo = quarter < 2 ? hn::And(l, m4) : hn::ShiftRight<4>(l);
        VU8 hi;
        switch (quarter) {
          case 0: hi = hn::ShiftLeft<4>(qh); break;
          case 1: hi = hn::ShiftLeft<2>(qh); break;
          case 2: hi = qh; break;
          default: hi = hn::ShiftRight<2>(qh); break;
        }
        const WB wv = MakeWB(hn::Or(lo, hn::And(hi, m30)), 32);
        const V32 vsc = hn::Set(d32, static_cast<int32_t>(b.scales[v]));
        for (size_t i = 0; i < C; ++i)
          acc[i] = hn::Add(acc[i], hn::Mul(DotBytes(hn::Zero(d32), wv, a[i].q + 256 * sb + 16 * v), vsc));
      }
      const float d = f16_bits_to_f32(b.d.bits);
      for (size_t i = 0; i < C; ++i) f[i] = hn::MulAdd(hn::ConvertTo(df, acc[i]), hn::Set(df, d * a[i].dx[sb]), f[i]);
    }
    for (size_t i = 0; i < C; ++i)
      y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = hn::GetLane(hn::SumOfLanes(df, f[i]));
  }
}
#endif  // KILN_QMM_BYTES

template <class B, size_t C>
HWY_INLINE void GemvTyped(const QActLayout& L, const ActRow* a, const int16_t* const* x16, const uint8_t* w,
                          ptrdiff_t ldw, size_t n, float* y, ptrdiff_t ldy) {
#if KILN_QMM_BYTES
  (void)x16;
  if constexpr (std::is_same_v<B, block_q4_K>) GemvQ45KB<false, C>(L, a, w, ldw, n, y, ldy);
  else if constexpr (std::is_same_v<B, block_q5_K>) GemvQ45KB<true, C>(L, a, w, ldw, n, y, ldy);
  else if constexpr (std::is_same_v<B, block_q6_K>) GemvQ6KB<C>(L, a, w, ldw, n, y, ldy);
  else Gemv32B<B, C>(L, a, w, ldw, n, y, ldy);
#else
  if constexpr (std::is_same_v<B, block_q4_K>) {
    GemvQ45K<false, C>(L, a, x16, w, ldw, n, y, ldy);
  } else if constexpr (std::is_same_v<B, block_q5_K>) {
    GemvQ45K<true, C>(L, a, x16, w, ldw, n, y, ldy);
  } else if constexpr (std::is_same_v<B, block_q6_K>) {
    GemvQ6K<C>(L, a, x16, w, ldw, n, y, ldy);
  } else {
    Gemv32<B, C>(L, a, x16, w, ldw, n, y, ldy);
  }
#endif
}

// q (kp int8, physical order) to int16.
HWY_INLINE void WidenAct(const int8_t* HWY_RESTRICT q, size_t kp, int16_t* HWY_RESTRICT x16) {
  const DI8 d8;
  const D16 d16;
  for (size_t t = 0; t < kp; t += 16) {
    const auto v = hn::LoadU(d8, q + t);
    hn::StoreU(hn::PromoteTo(d16, hn::LowerHalf(v)), d16, x16 + t);
    hn::StoreU(hn::PromoteTo(d16, hn::UpperHalf(DHI8(), v)), d16, x16 + t + 8);
  }
}

}  // namespace portable

// GEMV: one pass over W with all (<= 4) rows of x. GEMM: blocks of 32 weight rows (L2-resident) against 4
// rows of x at a time. Each output is computed the same way in both. Scratch slot 1: 4 widened rows of x.
inline void RowsPortable(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, ptrdiff_t ldw, size_t n,
                         float* y, ptrdiff_t ldy, bool gemm) {
  constexpr size_t kRowBlock = 32, kC = 4;
  const size_t nblock = gemm ? kRowBlock : n;
  auto* x16 = KILN_QMM_BYTES ? nullptr  // the byte engine reads x's bytes as they are
                             : static_cast<int16_t*>(::kiln::detail::qmm_scratch(1, kC * L.kp * sizeof(int16_t)));
  VisitType(L.type, [&](auto* tag) {
    using B = std::remove_pointer_t<decltype(tag)>;
    for (size_t j0 = 0; j0 < n; j0 += nblock) {
      const size_t nn = HWY_MIN(nblock, n - j0);
      const uint8_t* wj = w + static_cast<ptrdiff_t>(j0) * ldw;
      for (size_t i0 = 0; i0 < m; i0 += kC) {
        ActRow a[kC];
        const int16_t* xr[kC];
        const size_t c = HWY_MIN(kC, m - i0);
        for (size_t i = 0; i < c; ++i) {
          a[i] = GetActRow(act + (i0 + i) * L.row_bytes, L);
          xr[i] = nullptr;
          if (x16) {
            xr[i] = x16 + i * L.kp;
            portable::WidenAct(a[i].q, L.kp, x16 + i * L.kp);
          }
        }
        float* yi = y + static_cast<ptrdiff_t>(i0) * ldy + static_cast<ptrdiff_t>(j0);
        switch (c) {
          case 4: portable::GemvTyped<B, 4>(L, a, xr, wj, ldw, nn, yi, ldy); break;
          case 3: portable::GemvTyped<B, 3>(L, a, xr, wj, ldw, nn, yi, ldy); break;
          case 2: portable::GemvTyped<B, 2>(L, a, xr, wj, ldw, nn, yi, ldy); break;
          default: portable::GemvTyped<B, 1>(L, a, xr, wj, ldw, nn, yi, ldy); break;
        }
      }
    }
  });
}

#endif  // KILN_QMM_PORTABLE

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
