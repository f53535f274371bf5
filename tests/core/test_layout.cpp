// kiln/core/layout.hpp: property tests over random shapes of rank 1..4. Every offset is checked
// against the definition offset = sum(idx[r] * stride[r]) with strides computed here independently.
#include <algorithm>
#include <array>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

#include "test_util.hpp"

using namespace kiln;

namespace {

/// Calls f(idx) for every multi-index of the given extents, last index fastest.
template <std::size_t R, class F>
void for_each_index(const std::array<std::size_t, R>& ext, F&& f) {
  for (std::size_t e : ext)
    if (e == 0) return;
  std::array<std::size_t, R> idx{};
  for (;;) {
    f(idx);
    std::size_t r = R;
    while (r-- > 0) {
      if (++idx[r] < ext[r]) break;
      idx[r] = 0;
      if (r == 0) return;
    }
  }
}

template <class M, std::size_t R>
std::ptrdiff_t apply_mapping(const M& m, const std::array<std::size_t, R>& idx) {
  return std::apply([&](auto... i) { return m(i...); }, idx);
}

/// Row-major strides from the definition: stride[r] = product of extents right of r.
template <std::size_t R>
std::array<std::ptrdiff_t, R> row_major_strides(const std::array<std::size_t, R>& ext) {
  std::array<std::ptrdiff_t, R> s{};
  std::ptrdiff_t p = 1;
  for (std::size_t r = R; r-- > 0;) {
    s[r] = p;
    p *= std::ptrdiff_t(ext[r]);
  }
  return s;
}

template <std::size_t R>
std::ptrdiff_t dot(const std::array<std::size_t, R>& idx, const std::array<std::ptrdiff_t, R>& s) {
  std::ptrdiff_t o = 0;
  for (std::size_t r = 0; r < R; ++r) o += std::ptrdiff_t(idx[r]) * s[r];
  return o;
}

template <std::size_t R>
void layout_right_properties(std::mt19937& rng) {
  std::uniform_int_distribution<std::size_t> dim(1, 6);
  for (int trial = 0; trial < 200; ++trial) {
    std::array<std::size_t, R> ext{};
    for (auto& e : ext) e = dim(rng);
    CAPTURE(trial);
    const layout_right::mapping<dextents<R>> m{dextents<R>(ext)};
    const auto want_strides = row_major_strides(ext);
    const std::size_t size = std::accumulate(ext.begin(), ext.end(), std::size_t(1), std::multiplies<>());
    for (std::size_t r = 0; r < R; ++r) {
      CHECK(m.extent(r) == ext[r]);
      CHECK(m.stride(r) == want_strides[r]);
    }
    CHECK(m.is_contiguous());
    CHECK(m.required_span_size() == size);
    CHECK(m.extents().size() == size);
    // Offsets: the definition, and row-major order visits 0, 1, 2, ... (a bijection onto [0, size)).
    std::ptrdiff_t expect_next = 0;
    bool ok = true;
    for_each_index<R>(ext, [&](const auto& idx) {
      const std::ptrdiff_t o = apply_mapping(m, idx);
      ok = ok && o == dot(idx, want_strides) && o == expect_next++;
    });
    CHECK(ok);
    CHECK(expect_next == std::ptrdiff_t(size));
  }
}

template <std::size_t R>
void layout_stride_properties(std::mt19937& rng) {
  std::uniform_int_distribution<std::size_t> dim(1, 5), pad(0, 3);
  for (int trial = 0; trial < 200; ++trial) {
    CAPTURE(trial);
    std::array<std::size_t, R> ext{};
    for (auto& e : ext) e = dim(rng);
    // Strides of a padded row-major layout, then permuted: covers transposes and padded rows.
    std::array<std::ptrdiff_t, R> s{};
    std::array<std::size_t, R> order{};
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::ptrdiff_t p = 1;
    const bool padded = trial % 3 == 0;
    for (std::size_t k = R; k-- > 0;) {
      s[order[k]] = p;
      p *= std::ptrdiff_t(ext[order[k]] + (padded ? pad(rng) : 0));
    }
    if (trial % 7 == 0) s[trial % R] = 0;  // a broadcast dimension
    const layout_stride::mapping<dextents<R>> m{dextents<R>(ext), s};
    std::ptrdiff_t max_off = 0;
    bool ok = true;
    for_each_index<R>(ext, [&](const auto& idx) {
      const std::ptrdiff_t o = apply_mapping(m, idx);
      ok = ok && o == dot(idx, s);
      max_off = std::max(max_off, o);
    });
    CHECK(ok);
    CHECK(m.required_span_size() == std::size_t(max_off) + 1);
    // Contiguous exactly when every non-unit dimension has its row-major stride.
    const auto rm = row_major_strides(ext);
    bool contiguous = true;
    for (std::size_t r = 0; r < R; ++r) contiguous = contiguous && (ext[r] == 1 || s[r] == rm[r]);
    CHECK(m.is_contiguous() == contiguous);
    for (std::size_t r = 0; r < R; ++r) CHECK(m.stride(r) == s[r]);
  }
}

}  // namespace

TEST_CASE("layout_right: strides, offsets, span and contiguity on random shapes of rank 1..4") {
  std::mt19937 rng(1);
  layout_right_properties<1>(rng);
  layout_right_properties<2>(rng);
  layout_right_properties<3>(rng);
  layout_right_properties<4>(rng);
}

TEST_CASE("layout_stride: offsets = dot(idx, strides), span and contiguity on random shapes of rank 1..4") {
  std::mt19937 rng(2);
  layout_stride_properties<1>(rng);
  layout_stride_properties<2>(rng);
  layout_stride_properties<3>(rng);
  layout_stride_properties<4>(rng);
}

TEST_CASE("layout_stride from a layout_right mapping keeps extents, strides and offsets") {
  const layout_right::mapping<dextents<3>> r{dextents<3>(2, 3, 4)};
  const layout_stride::mapping<dextents<3>> s{r};
  CHECK(s.is_contiguous());
  for_each_index<3>({2, 3, 4}, [&](const auto& idx) { CHECK(apply_mapping(s, idx) == apply_mapping(r, idx)); });
  CHECK(s.required_span_size() == r.required_span_size());
}

TEST_CASE("empty extents have span 0 and a negative stride is rejected") {
  const layout_stride::mapping<dextents<2>> m{dextents<2>(0, 5), {5, 1}};
  CHECK(m.required_span_size() == 0);
  const layout_right::mapping<dextents<2>> r{dextents<2>(3, 0)};
  CHECK(r.required_span_size() == 0);
  CHECK_THROWS_WITH_AS((layout_stride::mapping<dextents<2>>{dextents<2>(2, 2), {-1, 1}}),
                       doctest::Contains("negative stride"), ShapeError);
}

TEST_CASE("static extents: compile-time strides, no storage, checked construction") {
  using E = extents<2, 3, 4>;
  static_assert(E::rank() == 3 && E::rank_dynamic() == 0, "all static");
  static_assert(layout_right::mapping<E>().stride(0) == 12 && layout_right::mapping<E>().stride(1) == 4 &&
                    layout_right::mapping<E>().stride(2) == 1,
                "static row-major strides are constants");
  static_assert(layout_right::mapping<E>()(1, 2, 3) == 23, "offsets of static mappings are constants");
  static_assert(sizeof(E) == 1, "fully static extents store nothing (size of an empty class)");
  static_assert(sizeof(extents<dynamic_extent, 4, dynamic_extent>) == 2 * sizeof(std::size_t),
                "only dynamic extents are stored");
  static_assert(sizeof(layout_right::mapping<extents<4, 8>>) == 1, "static layout_right mapping is empty");

  // Mixed static/dynamic agrees with all-dynamic.
  const layout_right::mapping<extents<dynamic_extent, 5, dynamic_extent>> mixed{
      extents<dynamic_extent, 5, dynamic_extent>(3, 2)};
  const layout_right::mapping<dextents<3>> dyn{dextents<3>(3, 5, 2)};
  CHECK(mixed.extent(0) == 3);
  CHECK(mixed.extent(1) == 5);
  CHECK(mixed.extent(2) == 2);
  for_each_index<3>({3, 5, 2}, [&](const auto& idx) { CHECK(apply_mapping(mixed, idx) == apply_mapping(dyn, idx)); });

  // Constructing from all extents checks the static ones.
  CHECK(extents<dynamic_extent, 5>(std::size_t(7), std::size_t(5)).extent(0) == 7);
  CHECK_THROWS_WITH_AS((extents<dynamic_extent, 5>(std::size_t(7), std::size_t(6))),
                       doctest::Contains("dimension 1 is static 5 but 6 was given"), ShapeError);
  CHECK(extents<3, dynamic_extent>(4) == dextents<2>(3, 4));
  CHECK_FALSE(extents<3, dynamic_extent>(4) == dextents<2>(3, 5));
  CHECK_FALSE(extents<3, dynamic_extent>(4) == dextents<3>(3, 4, 1));
}
