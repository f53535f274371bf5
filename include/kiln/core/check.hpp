// kiln/core/check.hpp - what op wrappers use to validate the views they are handed.
#pragma once

#include <array>
#include <cstddef>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"

/// Compile-time dtype check for an op argument: KILN_REQUIRE_DTYPE(X, float, "rms_norm", "x").
#define KILN_REQUIRE_DTYPE(X, T, OP, ARG)                                                    \
  static_assert(::kiln::TensorLike<X>, "kiln::" OP ": " ARG " must be a kiln::Tensor view"); \
  static_assert(std::is_same_v<typename std::remove_cvref_t<X>::value_type, T>,              \
                "kiln::" OP ": " ARG " must be a view of " #T " elements (wrong dtype)")

/// Output views must be writable.
#define KILN_REQUIRE_WRITABLE(X, OP, ARG)                                        \
  static_assert(!std::is_const_v<typename std::remove_cvref_t<X>::element_type>, \
                "kiln::" OP ": " ARG " is an output and must be a writable (non-const) view")

namespace kiln::detail {

template <class X>
std::string shape_str(const X& t) {
  std::ostringstream os;
  os << dtype_name<typename X::value_type> << '(';
  for (std::size_t r = 0; r < X::rank(); ++r) os << (r ? ", " : "") << t.extent(r);
  os << ')';
  if (!t.is_contiguous()) {
    os << " strides (";
    for (std::size_t r = 0; r < X::rank(); ++r) os << (r ? ", " : "") << t.stride(r);
    os << ')';
  }
  return os.str();
}

/// A view seen as `rows` rows of `n` contiguous elements, `stride` elements apart.
template <class T>
struct Rows {
  T* data;
  std::size_t rows;
  std::size_t n;
  std::ptrdiff_t stride;
};

/// Flattens all but the last dimension. The last dimension must be contiguous (stride 1) and the
/// leading ones must merge (stride[r] == stride[r+1] * extent[r+1]); otherwise a ShapeError names the
/// op and the argument.
template <class X>
auto as_rows(const X& t, const char* op, const char* arg) {
  using T = typename X::element_type;
  constexpr std::size_t R = X::rank();
  const std::size_t n = t.extent(R - 1);
  if (n > 1 && t.stride(R - 1) != 1)
    fail<ShapeError>("kiln::", op, ": ", arg, " ", shape_str(t), " must be contiguous in its last dimension");
  if constexpr (R == 1) {
    return Rows<T>{t.data(), 1, n, static_cast<std::ptrdiff_t>(n)};
  } else {
    std::size_t rows = 1;
    for (std::size_t r = 0; r + 1 < R; ++r) rows *= t.extent(r);
    for (std::size_t r = 0; r + 2 < R; ++r)
      if (t.extent(r) > 1 && t.stride(r) != t.stride(r + 1) * static_cast<std::ptrdiff_t>(t.extent(r + 1)))
        fail<ShapeError>("kiln::", op, ": ", arg, " ", shape_str(t),
                         " has leading dimensions that do not merge into rows");
    return Rows<T>{t.data(), rows, n, t.stride(R - 2)};
  }
}

/// [lowest, one past highest) byte a view can touch.
template <class X>
std::pair<const std::byte*, const std::byte*> byte_span(const X& t) {
  const auto* p = reinterpret_cast<const std::byte*>(t.data());
  std::ptrdiff_t lo = 0, hi = 0;
  for (std::size_t r = 0; r < X::rank(); ++r) {
    if (t.extent(r) == 0) return {p, p};
    const std::ptrdiff_t span = t.stride(r) * static_cast<std::ptrdiff_t>(t.extent(r) - 1);
    (span < 0 ? lo : hi) += span;
  }
  constexpr auto sz = static_cast<std::ptrdiff_t>(sizeof(typename X::value_type));
  return {p + lo * sz, p + (hi + 1) * sz};
}

/// Whether two non-empty views share any byte (an output that must not alias an input).
template <class X, class Y>
bool overlaps(const X& x, const Y& y) {
  const auto [x0, x1] = byte_span(x);
  const auto [y0, y1] = byte_span(y);
  return x0 < y1 && y0 < x1 && x0 != x1 && y0 != y1;
}

template <class A, class B>
void require_same_shape(const A& a, const B& b, const char* op, const char* an, const char* bn) {
  bool same = A::rank() == B::rank();
  for (std::size_t r = 0; same && r < A::rank(); ++r) same = a.extent(r) == b.extent(r);
  if (!same)
    fail<ShapeError>("kiln::", op, ": ", an, " ", shape_str(a), " and ", bn, " ", shape_str(b),
                     " must have the same shape");
}

}  // namespace kiln::detail
