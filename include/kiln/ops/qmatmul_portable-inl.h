// kiln/ops/qmatmul_portable-inl.h - qmatmul kernels in portable Highway operations on 128-bit vectors, for
// every target without a hand-written x86 kernel: NEON (64-bit Arm), SSE4, SSSE3, EMU128 and the others.
// HWY_SCALAR (one lane) keeps qmatmul_scalar-inl.h's RowsScalar. Included from qmatmul-inl.h only.
//
// One weight row at a time is decoded into 16-bit lanes, with the block's offset subtracted (Q4_0, Q5_0,
// Q6_K) and the K-quants' integer sub-block scales multiplied in, so that one widening multiply-add
// (ReorderWidenMulAccumulate: pmaddwd on x86, vmlal on NEON) per 8 values gives each integer sum; the
// activation rows are widened to 16 bits once per call (GEMV) or per 4 rows and 32 weight rows (GEMM),
// not once per weight row. 16-bit ranges: |u - off| <= 128 for the 32-value types; Q4_K/Q5_K u * sc <=
// 31 * 63 = 1953; Q6_K |(u - 32) * sc| <= 32 * 128 = 4096. The products go straight to 32 bits, and a
// super-block's sum, at most 256 * 4096 * 127 < 2^31, cannot overflow.
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
          if constexpr (kQ5)
            u = hn::Or(u, hn::IfThenElseZero(hn::TestBit(hn::LoadU(d8, b.qh + 16 * h), hn::Set(d8, uint8_t(1u << s))), m16));
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

template <class B, size_t C>
HWY_INLINE void GemvTyped(const QActLayout& L, const ActRow* a, const int16_t* const* x16, const uint8_t* w,
                          ptrdiff_t ldw, size_t n, float* y, ptrdiff_t ldy) {
  if constexpr (std::is_same_v<B, block_q4_K>) {
    GemvQ45K<false, C>(L, a, x16, w, ldw, n, y, ldy);
  } else if constexpr (std::is_same_v<B, block_q5_K>) {
    GemvQ45K<true, C>(L, a, x16, w, ldw, n, y, ldy);
  } else if constexpr (std::is_same_v<B, block_q6_K>) {
    GemvQ6K<C>(L, a, x16, w, ldw, n, y, ldy);
  } else {
    Gemv32<B, C>(L, a, x16, w, ldw, n, y, ldy);
  }
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
  auto* x16 = static_cast<int16_t*>(::kiln::detail::qmm_scratch(1, kC * L.kp * sizeof(int16_t)));
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
          xr[i] = x16 + i * L.kp;
          portable::WidenAct(a[i].q, L.kp, x16 + i * L.kp);
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
