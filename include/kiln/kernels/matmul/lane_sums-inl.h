// kiln/kernels/matmul/lane_sums-inl.h - the horizontal sums of kiln's f32 GEMV (gemv-inl.h), shared with the
// exact path's fused dequantizing GEMV (dequant-inl.h), which promises GemvM's bits and so must add
// exactly as it does. Compiled once per target; not for direct inclusion.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_MATMUL_LANE_SUMS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_MATMUL_LANE_SUMS_INL_H_
#undef KILN_KERNELS_MATMUL_LANE_SUMS_INL_H_
#else
#define KILN_KERNELS_MATMUL_LANE_SUMS_INL_H_
#endif

#include <cstddef>

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace lanes {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Horizontal sums of four vectors: out[i] = sum of the lanes of v_i. An in-block 4x4 transpose-add
// leaves one partial sum of each input per lane of every 128-bit block; the blocks are added last.
#if HWY_TARGET != HWY_SCALAR
// The in-block 4x4 transpose-add: lane i of each 128-bit block = that block's partial sum of v_i.
HWY_INLINE VF BlockSums4(VF v0, VF v1, VF v2, VF v3) {
  const DF d;
  const hn::Repartition<uint64_t, DF> du64;
  const VF s01 = hn::Add(hn::InterleaveLower(d, v0, v1), hn::InterleaveUpper(d, v0, v1));  // v0 v1 v0 v1
  const VF s23 = hn::Add(hn::InterleaveLower(d, v2, v3), hn::InterleaveUpper(d, v2, v3));  // v2 v3 v2 v3
  const VF lo = hn::BitCast(d, hn::InterleaveLower(du64, hn::BitCast(du64, s01), hn::BitCast(du64, s23)));
  const VF hi = hn::BitCast(d, hn::InterleaveUpper(du64, hn::BitCast(du64, s01), hn::BitCast(du64, s23)));
  return hn::Add(lo, hi);
}
#endif

HWY_INLINE void SumOfLanes4(VF v0, VF v1, VF v2, VF v3, float* HWY_RESTRICT out) {
  const DF d;
#if HWY_TARGET != HWY_SCALAR
  constexpr size_t kLanes = hn::MaxLanes(DF());
  alignas(64) float t[kLanes];
  hn::Store(BlockSums4(v0, v1, v2, v3), d, t);  // per block: v0 v1 v2 v3
  for (size_t i = 0; i < 4; ++i) {
    float s = t[i];
    for (size_t blk = 4; blk < kLanes; blk += 4) s += t[blk + i];
    out[i] = s;
  }
#else
  out[0] = hn::GetLane(hn::SumOfLanes(d, v0));
  out[1] = hn::GetLane(hn::SumOfLanes(d, v1));
  out[2] = hn::GetLane(hn::SumOfLanes(d, v2));
  out[3] = hn::GetLane(hn::SumOfLanes(d, v3));
#endif
}

}  // namespace lanes
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
