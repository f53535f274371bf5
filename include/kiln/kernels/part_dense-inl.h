// kiln/kernels/part_dense-inl.h - the f32/f16/bf16 kernels (one half of all-inl.h; see implementation.hpp):
// two finer parts that may also be compiled apart.
#include "kiln/kernels/part_elementwise-inl.h"
#include "kiln/kernels/part_matmul-inl.h"
