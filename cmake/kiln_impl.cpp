// One of the translation units of kiln_add_kernels() (cmake/KilnKernels.cmake): kiln's SIMD kernels
// split so that they compile in parallel, each in well under the memory of one file with all of them (see
// KILN_IMPLEMENTATION_PART in kiln/implementation.hpp). This one: norms, activations, softmax, RoPE, attention and
// kiln::simd::* (exactly one part defines KILN_IMPLEMENTATION_SIMD_CONTROL).
#define KILN_IMPLEMENTATION_PART "kiln/kernels/part_elementwise-inl.h"
#define KILN_IMPLEMENTATION_SIMD_CONTROL 1
#include "kiln/implementation.hpp"
