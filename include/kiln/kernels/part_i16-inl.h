// kiln/detail/part_i16-inl.h - the 16-bit-integer GEMM/GEMV over quantized weights (see implementation.hpp).
#include "kiln/ops/qmatmul_i16-inl.h"
