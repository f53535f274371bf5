// kiln/kernels/dense/attention_score-inl.h - the score step the f32 attention kernel (attention-inl.h) and the
// AMX one (attention_amx-inl.h) share, so that both soft-cap and mask a score the same way, op for op, and flag
// the same scores (the AMX kernel flags them itself without a soft-cap, on the same condition).
// Included from those two only.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_DENSE_ATTENTION_SCORE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_DENSE_ATTENTION_SCORE_INL_H_
#undef KILN_KERNELS_DENSE_ATTENTION_SCORE_INL_H_
#else
#define KILN_KERNELS_DENSE_ATTENTION_SCORE_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/kernels/dense/activation-inl.h"  // ExpNonPos, Reciprocal (per target)

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Which bounds of a row's positions a score step tests: none (every row sees the step's positions), causal
// (positions after the row's p_row: lo_row is 0) or a sliding window (also positions before its lo_row).
enum class AttnMask { kNone, kCausal, kWindow };

// One position's scores s for a vector of rows, as the online softmax takes them, compiled per case so that the
// common one (no soft-cap, no mask) has no test or branch: y = s, or with a soft-cap (kCap) cap * tanh(scale s /
// cap) (as kernels/dense/softmax-inl.h; without one the scale is applied later, in the exponential's FMA); -inf
// where position pc lies outside a row's [lo_row, p_row] (the bounds kMask names). With kTrack, bad |= NaN or
// +inf among the positions a row sees (with a soft-cap: NaN); without, the caller tracks them.
template <bool kCap, AttnMask kMask, bool kTrack, class D, class DI, class V = hn::Vec<D>, class VI = hn::Vec<DI>>
HWY_INLINE V AttnScoreY(D d, DI di, V s, V vcap_in, V vcap, int32_t pc, VI p_row, VI lo_row, hn::Mask<D>& bad) {
  const V vinf = hn::Set(d, std::numeric_limits<float>::infinity());
  V y = s;
  auto nan = hn::Not(hn::Lt(y, vinf));  // NaN or +inf (with a soft-cap: NaN only)
  if constexpr (kCap) {
    const V pre = hn::Mul(y, vcap_in);
    nan = hn::IsNaN(pre);
    const V e = ExpNonPos(d, hn::Mul(hn::Abs(pre), hn::Set(d, -2.0f)));
    const V th = hn::Mul(hn::Sub(hn::Set(d, 1.0f), e), Reciprocal(d, hn::Add(hn::Set(d, 1.0f), e)));
    y = hn::Mul(hn::CopySignToAbs(th, pre), vcap);
  }
  if constexpr (kMask != AttnMask::kNone) {  // masked positions count for nothing, NaN or not
    const auto vpc = hn::Set(di, pc);
    auto out = hn::Gt(vpc, p_row);
    if constexpr (kMask == AttnMask::kWindow) out = hn::Or(out, hn::Gt(lo_row, vpc));
    const auto masked = hn::RebindMask(d, out);
    y = hn::IfThenElse(masked, hn::Neg(vinf), y);
    nan = hn::AndNot(masked, nan);
  }
  if constexpr (kTrack) bad = hn::Or(bad, nan);
  else (void)bad;
  return y;
}

// Calls f(std::bool_constant<kCap>, std::integral_constant<AttnMask, kMask>) for the runtime case: a soft-cap
// (softcap > 0) and the mask (none where `full`, a window where `window`, else causal).
template <class F>
HWY_INLINE void AttnScoreCase(bool cap, bool full, bool window, F&& f) {
  auto mask = [&](auto kc) {
    if (full) f(kc, std::integral_constant<AttnMask, AttnMask::kNone>());
    else if (window) f(kc, std::integral_constant<AttnMask, AttnMask::kWindow>());
    else f(kc, std::integral_constant<AttnMask, AttnMask::kCausal>());
  };
  if (cap) mask(std::true_type());
  else mask(std::false_type());
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
