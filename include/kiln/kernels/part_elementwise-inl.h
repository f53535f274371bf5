// kiln/detail/part_elementwise-inl.h - norms, activations, softmax, RoPE and attention (see implementation.hpp).
#include "kiln/ops/norm-inl.h"
#include "kiln/ops/activation-inl.h"
#include "kiln/ops/softmax-inl.h"
#include "kiln/ops/rope-inl.h"
#include "kiln/ops/attention-inl.h"
