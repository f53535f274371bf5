// The second kernel translation unit of kiln's own build: the quantized-weight kernels.
#define KILN_IMPLEMENTATION_PART "kiln/detail/part_quant-inl.h"
#include "kiln/implementation.hpp"
