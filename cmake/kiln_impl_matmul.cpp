// One of the translation units of kiln_add_kernels() (cmake/KilnKernels.cmake): the f32/f16/bf16
// GEMV and GEMM kernels.
#define KILN_IMPLEMENTATION_PART "kiln/kernels/part_matmul-inl.h"
#include "kiln/implementation.hpp"
