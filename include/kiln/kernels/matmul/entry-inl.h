// kiln/kernels/matmul/entry-inl.h - Highway bodies of ops/matmul.hpp, compiled once per target by the
// KILN_IMPLEMENTATION translation unit (see kiln/implementation.hpp). Not for direct inclusion.
//
// This file holds the helpers both paths share and the per-target entry points; the GEMV path is in
// gemv-inl.h and the blocked GEMM path in gemm-inl.h (included from here only).

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_MATMUL_ENTRY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_MATMUL_ENTRY_INL_H_
#undef KILN_KERNELS_MATMUL_ENTRY_INL_H_
#else
#define KILN_KERNELS_MATMUL_ENTRY_INL_H_
#endif

#include <hwy/highway.h>

#include "kiln/kernels/x86/common.hpp"

#include "kiln/ops/dequant_matmul.hpp"
#include "kiln/kernels/matmul/lane_sums-inl.h"
#include "kiln/kernels/q8_0_rows-inl.h"
#include "kiln/ops/matmul.hpp"
#include "kiln/quant/blocks.hpp"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace mm {

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
inline constexpr size_t kLanes = hn::MaxLanes(DF());

// Register file: AVX-512 has 32 vector registers, the other x86 targets 16.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr bool kManyRegs = true;
#else
inline constexpr bool kManyRegs = false;
#endif

// vdpbf16ps is compiled into the AVX3_DL target only; the CPU check is at run time because AVX3_DL
// (Ice Lake and later) does not imply AVX512-BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and later).
#undef KILN_MM_HAVE_DPBF16
#if HWY_TARGET == HWY_AVX3_DL
#define KILN_MM_HAVE_DPBF16 1
// Functions with vdpbf16ps carry KILN_MM_ATTR_BF16 (x86/common.hpp).
inline bool cpu_has_dpbf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}
#else
#define KILN_MM_HAVE_DPBF16 0
#endif

// f32 vector from kLanes elements of B at p (f16 and bf16 widen exactly).
HWY_INLINE VF LoadF32(DF d, const float* HWY_RESTRICT p) { return hn::LoadU(d, p); }
HWY_INLINE VF LoadF32(DF d, const hwy::float16_t* HWY_RESTRICT p) {
  return hn::PromoteTo(d, hn::LoadU(hn::Rebind<hwy::float16_t, DF>(), p));
}
HWY_INLINE VF LoadF32(DF d, const hwy::bfloat16_t* HWY_RESTRICT p) {
  return hn::PromoteTo(d, hn::LoadU(hn::Rebind<hwy::bfloat16_t, DF>(), p));
}

// B's rows where they are stored. RowMajorB: row j at b + j * ldb. PackedB: the packed-rows layout of
// ops/matmul.hpp (f16/bf16, n rows of k). at(j, p) is where element (j, p) is; the kLanes (or kT) elements
// from there belong to row j when p is a multiple of kLanes (kT): chunks and the tail start on such p.
template <class TB>
struct RowMajorB {
  const TB* b;
  ptrdiff_t ldb;
  HWY_INLINE const TB* at(size_t j, size_t p) const { return b + static_cast<ptrdiff_t>(j) * ldb + p; }
};
// ColMajorB: B[j, p] at b + p * ldb + j (B^T row-major, e.g. attention's V (positions, head_dim)); at()
// names one element only (the kLanes from there run along j, not p): it has its own PackB.
template <class TB>
struct ColMajorB {
  const TB* b;
  ptrdiff_t ldb;
  HWY_INLINE const TB* at(size_t j, size_t p) const { return b + static_cast<ptrdiff_t>(p) * ldb + j; }
};
template <class TB>
struct PackedB {
  static constexpr size_t kR = detail::kPackRows, kC = detail::kPackChunkBytes / sizeof(TB);
  const TB* b;
  size_t k, n_grouped, kc;  // rows in whole groups; columns in whole chunks
  PackedB(const TB* b_, size_t n, size_t k_) : b(b_), k(k_), n_grouped(n / kR * kR), kc(k_ / kC * kC) {}
  HWY_INLINE const TB* at(size_t j, size_t p) const {
    if (j >= n_grouped) return b + j * k + p;
    const TB* g = b + j / kR * kR * k;
    const size_t r = j % kR;
    return p < kc ? g + p / kC * (kR * kC) + r * kC + p % kC : g + kR * kc + r * (k - kc) + (p - kc);
  }
};

HWY_INLINE float ToF32(float v) { return v; }
HWY_INLINE float ToF32(hwy::float16_t v) {
  uint16_t bits;  // hwy::float16_t is a struct of bits on x86, the native __fp16 on Arm
  std::memcpy(&bits, &v, sizeof(bits));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(bits);  // F16C (every AVX2 target has it): one instruction, exact like the scalar code
#else
  return f16_bits_to_f32(bits);
#endif
}
HWY_INLINE float ToF32(hwy::bfloat16_t v) { return bf16_bits_to_f32(v.bits); }

// Rows of B as the GEMV kernels read them (B row-major: rows[r] is row j; column-major: the row of B^T at p):
// RowF32(d, row, p) the kLanes elements from p on (p a multiple of kLanes), ElemF32(row, p) one, ElemAddr(row, p)
// its address (for prefetches). f32 / f16 / bf16 rows are at row + p. A row of Q8_0 blocks (the q8_0 KV cache)
// widens to d * q through q8rows (kernels/q8_0_rows-inl.h, shared with the tiled attention), exact in f32, so a
// product over it has the bits of the same kernel over an f32 B holding the dequantized values.
template <class TB>
HWY_INLINE VF RowF32(DF d, const TB* HWY_RESTRICT row, size_t p) {
  return LoadF32(d, row + p);
}
template <class TB>
HWY_INLINE float ElemF32(const TB* row, size_t p) {
  return ToF32(row[p]);
}
template <class TB>
HWY_INLINE const void* ElemAddr(const TB* row, size_t p) {
  return row + p;
}
HWY_INLINE VF RowF32(DF d, const block_q8_0* HWY_RESTRICT row, size_t p) {
  const block_q8_0& blk = row[p / QK8_0];
  return q8rows::Widen(d, blk, p % QK8_0, hn::Set(d, q8rows::Scale(blk)));
}
HWY_INLINE float ElemF32(const block_q8_0* row, size_t p) {
  return q8rows::Scale(row[p / QK8_0]) * static_cast<float>(row[p / QK8_0].qs[p % QK8_0]);
}
HWY_INLINE const void* ElemAddr(const block_q8_0* row, size_t p) { return row[p / QK8_0].qs + p % QK8_0; }

// f32 rounded to bf16 (nearest even) and back: what Bf16Mode::fast does to A.
HWY_INLINE float RoundBf16(float v) { return bf16_bits_to_f32(f32_to_bf16_bits(v)); }

// The bf16 pair (v[2q], v[2q + 1]) as the 32-bit word vdpbf16ps reads (low half first); a missing
// second element (odd k) is 0.
HWY_INLINE uint32_t Bf16PairOfF32(const float* v, size_t q, size_t k) {
  const uint32_t lo = f32_to_bf16_bits(v[2 * q]);
  const uint32_t hi = 2 * q + 1 < k ? f32_to_bf16_bits(v[2 * q + 1]) : 0u;
  return lo | (hi << 16);
}
HWY_INLINE uint32_t Bf16PairOfBf16(const hwy::bfloat16_t* v, size_t q, size_t k) {
  const uint32_t lo = v[2 * q].bits;
  const uint32_t hi = 2 * q + 1 < k ? v[2 * q + 1].bits : 0u;
  return lo | (hi << 16);
}

// BlockSums4 and SumOfLanes4 (the GEMV's horizontal sums) live in lane_sums-inl.h, shared with the exact
// path's fused GEMV (dequant-inl.h), which must add exactly as GemvM does.
using lanes::SumOfLanes4;
#if HWY_TARGET != HWY_SCALAR
using lanes::BlockSums4;
#endif

}  // namespace mm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#include "kiln/kernels/matmul/gemv-inl.h"
#include "kiln/kernels/matmul/gemm-inl.h"
#include "kiln/kernels/matmul/colmajor-inl.h"
#include "kiln/kernels/matmul/amx_bf16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {

namespace mm {

template <class TB>
void Matmul(const float* a, ptrdiff_t lda, const TB* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc, size_t m, size_t n,
            size_t k, unsigned flags) {
  const bool accumulate = (flags & detail::kMatmulAccumulate) != 0;
  if (flags & detail::kMatmulColMajorB) {
    if (flags & detail::kMatmulGemm)
      GemmBlocked<PolicyF32<TB>>(a, lda, ColMajorB<TB>{b, ldb}, c, ldc, m, n, k, accumulate);
    else GemvColMajor(a, lda, b, ldb, c, ldc, m, n, k, accumulate);
    return;
  }
  if constexpr (sizeof(TB) == 2) {
#if KILN_MM_HAVE_AMX_BF16
    if ((flags & detail::kMatmulAmxBf16) && (flags & detail::kMatmulGemm) && ::kiln::amx_bf16_active()) {
      if (flags & detail::kMatmulPacked) amxbf::Gemm(a, lda, PackedB<TB>(b, n, k), c, ldc, m, n, k, accumulate);
      else amxbf::Gemm(a, lda, RowMajorB<TB>{b, ldb}, c, ldc, m, n, k, accumulate);
      return;
    }
#endif
    if (flags & detail::kMatmulPacked) {
      if (flags & detail::kMatmulGemm)
        GemmBlocked<PolicyF32<TB>>(a, lda, PackedB<TB>(b, n, k), c, ldc, m, n, k, accumulate);
      else GemvPacked(a, lda, b, c, ldc, m, n, k, accumulate);
      return;
    }
  }
  if (flags & detail::kMatmulGemm) Gemm(a, lda, b, ldb, c, ldc, m, n, k, accumulate);
  else Gemv(a, lda, b, ldb, c, ldc, m, n, k, accumulate);
}

// The exact path's GEMM (ops/dequant_matmul.hpp): B is rows [r0, r0 + n) of a GGUF weight. Each B panel
// (kNR rows x kc columns) is dequantized into an L1 buffer (dispatch::dequant_block: bit for bit the
// reference's values) and packed from there as an f32 B would be, so C has the bits of dequantizing W into a
// tile and running the f32 GEMM on it, while x is packed once per K block instead of once per tile.
struct DequantB {
  uint32_t type;
  const void* w;
  size_t n, ldw;  // W's rows and their stride in bytes
  bool interleaved;
  size_t k, r0;  // values per row; C's column j is W's row r0 + j
};
HWY_INLINE void PanelGeometry(const DequantB&, size_t, size_t, size_t, size_t, PrefetchCursor&) {}

struct PolicyDequant {
  using Packed = float;
  static constexpr size_t kUnit = 1;
  // A K block starts on a whole block of every GGUF type (the K-quants' super-blocks: 256 values).
  static_assert(kKC % 256 == 0, "kKC must be a whole number of 256-value super-blocks");
  static void PackA(const float* a, ptrdiff_t lda, size_t mc, size_t u0, size_t kc, size_t /*k*/, float* pa) {
    mm::PackA(a + u0, lda, mc, kc, pa);
  }
  static void PackB(const DequantB& B, size_t n0, size_t nr, size_t u0, size_t kc, size_t /*k*/, float* pb) {
    auto* t = static_cast<float*>(detail::matmul_scratch(4, kNR * kKC * sizeof(float)));  // (nr, kc)
    ::kiln::dispatch::dequant_block(B.type, B.w, B.n, B.ldw, B.interleaved, B.r0 + n0, nr, B.k, u0, kc, t);
    mm::PackB(RowMajorB<float>{t, static_cast<ptrdiff_t>(kc)}, 0, 0, nr, kc, pb);
  }
  template <size_t kRows>
  static void Kernel(size_t kc, const float* pa, const float* pb, float* c, ptrdiff_t ldc, bool load_c,
                     PrefetchCursor& pf) {
    KernelF32<kRows>(kc, pa, pb, c, ldc, load_c, pf);
  }
};

}  // namespace mm

void MatmulDequant(const float* a, ptrdiff_t lda, uint32_t type, const void* w, size_t n_w, size_t ldw,
                   bool interleaved, size_t r0, float* c, ptrdiff_t ldc, size_t m, size_t n, size_t k) {
  mm::GemmBlocked<mm::PolicyDequant>(a, lda, mm::DequantB{type, w, n_w, ldw, interleaved, k, r0}, c, ldc, m, n, k,
                                     false);
}

void MatmulF32(const float* a, ptrdiff_t lda, const float* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc, size_t m,
               size_t n, size_t k, unsigned flags) {
  mm::Matmul(a, lda, b, ldb, c, ldc, m, n, k, flags);
}

void MatmulF16(const float* a, ptrdiff_t lda, const kiln::f16* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc, size_t m,
               size_t n, size_t k, unsigned flags) {
  mm::Matmul(a, lda, reinterpret_cast<const hwy::float16_t*>(b), ldb, c, ldc, m, n, k, flags);
}

void MatmulBF16(const float* a, ptrdiff_t lda, const kiln::bf16* b16, ptrdiff_t ldb, float* c, ptrdiff_t ldc, size_t m,
                size_t n, size_t k, unsigned flags) {
  const auto* b = reinterpret_cast<const hwy::bfloat16_t*>(b16);
  if (flags & detail::kMatmulFastBf16) {
#if KILN_MM_HAVE_DPBF16
    const bool accumulate = (flags & detail::kMatmulAccumulate) != 0;
    if (mm::cpu_has_dpbf16()) {
      if (flags & detail::kMatmulGemm) mm::GemmDpBf16(a, lda, b, ldb, c, ldc, m, n, k, accumulate);
      else mm::GemvDpBf16(a, lda, b, ldb, c, ldc, m, n, k, accumulate);
      return;
    }
#endif
    // The same maths without vdpbf16ps: A rounded to bf16 (held in f32), then the exact kernels.
    auto* ar = static_cast<float*>(detail::matmul_scratch(2, m * k * sizeof(float)));
    for (size_t i = 0; i < m; ++i)
      for (size_t p = 0; p < k; ++p) ar[i * k + p] = mm::RoundBf16(a[static_cast<ptrdiff_t>(i) * lda + p]);
    mm::Matmul(ar, static_cast<ptrdiff_t>(k), b, ldb, c, ldc, m, n, k, flags);
    return;
  }
  mm::Matmul(a, lda, b, ldb, c, ldc, m, n, k, flags);
}

void MatmulQ8_0(const float* a, ptrdiff_t lda, const kiln::block_q8_0* b, ptrdiff_t ldb, float* c, ptrdiff_t ldc,
                size_t m, size_t n, size_t k, unsigned flags) {
  const bool accumulate = (flags & detail::kMatmulAccumulate) != 0;
  if (flags & detail::kMatmulColMajorB) mm::GemvColMajor(a, lda, b, ldb, c, ldc, m, n, k, accumulate);
  else mm::Gemv(a, lda, b, ldb, c, ldc, m, n, k, accumulate);
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
HWY_EXPORT(MatmulF32);
HWY_EXPORT(MatmulF16);
HWY_EXPORT(MatmulBF16);
HWY_EXPORT(MatmulDequant);
HWY_EXPORT(MatmulQ8_0);
}  // namespace kiln

KILN_DISPATCH_BEGIN
void matmul_f32(const float* a, std::ptrdiff_t lda, const float* b, std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc,
                std::size_t m, std::size_t n, std::size_t k, unsigned flags) {
  HWY_DYNAMIC_DISPATCH(MatmulF32)(a, lda, b, ldb, c, ldc, m, n, k, flags);
}
void matmul_f16(const float* a, std::ptrdiff_t lda, const ::kiln::f16* b, std::ptrdiff_t ldb, float* c,
                std::ptrdiff_t ldc, std::size_t m, std::size_t n, std::size_t k, unsigned flags) {
  HWY_DYNAMIC_DISPATCH(MatmulF16)(a, lda, b, ldb, c, ldc, m, n, k, flags);
}
void matmul_bf16(const float* a, std::ptrdiff_t lda, const ::kiln::bf16* b, std::ptrdiff_t ldb, float* c,
                 std::ptrdiff_t ldc, std::size_t m, std::size_t n, std::size_t k, unsigned flags) {
  HWY_DYNAMIC_DISPATCH(MatmulBF16)(a, lda, b, ldb, c, ldc, m, n, k, flags);
}
void matmul_dequant(const float* a, std::ptrdiff_t lda, uint32_t type, const void* w, std::size_t n_w, std::size_t ldw,
                    bool interleaved, std::size_t r0, float* c, std::ptrdiff_t ldc, std::size_t m, std::size_t n,
                    std::size_t k) {
  HWY_DYNAMIC_DISPATCH(MatmulDequant)(a, lda, type, w, n_w, ldw, interleaved, r0, c, ldc, m, n, k);
}
void matmul_q8_0(const float* a, std::ptrdiff_t lda, const ::kiln::block_q8_0* b, std::ptrdiff_t ldb, float* c,
                 std::ptrdiff_t ldc, std::size_t m, std::size_t n, std::size_t k, unsigned flags) {
  HWY_DYNAMIC_DISPATCH(MatmulQ8_0)(a, lda, b, ldb, c, ldc, m, n, k, flags);
}
KILN_DISPATCH_END
#endif  // HWY_ONCE

#endif  // per-target include guard
