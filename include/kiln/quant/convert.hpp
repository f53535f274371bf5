// kiln/quant/convert.hpp - rows and tensors of GGUF blocks to f32 and back, by compile-time block type
// or by GGUF type id at run time, plus F32/F16/BF16 row conversions.
//
//   dequantize_row(const B* blocks, float* out, n)          n elements (a multiple of B's block size)
//   quantize_row(const float|f16|bf16* x, B* blocks, n)     B Quantizable (f16/bf16 are widened exactly)
//   dequantize_row(type, const void* src, float* out, n)    type: a ggml id (uint32_t or io::GGMLType) of
//                                                           F32, F16, BF16 or a blocks.hpp block
//   ggml_row_bytes(type, n)                                 bytes of n elements of that type
//   dequantize(src (..., n / block_size), out (..., n), pool)   Tensor views, rows split over the pool
//   quantize(x (..., n), out (..., n / block_size), pool)
//
// F16 -> f32 and BF16 -> f32 are exact; f32 -> f16/bf16 round to nearest even (kiln::f16/bf16), as
// gguf-py's numpy astype(float16) and its BF16 quantizer do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kiln/core/check.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/quant/blocks.hpp"
#include "kiln/quant/dequant.hpp"

namespace kiln {

namespace detail {
inline void require_whole_blocks(std::size_t n, std::size_t bs, std::string_view type, const char* op) {
  if (n % bs != 0)
    fail<ShapeError>("kiln::", op, ": ", n, " elements is not a whole number of ", type, " blocks of ", bs);
}
}  // namespace detail

/// out[0, n) = the n values stored in blocks[0, n / block_size).
template <Dequantizable B>
void dequantize_row(const B* blocks, float* out, std::size_t n) {
  constexpr std::size_t bs = block_size_v<B>;
  detail::require_whole_blocks(n, bs, dtype_name<B>, "dequantize_row");
  for (std::size_t i = 0; i < n / bs; ++i) quant_traits<std::remove_const_t<B>>::dequantize(blocks[i], out + i * bs);
}

inline void dequantize_row(const float* src, float* out, std::size_t n) {
  if (n) std::memmove(out, src, n * sizeof(float));
}
inline void dequantize_row(const f16* src, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = f16_bits_to_f32(src[i].bits);
}
inline void dequantize_row(const bf16* src, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(src[i].bits);
}

/// blocks[0, n / block_size) = x[0, n) quantized. X is float, f16 or bf16 (widened to f32 exactly first,
/// as gguf-py does with rows.astype(float32)).
template <Quantizable B, class X>
requires(std::is_same_v<X, float> || std::is_same_v<X, f16> ||
         std::is_same_v<X, bf16>) void quantize_row(const X* x, B* blocks, std::size_t n) {
  constexpr std::size_t bs = block_size_v<B>;
  detail::require_whole_blocks(n, bs, dtype_name<B>, "quantize_row");
  for (std::size_t i = 0; i < n / bs; ++i) {
    if constexpr (std::is_same_v<X, float>) {
      quant_traits<B>::quantize(x + i * bs, blocks[i]);
    } else {
      float tmp[bs];
      for (std::size_t j = 0; j < bs; ++j) tmp[j] = float(x[i * bs + j]);
      quant_traits<B>::quantize(tmp, blocks[i]);
    }
  }
}

inline void quantize_row(const float* x, f16* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = f16::from_bits(f32_to_f16_bits(x[i]));
}
inline void quantize_row(const float* x, bf16* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = bf16::from_bits(f32_to_bf16_bits(x[i]));
}

/// Calls f(B*) with a null pointer of the block (or scalar) type of a GGUF type id; false if kiln does
/// not know the type.
template <class F>
bool visit_ggml_type(uint32_t type, F&& f) {
  switch (type) {
    case ggml_type_id::F32:
      f(static_cast<float*>(nullptr));
      return true;
    case ggml_type_id::F16:
      f(static_cast<f16*>(nullptr));
      return true;
    case ggml_type_id::BF16:
      f(static_cast<bf16*>(nullptr));
      return true;
    case ggml_type_id::Q4_0:
      f(static_cast<block_q4_0*>(nullptr));
      return true;
    case ggml_type_id::Q4_1:
      f(static_cast<block_q4_1*>(nullptr));
      return true;
    case ggml_type_id::Q5_0:
      f(static_cast<block_q5_0*>(nullptr));
      return true;
    case ggml_type_id::Q5_1:
      f(static_cast<block_q5_1*>(nullptr));
      return true;
    case ggml_type_id::Q8_0:
      f(static_cast<block_q8_0*>(nullptr));
      return true;
    case ggml_type_id::Q2_K:
      f(static_cast<block_q2_K*>(nullptr));
      return true;
    case ggml_type_id::Q3_K:
      f(static_cast<block_q3_K*>(nullptr));
      return true;
    case ggml_type_id::Q4_K:
      f(static_cast<block_q4_K*>(nullptr));
      return true;
    case ggml_type_id::Q5_K:
      f(static_cast<block_q5_K*>(nullptr));
      return true;
    case ggml_type_id::Q6_K:
      f(static_cast<block_q6_K*>(nullptr));
      return true;
    case ggml_type_id::Q8_K:
      f(static_cast<block_q8_K*>(nullptr));
      return true;
    case ggml_type_id::MXFP4:
      f(static_cast<block_mxfp4*>(nullptr));
      return true;
    default:
      return false;
  }
}

template <class F>
bool visit_ggml_type(io::GGMLType type, F&& f) {
  return visit_ggml_type(static_cast<uint32_t>(type), std::forward<F>(f));
}

/// Bytes of n elements of a GGUF type (n a multiple of its block size); throws FormatError for a type
/// kiln cannot dequantize.
inline std::size_t ggml_row_bytes(uint32_t type, std::size_t n) {
  std::size_t bytes = 0;
  const bool known = visit_ggml_type(type, [&]<class T>(T*) {
    constexpr std::size_t bs = dtype_traits<T>::block_size;
    if (n % bs != 0) fail<FormatError>("kiln: ", n, " elements is not a whole number of ", dtype_name<T>, " blocks");
    bytes = n / bs * sizeof(T);
  });
  if (!known)
    fail<FormatError>("kiln: unsupported GGUF tensor type ", io::ggml_type_name(io::GGMLType(type)), " (", type, ")");
  return bytes;
}
inline std::size_t ggml_row_bytes(io::GGMLType type, std::size_t n) {
  return ggml_row_bytes(static_cast<uint32_t>(type), n);
}

/// out[0, n) = the n values of GGUF type `type` stored at src (unaligned src is fine for block types:
/// they need at most 4-byte alignment, which is checked).
inline void dequantize_row(uint32_t type, const void* src, float* out, std::size_t n) {
  const bool known = visit_ggml_type(type, [&]<class T>(T*) {
    if (reinterpret_cast<std::uintptr_t>(src) % alignof(T) != 0)
      fail<FormatError>("kiln::dequantize_row: ", dtype_name<T>, " data at a misaligned address");
    dequantize_row(static_cast<const T*>(src), out, n);
  });
  if (!known)
    fail<FormatError>("kiln::dequantize_row: unsupported GGUF tensor type ", io::ggml_type_name(io::GGMLType(type)),
                      " (", type, ")");
}
inline void dequantize_row(io::GGMLType type, const void* src, float* out, std::size_t n) {
  dequantize_row(static_cast<uint32_t>(type), src, out, n);
}

/// out (..., n) = the values of src (..., n / block_size). src's element type is a block type, f16 or bf16.
template <class S, class O>
void dequantize(const S& src, const O& out, ThreadPool* pool = nullptr) {
  using B = typename S::value_type;
  static_assert(TensorLike<S> && TensorLike<O>, "kiln::dequantize: src and out must be kiln::Tensor views");
  static_assert(Dequantizable<B> || std::is_same_v<B, f16> || std::is_same_v<B, bf16>,
                "kiln::dequantize: src must hold GGUF blocks, f16 or bf16");
  KILN_REQUIRE_DTYPE(O, float, "dequantize", "out");
  KILN_REQUIRE_WRITABLE(O, "dequantize", "out");
  static_assert(S::rank() == O::rank(), "kiln::dequantize: src and out must have the same rank");
  constexpr std::size_t bs = dtype_traits<B>::block_size;
  const auto s = detail::as_rows(src, "dequantize", "src");
  const auto o = detail::as_rows(out, "dequantize", "out");
  bool ok = s.n * bs == o.n;
  for (std::size_t r = 0; ok && r + 1 < S::rank(); ++r) ok = src.extent(r) == out.extent(r);
  if (!ok)
    fail<ShapeError>("kiln::dequantize: out ", detail::shape_str(out), " must have src's shape ",
                     detail::shape_str(src), " with the last dimension times ", bs);
  detail::for_rows(
      s.rows, o.n, pool,
      [&](std::size_t b, std::size_t e) {
        for (std::size_t r = b; r < e; ++r) dequantize_row(s.data + r * s.stride, o.data + r * o.stride, o.n);
      },
      1 << 15);
}

/// out (..., n / block_size) = x (..., n) quantized into out's block type (or f16/bf16).
template <class X, class O>
void quantize(const X& x, const O& out, ThreadPool* pool = nullptr) {
  using B = typename O::value_type;
  static_assert(TensorLike<X> && TensorLike<O>, "kiln::quantize: x and out must be kiln::Tensor views");
  static_assert(Quantizable<B> || std::is_same_v<B, f16> || std::is_same_v<B, bf16>,
                "kiln::quantize: kiln cannot quantize into out's block type");
  KILN_REQUIRE_WRITABLE(O, "quantize", "out");
  static_assert(X::rank() == O::rank(), "kiln::quantize: x and out must have the same rank");
  constexpr std::size_t bs = dtype_traits<B>::block_size;
  const auto xs = detail::as_rows(x, "quantize", "x");
  const auto o = detail::as_rows(out, "quantize", "out");
  bool ok = o.n * bs == xs.n;
  for (std::size_t r = 0; ok && r + 1 < X::rank(); ++r) ok = x.extent(r) == out.extent(r);
  if (!ok)
    fail<ShapeError>("kiln::quantize: out ", detail::shape_str(out), " must have x's shape ", detail::shape_str(x),
                     " with the last dimension divided by ", bs);
  detail::for_rows(
      xs.rows, xs.n, pool,
      [&](std::size_t b, std::size_t e) {
        for (std::size_t r = b; r < e; ++r) quantize_row(xs.data + r * xs.stride, o.data + r * o.stride, xs.n);
      },
      1 << 15);
}

}  // namespace kiln
