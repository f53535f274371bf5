// kiln/kernels/qmatmul/generic/portable_body-inl.h - the portable qmatmul kernels' source (engines, decoding, kernels,
// and their entry KILN_QMM_ROWS), included by portable-inl.h once per engine it compiles: inside
// namespace kiln::HWY_NAMESPACE::qmm, with KILN_QMM_BYTES (the engine: 1 bytes, 0 16-bit), KILN_QMM_PNS
// (the kernels' namespace) and KILN_QMM_ROWS (the entry's name) defined. No include guard: that is its use.
// See portable-inl.h for the engines and the arithmetic.

namespace KILN_QMM_PNS {

using DU8 = hn::Full128<uint8_t>;
using DI8 = hn::Full128<int8_t>;
using DH8 = hn::Full64<uint8_t>;
using DHI8 = hn::Full64<int8_t>;
using D16 = hn::Full128<int16_t>;
using D32 = hn::Full128<int32_t>;
using DF = hn::Full128<float>;
using VU8 = hn::Vec<DU8>;
using VI8 = hn::Vec<DI8>;
using V16 = hn::Vec<D16>;
using V32 = hn::Vec<D32>;
using VF = hn::Vec<DF>;

// ---- The engines. A Run is 16 consecutive weight values; Dot adds their products with x[0, 16) to 4 int32
// lanes of s0 (and s1); Scaled / ScaledSum apply a K-quant sub-block scale to the run or to its sum.
// Structs of vectors get user-provided constructors: an implicit one is compiled without Highway's target
// attributes and fails to inline the vectors' own (GCC on Arm with -march=...+dotprod).
#if KILN_QMM_BYTES
using XT = int8_t;  // x as the kernels read it: its bytes
struct Run {
  HWY_INLINE Run() {}
  HWY_INLINE Run(VI8 w_, VI8 a_) : w(w_), a(a_) {}
  VI8 w, a;  // the values, and |w| for pmaddubsw
};
HWY_INLINE Run MakeRun(VI8 w) {
#if HWY_ARCH_X86
  return Run(w, VI8{_mm_abs_epi8(w.raw)});
#else
  return Run(w, w);
#endif
}
// pmaddubsw: |w| times x with w's sign, pairs to 16 bits (at most 2 * 128 * 127 = 32512), then pairs to 32.
HWY_INLINE void Dot(V32& s0, V32& /*s1*/, const Run& r, const int8_t* HWY_RESTRICT x) {
#if HWY_ARCH_X86
  const __m128i xv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  const __m128i p = _mm_maddubs_epi16(r.a.raw, _mm_sign_epi8(xv, r.w.raw));
  s0 = V32{_mm_add_epi32(s0.raw, _mm_madd_epi16(p, _mm_set1_epi16(1)))};
#else
  s0 = V32{vdotq_s32(s0.raw, r.w.raw, vld1q_s8(x))};
#endif
}
// Unsigned values (< 64) minus an offset, as signed bytes.
HWY_INLINE Run MakeRun(VU8 u, int8_t off) { return MakeRun(hn::Sub(hn::BitCast(DI8(), u), hn::Set(DI8(), off))); }
HWY_INLINE Run Scaled(const Run& r, int16_t /*sc*/) { return r; }
HWY_INLINE V32 ScaledSum(V32 s, int32_t sc) { return hn::Mul(s, hn::Set(D32(), sc)); }
#else
using XT = int16_t;  // x widened to 16 bits (WidenAct)
struct Run {
  HWY_INLINE Run() {}
  HWY_INLINE Run(V16 lo_, V16 hi_) : lo(lo_), hi(hi_) {}
  V16 lo, hi;  // values 0..7, 8..15
};
HWY_INLINE Run MakeRun(VI8 w) {
  const D16 d16;
  return Run(hn::PromoteTo(d16, hn::LowerHalf(w)), hn::PromoteTo(d16, hn::UpperHalf(DHI8(), w)));
}
// Unsigned values (< 64) minus an offset: zero-extended, then subtracted in 16 bits (SSSE3 has no
// sign-extending byte load; NEON's costs the same either way).
HWY_INLINE Run MakeRun(VU8 u, int8_t off) {
  const D16 d16;
  const V16 o = hn::Set(d16, off);
  return Run(hn::Sub(hn::PromoteTo(d16, hn::LowerHalf(u)), o), hn::Sub(hn::PromoteTo(d16, hn::UpperHalf(DH8(), u)), o));
}
HWY_INLINE void Dot(V32& s0, V32& s1, const Run& r, const int16_t* HWY_RESTRICT x) {
  const D16 d16;
  const D32 d32;
  s0 = hn::ReorderWidenMulAccumulate(d32, r.lo, hn::LoadU(d16, x), s0, s1);
  s0 = hn::ReorderWidenMulAccumulate(d32, r.hi, hn::LoadU(d16, x + 8), s0, s1);
}
HWY_INLINE Run Scaled(const Run& r, int16_t sc) {
  const V16 v = hn::Set(D16(), sc);
  return Run(hn::Mul(r.lo, v), hn::Mul(r.hi, v));
}
HWY_INLINE V32 ScaledSum(V32 s, int32_t /*sc*/) { return s; }
#endif

// ---- Decoding.

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

// One 32-value block as two runs (values 0..15, 16..31) minus the type's offset, and its scales: dw (of the
// integer sum) and dm (Q4_1/Q5_1's min, of dx * S).
// MXFP4: the codes through a table to their signed values kvalues_mxfp4 (no offset), dw = 2^(e - 128).
template <class B>
HWY_INLINE void DecodeBlock(const B& b, Run* r, float& dw, float& dm) {
  dm = 0;
  if constexpr (std::is_same_v<B, block_mxfp4>) {
    dw = ::kiln::detail::e8m0_to_fp32_half(b.e);
    const DU8 d8;
    const VI8 lut = hn::LoadU(DI8(), ::kiln::detail::kvalues_mxfp4);
    const VU8 v = hn::LoadU(d8, b.qs);
    r[0] = MakeRun(hn::TableLookupBytes(lut, hn::BitCast(DI8(), hn::And(v, hn::Set(d8, 0x0F)))));
    r[1] = MakeRun(hn::TableLookupBytes(lut, hn::BitCast(DI8(), hn::ShiftRight<4>(v))));
    return;
  } else {
    dw = f16_bits_to_f32(b.d.bits);
  }
  if constexpr (std::is_same_v<B, block_q8_0>) {
    r[0] = MakeRun(hn::LoadU(DI8(), b.qs));
    r[1] = MakeRun(hn::LoadU(DI8(), b.qs + 16));
  } else {
    constexpr bool kQ5 = std::is_same_v<B, block_q5_0> || std::is_same_v<B, block_q5_1>;
    constexpr bool kMin = std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_1>;
    constexpr int8_t off = kMin ? 0 : kQ5 ? 16 : 8;
    const DU8 d8;
    const VU8 v = hn::LoadU(d8, b.qs);
    VU8 lo = hn::And(v, hn::Set(d8, 0x0F)), hi = hn::ShiftRight<4>(v);
    if constexpr (kQ5) {
      const uint32_t qh = ::kiln::detail::load_u32_le(b.qh);
      lo = hn::Or(lo, FifthBits(qh, 0));
      hi = hn::Or(hi, FifthBits(qh, 16));
    }
    r[0] = MakeRun(lo, off);
    r[1] = MakeRun(hi, off);
    if constexpr (kMin) dm = f16_bits_to_f32(b.m.bits);
  }
}

// ---- Kernels: C outputs of each of n weight rows; x[i]: row i of x as the engine reads it (physical order).

template <class B, size_t C>
HWY_NOINLINE void Gemv32(const QActLayout& L, const ActRow* a, const XT* const* x, const uint8_t* w, ptrdiff_t ldw,
                         size_t n, float* y, ptrdiff_t ldy) {
  constexpr bool kMin = std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_1>;
  const DF df;
  const D32 d32;
  const size_t nb = L.k / 32;
  for (size_t j = 0; j < n; ++j) {
    const B* row = reinterpret_cast<const B*>(w + static_cast<ptrdiff_t>(j) * ldw);
    VF f[C];
    for (size_t i = 0; i < C; ++i) f[i] = hn::Zero(df);
    for (size_t b = 0; b < nb; ++b) {
      Run r[2];
      float dw, dm;
      DecodeBlock(row[b], r, dw, dm);
      const size_t o = 128 * (b / 4) + 16 * (b % 4);
      for (size_t i = 0; i < C; ++i) {
        V32 s0 = hn::Zero(d32), s1 = hn::Zero(d32);
        Dot(s0, s1, r[0], x[i] + o);
        Dot(s0, s1, r[1], x[i] + o + 64);
        const VF t = hn::Mul(hn::ConvertTo(df, hn::Add(s0, s1)), hn::LoadU(df, a[i].dxr + 4 * b));
        f[i] = hn::MulAdd(t, hn::Set(df, dw), f[i]);
        if constexpr (kMin) f[i] = hn::MulAdd(hn::Set(df, dm), hn::LoadU(df, a[i].dxsr + 4 * b), f[i]);
      }
    }
    for (size_t i = 0; i < C; ++i)
      y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = hn::GetLane(hn::SumOfLanes(df, f[i]));
  }
}

// Q4_K / Q5_K: 8 sub-blocks of 32 (logical s at physical 32 kKPerm[s] in x), each sum times its 6-bit scale;
// the mins term dmin * dx * sum_s mn_s S_s is scalar.
template <bool kQ5, size_t C>
HWY_NOINLINE void GemvQ45K(const QActLayout& L, const ActRow* a, const XT* const* x, const uint8_t* w, ptrdiff_t ldw,
                           size_t n, float* y, ptrdiff_t ldy) {
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
      ::kiln::detail::scales_mins_k4(b.scales, sc, mn);
      V32 acc[C];
      for (size_t i = 0; i < C; ++i) acc[i] = hn::Zero(d32);
      for (size_t s = 0; s < 8; ++s) {
        Run r[2];
        for (size_t h = 0; h < 2; ++h) {  // values 16 h .. 16 h + 15 of sub-block s
          const VU8 q = hn::LoadU(d8, b.qs + 32 * (s / 2) + 16 * h);
          VU8 u = s % 2 ? hn::ShiftRight<4>(q) : hn::And(q, m4);
          if constexpr (kQ5) {  // bit s of qh[l] -> 0x10
            const auto bit = hn::TestBit(hn::LoadU(d8, b.qh + 16 * h), hn::Set(d8, uint8_t(1u << s)));
            u = hn::Or(u, hn::IfThenElseZero(bit, m16));
          }
          r[h] = Scaled(MakeRun(u, 0), static_cast<int16_t>(sc[s]));
        }
        for (size_t i = 0; i < C; ++i) {
          const XT* xs = x[i] + 256 * sb + 32 * kKPerm[s];
          V32 s0 = hn::Zero(d32), s1 = hn::Zero(d32);
          Dot(s0, s1, r[0], xs);
          Dot(s0, s1, r[1], xs + 16);
          acc[i] = hn::Add(acc[i], ScaledSum(hn::Add(s0, s1), sc[s]));
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

// Q6_K: 16 sub-blocks of 16 (natural order), (u - 32) times the int8 scale.
template <size_t C>
HWY_NOINLINE void GemvQ6K(const QActLayout& L, const ActRow* a, const XT* const* x, const uint8_t* w, ptrdiff_t ldw,
                          size_t n, float* y, ptrdiff_t ldy) {
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
      for (size_t v = 0; v < 16; ++v) {  // values 16 v .. 16 v + 15: sub-block v
        // Value 32 V + 16 part + l (V = 4 h + quarter): low 4 bits from ql (quarters 0/2 the low nibbles of
        // ql[64 h ..], 1/3 of ql[64 h + 32 ..], 2/3 shifted down), high 2 from qh bits 2 quarter.
        const size_t h = v / 8, r8 = v % 8, part = r8 % 2, quarter = r8 / 2;
        const VU8 l = hn::LoadU(d8, b.ql + 64 * h + 32 * (quarter % 2) + 16 * part);
        const VU8 qh = hn::LoadU(d8, b.qh + 32 * h + 16 * part);
        const VU8 lo = quarter < 2 ? hn::And(l, m4) : hn::ShiftRight<4>(l);
        VU8 hi;
        switch (quarter) {
          case 0:
            hi = hn::ShiftLeft<4>(qh);
            break;
          case 1:
            hi = hn::ShiftLeft<2>(qh);
            break;
          case 2:
            hi = qh;
            break;
          default:
            hi = hn::ShiftRight<2>(qh);
            break;
        }
        const int16_t sc = static_cast<int16_t>(b.scales[v]);
        const Run r = Scaled(MakeRun(hn::Or(lo, hn::And(hi, m30)), 32), sc);
        for (size_t i = 0; i < C; ++i) {
          V32 s0 = hn::Zero(d32), s1 = hn::Zero(d32);
          Dot(s0, s1, r, x[i] + 256 * sb + 16 * v);
          acc[i] = hn::Add(acc[i], ScaledSum(hn::Add(s0, s1), sc));
        }
      }
      const float d = f16_bits_to_f32(b.d.bits);
      for (size_t i = 0; i < C; ++i) f[i] = hn::MulAdd(hn::ConvertTo(df, acc[i]), hn::Set(df, d * a[i].dx[sb]), f[i]);
    }
    for (size_t i = 0; i < C; ++i)
      y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = hn::GetLane(hn::SumOfLanes(df, f[i]));
  }
}

template <class B, size_t C>
HWY_INLINE void GemvTyped(const QActLayout& L, const ActRow* a, const XT* const* x, const uint8_t* w, ptrdiff_t ldw,
                          size_t n, float* y, ptrdiff_t ldy) {
  if constexpr (std::is_same_v<B, block_q4_K>) GemvQ45K<false, C>(L, a, x, w, ldw, n, y, ldy);
  else if constexpr (std::is_same_v<B, block_q5_K>) GemvQ45K<true, C>(L, a, x, w, ldw, n, y, ldy);
  else if constexpr (std::is_same_v<B, block_q6_K>) GemvQ6K<C>(L, a, x, w, ldw, n, y, ldy);
  else Gemv32<B, C>(L, a, x, w, ldw, n, y, ldy);
}

// q (kp int8, physical order) to int16 (the 16-bit engine).
HWY_INLINE void WidenAct(const int8_t* HWY_RESTRICT q, size_t kp, int16_t* HWY_RESTRICT x16) {
  const DI8 d8;
  const D16 d16;
  for (size_t t = 0; t < kp; t += 16) {
    const auto v = hn::LoadU(d8, q + t);
    hn::StoreU(hn::PromoteTo(d16, hn::LowerHalf(v)), d16, x16 + t);
    hn::StoreU(hn::PromoteTo(d16, hn::UpperHalf(DHI8(), v)), d16, x16 + t + 8);
  }
}

}  // namespace KILN_QMM_PNS

// GEMV: one pass over W with all (<= 4) rows of x. GEMM: blocks of 32 weight rows (L2-resident) against 4
// rows of x at a time. Each output is computed the same way in both. Scratch slot 1: 4 widened rows of x
// (16-bit engine).
inline void KILN_QMM_ROWS(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, ptrdiff_t ldw, size_t n,
                          float* y, ptrdiff_t ldy, bool gemm) {
  constexpr size_t kRowBlock = 32, kC = 4;
  using XT = KILN_QMM_PNS::XT;
  constexpr bool kWiden = std::is_same_v<XT, int16_t>;
  const size_t nblock = gemm ? kRowBlock : n;
  auto* x16 = kWiden ? static_cast<int16_t*>(::kiln::detail::qmm_scratch(1, kC * L.kp * sizeof(int16_t))) : nullptr;
  VisitType(L.type, [&](auto* tag) {
    using B = std::remove_pointer_t<decltype(tag)>;
    for (size_t j0 = 0; j0 < n; j0 += nblock) {
      const size_t nn = HWY_MIN(nblock, n - j0);
      const uint8_t* wj = w + static_cast<ptrdiff_t>(j0) * ldw;
      for (size_t i0 = 0; i0 < m; i0 += kC) {
        ActRow a[kC];
        const XT* xr[kC];
        const size_t c = HWY_MIN(kC, m - i0);
        for (size_t i = 0; i < c; ++i) {
          a[i] = GetActRow(act + (i0 + i) * L.row_bytes, L);
          if (kWiden) KILN_QMM_PNS::WidenAct(a[i].q, L.kp, x16 + i * L.kp);
          // (a cast to the type it already has on either side: the branch not taken must compile too)
          xr[i] = kWiden ? reinterpret_cast<const XT*>(x16 + i * L.kp) : reinterpret_cast<const XT*>(a[i].q);
        }
        float* yi = y + static_cast<ptrdiff_t>(i0) * ldy + static_cast<ptrdiff_t>(j0);
        switch (c) {
          case 4:
            KILN_QMM_PNS::GemvTyped<B, 4>(L, a, xr, wj, ldw, nn, yi, ldy);
            break;
          case 3:
            KILN_QMM_PNS::GemvTyped<B, 3>(L, a, xr, wj, ldw, nn, yi, ldy);
            break;
          case 2:
            KILN_QMM_PNS::GemvTyped<B, 2>(L, a, xr, wj, ldw, nn, yi, ldy);
            break;
          default:
            KILN_QMM_PNS::GemvTyped<B, 1>(L, a, xr, wj, ldw, nn, yi, ldy);
            break;
        }
      }
    }
  });
}
