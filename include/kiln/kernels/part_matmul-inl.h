// kiln/kernels/part_matmul-inl.h - the f32/f16/bf16 GEMV/GEMM kernels (see implementation.hpp).
#include "kiln/kernels/matmul/entry-inl.h"
