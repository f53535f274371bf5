// kiln/ops/activation.hpp - elementwise activations, the gated MLP products and the residual add.
//
//   silu(x)      = x * sigmoid(x) = x / (1 + exp(-x))
//   gelu_tanh(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)   (PyTorch approximate='tanh',
//                  HF gelu_pytorch_tanh / gelu_new; Gemma)
//   gelu_erf(x)  = 0.5 x (1 + erf(x / sqrt(2)))                             (PyTorch's exact gelu; BERT)
//   swiglu(gate, up) = silu(gate) * up        (Llama, Qwen, SmolLM2 MLPs)
//   geglu(gate, up)  = gelu(gate) * up        (Gemma: tanh approximation)
//   add(a, b) = a + b                         (residual connections)
//
// Every view: (..., n), last dimension contiguous, leading dimensions merged into rows (so gate and up
// may be the two halves of one fused (rows, 2n) matmul output). out may alias an input exactly (same
// data and strides). Accuracy of the SIMD kernels against the exact functions (measured on every
// target): silu 2.8e-7 relative, gelu_erf 4.6e-7, gelu_tanh 2.1e-6 on [-5, 5] (it is 3 ulp + 2|u| ulp:
// exp(-2u) amplifies the f32 rounding of u), add exact. Inputs far in the tails give 0 (or x), never
// NaN; NaN propagates. The scalar references (double precision) are kiln::ref::*.
#pragma once

#include <cmath>
#include <cstddef>

#include "kiln/core/check.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/kernels/dispatch.hpp"

namespace kiln {

/// Which GELU: PyTorch's approximate='tanh' or the exact erf form.
enum class Gelu { tanh, erf };

/// The activation a kernel applies (to x alone, or to gate before multiplying by up).
enum class Activation : int { silu = 0, gelu_tanh = 1, gelu_erf = 2 };

}  // namespace kiln

KILN_DISPATCH_BEGIN
// out = act(x) when up is null, else act(x) * up. x, up, out: rows x n with row strides xs, us, os.
void activation_f32(::kiln::Activation act, const float* x, std::ptrdiff_t xs, const float* up, std::ptrdiff_t us,
                    float* out, std::ptrdiff_t os, std::size_t rows, std::size_t n);
// out = a + b, rows x n with row strides as, bs, os.
void add_f32(const float* a, std::ptrdiff_t as, const float* b, std::ptrdiff_t bs, float* out, std::ptrdiff_t os,
             std::size_t rows, std::size_t n);
// out = gpt-oss's clamped SwiGLU of gate g and up u (model/moe.hpp's detail::swiglu_oai): g' = min(g, limit),
// u' = clamp(u, -limit, limit), out = g' sigmoid(alpha g') (u' + 1); rows x n with row strides gs, us, os. out
// may alias g or u exactly.
void swiglu_oai_f32(const float* g, std::ptrdiff_t gs, const float* u, std::ptrdiff_t us, float* out, std::ptrdiff_t os,
                    std::size_t rows, std::size_t n, float alpha, float limit);
KILN_DISPATCH_END

namespace kiln {

namespace detail {
template <class X, class U, class O>
void activation_op(Activation act, const X& x, const U* up, const O& out, const char* op, const char* xname,
                   ThreadPool* pool) {
  detail::require_same_shape(x, out, op, xname, "out");
  const auto xr = detail::as_rows(x, op, xname);
  const auto orow = detail::as_rows(out, op, "out");
  const float* up_data = nullptr;
  std::ptrdiff_t up_stride = 0;
  if (up) {
    detail::require_same_shape(x, *up, op, xname, "up");
    const auto ur = detail::as_rows(*up, op, "up");
    up_data = ur.data;
    up_stride = ur.stride;
  }
  detail::for_rows(xr.rows, xr.n, pool, [&](std::size_t b, std::size_t e) {
    dispatch::activation_f32(act, xr.data + b * xr.stride, xr.stride, up_data ? up_data + b * up_stride : nullptr,
                             up_stride, orow.data + b * orow.stride, orow.stride, e - b, xr.n);
  });
}
}  // namespace detail

#define KILN_ACTIVATION_CHECKS(OP)         \
  KILN_REQUIRE_DTYPE(X, float, OP, "x");   \
  KILN_REQUIRE_DTYPE(O, float, OP, "out"); \
  KILN_REQUIRE_WRITABLE(O, OP, "out")

/// out = x * sigmoid(x). Shapes: x, out (..., n).
template <class X, class O>
void silu(const X& x, const O& out, ThreadPool* pool = nullptr) {
  KILN_ACTIVATION_CHECKS("silu");
  detail::activation_op(Activation::silu, x, static_cast<const X*>(nullptr), out, "silu", "x", pool);
}

/// out = gelu(x) with the tanh approximation. Shapes: x, out (..., n).
template <class X, class O>
void gelu_tanh(const X& x, const O& out, ThreadPool* pool = nullptr) {
  KILN_ACTIVATION_CHECKS("gelu_tanh");
  detail::activation_op(Activation::gelu_tanh, x, static_cast<const X*>(nullptr), out, "gelu_tanh", "x", pool);
}

/// out = gelu(x), exact (erf) form. Shapes: x, out (..., n).
template <class X, class O>
void gelu_erf(const X& x, const O& out, ThreadPool* pool = nullptr) {
  KILN_ACTIVATION_CHECKS("gelu_erf");
  detail::activation_op(Activation::gelu_erf, x, static_cast<const X*>(nullptr), out, "gelu_erf", "x", pool);
}
#undef KILN_ACTIVATION_CHECKS

#define KILN_GATED_CHECKS(OP)               \
  KILN_REQUIRE_DTYPE(G, float, OP, "gate"); \
  KILN_REQUIRE_DTYPE(U, float, OP, "up");   \
  KILN_REQUIRE_DTYPE(O, float, OP, "out");  \
  KILN_REQUIRE_WRITABLE(O, OP, "out")

/// out = silu(gate) * up. Shapes: gate, up, out (..., n).
template <class G, class U, class O>
void swiglu(const G& gate, const U& up, const O& out, ThreadPool* pool = nullptr) {
  KILN_GATED_CHECKS("swiglu");
  detail::activation_op(Activation::silu, gate, &up, out, "swiglu", "gate", pool);
}

/// out = gelu(gate) * up (tanh approximation unless kind is Gelu::erf). Shapes: gate, up, out (..., n).
template <class G, class U, class O>
void geglu(const G& gate, const U& up, const O& out, Gelu kind = Gelu::tanh, ThreadPool* pool = nullptr) {
  KILN_GATED_CHECKS("geglu");
  detail::activation_op(kind == Gelu::tanh ? Activation::gelu_tanh : Activation::gelu_erf, gate, &up, out, "geglu",
                        "gate", pool);
}
#undef KILN_GATED_CHECKS

/// out = a + b (the residual add). Shapes: a, b, out (..., n).
template <class A, class B, class O>
void add(const A& a, const B& b, const O& out, ThreadPool* pool = nullptr) {
  KILN_REQUIRE_DTYPE(A, float, "add", "a");
  KILN_REQUIRE_DTYPE(B, float, "add", "b");
  KILN_REQUIRE_DTYPE(O, float, "add", "out");
  KILN_REQUIRE_WRITABLE(O, "add", "out");
  detail::require_same_shape(a, b, "add", "a", "b");
  detail::require_same_shape(a, out, "add", "a", "out");
  const auto ar = detail::as_rows(a, "add", "a");
  const auto br = detail::as_rows(b, "add", "b");
  const auto orow = detail::as_rows(out, "add", "out");
  detail::for_rows(ar.rows, ar.n, pool, [&](std::size_t r0, std::size_t r1) {
    dispatch::add_f32(ar.data + r0 * ar.stride, ar.stride, br.data + r0 * br.stride, br.stride,
                      orow.data + r0 * orow.stride, orow.stride, r1 - r0, ar.n);
  });
}

namespace ref {
/// Scalar references in double precision: the textbook formulas (erfc for the exact GELU, which is
/// 1 + erf(z) without the cancellation for negative z).
inline double activation_exact(Activation act, double x) {
  switch (act) {
    case Activation::silu:
      return x / (1.0 + std::exp(-x));
    case Activation::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case Activation::gelu_erf:
      return 0.5 * x * std::erfc(-x * 0.7071067811865476);
  }
  return x;
}
inline float silu(float x) { return float(activation_exact(Activation::silu, x)); }
inline float gelu_tanh(float x) { return float(activation_exact(Activation::gelu_tanh, x)); }
inline float gelu_erf(float x) { return float(activation_exact(Activation::gelu_erf, x)); }
/// out[i] = act(x[i]) (* up[i] when up is not null).
inline void activation(Activation act, const float* x, const float* up, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const double a = activation_exact(act, x[i]);
    out[i] = float(up ? a * double(up[i]) : a);
  }
}
/// out[i] = a[i] + b[i].
inline void add(const float* a, const float* b, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
}  // namespace ref

}  // namespace kiln
