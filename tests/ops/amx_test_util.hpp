// Shared by the AMX tests (test_qmatmul_amx, test_matmul_amx, test_attention_amx): a guard that restores the
// AMX switch and KILN_NO_AMX, the "skipped: no AMX" check that names what the CPU and OS lack, and test values
// over a wide dynamic range.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kiln/core/amx.hpp"
#include "test_util.hpp"

namespace kiln::amx_test {

// Restores the switch and KILN_NO_AMX whatever a case does; KILN_NO_AMX is unset meanwhile.
struct SwitchGuard {
  std::string env;
  bool had_env;
  AmxOptions was = amx_options();
  SwitchGuard() {
    const char* e = std::getenv("KILN_NO_AMX");
    had_env = e != nullptr;
    if (had_env) env = e;
    unsetenv("KILN_NO_AMX");
  }
  ~SwitchGuard() {
    set_amx_enabled(was);
    if (had_env) setenv("KILN_NO_AMX", env.c_str(), 1);
    else unsetenv("KILN_NO_AMX");
  }
};

// true where AMX-BF16 is usable; else says "skipped: no AMX" with the reason and what runs instead.
inline bool bf16_usable_or_skip(const char* instead) {
  if (amx_support().usable_bf16()) return true;
  const AmxSupport& s = amx_support();
  MESSAGE("skipped: no AMX (cpuid tile ", s.tile, " bf16 ", s.bf16, ", OS tile state ", s.os_state, ", permission ",
          s.permitted, "): ", instead, " runs instead");
  return false;
}

// Values m * 2^e, m uniform in [-1, 1], e uniform in [lo, hi]; every 7th value 0 (as f16: lo >= -24).
inline std::vector<float> wide(std::size_t n, uint32_t seed, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> m(-1.f, 1.f);
  std::uniform_int_distribution<int> e(lo, hi);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i % 7 == 3 ? 0.f : std::ldexp(m(rng), e(rng));
  return v;
}

}  // namespace kiln::amx_test
