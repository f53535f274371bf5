// kiln/ops/norm.hpp - RMSNorm (plain and Gemma's (1 + w)) and LayerNorm over the last dimension.
//
//   rms_norm:   out = x / sqrt(mean(x^2) + eps) * w          (Llama, Qwen, SmolLM2)
//               out = x / sqrt(mean(x^2) + eps) * (1 + w)    (Gemma: NormWeight::one_plus)
//   layer_norm: out = (x - mean(x)) / sqrt(var(x) + eps) * w + b   (biased variance, like PyTorch)
//
// x, out: (..., n), last dimension contiguous, leading dimensions merged into rows; w, b: (n).
// out may alias x (in-place). The scalar references are kiln::ref::*.
#pragma once

#include <cmath>
#include <cstddef>

#include "kiln/core/check.hpp"
#include "kiln/core/parallel.hpp"  // detail::for_rows
#include "kiln/core/tensor.hpp"
#include "kiln/kernels/dispatch.hpp"

namespace kiln {

enum class NormWeight { plain, one_plus };

}  // namespace kiln

KILN_DISPATCH_BEGIN
// x: rows x n with row stride xs; out likewise with os; w (and b): n.
void rms_norm_f32(const float* x, std::ptrdiff_t xs, const float* w, float* out, std::ptrdiff_t os, std::size_t rows,
                  std::size_t n, float eps, bool one_plus);
void layer_norm_f32(const float* x, std::ptrdiff_t xs, const float* w, const float* b, float* out, std::ptrdiff_t os,
                    std::size_t rows, std::size_t n, float eps);
KILN_DISPATCH_END

namespace kiln {

/// out = rms_norm(x) * w (or * (1 + w)). Shapes: x, out (..., n); w (n).
template <class X, class W, class O>
void rms_norm(const X& x, const W& w, const O& out, float eps, NormWeight kind = NormWeight::plain,
              ThreadPool* pool = nullptr) {
  KILN_REQUIRE_DTYPE(X, float, "rms_norm", "x");
  KILN_REQUIRE_DTYPE(W, float, "rms_norm", "w");
  KILN_REQUIRE_DTYPE(O, float, "rms_norm", "out");
  KILN_REQUIRE_WRITABLE(O, "rms_norm", "out");
  static_assert(W::rank() == 1, "kiln::rms_norm: w must be rank 1");
  detail::require_same_shape(x, out, "rms_norm", "x", "out");
  const auto xr = detail::as_rows(x, "rms_norm", "x");
  const auto orow = detail::as_rows(out, "rms_norm", "out");
  if (w.extent(0) != xr.n || (xr.n > 1 && w.stride(0) != 1))
    fail<ShapeError>("kiln::rms_norm: w ", detail::shape_str(w), " must be contiguous of length ", xr.n, " (x is ",
                     detail::shape_str(x), ")");
  detail::for_rows(xr.rows, xr.n, pool, [&](std::size_t b, std::size_t e) {
    dispatch::rms_norm_f32(xr.data + b * xr.stride, xr.stride, w.data(), orow.data + b * orow.stride, orow.stride,
                           e - b, xr.n, eps, kind == NormWeight::one_plus);
  });
}

/// out = layer_norm(x) * w + b. Shapes: x, out (..., n); w, b (n).
template <class X, class W, class B, class O>
void layer_norm(const X& x, const W& w, const B& b, const O& out, float eps, ThreadPool* pool = nullptr) {
  KILN_REQUIRE_DTYPE(X, float, "layer_norm", "x");
  KILN_REQUIRE_DTYPE(W, float, "layer_norm", "w");
  KILN_REQUIRE_DTYPE(B, float, "layer_norm", "b");
  KILN_REQUIRE_DTYPE(O, float, "layer_norm", "out");
  KILN_REQUIRE_WRITABLE(O, "layer_norm", "out");
  static_assert(W::rank() == 1 && B::rank() == 1, "kiln::layer_norm: w and b must be rank 1");
  detail::require_same_shape(x, out, "layer_norm", "x", "out");
  const auto xr = detail::as_rows(x, "layer_norm", "x");
  const auto orow = detail::as_rows(out, "layer_norm", "out");
  if (w.extent(0) != xr.n || (xr.n > 1 && w.stride(0) != 1))
    fail<ShapeError>("kiln::layer_norm: w ", detail::shape_str(w), " must be contiguous of length ", xr.n);
  if (b.extent(0) != xr.n || (xr.n > 1 && b.stride(0) != 1))
    fail<ShapeError>("kiln::layer_norm: b ", detail::shape_str(b), " must be contiguous of length ", xr.n);
  detail::for_rows(xr.rows, xr.n, pool, [&](std::size_t r0, std::size_t r1) {
    dispatch::layer_norm_f32(xr.data + r0 * xr.stride, xr.stride, w.data(), b.data(), orow.data + r0 * orow.stride,
                             orow.stride, r1 - r0, xr.n, eps);
  });
}

namespace ref {
/// Scalar references: the definitions above, accumulated in double.
inline void rms_norm(const float* x, const float* w, float* out, std::size_t n, float eps, bool one_plus) {
  double ss = 0;
  for (std::size_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
  for (std::size_t i = 0; i < n; ++i) out[i] = float(x[i] * inv * (one_plus ? 1.0 + w[i] : double(w[i])));
}
inline void layer_norm(const float* x, const float* w, const float* b, float* out, std::size_t n, float eps) {
  double mean = 0, var = 0;
  for (std::size_t i = 0; i < n; ++i) mean += x[i];
  mean /= double(n);
  for (std::size_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= double(n);
  const double inv = 1.0 / std::sqrt(var + eps);
  for (std::size_t i = 0; i < n; ++i) out[i] = float((x[i] - mean) * inv * w[i] + b[i]);
}
}  // namespace ref

}  // namespace kiln
