// kiln/kernels/dense/attention_amx-inl.h - the tile products of the prompt attention on Intel AMX bf16 tiles
// (AVX3_DL target, where core/amx.hpp finds AMX-BF16 usable; AttentionOptions::amx_bf16, f16 K/V, head_dim a
// multiple of 32). Included from attention-inl.h only, which keeps the online softmax in f32 vectors between
// the two products (the error bound is in docs/kernels.md):
//   S^T (positions x rows) = K q^T: A = 16 positions of K (f16 split exactly into bf16 hi + lo: hi the 8
//   leading significant bits, lo the other 3), B = the block's query rows (f32 split hi = bf16(q) nearest
//   even, lo = bf16(q - hi)); main = sum K_hi q_hi and corr = sum (K_lo q_hi + K_hi q_lo) in tiles of their
//   own, added once per score. Transposed so that a score vector holds one position for 16 rows, as the f32
//   kernel's softmax reads it.
//   O += P V: A = 16 query rows of P (f32 weights transposed, split as q), B = V (f16, split as K); main and
//   corr accumulated over all positions in tiles of their own (kept in scratch between tiles, scaled by the
//   online softmax's rescale factor there), added once at the end.
// The contraction pairs of a tile (tdpbf16ps multiplies 32-bit pairs of bf16) are (j, j + 16) within each 32
// head elements (scores) or positions (values), on both operands: any fixed pairing gives the same products,
// and this one needs no permutes to build. Tiles: 0-3 the accumulators (main, corr of column tile 0, main,
// corr of column tile 1), 4, 5 the A operand's hi and lo, 6, 7 the B operand's.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_DENSE_ATTENTION_AMX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_DENSE_ATTENTION_AMX_INL_H_
#undef KILN_KERNELS_DENSE_ATTENTION_AMX_INL_H_
#else
#define KILN_KERNELS_DENSE_ATTENTION_AMX_INL_H_
#endif

#include <hwy/highway.h>

#include <cstring>

#include "kiln/core/amx.hpp"
#include "kiln/kernels/x86/common.hpp"  // KILN_X86_DIAGNOSTICS_*, KILN_MM_AMXBF, TileConfig

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {

#undef KILN_ATTN_HAVE_AMX
#if HWY_TARGET == HWY_AVX3_DL && KILN_AMX_X86
#define KILN_ATTN_HAVE_AMX 1

KILN_X86_DIAGNOSTICS_PUSH

namespace attn_amx {
#undef KILN_ATTN_AMX
#define KILN_ATTN_AMX KILN_MM_AMXBF

inline constexpr size_t kT = 16;       // rows of a tile
inline constexpr size_t kS = 32;       // bf16 per tile row: head elements (scores) or positions (values) per step
inline constexpr size_t kTile = 1024;  // bytes per tile
inline constexpr size_t kTileF = 256;  // floats per accumulator tile
inline constexpr size_t kVSteps = 2;   // value steps per tile of 64 positions

// Eight tiles of 16 rows x 64 bytes.
KILN_ATTN_AMX HWY_NOINLINE void Configure() {
  ::kiln::detail::x86::TileConfig c;
  std::memset(&c, 0, sizeof(c));
  c.palette = 1;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = kT;
    c.colsb[t] = 64;
  }
  ::kiln::detail::x86::LoadTileConfig(c);
}

KILN_ATTN_AMX HWY_NOINLINE void Release() { _tile_release(); }

// 16 vectors of 16 32-bit lanes transposed (v[i] lane j <- v[j] lane i).
KILN_ATTN_AMX HWY_INLINE void Transpose16(__m512* v) {
  __m512 t[16], u[16];
  for (size_t i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (size_t i = 0; i < 4; ++i) {
    const __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (size_t q = 0; q < 4; ++q) {  // block b of u[4i + q] holds rows 4i..4i+3 of column 4b + q
    const __m512 s0 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0x44), s1 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0xEE);
    const __m512 s2 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0x44);
    const __m512 s3 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0xEE);
    v[q] = _mm512_shuffle_f32x4(s0, s2, 0x88);
    v[4 + q] = _mm512_shuffle_f32x4(s0, s2, 0xDD);
    v[8 + q] = _mm512_shuffle_f32x4(s1, s3, 0x88);
    v[12 + q] = _mm512_shuffle_f32x4(s1, s3, 0xDD);
  }
}

// 16 f16 values a and 16 b as bf16 pairs (lane j: a_j in the low half, b_j in the high half), split exactly:
// hi = the leading 8 significant bits (f16 has 11; its subnormals are normal bf16 numbers), lo = the rest.
KILN_ATTN_AMX HWY_INLINE void SplitF16(__m256i a, __m256i b, __m512i& hi, __m512i& lo) {
  const __m512 fa = _mm512_cvtph_ps(a), fb = _mm512_cvtph_ps(b);
  const __m512 keep = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __m512 ta = _mm512_and_ps(fa, keep), tb = _mm512_and_ps(fb, keep);
  // fa - ta has at most 3 significant bits: its f32 low half is zero, as ta's and tb's.
  hi = _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(ta), 16), _mm512_castps_si512(tb));
  lo = _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(_mm512_sub_ps(fa, ta)), 16),
                       _mm512_castps_si512(_mm512_sub_ps(fb, tb)));
}

// 16 f32 values a and 16 b as bf16 pairs (as SplitF16), hi = bf16(x) nearest even, lo = bf16(x - hi):
// |x - hi - lo| <= 2^-16 |x| (vcvtne2ps2bf16 flushes f32 subnormals).
KILN_ATTN_AMX HWY_INLINE void SplitF32(__m512 a, __m512 b, __m512i& hi, __m512i& lo) {
  alignas(64) static constexpr uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kIdx);
  hi = _mm512_permutexvar_epi16(idx, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
  const __m512 ha = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
  const __m512 hb = _mm512_castsi512_ps(_mm512_and_si512(hi, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  lo = _mm512_permutexvar_epi16(
      idx, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha))));
}

// The block's query rows (nr; rows past nr up to a whole pair of row tiles zero; head elements d and d + 16
// of each 32 paired) as B tiles: per pair of row tiles, per step of 32 head elements, the first row tile's hi
// and lo, then the second's (the layout Tiles reads).
KILN_ATTN_AMX void PackQ(const float* q, ptrdiff_t qs, size_t nr, size_t hd, uint8_t* qb) {
  const size_t steps = hd / kS, pairs = (nr + 2 * kT - 1) / (2 * kT);
  for (size_t pp = 0; pp < pairs; ++pp)
    for (size_t s = 0; s < steps; ++s)
      for (size_t ct = 0; ct < 2; ++ct) {
        __m512 h[16], l[16];
        for (size_t j = 0; j < kT; ++j) {
          const size_t r = (pp * 2 + ct) * kT + j;
          __m512i hj = _mm512_setzero_si512(), lj = _mm512_setzero_si512();
          if (r < nr) {
            const float* row = q + static_cast<ptrdiff_t>(r) * qs + s * kS;
            SplitF32(_mm512_loadu_ps(row), _mm512_loadu_ps(row + 16), hj, lj);
          }
          h[j] = _mm512_castsi512_ps(hj);
          l[j] = _mm512_castsi512_ps(lj);
        }
        Transpose16(h);  // row i: pair i of each query row
        Transpose16(l);
        uint8_t* dst = qb + ((pp * steps + s) * 2 + ct) * 2 * kTile;
        for (size_t i = 0; i < kT; ++i) {
          _mm512_store_ps(reinterpret_cast<float*>(dst + 64 * i), h[i]);
          _mm512_store_ps(reinterpret_cast<float*>(dst + kTile + 64 * i), l[i]);
        }
      }
}

// Positions [0, tn) of a tile of K (rows kvs apart) as A tiles, per group of 16 positions and step of 32 head
// elements: hi then lo; positions past tn zero.
KILN_ATTN_AMX void PackK(const uint16_t* k, ptrdiff_t kvs, size_t tn, size_t hd, uint8_t* kt) {
  const size_t steps = hd / kS;
  for (size_t g = 0; g * kT < tn; ++g)
    for (size_t i = 0; i < kT; ++i) {
      const size_t c = g * kT + i;
      const uint16_t* row = k + static_cast<ptrdiff_t>(c) * kvs;
      for (size_t s = 0; s < steps; ++s) {
        __m512i h = _mm512_setzero_si512(), l = _mm512_setzero_si512();
        if (c < tn)
          SplitF16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + s * kS)),
                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + s * kS + 16)), h, l);
        uint8_t* dst = kt + (g * steps + s) * 2 * kTile + 64 * i;
        _mm512_store_si512(dst, h);
        _mm512_store_si512(dst + kTile, l);
      }
    }
}

// Positions [0, tn) of a tile of V as B tiles, per pair of 16-column tiles of head elements (32 columns) and
// step of 32 positions (c and c + 16 paired): column tile 0's hi and lo, then column tile 1's; past tn zero.
KILN_ATTN_AMX void PackV(const uint16_t* v, ptrdiff_t kvs, size_t tn, size_t hd, uint8_t* vt) {
  const __m256i zero = _mm256_setzero_si256();
  for (size_t s = 0; s * kS < tn; ++s)
    for (size_t i = 0; i < kT; ++i) {
      const size_t a = s * kS + i, b = a + 16;
      const uint16_t* ra = v + static_cast<ptrdiff_t>(a) * kvs;
      const uint16_t* rb = v + static_cast<ptrdiff_t>(b) * kvs;
      for (size_t d0 = 0; d0 < hd; d0 += kT) {
        const __m256i va = a < tn ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ra + d0)) : zero;
        const __m256i vb = b < tn ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rb + d0)) : zero;
        __m512i h, l;
        SplitF16(va, vb, h, l);
        const size_t hp = d0 / kS, ct = d0 / kT % 2;
        uint8_t* dst = vt + ((hp * kVSteps + s) * 4 + ct * 2) * kTile + 64 * i;
        _mm512_store_si512(dst, h);
        _mm512_store_si512(dst + kTile, l);
      }
    }
}

// 16 rows of A against 32 columns of B over `steps` steps (A: per step hi then lo; B: per step column tile 0's
// hi and lo, then column tile 1's): cs (main0, corr0, main1, corr1, 16 x 16 f32 each) = [cs +] main and corr.
KILN_ATTN_AMX HWY_NOINLINE void Tiles(const uint8_t* ab, const uint8_t* bb, size_t steps, float* cs, bool first) {
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, cs, 64);
    _tile_loadd(1, cs + 256, 64);
    _tile_loadd(2, cs + 512, 64);
    _tile_loadd(3, cs + 768, 64);
  }
  for (size_t s = 0; s < steps; ++s) {
    const uint8_t* x = ab + s * 2 * kTile;
    const uint8_t* w = bb + s * 4 * kTile;
    // Both column tiles' hi parts first: each B tile serves two products before the next load replaces it.
    _tile_loadd(4, x, 64);
    _tile_loadd(6, w, 64);
    _tile_loadd(7, w + 2 * kTile, 64);
    _tile_loadd(5, x + kTile, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 4, 7);
    _tile_dpbf16ps(1, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    _tile_loadd(6, w + kTile, 64);
    _tile_loadd(7, w + 3 * kTile, 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(3, 4, 7);
  }
  _tile_stored(0, cs, 64);
  _tile_stored(1, cs + 256, 64);
  _tile_stored(2, cs + 512, 64);
  _tile_stored(3, cs + 768, 64);
}

// Scores of positions [0, tn) for the block's rows: s[c * nrp + r] = main + corr (nrp a multiple of 16).
KILN_ATTN_AMX void Scores(const uint8_t* kt, const uint8_t* qb, size_t tn, size_t hd, size_t nrp, float* s, float* cs) {
  const size_t steps = hd / kS, pairs = (nrp + 2 * kT - 1) / (2 * kT);
  for (size_t g = 0; g * kT < tn; ++g) {
    const size_t mr = HWY_MIN(kT, tn - g * kT);
    for (size_t pp = 0; pp < pairs; ++pp) {
      Tiles(kt + g * steps * 2 * kTile, qb + pp * steps * 4 * kTile, steps, cs, true);
      for (size_t ct = 0; ct < 2 && (pp * 2 + ct) * kT < nrp; ++ct)
        for (size_t i = 0; i < mr; ++i)
          _mm512_storeu_ps(
              s + (g * kT + i) * nrp + (pp * 2 + ct) * kT,
              _mm512_add_ps(_mm512_load_ps(cs + ct * 512 + 16 * i), _mm512_load_ps(cs + ct * 512 + 256 + 16 * i)));
    }
  }
}

// The weights p (s[c * nrp + r], positions [0, tn)) as A tiles, per row tile and step of 32 positions (c and
// c + 16 paired): hi then lo; positions past tn zero.
KILN_ATTN_AMX void PackP(const float* s, size_t nrp, size_t tn, uint8_t* pt) {
  const __m512 zero = _mm512_setzero_ps();
  for (size_t rt = 0; rt * kT < nrp; ++rt)
    for (size_t st = 0; st * kS < tn; ++st) {
      __m512 x0[16], x1[16];
      for (size_t i = 0; i < kT; ++i) {
        const size_t c0 = st * kS + i, c1 = c0 + 16;
        x0[i] = c0 < tn ? _mm512_loadu_ps(s + c0 * nrp + rt * kT) : zero;
        x1[i] = c1 < tn ? _mm512_loadu_ps(s + c1 * nrp + rt * kT) : zero;
      }
      Transpose16(x0);  // x0[j]: row j's weights at positions st * 32 + [0, 16)
      Transpose16(x1);
      uint8_t* dst = pt + (rt * kVSteps + st) * 2 * kTile;
      for (size_t j = 0; j < kT; ++j) {
        __m512i h, l;
        SplitF32(x0[j], x1[j], h, l);
        _mm512_store_si512(dst + 64 * j, h);
        _mm512_store_si512(dst + kTile + 64 * j, l);
      }
    }
}

// acc (per row tile and 32 head elements: main0, corr0, main1, corr1) = acc alpha[row] + P V over positions
// [0, tn). alpha exactly 1 for every row leaves acc as it is (the product would too).
KILN_ATTN_AMX void Values(const uint8_t* pt, const uint8_t* vt, size_t tn, size_t hd, size_t nrp, const float* alpha,
                          float* acc) {
  const size_t pairs = hd / kS, steps = (tn + kS - 1) / kS;
  bool scale = false;
  for (size_t r = 0; r < nrp; ++r) scale |= alpha[r] != 1.0f;
  for (size_t rt = 0; rt * kT < nrp; ++rt)
    for (size_t hp = 0; hp < pairs; ++hp) {
      float* cs = acc + (rt * pairs + hp) * 4 * kTileF;
      if (scale)
        for (size_t i = 0; i < kT; ++i) {
          const __m512 a = _mm512_set1_ps(alpha[rt * kT + i]);
          for (size_t t = 0; t < 4; ++t) {
            float* p = cs + t * kTileF + 16 * i;
            _mm512_store_ps(p, _mm512_mul_ps(_mm512_load_ps(p), a));
          }
        }
      Tiles(pt + rt * kVSteps * 2 * kTile, vt + hp * kVSteps * 4 * kTile, steps, cs, false);
    }
}

// Row r's accumulated values (main + corr) times inv into o[0, hd).
KILN_ATTN_AMX void Output(const float* acc, size_t r, size_t hd, float inv, float* o) {
  const size_t pairs = hd / kS, rt = r / kT, i = r % kT;
  const __m512 vi = _mm512_set1_ps(inv);
  for (size_t hp = 0; hp < pairs; ++hp)
    for (size_t ct = 0; ct < 2; ++ct) {
      const float* p = acc + ((rt * pairs + hp) * 4 + ct * 2) * kTileF + 16 * i;
      _mm512_storeu_ps(o + hp * kS + ct * kT,
                       _mm512_mul_ps(_mm512_add_ps(_mm512_load_ps(p), _mm512_load_ps(p + kTileF)), vi));
    }
}

}  // namespace attn_amx

KILN_X86_DIAGNOSTICS_POP

#else
#define KILN_ATTN_HAVE_AMX 0
#endif  // HWY_TARGET == HWY_AVX3_DL && KILN_AMX_X86

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
