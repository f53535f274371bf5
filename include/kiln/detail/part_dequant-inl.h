// kiln/detail/part_dequant-inl.h - dequantizing (f32) products and the 16-bit-integer GEMM (see implementation.hpp).
#include "kiln/ops/dequant-inl.h"
#include "kiln/ops/qmatmul_i16-inl.h"
