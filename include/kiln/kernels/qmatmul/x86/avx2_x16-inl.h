// kiln/kernels/qmatmul/x86/avx2_x16-inl.h - qmatmul over 16-row interleaved Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K
// / MXFP4 weights (quant/interleave.hpp) on the AVX2 and AVX3 targets: GEMV and GEMM. Included from
// entry-inl.h only, after avx2-inl.h. (Q4_K: its own kernel, GemvX16K below.)
//
// A 64-byte step of a block column is two 256-bit registers: rows 0..7 and rows 8..15 of the group, 4 qs
// bytes of one row per 32-bit lane. Per step and nibble half, vpmaddubsw of the unsigned nibbles against 4
// broadcast activation bytes gives each lane two 16-bit pair sums of its row; the 8 of a block add in 16
// bits (|pair| <= 2 * 15 * 128, 8 * 3840 < 2^15), then one vpmaddwd by 1 widens them: the lane's 32-bit dot
// of the block. From there it is the AVX3_DL GEMV's arithmetic (vnni_x16-inl.h), 8 lanes at a time:
// acc starts at ginit = kQmmMagic - off * S, f += ((f32 bits of acc) - 1.5 * 2^23) * (d * dx) [+ m * (dx * S)].
// Q8_0's signed bytes go as |w| x sign(x, w), each vpmaddubsw widened at once (pairs up to 32512).
// Q5_0/Q5_1: each lane's 32-bit qh (one row's) gives the fifth bits of its 4 bytes of a step (bits 4s + j
// and 16 + 4s + j: a shift, a byte broadcast, a compare with the bit), or'ed in as 0x10; the pairs reach
// 2 * 31 * 127 = 7874, so the 16-bit sums are widened every 2 steps (4 pairs: 31496 < 2^15). MXFP4: the codes
// through a vpshufb table to u = kvalues_mxfp4[code] + 12 (0..24: pairs up to 2 * 24 * 128 = 6144, widened
// every 2 steps likewise), d = 2^(e - 128) from its e8m0 bytes.
// Per 8 rows x 32 values and row of x: 8 vpmaddubsw + 8 16-bit adds, 1 vpmaddwd, 1 add and 3 f32 ops; the
// row-major AVX2 GEMV needs about twice the instructions (a decode and f32 steps per block and row).
// Two activation parts (kQmmPairs): per block the two 32-bit dots add as 2^s X + R before one conversion
// (X16PairStep), as AVX3_DL's GEMV and GEMM do, so the outputs have AVX3_DL's bits.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_QMATMUL_X86_AVX2_X16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_QMATMUL_X86_AVX2_X16_INL_H_
#undef KILN_KERNELS_QMATMUL_X86_AVX2_X16_INL_H_
#else
#define KILN_KERNELS_QMATMUL_X86_AVX2_X16_INL_H_
#endif

#include <hwy/highway.h>

#include "kiln/kernels/qmatmul/x86/avx2_common-inl.h"  // Bcast4, X16FifthBits, PrefetchStream

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3

namespace avx2 {

/// The block types with AVX2 kernels for the interleaved layout.
template <class B>
inline constexpr bool kX16Avx2 = kernels::qmm_interleavable_v<B>;

// Rows 8h .. 8h + 7's scales d of a block column as f32: f16, or MXFP4's e8m0 bytes as 2^(e - 128) (f32 bits
// (e - 1) << 23, the subnormals 2^-128 and 2^-127 as 0x00200000 << e: detail::e8m0_to_fp32_half).
template <class X>
HWY_INLINE __m256 X16Scales8(const uint8_t* col, size_t h) {
  if constexpr (X::kE8m0) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(col + 8 * h)));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small));
  } else {
    return _mm256_cvtph_ps(Load16(col + 16 * h));
  }
}

// Step s of a Q5 block: fifth bits of values 4s + j (low nibbles) and 16 + 4s + j (high nibbles).
template <int kStep>
HWY_INLINE void X16OrFifth(__m256i qh, __m256i& lo, __m256i& hi) {
  lo = _mm256_or_si256(lo, X16FifthBits<4 * kStep>(qh));
  hi = _mm256_or_si256(hi, X16FifthBits<16 + 4 * kStep>(qh));
}

// The end of block b for the two parts ax, ar of one row of x (kQmmPairs; QuantizeRowSplit), given each
// part's 32-bit dot of the block per lane (ix, ir): c = (ix + ginit) << s + (ir + pinit) = 2^s X + R (mod
// 2^32, exact: pinit = ginit_r - (2^s + 1) kQmmMagic, see QActLayout), f += c * (dw * dx_r): the AVX3_DL
// kernels' PairGroupStep. Q8_0's signed products carry no offset here (the AVX3_DL ginit holds its +128
// flip), so c = (ix << s) + ir.
template <bool kQ8>
HWY_INLINE __m256 X16PairStep(__m256 f, __m256i ix, __m256i ir, const ActRow& ax, const ActRow& ar, size_t b,
                              __m256 dw) {
  const __m128i s = _mm_cvtsi32_si128(ar.pshift[b]);
  if constexpr (!kQ8) {
    ix = _mm256_add_epi32(ix, _mm256_set1_epi32(ax.ginit[b]));
    ir = _mm256_add_epi32(ir, _mm256_set1_epi32(ar.pinit[b]));
  }
  const __m256i c = _mm256_add_epi32(_mm256_sll_epi32(ix, s), ir);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), _mm256_mul_ps(dw, _mm256_set1_ps(ar.dx[b])), f);
}

// y[c * ldy + 16 g + 8 h + l] for rows c < C of x, the `groups` groups at w, and the halves h of each group
// in [H0, H0 + NH) (8 rows each): NH = 2 keeps both halves' sums in registers (C <= 2: 4 f32 + 4 integer
// accumulators), NH = 1 goes over the group once per half (C <= 4; the second pass reads L1/L2, a large
// cost for the decode's C = 2, so C <= 2 keeps NH = 2).
// kPan (GEMM, Q5_0 / Q5_1, groups = 1): the group's unsigned values come decoded from pan
// (DecodeX16Panel) instead of from its qs and qh bytes. kPairs: rows 2i and 2i + 1 of x are the two parts
// of one row (kQmmPairs), added per block as integers, c = 2^s X + R, then converted once (X16PairStep:
// the AVX3_DL kernels' PairGroupStep, 8 lanes at a time); row i of y gets pair i.
template <class B, size_t C, size_t NH, bool kPan = false, bool kPairs = false>
HWY_NOINLINE void GemvX16(const QActLayout& L, const ActRow* a, const uint8_t* w, size_t groups, size_t h0, float* y,
                          ptrdiff_t ldy, const uint8_t* pan = nullptr) {
  using X = ::kiln::detail::QmmX16<B>;
  constexpr bool kQ8 = X::kSteps == 8;
  static_assert(kX16Avx2<B> && !X::kK, "kiln: GemvX16 takes Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4 (Q4_K: GemvX16K)");
  constexpr bool kWiden = X::kQh || X::kE8m0;  // 16-bit pair sums widened every 2 steps
  static_assert(C * NH <= 4, "kiln: at most 4 rows of x x halves of a group in registers");
  static_assert(!kPairs || C % 2 == 0, "kiln: pairs of activation rows need an even C");
  const size_t nb = L.k / 32;
  const __m256 magic = _mm256_set1_ps(::kiln::detail::kQmmMagicF);
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  [[maybe_unused]] const __m256i lut = X::kE8m0 ? Mxfp4Lut() : _mm256_setzero_si256();
  for (size_t g = 0; g < groups; ++g) {
    const uint8_t* col = w + g * nb * X::kColBytes;
    __m256 f[C][NH];
    for (size_t c = 0; c < C; ++c)
      for (size_t h = 0; h < NH; ++h) f[c][h] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; ++b, col += X::kColBytes) {
      if (!kPan) PrefetchStream<X::kColBytes>(col);  // the groups lie one after another: one stream
      __m256i p[C][NH];                              // 4-bit: 16-bit pair sums; Q8_0: 32-bit lane sums
      for (size_t c = 0; c < C; ++c)
        for (size_t h = 0; h < NH; ++h) p[c][h] = _mm256_setzero_si256();
      if constexpr (kQ8) {
        // Signed weights: |w| x sign(x, w) (|pair| <= 2 * 128 * 127 < 2^15), widened at once.
        for (size_t s = 0; s < 8; ++s) {
          for (size_t h = 0; h < NH; ++h) {
            const __m256i z = Load32(col + X::kOffQ + 64 * s + 32 * (h0 + h)), az = _mm256_abs_epi8(z);
            for (size_t c = 0; c < C; ++c) {
              const __m256i xs = _mm256_sign_epi8(Bcast4(a[c].q + X16ActOffset(b, s, false)), z);
              p[c][h] = _mm256_add_epi32(p[c][h], _mm256_madd_epi16(_mm256_maddubs_epi16(az, xs), ones));
              KeepChain(p[c][h]);
            }
          }
        }
      } else {
        [[maybe_unused]] __m256i p32[C][NH];  // Q5, MXFP4: the widened sums of steps 0-1
        HWY_UNROLL(4)
        for (size_t s = 0; s < 4; ++s) {
          for (size_t h = 0; h < NH; ++h) {
            __m256i lo, hi;
            if constexpr (kPan) {
              const uint8_t* ps = pan + 128 * (4 * b + s) + 32 * (h0 + h);
              lo = Load32(ps);
              hi = Load32(ps + 64);
            } else {
              const __m256i z = Load32(col + X::kOffQ + 64 * s + 32 * (h0 + h));
              lo = _mm256_and_si256(z, m4);
              hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
              if constexpr (X::kE8m0) {
                lo = _mm256_shuffle_epi8(lut, lo);
                hi = _mm256_shuffle_epi8(lut, hi);
              }
            }
            if constexpr (X::kQh && !kPan) {
              const __m256i qh = Load32(col + X::kOffQh + 32 * (h0 + h));
              switch (s) {  // immediate shifts (the loop is unrolled)
                case 0:
                  X16OrFifth<0>(qh, lo, hi);
                  break;
                case 1:
                  X16OrFifth<1>(qh, lo, hi);
                  break;
                case 2:
                  X16OrFifth<2>(qh, lo, hi);
                  break;
                default:
                  X16OrFifth<3>(qh, lo, hi);
                  break;
              }
            }
            for (size_t c = 0; c < C; ++c) {
              const __m256i xl = Bcast4(a[c].q + X16ActOffset(b, s, false));
              const __m256i xh = Bcast4(a[c].q + X16ActOffset(b, s, true));
              p[c][h] = _mm256_add_epi16(p[c][h], _mm256_maddubs_epi16(lo, xl));
              p[c][h] = _mm256_add_epi16(p[c][h], _mm256_maddubs_epi16(hi, xh));
              KeepChain(p[c][h]);
              if constexpr (kWiden) {
                if (s == 1) {  // 4 pairs of at most 7874 so far: widen before the 16-bit sum could overflow
                  p32[c][h] = _mm256_madd_epi16(p[c][h], ones);
                  p[c][h] = _mm256_setzero_si256();
                } else if (s == 3) {
                  p[c][h] = _mm256_add_epi32(p32[c][h], _mm256_madd_epi16(p[c][h], ones));
                }
              }
            }
          }
        }
      }
      for (size_t h = 0; h < NH; ++h) {
        const __m256 dw = X16Scales8<X>(col, h0 + h);
        if constexpr (kPairs) {
          for (size_t c = 0; c < C; c += 2) {
            const __m256i ix = kQ8 || kWiden ? p[c][h] : _mm256_madd_epi16(p[c][h], ones);
            const __m256i ir = kQ8 || kWiden ? p[c + 1][h] : _mm256_madd_epi16(p[c + 1][h], ones);
            f[c][h] = X16PairStep<kQ8>(f[c][h], ix, ir, a[c], a[c + 1], b, dw);
          }
          if constexpr (X::kMin) {
            const __m256 dm = _mm256_cvtph_ps(Load16(col + 32 + 16 * (h0 + h)));
            for (size_t c = 0; c < C; c += 2)
              f[c][h] = _mm256_fmadd_ps(dm, _mm256_set1_ps(a[c].gdxs[b] + a[c + 1].gdxs[b]), f[c][h]);
          }
          continue;
        }
        for (size_t c = 0; c < C; ++c) {
          // Start value: ginit = kQmmMagic - off * S (the unsigned nibbles' offset); Q8_0's signed products
          // need no offset term (its ginit holds the AVX3_DL kernel's +128 flip), so kQmmMagic alone.
          const __m256i i32 = kQ8 || kWiden ? p[c][h] : _mm256_madd_epi16(p[c][h], ones);
          const __m256i acc = _mm256_add_epi32(i32, _mm256_set1_epi32(kQ8 ? ::kiln::detail::kQmmMagic : a[c].ginit[b]));
          const __m256 t = _mm256_sub_ps(_mm256_castsi256_ps(acc), magic);
          f[c][h] = _mm256_fmadd_ps(t, _mm256_mul_ps(dw, _mm256_set1_ps(a[c].dx[b])), f[c][h]);
        }
        if constexpr (X::kMin) {
          const __m256 dm = _mm256_cvtph_ps(Load16(col + 32 + 16 * (h0 + h)));
          for (size_t c = 0; c < C; ++c) f[c][h] = _mm256_fmadd_ps(dm, _mm256_set1_ps(a[c].gdxs[b]), f[c][h]);
        }
      }
    }
    for (size_t c = 0; c < C; c += kPairs ? 2 : 1)
      for (size_t h = 0; h < NH; ++h)
        _mm256_storeu_ps(
            y + static_cast<ptrdiff_t>(kPairs ? c / 2 : c) * ldy + static_cast<ptrdiff_t>(16 * g + 8 * (h0 + h)),
            f[c][h]);
  }
}

// ---- Q4_K ----
// A super-block column holds 16 d, 16 dmin, the 12 scale bytes of the 16 rows as three runs of a dword per
// row (u0 = bytes 0..3, u1 = 4..7, u2 = 8..11), then 32 steps: step 8c + t = qs bytes 32c + 4t .. of each
// row, whose low nibbles are logical sub-block 2c (values 4t..4t+3) and high nibbles sub-block 2c + 1. Per
// half (8 rows, one 256-bit register) and sub-block j, for each row of x: 8 vpmaddubsw of the step's nibbles
// against 4 broadcast activation bytes add into 16-bit pair sums (8 x 2 x 15 x 128 < 2^15), one vpmaddwd by
// the lane's (sc_j, sc_j) words adds sc_j * I_j to the super-block's exact int32 sum I (as the row-major
// GemvQ45K), the mins M = sum_j mn_j S_j likewise by (mn_2i, mn_2i+1) words against the activation's
// (S_2i, S_2i+1); then f += I * (d dx) - M * (dmin dx), lane by lane.
struct X16KHalf {
  __m256i scw[8];  // sub-block j's 6-bit scale in both 16-bit words of each lane
  __m256i mnw[4];  // (mn_2i, mn_2i+1) words of each lane
  __m256 d, dmin;
};
// vpshufb pattern: per dword k of a 128-bit lane, bytes (4k + b0, zero, 4k + b1, zero).
HWY_INLINE __m256i X16KWordPattern(int b0, int b1) {
  auto dw = [&](int k) { return (4 * k + b0) | 0x8000 | (4 * k + b1) << 16 | static_cast<int>(0x80000000u); };
  return _mm256_setr_epi32(dw(0), dw(1), dw(2), dw(3), dw(0), dw(1), dw(2), dw(3));
}
// Scales and mins of rows 8h .. 8h + 7 of the super-block column at col (llama.cpp's get_scale_min_k4, lane
// by lane: j < 4: sc = u0 byte j & 63, mn = u1 byte j & 63; j >= 4: sc = (u2 byte j-4 & 15) | (u0 byte j-4
// >> 6) << 4, mn = (u2 byte j-4 >> 4) | (u1 byte j-4 >> 6) << 4).
HWY_INLINE void X16KLoadHalf(const uint8_t* col, size_t h, X16KHalf& k) {
  using X = ::kiln::detail::QmmX16<block_q4_K>;
  const __m256i u0 = Load32(col + X::kOffQh + 32 * h), u1 = Load32(col + X::kOffQh + 64 + 32 * h),
                u2 = Load32(col + X::kOffQh + 128 + 32 * h);
  const __m256i m6 = _mm256_set1_epi8(0x3F), m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  const __m256i sc03 = _mm256_and_si256(u0, m6), mn03 = _mm256_and_si256(u1, m6);
  const __m256i sc47 = _mm256_or_si256(_mm256_and_si256(u2, m4), _mm256_and_si256(_mm256_srli_epi32(u0, 2), m30));
  const __m256i mn47 =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m4), _mm256_and_si256(_mm256_srli_epi32(u1, 2), m30));
  for (int j = 0; j < 4; ++j) {
    const __m256i pat = X16KWordPattern(j, j);
    k.scw[j] = _mm256_shuffle_epi8(sc03, pat);
    k.scw[4 + j] = _mm256_shuffle_epi8(sc47, pat);
  }
  const __m256i p01 = X16KWordPattern(0, 1), p23 = X16KWordPattern(2, 3);
  k.mnw[0] = _mm256_shuffle_epi8(mn03, p01);
  k.mnw[1] = _mm256_shuffle_epi8(mn03, p23);
  k.mnw[2] = _mm256_shuffle_epi8(mn47, p01);
  k.mnw[3] = _mm256_shuffle_epi8(mn47, p23);
  k.d = _mm256_cvtph_ps(Load16(col + 16 * h));
  k.dmin = _mm256_cvtph_ps(Load16(col + 32 + 16 * h));
}

// Logical sub-block J of a super-block for the halves' rows: acc[c] += sc_J * I_J (exact).
template <size_t J, size_t C>
HWY_INLINE void X16KSubBlock(const uint8_t* steps, const int8_t* const* q, __m256i scw, __m256i* acc) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256i p[C];
  for (size_t c = 0; c < C; ++c) p[c] = _mm256_setzero_si256();
  HWY_UNROLL(8)
  for (size_t t = 0; t < 8; ++t) {
    const __m256i z = Load32(steps + 64 * (8 * (J / 2) + t));
    const __m256i u = J % 2 ? _mm256_and_si256(_mm256_srli_epi16(z, 4), m4) : _mm256_and_si256(z, m4);
    for (size_t c = 0; c < C; ++c) {
      p[c] = _mm256_add_epi16(p[c], _mm256_maddubs_epi16(u, Bcast4(q[c] + 32 * kKPerm[J] + 4 * t)));
      KeepChain(p[c]);
    }
  }
  for (size_t c = 0; c < C; ++c) acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p[c], scw));
}

// GemvX16's loop for interleaved Q4_K groups (same halves and registers).
template <size_t C, size_t NH>
HWY_NOINLINE void GemvX16K(const QActLayout& L, const ActRow* a, const uint8_t* w, size_t groups, size_t h0, float* y,
                           ptrdiff_t ldy) {
  using X = ::kiln::detail::QmmX16<block_q4_K>;
  static_assert(C * NH <= 4, "kiln: at most 4 rows of x x halves of a group in registers");
  const size_t nsb = L.k / 256;
  for (size_t g = 0; g < groups; ++g) {
    const uint8_t* col = w + g * nsb * X::kColBytes;
    __m256 f[C][NH];
    for (size_t c = 0; c < C; ++c)
      for (size_t h = 0; h < NH; ++h) f[c][h] = _mm256_setzero_ps();
    for (size_t sb = 0; sb < nsb; ++sb, col += X::kColBytes) {
      PrefetchStream<X::kColBytes>(col);
      const int8_t* q[C];
      for (size_t c = 0; c < C; ++c) q[c] = a[c].q + 256 * sb;
      for (size_t h = 0; h < NH; ++h) {
        X16KHalf k;
        X16KLoadHalf(col, h0 + h, k);
        const uint8_t* steps = col + X::kOffQ + 32 * (h0 + h);
        __m256i acc[C];
        for (size_t c = 0; c < C; ++c) acc[c] = _mm256_setzero_si256();
        X16KSubBlock<0, C>(steps, q, k.scw[0], acc);
        X16KSubBlock<1, C>(steps, q, k.scw[1], acc);
        X16KSubBlock<2, C>(steps, q, k.scw[2], acc);
        X16KSubBlock<3, C>(steps, q, k.scw[3], acc);
        X16KSubBlock<4, C>(steps, q, k.scw[4], acc);
        X16KSubBlock<5, C>(steps, q, k.scw[5], acc);
        X16KSubBlock<6, C>(steps, q, k.scw[6], acc);
        X16KSubBlock<7, C>(steps, q, k.scw[7], acc);
        for (size_t c = 0; c < C; ++c) {
          const int16_t* ls = a[c].lsum16 + 8 * sb;  // S per logical sub-block
          __m256i m = _mm256_madd_epi16(k.mnw[0], Bcast4(reinterpret_cast<const int8_t*>(ls)));
          for (size_t i = 1; i < 4; ++i)
            m = _mm256_add_epi32(m, _mm256_madd_epi16(k.mnw[i], Bcast4(reinterpret_cast<const int8_t*>(ls + 2 * i))));
          const __m256 dx = _mm256_set1_ps(a[c].dx[sb]);
          f[c][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[c]), _mm256_mul_ps(k.d, dx), f[c][h]);
          f[c][h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(k.dmin, dx), f[c][h]);
        }
      }
    }
    for (size_t c = 0; c < C; ++c)
      for (size_t h = 0; h < NH; ++h)
        _mm256_storeu_ps(y + static_cast<ptrdiff_t>(c) * ldy + static_cast<ptrdiff_t>(16 * g + 8 * (h0 + h)), f[c][h]);
  }
}

// The GEMM's decode of one interleaved Q5_0 / Q5_1 group, once per call: block b, step s into pan + 128 (4 b +
// s): [low-nibble values, rows 0-7 | rows 8-15 | high-nibble values, rows 0-7 | 8-15], fifth bits included.
// Decoding the fifth bits per step and 4 rows of x was a large share of the kernel's instructions. For
// Q4_0 / Q4_1 (an and and a shift per step) the panel's stores and reloads cost as much as they save: they
// decode as they go.
template <class B>
inline constexpr bool kX16Pan = std::is_same_v<B, block_q5_0> || std::is_same_v<B, block_q5_1>;
template <class B>
HWY_NOINLINE void DecodeX16Panel(const uint8_t* grp, size_t nb, uint8_t* pan) {
  using X = ::kiln::detail::QmmX16<B>;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* col = grp + b * X::kColBytes;
    for (size_t h = 0; h < 2; ++h) {
      [[maybe_unused]] const __m256i qh = X::kQh ? Load32(col + X::kOffQh + 32 * h) : _mm256_setzero_si256();
      HWY_UNROLL(4)
      for (size_t s = 0; s < 4; ++s) {
        const __m256i z = Load32(col + X::kOffQ + 64 * s + 32 * h);
        __m256i lo = _mm256_and_si256(z, m4), hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
        if constexpr (X::kQh) {
          switch (s) {
            case 0:
              X16OrFifth<0>(qh, lo, hi);
              break;
            case 1:
              X16OrFifth<1>(qh, lo, hi);
              break;
            case 2:
              X16OrFifth<2>(qh, lo, hi);
              break;
            default:
              X16OrFifth<3>(qh, lo, hi);
              break;
          }
        }
        uint8_t* ps = pan + 128 * (4 * b + s) + 32 * h;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(ps), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(ps + 64), hi);
      }
    }
  }
}

template <class B, size_t C, size_t NH, bool kPairs>
HWY_INLINE void GemvX16Any(const QActLayout& L, const ActRow* a, const uint8_t* w, size_t groups, size_t h0, float* y,
                           ptrdiff_t ldy) {
  if constexpr (std::is_same_v<B, block_q4_K>) {
    static_assert(!kPairs, "kiln: Q4_K's interleaved kernel keeps the two parts apart");
    GemvX16K<C, NH>(L, a, w, groups, h0, y, ldy);
  } else {
    GemvX16<B, C, NH, false, kPairs>(L, a, w, groups, h0, y, ldy);
  }
}

template <class B, size_t C, bool kPairs>
HWY_INLINE void GemvX16Rows(const QActLayout& L, const ActRow* a, const uint8_t* w, size_t groups, float* y,
                            ptrdiff_t ldy) {
  if constexpr (C <= 2) {
    GemvX16Any<B, C, 2, kPairs>(L, a, w, groups, 0, y, ldy);
  } else {
    GemvX16Any<B, C, 1, kPairs>(L, a, w, groups, 0, y, ldy);
    GemvX16Any<B, C, 1, kPairs>(L, a, w, groups, 1, y, ldy);
  }
}

}  // namespace avx2

// Whether RowsX16Avx2 adds the two parts of kQmmPairs itself (pairs = true): all but Q4_K, whose kernel keeps
// exact integer sums per super-block, part by part.
HWY_INLINE bool X16Avx2Pairs(uint32_t type) { return type != ::kiln::ggml_type_id::Q4_K; }

namespace avx2 {
template <class B, bool kPairs>
inline void RowsX16(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, size_t groups, float* y,
                    ptrdiff_t ldy) {
  using X = ::kiln::detail::QmmX16<B>;
  constexpr size_t kC = 4;
  const size_t step = m <= kC ? groups : 1;  // groups per pass
  const size_t nb = L.k / dtype_traits<B>::block_size;
  // Row of y of row i0 of x (pairs: rows 2i, 2i + 1 of x give row i; ForRowsOf4's C is even as m is).
  auto y_at = [&](size_t i0, size_t g0) {
    return y + static_cast<ptrdiff_t>(kPairs ? i0 / 2 : i0) * ldy + static_cast<ptrdiff_t>(16 * g0);
  };
  for (size_t g0 = 0; g0 < groups; g0 += step) {
    const uint8_t* wg = w + g0 * nb * X::kColBytes;
    if constexpr (kX16Pan<B>) {
      if (m > kC) {  // GEMM: the group decoded once, then every row of x
        auto* pan = static_cast<uint8_t*>(::kiln::detail::qmm_scratch(2, 512 * nb));
        DecodeX16Panel<B>(wg, nb, pan);
        ForRowsOf4(L, act, m, [&](const ActRow* a, auto C, size_t i0) {
          constexpr size_t kCv = decltype(C)::value;
          if constexpr (!kPairs || kCv % 2 == 0)
            for (size_t h = 0; h < 2; ++h) GemvX16<B, kCv, 1, true, kPairs>(L, a, wg, 1, h, y_at(i0, g0), ldy, pan);
        });
        continue;
      }
    }
    ForRowsOf4(L, act, m, [&](const ActRow* a, auto C, size_t i0) {
      constexpr size_t kCv = decltype(C)::value;
      if constexpr (!kPairs || kCv % 2 == 0) GemvX16Rows<B, kCv, kPairs>(L, a, wg, step, y_at(i0, g0), ldy);
    });
  }
}
}  // namespace avx2

// y (m, 16 * groups) for the `groups` interleaved groups at w (any qmm_interleavable type), rows of x 4 at a
// time. GEMV (m <= 4): one pass over W. GEMM: a group at a time against every row of x, so that its bytes stay in
// L1/L2 while the rows of x stream past. Each output is computed the same way in both. pairs (X16Avx2Pairs, m
// even): rows 2i, 2i + 1 are one row of x's two parts, and y gets m / 2 rows.
inline void RowsX16Avx2(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, size_t groups, float* y,
                        ptrdiff_t ldy, bool pairs) {
  HWY_ASSERT(!pairs || (m % 2 == 0 && X16Avx2Pairs(L.type)));
  VisitType(L.type, [&](auto* tag) {
    using B = std::remove_pointer_t<decltype(tag)>;
    if constexpr (avx2::kX16Avx2<B>) {
      if (!pairs) return avx2::RowsX16<B, false>(L, act, m, w, groups, y, ldy);
      if constexpr (!::kiln::detail::QmmX16<B>::kK) avx2::RowsX16<B, true>(L, act, m, w, groups, y, ldy);
    }
  });
}

#endif  // HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
