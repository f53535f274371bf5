// kiln/kernels/qmatmul/x86/vnni-inl.h - qmatmul GEMV kernels with AVX-512 VNNI (AVX3_DL target): vpdpbusd sums 4
// products of unsigned weight bytes and signed activation bytes into each int32 lane. Highway 1.0.3 has
// no op for it, so these are intrinsics in functions that add "avx512vnni" to the target's features.
// Included from entry-inl.h only.
//
// 32-value blocks, 4 blocks (one group, 72..136 bytes) at a time: one or two vpermt2b from a 128-byte
// window gather the 4 blocks' quants into 64 bytes ([b0 qs0..15 | b1 .. | b2 .. | b3 ..]), split into low
// and high nibbles (values 0..15 and 16..31 of each block: the activation's physical order), and two
// vpdpbusd leave each block's sum in 4 lanes. Per 16 blocks (4 groups) the sums are reduced to one lane per
// block (vpackssdw + vpmaddwd while they fit 16 bits), the offset -off * S added, and the 16 f16 scales,
// gathered by masked vpermb, converted at once: one conversion, multiply by dx and FMA by the scales per
// 16 blocks and row of x. The last groups of a row (masked loads) go one at a time, 4 lanes per block.
// K-quants, per super-block: vpdpbusd per 64 values (two sub-blocks: a 4-lane partial is at most
// 4 * 31 * 127 or 4 * 63 * 127 < 2^15), then vpdpwssd by the sub-block scales (low word: partial * sc;
// high word: sign extension * 0) accumulates sum_s sc_s * I_s exactly; one conversion per super-block.
// 32-value blocks: rows are read one after another (with contiguous rows, one sequential stream) and the
// row kAhead rows on is prefetched at the same pace; K-quants likewise (the next row prefetched).

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_QMATMUL_X86_VNNI_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_QMATMUL_X86_VNNI_INL_H_
#undef KILN_KERNELS_QMATMUL_X86_VNNI_INL_H_
#else
#define KILN_KERNELS_QMATMUL_X86_VNNI_INL_H_
#endif

#include <hwy/highway.h>

#include "kiln/kernels/x86/common.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {

#if HWY_TARGET == HWY_AVX3_DL

KILN_X86_DIAGNOSTICS_PUSH

// KILN_QMM_VNNI (x86/common.hpp): AVX512-VNNI, which AVX3_DL CPUs have (Ice Lake, Zen 4 and later).

namespace vnni {

struct Idx64 {
  alignas(64) uint8_t v[64];
};
// Bytes qs_off..qs_off+15 of each of 4 blocks of `bpb` bytes.
constexpr Idx64 QsIdx(size_t bpb, size_t qs_off) {
  Idx64 r{};
  for (size_t c = 0; c < 4; ++c)
    for (size_t j = 0; j < 16; ++j) r.v[16 * c + j] = static_cast<uint8_t>(c * bpb + qs_off + j);
  return r;
}
// The f16 at h_off of each block, 4 times: 16 words (the low 32 bytes).
constexpr Idx64 HalfIdx(size_t bpb, size_t h_off) {
  Idx64 r{};
  for (size_t w = 0; w < 16; ++w) {
    r.v[2 * w] = static_cast<uint8_t>((w / 4) * bpb + h_off);
    r.v[2 * w + 1] = static_cast<uint8_t>((w / 4) * bpb + h_off + 1);
  }
  return r;
}
// Q5: the 4 qh bytes of block c into the low dword of qwords 2c and 2c + 1 (vpshufbitqmb reads bits there).
constexpr Idx64 QhIdx(size_t bpb, size_t qh_off) {
  Idx64 r{};
  for (size_t q = 0; q < 8; ++q)
    for (size_t t = 0; t < 8; ++t) r.v[8 * q + t] = static_cast<uint8_t>((q / 2) * bpb + qh_off + t % 4);
  return r;
}
// Bit indices for vpshufbitqmb: byte j of a 16-byte chunk takes bit j (low values) or 16 + j (high).
constexpr Idx64 BitIdx(size_t base) {
  Idx64 r{};
  for (size_t i = 0; i < 64; ++i) r.v[i] = static_cast<uint8_t>(base + i % 16);
  return r;
}
// Scales of 16 blocks (4 groups) into 16 words: word t = d of a block (bytes 0..31), word 16 + t = its m
// (bytes 32..63). Transposed (the order of the GEMV's reduced sums): t = 4c + G for block c of group G;
// natural: t = 4G + c. The index is G-independent; a mask picks the words of one group.
constexpr Idx64 MergeIdx(size_t bpb, int m_off, bool transposed) {
  Idx64 r{};
  for (size_t p = 0; p < 64; ++p) {
    const size_t t = (p % 32) / 2, c = transposed ? t / 4 : t % 4;
    const size_t off = p < 32 ? 0 : static_cast<size_t>(m_off < 0 ? 0 : m_off);
    r.v[p] = static_cast<uint8_t>(c * bpb + off + p % 2);
  }
  return r;
}
constexpr uint64_t MergeMask(size_t G, bool with_m, bool transposed) {
  uint64_t k = 0;
  for (size_t c = 0; c < 4; ++c) {
    const size_t t = transposed ? 4 * c + G : 4 * G + c;
    k |= uint64_t{3} << (2 * t);
    if (with_m) k |= uint64_t{3} << (32 + 2 * t);
  }
  return k;
}
inline constexpr Idx64 kBitLo = BitIdx(0), kBitHi = BitIdx(16);

KILN_QMM_VNNI HWY_INLINE __m512i LoadIdx(const Idx64& i) { return _mm512_load_si512(i.v); }

// The end of a sum group for the two parts of one row of x (kQmmPairs; QuantizeRowSplit), shared by the GEMM
// kernel and the interleaved GEMV so that both give the same bits: acc_x started at ginit, acc_r at pinit,
// so c = (acc_x << s) + acc_r = 2^s X + R (mod 2^32, exact: |c| < 2^31), and f += c * (dw * dx_r), dx_r the
// residual's scale. PairMinStep: the group's min term, f += dm * (dx S + dx_r S_r) (gdxs of either part).
KILN_QMM_VNNI HWY_INLINE __m512 PairGroupStep(__m512 f, __m512i acc_x, __m512i acc_r, int32_t s, __m512 dw,
                                              float dx_r) {
  const __m512i c = _mm512_add_epi32(_mm512_sllv_epi32(acc_x, _mm512_set1_epi32(s)), acc_r);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), _mm512_mul_ps(dw, _mm512_set1_ps(dx_r)), f);
}
KILN_QMM_VNNI HWY_INLINE __m512 PairMinStep(__m512 f, __m512 dm, float gdxs_x, float gdxs_r) {
  return _mm512_fmadd_ps(dm, _mm512_set1_ps(gdxs_x + gdxs_r), f);
}

// 64 bytes at p, of which only the first `valid` (clipped to [0, 64]) are read; the rest are zero.
KILN_QMM_VNNI HWY_INLINE __m512i LoadPart(const uint8_t* p, ptrdiff_t valid) {
  if (valid >= 64) return _mm512_loadu_si512(p);
  if (valid <= 0) return _mm512_setzero_si512();
  return _mm512_maskz_loadu_epi8(_cvtu64_mask64((uint64_t{1} << valid) - 1), p);
}

// A 32-value block type: kBpb bytes a block, quants at kQs, d at 0, m at kM (or none), Q5's qh at kQh (or
// none), kQ8 for Q8_0's signed bytes. A group of 4 blocks is read through one (Q8_0: two) 128-byte windows.
template <size_t kBpb, size_t kQs, int kM, int kQh, bool kQ8>
struct Dec32Impl {
  static constexpr size_t kBytes = 4 * kBpb;        // a group
  static constexpr size_t kNeed = kQ8 ? 144 : 128;  // bytes the unmasked window loads read
  static constexpr bool kMin = kM >= 0;
  // How the reduction to one lane per block may narrow to 16 bits: a lane of a group holds 8 products,
  // at most 8 * 15 * 127 = 15240 (4-bit), 8 * 31 * 127 = 31496 (5-bit), 8 * 255 * 127 (Q8_0).
  static constexpr int kNarrow = kQ8 ? 0 : (kQh >= 0 ? 1 : 2);  // levels that may use vpackssdw
  static constexpr Idx64 kQsIdx = QsIdx(kBpb, kQs), kDIdx = HalfIdx(kBpb, 0),
                         kMIdx = HalfIdx(kBpb, kM < 0 ? 0 : static_cast<size_t>(kM)),
                         kQhIdx = QhIdx(kBpb, kQh < 0 ? 0 : static_cast<size_t>(kQh)),
                         kMergeIdx = MergeIdx(kBpb, kM, true), kMergeIdxN = MergeIdx(kBpb, kM, false);
  static constexpr bool kMergeInZ0 = 3 * kBpb + (kM < 0 ? 0 : static_cast<size_t>(kM)) + 1 < 64;

  struct Win {
    __m512i z0, z1, y0, y1;
  };
  // `valid` bytes from p may be read (>= kNeed: unmasked); blocks past them come out as zeros.
  KILN_QMM_VNNI static HWY_INLINE Win Load(const uint8_t* p, ptrdiff_t valid) {
    Win w;
    w.z0 = LoadPart(p, valid);
    w.z1 = LoadPart(p + 64, valid - 64);
    if constexpr (kQ8) {
      w.y0 = LoadPart(p + 16, valid - 16);
      w.y1 = LoadPart(p + 80, valid - 80);
    }
    return w;
  }
  // Unsigned quants: lo = values 0..15 of each block, hi = 16..31 (Q8_0: q + 128 = q ^ 0x80; the second
  // halves come from the window at p + 16 with the same indices).
  KILN_QMM_VNNI static HWY_INLINE void Quants(const Win& w, __m512i& lo, __m512i& hi) {
    if constexpr (kQ8) {
      const __m512i idx = LoadIdx(kQsIdx), flip = _mm512_set1_epi8(static_cast<char>(0x80));
      lo = _mm512_xor_si512(_mm512_permutex2var_epi8(w.z0, idx, w.z1), flip);
      hi = _mm512_xor_si512(_mm512_permutex2var_epi8(w.y0, idx, w.y1), flip);
    } else {
      const __m512i m4 = _mm512_set1_epi8(0x0F);
      const __m512i qs = _mm512_permutex2var_epi8(w.z0, LoadIdx(kQsIdx), w.z1);
      lo = _mm512_and_si512(qs, m4);
      hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
      if constexpr (kQh >= 0) {  // bit 4 of value j of block c is bit j of its qh
        const __m512i qh = _mm512_permutex2var_epi8(w.z0, LoadIdx(kQhIdx), w.z1), b4 = _mm512_set1_epi8(0x10);
        lo = _mm512_mask_add_epi8(lo, _mm512_bitshuffle_epi64_mask(qh, LoadIdx(kBitLo)), lo, b4);
        hi = _mm512_mask_add_epi8(hi, _mm512_bitshuffle_epi64_mask(qh, LoadIdx(kBitHi)), hi, b4);
      }
    }
  }
  // Scales (and mins) as f32, 4 lanes per block, for the per-group path.
  KILN_QMM_VNNI static HWY_INLINE void Scales4(const Win& w, __m512& dw, __m512& dm) {
    dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi8(w.z0, LoadIdx(kDIdx), w.z1)));
    if constexpr (kMin)
      dm = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi8(w.z0, LoadIdx(kMIdx), w.z1)));
  }
  // Group G's scales (and mins) into their words of the 16-block scale vector (see MergeIdx).
  template <bool kTransposed = true>
  KILN_QMM_VNNI static HWY_INLINE __m512i MergeScales(const Win& w, size_t G, __m512i dm16) {
    const __mmask64 k = _cvtu64_mask64(MergeMask(G, kMin, kTransposed));
    const __m512i idx = LoadIdx(kTransposed ? kMergeIdx : kMergeIdxN);
    if constexpr (kMergeInZ0) return _mm512_mask_permutexvar_epi8(dm16, k, idx, w.z0);
    else return _mm512_or_si512(dm16, _mm512_maskz_permutex2var_epi8(k, w.z0, idx, w.z1));
  }
  // The 16 blocks' scales and mins of a merged scale vector as f32.
  KILN_QMM_VNNI static HWY_INLINE __m512 ScalesF32(__m512i dm16) {
    return _mm512_cvtph_ps(_mm512_castsi512_si256(dm16));
  }
  KILN_QMM_VNNI static HWY_INLINE __m512 MinsF32(__m512i dm16) {
    return _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm16, 1));
  }
};

// 2^(e - 128) as f32 bits for e8m0 bytes e (0..255) in the 16 dword lanes (::kiln::detail::e8m0_to_fp32_half):
// (e - 1) << 23 for e >= 2, the subnormals 2^-128 and 2^-127 as 0x00200000 << e below.
KILN_QMM_VNNI HWY_INLINE __m512 E8m0Half(__m512i e) {
  const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
  const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2)), normal, sub));
}

// MXFP4 (17-byte blocks: e at 0, quants at 1): the nibbles through a vpshufb table to u = kvalues_mxfp4[code] +
// 12 (offset 12; a lane of a group holds 8 products of at most 24 * 127 = 3048: one level of the reduction
// narrows to 16 bits), and e8m0 scale bytes instead of f16 scales: gathered into the low bytes of the
// scale words (the high bytes stay zero) and built into 2^(e - 128) as f32 bits (E8m0Half).
struct Dec32Mxfp4 : Dec32Impl<17, 1, -1, -1, false> {
  static constexpr int kNarrow = 1;
  static constexpr Idx64 kLut = [] {
    Idx64 r{};
    for (size_t i = 0; i < 64; ++i) r.v[i] = static_cast<uint8_t>(::kiln::detail::kvalues_mxfp4[i % 16] + 12);
    return r;
  }();
  // Dword lane l = byte e of block l / 4 (Scales4's 4 lanes per block).
  static constexpr Idx64 kE4Idx = [] {
    Idx64 r{};
    for (size_t i = 0; i < 64; ++i) r.v[i] = static_cast<uint8_t>((i / 16) * 17);
    return r;
  }();
  KILN_QMM_VNNI static HWY_INLINE void Quants(const Win& w, __m512i& lo, __m512i& hi) {
    Dec32Impl::Quants(w, lo, hi);
    const __m512i lut = LoadIdx(kLut);
    lo = _mm512_shuffle_epi8(lut, lo);
    hi = _mm512_shuffle_epi8(lut, hi);
  }
  KILN_QMM_VNNI static HWY_INLINE void Scales4(const Win& w, __m512& dw, __m512& dm) {
    dw = E8m0Half(_mm512_maskz_permutexvar_epi8(_cvtu64_mask64(0x1111111111111111ull), LoadIdx(kE4Idx), w.z0));
    dm = _mm512_setzero_ps();
  }
  template <bool kTransposed = true>
  KILN_QMM_VNNI static HWY_INLINE __m512i MergeScales(const Win& w, size_t G, __m512i dm16) {
    const __mmask64 k = _cvtu64_mask64(MergeMask(G, false, kTransposed) & 0x5555555555555555ull);  // low bytes
    return _mm512_mask_permutexvar_epi8(dm16, k, LoadIdx(kTransposed ? kMergeIdx : kMergeIdxN), w.z0);
  }
  KILN_QMM_VNNI static HWY_INLINE __m512 ScalesF32(__m512i dm16) {
    return E8m0Half(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(dm16)));
  }
  KILN_QMM_VNNI static HWY_INLINE __m512 MinsF32(__m512i) { return _mm512_setzero_ps(); }
};

template <class B>
struct Dec32;
template <>
struct Dec32<block_q4_0> : Dec32Impl<18, 2, -1, -1, false> {};
template <>
struct Dec32<block_q4_1> : Dec32Impl<20, 4, 2, -1, false> {};
template <>
struct Dec32<block_q5_0> : Dec32Impl<22, 6, -1, 2, false> {};
template <>
struct Dec32<block_q5_1> : Dec32Impl<24, 8, 2, 4, false> {};
template <>
struct Dec32<block_q8_0> : Dec32Impl<34, 2, -1, -1, true> {};
template <>
struct Dec32<block_mxfp4> : Dec32Mxfp4 {};

// Per-group path (the last groups of a row): f += dw * dx * (4 lane sums per block, started at
// -off * S / 4) [+ dm * dx * S / 4].
template <bool kMin>
KILN_QMM_VNNI HWY_INLINE __m512 DotGroup(__m512i lo, __m512i hi, __m512 dw, __m512 dm, const ActRow& a, size_t G,
                                         __m512 f) {
  __m512i acc = _mm512_loadu_si512(a.corr + 16 * G);
  acc = _mm512_dpbusd_epi32(acc, lo, _mm512_loadu_si512(a.q + 128 * G));
  acc = _mm512_dpbusd_epi32(acc, hi, _mm512_loadu_si512(a.q + 128 * G + 64));
  const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_loadu_ps(a.dxr + 16 * G));
  f = _mm512_fmadd_ps(t, dw, f);
  if constexpr (kMin) f = _mm512_fmadd_ps(dm, _mm512_loadu_ps(a.dxsr + 16 * G), f);
  return f;
}

// Pairwise sums of adjacent i32 lanes of a and b, per 128-bit lane [a0+a1, a2+a3, b0+b1, b2+b3]: through
// vpackssdw + vpmaddwd when every lane fits 16 bits, else two vshufps and an add.
template <bool kNarrow>
KILN_QMM_VNNI HWY_INLINE __m512i PairSums(__m512i a, __m512i b) {
  if constexpr (kNarrow) {
    return _mm512_madd_epi16(_mm512_packs_epi32(a, b), _mm512_set1_epi16(1));
  } else {
    const __m512 fa = _mm512_castsi512_ps(a), fb = _mm512_castsi512_ps(b);
    return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(fa, fb, 0x88)),
                            _mm512_castps_si512(_mm512_shuffle_ps(fa, fb, 0xDD)));
  }
}
// acc[G] (4 lanes per block c of group G) -> one lane per block, lane 4c + G.
template <int kNarrow>
KILN_QMM_VNNI HWY_INLINE __m512i Reduce4(const __m512i* acc) {
  const __m512i l01 = PairSums<(kNarrow >= 1)>(acc[0], acc[1]), l23 = PairSums<(kNarrow >= 1)>(acc[2], acc[3]);
  return PairSums<(kNarrow >= 2)>(l01, l23);
}

// Rows are read one after another (one sequential stream when rows are contiguous, which the hardware
// prefetcher follows across rows), and the row kAhead rows on is prefetched at the same pace.
inline constexpr size_t kAhead = 2;
// KDec's arrays stay in registers only if every loop indexing them is unrolled (GCC otherwise spills
// the decoded super-block to the stack and reloads it: measured 1.3x slower).
#define KILN_QMM_UNROLL _Pragma("GCC unroll 4")
#define KILN_QMM_PREFETCH(p) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0)

template <class B, size_t C>
KILN_QMM_VNNI HWY_NOINLINE void Gemv32(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n,
                                       float* y, ptrdiff_t ldy) {
  using D = Dec32<B>;
  constexpr size_t gbytes = D::kBytes;
  constexpr bool kOffset = !std::is_same_v<B, block_q4_1> && !std::is_same_v<B, block_q5_1>;
  const size_t nb = L.k / 32, ngroups = (nb + 3) / 4;
  const ptrdiff_t row_bytes = static_cast<ptrdiff_t>(nb * sizeof(B));
  // Groups whose window loads stay inside the row (unmasked), and whole units of 4 of them.
  const size_t nfast = row_bytes >= static_cast<ptrdiff_t>(D::kNeed)
                           ? HWY_MIN(nb / 4, (static_cast<size_t>(row_bytes) - D::kNeed) / gbytes + 1)
                           : 0;
  const size_t nunits = nfast / 4;
  for (size_t j = 0; j < n; ++j) {
    const uint8_t* row = w + static_cast<ptrdiff_t>(j) * ldw;
    const uint8_t* ahead = w + static_cast<ptrdiff_t>(HWY_MIN(j + kAhead, n - 1)) * ldw;
    __m512 f[C];
    KILN_QMM_UNROLL
    for (size_t c = 0; c < C; ++c) f[c] = _mm512_setzero_ps();
    // Units of 16 blocks: per group, two vpdpbusd per row of x; per unit, the 4 group sums reduced to one
    // lane per block, the 16 f16 scales converted once.
    for (size_t u = 0; u < nunits; ++u) {
      __m512i acc[C][4];
      __m512i dm16 = _mm512_setzero_si512();
      KILN_QMM_UNROLL
      for (size_t G = 0; G < 4; ++G) {
        const size_t g = 4 * u + G;
        for (size_t o = 0; o < gbytes; o += 64) KILN_QMM_PREFETCH(ahead + g * gbytes + o);
        const auto win = D::Load(row + g * gbytes, static_cast<ptrdiff_t>(D::kNeed));
        __m512i lo, hi;
        D::Quants(win, lo, hi);
        dm16 = D::MergeScales(win, G, dm16);
        KILN_QMM_UNROLL
        for (size_t c = 0; c < C; ++c) {
          const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(a[c].q + 128 * g));
          acc[c][G] = _mm512_dpbusd_epi32(p, hi, _mm512_loadu_si512(a[c].q + 128 * g + 64));
        }
      }
      const __m512 dw = D::ScalesF32(dm16);
      __m512 dm = _mm512_setzero_ps();
      if constexpr (D::kMin) dm = D::MinsF32(dm16);
      KILN_QMM_UNROLL
      for (size_t c = 0; c < C; ++c) {
        __m512i I = Reduce4<D::kNarrow>(acc[c]);
        if constexpr (kOffset) I = _mm512_add_epi32(I, _mm512_loadu_si512(a[c].corrT + 16 * u));
        const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(I), _mm512_loadu_ps(a[c].dxT + 16 * u));
        f[c] = _mm512_fmadd_ps(t, dw, f[c]);
        if constexpr (D::kMin) f[c] = _mm512_fmadd_ps(dm, _mm512_loadu_ps(a[c].gdxsT + 16 * u), f[c]);
      }
    }
    // The remaining groups one at a time (masked loads near the end of the row).
    for (size_t G = 4 * nunits; G < ngroups; ++G) {
      const ptrdiff_t left = row_bytes - static_cast<ptrdiff_t>(G * gbytes);
      const ptrdiff_t valid =
          G < nfast ? static_cast<ptrdiff_t>(D::kNeed) : HWY_MIN(left, static_cast<ptrdiff_t>(gbytes));
      for (size_t o = 0; o < gbytes; o += 64) KILN_QMM_PREFETCH(ahead + G * gbytes + o);
      const auto win = D::Load(row + G * gbytes, valid);
      __m512i lo, hi;
      __m512 dw, dm = _mm512_setzero_ps();
      D::Quants(win, lo, hi);
      D::Scales4(win, dw, dm);
      KILN_QMM_UNROLL
      for (size_t c = 0; c < C; ++c) f[c] = DotGroup<D::kMin>(lo, hi, dw, dm, a[c], G, f[c]);
    }
    KILN_QMM_UNROLL
    for (size_t c = 0; c < C; ++c)
      y[static_cast<ptrdiff_t>(c) * ldy + static_cast<ptrdiff_t>(j)] = _mm512_reduce_add_ps(f[c]);
  }
}

// ---- K-quants ----

// Q4_K/Q5_K 6-bit scales and mins (llama.cpp's shuffle of the 3 dwords u0 u1 u2, in 32-bit lanes):
// bytes 0..7 = sc[0..7], bytes 8..15 = mn[0..7]. Reads 16 bytes at s12 (the 4 after the scales are quants).
//   [u0 & 0x3f.., (u2 & 0x0f..) | ((u0 >> 6) & 0x03..) << 4, u1 & 0x3f.., ((u2 >> 4) & 0x0f..) | ((u1 >> 6) & 0x03..) << 4]
KILN_QMM_VNNI HWY_INLINE __m128i KScalesMins(const uint8_t* s12) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s12));
  const __m128i a = _mm_srlv_epi32(_mm_shuffle_epi32(x, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4));
  const __m128i b = _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 0, 0));
  const __m128i lo = _mm_and_si128(a, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m128i hi = _mm_and_si128(_mm_srli_epi32(b, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(lo, hi);
}

// vpermb indices putting byte s0 into the low byte of dwords 0..7 and s1 into dwords 8..15 (with the
// zero-masking 0x1111.. the dword is that byte zero-extended).
constexpr Idx64 ByteToDword(size_t s0, size_t s1) {
  Idx64 r{};
  for (size_t l = 0; l < 16; ++l) r.v[4 * l] = static_cast<uint8_t>(l < 8 ? s0 : s1);
  return r;
}
inline constexpr Idx64 kSc02 = ByteToDword(0, 2), kSc13 = ByteToDword(1, 3), kSc46 = ByteToDword(4, 6),
                       kSc57 = ByteToDword(5, 7);
// vpermw indices: word 2l = word 4v + l / 4 of the 16 Q6_K scales (odd words are zero-masked).
struct Idx32w {
  alignas(64) uint16_t v[32];
};
constexpr Idx32w Q6ScIdx(size_t v) {
  Idx32w r{};
  for (size_t l = 0; l < 16; ++l) r.v[2 * l] = static_cast<uint16_t>(4 * v + l / 4);
  return r;
}
inline constexpr Idx32w kQ6Sc[4] = {Q6ScIdx(0), Q6ScIdx(1), Q6ScIdx(2), Q6ScIdx(3)};

// Lane index vectors: sub-blocks (s0 x 8, s1 x 8) and, for Q6_K, (4v, 4v+1, 4v+2, 4v+3) x 4 each.
KILN_QMM_VNNI HWY_INLINE __m512i Pick2(int s0, int s1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(s0)), _mm256_set1_epi32(s1), 1);
}

// u[v]: 64 unsigned quants at physical bytes 64v.. of the super-block; sc[v]: their sub-blocks' scales per
// lane (low word, high word 0).
struct KDec {
  __m512i u[4], sc[4];
  __m128 dd;     // d (lane 0) and, for Q4_K/Q5_K, dmin (lane 1)
  __m128i mn16;  // Q4_K/Q5_K: the 8 mins as i16
  __m256i sc16;  // Q6_K: the 16 scales as i16
};

template <bool kQ5>
KILN_QMM_VNNI HWY_INLINE void DecodeQ45K(const uint8_t* blk, KDec& k) {
  using B = std::conditional_t<kQ5, block_q5_K, block_q4_K>;
  const B& b = *reinterpret_cast<const B*>(blk);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i z0 = _mm512_loadu_si512(b.qs), z1 = _mm512_loadu_si512(b.qs + 64);
  k.u[0] = _mm512_and_si512(z0, m4);                        // sub-blocks 0 | 2
  k.u[1] = _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4);  // 1 | 3
  k.u[2] = _mm512_and_si512(z1, m4);                        // 4 | 6
  k.u[3] = _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4);  // 5 | 7
  if constexpr (kQ5) {  // bit s of qh[l] is bit 4 of value 32 s + l; 16-bit shifts by <= 4 stay in the byte
    const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh)));
    const __m512i b4 = _mm512_set1_epi8(0x10);
    const __m512i v0 = _mm512_sllv_epi16(hb, Pick2(4 | (4 << 16), 2 | (2 << 16)));
    const __m512i v1 = _mm512_sllv_epi16(hb, Pick2(3 | (3 << 16), 1 | (1 << 16)));
    const __m512i v2 = _mm512_srlv_epi16(hb, Pick2(0, 2 | (2 << 16)));
    const __m512i v3 = _mm512_srlv_epi16(hb, Pick2(1 | (1 << 16), 3 | (3 << 16)));
    k.u[0] = _mm512_ternarylogic_epi32(k.u[0], v0, b4, 0xF8);  // u | (v & 0x10)
    k.u[1] = _mm512_ternarylogic_epi32(k.u[1], v1, b4, 0xF8);
    k.u[2] = _mm512_ternarylogic_epi32(k.u[2], v2, b4, 0xF8);
    k.u[3] = _mm512_ternarylogic_epi32(k.u[3], v3, b4, 0xF8);
  }
  const __m128i sm = KScalesMins(b.scales);
  const __m512i smz = _mm512_castsi128_si512(sm);  // upper bytes never picked
  const __mmask64 low_bytes = _cvtu64_mask64(0x1111111111111111ull);
  k.sc[0] = _mm512_maskz_permutexvar_epi8(low_bytes, LoadIdx(kSc02), smz);
  k.sc[1] = _mm512_maskz_permutexvar_epi8(low_bytes, LoadIdx(kSc13), smz);
  k.sc[2] = _mm512_maskz_permutexvar_epi8(low_bytes, LoadIdx(kSc46), smz);
  k.sc[3] = _mm512_maskz_permutexvar_epi8(low_bytes, LoadIdx(kSc57), smz);
  k.mn16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
  k.dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(::kiln::detail::load_u32_le(blk))));  // d, dmin
}

KILN_QMM_VNNI HWY_INLINE void DecodeQ6K(const uint8_t* blk, KDec& k) {
  const block_q6_K& b = *reinterpret_cast<const block_q6_K*>(blk);
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  KILN_QMM_UNROLL
  for (size_t h = 0; h < 2; ++h) {
    const __m512i ql = _mm512_loadu_si512(b.ql + 64 * h);
    const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h)));
    // values 128h + l (l < 64): bits 2 (l / 32) of qh -> bits 4..5; 128h + 64 + l: bits 4 + 2 (l / 32).
    const __m512i lo = _mm512_and_si512(ql, m4), hi = _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
    k.u[2 * h] = _mm512_ternarylogic_epi32(lo, _mm512_sllv_epi16(hb, Pick2(4 | (4 << 16), 2 | (2 << 16))), m30, 0xF8);
    k.u[2 * h + 1] = _mm512_ternarylogic_epi32(hi, _mm512_srlv_epi16(hb, Pick2(0, 2 | (2 << 16))), m30, 0xF8);
  }
  k.sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
  const __m512i scz = _mm512_castsi256_si512(k.sc16);  // upper words never picked
  const __mmask32 low_words = _cvtu32_mask32(0x55555555u);
  KILN_QMM_UNROLL
  for (size_t v = 0; v < 4; ++v)  // low word: the int8 scale as i16, high word 0
    k.sc[v] = _mm512_maskz_permutexvar_epi16(low_words, _mm512_load_si512(kQ6Sc[v].v), scz);
  k.dd = _mm_cvtph_ps(_mm_cvtsi32_si128(b.d.bits));
}

// Super-block sb of one row with one row of x: f += (d dx) * sum_s sc_s I_s; fm += (dmin dx) * sum mn_s S_s.
template <bool kQ6>
KILN_QMM_VNNI HWY_INLINE void DotK(const KDec& k, const ActRow& a, size_t sb, __m512& f, __m128& fm) {
  const int8_t* q = a.q + 256 * sb;
  __m512i acc = _mm512_setzero_si512();
  KILN_QMM_UNROLL
  for (size_t v = 0; v < 4; ++v) {
    const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k.u[v], _mm512_loadu_si512(q + 64 * v));
    acc = _mm512_dpwssd_epi32(acc, p, k.sc[v]);
  }
  if constexpr (kQ6) {  // -32 * sum_s sc_s S_s
    const __m256i s16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.lsum16 + 16 * sb));
    const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(k.sc16, s16), 5);
    acc = _mm512_sub_epi32(acc, _mm512_zextsi256_si512(off));
  } else {
    const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.lsum16 + 8 * sb));
    const __m128 dminx = _mm_mul_ps(_mm_shuffle_ps(k.dd, k.dd, 0x55), _mm_set1_ps(a.dx[sb]));
    fm = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(k.mn16, s8)), dminx, fm);
  }
  f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_broadcastss_ps(_mm_mul_ss(k.dd, _mm_set_ss(a.dx[sb]))), f);
}

// K-quant rows are read one after another like the 32-value blocks (on Zen 5, 4 rows at a time with the
// next 4 prefetched reached only 55-60% of the read bandwidth, one row at a time 1.7x that), and the next
// row is prefetched at the same pace.
inline constexpr size_t kAheadK = 1;

template <class B, size_t C>
KILN_QMM_VNNI HWY_NOINLINE void GemvK(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n,
                                      float* y, ptrdiff_t ldy) {
  constexpr bool kQ6 = std::is_same_v<B, block_q6_K>;
  for (size_t j = 0; j < n; ++j) {
    const uint8_t* row = w + static_cast<ptrdiff_t>(j) * ldw;
    const uint8_t* ahead = w + static_cast<ptrdiff_t>(HWY_MIN(j + kAheadK, n - 1)) * ldw;
    __m512 f[C];
    __m128 fm[C];
    KILN_QMM_UNROLL
    for (size_t c = 0; c < C; ++c) {
      f[c] = _mm512_setzero_ps();
      fm[c] = _mm_setzero_ps();
    }
    for (size_t sb = 0; sb < L.nd; ++sb) {
      for (size_t o = 0; o < sizeof(B); o += 64) KILN_QMM_PREFETCH(ahead + sb * sizeof(B) + o);
      KDec k;
      if constexpr (kQ6) DecodeQ6K(row + sb * sizeof(B), k);
      else DecodeQ45K<std::is_same_v<B, block_q5_K>>(row + sb * sizeof(B), k);
      KILN_QMM_UNROLL
      for (size_t c = 0; c < C; ++c) DotK<kQ6>(k, a[c], sb, f[c], fm[c]);
    }
    KILN_QMM_UNROLL
    for (size_t c = 0; c < C; ++c) {
      __m128 m = fm[c];
      m = _mm_add_ps(m, _mm_movehl_ps(m, m));
      m = _mm_add_ss(m, _mm_movehdup_ps(m));
      y[static_cast<ptrdiff_t>(c) * ldy + static_cast<ptrdiff_t>(j)] = _mm512_reduce_add_ps(f[c]) - _mm_cvtss_f32(m);
    }
  }
}

template <class B, size_t C>
KILN_QMM_VNNI void GemvTyped(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n, float* y,
                             ptrdiff_t ldy) {
  if constexpr (dtype_traits<B>::block_size == 256) GemvK<B, C>(L, a, w, ldw, n, y, ldy);
  else Gemv32<B, C>(L, a, w, ldw, n, y, ldy);
}

}  // namespace vnni

// GEMV: one pass over W, each group decoded once for all (<= 4) rows of x.
inline void GemvVnni(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, ptrdiff_t ldw, size_t n,
                     float* y, ptrdiff_t ldy) {
  constexpr size_t kC = 4;
  VisitType(L.type, [&](auto* tag) {
    using B = std::remove_pointer_t<decltype(tag)>;
    for (size_t i0 = 0; i0 < m; i0 += kC) {
      ActRow a[kC];
      const size_t c = HWY_MIN(kC, m - i0);
      for (size_t i = 0; i < c; ++i) a[i] = GetActRow(act + (i0 + i) * L.row_bytes, L);
      float* yi = y + static_cast<ptrdiff_t>(i0) * ldy;
      switch (c) {
        case 4:
          vnni::GemvTyped<B, 4>(L, a, w, ldw, n, yi, ldy);
          break;
        case 3:
          vnni::GemvTyped<B, 3>(L, a, w, ldw, n, yi, ldy);
          break;
        case 2:
          vnni::GemvTyped<B, 2>(L, a, w, ldw, n, yi, ldy);
          break;
        default:
          vnni::GemvTyped<B, 1>(L, a, w, ldw, n, yi, ldy);
          break;
      }
    }
  });
}

#undef KILN_QMM_PREFETCH
#undef KILN_QMM_UNROLL
KILN_X86_DIAGNOSTICS_POP

#endif  // HWY_TARGET == HWY_AVX3_DL

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
