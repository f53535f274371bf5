// kiln/implementation.hpp - the SIMD kernels, compiled once per Highway target, and their dispatch.
//
// Exactly one .cpp of a program includes this (or defines KILN_IMPLEMENTATION before including
// kiln/kiln.hpp): it is the only translation unit that sees Highway. Every other file includes the
// Highway-free public headers only. Link hwy::hwy (libhwy.so: runtime CPU detection).
//
// To compile the kernels in parallel, a build may instead split them over several translation units:
// each defines KILN_IMPLEMENTATION_PART as one of "kiln/kernels/part_elementwise-inl.h",
// "kiln/kernels/part_matmul-inl.h", "kiln/kernels/part_qmatmul-inl.h", "kiln/kernels/part_dequant-inl.h" and
// "kiln/kernels/part_i16-inl.h" (or the two halves "kiln/kernels/part_dense-inl.h" and
// "kiln/kernels/part_quant-inl.h", which include them) before including this file, and exactly one of them
// also defines KILN_IMPLEMENTATION_SIMD_CONTROL (kiln::simd::*). CMake's kiln_add_kernels()
// (cmake/KilnKernels.cmake) builds the five plus the architectures as one library; kiln's own build uses it.
#pragma once

#if defined(__CUDACC__)
#error \
    "kiln: the SIMD implementation uses Highway, which does not compile under nvcc. Include kiln/implementation.hpp (or define KILN_IMPLEMENTATION) in a .cpp built by the host compiler."
#endif

#include "kiln/core/config.hpp"
#include "kiln/kiln.hpp"

#if defined(KILN_IMPLEMENTATION_PART)
#define KILN_DETAIL_KERNELS KILN_IMPLEMENTATION_PART
#else
#define KILN_DETAIL_KERNELS "kiln/kernels/all-inl.h"
#define KILN_IMPLEMENTATION_SIMD_CONTROL 1
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE KILN_DETAIL_KERNELS
#include <hwy/foreach_target.h>  // re-includes the kernels once per target
#include <hwy/highway.h>
#include <hwy/targets.h>

#include KILN_DETAIL_KERNELS  // and once for the static target, with HWY_ONCE set

#if defined(KILN_IMPLEMENTATION_SIMD_CONTROL)

#include <string>
#include <vector>

namespace kiln::simd {

namespace detail {
inline std::vector<int64_t> compiled_supported() {
  std::vector<int64_t> out;
  const int64_t all = hwy::SupportedTargets() & HWY_TARGETS;
  for (int64_t t = all; t != 0; t &= t - 1) out.push_back(t & ~(t - 1));  // lowest bit = best target
  return out;
}
inline int64_t& forced() {
  static int64_t f = 0;
  return f;
}
}  // namespace detail

inline namespace kernels_need_KILN_IMPLEMENTATION_in_one_cpp {
std::vector<std::string> supported_targets() {
  hwy::SetSupportedTargetsForTest(0);
  std::vector<std::string> names;
  for (int64_t t : detail::compiled_supported()) {
    if (t == HWY_NEON && detail::cpu_has_arm_dotprod()) names.emplace_back("NEON_DOTPROD");
    names.emplace_back(hwy::TargetName(t));
  }
  if (detail::forced()) hwy::SetSupportedTargetsForTest(detail::forced());
  return names;
}

std::string current_target() {
  const auto ts = detail::compiled_supported();  // honours a forced target
  if (!ts.empty() && ts.front() == HWY_NEON && detail::arm_dotprod_active()) return "NEON_DOTPROD";
  return ts.empty() ? std::string("none") : std::string(hwy::TargetName(ts.front()));
}

void force_target(const std::string& name) {
  hwy::SetSupportedTargetsForTest(0);
  detail::forced() = 0;
  detail::arm_dotprod_off() = false;
  if (!name.empty()) {
    int64_t found = 0;
    for (int64_t t : detail::compiled_supported())
      if (name == hwy::TargetName(t) || (name == "NEON_DOTPROD" && t == HWY_NEON && detail::cpu_has_arm_dotprod()))
        found = t;
    if (!found) {
      std::string list;
      for (const auto& t : supported_targets()) list += (list.empty() ? "" : ", ") + t;
      ::kiln::fail("kiln::simd::force_target: unknown or unsupported target '", name, "' (this CPU runs: ", list, ")");
    }
    detail::arm_dotprod_off() = name == "NEON";
    detail::forced() = found;
    hwy::SetSupportedTargetsForTest(found);
  }
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}
}  // namespace kernels_need_KILN_IMPLEMENTATION_in_one_cpp

}  // namespace kiln::simd
#endif  // KILN_IMPLEMENTATION_SIMD_CONTROL
