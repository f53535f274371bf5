// kiln/ops/matmul.hpp - dense matrix products C = A * B^T: a Linear layer (y = x W^T).
//
//   A (M, K) f32 activations; B (N, K) weights in PyTorch Linear layout, f32, f16 or bf16; C (M, N) f32.
//   A and C may have more leading dimensions (merged into rows: (batch, seq, K) -> (batch * seq, K)) or be
//   rank 1 (one row). Rows may be strided; the last dimension of A and C must be contiguous, and B's
//   (row-major) or its first (column-major: transpose() of a row-major (K, N), e.g. KVCache::values_t()
//   for attention's out = P V, where each row of V^T is one contiguous read; its own GEMV kernel, and the
//   GEMM packs its panels from it; Bf16Mode::exact only).
//
// Paths (chosen per call from M, identical for any thread count):
//   GEMV, M <= detail::kGemvMaxRows: B is streamed once, 4 or 8 rows at a time, each dotted with every
//     row of A (the decode step: memory-bound, runs at the machine's read bandwidth).
//   GEMM, larger M: BLIS-style. A is packed per (MC, KC) block, B per (KC, NR) micro-panel (transposed,
//     widened to f32), and a register-blocked microkernel (12 rows x 32 columns of C on AVX-512)
//     accumulates; see kernels/matmul/gemm-inl.h.
// Threads split N (each thread a contiguous range of B's rows), or M when N is too small to share.
//
// bf16 weights, two precisions (MatmulOptions::bf16):
//   Bf16Mode::exact (default): B widened to f32 (exact) and f32 FMA: the result is that of an f32
//     matmul with the widened B.
//   Bf16Mode::fast: A is rounded to bf16 (nearest even; relative error <= 2^-8 per element) and the
//     bf16 x bf16 products (exact in f32) are summed in f32: vdpbf16ps on CPUs with AVX512-BF16 (two
//     products per lane per instruction), the same rounded maths with f32 FMA elsewhere. Error against
//     exact: <= 2^-8 * sum_k |a_k b_k| plus the f32 summation error. Whether it is faster depends on the
//     CPU: on Sapphire Rapids vdpbf16ps issues once per cycle against two FMAs, and the fast GEMM runs at
//     about 0.55x the exact one (GEMV, bound by reading B, is the same speed); on Zen 5 its peak is
//     twice the f32 FMA peak (447 vs 224 GFLOP/s, ../shared/README.md). Prefer exact unless measured.
//
// AMX bf16 tiles (MatmulOptions::amx_bf16; f16 and bf16 B, the GEMM path, where kiln::amx_bf16_active()):
//   A split into two bf16 parts (A_hi = A rounded to nearest even, A_lo = what that left, rounded), f16 B
//   into two (8 significant bits and the other 3: exact), bf16 B as it is; the products of the parts (all
//   but A_lo B_lo) summed in f32 in the tiles, the large A_hi B_hi ones apart from the small rest. Error:
//   <= (3 * 2^-16 + gamma_K (1 + 2^-8) + 0.012 gamma_2K + 2^-23) * sum_k |a_k b_k| (bf16 B: 2^-16 for
//   3 * 2^-16), gamma_n = n 2^-24 / (1 - n 2^-24): about 1.4x the f32 GEMM's gamma_K at K = 2048
//   (docs/kernels.md derives it). A non-finite value in A or B gives NaN in its outputs. kernels/matmul/
//   amx_bf16-inl.h; linear() uses it for F16/BF16 weights at Precision::fast and fast8.
//
// Packed rows (f16 and bf16 weights): PackedRows<T> holds B in kiln's row-interleaved layout, made once
// by pack_rows() (or pack_rows_in_place(), which the model loader uses in LoadMode::read). Same size as
// the row-major matrix, and bit-identical results: only the order of the bytes in memory changes.
//   Rows 8g .. 8g + 7 (every whole group of kPackRows rows) are stored together, from element 8 g K on:
//   first their elements [32 c, 32 c + 32) for each whole chunk c (row 0's 32, row 1's 32, ... row 7's;
//   64 bytes each), then each row's last K % 32 elements, row after row. The N % 8 rows past the last
//   whole group stay row-major where they were.
// Why: the GEMV dots several rows of B at once so that each load of A serves several FMAs; in row-major
// order those rows are separate read streams (K elements apart), and on Zen 5 8 streams of 2048-wide f16
// rows read at ~18 GB/s where one stream reads at 24-25 (1024-wide rows: 12 against 22). Packed, the 8
// rows are one contiguous stream. The GEMM packs its B panels from either layout.
//
// Scratch: packing buffers are thread_local, 64-byte aligned, grown on demand and kept for the thread's
// lifetime (detail::matmul_scratch), so repeated calls of the same or smaller size never allocate.
// The scalar reference (double accumulation) is kiln::ref::matmul.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/amx.hpp"
#include "kiln/core/check.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/kernels/dispatch.hpp"
#include "kiln/quant/blocks.hpp"

namespace kiln {

/// How bf16 weights are multiplied (see the top of this header).
enum class Bf16Mode {
  exact,  ///< B widened to f32, f32 FMA (default)
  fast,   ///< A rounded to bf16 (nearest even), bf16 products summed in f32 (vdpbf16ps where available)
};

struct MatmulOptions {
  bool accumulate = false;          ///< C += A * B^T (beta = 1) instead of C = A * B^T
  Bf16Mode bf16 = Bf16Mode::exact;  ///< ignored unless B is bf16
  /// f16 or bf16 B (row-major or packed rows, Bf16Mode::exact), GEMM path (M > 4), where kiln::amx_bf16_active():
  /// the products on AMX bf16 tiles with A (and f16 B) split into two bf16 parts (see the top of this header).
  /// Ignored otherwise (the f32 GEMM runs).
  bool amx_bf16 = false;
};

namespace detail {
/// Flags of the raw kernels.
inline constexpr unsigned kMatmulAccumulate = 1;  // C += A * B^T
inline constexpr unsigned kMatmulGemm = 2;        // blocked GEMM path (else GEMV; needs m <= kGemvMaxRows)
inline constexpr unsigned kMatmulFastBf16 = 4;    // bf16 B only: Bf16Mode::fast
inline constexpr unsigned kMatmulPacked = 8;      // f16/bf16 B in the packed-rows layout (ldb must be k)
inline constexpr unsigned kMatmulColMajorB = 16;  // B column-major: B[j, p] at b[p * ldb + j] (B^T row-major)
inline constexpr unsigned kMatmulAmxBf16 = 32;    // f16/bf16 B, GEMM: AMX bf16 tiles where usable (amx_bf16_active)
/// The packed-rows layout (see the top of this header): rows per group and bytes per row per chunk.
inline constexpr std::size_t kPackRows = 8;
inline constexpr std::size_t kPackChunkBytes = 64;
/// Up to this many rows of A, B is streamed once with every row of A in registers (GEMV path).
inline constexpr std::size_t kGemvMaxRows = 4;
}  // namespace detail

}  // namespace kiln

KILN_DISPATCH_BEGIN
// C (m, n; row stride ldc) = [C +] A (m, k; row stride lda) * B^T, B (n, k; row stride ldb). Runs on the
// calling thread; flags are detail::kMatmul*. n and m may be any sub-range of a larger product: every
// element of C is computed the same way whatever the range (so thread splits do not change results).
// With kMatmulPacked, b is packed rows (f16/bf16 only) and a sub-range of n starts on a whole group.
// With kMatmulColMajorB, B[j, p] is b[p * ldb + j] (B^T (k, n) row-major: V (positions, head_dim) in
// attention's out = P V), and a sub-range of n starts at column b + n0.
void matmul_f32(const float* a, std::ptrdiff_t lda, const float* b, std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc,
                std::size_t m, std::size_t n, std::size_t k, unsigned flags);
void matmul_f16(const float* a, std::ptrdiff_t lda, const ::kiln::f16* b, std::ptrdiff_t ldb, float* c,
                std::ptrdiff_t ldc, std::size_t m, std::size_t n, std::size_t k, unsigned flags);
void matmul_bf16(const float* a, std::ptrdiff_t lda, const ::kiln::bf16* b, std::ptrdiff_t ldb, float* c,
                 std::ptrdiff_t ldc, std::size_t m, std::size_t n, std::size_t k, unsigned flags);
// The same for B in GGUF Q8_0 blocks (a q8_0 KV cache; k, or with kMatmulColMajorB n, a multiple of 32; ldb in
// blocks): the GEMV kernels at any m (rows of A in passes of 4; flags: kMatmulAccumulate, kMatmulColMajorB),
// each block widened to d * q (exact in f32), so every element of C has the bits matmul_f32's GEMV gives for
// the dequantized B.
void matmul_q8_0(const float* a, std::ptrdiff_t lda, const ::kiln::block_q8_0* b, std::ptrdiff_t ldb, float* c,
                 std::ptrdiff_t ldc, std::size_t m, std::size_t n, std::size_t k, unsigned flags);
// The scores c (m, n) [+]= a (m, k) B^T of matmul_q8_0 with a rounded per block of 32 to `parts` 8-bit parts, as
// qmatmul rounds activations (1: ref::qmm_quantize_act, fast8's; 2: ref::qmm_split_residual_act's two, fast's),
// and integer dot products with B's int8 values: on AVX3_DL (AVX-512 VNNI), for k a multiple of 32 up to 128
// and finite a; it returns true then. Otherwise (other targets, parts 0, other products) matmul_q8_0's f32
// GEMV, and false. flags: kMatmulAccumulate. Every element of C is computed the same way whatever the range.
// With kMatmulColMajorB, the values c (m, n) [+]= a (m, k) V instead, V (k, n) rows of Q8_0 blocks (ldb apart):
// on AVX3_DL with parts 1 or 2 (the same rounding either way) and n a multiple of 32 up to 256, each row's
// weights w_p = a[i, p] d_p (d: row p's block scale) rounded per block and group of 256 positions to int16
// multiples of max|w| / 32767, and integer dot products with V's int8 values (true); a row whose weights are
// not finite by the f32 GEMV, as are other shapes and targets (false). A row's result does not depend on the
// other rows of the call.
bool matmul_q8_0_int(const float* a, std::ptrdiff_t lda, const ::kiln::block_q8_0* b, std::ptrdiff_t ldb, float* c,
                     std::ptrdiff_t ldc, std::size_t m, std::size_t n, std::size_t k, unsigned parts, unsigned flags);
KILN_DISPATCH_END

namespace kiln {

namespace detail {

/// Per-thread, 64-byte-aligned scratch for packing: buffer `slot` (0..4) of at least `bytes` bytes.
/// Grown on demand and kept for the thread's lifetime (the pool's threads persist), so steady-state
/// calls never allocate. The contents are not preserved across calls.
inline void* matmul_scratch(std::size_t slot, std::size_t bytes) {
  thread_local Scratch<std::byte> slots[5];
  return slots[slot].get(bytes);
}

template <class TB>
void matmul_kernel(const float* a, std::ptrdiff_t lda, const TB* b, std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc,
                   std::size_t m, std::size_t n, std::size_t k, unsigned flags) {
  if constexpr (std::is_same_v<TB, float>) dispatch::matmul_f32(a, lda, b, ldb, c, ldc, m, n, k, flags);
  else if constexpr (std::is_same_v<TB, f16>) dispatch::matmul_f16(a, lda, b, ldb, c, ldc, m, n, k, flags);
  else dispatch::matmul_bf16(a, lda, b, ldb, c, ldc, m, n, k, flags);
}

/// Splits an (m, n, k) product into per-thread blocks and runs f(m0, m1, n0, n1) on each.
/// N ranges are multiples of 64 columns (a whole number of GEMV row groups and GEMM panels); M is split
/// only for the GEMM path when N is too narrow to share.
template <class F>
void matmul_split(std::size_t m, std::size_t n, std::size_t k, bool gemm, ThreadPool* pool, F&& f) {
  constexpr std::size_t kNGrain = 64, kMGrain = 16;
  constexpr double kMinFlopsPerThread = 1 << 18;  // below this, waking a thread costs more than it saves
  const std::size_t threads = pool ? pool->size() : 1;
  const double flops = 2.0 * double(m) * double(n) * double(k);
  std::size_t tasks = std::min<std::size_t>(threads, std::size_t(flops / kMinFlopsPerThread) + 1);
  const std::size_t n_units = (n + kNGrain - 1) / kNGrain, m_units = (m + kMGrain - 1) / kMGrain;
  if (tasks <= 1 || (n_units < 2 && (!gemm || m_units < 2))) {
    f(std::size_t(0), m, std::size_t(0), n);
    return;
  }
  if (n_units >= tasks || !gemm || m_units < 2) {
    tasks = std::min(tasks, n_units);
    pool->parallel_for(tasks, [&](std::size_t t, std::size_t) {
      const auto [n0, n1] = split_range(n, tasks, t, kNGrain);
      if (n0 < n1) f(std::size_t(0), m, n0, n1);
    });
  } else {
    tasks = std::min(tasks, m_units);
    pool->parallel_for(tasks, [&](std::size_t t, std::size_t) {
      const auto [m0, m1] = split_range(m, tasks, t, kMGrain);
      if (m0 < m1) f(m0, m1, std::size_t(0), n);
    });
  }
}

}  // namespace detail

/// f16 or bf16 weights (rows, cols) in the packed-rows layout (top of this header), made by pack_rows()
/// or pack_rows_in_place(). A plain (non-owning) description of the bytes: matmul() takes it for B.
template <class T>
struct PackedRows {
  static_assert(std::is_same_v<std::remove_const_t<T>, f16> || std::is_same_v<std::remove_const_t<T>, bf16>,
                "kiln::PackedRows: only f16 and bf16 weights have a packed layout");
  const std::remove_const_t<T>* data = nullptr;
  std::size_t rows = 0, cols = 0;
};

namespace detail {
template <class B>
inline constexpr bool is_packed_rows = false;
template <class T>
inline constexpr bool is_packed_rows<PackedRows<T>> = true;

/// Offset of element (j, p) of a packed (n, k) matrix of 16-bit values from its start.
inline std::size_t packed_offset(std::size_t n, std::size_t k, std::size_t j, std::size_t p) {
  constexpr std::size_t R = kPackRows, C = kPackChunkBytes / 2;
  const std::size_t n_grouped = n / R * R, kc = k / C * C;
  if (j >= n_grouped) return j * k + p;
  const std::size_t g = j / R * R * k, r = j % R;
  return p < kc ? g + p / C * (R * C) + r * C + p % C : g + R * kc + r * (k - kc) + (p - kc);
}

template <class T>
void check_pack_args(std::size_t n, std::size_t k, const char* op) {
  static_assert(sizeof(T) == 2, "kiln: the packed-rows layout is for 16-bit weights (f16, bf16)");
  if (n != 0 && k > SIZE_MAX / sizeof(T) / n) fail<ShapeError>("kiln::", op, ": (", n, ", ", k, ") overflows");
}

// The shared body of matmul(): a, c any rank; b as (data, n, k, row stride), packed or not. b_shape()
// describes b in error messages (called only then: the success path allocates nothing).
template <class TB, class A, class C, class ShapeFn>
void matmul_rows(const A& a, const TB* b, std::size_t n, std::size_t k, std::ptrdiff_t ldb, bool packed,
                 ShapeFn&& b_shape, const C& c, const MatmulOptions& opt, ThreadPool* pool, bool col_major = false) {
  bool ok = a.extent(A::rank() - 1) == k && c.extent(C::rank() - 1) == n;
  for (std::size_t r = 0; ok && r + 1 < A::rank(); ++r) ok = a.extent(r) == c.extent(r);
  if (!ok)
    fail<ShapeError>("kiln::matmul: a ", shape_str(a), ", b ", b_shape(), " and c ", shape_str(c),
                     " do not fit: need a (..., K), b (N, K), c (..., N)");
  // b's bytes: n rows of k, ldb apart (packed: n * k in a block; column-major: k rows of n, ldb apart)
  const auto [c0, c1] = byte_span(c);
  const auto* b0 = reinterpret_cast<const std::byte*>(b);
  const std::size_t b_lines = col_major ? k : n, b_len = col_major ? n : k;
  const auto* b1 = b0 + (n == 0 || k == 0 ? 0 : ((b_lines - 1) * std::size_t(ldb) + b_len) * sizeof(TB));
  if (overlaps(c, a) || (c0 != c1 && b0 != b1 && c0 < b1 && b0 < c1))
    fail<ShapeError>("kiln::matmul: c ", shape_str(c), " overlaps a ", shape_str(a), " or b ", b_shape(),
                     " (the output must be a separate buffer)");
  if (packed && std::is_same_v<TB, bf16> && opt.bf16 == Bf16Mode::fast)
    fail<ShapeError>("kiln::matmul: Bf16Mode::fast is not implemented for packed rows (use Bf16Mode::exact)");
  if (col_major && std::is_same_v<TB, bf16> && opt.bf16 == Bf16Mode::fast)
    fail<ShapeError>("kiln::matmul: Bf16Mode::fast is not implemented for a column-major b ", b_shape(),
                     " (use Bf16Mode::exact)");
  const auto ar = as_rows(a, "matmul", "a");
  const auto cr = as_rows(c, "matmul", "c");
  const std::size_t m = ar.rows;
  if (m == 0 || n == 0) return;
  if (k == 0) {  // empty sum
    if (!opt.accumulate)
      for (std::size_t i = 0; i < m; ++i) std::fill_n(cr.data + std::ptrdiff_t(i) * cr.stride, n, 0.0f);
    return;
  }
  const bool gemm = m > kGemvMaxRows;
  const unsigned flags =
      (opt.accumulate ? kMatmulAccumulate : 0u) | (gemm ? kMatmulGemm : 0u) |
      (std::is_same_v<TB, bf16> && opt.bf16 == Bf16Mode::fast ? kMatmulFastBf16 : 0u) | (packed ? kMatmulPacked : 0u) |
      (col_major ? kMatmulColMajorB : 0u) |
      (opt.amx_bf16 && gemm && !col_major && sizeof(TB) == 2 && opt.bf16 == Bf16Mode::exact ? kMatmulAmxBf16 : 0u);
  // Thread splits of N are multiples of 64 rows: whole packed groups.
  matmul_split(m, n, k, gemm, pool, [&](std::size_t m0, std::size_t m1, std::size_t n0, std::size_t n1) {
    matmul_kernel<TB>(
        ar.data + std::ptrdiff_t(m0) * ar.stride, ar.stride, b + std::ptrdiff_t(n0) * (col_major ? 1 : ldb), ldb,
        cr.data + std::ptrdiff_t(m0) * cr.stride + std::ptrdiff_t(n0), cr.stride, m1 - m0, n1 - n0, k, flags);
  });
}

}  // namespace detail

/// C = A * B^T (or C += A * B^T with opt.accumulate). Shapes: A (..., K), B (N, K), C (..., N) with the
/// same leading dimensions as A. A and C are f32; B is f32, f16 or bf16. C must not overlap A or B.
template <class A, class B, class C>
void matmul(const A& a, const B& b, const C& c, const MatmulOptions& opt, ThreadPool* pool = nullptr) {
  KILN_REQUIRE_DTYPE(A, float, "matmul", "a");
  KILN_REQUIRE_DTYPE(C, float, "matmul", "c");
  KILN_REQUIRE_WRITABLE(C, "matmul", "c");
  static_assert(A::rank() == C::rank(), "kiln::matmul: a (..., K) and c (..., N) must have the same rank");
  if constexpr (detail::is_packed_rows<std::remove_cvref_t<B>>) {
    using TB = std::remove_cvref_t<decltype(*b.data)>;
    detail::check_pack_args<TB>(b.rows, b.cols, "matmul");
    if (!b.data && b.rows && b.cols) fail<ShapeError>("kiln::matmul: packed b has no data");
    auto shape = [&] {
      std::string s = "(";  // appended, not operator+: GCC 12 misreports -Wrestrict on that chain
      s.append(std::to_string(b.rows)).append(", ").append(std::to_string(b.cols)).append(") packed");
      return s;
    };
    detail::matmul_rows<TB>(a, b.data, b.rows, b.cols, std::ptrdiff_t(b.cols), true, shape, c, opt, pool);
  } else {
    static_assert(TensorLike<B>, "kiln::matmul: b must be a kiln::Tensor view (or kiln::PackedRows)");
    using TB = typename std::remove_cvref_t<B>::value_type;
    static_assert(std::is_same_v<TB, float> || std::is_same_v<TB, f16> || std::is_same_v<TB, bf16>,
                  "kiln::matmul: b (the weight) must be a view of float, f16 or bf16 elements (wrong dtype; "
                  "quantized weights go through kiln::qmatmul)");
    static_assert(B::rank() == 2, "kiln::matmul: b must be rank 2 (N, K)");
    if (b.extent(1) > 1 && b.stride(1) != 1 && (b.stride(0) == 1 || b.extent(0) <= 1) && b.stride(1) > 0) {
      // Column-major B (the transpose of a row-major (K, N) matrix, e.g. transpose(V)): its own kernels.
      detail::matmul_rows<TB>(
          a, b.data(), b.extent(0), b.extent(1), b.stride(1), false, [&] { return detail::shape_str(b); }, c, opt, pool,
          true);
      return;
    }
    const auto br = detail::as_rows(b, "matmul", "b");
    detail::matmul_rows<TB>(
        a, br.data, br.rows, br.n, br.stride, false, [&] { return detail::shape_str(b); }, c, opt, pool);
  }
}

/// C = A * B^T with default options.
template <class A, class B, class C>
void matmul(const A& a, const B& b, const C& c, ThreadPool* pool = nullptr) {
  matmul(a, b, c, MatmulOptions{}, pool);
}

namespace detail {
// Writes rows[0 .. kPackRows) (row stride ld) to dst as one packed group of k columns.
template <class T>
void pack_group(const T* rows, std::ptrdiff_t ld, std::size_t k, T* dst) {
  constexpr std::size_t R = kPackRows, C = kPackChunkBytes / sizeof(T);
  const std::size_t kc = k / C * C;
  for (std::size_t p = 0; p < kc; p += C)
    for (std::size_t r = 0; r < R; ++r, dst += C) std::memcpy(dst, rows + std::ptrdiff_t(r) * ld + p, C * sizeof(T));
  for (std::size_t r = 0; r < R; ++r, dst += k - kc)
    std::memcpy(dst, rows + std::ptrdiff_t(r) * ld + kc, (k - kc) * sizeof(T));
}
}  // namespace detail

/// Packs B (N, K) f16 or bf16 (rows contiguous, any row stride) into dst (N * K elements, not
/// overlapping B) in the packed-rows layout; returns the view matmul() takes.
template <class B, class T>
PackedRows<T> pack_rows(const B& b, T* dst) {
  static_assert(TensorLike<B> && B::rank() == 2, "kiln::pack_rows: b must be a rank-2 kiln::Tensor view (N, K)");
  static_assert(std::is_same_v<typename B::value_type, T>, "kiln::pack_rows: b and dst must have the same dtype");
  const std::size_t n = b.extent(0), k = b.extent(1);
  detail::check_pack_args<T>(n, k, "pack_rows");
  const auto br = detail::as_rows(b, "pack_rows", "b");
  const std::size_t ng = n / detail::kPackRows * detail::kPackRows;
  for (std::size_t j = 0; j < ng; j += detail::kPackRows)
    detail::pack_group(br.data + std::ptrdiff_t(j) * br.stride, br.stride, k, dst + j * k);
  for (std::size_t j = ng; j < n; ++j) std::memcpy(dst + j * k, br.data + std::ptrdiff_t(j) * br.stride, k * sizeof(T));
  return {dst, n, k};
}

/// Packs a row-major (rows, cols) f16 or bf16 matrix in place (memory it owns and may rewrite), one
/// group of kPackRows rows at a time through a small buffer; returns the view matmul() takes.
template <class T>
PackedRows<T> pack_rows_in_place(T* data, std::size_t rows, std::size_t cols) {
  detail::check_pack_args<T>(rows, cols, "pack_rows_in_place");
  std::vector<T> group(detail::kPackRows * cols);
  for (std::size_t j = 0; j + detail::kPackRows <= rows; j += detail::kPackRows) {
    T* g = data + j * cols;
    std::memcpy(group.data(), g, group.size() * sizeof(T));
    detail::pack_group(group.data(), std::ptrdiff_t(cols), cols, g);
  }
  return {data, rows, cols};
}

namespace ref {
/// Scalar reference: C = [C +] A * B^T (opt.accumulate) accumulated in double, B widened exactly to f32 first.
/// With opt.bf16 = Bf16Mode::fast, A is first rounded to bf16 (nearest even), as that mode does for any B.
/// opt.amx_bf16 is ignored (the kernels' AMX path is checked against this reference).
template <class TB>
void matmul(const float* a, std::ptrdiff_t lda, const TB* b, std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc,
            std::size_t m, std::size_t n, std::size_t k, const MatmulOptions& opt = {}) {
  const bool accumulate = opt.accumulate, fast_bf16 = opt.bf16 == Bf16Mode::fast;
  for (std::size_t i = 0; i < m; ++i) {
    const float* ai = a + std::ptrdiff_t(i) * lda;
    for (std::size_t j = 0; j < n; ++j) {
      const TB* bj = b + std::ptrdiff_t(j) * ldb;
      float& out = c[std::ptrdiff_t(i) * ldc + std::ptrdiff_t(j)];
      double s = accumulate ? double(out) : 0.0;
      for (std::size_t p = 0; p < k; ++p) {
        const float av = fast_bf16 ? bf16_bits_to_f32(f32_to_bf16_bits(ai[p])) : ai[p];
        s += double(av) * double(to_f32(bj[p]));
      }
      out = float(s);
    }
  }
}
}  // namespace ref

}  // namespace kiln
