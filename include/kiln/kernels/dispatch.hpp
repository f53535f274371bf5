// kiln/kernels/dispatch.hpp - the namespace of the SIMD entry points.
//
// Op headers declare their raw-pointer kernels in kiln::dispatch (between KILN_DISPATCH_BEGIN and
// KILN_DISPATCH_END); the translation unit that defines KILN_IMPLEMENTATION compiles them once per
// Highway target and defines them. The inline namespace's name is part of every symbol, so when that
// translation unit is missing the linker's "undefined reference to
// kiln::dispatch::kernels_need_KILN_IMPLEMENTATION_in_one_cpp::..." says what to do.
#pragma once

#define KILN_DISPATCH_BEGIN  \
  namespace kiln::dispatch { \
  inline namespace kernels_need_KILN_IMPLEMENTATION_in_one_cpp {
#define KILN_DISPATCH_END \
  }                       \
  }
