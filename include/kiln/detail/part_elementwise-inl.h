// kiln/detail/part_elementwise-inl.h - norms, activations, softmax and RoPE (see implementation.hpp).
#include "kiln/ops/norm-inl.h"
#include "kiln/ops/activation-inl.h"
#include "kiln/ops/softmax-inl.h"
#include "kiln/ops/rope-inl.h"
