// kiln/core/layout.hpp - extents (static or dynamic per dimension) and the two layouts kiln uses.
//
// Names follow std::mdspan: extents<Ext...> with dynamic_extent, layout_right (row-major, contiguous)
// and layout_stride (arbitrary strides). A layout_right mapping over static extents stores nothing and
// computes its strides at compile time; dynamic extents cost one size_t each.
#pragma once

#include <array>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <utility>

#include "kiln/core/error.hpp"

namespace kiln {

inline constexpr std::size_t dynamic_extent = std::numeric_limits<std::size_t>::max();
inline constexpr std::size_t max_rank = 4;

namespace detail {
/// Stands in for the dynamic-extent array when there are none: an empty class, so a fully static view
/// is a bare pointer (std::array<T, 0> is not empty). Its operator[] is never reached at run time.
struct no_dynamic_extents {
  struct sink {
    constexpr void operator=(std::size_t) const {}
    constexpr operator std::size_t() const { return 0; }
  };
  constexpr sink operator[](std::size_t) const { return {}; }
};
}  // namespace detail

/// Extents of a view: each dimension either a compile-time constant or dynamic_extent (stored).
template <std::size_t... Exts>
class extents {
 public:
  static constexpr std::size_t rank_v = sizeof...(Exts);
  static_assert(rank_v >= 1 && rank_v <= max_rank, "kiln::extents: rank must be between 1 and 4");
  static constexpr std::array<std::size_t, rank_v> static_exts{Exts...};
  static constexpr std::size_t rank_dynamic_v = ((Exts == dynamic_extent) + ... + 0);

  static constexpr std::size_t rank() { return rank_v; }
  static constexpr std::size_t rank_dynamic() { return rank_dynamic_v; }
  static constexpr std::size_t static_extent(std::size_t r) { return static_exts[r]; }
  static constexpr bool is_static(std::size_t r) { return static_exts[r] != dynamic_extent; }

  constexpr extents() requires(rank_dynamic_v == 0) = default;

  /// Either the dynamic extents only, or all extents (static ones are checked).
  template <class... I>
  requires((std::is_convertible_v<I, std::size_t> && ...) &&
           (sizeof...(I) == rank_dynamic_v || sizeof...(I) == rank_v) &&
           (sizeof...(I) > 0 || rank_dynamic_v == 0)) constexpr explicit extents(I... sizes) {
    const std::array<std::size_t, sizeof...(I)> s{static_cast<std::size_t>(sizes)...};
    init(s);
  }

  template <std::size_t N>
  requires(N == rank_v ||
           (N == rank_dynamic_v && N != rank_v)) constexpr explicit extents(const std::array<std::size_t, N>& s) {
    init(s);
  }

  constexpr std::size_t extent(std::size_t r) const {
    if (static_exts[r] != dynamic_extent) return static_exts[r];
    return dyn_[dyn_index(r)];
  }

  constexpr std::size_t size() const {
    std::size_t n = 1;
    for (std::size_t r = 0; r < rank_v; ++r) n *= extent(r);
    return n;
  }

  constexpr std::array<std::size_t, rank_v> to_array() const {
    std::array<std::size_t, rank_v> a{};
    for (std::size_t r = 0; r < rank_v; ++r) a[r] = extent(r);
    return a;
  }

  template <std::size_t... O>
  friend constexpr bool operator==(const extents& a, const extents<O...>& b) {
    if constexpr (sizeof...(O) != rank_v) return false;
    else {
      for (std::size_t r = 0; r < rank_v; ++r)
        if (a.extent(r) != b.extent(r)) return false;
      return true;
    }
  }

 private:
  static constexpr std::size_t dyn_index(std::size_t r) {
    std::size_t i = 0;
    for (std::size_t k = 0; k < r; ++k) i += (static_exts[k] == dynamic_extent);
    return i;
  }

  template <std::size_t N>
  constexpr void init(const std::array<std::size_t, N>& s) {
    if constexpr (N == rank_v) {
      for (std::size_t r = 0; r < rank_v; ++r) {
        if (static_exts[r] == dynamic_extent) dyn_[dyn_index(r)] = s[r];
        else if (s[r] != static_exts[r])
          fail<ShapeError>("kiln::extents: dimension ", r, " is static ", static_exts[r], " but ", s[r], " was given");
      }
    } else {
      for (std::size_t i = 0; i < N; ++i) dyn_[i] = s[i];
    }
  }

  [[no_unique_address]] std::conditional_t<rank_dynamic_v == 0, detail::no_dynamic_extents,
                                           std::array<std::size_t, rank_dynamic_v>>
      dyn_{};
};

/// dextents<R>: all-dynamic extents of rank R (std::dextents).
namespace detail {
template <std::size_t R, std::size_t... E>
struct make_dextents : make_dextents<R - 1, dynamic_extent, E...> {};
template <std::size_t... E>
struct make_dextents<0, E...> {
  using type = extents<E...>;
};
}  // namespace detail
template <std::size_t R>
using dextents = typename detail::make_dextents<R>::type;

template <class E>
struct is_extents : std::false_type {};
template <std::size_t... X>
struct is_extents<extents<X...>> : std::true_type {};

/// Row-major, contiguous: stride(r) = product of extents right of r. Strides of static trailing
/// dimensions are compile-time constants.
struct layout_right {
  template <class Extents>
  class mapping {
   public:
    using extents_type = Extents;
    using layout_type = layout_right;
    static constexpr std::size_t rank_v = Extents::rank();
    static constexpr bool always_contiguous = true;

    constexpr mapping() requires(Extents::rank_dynamic() == 0) = default;
    constexpr explicit mapping(const Extents& e) : ext_(e) {}

    constexpr const Extents& extents() const { return ext_; }
    constexpr std::size_t extent(std::size_t r) const { return ext_.extent(r); }
    constexpr std::ptrdiff_t stride(std::size_t r) const {
      std::size_t s = 1;
      for (std::size_t k = r + 1; k < rank_v; ++k) s *= ext_.extent(k);
      return static_cast<std::ptrdiff_t>(s);
    }
    constexpr bool is_contiguous() const { return true; }
    constexpr std::size_t required_span_size() const { return ext_.size(); }

    template <class... I>
    constexpr std::ptrdiff_t operator()(I... idx) const {
      static_assert(sizeof...(I) == rank_v, "kiln::layout_right: wrong number of indices");
      const std::array<std::size_t, rank_v> ix{static_cast<std::size_t>(idx)...};
      std::size_t off = 0;
      for (std::size_t r = 0; r < rank_v; ++r) off = off * ext_.extent(r) + ix[r];
      return static_cast<std::ptrdiff_t>(off);
    }

   private:
    [[no_unique_address]] Extents ext_{};
  };
};

/// Arbitrary strides (in elements; may be zero for broadcasts, never negative).
struct layout_stride {
  template <class Extents>
  class mapping {
   public:
    using extents_type = Extents;
    using layout_type = layout_stride;
    static constexpr std::size_t rank_v = Extents::rank();
    static constexpr bool always_contiguous = false;

    constexpr mapping() = default;
    constexpr mapping(const Extents& e, const std::array<std::ptrdiff_t, rank_v>& s) : ext_(e), str_(s) {
      for (std::size_t r = 0; r < rank_v; ++r)
        if (s[r] < 0) fail<ShapeError>("kiln::layout_stride: negative stride ", s[r], " in dimension ", r);
    }
    template <class M>
    requires(M::rank_v == rank_v) constexpr explicit mapping(const M& other) : ext_(other.extents().to_array()) {
      for (std::size_t r = 0; r < rank_v; ++r) str_[r] = other.stride(r);
    }

    constexpr const Extents& extents() const { return ext_; }
    constexpr std::size_t extent(std::size_t r) const { return ext_.extent(r); }
    constexpr std::ptrdiff_t stride(std::size_t r) const { return str_[r]; }
    constexpr const std::array<std::ptrdiff_t, rank_v>& strides() const { return str_; }

    /// True when the strides are exactly those of layout_right over the same extents.
    constexpr bool is_contiguous() const {
      std::ptrdiff_t s = 1;
      for (std::size_t r = rank_v; r-- > 0;) {
        if (ext_.extent(r) != 1 && str_[r] != s) return false;
        s *= static_cast<std::ptrdiff_t>(ext_.extent(r));
      }
      return true;
    }
    constexpr std::size_t required_span_size() const {
      std::size_t span = 1;
      for (std::size_t r = 0; r < rank_v; ++r) {
        if (ext_.extent(r) == 0) return 0;
        span += (ext_.extent(r) - 1) * static_cast<std::size_t>(str_[r]);
      }
      return span;
    }

    template <class... I>
    constexpr std::ptrdiff_t operator()(I... idx) const {
      static_assert(sizeof...(I) == rank_v, "kiln::layout_stride: wrong number of indices");
      const std::array<std::size_t, rank_v> ix{static_cast<std::size_t>(idx)...};
      std::ptrdiff_t off = 0;
      for (std::size_t r = 0; r < rank_v; ++r) off += static_cast<std::ptrdiff_t>(ix[r]) * str_[r];
      return off;
    }

   private:
    [[no_unique_address]] Extents ext_{};
    std::array<std::ptrdiff_t, rank_v> str_{};
  };
};

}  // namespace kiln
