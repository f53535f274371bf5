// kiln/ops/dequant-inl.h - Highway body of the exact path's weight dequantization (ops/dequant_matmul.hpp),
// compiled once per target by the KILN_IMPLEMENTATION translation unit. Not for direct inclusion.
//
// Rows of a GGUF weight to f32, bit for bit what the scalar reference (quant/dequant.hpp, itself bit-exact
// with gguf-py) gives: each block's integers are unpacked with byte operations, then widened and scaled
// in vectors with the reference's own f32 operations in its order (a product, then the min added or
// subtracted). Interleaved weights (ops/qmatmul_interleave.hpp) are read in place,
// block column by block column, instead of gathering each row first. Types without a kernel here (Q2_K,
// Q3_K, F16, ...) go through the scalar reference.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_OPS_DEQUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_OPS_DEQUANT_INL_H_
#undef KILN_OPS_DEQUANT_INL_H_
#else
#define KILN_OPS_DEQUANT_INL_H_
#endif

#include <cstring>

#include <hwy/highway.h>

#include "kiln/ops/dequant_matmul.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace dq {

namespace hn = hwy::HWY_NAMESPACE;

// out[0, n) = s * q[i] (+ m), n a multiple of 16: the reference's f32 product (and sum) per value. Where a
// min follows, s * q is exact (s: an f16, or an f16 times a 6-bit scale; q: 4 or 5 bits), so whether the
// compiler fuses the two operations or not gives the same bits.
template <bool kAddMin>
HWY_INLINE void Scale(const int8_t* HWY_RESTRICT q, size_t n, float s, float m, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  const auto vs = hn::Set(df, s), vm = hn::Set(df, m);
  for (size_t i = 0; i < n; i += N) {
    const auto p = hn::Mul(vs, hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, q + i))));
    if constexpr (kAddMin) hn::StoreU(hn::Add(p, vm), df, out + i);
    else hn::StoreU(p, df, out + i);
  }
}

// The 32 values of a 4/5-bit block: low nibbles are values 0..15, high nibbles 16..31; Q5's bit j of qh
// is bit 4 of value j; minus `off`.
template <bool kQh>
HWY_INLINE void Unpack32(const uint8_t* HWY_RESTRICT qs, const uint8_t* qh, int off, int8_t* HWY_RESTRICT q) {
  uint32_t h = 0;
  if constexpr (kQh) h = ::kiln::detail::load_u32_le(qh);
  for (size_t j = 0; j < 16; ++j) {
    int lo = qs[j] & 0xF, hi = qs[j] >> 4;
    if constexpr (kQh) {
      lo |= int((h >> j) & 1u) << 4;
      hi |= int((h >> (j + 16)) & 1u) << 4;
    }
    q[j] = static_cast<int8_t>(lo - off);
    q[j + 16] = static_cast<int8_t>(hi - off);
  }
}

template <class B>
HWY_INLINE void Block(const B& b, float* HWY_RESTRICT out) {
  HWY_ALIGN int8_t q[256];
  if constexpr (std::is_same_v<B, block_q8_0>) {
    Scale<false>(b.qs, 32, float(b.d), 0.0f, out);
  } else if constexpr (std::is_same_v<B, block_q4_0>) {
    Unpack32<false>(b.qs, nullptr, 8, q);
    Scale<false>(q, 32, float(b.d), 0.0f, out);
  } else if constexpr (std::is_same_v<B, block_q4_1>) {
    Unpack32<false>(b.qs, nullptr, 0, q);
    Scale<true>(q, 32, float(b.d), float(b.m), out);
  } else if constexpr (std::is_same_v<B, block_q5_0>) {
    Unpack32<true>(b.qs, b.qh, 16, q);
    Scale<false>(q, 32, float(b.d), 0.0f, out);
  } else if constexpr (std::is_same_v<B, block_q5_1>) {
    Unpack32<true>(b.qs, b.qh, 0, q);
    Scale<true>(q, 32, float(b.d), float(b.m), out);
  } else if constexpr (std::is_same_v<B, block_q4_K> || std::is_same_v<B, block_q5_K>) {
    // sub-block 2c + h: nibble h of qs[32 c + l] (Q5_K: bit 2c + h of qh[l] as bit 4), dl * q - ml
    constexpr bool kQh = std::is_same_v<B, block_q5_K>;
    const float d = float(b.d), dmin = float(b.dmin);
    for (size_t c = 0; c < 4; ++c)
      for (size_t h = 0; h < 2; ++h) {
        const size_t sub = 2 * c + h;
        uint8_t sc, mn;
        ::kiln::detail::get_scale_min_k4(sub, b.scales, sc, mn);
        int8_t* qq = q + 32 * sub;
        for (size_t l = 0; l < 32; ++l) {
          int v = (b.qs[32 * c + l] >> (4 * h)) & 0xF;
          if constexpr (kQh) v |= ((b.qh[l] >> sub) & 1) << 4;
          qq[l] = static_cast<int8_t>(v);
        }
        // dl * q - ml == dl * q + (-ml) exactly
        Scale<true>(qq, 32, d * float(sc), -(dmin * float(mn)), out + 32 * sub);
      }
  } else if constexpr (std::is_same_v<B, block_q6_K>) {
    // value h*128 + k*32 + l: nibble k / 2 of ql[h*64 + (k % 2)*32 + l], bit pair k of qh[h*32 + l]; minus 32
    const float d = float(b.d);
    for (size_t h = 0; h < 2; ++h)
      for (size_t k = 0; k < 4; ++k) {
        const uint8_t* ql = b.ql + h * 64 + (k % 2) * 32;
        const uint8_t* qh = b.qh + h * 32;
        int8_t* qq = q + h * 128 + k * 32;
        for (size_t l = 0; l < 32; ++l)
          qq[l] = static_cast<int8_t>((((ql[l] >> (4 * (k / 2))) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32);
        for (size_t g = 0; g < 2; ++g)  // sub-blocks of 16, scale d * scales[h*8 + k*2 + g]
          Scale<false>(qq + 16 * g, 16, d * float(b.scales[h * 8 + k * 2 + g]), 0.0f, out + h * 128 + k * 32 + 16 * g);
      }
  }
}

template <class B>
inline constexpr bool kHasKernel =
    std::is_same_v<B, block_q4_0> || std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_0> ||
    std::is_same_v<B, block_q5_1> || std::is_same_v<B, block_q8_0> || std::is_same_v<B, block_q4_K> ||
    std::is_same_v<B, block_q5_K> || std::is_same_v<B, block_q6_K>;

// Rows [r0, r0 + rows) of the n-row weight w (nb blocks a row, ldw bytes apart; interleaved: 16-row groups)
// into out (rows, nb * block size).
template <class B>
void Rows(const std::byte* w, size_t n, size_t ldw, bool interleaved, size_t r0, size_t rows, size_t nb,
          float* HWY_RESTRICT out) {
  constexpr size_t bs = block_size_v<B>, G = kQmmInterleaveRows;
  const size_t k = nb * bs, r1 = r0 + rows;
  size_t r = r0;
  if constexpr (qmm_interleavable_v<B>) {
    const size_t x16_end = interleaved ? HWY_MIN(r1, n / G * G) : r0;
    while (r < x16_end) {  // block column by block column of each group: its bytes are contiguous
      const size_t g = r / G, e = HWY_MIN(x16_end, (g + 1) * G);
      const std::byte* grp = w + g * G * nb * sizeof(B);
      for (size_t b = 0; b < nb; ++b)
        for (size_t j = r; j < e; ++j)
          Block(::kiln::detail::qmm_x16_block<B>(grp, j % G, b), out + (j - r0) * k + b * bs);
      r = e;
    }
  }
  for (; r < r1; ++r)
    for (size_t b = 0; b < nb; ++b) {
      B blk;  // copied: ldw need not keep the blocks aligned
      std::memcpy(static_cast<void*>(&blk), w + r * ldw + b * sizeof(B), sizeof(B));
      Block(blk, out + (r - r0) * k + b * bs);
    }
}

}  // namespace dq

// Rows [r0, r0 + rows) of W (GGUF type `type`, n rows of k values, ldw bytes apart; interleaved: see
// qmatmul_interleave.hpp) as f32 into out (rows, k).
void DequantRows(uint32_t type, const void* w, size_t n, size_t ldw, bool interleaved, size_t r0, size_t rows,
                 size_t k, float* out) {
  const auto* wb = static_cast<const std::byte*>(w);
  bool done = false;
  visit_ggml_type(type, [&]<class T>(T*) {
    if constexpr (dq::kHasKernel<T>) {
      dq::Rows<T>(wb, n, ldw, interleaved, r0, rows, k / block_size_v<T>, out);
      done = true;
    }
  });
  if (done) return;
  // The scalar reference (which names an unsupported type in its FormatError).
  for (size_t r = 0; r < rows; ++r) ::kiln::dequantize_row(type, wb + (r0 + r) * ldw, out + r * k, k);
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
HWY_EXPORT(DequantRows);
}  // namespace kiln

KILN_DISPATCH_BEGIN
void dequant_rows(uint32_t type, const void* w, std::size_t n, std::size_t ldw, bool interleaved, std::size_t r0,
                  std::size_t rows, std::size_t k, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantRows)(type, w, n, ldw, interleaved, r0, rows, k, out);
}
KILN_DISPATCH_END
#endif  // HWY_ONCE

#endif  // per-target include guard
