// kiln/quant/dequant.hpp - quant_traits<B>: scalar dequantization of every GGUF block type, and
// quantization into Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q8_K.
//
//   quant_traits<B>::dequantize(const B& block, float* out)      out: block_size floats
//   quant_traits<B>::quantize(const float* x, B& block)          x: block_size floats (can_quantize)
//
// Dequantization is bit-exact with gguf-py's numpy dequantizer (gguf.quants.dequantize), which rounds
// every operation to f32 in this order: K-quants first form the sub-block scale d*sc (and dmin*mn), then
// (d*sc)*q, then subtract; Q4_1/Q5_1 compute d*q + m. kiln keeps the same order. Every product before an
// add is exact in f32 (an f16 significand has 11 bits, sc at most 6 and q at most 5: d*sc*q needs <= 22
// of f32's 24 bits and stays far from under/overflow), so an FMA contraction of the add cannot change
// the result either: compilers may fuse or vectorise these loops freely.
//
// Quantization into Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 is byte-identical with gguf-py's quantizer (itself
// identical with ggml's *_ref functions) for finite inputs. There x * (1/d) is inexact, so the add that
// follows must see it rounded: detail::rounded stops the compiler from fusing them (FMA contraction,
// GCC's default wherever FMA is enabled, does change levels; tests/quant/test_fma.cpp). Q4_K and Q8_K
// follow ggml's quantize_row_q4_K_ref / quantize_row_q8_K_ref (gguf-py has no quantizer for them).
// Non-finite inputs give a defined block (NaN quantizes to level 0) but are not promised to match
// anything.
//
// The fast paths for inference are the integer dot products (ops), not these loops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kiln/core/dtype.hpp"
#include "kiln/quant/blocks.hpp"

namespace kiln {

namespace detail {

/// Returns x unchanged, but opaque to the optimiser: a product passed through it is rounded to f32
/// before any following add, so no FMA contraction can change results (-ffp-contract=fast is GCC's
/// default and applies whenever the target has FMA, e.g. after inlining into an AVX2 function).
inline float rounded(float x) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__SSE2__))
  asm("" : "+x"(x));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm("" : "+w"(x));
#elif defined(__GNUC__)
  asm("" : "+m"(x));
#else
  volatile float v = x;
  x = v;
#endif
  return x;
}

inline uint32_t load_u32_le(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian host (blocks.hpp)
  return v;
}

/// Q4_K/Q5_K: the 6-bit scale and min of sub-block j (< 8) from the 12 packed bytes: bytes 0..3 hold
/// scales 0..3 (low 6 bits), bytes 4..7 mins 0..3; scales/mins 4..7 have their low nibbles in bytes
/// 8..11 and their top 2 bits in the top 2 bits of bytes 0..3 / 4..7.
inline void get_scale_min_k4(std::size_t j, const uint8_t* q, uint8_t& sc, uint8_t& mn) {
  if (j < 4) {
    sc = q[j] & 63;
    mn = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    mn = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/// get_scale_min_k4 for all 8 sub-blocks at once, 4 at a time in 32-bit words (the kernels' per-row form;
/// get_scale_min_k4 stays the reference): sc[j], mn[j] for j < 8.
inline void scales_mins_k4(const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  const uint32_t u0 = load_u32_le(q), u1 = load_u32_le(q + 4), u2 = load_u32_le(q + 8);
  const uint32_t s03 = u0 & 0x3F3F3F3Fu, m03 = u1 & 0x3F3F3F3Fu;
  const uint32_t s47 = (u2 & 0x0F0F0F0Fu) | ((u0 >> 2) & 0x30303030u);
  const uint32_t m47 = ((u2 >> 4) & 0x0F0F0F0Fu) | ((u1 >> 2) & 0x30303030u);
  for (std::size_t j = 0; j < 4; ++j) {
    sc[j] = static_cast<uint8_t>(s03 >> (8 * j));
    sc[4 + j] = static_cast<uint8_t>(s47 >> (8 * j));
    mn[j] = static_cast<uint8_t>(m03 >> (8 * j));
    mn[4 + j] = static_cast<uint8_t>(m47 >> (8 * j));
  }
}

/// Q3_K: the 6-bit scale of sub-block i (< 16), still biased by 32: low 4 bits are nibble i / 8 of byte
/// i % 8, high 2 bits are bits 2*(i / 4).. of byte 8 + i % 4.
inline int q3_k_scale(const uint8_t* s, std::size_t i) {
  const int lo = (i < 8 ? s[i] : s[i - 8] >> 4) & 0xF;
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

/// The e2m1 values doubled, by 4-bit code (ggml's kvalues_mxfp4): integers, so that an int8 table lookup
/// gives MXFP4's codes for integer dot products.
inline constexpr int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/// MXFP4's scale as ggml and gguf-py use it with the doubled values: 2^(e - 128) (ggml_e8m0_to_fp32_half),
/// as f32 bits: subnormal for e < 2 (e = 0: 2^-128, e = 1: 2^-127), 2^127 for e = 255 (ggml does not
/// read 255 as NaN).
inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t(0x00200000) << e : uint32_t(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// Index and value of the first element of largest magnitude (numpy's argmax of abs(x), and ggml's
/// strict `amax < fabsf(v)` scan; both keep the first of equal magnitudes).
inline float signed_absmax(const float* x, std::size_t n) {
  float amax = std::fabs(x[0]), max = x[0];
  for (std::size_t i = 1; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  return max;
}

/// ggml's nearest_int: round half to even through the float magic 1.5 * 2^23 (|v| <= 2^22).
inline int nearest_int(float v) {
  const float m = rounded(v) + 12582912.f;
  int32_t i;
  std::memcpy(&i, &m, 4);
  return (i & 0x007fffff) - 0x00400000;
}

/// trunc(v) as an int clamped to [0, hi], NaN -> 0 (gguf-py: np.trunc(...).astype(uint8).clip(0, hi)).
inline uint8_t trunc_clamp(float v, int hi) {
  if (!(v >= 0.f)) return 0;
  return v >= float(hi) ? uint8_t(hi) : uint8_t(int(v));
}

/// Legacy quantizers' shared pieces: q = trunc(x * id + offset) clamped to [0, qmax].
inline uint8_t quant_level(float x, float id, float offset, int qmax) {
  return trunc_clamp(rounded(x * id) + offset, qmax);
}
inline uint8_t quant_level_min(float x, float min, float id, int qmax) {
  return trunc_clamp(rounded((x - min) * id) + 0.5f, qmax);
}
inline float inverse_or_zero(float d) { return d == 0.f ? 0.f : 1.f / d; }

/// Block min and max as numpy's blocks.min(axis=-1)/max(axis=-1) return them: of equal extremes the
/// last one, which only shows for +0 and -0 (it sets the sign of a zero m or d; measured on numpy 2.4,
/// see make_quant_fixtures.py). ggml's strict scan would keep the first; the values are the same.
inline void min_max(const float* x, std::size_t n, float& mn, float& mx) {
  mn = mx = x[0];
  for (std::size_t i = 1; i < n; ++i) {
    if (x[i] <= mn) mn = x[i];
    if (x[i] >= mx) mx = x[i];
  }
}

void quantize_q4_k(const float* x, block_q4_K& y);  // below

}  // namespace detail

/// Compile-time dequantize/quantize per block type; specialised for every block in blocks.hpp.
template <class B>
struct quant_traits {
  static constexpr bool is_quant = false;
};

/// A block type kiln can dequantize (all of blocks.hpp), and one it can also quantize into.
template <class B>
concept Dequantizable = BlockDType<B> && quant_traits<std::remove_const_t<B>>::is_quant;
template <class B>
concept Quantizable = Dequantizable<B> && quant_traits<std::remove_const_t<B>>::can_quantize;

template <>
struct quant_traits<block_q4_0> {
  static constexpr bool is_quant = true, can_quantize = true;
  static void dequantize(const block_q4_0& b, float* y) {
    const float d = float(b.d);
    for (std::size_t j = 0; j < QK4_0 / 2; ++j) {
      y[j] = d * float((b.qs[j] & 0xF) - 8);
      y[j + QK4_0 / 2] = d * float((b.qs[j] >> 4) - 8);
    }
  }
  /// d = (the signed value of largest magnitude) / -8, q = trunc(x / d + 8.5) clamped to 15.
  static void quantize(const float* x, block_q4_0& b) {
    const float d = detail::signed_absmax(x, QK4_0) / -8.f;
    const float id = detail::inverse_or_zero(d);
    b.d = f16(d);
    for (std::size_t j = 0; j < QK4_0 / 2; ++j)
      b.qs[j] =
          uint8_t(detail::quant_level(x[j], id, 8.5f, 15) | (detail::quant_level(x[j + QK4_0 / 2], id, 8.5f, 15) << 4));
  }
};

template <>
struct quant_traits<block_q4_1> {
  static constexpr bool is_quant = true, can_quantize = true;
  static void dequantize(const block_q4_1& b, float* y) {
    const float d = float(b.d), m = float(b.m);
    for (std::size_t j = 0; j < QK4_1 / 2; ++j) {
      y[j] = d * float(b.qs[j] & 0xF) + m;
      y[j + QK4_1 / 2] = d * float(b.qs[j] >> 4) + m;
    }
  }
  /// d = (max - min) / 15, m = min, q = trunc((x - min) / d + 0.5) clamped to 15.
  static void quantize(const float* x, block_q4_1& b) {
    float mn, mx;
    detail::min_max(x, QK4_1, mn, mx);
    const float d = (mx - mn) / 15.f;
    const float id = detail::inverse_or_zero(d);
    b.d = f16(d);
    b.m = f16(mn);
    for (std::size_t j = 0; j < QK4_1 / 2; ++j)
      b.qs[j] = uint8_t(detail::quant_level_min(x[j], mn, id, 15) |
                        (detail::quant_level_min(x[j + QK4_1 / 2], mn, id, 15) << 4));
  }
};

template <>
struct quant_traits<block_q5_0> {
  static constexpr bool is_quant = true, can_quantize = true;
  static void dequantize(const block_q5_0& b, float* y) {
    const float d = float(b.d);
    const uint32_t qh = detail::load_u32_le(b.qh);
    for (std::size_t j = 0; j < QK5_0 / 2; ++j) {
      const int q0 = (b.qs[j] & 0xF) | int(((qh >> j) & 1u) << 4);
      const int q1 = (b.qs[j] >> 4) | int(((qh >> (j + 16)) & 1u) << 4);
      y[j] = d * float(q0 - 16);
      y[j + QK5_0 / 2] = d * float(q1 - 16);
    }
  }
  /// d = (the signed value of largest magnitude) / -16, q = trunc(x / d + 16.5) clamped to 31.
  static void quantize(const float* x, block_q5_0& b) {
    const float d = detail::signed_absmax(x, QK5_0) / -16.f;
    const float id = detail::inverse_or_zero(d);
    b.d = f16(d);
    uint32_t qh = 0;
    for (std::size_t j = 0; j < QK5_0 / 2; ++j) {
      const uint8_t q0 = detail::quant_level(x[j], id, 16.5f, 31);
      const uint8_t q1 = detail::quant_level(x[j + QK5_0 / 2], id, 16.5f, 31);
      b.qs[j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= uint32_t(q0 >> 4) << j;
      qh |= uint32_t(q1 >> 4) << (j + 16);
    }
    std::memcpy(b.qh, &qh, 4);
  }
};

template <>
struct quant_traits<block_q5_1> {
  static constexpr bool is_quant = true, can_quantize = true;
  static void dequantize(const block_q5_1& b, float* y) {
    const float d = float(b.d), m = float(b.m);
    const uint32_t qh = detail::load_u32_le(b.qh);
    for (std::size_t j = 0; j < QK5_1 / 2; ++j) {
      const int q0 = (b.qs[j] & 0xF) | int(((qh >> j) & 1u) << 4);
      const int q1 = (b.qs[j] >> 4) | int(((qh >> (j + 16)) & 1u) << 4);
      y[j] = d * float(q0) + m;
      y[j + QK5_1 / 2] = d * float(q1) + m;
    }
  }
  /// d = (max - min) / 31, m = min, q = trunc((x - min) / d + 0.5) clamped to 31.
  static void quantize(const float* x, block_q5_1& b) {
    float mn, mx;
    detail::min_max(x, QK5_1, mn, mx);
    const float d = (mx - mn) / 31.f;
    const float id = detail::inverse_or_zero(d);
    b.d = f16(d);
    b.m = f16(mn);
    uint32_t qh = 0;
    for (std::size_t j = 0; j < QK5_1 / 2; ++j) {
      const uint8_t q0 = detail::quant_level_min(x[j], mn, id, 31);
      const uint8_t q1 = detail::quant_level_min(x[j + QK5_1 / 2], mn, id, 31);
      b.qs[j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= uint32_t(q0 >> 4) << j;
      qh |= uint32_t(q1 >> 4) << (j + 16);
    }
    std::memcpy(b.qh, &qh, 4);
  }
};

template <>
struct quant_traits<block_q8_0> {
  static constexpr bool is_quant = true, can_quantize = true;
  static void dequantize(const block_q8_0& b, float* y) {
    const float d = float(b.d);
    for (std::size_t j = 0; j < QK8_0; ++j) y[j] = d * float(b.qs[j]);
  }
  /// d = max|x| / 127, q = round(x / d), halves away from zero (roundf; gguf-py's np_roundf).
  static void quantize(const float* x, block_q8_0& b) {
    float amax = 0.f;
    for (std::size_t j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f;
    const float id = detail::inverse_or_zero(d);
    b.d = f16(d);
    for (std::size_t j = 0; j < QK8_0; ++j) {
      const float r = std::round(x[j] * id);
      b.qs[j] = r != r ? int8_t(0) : int8_t(std::clamp(r, -127.f, 127.f));  // |r| <= 127 when finite
    }
  }
};

template <>
struct quant_traits<block_q2_K> {
  static constexpr bool is_quant = true, can_quantize = false;
  static void dequantize(const block_q2_K& b, float* y) {
    const float d = float(b.d), dmin = float(b.dmin);
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t s = 0; s < 4; ++s)
        for (std::size_t g = 0; g < 2; ++g) {  // sub-block (h*128 + s*32 + g*16) / 16
          const uint8_t sc = b.scales[h * 8 + s * 2 + g];
          const float dl = d * float(sc & 0xF), ml = dmin * float(sc >> 4);
          const uint8_t* q = b.qs + h * 32 + g * 16;
          float* out = y + h * 128 + s * 32 + g * 16;
          for (std::size_t l = 0; l < 16; ++l) out[l] = dl * float((q[l] >> (2 * s)) & 3) - ml;
        }
  }
};

template <>
struct quant_traits<block_q3_K> {
  static constexpr bool is_quant = true, can_quantize = false;
  static void dequantize(const block_q3_K& b, float* y) {
    const float d = float(b.d);
    float dl[16];
    for (std::size_t i = 0; i < 16; ++i) dl[i] = d * float(detail::q3_k_scale(b.scales, i));
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t s = 0; s < 4; ++s)
        for (std::size_t g = 0; g < 2; ++g) {  // 16 values e = h*128 + s*32 + g*16 + l; high bit e / 32
          const float dg = dl[h * 8 + s * 2 + g];
          const std::size_t hb = h * 4 + s;
          float* out = y + h * 128 + s * 32 + g * 16;
          for (std::size_t l = 0; l < 16; ++l) {
            const int lo = (b.qs[h * 32 + g * 16 + l] >> (2 * s)) & 3;
            const int hbit = (b.hmask[g * 16 + l] >> hb) & 1;
            out[l] = dg * float(lo - 4 + 4 * hbit);
          }
        }
  }
};

template <>
struct quant_traits<block_q4_K> {
  static constexpr bool is_quant = true, can_quantize = true;
  static void dequantize(const block_q4_K& b, float* y) {
    const float d = float(b.d), dmin = float(b.dmin);
    for (std::size_t c = 0; c < 4; ++c)
      for (std::size_t h = 0; h < 2; ++h) {
        uint8_t sc, mn;
        detail::get_scale_min_k4(2 * c + h, b.scales, sc, mn);
        const float dl = d * float(sc), ml = dmin * float(mn);
        float* out = y + c * 64 + h * 32;
        for (std::size_t l = 0; l < 32; ++l) out[l] = dl * float((b.qs[c * 32 + l] >> (4 * h)) & 0xF) - ml;
      }
  }
  /// ggml's quantize_row_q4_K_ref: per 32-value sub-block a weighted least-squares scale and min
  /// search (make_qkx2_quants), then 6-bit scales/mins relative to their maxima, then requantization.
  static void quantize(const float* x, block_q4_K& b) { detail::quantize_q4_k(x, b); }
};

template <>
struct quant_traits<block_q5_K> {
  static constexpr bool is_quant = true, can_quantize = false;
  static void dequantize(const block_q5_K& b, float* y) {
    const float d = float(b.d), dmin = float(b.dmin);
    for (std::size_t c = 0; c < 4; ++c)
      for (std::size_t h = 0; h < 2; ++h) {
        const std::size_t sub = 2 * c + h;
        uint8_t sc, mn;
        detail::get_scale_min_k4(sub, b.scales, sc, mn);
        const float dl = d * float(sc), ml = dmin * float(mn);
        float* out = y + sub * 32;
        for (std::size_t l = 0; l < 32; ++l) {
          const int q = ((b.qs[c * 32 + l] >> (4 * h)) & 0xF) | (((b.qh[l] >> sub) & 1) << 4);
          out[l] = dl * float(q) - ml;
        }
      }
  }
};

template <>
struct quant_traits<block_q6_K> {
  static constexpr bool is_quant = true, can_quantize = false;
  static void dequantize(const block_q6_K& b, float* y) {
    const float d = float(b.d);
    float dl[16];
    for (std::size_t i = 0; i < 16; ++i) dl[i] = d * float(b.scales[i]);
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t k = 0; k < 4; ++k)      // values e = h*128 + k*32 + l: nibble k / 2 of ql, bit pair k of qh
        for (std::size_t g = 0; g < 2; ++g) {  // two sub-blocks of 16
          const float dg = dl[h * 8 + k * 2 + g];
          const uint8_t* ql = b.ql + h * 64 + (k % 2) * 32 + g * 16;
          const uint8_t* qh = b.qh + h * 32 + g * 16;
          float* out = y + h * 128 + k * 32 + g * 16;
          for (std::size_t l = 0; l < 16; ++l) {
            const int lo = (ql[l] >> (4 * (k / 2))) & 0xF;
            const int hi = (qh[l] >> (2 * k)) & 3;
            out[l] = dg * float((lo | (hi << 4)) - 32);
          }
        }
  }
};

/// MXFP4: y = d * kvalues_mxfp4[code] with d = e8m0_to_fp32_half(e); every product is exact (a power of
/// two times an integer of at most 4 bits), overflowing to inf only for e = 255 and codes of 8 or 12.
/// Quantizes as gguf-py does (below).
template <>
struct quant_traits<block_mxfp4> {
  static constexpr bool is_quant = true, can_quantize = true;
  static void dequantize(const block_mxfp4& b, float* y) {
    const float d = detail::e8m0_to_fp32_half(b.e);
    for (std::size_t j = 0; j < QK_MXFP4 / 2; ++j) {
      y[j] = d * float(detail::kvalues_mxfp4[b.qs[j] & 0xF]);
      y[j + QK_MXFP4 / 2] = d * float(detail::kvalues_mxfp4[b.qs[j] >> 4]);
    }
  }
  /// gguf-py's MXFP4.quantize_blocks (ggml's quantize_row_mxfp4_ref): amax = max |x|, e = floor(log2f(amax))
  /// - 2 + 127 (0 for amax = 0; clamped to 0..255 where gguf-py's uint8 cast is undefined: amax < 2^-125),
  /// d = 2^(e - 128), and each value's code the first of the 16 minimising |d * kvalues_mxfp4[c] - x| in f32
  /// (numpy's argmin: of equal errors the lower code, so +0 for zeros and the smaller magnitude at halves).
  static void quantize(const float* x, block_mxfp4& b) {
    float amax = 0.f;
    for (std::size_t j = 0; j < QK_MXFP4; ++j) amax = std::max(amax, std::fabs(x[j]));
    int e = 0;
    if (amax > 0.f) e = std::clamp(int(std::floor(std::log2(amax))) - 2 + 127, 0, 255);
    b.e = uint8_t(e);
    const float d = detail::e8m0_to_fp32_half(b.e);
    uint8_t code[QK_MXFP4];
    for (std::size_t j = 0; j < QK_MXFP4; ++j) {
      uint8_t best = 0;
      float best_err = std::fabs(detail::rounded(d * float(detail::kvalues_mxfp4[0])) - x[j]);
      for (uint8_t c = 1; c < 16; ++c) {
        // rounded: the product is exact or overflows (e = 255), and an FMA would not overflow
        const float err = std::fabs(detail::rounded(d * float(detail::kvalues_mxfp4[c])) - x[j]);
        if (err < best_err) {
          best_err = err;
          best = c;
        }
      }
      code[j] = best;
    }
    for (std::size_t j = 0; j < QK_MXFP4 / 2; ++j) b.qs[j] = uint8_t(code[j] | (code[j + QK_MXFP4 / 2] << 4));
  }
};

template <>
struct quant_traits<block_q8_K> {
  static constexpr bool is_quant = true, can_quantize = true;
  static void dequantize(const block_q8_K& b, float* y) {
    for (std::size_t j = 0; j < QK_K; ++j) y[j] = b.d * float(b.qs[j]);
  }
  /// ggml's quantize_row_q8_K_ref: with m the signed value of largest magnitude, iscale = -127 / m,
  /// q = nearest_int(iscale * x) (ties to even) capped at 127, d = 1 / iscale, bsums = group sums.
  static void quantize(const float* x, block_q8_K& b) {
    const float max = detail::signed_absmax(x, QK_K);
    if (!(std::fabs(max) > 0.f)) {  // all zero (or NaN): an all-zero block
      b.d = 0.f;
      std::memset(b.qs, 0, sizeof b.qs);
      std::memset(b.bsums, 0, sizeof b.bsums);
      return;
    }
    const float iscale = -127.f / max;
    for (std::size_t j = 0; j < QK_K; ++j) {
      const float v = iscale * x[j];
      b.qs[j] = v != v ? int8_t(0) : int8_t(std::min(127, detail::nearest_int(std::clamp(v, -128.f, 128.f))));
    }
    for (std::size_t g = 0; g < QK_K / 16; ++g) {
      int sum = 0;
      for (std::size_t l = 0; l < 16; ++l) sum += b.qs[g * 16 + l];
      b.bsums[g] = int16_t(sum);
    }
    b.d = 1.f / iscale;
  }
};

namespace detail {

/// ggml's make_qkx2_quants: fits x[i] ~ scale * L[i] - the_min with L in [0, nmax] and the_min >= 0,
/// minimising the weighted squared error over nstep + 1 candidate scales around nmax / (max - min).
inline float make_qkx2_quants(std::size_t n, int nmax, const float* x, const float* w, uint8_t* L, float& the_min,
                              uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = w[0], sum_x = sum_w * x[0];
  for (std::size_t i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t(0));
    the_min = -min;
    return 0.f;
  }
  float iscale = float(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = uint8_t(std::clamp(l, 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best_error += w[i] * diff * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = uint8_t(l);
      sum_l += w[i] * float(l);
      sum_l2 += w[i] * float(l) * float(l);
      sum_xl += w[i] * float(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const float diff = this_scale * Laux[i] + this_min - x[i];
        cur_error += w[i] * diff * diff;
      }
      if (cur_error < best_error) {
        std::copy(Laux, Laux + n, L);
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  the_min = -min;
  return scale;
}

inline void quantize_q4_k(const float* x, block_q4_K& y) {
  uint8_t L[QK_K], Laux[32];
  float weights[32], mins[QK_K / 32], scales[QK_K / 32];
  float max_scale = 0, max_min = 0;
  for (std::size_t j = 0; j < QK_K / 32; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (std::size_t l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);  // weights: |x| plus the sub-block's rms
    for (std::size_t l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = make_qkx2_quants(32, 15, xs, weights, L + 32 * j, mins[j], Laux, -1.f, 0.1f, 20);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::memset(y.scales, 0, sizeof y.scales);
  for (std::size_t j = 0; j < QK_K / 32; ++j) {
    const uint8_t ls = uint8_t(std::min(63, nearest_int(inv_scale * scales[j])));
    const uint8_t lm = uint8_t(std::min(63, nearest_int(inv_min * mins[j])));
    if (j < 4) {
      y.scales[j] = ls;
      y.scales[j + 4] = lm;
    } else {
      y.scales[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
      y.scales[j - 4] |= uint8_t((ls >> 4) << 6);
      y.scales[j] |= uint8_t((lm >> 4) << 6);
    }
  }
  y.d = f16(max_scale / 63.f);
  y.dmin = f16(max_min / 63.f);
  for (std::size_t j = 0; j < QK_K / 32; ++j) {  // requantize against the stored (rounded) scales
    uint8_t sc, mn;
    get_scale_min_k4(j, y.scales, sc, mn);
    const float d = float(y.d) * float(sc);
    if (d == 0.f) continue;
    const float dm = float(y.dmin) * float(mn);
    for (std::size_t i = 0; i < 32; ++i)
      L[32 * j + i] = uint8_t(std::clamp(nearest_int((x[32 * j + i] + dm) / d), 0, 15));
  }
  for (std::size_t c = 0; c < 4; ++c)
    for (std::size_t l = 0; l < 32; ++l) y.qs[c * 32 + l] = uint8_t(L[c * 64 + l] | (L[c * 64 + 32 + l] << 4));
}

}  // namespace detail

}  // namespace kiln
