// Uses kiln through the plain headers only (the kernels come from kiln_impl.cpp) and checks a result
// computed by hand.
#include <cmath>
#include <cstdio>
#include <vector>

#include <kiln/kiln.hpp>

int main() {
  // x repeats (1, -1, 1, -1, 1, -1, 1, 5): mean(x^2) = (7 * 1 + 25) / 8 = 4, so rms(x) = 2 exactly and
  // rms_norm(x) * w = x * w / 2 with w = (1, 2, ..., 8) repeated. n = 32 fills whole SIMD vectors.
  const float pattern[8] = {1, -1, 1, -1, 1, -1, 1, 5};
  const std::size_t rows = 2, n = 32;
  kiln::Storage<float, 2> x(rows, n), out(rows, n);
  std::vector<float> w(n);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < n; ++i) x.view()(r, i) = pattern[i % 8] * float(r + 1);  // row 1: rms 4
  for (std::size_t i = 0; i < n; ++i) w[i] = float(i % 8 + 1);

  kiln::ThreadPool pool(2);
  kiln::rms_norm(x.view(), kiln::make_tensor<const float>(w.data(), n), out.view(), 0.0f, kiln::NormWeight::plain,
                 &pool);

  int bad = 0;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < n; ++i) {
      const float want = pattern[i % 8] * float(i % 8 + 1) / 2.0f;  // x * w / rms, rms = 2 (r + 1)
      const float got = out.view()(r, i);
      // 1e-6 relative: one rsqrt-refined division and one product of exactly representable values.
      if (!(std::fabs(got - want) <= 1e-6f * std::fabs(want))) {
        std::printf("mismatch at (%zu, %zu): got %.9g, want %.9g\n", r, i, double(got), double(want));
        ++bad;
      }
    }
  std::printf("kiln consumer: SIMD target %s, %d mismatches\n", kiln::simd::current_target().c_str(), bad);
  if (bad) return 1;
  std::printf("kiln consumer: OK\n");
  return 0;
}
