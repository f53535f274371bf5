// kiln/ops.hpp and kiln/io.hpp on their own: this file includes no other kiln header (and, unlike the other
// test files, not the precompiled kiln/kiln.hpp: tests/CMakeLists.txt), so it compiles only if the umbrellas
// are complete. It runs a weight product over a Q8_0 weight through kiln::linear (ops/linear.hpp) against a
// double reference over the same dequantized weights.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "kiln/io.hpp"
#include "kiln/ops.hpp"

TEST_CASE("umbrella: kiln/ops.hpp alone runs linear over a Q8_0 weight as a double reference does") {
  constexpr std::size_t m = 3, rows = 24, cols = 96;  // rows past one 16-row group; cols = 3 blocks
  std::vector<float> wf(rows * cols), x(m * cols);
  for (std::size_t i = 0; i < wf.size(); ++i) wf[i] = std::sin(0.37f * float(i) + 0.1f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.23f * float(i)) - 0.2f;
  std::vector<kiln::block_q8_0> wq(rows * cols / 32);
  kiln::quantize_row(wf.data(), wq.data(), rows * cols);
  std::vector<float> wd(rows * cols);  // what the weight holds: the reference's operand
  kiln::dequantize_row(wq.data(), wd.data(), rows * cols);
  const kiln::WeightRef w{reinterpret_cast<const std::byte*>(wq.data()),
                          kiln::io::GGMLType::Q8_0,
                          rows,
                          cols,
                          cols / 32 * sizeof(kiln::block_q8_0),
                          "w"};
  CHECK(kiln::io::ggml_type_name(w.type) == "q8_0");
  kiln::Storage<float, 2> y(m, rows);
  kiln::ThreadPool pool(2);
  kiln::linear(kiln::make_tensor<const float>(x.data(), m, cols), w, y.view(), &pool, kiln::Precision::exact);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < rows; ++j) {
      double ref = 0, mag = 0;
      for (std::size_t p = 0; p < cols; ++p) {
        ref += double(x[i * cols + p]) * wd[j * cols + p];
        mag += std::fabs(double(x[i * cols + p]) * wd[j * cols + p]);
      }
      // The exact path multiplies the same f32 weights and sums cols products in f32 in some order: each
      // product and each partial sum rounds once (u = 2^-24), so |error| <= (cols + 1) u sum |x w| (to first
      // order, cols u << 1).
      const double bound = double(cols + 1) * std::ldexp(1.0, -24) * mag;
      CHECK(std::fabs(double(y.view()(i, j)) - ref) <= bound);
    }
}
