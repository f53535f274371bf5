// kiln/quant/blocks.hpp - the GGUF (ggml) quantized block types as plain structs, each a kiln DType.
//
// Byte layouts are ggml's (ggml-common.h), so a row of a GGUF tensor is an array of these structs and a
// Tensor<const block_q4_K, ...> views file bytes directly. A block of `block_size` weights is stored in
// `block_bytes` bytes; halves are kiln::f16 (IEEE binary16 bits, little-endian like the file). Every
// multi-byte field is little-endian; kiln supports little-endian hosts only (asserted below).
//
// What each block encodes (q: the small integers, d/dmin: the f16 scales; dequantize.hpp has the exact
// arithmetic):
//   Q4_0  x = d * (q - 8)           q 4-bit          Q4_1  x = d * q + m            q 4-bit
//   Q5_0  x = d * (q - 16)          q 5-bit          Q5_1  x = d * q + m            q 5-bit
//   Q8_0  x = d * q                 q int8
//   Q2_K  x = (d * sc) * q - dmin * mn     16 sub-blocks of 16, sc/mn 4-bit, q 2-bit
//   Q3_K  x = (d * (sc - 32)) * (q - 4*(1 - hbit))  16 sub-blocks of 16, sc 6-bit, q 2+1-bit
//   Q4_K  x = (d * sc) * q - dmin * mn     8 sub-blocks of 32, sc/mn 6-bit, q 4-bit
//   Q5_K  x = (d * sc) * q - dmin * mn     8 sub-blocks of 32, sc/mn 6-bit, q 4+1-bit
//   Q6_K  x = (d * sc) * (q - 32)          16 sub-blocks of 16, sc int8, q 4+2-bit
//   Q8_K  x = d * q    (d is an f32; bsums[i] = sum of q over the 16 values of group i; an activation
//                       format for integer dot products, not found in model files)
//   MXFP4 x = 2^(e - 127) * v       v an e2m1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), e an
//                                   e8m0 byte (OCP microscaling; gpt-oss's experts)
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/core/dtype.hpp"
#include "kiln/io/ggml_types.hpp"

static_assert(std::endian::native == std::endian::little, "kiln: GGUF blocks need a little-endian host");

namespace kiln {

inline constexpr std::size_t QK4_0 = 32;
inline constexpr std::size_t QK4_1 = 32;
inline constexpr std::size_t QK5_0 = 32;
inline constexpr std::size_t QK5_1 = 32;
inline constexpr std::size_t QK8_0 = 32;
inline constexpr std::size_t QK_K = 256;         // weights per K-quant super-block
inline constexpr std::size_t K_SCALE_SIZE = 12;  // bytes of packed 6-bit scales and mins in Q4_K/Q5_K
inline constexpr std::size_t QK_MXFP4 = 32;

/// Q4_0: qs[j] holds q[j] (low nibble) and q[j + 16] (high nibble).
struct block_q4_0 {
  f16 d;
  uint8_t qs[QK4_0 / 2];
};
/// Q4_1: as Q4_0, plus the block minimum m.
struct block_q4_1 {
  f16 d;
  f16 m;
  uint8_t qs[QK4_1 / 2];
};
/// Q5_0: the low 4 bits as in Q4_0; bit j of the little-endian uint32 qh is bit 4 of q[j].
struct block_q5_0 {
  f16 d;
  uint8_t qh[4];
  uint8_t qs[QK5_0 / 2];
};
/// Q5_1: as Q5_0, plus the block minimum m.
struct block_q5_1 {
  f16 d;
  f16 m;
  uint8_t qh[4];
  uint8_t qs[QK5_1 / 2];
};
/// Q8_0: 32 signed bytes and one scale.
struct block_q8_0 {
  f16 d;
  int8_t qs[QK8_0];
};
/// Q2_K: scales[i] = sc (low nibble) | mn (high nibble) of sub-block i; value e = h*128 + s*32 + l
/// (h < 2, s < 4, l < 32) is bits 2s..2s+1 of qs[h*32 + l], sub-block e / 16.
struct block_q2_K {
  uint8_t scales[QK_K / 16];
  uint8_t qs[QK_K / 4];
  f16 d;
  f16 dmin;
};
/// Q3_K: low 2 bits like Q2_K's qs; bit e / 32 of hmask[e % 32] is the high bit (set: q - 0, clear: q - 4);
/// 16 6-bit scales packed in 12 bytes (low nibbles in bytes 0..7, high 2-bit pairs in bytes 8..11).
struct block_q3_K {
  uint8_t hmask[QK_K / 8];
  uint8_t qs[QK_K / 4];
  uint8_t scales[12];
  f16 d;
};
/// Q4_K: 8 6-bit scales and 8 6-bit mins packed in 12 bytes; value e = c*64 + h*32 + l is nibble h of
/// qs[c*32 + l], sub-block e / 32.
struct block_q4_K {
  f16 d;
  f16 dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qs[QK_K / 2];
};
/// Q5_K: as Q4_K, plus bit e / 32 of qh[e % 32] as bit 4 of q.
struct block_q5_K {
  f16 d;
  f16 dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
/// Q6_K: value e = h*128 + n*64 + l (l < 64) has low nibble n of ql[h*64 + l] and, with l' = e % 32 and
/// s = (e % 128) / 32, high bits 2s..2s+1 of qh[h*32 + l']; int8 scale of sub-block e / 16.
struct block_q6_K {
  uint8_t ql[QK_K / 2];
  uint8_t qh[QK_K / 4];
  int8_t scales[QK_K / 16];
  f16 d;
};
/// Q8_K: f32 scale, 256 signed bytes, and the sums of each group of 16 (for K-quant dot products).
struct block_q8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];
};

/// MXFP4: an e8m0 scale byte e (2^(e - 127); ggml reads it as half of that, 2^(e - 128), times the e2m1
/// values doubled: the integers kvalues_mxfp4) and 32 4-bit e2m1 codes, qs[j] holding code j (low nibble)
/// and code j + 16 (high nibble), as Q4_0. A code is sign (bit 3) and magnitude index (bits 0..2).
struct block_mxfp4 {
  uint8_t e;
  uint8_t qs[QK_MXFP4 / 2];
};

static_assert(sizeof(block_q4_0) == 2 + QK4_0 / 2, "block_q4_0: wrong size/padding");
static_assert(sizeof(block_q4_1) == 4 + QK4_1 / 2, "block_q4_1: wrong size/padding");
static_assert(sizeof(block_q5_0) == 2 + 4 + QK5_0 / 2, "block_q5_0: wrong size/padding");
static_assert(sizeof(block_q5_1) == 4 + 4 + QK5_1 / 2, "block_q5_1: wrong size/padding");
static_assert(sizeof(block_q8_0) == 2 + QK8_0, "block_q8_0: wrong size/padding");
static_assert(sizeof(block_q2_K) == 4 + QK_K / 16 + QK_K / 4, "block_q2_K: wrong size/padding");
static_assert(sizeof(block_q3_K) == 2 + QK_K / 4 + QK_K / 8 + 12, "block_q3_K: wrong size/padding");
static_assert(sizeof(block_q4_K) == 4 + K_SCALE_SIZE + QK_K / 2, "block_q4_K: wrong size/padding");
static_assert(sizeof(block_q5_K) == 4 + K_SCALE_SIZE + QK_K / 8 + QK_K / 2, "block_q5_K: wrong size/padding");
static_assert(sizeof(block_q6_K) == 2 + QK_K / 2 + QK_K / 4 + QK_K / 16, "block_q6_K: wrong size/padding");
static_assert(sizeof(block_q8_K) == 4 + QK_K + QK_K / 16 * 2, "block_q8_K: wrong size/padding");
static_assert(sizeof(block_mxfp4) == 1 + QK_MXFP4 / 2, "block_mxfp4: wrong size/padding");
static_assert(alignof(block_q4_0) <= 2 && alignof(block_q6_K) <= 2 && alignof(block_q8_K) <= 4,
              "kiln blocks must not need more alignment than ggml's (rows of them are packed in files)");

/// ggml's type ids (the `type` field of a GGUF tensor info) as plain integers, for switches and for
/// dtype_traits<B>::ggml_type; the same values as io::GGMLType (io/ggml_types.hpp).
namespace ggml_type_id {
#define KILN_GGML_ID(X) inline constexpr uint32_t X = static_cast<uint32_t>(io::GGMLType::X)
KILN_GGML_ID(F32);
KILN_GGML_ID(F16);
KILN_GGML_ID(BF16);
KILN_GGML_ID(Q4_0);
KILN_GGML_ID(Q4_1);
KILN_GGML_ID(Q5_0);
KILN_GGML_ID(Q5_1);
KILN_GGML_ID(Q8_0);
KILN_GGML_ID(Q2_K);
KILN_GGML_ID(Q3_K);
KILN_GGML_ID(Q4_K);
KILN_GGML_ID(Q5_K);
KILN_GGML_ID(Q6_K);
KILN_GGML_ID(Q8_K);
KILN_GGML_ID(MXFP4);
#undef KILN_GGML_ID
}  // namespace ggml_type_id
static_assert(ggml_type_id::Q4_0 == 2 && ggml_type_id::Q4_K == 12 && ggml_type_id::BF16 == 30,
              "kiln: ggml type ids changed");

#define KILN_BLOCK_DTYPE(T, N, NAME, ID)                                           \
  template <>                                                                      \
  struct dtype_traits<T> {                                                         \
    static constexpr bool is_dtype = true;                                         \
    static constexpr bool is_block = true;                                         \
    static constexpr std::size_t block_size = N;                                   \
    static constexpr std::size_t block_bytes = sizeof(T);                          \
    static constexpr std::string_view name = NAME;                                 \
    static constexpr uint32_t ggml_type = ggml_type_id::ID;                        \
  };                                                                               \
  static_assert(io::ggml_type_info(io::GGMLType::ID).block_size == N &&            \
                    io::ggml_type_info(io::GGMLType::ID).type_size == sizeof(T) && \
                    io::ggml_type_info(io::GGMLType::ID).name == NAME,             \
                "kiln: " NAME " disagrees with io/ggml_types.hpp's table")
KILN_BLOCK_DTYPE(block_q4_0, QK4_0, "q4_0", Q4_0);
KILN_BLOCK_DTYPE(block_q4_1, QK4_1, "q4_1", Q4_1);
KILN_BLOCK_DTYPE(block_q5_0, QK5_0, "q5_0", Q5_0);
KILN_BLOCK_DTYPE(block_q5_1, QK5_1, "q5_1", Q5_1);
KILN_BLOCK_DTYPE(block_q8_0, QK8_0, "q8_0", Q8_0);
KILN_BLOCK_DTYPE(block_q2_K, QK_K, "q2_K", Q2_K);
KILN_BLOCK_DTYPE(block_q3_K, QK_K, "q3_K", Q3_K);
KILN_BLOCK_DTYPE(block_q4_K, QK_K, "q4_K", Q4_K);
KILN_BLOCK_DTYPE(block_q5_K, QK_K, "q5_K", Q5_K);
KILN_BLOCK_DTYPE(block_q6_K, QK_K, "q6_K", Q6_K);
KILN_BLOCK_DTYPE(block_q8_K, QK_K, "q8_K", Q8_K);
KILN_BLOCK_DTYPE(block_mxfp4, QK_MXFP4, "mxfp4", MXFP4);
#undef KILN_BLOCK_DTYPE

/// A GGUF block type (one of the structs above).
template <class T>
concept BlockDType = DType<T> && dtype_traits<std::remove_const_t<T>>::is_block;

template <BlockDType B>
inline constexpr std::size_t block_size_v = dtype_traits<std::remove_const_t<B>>::block_size;

}  // namespace kiln
