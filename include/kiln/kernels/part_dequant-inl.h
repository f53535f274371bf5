// kiln/detail/part_dequant-inl.h - products over dequantized weights, f32 (see implementation.hpp).
#include "kiln/ops/dequant-inl.h"
