// kiln/kernels/matmul/amx_bf16-inl.h - the GEMM of f16 and bf16 weights on Intel AMX bf16 tiles (AVX3_DL target,
// where core/amx.hpp finds AMX-BF16 usable; MatmulOptions::amx_bf16). Included from entry-inl.h only.
//
// C (M x N) = A (M x K f32) * B^T (N x K, f16 or bf16), every operand split into bf16 parts so that the
// products keep f32-class accuracy (the bound is in docs/kernels.md):
//   A = A_hi + A_lo: A_hi = bf16(a) (nearest even), A_lo = bf16(a - A_hi); |a - A_hi - A_lo| <= 2^-16 |a|.
//   bf16 B is exact. f16 B = B_hi + B_lo exactly: B_hi is b truncated to 8 significant bits, B_lo = b - B_hi
//   has at most 3 (f16 has 11; its subnormals are normal bf16 numbers), |B_lo| < 2^-7 |b|.
//   main = sum A_hi B_hi, corr = sum (A_lo B_hi [+ A_hi B_lo]) (the dropped A_lo B_lo is < 2^-15 |a b|), each
//   accumulated in f32 in tiles over all of K (TDPBF16PS: bf16 products exact in f32, RNE adds); C = main + corr.
//   Keeping the small corrections in tiles of their own leaves the long sum of the main products with K
//   roundings, as the f32 GEMM's, instead of 2K or 3K. A non-finite value in x or W makes its outputs NaN
//   (an infinity's remainder inf - inf is NaN, and its zero partner's product 0 * inf too), where the f32
//   GEMM gives an infinity or NaN.
// Layout: A is the tiles' A operand (16 rows x 32 k: rows of x as they are, converted once per call into
// 1 KiB tiles, hi then lo, per 16-row block and 32-k step); B the B operand (16 pairs of k x 16 columns,
// the pairs of each weight row interleaved), packed per (kNC rows, kKC k) block as BLIS packs B (the
// 16 x 16 transposes of the f32 GEMM's packing, on 32-bit pairs). Per 16 rows of x and 32 weight rows: 4
// accumulator tiles (main, corr for 2 x 16 columns), x hi / lo, 2 weight tiles. Between K blocks the
// accumulators go to a scratch and back (f32 stored and reloaded: the same sums as if they stayed).

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_MATMUL_AMX_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_MATMUL_AMX_BF16_INL_H_
#undef KILN_KERNELS_MATMUL_AMX_BF16_INL_H_
#else
#define KILN_KERNELS_MATMUL_AMX_BF16_INL_H_
#endif

#include <hwy/highway.h>

#include "kiln/kernels/x86/common.hpp"

#include "kiln/core/amx.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace mm {

#undef KILN_MM_HAVE_AMX_BF16
#if HWY_TARGET == HWY_AVX3_DL && KILN_AMX_X86
#define KILN_MM_HAVE_AMX_BF16 1

KILN_X86_DIAGNOSTICS_PUSH

namespace amxbf {

inline constexpr size_t kT = 16;         // rows of a tile; x rows and weight rows per tile
inline constexpr size_t kS = 32;         // k per step (bf16 per tile row)
inline constexpr size_t kTile = 1024;    // bytes per tile
inline constexpr size_t kKCs = 8;        // steps per K block (256 k): 32 weight rows' tiles, 32 KiB (f16), in L1
inline constexpr size_t kNCb = 256;      // weight rows per N block (the packed block: 256 KiB for f16, in L2)
inline constexpr size_t kPairCols = 32;  // weight rows per inner block (2 column tiles)

using ::kiln::detail::x86::TileConfig;

// Tiles 0..3: main, corr of column tile 0, main, corr of column tile 1; 4, 5: x hi, lo; 6, 7: weights.
// All are 16 rows of 64 bytes.
KILN_MM_AMXBF HWY_NOINLINE void Configure() {
  TileConfig c;
  std::memset(&c, 0, sizeof(c));
  c.palette = 1;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = kT;
    c.colsb[t] = 64;
  }
  ::kiln::detail::x86::LoadTileConfig(c);
}

KILN_MM_AMXBF HWY_NOINLINE void Release() { _tile_release(); }

// The low 16 bits of each f32 lane of v0 (lanes 0..15) and v1 (16..31) as bf16 words in order: the bf16 of
// an f32 that has no more bits than bf16 (truncated values, or their exact remainders).
KILN_MM_AMXBF HWY_INLINE __m512i UpperWords(__m512 v0, __m512 v1) {
  alignas(64) static constexpr uint16_t kIdx[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                                    33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  return _mm512_permutex2var_epi16(_mm512_castps_si512(v0), _mm512_load_si512(kIdx), _mm512_castps_si512(v1));
}

// bf16 (16 in a 256-bit vector) widened to f32.
KILN_MM_AMXBF HWY_INLINE __m512 WidenBf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// x rows [i0, i0 + 16) (those past m zero), k steps [0, steps): per step, the hi tile then the lo tile.
KILN_MM_AMXBF void ConvertX(const float* a, ptrdiff_t lda, size_t m, size_t i0, size_t k, size_t steps, uint8_t* dst) {
  for (size_t s = 0; s < steps; ++s) {
    uint8_t* hi = dst + s * 2 * kTile;
    uint8_t* lo = hi + kTile;
    const size_t p = s * kS, kv = HWY_MIN(kS, k - p);
    const __mmask16 m0 = static_cast<__mmask16>(kv >= 16 ? 0xFFFFu : (1u << kv) - 1u);
    const __mmask16 m1 = static_cast<__mmask16>(kv >= 32 ? 0xFFFFu : kv <= 16 ? 0u : (1u << (kv - 16)) - 1u);
    for (size_t r = 0; r < kT; ++r) {
      __m512i h = _mm512_setzero_si512(), l = _mm512_setzero_si512();
      if (i0 + r < m) {
        const float* row = a + static_cast<ptrdiff_t>(i0 + r) * lda + p;
        const __m512 a0 = _mm512_maskz_loadu_ps(m0, row), a1 = _mm512_maskz_loadu_ps(m1, row + 16);
        h = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(a1, a0));
        const __m512 h0 = WidenBf16(_mm512_castsi512_si256(h)), h1 = WidenBf16(_mm512_extracti64x4_epi64(h, 1));
        l = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_sub_ps(a1, h1), _mm512_sub_ps(a0, h0)));
      }
      _mm512_store_si512(hi + 64 * r, h);
      _mm512_store_si512(lo + 64 * r, l);
    }
  }
}

// 16 vectors of 16 32-bit words transposed (mm::Transpose on the bits).
HWY_INLINE void TransposeWords(__m512i* w) {
  VF v[16];
  for (size_t i = 0; i < 16; ++i) v[i].raw = _mm512_castsi512_ps(w[i]);
  Transpose(v);
  for (size_t i = 0; i < 16; ++i) w[i] = _mm512_castps_si512(v[i].raw);
}

// Weight rows [j0, j0 + 16) (those past n zero), k [p, p + 32) (past k zero) as B tiles: row q of a tile is
// the pairs (2q, 2q + 1) of the 16 rows. f16: hi and lo tiles; bf16: one tile.
template <class Src>
KILN_MM_AMXBF HWY_INLINE void PackWStep(const Src& B, size_t n, size_t k, size_t j0, size_t p, uint8_t* dst) {
  using TB = std::remove_cv_t<std::remove_pointer_t<decltype(B.at(0, 0))>>;
  const size_t kv = HWY_MIN(kS, k - p);
  const __mmask32 mk = kv >= 32 ? 0xFFFFFFFFu : static_cast<__mmask32>((1u << kv) - 1u);
  __m512i hi[16], lo[16];
  for (size_t r = 0; r < kT; ++r) {
    if (j0 + r >= n) {
      hi[r] = lo[r] = _mm512_setzero_si512();
      continue;
    }
    const __m512i raw = _mm512_maskz_loadu_epi16(mk, B.at(j0 + r, p));
    if constexpr (std::is_same_v<TB, hwy::bfloat16_t>) {
      hi[r] = raw;
    } else {
      const __m512 f0 = _mm512_cvtph_ps(_mm512_castsi512_si256(raw));
      const __m512 f1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(raw, 1));
      const __m512 keep = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
      const __m512 t0 = _mm512_and_ps(f0, keep), t1 = _mm512_and_ps(f1, keep);
      hi[r] = UpperWords(t0, t1);
      lo[r] = UpperWords(_mm512_sub_ps(f0, t0), _mm512_sub_ps(f1, t1));
    }
  }
  TransposeWords(hi);
  for (size_t q = 0; q < kT; ++q) _mm512_store_si512(dst + 64 * q, hi[q]);
  if constexpr (!std::is_same_v<TB, hwy::bfloat16_t>) {
    TransposeWords(lo);
    for (size_t q = 0; q < kT; ++q) _mm512_store_si512(dst + kTile + 64 * q, lo[q]);
  }
}

// One 16-row block of x against 32 weight rows over `steps` steps. xb: the block's tiles of this K block
// (2 per step); wb: the pair's (per step: column tile 0's hi [lo], then column tile 1's); cs: the 4
// accumulators (main0, corr0, main1, corr1) in, unless first, and out. (Software prefetches of the next
// block's x tiles and accumulators made it slower: they evict the weights from L1.)
template <bool kF16>
KILN_MM_AMXBF HWY_NOINLINE void Block(const uint8_t* xb, const uint8_t* wb, size_t steps, float* cs, bool first) {
  constexpr size_t kW = kF16 ? 2 : 1;  // weight tiles per column tile and step
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
    const uint8_t* x = xb + s * 2 * kTile;
    const uint8_t* w = wb + s * 2 * kW * kTile;
    _tile_loadd(4, x, 64);
    _tile_loadd(5, x + kTile, 64);
    if constexpr (kF16) {
      _tile_loadd(6, w, 64);
      _tile_loadd(7, w + kTile, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(1, 5, 6);
      _tile_loadd(6, w + 2 * kTile, 64);
      _tile_loadd(7, w + 3 * kTile, 64);
      _tile_dpbf16ps(2, 4, 6);
      _tile_dpbf16ps(3, 4, 7);
      _tile_dpbf16ps(3, 5, 6);
    } else {
      _tile_loadd(6, w, 64);
      _tile_loadd(7, w + kTile, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 5, 6);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, cs, 64);
  _tile_stored(1, cs + 256, 64);
  _tile_stored(2, cs + 512, 64);
  _tile_stored(3, cs + 768, 64);
}

// C rows [i0, i0 + mr), columns [j0, j0 + nc) (nc <= 32) = [C +] main + corr from the 4 accumulators.
KILN_MM_AMXBF HWY_INLINE void Finish(const float* cs, float* c, ptrdiff_t ldc, size_t mr, size_t nc, bool accumulate) {
  for (size_t t = 0; t < 2 && 16 * t < nc; ++t) {
    const size_t cols = HWY_MIN(size_t{16}, nc - 16 * t);
    const __mmask16 mask = static_cast<__mmask16>(cols == 16 ? 0xFFFFu : (1u << cols) - 1u);
    const float* mainp = cs + 512 * t;
    for (size_t r = 0; r < mr; ++r) {
      __m512 v = _mm512_add_ps(_mm512_load_ps(mainp + 16 * r), _mm512_load_ps(mainp + 256 + 16 * r));
      float* out = c + static_cast<ptrdiff_t>(r) * ldc + 16 * t;
      if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), v);
      _mm512_mask_storeu_ps(out, mask, v);
    }
  }
}

template <class Src>
KILN_MM_AMXBF void Gemm(const float* a, ptrdiff_t lda, const Src& B, float* c, ptrdiff_t ldc, size_t m, size_t n,
                        size_t k, bool accumulate) {
  using TB = std::remove_cv_t<std::remove_pointer_t<decltype(B.at(0, 0))>>;
  constexpr bool kF16 = !std::is_same_v<TB, hwy::bfloat16_t>;
  constexpr size_t kW = kF16 ? 2 : 1;
  const size_t steps = (k + kS - 1) / kS, blocks = (m + kT - 1) / kT;
  // Scratch (the f32 GEMM's slots: this path replaces it): x's tiles, the packed weight block, the
  // accumulators of an N block between K blocks.
  auto* xt = static_cast<uint8_t*>(detail::matmul_scratch(0, blocks * steps * 2 * kTile));
  constexpr size_t kKC = kKCs;
  auto* wp = static_cast<uint8_t*>(detail::matmul_scratch(1, kNCb / kT * kKC * kW * kTile));
  const size_t pairs_max = HWY_MIN(kNCb, (n + kPairCols - 1) / kPairCols * kPairCols) / kPairCols;
  auto* cs = static_cast<float*>(detail::matmul_scratch(2, blocks * pairs_max * 4 * kTile));
  for (size_t b = 0; b < blocks; ++b) ConvertX(a, lda, m, b * kT, k, steps, xt + b * steps * 2 * kTile);
  Configure();
  ::kiln::detail::amx_gemm_calls().fetch_add(1, std::memory_order_relaxed);
  for (size_t nb = 0; nb < n; nb += kNCb) {
    const size_t nn = HWY_MIN(kNCb, n - nb), pairs = (nn + kPairCols - 1) / kPairCols;
    for (size_t s0 = 0; s0 < steps; s0 += kKC) {
      const size_t ks = HWY_MIN(kKC, steps - s0);
      const bool first = s0 == 0, last = s0 + ks == steps;
      // The block's weights: per pair of column tiles, per step, tile 0's then tile 1's.
      for (size_t pr = 0; pr < pairs; ++pr)
        for (size_t s = 0; s < ks; ++s)
          for (size_t t = 0; t < 2; ++t)
            PackWStep(B, n, k, nb + pr * kPairCols + t * kT, (s0 + s) * kS, wp + ((pr * ks + s) * 2 + t) * kW * kTile);
      for (size_t pr = 0; pr < pairs; ++pr) {
        const uint8_t* wb = wp + pr * ks * 2 * kW * kTile;
        for (size_t b = 0; b < blocks; ++b) {
          float* acc = cs + (b * pairs_max + pr) * 1024;
          Block<kF16>(xt + (b * steps + s0) * 2 * kTile, wb, ks, acc, first);
          if (last) {
            const size_t j0 = nb + pr * kPairCols;
            Finish(acc, c + static_cast<ptrdiff_t>(b * kT) * ldc + static_cast<ptrdiff_t>(j0), ldc,
                   HWY_MIN(kT, m - b * kT), HWY_MIN(kPairCols, n - j0), accumulate);
          }
        }
      }
    }
  }
  Release();
}

}  // namespace amxbf

KILN_X86_DIAGNOSTICS_POP

#else
#define KILN_MM_HAVE_AMX_BF16 0
#endif  // HWY_TARGET == HWY_AVX3_DL

}  // namespace mm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
