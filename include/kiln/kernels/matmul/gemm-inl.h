// kiln/kernels/matmul/gemm-inl.h - the blocked GEMM path of matmul (M > detail::kGemvMaxRows), BLIS-style:
//
//   for each block of kMC rows of A, for each block of kNC columns of C (kept in L2):
//     for each block of kKC along K:
//       pack A (kMC x kKC) into kMR-row panels, k-major              (thread_local scratch slot 0, in L2)
//       for each kNR-column panel of B:
//         pack B (kNR x kKC) transposed to k-major, widened to f32    (slot 1, 32 KiB: stays in L1)
//         for each kMR-row panel of A: microkernel, a kMR x kNR tile of C in registers
//
// The microkernel broadcasts kMR values of A and loads kNV vectors of B per k step (kMR * kNV FMAs),
// streaming the small A panel from L2 while the B panel sits in L1; while it runs it prefetches the
// next B panel into L2 (PrefetchCursor), so packing reads B from L2 rather than waiting on memory.
// Packing transposes 16x16 (AVX-512) or 8x8 (AVX2) blocks in registers. Each element of C is summed
// over k in the same order whatever the tile, range or thread it falls in.
//
// Blocking: 12x2 vectors; 14x2 gains on large squares but loses on smaller products and f16 / bf16 B; 8x3
// and 6x4 have too few accumulators; without N blocking 2-thread scaling drops (docs/history/benchmarks-log.md
// has the measurements). Included from entry-inl.h only.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_MATMUL_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_MATMUL_GEMM_INL_H_
#undef KILN_KERNELS_MATMUL_GEMM_INL_H_
#else
#define KILN_KERNELS_MATMUL_GEMM_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kiln/kernels/x86/common.hpp"

KILN_X86_DIAGNOSTICS_PUSH  // GCC 12's false warnings inside AVX-512 intrinsics (x86/common.hpp)

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace mm {

// Register tile: kMR rows x kNV vectors of C (kMR * kNV accumulators + kNV B vectors + 1 broadcast):
// 24 of the 32 AVX-512 registers, 12 of the 16 of AVX2 / SSE.
inline constexpr size_t kMR = kManyRegs ? 12 : 6;
inline constexpr size_t kNV = 2;
inline constexpr size_t kNR = kNV * kLanes;
// K block: the packed B panel (kKC x kNR f32, or kKC pairs for vdpbf16ps) is 32 KiB, in L1 (48 KiB).
inline constexpr size_t kKC = HWY_MAX(size_t{16}, 32768 / 4 / kNR / 16 * 16);
// N block: the kMC x kNC block of C stays in L2 across the K blocks (A is packed again per N block).
inline constexpr size_t kNC = (1024 + kNR - 1) / kNR * kNR;
// M block: the packed A block (kMC x kKC f32, <= 512 KiB) stays in L2 while every B panel passes.
inline constexpr size_t kMC = (HWY_MAX(size_t{64}, 131072 / kKC) + kMR - 1) / kMR * kMR;

// In-register transpose width of the packing code (0: scalar packing).
#undef KILN_MM_TRANSPOSE
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define KILN_MM_TRANSPOSE 1
inline constexpr size_t kT = 16;
static_assert(kLanes == 16, "AVX-512 vectors hold 16 floats");
// v[i] = row i (16 lanes) -> v[j] = column j. unpack 32-bit, unpack 64-bit, then 4x4 of 128-bit blocks.
HWY_INLINE void Transpose(VF* v) {
  __m512 t[16], u[16];
  HWY_UNROLL(16)
  for (size_t i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(v[2 * i].raw, v[2 * i + 1].raw);
    t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i].raw, v[2 * i + 1].raw);
  }
  HWY_UNROLL(16)
  for (size_t i = 0; i < 4; ++i) {
    const __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  // Block b of u[4i + q] holds rows 4i..4i+3 of column 4b + q.
  HWY_UNROLL(16)
  for (size_t q = 0; q < 4; ++q) {
    const __m512 s0 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0x44), s1 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0xEE);
    const __m512 s2 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0x44);
    const __m512 s3 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0xEE);
    v[q].raw = _mm512_shuffle_f32x4(s0, s2, 0x88);
    v[4 + q].raw = _mm512_shuffle_f32x4(s0, s2, 0xDD);
    v[8 + q].raw = _mm512_shuffle_f32x4(s1, s3, 0x88);
    v[12 + q].raw = _mm512_shuffle_f32x4(s1, s3, 0xDD);
  }
}
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
#define KILN_MM_TRANSPOSE 1
inline constexpr size_t kT = 8;
static_assert(kLanes == 8, "AVX2 vectors hold 8 floats");
HWY_INLINE void Transpose(VF* v) {
  __m256 t[8], u[8];
  HWY_UNROLL(16)
  for (size_t i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(v[2 * i].raw, v[2 * i + 1].raw);
    t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i].raw, v[2 * i + 1].raw);
  }
  HWY_UNROLL(16)
  for (size_t i = 0; i < 2; ++i) {
    const __m256d t0 = _mm256_castps_pd(t[4 * i]), t1 = _mm256_castps_pd(t[4 * i + 1]);
    const __m256d t2 = _mm256_castps_pd(t[4 * i + 2]), t3 = _mm256_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm256_castpd_ps(_mm256_unpacklo_pd(t0, t2));
    u[4 * i + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(t0, t2));
    u[4 * i + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(t1, t3));
    u[4 * i + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(t1, t3));
  }
  HWY_UNROLL(16)
  for (size_t q = 0; q < 4; ++q) {  // block b of u[4i + q]: rows 4i..4i+3 of column 4b + q
    v[q].raw = _mm256_permute2f128_ps(u[q], u[4 + q], 0x20);
    v[4 + q].raw = _mm256_permute2f128_ps(u[q], u[4 + q], 0x31);
  }
}
#else
#define KILN_MM_TRANSPOSE 0
inline constexpr size_t kT = 0;
#endif

HWY_INLINE void PrefetchL2(const void* p) {
#if HWY_ARCH_X86
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
#else
  hwy::Prefetch(p);
#endif
}

// Walks the rows of the next B panel 64 bytes at a time, prefetching into L2, so that the next PackB
// reads from L2 instead of waiting on memory. Microkernels call Step() every (mask + 1) k steps.
struct PrefetchCursor {
  const char* row = nullptr;
  ptrdiff_t ld = 0;      // bytes between rows
  size_t row_bytes = 0;  // bytes of each row in the panel
  size_t off = 0;
  size_t left = 0;  // lines still to prefetch
  size_t mask = 0;
  HWY_INLINE void Step() {
    if (left == 0) return;
    PrefetchL2(row + off);
    off += 64;
    if (off >= row_bytes) {
      off = 0;
      row += ld;
    }
    --left;
  }
};

// ---- Packing. Element j of k step p of a B panel is B[j, k0 + p]; A panels hold kMR rows likewise.

// pb[p * kNR + j] = B[j, p] for j < nr, 0 for nr <= j < kNR; p < kc.
// B's rows j0 .. j0 + nr, columns p0 .. p0 + kc (p0 a multiple of kT), from either layout (RowMajorB, PackedB).
template <class Src>
HWY_INLINE void PackB(const Src& B, size_t j0, size_t p0, size_t nr, size_t kc, float* HWY_RESTRICT pb) {
  size_t p_done = 0;
#if KILN_MM_TRANSPOSE
  {
    const DF d;
    const size_t kc_vec = kc / kT * kT;
    for (size_t g = 0; g < kNR; g += kT) {
      for (size_t p = 0; p < kc_vec; p += kT) {
        VF v[kT];
        HWY_UNROLL(16)
        for (size_t i = 0; i < kT; ++i) v[i] = g + i < nr ? LoadF32(d, B.at(j0 + g + i, p0 + p)) : hn::Zero(d);
        Transpose(v);
        HWY_UNROLL(16)
        for (size_t j = 0; j < kT; ++j) hn::Store(v[j], d, pb + (p + j) * kNR + g);
      }
    }
    p_done = kc_vec;
  }
#endif
  for (size_t p = p_done; p < kc; ++p)
    for (size_t j = 0; j < kNR; ++j) pb[p * kNR + j] = j < nr ? ToF32(*B.at(j0 + j, p0 + p)) : 0.0f;
}

// A column-major B: step p of the panel is kNR contiguous elements of B^T's row p0 + p, widened.
template <class TB>
HWY_INLINE void PackB(const ColMajorB<TB>& B, size_t j0, size_t p0, size_t nr, size_t kc, float* HWY_RESTRICT pb) {
  const DF d;
  for (size_t p = 0; p < kc; ++p) {
    const TB* row = B.at(j0, p0 + p);
    float* dst = pb + p * kNR;
    if (nr == kNR) {
      HWY_UNROLL(4)
      for (size_t v = 0; v < kNR; v += kLanes) hn::Store(LoadF32(d, row + v), d, dst + v);
    } else {
      for (size_t j = 0; j < kNR; ++j) dst[j] = j < nr ? ToF32(row[j]) : 0.0f;
    }
  }
}

// Panels of kMR rows: pa[panel * kMR * kc + p * kMR + r] = A[panel * kMR + r, p] (0 past mc).
// The transposed columns are stored whole (kT lanes) at a kMR stride: each store's extra lanes land
// where the next column (or the next panel, packed later) goes. The buffer has kT floats of slack.
HWY_INLINE void PackA(const float* HWY_RESTRICT a, ptrdiff_t lda, size_t mc, size_t kc, float* HWY_RESTRICT pa) {
  for (size_t i0 = 0; i0 < mc; i0 += kMR, pa += kMR * kc) {
    const size_t mr = HWY_MIN(kMR, mc - i0);
    const float* rows = a + static_cast<ptrdiff_t>(i0) * lda;
    size_t p_done = 0;
#if KILN_MM_TRANSPOSE
    {
      static_assert(kMR <= kT, "PackA transposes one kT x kT block per kMR rows");
      const DF d;
      for (; p_done + kT <= kc; p_done += kT) {
        VF v[kT];
        HWY_UNROLL(16)
        for (size_t r = 0; r < kT; ++r)
          v[r] = r < mr ? hn::LoadU(d, rows + static_cast<ptrdiff_t>(r) * lda + p_done) : hn::Zero(d);
        Transpose(v);
        HWY_UNROLL(16)
        for (size_t j = 0; j < kT; ++j) hn::StoreU(v[j], d, pa + (p_done + j) * kMR);
      }
    }
#endif
    for (size_t p = p_done; p < kc; ++p)
      for (size_t r = 0; r < kMR; ++r) pa[p * kMR + r] = r < mr ? rows[static_cast<ptrdiff_t>(r) * lda + p] : 0.0f;
  }
}

// ---- Microkernel: c (kRows x kNR, row stride ldc) = [c +] pa panel * pb panel over kc steps. kRows is
// kMR, or fewer for the last panel of A (whose packed stride is still kMR).
template <size_t kRows>
HWY_NOINLINE void KernelF32(size_t kc, const float* HWY_RESTRICT pa, const float* HWY_RESTRICT pb,
                            float* HWY_RESTRICT c, ptrdiff_t ldc, bool load_c, PrefetchCursor& pf_ref) {
  const DF d;
  PrefetchCursor pf = pf_ref;
  if (load_c)  // the C tile is read at the end: fetch it meanwhile
    for (size_t i = 0; i < kRows; ++i)
      for (size_t v = 0; v < kNR; v += 16) hwy::Prefetch(c + static_cast<ptrdiff_t>(i) * ldc + v);
  VF acc[kRows][kNV];
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i)
    for (size_t v = 0; v < kNV; ++v) acc[i][v] = hn::Zero(d);
  for (size_t p = 0; p < kc; ++p) {
    if ((p & pf.mask) == 0) pf.Step();
    VF bv[kNV];
    for (size_t v = 0; v < kNV; ++v) bv[v] = hn::Load(d, pb + p * kNR + v * kLanes);
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i) {
      const VF av = hn::Set(d, pa[p * kMR + i]);
      for (size_t v = 0; v < kNV; ++v) acc[i][v] = hn::MulAdd(av, bv[v], acc[i][v]);
    }
  }
  HWY_UNROLL(16)
  for (size_t i = 0; i < kRows; ++i)
    for (size_t v = 0; v < kNV; ++v) {
      float* out = c + static_cast<ptrdiff_t>(i) * ldc + v * kLanes;
      hn::StoreU(load_c ? hn::Add(hn::LoadU(d, out), acc[i][v]) : acc[i][v], d, out);
    }
  pf_ref = pf;
}

// The loops around the microkernel. P (a packing/kernel policy) works in "k units": one f32 element,
// or one bf16 pair for vdpbf16ps; ku = k units in all.
// Where the next B panel (rows n1 .. n1 + rows, columns p0 .. p0 + elems) lies, for the prefetch cursor.
// Row-major: `rows` rows of `elems` elements, ldb apart; column-major: `elems` rows of B^T, `rows` each.
template <class TB>
HWY_INLINE void StridedPanel(const TB* first, ptrdiff_t ldb, size_t lines, size_t per_line, PrefetchCursor& pf) {
  pf.row = reinterpret_cast<const char*>(first);
  pf.ld = ldb * static_cast<ptrdiff_t>(sizeof(TB));
  pf.row_bytes = per_line * sizeof(TB);
  pf.left = lines * ((pf.row_bytes + 63) / 64);
}
template <class TB>
HWY_INLINE void PanelGeometry(const RowMajorB<TB>& B, size_t n1, size_t rows, size_t p0, size_t elems,
                              PrefetchCursor& pf) {
  StridedPanel(B.at(n1, p0), B.ldb, rows, elems, pf);
}
template <class TB>
HWY_INLINE void PanelGeometry(const ColMajorB<TB>& B, size_t n1, size_t rows, size_t p0, size_t elems,
                              PrefetchCursor& pf) {
  StridedPanel(B.at(n1, p0), B.ldb, elems, rows, pf);
}
// Packed: a panel's whole groups hold its chunks contiguously, 8 rows' worth per group (the tail columns
// and rows past the last group, a small share, are left to the hardware).
template <class TB>
HWY_INLINE void PanelGeometry(const PackedB<TB>& B, size_t n1, size_t rows, size_t p0, size_t elems,
                              PrefetchCursor& pf) {
  const size_t groups = n1 >= B.n_grouped ? 0 : (HWY_MIN(n1 + rows, B.n_grouped) - n1) / B.kR;
  if (groups == 0 || p0 >= B.kc) return;
  pf.row = reinterpret_cast<const char*>(B.at(n1, p0));
  pf.ld = static_cast<ptrdiff_t>(B.kR * B.k * sizeof(TB));
  pf.row_bytes = B.kR * HWY_MIN(elems, B.kc - p0) * sizeof(TB);
  pf.left = groups * ((pf.row_bytes + 63) / 64);
}

template <class P, class Src>
void GemmBlocked(const float* a, ptrdiff_t lda, const Src& B, float* c, ptrdiff_t ldc, size_t m, size_t n, size_t k,
                 bool accumulate) {
  using T = typename P::Packed;
  const size_t ku = (k + P::kUnit - 1) / P::kUnit;
  const size_t mc_max = HWY_MIN(kMC, (m + kMR - 1) / kMR * kMR);
  auto* pa = static_cast<T*>(detail::matmul_scratch(0, (mc_max * kKC + kLanes) * sizeof(T)));
  auto* pb = static_cast<T*>(detail::matmul_scratch(1, kKC * kNR * sizeof(T)));
  for (size_t m0 = 0; m0 < m; m0 += kMC)
    for (size_t nb = 0; nb < n; nb += kNC) {
      const size_t mc = HWY_MIN(kMC, m - m0), nb_end = HWY_MIN(n, nb + kNC);
      const size_t panels = (mc + kMR - 1) / kMR;
      for (size_t u0 = 0; u0 < ku; u0 += kKC) {
        const size_t kc = HWY_MIN(kKC, ku - u0);
        P::PackA(a + static_cast<ptrdiff_t>(m0) * lda, lda, mc, u0, kc, k, pa);
        const bool load_c = accumulate || u0 > 0;
        for (size_t n0 = nb; n0 < nb_end; n0 += kNR) {
          const size_t nr = HWY_MIN(kNR, nb_end - n0);
          P::PackB(B, n0, nr, u0, kc, k, pb);
          // Prefetch the next B panel (in loop order) into L2 while this one is used.
          PrefetchCursor pf;
          {
            size_t n1 = n0 + kNR, u1 = u0;  // next panel in loop order:
            if (n1 >= nb_end) {
              n1 = nb;
              u1 = u0 + kKC;
            }  // next K block of this N block,
            if (u1 >= ku) {
              n1 = nb + kNC;
              u1 = 0;
            }                                     // the next N block,
            if (n1 >= n && m0 + kMC < m) n1 = 0;  // the next M block
            if (n1 < n) {
              const size_t rows = HWY_MIN(kNR, HWY_MIN(n, n1 / kNC * kNC + kNC) - n1);
              PanelGeometry(B, n1, rows, u1 * P::kUnit, HWY_MIN(kKC * P::kUnit, k - u1 * P::kUnit), pf);
              // Step often enough to finish within this panel's microkernel calls (every 1 to 8 k steps).
              const size_t steps = panels * kc;
              pf.mask = steps >= 8 * pf.left ? 7 : steps >= 4 * pf.left ? 3 : steps >= 2 * pf.left ? 1 : 0;
            }
          }
          for (size_t ip = 0; ip < panels; ++ip) {
            const size_t i0 = ip * kMR, mr = HWY_MIN(kMR, mc - i0);
            float* ct = c + static_cast<ptrdiff_t>(m0 + i0) * ldc + static_cast<ptrdiff_t>(n0);
            const T* pai = pa + ip * kMR * kc;
            // The last panel of A may be short: a kernel of kMR / 3, 2 kMR / 3 or kMR rows covers it.
            const size_t rows = mr <= kMR / 3 ? kMR / 3 : mr <= 2 * kMR / 3 ? 2 * kMR / 3 : kMR;
            auto kernel = [&](float* cc, ptrdiff_t ldcc) {
              if (rows == kMR) P::template Kernel<kMR>(kc, pai, pb, cc, ldcc, load_c, pf);
              else if (rows == 2 * kMR / 3) P::template Kernel<2 * kMR / 3>(kc, pai, pb, cc, ldcc, load_c, pf);
              else P::template Kernel<kMR / 3>(kc, pai, pb, cc, ldcc, load_c, pf);
            };
            if (mr == rows && nr == kNR) {
              kernel(ct, ldc);
            } else {  // edge tile: through a full-size tile, the same operations per element
              alignas(64) float tile[kMR * kNR];
              if (load_c)
                for (size_t i = 0; i < mr; ++i)
                  for (size_t j = 0; j < nr; ++j) tile[i * kNR + j] = ct[static_cast<ptrdiff_t>(i) * ldc + j];
              kernel(tile, static_cast<ptrdiff_t>(kNR));
              for (size_t i = 0; i < mr; ++i)
                for (size_t j = 0; j < nr; ++j) ct[static_cast<ptrdiff_t>(i) * ldc + j] = tile[i * kNR + j];
            }
          }
        }
      }
    }
}

// f32 (and f16/bf16 widened exactly) policy: k units are elements.
template <class TB>
struct PolicyF32 {
  using Packed = float;
  static constexpr size_t kUnit = 1;
  static void PackA(const float* a, ptrdiff_t lda, size_t mc, size_t u0, size_t kc, size_t /*k*/, float* pa) {
    mm::PackA(a + u0, lda, mc, kc, pa);
  }
  template <class Src>
  static void PackB(const Src& B, size_t n0, size_t nr, size_t u0, size_t kc, size_t /*k*/, float* pb) {
    mm::PackB(B, n0, u0, nr, kc, pb);
  }
  template <size_t kRows>
  static void Kernel(size_t kc, const float* pa, const float* pb, float* c, ptrdiff_t ldc, bool load_c,
                     PrefetchCursor& pf) {
    KernelF32<kRows>(kc, pa, pb, c, ldc, load_c, pf);
  }
};

template <class TB>
void Gemm(const float* a, ptrdiff_t lda, const TB* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc, size_t m, size_t n,
          size_t k, bool accumulate) {
  GemmBlocked<PolicyF32<TB>>(a, lda, RowMajorB<TB>{b, ldb}, c, ldc, m, n, k, accumulate);
}

#if KILN_MM_HAVE_DPBF16
// Bf16Mode::fast policy: k units are bf16 pairs (u32 words); A is rounded to bf16 while packed.
struct PolicyDpBf16 {
  using Packed = uint32_t;
  static constexpr size_t kUnit = 2;

  // Pairs (2 (u0 + q), 2 (u0 + q) + 1) of each row; the second is 0 past k.
  KILN_MM_ATTR_BF16 static void PackA(const float* a, ptrdiff_t lda, size_t mc, size_t u0, size_t kc, size_t k,
                                      uint32_t* pa) {
    const size_t kk = k - 2 * u0;  // elements left from this block on
    const DF d;
    for (size_t i0 = 0; i0 < mc; i0 += kMR, pa += kMR * kc) {
      const size_t mr = HWY_MIN(kMR, mc - i0);
      const float* rows = a + static_cast<ptrdiff_t>(i0) * lda + 2 * u0;
      const size_t q_vec = HWY_MIN(kc, kk / 2) / 16 * 16;  // whole pairs, 16 at a time
      for (size_t q0 = 0; q0 < q_vec; q0 += 16) {
        VF v[16];
        HWY_UNROLL(16)
        for (size_t r = 0; r < 16; ++r) {
          if (r < mr) {
            const float* p = rows + static_cast<ptrdiff_t>(r) * lda + 2 * q0;
            v[r].raw = _mm512_castsi512_ps(
                reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p))));
          } else {
            v[r] = hn::Zero(d);
          }
        }
        Transpose(v);
        HWY_UNROLL(16)
        for (size_t j = 0; j < 16; ++j) hn::StoreU(v[j], d, reinterpret_cast<float*>(pa + (q0 + j) * kMR));
      }
      for (size_t q = q_vec; q < kc; ++q)
        for (size_t r = 0; r < kMR; ++r)
          pa[q * kMR + r] = r < mr ? Bf16PairOfF32(rows + static_cast<ptrdiff_t>(r) * lda, q, kk) : 0u;
    }
  }

  static void PackB(const RowMajorB<hwy::bfloat16_t>& B, size_t n0, size_t nr, size_t u0, size_t kc, size_t k,
                    uint32_t* pb) {
    const hwy::bfloat16_t* b = B.at(n0, 0);
    const ptrdiff_t ldb = B.ldb;
    const size_t kk = k - 2 * u0;
    const DF d;
    const size_t q_vec = HWY_MIN(kc, kk / 2) / 16 * 16;  // whole pairs, 16 at a time
    for (size_t g = 0; g < kNR; g += 16) {
      for (size_t q = 0; q < q_vec; q += 16) {
        VF v[16];
        HWY_UNROLL(16)
        for (size_t i = 0; i < 16; ++i)
          v[i] =
              g + i < nr
                  ? hn::LoadU(d, reinterpret_cast<const float*>(b + static_cast<ptrdiff_t>(g + i) * ldb + 2 * (u0 + q)))
                  : hn::Zero(d);
        Transpose(v);
        HWY_UNROLL(16)
        for (size_t j = 0; j < 16; ++j) hn::Store(v[j], d, reinterpret_cast<float*>(pb + (q + j) * kNR + g));
      }
    }
    for (size_t q = q_vec; q < kc; ++q)
      for (size_t j = 0; j < kNR; ++j)
        pb[q * kNR + j] = j < nr ? Bf16PairOfBf16(b + static_cast<ptrdiff_t>(j) * ldb + 2 * u0, q, kk) : 0u;
  }

  template <size_t kRows>
  KILN_MM_ATTR_BF16 HWY_NOINLINE static void Kernel(size_t kc, const uint32_t* HWY_RESTRICT pa,
                                                    const uint32_t* HWY_RESTRICT pb, float* HWY_RESTRICT c,
                                                    ptrdiff_t ldc, bool load_c, PrefetchCursor& pf_ref) {
    PrefetchCursor pf = pf_ref;
    if (load_c)
      for (size_t i = 0; i < kRows; ++i)
        for (size_t v = 0; v < kNR; v += 16) hwy::Prefetch(c + static_cast<ptrdiff_t>(i) * ldc + v);
    __m512 acc[kRows][kNV];
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i)
      for (size_t v = 0; v < kNV; ++v) acc[i][v] = _mm512_setzero_ps();
    for (size_t q = 0; q < kc; ++q) {
      if ((q & pf.mask) == 0) pf.Step();
      __m512i bv[kNV];
      for (size_t v = 0; v < kNV; ++v) bv[v] = _mm512_load_si512(pb + q * kNR + v * 16);
      HWY_UNROLL(16)
      for (size_t i = 0; i < kRows; ++i) {
        const __m512i av = _mm512_set1_epi32(static_cast<int>(pa[q * kMR + i]));
        for (size_t v = 0; v < kNV; ++v)
          acc[i][v] = _mm512_dpbf16_ps(acc[i][v], reinterpret_cast<__m512bh>(av), reinterpret_cast<__m512bh>(bv[v]));
      }
    }
    HWY_UNROLL(16)
    for (size_t i = 0; i < kRows; ++i)
      for (size_t v = 0; v < kNV; ++v) {
        float* out = c + static_cast<ptrdiff_t>(i) * ldc + v * 16;
        _mm512_storeu_ps(out, load_c ? _mm512_add_ps(_mm512_loadu_ps(out), acc[i][v]) : acc[i][v]);
      }
    pf_ref = pf;
  }
};

inline void GemmDpBf16(const float* a, ptrdiff_t lda, const hwy::bfloat16_t* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc,
                       size_t m, size_t n, size_t k, bool accumulate) {
  GemmBlocked<PolicyDpBf16>(a, lda, RowMajorB<hwy::bfloat16_t>{b, ldb}, c, ldc, m, n, k, accumulate);
}
#endif  // KILN_MM_HAVE_DPBF16

}  // namespace mm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

KILN_X86_DIAGNOSTICS_POP

#endif  // per-target include guard
