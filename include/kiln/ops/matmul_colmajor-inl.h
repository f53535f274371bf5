// kiln/ops/matmul_colmajor-inl.h - the GEMV path of matmul for a column-major B (kMatmulColMajorB: B[j, p]
// at b[p * ldb + j], i.e. B^T (k, n) row-major): attention's out = P V with V stored position-major, (n_pos,
// head_dim). C's row i is sum_p a[i, p] * (row p of B^T): each row of B^T is read once, contiguously, and
// scaled into kV vectors of accumulators per row of A, so a head's V is one read stream (V^T's head_dim
// rows, ctx apart, were head_dim streams of a few lines each). Each output is one FMA chain over p in
// order (the scalar columns past the last vector too, std::fma). The GEMM path packs B's panels from the
// same layout (PackB(ColMajorB), matmul_gemm-inl.h). Included from matmul-inl.h only (uses its helpers).

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_OPS_MATMUL_COLMAJOR_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_OPS_MATMUL_COLMAJOR_INL_H_
#undef KILN_OPS_MATMUL_COLMAJOR_INL_H_
#else
#define KILN_OPS_MATMUL_COLMAJOR_INL_H_
#endif

#include <cmath>

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace mm {

// c[i, j0 .. j0 + kV kLanes) for kM rows of A: acc[i][v] += a[i, p] * B^T[p, j0 + v kLanes ..], p = 0 .. k.
template <size_t kM, size_t kV, class TB>
HWY_INLINE void GemvColMajorChunk(const float* HWY_RESTRICT a, ptrdiff_t lda, const TB* HWY_RESTRICT b,
                                  ptrdiff_t ldb, float* HWY_RESTRICT c, ptrdiff_t ldc, size_t j0, size_t k,
                                  bool accumulate) {
  const DF d;
  VF acc[kM][kV];
  for (size_t i = 0; i < kM; ++i)
    for (size_t v = 0; v < kV; ++v) acc[i][v] = hn::Zero(d);
  const TB* row = b + j0;
  for (size_t p = 0; p < k; ++p, row += ldb) {
    VF bv[kV];
    for (size_t v = 0; v < kV; ++v) bv[v] = LoadF32(d, row + v * kLanes);
    for (size_t i = 0; i < kM; ++i) {
      const VF av = hn::Set(d, a[static_cast<ptrdiff_t>(i) * lda + static_cast<ptrdiff_t>(p)]);
      for (size_t v = 0; v < kV; ++v) acc[i][v] = hn::MulAdd(av, bv[v], acc[i][v]);
    }
  }
  for (size_t i = 0; i < kM; ++i)
    for (size_t v = 0; v < kV; ++v) {
      float* ci = c + static_cast<ptrdiff_t>(i) * ldc + static_cast<ptrdiff_t>(j0 + v * kLanes);
      hn::StoreU(accumulate ? hn::Add(hn::LoadU(d, ci), acc[i][v]) : acc[i][v], d, ci);
    }
}

// Vectors of columns per pass: as many accumulators as the registers hold beside B's kV vectors.
template <size_t kM>
constexpr size_t ColMajorMaxV() {
  return kManyRegs ? (kM <= 2 ? 8 : 4) : (kM <= 2 ? 4 : 2);
}

template <size_t kM, class TB>
HWY_NOINLINE void GemvColMajorM(const float* HWY_RESTRICT a, ptrdiff_t lda, const TB* HWY_RESTRICT b, ptrdiff_t ldb,
                                float* HWY_RESTRICT c, ptrdiff_t ldc, size_t n, size_t k, bool accumulate) {
  constexpr size_t kMaxV = ColMajorMaxV<kM>();
  size_t j0 = 0;
  for (; j0 + kMaxV * kLanes <= n; j0 += kMaxV * kLanes)
    GemvColMajorChunk<kM, kMaxV>(a, lda, b, ldb, c, ldc, j0, k, accumulate);
  // The remaining whole vectors in one pass (head_dim 64 on AVX-512: 4), then the scalar columns.
  const size_t rest = (n - j0) / kLanes;
  if constexpr (kMaxV > 4) {
    if (rest >= 4) {
      GemvColMajorChunk<kM, 4>(a, lda, b, ldb, c, ldc, j0, k, accumulate);
      j0 += 4 * kLanes;
    }
  }
  const size_t rest2 = (n - j0) / kLanes;
  if constexpr (kMaxV > 2) {
    if (rest2 >= 2) {
      if (rest2 >= 3) {
        GemvColMajorChunk<kM, 3>(a, lda, b, ldb, c, ldc, j0, k, accumulate);
        j0 += 3 * kLanes;
      } else {
        GemvColMajorChunk<kM, 2>(a, lda, b, ldb, c, ldc, j0, k, accumulate);
        j0 += 2 * kLanes;
      }
    }
  }
  for (; j0 + kLanes <= n; j0 += kLanes) GemvColMajorChunk<kM, 1>(a, lda, b, ldb, c, ldc, j0, k, accumulate);
  for (; j0 < n; ++j0)
    for (size_t i = 0; i < kM; ++i) {
      const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
      float s = 0.0f;
      for (size_t p = 0; p < k; ++p) s = std::fma(ai[p], ToF32(b[static_cast<ptrdiff_t>(p) * ldb + static_cast<ptrdiff_t>(j0)]), s);
      float& ci = c[static_cast<ptrdiff_t>(i) * ldc + static_cast<ptrdiff_t>(j0)];
      ci = accumulate ? ci + s : s;
    }
}

template <class TB>
void GemvColMajor(const float* a, ptrdiff_t lda, const TB* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc, size_t m,
                  size_t n, size_t k, bool accumulate) {
  for (size_t i = 0; i < m; i += 4) {
    const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
    float* ci = c + static_cast<ptrdiff_t>(i) * ldc;
    switch (HWY_MIN(size_t{4}, m - i)) {
      case 4: GemvColMajorM<4>(ai, lda, b, ldb, ci, ldc, n, k, accumulate); break;
      case 3: GemvColMajorM<3>(ai, lda, b, ldb, ci, ldc, n, k, accumulate); break;
      case 2: GemvColMajorM<2>(ai, lda, b, ldb, ci, ldc, n, k, accumulate); break;
      default: GemvColMajorM<1>(ai, lda, b, ldb, ci, ldc, n, k, accumulate); break;
    }
  }
}

}  // namespace mm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
