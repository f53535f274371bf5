// kiln/kernels/part_elementwise-inl.h - norms, activations, softmax, RoPE and attention (see implementation.hpp).
#include "kiln/kernels/dense/norm-inl.h"
#include "kiln/kernels/dense/activation-inl.h"
#include "kiln/kernels/dense/softmax-inl.h"
#include "kiln/kernels/dense/rope-inl.h"
#include "kiln/kernels/dense/attention-inl.h"
