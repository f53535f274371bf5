// kiln/ops/qmatmul_amx_gemm-inl.h - qmatmul's GEMM kernel on Intel AMX int8 tiles (AVX3_DL target, where
// core/amx.hpp finds the tile unit usable). Included from qmatmul-inl.h only, after qmatmul_vnni_gemm-inl.h:
// it takes that file's panels (16 rows of W decoded to unsigned bytes, 4-byte steps interleaved: exactly
// the layout of a B tile of 16 columns) and replaces its register-blocked vpdpbusd kernel.
//
// Per sum group and 16 rows of x: C (16 x 16 int32) = A (16 rows x 16 activation bytes, signed) . B (the
// panel's 4 steps, unsigned) by tdpbsud, once per run of 16 bytes (a group is one or two runs: in the
// activation's physical order the 32-value blocks interleave four groups' runs in 128 bytes, so K = 16 per
// tile product is the widest that keeps each group's sum apart without re-laying out x). The tile sums are
// exact int32 sums, so the accumulator the VNNI kernel ends a group with is C + ginit (pinit) mod 2^32, bit
// for bit; the f32 epilogue below is the VNNI kernel's, op for op and in the same order per output, so the
// results are bit-identical to GemmVnni's (tests/ops/test_qmatmul_amx.cpp checks it).

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_OPS_QMATMUL_AMX_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_OPS_QMATMUL_AMX_GEMM_INL_H_
#undef KILN_OPS_QMATMUL_AMX_GEMM_INL_H_
#else
#define KILN_OPS_QMATMUL_AMX_GEMM_INL_H_
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

namespace amx {
#undef KILN_QMM_AMX
#define KILN_QMM_AMX __attribute__((target(HWY_TARGET_STR ",avx512vnni,amx-tile,amx-int8")))
using vnni::Panel;
using vnni::RowPrefetch;
inline constexpr size_t kMT = 16;  // rows of x per tile product
inline constexpr size_t kGC = 8;   // sum groups per chunk of stored tile sums (16 KiB for two panels)
struct Ctx {
  const int8_t* tail;  // the last m % kMT rows' quants, zero-padded to kMT rows of kp bytes
  int32_t* cbuf;       // kGC x 2 tiles of 16 x 16 int32
  float* fbuf;         // 2 x kMT x 16 f32 accumulators
};

using vnni::GroupOffset;
using vnni::kNR;
using vnni::PairGroupStep;
using vnni::PairMinStep;

// The tile configuration (palette 1), written field by field into a zeroed, 64-byte aligned struct.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "AMX tile configuration is 64 bytes");

// Tiles: 0, 1 the sums of panels 0 and 1 (even groups), 6, 7 (odd groups); 2, 3 the activation runs of
// even and odd groups; 4, 5 the two panels' runs.
KILN_QMM_AMX HWY_NOINLINE void Configure() {
  TileConfig c;
  std::memset(&c, 0, sizeof(c));
  c.palette = 1;
  for (int t : {0, 1, 6, 7}) {
    c.rows[t] = kMT;
    c.colsb[t] = 64;
  }
  for (int t : {2, 3}) {
    c.rows[t] = kMT;
    c.colsb[t] = 16;
  }
  for (int t : {4, 5}) {
    c.rows[t] = 4;
    c.colsb[t] = 64;
  }
  // Not _tile_loadconfig: GCC 12's builtin does not tell the optimizer it reads the struct, so the stores
  // above were dropped (ldtilecfg of an all-zero-but-palette config; the first tile instruction then faults).
  __asm__ volatile("ldtilecfg %0" : : "m"(c));
}

KILN_QMM_AMX HWY_NOINLINE void Release() { _tile_release(); }

// Scratch slot 5 for the AMX kernel, the tail rows copied, and the tile configuration loaded.
inline Ctx Prepare(const QActLayout& L, const uint8_t* act, size_t m) {
  const size_t tail_bytes = kMT * L.kp, cbytes = kGC * 2 * 256 * sizeof(int32_t);
  auto* s = static_cast<uint8_t*>(::kiln::detail::qmm_scratch(5, tail_bytes + cbytes + 2 * kMT * 16 * sizeof(float)));
  const size_t mt = m % kMT, i0 = m - mt;
  std::memset(s, 0, tail_bytes);
  for (size_t i = 0; i < mt; ++i) std::memcpy(s + i * L.kp, act + (i0 + i) * L.row_bytes, L.kp);
  Configure();
  ::kiln::detail::amx_gemm_calls().fetch_add(1, std::memory_order_relaxed);
  return Ctx{reinterpret_cast<const int8_t*>(s), reinterpret_cast<int32_t*>(s + tail_bytes),
             reinterpret_cast<float*>(s + tail_bytes + cbytes)};
}

// One group's tile products into cb (kP blocks of 16 x 16 int32), on tiles c0, c1 (sums) and ta (x); GCC's
// tile intrinsics are macros that paste the tile number into the instruction, hence a macro here too.
#define KILN_AMX_GROUP_TILES(c0, c1, ta)                   \
  do {                                                     \
    _tile_zero(c0);                                        \
    if constexpr (kP == 2) _tile_zero(c1);                 \
    for (size_t run = 0; run < kRuns; ++run) {             \
      const size_t ob = o + run * kRun2;                   \
      _tile_loadd(ta, q0 + ob, static_cast<long>(lda));    \
      _tile_loadd(4, P[0].u + 16 * ob, 64);                \
      _tile_dpbsud(c0, ta, 4);                             \
      if constexpr (kP == 2) {                             \
        _tile_loadd(5, P[1].u + 16 * ob, 64);              \
        _tile_dpbsud(c1, ta, 5);                           \
      }                                                    \
    }                                                      \
    _tile_stored(c0, cb, 64);                              \
    if constexpr (kP == 2) _tile_stored(c1, cb + 256, 64); \
  } while (0)

template <size_t kP, int kLayout, bool kOdd>
KILN_QMM_AMX HWY_INLINE void GroupTiles(const Panel* P, const int8_t* q0, size_t lda, size_t g, int32_t* cb) {
  constexpr size_t kRun2 = kLayout == 0 ? 64 : 16;
  constexpr size_t kRuns = kLayout != 2 ? 2 : 1;
  const size_t o = GroupOffset<kLayout>(g);
  if constexpr (kOdd) KILN_AMX_GROUP_TILES(6, 7, 3);
  else KILN_AMX_GROUP_TILES(0, 1, 2);
}
#undef KILN_AMX_GROUP_TILES

// kMT rows of x (a[i] for i >= the valid rows repeat a valid one; their outputs are dropped) against kP
// panels: per chunk of up to kGC groups, the tile sums into cbuf, then the VNNI kernel's epilogue with the
// f32 accumulators of 8 rows in registers (kept in fbuf between chunks).
template <size_t kP, int kLayout, bool kMin, bool kPairs>
KILN_QMM_AMX HWY_NOINLINE void Block(const Panel* P, const int8_t* q0, size_t lda, const ActRow* a, size_t groups,
                                     size_t dx_shift, int32_t* cbuf, float* fbuf) {
  const __m512 magic = _mm512_set1_ps(::kiln::detail::kQmmMagicF);
  for (size_t i = 0; i < kP * kMT * 16; i += 16) _mm512_store_ps(fbuf + i, _mm512_setzero_ps());
  for (size_t g0 = 0; g0 < groups; g0 += kGC) {
    const size_t gn = HWY_MIN(kGC, groups - g0);
    size_t gc = 0;
    for (; gc + 2 <= gn; gc += 2) {
      GroupTiles<kP, kLayout, false>(P, q0, lda, g0 + gc, cbuf + gc * kP * 256);
      GroupTiles<kP, kLayout, true>(P, q0, lda, g0 + gc + 1, cbuf + (gc + 1) * kP * 256);
    }
    if (gc < gn) GroupTiles<kP, kLayout, false>(P, q0, lda, g0 + gc, cbuf + gc * kP * 256);
    for (size_t p = 0; p < kP; ++p) {
      for (size_t i0 = 0; i0 < kMT; i0 += 8) {
        float* fb = fbuf + (p * kMT + i0) * 16;
        __m512 f[8];
        for (size_t i = 0; i < 8; ++i) f[i] = _mm512_load_ps(fb + 16 * i);
        for (size_t gc2 = 0; gc2 < gn; ++gc2) {
          const size_t g = g0 + gc2;
          const int32_t* cb = cbuf + (gc2 * kP + p) * 256 + i0 * 16;
          const __m512 dwv = _mm512_load_ps(P[p].dw + 16 * g);
          const ActRow* ai = a + i0;
          if constexpr (kPairs) {
            for (size_t i = 0; i < 8; i += 2) {
              const __m512i ax = _mm512_add_epi32(_mm512_load_si512(cb + 16 * i), _mm512_set1_epi32(ai[i].ginit[g]));
              const __m512i ar =
                  _mm512_add_epi32(_mm512_load_si512(cb + 16 * (i + 1)), _mm512_set1_epi32(ai[i + 1].pinit[g]));
              f[i] = PairGroupStep(f[i], ax, ar, ai[i + 1].pshift[g], dwv, ai[i + 1].dx[g >> dx_shift]);
            }
            if constexpr (kMin) {
              const __m512 dmv = _mm512_load_ps(P[p].dm + 16 * g);
              for (size_t i = 0; i < 8; i += 2) f[i] = PairMinStep(f[i], dmv, ai[i].gdxs[g], ai[i + 1].gdxs[g]);
            }
          } else {
            for (size_t i = 0; i < 8; ++i) {
              const __m512i acc = _mm512_add_epi32(_mm512_load_si512(cb + 16 * i), _mm512_set1_epi32(ai[i].ginit[g]));
              const __m512 t = _mm512_sub_ps(_mm512_castsi512_ps(acc), magic);
              f[i] = _mm512_fmadd_ps(t, _mm512_mul_ps(dwv, _mm512_set1_ps(ai[i].dx[g >> dx_shift])), f[i]);
            }
            if constexpr (kMin) {
              const __m512 dmv = _mm512_load_ps(P[p].dm + 16 * g);
              for (size_t i = 0; i < 8; ++i) f[i] = _mm512_fmadd_ps(dmv, _mm512_set1_ps(ai[i].gdxs[g]), f[i]);
            }
          }
        }
        for (size_t i = 0; i < 8; ++i) _mm512_store_ps(fb + 16 * i, f[i]);
      }
    }
  }
}

template <int kLayout, bool kMin>
KILN_QMM_AMX void Rows(const Ctx& c, const Panel* P, size_t np, const QActLayout& L, const uint8_t* act, size_t m,
                       size_t groups, size_t dx_shift, float* y, ptrdiff_t ldy, size_t nn, RowPrefetch& pf,
                       bool pairs) {
  const size_t blocks = (m + kMT - 1) / kMT, per_call = (pf.left + blocks - 1) / HWY_MAX(blocks, size_t{1});
  ActRow a[kMT];
  for (size_t i0 = 0; i0 < m; i0 += kMT) {
    pf.Step(per_call);
    const size_t mr = HWY_MIN(kMT, m - i0);
    for (size_t i = 0; i < kMT; ++i) a[i] = GetActRow(act + (i0 + HWY_MIN(i, mr - 1)) * L.row_bytes, L);
    const bool tail = mr < kMT;  // its rows' bytes were copied into c.tail, zero-padded to kMT rows
    const int8_t* q0 = tail ? c.tail : a[0].q;
    const size_t lda = tail ? L.kp : L.row_bytes;
    auto run = [&](auto pv, auto kpv) {
      constexpr bool kPairs = decltype(pv)::value;
      constexpr size_t kP = decltype(kpv)::value;
      Block<kP, kLayout, kMin, kPairs>(P, q0, lda, a, groups, dx_shift, c.cbuf, c.fbuf);
    };
    if (pairs) {
      if (np == 2) run(std::true_type{}, std::integral_constant<size_t, 2>{});
      else run(std::true_type{}, std::integral_constant<size_t, 1>{});
    } else {
      if (np == 2) run(std::false_type{}, std::integral_constant<size_t, 2>{});
      else run(std::false_type{}, std::integral_constant<size_t, 1>{});
    }
    // Row i of the block (pairs: every other row, pair i / 2) to y; columns [0, nn) of the panels.
    const size_t step = pairs ? 2 : 1;
    for (size_t p = 0; p < np; ++p) {
      const size_t ncols = p * kNR < nn ? HWY_MIN(kNR, nn - p * kNR) : 0;
      const __mmask16 mask = static_cast<__mmask16>((1u << ncols) - 1u);
      for (size_t i = 0; i < mr; i += step) {
        const size_t yr = (i0 + i) / step;
        _mm512_mask_storeu_ps(y + static_cast<ptrdiff_t>(yr) * ldy + static_cast<ptrdiff_t>(p * kNR), mask,
                              _mm512_load_ps(c.fbuf + (p * kMT + i) * 16));
      }
    }
  }
}

}  // namespace amx

HWY_DIAGNOSTICS(pop)

#endif  // HWY_TARGET == HWY_AVX3_DL

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
