// kiln/kernels/q8_0_rows-inl.h - a q8_0 KV cache's rows (GGUF Q8_0 blocks: an f16 scale d, 32 int8 q) widened
// to f32 vectors, for the GEMV kernels (matmul/entry-inl.h: RowF32) and the tiled attention's tiles
// (dense/attention-inl.h: AttnRowsF32). d * q is exact in f32 (an 11-bit significand times a 7-bit integer),
// so a kernel over the widened rows gives the bits of the same kernel over an f32 copy holding the dequantized
// values. Compiled once per target; not for direct inclusion.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_Q8_0_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_Q8_0_ROWS_INL_H_
#undef KILN_KERNELS_Q8_0_ROWS_INL_H_
#else
#define KILN_KERNELS_Q8_0_ROWS_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include <hwy/highway.h>

#include "kiln/core/dtype.hpp"
#include "kiln/quant/blocks.hpp"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace q8rows {

namespace hn = hwy::HWY_NAMESPACE;

// The block's scale d as f32 (F16C's one instruction where the target has it; exact either way).
HWY_INLINE float Scale(const block_q8_0& b) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(b.d.bits);
#else
  return f16_bits_to_f32(b.d.bits);
#endif
}

// Values [i, i + Lanes(d)) of block b as f32: q widened, times vd = Set(d, Scale(b)). i is a multiple of
// Lanes(d) below 32.
template <class D>
HWY_INLINE hn::Vec<D> Widen(D d, const block_q8_0& b, size_t i, hn::Vec<D> vd) {
  static_assert(QK8_0 % hn::MaxLanes(D()) == 0, "a vector within one Q8_0 block");
  const hn::Rebind<int8_t, D> d8;
  return hn::Mul(hn::ConvertTo(d, hn::PromoteTo(hn::RebindToSigned<D>(), hn::LoadU(d8, b.qs + i))), vd);
}

}  // namespace q8rows
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
