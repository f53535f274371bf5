// kiln/quant/interleave.hpp - 16-row interleaved storage of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and MXFP4
// weights: the layout qmatmul's kernels read fastest (LoadOptions::pack repacks a model's matrices into it at
// load where the target has kernels for it: dispatch::qmatmul_interleaved_native). Included from ops/qmatmul.hpp.
//
// A matrix of n rows of nb blocks (rows contiguous, nb * sizeof(B) bytes each) keeps its size. Rows
// [0, 16 * (n / 16)) are stored in groups of 16, group g in the bytes rows 16g .. 16g + 15 had; within a
// group, block column b (0 <= b < nb) takes the 16 * sizeof(B) bytes at b * 16 * sizeof(B):
//   d of rows 0..15 (16 f16; MXFP4: its 16 e8m0 bytes e) | Q4_1/Q5_1: m, Q4_K: dmin of rows 0..15 (16 f16) |
//   Q5_0/Q5_1: qh, Q4_K: the 12 scale bytes, as E dwords of 64 bytes, dword e holding bytes 4e .. 4e + 3 of
//   row r's qh or scales at 4r (E = 1 or 3) | S steps of 64 bytes, step s holding bytes 4s .. 4s + 3 of row r's qs at 4r (S = 4 for
//   the 16 nibble bytes of Q4/Q5 and MXFP4, 8 for Q8_0's 32 bytes, 32 for Q4_K's 128).
// Rows past the last whole group stay row-major. A step is one 512-bit register of 16 rows. For the 4-bit
// types its low nibbles are values 4s .. 4s + 3 of each row and its high nibbles values 16 + 4s .. (qs byte
// j holds values j and j + 16; Q5's fifth bits come from the qh register, one row's qh per 32-bit lane),
// so a vpdpbusd against 4 broadcast activation bytes adds 4 products to each of 16 rows' sums, lane by
// lane: no byte permutes, no horizontal sums (the row-major GEMV needs both), and the GEMM's panels come
// from it with two logic ops per register instead of a decode and a transpose.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kiln/core/check.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/quant/blocks.hpp"
#include "kiln/quant/convert.hpp"

namespace kiln {
namespace kernels {

/// Rows per interleaved group.
inline constexpr std::size_t kQmmInterleaveRows = 16;

/// The block types with a 16-row interleaved layout.
template <class B>
inline constexpr bool qmm_interleavable_v =
    std::is_same_v<B, block_q4_0> || std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_0> ||
    std::is_same_v<B, block_q5_1> || std::is_same_v<B, block_q8_0> || std::is_same_v<B, block_q4_K> ||
    std::is_same_v<B, block_mxfp4>;

inline constexpr bool qmm_interleavable(uint32_t type) {
  return type == ggml_type_id::Q4_0 || type == ggml_type_id::Q4_1 || type == ggml_type_id::Q5_0 ||
         type == ggml_type_id::Q5_1 || type == ggml_type_id::Q8_0 || type == ggml_type_id::Q4_K ||
         type == ggml_type_id::MXFP4;
}

}  // namespace kernels

namespace detail {

/// Where a block's fields sit in a block column of an interleaved group (see the top of this header).
template <class B>
struct QmmX16 {
  static_assert(kernels::qmm_interleavable_v<B>,
                "kiln: only q4_0, q4_1, q5_0, q5_1, q8_0, q4_K and mxfp4 have a 16-row interleaved layout");
  static constexpr bool kK = std::is_same_v<B, block_q4_K>;
  static constexpr bool kE8m0 = std::is_same_v<B, block_mxfp4>;  // one scale byte e a row, not an f16 d
  static constexpr std::size_t kScaleBytes = kE8m0 ? 1 : 2;
  static constexpr bool kMin = std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_1> || kK;
  static constexpr bool kQh = std::is_same_v<B, block_q5_0> || std::is_same_v<B, block_q5_1>;
  static constexpr std::size_t kExtraDwords = kQh ? 1 : kK ? 3 : 0;      // qh, or Q4_K's 12 scale bytes
  static constexpr std::size_t kQsBytes = sizeof(B::qs);                 // 16 (4 and 5-bit), 32 (Q8_0), 128 (Q4_K)
  static constexpr std::size_t kSteps = kQsBytes / 4;                    // 64-byte steps per block column
  static constexpr std::size_t kOffQh = (kMin ? 32 : 16) * kScaleBytes;  // after the 16 d or e (16 m or dmin)
  static constexpr std::size_t kOffQ = kOffQh + 64 * kExtraDwords;
  static constexpr std::size_t kColBytes = kernels::kQmmInterleaveRows * sizeof(B);
  static_assert(kOffQ + 64 * kSteps == kColBytes, "kiln: a block column is 16 blocks' bytes, no more, no less");
};

/// The bytes a block keeps between its scales and its quants (qh, or Q4_K's scales), if any.
template <class B>
std::byte* qmm_x16_extra(B& blk) {
  if constexpr (requires { blk.qh; }) return reinterpret_cast<std::byte*>(blk.qh);
  else if constexpr (requires { blk.scales; }) return reinterpret_cast<std::byte*>(blk.scales);
  else return nullptr;
}

/// Block b of row r (< 16) of the interleaved group at grp.
template <class B>
B qmm_x16_block(const std::byte* grp, std::size_t r, std::size_t b) {
  using X = QmmX16<B>;
  const std::byte* col = grp + b * X::kColBytes;
  B blk;
  if constexpr (X::kE8m0) std::memcpy(&blk.e, col + r, 1);
  else std::memcpy(&blk.d, col + 2 * r, 2);
  if constexpr (X::kK) std::memcpy(&blk.dmin, col + 32 + 2 * r, 2);
  else if constexpr (X::kMin) std::memcpy(&blk.m, col + 32 + 2 * r, 2);
  for (std::size_t e = 0; e < X::kExtraDwords; ++e)
    std::memcpy(qmm_x16_extra(blk) + 4 * e, col + X::kOffQh + 64 * e + 4 * r, 4);
  for (std::size_t s = 0; s < X::kSteps; ++s)
    std::memcpy(reinterpret_cast<std::byte*>(blk.qs) + 4 * s, col + X::kOffQ + 64 * s + 4 * r, 4);
  return blk;
}

/// Writes blk as block b of row r of the interleaved group at grp.
template <class B>
void qmm_x16_store(std::byte* grp, std::size_t r, std::size_t b, const B& blk) {
  using X = QmmX16<B>;
  std::byte* col = grp + b * X::kColBytes;
  if constexpr (X::kE8m0) std::memcpy(col + r, &blk.e, 1);
  else std::memcpy(col + 2 * r, &blk.d, 2);
  if constexpr (X::kK) std::memcpy(col + 32 + 2 * r, &blk.dmin, 2);
  else if constexpr (X::kMin) std::memcpy(col + 32 + 2 * r, &blk.m, 2);
  B copy = blk;  // qmm_x16_extra takes a non-const block
  for (std::size_t e = 0; e < X::kExtraDwords; ++e)
    std::memcpy(col + X::kOffQh + 64 * e + 4 * r, qmm_x16_extra(copy) + 4 * e, 4);
  for (std::size_t s = 0; s < X::kSteps; ++s)
    std::memcpy(col + X::kOffQ + 64 * s + 4 * r, reinterpret_cast<const std::byte*>(blk.qs) + 4 * s, 4);
}

/// Row r (< 16) of the interleaved group at grp (nb blocks a row) as nb row-major blocks at dst.
template <class B>
void qmm_x16_row(const std::byte* grp, std::size_t r, std::size_t nb, B* dst) {
  for (std::size_t b = 0; b < nb; ++b) {
    const B blk = qmm_x16_block<B>(grp, r, b);
    std::memcpy(static_cast<void*>(dst + b), &blk, sizeof(B));
  }
}

}  // namespace detail

namespace kernels {

/// Interleaves the n rows of nb blocks at src (row-major, contiguous) into dst (n * nb blocks; must not
/// overlap src). See the top of this header.
template <class B>
void qmm_interleave_rows(const B* src, std::size_t n, std::size_t nb, B* dst) {
  static_assert(qmm_interleavable_v<B>,
                "kiln::kernels::qmm_interleave_rows: q4_0, q4_1, q5_0, q5_1, q8_0, q4_K or mxfp4 blocks");
  const std::size_t groups = n / kQmmInterleaveRows;
  auto* out = reinterpret_cast<std::byte*>(dst);
  for (std::size_t g = 0; g < groups; ++g)  // column by column: each written in order
    for (std::size_t b = 0; b < nb; ++b)
      for (std::size_t r = 0; r < kQmmInterleaveRows; ++r)
        detail::qmm_x16_store<B>(out + g * kQmmInterleaveRows * nb * sizeof(B), r, b,
                                 src[(g * kQmmInterleaveRows + r) * nb + b]);
  const std::size_t done = groups * kQmmInterleaveRows;
  if (done < n) std::memcpy(static_cast<void*>(dst + done * nb), src + done * nb, (n - done) * nb * sizeof(B));
}

/// qmm_interleave_rows in place (one group's copy of scratch).
template <class B>
void qmm_interleave_rows_in_place(B* data, std::size_t n, std::size_t nb) {
  static_assert(qmm_interleavable_v<B>,
                "kiln::kernels::qmm_interleave_rows_in_place: q4_0, q4_1, q5_0, q5_1, q8_0, q4_K or mxfp4 blocks");
  std::vector<B> tmp(kQmmInterleaveRows * nb);
  for (std::size_t g = 0; g + kQmmInterleaveRows <= n; g += kQmmInterleaveRows) {
    std::memcpy(static_cast<void*>(tmp.data()), data + g * nb, tmp.size() * sizeof(B));
    qmm_interleave_rows(tmp.data(), kQmmInterleaveRows, nb, data + g * nb);
  }
}

/// Row j (< n) of an interleaved matrix of n rows of nb blocks, as nb row-major blocks at dst.
template <class B>
void qmm_interleaved_row(const B* data, std::size_t n, std::size_t nb, std::size_t j, B* dst) {
  KILN_CHECK(j < n, "kiln::kernels::qmm_interleaved_row: row ", j, " of ", n);
  const std::size_t g = j / kQmmInterleaveRows;
  if ((g + 1) * kQmmInterleaveRows > n) {
    std::memcpy(static_cast<void*>(dst), data + j * nb, nb * sizeof(B));
    return;
  }
  detail::qmm_x16_row<B>(reinterpret_cast<const std::byte*>(data + g * kQmmInterleaveRows * nb), j % kQmmInterleaveRows,
                         nb, dst);
}

}  // namespace kernels

namespace detail {
/// f((B*)nullptr) for the block type B of a kernels::qmm_interleavable GGUF type (q4_0, q4_1, q5_0, q5_1, q8_0,
/// q4_K, mxfp4); false, f not called, for any other type.
template <class F>
bool visit_qmm_x16_type(uint32_t type, F&& f) {
  bool ok = false;
  visit_ggml_type(type, [&]<class B>(B* tag) {
    if constexpr (kernels::qmm_interleavable_v<B>) {
      f(tag);
      ok = true;
    }
  });
  return ok;
}
}  // namespace detail

namespace kernels {

/// qmm_interleaved_row for a matrix of GGUF type `type` (one qmm_interleavable accepts) and cols values a
/// row: row j (< n) as ggml_row_bytes(type, cols) row-major bytes at dst.
inline void qmm_interleaved_row(uint32_t type, const void* data, std::size_t n, std::size_t cols, std::size_t j,
                                void* dst) {
  auto row = [&]<class B>(B*) {
    qmm_interleaved_row(static_cast<const B*>(data), n, cols / block_size_v<B>, j, static_cast<B*>(dst));
  };
  KILN_CHECK(detail::visit_qmm_x16_type(type, row), "kiln::kernels::qmm_interleaved_row: GGUF type ", type,
             " has no interleaved layout");
}

}  // namespace kernels
}  // namespace kiln
