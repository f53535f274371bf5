// kiln/kernels/matmul/gemv-inl.h - the GEMV path of matmul (M <= detail::kGemvMaxRows): B is streamed once,
// 4 or 8 rows at a time, each dotted with every row of A held in registers; B row-major or in packed
// rows (ops/matmul.hpp: the 8 rows of a group are then one read stream). Memory-bound for large B. Short
// rows (attention scores: k = head_dim) go 16 at a time through GemvShortK on AVX-512, bit-identical;
// rows shorter than a vector (head_dim 4 or 8) through GemvTinyK, 16 / k rows per vector.
// Included from entry-inl.h only (uses its helpers).

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_MATMUL_GEMV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_MATMUL_GEMV_INL_H_
#undef KILN_KERNELS_MATMUL_GEMV_INL_H_
#else
#define KILN_KERNELS_MATMUL_GEMV_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kiln/kernels/x86/common.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace mm {

// Rows of B per group: several concurrent read streams keep the memory system busy, and each A vector
// load serves that many FMAs. Eight rows for one or two rows of A (16 accumulators at most), four for
// three or four; on 16-register targets (AVX2) eight for one row of A (8 accumulators), else four (eight
// streams keep AVX2's memory system busier than four). Thread splits are multiples of 64 rows, so groups
// never straddle threads.
template <size_t kM>
constexpr size_t GemvRows() {
  return (kManyRegs && kM <= 2) || kM == 1 ? 8 : 4;
}
// Software prefetch distance along each row of B, in bytes: the distance that came closest to a plain
// read loop's bandwidth at 1 and 2 threads (none and 1024 bytes each lose at one of them).
inline constexpr size_t kGemvPrefetch = 512;
// The same along packed rows (PackedB; one stream when R = kR, i.e. one row of A): on AVX2 1024 bytes ahead,
// where Zen 3 reads the single stream markedly faster with it (768 and 1536 bytes no better); on AVX3_DL 4096
// bytes ahead into L2, as the interleaved quantized GEMVs (kernels/qmatmul/x86/vnni_x16-inl.h: Sapphire/Emerald
// Rapids, whose cores' read bandwidth is bound by their outstanding misses, read the stream markedly faster
// with it; 2048 bytes gained less; on AVX3_DL only where x86::stream_prefetch_on(): Intel, as Zen 4 read the
// stream faster without it); elsewhere no gain shown.
inline constexpr size_t kGemvPackedPrefetch = HWY_TARGET == HWY_AVX2 ? 1024 : HWY_TARGET == HWY_AVX3_DL ? 4096 : 0;
// Prefetches the `bytes` from p on, kGemvPackedPrefetch ahead (AVX3_DL: into L2, prefetcht1).
HWY_INLINE void PackedPrefetch(const void* p, size_t bytes) {
#if HWY_TARGET == HWY_AVX3_DL
  if (!::kiln::detail::x86::stream_prefetch_on()) return;
#endif
  if constexpr (kGemvPackedPrefetch != 0) {
    for (size_t l = 0; l < bytes; l += 64) {
      const char* q = static_cast<const char*>(p) + kGemvPackedPrefetch + l;
      if constexpr (HWY_TARGET == HWY_AVX3_DL) __builtin_prefetch(q, 0, 2);
      else hwy::Prefetch(q);
    }
  }
}

// Rows of A per pass: all four fit the 32 AVX-512 registers; with 16 registers, two at a time avoids
// spills (B is then streamed once per two rows of A).
inline constexpr size_t kGemvMaxM = kManyRegs ? 4 : 2;

template <size_t R, class TB>
HWY_INLINE void GemvRowPointers(const TB* b, ptrdiff_t ldb, size_t j0, size_t n, const TB** rows) {
  for (size_t r = 0; r < R; ++r)  // past the end of B: repeat its last row (results dropped)
    rows[r] = b + static_cast<ptrdiff_t>(HWY_MIN(j0 + r, n - 1)) * ldb;
}

template <size_t R>
HWY_INLINE void GemvStore(const float* s, float* HWY_RESTRICT ci, size_t j0, size_t n, bool accumulate) {
  for (size_t r = 0; r < R && j0 + r < n; ++r) ci[j0 + r] = accumulate ? ci[j0 + r] + s[r] : s[r];
}

// c[i, j] = [c +] sum_p a[i, p] b[j, p] for kM rows of A and n rows of B (f32 or f16). Each output's k
// loop runs in kLanes lane-wise partial sums, reduced by SumOfLanes4, plus a scalar tail: the same
// operations for a given (i, j) whatever n is or where the group starts.
template <size_t kM, class TB>
HWY_NOINLINE void GemvM(const float* HWY_RESTRICT a, ptrdiff_t lda, const TB* HWY_RESTRICT b, ptrdiff_t ldb,
                        float* HWY_RESTRICT c, ptrdiff_t ldc, size_t n, size_t k, bool accumulate) {
  const DF d;
  constexpr size_t R = GemvRows<kM>();
  for (size_t j0 = 0; j0 < n; j0 += R) {
    const TB* rows[R];
    GemvRowPointers<R>(b, ldb, j0, n, rows);
    VF acc[kM][R];
    HWY_UNROLL(4)
    for (size_t i = 0; i < kM; ++i)
      for (size_t r = 0; r < R; ++r) acc[i][r] = hn::Zero(d);
    size_t p = 0;
    for (; p + kLanes <= k; p += kLanes) {
      VF bv[R];
      if constexpr (kGemvPrefetch != 0)
        for (size_t r = 0; r < R; ++r) hwy::Prefetch(static_cast<const char*>(ElemAddr(rows[r], p)) + kGemvPrefetch);
      for (size_t r = 0; r < R; ++r) bv[r] = RowF32(d, rows[r], p);
      HWY_UNROLL(4)
      for (size_t i = 0; i < kM; ++i) {
        const VF av = hn::LoadU(d, a + static_cast<ptrdiff_t>(i) * lda + p);
        for (size_t r = 0; r < R; ++r) acc[i][r] = hn::MulAdd(av, bv[r], acc[i][r]);
      }
    }
    for (size_t i = 0; i < kM; ++i) {
      const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
      float s[R];
      for (size_t r = 0; r < R; r += 4) SumOfLanes4(acc[i][r], acc[i][r + 1], acc[i][r + 2], acc[i][r + 3], s + r);
      for (size_t q = p; q < k; ++q)
        for (size_t r = 0; r < R; ++r) s[r] += ai[q] * ElemF32(rows[r], q);
      GemvStore<R>(s, c + static_cast<ptrdiff_t>(i) * ldc, j0, n, accumulate);
    }
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
KILN_X86_DIAGNOSTICS_PUSH
// Short rows of B (k = 64, 128 or 256; f32, f16 or Q8_0 blocks): decoding attention's scores, q (group, head_dim)
// times K (positions, head_dim)^T. GemvM spends more on each group's bookkeeping and horizontal sums than on
// its 4 steps of FMAs there (12 GMAC/s for head_dim 64 on Zen 5). Here 4 rows of B at a time are widened
// straight into registers, each vector of B serving the kM rows of A, whose 4 x kM lane-wise partial sums
// stay in registers; every 16 rows of B, each row of A's 16 partial sums are reduced together into one
// vector. Bit-identical to GemvM: the same FMA chain per lane, and the reduction adds exactly as SumOfLanes4
// does (the in-block 4x4 transpose-add, then the 4 blocks left to right), 16 outputs at a time.

// out lane 4g + i = SumOfLanes4's sum of the lanes of v_i of group g, given w[g] = BlockSums4 of group g.
HWY_INLINE __m512 CombineBlocks16(const __m512* w) {
  // x[b] = block b of w[0], w[1], w[2], w[3]: lane 4g + i of x[b] is block b's partial sum of v_i of group g.
  const __m512 t01l = _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(1, 0, 1, 0));  // w0.b0 w0.b1 w1.b0 w1.b1
  const __m512 t23l = _mm512_shuffle_f32x4(w[2], w[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512 t01h = _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512 t23h = _mm512_shuffle_f32x4(w[2], w[3], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512 x0 = _mm512_shuffle_f32x4(t01l, t23l, _MM_SHUFFLE(2, 0, 2, 0));
  const __m512 x1 = _mm512_shuffle_f32x4(t01l, t23l, _MM_SHUFFLE(3, 1, 3, 1));
  const __m512 x2 = _mm512_shuffle_f32x4(t01h, t23h, _MM_SHUFFLE(2, 0, 2, 0));
  const __m512 x3 = _mm512_shuffle_f32x4(t01h, t23h, _MM_SHUFFLE(3, 1, 3, 1));
  return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x0, x1), x2), x3);  // blocks left to right
}

// c[i, j0 : j0 + 16] for kM rows of A (i < kM) and rows j0 .. j0 + 15 of B, k = 16 kSteps (rows past n repeat
// the last row; their results are not stored). k is a compile-time constant so that the row offsets are
// immediates.
template <size_t kM, size_t kSteps, class TB>
HWY_INLINE void GemvShortK16(const float* HWY_RESTRICT a, ptrdiff_t lda, const TB* HWY_RESTRICT b, ptrdiff_t ldb,
                             float* HWY_RESTRICT c, ptrdiff_t ldc, size_t j0, size_t n, bool accumulate) {
  const DF d;
  __m512 w[kM][4];  // per row of A and group of 4 rows of B: BlockSums4 of the group's partial sums
  HWY_UNROLL(4)
  for (size_t g = 0; g < 4; ++g) {
    const TB* rows[4];
    GemvRowPointers<4>(b, ldb, j0 + 4 * g, n, rows);
    VF acc[kM][4];
    HWY_UNROLL(4)
    for (size_t i = 0; i < kM; ++i)
      for (size_t r = 0; r < 4; ++r) acc[i][r] = hn::Zero(d);
    HWY_UNROLL(8)
    for (size_t p = 0; p < 16 * kSteps; p += 16) {
      HWY_UNROLL(4)
      for (size_t r = 0; r < 4; ++r) {
        const VF bv = RowF32(d, rows[r], p);
        HWY_UNROLL(4)  // A's vectors as the FMAs' memory operands (L1): registers go to the partial sums
        for (size_t i = 0; i < kM; ++i)
          acc[i][r] = hn::MulAdd(hn::LoadU(d, a + static_cast<ptrdiff_t>(i) * lda + p), bv, acc[i][r]);
      }
    }
    HWY_UNROLL(4)
    for (size_t i = 0; i < kM; ++i) w[i][g] = BlockSums4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]).raw;
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << HWY_MIN(size_t{16}, n - j0)) - 1u);
  HWY_UNROLL(4)
  for (size_t i = 0; i < kM; ++i) {
    float* ci = c + static_cast<ptrdiff_t>(i) * ldc + static_cast<ptrdiff_t>(j0);
    __m512 s = CombineBlocks16(w[i]);
    if (accumulate) s = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, ci), s);
    _mm512_mask_storeu_ps(ci, mask, s);
  }
}

// GemvM for k = 16 kSteps, 16 rows of B at a time. Four rows of A with k >= 128 go as two pairs over the same
// 16 rows of B (in L1 for the second): in one pass the compiler spilled partial sums inside the FMA loop
// (for k = 64 it keeps them, spilling only block sums).
template <size_t kM, size_t kSteps, class TB>
HWY_NOINLINE void GemvShortK(const float* HWY_RESTRICT a, ptrdiff_t lda, const TB* HWY_RESTRICT b, ptrdiff_t ldb,
                             float* HWY_RESTRICT c, ptrdiff_t ldc, size_t n, bool accumulate) {
  static_assert(kLanes == 16 && kM <= 4, "the AVX-512 targets, up to 4 rows of A");
  for (size_t j0 = 0; j0 < n; j0 += 16) {
    if constexpr (kM == 4 && kSteps > 4) {
      GemvShortK16<2, kSteps>(a, lda, b, ldb, c, ldc, j0, n, accumulate);
      GemvShortK16<2, kSteps>(a + 2 * lda, lda, b, ldb, c + 2 * ldc, ldc, j0, n, accumulate);
    } else {
      GemvShortK16<kM, kSteps>(a, lda, b, ldb, c, ldc, j0, n, accumulate);
    }
  }
}

// GemvShortK for the head sizes of attention: k = 64, 128 or 256, any kM (faster than GemvM at each of these
// on Zen 4 in `kiln-bench --benchmark_filter=BM_matmul_attn_scores`; docs/benchmarks.md). false: not taken.
template <size_t kM, class TB>
HWY_INLINE bool TryGemvShortK(const float* a, ptrdiff_t lda, const TB* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc,
                              size_t n, size_t k, bool accumulate) {
  if (k == 64) {
    GemvShortK<kM, 4>(a, lda, b, ldb, c, ldc, n, accumulate);
    return true;
  }
  if (k == 128) {
    GemvShortK<kM, 8>(a, lda, b, ldb, c, ldc, n, accumulate);
    return true;
  }
  if (k == 256) {
    GemvShortK<kM, 16>(a, lda, b, ldb, c, ldc, n, accumulate);
    return true;
  }
  return false;
}

// Rows of B shorter than a vector (k = 4 or 8, stored back to back: ldb == k): the scores of attention
// with head_dim 8 (stories260K), which GemvM ran entirely in its scalar tail. A vector holds 16 / k rows;
// 16 rows of B are loaded once per group as 4 (lo, hi) pairs of vectors, pair m holding rows 4m .. 4m + 3
// one per 128-bit block (lo: elements 0-3 of each, hi: 4-7). Per row of A, y_m = lo_m * a[0:4] + hi_m *
// a[4:8] (each block's 4 lane-wise partial sums of its row), then BlockSums4 and one permutation put
// the 16 dot products in order. Each output's operations depend only on its row of A and of B, whatever
// n is or where the group starts (the thread splits stay bit for bit).
template <size_t kM, size_t k, class TB>
HWY_NOINLINE void GemvTinyK(const float* HWY_RESTRICT a, ptrdiff_t lda, const TB* HWY_RESTRICT b, float* HWY_RESTRICT c,
                            ptrdiff_t ldc, size_t n, bool accumulate) {
  static_assert(kLanes == 16 && (k == 4 || k == 8), "16 / k rows of B per vector, in whole blocks");
  const DF d;
  __m512 alo[kM], ahi[kM];  // a[i, 0:4] (and a[i, 4:8]) in every block
  for (size_t i = 0; i < kM; ++i) {
    const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
    alo[i] = _mm512_broadcast_f32x4(_mm_loadu_ps(ai));
    ahi[i] = k == 8 ? _mm512_broadcast_f32x4(_mm_loadu_ps(ai + 4)) : alo[i];
  }
  // BlockSums4 leaves row 4i + b in lane 4b + i; lane j takes row j back from lane 4 (j % 4) + j / 4.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  HWY_ALIGN TB tail[16 * k];  // the last group's rows, the last one repeated (results dropped)
  for (size_t j0 = 0; j0 < n; j0 += 16) {
    const size_t rows = HWY_MIN(size_t{16}, n - j0);
    const TB* g = b + j0 * k;  // (16, k)
    if (rows < 16) {
      for (size_t r = 0; r < 16; ++r)
        for (size_t p = 0; p < k; ++p) tail[r * k + p] = g[HWY_MIN(r, rows - 1) * k + p];
      g = tail;
    }
    __m512 lo[4], hi[4];
    for (size_t m = 0; m < 4; ++m) {
      if constexpr (k == 8) {  // rows 4m, 4m + 1 | 4m + 2, 4m + 3 -> their 4-element halves, one row a block
        const __m512 v0 = LoadF32(d, g + (2 * m) * 16).raw, v1 = LoadF32(d, g + (2 * m + 1) * 16).raw;
        lo[m] = _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
        hi[m] = _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
      } else {
        lo[m] = LoadF32(d, g + m * 16).raw;
      }
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1u);
    for (size_t i = 0; i < kM; ++i) {
      VF y[4];
      for (size_t m = 0; m < 4; ++m) {
        __m512 t = _mm512_mul_ps(lo[m], alo[i]);
        if constexpr (k == 8) t = _mm512_fmadd_ps(hi[m], ahi[i], t);
        y[m] = VF{t};
      }
      __m512 s = _mm512_permutexvar_ps(order, BlockSums4(y[0], y[1], y[2], y[3]).raw);
      float* ci = c + static_cast<ptrdiff_t>(i) * ldc + static_cast<ptrdiff_t>(j0);
      if (accumulate) s = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, ci), s);
      _mm512_mask_storeu_ps(ci, mask, s);
    }
  }
}

template <size_t kM, class TB>
HWY_INLINE bool TryGemvTinyK(const float* a, ptrdiff_t lda, const TB* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc,
                             size_t n, size_t k, bool accumulate) {
  if ((k != 4 && k != 8) || ldb != static_cast<ptrdiff_t>(k)) return false;
  if (k == 8) GemvTinyK<kM, 8>(a, lda, b, c, ldc, n, accumulate);
  else GemvTinyK<kM, 4>(a, lda, b, c, ldc, n, accumulate);
  return true;
}
KILN_X86_DIAGNOSTICS_POP
#endif

// One step of the bf16 GEMVs: acc[i][r] += A's pairs q .. q + kLanes (ae / ao: kM rows of k2) times the
// 2 kLanes bf16 of B's row r at row(r). As 32-bit lanes, (x << 16) is the even element's f32 and
// (x & 0xffff0000) the odd one's.
template <size_t kM, size_t R, class RowPtr>
HWY_INLINE void Bf16PairStep(const float* HWY_RESTRICT ae, const float* HWY_RESTRICT ao, size_t k2, size_t q,
                             RowPtr row, VF (&acc)[kM][R]) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const auto hi_mask = hn::Set(du, 0xffff0000u);
  VF be[R], bo[R];
  for (size_t r = 0; r < R; ++r) {
    const auto x = hn::LoadU(du, reinterpret_cast<const uint32_t*>(row(r)));
    be[r] = hn::BitCast(d, hn::ShiftLeft<16>(x));
    bo[r] = hn::BitCast(d, hn::And(x, hi_mask));
  }
  HWY_UNROLL(4)
  for (size_t i = 0; i < kM; ++i) {
    const VF ave = hn::LoadU(d, ae + i * k2 + q), avo = hn::LoadU(d, ao + i * k2 + q);
    for (size_t r = 0; r < R; ++r) acc[i][r] = hn::MulAdd(avo, bo[r], hn::MulAdd(ave, be[r], acc[i][r]));
  }
}

// The same for bf16 B, exact, 32 elements of each row per step: one 64-byte load holds 16 pairs,
// multiplied by A split beforehand into its even (ae) and odd (ao) elements (kM rows of k / 2 each).
template <size_t kM>
HWY_NOINLINE void GemvBf16M(const float* HWY_RESTRICT ae, const float* HWY_RESTRICT ao, const float* HWY_RESTRICT a,
                            ptrdiff_t lda, const hwy::bfloat16_t* HWY_RESTRICT b, ptrdiff_t ldb, float* HWY_RESTRICT c,
                            ptrdiff_t ldc, size_t n, size_t k, bool accumulate) {
  const DF d;
  constexpr size_t R = GemvRows<kM>();
  const size_t k2 = k / 2;  // whole pairs
  for (size_t j0 = 0; j0 < n; j0 += R) {
    const hwy::bfloat16_t* rows[R];
    GemvRowPointers<R>(b, ldb, j0, n, rows);
    VF acc[kM][R];
    HWY_UNROLL(4)
    for (size_t i = 0; i < kM; ++i)
      for (size_t r = 0; r < R; ++r) acc[i][r] = hn::Zero(d);
    size_t q = 0;
    for (; q + kLanes <= k2; q += kLanes) {
      if constexpr (kGemvPrefetch != 0)
        for (size_t r = 0; r < R; ++r) hwy::Prefetch(reinterpret_cast<const char*>(rows[r] + 2 * q) + kGemvPrefetch);
      Bf16PairStep<kM, R>(
          ae, ao, k2, q, [&](size_t r) { return rows[r] + 2 * q; }, acc);
    }
    for (size_t i = 0; i < kM; ++i) {
      const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
      float s[R];
      for (size_t r = 0; r < R; r += 4) SumOfLanes4(acc[i][r], acc[i][r + 1], acc[i][r + 2], acc[i][r + 3], s + r);
      for (size_t p = 2 * q; p < k; ++p)
        for (size_t r = 0; r < R; ++r) s[r] += ai[p] * ToF32(rows[r][p]);
      GemvStore<R>(s, c + static_cast<ptrdiff_t>(i) * ldc, j0, n, accumulate);
    }
  }
}

template <size_t kM, class TB>
HWY_INLINE void GemvRowsOfA(const float* a, ptrdiff_t lda, const TB* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc,
                            size_t n, size_t k, bool accumulate) {
  if constexpr (std::is_same_v<TB, hwy::bfloat16_t>) {
    const size_t k2 = k / 2;
    auto* split = static_cast<float*>(detail::matmul_scratch(3, 2 * kM * k2 * sizeof(float) + 64));
    float* ae = split;
    float* ao = split + kM * k2;
    for (size_t i = 0; i < kM; ++i) {
      const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
      for (size_t q = 0; q < k2; ++q) {
        ae[i * k2 + q] = ai[2 * q];
        ao[i * k2 + q] = ai[2 * q + 1];
      }
    }
    GemvBf16M<kM>(ae, ao, a, lda, b, ldb, c, ldc, n, k, accumulate);
  } else {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if (TryGemvShortK<kM>(a, lda, b, ldb, c, ldc, n, k, accumulate)) return;
    if constexpr (!std::is_same_v<TB, block_q8_0>)  // (k >= 32 there)
      if (TryGemvTinyK<kM>(a, lda, b, ldb, c, ldc, n, k, accumulate)) return;
#endif
    GemvM<kM>(a, lda, b, ldb, c, ldc, n, k, accumulate);
  }
}

template <class TB>
void Gemv(const float* a, ptrdiff_t lda, const TB* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc, size_t m, size_t n,
          size_t k, bool accumulate) {
  for (size_t i = 0; i < m; i += kGemvMaxM) {
    const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
    float* ci = c + static_cast<ptrdiff_t>(i) * ldc;
    const size_t rows = HWY_MIN(kGemvMaxM, m - i);
    if constexpr (kGemvMaxM >= 4) {
      if (rows == 4) {
        GemvRowsOfA<4>(ai, lda, b, ldb, ci, ldc, n, k, accumulate);
        continue;
      }
      if (rows == 3) {
        GemvRowsOfA<3>(ai, lda, b, ldb, ci, ldc, n, k, accumulate);
        continue;
      }
    }
    if (rows == 2) GemvRowsOfA<2>(ai, lda, b, ldb, ci, ldc, n, k, accumulate);
    else GemvRowsOfA<1>(ai, lda, b, ldb, ci, ldc, n, k, accumulate);
  }
}

// ---- Packed rows (f16 / bf16, ops/matmul.hpp). The kernels below do GemvM's / GemvBf16M's arithmetic for
// each (i, j) (the same kLanes steps in the same order, SumOfLanes4, the same scalar tail), so a packed
// matrix gives bit-identical results; only the addresses differ. A group of 8 rows is taken R rows at a
// time (R = 4 for 3-4 rows of A: the second half then comes from L2).

// c[i, j0 + h + r] for the rows h .. h + R of the packed group at g (B.kR rows, all of them in B).
template <size_t kM, size_t R, class TB>
HWY_INLINE void GemvPackedRows(const float* HWY_RESTRICT a, ptrdiff_t lda, const PackedB<TB>& B, const TB* g, size_t h,
                               float* HWY_RESTRICT c, ptrdiff_t ldc, size_t j, bool accumulate) {
  const DF d;
  const size_t k = B.k, kc = B.kc;
  VF acc[kM][R];
  HWY_UNROLL(4)
  for (size_t i = 0; i < kM; ++i)
    for (size_t r = 0; r < R; ++r) acc[i][r] = hn::Zero(d);
  auto step = [&](size_t p, const TB* row0, size_t stride) HWY_ATTR {  // row r's kLanes at row0 + r * stride
    VF bv[R];
    for (size_t r = 0; r < R; ++r) bv[r] = LoadF32(d, row0 + r * stride);
    HWY_UNROLL(4)
    for (size_t i = 0; i < kM; ++i) {
      const VF av = hn::LoadU(d, a + static_cast<ptrdiff_t>(i) * lda + p);
      for (size_t r = 0; r < R; ++r) acc[i][r] = hn::MulAdd(av, bv[r], acc[i][r]);
    }
  };
  size_t p = 0;
  for (; p < kc; p += kLanes) {
    const TB* chunk = g + p / B.kC * (B.kR * B.kC);  // (kR, kC): this chunk of the group's rows
    if (p % B.kC == 0) PackedPrefetch(chunk + h * B.kC, R * B.kC * sizeof(TB));  // each chunk's R rows, once
    step(p, chunk + h * B.kC + p % B.kC, B.kC);
  }
  for (; p + kLanes <= k; p += kLanes) step(p, g + B.kR * kc + h * (k - kc) + (p - kc), k - kc);
  for (size_t i = 0; i < kM; ++i) {
    const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
    float s[R];
    for (size_t r = 0; r < R; r += 4) SumOfLanes4(acc[i][r], acc[i][r + 1], acc[i][r + 2], acc[i][r + 3], s + r);
    for (size_t q = p; q < k; ++q)
      for (size_t r = 0; r < R; ++r) s[r] += ai[q] * ToF32(g[B.kR * kc + (h + r) * (k - kc) + (q - kc)]);
    GemvStore<R>(s, c + static_cast<ptrdiff_t>(i) * ldc, j, j + R, accumulate);
  }
}

// bf16: GemvBf16M's pairs (ae / ao: A's even and odd elements, kM rows of k / 2).
template <size_t kM, size_t R>
HWY_INLINE void GemvBf16PackedRows(const float* HWY_RESTRICT ae, const float* HWY_RESTRICT ao,
                                   const float* HWY_RESTRICT a, ptrdiff_t lda, const PackedB<hwy::bfloat16_t>& B,
                                   const hwy::bfloat16_t* g, size_t h, float* HWY_RESTRICT c, ptrdiff_t ldc, size_t j,
                                   bool accumulate) {
  const DF d;
  const size_t k = B.k, kc = B.kc, k2 = k / 2;
  VF acc[kM][R];
  HWY_UNROLL(4)
  for (size_t i = 0; i < kM; ++i)
    for (size_t r = 0; r < R; ++r) acc[i][r] = hn::Zero(d);
  auto step = [&](size_t q, const hwy::bfloat16_t* row0, size_t stride) HWY_ATTR {  // 2 kLanes elements a row
    Bf16PairStep<kM, R>(
        ae, ao, k2, q, [&](size_t r) { return row0 + r * stride; }, acc);
  };
  size_t q = 0;
  for (; 2 * q < kc; q += kLanes) {
    const hwy::bfloat16_t* chunk = g + 2 * q / B.kC * (B.kR * B.kC);  // (kR, kC): this chunk of the group's rows
    if (2 * q % B.kC == 0) PackedPrefetch(chunk + h * B.kC, R * B.kC * sizeof(hwy::bfloat16_t));
    step(q, chunk + h * B.kC + 2 * q % B.kC, B.kC);
  }
  for (; q + kLanes <= k2; q += kLanes) step(q, g + B.kR * kc + h * (k - kc) + (2 * q - kc), k - kc);
  for (size_t i = 0; i < kM; ++i) {
    const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
    float s[R];
    for (size_t r = 0; r < R; r += 4) SumOfLanes4(acc[i][r], acc[i][r + 1], acc[i][r + 2], acc[i][r + 3], s + r);
    for (size_t p = 2 * q; p < k; ++p)
      for (size_t r = 0; r < R; ++r) s[r] += ai[p] * ToF32(g[B.kR * kc + (h + r) * (k - kc) + (p - kc)]);
    GemvStore<R>(s, c + static_cast<ptrdiff_t>(i) * ldc, j, j + R, accumulate);
  }
}

template <size_t kM, class TB>
HWY_NOINLINE void GemvPackedM(const float* a, ptrdiff_t lda, const PackedB<TB>& B, float* c, ptrdiff_t ldc,
                              bool accumulate) {
  constexpr size_t R = GemvRows<kM>();
  static_assert(PackedB<TB>::kR % R == 0, "a packed group must hold whole GEMV row groups");
  const float *ae = nullptr, *ao = nullptr;
  if constexpr (std::is_same_v<TB, hwy::bfloat16_t>) {  // split A into even and odd elements once
    const size_t k2 = B.k / 2;
    auto* split = static_cast<float*>(detail::matmul_scratch(3, 2 * kM * k2 * sizeof(float) + 64));
    for (size_t i = 0; i < kM; ++i) {
      const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
      for (size_t q = 0; q < k2; ++q) {
        split[i * k2 + q] = ai[2 * q];
        split[kM * k2 + i * k2 + q] = ai[2 * q + 1];
      }
    }
    ae = split;
    ao = split + kM * k2;
  }
  for (size_t j0 = 0; j0 < B.n_grouped; j0 += B.kR) {
    const TB* g = B.b + j0 * B.k;
    for (size_t h = 0; h < B.kR; h += R) {
      if constexpr (std::is_same_v<TB, hwy::bfloat16_t>)
        GemvBf16PackedRows<kM, R>(ae, ao, a, lda, B, g, h, c, ldc, j0 + h, accumulate);
      else GemvPackedRows<kM, R>(a, lda, B, g, h, c, ldc, j0 + h, accumulate);
    }
  }
}

// Packed B (n, k): the whole groups here, the rows past them (row-major) through Gemv.
template <class TB>
void GemvPacked(const float* a, ptrdiff_t lda, const TB* b, float* c, ptrdiff_t ldc, size_t m, size_t n, size_t k,
                bool accumulate) {
  const PackedB<TB> B(b, n, k);
  for (size_t i = 0; i < m; i += kGemvMaxM) {
    const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
    float* ci = c + static_cast<ptrdiff_t>(i) * ldc;
    const size_t rows = HWY_MIN(kGemvMaxM, m - i);
    if constexpr (kGemvMaxM >= 4) {
      if (rows == 4) {
        GemvPackedM<4>(ai, lda, B, ci, ldc, accumulate);
        continue;
      }
      if (rows == 3) {
        GemvPackedM<3>(ai, lda, B, ci, ldc, accumulate);
        continue;
      }
    }
    if (rows == 2) GemvPackedM<2>(ai, lda, B, ci, ldc, accumulate);
    else GemvPackedM<1>(ai, lda, B, ci, ldc, accumulate);
  }
  if (B.n_grouped < n)
    Gemv(a, lda, b + B.n_grouped * k, static_cast<ptrdiff_t>(k), c + B.n_grouped, ldc, m, n - B.n_grouped, k,
         accumulate);
}

#if KILN_MM_HAVE_DPBF16
// Bf16Mode::fast GEMV with vdpbf16ps. ap: kM rows of A as bf16 pairs (k2 = ceil(k / 2) words a row,
// the last one zero-padded when k is odd). Each lane sums pair products; the pairs past the last
// whole 16 go through the same maths in scalar code.
template <size_t kM>
KILN_MM_ATTR_BF16 HWY_NOINLINE void GemvDpBf16M(const uint32_t* HWY_RESTRICT ap, size_t k2,
                                                const hwy::bfloat16_t* HWY_RESTRICT b, ptrdiff_t ldb,
                                                float* HWY_RESTRICT c, ptrdiff_t ldc, size_t n, size_t k,
                                                bool accumulate) {
  constexpr size_t R = GemvRows<kM>();
  for (size_t j0 = 0; j0 < n; j0 += R) {
    const hwy::bfloat16_t* rows[R];
    GemvRowPointers<R>(b, ldb, j0, n, rows);
    __m512 acc[kM][R];
    for (size_t i = 0; i < kM; ++i)
      for (size_t r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
    size_t q = 0;
    for (; 2 * (q + 16) <= k; q += 16) {  // 16 whole pairs = 32 elements of each row
      __m512i bv[R];
      if constexpr (kGemvPrefetch != 0)
        for (size_t r = 0; r < R; ++r) hwy::Prefetch(reinterpret_cast<const char*>(rows[r] + 2 * q) + kGemvPrefetch);
      for (size_t r = 0; r < R; ++r) bv[r] = _mm512_loadu_si512(rows[r] + 2 * q);
      HWY_UNROLL(4)
      for (size_t i = 0; i < kM; ++i) {
        const __m512i av = _mm512_loadu_si512(ap + i * k2 + q);
        for (size_t r = 0; r < R; ++r)
          acc[i][r] = _mm512_dpbf16_ps(acc[i][r], reinterpret_cast<__m512bh>(av), reinterpret_cast<__m512bh>(bv[r]));
      }
    }
    for (size_t i = 0; i < kM; ++i) {
      float s[R];
      for (size_t r = 0; r < R; r += 4)
        SumOfLanes4(VF{acc[i][r]}, VF{acc[i][r + 1]}, VF{acc[i][r + 2]}, VF{acc[i][r + 3]}, s + r);
      for (size_t t = q; t < k2; ++t) {
        const uint32_t pa = ap[i * k2 + t];
        const float a0 = bf16_bits_to_f32(uint16_t(pa)), a1 = bf16_bits_to_f32(uint16_t(pa >> 16));
        for (size_t r = 0; r < R; ++r) {
          const uint32_t pb = Bf16PairOfBf16(rows[r], t, k);
          s[r] += a0 * bf16_bits_to_f32(uint16_t(pb)) + a1 * bf16_bits_to_f32(uint16_t(pb >> 16));
        }
      }
      GemvStore<R>(s, c + static_cast<ptrdiff_t>(i) * ldc, j0, n, accumulate);
    }
  }
}

// A rows rounded to bf16 (nearest even) as pairs: 32 elements per vcvtne2ps2bf16, in memory order.
KILN_MM_ATTR_BF16 inline void ToBf16Pairs(const float* HWY_RESTRICT a, size_t k, uint32_t* HWY_RESTRICT out) {
  size_t q = 0;
  for (; 2 * (q + 16) <= k; q += 16) {
    const __m512 lo = _mm512_loadu_ps(a + 2 * q), hi = _mm512_loadu_ps(a + 2 * q + 16);
    _mm512_storeu_si512(out + q, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
  for (; 2 * q < k; ++q) out[q] = Bf16PairOfF32(a, q, k);
}

inline void GemvDpBf16(const float* a, ptrdiff_t lda, const hwy::bfloat16_t* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc,
                       size_t m, size_t n, size_t k, bool accumulate) {
  const size_t k2 = (k + 1) / 2;
  auto* ap = static_cast<uint32_t*>(detail::matmul_scratch(3, m * k2 * sizeof(uint32_t)));
  for (size_t i = 0; i < m; ++i) ToBf16Pairs(a + static_cast<ptrdiff_t>(i) * lda, k, ap + i * k2);
  for (size_t i = 0; i < m; i += 4) {
    const uint32_t* ai = ap + i * k2;
    float* ci = c + static_cast<ptrdiff_t>(i) * ldc;
    switch (HWY_MIN(size_t{4}, m - i)) {
      case 4:
        GemvDpBf16M<4>(ai, k2, b, ldb, ci, ldc, n, k, accumulate);
        break;
      case 3:
        GemvDpBf16M<3>(ai, k2, b, ldb, ci, ldc, n, k, accumulate);
        break;
      case 2:
        GemvDpBf16M<2>(ai, k2, b, ldb, ci, ldc, n, k, accumulate);
        break;
      default:
        GemvDpBf16M<1>(ai, k2, b, ldb, ci, ldc, n, k, accumulate);
        break;
    }
  }
}
#endif  // KILN_MM_HAVE_DPBF16

}  // namespace mm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
