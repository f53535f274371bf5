// Must not compile: a 3x5 static view cannot be reshaped to 4x4 (15 != 16 elements, both known at compile
// time). With -DKILN_COMPILE_FAIL_CONTROL it reshapes to 5x3 instead and must compile.
#include <kiln/kiln.hpp>

float sum_reshaped(float* p) {
  auto a = kiln::make_tensor<3, 5>(p);  // (3, 5)
#if defined(KILN_COMPILE_FAIL_CONTROL)
  auto b = kiln::reshape<5, 3>(a);
#else
  auto b = kiln::reshape<4, 4>(a);
#endif
  return b(0, 0) + b(1, 1);
}
