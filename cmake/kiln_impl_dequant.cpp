// One of the translation units of kiln_add_kernels() (cmake/KilnKernels.cmake): the products over
// dequantized weights (Precision::exact).
#define KILN_IMPLEMENTATION_PART "kiln/kernels/part_dequant-inl.h"
#include "kiln/implementation.hpp"
