// kiln/kernels/matmul/colmajor-inl.h - the GEMV path of matmul for a column-major B (kMatmulColMajorB: B[j, p]
// at b[p * ldb + j], i.e. B^T (k, n) row-major): attention's out = P V with V stored position-major, (n_pos,
// head_dim). C's row i is sum_p a[i, p] * (row p of B^T): each row of B^T is read once, contiguously, and
// scaled into kV vectors of accumulators per row of A, so a head's V is one read stream (V^T's head_dim
// rows, ctx apart, were head_dim streams of a few lines each: a 1B decode step's values product ran at
// half the keys' speed for the same bytes). Each output is one FMA chain over p in order, whatever the
// thread split or the rows of A sharing its pass. The columns past the last whole vector go through a
// zero-padded copy of each row; rows shorter than a vector (head_dim 8) take several positions per vector.
// The GEMM path packs B's panels from the same layout (PackB(ColMajorB), gemm-inl.h). Included from
// entry-inl.h only (uses its helpers).

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_MATMUL_COLMAJOR_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_MATMUL_COLMAJOR_INL_H_
#undef KILN_KERNELS_MATMUL_COLMAJOR_INL_H_
#else
#define KILN_KERNELS_MATMUL_COLMAJOR_INL_H_
#endif

#include <algorithm>

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace mm {

// Each output is one FMA chain over p in order, whatever kM and kV, so its bits do not depend on which rows
// of A or columns of B share its pass (attention may split a group's query heads over threads: each head's
// output must not change). The kM kV accumulators of a pass (4 to 16) hide the FMA latency; two partial sums
// per output halved the columns per pass for 3-4 rows of A (SmolLM2's 3 query heads per KV head: 2 passes
// over V instead of 1, markedly slower), so there are none.

// c[i, j0 .. j0 + kV kLanes) for kM rows of A: acc[i][v] += a[i, p] * B^T[p, j0 + v kLanes ..], p = 0 .. k.
// nc < kV kLanes (the last, partial chunk): only the first nc columns are stored.
template <size_t kM, size_t kV, class TB>
HWY_INLINE void GemvColMajorChunk(const float* HWY_RESTRICT a, ptrdiff_t lda, const TB* HWY_RESTRICT b, ptrdiff_t ldb,
                                  float* HWY_RESTRICT c, ptrdiff_t ldc, size_t j0, size_t k, bool accumulate,
                                  size_t nc = kV * kLanes) {
  const DF d;
  VF acc[kM][kV];
  for (size_t i = 0; i < kM; ++i)
    for (size_t v = 0; v < kV; ++v) acc[i][v] = hn::Zero(d);
  for (size_t p = 0; p < k; ++p) {
    const TB* row = b + static_cast<ptrdiff_t>(p) * ldb;  // B^T's row p (ldb in TB: elements or Q8_0 blocks)
    VF bv[kV];
    if (nc >= kV * kLanes) {
      for (size_t v = 0; v < kV; ++v) bv[v] = RowF32(d, row, j0 + v * kLanes);
    } else {  // kV = 1, nc < kLanes: the row's nc values, zero-padded
      HWY_ALIGN float t[kLanes] = {};
      for (size_t j = 0; j < nc; ++j) t[j] = ElemF32(row, j0 + j);
      for (size_t v = 0; v < kV; ++v) bv[v] = hn::Zero(d);
      bv[0] = hn::Load(d, t);
    }
    for (size_t i = 0; i < kM; ++i) {
      const VF av = hn::Set(d, a[static_cast<ptrdiff_t>(i) * lda + static_cast<ptrdiff_t>(p)]);
      for (size_t v = 0; v < kV; ++v) acc[i][v] = hn::MulAdd(av, bv[v], acc[i][v]);
    }
  }
  for (size_t i = 0; i < kM; ++i)
    for (size_t v = 0; v < kV; ++v) {
      const VF sum = acc[i][v];
      float* ci = c + static_cast<ptrdiff_t>(i) * ldc + static_cast<ptrdiff_t>(j0 + v * kLanes);
      if (nc >= (v + 1) * kLanes) {
        hn::StoreU(accumulate ? hn::Add(hn::LoadU(d, ci), sum) : sum, d, ci);
      } else if (nc > v * kLanes) {
        HWY_ALIGN float t[kLanes];
        hn::Store(sum, d, t);
        for (size_t j = 0; j < nc - v * kLanes; ++j) ci[j] = accumulate ? ci[j] + t[j] : t[j];
      }
    }
}

// Vectors of columns per pass: kM kV accumulators, as many as the registers hold beside B's kV vectors.
// Gemma 3 (head_dim 256, 4 query heads) takes 4 passes, each reading 128 of a row's 512 bytes: at 2,048
// positions (1 MiB from memory) 0.75x the transposed layout's speed (BM_matmul_attn_values), at 256 2.4x.
template <size_t kM>
constexpr size_t ColMajorMaxV() {
  return kManyRegs ? 4 : (kM <= 2 ? 4 : 2);
}

// Rows of B^T shorter than a vector (n divides kLanes, rows contiguous: ldb = n; head_dim 8 on AVX-512):
// r = kLanes / n positions per vector, and A's lanes to match (lane l: a[i, p + l / n], a table lookup of
// A's row at p, or of a copy of its last r values); lane l sums column l % n over the positions p = l / n (mod r), and the r
// groups fold into C's n columns in order; positions past the last whole vector are added one by one.
template <size_t kM, class TB>
HWY_NOINLINE void GemvColMajorNarrow(const float* HWY_RESTRICT a, ptrdiff_t lda, const TB* HWY_RESTRICT b,
                                     float* HWY_RESTRICT c, ptrdiff_t ldc, size_t n, size_t k, bool accumulate) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const size_t r = kLanes / n, kv = k / r * r;
  HWY_ALIGN int32_t idx[kLanes];
  for (size_t l = 0; l < kLanes; ++l) idx[l] = static_cast<int32_t>(l / n);
  const auto tbl = hn::IndicesFromVec(d, hn::Load(di, idx));
  VF acc[kM];
  for (size_t i = 0; i < kM; ++i) acc[i] = hn::Zero(d);
  // A's r values at p as a vector: loaded in place while a whole vector fits in the row, else via a copy.
  for (size_t p = 0; p < kv; p += r) {
    const VF bv = LoadF32(d, b + static_cast<ptrdiff_t>(p * n));
    for (size_t i = 0; i < kM; ++i) {
      const float* ai = a + static_cast<ptrdiff_t>(i) * lda + static_cast<ptrdiff_t>(p);
      VF av;
      if (p + kLanes <= k) {
        av = hn::LoadU(d, ai);
      } else {
        HWY_ALIGN float t[kLanes] = {};
        std::copy_n(ai, r, t);
        av = hn::Load(d, t);
      }
      acc[i] = hn::MulAdd(hn::TableLookupLanes(av, tbl), bv, acc[i]);
    }
  }
  for (size_t i = 0; i < kM; ++i) {
    HWY_ALIGN float t[kLanes];
    hn::Store(acc[i], d, t);
    const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
    float* ci = c + static_cast<ptrdiff_t>(i) * ldc;
    for (size_t j = 0; j < n; ++j) {
      float s = t[j];
      for (size_t g = 1; g < r; ++g) s += t[g * n + j];
      for (size_t q = kv; q < k; ++q) s += ai[q] * ToF32(b[q * n + j]);
      ci[j] = accumulate ? ci[j] + s : s;
    }
  }
}

template <size_t kM, class TB>
HWY_NOINLINE void GemvColMajorM(const float* HWY_RESTRICT a, ptrdiff_t lda, const TB* HWY_RESTRICT b, ptrdiff_t ldb,
                                float* HWY_RESTRICT c, ptrdiff_t ldc, size_t n, size_t k, bool accumulate) {
  constexpr size_t kMaxV = ColMajorMaxV<kM>();
  size_t j0 = 0;
  for (; j0 + kMaxV * kLanes <= n; j0 += kMaxV * kLanes)
    GemvColMajorChunk<kM, kMaxV>(a, lda, b, ldb, c, ldc, j0, k, accumulate);
  // The remaining whole vectors in one pass.
  if constexpr (kMaxV > 2) {
    const size_t rest = (n - j0) / kLanes;
    if (rest >= 3) {
      GemvColMajorChunk<kM, 3>(a, lda, b, ldb, c, ldc, j0, k, accumulate);
      j0 += 3 * kLanes;
    } else if (rest == 2) {
      GemvColMajorChunk<kM, 2>(a, lda, b, ldb, c, ldc, j0, k, accumulate);
      j0 += 2 * kLanes;
    }
  }
  for (; j0 + kLanes <= n; j0 += kLanes) GemvColMajorChunk<kM, 1>(a, lda, b, ldb, c, ldc, j0, k, accumulate);
  // The last n - j0 < kLanes columns (an odd head_dim, or a padded row stride): each row's few values
  // widened into a zero-padded vector, then as a whole vector.
  if (j0 < n) GemvColMajorChunk<kM, 1>(a, lda, b, ldb, c, ldc, j0, k, accumulate, n - j0);
}

template <class TB>
void GemvColMajor(const float* a, ptrdiff_t lda, const TB* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc, size_t m,
                  size_t n, size_t k, bool accumulate) {
  [[maybe_unused]] const bool narrow = n < kLanes && kLanes % n == 0 && ldb == static_cast<ptrdiff_t>(n);
  for (size_t i = 0; i < m; i += 4) {
    const float* ai = a + static_cast<ptrdiff_t>(i) * lda;
    float* ci = c + static_cast<ptrdiff_t>(i) * ldc;
    if constexpr (!std::is_same_v<TB, block_q8_0>) {  // (Q8_0 rows: n >= 32)
      if (narrow) {
        switch (HWY_MIN(size_t{4}, m - i)) {
          case 4:
            GemvColMajorNarrow<4>(ai, lda, b, ci, ldc, n, k, accumulate);
            break;
          case 3:
            GemvColMajorNarrow<3>(ai, lda, b, ci, ldc, n, k, accumulate);
            break;
          case 2:
            GemvColMajorNarrow<2>(ai, lda, b, ci, ldc, n, k, accumulate);
            break;
          default:
            GemvColMajorNarrow<1>(ai, lda, b, ci, ldc, n, k, accumulate);
            break;
        }
        continue;
      }
    }
    switch (HWY_MIN(size_t{4}, m - i)) {
      case 4:
        GemvColMajorM<4>(ai, lda, b, ldb, ci, ldc, n, k, accumulate);
        break;
      case 3:
        GemvColMajorM<3>(ai, lda, b, ldb, ci, ldc, n, k, accumulate);
        break;
      case 2:
        GemvColMajorM<2>(ai, lda, b, ldb, ci, ldc, n, k, accumulate);
        break;
      default:
        GemvColMajorM<1>(ai, lda, b, ldb, ci, ldc, n, k, accumulate);
        break;
    }
  }
}

}  // namespace mm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
