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
/// f16 scales (and mins); MXFP4 with scale bytes of moderate values. extremes: block 7's scale the largest f16
/// and block 40's an infinity instead (MXFP4: 2^126 and 2^127, whose largest codes overflow).
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
    } else if constexpr (std::is_same_v<T, block_mxfp4>) {  // random codes, scales 2^-8 .. 2^-3
      for (auto& b : w) b = uint8_t(rng());
      auto* blocks = reinterpret_cast<T*>(w.data());
      for (std::size_t i = 0; i < nb; ++i) {
        blocks[i].e = uint8_t(120 + rng() % 6);
        if (extremes && i == 7) blocks[i].e = 254;   // 2^126: codes 8 and 12 still finite
        if (extremes && i == 40) blocks[i].e = 255;  // 2^127: codes 8 and 12 overflow to infinities
      }
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
