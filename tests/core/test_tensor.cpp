// kiln/core/tensor.hpp: views are zero-copy (every element of a derived view is the same address as
// the element it names in the original), layouts are chosen at compile time, and static extents are free.
#include <numeric>
#include <type_traits>
#include <vector>

#include "test_util.hpp"

using namespace kiln;

namespace {
std::vector<float> iota_floats(std::size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.f);
  return v;
}
}  // namespace

// Static extents cost nothing: the view is one pointer.
static_assert(sizeof(Tensor<float, layout_right::mapping<extents<4, 8>>>) == sizeof(float*),
              "a fully static row-major view must be a bare pointer");
static_assert(sizeof(DenseTensor<float, 2>) == sizeof(float*) + 2 * sizeof(std::size_t),
              "a dynamic row-major view stores its extents only");
static_assert(sizeof(Tensor<float, layout_right::mapping<extents<dynamic_extent, 64>>>) ==
                  sizeof(float*) + sizeof(std::size_t),
              "only dynamic extents are stored");
static_assert(std::is_trivially_copyable_v<DenseTensor<float, 3>>, "views are trivially copyable");

// Conversions that lose nothing are implicit; the others do not exist.
static_assert(std::is_convertible_v<DenseTensor<float, 2>, DenseTensor<const float, 2>>, "T -> const T");
static_assert(!std::is_convertible_v<DenseTensor<const float, 2>, DenseTensor<float, 2>>, "const T -/-> T");
static_assert(std::is_convertible_v<DenseTensor<float, 2>, StridedTensor<float, 2>>, "layout_right -> layout_stride");
static_assert(std::is_convertible_v<DenseTensor<float, 2>, StridedTensor<const float, 2>>, "both at once");
static_assert(!std::is_convertible_v<StridedTensor<float, 2>, DenseTensor<float, 2>>,
              "layout_stride -/-> layout_right");
static_assert(!std::is_convertible_v<DenseTensor<float, 2>, DenseTensor<float, 3>>, "rank must match");
static_assert(!std::is_convertible_v<DenseTensor<float, 2>, DenseTensor<bf16, 2>>, "dtype must match");
static_assert(std::is_convertible_v<Tensor<float, layout_right::mapping<extents<4, 8>>>, DenseTensor<float, 2>>,
              "static -> dynamic extents");

TEST_CASE("make_tensor: row-major views with dynamic and static extents") {
  auto buf = iota_floats(24);
  auto t = make_tensor(buf.data(), 2, 3, 4);  // (2, 3, 4)
  static_assert(std::is_same_v<decltype(t), DenseTensor<float, 3>>, "make_tensor gives a DenseTensor");
  CHECK(t.rank() == 3);
  CHECK(t.size() == 24);
  CHECK(t.shape() == std::array<std::size_t, 3>{2, 3, 4});
  CHECK(t.stride(0) == 12);
  CHECK(t.stride(1) == 4);
  CHECK(t.stride(2) == 1);
  CHECK(t(1, 2, 3) == 23.f);
  CHECK(&t(1, 0, 2) == buf.data() + 14);

  auto s = make_tensor<4, 6>(buf.data());  // (4, 6), all static
  static_assert(std::is_same_v<decltype(s), Tensor<float, layout_right::mapping<extents<4, 6>>>>, "static view");
  CHECK(s(3, 5) == 23.f);
  auto m = make_tensor<dynamic_extent, 8>(buf.data(), 3);  // (3, 8)
  CHECK(m.extent(0) == 3);
  CHECK(m.extent(1) == 8);
  CHECK(m(2, 7) == 23.f);
  CHECK(make_tensor(buf.data(), 0, 5).empty());
}

TEST_CASE("reshape is zero-copy and checks element counts") {
  auto buf = iota_floats(24);
  auto t = make_tensor(buf.data(), 2, 3, 4);
  auto r = reshape(t, 6, 4);
  static_assert(std::is_same_v<decltype(r), DenseTensor<float, 2>>, "dynamic reshape");
  CHECK(r.data() == t.data());
  for (std::size_t i = 0; i < 6; ++i)
    for (std::size_t j = 0; j < 4; ++j) CHECK(&r(i, j) == &t(i / 3, i % 3, j));
  auto f = reshape(t, 24);
  CHECK(&f(17) == &t(1, 1, 1));
  auto st = reshape<4, 6>(t);  // static target
  static_assert(std::is_same_v<decltype(st), Tensor<float, layout_right::mapping<extents<4, 6>>>>, "static reshape");
  CHECK(&st(3, 5) == &t(1, 2, 3));
  auto mixed = reshape<dynamic_extent, 12>(t, 2);
  CHECK(&mixed(1, 11) == &t(1, 2, 3));
  CHECK_THROWS_WITH_AS(reshape(t, 5, 5), doctest::Contains("cannot view 24 elements as 25"), ShapeError);
  CHECK_THROWS_AS((reshape<5, 5>(t)), ShapeError);  // dynamic source: checked at run time
}

TEST_CASE("reshape of a non-contiguous view throws a clear error, a contiguous strided view reshapes") {
  auto buf = iota_floats(24);
  auto t = make_tensor(buf.data(), 4, 6);
  CHECK_THROWS_WITH_AS(reshape(transpose(t), 24), doctest::Contains("not contiguous"), ShapeError);
  CHECK_THROWS_WITH_AS(reshape(slice<1>(t, 0, 3), 12), doctest::Contains("not contiguous (copy it first)"), ShapeError);
  CHECK_THROWS_AS(reshape<12>(slice<1>(t, 0, 3)), ShapeError);
  // A strided view whose strides happen to be row-major (slice<1> over the full range) is contiguous.
  auto full = slice<1>(t, 0, 6);
  CHECK(full.is_contiguous());
  CHECK(reshape(full, 24).data() == t.data());
}

TEST_CASE("slice: zero-copy, slicing dim 0 keeps layout_right, other dims give layout_stride") {
  auto buf = iota_floats(2 * 5 * 3);
  auto t = make_tensor(buf.data(), 2, 5, 3);  // (2, 5, 3)
  auto s0 = slice<0>(t, 1, 2);
  auto s1 = slice<1>(t, 1, 4);
  auto s2 = slice<2>(t, 2, 3);
  static_assert(std::is_same_v<decltype(s0)::layout_type, layout_right>, "slice<0> of row-major is row-major");
  static_assert(std::is_same_v<decltype(s1)::layout_type, layout_stride>, "slice<1> is strided");
  static_assert(std::is_same_v<decltype(s2)::layout_type, layout_stride>, "slice<2> is strided");
  CHECK(s0.shape() == std::array<std::size_t, 3>{1, 5, 3});
  CHECK(s1.shape() == std::array<std::size_t, 3>{2, 3, 3});
  CHECK(s2.shape() == std::array<std::size_t, 3>{2, 5, 1});
  CHECK_FALSE(s1.is_contiguous());
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 5; ++j)
      for (std::size_t k = 0; k < 3; ++k) {
        if (i == 1) CHECK(&s0(0, j, k) == &t(1, j, k));
        if (j >= 1 && j < 4) CHECK(&s1(i, j - 1, k) == &t(i, j, k));
        if (k == 2) CHECK(&s2(i, j, 0) == &t(i, j, 2));
      }
  CHECK(slice<1>(t, 2, 2).empty());
  CHECK_THROWS_WITH_AS(slice<1>(t, 3, 6), doctest::Contains("out of bounds for dimension 1 of extent 5"), ShapeError);
  CHECK_THROWS_AS(slice<0>(t, 2, 1), ShapeError);

  // On static extents the sliced dimension becomes dynamic and the others stay static.
  auto st = make_tensor<4, 8>(buf.data());
  auto ss = slice<0>(st, 1, 3);
  static_assert(std::is_same_v<decltype(ss), Tensor<float, layout_right::mapping<extents<dynamic_extent, 8>>>>,
                "slice<0> of a static view");
  CHECK(&ss(1, 7) == &st(2, 7));
}

TEST_CASE("select, row, transpose and permute are zero-copy") {
  auto buf = iota_floats(2 * 3 * 4);
  auto t = make_tensor(buf.data(), 2, 3, 4);  // (2, 3, 4)

  auto r = row(t, 1);  // (3, 4)
  static_assert(std::is_same_v<decltype(r), DenseTensor<float, 2>>, "row of row-major is row-major");
  auto s1 = select<1>(t, 2);  // (2, 4)
  static_assert(std::is_same_v<decltype(s1)::layout_type, layout_stride>, "select<1> is strided");
  auto s2 = select<2>(t, 3);     // (2, 3)
  auto p = permute<2, 0, 1>(t);  // (4, 2, 3)
  CHECK(p.shape() == std::array<std::size_t, 3>{4, 2, 3});
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j)
      for (std::size_t k = 0; k < 4; ++k) {
        if (i == 1) CHECK(&r(j, k) == &t(1, j, k));
        if (j == 2) CHECK(&s1(i, k) == &t(i, 2, k));
        if (k == 3) CHECK(&s2(i, j) == &t(i, j, 3));
        CHECK(&p(k, i, j) == &t(i, j, k));
      }
  CHECK_THROWS_WITH_AS(select<2>(t, 4), doctest::Contains("index 4 out of bounds for dimension 2"), ShapeError);

  auto m = make_tensor(buf.data(), 4, 6);
  auto mt = transpose(m);  // (6, 4)
  CHECK(mt.shape() == std::array<std::size_t, 2>{6, 4});
  CHECK(mt.stride(0) == 1);
  CHECK(mt.stride(1) == 6);
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j < 6; ++j) CHECK(&mt(j, i) == &m(i, j));
  auto back = transpose(mt);
  CHECK(back.is_contiguous());
  CHECK(&back(3, 5) == &m(3, 5));

  // Static extents follow the permutation.
  auto st = make_tensor<2, 3, 4>(buf.data());
  auto sp = permute<2, 0, 1>(st);
  static_assert(std::is_same_v<decltype(sp)::extents_type, extents<4, 2, 3>>, "static extents are permuted");
  CHECK(&sp(3, 1, 2) == &st(1, 2, 3));
  auto sr = row(st, 1);
  static_assert(std::is_same_v<decltype(sr), Tensor<float, layout_right::mapping<extents<3, 4>>>>, "static row");
  CHECK(&sr(2, 3) == &st(1, 2, 3));
}

TEST_CASE("views convert to const and to layout_stride without copying") {
  auto buf = iota_floats(12);
  auto t = make_tensor(buf.data(), 3, 4);
  DenseTensor<const float, 2> c = t;
  StridedTensor<float, 2> s = t;
  StridedTensor<const float, 2> cs = t;
  CHECK(c.data() == t.data());
  CHECK(s.data() == t.data());
  CHECK(cs.data() == t.data());
  CHECK(s.stride(0) == 4);
  CHECK(s.stride(1) == 1);
  CHECK(s.is_contiguous());
  CHECK(&cs(2, 3) == &t(2, 3));
  auto ac = as_const(t);
  static_assert(std::is_same_v<decltype(ac), DenseTensor<const float, 2>>, "as_const");
  static_assert(std::is_same_v<std::remove_reference_t<decltype(ac(0, 0))>, const float>, "read-only elements");
  auto st = make_tensor<3, 4>(buf.data());
  DenseTensor<float, 2> d = st;
  CHECK(d.extent(0) == 3);
  CHECK(d.extent(1) == 4);
  CHECK(&d(2, 1) == &st(2, 1));
}

TEST_CASE("make_strided: explicit strides, element addresses follow them") {
  std::vector<float> buf(40);
  auto v = make_strided(buf.data(), std::array<std::size_t, 2>{3, 4}, std::array<std::ptrdiff_t, 2>{10, 2});
  CHECK_FALSE(v.is_contiguous());
  CHECK(v.mapping().required_span_size() == 2 * 10 + 3 * 2 + 1);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 4; ++j) CHECK(&v(i, j) == buf.data() + 10 * i + 2 * j);
}

TEST_CASE("shape_str names dtype, extents and non-contiguous strides") {
  std::vector<bf16> buf(12);
  auto t = make_tensor(buf.data(), 3, 4);
  CHECK(detail::shape_str(t) == "bf16(3, 4)");
  CHECK(detail::shape_str(transpose(t)) == "bf16(4, 3) strides (1, 4)");
}
