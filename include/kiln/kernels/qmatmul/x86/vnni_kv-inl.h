// kiln/kernels/qmatmul/x86/vnni_kv-inl.h - a q8_0 KV cache's decoding scores s = q K^T and values p V as
// integer dot products with AVX-512 VNNI (AVX3_DL). The scores: each block of 32 values of q is rounded to 8 bits
// as qmatmul rounds activations (one part, ref::qmm_quantize_act; or two, ref::qmm_split_residual_act's x part
// and residual part with the scales dx and dx / 2^s), and dotted with the keys' int8 values. Included from
// entry-inl.h only.
//
// The keys are rows of Q8_0 blocks (34 bytes: an f16 d, 32 int8), a row per position. A row is too short
// (head_dim 64: 2 blocks) for the weight GEMV's per-row reductions, so 16 keys go through at once with the
// keys in the lanes: their 32-byte blocks are transposed into 8 vectors T_c of 16 lanes, lane j holding bytes
// [4c, 4c + 4) of key j's block (24 shuffles, shared by every query row and part), and one vpdpbusd per c
// with q's bytes [4c, 4c + 4) broadcast adds 4 products into each key's lane: 8 instructions per block, query
// row and part, with no reduction; the 16 scales d come in by scalar loads. vpdpbusd multiplies unsigned by
// signed bytes: the keys go as k + 128 (an XOR), and the 128 sum(q) that adds is subtracted once per block.
// Two parts are combined as integers, 2^s X + R (|X|, |R| <= 32 * 128 * 127 and s <= 12: it fits int32; the
// shift and the correction wrap mod 2^32 on the way), converted once and scaled by d_k * dx / 2^s: every
// block's integer sum is exact, and the result differs from ref's integer sums
// (tests/ops/test_matmul_q8_0_int.cpp) only by the f32 rounding of the conversion, the scale product and the
// accumulation over blocks.
//
// The values out = s V (s the scores' exp(y - m), V rows of Q8_0 blocks a position each) go the same way with
// the positions as the dot products' length: per query row i, V block column b and group of up to 256
// positions, the weights w_t = s_t d_t (the row's scale folded in) are rounded to int16 multiples of
// max|w| / 32767, and each vpdpwssd adds two positions' products W_t v_t + W_t+1 v_t+1 into a lane per value
// of the block (the two rows' 32-byte blocks interleaved by one vpermb and widened to int16); 256 positions of
// |W| v <= 32767 * 128 fit int32. A group's integer sums are exact; they are converted once, times the group's
// max|w| / 32767, and accumulated over groups in f32.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_QMATMUL_X86_VNNI_KV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_QMATMUL_X86_VNNI_KV_INL_H_
#undef KILN_KERNELS_QMATMUL_X86_VNNI_KV_INL_H_
#else
#define KILN_KERNELS_QMATMUL_X86_VNNI_KV_INL_H_
#endif

#include <array>
#include <utility>

#include <hwy/highway.h>

#include "kiln/kernels/x86/common.hpp"
#include "kiln/quant/blocks.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {

#if HWY_TARGET == HWY_AVX3_DL

KILN_X86_DIAGNOSTICS_PUSH

namespace kvq8 {

// head_dim up to 128 (SmolLM2, Llama 3.2 1B, gpt-oss: 64; Qwen3, Llama 3 8B: 128). Gemma 3's 256 decoded more
// slowly through it than through the f32 GEMV in a whole model (docs/benchmarks.md), so it keeps that.
inline constexpr size_t kMaxBlocks = 4;
inline constexpr size_t kMaxRows = 8;    // query rows per pass over the keys
inline constexpr ptrdiff_t kAhead = 32;  // keys prefetched ahead of the 16 being read

// One pass's query rows, rounded: per row and block the parts' bytes (as dwords: 4 values each), the
// correction 2^s 128 sum(q) + 128 sum(r) (mod 2^32), the shift s and the scale of the combined sum.
struct QRows {
  alignas(64) int32_t q[kMaxRows][kMaxBlocks][2][8];
  uint32_t corr[kMaxRows][kMaxBlocks];
  int shift[kMaxRows][kMaxBlocks];
  float scale[kMaxRows][kMaxBlocks];
};

// Rounds rows [0, m) of a (k = 32 nb values each) into r: exactly as ref::qmm_quantize_act (parts 1) or
// ref::qmm_split_residual_act (parts 2) do, through the same per-target helpers as qmatmul's activations.
HWY_INLINE void RoundRows(const float* a, ptrdiff_t lda, size_t m, size_t nb, int parts, QRows& r) {
  int8_t t[32];
  int32_t s16[2];
  alignas(64) float res[32];
  for (size_t i = 0; i < m; ++i)
    for (size_t b = 0; b < nb; ++b) {
      const float* x = a + static_cast<ptrdiff_t>(i) * lda + static_cast<ptrdiff_t>(32 * b);
      if (parts == 1) {
        r.scale[i][b] = QuantizeGroup(x, 32, t, s16);
        std::memcpy(r.q[i][b][0], t, 32);
        r.corr[i][b] = 128u * static_cast<uint32_t>(s16[0] + s16[1]);
        r.shift[i][b] = 0;
        continue;
      }
      float amax = 0;
      QuantizeGroupSplit(x, 32, t, s16, res, amax);
      std::memcpy(r.q[i][b][0], t, 32);
      const uint32_t sx = 128u * static_cast<uint32_t>(s16[0] + s16[1]);
      const int sh = ResidualShift(amax, GroupAmax(res, 32));
      r.scale[i][b] = QuantizeGroupAmax(res, 32, amax * Pow2Neg(sh), t, s16);  // (amax / 2^s) / 127
      std::memcpy(r.q[i][b][1], t, 32);
      r.corr[i][b] = (sx << sh) + 128u * static_cast<uint32_t>(s16[0] + s16[1]);
      r.shift[i][b] = sh;
    }
}

// The 8 x 8 dwords of z[i] = [key i | key i + 8] (two 32-byte blocks) transposed: t[c] lane l holds dword c
// of key kLaneKey[l] (lanes 0-3: keys 0-3, 4-7: 8-11, 8-11: 4-7, 12-15: 12-15).
KILN_QMM_VNNI HWY_INLINE void Transpose16x8(const __m512i z[8], __m512i t[8]) {
  const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
  const __m512i t4 = _mm512_unpacklo_epi32(z[4], z[5]), t5 = _mm512_unpackhi_epi32(z[4], z[5]);
  const __m512i t6 = _mm512_unpacklo_epi32(z[6], z[7]), t7 = _mm512_unpackhi_epi32(z[6], z[7]);
  // u: dwords c | c + 4 of keys 0-3 (lanes 0, 1) and 8-11 (2, 3); w the same of keys 4-7 and 12-15.
  const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
  const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
  const __m512i w0 = _mm512_unpacklo_epi64(t4, t6), w1 = _mm512_unpackhi_epi64(t4, t6);
  const __m512i w2 = _mm512_unpacklo_epi64(t5, t7), w3 = _mm512_unpackhi_epi64(t5, t7);
  constexpr int kLo = _MM_SHUFFLE(2, 0, 2, 0), kHi = _MM_SHUFFLE(3, 1, 3, 1);
  t[0] = _mm512_shuffle_i32x4(u0, w0, kLo);
  t[4] = _mm512_shuffle_i32x4(u0, w0, kHi);
  t[1] = _mm512_shuffle_i32x4(u1, w1, kLo);
  t[5] = _mm512_shuffle_i32x4(u1, w1, kHi);
  t[2] = _mm512_shuffle_i32x4(u2, w2, kLo);
  t[6] = _mm512_shuffle_i32x4(u2, w2, kHi);
  t[3] = _mm512_shuffle_i32x4(u3, w3, kLo);
  t[7] = _mm512_shuffle_i32x4(u3, w3, kHi);
}

// Rows [0, M) of r against keys [0, n) (rows of nb blocks, row_bytes apart, from kb): c[i * ldc + j] (=, or +=
// with acc) the score of row i and key j.
template <size_t M, int kParts>
KILN_QMM_VNNI void Scores(const QRows& r, const uint8_t* kb, ptrdiff_t row_bytes, size_t n, size_t nb, float* c,
                          ptrdiff_t ldc, bool acc) {
  alignas(64) static constexpr int32_t kLaneKey[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
  const __m512i lane_key = _mm512_load_si512(kLaneKey);  // its own inverse: also the store's permutation
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  // The keys are prefetched kAhead keys ahead of the group being read: each call reads another KV head's part,
  // a new stream that the hardware prefetcher meets late (docs/benchmarks.md, scattered). Within the keys only.
  const uint8_t* end = kb + static_cast<ptrdiff_t>(n) * row_bytes;
  const uint8_t* pf = kb;
  auto prefetch_to = [&](const uint8_t* to) {
    for (to = HWY_MIN(to, end); pf < to; pf += 64) _mm_prefetch(reinterpret_cast<const char*>(pf), _MM_HINT_T0);
  };
  for (size_t j0 = 0; j0 < n; j0 += 16) {
    const size_t cnt = HWY_MIN(size_t{16}, n - j0);
    const uint8_t* rows = kb + static_cast<ptrdiff_t>(j0) * row_bytes;
    prefetch_to(rows + (16 + kAhead) * row_bytes);
    const uint8_t* key[16];  // keys past n repeat the last one (their lanes are not stored)
    for (size_t i = 0; i < 16; ++i) key[i] = rows + static_cast<ptrdiff_t>(HWY_MIN(i, cnt - 1)) * row_bytes;
    __m512 s[M];
    for (size_t i = 0; i < M; ++i) s[i] = _mm512_setzero_ps();
    for (size_t b = 0; b < nb; ++b) {
      const size_t off = sizeof(block_q8_0) * b;
      __m512i z[8], t[8];
      for (size_t i = 0; i < 8; ++i)
        z[i] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(key[i] + off + 2))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key[i + 8] + off + 2)), 1);
      Transpose16x8(z, t);
      for (size_t c = 0; c < 8; ++c) t[c] = _mm512_xor_si512(t[c], flip);  // k + 128, unsigned
      // The 16 keys' d in lane order, by scalar loads (a vpgatherdd of them waits on every key's cache miss).
      alignas(32) uint16_t dks[16];
      for (size_t l = 0; l < 16; ++l) std::memcpy(&dks[l], key[kLaneKey[l]] + off, 2);
      const __m512 dk = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dks)));
      for (size_t i = 0; i < M; ++i) {
        __m512i x = _mm512_setzero_si512();
        for (size_t c = 0; c < 8; ++c) x = _mm512_dpbusd_epi32(x, t[c], _mm512_set1_epi32(r.q[i][b][0][c]));
        if constexpr (kParts == 2) {
          __m512i y = _mm512_setzero_si512();
          for (size_t c = 0; c < 8; ++c) y = _mm512_dpbusd_epi32(y, t[c], _mm512_set1_epi32(r.q[i][b][1][c]));
          x = _mm512_add_epi32(_mm512_sll_epi32(x, _mm_cvtsi32_si128(r.shift[i][b])), y);
        }
        x = _mm512_sub_epi32(x, _mm512_set1_epi32(static_cast<int32_t>(r.corr[i][b])));
        s[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), _mm512_mul_ps(dk, _mm512_set1_ps(r.scale[i][b])), s[i]);
      }
    }
    const __mmask16 store = static_cast<__mmask16>((1u << cnt) - 1u);
    for (size_t i = 0; i < M; ++i) {
      float* ci = c + static_cast<ptrdiff_t>(i) * ldc + static_cast<ptrdiff_t>(j0);
      __m512 v = _mm512_permutexvar_ps(lane_key, s[i]);
      if (acc) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(store, ci));
      _mm512_mask_storeu_ps(ci, store, v);
    }
  }
}

// Scores<M, kParts> for M = m (1..kMaxRows).
template <int kParts>
KILN_QMM_VNNI void ScoresRows(const QRows& r, size_t m, const uint8_t* kb, ptrdiff_t row_bytes, size_t n, size_t nb,
                              float* c, ptrdiff_t ldc, bool acc) {
  using Fn = void (*)(const QRows&, const uint8_t*, ptrdiff_t, size_t, size_t, float*, ptrdiff_t, bool);
  static constexpr auto kByRows = []<size_t... I>(std::index_sequence<I...>) {
    return std::array<Fn, sizeof...(I)>{&Scores<I + 1, kParts>...};
  }
  (std::make_index_sequence<kMaxRows>());
  kByRows[m - 1](r, kb, row_bytes, n, nb, c, ldc, acc);
}

// Whether the integer kernel takes this product: whole blocks, at most kMaxBlocks a row, rows that do not
// overlap, and finite q (a NaN or infinity would not survive the rounding; the f32 kernel propagates it).
HWY_INLINE bool Takes(const float* a, ptrdiff_t lda, size_t m, size_t k, ptrdiff_t ldb) {
  if (k == 0 || k % 32 != 0 || k / 32 > kMaxBlocks || ldb < static_cast<ptrdiff_t>(k / 32)) return false;
  uint32_t bad = 0;
  for (size_t i = 0; i < m; ++i) {
    const float* x = a + static_cast<ptrdiff_t>(i) * lda;
    for (size_t p = 0; p < k; ++p) {
      uint32_t u;
      std::memcpy(&u, x + p, 4);
      bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
    }
  }
  return bad == 0;
}

// ---- The values: c (m, 32 nb) [+]= s (m, k) V over k positions.

inline constexpr size_t kValueGroup = 256;    // positions per integer sum (int32: 256 * 32767 * 128 < 2^31)
inline constexpr size_t kMaxValueBlocks = 8;  // head_dim up to 256
inline constexpr float kWMax = 32767.0f;

// One pass's rounded weights for a group of positions: W[i][b][t] (pairs of positions as dwords), the scale
// of their sums, and the rows' accumulated outputs.
struct WRows {
  alignas(64) int16_t w[kMaxRows][kMaxValueBlocks][kValueGroup];
  float scale[kMaxRows][kMaxValueBlocks];
  alignas(64) float out[kMaxRows][kMaxValueBlocks * 32];
};

// Rounds the weights of rows [0, M) of s for positions [t0, t0 + g) (g <= kValueGroup; W past g, to the next
// multiple of 16, is zero): w = s d (f32), W = round(w * (32767 / max|w|)) to nearest even; the scale
// max|w| / 32767. Returns the rows (bit i) with a weight that is not finite (the rounding would hide a NaN or
// an infinity, which the f32 kernel propagates).
template <size_t M>
KILN_QMM_VNNI uint32_t RoundWeights(const float* s, ptrdiff_t lds, const uint8_t* vb, ptrdiff_t row_bytes, size_t t0,
                                    size_t g, size_t nb, WRows& r) {
  // The rows' scales d (f32), 16 rows per gather (a dword from each row's block: d and two values, the low half
  // kept); rows past g read nothing and give 0. The rows 32 ahead are prefetched on the way (the first group's;
  // ValuesGroup has fetched the later ones).
  alignas(64) float dv[kMaxValueBlocks][kValueGroup];
  const size_t gv = (g + 15) & ~size_t{15};
  const uint8_t* base = vb + static_cast<ptrdiff_t>(t0) * row_bytes;
  const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(static_cast<int32_t>(row_bytes)));
  for (size_t t = 0; t < gv; t += 16) {
    const __mmask16 in = static_cast<__mmask16>(g - t >= 16 ? 0xffffu : (1u << (g - t)) - 1u);
    const uint8_t* r = base + static_cast<ptrdiff_t>(t) * row_bytes;
    const uint8_t* ahead = r + 32 * row_bytes;
    for (ptrdiff_t o = 0; o < 16 * row_bytes && t + 32 < g; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + o), _MM_HINT_T0);
    for (size_t b = 0; b < nb; ++b) {
      const __m512i off = _mm512_add_epi32(rows, _mm512_set1_epi32(static_cast<int32_t>(sizeof(block_q8_0) * b)));
      const __m512i x = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), in, off, r, 1);
      _mm512_store_ps(&dv[b][t], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x)));
    }
  }
  uint32_t bad = 0;
  for (size_t i = 0; i < M; ++i) {
    const float* si = s + static_cast<ptrdiff_t>(i) * lds + static_cast<ptrdiff_t>(t0);
    for (size_t b = 0; b < nb; ++b) {
      alignas(64) float w[kValueGroup];
      __m512 amax = _mm512_setzero_ps();
      for (size_t t = 0; t < gv; t += 16) {
        const __mmask16 in = static_cast<__mmask16>(g - t >= 16 ? 0xffffu : (1u << (g - t)) - 1u);
        const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, si + t), _mm512_load_ps(&dv[b][t]));
        if (_mm512_fpclass_ps_mask(x, 0x99) != 0) bad |= 1u << i;  // QNaN, SNaN, +-infinity
        amax = _mm512_max_ps(amax, _mm512_abs_ps(x));
        _mm512_store_ps(w + t, x);
      }
      const float m = _mm512_reduce_max_ps(amax);
      const float inv = m > 0.0f ? kWMax / m : 0.0f;
      r.scale[i][b] = m / kWMax;
      const __m512 vinv = _mm512_set1_ps(inv);
      for (size_t t = 0; t < gv; t += 16)
        _mm256_store_si256(reinterpret_cast<__m256i*>(&r.w[i][b][t]),
                           _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(w + t), vinv))));
    }
  }
  return bad;
}

// Rows [0, M) of r.out += the group's products: positions [t0, t0 + g) of V, two at a time. The next group's
// rows (up to `end`) are prefetched meanwhile: RoundWeights, the first to read them, then meets them cached.
template <size_t M>
KILN_QMM_VNNI void ValuesGroup(const uint8_t* vb, ptrdiff_t row_bytes, size_t t0, size_t g, size_t nb,
                               const uint8_t* end, WRows& r) {
  // Byte o of the interleave: value o / 2 of position o % 2 (the second row's block in bytes 32-63).
  alignas(64) static constexpr uint8_t kPairs[64] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                     8,  40, 9,  41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47,
                                                     16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                     24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i pairs = _mm512_load_si512(kPairs);
  const uint8_t* last = vb + static_cast<ptrdiff_t>(t0 + g - 1) * row_bytes;  // an odd g's partner (W = 0)
  for (size_t b = 0; b < nb; ++b) {
    const size_t off = sizeof(block_q8_0) * b + 2;
    __m512i acc[M][2];
    for (size_t i = 0; i < M; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_si512();
    for (size_t t = 0; t < g; t += 2) {
      const uint8_t* r0 = vb + static_cast<ptrdiff_t>(t0 + t) * row_bytes;
      const uint8_t* r1 = t + 1 < g ? r0 + row_bytes : last;
      if (b == 0) {
        const uint8_t* next = r0 + static_cast<ptrdiff_t>(kValueGroup) * row_bytes;  // two rows' lines
        for (ptrdiff_t o = 0; o < 2 * row_bytes && next + o < end; o += 64)
          _mm_prefetch(reinterpret_cast<const char*>(next + o), _MM_HINT_T0);
      }
      const __m512i z =
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + off))),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + off)), 1);
      const __m512i p = _mm512_permutexvar_epi8(pairs, z);
      const __m512i lo = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(p));        // values 0-15, both positions
      const __m512i hi = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(p, 1));  // values 16-31
      for (size_t i = 0; i < M; ++i) {
        int32_t w2;
        std::memcpy(&w2, &r.w[i][b][t], 4);
        const __m512i wv = _mm512_set1_epi32(w2);
        acc[i][0] = _mm512_dpwssd_epi32(acc[i][0], lo, wv);
        acc[i][1] = _mm512_dpwssd_epi32(acc[i][1], hi, wv);
      }
    }
    for (size_t i = 0; i < M; ++i) {
      const __m512 sc = _mm512_set1_ps(r.scale[i][b]);
      float* o = &r.out[i][32 * b];
      _mm512_store_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][0]), sc, _mm512_load_ps(o)));
      _mm512_store_ps(o + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][1]), sc, _mm512_load_ps(o + 16)));
    }
  }
}

// Rows [0, M) of c (=, or += with acc) s V over positions [0, k), but for the rows it returns (bit i: a weight
// that is not finite), which it leaves as they were.
template <size_t M>
KILN_QMM_VNNI uint32_t Values(const float* s, ptrdiff_t lds, const uint8_t* vb, ptrdiff_t row_bytes, size_t k,
                              size_t nb, float* c, ptrdiff_t ldc, bool acc, WRows& r) {
  for (size_t i = 0; i < M; ++i) std::memset(r.out[i], 0, 32 * nb * sizeof(float));
  uint32_t bad = 0;
  for (size_t t0 = 0; t0 < k; t0 += kValueGroup) {
    const size_t g = HWY_MIN(kValueGroup, k - t0);
    bad |= RoundWeights<M>(s, lds, vb, row_bytes, t0, g, nb, r);
    ValuesGroup<M>(vb, row_bytes, t0, g, nb, vb + static_cast<ptrdiff_t>(k) * row_bytes, r);
  }
  for (size_t i = 0; i < M; ++i) {
    if (bad & (1u << i)) continue;
    float* ci = c + static_cast<ptrdiff_t>(i) * ldc;
    for (size_t j = 0; j < 32 * nb; ++j) ci[j] = acc ? ci[j] + r.out[i][j] : r.out[i][j];
  }
  return bad;
}

template <size_t... I>
constexpr auto ValuesTable(std::index_sequence<I...>) {
  using Fn =
      uint32_t (*)(const float*, ptrdiff_t, const uint8_t*, ptrdiff_t, size_t, size_t, float*, ptrdiff_t, bool, WRows&);
  return std::array<Fn, sizeof...(I)>{&Values<I + 1>...};
}

}  // namespace kvq8

// c (m, n) [+]= s (m, k) V, V (k, n) rows of Q8_0 blocks (ldb blocks apart), as described at the top. false: a
// row with a weight that is not finite, which the f32 kernel computes alone (matmul_q8_0). Each row's result
// depends on that row alone, not on the rows that share the call.
KILN_QMM_VNNI inline bool ValuesQ8_0Int(const float* s, ptrdiff_t lds, const block_q8_0* b, ptrdiff_t ldb, float* c,
                                        ptrdiff_t ldc, size_t m, size_t n, size_t k, bool acc) {
  // The caller (MatmulQ8_0Int) has checked the shape: n a multiple of 32 up to 32 kMaxValueBlocks, k > 0.
  unsigned flags = ::kiln::detail::kMatmulColMajorB;
  if (acc) flags |= ::kiln::detail::kMatmulAccumulate;
  bool all = true;
  const size_t nb = n / 32;
  const ptrdiff_t row_bytes = ldb * static_cast<ptrdiff_t>(sizeof(block_q8_0));
  const auto* vb = reinterpret_cast<const uint8_t*>(b);
  static constexpr auto kByRows = kvq8::ValuesTable(std::make_index_sequence<kvq8::kMaxRows>());
  thread_local kvq8::WRows r;  // 80 KiB: not on the stack
  for (size_t i0 = 0; i0 < m; i0 += kvq8::kMaxRows) {
    const size_t mp = HWY_MIN(kvq8::kMaxRows, m - i0);
    const uint32_t bad = kByRows[mp - 1](s + static_cast<ptrdiff_t>(i0) * lds, lds, vb, row_bytes, k, nb,
                                         c + static_cast<ptrdiff_t>(i0) * ldc, ldc, acc, r);
    for (size_t i = 0; i < mp; ++i)
      if (bad & (1u << i)) {
        all = false;
        const ptrdiff_t row = static_cast<ptrdiff_t>(i0 + i);
        ::kiln::dispatch::matmul_q8_0(s + row * lds, lds, b, ldb, c + row * ldc, ldc, 1, n, k, flags);
      }
  }
  return all;
}

// s (m, n) = a (m, k) B^T over Q8_0 rows as described at the top; false (nothing written) where kvq8::Takes
// refuses the product.
KILN_QMM_VNNI inline bool ScoresQ8_0Int(const float* a, ptrdiff_t lda, const block_q8_0* b, ptrdiff_t ldb, float* c,
                                        ptrdiff_t ldc, size_t m, size_t n, size_t k, int parts, bool acc) {
  if (!kvq8::Takes(a, lda, m, k, ldb)) return false;
  const size_t nb = k / 32;
  const ptrdiff_t row_bytes = ldb * static_cast<ptrdiff_t>(sizeof(block_q8_0));
  const auto* kb = reinterpret_cast<const uint8_t*>(b);
  kvq8::QRows r;
  for (size_t i0 = 0; i0 < m; i0 += kvq8::kMaxRows) {
    const size_t mp = HWY_MIN(kvq8::kMaxRows, m - i0);
    kvq8::RoundRows(a + static_cast<ptrdiff_t>(i0) * lda, lda, mp, nb, parts, r);
    float* ci = c + static_cast<ptrdiff_t>(i0) * ldc;
    if (parts == 1) kvq8::ScoresRows<1>(r, mp, kb, row_bytes, n, nb, ci, ldc, acc);
    else kvq8::ScoresRows<2>(r, mp, kb, row_bytes, n, nb, ci, ldc, acc);
  }
  return true;
}

KILN_X86_DIAGNOSTICS_POP

#endif  // HWY_TARGET == HWY_AVX3_DL

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
