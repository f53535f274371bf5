// kiln/io/ggml_types.hpp - the ggml tensor type ids a GGUF file uses, with each type's block geometry.
//
// A ggml tensor row of ne[0] elements is stored as ne[0] / block_size blocks of type_size bytes each
// (block_size 1 for plain scalars). The ids and sizes are ggml's (ggml.h `enum ggml_type`,
// ggml-common.h block structs); kiln's quantization blocks (kiln/quant/) static_assert against this
// table. Ids ggml removed (4, 5, 31-33, 36-38) are unknown here, so a file using them is rejected.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "kiln/core/dtype.hpp"

namespace kiln::io {

enum class GGMLType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  // 4 (Q4_2) and 5 (Q4_3): removed from ggml
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  // 31-33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8): removed (repacked at load time now)
  TQ1_0 = 34,
  TQ2_0 = 35,
  // 36-38 (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8): removed
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
};

/// Geometry of one ggml type: block_size elements are stored in type_size bytes.
struct GGMLTypeInfo {
  std::string_view name;    ///< ggml's lower-case name ("q4_0"); empty for an unknown id
  uint32_t block_size = 0;  ///< elements per block (1 for scalar types); 0 for an unknown id
  uint32_t type_size = 0;   ///< bytes per block
  bool quantized = false;   ///< a block type (block_size > 1)
  constexpr bool known() const { return block_size != 0; }
};

inline constexpr uint32_t ggml_type_count = 42;  // one past the largest id

namespace detail {
constexpr std::array<GGMLTypeInfo, ggml_type_count> make_ggml_type_table() {
  std::array<GGMLTypeInfo, ggml_type_count> t{};
  auto set = [&t](GGMLType id, std::string_view name, uint32_t bs, uint32_t ts) {
    t[static_cast<uint32_t>(id)] = GGMLTypeInfo{name, bs, ts, bs > 1};
  };
  set(GGMLType::F32, "f32", 1, 4);
  set(GGMLType::F16, "f16", 1, 2);
  set(GGMLType::Q4_0, "q4_0", 32, 2 + 16);                  // d (f16), 32 x 4-bit
  set(GGMLType::Q4_1, "q4_1", 32, 2 + 2 + 16);              // d, m (f16), 32 x 4-bit
  set(GGMLType::Q5_0, "q5_0", 32, 2 + 4 + 16);              // d, qh[4], 32 x 4-bit
  set(GGMLType::Q5_1, "q5_1", 32, 2 + 2 + 4 + 16);          // d, m, qh[4], 32 x 4-bit
  set(GGMLType::Q8_0, "q8_0", 32, 2 + 32);                  // d, 32 x int8
  set(GGMLType::Q8_1, "q8_1", 32, 2 + 2 + 32);              // d, s (f16), 32 x int8 (gguf-py still says 40: stale)
  set(GGMLType::Q2_K, "q2_K", 256, 16 + 64 + 2 + 2);        // scales[16], qs[64], d, dmin
  set(GGMLType::Q3_K, "q3_K", 256, 32 + 64 + 12 + 2);       // hmask[32], qs[64], scales[12], d
  set(GGMLType::Q4_K, "q4_K", 256, 2 + 2 + 12 + 128);       // d, dmin, scales[12], qs[128]
  set(GGMLType::Q5_K, "q5_K", 256, 2 + 2 + 12 + 32 + 128);  // d, dmin, scales[12], qh[32], qs[128]
  set(GGMLType::Q6_K, "q6_K", 256, 128 + 64 + 16 + 2);      // ql[128], qh[64], scales[16], d
  set(GGMLType::Q8_K, "q8_K", 256, 4 + 256 + 32);           // d (f32), qs[256], bsums[16] (int16)
  set(GGMLType::IQ2_XXS, "iq2_xxs", 256, 2 + 64);
  set(GGMLType::IQ2_XS, "iq2_xs", 256, 2 + 64 + 8);
  set(GGMLType::IQ3_XXS, "iq3_xxs", 256, 2 + 96);
  set(GGMLType::IQ1_S, "iq1_s", 256, 2 + 32 + 16);
  set(GGMLType::IQ4_NL, "iq4_nl", 32, 2 + 16);
  set(GGMLType::IQ3_S, "iq3_s", 256, 2 + 64 + 8 + 32 + 4);
  set(GGMLType::IQ2_S, "iq2_s", 256, 2 + 64 + 8 + 8);
  set(GGMLType::IQ4_XS, "iq4_xs", 256, 2 + 2 + 4 + 128);
  set(GGMLType::I8, "i8", 1, 1);
  set(GGMLType::I16, "i16", 1, 2);
  set(GGMLType::I32, "i32", 1, 4);
  set(GGMLType::I64, "i64", 1, 8);
  set(GGMLType::F64, "f64", 1, 8);
  set(GGMLType::IQ1_M, "iq1_m", 256, 32 + 16 + 8);
  set(GGMLType::BF16, "bf16", 1, 2);
  set(GGMLType::TQ1_0, "tq1_0", 256, 48 + 4 + 2);
  set(GGMLType::TQ2_0, "tq2_0", 256, 64 + 2);
  set(GGMLType::MXFP4, "mxfp4", 32, 1 + 16);  // e (e8m0), 32 x 4-bit
  set(GGMLType::NVFP4, "nvfp4", 64, 4 + 32);  // 4 x e4m3 scales, 64 x 4-bit
  set(GGMLType::Q1_0, "q1_0", 128, 2 + 16);   // d, 128 x 1-bit
  return t;
}
}  // namespace detail

inline constexpr std::array<GGMLTypeInfo, ggml_type_count> ggml_type_table = detail::make_ggml_type_table();

/// The geometry of type id `id`; info.known() is false for an id ggml does not (or no longer) define.
constexpr GGMLTypeInfo ggml_type_info(uint32_t id) {
  return id < ggml_type_count ? ggml_type_table[id] : GGMLTypeInfo{};
}
constexpr GGMLTypeInfo ggml_type_info(GGMLType t) { return ggml_type_info(static_cast<uint32_t>(t)); }
constexpr bool is_known_ggml_type(uint32_t id) { return ggml_type_info(id).known(); }
constexpr std::string_view ggml_type_name(GGMLType t) {
  const auto i = ggml_type_info(t);
  return i.known() ? i.name : std::string_view("unknown");
}

static_assert(ggml_type_info(GGMLType::Q4_0).type_size == 18 && ggml_type_info(GGMLType::Q4_K).type_size == 144 &&
                  ggml_type_info(GGMLType::Q6_K).type_size == 210 && ggml_type_info(GGMLType::BF16).type_size == 2,
              "kiln::io: ggml type table disagrees with ggml's block sizes");
static_assert(!is_known_ggml_type(4) && !is_known_ggml_type(31) && !is_known_ggml_type(36),
              "kiln::io: removed ggml type ids must stay unknown");

/// The ggml type that stores kiln dtype T (F32, F16, BF16, I8, I32).
template <class T>
constexpr GGMLType ggml_type_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return GGMLType::F32;
  else if constexpr (std::is_same_v<U, f16>) return GGMLType::F16;
  else if constexpr (std::is_same_v<U, bf16>) return GGMLType::BF16;
  else if constexpr (std::is_same_v<U, int8_t>) return GGMLType::I8;
  else if constexpr (std::is_same_v<U, int32_t>) return GGMLType::I32;
  else static_assert(sizeof(U) == 0, "kiln::io: no ggml type for this dtype (use float, f16, bf16, int8_t, int32_t)");
}

}  // namespace kiln::io
