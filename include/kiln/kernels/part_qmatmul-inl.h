// kiln/kernels/part_qmatmul-inl.h - the integer-dot quantized GEMV/GEMM kernels (see implementation.hpp).
#include "kiln/kernels/qmatmul/entry-inl.h"
