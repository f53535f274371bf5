// kiln/kernels/qmatmul/x86/avx2-inl.h - qmatmul kernels with AVX2 vpmaddubsw (unsigned x signed bytes to pairs of
// 16-bit sums), for the AVX2 and AVX3 targets. One weight row at a time is decoded into 256-bit registers
// and dotted with up to 4 quantized rows of x; the GEMM path runs the same kernel over blocks of 32 weight
// rows (kept in L2) and 4 rows of x. Included from entry-inl.h only.
//
// 16-bit safety: a vpmaddubsw pair is at most 2 * 31 * 127 = 7874 for 5-bit weights (two such pairs may be
// added before widening) and 2 * 63 * 127 = 16002 for Q6_K; Q8_0 keeps its signed bytes and uses the
// |w| x sign(x, w) form, 2 * 128 * 127 = 32512 per pair, widened at once.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_QMATMUL_X86_AVX2_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_QMATMUL_X86_AVX2_INL_H_
#undef KILN_KERNELS_QMATMUL_X86_AVX2_INL_H_
#else
#define KILN_KERNELS_QMATMUL_X86_AVX2_INL_H_
#endif

#include <hwy/highway.h>

#include "kiln/kernels/qmatmul/x86/avx2_common-inl.h"  // Bcast4, Load16, Load32, Mxfp4Lut, PrefetchStream

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3

namespace avx2 {

HWY_INLINE float F16(f16 h) { return _cvtsh_ss(h.bits); }

// An empty asm that claims to change v: the compiler must keep a running sum in a register, step by step.
// Without it GCC reassociates the integer adds of a block, computes all of its products first and spills
// them to the stack (the interleaved Q4_0 GEMM ran 30% slower so).
HWY_INLINE void KeepChain(__m256i& v) {
#if defined(__GNUC__) || defined(__clang__)
  asm("" : "+x"(v));
#else
  (void)v;
#endif
}

// Rows of x 4 at a time: f(a, C) with a[0 .. C) the rows i0 .. i0 + C - 1 (C a compile-time constant, so
// that f can name its kernel <..., C>) and i0 = a's first row: the loop of every AVX2 kernel's caller.
template <class F>
HWY_INLINE void ForRowsOf4(const QActLayout& L, const uint8_t* act, size_t m, const F& f) {
  constexpr size_t kC = 4;
  for (size_t i0 = 0; i0 < m; i0 += kC) {
    ActRow a[kC];
    const size_t c = HWY_MIN(kC, m - i0);
    for (size_t i = 0; i < c; ++i) a[i] = GetActRow(act + (i0 + i) * L.row_bytes, L);
    switch (c) {
      case 4:
        f(a, std::integral_constant<size_t, 4>(), i0);
        break;
      case 3:
        f(a, std::integral_constant<size_t, 3>(), i0);
        break;
      case 2:
        f(a, std::integral_constant<size_t, 2>(), i0);
        break;
      default:
        f(a, std::integral_constant<size_t, 1>(), i0);
        break;
    }
  }
}

// Byte i = 0xFF where bit i of x is set.
HWY_INLINE __m256i BytesFromBits(uint32_t x) {
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i r = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
  const __m256i bit = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  return _mm256_cmpeq_epi8(_mm256_or_si256(r, bit), _mm256_set1_epi64x(-1));
}

HWY_INLINE float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Two 32-value blocks (b1 may be null: zeros): lo = [b0 values 0..15 | b1 0..15], hi = [.. 16..31 ..],
// unsigned (signed for Q8_0); dw, dm = the scales and mins, 4 lanes per block.
struct Pair {
  __m256i lo, hi;
  __m256 dw, dm;
};
HWY_INLINE __m256 Scales2(float a, float b) { return _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a)); }
HWY_INLINE void Nibbles(__m128i q0, __m128i q1, Pair& p) {
  const __m256i qs = _mm256_set_m128i(q1, q0), m = _mm256_set1_epi8(0x0F);
  p.lo = _mm256_and_si256(qs, m);
  p.hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m);
}
template <class B>
HWY_INLINE void Fifth(const B* b0, const B* b1, Pair& p) {  // bit 4 of Q5 values from qh
  const uint32_t h0 = ::kiln::detail::load_u32_le(b0->qh), h1 = b1 ? ::kiln::detail::load_u32_le(b1->qh) : 0u;
  const __m256i m = _mm256_set1_epi8(0x10);
  p.lo = _mm256_or_si256(p.lo, _mm256_and_si256(BytesFromBits((h0 & 0xFFFFu) | (h1 << 16)), m));
  p.hi = _mm256_or_si256(p.hi, _mm256_and_si256(BytesFromBits((h0 >> 16) | (h1 & 0xFFFF0000u)), m));
}
HWY_INLINE void DecodePair(const block_q4_0* b0, const block_q4_0* b1, Pair& p) {
  Nibbles(Load16(b0->qs), b1 ? Load16(b1->qs) : _mm_setzero_si128(), p);
  p.dw = Scales2(F16(b0->d), b1 ? F16(b1->d) : 0.f);
}
HWY_INLINE void DecodePair(const block_q4_1* b0, const block_q4_1* b1, Pair& p) {
  Nibbles(Load16(b0->qs), b1 ? Load16(b1->qs) : _mm_setzero_si128(), p);
  p.dw = Scales2(F16(b0->d), b1 ? F16(b1->d) : 0.f);
  p.dm = Scales2(F16(b0->m), b1 ? F16(b1->m) : 0.f);
}
HWY_INLINE void DecodePair(const block_q5_0* b0, const block_q5_0* b1, Pair& p) {
  Nibbles(Load16(b0->qs), b1 ? Load16(b1->qs) : _mm_setzero_si128(), p);
  Fifth(b0, b1, p);
  p.dw = Scales2(F16(b0->d), b1 ? F16(b1->d) : 0.f);
}
HWY_INLINE void DecodePair(const block_q5_1* b0, const block_q5_1* b1, Pair& p) {
  Nibbles(Load16(b0->qs), b1 ? Load16(b1->qs) : _mm_setzero_si128(), p);
  Fifth(b0, b1, p);
  p.dw = Scales2(F16(b0->d), b1 ? F16(b1->d) : 0.f);
  p.dm = Scales2(F16(b0->m), b1 ? F16(b1->m) : 0.f);
}
// MXFP4: the nibbles through a table to kvalues_mxfp4[code] + 12 (unsigned, offset 12), dw = 2^(e - 128). A
// missing b1 decodes to 12s against the zero activations of the row's padding, with dw = 0.
HWY_INLINE void DecodePair(const block_mxfp4* b0, const block_mxfp4* b1, Pair& p) {
  Nibbles(Load16(b0->qs), b1 ? Load16(b1->qs) : _mm_setzero_si128(), p);
  const __m256i lut = Mxfp4Lut();
  p.lo = _mm256_shuffle_epi8(lut, p.lo);
  p.hi = _mm256_shuffle_epi8(lut, p.hi);
  p.dw = Scales2(::kiln::detail::e8m0_to_fp32_half(b0->e), b1 ? ::kiln::detail::e8m0_to_fp32_half(b1->e) : 0.f);
}
HWY_INLINE void DecodePair(const block_q8_0* b0, const block_q8_0* b1, Pair& p) {
  const auto* q0 = reinterpret_cast<const uint8_t*>(b0->qs);
  const auto* q1 = b1 ? reinterpret_cast<const uint8_t*>(b1->qs) : nullptr;
  p.lo = _mm256_set_m128i(q1 ? Load16(q1) : _mm_setzero_si128(), Load16(q0));
  p.hi = _mm256_set_m128i(q1 ? Load16(q1 + 16) : _mm_setzero_si128(), Load16(q0 + 16));
  p.dw = Scales2(F16(b0->d), b1 ? F16(b1->d) : 0.f);
}

// C outputs of each of n rows of 32-value blocks.
template <class B, size_t C>
HWY_NOINLINE void Gemv32(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n, float* y,
                         ptrdiff_t ldy) {
  constexpr bool kSigned = std::is_same_v<B, block_q8_0>;
  constexpr bool kMin = std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_1>;
  const size_t nb = L.k / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t j = 0; j < n; ++j) {
    const B* row = reinterpret_cast<const B*>(w + static_cast<ptrdiff_t>(j) * ldw);
    __m256 f[C];
    for (size_t i = 0; i < C; ++i) f[i] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b += 2) {
      PrefetchStream<2 * sizeof(B)>(row + b);  // rows are read one after another: one stream
      Pair p;
      DecodePair(row + b, b + 1 < nb ? row + b + 1 : nullptr, p);
      const size_t o = 128 * (b / 4) + 16 * (b % 4);
      for (size_t i = 0; i < C; ++i) {
        const __m256i xl = Load32(a[i].q + o), xh = Load32(a[i].q + o + 64);
        __m256i acc;
        if constexpr (kSigned) {
          const __m256i sl = _mm256_maddubs_epi16(_mm256_abs_epi8(p.lo), _mm256_sign_epi8(xl, p.lo));
          const __m256i sh = _mm256_maddubs_epi16(_mm256_abs_epi8(p.hi), _mm256_sign_epi8(xh, p.hi));
          acc = _mm256_add_epi32(_mm256_madd_epi16(sl, ones), _mm256_madd_epi16(sh, ones));
        } else {
          const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(p.lo, xl), _mm256_maddubs_epi16(p.hi, xh));
          acc = _mm256_add_epi32(_mm256_madd_epi16(s, ones), Load32(a[i].corr + 4 * b));  // - off * S / 4
        }
        const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_loadu_ps(a[i].dxr + 4 * b));
        f[i] = _mm256_fmadd_ps(t, p.dw, f[i]);
        if constexpr (kMin) f[i] = _mm256_fmadd_ps(p.dm, _mm256_loadu_ps(a[i].dxsr + 4 * b), f[i]);
      }
    }
    for (size_t i = 0; i < C; ++i) y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = HSum(f[i]);
  }
}

// Q4_K / Q5_K: 8 sub-blocks of 32, 6-bit scales sc and mins mn. Per super-block the integer sum
// sum_s sc_s * sum(u q) is exact (vpmaddwd by sc); the mins term dmin * dx * sum_s mn_s S_s is scalar.
template <bool kQ5, size_t C>
HWY_NOINLINE void GemvQ45K(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n, float* y,
                           ptrdiff_t ldy) {
  using B = std::conditional_t<kQ5, block_q5_K, block_q4_K>;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m16 = _mm256_set1_epi8(0x10);
  for (size_t j = 0; j < n; ++j) {
    const B* row = reinterpret_cast<const B*>(w + static_cast<ptrdiff_t>(j) * ldw);
    __m256 f[C];
    float fmin[C];
    for (size_t i = 0; i < C; ++i) {
      f[i] = _mm256_setzero_ps();
      fmin[i] = 0;
    }
    for (size_t sb = 0; sb < L.nd; ++sb) {
      const B& b = row[sb];
      PrefetchStream<sizeof(B)>(&b);
      uint8_t sc[8], mn[8];
      ::kiln::detail::scales_mins_k4(b.scales, sc, mn);
      const __m128i mn16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn)));
      __m256i u[8];  // logical sub-block order
      __m256i hb = _mm256_setzero_si256();
      if constexpr (kQ5) hb = Load32(b.qh);
      for (size_t c = 0; c < 4; ++c) {
        const __m256i qs = Load32(b.qs + 32 * c);
        u[2 * c] = _mm256_and_si256(qs, m4);
        u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
        if constexpr (kQ5) {  // bit s of qh -> bit 4 (16-bit shifts by <= 4 do not cross into bit 4 of a byte)
          for (size_t h = 0; h < 2; ++h) {
            const int s = static_cast<int>(2 * c + h);
            const __m256i v = s <= 4 ? _mm256_slli_epi16(hb, 4 - s) : _mm256_srli_epi16(hb, s - 4);
            u[2 * c + h] = _mm256_or_si256(u[2 * c + h], _mm256_and_si256(v, m16));
          }
        }
      }
      const float d = F16(b.d), dmin = F16(b.dmin);
      for (size_t i = 0; i < C; ++i) {
        const int8_t* q = a[i].q + 256 * sb;
        __m256i acc = _mm256_setzero_si256();
        for (size_t s = 0; s < 8; ++s) {
          const __m256i p = _mm256_maddubs_epi16(u[s], Load32(q + 32 * kKPerm[s]));
          acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(sc[s])));
          KeepChain(acc);
        }
        // sum_s mn_s S_s: 8 products in 4 lanes (vpmaddwd), then across them.
        __m128i m = _mm_madd_epi16(mn16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[i].lsum16 + 8 * sb)));
        m = _mm_add_epi32(m, _mm_unpackhi_epi64(m, m));
        m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 1));
        const int32_t imn = _mm_cvtsi128_si32(m);
        f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(d * a[i].dx[sb]), f[i]);
        fmin[i] += (dmin * a[i].dx[sb]) * static_cast<float>(imn);
      }
    }
    for (size_t i = 0; i < C; ++i)
      y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = HSum(f[i]) - fmin[i];
  }
}

// Q6_K: 16 sub-blocks of 16, int8 scales; the -32 offset is -32 * sum_s sc_s S_s, per super-block (in the
// lanes' int32 sums, two sub-blocks a lane: their total is the same integer).
template <size_t C>
HWY_NOINLINE void GemvQ6K(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n, float* y,
                          ptrdiff_t ldy) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  for (size_t j = 0; j < n; ++j) {
    const block_q6_K* row = reinterpret_cast<const block_q6_K*>(w + static_cast<ptrdiff_t>(j) * ldw);
    __m256 f[C];
    for (size_t i = 0; i < C; ++i) f[i] = _mm256_setzero_ps();
    for (size_t sb = 0; sb < L.nd; ++sb) {
      const block_q6_K& b = row[sb];
      PrefetchStream<sizeof(block_q6_K)>(&b);
      __m256i u[8], scv[8];  // u[v]: values 32v..32v+31 (sub-blocks 2v, 2v + 1)
      for (size_t h = 0; h < 2; ++h) {
        const __m256i l0 = Load32(b.ql + 64 * h), l1 = Load32(b.ql + 64 * h + 32), qh = Load32(b.qh + 32 * h);
        u[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
        u[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
        u[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
        u[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
      }
      for (size_t v = 0; v < 8; ++v)
        scv[v] = _mm256_set_m128i(_mm_set1_epi16(b.scales[2 * v + 1]), _mm_set1_epi16(b.scales[2 * v]));
      const float d = F16(b.d);
      // The offset term sum_s (-32 sc_s) S_s, 2 sub-blocks per lane: vpmaddwd of the 16 words -32 sc_s
      // (|.| <= 4096) by the 16 S.
      const __m256i off16 = _mm256_sub_epi16(
          _mm256_setzero_si256(),
          _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales))), 5));
      for (size_t i = 0; i < C; ++i) {
        const int8_t* q = a[i].q + 256 * sb;
        __m256i acc = _mm256_madd_epi16(off16, Load32(a[i].lsum16 + 16 * sb));
        for (size_t v = 0; v < 8; ++v) {
          acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u[v], Load32(q + 32 * v)), scv[v]));
          KeepChain(acc);
        }
        f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(d * a[i].dx[sb]), f[i]);
      }
    }
    for (size_t i = 0; i < C; ++i) y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = HSum(f[i]);
  }
}

// ---- K-quant GEMM: panels of 8 decoded rows ----
// The row-major kernels above decode every weight row again for each 4 rows of x (and Q4_K / Q5_K unpack
// their 6-bit scales in scalar code per row). The GEMM decodes 8 rows once into a panel (per thread scratch,
// ~9-11 bytes per value column: L1/L2) and runs every row of x past it:
//   u:  step t (4 values, x's physical order) of the 8 rows, row r's 4 unsigned values at 4r: one register;
//   sc: per scale group (Q6_K: 16 values, Q4_K / Q5_K: the 32 at physical sub-block p, i.e. logical
//       sub-block kKPerm[p]), each row's scale in both 16-bit words of its lane;
//   mw: per super-block, pair of groups (2i, 2i + 1) (logical order) and row, the words that meet x's
//       (S_2i, S_2i+1): Q6_K (-32 sc_2i, -32 sc_2i+1), its offset; Q4_K / Q5_K (mn_2i, mn_2i+1), the mins;
//   d, dm: per super-block, the 8 rows' d and dmin.
// Per row of x and scale group: vpmaddubsw of the steps against 4 broadcast activation bytes, their 16-bit
// pair sums added (2 steps for 6-bit values, 2 * 2 * 63 * 128 < 2^15; 4 for 4- and 5-bit ones, 4 * 2 * 31 *
// 128 < 2^15), vpmaddwd by sc into the super-block's exact int32 sum I = sum_g sc_g sum(u q); then M = sum
// mw (S_2i, S_2i+1) by vpmaddwd, and f += (I + M) d dx (Q6_K) or f += I d dx - M dmin dx, lane r = weight
// row r. The integer sums are the row-major kernels'; only the f32 steps' order differs.
inline constexpr size_t kKPanelRows = 8;
template <class B>
struct KPanel {
  static constexpr bool k6 = std::is_same_v<B, block_q6_K>;
  static constexpr size_t kGroups = k6 ? 16 : 8;  // scale groups per super-block
  static constexpr size_t kPairs = kGroups / 2;   // mw vectors per super-block
  uint8_t* u;
  __m256i* sc;
  __m256i* mw;
  float* d;
  float* dm;
  static size_t bytes(size_t k) {
    const size_t nsb = k / 256;
    return k * kKPanelRows + nsb * (kGroups + kPairs) * 32 + 2 * nsb * 32;
  }
  KPanel(void* mem, size_t k) {  // mem: 64-byte aligned, bytes(k)
    const size_t nsb = k / 256;
    u = static_cast<uint8_t*>(mem);
    sc = reinterpret_cast<__m256i*>(u + k * kKPanelRows);
    mw = sc + nsb * kGroups;
    d = reinterpret_cast<float*>(mw + nsb * kPairs);
    dm = d + kKPanelRows * nsb;
  }
};
// Values 32v .. 32v + 31 of a Q6_K super-block, unsigned (0..63).
HWY_INLINE __m256i KValues(const block_q6_K& b, size_t v) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  const size_t h = v / 4, kind = v % 4;
  const __m256i l = Load32(b.ql + 64 * h + 32 * (kind % 2)), qh = Load32(b.qh + 32 * h);
  const __m256i lo = kind < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
  __m256i hi;
  switch (kind) {  // bits 2 kind, 2 kind + 1 of qh -> bits 4, 5
    case 0:
      hi = _mm256_slli_epi16(qh, 4);
      break;
    case 1:
      hi = _mm256_slli_epi16(qh, 2);
      break;
    case 2:
      hi = qh;
      break;
    default:
      hi = _mm256_srli_epi16(qh, 2);
      break;
  }
  return _mm256_or_si256(lo, _mm256_and_si256(hi, m30));
}
// Logical sub-block j (32 values) of a Q4_K / Q5_K super-block, unsigned (GemvQ45K's decode).
template <class B>
HWY_INLINE __m256i KValues(const B& b, size_t j) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i qs = Load32(b.qs + 32 * (j / 2));
  __m256i u = j % 2 ? _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4) : _mm256_and_si256(qs, m4);
  if constexpr (std::is_same_v<B, block_q5_K>) {  // bit j of qh -> bit 4
    const __m256i hb = Load32(b.qh);
    const __m128i cnt = _mm_cvtsi32_si128(static_cast<int>(j <= 4 ? 4 - j : j - 4));
    const __m256i v = j <= 4 ? _mm256_sll_epi16(hb, cnt) : _mm256_srl_epi16(hb, cnt);
    u = _mm256_or_si256(u, _mm256_and_si256(v, _mm256_set1_epi8(0x10)));
  }
  return u;
}
// Dword c of r[i] to bytes 32 c + 4 i of dst (an 8 x 8 dword transpose).
HWY_INLINE void Transpose8x8Store(const __m256i* r, uint8_t* dst) {
  __m256i t[8], s[8];
  for (size_t i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);      // r_i c0, r_i+1 c0, r_i c1, r_i+1 c1 | same for c4, c5
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);  // c2, c3 | c6, c7
  }
  for (size_t i = 0; i < 8; i += 4) {
    s[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);          // rows i..i+3 of c0 | c4
    s[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);      // c1 | c5
    s[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);  // c2 | c6
    s[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);  // c3 | c7
  }
  for (size_t c = 0; c < 4; ++c) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * c), _mm256_permute2x128_si256(s[c], s[4 + c], 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * (c + 4)),
                        _mm256_permute2x128_si256(s[c], s[4 + c], 0x31));
  }
}
HWY_INLINE int32_t Words(int a, int b) {  // (a, b) as the low and high int16 words of a lane
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(a)) |
                              static_cast<uint32_t>(static_cast<uint16_t>(b)) << 16);
}
// Rows 0 .. 7 of W at w (row-major, rows ldw bytes apart) into the panel P.
template <class B>
HWY_NOINLINE void PackKPanel(const QActLayout& L, const uint8_t* w, ptrdiff_t ldw, const KPanel<B>& P) {
  using KP = KPanel<B>;
  const B* rows[kKPanelRows];
  for (size_t r = 0; r < kKPanelRows; ++r) rows[r] = reinterpret_cast<const B*>(w + static_cast<ptrdiff_t>(r) * ldw);
  for (size_t sb = 0; sb < L.nd; ++sb) {
    for (size_t v = 0; v < 8; ++v) {  // Q6_K: values 32v..; Q4_K / Q5_K: logical sub-block v, at kKPerm[v]
      __m256i r[kKPanelRows];
      for (size_t i = 0; i < kKPanelRows; ++i) r[i] = KValues(rows[i][sb], v);
      Transpose8x8Store(r, P.u + 32 * (64 * sb + 8 * (KP::k6 ? v : kKPerm[v])));
    }
    alignas(32) int32_t sw[KP::kGroups][kKPanelRows], mw[KP::kPairs][kKPanelRows];
    for (size_t i = 0; i < kKPanelRows; ++i) {
      const B& b = rows[i][sb];
      if constexpr (KP::k6) {
        for (size_t g = 0; g < 16; ++g) sw[g][i] = Words(b.scales[g], b.scales[g]);
        for (size_t g = 0; g < 8; ++g) mw[g][i] = Words(-32 * b.scales[2 * g], -32 * b.scales[2 * g + 1]);
        P.dm[kKPanelRows * sb + i] = 0.f;
      } else {
        uint8_t sc[8], mn[8];
        ::kiln::detail::scales_mins_k4(b.scales, sc, mn);
        for (size_t p = 0; p < 8; ++p) sw[p][i] = Words(sc[kKPerm[p]], sc[kKPerm[p]]);
        for (size_t g = 0; g < 4; ++g) mw[g][i] = Words(mn[2 * g], mn[2 * g + 1]);
        P.dm[kKPanelRows * sb + i] = F16(b.dmin);
      }
      P.d[kKPanelRows * sb + i] = F16(b.d);
    }
    for (size_t g = 0; g < KP::kGroups; ++g)
      P.sc[KP::kGroups * sb + g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(sw[g]));
    for (size_t g = 0; g < KP::kPairs; ++g)
      P.mw[KP::kPairs * sb + g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(mw[g]));
  }
}
// y[c * ldy + r] (r < 8) for rows c < C of x against the panel.
template <class B, size_t C>
HWY_NOINLINE void GemmKPanel(const QActLayout& L, const ActRow* a, const KPanel<B>& P, float* y, ptrdiff_t ldy) {
  using KP = KPanel<B>;
  constexpr size_t kSteps = 256 / 4 / KP::kGroups;  // steps per scale group: 4 (Q6_K) or 8
  constexpr size_t kPer = KP::k6 ? 2 : 4;           // steps per 16-bit sum
  __m256 f[C];
  for (size_t c = 0; c < C; ++c) f[c] = _mm256_setzero_ps();
  for (size_t sb = 0; sb < L.nd; ++sb) {
    __m256i acc[C];
    for (size_t c = 0; c < C; ++c) acc[c] = _mm256_setzero_si256();
    for (size_t g = 0; g < KP::kGroups; ++g) {
      const __m256i sc = P.sc[KP::kGroups * sb + g];
      for (size_t h = 0; h < kSteps; h += kPer) {
        const size_t t0 = 64 * sb + kSteps * g + h;  // first step
        __m256i z[kPer];
        for (size_t t = 0; t < kPer; ++t) z[t] = Load32(P.u + 32 * (t0 + t));
        for (size_t c = 0; c < C; ++c) {
          const int8_t* q = a[c].q + 4 * t0;
          __m256i p = _mm256_maddubs_epi16(z[0], Bcast4(q));
          for (size_t t = 1; t < kPer; ++t) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(z[t], Bcast4(q + 4 * t)));
          acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p, sc));
          KeepChain(acc[c]);
        }
      }
    }
    const __m256 d = _mm256_load_ps(P.d + kKPanelRows * sb);
    for (size_t c = 0; c < C; ++c) {
      const int8_t* ls = reinterpret_cast<const int8_t*>(a[c].lsum16 + KP::kGroups * sb);  // S per group
      __m256i m = _mm256_madd_epi16(P.mw[KP::kPairs * sb], Bcast4(ls));
      for (size_t i = 1; i < KP::kPairs; ++i)
        m = _mm256_add_epi32(m, _mm256_madd_epi16(P.mw[KP::kPairs * sb + i], Bcast4(ls + 4 * i)));
      const __m256 dx = _mm256_set1_ps(a[c].dx[sb]);
      if constexpr (KP::k6) {
        f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(acc[c], m)), _mm256_mul_ps(d, dx), f[c]);
      } else {
        f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[c]), _mm256_mul_ps(d, dx), f[c]);
        f[c] =
            _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(_mm256_load_ps(P.dm + kKPanelRows * sb), dx), f[c]);
      }
    }
  }
  for (size_t c = 0; c < C; ++c) _mm256_storeu_ps(y + static_cast<ptrdiff_t>(c) * ldy, f[c]);
}
// The GEMM over rows [0, 8 * (n / 8)) of row-major K-quant W in panels; returns the rows done.
template <class B>
size_t GemmKPanels(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, ptrdiff_t ldw, size_t n,
                   float* y, ptrdiff_t ldy) {
  const size_t panels = n / kKPanelRows;
  if (panels == 0) return 0;
  const KPanel<B> P(::kiln::detail::qmm_scratch(1, KPanel<B>::bytes(L.k)), L.k);
  for (size_t pi = 0; pi < panels; ++pi) {
    const size_t j0 = pi * kKPanelRows;
    PackKPanel<B>(L, w + static_cast<ptrdiff_t>(j0) * ldw, ldw, P);
    ForRowsOf4(L, act, m, [&](const ActRow* a, auto C, size_t i0) {
      GemmKPanel<B, decltype(C)::value>(L, a, P, y + static_cast<ptrdiff_t>(i0) * ldy + static_cast<ptrdiff_t>(j0),
                                        ldy);
    });
  }
  return panels * kKPanelRows;
}

template <class B, size_t C>
HWY_INLINE void GemvTyped(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n, float* y,
                          ptrdiff_t ldy) {
  if constexpr (std::is_same_v<B, block_q4_K>) GemvQ45K<false, C>(L, a, w, ldw, n, y, ldy);
  else if constexpr (std::is_same_v<B, block_q5_K>) GemvQ45K<true, C>(L, a, w, ldw, n, y, ldy);
  else if constexpr (std::is_same_v<B, block_q6_K>) GemvQ6K<C>(L, a, w, ldw, n, y, ldy);
  else Gemv32<B, C>(L, a, w, ldw, n, y, ldy);
}

}  // namespace avx2

// GEMV: one pass over W with all (<= 4) rows of x. GEMM: blocks of 32 weight rows (L2-resident) against 4
// rows of x at a time. Each output is computed the same way in both.
inline void RowsAvx2(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, ptrdiff_t ldw, size_t n,
                     float* y, ptrdiff_t ldy, bool gemm) {
  constexpr size_t kRowBlock = 32;
  if (gemm && ::kiln::detail::qmm_is_kquant(L.type)) {
    // Panels of 8 rows, then the rows past the last whole panel as below. Callers' row ranges start at
    // multiples of 16, so a row of W is in a panel or not whatever range a call covers.
    size_t done = 0;
    VisitType(L.type, [&](auto* tag) {
      using B = std::remove_pointer_t<decltype(tag)>;
      if constexpr (dtype_traits<B>::block_size == 256) done = avx2::GemmKPanels<B>(L, act, m, w, ldw, n, y, ldy);
    });
    if (done < n) RowsAvx2(L, act, m, w + static_cast<ptrdiff_t>(done) * ldw, ldw, n - done, y + done, ldy, false);
    return;
  }
  const size_t nblock = gemm ? kRowBlock : n;
  VisitType(L.type, [&](auto* tag) {
    using B = std::remove_pointer_t<decltype(tag)>;
    for (size_t j0 = 0; j0 < n; j0 += nblock) {
      const size_t nn = HWY_MIN(nblock, n - j0);
      const uint8_t* wj = w + static_cast<ptrdiff_t>(j0) * ldw;
      avx2::ForRowsOf4(L, act, m, [&](const ActRow* a, auto C, size_t i0) {
        avx2::GemvTyped<B, decltype(C)::value>(L, a, wj, ldw, nn,
                                               y + static_cast<ptrdiff_t>(i0) * ldy + static_cast<ptrdiff_t>(j0), ldy);
      });
    }
  });
}

#endif  // HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
