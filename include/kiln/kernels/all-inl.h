// kiln/kernels/all-inl.h - every Highway -inl.h of kiln, re-included once per target by
// hwy/foreach_target.h from kiln/implementation.hpp. A new op family's -inl.h goes into one of the parts
// (each part can also be compiled as its own translation unit: see KILN_IMPLEMENTATION_PART).
#include "kiln/kernels/part_dense-inl.h"
#include "kiln/kernels/part_quant-inl.h"
