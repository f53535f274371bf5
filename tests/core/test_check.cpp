// kiln/core/check.hpp and error.hpp: what op wrappers use to validate views (as_rows, require_same_shape)
// and the errors they throw.
#include <vector>

#include "test_util.hpp"

using namespace kiln;

TEST_CASE("fail, KILN_CHECK and KILN_CHECK_SHAPE throw the right type with the streamed message") {
  CHECK_THROWS_WITH_AS(fail("a ", 1, ' ', 2.5), "a 1 2.5", Error);
  CHECK_THROWS_WITH_AS(fail<FormatError>("bad ", "file"), "bad file", FormatError);
  CHECK_THROWS_AS(KILN_CHECK(1 + 1 == 3, "x=", 3), Error);
  CHECK_NOTHROW(KILN_CHECK(true, "never"));
  CHECK_THROWS_WITH_AS(KILN_CHECK_SHAPE(false, "dims ", 4), "dims 4", ShapeError);
  static_assert(std::is_base_of_v<Error, ShapeError> && std::is_base_of_v<Error, FormatError> &&
                    std::is_base_of_v<std::runtime_error, Error>,
                "every kiln error is a kiln::Error and a std::runtime_error");
}

TEST_CASE("as_rows merges leading dimensions of row-major and padded views") {
  std::vector<float> buf(2 * 3 * 8);
  auto t = make_tensor(buf.data(), 2, 3, 8);  // (2, 3, 8)
  auto r = detail::as_rows(t, "op", "x");
  CHECK(r.data == buf.data());
  CHECK(r.rows == 6);
  CHECK(r.n == 8);
  CHECK(r.stride == 8);
  // Rows padded to 8 but only 5 used: still rows, with stride 8.
  auto padded = slice<2>(t, 0, 5);  // (2, 3, 5) strides (24, 8, 1)
  auto pr = detail::as_rows(padded, "op", "x");
  CHECK(pr.rows == 6);
  CHECK(pr.n == 5);
  CHECK(pr.stride == 8);
  auto v = detail::as_rows(make_tensor(buf.data(), 7), "op", "x");  // a vector is one row
  CHECK(v.rows == 1);
  CHECK(v.n == 7);
}

TEST_CASE("as_rows rejects views it cannot see as rows, naming op, argument and shape") {
  std::vector<float> buf(2 * 3 * 8);
  auto t = make_tensor(buf.data(), 2, 3, 8);
  CHECK_THROWS_WITH_AS(
      detail::as_rows(permute<0, 2, 1>(t), "rms_norm", "x"),
      doctest::Contains("kiln::rms_norm: x f32(2, 8, 3) strides (24, 1, 8) must be contiguous in its last dimension"),
      ShapeError);
  // Dimension 1 sliced: rows of the two outer blocks are not evenly spaced.
  CHECK_THROWS_WITH_AS(detail::as_rows(slice<1>(t, 0, 2), "matmul", "a"), doctest::Contains("do not merge into rows"),
                       ShapeError);
}

TEST_CASE("require_same_shape compares rank and extents and names both views") {
  std::vector<float> a(12), b(12);
  CHECK_NOTHROW(detail::require_same_shape(make_tensor(a.data(), 3, 4), make_tensor(b.data(), 3, 4), "op", "x", "y"));
  CHECK_THROWS_WITH_AS(
      detail::require_same_shape(make_tensor(a.data(), 3, 4), make_tensor(b.data(), 4, 3), "add", "x", "out"),
      "kiln::add: x f32(3, 4) and out f32(4, 3) must have the same shape", ShapeError);
  CHECK_THROWS_AS(detail::require_same_shape(make_tensor(a.data(), 12), make_tensor(b.data(), 3, 4), "op", "x", "y"),
                  ShapeError);
}
