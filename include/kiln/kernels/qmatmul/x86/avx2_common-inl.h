// kiln/kernels/qmatmul/x86/avx2_common-inl.h - the AVX2 helpers that the integer-dot kernels (avx2*-inl.h)
// share, and those the 16-bit-integer GEMM (i16-inl.h) uses too, so that the two can be compiled in separate
// translation units (kiln/kernels/part_qmatmul-inl.h, part_i16-inl.h).

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_QMATMUL_X86_AVX2_COMMON_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_QMATMUL_X86_AVX2_COMMON_INL_H_
#undef KILN_KERNELS_QMATMUL_X86_AVX2_COMMON_INL_H_
#else
#define KILN_KERNELS_QMATMUL_X86_AVX2_COMMON_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3

namespace avx2 {

// Software prefetch along a GEMV's weight stream, kGemvStreamPrefetch bytes ahead of p: every 64-byte line
// of the kBytes the kernel is about to read from p (a block, a block column). The decode GEMVs read their
// weights once, front to back; without it Zen 3's hardware prefetchers let the kernels' compute and the
// stream take turns (docs/history/benchmarks-log.md has the distances tried).
// AVX2 only: on the AVX3 target (AVX-512 CPUs without VNNI) no distance has been shown to help.
inline constexpr size_t kGemvStreamPrefetch = HWY_TARGET == HWY_AVX2 ? 2048 : 0;
template <size_t kBytes>
HWY_INLINE void PrefetchStream(const void* p) {
  if constexpr (kGemvStreamPrefetch != 0)
    for (size_t o = 0; o < kBytes; o += 64)
      hwy::Prefetch(static_cast<const char*>(p) + kGemvStreamPrefetch + o);  // as the f32 GEMV's kGemvPrefetch
}

// Byte j of each 32-bit lane = 0x10 where bit (kShift + j) of the lane is set, j < 4 (Q5 fifth bits).
// 4 bytes at p in every 32-bit lane.
HWY_INLINE __m256i Bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

HWY_INLINE __m128i Load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// MXFP4's vpshufb table in each 128-bit lane: code c -> u = kvalues_mxfp4[c] + 12 (0..24, the offset-12 unsigned
// values its integer kernels multiply).
HWY_INLINE __m256i Mxfp4Lut() {
  return _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,  //
                          12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
}
HWY_INLINE __m256i Load32(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

template <int kShift>
HWY_INLINE __m256i X16FifthBits(__m256i qh) {
  const __m256i bcast = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4, 8,
                                         8, 8, 8, 12, 12, 12, 12);
  const __m256i bit = _mm256_set1_epi32(0x08040201);
  const __m256i b = _mm256_shuffle_epi8(_mm256_srli_epi32(qh, kShift), bcast);  // low byte of the lane, 4x
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit), _mm256_set1_epi8(0x10));
}

}  // namespace avx2

#endif  // HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
