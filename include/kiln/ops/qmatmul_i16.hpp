// kiln/ops/qmatmul_i16.hpp - y = x * W^T with x rounded to 16-bit integers: Precision::fast's prompt GEMM on
// CPUs without an 8-bit dot product instruction (AVX2), and its Q8_0 decode GEMV there.
//
//   x (M, K) f32 (more leading dimensions merge into rows, rows may be strided); W (N, K) in Q4_0, Q4_1,
//   Q5_0, Q5_1, Q8_0 or Q4_K blocks (row-major, or 16-row interleaved groups: quant/interleave.hpp);
//   y (M, N) f32.
//
// How it computes: x is cut into blocks of 32 values, each rounded once with dx = amax / 32767 to
// q = nearest_even(x * (32767 / amax)), |q| <= 32767 (error <= dx / 2 = amax / 65534, as fine as
// qmatmul_split_act's two 8-bit parts). Each 32 values of a weight are w = d * u + mn with u a small
// integer (Q4_0: nibble - 8; Q5_0: 5 bits - 16; Q8_0: the signed byte; Q4_1 / Q5_1: the unsigned value,
// mn = m; Q4_K's sub-blocks: the nibble, d = d_K * sc, mn = -(dmin * m), both exact in f32; else mn = 0).
// Block term, per 32 values, row of x and row of W:
//     y += float(sum(u * q)) * (d * dx)          [+ m * sx, sx = the f32 sum of the block's 32 x]
// each step one f32 fma in that order, blocks in order, so every target gives the same bits.
// The integer sum is exact: 32 products of |u| <= 128 and |q| <= 32767 stay below 2^28.
//
// On AVX2 (kernels/qmatmul/i16-inl.h) the weights of 16 rows x 32 values are widened once into a panel of 16-bit
// pairs (8 rows per 256-bit register), and a register-blocked kernel runs vpmaddwd of each panel register
// against 6 broadcast pairs of x (6 rows x 16 columns of 32-bit sums, 16 multiply-adds per instruction):
// about twice the multiply-adds per cycle of the f32 FMA GEMM, with no dequantization to f32. Other targets
// run the same arithmetic in plain C++ (correct, not fast: dispatch::qmatmul_i16_min_rows says SIZE_MAX
// there, so linear() never picks it). On AVX2 linear() takes it from 32 rows of x (kQmmI16MinRows), Q8_0
// from one row.
//
// Threads: the rows of x are quantized in parallel, then the threads split N (multiples of 64 rows of W).
//
// GEMV (up to dispatch::qmatmul_i16_gemv_rows rows of x: AVX2's Q8_0, 4 rows, decode steps): x is
// quantized the same way into plain rows (detail::qmm_i16_row_bytes: its 16-bit values in order, then dx
// and sx per block), each thread its own copy, and the threads split N in whole 16-row groups. On AVX2 the
// 4 bytes of 4 rows in a step of an interleaved Q8_0 block column widen with one vpmovsxbw each (from
// memory) and meet a vpbroadcastq of the 4 matching 16-bit values of x in one vpmaddwd: per 16 rows x 4
// values 4 widenings, 4 vpmaddwd and 4 vpaddd, against 8 multiplies and 16 other ops for the two 8-bit
// parts of qmatmul_split_act. Per block one vphaddd per 8 rows completes each row's integer sum, which
// scales as above: every y bit-identical to the GEMM's row. 2-4 rows of x take the two 8-row halves one
// after the other (W read once); row-major rows go 8 at a time (two vpmaddwd per row and block, a vphaddd
// tree per 8 rows), with the same bits.
//
// Scalar reference: kiln::ref::qmatmul_i16 (below): the same quantized x, reference dequantization, double
// sums.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kiln/core/check.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/kernels/dispatch.hpp"
#include "kiln/ops/dequant_matmul.hpp"
#include "kiln/ops/qmatmul.hpp"
#include "kiln/quant/convert.hpp"
#include "kiln/quant/dequant.hpp"

namespace kiln {

namespace detail {

/// Rows of x per kernel panel.
inline constexpr std::size_t kQmmI16Rows = 6;
/// AVX2: up to how many rows of x qmatmul_i16 takes its Q8_0 GEMV (one pass over W; the GEMM past it).
inline constexpr std::size_t kQmmI16GemvMaxRows = 4;
/// AVX2: from how many rows of x linear() takes qmatmul_i16 (dispatch::qmatmul_i16_min_rows; Q8_0: 1).
inline constexpr std::size_t kQmmI16MinRows = 32;

/// One 32-value block of kQmmI16Rows rows of quantized x: q[p][r] holds values 2p and 2p + 1 of row r as
/// two int16 (low half: 2p), dx[r] its scale, sx[r] the f32 sum of its 32 unquantized values. Rows past M
/// are zero. A panel of rows is nb such blocks in order; panel P starts at block P * nb.
struct QmmI16Act {
  int32_t q[16][kQmmI16Rows];
  float dx[kQmmI16Rows];
  float sx[kQmmI16Rows];
};
static_assert(sizeof(QmmI16Act) == 16 * 4 * kQmmI16Rows + 8 * kQmmI16Rows,
              "kiln: QmmI16Act is the pairs, then the scales, then the sums, unpadded");

/// Bytes of one row of x quantized for the GEMV (k values): q (k int16, in order) | dx (k / 32 f32) |
/// sx (k / 32 f32); dx starts 2k bytes in, a multiple of 64 (k a whole number of blocks of 32).
inline constexpr std::size_t qmm_i16_row_bytes(std::size_t k) { return 2 * k + 8 * (k / 32); }

inline constexpr bool qmm_i16_supported(uint32_t type) {
  return type == ggml_type_id::Q4_0 || type == ggml_type_id::Q4_1 || type == ggml_type_id::Q5_0 ||
         type == ggml_type_id::Q5_1 || type == ggml_type_id::Q8_0 || type == ggml_type_id::Q4_K;
}

/// dx and q of one block of 32 values (what every target computes): amax = max |x|; dx = amax / 32767;
/// q = nearest_even(x * (32767 / amax)); all zero when amax is 0.
inline float qmm_i16_quantize_block(const float* x, int16_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.0f) {
    std::fill_n(q, 32, int16_t(0));
    return 0.0f;
  }
  const float id = 32767.0f / amax;
  for (int i = 0; i < 32; ++i) q[i] = static_cast<int16_t>(std::nearbyint(x[i] * id));
  return amax / 32767.0f;
}

/// sx of one block: lane sums s[l] = (x[l] + x[8 + l]) + (x[16 + l] + x[24 + l]), then
/// ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)) (the order of an 8-lane vector's reduction).
inline float qmm_i16_block_sum(const float* x) {
  float s[8];
  for (int l = 0; l < 8; ++l) s[l] = (x[l] + x[8 + l]) + (x[16 + l] + x[24 + l]);
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

}  // namespace detail

}  // namespace kiln

KILN_DISPATCH_BEGIN
/// From how many rows of x the dispatched target's linear() should take qmatmul_i16 for `type` and K
/// columns (SIZE_MAX: never; only AVX2 has the fast kernels: kQmmI16MinRows, Q8_0 1).
std::size_t qmatmul_i16_min_rows(uint32_t type, std::size_t k);
/// Quantizes the row panels [p0, p1) of x (m rows of k values, row stride ldx; panel P = rows 6P .. 6P + 5)
/// into act (detail::QmmI16Act blocks, k / 32 per panel, from panel 0).
void qmatmul_i16_quantize(const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k, std::size_t p0,
                          std::size_t p1, void* act);
/// y (m, columns [n0, n1)) = act * W^T for rows [n0, n1) of W (n rows of k values of GGUF type `type`,
/// ldw bytes apart, or interleaved); y points at column 0; n0 a multiple of 16.
void qmatmul_i16_gemm(uint32_t type, const void* act, std::size_t m, std::size_t k, const void* w, std::size_t n,
                      std::size_t ldw, bool interleaved, std::size_t n0, std::size_t n1, float* y, std::ptrdiff_t ldy);
/// Up to how many rows of x qmatmul_i16 takes its GEMV for `type` on the dispatched target (AVX2: Q8_0,
/// detail::kQmmI16GemvMaxRows; else 0).
std::size_t qmatmul_i16_gemv_rows(uint32_t type);
/// m rows of x (k values, a whole number of blocks of 32; row stride ldx) into m GEMV rows at act, one
/// after another (detail::qmm_i16_row_bytes(k) bytes each).
void qmatmul_i16_quantize_rows(const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k, void* act);
/// y (m, columns [n0, n1)) = act * W^T for the m GEMV rows at act and rows [n0, n1) of W (as
/// qmatmul_i16_gemm's); y points at column 0; n0 a multiple of 16.
void qmatmul_i16_gemv(uint32_t type, const void* act, std::size_t m, std::size_t k, const void* w, std::size_t n,
                      std::size_t ldw, bool interleaved, std::size_t n0, std::size_t n1, float* y, std::ptrdiff_t ldy);
KILN_DISPATCH_END

namespace kiln {
namespace detail {

/// The GEMV of qmatmul_i16 for m rows of x (k values, row stride ldx; m <= dispatch::qmatmul_i16_gemv_rows
/// of each output's type) and outputs outs[0 .. n_outs) (y (m, o.n), row stride o.ldy): one parallel_for
/// over units of 16 rows of W across the outputs, each task quantizing x into its thread's own scratch first
/// (identical copies, no thread waiting on another). Every y is computed alike whatever the split, so
/// bit-identical for any thread count.
inline void qmm_i16_gemv_run(const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k, const QmmOutput* outs,
                             std::size_t n_outs, ThreadPool* pool) {
  KILN_CHECK(n_outs <= kQmmMaxOutputs, "kiln::qmatmul_i16: ", n_outs, " weights; at most ", kQmmMaxOutputs);
  constexpr std::size_t kGrain = kernels::kQmmInterleaveRows;
  constexpr double kMinOpsPerThread = 1 << 19;  // below this, waking a thread costs more than it saves
  std::size_t unit0[kQmmMaxOutputs + 1] = {}, n_total = 0;
  for (std::size_t i = 0; i < n_outs; ++i) {
    unit0[i + 1] = unit0[i] + (outs[i].n + kGrain - 1) / kGrain;
    n_total += outs[i].n;
  }
  if (m == 0 || n_total == 0) return;
  if (k == 0) {
    for (std::size_t i = 0; i < n_outs; ++i)
      for (std::size_t r = 0; r < m; ++r) std::fill_n(outs[i].y + std::ptrdiff_t(r) * outs[i].ldy, outs[i].n, 0.0f);
    return;
  }
  const std::size_t n_units = unit0[n_outs], bytes = m * qmm_i16_row_bytes(k);
  auto run_units = [&](const void* act, std::size_t u0, std::size_t u1) {
    for (std::size_t i = 0; i < n_outs; ++i) {
      const std::size_t a = std::max(u0, unit0[i]), b = std::min(u1, unit0[i + 1]);
      if (a >= b) continue;
      const QmmOutput& o = outs[i];
      const std::size_t n0 = (a - unit0[i]) * kGrain;
      dispatch::qmatmul_i16_gemv(o.type, act, m, k, o.w, o.n, std::size_t(o.ldw), o.interleaved, n0,
                                 std::min(o.n, (b - unit0[i]) * kGrain), o.y, o.ldy);
    }
  };
  const std::size_t threads = pool ? pool->size() : 1;
  const double ops = 2.0 * double(m) * double(n_total) * double(k);
  const std::size_t tasks = std::min({threads, std::size_t(ops / kMinOpsPerThread) + 1, n_units});
  if (tasks <= 1) {
    void* act = qmm_scratch(0, bytes);
    dispatch::qmatmul_i16_quantize_rows(x, ldx, m, k, act);
    run_units(act, 0, n_units);
    return;
  }
  pool->parallel_for(tasks, [&](std::size_t t, std::size_t) {
    const auto [u0, u1] = split_range(n_units, tasks, t);
    if (u0 >= u1) return;
    void* act = qmm_scratch(0, bytes);  // this thread's copy (a thread taking two tasks quantizes twice)
    dispatch::qmatmul_i16_quantize_rows(x, ldx, m, k, act);
    run_units(act, u0, u1);
  });
}

}  // namespace detail
}  // namespace kiln

namespace kiln::kernels {

/// y (M, n) = x (M, K) * W^T with x rounded to 16 bits per block of 32 (see the top of this header). W: n
/// rows of K values of GGUF type ggml_type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K) at w, row_bytes apart (0:
/// packed), or in 16-row interleaved groups (`{.interleaved = true}`; rows contiguous). Throws ShapeError for
/// another type, a K that is not a whole number of blocks, shapes that do not fit or y overlapping x.
template <class X, class Y>
void qmatmul_i16(const X& x, uint32_t ggml_type, const void* w, std::size_t n, std::size_t row_bytes, const Y& y,
                 ThreadPool* pool = nullptr, WeightLayout layout = {}) {
  const bool interleaved = layout.interleaved;
  KILN_REQUIRE_DTYPE(X, float, "qmatmul_i16", "x");
  KILN_REQUIRE_DTYPE(Y, float, "qmatmul_i16", "y");
  KILN_REQUIRE_WRITABLE(Y, "qmatmul_i16", "y");
  static_assert(X::rank() == Y::rank(), "kiln::qmatmul_i16: x (..., K) and y (..., N) must have the same rank");
  if (!detail::qmm_i16_supported(ggml_type))
    fail<ShapeError>("kiln::qmatmul_i16: GGUF type ", ggml_type, " is not one of q4_0, q4_1, q5_0, q5_1, q8_0, q4_K");
  const std::size_t k = x.extent(X::rank() - 1);
  const std::size_t ldw = detail::check_gguf_weight_args("qmatmul_i16", x, ggml_type, n, row_bytes, y, interleaved);
  if (detail::overlaps(y, x))
    fail<ShapeError>("kiln::qmatmul_i16: y ", detail::shape_str(y), " overlaps x ", detail::shape_str(x),
                     " (the output must be a separate buffer)");
  const auto xr = detail::as_rows(x, "qmatmul_i16", "x");
  const auto yr = detail::as_rows(y, "qmatmul_i16", "y");
  const std::size_t m = xr.rows;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::size_t i = 0; i < m; ++i) std::fill_n(yr.data + std::ptrdiff_t(i) * yr.stride, n, 0.0f);
    return;
  }
  if (m <= dispatch::qmatmul_i16_gemv_rows(ggml_type)) {
    const detail::QmmOutput o{ggml_type,  static_cast<const std::byte*>(w), std::ptrdiff_t(ldw), n, yr.data, yr.stride,
                              interleaved};
    detail::qmm_i16_gemv_run(xr.data, xr.stride, m, k, &o, 1, pool);
    return;
  }
  const std::size_t panels = (m + detail::kQmmI16Rows - 1) / detail::kQmmI16Rows, nb = k / 32;
  void* act = detail::qmm_scratch(0, panels * nb * sizeof(detail::QmmI16Act));
  const std::size_t threads = pool ? pool->size() : 1;
  const std::size_t qtasks = std::min(threads, panels);
  if (qtasks <= 1) {
    dispatch::qmatmul_i16_quantize(xr.data, xr.stride, m, k, 0, panels, act);
  } else {
    pool->parallel_for(qtasks, [&](std::size_t t, std::size_t) {
      const auto [p0, p1] = split_range(panels, qtasks, t, 1);
      if (p0 < p1) dispatch::qmatmul_i16_quantize(xr.data, xr.stride, m, k, p0, p1, act);
    });
  }
  constexpr std::size_t kGrain = 64;  // whole interleaved groups
  const std::size_t tasks = std::min(threads, (n + kGrain - 1) / kGrain);
  if (tasks <= 1) {
    dispatch::qmatmul_i16_gemm(ggml_type, act, m, k, w, n, ldw, interleaved, 0, n, yr.data, yr.stride);
    return;
  }
  pool->parallel_for(tasks, [&](std::size_t t, std::size_t) {
    const auto [n0, n1] = split_range(n, tasks, t, kGrain);
    if (n0 < n1) dispatch::qmatmul_i16_gemm(ggml_type, act, m, k, w, n, ldw, interleaved, n0, n1, yr.data, yr.stride);
  });
}

}  // namespace kiln::kernels

namespace kiln {

namespace ref {
/// Scalar reference of qmatmul_i16 (row-major W): x quantized per block as it does
/// (detail::qmm_i16_quantize_block, detail::qmm_i16_block_sum), W dequantized by the reference dequantizer
/// (dequantize_row), each block term sum((w - mn) * q) * dx + mn * sx summed in double.
inline void qmatmul_i16(const float* x, std::size_t ldx, std::size_t m, std::size_t k, uint32_t type, const void* w,
                        std::size_t n, std::size_t ldw, float* y, std::size_t ldy) {
  KILN_CHECK(::kiln::detail::qmm_i16_supported(type) && k % (type == ggml_type_id::Q4_K ? 256 : 32) == 0,
             "kiln::ref::qmatmul_i16: type ", type, ", K = ", k);
  const std::size_t nb = k / 32;
  std::vector<float> wr(k), mn(nb);
  std::vector<int16_t> q(m * k);
  std::vector<double> dx(m * nb), sx(m * nb);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t b = 0; b < nb; ++b) {
      dx[i * nb + b] = ::kiln::detail::qmm_i16_quantize_block(x + i * ldx + 32 * b, q.data() + i * k + 32 * b);
      sx[i * nb + b] = ::kiln::detail::qmm_i16_block_sum(x + i * ldx + 32 * b);
    }
  const bool has_min = type == ggml_type_id::Q4_1 || type == ggml_type_id::Q5_1;
  for (std::size_t j = 0; j < n; ++j) {
    const auto* row = static_cast<const std::byte*>(w) + j * ldw;
    dequantize_row(type, row, wr.data(), k);
    for (std::size_t b = 0; b < nb; ++b) {
      mn[b] = 0.0f;
      if (type == ggml_type_id::Q4_K) {  // sub-block b % 8 of super-block b / 8: -(dmin * its 6-bit min)
        block_q4_K blk;
        std::memcpy(&blk, row + (b / 8) * sizeof(block_q4_K), sizeof(blk));
        uint8_t sc = 0, m6 = 0;
        ::kiln::detail::get_scale_min_k4(b % 8, blk.scales, sc, m6);
        mn[b] = -(to_f32(blk.dmin) * float(m6));
      } else if (has_min) {  // the block's m: the f16 after d in both block_q4_1 and block_q5_1
        f16 h;
        std::memcpy(&h, row + b * ggml_row_bytes(type, 32) + sizeof(f16), sizeof(f16));
        mn[b] = to_f32(h);
      }
    }
    for (std::size_t i = 0; i < m; ++i) {
      double s = 0.0;
      for (std::size_t b = 0; b < nb; ++b) {
        double t = 0.0;
        for (std::size_t e = 0; e < 32; ++e)
          t += (double(wr[32 * b + e]) - double(mn[b])) * double(q[i * k + 32 * b + e]);
        s += t * dx[i * nb + b] + double(mn[b]) * sx[i * nb + b];
      }
      y[i * ldy + j] = float(s);
    }
  }
}
}  // namespace ref

}  // namespace kiln
