// kiln/kernels/qmatmul/x86/vnni_x16-inl.h - qmatmul over 16-row interleaved Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 /
// Q4_K / MXFP4 weights (quant/interleave.hpp) on AVX3_DL: the GEMV kernel, and the GEMM's panels from interleaved
// groups. MXFP4 as the row-major kernels take it (vnni-inl.h, Dec32Mxfp4): u = kvalues_mxfp4[code] + 12 through
// a vpshufb table, and 2^(e - 128) for d.
// Included from entry-inl.h only, after vnni-inl.h (KILN_QMM_VNNI).
//
// GEMV, per group of 16 rows and block b, for each row i of x: acc (16 lanes = 16 weight rows) starts at
// ginit = kQmmMagic - off * S, then one vpdpbusd per step and nibble half against 4 broadcast activation
// bytes; f += ((f32 bits of acc) - 1.5 * 2^23) * (d * dx) [+ m * (dx * S)]. That is the GEMM kernel's
// arithmetic, lane for lane, so GEMV and GEMM give identical outputs for the same row of x (Q4_K, below:
// exact integer sums per super-block instead, as the row-major GEMV; cheaper than 8 f32 steps). With two
// activation parts (kQmmPairs) the GEMV, as the GEMM, adds their integer sums per block before converting
// (2^s X + R), so a decode step's products have a prompt's bits (Q4_K: each part scaled in f32 and the pair
// added after, equal up to f32 rounding).
// Per 16 rows x 32 values: 4 (Q8_0: 8) loads, 3 logic ops per 4-bit step (Q5: 4 more for the fifth bits),
// 8 vpdpbusd per row of x and 3 f32 ops: about 1.6x fewer instructions than the row-major GEMV, which
// permutes bytes and reduces across lanes.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_QMATMUL_X86_VNNI_X16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_QMATMUL_X86_VNNI_X16_INL_H_
#undef KILN_KERNELS_QMATMUL_X86_VNNI_X16_INL_H_
#else
#define KILN_KERNELS_QMATMUL_X86_VNNI_X16_INL_H_
#endif

#include <hwy/highway.h>

#include "kiln/kernels/x86/common.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {

#if HWY_TARGET == HWY_AVX3_DL

KILN_X86_DIAGNOSTICS_PUSH

namespace vnni {

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
// values 4s.. (low nibbles), hi = values 16 + 4s.. (high nibbles), each plus 16 where its qh bit is set
// (MXFP4: the codes' u through the table).
template <class X>
KILN_QMM_VNNI HWY_INLINE void X16Nibbles(__m512i z, __m512i qh, size_t s, __m512i& lo, __m512i& hi) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  lo = _mm512_and_si512(z, m4);
  hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
  if constexpr (X::kE8m0) {
    const __m512i lut = LoadIdx(Dec32Mxfp4::kLut);
    lo = _mm512_shuffle_epi8(lut, lo);
    hi = _mm512_shuffle_epi8(lut, hi);
  }
  if constexpr (X::kQh) {
    const __m512i b4 = _mm512_set1_epi8(0x10);
    lo = _mm512_mask_add_epi8(lo, _mm512_bitshuffle_epi64_mask(qh, LoadIdx(kX16BitLo[s])), lo, b4);
    hi = _mm512_mask_add_epi8(hi, _mm512_bitshuffle_epi64_mask(qh, LoadIdx(kX16BitHi[s])), hi, b4);
  } else {
    (void)qh;
  }
}

// The GEMVs read a task's groups front to back as one stream, which the hardware prefetchers alone keep too
// few lines ahead of where one core's read bandwidth is bound by its outstanding misses (Sapphire/Emerald
// Rapids: the Q4/Q5 GEMVs well below a plain read loop over the same bytes, docs/benchmarks.md). Each block
// column's lines are prefetched into L2 (prefetcht1) kX16PrefetchBytes ahead, which brings them to the read
// loop's speed there; into L1 or at 1 KiB they gained less. Lines past a task's range are few and harmless
// (a prefetch never faults). Only where x86::stream_prefetch_on() (Intel; on Zen 4 it cost bandwidth).
inline constexpr size_t kX16PrefetchBytes = 4096;
template <size_t kBytes>
HWY_INLINE void X16Prefetch(const uint8_t* col, bool on) {
  if (!on) return;
  for (size_t o = 0; o < kBytes; o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(col) + kX16PrefetchBytes + o, _MM_HINT_T1);
}

// A block column's 16 scales d as f32 (f16, or MXFP4's e8m0 bytes as 2^(e - 128)).
template <class X>
KILN_QMM_VNNI HWY_INLINE __m512 X16Scales(const uint8_t* col) {
  if constexpr (X::kE8m0) return E8m0Half(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col))));
  else return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col)));
}

HWY_INLINE __m512i X16Bcast(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// y[c * ldy + 16 g + l] for rows c < C of x and the `groups` interleaved groups at w. kPairs: rows 2i and
// 2i + 1 are the two parts of one row of x (kQmmPairs), ended per block by the GEMM's PairGroupStep /
// PairMinStep, so each row of y (row i of y: pair i) has the GEMM's bits for the same row of x.
template <class B, size_t C, bool kPairs>
KILN_QMM_VNNI HWY_NOINLINE void GemvX16(const QActLayout& L, const ActRow* a, const uint8_t* w, size_t groups, float* y,
                                        ptrdiff_t ldy) {
  using X = ::kiln::detail::QmmX16<B>;
  constexpr bool kQ8 = X::kSteps == 8;
  static_assert(!kPairs || C % 2 == 0, "kiln: pairs of activation rows need an even C");
  const size_t nb = L.k / 32;
  const __m512 magic = _mm512_set1_ps(::kiln::detail::kQmmMagicF);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const bool pf = ::kiln::detail::x86::stream_prefetch_on();
  const uint8_t* col = w;
  for (size_t g = 0; g < groups; ++g) {
    __m512 f[C];
    for (size_t c = 0; c < C; ++c) f[c] = _mm512_setzero_ps();
    for (size_t b = 0; b < nb; ++b, col += X::kColBytes) {
      X16Prefetch<X::kColBytes>(col, pf);
      __m512i acc[C];
      for (size_t c = 0; c < C; ++c) acc[c] = _mm512_set1_epi32(kPairs && c % 2 == 1 ? a[c].pinit[b] : a[c].ginit[b]);
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
      const __m512 dw = X16Scales<X>(col);
      if constexpr (kPairs) {
        for (size_t c = 0; c < C; c += 2)
          f[c] = PairGroupStep(f[c], acc[c], acc[c + 1], a[c + 1].pshift[b], dw, a[c + 1].dx[b]);
      } else {
        for (size_t c = 0; c < C; ++c) {
          const __m512 t = _mm512_sub_ps(_mm512_castsi512_ps(acc[c]), magic);
          f[c] = _mm512_fmadd_ps(t, _mm512_mul_ps(dw, _mm512_set1_ps(a[c].dx[b])), f[c]);
        }
      }
      if constexpr (X::kMin) {
        const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 32)));
        if constexpr (kPairs) {
          for (size_t c = 0; c < C; c += 2) f[c] = PairMinStep(f[c], dm, a[c].gdxs[b], a[c + 1].gdxs[b]);
        } else {
          for (size_t c = 0; c < C; ++c) f[c] = _mm512_fmadd_ps(dm, _mm512_set1_ps(a[c].gdxs[b]), f[c]);
        }
      }
    }
    for (size_t c = 0; c < C; c += kPairs ? 2 : 1)
      _mm512_storeu_ps(y + static_cast<ptrdiff_t>(kPairs ? c / 2 : c) * ldy + static_cast<ptrdiff_t>(16 * g), f[c]);
  }
}

// ---- Q4_K ----
#define KILN_X16_UNROLL _Pragma("GCC unroll 8")
// A super-block column holds the 12 scale bytes of 16 rows as three dword registers (u0 = bytes 0..3 of
// each row, u1 = 4..7, u2 = 8..11), from which sub-block j's 6-bit scale and min come lane by lane
// (llama.cpp's get_scale_min_k4): j < 4: sc = u0 byte j & 63, mn = u1 byte j & 63; j >= 4: sc = (u2 byte
// j-4 & 15) | (u0 byte j-4 >> 6) << 4, mn = (u2 byte j-4 >> 4) | (u1 byte j-4 >> 6) << 4.
struct X16KScales {
  __m512i sc03, sc47, mn03, mn47;
  __m512 d, nd;  // d and -dmin
};
KILN_QMM_VNNI HWY_INLINE X16KScales X16KLoadScales(const uint8_t* col) {
  using X = ::kiln::detail::QmmX16<block_q4_K>;
  const __m512i u0 = _mm512_loadu_si512(col + X::kOffQh), u1 = _mm512_loadu_si512(col + X::kOffQh + 64),
                u2 = _mm512_loadu_si512(col + X::kOffQh + 128);
  const __m512i m6 = _mm512_set1_epi8(0x3F), m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  X16KScales k;
  k.sc03 = _mm512_and_si512(u0, m6);
  k.mn03 = _mm512_and_si512(u1, m6);
  k.sc47 = _mm512_or_si512(_mm512_and_si512(u2, m4), _mm512_and_si512(_mm512_srli_epi32(u0, 2), m30));
  k.mn47 =
      _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4), _mm512_and_si512(_mm512_srli_epi32(u1, 2), m30));
  k.d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col)));
  const __m256i dmin = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 32));
  k.nd = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_cvtph_ps(dmin));
  return k;
}
// Byte j (< 4) of each lane as f32.
KILN_QMM_VNNI HWY_INLINE __m512 X16KByte(__m512i v, size_t j) {
  const __m512i b = _mm512_srli_epi32(v, static_cast<unsigned>(8 * j));
  return _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(0xFF)));
}
// The GEMM panel's coefficients of logical sub-block j (DecodeRowForPanel): dw = sc * d, dm = mn * -dmin.
KILN_QMM_VNNI HWY_INLINE void X16KCoefs(const X16KScales& k, size_t j, __m512& dw, __m512& dm) {
  dw = _mm512_mul_ps(X16KByte(j < 4 ? k.sc03 : k.sc47, j % 4), k.d);
  dm = _mm512_mul_ps(X16KByte(j < 4 ? k.mn03 : k.mn47, j % 4), k.nd);
}

// Q4_K rows of x against interleaved groups, in integers per super-block as the row-major GemvK does:
// per logical sub-block j, vpdpbusd partial sums of 16 values (|p| <= 16 * 15 * 127 < 2^15) times sc_j by
// vpdpwssd (low word p * sc, high word: sign * 0) give sum_j sc_j I_j exactly; the mins sum_j mn_j S_j
// likewise (vpdpwssd of (mn_2i, mn_2i+1) words by the activation's (S_2i, S_2i+1)); then per super-block
// and row of x, f += I * (d dx), fm += M * (dmin dx), and y = f - fm lane by lane. qs chunk c (steps
// 8c .. 8c + 7) holds logical sub-blocks 2c (low nibbles) and 2c + 1 (high).
KILN_QMM_VNNI HWY_INLINE __m512i X16KWord(__m512i v, unsigned j) {  // byte j of each lane, zero-extended
  return _mm512_and_si512(_mm512_srli_epi32(v, 8 * j), _mm512_set1_epi32(0xFF));
}
template <size_t C>
KILN_QMM_VNNI HWY_NOINLINE void GemvX16K(const QActLayout& L, const ActRow* a, const uint8_t* w, size_t groups,
                                         float* y, ptrdiff_t ldy) {
  using X = ::kiln::detail::QmmX16<block_q4_K>;
  const size_t nsb = L.k / 256;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  // vpshufb patterns (indices within each 128-bit lane): bytes 0, 1 (or 2, 3) of each dword zero-extended
  // to its two words.
  auto pat = [](unsigned b0) {
    auto dw = [&](unsigned k) {
      return static_cast<int>((4 * k + b0) | 0x8000u | (4 * k + b0 + 1) << 16 | 0x80000000u);
    };
    return _mm512_set4_epi32(dw(3), dw(2), dw(1), dw(0));
  };
  const __m512i w01 = pat(0), w23 = pat(2);
  const bool pf = ::kiln::detail::x86::stream_prefetch_on();
  const uint8_t* col = w;
  for (size_t g = 0; g < groups; ++g) {
    __m512 f[C], fm[C];
    for (size_t c = 0; c < C; ++c) f[c] = fm[c] = _mm512_setzero_ps();
    for (size_t sb = 0; sb < nsb; ++sb, col += X::kColBytes) {
      X16Prefetch<X::kColBytes>(col, pf);
      const X16KScales k = X16KLoadScales(col);
      __m512i acc[C], macc[C];
      for (size_t c = 0; c < C; ++c) acc[c] = macc[c] = _mm512_setzero_si512();
      KILN_X16_UNROLL
      for (unsigned chunk = 0; chunk < 4; ++chunk) {
        const __m512i sc = chunk < 2 ? k.sc03 : k.sc47;
        const __m512i sclo = X16KWord(sc, 2 * chunk % 4), schi = X16KWord(sc, (2 * chunk + 1) % 4);
        const size_t plo = kKPerm[2 * chunk], phi = kKPerm[2 * chunk + 1];  // physical positions in q
        __m512i p[C][4];
        for (size_t c = 0; c < C; ++c) p[c][0] = p[c][1] = p[c][2] = p[c][3] = _mm512_setzero_si512();
        KILN_X16_UNROLL
        for (size_t t = 0; t < 8; ++t) {
          const __m512i z = _mm512_loadu_si512(col + X::kOffQ + 64 * (8 * chunk + t));
          const __m512i lo = _mm512_and_si512(z, m4), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
          const size_t h = t / 4;  // which 16 values of the sub-block
          for (size_t c = 0; c < C; ++c) {
            const int8_t* q = a[c].q + 256 * sb + 4 * t;
            p[c][h] = _mm512_dpbusd_epi32(p[c][h], lo, X16Bcast(q + 32 * plo));
            p[c][2 + h] = _mm512_dpbusd_epi32(p[c][2 + h], hi, X16Bcast(q + 32 * phi));
          }
        }
        for (size_t c = 0; c < C; ++c) {
          acc[c] = _mm512_dpwssd_epi32(acc[c], p[c][0], sclo);
          acc[c] = _mm512_dpwssd_epi32(acc[c], p[c][1], sclo);
          acc[c] = _mm512_dpwssd_epi32(acc[c], p[c][2], schi);
          acc[c] = _mm512_dpwssd_epi32(acc[c], p[c][3], schi);
        }
      }
      const __m512i mn01 = _mm512_shuffle_epi8(k.mn03, w01), mn23 = _mm512_shuffle_epi8(k.mn03, w23),
                    mn45 = _mm512_shuffle_epi8(k.mn47, w01), mn67 = _mm512_shuffle_epi8(k.mn47, w23);
      const __m512 dmin = _mm512_sub_ps(_mm512_setzero_ps(), k.nd);
      for (size_t c = 0; c < C; ++c) {
        const int16_t* ls = a[c].lsum16 + 8 * sb;  // S per logical sub-block
        macc[c] = _mm512_dpwssd_epi32(macc[c], mn01, X16Bcast(reinterpret_cast<const int8_t*>(ls)));
        macc[c] = _mm512_dpwssd_epi32(macc[c], mn23, X16Bcast(reinterpret_cast<const int8_t*>(ls + 2)));
        macc[c] = _mm512_dpwssd_epi32(macc[c], mn45, X16Bcast(reinterpret_cast<const int8_t*>(ls + 4)));
        macc[c] = _mm512_dpwssd_epi32(macc[c], mn67, X16Bcast(reinterpret_cast<const int8_t*>(ls + 6)));
        const __m512 dx = _mm512_set1_ps(a[c].dx[sb]);
        f[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[c]), _mm512_mul_ps(k.d, dx), f[c]);
        fm[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(macc[c]), _mm512_mul_ps(dmin, dx), fm[c]);
      }
    }
    for (size_t c = 0; c < C; ++c)
      _mm512_storeu_ps(y + static_cast<ptrdiff_t>(c) * ldy + static_cast<ptrdiff_t>(16 * g),
                       _mm512_sub_ps(f[c], fm[c]));
  }
}

// Whether GemvVnniX16 adds the two parts of kQmmPairs itself (pairs = true): all but Q4_K, whose GEMV keeps
// exact integer sums per super-block, part by part.
HWY_INLINE bool GemvX16Pairs(uint32_t type) { return type != ::kiln::ggml_type_id::Q4_K; }

// GEMV over the `groups` interleaved groups at w: rows of x 8 at a time (Q4_K: 4; its 4 partial sums per row
// would not fit the 32 registers at 8), so up to 8 rows (4 sequences of a SessionGroup step, two activation
// parts each) stream W once. pairs (GemvX16Pairs, m even): rows 2i, 2i + 1 are one row of x's two parts,
// and y gets m / 2 rows.
inline void GemvVnniX16(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, size_t groups, float* y,
                        ptrdiff_t ldy, bool pairs) {
  constexpr size_t kC = 8;
  HWY_DASSERT(!pairs || (m % 2 == 0 && GemvX16Pairs(L.type)));
  VisitType(L.type, [&](auto* tag) {
    using B = std::remove_pointer_t<decltype(tag)>;
    if constexpr (kernels::qmm_interleavable_v<B>) {
      for (size_t i0 = 0; i0 < m; i0 += kC) {
        ActRow a[kC];
        const size_t c = HWY_MIN(kC, m - i0);
        for (size_t i = 0; i < c; ++i) a[i] = GetActRow(act + (i0 + i) * L.row_bytes, L);
        float* yi = y + static_cast<ptrdiff_t>(pairs ? i0 / 2 : i0) * ldy;
        if constexpr (std::is_same_v<B, block_q4_K>) {
          for (size_t j = 0; j < c; j += 4) {
            const size_t cj = HWY_MIN(size_t{4}, c - j);
            float* yj = yi + static_cast<ptrdiff_t>(j) * ldy;
            switch (cj) {
              case 4:
                GemvX16K<4>(L, a + j, w, groups, yj, ldy);
                break;
              case 3:
                GemvX16K<3>(L, a + j, w, groups, yj, ldy);
                break;
              case 2:
                GemvX16K<2>(L, a + j, w, groups, yj, ldy);
                break;
              default:
                GemvX16K<1>(L, a + j, w, groups, yj, ldy);
                break;
            }
          }
        } else if (pairs) {
          switch (c) {
            case 8:
              GemvX16<B, 8, true>(L, a, w, groups, yi, ldy);
              break;
            case 6:
              GemvX16<B, 6, true>(L, a, w, groups, yi, ldy);
              break;
            case 4:
              GemvX16<B, 4, true>(L, a, w, groups, yi, ldy);
              break;
            default:
              GemvX16<B, 2, true>(L, a, w, groups, yi, ldy);
              break;
          }
        } else {
          switch (c) {
            case 8:
              GemvX16<B, 8, false>(L, a, w, groups, yi, ldy);
              break;
            case 7:
              GemvX16<B, 7, false>(L, a, w, groups, yi, ldy);
              break;
            case 6:
              GemvX16<B, 6, false>(L, a, w, groups, yi, ldy);
              break;
            case 5:
              GemvX16<B, 5, false>(L, a, w, groups, yi, ldy);
              break;
            case 4:
              GemvX16<B, 4, false>(L, a, w, groups, yi, ldy);
              break;
            case 3:
              GemvX16<B, 3, false>(L, a, w, groups, yi, ldy);
              break;
            case 2:
              GemvX16<B, 2, false>(L, a, w, groups, yi, ldy);
              break;
            default:
              GemvX16<B, 1, false>(L, a, w, groups, yi, ldy);
              break;
          }
        }
      }
    }
  });
}

// One interleaved group into a GEMM panel (vnni_gemm-inl.h: step t of 16 rows' unsigned bytes at
// u + 64 t for activation bytes 4t..4t+3; d (and m) per block as 16 f32 lanes).
template <class B, class PanelT>
KILN_QMM_VNNI void PackPanelX16(const uint8_t* grp, const QActLayout& L, const PanelT& P) {
  using X = ::kiln::detail::QmmX16<B>;
  if constexpr (X::kK) {  // Q4_K: sum group = physical sub-block (GroupOffset<1>), coefficients per group
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (size_t sb = 0; sb < L.k / 256; ++sb) {
      const uint8_t* col = grp + sb * X::kColBytes;
      const X16KScales k = X16KLoadScales(col);
      for (size_t p = 0; p < 8; ++p) {
        __m512 dw, dm;
        X16KCoefs(k, kKPerm[p], dw, dm);
        _mm512_store_ps(P.dw + 16 * (8 * sb + p), dw);
        _mm512_store_ps(P.dm + 16 * (8 * sb + p), dm);
      }
      for (size_t chunk = 0; chunk < 4; ++chunk) {
        const size_t plo = kKPerm[2 * chunk], phi = kKPerm[2 * chunk + 1];
        for (size_t t = 0; t < 8; ++t) {
          const __m512i z = _mm512_loadu_si512(col + X::kOffQ + 64 * (8 * chunk + t));
          _mm512_store_si512(P.u + 16 * (256 * sb + 32 * plo + 4 * t), _mm512_and_si512(z, m4));
          _mm512_store_si512(P.u + 16 * (256 * sb + 32 * phi + 4 * t), _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
        }
      }
    }
    return;
  }
  const size_t nb = L.k / 32;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* col = grp + b * X::kColBytes;
    const __m512i qh = X::kQh ? _mm512_loadu_si512(col + X::kOffQh) : _mm512_setzero_si512();
    _mm512_store_ps(P.dw + 16 * b, X16Scales<X>(col));
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

#undef KILN_X16_UNROLL
KILN_X86_DIAGNOSTICS_POP

#endif  // HWY_TARGET == HWY_AVX3_DL

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
