// kiln/ops/softmax.hpp - softmax over the last dimension, with the attention extras fused in.
//
//   y_j   = scale * x_j                              (e.g. 1 / sqrt(head_dim))
//   y_j   = cap * tanh(y_j / cap)     if cap > 0     (logit soft-capping, Gemma 2/3)
//   y_j   = -inf                      if causal and j > r + offset (see below)
//   out_j = exp(y_j - max y) / sum_k exp(y_k - max y)  (max-subtracted: no overflow)
//
// x, out: (..., n), last dimension contiguous, leading dimensions merged into rows; out may alias x.
// Causal masking treats the second-to-last dimension as the query index: row r of each (q_len, kv_len)
// block (r = row index modulo q_len; q_len = 1 for a vector) keeps columns j <= r + offset. With a KV
// cache holding `past` earlier positions, offset = past = kv_len - q_len.
// A row with nothing left to attend to (every column masked, or every logit -inf) is all zeros, never
// NaN; a NaN logit (or +inf before any soft-cap) makes its row NaN, as in PyTorch. Accuracy: a few ulp
// plus |y - max| * 2^-24 relative per element (the rounding of the exponent's argument); measured on
// every target: 4.6e-7 for logits within 8 of the max, 1.2e-6 with a soft-cap of 5. Probabilities
// below e^-87 (1.6e-38) come out as 0. The scalar reference is kiln::ref::softmax.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kiln/core/check.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/kernels/dispatch.hpp"

namespace kiln {

struct SoftmaxOptions {
  float scale = 1.0f;                ///< multiplies the logits first
  float softcap = 0.0f;              ///< > 0: cap * tanh(y / cap) after scaling, before the mask
  bool causal = false;               ///< mask columns j > r + causal_offset (r: the query row)
  std::ptrdiff_t causal_offset = 0;  ///< usually kv_len - q_len (the positions already cached)
};

}  // namespace kiln

KILN_DISPATCH_BEGIN
// x: rows x n with row stride xs; out likewise with os. Row i is query row (row0 + i) % q_len when
// causal (keeps columns <= that + offset).
void softmax_f32(const float* x, std::ptrdiff_t xs, float* out, std::ptrdiff_t os, std::size_t rows, std::size_t n,
                 float scale, float softcap, bool causal, std::size_t q_len, std::size_t row0, std::ptrdiff_t offset);
KILN_DISPATCH_END

namespace kiln {

namespace detail {
/// Columns [0, softmax_valid(...)) of a row take part; the rest are masked.
inline std::size_t softmax_valid(std::size_t n, bool causal, std::size_t q_row, std::ptrdiff_t offset) {
  if (!causal) return n;
  const std::ptrdiff_t lim = static_cast<std::ptrdiff_t>(q_row) + offset + 1;
  return lim <= 0 ? 0 : std::min(n, static_cast<std::size_t>(lim));
}
}  // namespace detail

/// out = softmax(mask(softcap(scale * x))) over the last dimension. Shapes: x, out (..., n).
template <class X, class O>
void softmax(const X& x, const O& out, const SoftmaxOptions& opt = {}, ThreadPool* pool = nullptr) {
  KILN_REQUIRE_DTYPE(X, float, "softmax", "x");
  KILN_REQUIRE_DTYPE(O, float, "softmax", "out");
  KILN_REQUIRE_WRITABLE(O, "softmax", "out");
  detail::require_same_shape(x, out, "softmax", "x", "out");
  if (!(opt.softcap >= 0.0f) || !std::isfinite(opt.scale))
    fail("kiln::softmax: softcap ", opt.softcap, " must be >= 0 and scale ", opt.scale, " finite (x is ",
         detail::shape_str(x), ")");
  const auto xr = detail::as_rows(x, "softmax", "x");
  const auto orow = detail::as_rows(out, "softmax", "out");
  std::size_t q_len = 1;
  if constexpr (X::rank() >= 2) q_len = x.extent(X::rank() - 2);
  if (xr.rows == 0 || xr.n == 0) return;
  detail::for_rows(xr.rows, xr.n, pool, [&](std::size_t b, std::size_t e) {
    dispatch::softmax_f32(xr.data + b * xr.stride, xr.stride, orow.data + b * orow.stride, orow.stride, e - b, xr.n,
                          opt.scale, opt.softcap, opt.causal, q_len, b, opt.causal_offset);
  });
}

namespace ref {
/// Scalar reference for one row, in double: the definition above, with columns >= valid masked.
inline void softmax(const float* x, float* out, std::size_t n, float scale, float softcap, std::size_t valid) {
  std::vector<double> y(n);
  double m = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < valid; ++j) {
    y[j] = double(scale) * x[j];
    if (softcap > 0) y[j] = softcap * std::tanh(y[j] / softcap);
    m = std::max(m, y[j]);
  }
  if (m == -std::numeric_limits<double>::infinity()) {  // nothing to attend to
    std::fill(out, out + n, 0.0f);
    return;
  }
  double sum = 0;
  for (std::size_t j = 0; j < valid; ++j) sum += (y[j] = std::exp(y[j] - m));
  for (std::size_t j = 0; j < n; ++j) out[j] = j < valid ? float(y[j] / sum) : 0.0f;
}
}  // namespace ref

}  // namespace kiln
