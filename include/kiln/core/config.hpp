// kiln/core/config.hpp - build-setup checks every kiln header runs first.
#pragma once

// Highway must see the same HWY_WANT_AVX3_DL in every translation unit of a program (on g++ 12, a
// mix crashed at run time), and kiln's kernels want the AVX3_DL target (VNNI, AVX512-BF16). The CMake
// target kiln::kiln defines it for you; without CMake, add -DHWY_WANT_AVX3_DL=1 to every compile.
// (Highway reads it on x86 only.)
#if !defined(HWY_WANT_AVX3_DL) && !defined(KILN_NO_HWY_CHECK) && \
    (defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86))
#error \
    "kiln: HWY_WANT_AVX3_DL is not defined. Link the CMake target kiln::kiln (it defines it) or compile every translation unit with -DHWY_WANT_AVX3_DL=1 (a mix crashes Highway's dispatch)."
#endif

// Highway's SVE/SVE2 (Arm) and RVV (RISC-V) targets use sizeless vector types, which cannot be array
// elements or members; kiln's kernels keep register tiles in arrays, so on Arm kiln compiles NEON only
// (every 64-bit Arm CPU has it). kiln::kiln defines the setting; a translation unit that included Highway
// before any kiln header without it gets this error instead of a wall of template errors.
#if defined(__aarch64__) || defined(_M_ARM64) || defined(__riscv)
#if !defined(HWY_DISABLED_TARGETS)
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif
#include <hwy/detect_targets.h>
#if (HWY_TARGETS) & (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#error \
    "kiln: Highway's SVE/RVV targets are enabled. Compile every translation unit with -DHWY_DISABLED_TARGETS=(HWY_SVE|HWY_SVE2|HWY_SVE_256|HWY_SVE2_128|HWY_RVV) (the CMake target kiln::kiln does), or include a kiln header before Highway."
#endif
#endif

// Arm: a GCC build for a baseline without the dot product (-march=armv8-a .. armv8.2-a, the default) also
// compiles qmatmul's byte engine with sdot (under `#pragma GCC target`), taken at run time where the CPU
// has it (Linux: getauxval's HWCAP_ASIMDDP). Builds with dotprod (-mcpu=native on such a CPU) have only
// that engine. Off with -DKILN_NO_RUNTIME_DOTPROD, with clang, and for flags the pragma's
// armv8.2-a+dotprod+crypto does not cover (Armv8.3+, SVE, fp16 arithmetic): GCC would refuse to inline
// Highway's operations into the pragma's functions.
#if !defined(KILN_ARM_RUNTIME_DOTPROD)
#if defined(__aarch64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) &&         \
    !defined(__ARM_FEATURE_DOTPROD) && !defined(__ARM_FEATURE_JCVT) && !defined(__ARM_FEATURE_SVE) && \
    !defined(__ARM_FEATURE_FP16_VECTOR_ARITHMETIC) && !defined(KILN_NO_RUNTIME_DOTPROD)
#define KILN_ARM_RUNTIME_DOTPROD 1
#else
#define KILN_ARM_RUNTIME_DOTPROD 0
#endif
#endif

#if defined(__cplusplus) && __cplusplus < 202002L && !defined(_MSVC_LANG)
#error "kiln: needs C++20 (-std=c++20)"
#endif
