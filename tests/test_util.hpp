// tests/test_util.hpp - helpers shared by kiln's tests.
#pragma once

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "kiln/kiln.hpp"

namespace kiln::test {

/// A real model of scripts/fetch_models.sh: $KILN_MODEL_DIR/<file>, default ~/.cache/kiln/models/<file>.
/// A missing file FAILs the test naming the path and the script that fetches it (never a skip).
inline std::string real_model(const std::string& file) {
  const char* dir = std::getenv("KILN_MODEL_DIR");
  const char* home = std::getenv("HOME");
  const std::string p =
      (dir && *dir ? std::string(dir) : std::string(home ? home : "") + "/.cache/kiln/models") + "/" + file;
  if (!std::ifstream(p)) FAIL("missing model '", p, "': run scripts/fetch_models.sh (scripts/test.sh does)");
  return p;
}

/// The sizes every kernel is tested at: tails around 16 and 64 lanes, and large ones.
inline const std::vector<std::size_t>& kernel_sizes() {
  static const std::vector<std::size_t> s{1, 3, 15, 16, 17, 63, 64, 65, 1000, 4095, 4097};
  return s;
}

/// Every Highway target this CPU supports (best first, EMU128 = the portable scalar-ish target last).
inline std::vector<std::string> targets() { return simd::supported_targets(); }

/// Runs body() once per supported target, with the target forced and named in a doctest SUBCASE-free
/// CAPTURE so failures say which target failed.
template <class F>
void for_each_target(F&& body) {
  for (const auto& t : targets()) {
    simd::ScopedTarget scope(t);
    INFO("target ", t);
    body(t);
  }
}

/// Deterministic random floats in [lo, hi).
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// A vector of n floats whose data() is deliberately misaligned by `offset_floats` from a 64-byte boundary.
struct Misaligned {
  std::vector<float> storage;
  float* ptr;
  Misaligned(std::size_t n, std::size_t offset_floats) : storage(n + 16 + offset_floats) {
    auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    std::size_t skip = ((64 - addr % 64) % 64) / sizeof(float) + offset_floats;
    ptr = storage.data() + skip;
  }
};

/// max |a - b| / (atol + rtol * |b|) <= 1 for all elements, reporting the worst index.
inline void check_close(const float* got, const float* want, std::size_t n, float rtol, float atol,
                        const char* what = "") {
  std::size_t worst = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const double ratio = err / (atol + rtol * std::fabs(double(want[i])));
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }  // NaN counts as worst
  }
  INFO(what, ": worst at ", worst, " of ", n, ": got ", got[worst], ", want ", want[worst]);
  CHECK(worst_ratio <= 1.0);
}

}  // namespace kiln::test
