// kiln/kernels/part_quant-inl.h - the quantized-weight kernels (one half of all-inl.h; see implementation.hpp):
// three finer parts that may also be compiled apart.
#include "kiln/kernels/part_qmatmul-inl.h"
#include "kiln/kernels/part_dequant-inl.h"
#include "kiln/kernels/part_i16-inl.h"
