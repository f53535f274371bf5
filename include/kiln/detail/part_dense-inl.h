// kiln/detail/part_dense-inl.h - the f32/f16/bf16 kernels (one half of all-inl.h; see implementation.hpp).
#include "kiln/ops/norm-inl.h"
#include "kiln/ops/matmul-inl.h"
#include "kiln/ops/activation-inl.h"
#include "kiln/ops/softmax-inl.h"
#include "kiln/ops/rope-inl.h"
