// kiln/kernels/qmatmul/i16-inl.h - Highway bodies of ops/qmatmul_i16.hpp (x in 16-bit integers), compiled once
// per target by the KILN_IMPLEMENTATION translation unit. Included from kernels/part_i16-inl.h; shares
// the AVX2 fifth-bit decode and stream prefetch with the integer-dot kernels through
// x86/avx2_common-inl.h, so it compiles apart from them. Not for direct inclusion.
//
// AVX2: W goes 16 rows (an interleaved group, or 16 row-major rows gathered into that layout) by 8 blocks
// (256 values) at a time into a panel of 16-bit pairs in L1:
//   per block (kBlockBytes): pair p < 16 at 64 p: rows 0..7 then rows 8..15, one int32 (values 2p, 2p + 1
//   of the block) per row | d of rows 0..15 (16 f32) | m of rows 0..15 (16 f32; Q4_1, Q5_1)
// Each step of a group's block column (4 bytes of each row, quant/interleave.hpp) widens to 16-bit
// values with vpmovsxbw and becomes two pair registers with one vshufps and one vpermq. Then for each
// panel of 6 rows of x (252 rows per pass, ~145 KiB of quantized x in L2), the kernel keeps a 6 x 16 tile
// of 32-bit sums in 12 registers: per pair, 2 panel loads, 6 broadcasts, 12 vpmaddwd and 12 vpaddd
// (192 multiply-adds); per block, each row's sums scale into its C row (one cvt, mul and fma per
// 8 columns, plus an fma for the minimum). The Q8_0 GEMV (1-4 rows of x, GemvI16Q8) reads the block columns
// in place instead: no panel, a vpmovsxbw per 4 rows x 4 values straight into vpmaddwd. Other targets: the
// same arithmetic in plain C++.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_QMATMUL_I16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_QMATMUL_I16_INL_H_
#undef KILN_KERNELS_QMATMUL_I16_INL_H_
#else
#define KILN_KERNELS_QMATMUL_I16_INL_H_
#endif

#include <cmath>
#include <cstring>
#include <utility>

#include <hwy/highway.h>

#include "kiln/kernels/qmatmul/x86/avx2_common-inl.h"  // qmm::avx2::X16FifthBits, PrefetchStream
#include "kiln/ops/qmatmul_i16.hpp"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm16 {

using ::kiln::detail::kQmmI16Rows;
using ::kiln::detail::QmmI16Act;
using ::kiln::detail::QmmX16;

template <class B>
inline constexpr int kOffset = std::is_same_v<B, block_q4_0>   ? 8
                               : std::is_same_v<B, block_q5_0> ? 16
                                                               : 0;
template <class B>
inline constexpr bool kHasMin =
    std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_1> || std::is_same_v<B, block_q4_K>;
// 32-value blocks of x per weight block (Q4_K: its 8 sub-blocks, each its own scale and minimum).
template <class B>
inline constexpr size_t kSub = block_size_v<B> / 32;

// The small integers u of a block (w = d * u + m for each 32 values), and d and m of each 32 values.
template <class B>
HWY_INLINE void UnpackBlock(const B& blk, int16_t* u, float* d, float* m) {
  if constexpr (std::is_same_v<B, block_q4_K>) {  // sub-block j: nibble j % 2 of bytes 32 (j / 2) ..
    uint8_t sc[8], mn[8];
    for (size_t j = 0; j < 8; ++j) ::kiln::detail::get_scale_min_k4(j, blk.scales, sc[j], mn[j]);
    for (size_t j = 0; j < 8; ++j) {
      d[j] = to_f32(blk.d) * float(sc[j]);
      m[j] = -(to_f32(blk.dmin) * float(mn[j]));
      const uint8_t* q = blk.qs + 32 * (j / 2);
      for (size_t l = 0; l < 32; ++l) u[32 * j + l] = int16_t(j % 2 ? q[l] >> 4 : q[l] & 15);
    }
  } else if constexpr (std::is_same_v<B, block_q8_0>) {
    d[0] = to_f32(blk.d);
    m[0] = 0.0f;
    for (int j = 0; j < 32; ++j) u[j] = blk.qs[j];
  } else {
    d[0] = to_f32(blk.d);
    m[0] = 0.0f;
    if constexpr (kHasMin<B>) m[0] = to_f32(blk.m);
    uint32_t qh = 0;
    if constexpr (QmmX16<B>::kQh) std::memcpy(&qh, blk.qh, 4);
    for (int j = 0; j < 16; ++j) {
      int lo = blk.qs[j] & 15, hi = blk.qs[j] >> 4;
      if constexpr (QmmX16<B>::kQh) {
        lo |= int((qh >> j) & 1) << 4;
        hi |= int((qh >> (j + 16)) & 1) << 4;
      }
      u[j] = static_cast<int16_t>(lo - kOffset<B>);
      u[j + 16] = static_cast<int16_t>(hi - kOffset<B>);
    }
  }
}

HWY_INLINE int32_t PackPair(int16_t lo, int16_t hi) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                              (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
}
HWY_INLINE int32_t PairLo(int32_t p) { return static_cast<int16_t>(static_cast<uint32_t>(p) & 0xFFFF); }
HWY_INLINE int32_t PairHi(int32_t p) { return static_cast<int16_t>(static_cast<uint32_t>(p) >> 16); }

// Block b of W's row j (interleaved groups read in place).
template <class B>
HWY_INLINE B RowBlock(const uint8_t* w, size_t n, size_t ldw, bool interleaved, size_t j, size_t b) {
  if (interleaved && j < n / kernels::kQmmInterleaveRows * kernels::kQmmInterleaveRows) {
    const size_t g = j / kernels::kQmmInterleaveRows * kernels::kQmmInterleaveRows;
    return ::kiln::detail::qmm_x16_block<B>(reinterpret_cast<const std::byte*>(w + g * ldw), j - g, b);
  }
  B blk;
  std::memcpy(&blk, w + j * ldw + b * sizeof(B), sizeof(B));
  return blk;
}

#if HWY_TARGET == HWY_AVX2

inline constexpr size_t kPairsBytes = 16 * 64;
inline constexpr size_t kBlockBytes = kPairsBytes + 2 * 64;  // pairs | d[16] | m[16]
inline constexpr size_t kKB = 8;                             // blocks per panel (a K block of 256 values)
inline constexpr size_t kMB = 42;                            // row panels per pass over W (252 rows)

// The 16 rows from j0 of block column b, in the interleaved layout: in place for a whole interleaved group,
// else gathered into buf (rows past n: zero blocks).
template <class B>
HWY_INLINE const uint8_t* GroupColumn(const uint8_t* w, size_t n, size_t ldw, bool interleaved, size_t j0, size_t b,
                                      uint8_t* buf) {
  if (interleaved && j0 + kernels::kQmmInterleaveRows <= n / kernels::kQmmInterleaveRows * kernels::kQmmInterleaveRows)
    return w + j0 * ldw + b * QmmX16<B>::kColBytes;
  auto* col = reinterpret_cast<std::byte*>(buf);
  for (size_t r = 0; r < kernels::kQmmInterleaveRows; ++r) {
    B blk;
    if (j0 + r < n) blk = RowBlock<B>(w, n, ldw, interleaved, j0 + r, b);
    else std::memset(static_cast<void*>(&blk), 0, sizeof(B));
    ::kiln::detail::qmm_x16_store<B>(col, r, 0, blk);
  }
  return buf;
}

// 8 rows x 4 int8 values (one row's 4 consecutive values per 32-bit lane) -> pair registers of values
// (0, 1) and (2, 3), rows in order, at out and out + 64.
HWY_INLINE void EmitPairs(__m256i v, uint8_t* out) {
  const __m256 x = _mm256_castsi256_ps(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));       // rows 0..3
  const __m256 y = _mm256_castsi256_ps(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)));  // rows 4..7
  // shufps takes lanes (0, 2) or (1, 3) of each half: rows 0 1 4 5 | 2 3 6 7; vpermq puts them in order.
  const __m256i a = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(x, y, 0x88)), 0xD8);
  const __m256i b = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(x, y, 0xDD)), 0xD8);
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), a);
  _mm256_store_si256(reinterpret_cast<__m256i*>(out + 64), b);
}

// Step S of a block column (values 4S .. 4S + 3; the 4-bit types' high nibbles 16 + 4S ..) into pairs.
template <class B, size_t S>
HWY_INLINE void PackStep(const uint8_t* col, uint8_t* out) {
  using X = QmmX16<B>;
  const __m256i m4 = _mm256_set1_epi8(0x0F), off = _mm256_set1_epi8(static_cast<char>(kOffset<B>));
  for (size_t h = 0; h < 2; ++h) {
    const __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + X::kOffQ + 64 * S + 32 * h));
    if constexpr (std::is_same_v<B, block_q8_0>) {
      EmitPairs(r, out + 64 * (2 * S) + 32 * h);
    } else {
      __m256i lo = _mm256_and_si256(r, m4), hi = _mm256_and_si256(_mm256_srli_epi16(r, 4), m4);
      if constexpr (X::kQh) {
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + X::kOffQh + 32 * h));
        lo = _mm256_or_si256(lo, qmm::avx2::X16FifthBits<4 * S>(qh));
        hi = _mm256_or_si256(hi, qmm::avx2::X16FifthBits<16 + 4 * S>(qh));
      }
      if constexpr (kOffset<B> != 0) {
        lo = _mm256_sub_epi8(lo, off);
        hi = _mm256_sub_epi8(hi, off);
      }
      EmitPairs(lo, out + 64 * (2 * S) + 32 * h);
      EmitPairs(hi, out + 64 * (8 + 2 * S) + 32 * h);
    }
  }
}

template <class B, size_t... S>
HWY_INLINE void PackSteps(const uint8_t* col, uint8_t* out, std::index_sequence<S...>) {
  (PackStep<B, S>(col, out), ...);
}

// One Q4_K block column of 16 rows -> 8 panel blocks (its sub-blocks): sub-block 2c + h is nibble h of
// steps 8c .. 8c + 7, step 8c + t its values 4t .. 4t + 3; d = d_row * sc, m = -(dmin_row * mn).
HWY_INLINE void PackBlockK(const uint8_t* col, uint8_t* out) {
  using X = QmmX16<block_q4_K>;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (size_t c = 0; c < 4; ++c)
    for (size_t t = 0; t < 8; ++t)
      for (size_t h = 0; h < 2; ++h) {
        const auto* step = reinterpret_cast<const __m256i*>(col + X::kOffQ + 64 * (8 * c + t) + 32 * h);
        const __m256i r = _mm256_loadu_si256(step);
        uint8_t* o = out + (2 * c) * kBlockBytes + 64 * (2 * t) + 32 * h;
        EmitPairs(_mm256_and_si256(r, m4), o);
        EmitPairs(_mm256_and_si256(_mm256_srli_epi16(r, 4), m4), o + kBlockBytes);
      }
  for (size_t r = 0; r < kernels::kQmmInterleaveRows; ++r) {
    f16 dh, mh;
    uint8_t scales[12], sc[8], mn[8];
    std::memcpy(&dh, col + 2 * r, 2);
    std::memcpy(&mh, col + 32 + 2 * r, 2);
    for (size_t e = 0; e < 3; ++e) std::memcpy(scales + 4 * e, col + X::kOffQh + 64 * e + 4 * r, 4);
    for (size_t j = 0; j < 8; ++j) ::kiln::detail::get_scale_min_k4(j, scales, sc[j], mn[j]);
    const float d = to_f32(dh), dmin = to_f32(mh);
    for (size_t j = 0; j < 8; ++j) {
      auto* f = reinterpret_cast<float*>(out + j * kBlockBytes + kPairsBytes);
      f[r] = d * float(sc[j]);
      f[16 + r] = -(dmin * float(mn[j]));
    }
  }
}

// One block column of 16 rows (interleaved layout) -> one panel block (Q4_K: kSub = 8 of them).
template <class B>
HWY_INLINE void PackBlock(const uint8_t* col, uint8_t* out) {
  if constexpr (std::is_same_v<B, block_q4_K>) {
    PackBlockK(col, out);
  } else {
    PackSteps<B>(col, out, std::make_index_sequence < std::is_same_v<B, block_q8_0> ? 8 : 4 > ());
    auto* sc = reinterpret_cast<float*>(out + kPairsBytes);
    for (size_t h = 0; h < 2; ++h) {
      const auto* d16 = reinterpret_cast<const __m128i*>(col + 16 * h);
      const auto* m16 = reinterpret_cast<const __m128i*>(col + 32 + 16 * h);
      _mm256_store_ps(sc + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128(d16)));
      _mm256_store_ps(sc + 16 + 8 * h, kHasMin<B> ? _mm256_cvtph_ps(_mm_loadu_si128(m16)) : _mm256_setzero_ps());
    }
  }
}

// c (kRows x 16, row stride ldc) += the nblk blocks of panel pb times kRows rows of x (init: the first
// block starts from 0 instead of c).
template <size_t kRows>
HWY_NOINLINE void KernelI16(size_t nblk, const QmmI16Act* HWY_RESTRICT a, const uint8_t* HWY_RESTRICT pb,
                            float* HWY_RESTRICT c, ptrdiff_t ldc, bool init, bool mins) {
  for (size_t b = 0; b < nblk; ++b, ++a, pb += kBlockBytes) {
    __m256i acc[kRows][2];
    HWY_UNROLL(16)
    for (size_t r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    HWY_UNROLL(16)
    for (size_t p = 0; p < 16; ++p) {
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb + 64 * p));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb + 64 * p + 32));
      HWY_UNROLL(16)
      for (size_t r = 0; r < kRows; ++r) {
        const __m256i xv = _mm256_set1_epi32(a->q[p][r]);
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(w0, xv));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(w1, xv));
      }
      // Keeps each sum a chain in its register: without this GCC reassociates the 16 integer adds into a
      // tree and spills the 192 products to the stack (3x slower).
      HWY_UNROLL(16)
      for (size_t r = 0; r < kRows; ++r) __asm__("" : "+x"(acc[r][0]), "+x"(acc[r][1]));
    }
    const auto* sc = reinterpret_cast<const float*>(pb + kPairsBytes);
    const __m256 d0 = _mm256_load_ps(sc), d1 = _mm256_load_ps(sc + 8);
    const bool zero = init && b == 0;
    HWY_UNROLL(16)
    for (size_t r = 0; r < kRows; ++r) {
      float* cr = c + static_cast<ptrdiff_t>(r) * ldc;
      const __m256 dx = _mm256_set1_ps(a->dx[r]);
      __m256 t0 = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(cr);
      __m256 t1 = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(cr + 8);
      t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][0]), _mm256_mul_ps(d0, dx), t0);
      t1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][1]), _mm256_mul_ps(d1, dx), t1);
      if (mins) {
        const __m256 sx = _mm256_set1_ps(a->sx[r]);
        t0 = _mm256_fmadd_ps(_mm256_load_ps(sc + 16), sx, t0);
        t1 = _mm256_fmadd_ps(_mm256_load_ps(sc + 24), sx, t1);
      }
      _mm256_storeu_ps(cr, t0);
      _mm256_storeu_ps(cr + 8, t1);
    }
  }
}

template <class B>
void GemmI16(const QmmI16Act* act, size_t m, size_t k, const uint8_t* w, size_t n, size_t ldw, bool interleaved,
             size_t n0, size_t n1, float* y, ptrdiff_t ldy) {
  const size_t nb = k / 32, panels = (m + kQmmI16Rows - 1) / kQmmI16Rows;
  auto* pb = static_cast<uint8_t*>(::kiln::detail::qmm_scratch(1, kKB * kBlockBytes));
  auto* gbuf = static_cast<uint8_t*>(::kiln::detail::qmm_scratch(2, QmmX16<B>::kColBytes));
  constexpr size_t kCols = kernels::kQmmInterleaveRows;
  for (size_t pm = 0; pm < panels; pm += kMB) {
    const size_t pe = HWY_MIN(panels, pm + kMB), i0 = pm * kQmmI16Rows, i1 = HWY_MIN(m, pe * kQmmI16Rows);
    for (size_t j0 = n0; j0 < n1; j0 += kCols) {
      const size_t nr = HWY_MIN(kCols, n1 - j0);
      // A short last group goes through a (rows, 16) tile: rows [i0, i1) of C's 16 columns from j0.
      float* edge = nullptr;
      if (nr < kCols) edge = static_cast<float*>(::kiln::detail::qmm_scratch(3, (i1 - i0) * kCols * sizeof(float)));
      for (size_t b0 = 0; b0 < nb; b0 += kKB) {
        const size_t kb = HWY_MIN(kKB, nb - b0);
        for (size_t b = 0; b < kb; b += kSub<B>)  // weight block (b0 + b) / kSub of the 16 rows
          PackBlock<B>(GroupColumn<B>(w, n, ldw, interleaved, j0, (b0 + b) / kSub<B>, gbuf), pb + b * kBlockBytes);
        for (size_t P = pm; P < pe; ++P) {
          const size_t i = P * kQmmI16Rows, rows = HWY_MIN(kQmmI16Rows, m - i);
          float* c = edge ? edge + (i - i0) * kCols : y + static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j0);
          const ptrdiff_t ldc = edge ? static_cast<ptrdiff_t>(kCols) : ldy;
          const QmmI16Act* a = act + P * nb + b0;
          const bool init = b0 == 0;
          switch (rows) {
            case 1:
              KernelI16<1>(kb, a, pb, c, ldc, init, kHasMin<B>);
              break;
            case 2:
              KernelI16<2>(kb, a, pb, c, ldc, init, kHasMin<B>);
              break;
            case 3:
              KernelI16<3>(kb, a, pb, c, ldc, init, kHasMin<B>);
              break;
            case 4:
              KernelI16<4>(kb, a, pb, c, ldc, init, kHasMin<B>);
              break;
            case 5:
              KernelI16<5>(kb, a, pb, c, ldc, init, kHasMin<B>);
              break;
            default:
              KernelI16<6>(kb, a, pb, c, ldc, init, kHasMin<B>);
              break;
          }
        }
      }
      if (edge)
        for (size_t i = i0; i < i1; ++i)
          std::memcpy(y + static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j0), edge + (i - i0) * kCols,
                      nr * sizeof(float));
    }
  }
}

// One block of 32 values of x into q (32 int16, in order): returns dx (ref: detail::qmm_i16_quantize_block).
HWY_INLINE float QuantizeBlock16(const float* xb, int16_t* q16) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], mx = _mm256_setzero_ps();
  for (size_t i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(xb + 8 * i);
    mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float amax = _mm_cvtss_f32(m4);
  if (amax == 0.0f) {
    std::memset(q16, 0, 32 * sizeof(int16_t));
    return 0.0f;
  }
  const __m256 id = _mm256_set1_ps(32767.0f / amax);
  __m256i q[4];
  for (size_t i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));  // nearest even
  // packs interleaves the halves: [a0..3 b0..3 | a4..7 b4..7]; vpermq restores value order.
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q16), _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q16 + 16),
                      _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8));
  return amax / 32767.0f;
}

void QuantizeRowBlock(const float* xb, QmmI16Act& o, size_t r) {
  alignas(32) int16_t q[32];
  o.dx[r] = QuantizeBlock16(xb, q);
  o.sx[r] = ::kiln::detail::qmm_i16_block_sum(xb);
  for (size_t p = 0; p < 16; ++p) o.q[p][r] = PackPair(q[2 * p], q[2 * p + 1]);
}

// The GEMV over Q8_0 (decode steps): y[i, j] for C <= 4 quantized rows i of x at act (GEMV rows of
// detail::qmm_i16_row_bytes(k) bytes: q, k int16; dx per block) and rows j in [j0, j1) of W, which is read
// once for all C. Every block sum is an exact int32, then f += float(sum) * (d * dx) block by block: the
// GEMM's step, bit for bit, whatever the layout.
template <size_t C>
struct GemvRowsI16 {
  const int16_t* q[C];
  const float* dx[C];
  GemvRowsI16(const uint8_t* act, size_t k) {
    for (size_t c = 0; c < C; ++c) {
      q[c] = reinterpret_cast<const int16_t*>(act + c * ::kiln::detail::qmm_i16_row_bytes(k));
      dx[c] = reinterpret_cast<const float*>(q[c] + k);
    }
  }
};

// Interleaved groups: step s of a block column (4 bytes of each row: values 4s .. 4s + 3) is 4 x 16 bytes
// of 4 rows each; each widens to 16 int16 (vpmovsxbw from memory: rows r, r + 1 | r + 2, r + 3) and one
// vpmaddwd against values 4s .. 4s + 3 of x broadcast to every 64 bits gives 2 pair sums per row. After 8
// steps, vphaddd of (rows 0-3, rows 4-7) gives each row's block sum, lanes in the order rows 0 1 4 5 |
// 2 3 6 7 (kPerm, its own inverse), which the block's d follow. One row of x takes the 16 rows of W in one
// pass over the steps (4 accumulators); 2-4 rows the two 8-row halves one after the other (the block
// column is in L1 by then), 2 accumulators per row of x.
template <size_t C>
HWY_NOINLINE void GemvI16Q8Groups(const uint8_t* act, size_t k, const uint8_t* w, size_t ldw, size_t j0, size_t j1,
                                  float* HWY_RESTRICT y, ptrdiff_t ldy) {
  using X = QmmX16<block_q8_0>;
  constexpr size_t kH = C == 1 ? 2 : 1;  // 8-row halves per pass over the steps
  const GemvRowsI16<C> a(act, k);
  const size_t nb = k / 32;
  const __m256i perm = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  for (; j0 < j1; j0 += kernels::kQmmInterleaveRows) {
    const uint8_t* col = w + j0 * ldw;  // block column b at col + b kColBytes
    __m256 f[C][2];
    for (size_t c = 0; c < C; ++c) f[c][0] = f[c][1] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; ++b, col += X::kColBytes) {
      qmm::avx2::PrefetchStream<X::kColBytes>(col);  // the groups lie one after another: one stream
      for (size_t h0 = 0; h0 < 2; h0 += kH) {
        __m256i acc[C][2 * kH];
        for (size_t c = 0; c < C; ++c)
          for (size_t r = 0; r < 2 * kH; ++r) acc[c][r] = _mm256_setzero_si256();
        HWY_UNROLL(8)
        for (size_t s = 0; s < 8; ++s) {
          __m256i xv[C];
          for (size_t c = 0; c < C; ++c) {
            int64_t x4;
            std::memcpy(&x4, a.q[c] + 32 * b + 4 * s, 8);
            xv[c] = _mm256_set1_epi64x(x4);
          }
          const uint8_t* st = col + X::kOffQ + 64 * s + 32 * h0;
          HWY_UNROLL(4)
          for (size_t r = 0; r < 2 * kH; ++r) {
            const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(st + 16 * r)));
            for (size_t c = 0; c < C; ++c) acc[c][r] = _mm256_add_epi32(acc[c][r], _mm256_madd_epi16(wv, xv[c]));
          }
        }
        for (size_t hh = 0; hh < kH; ++hh) {
          const size_t h = h0 + hh;
          const __m256 d = _mm256_permutevar8x32_ps(
              _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col + 16 * h))), perm);
          for (size_t c = 0; c < C; ++c)
            f[c][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_hadd_epi32(acc[c][2 * hh], acc[c][2 * hh + 1])),
                                      _mm256_mul_ps(d, _mm256_set1_ps(a.dx[c][b])), f[c][h]);
        }
      }
    }
    for (size_t c = 0; c < C; ++c) {
      float* yc = y + static_cast<ptrdiff_t>(c) * ldy + static_cast<ptrdiff_t>(j0);
      _mm256_storeu_ps(yc, _mm256_permutevar8x32_ps(f[c][0], perm));
      _mm256_storeu_ps(yc + 8, _mm256_permutevar8x32_ps(f[c][1], perm));
    }
  }
}

// Row-major rows (W not interleaved, or the rows past its last whole group), 8 at a time: per row and
// block, two vpmovsxbw of its 32 bytes and two vpmaddwd against the block's 32 values of x; three rounds of
// vphaddd and one cross-lane add reduce the 8 rows' vectors to one vector of their 8 block sums. Rows of x
// after the first widen the block's bytes again, from L1.
template <size_t C>
HWY_NOINLINE void GemvI16Q8Rows(const uint8_t* act, size_t k, const uint8_t* w, size_t ldw, size_t j0, size_t j1,
                                float* HWY_RESTRICT y, ptrdiff_t ldy) {
  constexpr size_t kR = 8;
  const GemvRowsI16<C> a(act, k);
  const size_t nb = k / 32;
  for (; j0 < j1; j0 += kR) {
    const uint8_t* rows[kR];
    for (size_t r = 0; r < kR; ++r)  // past j1: repeat the last row (results dropped)
      rows[r] = w + HWY_MIN(j0 + r, j1 - 1) * ldw;
    __m256 f[C];
    for (size_t c = 0; c < C; ++c) f[c] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; ++b) {
      alignas(16) uint16_t dh[kR];
      for (size_t r = 0; r < kR; ++r) {
        const uint8_t* blk = rows[r] + b * sizeof(block_q8_0);  // d (f16) | qs (32 int8)
        qmm::avx2::PrefetchStream<sizeof(block_q8_0)>(blk);     // 8 streams, one per row
        std::memcpy(&dh[r], blk + offsetof(block_q8_0, d), 2);
      }
      const __m256 d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh)));
      for (size_t c = 0; c < C; ++c) {
        const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q[c] + 32 * b));
        const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q[c] + 32 * b + 16));
        __m256i acc[kR];
        HWY_UNROLL(8)
        for (size_t r = 0; r < kR; ++r) {
          const auto* qs =
              reinterpret_cast<const __m128i*>(rows[r] + b * sizeof(block_q8_0) + offsetof(block_q8_0, qs));
          acc[r] = _mm256_add_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(qs)), xl),
                                    _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(qs + 1)), xh));
        }
        // hadd(hadd(a0, a1), hadd(a2, a3)): [sums of a0..a3 over lanes 0-3 | over lanes 4-7].
        const __m256i s03 = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]), _mm256_hadd_epi32(acc[2], acc[3]));
        const __m256i s47 = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[4], acc[5]), _mm256_hadd_epi32(acc[6], acc[7]));
        const __m256i sum = _mm256_add_epi32(_mm256_permute2x128_si256(s03, s47, 0x20),
                                             _mm256_permute2x128_si256(s03, s47, 0x31));  // rows 0..7
        f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, _mm256_set1_ps(a.dx[c][b])), f[c]);
      }
    }
    for (size_t c = 0; c < C; ++c) {
      alignas(32) float out[kR];
      _mm256_store_ps(out, f[c]);
      std::memcpy(y + static_cast<ptrdiff_t>(c) * ldy + static_cast<ptrdiff_t>(j0), out,
                  HWY_MIN(kR, j1 - j0) * sizeof(float));
    }
  }
}

template <size_t C>
HWY_INLINE void GemvI16Q8(const uint8_t* act, size_t k, const uint8_t* w, size_t n, size_t ldw, bool interleaved,
                          size_t n0, size_t n1, float* y, ptrdiff_t ldy) {
  const size_t whole =
      interleaved ? n / kernels::kQmmInterleaveRows * kernels::kQmmInterleaveRows : 0;  // n0: a group's first row
  const size_t split = HWY_MIN(HWY_MAX(whole, n0), n1);
  if (n0 < split) GemvI16Q8Groups<C>(act, k, w, ldw, n0, split, y, ldy);
  if (split < n1) GemvI16Q8Rows<C>(act, k, w, ldw, split, n1, y, ldy);
}

#else  // portable: the same arithmetic in plain C++

template <class B>
void GemmI16(const QmmI16Act* act, size_t m, size_t k, const uint8_t* w, size_t n, size_t ldw, bool interleaved,
             size_t n0, size_t n1, float* y, ptrdiff_t ldy) {
  const size_t nb = k / 32;
  auto* u = static_cast<int16_t*>(::kiln::detail::qmm_scratch(1, k * sizeof(int16_t)));
  auto* dm = static_cast<float*>(::kiln::detail::qmm_scratch(2, 2 * nb * sizeof(float)));  // d[nb] | m[nb]
  for (size_t j = n0; j < n1; ++j) {
    for (size_t b = 0; b < nb; b += kSub<B>)
      UnpackBlock<B>(RowBlock<B>(w, n, ldw, interleaved, j, b / kSub<B>), u + 32 * b, dm + b, dm + nb + b);
    for (size_t i = 0; i < m; ++i) {
      const size_t P = i / kQmmI16Rows, r = i % kQmmI16Rows;
      float f = 0.0f;
      for (size_t b = 0; b < nb; ++b) {
        const QmmI16Act& a = act[P * nb + b];
        int32_t s = 0;
        for (size_t p = 0; p < 16; ++p)
          s += int32_t(u[32 * b + 2 * p]) * PairLo(a.q[p][r]) + int32_t(u[32 * b + 2 * p + 1]) * PairHi(a.q[p][r]);
        f = std::fma(static_cast<float>(s), dm[b] * a.dx[r], f);
        if constexpr (kHasMin<B>) f = std::fma(dm[nb + b], a.sx[r], f);
      }
      y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = f;
    }
  }
}

void QuantizeRowBlock(const float* xb, QmmI16Act& o, size_t r) {
  int16_t q[32];
  o.dx[r] = ::kiln::detail::qmm_i16_quantize_block(xb, q);
  o.sx[r] = ::kiln::detail::qmm_i16_block_sum(xb);
  for (size_t p = 0; p < 16; ++p) o.q[p][r] = PackPair(q[2 * p], q[2 * p + 1]);
}

#endif  // HWY_TARGET == HWY_AVX2

// The GEMV's arithmetic in plain C++ (every target and type; AVX2's Q8_0 takes GemvI16Q8): y[i, j] for
// the m GEMV rows of x at act and rows j in [n0, n1) of W.
template <class B>
void GemvI16Plain(const uint8_t* act, size_t m, size_t k, const uint8_t* w, size_t n, size_t ldw, bool interleaved,
                  size_t n0, size_t n1, float* y, ptrdiff_t ldy) {
  const size_t nb = k / 32;
  int16_t u[256];
  float d[kSub<B>], mn[kSub<B>];
  for (size_t j = n0; j < n1; ++j)
    for (size_t i = 0; i < m; ++i) {
      const auto* q = reinterpret_cast<const int16_t*>(act + i * ::kiln::detail::qmm_i16_row_bytes(k));
      const auto* dx = reinterpret_cast<const float*>(q + k);
      const float* sx = dx + nb;
      float f = 0.0f;
      for (size_t b = 0; b < nb; b += kSub<B>) {
        UnpackBlock<B>(RowBlock<B>(w, n, ldw, interleaved, j, b / kSub<B>), u, d, mn);
        for (size_t sb = 0; sb < kSub<B>; ++sb) {
          int32_t acc = 0;
          for (size_t e = 0; e < 32; ++e) acc += int32_t(u[32 * sb + e]) * int32_t(q[32 * (b + sb) + e]);
          f = std::fma(static_cast<float>(acc), d[sb] * dx[b + sb], f);
          if constexpr (kHasMin<B>) f = std::fma(mn[sb], sx[b + sb], f);
        }
      }
      y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = f;
    }
}

// f((B*)nullptr) for the block type B of a 16-bit kernel's GGUF type (the interleavable ones but MXFP4).
template <class F>
void VisitI16Type(uint32_t type, const F& f) {
  KILN_CHECK(::kiln::detail::qmm_i16_supported(type) &&
                 ::kiln::detail::visit_qmm_x16_type(type,
                                                    [&](auto* tag) {
                                                      using B = std::remove_pointer_t<decltype(tag)>;
                                                      if constexpr (!std::is_same_v<B, block_mxfp4>) f(tag);
                                                    }),
             "kiln::qmatmul_i16: GGUF type ", type, " has no 16-bit kernel");
}

}  // namespace qmm16

size_t QmatmulI16GemvRows(uint32_t type) {
#if HWY_TARGET == HWY_AVX2
  if (type == ::kiln::ggml_type_id::Q8_0) return ::kiln::detail::kQmmI16GemvMaxRows;
#else
  (void)type;
#endif
  return 0;
}

void QmatmulI16QuantizeRows(const float* x, ptrdiff_t ldx, size_t m, size_t k, void* act) {
  const size_t nb = k / 32;
  for (size_t i = 0; i < m; ++i) {
    const float* xi = x + static_cast<ptrdiff_t>(i) * ldx;
    auto* q = reinterpret_cast<int16_t*>(static_cast<uint8_t*>(act) + i * ::kiln::detail::qmm_i16_row_bytes(k));
    auto* dx = reinterpret_cast<float*>(q + k);
    float* sx = dx + nb;
    for (size_t b = 0; b < nb; ++b) {
#if HWY_TARGET == HWY_AVX2
      dx[b] = qmm16::QuantizeBlock16(xi + 32 * b, q + 32 * b);
#else
      dx[b] = ::kiln::detail::qmm_i16_quantize_block(xi + 32 * b, q + 32 * b);
#endif
      sx[b] = ::kiln::detail::qmm_i16_block_sum(xi + 32 * b);
    }
  }
}

void QmatmulI16Gemv(uint32_t type, const void* act, size_t m, size_t k, const void* w, size_t n, size_t ldw,
                    bool interleaved, size_t n0, size_t n1, float* y, ptrdiff_t ldy) {
  const auto* a = static_cast<const uint8_t*>(act);
  const auto* wb = static_cast<const uint8_t*>(w);
#if HWY_TARGET == HWY_AVX2
  if (type == ::kiln::ggml_type_id::Q8_0) {
    switch (m) {
      case 1:
        return qmm16::GemvI16Q8<1>(a, k, wb, n, ldw, interleaved, n0, n1, y, ldy);
      case 2:
        return qmm16::GemvI16Q8<2>(a, k, wb, n, ldw, interleaved, n0, n1, y, ldy);
      case 3:
        return qmm16::GemvI16Q8<3>(a, k, wb, n, ldw, interleaved, n0, n1, y, ldy);
      case 4:
        return qmm16::GemvI16Q8<4>(a, k, wb, n, ldw, interleaved, n0, n1, y, ldy);
      default:
        break;  // more rows: the plain loop below
    }
  }
#endif
  qmm16::VisitI16Type(type, [&](auto* tag) {
    qmm16::GemvI16Plain<std::remove_pointer_t<decltype(tag)>>(a, m, k, wb, n, ldw, interleaved, n0, n1, y, ldy);
  });
}

void QmatmulI16Quantize(const float* x, ptrdiff_t ldx, size_t m, size_t k, size_t p0, size_t p1, void* act_v) {
  auto* act = static_cast<::kiln::detail::QmmI16Act*>(act_v);
  const size_t nb = k / 32;
  for (size_t P = p0; P < p1; ++P)
    for (size_t b = 0; b < nb; ++b) {
      ::kiln::detail::QmmI16Act& o = act[P * nb + b];
      for (size_t r = 0; r < ::kiln::detail::kQmmI16Rows; ++r) {
        const size_t i = P * ::kiln::detail::kQmmI16Rows + r;
        if (i < m) {
          qmm16::QuantizeRowBlock(x + static_cast<ptrdiff_t>(i) * ldx + static_cast<ptrdiff_t>(32 * b), o, r);
        } else {
          for (size_t p = 0; p < 16; ++p) o.q[p][r] = 0;
          o.dx[r] = o.sx[r] = 0.0f;
        }
      }
    }
}

void QmatmulI16Gemm(uint32_t type, const void* act, size_t m, size_t k, const void* w, size_t n, size_t ldw,
                    bool interleaved, size_t n0, size_t n1, float* y, ptrdiff_t ldy) {
  const auto* a = static_cast<const ::kiln::detail::QmmI16Act*>(act);
  const auto* wb = static_cast<const uint8_t*>(w);
  qmm16::VisitI16Type(type, [&](auto* tag) {
    qmm16::GemmI16<std::remove_pointer_t<decltype(tag)>>(a, m, k, wb, n, ldw, interleaved, n0, n1, y, ldy);
  });
}

size_t QmatmulI16MinRows(uint32_t type, size_t k) {
  (void)k;
#if HWY_TARGET == HWY_AVX2
  if (type == ::kiln::ggml_type_id::Q8_0) return 1;  // decode too: GemvI16Q8, and any number of rows
  if (::kiln::detail::qmm_i16_supported(type)) return ::kiln::detail::kQmmI16MinRows;
#else
  (void)type;
#endif
  return SIZE_MAX;
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
HWY_EXPORT(QmatmulI16Quantize);
HWY_EXPORT(QmatmulI16Gemm);
HWY_EXPORT(QmatmulI16MinRows);
HWY_EXPORT(QmatmulI16GemvRows);
HWY_EXPORT(QmatmulI16QuantizeRows);
HWY_EXPORT(QmatmulI16Gemv);
}  // namespace kiln

KILN_DISPATCH_BEGIN
std::size_t qmatmul_i16_min_rows(uint32_t type, std::size_t k) {
  return HWY_DYNAMIC_DISPATCH(QmatmulI16MinRows)(type, k);
}
void qmatmul_i16_quantize(const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k, std::size_t p0,
                          std::size_t p1, void* act) {
  HWY_DYNAMIC_DISPATCH(QmatmulI16Quantize)(x, ldx, m, k, p0, p1, act);
}
void qmatmul_i16_gemm(uint32_t type, const void* act, std::size_t m, std::size_t k, const void* w, std::size_t n,
                      std::size_t ldw, bool interleaved, std::size_t n0, std::size_t n1, float* y, std::ptrdiff_t ldy) {
  HWY_DYNAMIC_DISPATCH(QmatmulI16Gemm)(type, act, m, k, w, n, ldw, interleaved, n0, n1, y, ldy);
}
std::size_t qmatmul_i16_gemv_rows(uint32_t type) { return HWY_DYNAMIC_DISPATCH(QmatmulI16GemvRows)(type); }
void qmatmul_i16_quantize_rows(const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k, void* act) {
  HWY_DYNAMIC_DISPATCH(QmatmulI16QuantizeRows)(x, ldx, m, k, act);
}
void qmatmul_i16_gemv(uint32_t type, const void* act, std::size_t m, std::size_t k, const void* w, std::size_t n,
                      std::size_t ldw, bool interleaved, std::size_t n0, std::size_t n1, float* y, std::ptrdiff_t ldy) {
  HWY_DYNAMIC_DISPATCH(QmatmulI16Gemv)(type, act, m, k, w, n, ldw, interleaved, n0, n1, y, ldy);
}
KILN_DISPATCH_END
#endif  // HWY_ONCE

#endif  // per-target include guard
