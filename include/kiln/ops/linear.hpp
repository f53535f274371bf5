// kiln/ops/linear.hpp - a weight matrix as stored in a model file, and the one function every weight
// product goes through: it picks the kernel from the weight's type, the rows of x and the Precision.
//
//   WeightRef: a (rows, cols) matrix in any GGML storage type (f32, f16, bf16 or quantized blocks),
//              PyTorch Linear layout (rows = output features, each row `cols` input features).
//   linear(x, W, y, pool, precision): y (M, rows) = x (M, cols) W^T. f32/f16/bf16 go to ops/matmul.hpp;
//              quantized types to ops/qmatmul.hpp (Precision::fast) or ops/dequant_matmul.hpp (::exact).
//   linear_multi(x, {&Wq, &Wk, &Wv}, {q, k, v}, pool, precision): linear() of weights sharing x, fused
//              (ops/qmatmul.hpp's qmatmul_multi), bit-identical to one linear() per weight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "kiln/core/error.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/ops/dequant_matmul.hpp"
#include "kiln/ops/qmatmul_i16.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/ops/qmatmul.hpp"

namespace kiln {

/// A weight matrix as stored in the file: `rows` rows of `cols` values of GGML type `type`.
struct WeightRef {
  const std::byte* data = nullptr;
  io::GGMLType type = io::GGMLType::F32;
  std::size_t rows = 0, cols = 0, row_bytes = 0;
  std::string name;
  // Stored in a kernel layout by pack_weights, for linear() only: f16/bf16 in ops/matmul.hpp's packed rows,
  // q4_0/q4_1/q5_0/q5_1/q8_0/q4_K in quant/interleave.hpp's 16-row interleaved groups.
  bool packed = false;

  explicit operator bool() const { return data != nullptr; }

  template <class T>
  DenseTensor<const T, 2> view() const {
    if (type != io::ggml_type_of<T>())
      fail("kiln: weight '", name, "' is ", io::ggml_type_name(type), ", not ", dtype_name<T>);
    if (packed)
      fail("kiln: weight '", name, "' is stored in ",
           type == io::GGMLType::F16 || type == io::GGMLType::BF16 ? "packed rows" : "16-row interleaved blocks",
           " (LoadOptions::pack); it has no row-major view: "
           "multiply by it with kiln::linear, or load with pack = false");
    return make_tensor(reinterpret_cast<const T*>(data), rows, cols);
  }
  template <class T>
  PackedRows<const T> packed_view() const {
    if (type != io::ggml_type_of<T>() || !packed)
      fail("kiln: weight '", name, "' is not ", dtype_name<T>, " in packed rows");
    return {reinterpret_cast<const T*>(data), rows, cols};
  }

  static WeightRef f32(const float* p, std::size_t rows, std::size_t cols, std::string name) {
    return {
        reinterpret_cast<const std::byte*>(p), io::GGMLType::F32, rows, cols, cols * sizeof(float), std::move(name)};
  }
  static WeightRef from_gguf(const io::GGUFTensor& t) {
    if (t.n_dims > 2)
      fail<FormatError>("kiln: GGUF file '", t.file, "': tensor '", t.name, "' has ", t.n_dims,
                        " dimensions; a weight matrix needs 1 or 2");
    return {t.data.data(),      t.type, std::size_t(t.rows()), std::size_t(t.row_length()), std::size_t(t.row_bytes()),
            std::string(t.name)};
  }
};

/// Rows [r0, r0 + n) of w, as a matrix of its own (a view: rows are independent in every storage type).
/// The parts of a fused matrix (Phi-3's q/k/v and gate/up).
inline WeightRef weight_rows(const WeightRef& w, std::size_t r0, std::size_t n, std::string_view part) {
  if (r0 + n > w.rows || w.packed)
    fail("kiln: rows [", r0, ", ", r0 + n, ") of weight '", w.name, "' (", w.rows, " rows)");
  return {w.data + r0 * w.row_bytes, w.type, n, w.cols, w.row_bytes, w.name + "[" + std::string(part) + "]"};
}

/// How linear() multiplies by quantized weights.
///   fast:  ops/qmatmul.hpp's qmatmul_split_act: x carried as two 8-bit parts (its 8-bit rounding and the
///          rounding of what that left), both dotted with each weight block in integers in one pass over
///          the weights. Activation error ~1/32000 of each block's largest value: logits within ~1e-4 of
///          their range of the f32 product. Decode (GEMV) costs about what fast8 does; prefill ~2x the
///          integer work. The default. On AVX2 (no int8 dot product) prompts of 32 rows or more take
///          faster products of the same accuracy (detail::linear_path): over Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
///          and Q4_K, ops/qmatmul_i16.hpp (x rounded once to 16 bits: error <= 1/65534 of each block's
///          largest value); over Q6_K the f32 GEMM over dequantized panels (exact's product). Q8_0 takes
///          qmatmul_i16 there from one row of x: its decode GEMV (one vpmaddwd per 4 rows x 4 values, where
///          the two 8-bit parts take 4 multiplies) computes each row as its GEMM does, so a Q8_0 weight gives
///          a row of x the same bits in a decode step, a batched step and a prompt.
///   fast8: ops/qmatmul.hpp's qmatmul: x rounded to 8 bits per block once (llama.cpp's scheme). Fastest
///          prefill; logits move by up to ~4% of their range (enough to change a chat model's answer).
///   exact: ops/dequant_matmul.hpp: weights dequantized to f32 tile by tile, f32 products (what Hugging Face
///          transformers computes from the same GGUF; only the summation order differs). Slowest.
/// F32 weights are multiplied in f32 whatever the choice. F16 and BF16 weights too (bf16 with Bf16Mode::exact),
/// except prompts (more than 4 rows of x) with fast or fast8 where AMX-BF16 is usable (kiln::amx_bf16_active()):
/// AMX bf16 tiles on two-part bf16 operands (MatmulOptions::amx_bf16; within ~1.4x the f32 GEMM's error bound,
/// docs/kernels.md). exact keeps the f32 products.
enum class Precision { fast, fast8, exact };

namespace detail {
/// How linear() multiplies x by a quantized weight of `type`:
///   int8:  qmatmul / qmatmul_split_act (fast8 always; fast below the thresholds below);
///   int16: qmatmul_i16, x in 16-bit integers (fast, from dispatch::qmatmul_i16_min_rows rows of x: AVX2's
///          prompts over Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q4_K, where vpmaddwd beats both the two-part
///          8-bit GEMM and the f32 FMA GEMM; Q8_0 from one row, where its GEMV beats the two-part 8-bit
///          GEMV);
///   f32:   dequant_matmul (exact always; fast from dispatch::qmatmul_split_f32_min_rows rows, where the
///          target's f32 GEMM over dequantized panels beats its two-part integer GEMM and no int16 path
///          applies: AVX2's prompts over Q6_K; types without an integer kernel).
enum class LinearPath { int8, int16, f32 };
template <class X>
LinearPath linear_path(const X& x, uint32_t type, Precision precision) {
  if (precision == Precision::exact || !qmm_supported(type)) return LinearPath::f32;
  if (precision == Precision::fast8) return LinearPath::int8;
  std::size_t m = 1;  // rows of x
  for (std::size_t r = 0; r + 1 < X::rank(); ++r) m *= x.extent(r);
  const std::size_t k = x.extent(X::rank() - 1);
  if (m >= dispatch::qmatmul_i16_min_rows(type, k)) return LinearPath::int16;
  return m < dispatch::qmatmul_split_f32_min_rows(type, k) ? LinearPath::int8 : LinearPath::f32;
}

/// F16/BF16 weights: fast and fast8 take AMX bf16 tiles for prompts where usable (MatmulOptions::amx_bf16).
inline MatmulOptions f16_bf16_options(Precision precision) { return {.amx_bf16 = precision != Precision::exact}; }
}  // namespace detail

/// y (..., w.rows) = x (..., w.cols) * W^T. The single entry point for weight products.
template <class X, class Y>
void linear(const X& x, const WeightRef& w, const Y& y, ThreadPool* pool, Precision precision = Precision::fast) {
  switch (w.type) {
    case io::GGMLType::F32:
      matmul(x, w.view<float>(), y, pool);
      return;
    case io::GGMLType::F16:
      if (w.packed) matmul(x, w.packed_view<f16>(), y, detail::f16_bf16_options(precision), pool);
      else matmul(x, w.view<f16>(), y, detail::f16_bf16_options(precision), pool);
      return;
    case io::GGMLType::BF16:
      if (w.packed) matmul(x, w.packed_view<bf16>(), y, detail::f16_bf16_options(precision), pool);
      else matmul(x, w.view<bf16>(), y, detail::f16_bf16_options(precision), pool);
      return;
    default:
      break;
  }
  const auto type = static_cast<uint32_t>(w.type);
  if (x.extent(X::rank() - 1) != w.cols)
    fail<ShapeError>("kiln::linear: x ", detail::shape_str(x), " does not fit weight '", w.name, "' (", w.rows, ", ",
                     w.cols, ")");
  const auto path = detail::linear_path(x, type, precision);
  if (path == detail::LinearPath::int16) {
    kernels::qmatmul_i16(x, type, w.data, w.rows, w.row_bytes, y, pool, {.interleaved = w.packed});
  } else if (path == detail::LinearPath::int8) {
    const kernels::QmmWeight q{type, w.data, w.rows, w.row_bytes, w.packed};
    detail::qmatmul_multi_impl(precision == Precision::fast ? "qmatmul_split_act" : "qmatmul", x,
                               std::span<const kernels::QmmWeight>(&q, 1), std::span<const Y>(&y, 1), pool,
                               precision == Precision::fast ? kernels::ActParts::two : kernels::ActParts::one);
  } else {
    // Exact path, the fast path's fallback for block types without an integer kernel (Q2_K, Q3_K), and its
    // prompts where the f32 GEMM is the faster (detail::linear_path).
    kernels::dequant_matmul(x, type, w.data, w.rows, w.row_bytes, y, pool, {.interleaved = w.packed});
  }
}

/// y[i] (..., w[i]->rows) = x (..., K) * W_i^T for weights that share their input (a layer's Q, K and V; its
/// gate and up): each y[i] bit-identical to linear(x, *w[i], y[i], pool, precision), with the quantized
/// weights of the fast and fast8 paths in one qmatmul_multi (x quantized once per activation layout, one
/// parallel_for over all their rows). The exact path and f32/f16/bf16 weights go through linear() one by one.
template <class X, class Y>
void linear_multi(const X& x, std::span<const WeightRef* const> w, std::span<const Y> y, ThreadPool* pool,
                  Precision precision = Precision::fast) {
  KILN_REQUIRE_DTYPE(X, float, "linear_multi", "x");
  KILN_REQUIRE_DTYPE(Y, float, "linear_multi", "y");
  KILN_REQUIRE_WRITABLE(Y, "linear_multi", "y");
  if (w.size() != y.size())
    fail<ShapeError>("kiln::linear_multi: ", w.size(), " weights and ", y.size(),
                     " outputs: need one output per weight");
  if (w.size() > detail::kQmmMaxOutputs)
    fail<ShapeError>("kiln::linear_multi: ", w.size(), " weights; at most ", detail::kQmmMaxOutputs, " per call");
  detail::QmmOutput outs[detail::kQmmMaxOutputs], outs16[detail::kQmmMaxOutputs];
  std::size_t n = 0, n16 = 0;
  const char* op = precision == Precision::fast ? "qmatmul_split_act" : "qmatmul";
  std::size_t m = 1;  // rows of x
  for (std::size_t r = 0; r + 1 < X::rank(); ++r) m *= x.extent(r);
  for (std::size_t i = 0; i < w.size(); ++i) {
    const auto type = static_cast<uint32_t>(w[i]->type);
    const auto path = detail::linear_path(x, type, precision);
    // The int16 GEMVs (AVX2's Q8_0 decode) of several outputs also go in one parallel_for.
    const bool gemv16 = path == detail::LinearPath::int16 && m <= dispatch::qmatmul_i16_gemv_rows(type);
    if (path == detail::LinearPath::int8 || gemv16) {
      if (x.extent(X::rank() - 1) != w[i]->cols)
        fail<ShapeError>("kiln::linear: x ", detail::shape_str(x), " does not fit weight '", w[i]->name, "' (",
                         w[i]->rows, ", ", w[i]->cols, ")");
      const auto o = detail::qmm_output(
          op, x, kernels::QmmWeight{type, w[i]->data, w[i]->rows, w[i]->row_bytes, w[i]->packed}, y[i]);
      if (gemv16) outs16[n16++] = o;
      else outs[n++] = o;
    } else {
      linear(x, *w[i], y[i], pool, precision);  // f32/f16/bf16, the f32 GEMM's and the int16 GEMM's (linear_path)
    }
  }
  if (n16) {
    detail::qmm_check_outputs("qmatmul_i16", x, outs16, n16);
    const auto xr = detail::as_rows(x, "linear_multi", "x");
    detail::qmm_i16_gemv_run(xr.data, xr.stride, xr.rows, x.extent(X::rank() - 1), outs16, n16, pool);
  }
  detail::qmm_run_outputs(op, x, outs, n, pool,
                          precision == Precision::fast ? kernels::ActParts::two : kernels::ActParts::one);
}
/// linear_multi(x, {&wq, &wk, &wv}, {q, k, v}, pool, precision).
template <class X, class Y>
void linear_multi(const X& x, std::initializer_list<const WeightRef*> w, std::initializer_list<Y> y, ThreadPool* pool,
                  Precision precision = Precision::fast) {
  linear_multi(x, std::span<const WeightRef* const>(w.begin(), w.size()), std::span<const Y>(y.begin(), y.size()), pool,
               precision);
}

}  // namespace kiln
