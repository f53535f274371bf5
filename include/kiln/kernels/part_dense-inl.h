// kiln/detail/part_dense-inl.h - the f32/f16/bf16 kernels (one half of all-inl.h; see implementation.hpp):
// two finer parts that may also be compiled apart.
#include "kiln/detail/part_elementwise-inl.h"
#include "kiln/detail/part_matmul-inl.h"
