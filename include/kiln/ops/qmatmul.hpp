// kiln/ops/qmatmul.hpp - y = x * W^T with W in GGUF quantized blocks (a quantized Linear layer).
//
//   x (M, K) f32 activations (more leading dimensions merge into rows, rows may be strided, or rank 1);
//   W (N, K / block_size) a Tensor of blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K or MXFP4; rows may be
//   strided in blocks); y (M, N) f32 (like x). qmatmul(x, ggml_type, ptr, n, row_bytes, y) takes the
//   weight as a GGUF type id and a raw pointer (model loading) and dispatches to the typed template.
//
// How it computes (llama.cpp's scheme): x is quantized ONCE per call to 8 bits, then every weight block is
// dotted with it in integers and the integer block sums are scaled in f32.
//   - 32-value weight blocks (Q4_0 .. Q8_0): x is cut into blocks of 32 with dx = amax / 127 (f32),
//     q = nearest_even(x * (127 / amax)). Block term: dw * dx * sum((u - off) * q) [+ m * dx * sum(q)],
//     u the unsigned stored value (off = 8 for Q4_0, 16 for Q5_0, 128 for Q8_0 (stored + 128), 0 for
//     Q4_1/Q5_1 with their min m). MXFP4 is one of these: its 4-bit e2m1 code c is worth kvalues_mxfp4[c]
//     (the e2m1 value doubled, an integer in [-12, 12]) times dw = 2^(e - 128) (the e8m0 scale halved), so
//     u = kvalues_mxfp4[c] + 12 (a table lookup, 0..24) with off = 12, and dw, a power of two, scales dx
//     exactly: the block term is the same exact integer sum scaled in f32 as the other types'.
//   - K-quants (Q4_K, Q5_K, Q6_K): x is cut into super-blocks of 256 with one dx (Q8_K's layout: one
//     scale and the sums of q per 32 or 16 values; the scale is amax / 127 as above, not ggml's signed
//     -max / 127), so a super-block needs one f32 scale product: the 6/8-bit sub-block scales multiply
//     the integer sums exactly.
// The integer dots run AVX-512 VNNI vpdpbusd (unsigned weight bytes x signed activation bytes; the weight
// offset is folded into the start value via sum(q)) on the AVX3_DL target, AVX2 vpmaddubsw on AVX2 and
// AVX3, portable 128-bit Highway code on NEON, SSE4, SSSE3 and EMU128 (kernels/qmatmul/generic/portable-inl.h: sdot or
// pmaddubsw byte dots where the target has them, 16-bit widening multiply-adds elsewhere), and plain
// integer code on HWY_SCALAR. Every path computes the same integer block
// sums; only the f32 summation order of the scaled terms differs between paths and targets.
//
// Paths (chosen from M only, so any thread count gives identical results):
//   GEMV, M <= detail::kQmmGemvMaxRows (AVX3_DL with interleaved W: kQmmGemvMaxRowsX16): W is streamed
//     once, each weight block decoded once and dotted with every quantized row of x (the decode step).
//   GEMM, larger M: on AVX3_DL, 16 weight rows at a time are decoded into a panel with the rows interleaved
//     in 4-byte groups (one 512-bit register = 16 rows), then a register-blocked kernel runs vpdpbusd of the
//     panel against 8 broadcast activation rows, converting each block's integer sums once. Other targets
//     reuse the GEMV kernel over blocks of rows.
//   Interleaved W (QmmWeight::interleaved: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K in 16-row groups,
//     quant/interleave.hpp; what LoadOptions::pack makes of a model's matrices): on AVX3_DL the GEMV
//     runs vpdpbusd straight on the stored registers of 16 rows, with the GEMM kernel's per-block arithmetic
//     (32-value blocks: its outputs equal the GEMM's for the same row of x) or, for Q4_K, the row-major
//     GEMV's exact integer sum per super-block; the GEMM's panels come from the groups without a decode.
//     AVX2 and AVX3 read them as they are too (kernels/qmatmul/x86/avx2_x16-inl.h: 8 rows per 256-bit register, GEMV
//     and GEMM alike; within f32 rounding of the row-major results). Other targets copy each group back to
//     16 row-major rows and run their usual kernels (identical results).
// Threads split N (each thread a contiguous range of W's rows), or M when N is too small to share.
// Several weights that share x (a layer's Q, K and V; gate and up) go through qmatmul_multi: x quantized
// once per distinct activation layout, one fork/join over the rows of all of them, each output
// bit-identical to its own qmatmul. qmatmul_split_act carries x in two 8-bit parts (see there).
//
// Scratch: the quantized activations and the GEMM panels live in thread_local buffers that grow on demand
// and are kept (detail::qmm_scratch), so steady-state calls never allocate. Results are exact integer dots
// scaled in f32; the error against the unquantized product is that of rounding x to 8 bits, at most
// sum_i |w_i| * dx / 2 per block (tests/ops/test_qmatmul.cpp derives and checks it). Inputs must be finite.
//
// Scalar references (ops/qmatmul_ref.hpp, included at the end): kiln::ref::qmatmul_dequant (W dequantized,
// double dot: the 'true' product) and kiln::ref::qmatmul_int (the same activation quantization and integer
// block dots, double scaling).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <span>
#include <type_traits>
#include <vector>

#include "kiln/core/check.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/kernels/dispatch.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/quant/interleave.hpp"
#include "kiln/quant/blocks.hpp"
#include "kiln/quant/convert.hpp"
#include "kiln/quant/dequant.hpp"

namespace kiln {

/// The weight block types qmatmul multiplies by.
template <class B>
inline constexpr bool qmatmul_supported_v =
    std::is_same_v<B, block_q4_0> || std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_0> ||
    std::is_same_v<B, block_q5_1> || std::is_same_v<B, block_q8_0> || std::is_same_v<B, block_q4_K> ||
    std::is_same_v<B, block_q5_K> || std::is_same_v<B, block_q6_K> || std::is_same_v<B, block_mxfp4>;

namespace detail {

/// Up to this many rows of x, the GEMV path; above, the GEMM path.
inline constexpr std::size_t kQmmGemvMaxRows = 4;
/// AVX3_DL with every W interleaved: the GEMV path up to this many rows (its interleaved GEMV holds 8 rows of x
/// in registers: a SessionGroup step of 4 sequences, two activation parts each, streams W once). Elsewhere 4:
/// AVX2's GEMM beat its GEMV at 8 rows, and the row-major GEMV takes 4 rows per pass over W.
inline constexpr std::size_t kQmmGemvMaxRowsX16 = 8;
/// dispatch::qmatmul_split_f32_min_rows on AVX2: from this many rows, fast precision's products go to the f32
/// GEMM on dequantized W where it beats the two-part integer GEMM (kiln-bench's BM_qmatmul_gemm2_* against
/// exact_gemm_*): Q8_0 and Q6_K at any k, the 4- and 5-bit types below kQmmSplitF32MaxK4. The integer GEMM
/// gains on the f32 one as k grows (its per-block epilogue is fixed, the f32 GEMM's panels are not).
inline constexpr std::size_t kQmmSplitF32MinRows = 32;
inline constexpr std::size_t kQmmSplitF32MaxK4 = 2048;
/// Flags of the raw kernel: the GEMM path; W in 16-row interleaved groups (quant/interleave.hpp; the
/// rows past the last whole group row-major, rows contiguous); the rows of the activations come in pairs
/// (a row of x's part, then the same row's residual part: qmatmul_split_act), and y gets one row per pair,
/// (x part) + (residual part); with kQmmGemm, the activations already in the AMX GEMM's repacked form
/// (dispatch::qmatmul_quantize_amx; only where dispatch::qmatmul_amx_x_bytes is not 0).
inline constexpr unsigned kQmmGemm = 1, kQmmInterleaved = 2, kQmmPairs = 4, kQmmAmxX = 8;

/// Offset subtracted from the stored unsigned weight value u (see the top of this header).
inline constexpr int qmm_weight_offset(uint32_t type) {
  switch (type) {
    case ggml_type_id::Q4_0:
      return 8;
    case ggml_type_id::Q5_0:
      return 16;
    case ggml_type_id::Q8_0:
      return 128;
    case ggml_type_id::Q6_K:
      return 32;
    case ggml_type_id::MXFP4:  // u = kvalues_mxfp4[code] + 12, 0..24
      return 12;
    default:
      return 0;
  }
}
inline constexpr bool qmm_is_kquant(uint32_t type) {
  return type == ggml_type_id::Q4_K || type == ggml_type_id::Q5_K || type == ggml_type_id::Q6_K;
}
inline constexpr bool qmm_supported(uint32_t type) {
  return type == ggml_type_id::Q4_0 || type == ggml_type_id::Q4_1 || type == ggml_type_id::Q5_0 ||
         type == ggml_type_id::Q5_1 || type == ggml_type_id::Q8_0 || qmm_is_kquant(type) || type == ggml_type_id::MXFP4;
}

/// 12582912 = 1.5 * 2^23 as f32 bits: (float bits of (kQmmMagic + v)) - 12582912.f == v for |v| < 2^22,
/// which turns an int32 lane into f32 with one integer add (folded into the start value) and one f32 sub.
inline constexpr int32_t kQmmMagic = 0x4B400000;
inline constexpr float kQmmMagicF = 12582912.0f;

/// Where one quantized row of x lives in the activation scratch (all offsets in bytes, 64-aligned).
///
/// q holds the kp 8-bit values in the kernels' physical order:
///   32-value blocks: groups of 4 blocks (128 values) as [b0 q0..15 | b1 q0..15 | b2 .. | b3 .. |
///     b0 q16..31 | b1 q16..31 | ..]; K is padded to whole groups with zero blocks (dx = 0).
///   Q4_K/Q5_K: per 256, the 32-value sub-blocks in the order 0 2 1 3 4 6 5 7 (a 4-bit byte holds
///     values of sub-blocks 2c and 2c + 1, so one 64-byte load feeds sub-blocks 2c and 2c + 2 ... ).
///   Q6_K: natural order.
/// Per scale group (dg values: 32, or 256 for K-quants): dx (f32). Per sum group (sg values: 32, or 16 for
/// Q6_K, physical order): S = sum q (i32), corr = -off * S / 4 (i32, repeated 4x: a start value of a 4-lane
/// partial sum), ginit = kQmmMagic - off * S, gdxs = dx * S (f32). 32-value blocks also keep dxr = dx
/// repeated 4x and dxsr = dx * S / 4 repeated 4x, and per 16 blocks, in the order of the GEMV's reduced
/// sums (lane 4c + G for block c of group G): corrT = -off * S, dxT = dx, gdxsT = dx * S. Q4_K/Q5_K keep
/// lsum16 = S per sub-block in logical order as i16 (for the min terms). A residual row of
/// qmatmul_quantize_split (scale dx / 2^s) also keeps, per sum group, pshift = s and pinit = ginit -
/// (2^s + 1) kQmmMagic (mod 2^32: the start value that makes AVX3_DL's GEMM sum come out as 2^s X + R).
struct QActLayout {
  uint32_t type = 0;
  std::size_t k = 0, kp = 0;   // logical and padded K
  std::size_t dg = 0, sg = 0;  // values per dx and per sum group
  std::size_t nd = 0, ns = 0;  // dx and sum groups per row (over kp)
  int offset = 0;              // qmm_weight_offset(type)
  std::size_t o_dx = 0, o_sum = 0, o_corr = 0, o_ginit = 0, o_gdxs = 0, o_dxr = 0, o_dxsr = 0, o_lsum16 = 0;
  std::size_t o_corrT = 0, o_dxT = 0, o_gdxsT = 0;
  std::size_t o_pinit = 0, o_pshift = 0;  // residual rows only
  std::size_t row_bytes = 0;
};

inline QActLayout qact_layout(uint32_t type, std::size_t k) {
  QActLayout L;
  L.type = type;
  L.k = k;
  const bool kq = qmm_is_kquant(type);
  L.kp = kq ? k : (k + 127) / 128 * 128;
  L.dg = kq ? 256 : 32;
  L.sg = type == ggml_type_id::Q6_K ? 16 : 32;
  L.nd = L.kp / L.dg;
  L.ns = L.kp / L.sg;
  L.offset = qmm_weight_offset(type);
  std::size_t o = align_up(L.kp);
  auto take = [&](std::size_t& field, std::size_t bytes) {
    field = o;
    o += align_up(std::max<std::size_t>(bytes, 1));
  };
  take(L.o_dx, L.nd * 4);
  take(L.o_sum, L.ns * 4);
  take(L.o_corr, L.ns * 16);
  take(L.o_ginit, L.ns * 4);
  take(L.o_gdxs, L.ns * 4);
  take(L.o_dxr, kq ? 0 : L.ns * 16);
  take(L.o_dxsr, kq ? 0 : L.ns * 16);
  take(L.o_lsum16, L.ns * 2);
  const std::size_t ns16 = kq ? 0 : (L.ns + 15) / 16 * 16;
  take(L.o_corrT, ns16 * 4);
  take(L.o_dxT, ns16 * 4);
  take(L.o_gdxsT, ns16 * 4);
  take(L.o_pinit, L.ns * 4);
  take(L.o_pshift, L.ns * 4);
  L.row_bytes = o;
  return L;
}

/// Per-thread, 64-byte-aligned scratch `slot` (0..5) of at least `bytes` bytes, grown on demand and kept
/// for the thread's lifetime (pool threads persist), so steady-state calls never allocate. Slot 0: the
/// quantized activations (written by the calling thread, read by all); 1..4: per-thread kernel buffers;
/// 5: the AMX GEMM's.
inline void* qmm_scratch(std::size_t slot, std::size_t bytes) {
  thread_local Scratch<std::byte> slots[6];
  return slots[slot].get(bytes);
}

}  // namespace detail

}  // namespace kiln

KILN_DISPATCH_BEGIN
// Quantizes m rows of x (k values, row stride ldx) into the activation scratch `act` (m rows of
// qact_layout(type, k).row_bytes bytes).
void qmatmul_quantize(uint32_t type, const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k, void* act);
// qmatmul_split_act's two parts of m rows of x in one pass: row i's 8-bit rounding into act_x + i * ld_act
// (what qmatmul_quantize writes) and the rounding of its residual r = x - dx * nearbyint(x * id) (per scale
// group, f32, dx and id of ref::qmm_group_scale; ref::qmm_split_residual) with the scale dx / 2^s, s in
// [8, 12] per scale group (ref::qmm_split_residual_act) into act_r + i * ld_act (bytes; at least qact_layout(type, k).row_bytes;
// qmatmul_multi interleaves the parts: ld_act = 2 row_bytes).
void qmatmul_quantize_split(uint32_t type, const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k,
                            void* act_x, void* act_r, std::size_t ld_act);
// y (m, n; row stride ldy) = act * W^T for n weight rows starting at w (ldw bytes apart), on the calling
// thread. flags: detail::kQmmGemm for the GEMM path, kQmmInterleaved, kQmmPairs (m even; y gets m / 2 rows,
// row i = product of act row 2i + product of act row 2i + 1, each as without the flag, then one f32 add;
// on AVX3_DL with kQmmGemm, the two parts of qmatmul_quantize_split (scales dx and dx / 2^s) are added as
// integers per sum group instead, 2^s X + R, and converted once: the same sum up to f32 rounding).
// Every element of y is computed the same way whatever sub-range of rows of W or of act a call covers.
void qmatmul_rows(uint32_t type, const void* act, std::size_t m, std::size_t k, const void* w, std::ptrdiff_t ldw,
                  std::size_t n, float* y, std::ptrdiff_t ldy, unsigned flags);
// Whether the dispatched target has kernels that read 16-row interleaved weights of `type` as they are
// (AVX3_DL, AVX2 and AVX3: every qmm_interleavable type). Other targets and types take
// them too, but first copy each group back to 16 row-major rows, on every call: a 1B Q8_0 model then
// decoded at a fifth of its row-major speed on AVX2 (pack_weights asks this first).
bool qmatmul_interleaved_native(uint32_t type);
// The most rows of x the GEMV path takes on the dispatched target: detail::kQmmGemvMaxRowsX16 on AVX3_DL when
// every W is interleaved, else detail::kQmmGemvMaxRows.
std::size_t qmatmul_gemv_max_rows(bool all_interleaved);
// The fewest rows of x from which Precision::fast (ops/linear.hpp: linear) multiplies a `type` weight of k
// columns by the f32 GEMM over dequantized panels (dequant_matmul, Precision::exact's product) instead of the
// two-part integer GEMM, on the dispatched target; SIZE_MAX: never. AVX2 (no int8 dot product instruction):
// from kQmmSplitF32MinRows rows, Q8_0 and Q6_K at any k, the 4- and 5-bit types below kQmmSplitF32MaxK4
// columns, where the f32 GEMM is the faster of the two (and exact). Elsewhere never.
std::size_t qmatmul_split_f32_min_rows(uint32_t type, std::size_t k);
// Bytes of m quantized rows of `type` by k in the AMX GEMM's repacked form (blocks of 16 rows, the last
// padded), or 0 where the dispatched target's GEMM does not run on AMX tiles now (not AVX3_DL, or
// kiln::amx_active() false).
std::size_t qmatmul_amx_x_bytes(uint32_t type, std::size_t m, std::size_t k);
// Blocks [b0, b1) of the quantized rows of x (m rows of k values, row stride ldx; pairs: kQmmPairs' 2m rows,
// as qmatmul_quantize_split interleaves them, else qmatmul_quantize's m) in the AMX GEMM's form: quantized
// rows [16 b0, 16 b1), those past the last zero, at dst + qmatmul_amx_x_bytes(type, 16 b0, k), without the
// row-major activation rows (each block's go through a per-thread buffer). qmatmul_rows with
// kQmmGemm | kQmmAmxX then takes dst advanced to a block of 16 as its act.
void qmatmul_quantize_amx(uint32_t type, const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k, bool pairs,
                          std::size_t b0, std::size_t b1, void* dst);
KILN_DISPATCH_END

namespace kiln {

namespace detail {

/// Most weights one multi-output product (qmatmul_multi) takes.
inline constexpr std::size_t kQmmMaxOutputs = 8;

/// One product of qmatmul_multi_run: y (m, n; row stride ldy) = x * W^T, W n rows of `type` ldw bytes apart.
struct QmmOutput {
  uint32_t type = 0;
  const std::byte* w = nullptr;
  std::ptrdiff_t ldw = 0;
  std::size_t n = 0;
  float* y = nullptr;
  std::ptrdiff_t ldy = 0;
  bool interleaved = false;  // W in 16-row interleaved groups (quant/interleave.hpp)
};

/// Whether two weight types read identical activation layouts (qact_layout depends on the type only through
/// K-quant or not, Q6_K's 16-value sum groups in natural order, and the weight offset of corr/ginit).
inline constexpr bool qmm_same_layout(uint32_t a, uint32_t b) {
  return qmm_is_kquant(a) == qmm_is_kquant(b) && (a == ggml_type_id::Q6_K) == (b == ggml_type_id::Q6_K) &&
         qmm_weight_offset(a) == qmm_weight_offset(b);
}

/// Per-thread f32 scratch of the kQmmPairs products whose kernels do not add the pairs themselves (both
/// rows of each pair, a chunk of columns at a time), grown on demand and kept.
inline float* qmm_split_scratch(std::size_t floats) {
  thread_local detail::Scratch<float> s;
  return s.get(floats);
}

/// y = a + b over n floats (the split path's two halves; a loop the compiler vectorizes).
inline void qmm_add_halves(float* __restrict y, const float* __restrict a, const float* __restrict b, std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) y[j] = a[j] + b[j];
}

/// The quantize + kernel steps of checked products that share x (m rows of k values, row stride ldx):
/// x is quantized once per distinct activation layout (split: in two parts, row i's at quantized rows 2i
/// and 2i + 1, and y = (x part) + (residual part): kQmmPairs), then one parallel_for shares out the rows of all
/// outputs: units of 16 weight rows (a GEMM panel) of the concatenated outputs, a task's range spanning
/// outputs where it falls so, or (GEMM with too few units) the quantized rows. A GEMV of several tasks (up
/// to 8 quantized rows) has each thread quantize x into its own copy instead (no thread waits while one
/// quantizes, none reads another's copy). Where every output takes the GEMM on AMX tiles, x is quantized
/// straight into the tiles' form (blocks of 16 quantized rows; row ranges then start at block boundaries),
/// once for all outputs and threads. Each output's path (GEMV/GEMM) depends on the quantized row count
/// and its own W's layout only, and the kernels compute every element alike whatever sub-range of rows of W
/// or of act a call covers, so each output is bit-identical to its own product, for any thread count.
inline void qmatmul_multi_run(const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k, const QmmOutput* outs,
                              std::size_t n_outs, bool split, ThreadPool* pool) {
  if (m == 0 || n_outs == 0) return;
  KILN_CHECK(n_outs <= kQmmMaxOutputs, "kiln::qmatmul_multi: ", n_outs, " weights; at most ", kQmmMaxOutputs);
  if (k == 0) {
    for (std::size_t i = 0; i < n_outs; ++i)
      for (std::size_t r = 0; r < m; ++r) std::fill_n(outs[i].y + std::ptrdiff_t(r) * outs[i].ldy, outs[i].n, 0.0f);
    return;
  }
  constexpr std::size_t kNGrain = 16, kMGrain = 8;  // GEMM panel rows, GEMM row tile
  constexpr std::size_t kAmxRows = 16;              // quantized rows per block of the AMX GEMM's repacked x
  constexpr double kMinOpsPerThread = 1 << 19;      // below this, waking a thread costs more than it saves
  const std::size_t rows = split ? 2 * m : m;       // quantized rows
  // One activation layout per distinct one among the outputs.
  QActLayout lay[kQmmMaxOutputs];
  std::size_t lay_of[kQmmMaxOutputs] = {}, act_off[kQmmMaxOutputs] = {}, unit0[kQmmMaxOutputs + 1] = {};
  std::size_t n_lay = 0, act_bytes = 0, n_total = 0;
  for (std::size_t i = 0; i < n_outs; ++i) {
    unit0[i + 1] = unit0[i] + (outs[i].n + kNGrain - 1) / kNGrain;
    n_total += outs[i].n;
    if (outs[i].n == 0) continue;
    std::size_t j = 0;
    while (j < n_lay && !qmm_same_layout(lay[j].type, outs[i].type)) ++j;
    if (j == n_lay) {
      lay[j] = qact_layout(outs[i].type, k);
      act_off[j] = act_bytes;
      act_bytes += rows * lay[j].row_bytes;
      ++n_lay;
    }
    lay_of[i] = j;
  }
  if (n_total == 0) return;
  const std::size_t threads = pool ? pool->size() : 1;
  // Each output's path (GEMV or GEMM) is the one its own product would take: it depends on the quantized
  // row count and whether that W is interleaved (the AVX3_DL GEMV takes up to 8 rows of interleaved W).
  const std::size_t gemv_rows[2] = {dispatch::qmatmul_gemv_max_rows(false), dispatch::qmatmul_gemv_max_rows(true)};
  bool gemm = false;  // any output through the GEMM
  for (std::size_t i = 0; i < n_outs; ++i) gemm = gemm || (outs[i].n > 0 && rows > gemv_rows[outs[i].interleaved]);
  // Where the GEMM runs on AMX tiles and every output takes it (more rows than any GEMV), x goes straight
  // into the tiles' form (blocks of 16 quantized rows) once per layout as it is quantized, for all outputs
  // and threads: not repacked from the row-major rows by every output's product on every thread.
  std::size_t amx_block[kQmmMaxOutputs] = {};  // bytes per block; 0: row-major rows
  bool amx = false;
  if (rows > std::max(gemv_rows[0], gemv_rows[1]) && dispatch::qmatmul_amx_x_bytes(lay[0].type, rows, k)) {
    act_bytes = 0;
    for (std::size_t l = 0; l < n_lay; ++l) {
      amx_block[l] = dispatch::qmatmul_amx_x_bytes(lay[l].type, kAmxRows, k);
      act_off[l] = act_bytes;
      act_bytes += dispatch::qmatmul_amx_x_bytes(lay[l].type, rows, k);
    }
    amx = true;
  }
  const std::size_t m_grain = amx ? kAmxRows : kMGrain;  // path 2's row ranges: whole repacked blocks
  const double ops = 2.0 * double(rows) * double(n_total) * double(k);
  std::size_t tasks = std::min<std::size_t>(threads, std::size_t(ops / kMinOpsPerThread) + 1);
  const std::size_t n_units = unit0[n_outs], m_units = (rows + m_grain - 1) / m_grain;
  // The path: 0 = one thread, 1 = tasks over units of W's rows, 2 = tasks over the quantized rows (GEMM).
  const int path = tasks <= 1 || (n_units < 2 && (!gemm || m_units < 2)) ? 0
                   : n_units >= tasks || !gemm || m_units < 2            ? 1
                                                                         : 2;
  tasks = std::min(tasks, path == 1 ? n_units : m_units);

  // Rows [r0, r1) of x in layout l into the activation buffer `act`.
  auto quantize = [&](std::byte* act, std::size_t l, std::size_t r0, std::size_t r1) {
    const std::size_t rb = lay[l].row_bytes;
    std::byte* a = act + act_off[l];
    if (amx_block[l])  // quantized rows [r0, r1) start a block: x_grain below
      dispatch::qmatmul_quantize_amx(lay[l].type, x, ldx, m, k, split, (split ? 2 * r0 : r0) / kAmxRows,
                                     ((split ? 2 * r1 : r1) + kAmxRows - 1) / kAmxRows, a);
    else if (split)  // row i's parts at quantized rows 2i (x) and 2i + 1 (residual): kQmmPairs
      dispatch::qmatmul_quantize_split(lay[l].type, x + std::ptrdiff_t(r0) * ldx, ldx, r1 - r0, k, a + 2 * r0 * rb,
                                       a + (2 * r0 + 1) * rb, 2 * rb);
    else dispatch::qmatmul_quantize(lay[l].type, x + std::ptrdiff_t(r0) * ldx, ldx, r1 - r0, k, a + r0 * rb);
  };
  // Quantized rows [m0, m1) of `act` (even when split: whole pairs) times rows [n0, n1) of output i's W into
  // y (its rows m0.., or m0 / 2.. when split). Row ranges of W start at multiples of kNGrain = 16: whole
  // interleaved groups.
  auto run = [&](const std::byte* act, std::size_t i, std::size_t m0, std::size_t m1, std::size_t n0, std::size_t n1) {
    const QmmOutput& o = outs[i];
    const std::size_t l = lay_of[i], y0 = split ? m0 / 2 : m0;
    const bool g = rows > gemv_rows[o.interleaved], ax = amx_block[l] != 0;
    dispatch::qmatmul_rows(
        o.type, act + act_off[l] + (ax ? m0 / kAmxRows * amx_block[l] : m0 * lay[l].row_bytes), m1 - m0, k,
        o.w + std::ptrdiff_t(n0) * o.ldw, o.ldw, n1 - n0, o.y + std::ptrdiff_t(y0) * o.ldy + std::ptrdiff_t(n0), o.ldy,
        (g ? kQmmGemm : 0u) | (ax ? kQmmAmxX : 0u) | (split ? kQmmPairs : 0u) | (o.interleaved ? kQmmInterleaved : 0u));
  };
  auto run_units = [&](const std::byte* act, std::size_t u0, std::size_t u1) {  // units [u0, u1) of all outputs
    for (std::size_t i = 0; i < n_outs; ++i) {
      const std::size_t a = std::max(u0, unit0[i]), b = std::min(u1, unit0[i + 1]);
      if (a >= b) continue;
      run(act, i, 0, rows, (a - unit0[i]) * kNGrain, std::min(outs[i].n, (b - unit0[i]) * kNGrain));
    }
  };

  // The GEMV over several threads (a decode step): each thread quantizes x into its own scratch as its
  // first task starts, instead of the caller quantizing while the others wait and then each reading the
  // caller's copy. The work is O(rows K) against the GEMV's O(rows N K), and the copies are identical.
  constexpr std::size_t kMaxOwnCopies = 64;
  const bool own_copies = path == 1 && rows <= gemv_rows[1] && threads <= kMaxOwnCopies;
  std::byte* act = nullptr;
  if (!own_copies) {
    act = static_cast<std::byte*>(qmm_scratch(0, act_bytes));
    // Quantizing x costs O(M K); split it over rows only when there are many.
    if (threads > 1 && rows >= 64) {
      const std::size_t per = std::min(threads, rows / 32);                     // tasks per layout
      const std::size_t x_grain = amx ? (split ? kAmxRows / 2 : kAmxRows) : 1;  // whole repacked blocks
      pool->parallel_for(per * n_lay, [&](std::size_t t, std::size_t) {
        const auto [r0, r1] = split_range(m, per, t % per, x_grain);
        if (r0 < r1) quantize(act, t / per, r0, r1);
      });
    } else {
      for (std::size_t l = 0; l < n_lay; ++l) quantize(act, l, 0, m);
    }
  }
  if (path == 0) {
    run_units(act, 0, n_units);
  } else if (path == 1) {
    std::byte* own[kMaxOwnCopies] = {};  // by thread index, when own_copies
    pool->parallel_for(tasks, [&](std::size_t t, std::size_t thread) {
      const std::byte* a = act;
      if (own_copies) {
        if (!own[thread]) {
          own[thread] = static_cast<std::byte*>(qmm_scratch(0, act_bytes));
          for (std::size_t l = 0; l < n_lay; ++l) quantize(own[thread], l, 0, m);
        }
        a = own[thread];
      }
      const auto [u0, u1] = split_range(n_units, tasks, t);
      if (u0 < u1) run_units(a, u0, u1);
    });
  } else {  // GEMM with fewer units than threads: the quantized rows, kMGrain (even) at a time
    pool->parallel_for(tasks, [&](std::size_t t, std::size_t) {
      const auto [m0, m1] = split_range(rows, tasks, t, m_grain);
      if (m0 < m1)
        for (std::size_t i = 0; i < n_outs; ++i)
          if (outs[i].n) run(act, i, m0, m1, 0, outs[i].n);
    });
  }
}

/// Runs the quantize + kernel steps of one checked product, splitting over the pool.
inline void qmatmul_run(uint32_t type, const float* x, std::ptrdiff_t ldx, std::size_t m, std::size_t k, const void* w,
                        std::ptrdiff_t ldw, std::size_t n, float* y, std::ptrdiff_t ldy, ThreadPool* pool) {
  const QmmOutput o{type, static_cast<const std::byte*>(w), ldw, n, y, ldy};
  qmatmul_multi_run(x, ldx, m, k, &o, 1, false, pool);
}

/// Row stride in bytes of a raw weight of T blocks by x's K (row_bytes 0: packed rows), checked: K a whole
/// number of blocks, rows aligned for T and no shorter than K values.
template <class T, class X>
std::size_t qmm_row_stride(const char* op, const X& x, const void* w, std::size_t row_bytes) {
  const std::size_t k = x.extent(X::rank() - 1);
  constexpr std::size_t bs = dtype_traits<T>::block_size;
  if (k % bs != 0)
    fail<ShapeError>("kiln::", op, ": K = ", k, " (x ", shape_str(x), ") is not a multiple of the ", dtype_name<T>,
                     " block size ", bs);
  const std::size_t per_row = k / bs;
  const std::size_t stride_bytes = row_bytes ? row_bytes : per_row * sizeof(T);
  if (stride_bytes % sizeof(T) != 0 || stride_bytes < per_row * sizeof(T) ||
      reinterpret_cast<std::uintptr_t>(w) % alignof(T) != 0)
    fail<ShapeError>("kiln::", op, ": ", dtype_name<T>, " weight rows of ", stride_bytes, " bytes at ", w,
                     " are misaligned or shorter than K = ", k, " values");
  return stride_bytes;
}

}  // namespace detail

/// y = x * W^T. Shapes: x (..., K) f32, w (N, K / block_size) blocks, y (..., N) f32 with x's leading
/// dimensions. The last dimension of x and y must be contiguous; rows may be strided. y must not overlap
/// x or w.
template <class X, class W, class Y>
void qmatmul(const X& x, const W& w, const Y& y, ThreadPool* pool = nullptr) {
  KILN_REQUIRE_DTYPE(X, float, "qmatmul", "x");
  KILN_REQUIRE_DTYPE(Y, float, "qmatmul", "y");
  KILN_REQUIRE_WRITABLE(Y, "qmatmul", "y");
  static_assert(TensorLike<W>, "kiln::qmatmul: w must be a kiln::Tensor view");
  using B = typename std::remove_cvref_t<W>::value_type;
  static_assert(
      qmatmul_supported_v<B>,
      "kiln::qmatmul: w must be a view of q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K or mxfp4 blocks (wrong "
      "dtype; f32, f16 and bf16 weights go through kiln::matmul)");
  static_assert(W::rank() == 2, "kiln::qmatmul: w must be rank 2 (N, K / block_size)");
  static_assert(X::rank() == Y::rank(), "kiln::qmatmul: x (..., K) and y (..., N) must have the same rank");
  constexpr std::size_t bs = block_size_v<B>;
  const std::size_t k = x.extent(X::rank() - 1);
  if (k % bs != 0)
    fail<ShapeError>("kiln::qmatmul: K = ", k, " (x ", detail::shape_str(x), ") is not a multiple of the ",
                     dtype_name<B>, " block size ", bs);
  bool ok = w.extent(1) * bs == k && y.extent(Y::rank() - 1) == w.extent(0);
  for (std::size_t r = 0; ok && r + 1 < X::rank(); ++r) ok = x.extent(r) == y.extent(r);
  if (!ok)
    fail<ShapeError>("kiln::qmatmul: x ", detail::shape_str(x), ", w ", detail::shape_str(w), " and y ",
                     detail::shape_str(y), " do not fit: need x (..., K), w (N, K / ", bs, "), y (..., N)");
  if ((w.extent(1) > 1 && w.stride(1) != 1) || (w.extent(0) > 1 && w.stride(0) < std::ptrdiff_t(w.extent(1))))
    fail<ShapeError>("kiln::qmatmul: w ", detail::shape_str(w),
                     " must have contiguous rows of blocks (row stride >= K / block_size)");
  if (detail::overlaps(y, x) || detail::overlaps(y, w))
    fail<ShapeError>("kiln::qmatmul: y ", detail::shape_str(y), " overlaps x ", detail::shape_str(x), " or w ",
                     detail::shape_str(w), " (the output must be a separate buffer)");
  const auto xr = detail::as_rows(x, "qmatmul", "x");
  const auto yr = detail::as_rows(y, "qmatmul", "y");
  const std::size_t m = xr.rows, n = w.extent(0);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::size_t i = 0; i < m; ++i) std::fill_n(yr.data + std::ptrdiff_t(i) * yr.stride, n, 0.0f);
    return;
  }
  const std::ptrdiff_t ldw = (n > 1 ? w.stride(0) : std::ptrdiff_t(w.extent(1))) * std::ptrdiff_t(sizeof(B));
  detail::qmatmul_run(dtype_traits<B>::ggml_type, xr.data, xr.stride, m, k, w.data(), ldw, n, yr.data, yr.stride, pool);
}

/// y = x * W^T with W given as a GGUF type id and a raw pointer: n rows of K = x's last extent values,
/// row_bytes apart (0: packed rows, ggml_row_bytes(type, K)). Block types go through the typed qmatmul;
/// F32, F16 and BF16 through kiln::matmul. Throws ShapeError for a type kiln cannot multiply by.
template <class X, class Y>
void qmatmul(const X& x, uint32_t ggml_type, const void* w, std::size_t n, std::size_t row_bytes, const Y& y,
             ThreadPool* pool = nullptr) {
  const std::size_t k = x.extent(X::rank() - 1);
  bool handled = false;
  const bool known = visit_ggml_type(ggml_type, [&]<class T>(T*) {
    const std::size_t per_row = k / dtype_traits<T>::block_size;
    const std::size_t stride_bytes = detail::qmm_row_stride<T>("qmatmul", x, w, row_bytes);
    const auto wt =
        make_strided<const T, 2>(static_cast<const T*>(w), {n, per_row}, {std::ptrdiff_t(stride_bytes / sizeof(T)), 1});
    if constexpr (qmatmul_supported_v<T>) {
      qmatmul(x, wt, y, pool);
      handled = true;
    } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, f16> || std::is_same_v<T, bf16>) {
      matmul(x, wt, y, pool);
      handled = true;
    }
  });
  if (!known || !handled)
    fail<ShapeError>("kiln::qmatmul: GGUF weight type ", ggml_type,
                     " is not supported (supported: f32, f16, bf16, "
                     "q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K, mxfp4)");
}

// The scalar references (kiln::ref::qmatmul_dequant, qmatmul_int, qmm_split_residual): ops/qmatmul_ref.hpp,
// included at the end of this header.

}  // namespace kiln

namespace kiln {
namespace kernels {

/// One weight of qmatmul_multi: n rows of K values (K = x's last extent) of GGUF type `type`, row_bytes
/// apart (0: packed rows). interleaved: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 or Q4_K in 16-row interleaved groups
/// (qmm_interleave_rows, quant/interleave.hpp; rows contiguous), the layout the kernels read fastest.
struct QmmWeight {
  uint32_t type = 0;
  const void* data = nullptr;
  std::size_t n = 0;
  std::size_t row_bytes = 0;
  bool interleaved = false;
};

/// How qmatmul_multi carries x through the integer products: one 8-bit part (qmatmul) or two
/// (qmatmul_split_act).
enum class ActParts { one, two };

}  // namespace kernels

namespace detail {

/// Checks one weight of a product by x against y as the raw-pointer qmatmul does, for a type with an
/// integer kernel, and returns the product as a QmmOutput.
template <class X, class Y>
QmmOutput qmm_output(const char* op, const X& x, const kernels::QmmWeight& w, const Y& y) {
  const std::size_t k = x.extent(X::rank() - 1);
  const auto xr = as_rows(x, op, "x");
  const auto yr = as_rows(y, op, "y");
  if (yr.rows != xr.rows || y.extent(Y::rank() - 1) != w.n)
    fail<ShapeError>("kiln::", op, ": x ", shape_str(x), " and y ", shape_str(y), " do not fit a weight of ", w.n,
                     " rows: need x (..., K), y (..., ", w.n, ")");
  QmmOutput o;
  std::size_t w_bytes = 0;
  visit_ggml_type(w.type, [&]<class T>(T*) {
    const std::size_t per_row = k / dtype_traits<T>::block_size;
    const std::size_t stride_bytes = qmm_row_stride<T>(op, x, w.data, w.row_bytes);
    o = QmmOutput{
        w.type,       static_cast<const std::byte*>(w.data), std::ptrdiff_t(stride_bytes), w.n, yr.data, yr.stride,
        w.interleaved};
    if (w.interleaved && (!kernels::qmm_interleavable_v<T> || stride_bytes != per_row * sizeof(T)))
      fail<ShapeError>(
          "kiln::", op,
          ": an interleaved weight must be q4_0, q4_1, q5_0, q5_1, q8_0, q4_K or mxfp4 with contiguous rows (",
          dtype_name<T>, ", rows ", stride_bytes, " bytes apart for ", per_row * sizeof(T), " bytes)");
    w_bytes = w.n ? (w.n - 1) * stride_bytes + per_row * sizeof(T) : 0;
  });
  const auto [y0, y1] = byte_span(y);
  const auto* w0 = static_cast<const std::byte*>(w.data);
  if (overlaps(y, x) || (y0 != y1 && w_bytes && y0 < w0 + w_bytes && w0 < y1))
    fail<ShapeError>("kiln::", op, ": y ", shape_str(y), " overlaps x ", shape_str(x),
                     " or the weight (the output must be a separate buffer)");
  return o;
}

/// Checks that checked products by x (qmm_output) write disjoint outputs.
template <class X>
void qmm_check_outputs(const char* op, const X& x, const QmmOutput* outs, std::size_t n) {
  const auto xr = as_rows(x, op, "x");
  // Outputs must not share elements: their spans [y, y + (m - 1) ldy + n) are disjoint, or they are column
  // ranges of the same rows (equal row strides, disjoint within a row).
  auto end = [&](const QmmOutput& o) { return o.y + std::ptrdiff_t(xr.rows - 1) * o.ldy + std::ptrdiff_t(o.n); };
  auto interleaved = [&](const QmmOutput& a, const QmmOutput& b) {
    if (a.ldy != b.ldy || a.ldy <= 0) return false;
    const std::ptrdiff_t l = a.ldy, t = (((b.y - a.y) % l) + l) % l;  // b's start within a row of a
    return t >= std::ptrdiff_t(a.n) && t + std::ptrdiff_t(b.n) <= l;
  };
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (xr.rows && outs[i].n && outs[j].n && outs[i].y < end(outs[j]) && outs[j].y < end(outs[i]) &&
          !interleaved(outs[i], outs[j]))
        fail<ShapeError>("kiln::", op, ": outputs ", j, " and ", i, " overlap (each needs its own buffer)");
}

/// Checks that checked products by x (qmm_output) write disjoint outputs, then runs them.
template <class X>
void qmm_run_outputs(const char* op, const X& x, const QmmOutput* outs, std::size_t n, ThreadPool* pool,
                     kernels::ActParts parts) {
  qmm_check_outputs(op, x, outs, n);
  const auto xr = as_rows(x, op, "x");
  qmatmul_multi_run(xr.data, xr.stride, xr.rows, x.extent(X::rank() - 1), outs, n, parts == kernels::ActParts::two,
                    pool);
}

/// qmatmul_multi and qmatmul_split_act: weights with an integer kernel in one qmatmul_multi_run, the
/// others through the raw-pointer qmatmul one by one (f32, f16, bf16: matmul; the rest throw).
template <class X, class Y>
void qmatmul_multi_impl(const char* op, const X& x, std::span<const kernels::QmmWeight> w, std::span<const Y> y,
                        ThreadPool* pool, kernels::ActParts parts) {
  if (w.size() != y.size())
    fail<ShapeError>("kiln::", op, ": ", w.size(), " weights and ", y.size(), " outputs: need one output per weight");
  if (w.size() > kQmmMaxOutputs)
    fail<ShapeError>("kiln::", op, ": ", w.size(), " weights; at most ", kQmmMaxOutputs, " per call");
  QmmOutput outs[kQmmMaxOutputs];
  std::size_t n = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (w[i].interleaved && !kernels::qmm_interleavable(w[i].type))
      fail<ShapeError>("kiln::", op, ": weight ", i,
                       " is marked interleaved, but only q4_0, q4_1, q5_0, q5_1, q8_0, q4_K and mxfp4 have "
                       "an interleaved layout (GGUF type ",
                       w[i].type, ")");
    if (qmm_supported(w[i].type)) outs[n++] = qmm_output(op, x, w[i], y[i]);
    else qmatmul(x, w[i].type, w[i].data, w[i].n, w[i].row_bytes, y[i], pool);
  }
  qmm_run_outputs(op, x, outs, n, pool, parts);
}

}  // namespace detail

namespace kernels {

/// y[i] = x * W_i^T for weights that share their input x (a layer's Q, K and V, or its gate and up):
/// x (..., K) f32, y[i] (..., w[i].n) f32 with x's rows (the last dimensions contiguous, rows may be strided),
/// at most detail::kQmmMaxOutputs weights. x is quantized once per distinct activation layout (types whose
/// QActLayout is the same share it: Q4_1 with Q5_1, Q4_K with Q5_K; Q4_0, Q5_0, Q8_0, Q6_K and MXFP4 each their
/// own) in one part (ActParts::one, qmatmul) or two (ActParts::two, qmatmul_split_act), and one parallel_for
/// shares out the rows of all the weights. Each y[i] is bit-identical to qmatmul / qmatmul_split_act of
/// W_i alone, with any thread count. F32, F16 and BF16 weights go through qmatmul (kiln::matmul) one by
/// one; types without a kernel throw as qmatmul does.
template <class X, class Y>
void qmatmul_multi(const X& x, std::span<const QmmWeight> w, std::span<const Y> y, ThreadPool* pool = nullptr,
                   ActParts parts = ActParts::one) {
  KILN_REQUIRE_DTYPE(X, float, "qmatmul_multi", "x");
  KILN_REQUIRE_DTYPE(Y, float, "qmatmul_multi", "y");
  KILN_REQUIRE_WRITABLE(Y, "qmatmul_multi", "y");
  detail::qmatmul_multi_impl("qmatmul_multi", x, w, y, pool, parts);
}
template <class X, class Y>
void qmatmul_multi(const X& x, std::initializer_list<QmmWeight> w, std::initializer_list<Y> y,
                   ThreadPool* pool = nullptr, ActParts parts = ActParts::one) {
  qmatmul_multi(x, std::span<const QmmWeight>(w.begin(), w.size()), std::span<const Y>(y.begin(), y.size()), pool,
                parts);
}

/// y = x * W^T like qmatmul(x, ggml_type, w, n, row_bytes, y), with x carried in two 8-bit parts:
///   x = dx * q + r,  q = qmatmul's 8-bit rounding of x (per group of 32, or 256 for K-quants),
///   r = what that rounding left (|r| <= dx / 2; ref::qmm_split_residual), itself rounded to 8 bits with
///   the scale dx_r = dx / 2^s, s in [8, 12] per group (ref::qmm_split_residual_act): the finest that holds
///   the group's residuals without clamping. s = 8 when some |r| exceeds 127 dx / 512, the usual case; it
///   is finer in a group whose max is an outlier, where most values round to 0 and keep small residuals.
///   The power-of-two ratio lets the AVX-512 VNNI GEMM add the two parts' integer sums before converting.
/// Both parts are quantized from x in one pass (dispatch::qmatmul_quantize_split, no f32 copy), and the M
/// rows of x's part and the M rows of r's go through the kernel as one (2M, K) product (one pass over the
/// weights; for M <= 2 still the GEMV path); y = (x part) + (r part). The activation error falls from
/// dx / 2 to dx / 2^(s+1) <= dx / 512 (dx / 252 at worst, for the few residuals clamped from 128 to 127
/// where s = 8): products ~250x closer to the f32 ones, for about the same weight traffic.
/// Types without an integer kernel go to qmatmul (f32, f16, bf16) or throw as it does.
template <class X, class Y>
void qmatmul_split_act(const X& x, uint32_t ggml_type, const void* w, std::size_t n, std::size_t row_bytes, const Y& y,
                       ThreadPool* pool = nullptr) {
  KILN_REQUIRE_DTYPE(X, float, "qmatmul_split_act", "x");
  KILN_REQUIRE_DTYPE(Y, float, "qmatmul_split_act", "y");
  KILN_REQUIRE_WRITABLE(Y, "qmatmul_split_act", "y");
  const QmmWeight wt{ggml_type, w, n, row_bytes};
  detail::qmatmul_multi_impl("qmatmul_split_act", x, std::span<const QmmWeight>(&wt, 1), std::span<const Y>(&y, 1),
                             pool, ActParts::two);
}

}  // namespace kernels
}  // namespace kiln

#include "kiln/ops/qmatmul_ref.hpp"
