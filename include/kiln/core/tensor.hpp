// kiln/core/tensor.hpp - Tensor<DType, Layout>: a non-owning, typed view over memory.
//
// Layout is an mdspan-style mapping (layout_right::mapping<extents<...>> or
// layout_stride::mapping<...>). Views never own or allocate; owning storage is kiln::Buffer and the
// activation arena is kiln::Arena (core/storage.hpp). view/reshape, slice, select, transpose and permute
// are zero-copy: they return a new view of the same bytes, and pick the result's layout at compile time
// (submdspan's rule: slicing the leading dimension of a row-major view keeps it row-major).
#pragma once

#include <array>
#include <cstddef>
#include <type_traits>

#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/layout.hpp"

#if !defined(KILN_BOUNDS_CHECK)
#if defined(NDEBUG)
#define KILN_BOUNDS_CHECK 0
#else
#define KILN_BOUNDS_CHECK 1
#endif
#endif

namespace kiln {

template <class T, class Layout>
class Tensor;

template <class X>
struct is_tensor : std::false_type {};
template <class T, class L>
struct is_tensor<Tensor<T, L>> : std::true_type {};
template <class X>
concept TensorLike = is_tensor<std::remove_cvref_t<X>>::value;

template <class T, class Layout>
class Tensor {
  static_assert(DType<T>, "kiln::Tensor: T must be a kiln dtype (float, f16, bf16, int8_t, int32_t or a block type)");

 public:
  using element_type = T;
  using value_type = std::remove_const_t<T>;
  using layout_mapping = Layout;
  using extents_type = typename Layout::extents_type;
  using layout_type = typename Layout::layout_type;
  static constexpr std::size_t rank_v = extents_type::rank();
  static constexpr bool always_contiguous = Layout::always_contiguous;

  constexpr Tensor() = default;
  constexpr Tensor(T* data, const Layout& m) : data_(data), map_(m) {}
  constexpr Tensor(T* data, const extents_type& e) requires std::is_same_v<layout_type, layout_right> : data_(data),
                                                                                                        map_(e) {}

  /// Implicit conversions that lose nothing: T -> const T, and any layout -> layout_stride.
  template <class U, class L2>
  requires(std::is_convertible_v<U (*)[], T (*)[]> &&
           (std::is_same_v<L2, Layout> || (std::is_same_v<layout_type, layout_stride> && L2::rank_v == rank_v) ||
            (std::is_same_v<layout_type, layout_right> && std::is_same_v<typename L2::layout_type, layout_right> &&
             L2::rank_v == rank_v))) constexpr Tensor(const Tensor<U, L2>& o)
      : data_(o.data()), map_(convert_mapping(o.mapping())) {}

  constexpr T* data() const { return data_; }
  constexpr const Layout& mapping() const { return map_; }
  constexpr const extents_type& extents() const { return map_.extents(); }
  static constexpr std::size_t rank() { return rank_v; }
  constexpr std::size_t extent(std::size_t r) const { return map_.extent(r); }
  constexpr std::ptrdiff_t stride(std::size_t r) const { return map_.stride(r); }
  constexpr std::size_t size() const { return map_.extents().size(); }
  constexpr bool empty() const { return size() == 0; }
  constexpr bool is_contiguous() const {
    if constexpr (always_contiguous) return true;
    else return map_.is_contiguous();
  }
  constexpr std::array<std::size_t, rank_v> shape() const { return extents().to_array(); }

  template <class... I>
  constexpr T& operator()(I... idx) const {
    static_assert(sizeof...(I) == rank_v, "kiln::Tensor::operator(): number of indices must equal the rank");
#if KILN_BOUNDS_CHECK
    const std::array<std::size_t, rank_v> ix{static_cast<std::size_t>(idx)...};
    for (std::size_t r = 0; r < rank_v; ++r)
      if (ix[r] >= extent(r))
        fail<ShapeError>("kiln::Tensor: index ", ix[r], " out of bounds for dimension ", r, " of extent ", extent(r));
#endif
    return data_[map_(idx...)];
  }

 private:
  template <class L2>
  static constexpr Layout convert_mapping(const L2& m) {
    if constexpr (std::is_same_v<L2, Layout>) return m;
    else if constexpr (std::is_same_v<layout_type, layout_stride>) return Layout(m);
    else return Layout(extents_type(m.extents().to_array()));
  }

  T* data_ = nullptr;
  [[no_unique_address]] Layout map_{};
};

/// Row-major views with all-dynamic extents: the everyday types.
template <class T, std::size_t R>
using DenseTensor = Tensor<T, layout_right::mapping<dextents<R>>>;
template <class T, std::size_t R>
using StridedTensor = Tensor<T, layout_stride::mapping<dextents<R>>>;

/// make_tensor(ptr, d0, d1, ...): a row-major view with dynamic extents.
template <class T, class... I>
requires(sizeof...(I) >= 1 &&
         (std::is_integral_v<I> && ...)) constexpr DenseTensor<T, sizeof...(I)> make_tensor(T* data, I... dims) {
  return DenseTensor<T, sizeof...(I)>(data, dextents<sizeof...(I)>(static_cast<std::size_t>(dims)...));
}

/// make_tensor<4096>(ptr) or make_tensor<dynamic_extent, 64>(ptr, rows): a row-major view with the
/// given static extents (the dynamic ones passed at run time).
template <std::size_t... E, class T, class... I>
requires(sizeof...(E) >= 1) constexpr Tensor<T, layout_right::mapping<extents<E...>>> make_tensor(T* data, I... dyn) {
  return {data, extents<E...>(static_cast<std::size_t>(dyn)...)};
}

/// A strided view from explicit extents and strides (in elements).
template <class T, std::size_t R>
constexpr StridedTensor<T, R> make_strided(T* data, const std::array<std::size_t, R>& ext,
                                           const std::array<std::ptrdiff_t, R>& strides) {
  return {data, layout_stride::mapping<dextents<R>>(dextents<R>(ext), strides)};
}

namespace detail {
template <std::size_t Skip, std::size_t... E, std::size_t... I>
constexpr auto drop_extent_type(std::index_sequence<I...>)
    -> extents<extents<E...>::static_extent(I < Skip ? I : I + 1)...>;
template <class Ext, std::size_t Skip>
struct drop_extent;
template <std::size_t... E, std::size_t Skip>
struct drop_extent<extents<E...>, Skip> {
  using type = decltype(drop_extent_type<Skip, E...>(std::make_index_sequence<sizeof...(E) - 1>{}));
};
template <class Ext, std::size_t Dim>
struct make_dynamic;
template <std::size_t... E, std::size_t Dim>
struct make_dynamic<extents<E...>, Dim> {
  template <std::size_t... I>
  static auto f(std::index_sequence<I...>) -> extents<(I == Dim ? dynamic_extent : extents<E...>::static_extent(I))...>;
  using type = decltype(f(std::make_index_sequence<sizeof...(E)>{}));
};
template <class Ext, std::size_t... P>
struct permute_extents;
template <std::size_t... E, std::size_t... P>
struct permute_extents<extents<E...>, P...> {
  using type = extents<extents<E...>::static_extent(P)...>;
};
template <std::size_t... Ext>
constexpr std::size_t static_product() {
  std::size_t p = 1;
  for (std::size_t e : {Ext...}) {
    if (e == dynamic_extent) return dynamic_extent;
    p *= e;
  }
  return p;
}
template <std::size_t... P>
constexpr bool is_permutation() {
  constexpr std::size_t n = sizeof...(P);
  std::array<bool, n> seen{};
  for (std::size_t p : {P...}) {
    if (p >= n || seen[p]) return false;
    seen[p] = true;
  }
  return true;
}
template <class Ext>
struct static_size;
template <std::size_t... E>
struct static_size<extents<E...>> {
  static constexpr std::size_t value = static_product<E...>();
};
}  // namespace detail

/// reshape(t, d0, d1, ...): the same elements under new dynamic extents. Zero-copy; requires a
/// contiguous view (compile-time for layout_right, else checked) and an equal element count.
template <class T, class L, class... I>
requires(sizeof...(I) >= 1 &&
         (std::is_integral_v<I> && ...)) DenseTensor<T, sizeof...(I)> reshape(const Tensor<T, L>& t, I... dims) {
  const dextents<sizeof...(I)> e(static_cast<std::size_t>(dims)...);
  if (!t.is_contiguous()) fail<ShapeError>("kiln::reshape: the view is not contiguous (copy it first)");
  if (e.size() != t.size()) fail<ShapeError>("kiln::reshape: cannot view ", t.size(), " elements as ", e.size());
  return {t.data(), e};
}

/// reshape<E...>(t, dyn...): the same with static extents; a reshape between fully static shapes of
/// different sizes does not compile.
template <std::size_t... E, class T, class L, class... I>
requires(sizeof...(E) >= 1) Tensor<T, layout_right::mapping<extents<E...>>> reshape(const Tensor<T, L>& t, I... dyn) {
  constexpr std::size_t from = detail::static_size<typename L::extents_type>::value;
  constexpr std::size_t to = detail::static_product<E...>();
  static_assert(from == dynamic_extent || to == dynamic_extent || from == to,
                "kiln::reshape: impossible reshape (static element counts differ)");
  const extents<E...> e(static_cast<std::size_t>(dyn)...);
  if (!t.is_contiguous()) fail<ShapeError>("kiln::reshape: the view is not contiguous (copy it first)");
  if (e.size() != t.size()) fail<ShapeError>("kiln::reshape: cannot view ", t.size(), " elements as ", e.size());
  return {t.data(), e};
}

/// slice<Dim>(t, begin, end): elements [begin, end) of dimension Dim. Row-major stays row-major when
/// Dim == 0; any other dimension gives a layout_stride view. Zero-copy.
template <std::size_t Dim, class T, class L>
auto slice(const Tensor<T, L>& t, std::size_t begin, std::size_t end) {
  using Ext = typename L::extents_type;
  static_assert(Dim < Ext::rank(), "kiln::slice: dimension out of range");
  if (begin > end || end > t.extent(Dim))
    fail<ShapeError>("kiln::slice: range [", begin, ", ", end, ") out of bounds for dimension ", Dim, " of extent ",
                     t.extent(Dim));
  using NewExt = typename detail::make_dynamic<Ext, Dim>::type;
  auto e = t.extents().to_array();
  e[Dim] = end - begin;
  T* p = t.data() + static_cast<std::ptrdiff_t>(begin) * t.stride(Dim);
  if constexpr (std::is_same_v<typename L::layout_type, layout_right> && Dim == 0) {
    return Tensor<T, layout_right::mapping<NewExt>>(p, NewExt(e));
  } else {
    std::array<std::ptrdiff_t, Ext::rank()> s{};
    for (std::size_t r = 0; r < Ext::rank(); ++r) s[r] = t.stride(r);
    return Tensor<T, layout_stride::mapping<NewExt>>(p, layout_stride::mapping<NewExt>(NewExt(e), s));
  }
}

/// select<Dim>(t, i): fixes dimension Dim at index i, dropping it (rank - 1). row(t, i) is select<0>.
template <std::size_t Dim, class T, class L>
auto select(const Tensor<T, L>& t, std::size_t i) {
  using Ext = typename L::extents_type;
  static_assert(Ext::rank() >= 2, "kiln::select: needs rank >= 2 (use operator() on a vector)");
  static_assert(Dim < Ext::rank(), "kiln::select: dimension out of range");
  if (i >= t.extent(Dim))
    fail<ShapeError>("kiln::select: index ", i, " out of bounds for dimension ", Dim, " of extent ", t.extent(Dim));
  using NewExt = typename detail::drop_extent<Ext, Dim>::type;
  std::array<std::size_t, Ext::rank() - 1> e{};
  std::array<std::ptrdiff_t, Ext::rank() - 1> s{};
  for (std::size_t r = 0, k = 0; r < Ext::rank(); ++r)
    if (r != Dim) {
      e[k] = t.extent(r);
      s[k] = t.stride(r);
      ++k;
    }
  T* p = t.data() + static_cast<std::ptrdiff_t>(i) * t.stride(Dim);
  if constexpr (std::is_same_v<typename L::layout_type, layout_right> && Dim == 0) {
    return Tensor<T, layout_right::mapping<NewExt>>(p, NewExt(e));
  } else {
    return Tensor<T, layout_stride::mapping<NewExt>>(p, layout_stride::mapping<NewExt>(NewExt(e), s));
  }
}

template <class T, class L>
auto row(const Tensor<T, L>& t, std::size_t i) {
  return select<0>(t, i);
}

/// permute<P...>(t): dimension r of the result is dimension P[r] of t. Zero-copy (strides permuted).
template <std::size_t... P, class T, class L>
auto permute(const Tensor<T, L>& t) {
  using Ext = typename L::extents_type;
  static_assert(sizeof...(P) == Ext::rank(), "kiln::permute: give one index per dimension");
  constexpr std::array<std::size_t, sizeof...(P)> perm{P...};
  static_assert(detail::is_permutation<P...>(), "kiln::permute: indices must be a permutation of 0..rank-1");
  using NewExt = typename detail::permute_extents<Ext, P...>::type;
  std::array<std::size_t, Ext::rank()> e{};
  std::array<std::ptrdiff_t, Ext::rank()> s{};
  for (std::size_t r = 0; r < Ext::rank(); ++r) {
    e[r] = t.extent(perm[r]);
    s[r] = t.stride(perm[r]);
  }
  return Tensor<T, layout_stride::mapping<NewExt>>(t.data(), layout_stride::mapping<NewExt>(NewExt(e), s));
}

/// transpose(t): swaps the two dimensions of a matrix. Zero-copy.
template <class T, class L>
auto transpose(const Tensor<T, L>& t) {
  static_assert(L::extents_type::rank() == 2, "kiln::transpose: needs a rank-2 view (use permute<...>)");
  return permute<1, 0>(t);
}

/// as_const(t): the same view, read-only.
template <class T, class L>
Tensor<const T, L> as_const(const Tensor<T, L>& t) {
  return t;
}

}  // namespace kiln
