// kiln/detail/all-inl.h - every Highway -inl.h of kiln, re-included once per target by
// hwy/foreach_target.h from kiln/implementation.hpp. Add a new op family's -inl.h here.
#include "kiln/ops/norm-inl.h"
#include "kiln/ops/matmul-inl.h"
#include "kiln/ops/activation-inl.h"
#include "kiln/ops/softmax-inl.h"
#include "kiln/ops/rope-inl.h"
#include "kiln/ops/qmatmul-inl.h"
