// kiln/kernels/qmatmul/x86/amx_gemm-inl.h - qmatmul's GEMM kernel on Intel AMX int8 tiles (AVX3_DL target, where
// core/amx.hpp finds the tile unit usable). Included from entry-inl.h only, after vnni_gemm-inl.h:
// it takes that file's panels (16 rows of W decoded to unsigned bytes, 4-byte steps of the 16 rows
// interleaved) and replaces its register-blocked vpdpbusd kernel.
//
// One tile product per sum group (K = the group's 32 bytes; Q6_K: 16), so that each group's exact int32 sum
// comes out of the tiles on its own. For that the group's bytes must be contiguous on both sides:
// - x: once per call, every block of 16 rows is repacked group by group, [group][16 rows][32 bytes] (an A
//   tile with stride 32), with the per-row scalars the epilogue needs (dx, gdxs, pshift) next to it;
// - W: each panel is copied into the same group order, [group][8 steps][16 columns x 4 bytes] (a B tile);
//   for types without a min (Q4_0, Q5_0, Q8_0, Q6_K) the copy subtracts the offset, so the weights are the
//   signed quants and tdpbssd gives the group's sum q . x itself (the integer the VNNI kernel's start value
//   ginit corrects to); types with a min keep their unsigned quants (offset 0) and tdpbsud.
// The sums go through a ring of stored tiles to the f32 epilogue, which runs kLag groups behind the tile
// products so that no vector load waits on its tile store (a tile store itself takes port 5 about one cycle
// per row, so the stores and the epilogue's vector ops share ports 0 and 5: docs/kernels.md). The epilogue
// is the VNNI kernel's, op for op and in the same order per output (cvtdq2ps of the exact sum gives the
// float its magic-number conversion gives, |sum| < 2^22), so the results are bit-identical to GemmVnni's
// (tests/ops/test_qmatmul_amx.cpp checks it). The f32 accumulators of a block (16 rows x 16 columns, or 8
// pairs x 32 columns) stay in registers for all groups.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_QMATMUL_X86_AMX_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_QMATMUL_X86_AMX_GEMM_INL_H_
#undef KILN_KERNELS_QMATMUL_X86_AMX_GEMM_INL_H_
#else
#define KILN_KERNELS_QMATMUL_X86_AMX_GEMM_INL_H_
#endif

#include <hwy/highway.h>

#include "kiln/kernels/x86/common.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {

#if HWY_TARGET == HWY_AVX3_DL

KILN_X86_DIAGNOSTICS_PUSH

namespace amx {
using vnni::GroupOffset;
using vnni::kNR;
using vnni::Panel;
using vnni::RowPrefetch;
inline constexpr size_t kMT = 16;   // rows of x per tile product
inline constexpr size_t kRing = 8;  // stored tile sums in flight (slots of 2 tiles)
inline constexpr size_t kLag = 3;   // groups between a group's tile products and its epilogue (< kRing)

// The call's state: x repacked (per block of kMT rows: quants [groups][kMT][gb], then per group kMT dx, kMT
// gdxs, kMT pshift; pairs: 8 each, one per pair), the two panels in group order, the ring of tile sums.
struct Ctx {
  const uint8_t* xb;  // blocks of block_bytes
  size_t block_bytes, groups, gb;
  int8_t* wq[2];  // group-ordered panels (16 gb bytes per group)
  int32_t* cbuf;  // kRing x 2 tiles of 16 x 16 int32
};

using ::kiln::detail::x86::TileConfig;

// Tiles: 0, 1 the sums of panels 0 and 1 (even groups), 2, 3 (odd groups); 4, 5 x (even, odd groups);
// 6, 7 the two panels. gb: bytes per sum group (32, or 16 for Q6_K).
KILN_QMM_AMX HWY_NOINLINE void Configure(size_t gb) {
  TileConfig c;
  std::memset(&c, 0, sizeof(c));
  c.palette = 1;
  for (int t : {0, 1, 2, 3}) {
    c.rows[t] = kMT;
    c.colsb[t] = 64;
  }
  for (int t : {4, 5}) {
    c.rows[t] = kMT;
    c.colsb[t] = static_cast<uint16_t>(gb);
  }
  for (int t : {6, 7}) {
    c.rows[t] = static_cast<uint8_t>(gb / 4);
    c.colsb[t] = 64;
  }
  ::kiln::detail::x86::LoadTileConfig(c);
}

KILN_QMM_AMX HWY_NOINLINE void Release() { _tile_release(); }

// Per block: quants, then dx, gdxs (f32) and pshift (int32) of kMT slots per group.
inline size_t BlockBytes(size_t groups, size_t gb) { return groups * (kMT * gb + 3 * kMT * 4); }

// Block b of x (rows [16 b, 16 b + 16), those past m zero) into its repacked form at dst.
template <int kLayout>
KILN_QMM_AMX void RepackBlock(const QActLayout& L, const uint8_t* act, size_t m, size_t b, size_t groups,
                              size_t dx_shift, bool pairs, uint8_t* dst) {
  constexpr size_t gb = kLayout == 2 ? 16 : 32;
  int8_t* q = reinterpret_cast<int8_t*>(dst);
  float* sdx = reinterpret_cast<float*>(dst + groups * kMT * gb);
  float* sgd = sdx + groups * kMT;
  int32_t* ssh = reinterpret_cast<int32_t*>(sgd + groups * kMT);
  std::memset(sdx, 0, groups * kMT * 12);
  const size_t i0 = b * kMT, mr = HWY_MIN(kMT, m - i0);
  const int8_t* qrow[kMT];
  for (size_t i = 0; i < mr; ++i) qrow[i] = GetActRow(act + (i0 + i) * L.row_bytes, L).q;
  // Group by group, so that the stores run through dst in order (row by row they went 512 bytes apart, each
  // to another line, and waited on the lines' fetches).
  for (size_t g = 0; g < groups; ++g) {
    int8_t* d = q + g * kMT * gb;
    for (size_t i = 0; i < mr; ++i, d += gb) {
      const int8_t* src = qrow[i] + GroupOffset<kLayout>(g);
      if constexpr (kLayout == 0) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 16),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 64)));
      } else if constexpr (kLayout == 1) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
      } else {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
      }
    }
    if (mr < kMT) std::memset(d, 0, (kMT - mr) * gb);
  }
  for (size_t i = 0; i < mr; ++i) {
    const ActRow a = GetActRow(act + (i0 + i) * L.row_bytes, L);
    if (!pairs) {
      for (size_t g = 0; g < groups; ++g) {
        sdx[g * kMT + i] = a.dx[g >> dx_shift];
        sgd[g * kMT + i] = a.gdxs[g];
      }
    } else if (i % 2 == 1) {  // the residual row of pair i / 2: its scale and shift, both rows' min terms
      const ActRow ax = GetActRow(act + (i0 + i - 1) * L.row_bytes, L);
      for (size_t g = 0; g < groups; ++g) {
        sdx[g * kMT + i / 2] = a.dx[g >> dx_shift];
        sgd[g * kMT + i / 2] = ax.gdxs[g] + a.gdxs[g];
        ssh[g * kMT + i / 2] = a.pshift[g];
      }
    }
  }
}

// The repacked form's geometry for a layout: sum groups per row, bytes per group, groups per dx, layout.
struct Geometry {
  size_t groups, gb, dx_shift, block_bytes;
  int layout;
};
inline Geometry GetGeometry(const QActLayout& L) {
  const bool kq = ::kiln::detail::qmm_is_kquant(L.type);
  Geometry g;
  g.layout = !kq ? 0 : (L.type == ::kiln::ggml_type_id::Q6_K ? 2 : 1);
  g.groups = kq ? L.ns : L.k / 32;
  g.gb = g.layout == 2 ? 16 : 32;
  g.dx_shift = !kq ? 0 : (L.sg == 16 ? 4 : 3);  // sum groups per dx: 1, 8 or 16
  g.block_bytes = BlockBytes(g.groups, g.gb);
  return g;
}

// Blocks [b0, b1) of x (m rows in all) repacked into dst (block b at dst + b * block_bytes).
inline void RepackBlocks(const QActLayout& L, const uint8_t* act, size_t m, size_t b0, size_t b1, bool pairs,
                         uint8_t* dst) {
  const Geometry G = GetGeometry(L);
  for (size_t b = b0; b < b1; ++b) {
    uint8_t* d = dst + b * G.block_bytes;
    if (G.layout == 0) RepackBlock<0>(L, act, m, b, G.groups, G.dx_shift, pairs, d);
    else if (G.layout == 1) RepackBlock<1>(L, act, m, b, G.groups, G.dx_shift, pairs, d);
    else RepackBlock<2>(L, act, m, b, G.groups, G.dx_shift, pairs, d);
  }
}

// The call's state with the tile configuration loaded: x repacked here (scratch slot 5, with the panels'
// copies and the tile sums after it), or, where `repacked` is given, already repacked by the caller
// (RepackBlocks of these m rows: qmatmul_multi shares one repack among its outputs and threads).
inline Ctx Prepare(const QActLayout& L, const uint8_t* act, size_t m, bool pairs, const uint8_t* repacked) {
  const Geometry G = GetGeometry(L);
  Ctx c;
  c.groups = G.groups;
  c.gb = G.gb;
  c.block_bytes = G.block_bytes;
  const size_t blocks = (m + kMT - 1) / kMT, wbytes = kNR * G.groups * G.gb;
  const size_t xbytes = repacked ? 0 : blocks * G.block_bytes;
  const size_t cbytes = kRing * 2 * 256 * sizeof(int32_t);
  auto* s = static_cast<uint8_t*>(::kiln::detail::qmm_scratch(5, xbytes + 2 * wbytes + cbytes));
  if (!repacked) RepackBlocks(L, act, m, 0, blocks, pairs, s);
  c.xb = repacked ? repacked : s;
  c.wq[0] = reinterpret_cast<int8_t*>(s + xbytes);
  c.wq[1] = c.wq[0] + wbytes;
  c.cbuf = reinterpret_cast<int32_t*>(s + xbytes + 2 * wbytes);
  Configure(c.gb);
  ::kiln::detail::amx_gemm_calls().fetch_add(1, std::memory_order_relaxed);
  return c;
}

// A panel's quants in group order (layout 0: a group's two runs of 4 steps, 1 KiB apart in the panel, made
// adjacent), minus the type's offset where it has no min. Layout 1 (Q4_K, Q5_K: a group is 8 adjacent
// steps, and both types have a min) is used in place.
template <int kLayout, bool kSigned>
KILN_QMM_AMX const int8_t* GroupOrder(const Panel& P, size_t groups, int offset, int8_t* dst) {
  if constexpr (kLayout == 1 && !kSigned) {
    (void)groups;
    (void)offset;
    (void)dst;
    return reinterpret_cast<const int8_t*>(P.u);
  } else {
    constexpr size_t gsteps = kLayout == 2 ? 4 : 8;
    const __m512i off = _mm512_set1_epi8(static_cast<char>(kSigned ? offset : 0));
    for (size_t g = 0; g < groups; ++g) {
      const size_t o = GroupOffset<kLayout>(g);
      for (size_t s = 0; s < gsteps; ++s) {
        const size_t ob = kLayout == 0 ? o + (s / 4) * 64 + 4 * (s % 4) : o + 4 * s;
        const __m512i v = _mm512_load_si512(P.u + 16 * ob);
        _mm512_store_si512(dst + 64 * (gsteps * g + s), kSigned ? _mm512_sub_epi8(v, off) : v);
      }
    }
    return dst;
  }
}

// Rows [j, j + 16) of 16-row interleaved W (32-value block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) straight into
// the group-ordered form, and their coefficients into P.dw (P.dm): the bytes GroupOrder makes of
// PackPanelX16's panel (the same decode; step s of block b lands at step s of group b, a 4-bit type's high
// nibbles at step 4 + s), without the panel in between (PackPanelX16 then GroupOrder was ~5% of a 128-token
// SmolLM2 prompt, half of it the copy).
template <class B, bool kSigned>
KILN_QMM_AMX void PackGroupedX16(const uint8_t* grp, const QActLayout& L, const Panel& P, int8_t* dst) {
  using X = ::kiln::detail::QmmX16<B>;
  static_assert(!X::kK, "Q4_K panels are group-ordered already (GroupOrder<1> is in place)");
  const size_t nb = L.k / 32;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i off = _mm512_set1_epi8(static_cast<char>(kSigned ? L.offset : 0));
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* col = grp + b * X::kColBytes;
    const __m512i qh = X::kQh ? _mm512_loadu_si512(col + X::kOffQh) : _mm512_setzero_si512();
    _mm512_store_ps(P.dw + 16 * b, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col))));
    if constexpr (X::kMin)
      _mm512_store_ps(P.dm + 16 * b, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 32))));
    int8_t* d = dst + 64 * 8 * b;
    for (size_t s = 0; s < X::kSteps; ++s) {
      const __m512i z = _mm512_loadu_si512(col + X::kOffQ + 64 * s);
      if constexpr (X::kSteps == 8) {
        const __m512i v = _mm512_xor_si512(z, flip);
        _mm512_store_si512(d + 64 * s, kSigned ? _mm512_sub_epi8(v, off) : v);
      } else {
        __m512i lo, hi;
        vnni::X16Nibbles<X>(z, qh, s, lo, hi);
        _mm512_store_si512(d + 64 * s, kSigned ? _mm512_sub_epi8(lo, off) : lo);
        _mm512_store_si512(d + 64 * (s + 4), kSigned ? _mm512_sub_epi8(hi, off) : hi);
      }
    }
  }
}

// One group's tile products into slot (kP blocks of 16 x 16 int32) on tiles c0, c1 (sums), ta (x), 6, 7 (W).
// GCC's tile intrinsics are macros that paste the tile number into the instruction, hence a macro here too.
#define KILN_AMX_GROUP(c0, c1, ta, tb0, tb1, DP)             \
  do {                                                       \
    _tile_zero(c0);                                          \
    if constexpr (kP == 2) _tile_zero(c1);                   \
    _tile_loadd(ta, xa, static_cast<long>(gb));              \
    _tile_loadd(tb0, w0, 64);                                \
    DP(c0, ta, tb0);                                         \
    if constexpr (kP == 2) {                                 \
      _tile_loadd(tb1, w1, 64);                              \
      DP(c1, ta, tb1);                                       \
    }                                                        \
    _tile_stored(c0, slot, 64);                              \
    if constexpr (kP == 2) _tile_stored(c1, slot + 256, 64); \
  } while (0)

template <size_t kP, bool kSigned>
KILN_QMM_AMX HWY_INLINE void GroupTiles(const int8_t* xq, const int8_t* const* wq, size_t gtile, size_t g,
                                        int32_t* cbuf) {
  const int8_t* xa = xq + g * gtile;
  const int8_t* w0 = wq[0] + g * gtile;
  const int8_t* w1 = wq[kP - 1] + g * gtile;
  int32_t* slot = cbuf + (g % kRing) * 2 * 256;
  const size_t gb = gtile / kMT;
  if constexpr (kP == 1) {  // four chains: sums on tiles 0..3 in turn, x and W on 4, 6 / 5, 7
    switch (g % 4) {
      case 0:
        if constexpr (kSigned) KILN_AMX_GROUP(0, 0, 4, 6, 7, _tile_dpbssd);
        else KILN_AMX_GROUP(0, 0, 4, 6, 7, _tile_dpbsud);
        break;
      case 1:
        if constexpr (kSigned) KILN_AMX_GROUP(1, 1, 5, 7, 6, _tile_dpbssd);
        else KILN_AMX_GROUP(1, 1, 5, 7, 6, _tile_dpbsud);
        break;
      case 2:
        if constexpr (kSigned) KILN_AMX_GROUP(2, 2, 4, 6, 7, _tile_dpbssd);
        else KILN_AMX_GROUP(2, 2, 4, 6, 7, _tile_dpbsud);
        break;
      default:
        if constexpr (kSigned) KILN_AMX_GROUP(3, 3, 5, 7, 6, _tile_dpbssd);
        else KILN_AMX_GROUP(3, 3, 5, 7, 6, _tile_dpbsud);
        break;
    }
  } else {  // two chains of two sums: tiles 0, 1 / 2, 3; x on 4 / 5; W on 6, 7
    if (g & 1) {
      if constexpr (kSigned) KILN_AMX_GROUP(2, 3, 5, 6, 7, _tile_dpbssd);
      else KILN_AMX_GROUP(2, 3, 5, 6, 7, _tile_dpbsud);
    } else {
      if constexpr (kSigned) KILN_AMX_GROUP(0, 1, 4, 6, 7, _tile_dpbssd);
      else KILN_AMX_GROUP(0, 1, 4, 6, 7, _tile_dpbsud);
    }
  }
}
#undef KILN_AMX_GROUP

// kMT rows of x (one repacked block) against kP group-ordered panels, into y (rows of y: kMT, or kMT / 2
// pairs; the first yr valid, columns [0, nn) of the panels). Accumulators: kP x kAcc registers.
template <size_t kP, bool kMin, bool kPairs, bool kSigned>
KILN_QMM_AMX HWY_NOINLINE void Block(const Ctx& c, const uint8_t* blk, const int8_t* const* wq, const Panel* P,
                                     float* y, ptrdiff_t ldy, size_t yr, size_t nn) {
  constexpr size_t kAcc = kPairs ? kMT / 2 : kMT;
  const size_t groups = c.groups, gb = c.gb, gtile = kMT * gb;
  const int8_t* xq = reinterpret_cast<const int8_t*>(blk);
  const float* sdx = reinterpret_cast<const float*>(blk + groups * gtile);
  const float* sgd = sdx + groups * kMT;
  const int32_t* ssh = reinterpret_cast<const int32_t*>(sgd + groups * kMT);
  __m512 f[kP][kAcc];
#pragma GCC unroll 2
  for (size_t p = 0; p < kP; ++p)
#pragma GCC unroll 16
    for (size_t i = 0; i < kAcc; ++i) f[p][i] = _mm512_setzero_ps();
  for (size_t g = 0; g < HWY_MIN(kLag, groups); ++g) GroupTiles<kP, kSigned>(xq, wq, gtile, g, c.cbuf);
  for (size_t g = 0; g < groups; ++g) {
    if (g + kLag < groups) GroupTiles<kP, kSigned>(xq, wq, gtile, g + kLag, c.cbuf);
    // Per row (pair) of x its scalars are broadcast once for both panels; per output the ops and their order
    // are vnni::Kernel's (PairGroupStep, then PairMinStep with the sum of the pair's gdxs).
    const int32_t* cb = c.cbuf + (g % kRing) * 2 * 256;
    const float* dx = sdx + g * kMT;
    const float* gd = sgd + g * kMT;
    const int32_t* sh = ssh + g * kMT;
    __m512 dwv[kP], dmv[kP];
    for (size_t p = 0; p < kP; ++p) {
      dwv[p] = _mm512_load_ps(P[p].dw + 16 * g);
      if constexpr (kMin) dmv[p] = _mm512_load_ps(P[p].dm + 16 * g);
    }
    // Unrolled, so that f stays in registers: GCC kept it on the stack otherwise (a load and a store per
    // FMA, beside the tile stores; docs/benchmarks.md).
#pragma GCC unroll 16
    for (size_t i = 0; i < kAcc; ++i) {
      const __m512 dxv = _mm512_set1_ps(dx[i]);
#pragma GCC unroll 2
      for (size_t p = 0; p < kP; ++p) {
        const int32_t* cp = cb + p * 256;
        __m512 t;
        if constexpr (kPairs) {  // the pair's sums: rows 2i and 2i + 1
          const __m512i cx = _mm512_load_si512(cp + 32 * i), cr = _mm512_load_si512(cp + 32 * i + 16);
          t = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_sllv_epi32(cx, _mm512_set1_epi32(sh[i])), cr));
        } else {
          t = _mm512_cvtepi32_ps(_mm512_load_si512(cp + 16 * i));
        }
        f[p][i] = _mm512_fmadd_ps(t, _mm512_mul_ps(dwv[p], dxv), f[p][i]);
        if constexpr (kMin) f[p][i] = _mm512_fmadd_ps(dmv[p], _mm512_set1_ps(gd[i]), f[p][i]);
      }
    }
  }
#pragma GCC unroll 2
  for (size_t p = 0; p < kP; ++p) {
    const size_t ncols = p * kNR < nn ? HWY_MIN(kNR, nn - p * kNR) : 0;
    const __mmask16 mask = static_cast<__mmask16>((1u << ncols) - 1u);
#pragma GCC unroll 16
    for (size_t i = 0; i < kAcc; ++i)
      if (i < yr)
        _mm512_mask_storeu_ps(y + static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(p * kNR), mask, f[p][i]);
  }
}

// Every row of x against np (1 or 2) packed panels (nn <= 16 np valid columns): pairs, both panels at once
// (8 + 8 accumulators); one part, one panel at a time (16). pf advances before each block. Bit p of grouped:
// panel p's quants are in group order in c.wq[p] already (PackGroupedX16; its coefficients in P[p]).
template <int kLayout, bool kMin>
KILN_QMM_AMX void Rows(const Ctx& c, const Panel* P, size_t np, const QActLayout& L, size_t m, float* y, ptrdiff_t ldy,
                       size_t nn, RowPrefetch& pf, bool pairs, unsigned grouped = 0) {
  constexpr bool kSigned = !kMin;
  const int8_t* wq[2];
  for (size_t p = 0; p < np; ++p)
    wq[p] = (grouped >> p) & 1u ? c.wq[p] : GroupOrder<kLayout, kSigned>(P[p], c.groups, L.offset, c.wq[p]);
  const size_t blocks = (m + kMT - 1) / kMT, per_call = (pf.left + blocks - 1) / HWY_MAX(blocks, size_t{1});
  for (size_t b = 0; b < blocks; ++b) {
    pf.Step(per_call);
    const uint8_t* blk = c.xb + b * c.block_bytes;
    const size_t mr = HWY_MIN(kMT, m - b * kMT);
    if (pairs) {
      float* yb = y + static_cast<ptrdiff_t>(b * kMT / 2) * ldy;
      if (np == 2) Block<2, kMin, true, kSigned>(c, blk, wq, P, yb, ldy, mr / 2, nn);
      else Block<1, kMin, true, kSigned>(c, blk, wq, P, yb, ldy, mr / 2, nn);
    } else {
      float* yb = y + static_cast<ptrdiff_t>(b * kMT) * ldy;
      for (size_t p = 0; p < np; ++p)
        Block<1, kMin, false, kSigned>(c, blk, wq + p, P + p, yb + p * kNR, ldy, mr, nn - p * kNR);
    }
  }
}

}  // namespace amx

KILN_X86_DIAGNOSTICS_POP

#endif  // HWY_TARGET == HWY_AVX3_DL

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
