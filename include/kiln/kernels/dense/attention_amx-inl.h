// kiln/kernels/dense/attention_amx-inl.h - the prompt attention on Intel AMX bf16 tiles (AVX3_DL target, where
// core/amx.hpp finds AMX-BF16 usable; AttentionOptions::amx_bf16, f16 K/V, head_dim a multiple of 32). Included
// from attention-inl.h only. One pass holds the rows of every query head that shares the KV head (row i: head
// i / np, position i % np), so K and V are split into tiles once per KV head and tile of kPos (256) positions.
// Per tile of positions, per pair of row tiles (16 rows each); the error bound is in docs/kernels.md:
//   S^T (positions x rows) = K q^T: A = 16 positions of K (f16 split exactly into bf16 hi + lo: hi the 8
//   leading significant bits, lo the other 3), B = the rows' q (f32 split hi = bf16(q) nearest even, lo =
//   bf16(q - hi)); main = sum K_hi q_hi and corr = sum (K_lo q_hi + K_hi q_lo) in tiles of their own, added
//   once per score. Transposed so that a vector holds one position for 16 rows: the online softmax (f32
//   vectors) works down the positions, and its weights p of positions c and c + 16 for 16 rows are, split as
//   q, one row of a B tile of P^T as they come, with no transposes.
//   O^T (head elements x rows) += V^T P^T: A = V^T (f16, split as K, transposed once per tile of positions and
//   KV head), B = P^T; main and corr accumulated over all positions in tiles of their own (kept in scratch
//   between tiles of positions, scaled there by the online softmax's rescale factor where it is not 1),
//   added and transposed back to rows once at the end.
// A pair's value products and the next pair's scores run during its softmax (TileJob, a few steps per 32 positions
// of weights): tile and vector instructions use different ports, and a B tile of weights is loaded long after its
// stores.
// The contraction pairs of a tile (tdpbf16ps multiplies 32-bit pairs of bf16) are (j, j + 16) within each 32
// head elements (scores) or positions (values), on both operands: any fixed pairing gives the same products.
// A row's arithmetic is the same whichever rows share its tiles: every tile element is its own dot product, the
// softmax works lane by lane, and a row tile that no row of it sees in a tile of positions is skipped whole
// (its rows' state would not change: weights 0, rescale factor 1).

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_DENSE_ATTENTION_AMX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_DENSE_ATTENTION_AMX_INL_H_
#undef KILN_KERNELS_DENSE_ATTENTION_AMX_INL_H_
#else
#define KILN_KERNELS_DENSE_ATTENTION_AMX_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kiln/core/amx.hpp"
#include "kiln/kernels/dense/activation-inl.h"       // ExpNonPos (per target)
#include "kiln/kernels/dense/attention_score-inl.h"  // AttnScoreY (per target)
#include "kiln/kernels/x86/common.hpp"               // KILN_X86_DIAGNOSTICS_*, KILN_MM_AMXBF, TileConfig
#include "kiln/ops/attention.hpp"                    // detail::kAttnAmxRowsMax

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
inline constexpr size_t kPos = ::kiln::detail::kAttnAmxTile;  // positions per tile (a multiple of 32)
inline constexpr size_t kVSteps = kPos / kS;                  // value steps per tile of positions
inline constexpr size_t kMaxRowTiles = ::kiln::detail::kAttnAmxRowsMax / kT;

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

// Rows [0, nr) of the pass (row i: head i / np at q + (i % np) qs + (i / np) hd) as B tiles, per row tile and
// step of 32 head elements: hi then lo (head elements d and d + 16 of each 32 paired); rows past nr zero.
KILN_ATTN_AMX void PackQ(const float* q, ptrdiff_t qs, size_t np, size_t nr, size_t hd, uint8_t* qb) {
  const size_t steps = hd / kS;
  for (size_t rt = 0; rt * kT < nr; ++rt)
    for (size_t s = 0; s < steps; ++s) {
      __m512 h[16], l[16];
      for (size_t j = 0; j < kT; ++j) {
        const size_t i = rt * kT + j;
        __m512i hj = _mm512_setzero_si512(), lj = _mm512_setzero_si512();
        if (i < nr) {
          const float* row = q + static_cast<ptrdiff_t>(i % np) * qs + (i / np) * hd + s * kS;
          SplitF32(_mm512_loadu_ps(row), _mm512_loadu_ps(row + 16), hj, lj);
        }
        h[j] = _mm512_castsi512_ps(hj);
        l[j] = _mm512_castsi512_ps(lj);
      }
      Transpose16(h);  // row k: head pair k of each query row
      Transpose16(l);
      uint8_t* dst = qb + (rt * steps + s) * 2 * kTile;
      for (size_t k = 0; k < kT; ++k) {
        _mm512_store_ps(reinterpret_cast<float*>(dst + 64 * k), h[k]);
        _mm512_store_ps(reinterpret_cast<float*>(dst + kTile + 64 * k), l[k]);
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

// Positions [0, tn) of a tile of V transposed into A tiles, per 16 head elements e and step of 32 positions
// (c and c + 16 paired): hi then lo; positions past tn zero.
KILN_ATTN_AMX void PackVT(const uint16_t* v, ptrdiff_t kvs, size_t tn, size_t hd, uint8_t* vt) {
  const __m256i zero = _mm256_setzero_si256();
  for (size_t st = 0; st * kS < tn; ++st)
    for (size_t e = 0; e * kT < hd; ++e) {
      __m512 h[16], l[16];
      for (size_t k = 0; k < kT; ++k) {
        const size_t a = st * kS + k, b = a + 16;
        const uint16_t* ra = v + static_cast<ptrdiff_t>(a) * kvs + e * kT;
        const uint16_t* rb = v + static_cast<ptrdiff_t>(b) * kvs + e * kT;
        const __m256i va = a < tn ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ra)) : zero;
        const __m256i vb = b < tn ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rb)) : zero;
        __m512i hk, lk;
        SplitF16(va, vb, hk, lk);
        h[k] = _mm512_castsi512_ps(hk);
        l[k] = _mm512_castsi512_ps(lk);
      }
      Transpose16(h);  // row m: head element e * 16 + m, lane k: positions (k, k + 16) of the step
      Transpose16(l);
      uint8_t* dst = vt + (e * kVSteps + st) * 2 * kTile;
      for (size_t m = 0; m < kT; ++m) {
        _mm512_store_ps(reinterpret_cast<float*>(dst + 64 * m), h[m]);
        _mm512_store_ps(reinterpret_cast<float*>(dst + kTile + 64 * m), l[m]);
      }
    }
}

// Scores of the 16 positions of group g for NT row tiles (rts): sm, sc[c * 32 + 16 t + j] = main, corr of row
// tile t's row j against position c.
template <size_t NT>
KILN_ATTN_AMX HWY_INLINE void ScoreGroup(const uint8_t* kt, const uint8_t* qb, const size_t* rts, size_t g,
                                         size_t steps, float* sm, float* sc) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (NT == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (size_t s = 0; s < steps; ++s) {
    const uint8_t* x = kt + (g * steps + s) * 2 * kTile;
    const uint8_t* w0 = qb + (rts[0] * steps + s) * 2 * kTile;
    _tile_loadd(4, x, 64);
    _tile_loadd(6, w0, 64);
    _tile_loadd(7, w0 + kTile, 64);
    _tile_loadd(5, x + kTile, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(1, 5, 6);
    if constexpr (NT == 2) {
      const uint8_t* w1 = qb + (rts[1] * steps + s) * 2 * kTile;
      _tile_loadd(6, w1, 64);
      _tile_loadd(7, w1 + kTile, 64);
      _tile_dpbf16ps(2, 4, 6);
      _tile_dpbf16ps(3, 4, 7);
      _tile_dpbf16ps(3, 5, 6);
    }
  }
  float* om = sm + g * kT * 2 * kT;
  float* oc = sc + g * kT * 2 * kT;
  _tile_stored(0, om, 2 * kT * 4);
  _tile_stored(1, oc, 2 * kT * 4);
  if constexpr (NT == 2) {
    _tile_stored(2, om + kT, 2 * kT * 4);
    _tile_stored(3, oc + kT, 2 * kT * 4);
  }
}

// The tile unit's work while a pair of row tiles' softmax runs on the vector ports (tile and vector instructions
// use different ports), issued a few steps at a time between its steps of weights (TileRun):
//   the value products of the previous pair, acc (per row tile and 16 head elements: main, corr, head elements x
//   rows) += V^T P^T over `steps` steps of 32 positions (pt: per step a row tile's hi and lo B tiles); each unit (a
//   row tile's 32 head elements) loads its 4 accumulator tiles, runs its steps and stores them;
//   then the scores of the next pair, nt row tiles (rts) into sm, sc, a group of 16 positions at a time.
// Between TileRun calls nothing else may use the tiles. Work is counted in value steps (6 tile products); a group of
// scores counts nt * qsteps / 2 (3 nt qsteps products).
struct TileJob {
  const uint8_t* pt[2] = {};
  float* acc[2] = {};
  const uint8_t* vt = nullptr;
  size_t steps = 0, units = 0, epairs = 0;
  size_t unit = 0, st = 0;  // the next value step
  const uint8_t *kt = nullptr, *qb = nullptr;
  size_t rts[2] = {}, nt = 0, groups = 0, qsteps = 0;
  size_t g = 0;  // the next group of scores
  float *sm = nullptr, *sc = nullptr;
  size_t GroupCost() const { return std::max<size_t>(1, nt * qsteps / 2); }
  size_t Left() const { return (units - unit) * steps - st + (groups - g) * GroupCost(); }
};

KILN_ATTN_AMX HWY_NOINLINE void TileRun(TileJob& j, size_t n) {
  while (n > 0 && j.unit < j.units) {
    const size_t t = j.unit / j.epairs, e = (j.unit % j.epairs) * 2;
    float* a0 = j.acc[t] + e * 2 * kTileF;
    if (j.st == 0) {
      _tile_loadd(0, a0, 64);
      _tile_loadd(1, a0 + kTileF, 64);
      _tile_loadd(2, a0 + 2 * kTileF, 64);
      _tile_loadd(3, a0 + 3 * kTileF, 64);
    }
    for (; j.st < j.steps && n > 0; ++j.st, --n) {
      const uint8_t* x0 = j.vt + (e * kVSteps + j.st) * 2 * kTile;
      const uint8_t* x1 = j.vt + ((e + 1) * kVSteps + j.st) * 2 * kTile;
      const uint8_t* w = j.pt[t] + j.st * 2 * kTile;
      _tile_loadd(4, x0, 64);
      _tile_loadd(6, w, 64);
      _tile_loadd(7, w + kTile, 64);
      _tile_loadd(5, x0 + kTile, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(1, 5, 6);
      _tile_loadd(4, x1, 64);
      _tile_loadd(5, x1 + kTile, 64);
      _tile_dpbf16ps(2, 4, 6);
      _tile_dpbf16ps(3, 4, 7);
      _tile_dpbf16ps(3, 5, 6);
    }
    if (j.st == j.steps) {
      _tile_stored(0, a0, 64);
      _tile_stored(1, a0 + kTileF, 64);
      _tile_stored(2, a0 + 2 * kTileF, 64);
      _tile_stored(3, a0 + 3 * kTileF, 64);
      j.st = 0;
      ++j.unit;
    }
  }
  for (; n > 0 && j.unit == j.units && j.g < j.groups; ++j.g) {
    if (j.nt == 2) ScoreGroup<2>(j.kt, j.qb, j.rts, j.g, j.qsteps, j.sm, j.sc);
    else ScoreGroup<1>(j.kt, j.qb, j.rts, j.g, j.qsteps, j.sm, j.sc);
    n -= std::min(n, j.GroupCost());
  }
}

// e^x for x <= 0, the weights' exponential: ExpNonPos's reduction (x = n ln2 + r, |r| <= ln2/2, ln2 in two
// parts) and 2^n bit trick, with a degree-5 polynomial for e^r (c0 = 1; relative minimax error 9.1e-8, 2.5 u
// evaluated in f32 FMAs, so within 4 u in all: the weights' split into bf16 parts already moves them by up to
// 2^-16 = 256 u) instead of degree 7, and the results below e^-87 zeroed by the add's mask: 13 operations
// with the FMA that forms x, against 16. -inf gives 0.
KILN_ATTN_AMX HWY_INLINE __m512 ExpWeight(__m512 x) {
  const __m512 magic = _mm512_set1_ps(12582912.0f);  // 1.5 * 2^23: the low mantissa bits of t hold round(x / ln2)
  const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic);
  const __m512 n = _mm512_sub_ps(t, magic);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(0.008290315046906471f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.04189793020486832f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.1666763573884964f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.4999915063381195f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.9999997019767761f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);  // -inf, NaN: 0
  return _mm512_castsi512_ps(
      _mm512_maskz_add_epi32(keep, _mm512_castps_si512(p), _mm512_slli_epi32(_mm512_castps_si512(t), 23)));
}

// The pass's working memory (attention-inl.h carves it from the caller's scratch): q's B tiles, a tile of K's
// and of V^T's A tiles, two pairs of row tiles' scores (main, corr; one pair's are computed during the other's
// softmax), two pairs' weights' B tiles (one pair's value
// products run while the next pair's weights are computed), the accumulators (per row tile
// and 16 head elements: main, corr), per row the running max m, sum l, rescale factor, NaN / +inf seen, and
// its position and window start.
struct Scratch {
  uint8_t *qb, *kt, *vt, *pt;
  float *sm, *sc, *acc, *m, *l, *alpha, *bad;
  int32_t *pv, *lov;
};

// Floats of Scratch for R rows (without alignment slack).
inline constexpr size_t ScratchFloats(size_t R, size_t hd) {
  return R * hd + 2 * kPos * hd + 4 * kPos * 2 * kT + 4 * kVSteps * 2 * kTileF + 2 * R * hd + 6 * R;
}

// A row tile's weight p = exp(vs y - mu) of position c (scores y: sm, rows 32 floats apart, this row tile at
// column `col`), 0 past tn where kPartial. A function, not a lambda: clang gives a lambda none of the target
// attributes of the function it is in.
template <bool kPartial>
KILN_ATTN_AMX HWY_INLINE __m512 Weight(const float* sm, size_t col, size_t c, size_t tn, __m512 vs, __m512 mu) {
  if (kPartial && c >= tn) return _mm512_setzero_ps();
  return ExpWeight(_mm512_fmsub_ps(_mm512_load_ps(sm + c * 2 * kT + col), vs, mu));
}

// One step of 32 positions of a row tile's weights: positions c0 + k and c0 + k + 16 (Weight), summed into lsum0
// and lsum1 and split into the step's hi and lo B tiles at dst (positions c and c + 16 paired).
template <bool kPartial>
KILN_ATTN_AMX HWY_INLINE void WeightStep(const float* sm, size_t col, size_t c0, size_t tn, __m512 vs, __m512 mu,
                                         __m512& lsum0, __m512& lsum1, uint8_t* dst) {
  for (size_t k = 0; k < kT; ++k) {
    const __m512 pa = Weight<kPartial>(sm, col, c0 + k, tn, vs, mu);
    const __m512 pb = Weight<kPartial>(sm, col, c0 + k + kT, tn, vs, mu);
    lsum0 = _mm512_add_ps(lsum0, pa);
    lsum1 = _mm512_add_ps(lsum1, pb);
    __m512i h, l;
    SplitF32(pa, pb, h, l);
    _mm512_store_si512(dst + 64 * k, h);
    _mm512_store_si512(dst + kTile + 64 * k, l);
  }
}

// The online softmax of row tile rt over positions [t0, t0 + tn) (scores s: main sm, corr sc, rows 32 floats
// apart, this row tile at column `col`), compiled per case (a soft-cap: kCap; a sliding window: kWindow):
// y = scale * s (soft-capped), -inf where a row does not see the position (tested only outside [ca, cb), the
// positions every row of the tile sees); the new maximum; alpha = exp(m_old - m_new); p = exp(y - m_new) split
// into the weights' B tiles pt (per step of 32 positions hi then lo, positions c and c + 16 paired); l = l alpha
// + sum p. After each step of weights, `per` steps of the tile unit's job (TileJob). Returns whether
// some row's alpha is not 1 (its accumulators need the rescale).
template <bool kCap, bool kWindow>
KILN_ATTN_AMX bool Softmax(const Scratch& w, size_t rt, float* sm, const float* sc, size_t col, size_t t0, size_t tn,
                           size_t ca, size_t cb, float scale, float softcap, uint8_t* pt, TileJob& job, size_t per) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  using V = hn::Vec<decltype(d)>;
  const float kInf = std::numeric_limits<float>::infinity();
  const V vscale = hn::Set(d, scale), vninf = hn::Set(d, -kInf);
  const V vcap_in = hn::Set(d, kCap ? scale / softcap : 0.0f), vcap = hn::Set(d, softcap);
  const size_t r = rt * kT;
  const auto p_row = hn::Load(di, w.pv + r), lo_row = hn::Load(di, w.lov + r);
  // Rows with a NaN or +inf score: with a soft-cap the score step flags them (a NaN before the cap may not
  // show in y); without, `good` keeps y < inf with one masked compare per vector (masked positions: -inf).
  auto bad = hn::Lt(vninf, vninf);  // all false
  __mmask16 good = 0xFFFF;
  V tmax0 = vninf, tmax1 = vninf;  // two chains of max (exact: any order gives the same maximum)
  auto scores = [&](auto mask, size_t c, size_t end) {
    auto score = [&](size_t i) {
      float* sp = sm + i * 2 * kT + col;
      const V y = AttnScoreY<kCap, decltype(mask)::value, kCap>(
          d, di, hn::Add(hn::Load(d, sp), hn::Load(d, sc + i * 2 * kT + col)), vcap_in, vcap,
          static_cast<int32_t>(t0 + i), p_row, lo_row, bad);
      if constexpr (!kCap) good = _mm512_mask_cmp_ps_mask(good, y.raw, _mm512_set1_ps(kInf), _CMP_LT_OQ);
      hn::Store(y, d, sp);
      return y;
    };
    for (; c + 2 <= end; c += 2) {
      tmax0 = hn::Max(tmax0, score(c));
      tmax1 = hn::Max(tmax1, score(c + 1));
    }
    if (c < end) tmax0 = hn::Max(tmax0, score(c));
  };
  using Masked = std::integral_constant<AttnMask, kWindow ? AttnMask::kWindow : AttnMask::kCausal>;
  scores(Masked(), 0, ca);
  scores(std::integral_constant<AttnMask, AttnMask::kNone>(), ca, cb);
  scores(Masked(), cb, tn);
  if constexpr (!kCap) bad = hn::Mask<decltype(d)>{static_cast<__mmask16>(~good)};
  const V tmax = hn::Max(tmax0, tmax1);
  const V mo = hn::Load(d, w.m + r);
  const V mt = kCap ? tmax : hn::Mul(tmax, vscale);  // max(scale s) = scale max(s), scale > 0
  const V mn = hn::Max(mo, mt);
  const V mu = hn::IfThenZeroElse(hn::Eq(mn, vninf), mn);  // nothing yet: exp(-inf - 0) = 0
  const V alpha = ExpNonPos(d, hn::Sub(mo, mu));           // exactly 1 when the maximum stays
  const V vs = kCap ? hn::Set(d, 1.0f) : vscale;           // y - mu or scale y - mu, one FMA (y 1 = y exactly)
  __m512 lsum0 = _mm512_setzero_ps(), lsum1 = _mm512_setzero_ps();
  for (size_t st = 0; st * kS < tn; ++st) {
    uint8_t* dst = pt + st * 2 * kTile;
    const size_t c0 = st * kS;
    if (c0 + kS <= tn) WeightStep<false>(sm, col, c0, tn, vs.raw, mu.raw, lsum0, lsum1, dst);
    else WeightStep<true>(sm, col, c0, tn, vs.raw, mu.raw, lsum0, lsum1, dst);  // positions past tn weigh 0
    if (per > 0) TileRun(job, per);
  }
  hn::Store(mn, d, w.m + r);
  hn::Store(alpha, d, w.alpha + r);
  hn::Store(hn::MulAdd(hn::Load(d, w.l + r), alpha, V{_mm512_add_ps(lsum0, lsum1)}), d, w.l + r);
  hn::Store(hn::IfThenElse(bad, hn::Set(d, 1.0f), hn::Load(d, w.bad + r)), d, w.bad + r);
  return !hn::AllTrue(d, hn::Eq(alpha, hn::Set(d, 1.0f)));
}

// acc of row tile rt (head elements x 16 rows) times the rows' alpha.
KILN_ATTN_AMX void Rescale(float* acc, const float* alpha, size_t hd) {
  const __m512 a = _mm512_load_ps(alpha);
  for (size_t i = 0; i < 2 * hd; ++i) _mm512_store_ps(acc + 16 * i, _mm512_mul_ps(_mm512_load_ps(acc + 16 * i), a));
}

// np positions of `heads` query heads (row i: head i / np, position index i % np at pos0 + (i % np) * step) over
// positions [0, kv_len); heads * np <= the rows Scratch was carved for. Tiles configured by the caller.
KILN_ATTN_AMX void Block(const float* q, ptrdiff_t qs, const uint16_t* k, const uint16_t* v, ptrdiff_t kvs,
                         size_t kv_len, float* out, ptrdiff_t os, size_t np, size_t heads, size_t hd, size_t pos0,
                         size_t step, size_t window, float scale, float softcap, float sink, const float* sinks,
                         const Scratch& w) {
  constexpr size_t T_ = kPos;
  const float kInf = std::numeric_limits<float>::infinity();
  const size_t nr = heads * np, nrt = (nr + kT - 1) / kT, nrp = nrt * kT, steps = hd / kS;
  auto lo_of = [&](size_t p) { return window > 0 && p + 1 > window ? p + 1 - window : 0; };
  for (size_t i = 0; i < nrp; ++i) {
    const size_t p = pos0 + (i % np) * step;
    w.pv[i] = i < nr ? static_cast<int32_t>(std::min(kv_len - 1, p)) : -1;  // padding: nothing
    w.lov[i] = i < nr ? static_cast<int32_t>(lo_of(p)) : 0;
    w.m[i] = -kInf;
    w.l[i] = 0.0f;
    w.bad[i] = 0.0f;
  }
  // Per row tile: the union [ulo, uhi) of its rows' positions and their intersection [ilo, ihi) (empty with
  // padding rows: such a tile always masks).
  size_t ulo[kMaxRowTiles], uhi[kMaxRowTiles], ilo[kMaxRowTiles], ihi[kMaxRowTiles];
  size_t lo_min = kv_len, hi_max = 0;
  for (size_t rt = 0; rt < nrt; ++rt) {
    ulo[rt] = kv_len;
    uhi[rt] = 0;
    ilo[rt] = 0;
    ihi[rt] = kv_len;
    for (size_t i = rt * kT; i < rt * kT + kT; ++i) {
      const size_t lo = static_cast<size_t>(w.lov[i]), hi = static_cast<size_t>(w.pv[i] + 1);
      if (i < nr) {
        ulo[rt] = std::min(ulo[rt], lo);
        uhi[rt] = std::max(uhi[rt], hi);
      }
      ilo[rt] = std::max(ilo[rt], lo);
      ihi[rt] = std::min(ihi[rt], hi);
    }
    lo_min = std::min(lo_min, ulo[rt]);
    hi_max = std::max(hi_max, uhi[rt]);
  }
  PackQ(q, qs, np, nr, hd, w.qb);
  std::fill_n(w.acc, nrp * 2 * hd, 0.0f);

  // Tiles at multiples of kPos positions (fixed: a row's sums do not depend on the pass).
  for (size_t t0 = lo_min / T_ * T_; t0 < hi_max; t0 += T_) {
    const size_t tn = std::min(T_, hi_max - t0);
    PackK(k + static_cast<ptrdiff_t>(t0) * kvs, kvs, tn, hd, w.kt);
    PackVT(v + static_cast<ptrdiff_t>(t0) * kvs, kvs, tn, hd, w.vt);
    // The row tiles that see this tile of positions, in pairs. Per pair, the softmax (its scores at sm, sc buffer
    // p % 2), whose vectors run beside the tile unit's job (TileJob): the previous pair's value products and the
    // next pair's scores, issued a few steps per step of weights. The first pair's scores run alone at the start
    // of the tile of positions, the last pair's value products at its end (the next one repacks K and V). A pair
    // works on the positions [0, tn_of(p)) that some row of it sees (its rows' weights past them would be 0).
    size_t list[kMaxRowTiles], cnt = 0;
    for (size_t rt = 0; rt < nrt; ++rt)
      if (ulo[rt] < t0 + tn && uhi[rt] > t0) list[cnt++] = rt;  // some row of it sees this tile
    const size_t pairs = (cnt + 1) / 2;
    auto tn_of = [&](size_t p) {
      size_t hi = uhi[list[2 * p]];
      if (2 * p + 1 < cnt) hi = std::max(hi, uhi[list[2 * p + 1]]);
      return std::min(tn, hi - t0);
    };
    auto scores_of = [&](size_t p, TileJob& j) {  // pair p's scores as j's score part
      j.kt = w.kt;
      j.qb = w.qb;
      j.nt = std::min<size_t>(2, cnt - 2 * p);
      for (size_t t = 0; t < j.nt; ++t) j.rts[t] = list[2 * p + t];
      j.groups = (tn_of(p) + kT - 1) / kT;
      j.qsteps = steps;
      j.g = 0;
      j.sm = w.sm + (p % 2) * kPos * 2 * kT;
      j.sc = w.sc + (p % 2) * kPos * 2 * kT;
    };
    TileJob job;
    if (pairs > 0) {
      scores_of(0, job);
      TileRun(job, job.Left());
    }
    for (size_t p = 0; p < pairs; ++p) {
      const size_t n = std::min<size_t>(2, cnt - 2 * p), tnp = tn_of(p), vsteps = (tnp + kS - 1) / kS;
      if (p + 1 < pairs) scores_of(p + 1, job);
      else job.groups = 0;
      const size_t per = (job.Left() + n * vsteps - 1) / (n * vsteps);
      float* sm = w.sm + (p % 2) * kPos * 2 * kT;
      float* sc = w.sc + (p % 2) * kPos * 2 * kT;
      TileJob next;
      next.vt = w.vt;
      next.steps = vsteps;
      next.epairs = hd / kS;
      next.units = n * next.epairs;
      for (size_t t = 0; t < n; ++t) {
        const size_t rt = list[2 * p + t];
        // Positions [ca, cb) of the tile: every row of the row tile sees them (no mask test there).
        const size_t ca = std::min(std::max(ilo[rt], t0), t0 + tnp) - t0;
        const size_t cb = std::max(std::min(ihi[rt], t0 + tnp), t0 + ca) - t0;
        uint8_t* pt = w.pt + (2 * (p % 2) + t) * kVSteps * 2 * kTile;
        float* acc = w.acc + rt * 2 * hd * kT;
        bool rescale;
        if (softcap > 0)
          rescale = window > 0
                        ? Softmax<true, true>(w, rt, sm, sc, t * kT, t0, tnp, ca, cb, scale, softcap, pt, job, per)
                        : Softmax<true, false>(w, rt, sm, sc, t * kT, t0, tnp, ca, cb, scale, softcap, pt, job, per);
        else
          rescale = window > 0
                        ? Softmax<false, true>(w, rt, sm, sc, t * kT, t0, tnp, ca, cb, scale, softcap, pt, job, per)
                        : Softmax<false, false>(w, rt, sm, sc, t * kT, t0, tnp, ca, cb, scale, softcap, pt, job, per);
        if (rescale) Rescale(acc, w.alpha + rt * kT, hd);
        next.pt[t] = pt;
        next.acc[t] = acc;
      }
      TileRun(job, job.Left());
      job = next;
    }
    TileRun(job, job.Left());
  }

  // out = (main + corr) / l, transposed back to rows; a sink adds e^(sink - m) to l (m: the row's final max).
  float* inv = w.alpha;
  for (size_t i = 0; i < nr; ++i) {
    const float sk = sinks ? sinks[i / np] : sink;
    inv[i] = 1.0f / (sk > -kInf ? w.l[i] + std::exp(sk - w.m[i]) : w.l[i]);
  }
  for (size_t rt = 0; rt < nrt; ++rt)
    for (size_t e = 0; e * kT < hd; ++e) {
      const float* a = w.acc + (rt * 2 * hd / kT + 2 * e) * kTileF;
      __m512 x[16];
      for (size_t m = 0; m < kT; ++m)
        x[m] = _mm512_add_ps(_mm512_load_ps(a + 16 * m), _mm512_load_ps(a + kTileF + 16 * m));
      Transpose16(x);  // x[j]: row rt * 16 + j's head elements e * 16 + [0, 16)
      for (size_t j = 0; j < kT && rt * kT + j < nr; ++j) {
        const size_t i = rt * kT + j;
        float* o = out + static_cast<ptrdiff_t>(i % np) * os + (i / np) * hd + e * kT;
        if (w.bad[i] != 0.0f) _mm512_storeu_ps(o, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
        else if (!(w.l[i] > 0.0f)) _mm512_storeu_ps(o, _mm512_setzero_ps());  // nothing to attend to
        else _mm512_storeu_ps(o, _mm512_mul_ps(x[j], _mm512_set1_ps(inv[i])));
      }
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
