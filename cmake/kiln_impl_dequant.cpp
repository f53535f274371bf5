// One of the five translation units of kiln_add_kernels() (cmake/KilnKernels.cmake): the products over
// dequantized weights (Precision::exact) and the 16-bit-integer GEMM (AVX2 prompts).
#define KILN_IMPLEMENTATION_PART "kiln/detail/part_dequant-inl.h"
#include "kiln/implementation.hpp"
