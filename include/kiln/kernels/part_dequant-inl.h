// kiln/kernels/part_dequant-inl.h - products over dequantized weights, f32 (see implementation.hpp).
#include "kiln/kernels/matmul/dequant-inl.h"
