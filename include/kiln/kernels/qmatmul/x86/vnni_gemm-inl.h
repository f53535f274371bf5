// kiln/kernels/qmatmul/x86/vnni_gemm-inl.h - qmatmul's GEMM path on AVX3_DL (AVX-512 VNNI). Included from
// entry-inl.h only, after vnni-inl.h (uses its decoders).
//
// Panels: 16 rows of W are decoded once into unsigned bytes in the activation's physical order and
// interleaved in 4-byte steps, step t = [row 0 bytes 4t..4t+3 | row 1 .. | .. | row 15 ..] (64 bytes, one
// register), with the per-sum-group f32 coefficients (dw: scale, dm: min) as 16-lane vectors.
// Kernel: for kMR rows of x, vpdpbusd(acc_i, step, broadcast of 4 activation bytes) accumulates each sum
// group (32 or 16 values) in 16 lanes = 16 weight rows; acc_i starts at kQmmMagic - off * S, so
// (f32 bits of acc_i) - 1.5 * 2^23 is the group's integer sum with the offset applied, exactly (|sum| <
// 2^22), and f_i += sum * (dw * dx) [+ dm * (dx * S)] ends the group: 3 (or 4) f32 ops per 8 (or 4)
// vpdpbusd; for the two parts of a row of x (kQmmPairs) one convert and 2 f32 ops per pair, on 2^s X + R.
// Outputs of a row of x are 16 consecutive elements of y: one masked store.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_QMATMUL_X86_VNNI_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_QMATMUL_X86_VNNI_GEMM_INL_H_
#undef KILN_KERNELS_QMATMUL_X86_VNNI_GEMM_INL_H_
#else
#define KILN_KERNELS_QMATMUL_X86_VNNI_GEMM_INL_H_
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

inline constexpr size_t kNR = 16;  // weight rows per panel (lanes)
inline constexpr size_t kMR = 8;   // rows of x per kernel call

struct Panel {
  uint8_t* u;  // kp / 4 steps of 64 bytes
  float* dw;   // ns x 16
  float* dm;   // ns x 16
};

// Transposes 16 registers of 16 dwords into dst: dword c of r[i] -> dst[16 c + i] (r is overwritten).
KILN_QMM_VNNI HWY_INLINE void Transpose16x16Regs(__m512i* r, uint8_t* dst) {
  __m512i t[16];
  // 32-bit interleave within 128-bit lanes, then 64-bit, then the 128-bit lanes across rows.
  for (size_t i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (size_t i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // r[4a + b] now holds, per 128-bit lane L, dword column 4L + b of rows 4a..4a+3.
  for (size_t b = 0; b < 4; ++b) {
    // Gather lane L of r[b], r[4 + b], r[8 + b], r[12 + b] -> column 4L + b of all 16 rows.
    const __m512i a01l = _mm512_shuffle_i32x4(r[b], r[4 + b], 0x44);  // lanes 0,1 of each
    const __m512i a01h = _mm512_shuffle_i32x4(r[b], r[4 + b], 0xEE);  // lanes 2,3
    const __m512i a23l = _mm512_shuffle_i32x4(r[8 + b], r[12 + b], 0x44);
    const __m512i a23h = _mm512_shuffle_i32x4(r[8 + b], r[12 + b], 0xEE);
    t[b] = _mm512_shuffle_i32x4(a01l, a23l, 0x88);       // lane 0 of all four
    t[4 + b] = _mm512_shuffle_i32x4(a01l, a23l, 0xDD);   // lane 1
    t[8 + b] = _mm512_shuffle_i32x4(a01h, a23h, 0x88);   // lane 2
    t[12 + b] = _mm512_shuffle_i32x4(a01h, a23h, 0xDD);  // lane 3
  }
  for (size_t c = 0; c < 16; ++c) _mm512_storeu_si512(dst + 64 * c, t[c]);
}
// The same from 16 rows of 16 dwords in memory (src rows `ld` bytes apart).
KILN_QMM_VNNI HWY_INLINE void Transpose16x16(const uint8_t* src, size_t ld, uint8_t* dst) {
  __m512i r[16];
  for (size_t i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ld);
  Transpose16x16Regs(r, dst);
}

// One row of W into row-major unsigned bytes u (kp, physical order) and its per-sum-group coefficients into
// the rows sw, sm (ns16 floats each; transposed into the panel afterwards).
template <class B>
KILN_QMM_VNNI HWY_INLINE void DecodeRowForPanel(const uint8_t* row, const QActLayout& L, uint8_t* u, float* sw,
                                                float* sm) {
  if constexpr (dtype_traits<B>::block_size == 32) {
    using D = Dec32<B>;
    constexpr size_t gbytes = D::kBytes;
    const size_t nb = L.k / 32, ngroups = L.ns / 4;
    const ptrdiff_t row_bytes = static_cast<ptrdiff_t>(nb * sizeof(B));
    for (size_t u0 = 0; u0 < ngroups; u0 += 4) {  // 16 blocks: their scales converted at once
      __m512i dm16 = _mm512_setzero_si512();
      for (size_t G = u0; G < HWY_MIN(u0 + 4, ngroups); ++G) {
        const ptrdiff_t valid = row_bytes - static_cast<ptrdiff_t>(G * gbytes);
        const bool fast = valid >= static_cast<ptrdiff_t>(D::kNeed) && 4 * G + 4 <= nb;
        const auto win = D::Load(row + G * gbytes, fast ? valid : HWY_MIN(valid, static_cast<ptrdiff_t>(gbytes)));
        __m512i lo, hi;
        D::Quants(win, lo, hi);
        _mm512_storeu_si512(u + 128 * G, lo);
        _mm512_storeu_si512(u + 128 * G + 64, hi);
        dm16 = D::template MergeScales<false>(win, G - u0, dm16);
      }
      _mm512_storeu_ps(sw + 4 * u0, D::ScalesF32(dm16));
      _mm512_storeu_ps(sm + 4 * u0, D::kMin ? D::MinsF32(dm16) : _mm512_setzero_ps());
    }
  } else {
    for (size_t sb = 0; sb < L.nd; ++sb) {
      KDec k;
      const uint8_t* blk = row + sb * sizeof(B);
      if constexpr (std::is_same_v<B, block_q6_K>) DecodeQ6K(blk, k);
      else DecodeQ45K<std::is_same_v<B, block_q5_K>>(blk, k);
      for (size_t v = 0; v < 4; ++v) _mm512_storeu_si512(u + 256 * sb + 64 * v, k.u[v]);
      const B& b = *reinterpret_cast<const B*>(blk);
      if constexpr (std::is_same_v<B, block_q6_K>) {  // d * sc (exact: 11-bit by 8-bit)
        const __m512 sc =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales))));
        _mm512_storeu_ps(sw + 16 * sb, _mm512_mul_ps(sc, _mm512_broadcastss_ps(k.dd)));
        _mm512_storeu_ps(sm + 16 * sb, _mm512_setzero_ps());
      } else {  // d * sc and -(dmin * mn) in physical sub-block order (exact: 11-bit by 6-bit)
        const __m128i perm = _mm_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
        const __m128i smp = _mm_shuffle_epi8(KScalesMins(b.scales), perm);
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(smp));
        const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(smp, 8)));
        const __m128 ndmin = _mm_sub_ps(_mm_setzero_ps(), _mm_shuffle_ps(k.dd, k.dd, 0x55));
        _mm256_storeu_ps(sw + 8 * sb, _mm256_mul_ps(sc, _mm256_broadcastss_ps(k.dd)));
        _mm256_storeu_ps(sm + 8 * sb, _mm256_mul_ps(mn, _mm256_broadcastss_ps(ndmin)));
      }
    }
  }
}

// 32-value blocks: per group of 4 blocks, the 16 rows' decoded quants go straight from registers through the
// transpose into the panel (the low halves in registers, the high halves through 1 KiB of L1), instead of
// a 16 x kp row-major buffer written and read back (which made packing ~14% of a 128-row Q8_0 GEMM).
template <class B>
KILN_QMM_VNNI void PackPanel32(const uint8_t* w, ptrdiff_t ldw, size_t nn, const QActLayout& L, float* sw, float* sm,
                               const Panel& P) {
  using D = Dec32<B>;
  constexpr size_t gbytes = D::kBytes;
  const size_t ns16 = (L.ns + 15) / 16 * 16, nb = L.k / 32, ngroups = L.ns / 4;
  const ptrdiff_t row_bytes = static_cast<ptrdiff_t>(nb * sizeof(B));
  const uint8_t* rows[kNR];
  for (size_t r = 0; r < kNR; ++r) rows[r] = w + static_cast<ptrdiff_t>(HWY_MIN(r, nn - 1)) * ldw;
  alignas(64) uint8_t hi_buf[kNR * 64];
  alignas(64) uint8_t dm_buf[kNR * 64];         // per row: the 16-block scale words being merged (MergeScales)
  for (size_t u0 = 0; u0 < ngroups; u0 += 4) {  // 16 blocks: their scales converted at once
    std::memset(dm_buf, 0, sizeof(dm_buf));
    for (size_t G = u0; G < HWY_MIN(u0 + 4, ngroups); ++G) {
      const ptrdiff_t valid = row_bytes - static_cast<ptrdiff_t>(G * gbytes);
      const bool fast = valid >= static_cast<ptrdiff_t>(D::kNeed) && 4 * G + 4 <= nb;
      const ptrdiff_t v = fast ? valid : HWY_MIN(valid, static_cast<ptrdiff_t>(gbytes));
      __m512i lo[kNR];
      for (size_t r = 0; r < kNR; ++r) {
        const auto win = D::Load(rows[r] + G * gbytes, v);
        __m512i h;
        D::Quants(win, lo[r], h);
        _mm512_store_si512(hi_buf + 64 * r, h);
        __m512i* dm = reinterpret_cast<__m512i*>(dm_buf + 64 * r);
        _mm512_store_si512(dm, D::template MergeScales<false>(win, G - u0, _mm512_load_si512(dm)));
      }
      Transpose16x16Regs(lo, P.u + 16 * (128 * G));
      Transpose16x16(hi_buf, 64, P.u + 16 * (128 * G + 64));
    }
    for (size_t r = 0; r < kNR; ++r) {
      const __m512i dm16 = _mm512_load_si512(dm_buf + 64 * r);
      _mm512_storeu_ps(sw + r * ns16 + 4 * u0, D::ScalesF32(dm16));
      if constexpr (D::kMin) _mm512_storeu_ps(sm + r * ns16 + 4 * u0, D::MinsF32(dm16));
    }
  }
}

// Rows [0, nn) of W (nn <= 16; missing rows repeat the last) into a panel. tmp: 16 x kp bytes; tsc: 2 x 16 x
// ns16 floats.
template <class B>
KILN_QMM_VNNI void PackPanel(const uint8_t* w, ptrdiff_t ldw, size_t nn, const QActLayout& L, uint8_t* tmp, float* tsc,
                             const Panel& P) {
  const size_t ns16 = (L.ns + 15) / 16 * 16;
  float* sw = tsc;
  float* sm = tsc + kNR * ns16;
  constexpr bool kMin =
      std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_1> || dtype_traits<B>::block_size == 256;
  if constexpr (dtype_traits<B>::block_size == 32) {
    PackPanel32<B>(w, ldw, nn, L, sw, sm, P);
    for (size_t r = 0; r < kNR; ++r)
      for (size_t g = L.ns; g < ns16; ++g) sw[r * ns16 + g] = sm[r * ns16 + g] = 0.f;
    for (size_t g = 0; g < ns16; g += 16) {  // coefficient of group g + i, row r -> panel [(g + i) * 16 + r]
      Transpose16x16(reinterpret_cast<const uint8_t*>(sw + g), ns16 * sizeof(float),
                     reinterpret_cast<uint8_t*>(P.dw + 16 * g));
      if constexpr (kMin)  // the kernel reads dm only for types with a min
        Transpose16x16(reinterpret_cast<const uint8_t*>(sm + g), ns16 * sizeof(float),
                       reinterpret_cast<uint8_t*>(P.dm + 16 * g));
    }
    return;
  }
  for (size_t r = 0; r < kNR; ++r) {
    DecodeRowForPanel<B>(w + static_cast<ptrdiff_t>(HWY_MIN(r, nn - 1)) * ldw, L, tmp + r * L.kp, sw + r * ns16,
                         sm + r * ns16);
    for (size_t g = L.ns; g < ns16; ++g) sw[r * ns16 + g] = sm[r * ns16 + g] = 0.f;
  }
  for (size_t c = 0; c < L.kp; c += 64) Transpose16x16(tmp + c, L.kp, P.u + 16 * c);
  for (size_t g = 0; g < ns16; g += 16) {  // coefficient of group g + i, row r -> panel [(g + i) * 16 + r]
    Transpose16x16(reinterpret_cast<const uint8_t*>(sw + g), ns16 * sizeof(float),
                   reinterpret_cast<uint8_t*>(P.dw + 16 * g));
    Transpose16x16(reinterpret_cast<const uint8_t*>(sm + g), ns16 * sizeof(float),
                   reinterpret_cast<uint8_t*>(P.dm + 16 * g));
  }
}

// Layouts of sum groups in q: 0 = 32-value blocks (runs of 16 at o and o + 64), 1 = Q4_K/Q5_K (32 bytes
// at o), 2 = Q6_K (16 bytes at o).
template <int kLayout>
HWY_INLINE size_t GroupOffset(size_t g) {
  if constexpr (kLayout == 0) return 128 * (g / 4) + 16 * (g % 4);
  else if constexpr (kLayout == 1) return 32 * g;
  else return 16 * g;
}

HWY_INLINE int32_t Load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// kP panels (16 weight rows each) x kM rows of x: kP x kM accumulators. Per 4-byte step, kP weight loads and
// kM activation broadcasts feed kP x kM vpdpbusd (two panels halve the broadcasts per vpdpbusd: the loads,
// not the arithmetic, bound one panel with 8 rows). pairs (kM even): rows 2i and 2i + 1 are the two parts
// of one row of x (kQmmPairs), whose scales are dx and dx_r = dx / 2^s (QuantizeRowSplit; s = pshift, 8..12
// per group): per group their integer sums X and R are combined as c = 2^s X + R (|c| < 2^31: |X| <= 32 *
// 128 * 127), so one convert and one FMA, f += c * (dw * dx_r), end the group for both (the residual's start
// value pinit absorbs the magic constants: (M + X) 2^s + (M + R - (2^s + 1) M) = c mod 2^32); y row i gets
// the pair's f. With its own epilogue per part (3 f32 ops each) prompts ran 4-15% slower; with s read from
// the two scales' f32 exponents here (rather than pshift), as slow as that.
template <size_t kP, size_t kM, int kLayout, bool kMin, bool pairs>
KILN_QMM_VNNI HWY_NOINLINE void Kernel(const Panel* P, const ActRow* a, size_t groups, size_t dx_shift, float* y,
                                       ptrdiff_t ldy, size_t nn) {
  constexpr size_t kRun2 = kLayout == 0 ? 64 : 16;  // offset of the second run of 16 bytes
  constexpr size_t kRuns = kLayout != 2 ? 2 : 1;
  const __m512 magic = _mm512_set1_ps(::kiln::detail::kQmmMagicF);
  __m512 f[kP][kM];
  for (size_t p = 0; p < kP; ++p)
    for (size_t i = 0; i < kM; ++i) f[p][i] = _mm512_setzero_ps();
  for (size_t g = 0; g < groups; ++g) {
    const size_t o = GroupOffset<kLayout>(g);
    __m512i acc[kP][kM];
    for (size_t i = 0; i < kM; ++i) {
      const __m512i init = _mm512_set1_epi32(pairs && i % 2 == 1 ? a[i].pinit[g] : a[i].ginit[g]);
      for (size_t p = 0; p < kP; ++p) acc[p][i] = init;
    }
    for (size_t run = 0; run < kRuns; ++run) {
      const size_t ob = o + run * kRun2;
      for (size_t s = 0; s < 4; ++s) {
        __m512i wv[kP];
        for (size_t p = 0; p < kP; ++p) wv[p] = _mm512_load_si512(P[p].u + 16 * ob + 64 * s);
        for (size_t i = 0; i < kM; ++i) {
          const __m512i xv = _mm512_set1_epi32(Load4(a[i].q + ob + 4 * s));
          for (size_t p = 0; p < kP; ++p) acc[p][i] = _mm512_dpbusd_epi32(acc[p][i], wv[p], xv);
        }
      }
    }
    if constexpr (pairs) {
      static_assert(kM % 2 == 0, "pairs need an even tile");
      for (size_t p = 0; p < kP; ++p) {
        const __m512 dwv = _mm512_load_ps(P[p].dw + 16 * g);
        for (size_t i = 0; i < kM; i += 2)
          f[p][i] =
              PairGroupStep(f[p][i], acc[p][i], acc[p][i + 1], a[i + 1].pshift[g], dwv, a[i + 1].dx[g >> dx_shift]);
        if constexpr (kMin) {
          const __m512 dmv = _mm512_load_ps(P[p].dm + 16 * g);
          for (size_t i = 0; i < kM; i += 2) f[p][i] = PairMinStep(f[p][i], dmv, a[i].gdxs[g], a[i + 1].gdxs[g]);
        }
      }
      continue;
    }
    for (size_t p = 0; p < kP; ++p) {
      const __m512 dwv = _mm512_load_ps(P[p].dw + 16 * g);
      for (size_t i = 0; i < kM; ++i) {
        const __m512 t = _mm512_sub_ps(_mm512_castsi512_ps(acc[p][i]), magic);
        f[p][i] = _mm512_fmadd_ps(t, _mm512_mul_ps(dwv, _mm512_set1_ps(a[i].dx[g >> dx_shift])), f[p][i]);
      }
      if constexpr (kMin) {
        const __m512 dmv = _mm512_load_ps(P[p].dm + 16 * g);
        for (size_t i = 0; i < kM; ++i) f[p][i] = _mm512_fmadd_ps(dmv, _mm512_set1_ps(a[i].gdxs[g]), f[p][i]);
      }
    }
  }
  for (size_t p = 0; p < kP; ++p) {
    const size_t np = p * kNR < nn ? HWY_MIN(kNR, nn - p * kNR) : 0;
    const __mmask16 mask = static_cast<__mmask16>((1u << np) - 1u);
    if constexpr (pairs) {
      for (size_t i = 0; i < kM; i += 2)
        _mm512_mask_storeu_ps(y + static_cast<ptrdiff_t>(i / 2) * ldy + static_cast<ptrdiff_t>(p * kNR), mask, f[p][i]);
    } else {
      for (size_t i = 0; i < kM; ++i)
        _mm512_mask_storeu_ps(y + static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(p * kNR), mask, f[p][i]);
    }
  }
}

// The rows of W the next panels will be packed from, prefetched into L2 a few lines at a time while the
// kernel runs on the current ones: PackPanel reads 16 rows in turn (16 streams K bytes apart, which the
// hardware prefetchers follow poorly; without this, packing waited on memory for ~60% of its time).
struct RowPrefetch {
  const uint8_t* row = nullptr;
  ptrdiff_t ld = 0;
  size_t row_bytes = 0, off = 0, left = 0;  // left: lines still to prefetch
  HWY_INLINE void Step(size_t lines) {      // (no VNNI attribute: clang inlines it into lambdas, which lack it)
    for (; lines != 0 && left != 0; --lines, --left) {
      _mm_prefetch(reinterpret_cast<const char*>(row + off), _MM_HINT_T1);
      off += 64;
      if (off >= row_bytes) {
        off = 0;
        row += ld;
      }
    }
  }
};

// Every row of x against kP packed panels (nn <= 16 kP valid columns): tiles of kMR (or 6 for two panels),
// then 4, 2, 1 rows (pairs: m even, every tile even); pf advances before each tile, spread to end with the last.
template <size_t kP, int kLayout, bool kMin>
KILN_QMM_VNNI void KernelRows(const Panel* P, const QActLayout& L, const uint8_t* act, size_t m, size_t groups,
                              size_t dx_shift, float* y, ptrdiff_t ldy, size_t nn, RowPrefetch& pf, bool pairs) {
  constexpr size_t kTile = kP == 1 ? kMR : 6;  // accumulators: kP * kTile * 2 (int and f32) <= 24 registers
  const size_t calls = m / kTile + 3, per_call = (pf.left + calls - 1) / calls;
  size_t i0 = 0;
  ActRow a[kMR];
  auto rows = [&](size_t c) {
    pf.Step(per_call);
    for (size_t i = 0; i < c; ++i) a[i] = GetActRow(act + (i0 + i) * L.row_bytes, L);
    return y + static_cast<ptrdiff_t>(pairs ? i0 / 2 : i0) * ldy;
  };
  static_assert(kTile % 2 == 0, "kQmmPairs needs even tiles");
  auto run = [&](auto pv) {
    constexpr bool kPairs = decltype(pv)::value;
    for (; i0 + kTile <= m; i0 += kTile)
      Kernel<kP, kTile, kLayout, kMin, kPairs>(P, a, groups, dx_shift, rows(kTile), ldy, nn);
    for (; i0 + 4 <= m; i0 += 4) Kernel<kP, 4, kLayout, kMin, kPairs>(P, a, groups, dx_shift, rows(4), ldy, nn);
    for (; i0 + 2 <= m; i0 += 2) Kernel<kP, 2, kLayout, kMin, kPairs>(P, a, groups, dx_shift, rows(2), ldy, nn);
    for (; i0 < m; ++i0)
      Kernel<kP, 1, kLayout, kMin, false>(P, a, groups, dx_shift, rows(1), ldy, nn);  // not pairs: m even
  };
  if (pairs) run(std::true_type{});
  else run(std::false_type{});
}

}  // namespace vnni

KILN_X86_DIAGNOSTICS_POP
#endif  // HWY_TARGET == HWY_AVX3_DL
}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

// The AMX kernel GemmVnni runs where core/amx.hpp finds the tiles usable (it uses the panels above).
#include "kiln/kernels/qmatmul/x86/amx_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {
#if HWY_TARGET == HWY_AVX3_DL
KILN_X86_DIAGNOSTICS_PUSH

// GEMM: per pair of panels (32 rows of W, decoded once), every row of x. Rows [0, x16_rows) of W are in
// 16-row interleaved groups (quant/interleave.hpp), their panels made by PackPanelX16.
// The kernels store into a tile of kOutCols columns of every row of y (a per-thread buffer), copied to y
// row by row when full. Stored straight to y, 16 floats per row ldy apart (a 512-token prompt: 512 rows
// 2-6 KiB apart), the stores stalled the core (profile samples on the stores after each kernel call;
// a SmolLM2 prompt ran ~10% faster with the stores sent to a dummy buffer).
inline constexpr size_t kOutCols = 128;  // a multiple of 2 kNR

// n floats from src to dst, 16 at a time (memcpy of a tile row became `rep movsq`, whose start-up cost per
// row made the copy ~15% of a SmolLM2 prompt).
HWY_INLINE void CopyRow(float* dst, const float* src, size_t n) {
  size_t c = 0;
  for (; c + 16 <= n; c += 16) _mm512_storeu_ps(dst + c, _mm512_loadu_ps(src + c));
  if (c < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - c)) - 1u);
    _mm512_mask_storeu_ps(dst + c, mask, _mm512_maskz_loadu_ps(mask, src + c));
  }
}

// use_amx: on AMX tiles; amx_x: x already in amx::RepackBlocks' form (then act is not read).
inline void GemmVnni(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, ptrdiff_t ldw, size_t n,
                     float* y, ptrdiff_t ldy, size_t x16_rows = 0, bool pairs = false, bool use_amx = false,
                     const uint8_t* amx_x = nullptr) {
  using namespace vnni;
  const size_t ym = pairs ? m / 2 : m;  // rows of y
  // Tile rows one cache line longer than kOutCols: 512 bytes apart, the rows would map to 8 of L1's 64 sets.
  auto* out = static_cast<float*>(::kiln::detail::qmm_scratch(4, ym * (HWY_MIN(n, kOutCols) + 16) * sizeof(float)));
  const size_t ns16 = (L.ns + 15) / 16 * 16;
  const size_t panel_bytes = kNR * L.kp + 2 * ns16 * kNR * sizeof(float);  // a multiple of 64
  auto* tmp = static_cast<uint8_t*>(::kiln::detail::qmm_scratch(1, kNR * L.kp));
  auto* pbuf = static_cast<uint8_t*>(::kiln::detail::qmm_scratch(2, 2 * panel_bytes));
  auto* tsc = static_cast<float*>(::kiln::detail::qmm_scratch(3, 2 * ns16 * kNR * sizeof(float)));
  Panel P[2];
  for (size_t p = 0; p < 2; ++p) {
    uint8_t* base = pbuf + p * panel_bytes;
    P[p] = Panel{base, reinterpret_cast<float*>(base + kNR * L.kp),
                 reinterpret_cast<float*>(base + kNR * L.kp) + ns16 * kNR};
  }
  const bool kq = ::kiln::detail::qmm_is_kquant(L.type);
  const size_t groups = kq ? L.ns : L.k / 32;
  const size_t dx_shift = !kq ? 0 : (L.sg == 16 ? 4 : 3);  // sum groups per dx: 1, 8 or 16
  amx::Ctx actx{};
  if (use_amx) actx = amx::Prepare(L, act, m, pairs, amx_x);
  VisitType(L.type, [&](auto* tag) {
    using B = std::remove_pointer_t<decltype(tag)>;
    constexpr int kLayout = std::is_same_v<B, block_q6_K> ? 2 : (dtype_traits<B>::block_size == 256 ? 1 : 0);
    constexpr bool kMin = kLayout == 1 || std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_1>;
    const size_t row_bytes = L.k / dtype_traits<B>::block_size * sizeof(B);
    auto pack = [&](size_t j, size_t nn, const Panel& p) {  // rows [j, j + nn) of W
      if constexpr (kernels::qmm_interleavable_v<B>) {
        if (j + kNR <= x16_rows) return PackPanelX16<B>(w + static_cast<ptrdiff_t>(j) * ldw, L, p);
      }
      PackPanel<B>(w + static_cast<ptrdiff_t>(j) * ldw, ldw, nn, L, tmp, tsc, p);
    };
    // For the tiles: panel q of the pair, straight into the group-ordered form where W is interleaved (bit q
    // of the result), else as a panel that amx::Rows reorders.
    auto pack_amx = [&](size_t j, size_t nn, size_t q) -> unsigned {
      if constexpr (kernels::qmm_interleavable_v<B> && kLayout == 0 && !std::is_same_v<B, block_mxfp4>) {
        if (j + kNR <= x16_rows) {  // MXFP4: PackPanelX16, then reordered as a row-major panel is
          amx::PackGroupedX16<B, !kMin>(w + static_cast<ptrdiff_t>(j) * ldw, L, P[q], actx.wq[q]);
          return 1u << q;
        }
      }
      pack(j, nn, P[q]);
      return 0;
    };
    for (size_t j0 = 0; j0 < n; j0 += 2 * kNR) {
      const size_t nn = HWY_MIN(2 * kNR, n - j0);
      unsigned grouped = 0;
      if (use_amx) grouped = pack_amx(j0, HWY_MIN(kNR, nn), 0);
      else pack(j0, HWY_MIN(kNR, nn), P[0]);
      const size_t c0 = j0 / kOutCols * kOutCols, cw = HWY_MIN(kOutCols, n - c0);  // y columns of the tile
      float* yj = out + (j0 - c0);
      const ptrdiff_t ldo = static_cast<ptrdiff_t>(cw + 16);
      RowPrefetch pf;  // the next pair of panels' rows
      if (j0 + 2 * kNR < n) {
        pf.row = w + static_cast<ptrdiff_t>(j0 + 2 * kNR) * ldw;
        pf.ld = ldw;
        pf.row_bytes = row_bytes;
        pf.left = HWY_MIN(2 * kNR, n - j0 - 2 * kNR) * ((row_bytes + 63) / 64);
      }
      if (use_amx) {
        if (nn > kNR) grouped |= pack_amx(j0 + kNR, nn - kNR, 1);
        amx::Rows<kLayout, kMin>(actx, P, nn > kNR ? 2 : 1, L, m, yj, ldo, nn, pf, pairs, grouped);
      } else if (nn > kNR) {
        pack(j0 + kNR, nn - kNR, P[1]);
        KernelRows<2, kLayout, kMin>(P, L, act, m, groups, dx_shift, yj, ldo, nn, pf, pairs);
      } else {
        KernelRows<1, kLayout, kMin>(P, L, act, m, groups, dx_shift, yj, ldo, nn, pf, pairs);
      }
      if (j0 + nn == c0 + cw)  // the tile is full
        for (size_t r = 0; r < ym; ++r)
          CopyRow(y + static_cast<ptrdiff_t>(r) * ldy + static_cast<ptrdiff_t>(c0), out + r * (cw + 16), cw);
    }
  });
  if (use_amx) amx::Release();
}

KILN_X86_DIAGNOSTICS_POP

#endif  // HWY_TARGET == HWY_AVX3_DL

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
