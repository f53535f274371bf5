// kiln/detail/all-inl.h - every Highway -inl.h of kiln, re-included once per target by
// hwy/foreach_target.h from kiln/implementation.hpp. Add a new op family's -inl.h here.
#include "kiln/ops/norm-inl.h"
