// kiln/io/common.hpp - what the model-file readers share: overflow-checked arithmetic, a bounds-checked
// little-endian byte cursor, and the typed zero-copy view of a tensor's bytes.
//
// Every reader treats its input as hostile: each count, size and offset is checked against the bytes
// actually present, with overflow-safe arithmetic, before it is used, and every failure is a
// kiln::FormatError naming the file, the field and the values.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"

static_assert(std::endian::native == std::endian::little,
              "kiln/io: GGUF and safetensors are little-endian; big-endian hosts are not supported");

namespace kiln::io::detail {

template <class T>
struct is_std_vector : std::false_type {};
template <class E, class A>
struct is_std_vector<std::vector<E, A>> : std::true_type {};

/// a + b, or nullopt when it overflows uint64_t.
inline std::optional<uint64_t> add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
/// a * b, or nullopt when it overflows uint64_t.
inline std::optional<uint64_t> mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
/// n rounded up to a multiple of a (a power of two), or nullopt on overflow.
inline std::optional<uint64_t> align_up(uint64_t n, uint64_t a) {
  const auto s = add(n, a - 1);
  if (!s) return std::nullopt;
  return *s / a * a;
}

/// Quotes a name taken from a file for an error message: at most 80 bytes, non-printable bytes escaped.
inline std::string quote_name(std::string_view s) {
  std::string out = "'";
  const std::size_t n = s.size() < 80 ? s.size() : 80;
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > n) out += "...";
  out += '\'';
  return out;
}

/// Reads little-endian fields from a byte range, checking every read against the end. `what` names the
/// format ("GGUF"), `file` the file; a short read throws FormatError naming the field and its offset.
class Cursor {
 public:
  Cursor(std::span<const std::byte> bytes, std::string_view what, std::string_view file)
      : bytes_(bytes), what_(what), file_(file) {}

  std::size_t pos() const { return pos_; }
  std::size_t remaining() const { return bytes_.size() - pos_; }
  std::size_t size() const { return bytes_.size(); }
  const std::byte* here() const { return bytes_.data() + pos_; }

  template <class... Args>
  [[noreturn]] void error(const Args&... args) const {
    fail<FormatError>("kiln: ", what_, " file '", file_, "': ", args...);
  }

  /// Checks that n more bytes are present for `field`.
  template <class... Field>
  void need(uint64_t n, const Field&... field) const {
    if (n > remaining())
      error("truncated: ", field..., " needs ", n, " bytes at offset ", pos_, " but only ", remaining(),
            " remain (file size ", bytes_.size(), ")");
  }

  template <class T, class... Field>
  T read(const Field&... field) {
    static_assert(std::is_trivially_copyable_v<T>, "kiln::io::detail::Cursor::read: T must be trivially copyable");
    need(sizeof(T), field...);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  /// n raw bytes (n already validated or checked here), zero-copy.
  template <class... Field>
  std::span<const std::byte> take(uint64_t n, const Field&... field) {
    need(n, field...);
    auto s = bytes_.subspan(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }

  template <class... Field>
  void skip(uint64_t n, const Field&... field) {
    need(n, field...);
    pos_ += static_cast<std::size_t>(n);
  }

 private:
  std::span<const std::byte> bytes_;
  std::size_t pos_ = 0;
  std::string_view what_;
  std::string_view file_;
};

inline std::string_view as_string_view(std::span<const std::byte> s) {
  return {reinterpret_cast<const char*>(s.data()), s.size()};
}

/// A tensor shape in kiln's order (outermost first), as stored in a file: rank 0..8.
struct FileShape {
  static constexpr std::size_t max_rank = 8;
  std::array<uint64_t, max_rank> dims{};
  std::size_t rank = 0;
  uint64_t operator[](std::size_t i) const { return dims[i]; }
  std::string str() const {
    std::string s = "(";
    for (std::size_t i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + ")";
  }
};

/// A row-major DenseTensor<const T, R> over `data` with the file's shape. R may exceed the stored rank
/// (leading 1s are added) or be smaller when the dropped leading extents are 1. Throws ShapeError for
/// an impossible rank and FormatError when the data is not aligned for T.
template <class T, std::size_t R>
DenseTensor<const T, R> typed_view(const std::byte* data, const FileShape& shape, std::string_view what,
                                   std::string_view file, std::string_view name) {
  static_assert(R >= 1 && R <= max_rank, "kiln::io: a tensor view has rank 1..4");
  std::array<std::size_t, R> ext{};
  ext.fill(1);
  if (shape.rank <= R) {
    for (std::size_t i = 0; i < shape.rank; ++i) ext[R - shape.rank + i] = static_cast<std::size_t>(shape[i]);
  } else {
    const std::size_t drop = shape.rank - R;
    for (std::size_t i = 0; i < drop; ++i)
      if (shape[i] != 1)
        fail<ShapeError>("kiln: ", what, " file '", file, "': tensor ", quote_name(name), " has shape ", shape.str(),
                         " which cannot be viewed with rank ", R);
    for (std::size_t i = 0; i < R; ++i) ext[i] = static_cast<std::size_t>(shape[drop + i]);
  }
  if (reinterpret_cast<std::uintptr_t>(data) % alignof(T) != 0)
    fail<FormatError>("kiln: ", what, " file '", file, "': tensor ", quote_name(name), " data at address ",
                      static_cast<const void*>(data), " is not aligned to ", alignof(T), " bytes for ", dtype_name<T>,
                      " (load the file into aligned memory or use the raw bytes)");
  return DenseTensor<const T, R>(reinterpret_cast<const T*>(data), dextents<R>(ext));
}

}  // namespace kiln::io::detail
