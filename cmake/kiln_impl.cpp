// kiln's own tests, benchmarks and examples compile the SIMD kernels in two translation units so that a
// 2-core build compiles them in parallel (see KILN_IMPLEMENTATION_PART in kiln/implementation.hpp).
// This one: the dense (f32/f16/bf16) kernels and kiln::simd::*.
#define KILN_IMPLEMENTATION_PART "kiln/detail/part_dense-inl.h"
#define KILN_IMPLEMENTATION_SIMD_CONTROL 1
#include "kiln/implementation.hpp"
