// kiln/kernels/dense/attention_score-inl.h - the score step the f32 attention kernel (attention-inl.h) and the
// AMX one (attention_amx-inl.h) share, so that both soft-cap, mask and flag a score the same way, op for op.
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

#include "kiln/kernels/dense/activation-inl.h"  // ExpNonPos, Reciprocal (per target)

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One position's scores s for a vector of rows, as the online softmax takes them: y = s, or with a soft-cap
// (softcap > 0) cap * tanh(scale s / cap) (as kernels/dense/softmax-inl.h; without one the scale is applied
// later, in the exponential's FMA); -inf where position pc lies outside a row's [lo_row, p_row] (only checked
// where `full` is false). bad |= NaN or +inf among the positions a row sees (with a soft-cap: NaN).
template <class D, class DI, class V = hn::Vec<D>, class VI = hn::Vec<DI>>
HWY_INLINE V AttnScoreY(D d, DI di, V s, float softcap, V vcap_in, V vcap, bool full, int32_t pc, VI p_row, VI lo_row,
                        hn::Mask<D>& bad) {
  const V vinf = hn::Set(d, std::numeric_limits<float>::infinity());
  V y = s;
  auto nan = hn::Not(hn::Lt(y, vinf));  // NaN or +inf (with a soft-cap: NaN only)
  if (softcap > 0) {
    const V pre = hn::Mul(y, vcap_in);
    nan = hn::IsNaN(pre);
    const V e = ExpNonPos(d, hn::Mul(hn::Abs(pre), hn::Set(d, -2.0f)));
    const V th = hn::Mul(hn::Sub(hn::Set(d, 1.0f), e), Reciprocal(d, hn::Add(hn::Set(d, 1.0f), e)));
    y = hn::Mul(hn::CopySignToAbs(th, pre), vcap);
  }
  if (!full) {  // masked positions count for nothing, NaN or not
    const auto vpc = hn::Set(di, pc);
    const auto masked = hn::RebindMask(d, hn::Or(hn::Gt(vpc, p_row), hn::Gt(lo_row, vpc)));
    y = hn::IfThenElse(masked, hn::Neg(vinf), y);
    nan = hn::AndNot(masked, nan);
  }
  bad = hn::Or(bad, nan);
  return y;
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
