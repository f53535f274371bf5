// kiln/detail/part_matmul-inl.h - the f32/f16/bf16 GEMV/GEMM kernels (see implementation.hpp).
#include "kiln/ops/matmul-inl.h"
