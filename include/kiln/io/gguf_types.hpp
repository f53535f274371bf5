// kiln/io/gguf_types.hpp - GGUF metadata value types and GGUFValue, a zero-copy view of one value.
//
// A GGUF metadata value is a scalar (UINT8 .. FLOAT64, BOOL), a STRING (u64 length + bytes, not
// NUL-terminated) or an ARRAY (u32 element type + u64 count + elements; arrays may nest). GGUFValue
// points into the file's bytes and decodes on request:
//
//   v.as<uint32_t>()                   integers convert between integer types when the value fits
//   v.as<float>() / v.as<double>()      from FLOAT32 or FLOAT64
//   v.as<bool>(), v.as<std::string>(), v.as<std::string_view>() (zero-copy)
//   v.as<std::vector<std::string>>()    arrays, element by element with the same rules (nesting allowed)
//
// Anything else (a string read as an integer, a negative value read as unsigned, ...) throws
// kiln::FormatError naming the file, the key, the expected and the actual type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/io/common.hpp"

namespace kiln::io {

enum class GGUFValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

constexpr std::string_view gguf_type_name(GGUFValueType t) {
  constexpr std::string_view names[] = {"UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
                                        "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : std::string_view("INVALID");
}
constexpr bool is_valid_gguf_type(uint32_t t) { return t <= 12; }

/// Bytes of one scalar of type t; 0 for STRING and ARRAY (variable size).
constexpr std::size_t gguf_scalar_size(GGUFValueType t) {
  switch (t) {
    case GGUFValueType::UINT8:
    case GGUFValueType::INT8:
    case GGUFValueType::BOOL:
      return 1;
    case GGUFValueType::UINT16:
    case GGUFValueType::INT16:
      return 2;
    case GGUFValueType::UINT32:
    case GGUFValueType::INT32:
    case GGUFValueType::FLOAT32:
      return 4;
    case GGUFValueType::UINT64:
    case GGUFValueType::INT64:
    case GGUFValueType::FLOAT64:
      return 8;
    default:
      return 0;
  }
}

/// The GGUF type a C++ scalar is stored as (used by the writer and in error messages).
template <class T>
constexpr GGUFValueType gguf_type_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) return GGUFValueType::BOOL;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 1)
    return std::is_signed_v<U> ? GGUFValueType::INT8 : GGUFValueType::UINT8;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 2)
    return std::is_signed_v<U> ? GGUFValueType::INT16 : GGUFValueType::UINT16;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 4)
    return std::is_signed_v<U> ? GGUFValueType::INT32 : GGUFValueType::UINT32;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 8)
    return std::is_signed_v<U> ? GGUFValueType::INT64 : GGUFValueType::UINT64;
  else if constexpr (std::is_same_v<U, float>) return GGUFValueType::FLOAT32;
  else if constexpr (std::is_same_v<U, double>) return GGUFValueType::FLOAT64;
  else if constexpr (std::is_convertible_v<const U&, std::string_view>) return GGUFValueType::STRING;
  else return GGUFValueType::ARRAY;
}

namespace detail {

/// Arrays nested deeper than this are rejected (real files nest at most 2 deep); it bounds the
/// recursion of the value walker on hostile input.
inline constexpr int gguf_max_nesting = 16;

template <class T>
std::string gguf_expected_name() {
  if constexpr (is_std_vector<T>::value) return "ARRAY[" + gguf_expected_name<typename T::value_type>() + "]";
  else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::string_view>) return "STRING";
  else return std::string(gguf_type_name(gguf_type_of<T>()));
}

/// Field description for errors, formatted only when one is thrown: "metadata key 'k'" plus the
/// element index when inside an array.
struct GGUFField {
  std::string_view key;
  uint64_t index = UINT64_MAX;
};
inline std::ostream& operator<<(std::ostream& os, const GGUFField& f) {
  os << "metadata key " << quote_name(f.key);
  if (f.index != UINT64_MAX) os << " element " << f.index;
  return os;
}

inline void gguf_skip_value(Cursor& c, GGUFValueType t, int depth, GGUFField f);

/// Walks `count` encoded elements of type et at the cursor. The count is first checked against the
/// bytes left (each element takes at least 1, 8 or 12 bytes), so a hostile count fails before any work.
inline void gguf_skip_elements(Cursor& c, GGUFValueType et, uint64_t count, int depth, GGUFField f) {
  const std::size_t min_size = et == GGUFValueType::STRING ? 8 : et == GGUFValueType::ARRAY ? 12 : gguf_scalar_size(et);
  if (count > c.remaining() / min_size)
    c.error(f, ": array count ", count, " of ", gguf_type_name(et), " needs at least ",
            static_cast<long double>(count) * min_size, " bytes but only ", c.remaining(), " remain at offset ",
            c.pos());
  if (const std::size_t n = gguf_scalar_size(et)) {
    c.skip(count * n, f);
    return;
  }
  for (uint64_t i = 0; i < count; ++i)
    gguf_skip_value(c, et, depth + 1, GGUFField{f.key, f.index == UINT64_MAX ? i : f.index});
}

/// Walks one encoded value of type t at the cursor, checking every length and count against the bytes
/// left (so no later decode can run off the end) and advancing past it.
inline void gguf_skip_value(Cursor& c, GGUFValueType t, int depth, GGUFField f) {
  if (const std::size_t n = gguf_scalar_size(t)) {
    c.skip(n, f, " (", gguf_type_name(t), ")");
    return;
  }
  if (t == GGUFValueType::STRING) {
    const auto len = c.read<uint64_t>(f, " string length");
    if (len > c.remaining())
      c.error(f, ": string length ", len, " exceeds the ", c.remaining(), " bytes left at offset ", c.pos());
    c.skip(len, f);
    return;
  }
  if (t != GGUFValueType::ARRAY) c.error(f, ": invalid value type ", static_cast<uint32_t>(t));
  if (depth >= gguf_max_nesting) c.error(f, ": arrays nested deeper than ", gguf_max_nesting);
  const auto et = c.read<uint32_t>(f, " array element type");
  if (!is_valid_gguf_type(et)) c.error(f, ": invalid array element type ", et);
  const auto count = c.read<uint64_t>(f, " array count");
  gguf_skip_elements(c, static_cast<GGUFValueType>(et), count, depth, f);
}

}  // namespace detail

/// A zero-copy view of one metadata value inside a GGUF file's bytes (valid while the file lives).
class GGUFValue {
 public:
  GGUFValue() = default;
  /// `bytes`: a scalar's bytes, a string's characters, or an array's encoded elements (after its header).
  GGUFValue(GGUFValueType type, GGUFValueType elem_type, uint64_t count, std::span<const std::byte> bytes,
            std::string_view key, std::string_view file)
      : type_(type), elem_type_(elem_type), count_(count), bytes_(bytes), key_(key), file_(file) {}

  GGUFValueType type() const { return type_; }
  /// The element type of an ARRAY (throws for any other type).
  GGUFValueType array_type() const {
    require(GGUFValueType::ARRAY, "ARRAY");
    return elem_type_;
  }
  /// Elements of an ARRAY, bytes of a STRING, 1 for a scalar.
  uint64_t size() const { return count_; }
  /// The encoded bytes (see the constructor).
  std::span<const std::byte> raw() const { return bytes_; }
  std::string_view key() const { return key_; }
  /// "UINT32", "STRING", "ARRAY[FLOAT32]", "ARRAY[ARRAY]", ...
  std::string type_name() const {
    std::string s(gguf_type_name(type_));
    if (type_ == GGUFValueType::ARRAY) s.append("[").append(gguf_type_name(elem_type_)).append("]");
    return s;
  }

  /// Element i of an ARRAY: O(1) for scalar elements, O(i) for strings and nested arrays.
  GGUFValue at(uint64_t i) const {
    require(GGUFValueType::ARRAY, "ARRAY");
    if (i >= count_) error("index ", i, " out of range for an array of ", count_);
    const detail::GGUFField f{key_};
    detail::Cursor c(bytes_, "GGUF", file_);
    if (const std::size_t n = gguf_scalar_size(elem_type_)) {
      c.skip(i * n, f);
    } else {
      for (uint64_t k = 0; k < i; ++k) detail::gguf_skip_value(c, elem_type_, 1, f);
    }
    return decode_at(c, elem_type_, key_, file_);
  }

  template <class T>
  T as() const {
    using U = std::remove_cv_t<T>;
    if constexpr (detail::is_std_vector<U>::value) {
      using E = typename U::value_type;
      if (type_ != GGUFValueType::ARRAY) type_error(detail::gguf_expected_name<U>());
      U out;
      out.reserve(static_cast<std::size_t>(count_));  // count_ was checked against the bytes present
      if constexpr (std::is_arithmetic_v<E> && !std::is_same_v<E, bool>) {
        if (elem_type_ == gguf_type_of<E>()) {  // fast path: same representation, copy the bytes
          if (bytes_.size() / sizeof(E) != count_)
            error("array of ", count_, " elements has ", bytes_.size(), " bytes");
          out.resize(static_cast<std::size_t>(count_));
          if (count_) std::memcpy(out.data(), bytes_.data(), static_cast<std::size_t>(count_) * sizeof(E));
          return out;
        }
      }
      if (!elem_compatible<E>(elem_type_)) type_error(detail::gguf_expected_name<U>());
      detail::Cursor c(bytes_, "GGUF", file_);
      for (uint64_t i = 0; i < count_; ++i) out.push_back(decode_at(c, elem_type_, key_, file_).template as<E>());
      return out;
    } else if constexpr (std::is_same_v<U, std::string> || std::is_same_v<U, std::string_view>) {
      require(GGUFValueType::STRING, "STRING");
      return U(detail::as_string_view(bytes_));
    } else if constexpr (std::is_same_v<U, bool>) {
      require(GGUFValueType::BOOL, "BOOL");
      const auto b = std::to_integer<uint8_t>(bytes_[0]);
      if (b > 1) error("BOOL value ", unsigned(b), " is neither 0 nor 1");
      return b != 0;
    } else if constexpr (std::is_floating_point_v<U>) {
      if (type_ == GGUFValueType::FLOAT32) return static_cast<U>(load<float>());
      if (type_ == GGUFValueType::FLOAT64) return static_cast<U>(load<double>());
      type_error(detail::gguf_expected_name<U>());
    } else if constexpr (std::is_integral_v<U>) {
      return convert_int<U>();
    } else {
      static_assert(sizeof(U) == 0,
                    "kiln::io::GGUFValue::as<T>: unsupported T (use an integer, float, double, "
                    "bool, std::string, std::string_view or std::vector of those)");
    }
  }

  /// A short human-readable rendering: scalars and strings in full (strings quoted), arrays abbreviated
  /// to their first max_elems elements.
  std::string to_string(std::size_t max_elems = 8) const {
    switch (type_) {
      case GGUFValueType::STRING:
        return detail::quote_name(as<std::string_view>());
      case GGUFValueType::BOOL:
        return std::to_integer<uint8_t>(bytes_[0]) ? "true" : "false";
      case GGUFValueType::FLOAT32:
      case GGUFValueType::FLOAT64:
        return kiln::detail::concat(as<double>());
      case GGUFValueType::ARRAY: {
        std::string s = "[";
        for (uint64_t i = 0; i < count_ && i < max_elems; ++i) s += (i ? ", " : "") + at(i).to_string(max_elems);
        if (count_ > max_elems) s += ", ... (" + std::to_string(count_) + " total)";
        return s + "]";
      }
      case GGUFValueType::INT8:
      case GGUFValueType::INT16:
      case GGUFValueType::INT32:
      case GGUFValueType::INT64:
        return std::to_string(as<int64_t>());
      default:
        return std::to_string(as<uint64_t>());
    }
  }

  /// Decodes the value of type t at the cursor and advances past it. The walk re-checks every length,
  /// so this is safe on unvalidated bytes too.
  static GGUFValue decode_at(detail::Cursor& c, GGUFValueType t, std::string_view key, std::string_view file) {
    const detail::GGUFField f{key};
    if (const std::size_t n = gguf_scalar_size(t)) return {t, t, 1, c.take(n, f), key, file};
    if (t == GGUFValueType::STRING) {
      const auto len = c.read<uint64_t>(f, " string length");
      if (len > c.remaining())
        c.error(f, ": string length ", len, " exceeds the ", c.remaining(), " bytes left at offset ", c.pos());
      return {t, t, len, c.take(len, f), key, file};
    }
    if (t != GGUFValueType::ARRAY) c.error(f, ": invalid value type ", static_cast<uint32_t>(t));
    const auto et_raw = c.read<uint32_t>(f, " array element type");
    if (!is_valid_gguf_type(et_raw)) c.error(f, ": invalid array element type ", et_raw);
    const auto et = static_cast<GGUFValueType>(et_raw);
    const auto count = c.read<uint64_t>(f, " array count");
    detail::Cursor w = c;  // measure the elements by walking them
    detail::gguf_skip_elements(w, et, count, 0, f);
    return {t, et, count, c.take(w.pos() - c.pos(), f), key, file};
  }

 private:
  template <class... Args>
  [[noreturn]] void error(const Args&... args) const {
    fail<FormatError>("kiln: GGUF file '", file_, "': metadata key ", detail::quote_name(key_), ": ", args...);
  }
  [[noreturn]] void type_error(const std::string& expected) const {
    fail<FormatError>("kiln: GGUF file '", file_, "': metadata key ", detail::quote_name(key_), " has type ",
                      type_name(), ", expected ", expected);
  }
  void require(GGUFValueType t, const char* expected) const {
    if (type_ != t) type_error(expected);
  }
  template <class S>
  S load() const {
    S v;
    std::memcpy(&v, bytes_.data(), sizeof(S));  // bytes_.size() == sizeof(S) by construction
    return v;
  }

  template <class E>
  static bool elem_compatible(GGUFValueType et) {
    if constexpr (detail::is_std_vector<E>::value) return et == GGUFValueType::ARRAY;
    else if constexpr (std::is_same_v<E, std::string> || std::is_same_v<E, std::string_view>)
      return et == GGUFValueType::STRING;
    else if constexpr (std::is_same_v<E, bool>) return et == GGUFValueType::BOOL;
    else if constexpr (std::is_floating_point_v<E>) return et == GGUFValueType::FLOAT32 || et == GGUFValueType::FLOAT64;
    else if constexpr (std::is_integral_v<E>) return is_int_type(et);
    else return false;
  }
  static bool is_int_type(GGUFValueType t) {
    switch (t) {
      case GGUFValueType::UINT8:
      case GGUFValueType::INT8:
      case GGUFValueType::UINT16:
      case GGUFValueType::INT16:
      case GGUFValueType::UINT32:
      case GGUFValueType::INT32:
      case GGUFValueType::UINT64:
      case GGUFValueType::INT64:
        return true;
      default:
        return false;
    }
  }

  template <class U>
  U convert_int() const {
    bool negative = false;
    uint64_t mag = 0;  // |value|
    switch (type_) {
      case GGUFValueType::UINT8:
        mag = load<uint8_t>();
        break;
      case GGUFValueType::UINT16:
        mag = load<uint16_t>();
        break;
      case GGUFValueType::UINT32:
        mag = load<uint32_t>();
        break;
      case GGUFValueType::UINT64:
        mag = load<uint64_t>();
        break;
      case GGUFValueType::INT8:
      case GGUFValueType::INT16:
      case GGUFValueType::INT32:
      case GGUFValueType::INT64: {
        int64_t v = type_ == GGUFValueType::INT8    ? load<int8_t>()
                    : type_ == GGUFValueType::INT16 ? load<int16_t>()
                    : type_ == GGUFValueType::INT32 ? load<int32_t>()
                                                    : load<int64_t>();
        negative = v < 0;
        mag = negative ? uint64_t(0) - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
        break;
      }
      default:
        type_error(detail::gguf_expected_name<U>());
    }
    const bool fits = negative ? std::is_signed_v<U> && mag <= uint64_t(std::numeric_limits<U>::max()) + 1
                               : mag <= uint64_t(std::numeric_limits<U>::max());
    if (!fits)
      error("value ", negative ? "-" : "", mag, " (", type_name(), ") is out of range for ",
            detail::gguf_expected_name<U>());
    if (negative) return static_cast<U>(-static_cast<int64_t>(mag - 1) - 1);
    return static_cast<U>(mag);
  }

  GGUFValueType type_ = GGUFValueType::UINT8;
  GGUFValueType elem_type_ = GGUFValueType::UINT8;
  uint64_t count_ = 0;
  std::span<const std::byte> bytes_;
  std::string_view key_;
  std::string_view file_;
};

}  // namespace kiln::io
