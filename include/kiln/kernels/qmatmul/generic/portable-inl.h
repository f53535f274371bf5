// kiln/kernels/qmatmul/generic/portable-inl.h - qmatmul kernels in portable Highway operations on 128-bit vectors, for
// every target without a hand-written x86 kernel: NEON (64-bit Arm), SSE4, SSSE3, EMU128 and the others.
// HWY_SCALAR (one lane) keeps scalar-inl.h's RowsScalar. Included from entry-inl.h only.
//
// One weight row at a time is decoded into runs of 16 values, as signed bytes with the block's offset
// subtracted (|w| <= 128), and dotted with x; one kernel source, two engines for the dot, one per kind of
// target (Run, Dot, Scaled, ScaledSum in portable_body-inl.h, the kernels' source):
//   bytes (NEON with dotprod: sdot, see below; SSE4: pmaddubsw): the runs stay bytes and meet x's bytes as they
//     are, 16 at a time into 4 int32 lanes; K-quant sub-block sums are multiplied by their scales in 32 bits.
//   16-bit (NEON without dotprod, SSSE3, EMU128, others): the runs are widened to 16 bits, the K-quants'
//     sub-block scales multiplied in, so that one widening multiply-add (ReorderWidenMulAccumulate: vmlal
//     on NEON) per 8 values gives each integer sum; the activation rows are widened to 16 bits once per
//     call (GEMV) or per 4 rows and 32 weight rows (GEMM), not once per weight row. 16-bit ranges: Q4_K/Q5_K
//     u * sc <= 31 * 63 = 1953; Q6_K |(u - 32) * sc| <= 32 * 128 = 4096.
// The products go straight to 32 bits, and a super-block's sum, at most 256 * 4096 * 127 < 2^31, cannot
// overflow.
// The integer sums equal every other path's; the f32 steps are those of x86/avx2-inl.h (per block
// t = sum * dx, f += t * dw [+ dm * dx S]; per super-block f += sum * (d * dx)) on 4 lanes.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_QMATMUL_GENERIC_PORTABLE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_QMATMUL_GENERIC_PORTABLE_INL_H_
#undef KILN_KERNELS_QMATMUL_GENERIC_PORTABLE_INL_H_
#else
#define KILN_KERNELS_QMATMUL_GENERIC_PORTABLE_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {

#if KILN_QMM_PORTABLE

// Byte dots where the target has them: NEON's sdot and pmaddubsw on SSE4. There the weights are decoded to
// signed bytes (offset subtracted) and dotted with x's bytes as they are; elsewhere both go to 16 bits.
// (SSSE3 has pmaddubsw too, but runs the 16-bit engine: on x86 the test suite then covers both engines.)
// NEON: a build with dotprod (-mcpu=native on an Armv8.2+ CPU, -march=armv8.2-a+dotprod) has only the byte
// engine. A baseline build (-march=armv8-a, GCC) compiles both: the byte engine a second time under GCC's
// target pragma, taken at run time where the CPU has the dot product (KILN_ARM_RUNTIME_DOTPROD,
// core/config.hpp; simd::current_target() then reads "NEON_DOTPROD", and force_target("NEON") turns it off).
#undef KILN_QMM_BYTES
#if HWY_TARGET == HWY_NEON && defined(__ARM_FEATURE_DOTPROD)
#define KILN_QMM_BYTES 1
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_SSE4
#define KILN_QMM_BYTES 1
#else
#define KILN_QMM_BYTES 0
#endif

#define KILN_QMM_PNS portable
#define KILN_QMM_ROWS RowsPortableBase
#include "kiln/kernels/qmatmul/generic/portable_body-inl.h"
#undef KILN_QMM_PNS
#undef KILN_QMM_ROWS

#if HWY_TARGET == HWY_NEON && KILN_ARM_RUNTIME_DOTPROD
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod+crypto")
#undef KILN_QMM_BYTES
#define KILN_QMM_BYTES 1
#define KILN_QMM_PNS portable_dp
#define KILN_QMM_ROWS RowsPortableDotprod
#include "kiln/kernels/qmatmul/generic/portable_body-inl.h"
#undef KILN_QMM_PNS
#undef KILN_QMM_ROWS
#pragma GCC pop_options
#endif

// The portable kernels' entry: GEMV (m <= 4) or GEMM rows of W, through the engine this CPU runs best.
inline void RowsPortable(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, ptrdiff_t ldw, size_t n,
                         float* y, ptrdiff_t ldy, bool gemm) {
#if HWY_TARGET == HWY_NEON && KILN_ARM_RUNTIME_DOTPROD
  if (::kiln::simd::detail::arm_dotprod_active()) return RowsPortableDotprod(L, act, m, w, ldw, n, y, ldy, gemm);
#endif
  RowsPortableBase(L, act, m, w, ldw, n, y, ldy, gemm);
}

#endif  // KILN_QMM_PORTABLE

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
