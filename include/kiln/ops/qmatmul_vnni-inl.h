// stub
#if defined(KILN_OPS_QMATMUL_VNNI_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_OPS_QMATMUL_VNNI_INL_H_
#undef KILN_OPS_QMATMUL_VNNI_INL_H_
#else
#define KILN_OPS_QMATMUL_VNNI_INL_H_
#endif
#include <hwy/highway.h>
HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {
#if HWY_TARGET == HWY_AVX3_DL
inline void GemvVnni(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, ptrdiff_t ldw, size_t n,
                     float* y, ptrdiff_t ldy) { RowsScalar(L, act, m, w, ldw, n, y, ldy); }
#endif
}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();
#endif
