// kiln/ops/embedding.hpp - token embedding lookup: out[i] = float(table[ids[i]]).
//
// table: (vocab, dim) of f32, f16 or bf16, last dimension contiguous (rows may be strided); ids: (n)
// int32; out: (n, dim) f32, last dimension contiguous. Every id is checked against the vocabulary
// before anything is written; an id outside [0, vocab) throws kiln::Error naming the id, its index and
// the vocabulary size. f32 rows are copied, f16/bf16 rows converted exactly (scalar code: this runs once
// per token, far from any hot loop). Quantized tables (GGUF blocks) are the quant module's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kiln/core/check.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln {

/// out[i, :] = table[ids[i], :] as f32. Shapes: table (vocab, dim), ids (n), out (n, dim).
template <class Tab, class Ids, class O>
void embedding(const Tab& table, const Ids& ids, const O& out, ThreadPool* pool = nullptr) {
  static_assert(TensorLike<Tab>, "kiln::embedding: table must be a kiln::Tensor view");
  using T = typename Tab::value_type;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, f16> || std::is_same_v<T, bf16>,
                "kiln::embedding: table must be a view of float, f16 or bf16 elements (wrong dtype)");
  KILN_REQUIRE_DTYPE(Ids, std::int32_t, "embedding", "ids");
  KILN_REQUIRE_DTYPE(O, float, "embedding", "out");
  KILN_REQUIRE_WRITABLE(O, "embedding", "out");
  static_assert(Tab::rank() == 2, "kiln::embedding: table must be rank 2 (vocab, dim)");
  static_assert(Ids::rank() == 1, "kiln::embedding: ids must be rank 1 (n)");
  static_assert(O::rank() == 2, "kiln::embedding: out must be rank 2 (n, dim)");
  const std::size_t vocab = table.extent(0), dim = table.extent(1), n = ids.extent(0);
  if (out.extent(0) != n || out.extent(1) != dim)
    fail<ShapeError>("kiln::embedding: out ", detail::shape_str(out), " must be (", n, ", ", dim, ") for ids ",
                     detail::shape_str(ids), " and table ", detail::shape_str(table));
  if (dim > 1 && (table.stride(1) != 1 || out.stride(1) != 1))
    fail<ShapeError>("kiln::embedding: table ", detail::shape_str(table), " and out ", detail::shape_str(out),
                     " must be contiguous in their last dimension");
  const std::int32_t* id = ids.data();
  const std::ptrdiff_t is = ids.stride(0);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t t = id[static_cast<std::ptrdiff_t>(i) * is];
    if (t < 0 || static_cast<std::size_t>(t) >= vocab)
      fail("kiln::embedding: token id ", t, " (ids[", i, "]) is out of range for a vocabulary of ", vocab);
  }
  detail::for_rows(n, dim, pool, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      const auto* src =
          table.data() + static_cast<std::ptrdiff_t>(id[static_cast<std::ptrdiff_t>(i) * is]) * table.stride(0);
      float* dst = out.data() + static_cast<std::ptrdiff_t>(i) * out.stride(0);
      if constexpr (std::is_same_v<T, float>) {
        if (dim) std::memcpy(dst, src, dim * sizeof(float));
      } else if constexpr (std::is_same_v<T, bf16>) {
        for (std::size_t j = 0; j < dim; ++j) dst[j] = bf16_bits_to_f32(src[j].bits);
      } else {
        for (std::size_t j = 0; j < dim; ++j) dst[j] = f16_bits_to_f32(src[j].bits);
      }
    }
  });
}

}  // namespace kiln
