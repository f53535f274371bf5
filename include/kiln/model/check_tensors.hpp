// kiln/model/check_tensors.hpp - a scan of a GGUF file's tensors for NaN and infinity (llama.cpp's
// --check-tensors).
//
//   kiln::check_tensors_finite(kiln::io::GGUFFile("model.gguf"));   // throws FormatError on the first one
//
// A weight holding NaN or Inf makes every logit it reaches NaN and the output garbage, with no error: the
// forward pass does not check (a check per product would cost every token). This scan reads every tensor
// once, dequantized to f32 in pieces (so quantized blocks with a NaN or infinite scale are found too) by
// the scalar dequantizers, on one thread: it costs more than loading the model. Tensors of types kiln
// cannot dequantize are skipped (the loader rejects those that are weights, naming them).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/quant/convert.hpp"

namespace kiln {

/// Throws FormatError naming the file, the first tensor with a NaN or infinite element, its index and value.
inline void check_tensors_finite(const io::GGUFFile& f) {
  std::vector<float> buf;
  for (const io::GGUFTensor& t : f.tensors()) {
    std::size_t block = 0;
    if (!visit_ggml_type(t.type, [&]<class B>(B*) { block = dtype_traits<B>::block_size; })) continue;
    const std::size_t bytes_per_block = ggml_row_bytes(uint32_t(t.type), block);
    const std::size_t n = std::size_t(t.n_elements);
    // Pieces of whole blocks, about 1 MiB of f32 each.
    const std::size_t piece = std::max<std::size_t>(1, (std::size_t(1) << 18) / block) * block;
    buf.resize(std::min(piece, n));
    for (std::size_t i = 0; i < n; i += piece) {
      const std::size_t m = std::min(piece, n - i);
      dequantize_row(t.type, t.data.data() + i / block * bytes_per_block, buf.data(), m);
      for (std::size_t j = 0; j < m; ++j)
        if (!std::isfinite(buf[j]))
          fail<FormatError>("kiln: GGUF file '", f.name(), "': tensor '", t.name, "' (", io::ggml_type_name(t.type),
                            ") has ", std::isnan(buf[j]) ? "NaN" : "an infinite value", " at element ", i + j,
                            " (--check-tensors)");
    }
  }
}

}  // namespace kiln
