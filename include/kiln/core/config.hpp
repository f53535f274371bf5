// kiln/core/config.hpp - build-setup checks every kiln header runs first.
#pragma once

// Highway must see the same HWY_WANT_AVX3_DL in every translation unit of a program (on g++ 12, a
// mix crashed at run time), and kiln's kernels want the AVX3_DL target (VNNI, AVX512-BF16). The CMake
// target kiln::kiln defines it for you; without CMake, add -DHWY_WANT_AVX3_DL=1 to every compile.
#if !defined(HWY_WANT_AVX3_DL) && !defined(KILN_NO_HWY_CHECK)
#error "kiln: HWY_WANT_AVX3_DL is not defined. Link the CMake target kiln::kiln (it defines it) or compile every translation unit with -DHWY_WANT_AVX3_DL=1 (a mix crashes Highway's dispatch)."
#endif

#if defined(__cplusplus) && __cplusplus < 202002L && !defined(_MSVC_LANG)
#error "kiln: needs C++20 (-std=c++20)"
#endif
