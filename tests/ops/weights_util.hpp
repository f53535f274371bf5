// tests/ops/weights_util.hpp - random weight matrices of any GGUF storage type, shared by the ops tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "kiln/quant/convert.hpp"

namespace kiln::test {

/// rows x k values of GGUF type `type`, row-major: f32 / f16 / bf16 values in (-1, 1); quantized blocks from
/// random bytes (every bit pattern of the quants and the packed sub-block scales is valid) with finite random
/// f16 scales (and mins). extremes: block 7's scale the largest f16 and block 40's an infinity instead.
inline std::vector<uint8_t> random_weights(uint32_t type, std::size_t rows, std::size_t k, uint32_t seed,
                                           bool extremes = false) {
  std::vector<uint8_t> w;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> sc(-0.05f, 0.05f);
  visit_ggml_type(type, [&]<class T>(T*) {
    const std::size_t nb = rows * (k / dtype_traits<T>::block_size);
    w.resize(nb * sizeof(T));
    if constexpr (std::is_same_v<T, float>) {
      for (std::size_t i = 0; i < nb; ++i) reinterpret_cast<float*>(w.data())[i] = sc(rng) * 20;
    } else if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>) {
      for (std::size_t i = 0; i < nb; ++i) reinterpret_cast<T*>(w.data())[i] = T(sc(rng) * 20);
    } else if constexpr (std::is_same_v<decltype(T::d), f16>) {
      for (auto& b : w) b = uint8_t(rng());
      auto* blocks = reinterpret_cast<T*>(w.data());
      for (std::size_t i = 0; i < nb; ++i) {
        auto& b = blocks[i];
        b.d = f16(sc(rng));
        if (extremes && i == 7) b.d = f16(65504.0f);
        if (extremes && i == 40) b.d = f16(std::numeric_limits<float>::infinity());
        if constexpr (requires { b.m; }) b.m = f16(sc(rng));
        if constexpr (requires { b.dmin; }) b.dmin = f16(sc(rng) * 0.2f);
      }
    }
  });
  return w;
}

}  // namespace kiln::test
