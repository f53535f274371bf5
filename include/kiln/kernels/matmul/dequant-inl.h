// kiln/kernels/matmul/dequant-inl.h - Highway body of the exact path (ops/dequant_matmul.hpp): weight
// dequantization and the fused dequantizing GEMV, compiled once per target by the KILN_IMPLEMENTATION
// translation unit. Not for direct inclusion.
//
// Every value is bit for bit what the scalar reference (quant/dequant.hpp, itself bit-exact with gguf-py)
// gives: each block's bytes are widened to 32-bit lanes, their bit fields picked out with shifts and masks,
// and scaled with the reference's own f32 operations in its order (a product, then the min added or
// subtracted; on AVX-512 the 4/5-bit types look the products up in a per-block table built with those
// operations). Interleaved weights (quant/interleave.hpp) are read in place: a block column's quants
// are transposed back into each row's byte order (two rounds of interleaves per 4 steps), then go through
// the same per-block code as row-major blocks. The producers hand each vector of values to a sink: Rows
// stores them into the tile (dispatch::dequant_rows), Gemv feeds them to FMA chains (dispatch::dequant_gemv).
// Types without a kernel here (Q2_K, Q3_K, F16, ...) go through the scalar reference and the tile.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_MATMUL_DEQUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_MATMUL_DEQUANT_INL_H_
#undef KILN_KERNELS_MATMUL_DEQUANT_INL_H_
#else
#define KILN_KERNELS_MATMUL_DEQUANT_INL_H_
#endif

#include <cstddef>
#include <cstring>
#include <utility>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kiln/kernels/x86/common.hpp"

#include "kiln/ops/dequant_matmul.hpp"
#include "kiln/kernels/matmul/lane_sums-inl.h"

// For the lambdas that carry a block's values into the FMAs (HWY_INLINE for lambdas): left out of line by
// GCC, they took the accumulators through the stack (0.6x the speed).
#ifndef KILN_DQ_INLINE
#if defined(__GNUC__)
#define KILN_DQ_INLINE __attribute__((always_inline))
#else
#define KILN_DQ_INLINE
#endif
#endif

// f16 scales widen with vcvtph2ps where the target has F16C (x86 AVX2 and up); elsewhere kiln's scalar
// conversion, because Highway 1.0.3's emulated widening turns f16 infinities into 65536.
#undef KILN_DQ_F16C
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define KILN_DQ_F16C 1
#else
#define KILN_DQ_F16C 0
#endif

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace dq {

namespace hn = hwy::HWY_NAMESPACE;

using Df = hn::ScalableTag<float>;
using Di = hn::Rebind<int32_t, Df>;
using Du = hn::Rebind<uint32_t, Df>;
using D8 = hn::Rebind<uint8_t, Df>;

// 0, 1, 2, ... as f32 and u32: loaded instead of hn::Iota, which Highway 1.0.3 builds through a stack array
// (free at -O3, but ~15% of the exact path's time in the -O0 sanitizer build).
alignas(64) inline constexpr float kIota[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                                16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
alignas(64) inline constexpr uint32_t kIotaU[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// The reference's f32 operations per value: s * q, then (kAddMin) + m. Where a min follows, s * q is exact
// (s: an f16, or an f16 times a 6-bit scale; q: at most 6 bits), so whether the compiler fuses the two
// operations or not gives the same bits.
//
// Every producer below hands its values to a sink, sink(offset in the block, vector), in increasing offsets:
// Rows stores them into the tile, Gemv feeds them to its FMA chains in GemvM's order.
template <bool kAddMin, class Sink>
HWY_INLINE void Emit(hn::Vec<Di> q, hn::Vec<Df> s, hn::Vec<Df> m, size_t o, Sink& sink) {
  const auto p = hn::Mul(s, hn::ConvertTo(Df(), q));
  if constexpr (kAddMin) sink(o, hn::Add(p, m));
  else sink(o, p);
}

// AVX-512: a 4-bit (5-bit) block's values take at most 16 (32) distinct values, s * (q - off) (+ m), so
// they are computed once per block (or K sub-block) into a table with the same operations, then looked
// up per vector with one vpermps (vpermt2ps): a permute instead of a subtract, convert, multiply and add.
#undef KILN_DQ_LUT
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define KILN_DQ_LUT 1
struct Lut {
  hn::Vec<Df> lo, hi;  // t[q] for q = 0..15, 16..31
};
template <bool kAddMin, bool k32>
HWY_INLINE Lut MakeLut(float s, float m, int32_t off) {
  const Df df;
  const auto q0 = hn::Sub(hn::LoadU(df, kIota), hn::Set(df, float(off)));  // exact small integers
  const auto vs = hn::Set(df, s), vm = hn::Set(df, m);
  auto entry = [&](hn::Vec<Df> q) HWY_ATTR KILN_DQ_INLINE {
    const auto p = hn::Mul(vs, q);
    if constexpr (kAddMin) return hn::Add(p, vm);
    else return p;
  };
  Lut t{entry(q0), hn::Zero(df)};
  if constexpr (k32) t.hi = entry(hn::Add(q0, hn::Set(df, 16.0f)));
  return t;
}
KILN_X86_DIAGNOSTICS_PUSH
template <bool k32>
HWY_INLINE hn::Vec<Df> Lookup(const Lut& t, hn::Vec<Di> q) {  // t[q], q in [0, 16) or [0, 32)
  if constexpr (k32) return hn::Vec<Df>{_mm512_permutex2var_ps(t.lo.raw, q.raw, t.hi.raw)};
  else return hn::Vec<Df>{_mm512_permutexvar_ps(q.raw, t.lo.raw)};
}
KILN_X86_DIAGNOSTICS_POP
#else
#define KILN_DQ_LUT 0
#endif

// 16 signed bytes: value o + i = s * q[i] (Q8_0).
template <class Sink>
HWY_INLINE void ScaleI8(const int8_t* HWY_RESTRICT q, float s, size_t o, Sink& sink) {
  const hn::Rebind<int8_t, Df> d8;
  const auto vs = hn::Set(Df(), s), zero = hn::Zero(Df());
  for (size_t i = 0; i < 16; i += hn::Lanes(Df()))
    Emit<false>(hn::PromoteTo(Di(), hn::LoadU(d8, q + i)), vs, zero, o + i, sink);
}

// A 32-value Q4_0 / Q4_1 / Q5_0 / Q5_1 block from its 16 qs bytes: value j < 16 is the low nibble of qs[j],
// value 16 + j the high one; Q5 (kQh): bit j of qh is bit 4 of value j; minus off, times d (plus m).
template <bool kQh, bool kMin, class Sink>
HWY_INLINE void Nibbles32(const uint8_t* HWY_RESTRICT qs, uint32_t qh, int32_t off, float d, float m, Sink& sink) {
  const size_t N = hn::Lanes(Df());
  const auto vd = hn::Set(Df(), d), vm = hn::Set(Df(), m);
  const auto k15 = hn::Set(Di(), 15), voff = hn::Set(Di(), off);
  const auto iota = hn::LoadU(Du(), kIotaU), one = hn::Set(Du(), 1u), vqh = hn::Set(Du(), qh);
#if KILN_DQ_LUT
  const Lut t = MakeLut<kMin, kQh>(d, m, off);
#endif
  for (size_t h = 0; h < 2; ++h)  // low nibbles (values 0..15), then high ones
    for (size_t i = 0; i < 16; i += N) {
      const auto b = hn::BitCast(Di(), hn::PromoteTo(Du(), hn::LoadU(D8(), qs + i)));
      auto q = h ? hn::ShiftRight<4>(b) : hn::And(b, k15);
      if constexpr (kQh) {  // bits 16h + i .. of qh
        const auto sh = hn::Add(iota, hn::Set(Du(), uint32_t(16 * h + i)));
        q = hn::Or(q, hn::BitCast(Di(), hn::ShiftLeft<4>(hn::And(hn::Shr(vqh, sh), one))));
      }
#if KILN_DQ_LUT
      sink(16 * h + i, Lookup<kQh>(t, q));
      (void)vd, (void)vm, (void)voff;
#else
      Emit<kMin>(hn::Sub(q, voff), vd, vm, 16 * h + i, sink);
#endif
    }
}

// A Q4_K / Q5_K block (256 values): sub-block 2c + h is nibble h of qs[32 c + l] (Q5_K: bit 2c + h of qh[l] as
// bit 4), times d * scale, minus dmin * min. qs byte j is at qs + (j / 16) * cs + j % 16 (cs = 16: contiguous;
// the interleaved path passes its transposed chunks).
template <bool kQh, class Sink>
HWY_INLINE void K4(const uint8_t* HWY_RESTRICT qs, size_t cs, const uint8_t* HWY_RESTRICT qh,
                   const uint8_t* HWY_RESTRICT scales, float d, float dmin, Sink& sink) {
  const size_t N = hn::Lanes(Df());
  uint8_t sc[8], mn[8];
  ::kiln::detail::scales_mins_k4(scales, sc, mn);
  const auto k15 = hn::Set(Di(), 15), one = hn::Set(Di(), 1);
  for (size_t c = 0; c < 4; ++c)
    for (size_t h = 0; h < 2; ++h) {
      const size_t sub = 2 * c + h;
      // dl * q - ml == dl * q + (-ml) exactly
      const auto vd = hn::Set(Df(), d * float(sc[sub])), vm = hn::Set(Df(), -(dmin * float(mn[sub])));
#if KILN_DQ_LUT
      const Lut t = MakeLut<true, kQh>(d * float(sc[sub]), -(dmin * float(mn[sub])), 0);
#endif
      for (size_t l = 0; l < 32; l += N) {
        const size_t j = 32 * c + l;
        const auto b = hn::BitCast(Di(), hn::PromoteTo(Du(), hn::LoadU(D8(), qs + (j / 16) * cs + j % 16)));
        auto q = hn::And(hn::ShiftRightSame(b, int(4 * h)), k15);
        if constexpr (kQh) {
          const auto bh = hn::BitCast(Di(), hn::PromoteTo(Du(), hn::LoadU(D8(), qh + l)));
          q = hn::Or(q, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(bh, int(sub)), one)));
        }
#if KILN_DQ_LUT
        sink(32 * sub + l, Lookup<kQh>(t, q));
        (void)vd, (void)vm;
#else
        Emit<true>(q, vd, vm, 32 * sub + l, sink);
#endif
      }
    }
}

// A Q6_K block: value h*128 + k*32 + l is nibble k / 2 of ql[h*64 + (k % 2)*32 + l] with bits 2k, 2k + 1 of
// qh[h*32 + l] as bits 4, 5, minus 32, times d * scales[(h*128 + k*32 + l) / 16]. Each half's 128 quants
// are put together in bytes, 32 at a time (a quarter of the shifts and masks of doing it in 32-bit lanes),
// then widened 16 at a time as they are scaled.
template <class Sink>
HWY_INLINE void Q6K(const uint8_t* HWY_RESTRICT p, float d, Sink& sink) {  // p: the block's bytes
  using B = block_q6_K;
  const size_t N = hn::Lanes(Df());
  const hn::CappedTag<uint8_t, 32> d8;
  const hn::Rebind<int8_t, Df> di8;
  const auto* scales = reinterpret_cast<const int8_t*>(p + offsetof(B, scales));
  const auto zero = hn::Zero(Df());
  const auto k15 = hn::Set(d8, uint8_t{15}), k3 = hn::Set(d8, uint8_t{3}), k32 = hn::Set(d8, uint8_t{32});
  HWY_ALIGN uint8_t q[128];  // one half's q - 32 (as int8), value order
  for (size_t h = 0; h < 2; ++h) {
    const uint8_t* ql = p + offsetof(B, ql) + h * 64;
    const uint8_t* qh = p + offsetof(B, qh) + h * 32;
    for (size_t l = 0; l < 32; l += hn::Lanes(d8)) {
      const auto a = hn::LoadU(d8, ql + l), c = hn::LoadU(d8, ql + 32 + l), hb = hn::LoadU(d8, qh + l);
      hn::Store(hn::Sub(hn::Or(hn::And(a, k15), hn::ShiftLeft<4>(hn::And(hb, k3))), k32), d8, q + l);
      hn::Store(hn::Sub(hn::Or(hn::And(c, k15), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(hb), k3))), k32), d8,
                q + 32 + l);
      hn::Store(hn::Sub(hn::Or(hn::ShiftRight<4>(a), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(hb), k3))), k32), d8,
                q + 64 + l);
      hn::Store(hn::Sub(hn::Or(hn::ShiftRight<4>(c), hn::ShiftLeft<4>(hn::ShiftRight<6>(hb))), k32), d8, q + 96 + l);
    }
    for (size_t j = 0; j < 128; j += N) {  // N <= 16: a step stays in one sub-block of 16
      const size_t e = h * 128 + j;
      Emit<false>(hn::PromoteTo(Di(), hn::LoadU(di8, reinterpret_cast<const int8_t*>(q + j))),
                  hn::Set(Df(), d * float(scales[e / 16])), zero, e, sink);
    }
  }
}

template <class B>
HWY_INLINE float F16At(const uint8_t* p) {  // an f16 field of B (a block's d, m or dmin) at p
  static_assert(sizeof(decltype(B::d)) == 2, "an f16 field");
#if KILN_DQ_F16C
  // vcvtph2ps through Highway: exact, as kiln's scalar conversion
  const hn::CappedTag<float, 1> d1;
  return hn::GetLane(hn::PromoteTo(
      d1, hn::LoadU(hn::Rebind<hwy::float16_t, decltype(d1)>(), reinterpret_cast<const hwy::float16_t*>(p))));
#else
  decltype(B::d) v;
  std::memcpy(&v, p, sizeof(v));
  return float(v);
#endif
}

// One block at src (any alignment: fields are read with byte loads and memcpy) into out (block size values).
// qs byte j is at qs + (j / 16) * cs + j % 16: the block's own qs (cs = 16), or the interleaved path's
// transposed chunks; d, m / dmin, and qh or the K scales (`extra`) come separately for the same reason.
template <class B, class Sink>
HWY_INLINE void Values(const uint8_t* HWY_RESTRICT qs, size_t cs, float d, float m, const uint8_t* extra, Sink& sink) {
  if constexpr (std::is_same_v<B, block_q8_0>) {
    ScaleI8(reinterpret_cast<const int8_t*>(qs), d, 0, sink);
    ScaleI8(reinterpret_cast<const int8_t*>(qs + cs), d, 16, sink);
  } else if constexpr (std::is_same_v<B, block_q4_0>) {
    Nibbles32<false, false>(qs, 0, 8, d, 0.0f, sink);
  } else if constexpr (std::is_same_v<B, block_q4_1>) {
    Nibbles32<false, true>(qs, 0, 0, d, m, sink);
  } else if constexpr (std::is_same_v<B, block_q5_0>) {
    Nibbles32<true, false>(qs, ::kiln::detail::load_u32_le(extra), 16, d, 0.0f, sink);
  } else if constexpr (std::is_same_v<B, block_q5_1>) {
    Nibbles32<true, true>(qs, ::kiln::detail::load_u32_le(extra), 0, d, m, sink);
  } else if constexpr (std::is_same_v<B, block_q4_K>) {
    K4<false>(qs, cs, nullptr, extra, d, m, sink);
  }
}

template <class B>
inline constexpr bool kHasKernel =
    std::is_same_v<B, block_q4_0> || std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_0> ||
    std::is_same_v<B, block_q5_1> || std::is_same_v<B, block_q8_0> || std::is_same_v<B, block_q4_K> ||
    std::is_same_v<B, block_q5_K> || std::is_same_v<B, block_q6_K>;

// A row-major block at src (unaligned bytes) into the sink.
template <class B, class Sink>
HWY_INLINE void Block(const std::byte* src, Sink& sink) {
  const auto* p = reinterpret_cast<const uint8_t*>(src);
  if constexpr (std::is_same_v<B, block_q6_K>) {
    // Read in place (a copy of the 210-byte block per row and block, through 64-byte stores and narrower
    // loads, cost ~3x the time of the rest of the exact GEMV).
    Q6K(p, F16At<B>(p + offsetof(B, d)), sink);
  } else if constexpr (std::is_same_v<B, block_q5_K>) {
    K4<true>(p + offsetof(B, qs), 16, p + offsetof(B, qh), p + offsetof(B, scales), F16At<B>(p + offsetof(B, d)),
             F16At<B>(p + offsetof(B, dmin)), sink);
  } else {
    float m = 0.0f;
    const uint8_t* extra = nullptr;
    if constexpr (requires { B::m; }) m = F16At<B>(p + offsetof(B, m));
    if constexpr (requires { B::dmin; }) m = F16At<B>(p + offsetof(B, dmin));
    if constexpr (requires { B::qh; }) extra = p + offsetof(B, qh);
    if constexpr (requires { B::scales; }) extra = p + offsetof(B, scales);
    Values<B>(p + offsetof(B, qs), 16, F16At<B>(p + offsetof(B, d)), m, extra, sink);
  }
}

struct StoreSink {  // Rows: the values into the tile
  float* out;
  HWY_INLINE void operator()(size_t o, hn::Vec<Df> v) { hn::StoreU(v, Df(), out + o); }
};

#if HWY_TARGET != HWY_SCALAR
// Interleaved groups (quant/interleave.hpp): steps [4t, 4t + 4) of a block column (step s: 16 dwords
// at q + 64 s, row r's qs bytes 4s .. 4s + 3 in dword r) transposed into chunk t of each row, i.e. its qs
// bytes 16t .. 16t + 15: two rounds of 128-bit-block interleaves (dwords, then qwords) leave rows
// base + 4l + j in block l of vector j. Row r's chunk t is at buf + 256 t + 16 Slot(r).
HWY_INLINE size_t Slot(size_t r) {
  const size_t N = hn::Lanes(hn::ScalableTag<uint32_t>());  // as in TransposeChunk
  const size_t base = r / N * N, l = (r - base) / 4, j = (r - base) % 4;
  return base + j * (N / 4) + l;
}

HWY_INLINE void TransposeChunk(const uint8_t* HWY_RESTRICT q, uint8_t* HWY_RESTRICT buf) {
  const hn::ScalableTag<uint32_t> d32;
  const hn::Repartition<uint64_t, decltype(d32)> d64;
  const size_t N = hn::Lanes(d32);  // rows per round: 4 (128-bit targets), 8 or 16
  for (size_t base = 0; base < 16; base += N) {
    const auto* p = reinterpret_cast<const uint32_t*>(q) + base;
    const auto a0 = hn::LoadU(d32, p), a1 = hn::LoadU(d32, p + 16), a2 = hn::LoadU(d32, p + 32),
               a3 = hn::LoadU(d32, p + 48);
    const auto t0 = hn::BitCast(d64, hn::InterleaveLower(d32, a0, a1));  // per block: a0[0] a1[0] a0[1] a1[1]
    const auto t1 = hn::BitCast(d64, hn::InterleaveUpper(d32, a0, a1));  // a0[2] a1[2] a0[3] a1[3]
    const auto t2 = hn::BitCast(d64, hn::InterleaveLower(d32, a2, a3));
    const auto t3 = hn::BitCast(d64, hn::InterleaveUpper(d32, a2, a3));
    auto* o = reinterpret_cast<uint64_t*>(buf + 16 * base);
    const size_t step = hn::Lanes(d64);                               // one vector's qwords
    hn::StoreU(hn::InterleaveLower(d64, t0, t2), d64, o);             // rows base + 4l
    hn::StoreU(hn::InterleaveUpper(d64, t0, t2), d64, o + step);      // rows base + 4l + 1
    hn::StoreU(hn::InterleaveLower(d64, t1, t3), d64, o + 2 * step);  // rows base + 4l + 2
    hn::StoreU(hn::InterleaveUpper(d64, t1, t3), d64, o + 3 * step);  // rows base + 4l + 3
  }
}
#endif

// Rows [r0, r0 + rows), block columns [b0, b0 + nc) of the n-row weight w (nb blocks a row, ldw bytes apart;
// interleaved: 16-row groups) into out (rows, nc * block size).
template <class B>
void Rows(const std::byte* w, size_t n, size_t ldw, bool interleaved, size_t r0, size_t rows, size_t nb, size_t b0,
          size_t nc, float* HWY_RESTRICT out) {
  constexpr size_t bs = block_size_v<B>, G = kernels::kQmmInterleaveRows;
  const size_t k = nc * bs, r1 = r0 + rows, b1 = b0 + nc;
  size_t r = r0;
  if constexpr (kernels::qmm_interleavable_v<B>) {
    const size_t x16_end = interleaved ? HWY_MIN(r1, n / G * G) : r0;
    while (r < x16_end) {  // group by group, block column by block column: a column's bytes are contiguous
      const size_t g = r / G, e = HWY_MIN(x16_end, (g + 1) * G);
      const std::byte* grp = w + g * G * nb * sizeof(B);
#if HWY_TARGET != HWY_SCALAR
      using X = ::kiln::detail::QmmX16<B>;
      if (e - r >= 4) {  // transpose the column's quants once for its rows (fewer: block by block, below)
        HWY_ALIGN uint8_t buf[X::kSteps / 4 * 256];
        for (size_t b = b0; b < b1; ++b) {
          const auto* col = reinterpret_cast<const uint8_t*>(grp + b * X::kColBytes);
          for (size_t t = 0; t < X::kSteps / 4; ++t) TransposeChunk(col + X::kOffQ + 256 * t, buf + 256 * t);
          for (size_t j = r; j < e; ++j) {
            const size_t jr = j % G;
            const float d = F16At<B>(col + 2 * jr), m = X::kMin ? F16At<B>(col + 32 + 2 * jr) : 0.0f;
            HWY_ALIGN uint8_t extra[12];  // qh or the K scales: dwords 64 bytes apart
            for (size_t x = 0; x < X::kExtraDwords; ++x)
              std::memcpy(extra + 4 * x, col + X::kOffQh + 64 * x + 4 * jr, 4);
            StoreSink sink{out + (j - r0) * k + (b - b0) * bs};
            Values<B>(buf + 16 * Slot(jr), 256, d, m, extra, sink);
          }
        }
        r = e;
        continue;
      }
#endif
      for (size_t b = b0; b < b1; ++b)
        for (size_t j = r; j < e; ++j) {
          const B blk = ::kiln::detail::qmm_x16_block<B>(grp, j % G, b);
          StoreSink sink{out + (j - r0) * k + (b - b0) * bs};
          Block<B>(reinterpret_cast<const std::byte*>(&blk), sink);
        }
      r = e;
    }
  }
  for (; r < r1; ++r)
    for (size_t b = b0; b < b1; ++b) {
      StoreSink sink{out + (r - r0) * k + (b - b0) * bs};
      Block<B>(w + r * ldw + b * sizeof(B), sink);
    }
}

// ---- The fused GEMV (kM rows of x; DequantGemv runs kM = 1): the exact path's decode, without the tile.
//
// y[i, j] = sum_p x[i, p] W[j, p] with GemvM's operations (kernels/matmul/gemv-inl.h) on the values Rows would
// have written to the tile: per (i, j) one lane-wise FMA chain over p in increasing order (the producers
// emit in that order), then SumOfLanes4. So the result is bit-identical to Rows + matmul_kernel's GEMV, for
// either layout, while each value goes from registers into the FMAs instead of through a tile in L2. Rows
// go in batches (kGemvBatch), M accumulators each; an interleaved group's quants are first transposed back
// into row order, with its scales widened, into the caller's scratch (detail::dequant_gemv_scratch_bytes).

// block b of the row: its values land at p = b * bs + o
template <class Sink>
struct Shifted {
  Sink& sink;
  size_t base;
  template <class V>
  HWY_INLINE void operator()(size_t o, V v) {
    sink(base + o, v);
  }
};

template <size_t kM>
struct FmaSink {
  const float* x = nullptr;  // kM rows, ldx apart
  ptrdiff_t ldx = 0;
  hn::Vec<Df> acc[kM];
  // Defined here rather than implicitly: an implicit constructor lacks the target attributes, and GCC for
  // NEON then refuses to inline Vec128's constructor into it.
  HWY_INLINE FmaSink() {
    for (size_t i = 0; i < kM; ++i) acc[i] = hn::Zero(Df());
  }
  HWY_INLINE void operator()(size_t p, hn::Vec<Df> v) {
    for (size_t i = 0; i < kM; ++i)
      acc[i] = hn::MulAdd(hn::LoadU(Df(), x + static_cast<ptrdiff_t>(i) * ldx + p), v, acc[i]);
  }
};

template <size_t kM>
HWY_INLINE void GemvStoreRow(FmaSink<kM>& f, float* y, ptrdiff_t ldy, size_t j) {
  const auto z = hn::Zero(Df());
  hn::Vec<Df> v[4] = {z, z, z, z};
  for (size_t i = 0; i < kM; ++i) v[i] = f.acc[i];
  float s[4];  // s[i]: the lanes of acc[i] summed as GemvM sums them
  ::kiln::HWY_NAMESPACE::lanes::SumOfLanes4(v[0], v[1], v[2], v[3], s);
  for (size_t i = 0; i < kM; ++i) y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = s[i];
}

// Software prefetch distance along a row-major row, in bytes.
inline constexpr size_t kGemvPrefetch = 512;

// Rows of W per batch: each row's FMA chain is a dependency chain (its order is GemvM's), so several rows
// run side by side, kM * kGemvBatch accumulators (8 at most); the K-quants gain nothing from fewer.
template <size_t kM>
inline constexpr size_t kGemvBatch = kM == 1   ? 8
                                     : kM == 2 ? 4
                                               : 2;

// Rows j0 .. j0 + R - 1 of y: block(I, b, sink) hands block b of the batch's row I to the sink. The rows'
// indices are compile-time constants (a fold over I), so the accumulators stay in registers.
template <size_t kM, size_t R, class BlockFn>
HWY_INLINE void GemvBatch(const float* x, ptrdiff_t ldx, size_t nb, size_t bs, float* y, ptrdiff_t ldy, size_t j0,
                          const BlockFn& block) {
  FmaSink<kM> f[R];
  for (size_t r = 0; r < R; ++r) {
    f[r].x = x;
    f[r].ldx = ldx;
  }
  for (size_t b = 0; b < nb; ++b) [&]<size_t... I>(std::index_sequence<I...>) KILN_DQ_INLINE {
      (
          [&]() KILN_DQ_INLINE {
            Shifted<FmaSink<kM>> sink{f[I], b * bs};
            block(I, b, sink);
          }(),
          ...);
    }
  (std::make_index_sequence<R>());
  for (size_t r = 0; r < R; ++r) GemvStoreRow(f[r], y, ldy, j0 + r);
}

// Rows [j, e) in batches of R, the rest one by one.
template <size_t kM, size_t R, class BlockFn>
HWY_INLINE void GemvRange(const float* x, ptrdiff_t ldx, size_t nb, size_t bs, float* y, ptrdiff_t ldy, size_t j,
                          size_t e, const BlockFn& block) {  // block(row, b, sink)
  for (; j + R <= e; j += R)
    GemvBatch<kM, R>(x, ldx, nb, bs, y, ldy, j,
                     [&](size_t i, size_t b, auto& sink) KILN_DQ_INLINE { block(j + i, b, sink); });
  for (; j < e; ++j)
    GemvBatch<kM, 1>(x, ldx, nb, bs, y, ldy, j,
                     [&](size_t, size_t b, auto& sink) KILN_DQ_INLINE { block(j, b, sink); });
}

template <size_t kM, class B>
void Gemv(const std::byte* w, size_t n, size_t ldw, bool interleaved, size_t r0, size_t r1, size_t nb, const float* x,
          ptrdiff_t ldx, float* y, ptrdiff_t ldy, uint8_t* HWY_RESTRICT scratch) {
  constexpr size_t bs = block_size_v<B>, G = kernels::kQmmInterleaveRows, R = kGemvBatch<kM>;
  size_t r = r0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (kernels::qmm_interleavable_v<B>) {
    using X = ::kiln::detail::QmmX16<B>;
    constexpr size_t T = X::kSteps / 4;  // 16-byte chunks of a row's qs
    const size_t x16_end = interleaved ? HWY_MIN(r1, n / G * G) : r0;
    // scratch: the qs chunks (column b's chunk t of row r at 256 (b T + t) + 16 Slot(r)), then d and m / dmin
    // as f32 (column b's row r at 16 b + r), then qh / the K scales (12 bytes per row and column).
    uint8_t* qsb = scratch;
    float* dv = reinterpret_cast<float*>(scratch + nb * T * 256);
    float* mv = dv + nb * G;
    uint8_t* ev = reinterpret_cast<uint8_t*>(mv + nb * G);
#if KILN_DQ_F16C
    const hn::Rebind<hwy::float16_t, Df> dh;
#endif
    while (r < x16_end) {
      const size_t g = r / G, e = HWY_MIN(x16_end, (g + 1) * G);
      const std::byte* grp = w + g * G * nb * sizeof(B);
      for (size_t b = 0; b < nb; ++b) {
        const auto* col = reinterpret_cast<const uint8_t*>(grp + b * X::kColBytes);
        for (size_t t = 0; t < T; ++t) TransposeChunk(col + X::kOffQ + 256 * t, qsb + 256 * (b * T + t));
#if KILN_DQ_F16C
        for (size_t i = 0; i < G; i += hn::Lanes(Df())) {  // the 16 f16 scales (and mins) at the column's start
          const auto* h16 = reinterpret_cast<const hwy::float16_t*>(col);
          hn::StoreU(hn::PromoteTo(Df(), hn::LoadU(dh, h16 + i)), Df(), dv + b * G + i);
          if constexpr (X::kMin) hn::StoreU(hn::PromoteTo(Df(), hn::LoadU(dh, h16 + 16 + i)), Df(), mv + b * G + i);
        }
#else
        for (size_t i = 0; i < G; ++i) {
          dv[b * G + i] = F16At<B>(col + 2 * i);
          if constexpr (X::kMin) mv[b * G + i] = F16At<B>(col + 32 + 2 * i);
        }
#endif
        for (size_t jr = r - g * G; jr < e - g * G; ++jr)
          for (size_t q = 0; q < X::kExtraDwords; ++q)
            std::memcpy(ev + (b * G + jr) * 12 + 4 * q, col + X::kOffQh + 64 * q + 4 * jr, 4);
      }
      // While this group computes from the scratch, the next one is fetched into L2 (locality 2: prefetcht1),
      // one block's worth of its bytes per (row, block) step: into L1 (prefetcht0) it evicts the scratch and
      // loses to no prefetching at all.
      const std::byte* next = w + HWY_MIN(g + 1, n / G - 1) * G * nb * sizeof(B);
      GemvRange<kM, R>(x, ldx, nb, bs, y, ldy, r, e, [&](size_t j, size_t b, auto& sink) KILN_DQ_INLINE {
        const size_t jr = j - g * G, c = b * G + jr;
        for (size_t o = 0; o < sizeof(B); o += 64) __builtin_prefetch(next + (jr * nb + b) * sizeof(B) + o, 0, 2);
        Values<B>(qsb + 256 * b * T + 16 * Slot(jr), 256, dv[c], X::kMin ? mv[c] : 0.0f, ev + c * 12, sink);
      });
      r = e;
    }
  }
#else
  (void)scratch;
  if constexpr (kernels::qmm_interleavable_v<B>) {  // one lane: no transposes, the blocks gathered one by one
    const size_t x16_end = interleaved ? HWY_MIN(r1, n / G * G) : r0;
    GemvRange<kM, R>(x, ldx, nb, bs, y, ldy, r, x16_end, [&](size_t j, size_t b, auto& sink) KILN_DQ_INLINE {
      const B blk = ::kiln::detail::qmm_x16_block<B>(w + j / G * G * nb * sizeof(B), j % G, b);
      Block<B>(reinterpret_cast<const std::byte*>(&blk), sink);
    });
    r = HWY_MAX(r, x16_end);
  }
#endif
  GemvRange<kM, R>(x, ldx, nb, bs, y, ldy, r, r1, [&](size_t j, size_t b, auto& sink) KILN_DQ_INLINE {
    const std::byte* blk = w + j * ldw + b * sizeof(B);
    // Each row is its own read stream: every 64-byte line of the block kGemvPrefetch bytes ahead (one
    // prefetch per block left 2 of Q6_K's 3.3 lines per block, and 1 of Q4_K's 2.25, to the hardware).
    for (size_t o = 0; o < sizeof(B); o += 64) hwy::Prefetch(blk + kGemvPrefetch + o);
    Block<B>(blk, sink);
  });
}

}  // namespace dq

// Rows [r0, r0 + rows), columns [p0, p0 + kc) of W (GGUF type `type`, n rows of k values, ldw bytes apart;
// interleaved: see quant/interleave.hpp) as f32 into out (rows, kc). p0 and kc are whole blocks.
void DequantRows(uint32_t type, const void* w, size_t n, size_t ldw, bool interleaved, size_t r0, size_t rows, size_t k,
                 size_t p0, size_t kc, float* out) {
  const auto* wb = static_cast<const std::byte*>(w);
  bool done = false;
  visit_ggml_type(type, [&]<class T>(T*) {
    if constexpr (dq::kHasKernel<T>) {
      constexpr size_t bs = block_size_v<T>;
      dq::Rows<T>(wb, n, ldw, interleaved, r0, rows, k / bs, p0 / bs, kc / bs, out);
      done = true;
    }
  });
  if (done) return;
  // The scalar reference (which names an unsupported type in its FormatError); blocks are self-contained, so
  // columns [p0, p0 + kc) start ggml_row_bytes(type, p0) bytes into the row. Rows of interleaved groups
  // (MXFP4's) gathered back to row-major blocks, up to 64 at a time, each run dequantized in one call.
  const size_t skip = p0 == 0 ? 0 : ::kiln::ggml_row_bytes(type, p0), G = kernels::kQmmInterleaveRows;
  const size_t x16_end = interleaved ? n / G * G : 0;
  for (size_t r = 0; r < rows; ++r) {
    const size_t j = r0 + r;
    if (j >= x16_end) {
      ::kiln::dequantize_row(type, wb + j * ldw + skip, out + r * kc, kc);
      continue;
    }
    ::kiln::detail::visit_qmm_x16_type(type, [&]<class T>(T*) {
      constexpr size_t bs = block_size_v<T>, kRun = 64;
      T run[kRun];
      for (size_t b0 = p0 / bs, b1 = (p0 + kc) / bs; b0 < b1; b0 += kRun) {
        const size_t nr = HWY_MIN(kRun, b1 - b0);
        for (size_t b = 0; b < nr; ++b) run[b] = ::kiln::detail::qmm_x16_block<T>(wb + j / G * G * ldw, j % G, b0 + b);
        ::kiln::dequantize_row(type, run, out + r * kc + (b0 * bs - p0), nr * bs);
      }
    });
  }
}

// y (1, rows [r0, r1) of W) = x (1, k) W^T (dq::Gemv): one sequence's decode step. false (nothing written)
// for another m or a type without a kernel here: the tile path then computes the same bits. (Instantiating
// Gemv for m = 2..4 as well would triple this translation unit's compile time for SessionGroup's
// multi-sequence steps only.)
bool DequantGemv(uint32_t type, const void* w, size_t n, size_t ldw, bool interleaved, size_t r0, size_t r1, size_t k,
                 const float* x, ptrdiff_t ldx, size_t m, float* y, ptrdiff_t ldy, void* scratch) {
  if (m != 1) return false;
  const auto* wb = static_cast<const std::byte*>(w);
  auto* sc = static_cast<uint8_t*>(scratch);
  bool done = false;
  visit_ggml_type(type, [&]<class T>(T*) {
    if constexpr (dq::kHasKernel<T>) {
      dq::Gemv<1, T>(wb, n, ldw, interleaved, r0, r1, k / block_size_v<T>, x, ldx, y, ldy, sc);
      done = true;
    }
  });
  return done;
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
HWY_EXPORT(DequantRows);
HWY_EXPORT(DequantGemv);
}  // namespace kiln

KILN_DISPATCH_BEGIN
void dequant_block(uint32_t type, const void* w, std::size_t n, std::size_t ldw, bool interleaved, std::size_t r0,
                   std::size_t rows, std::size_t k, std::size_t p0, std::size_t kc, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantRows)(type, w, n, ldw, interleaved, r0, rows, k, p0, kc, out);
}
bool dequant_gemv(uint32_t type, const void* w, std::size_t n, std::size_t ldw, bool interleaved, std::size_t r0,
                  std::size_t r1, std::size_t k, const float* x, std::ptrdiff_t ldx, std::size_t m, float* y,
                  std::ptrdiff_t ldy, void* scratch) {
  return HWY_DYNAMIC_DISPATCH(DequantGemv)(type, w, n, ldw, interleaved, r0, r1, k, x, ldx, m, y, ldy, scratch);
}
KILN_DISPATCH_END
#endif  // HWY_ONCE

#endif  // per-target include guard
