// kiln/detail/part_quant-inl.h - the quantized-weight kernels (one half of all-inl.h; see implementation.hpp).
#include "kiln/ops/qmatmul-inl.h"
#include "kiln/ops/dequant-inl.h"
#include "kiln/ops/qmatmul_i16-inl.h"
