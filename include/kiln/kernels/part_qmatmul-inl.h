// kiln/detail/part_qmatmul-inl.h - the integer-dot quantized GEMV/GEMM kernels (see implementation.hpp).
#include "kiln/ops/qmatmul-inl.h"
