// kiln/ops/attention.hpp - scaled dot-product attention of one head, tiled (flash-style), over f32, f16 or
// Q8_0 keys and values: out = softmax(mask(softcap(scale * q K^T))) V.
//
//   q (rows, head_dim) f32, k and v (kv_len, head_dim) f32 or f16 (both the same) or (kv_len, head_dim / 32)
//   GGUF Q8_0 blocks (a q8_0 KV cache; each tile widened to d * q, exact: the bits of f32 k and v holding those
//   values), out (rows, head_dim) f32; each last dimension contiguous, rows any stride (a head's slice of a
//   wider matrix).
//
// Positions: with `causal`, query row r sits at position pos0 + r; without, every row sits at kv_len - 1
// (a decode step: all cached positions are in the past). A row at position p attends to the cached
// positions j <= p, and with window > 0 only to j > p - window (a sliding window). A row with nothing to
// attend to is zeros; a NaN or +inf score makes its row NaN (as ops/softmax.hpp).
// A sink (gpt-oss's learned per-head logit s) joins each row's softmax as one more score whose value is
// dropped: out = sum_j e^(y_j - m) v_j / (e^(s - m) + sum_j e^(y_j - m)), so a row may attend to almost nothing.
//
// The kernel never holds a (rows, kv_len) score matrix: for up to 32 query rows at a time it walks the
// positions in tiles of 64 (keys and values widened to f32 one tile at a time), keeps each row's running
// maximum m and sum l of exp(y - m), and rescales the row's accumulated values by exp(m_old - m_new)
// when m grows (the online softmax of Milakov & Gimelshein, as in FlashAttention). Its memory traffic is
// one read of K and V per 32 query rows, and its working set (attention_scratch_floats) stays in L2.
//
// Exactness. Every output row depends only on its query, its position and the cache: the tiles sit at
// fixed positions (multiples of 64), a row's sums run in the same order whichever rows share the call,
// and a tile with nothing for a row leaves that row's state bit for bit unchanged (exp(0) = 1 exactly).
// So splitting rows differently (chunks, batches, threads) gives the same bits. Against the two-pass
// softmax (scores, then max, then exp, then P V) the result differs by roundings only (u = 2^-24):
//   - exp(y - m) is evaluated with another m; the rescale factors exp(m_old - m_new) round their argument
//     (|m_old - m_new| u) and their value (1 ulp), and multiply the running sum and values alike, so they
//     cancel in acc / l except for those roundings: a relative (R + 2 t) u per weight, R the range of a
//     row's scores, t the number of tiles where its maximum grew;
//   - the sums of p and of p v are f32 over the positions in another order (the two-pass kernels' own
//     bound, a few u times the count of terms in the worst case).
// tests/ops/test_attention.cpp checks a bound built from these terms against a double-precision reference.
// The scalar reference is kiln::ref::attention.
//
// AMX bf16 tiles (AttentionOptions::amx_bf16, f16 K/V, head_dim a multiple of 32, where kiln::amx_bf16_active():
// Sapphire Rapids and later; kernels/dense/attention_amx-inl.h): the two products q K^T and P V run on bf16
// tiles with every operand split into two bf16 parts (f16 K and V exactly, q and the weights p to 2^-16), the
// online softmax between them in f32 vectors, up to attn_amx_rows(head_dim) rows (AttentionOptions::heads
// query heads x positions) per pass over the keys, in tiles of kAttnAmxTile positions. Each score and each
// row's value sum then carries about 3 * 2^-16 of its terms' magnitudes besides the f32 sums' roundings
// (docs/kernels.md derives the bound; tests/ops/test_attention_amx.cpp checks it). The exactness promises above
// hold on the tiles too (the choice depends on the options, the head size and the CPU only, never on the rows,
// heads or positions of a call; tiles of positions sit at fixed multiples of kAttnAmxTile, their pairs of
// positions and head elements in a fixed order); a non-finite q or K element makes its rows NaN (its lo part
// is inf - inf) where the f32 kernel may give a weight of 0 or an infinity.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "kiln/core/amx.hpp"
#include "kiln/core/check.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/kernels/dispatch.hpp"
#include "kiln/quant/blocks.hpp"

namespace kiln {

/// How kiln::attention masks and scales (see the top of this header).
struct AttentionOptions {
  float scale = 1.0f;      ///< multiplies q.k (> 0; usually 1 / sqrt(head_dim))
  float softcap = 0.0f;    ///< > 0: cap * tanh(y / cap) after scaling (Gemma 2)
  bool causal = false;     ///< row r at position pos0 + r; else every row at kv_len - 1
  std::size_t pos0 = 0;    ///< causal: the position of query row 0
  std::size_t window = 0;  ///< > 0: a row at position p sees positions (p - window, p] only
  /// The attention sink's logit (not scaled, not capped), joining each row's denominator; -inf: none.
  float sink = -std::numeric_limits<float>::infinity();
  std::span<float> scratch = {};  ///< at least attention_scratch_floats(head_dim) floats; empty: allocated
  /// true: q K^T and P V on AMX bf16 tiles where kiln::amx_bf16_active(), the cache is f16 and head_dim a multiple
  /// of 32 (see the top of this header; within about 3 * 2^-16 of the terms, not the f32 kernel's bits); else
  /// the f32 kernel. The transformer sets it at Precision::fast and fast8.
  bool amx_bf16 = false;
  /// Query heads sharing k and v (grouped-query attention): q and out are (rows, heads * head_dim), head j in
  /// columns [j head_dim, (j + 1) head_dim), each head's rows at the same positions. The same results as one
  /// call per head; on AMX tiles the heads' rows share one splitting of K and V into tiles.
  std::size_t heads = 1;
  /// With heads > 1: one sink logit per head (as `sink`); empty: `sink` for every head.
  std::span<const float> sinks = {};
};

namespace detail {
inline constexpr std::size_t kAttnRows = 32;  // query rows per pass over the keys
inline constexpr std::size_t kAttnTile = 64;  // positions per tile
// Rows (query heads x positions) per pass over the keys on AMX tiles, where K and V are split into tiles once:
// as many as keep the pass's accumulators and q tiles (3 x rows x head_dim floats) within about 300 KiB of L2.
inline constexpr std::size_t kAttnAmxRowsMax = 384;
// Positions per tile on AMX tiles: the accumulators go from tiles to memory and back (a store the next tile load
// waits for) and are rescaled once per tile, so longer tiles than the f32 kernel's.
inline constexpr std::size_t kAttnAmxTile = 256;
inline constexpr std::size_t attn_amx_rows(std::size_t head_dim) {
  return head_dim <= 64 ? kAttnAmxRowsMax : head_dim <= 128 ? 192 : 128;
}
}  // namespace detail

/// Floats of scratch one kiln::attention call needs for this head size (any row or head count, any target).
inline constexpr std::size_t attention_scratch_floats(std::size_t head_dim) {
  using detail::kAttnTile;
  constexpr std::size_t R = detail::kAttnRows;
  // The f32 kernel: q transposed, scores, keys and values of a tile widened, accumulators, m / l / alpha /
  // flags. On AMX tiles (rows A = attn_amx_rows): q's tiles, a tile of K's and of V^T's, two pairs of row
  // tiles' scores (main, corr), two pairs of row tiles' weights, two accumulators per output, 6 arrays of A. 16 floats
  // of slack per array for rounding each start up to 64 bytes.
  const std::size_t f32 = head_dim * R + kAttnTile * R + 2 * kAttnTile * head_dim + R * head_dim + 4 * R;
  const std::size_t A = detail::attn_amx_rows(head_dim);
  constexpr std::size_t TA = detail::kAttnAmxTile;
  const std::size_t amx = 3 * A * head_dim + 2 * TA * head_dim + 8 * TA * 16 + 4 * TA * 16 + 6 * A;
  return (f32 > amx ? f32 : amx) + 12 * 16;
}

}  // namespace kiln

namespace kiln::detail {
// attention_f32's kv_type: K and V in f32, f16 or rows of Q8_0 blocks (hd / 32 a row; kvs then in blocks).
inline constexpr unsigned kAttnKvF32 = 0, kAttnKvF16 = 1, kAttnKvQ8_0 = 2;
}  // namespace kiln::detail

KILN_DISPATCH_BEGIN
// q (rows, heads * hd) rows qs apart; k, v (kv_len, hd) rows kvs apart, of detail::kAttnKv*; out (rows,
// heads * hd) rows os apart. Row r at position pos0 + r * step (step 1: causal; 0: every row at pos0 = kv_len - 1).
// Head j's sink: sinks[j] (sinks null: sink). amx_bf16: on AMX bf16 tiles (the caller checked
// kiln::amx_bf16_active(); f16 K/V and hd % 32 == 0 on AVX3_DL, else ignored). scratch:
// attention_scratch_floats(hd) floats.
void attention_f32(const float* q, std::ptrdiff_t qs, const void* k, const void* v, unsigned kv_type,
                   std::ptrdiff_t kvs, std::size_t kv_len, float* out, std::ptrdiff_t os, std::size_t rows,
                   std::size_t hd, std::size_t heads, std::size_t pos0, std::size_t step, std::size_t window,
                   float scale, float softcap, float sink, const float* sinks, bool amx_bf16, float* scratch);
// Rows of scores s (rows, n), ss apart, in place: y = softcap(scale * s), m[r * ms] = max y, s = exp(y - m),
// l[r * ms] = sum of those. m = NaN for a row with a NaN or +inf score; m = -inf, l = 0 for one of -inf only.
void attention_exp_rows(float* s, std::ptrdiff_t ss, std::size_t rows, std::size_t n, float scale, float softcap,
                        float* m, float* l, std::ptrdiff_t ms);
KILN_DISPATCH_END

namespace kiln {

/// out = attention of q over (k, v) (see the top of this header). Shapes: q, out (rows, head_dim); k, v
/// (kv_len, head_dim), both f32 or both f16, or both GGUF Q8_0 blocks (kv_len, head_dim / 32) (a q8_0 KV cache:
/// each tile widened to d * q, exact, so the bits of f32 k, v holding the dequantized values).
template <class Q, class K, class V, class O>
void attention(const Q& q, const K& k, const V& v, const O& out, const AttentionOptions& opt = {}) {
  using KT = typename K::value_type;
  KILN_REQUIRE_DTYPE(Q, float, "attention", "q");
  KILN_REQUIRE_DTYPE(O, float, "attention", "out");
  KILN_REQUIRE_WRITABLE(O, "attention", "out");
  static_assert(std::is_same_v<KT, float> || std::is_same_v<KT, f16> || std::is_same_v<KT, block_q8_0>,
                "kiln::attention: k must be a view of float, kiln::f16 or kiln::block_q8_0 elements");
  KILN_REQUIRE_DTYPE(V, KT, "attention", "v (the same element type as k)");
  static_assert(Q::rank() == 2 && K::rank() == 2 && V::rank() == 2 && O::rank() == 2,
                "kiln::attention: q, k, v and out are 2-D views");
  constexpr bool q8 = std::is_same_v<KT, block_q8_0>;
  const std::size_t rows = q.extent(0), hd = k.extent(1) * (q8 ? QK8_0 : 1), kv_len = k.extent(0), heads = opt.heads;
  if (heads == 0) fail("kiln::attention: heads = 0: need at least one query head");
  if (q.extent(1) != heads * hd || v.extent(1) != k.extent(1) || v.extent(0) != kv_len || out.extent(0) != rows ||
      out.extent(1) != heads * hd)
    fail<ShapeError>("kiln::attention: q ", detail::shape_str(q), ", k ", detail::shape_str(k), ", v ",
                     detail::shape_str(v), " and out ", detail::shape_str(out), " with ", heads,
                     " head(s): need q, out (rows, heads * head_dim) and k, v (kv_len, head_dim)");
  if (!opt.sinks.empty() && opt.sinks.size() != heads)
    fail("kiln::attention: ", opt.sinks.size(), " sinks for ", heads, " heads: need one per head (or none)");
  for (const float s : opt.sinks)
    if (std::isnan(s) || s == std::numeric_limits<float>::infinity())
      fail("kiln::attention: sink ", s, " must be finite or -inf (none)");
  if (k.stride(0) != v.stride(0))
    fail<ShapeError>("kiln::attention: k and v rows are ", k.stride(0), " and ", v.stride(0),
                     " elements apart: they must share a row stride");
  if (!(opt.scale > 0.0f) || !std::isfinite(opt.scale) || !(opt.softcap >= 0.0f))
    fail("kiln::attention: scale ", opt.scale, " must be finite and > 0, softcap ", opt.softcap, " >= 0");
  if (std::isnan(opt.sink) || opt.sink == std::numeric_limits<float>::infinity())
    fail("kiln::attention: sink ", opt.sink, " must be finite or -inf (none)");
  if (rows == 0 || hd == 0) return;
  const auto qr = detail::as_rows(q, "attention", "q");
  const auto kr = detail::as_rows(k, "attention", "k");
  const auto vr = detail::as_rows(v, "attention", "v");
  const auto orow = detail::as_rows(out, "attention", "out");
  const std::size_t need = attention_scratch_floats(hd);
  if (!opt.scratch.empty() && opt.scratch.size() < need)
    fail("kiln::attention: scratch of ", opt.scratch.size(), " floats, need attention_scratch_floats(", hd,
         ") = ", need);
  std::vector<float> own;
  float* scratch = opt.scratch.data();
  if (opt.scratch.empty()) {
    own.resize(need);
    scratch = own.data();
  }
  if (kv_len == 0) {
    for (std::size_t r = 0; r < rows; ++r) std::fill_n(orow.data + std::ptrdiff_t(r) * orow.stride, heads * hd, 0.0f);
    return;
  }
  const std::size_t pos0 = opt.causal ? opt.pos0 : kv_len - 1;
  // From the options, the head size and the CPU only: a row's bits must not depend on the call it is in.
  const bool amx = opt.amx_bf16 && std::is_same_v<KT, f16> && hd % 32 == 0 && amx_bf16_active();
  const unsigned kv_type = q8 ? detail::kAttnKvQ8_0 : std::is_same_v<KT, f16> ? detail::kAttnKvF16 : detail::kAttnKvF32;
  dispatch::attention_f32(qr.data, qr.stride, kr.data, vr.data, kv_type, kr.stride, kv_len, orow.data, orow.stride,
                          rows, hd, heads, pos0, opt.causal ? 1 : 0, opt.window, opt.scale, opt.softcap, opt.sink,
                          opt.sinks.empty() ? nullptr : opt.sinks.data(), amx, scratch);
}

namespace ref {
/// Scalar reference in double: out (rows, hd) from q (rows, hd) and k, v (kv_len, hd) row-major (f32 or
/// f16 values read exactly), with the masks and soft-cap of `opt` (scratch ignored).
template <class T>
void attention(const float* q, const T* k, const T* v, float* out, std::size_t rows, std::size_t hd, std::size_t kv_len,
               const AttentionOptions& opt) {
  auto val = [](T x) {
    if constexpr (std::is_same_v<T, f16>) return double(f16_bits_to_f32(x.bits));
    else return double(x);
  };
  std::vector<double> y(kv_len), acc(hd);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t p = opt.causal ? opt.pos0 + r : kv_len - 1;
    const std::size_t hi = std::min(kv_len, p + 1), lo = opt.window > 0 && p + 1 > opt.window ? p + 1 - opt.window : 0;
    double m = -std::numeric_limits<double>::infinity();
    for (std::size_t j = lo; j < hi; ++j) {
      double s = 0;
      for (std::size_t d = 0; d < hd; ++d) s += double(q[r * hd + d]) * val(k[j * hd + d]);
      s *= double(opt.scale);
      if (opt.softcap > 0) s = double(opt.softcap) * std::tanh(s / double(opt.softcap));
      y[j] = s;
      m = std::max(m, s);
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    double sum = 0;
    for (std::size_t j = lo; j < hi; ++j) {
      const double e = std::exp(y[j] - m);
      sum += e;
      for (std::size_t d = 0; d < hd; ++d) acc[d] += e * val(v[j * hd + d]);
    }
    if (opt.sink > -std::numeric_limits<float>::infinity() && hi > lo) sum += std::exp(double(opt.sink) - m);
    for (std::size_t d = 0; d < hd; ++d) out[r * hd + d] = hi > lo ? float(acc[d] / sum) : 0.0f;
  }
}
}  // namespace ref

}  // namespace kiln
