// Bounds-checked element access (on by default in builds without NDEBUG). The tests build Release with
// NDEBUG too, so this file turns the check on itself.
//
// Tensor::operator() is an inline template: if this file instantiated the same specialisation as another
// file built without the check, the linker would keep one of the two bodies at random. The indices below
// are therefore of a type with internal linkage (Ix), so these instantiations exist in this file only.
#define KILN_BOUNDS_CHECK 1

#include <vector>

#include "test_util.hpp"

using namespace kiln;

namespace {
struct Ix {
  std::size_t v;
  constexpr explicit operator std::size_t() const { return v; }
};
}  // namespace

TEST_CASE("bounds-checked access throws ShapeError naming index, dimension and extent") {
  std::vector<float> buf(12);
  auto t = make_tensor(buf.data(), 3, 4);
  CHECK(&t(Ix{2}, Ix{3}) == buf.data() + 11);
  CHECK_THROWS_WITH_AS(t(Ix{3}, Ix{0}), doctest::Contains("index 3 out of bounds for dimension 0 of extent 3"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(t(Ix{0}, Ix{4}), doctest::Contains("index 4 out of bounds for dimension 1 of extent 4"),
                       ShapeError);
  auto tr = transpose(t);  // (4, 3) strided
  CHECK(&tr(Ix{3}, Ix{2}) == buf.data() + 11);
  CHECK_THROWS_AS(tr(Ix{0}, Ix{3}), ShapeError);
  auto s = make_tensor<2, 6>(buf.data());  // static extents are checked too
  CHECK_THROWS_AS(s(Ix{2}, Ix{0}), ShapeError);
  CHECK_THROWS_AS(s(Ix{1}, Ix{6}), ShapeError);
  auto v = make_tensor(buf.data(), 12);
  CHECK_THROWS_AS(v(Ix{12}), ShapeError);
  CHECK(&v(Ix{11}) == buf.data() + 11);
}
