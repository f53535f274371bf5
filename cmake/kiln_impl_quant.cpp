// One of the translation units of kiln_add_kernels() (cmake/KilnKernels.cmake): the integer-dot
// GEMV and GEMM kernels over quantized blocks.
#define KILN_IMPLEMENTATION_PART "kiln/kernels/part_qmatmul-inl.h"
#include "kiln/implementation.hpp"
