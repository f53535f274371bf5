// kiln/core/simd.hpp - which SIMD target the kernels run on (Highway runtime dispatch).
//
// Highway-free on purpose: only the translation unit that defines KILN_IMPLEMENTATION includes
// Highway. These functions are defined there.
#pragma once

#include <string>
#include <vector>

#include "kiln/core/config.hpp"
#if KILN_ARM_RUNTIME_DOTPROD
#include <sys/auxv.h>
#endif

namespace kiln::simd {
// Defined by the KILN_IMPLEMENTATION translation unit (the inline namespace names the fix in link errors).
inline namespace kernels_need_KILN_IMPLEMENTATION_in_one_cpp {

/// Names of the targets compiled into this program that this CPU runs, best first
/// (e.g. {"AVX3_DL", "AVX3", "AVX2", "SSE4", "SSSE3", "EMU128"}; on Arm {"NEON_DOTPROD", "NEON"} or {"NEON"},
/// see detail::cpu_has_arm_dotprod).
std::vector<std::string> supported_targets();

/// The target kernels dispatch to now.
std::string current_target();

/// Makes every kernel dispatch to the named target (one of supported_targets()), for tests and
/// per-target benchmarks; "" restores the best one. Throws kiln::Error for an unknown name.
/// Not thread-safe with kernels running concurrently.
void force_target(const std::string& name);

}  // namespace kernels_need_KILN_IMPLEMENTATION_in_one_cpp

namespace detail {
/// Arm builds that compile qmatmul's sdot engine for run-time use (KILN_ARM_RUNTIME_DOTPROD, core/config.hpp):
/// whether this CPU has the dot product (HWCAP_ASIMDDP). It then shows as the target "NEON_DOTPROD", above
/// "NEON" (force_target("NEON") runs the 16-bit engine).
inline bool cpu_has_arm_dotprod() {
#if KILN_ARM_RUNTIME_DOTPROD
  static const bool has = (getauxval(AT_HWCAP) & (1ul << 20)) != 0;  // HWCAP_ASIMDDP
  return has;
#else
  return false;
#endif
}
inline bool& arm_dotprod_off() {  // set by force_target("NEON")
  static bool off = false;
  return off;
}
inline bool arm_dotprod_active() { return cpu_has_arm_dotprod() && !arm_dotprod_off(); }
}  // namespace detail

/// RAII: forces a target for a scope.
class ScopedTarget {
 public:
  explicit ScopedTarget(const std::string& name) { force_target(name); }
  ~ScopedTarget() { force_target(""); }
  ScopedTarget(const ScopedTarget&) = delete;
  ScopedTarget& operator=(const ScopedTarget&) = delete;
};

}  // namespace kiln::simd
