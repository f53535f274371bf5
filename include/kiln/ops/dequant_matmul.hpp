// kiln/ops/dequant_matmul.hpp - y = x * W^T with W in any GGUF storage type, computed in f32: the exact
// path for quantized weights.
//
//   x (M, K) f32 (rows may be strided), W: n rows of K values of GGML type `type` (row_bytes apart),
//   y (M, N) f32.
//
// What it computes is what a reference implementation that dequantizes the weights to f32 computes
// (Hugging Face transformers loading a GGUF, for one): every weight value exactly as gguf-py dequantizes
// it (quant/dequant.hpp is bit-exact with it), times the unrounded f32 activations, summed in f32. Only
// the summation order differs from such a reference. qmatmul (ops/qmatmul.hpp) is the fast path: it
// rounds x to 8 bits and sums in integers, which moves logits by ~1e-2 of their range.
//
// How. M = 1 (a decode step): dispatch::dequant_gemv dequantizes each block into registers and feeds it to
// the GEMV's FMAs, with the same operations as the tile path below (so the same bits). M > 4 (a prompt):
// kiln's blocked f32 GEMM (kernels/matmul/gemm-inl.h) with B read through dispatch::dequant_block, which
// dequantizes each B panel (32 rows x 256 columns on AVX-512) just before it is packed (dispatch::matmul_dequant);
// threads split N. Otherwise (M = 2..4, or a type without a SIMD kernel at M = 1): W is cut into tiles of
// dequant_tile_rows(K) rows; each thread dequantizes one tile at a time (dispatch::dequant_rows, SIMD;
// interleaved weights read in place) into its own slice of the scratch (tile rows x K f32, sized to stay in
// L2) and runs kiln's f32 GEMV of all M rows of x against it. Every path gives the bits of dequantizing W to
// f32 and calling kiln::matmul. Steady-state calls do not allocate.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/core/check.hpp"
#include "kiln/kernels/dispatch.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/quant/interleave.hpp"
#include "kiln/quant/convert.hpp"

namespace kiln {

namespace detail {

/// The calling thread's scratch for the dequantized tiles of every pool thread (thread t uses slice t), grown
/// on demand and kept. Owned by the caller, which runs every call, rather than by each worker: which worker
/// picks up a task varies from call to call, and a worker-owned buffer would first grow whenever a worker
/// happened to get its first task, long after warm-up (the allocation test catches that).
inline float* dequant_tile_scratch(std::size_t floats) {
  thread_local Scratch<float> tile;
  return tile.get(floats);
}

/// Scratch of dispatch::dequant_gemv for rows of k values: an interleaved group's quants in row order and its
/// scales as f32 (at most 26 bytes per value of a row, Q8_0's).
inline std::size_t dequant_gemv_scratch_bytes(std::size_t k) { return 32 * k + 64; }

/// Rows of W per tile: about 128 KiB of f32 (half a typical L2), between 16 and 256, a multiple of 16.
inline std::size_t dequant_tile_rows(std::size_t k) {
  const std::size_t rows = (std::size_t(128) << 10) / (std::max<std::size_t>(k, 1) * sizeof(float));
  return std::clamp<std::size_t>(rows / 16 * 16, 16, 256);
}

}  // namespace detail

}  // namespace kiln

KILN_DISPATCH_BEGIN
/// Rows [r0, r0 + rows), columns [p0, p0 + kc) (whole blocks) of W (GGUF type `type`: n rows of k values, ldw
/// bytes apart, or 16-row interleaved groups, quant/interleave.hpp) as f32 into out (rows, kc): bit for
/// bit dequantize_row (kernels/matmul/dequant-inl.h: SIMD for q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K and q6_K; the
/// scalar reference for the other types).
void dequant_block(uint32_t type, const void* w, std::size_t n, std::size_t ldw, bool interleaved, std::size_t r0,
                   std::size_t rows, std::size_t k, std::size_t p0, std::size_t kc, float* out);
/// Whole rows: dequant_block over all k columns, out (rows, k).
inline void dequant_rows(uint32_t type, const void* w, std::size_t n, std::size_t ldw, bool interleaved, std::size_t r0,
                         std::size_t rows, std::size_t k, float* out) {
  dequant_block(type, w, n, ldw, interleaved, r0, rows, k, 0, k, out);
}
/// y (m, columns [r0, r1)) = x (m, k) * dequantize(rows [r0, r1) of W)^T without a tile: bit-identical to
/// dequant_rows followed by matmul_kernel's GEMV (the same FMA chains and horizontal sums). y points at column
/// 0. scratch: detail::dequant_gemv_scratch_bytes(k) bytes. Implemented for m = 1 (a decode step) and the
/// types with a SIMD kernel (see dequant_rows); false (nothing written) otherwise.
bool dequant_gemv(uint32_t type, const void* w, std::size_t n, std::size_t ldw, bool interleaved, std::size_t r0,
                  std::size_t r1, std::size_t k, const float* x, std::ptrdiff_t ldx, std::size_t m, float* y,
                  std::ptrdiff_t ldy, void* scratch);
/// c (m, n) = a (m, k) * dequantize(rows [r0, r0 + n) of W)^T by the blocked f32 GEMM (kernels/matmul/entry-inl.h), its
/// B panels dequantized by dequant_block as they are packed: the bits of matmul_f32 with kMatmulGemm on the dequantized
/// rows. W: n_w rows of k values of GGUF type `type`, ldw bytes apart, or interleaved.
void matmul_dequant(const float* a, std::ptrdiff_t lda, uint32_t type, const void* w, std::size_t n_w, std::size_t ldw,
                    bool interleaved, std::size_t r0, float* c, std::ptrdiff_t ldc, std::size_t m, std::size_t n,
                    std::size_t k);
KILN_DISPATCH_END

namespace kiln {

namespace detail {
/// The argument checks of y (..., n) = x (..., K) * W^T for a GGUF weight W of n rows (dequant_matmul,
/// qmatmul_i16), each a ShapeError naming `op`: x and y fit W; a known type and K a whole number of its
/// blocks; rows row_bytes apart (0: packed) hold K values; interleaved only for the types with that layout,
/// rows contiguous. Returns the rows' stride in bytes.
template <class X, class Y>
std::size_t check_gguf_weight_args(const char* op, const X& x, uint32_t ggml_type, std::size_t n, std::size_t row_bytes,
                                   const Y& y, bool interleaved) {
  const std::size_t k = x.extent(X::rank() - 1);
  bool ok = y.extent(Y::rank() - 1) == n;
  for (std::size_t r = 0; ok && r + 1 < X::rank(); ++r) ok = x.extent(r) == y.extent(r);
  if (!ok)
    fail<ShapeError>("kiln::", op, ": x ", shape_str(x), " and y ", shape_str(y), " do not fit a weight of ", n,
                     " rows: need x (..., K), y (..., ", n, ")");
  std::size_t bs = 0;
  if (!visit_ggml_type(ggml_type, [&]<class T>(T*) { bs = dtype_traits<T>::block_size; }))
    fail<ShapeError>("kiln::", op, ": unknown GGUF weight type ", ggml_type);
  if (k % bs != 0)
    fail<ShapeError>("kiln::", op, ": K = ", k, " is not a multiple of the block size ", bs, " of GGUF type ",
                     ggml_type);
  const std::size_t packed = ggml_row_bytes(ggml_type, k);
  const std::size_t ldw = row_bytes ? row_bytes : packed;
  if (ldw < packed)
    fail<ShapeError>("kiln::", op, ": weight rows ", ldw, " bytes apart are shorter than K = ", k, " values (", packed,
                     " bytes)");
  if (interleaved && (!kernels::qmm_interleavable(ggml_type) || ldw != packed))
    fail<ShapeError>("kiln::", op,
                     ": an interleaved weight must be q4_0, q4_1, q5_0, q5_1, q8_0, q4_K or mxfp4 "
                     "with contiguous rows (GGUF type ",
                     ggml_type, ", rows ", ldw, " bytes apart for ", packed, " bytes)");
  return ldw;
}
}  // namespace detail

namespace kernels {

/// How the rows of a GGUF weight lie in memory (dequant_matmul, qmatmul_i16): `{.interleaved = true}`.
struct WeightLayout {
  /// W (q4_0, q4_1, q5_0, q5_1, q8_0, q4_K or mxfp4, rows contiguous) in 16-row interleaved groups
  /// (quant/interleave.hpp), the layout the kernels read fastest; false: row-major.
  bool interleaved = false;
};

/// y (M, n) = x (M, K) * dequantize(W)^T, in f32. W: n rows of K values of GGML type `ggml_type` starting
/// at w, row_bytes apart (0: packed), laid out as `layout` says. Throws ShapeError for a type kiln cannot
/// dequantize, a K that is not a whole number of blocks, or an interleaved layout of another type.
template <class X, class Y>
void dequant_matmul(const X& x, uint32_t ggml_type, const void* w, std::size_t n, std::size_t row_bytes, const Y& y,
                    ThreadPool* pool = nullptr, WeightLayout layout = {}) {
  const bool interleaved = layout.interleaved;
  KILN_REQUIRE_DTYPE(X, float, "dequant_matmul", "x");
  KILN_REQUIRE_DTYPE(Y, float, "dequant_matmul", "y");
  KILN_REQUIRE_WRITABLE(Y, "dequant_matmul", "y");
  static_assert(X::rank() == Y::rank(), "kiln::dequant_matmul: x (..., K) and y (..., N) must have the same rank");
  const std::size_t k = x.extent(X::rank() - 1);
  const std::size_t ldw = detail::check_gguf_weight_args("dequant_matmul", x, ggml_type, n, row_bytes, y, interleaved);
  const auto xr = detail::as_rows(x, "dequant_matmul", "x");
  const auto yr = detail::as_rows(y, "dequant_matmul", "y");
  const std::size_t m = xr.rows;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::size_t i = 0; i < m; ++i) std::fill_n(yr.data + std::ptrdiff_t(i) * yr.stride, n, 0.0f);
    return;
  }
  const std::size_t threads = pool ? pool->size() : 1;
  if (m > detail::kGemvMaxRows) {       // the GEMM, each thread over its own columns (dequantizing costs O(N K))
    constexpr std::size_t kGrain = 64;  // whole GEMM panels and interleaved groups
    const std::size_t tasks = std::min(threads, (n + kGrain - 1) / kGrain);
    auto run = [&](std::size_t n0, std::size_t n1) {
      dispatch::matmul_dequant(xr.data, xr.stride, ggml_type, w, n, ldw, interleaved, n0, yr.data + n0, yr.stride, m,
                               n1 - n0, k);
    };
    if (tasks <= 1) {
      run(0, n);
      return;
    }
    pool->parallel_for(tasks, [&](std::size_t i, std::size_t) {
      const auto [n0, n1] = split_range(n, tasks, i, kGrain);
      if (n0 < n1) run(n0, n1);
    });
    return;
  }
  const std::size_t tile = detail::dequant_tile_rows(k);
  const std::size_t tiles = (n + tile - 1) / tile;
  const std::size_t tasks = std::min(threads, tiles);
  // The caller's scratch (see dequant_tile_scratch) holds every pool thread's tile, or its dequant_gemv scratch:
  // a tile is at least 16 rows of k floats, 64 k bytes >= dequant_gemv_scratch_bytes(k) for every k >= 32.
  float* scratch = detail::dequant_tile_scratch(threads * tile * k);
  // Rows [n0, n1) of W on pool thread `thread`: GEMV straight from the weights, else one tile at a time.
  auto run = [&](std::size_t n0, std::size_t n1, std::size_t thread) {
    float* t = scratch + thread * tile * k;
    if (dispatch::dequant_gemv(ggml_type, w, n, ldw, interleaved, n0, n1, k, xr.data, xr.stride, m, yr.data, yr.stride,
                               t))
      return;
    for (std::size_t r0 = n0; r0 < n1; r0 += tile) {
      const std::size_t rows = std::min(tile, n1 - r0);
      dispatch::dequant_rows(ggml_type, w, n, ldw, interleaved, r0, rows, k, t);  // t (rows, k)
      detail::matmul_kernel<float>(xr.data, xr.stride, t, std::ptrdiff_t(k), yr.data + r0, yr.stride, m, rows, k, 0u);
    }
  };
  // Dequantizing costs O(N K) whatever M is, so split N whenever there are two tiles to share.
  if (tasks <= 1) {
    run(0, n, 0);
    return;
  }
  pool->parallel_for(tasks, [&](std::size_t i, std::size_t thread) {
    const auto [n0, n1] = split_range(n, tasks, i, tile);
    if (n0 < n1) run(n0, n1, thread);
  });
}

}  // namespace kernels
}  // namespace kiln
