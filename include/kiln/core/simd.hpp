// kiln/core/simd.hpp - which SIMD target the kernels run on (Highway runtime dispatch).
//
// Highway-free on purpose: only the translation unit that defines KILN_IMPLEMENTATION includes
// Highway. These functions are defined there.
#pragma once

#include <string>
#include <vector>

namespace kiln::simd {
// Defined by the KILN_IMPLEMENTATION translation unit (the inline namespace names the fix in link errors).
inline namespace kernels_need_KILN_IMPLEMENTATION_in_one_cpp {

/// Names of the targets compiled into this program that this CPU runs, best first
/// (e.g. {"AVX3_DL", "AVX3", "AVX2", "SSE4", "SSSE3", "EMU128"}).
std::vector<std::string> supported_targets();

/// The target kernels dispatch to now.
std::string current_target();

/// Makes every kernel dispatch to the named target (one of supported_targets()), for tests and
/// per-target benchmarks; "" restores the best one. Throws kiln::Error for an unknown name.
/// Not thread-safe with kernels running concurrently.
void force_target(const std::string& name);

}  // inline namespace

/// RAII: forces a target for a scope.
class ScopedTarget {
 public:
  explicit ScopedTarget(const std::string& name) { force_target(name); }
  ~ScopedTarget() { force_target(""); }
  ScopedTarget(const ScopedTarget&) = delete;
  ScopedTarget& operator=(const ScopedTarget&) = delete;
};

}  // namespace kiln::simd
