// kiln/kernels/part_i16-inl.h - the 16-bit-integer GEMM/GEMV over quantized weights (see implementation.hpp).
#include "kiln/kernels/qmatmul/i16-inl.h"
