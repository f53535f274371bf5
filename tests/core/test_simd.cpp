// kiln/core/simd.hpp: the run-time target list, forcing a target, and on Arm the run-time choice of the
// sdot kernels ("NEON_DOTPROD", core/config.hpp's KILN_ARM_RUNTIME_DOTPROD).
//   KILN_TEST_EXPECT_DOTPROD=0 or 1 (set by scripts/cross_aarch64.sh when it runs this under QEMU with a CPU
//   model without / with the dot product) checks the CPU detection itself against what the emulator offers.
#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "kiln/core/simd.hpp"
#include "test_util.hpp"

using namespace kiln;

TEST_CASE("simd: the best supported target runs; each one can be forced, and restored") {
  const std::vector<std::string> ts = simd::supported_targets();
  REQUIRE(!ts.empty());
  CHECK(simd::current_target() == ts.front());
  for (const std::string& t : ts) {
    CAPTURE(t);
    {
      simd::ScopedTarget scope(t);
      CHECK(simd::current_target() == t);
      CHECK(simd::supported_targets() == ts);  // the list does not depend on the forced target
    }
    CHECK(simd::current_target() == ts.front());
  }
  CHECK(std::set<std::string>(ts.begin(), ts.end()).size() == ts.size());
}

TEST_CASE("simd: an unknown target is refused with the list of those this CPU runs") {
  const std::string best = simd::current_target();
  try {
    simd::force_target("NOT_A_TARGET");
    FAIL("force_target accepted NOT_A_TARGET");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("'NOT_A_TARGET'") != std::string::npos);
    CHECK(msg.find(best) != std::string::npos);
  }
  CHECK(simd::current_target() == best);  // the failed call leaves the best target
}

TEST_CASE("simd: Arm's sdot kernels show as NEON_DOTPROD exactly where the CPU has the dot product") {
  const auto ts = simd::supported_targets();
  const bool listed = std::find(ts.begin(), ts.end(), "NEON_DOTPROD") != ts.end();
  CHECK(listed == simd::detail::cpu_has_arm_dotprod());
#if KILN_ARM_RUNTIME_DOTPROD
  if (listed) {
    CHECK(ts.front() == "NEON_DOTPROD");
    CHECK(simd::detail::arm_dotprod_active());
    simd::ScopedTarget scope("NEON");
    CHECK(!simd::detail::arm_dotprod_active());  // the 16-bit engine
  }
#else
  CHECK(!listed);  // compiled with dotprod (one engine) or not for Arm: no run-time choice
#endif
  if (const char* e = std::getenv("KILN_TEST_EXPECT_DOTPROD")) {
    INFO("KILN_TEST_EXPECT_DOTPROD=", e);
    CHECK(KILN_ARM_RUNTIME_DOTPROD == 1);  // only meaningful where the run-time copy exists
    CHECK(simd::detail::cpu_has_arm_dotprod() == (std::string(e) == "1"));
  }
}
