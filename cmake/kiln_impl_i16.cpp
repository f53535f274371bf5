// One of the translation units of kiln_add_kernels() (cmake/KilnKernels.cmake): the 16-bit-integer GEMM
// and GEMV over quantized weights (AVX2 prompts, Q8_0 everywhere).
#define KILN_IMPLEMENTATION_PART "kiln/kernels/part_i16-inl.h"
#include "kiln/implementation.hpp"
