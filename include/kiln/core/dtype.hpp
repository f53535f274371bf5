// kiln/core/dtype.hpp - element types a Tensor can hold, and their compile-time traits.
//
// A DType is the C++ type a view's storage unit is made of: float, f16, bf16, int8_t, int32_t, and (in
// quant/blocks.hpp) the GGUF block structs. dtype_traits<T> says how many logical elements one storage
// unit holds (1 for scalars, 32 or 256 for blocks), its size and its name; block types join by
// specialising dtype_traits with is_block = true.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace kiln {

/// IEEE 754 binary16, stored as bits. Conversions are exact (f16 -> f32) and round to nearest even
/// (f32 -> f16), with infinities, NaN and subnormals handled.
struct f16 {
  uint16_t bits = 0;
  constexpr f16() = default;
  static constexpr f16 from_bits(uint16_t b) {
    f16 h;
    h.bits = b;
    return h;
  }
  explicit f16(float f);
  explicit operator float() const;
  friend constexpr bool operator==(f16 a, f16 b) { return a.bits == b.bits; }
};

/// bfloat16 (the top 16 bits of an f32), stored as bits. f32 -> bf16 rounds to nearest even (unlike
/// Highway 1.0.3's DemoteTo, which truncates); NaN stays NaN.
struct bf16 {
  uint16_t bits = 0;
  constexpr bf16() = default;
  static constexpr bf16 from_bits(uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
  explicit bf16(float f);
  explicit operator float() const { return std::bit_cast<float>(uint32_t(bits) << 16); }
  friend constexpr bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};
static_assert(sizeof(f16) == 2 && sizeof(bf16) == 2, "f16/bf16 must be 2 bytes");

inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // NaN: keep it quiet
  u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest, ties to even
  return uint16_t(u >> 16);
}
inline float bf16_bits_to_f32(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint16_t f32_to_f16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);                          // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
    // value = abs_float; f16 subnormal unit is 2^-24. Round to nearest even via float arithmetic.
    const float a = std::bit_cast<float>(abs);
    const float scaled = a * 16777216.0f;                 // a / 2^-24, exact (power of two)
    const uint32_t q = uint32_t(std::nearbyint(scaled));  // default rounding mode: nearest even
    return uint16_t(sign | q);
  }
  // normal: rebias exponent 127 -> 15, round 23-bit mantissa to 10 bits (nearest even)
  uint32_t r = abs - 0x38000000u;  // exponent -= 112
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = float(man) * (1.0f / 16777216.0f);
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf / NaN
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

inline f16::f16(float f) : bits(f32_to_f16_bits(f)) {}
inline f16::operator float() const { return f16_bits_to_f32(bits); }
inline bf16::bf16(float f) : bits(f32_to_bf16_bits(f)) {}

/// Compile-time facts about a storage unit. Block types (quant/blocks.hpp) specialise this with
/// is_block = true and block_size = elements per block.
template <class T>
struct dtype_traits {
  static constexpr bool is_dtype = false;
};

#define KILN_SCALAR_DTYPE(T, NAME)                        \
  template <>                                             \
  struct dtype_traits<T> {                                \
    static constexpr bool is_dtype = true;                \
    static constexpr bool is_block = false;               \
    static constexpr std::size_t block_size = 1;          \
    static constexpr std::size_t block_bytes = sizeof(T); \
    static constexpr std::string_view name = NAME;        \
  }
KILN_SCALAR_DTYPE(float, "f32");
KILN_SCALAR_DTYPE(f16, "f16");
KILN_SCALAR_DTYPE(bf16, "bf16");
KILN_SCALAR_DTYPE(int8_t, "i8");
KILN_SCALAR_DTYPE(int32_t, "i32");
#undef KILN_SCALAR_DTYPE

template <class T>
concept DType = dtype_traits<std::remove_const_t<T>>::is_dtype;

template <class T>
inline constexpr std::string_view dtype_name = dtype_traits<std::remove_const_t<T>>::name;

/// Converts any scalar dtype to f32 (identity for float).
template <class T>
inline float to_f32(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return static_cast<float>(v);
}

}  // namespace kiln
