// kiln/ops/qmatmul_vnni_x16-inl.h - qmatmul over 16-row interleaved Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights
// (ops/qmatmul_interleave.hpp) on AVX3_DL: the GEMV kernel, and the GEMM's panels from interleaved groups.
// Included from qmatmul-inl.h only, after qmatmul_vnni-inl.h (KILN_QMM_VNNI).
//
// GEMV, per group of 16 rows and block b, for each row i of x: acc (16 lanes = 16 weight rows) starts at
// ginit = kQmmMagic - off * S, then one vpdpbusd per step and nibble half against 4 broadcast activation
// bytes; f += ((f32 bits of acc) - 1.5 * 2^23) * (d * dx) [+ m * (dx * S)]. That is the GEMM kernel's
// arithmetic, lane for lane, so GEMV and GEMM give identical outputs for the same row of x.
// Per 16 rows x 32 values: 4 (Q8_0: 8) loads, 3 logic ops per 4-bit step (Q5: 4 more for the fifth bits),
// 8 vpdpbusd per row of x and 3 f32 ops: about 1.6x fewer instructions than the row-major GEMV, which
// permutes bytes and reduces across lanes.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_OPS_QMATMUL_VNNI_X16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_OPS_QMATMUL_VNNI_X16_INL_H_
#undef KILN_OPS_QMATMUL_VNNI_X16_INL_H_
#else
#define KILN_OPS_QMATMUL_VNNI_X16_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {

#if HWY_TARGET == HWY_AVX3_DL

HWY_DIAGNOSTICS(push)
#if HWY_COMPILER_GCC_ACTUAL
HWY_DIAGNOSTICS_OFF(disable : 4701, ignored "-Wuninitialized")
HWY_DIAGNOSTICS_OFF(disable : 4703 6001 26494, ignored "-Wmaybe-uninitialized")
#endif

namespace vnni {

// Offset in a row of x's physical order (QActLayout) of the 4 activation bytes that step s of block b
// meets: 4-bit types, low nibbles (hi = false) values 4s.., high nibbles 16 + 4s..; Q8_0 steps 0..7 are
// values 4s.. in order.
HWY_INLINE size_t X16ActOffset(size_t b, size_t s, bool hi) {
  const size_t o = 128 * (b / 4) + 16 * (b % 4);
  return s < 4 ? o + 4 * s + (hi ? 64 : 0) : o + 64 + 4 * (s - 4);
}

// Q5: vpshufbitqmb indices taking, for byte i of a step register, the fifth bit of its value from the
// qh register (row r's qh in 32-bit lane r, so qword q holds rows 2q (bits 0..31) and 2q + 1 (32..63)):
// byte 8q + t is value `off` + t % 4 of row 2q + t / 4, whose fifth bit is qh bit off + t % 4.
constexpr Idx64 X16BitIdx(size_t off) {
  Idx64 r{};
  for (size_t i = 0; i < 64; ++i) r.v[i] = static_cast<uint8_t>((i % 8) / 4 * 32 + off + i % 4);
  return r;
}
inline constexpr Idx64 kX16BitLo[4] = {X16BitIdx(0), X16BitIdx(4), X16BitIdx(8), X16BitIdx(12)};
inline constexpr Idx64 kX16BitHi[4] = {X16BitIdx(16), X16BitIdx(20), X16BitIdx(24), X16BitIdx(28)};

// Step s's unsigned values of 16 rows from the stored register z (and, for Q5, the qh register): lo =
// values 4s.. (low nibbles), hi = values 16 + 4s.. (high nibbles), each plus 16 where its qh bit is set.
template <class X>
KILN_QMM_VNNI HWY_INLINE void X16Nibbles(__m512i z, __m512i qh, size_t s, __m512i& lo, __m512i& hi) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  lo = _mm512_and_si512(z, m4);
  hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
  if constexpr (X::kQh) {
    const __m512i b4 = _mm512_set1_epi8(0x10);
    lo = _mm512_mask_add_epi8(lo, _mm512_bitshuffle_epi64_mask(qh, LoadIdx(kX16BitLo[s])), lo, b4);
    hi = _mm512_mask_add_epi8(hi, _mm512_bitshuffle_epi64_mask(qh, LoadIdx(kX16BitHi[s])), hi, b4);
  } else {
    (void)qh;
  }
}

HWY_INLINE __m512i X16Bcast(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// y[c * ldy + 16 g + l] for rows c < C of x and the `groups` interleaved groups at w.
template <class B, size_t C>
KILN_QMM_VNNI HWY_NOINLINE void GemvX16(const QActLayout& L, const ActRow* a, const uint8_t* w, size_t groups,
                                        float* y, ptrdiff_t ldy) {
  using X = ::kiln::detail::QmmX16<B>;
  constexpr bool kQ8 = X::kSteps == 8;
  const size_t nb = L.k / 32;
  const __m512 magic = _mm512_set1_ps(::kiln::detail::kQmmMagicF);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const uint8_t* col = w;
  for (size_t g = 0; g < groups; ++g) {
    __m512 f[C];
    for (size_t c = 0; c < C; ++c) f[c] = _mm512_setzero_ps();
    for (size_t b = 0; b < nb; ++b, col += X::kColBytes) {
      __m512i acc[C];
      for (size_t c = 0; c < C; ++c) acc[c] = _mm512_set1_epi32(a[c].ginit[b]);
      const __m512i qh = X::kQh ? _mm512_loadu_si512(col + X::kOffQh) : _mm512_setzero_si512();
      for (size_t s = 0; s < 4; ++s) {
        const __m512i z = _mm512_loadu_si512(col + X::kOffQ + 64 * s);
        if constexpr (kQ8) {
          const __m512i z2 = _mm512_xor_si512(_mm512_loadu_si512(col + X::kOffQ + 64 * (s + 4)), flip);
          const __m512i z1 = _mm512_xor_si512(z, flip);
          for (size_t c = 0; c < C; ++c) {
            acc[c] = _mm512_dpbusd_epi32(acc[c], z1, X16Bcast(a[c].q + X16ActOffset(b, s, false)));
            acc[c] = _mm512_dpbusd_epi32(acc[c], z2, X16Bcast(a[c].q + X16ActOffset(b, s + 4, false)));
          }
        } else {
          __m512i lo, hi;
          X16Nibbles<X>(z, qh, s, lo, hi);
          for (size_t c = 0; c < C; ++c) {
            acc[c] = _mm512_dpbusd_epi32(acc[c], lo, X16Bcast(a[c].q + X16ActOffset(b, s, false)));
            acc[c] = _mm512_dpbusd_epi32(acc[c], hi, X16Bcast(a[c].q + X16ActOffset(b, s, true)));
          }
        }
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col)));
      for (size_t c = 0; c < C; ++c) {
        const __m512 t = _mm512_sub_ps(_mm512_castsi512_ps(acc[c]), magic);
        f[c] = _mm512_fmadd_ps(t, _mm512_mul_ps(dw, _mm512_set1_ps(a[c].dx[b])), f[c]);
      }
      if constexpr (X::kMin) {
        const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 32)));
        for (size_t c = 0; c < C; ++c) f[c] = _mm512_fmadd_ps(dm, _mm512_set1_ps(a[c].gdxs[b]), f[c]);
      }
    }
    for (size_t c = 0; c < C; ++c)
      _mm512_storeu_ps(y + static_cast<ptrdiff_t>(c) * ldy + static_cast<ptrdiff_t>(16 * g), f[c]);
  }
}

// GEMV over the `groups` interleaved groups at w: rows of x 4 at a time.
inline void GemvVnniX16(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, size_t groups,
                        float* y, ptrdiff_t ldy) {
  constexpr size_t kC = 4;
  VisitType(L.type, [&](auto* tag) {
    using B = std::remove_pointer_t<decltype(tag)>;
    if constexpr (qmm_interleavable_v<B>) {
      for (size_t i0 = 0; i0 < m; i0 += kC) {
        ActRow a[kC];
        const size_t c = HWY_MIN(kC, m - i0);
        for (size_t i = 0; i < c; ++i) a[i] = GetActRow(act + (i0 + i) * L.row_bytes, L);
        float* yi = y + static_cast<ptrdiff_t>(i0) * ldy;
        switch (c) {
          case 4: GemvX16<B, 4>(L, a, w, groups, yi, ldy); break;
          case 3: GemvX16<B, 3>(L, a, w, groups, yi, ldy); break;
          case 2: GemvX16<B, 2>(L, a, w, groups, yi, ldy); break;
          default: GemvX16<B, 1>(L, a, w, groups, yi, ldy); break;
        }
      }
    }
  });
}

// One interleaved group into a GEMM panel (qmatmul_vnni_gemm-inl.h: step t of 16 rows' unsigned bytes at
// u + 64 t for activation bytes 4t..4t+3; d (and m) per block as 16 f32 lanes).
template <class B, class PanelT>
KILN_QMM_VNNI void PackPanelX16(const uint8_t* grp, const QActLayout& L, const PanelT& P) {
  using X = ::kiln::detail::QmmX16<B>;
  const size_t nb = L.k / 32;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* col = grp + b * X::kColBytes;
    const __m512i qh = X::kQh ? _mm512_loadu_si512(col + X::kOffQh) : _mm512_setzero_si512();
    _mm512_store_ps(P.dw + 16 * b, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col))));
    if constexpr (X::kMin)
      _mm512_store_ps(P.dm + 16 * b, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 32))));
    for (size_t s = 0; s < X::kSteps; ++s) {
      const __m512i z = _mm512_loadu_si512(col + X::kOffQ + 64 * s);
      if constexpr (X::kSteps == 8) {
        _mm512_store_si512(P.u + 16 * X16ActOffset(b, s, false), _mm512_xor_si512(z, flip));
      } else {
        __m512i lo, hi;
        X16Nibbles<X>(z, qh, s, lo, hi);
        _mm512_store_si512(P.u + 16 * X16ActOffset(b, s, false), lo);
        _mm512_store_si512(P.u + 16 * X16ActOffset(b, s, true), hi);
      }
    }
  }
}

}  // namespace vnni

HWY_DIAGNOSTICS(pop)

#endif  // HWY_TARGET == HWY_AVX3_DL

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
