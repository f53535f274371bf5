// kiln/kernels/dense/attention-inl.h - Highway body of ops/attention.hpp, compiled once per target by the
// KILN_IMPLEMENTATION translation unit (see kiln/implementation.hpp). Not for direct inclusion.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_DENSE_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_DENSE_ATTENTION_INL_H_
#undef KILN_KERNELS_DENSE_ATTENTION_INL_H_
#else
#define KILN_KERNELS_DENSE_ATTENTION_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kiln/kernels/dense/activation-inl.h"       // ExpNonPos, Reciprocal (per target)
#include "kiln/kernels/dense/attention_amx-inl.h"    // attn_amx (AVX3_DL with AMX-BF16): the whole pass on tiles
#include "kiln/kernels/dense/attention_score-inl.h"  // AttnScoreY
#include "kiln/kernels/q8_0_rows-inl.h"              // q8rows: Q8_0 rows widened
#include "kiln/ops/attention.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Layout of one block's work (up to kAttnRows query rows, nrp = rows rounded up to whole vectors):
//   qt (hd, nrp): q transposed, so a score vector holds one position's scores for nrp rows;
//   s (kAttnTile, nrp): a tile's scores, then its exp(y - m);
//   kf, vf (kAttnTile, hd): the tile's keys and values widened to f32 (f16 caches only);
//   acc (kAttnRows, hd): each row's running sum of p v; m, l, alpha, bad (nrp): running max, running sum,
//   this tile's rescale factor, NaN / +inf seen.
struct AttnScratch {
  float *qt, *s, *kf, *vf, *acc, *m, *l, *alpha, *bad;
};

inline float* AttnCarve(float*& p, size_t n) {
  float* a = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
  p = a + n;
  return a;
}

// Rows of T (f32 or f16), `stride` apart, as f32 rows of hd: the cache itself for f32, else widened.
HWY_INLINE const float* AttnRowsF32(const float* src, ptrdiff_t /*stride*/, size_t /*n*/, size_t /*hd*/,
                                    float* /*dst*/) {
  return src;
}
HWY_INLINE const float* AttnRowsF32(const hwy::float16_t* src, ptrdiff_t stride, size_t n, size_t hd, float* dst) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  for (size_t c = 0; c < n; ++c) {
    const hwy::float16_t* s = src + static_cast<ptrdiff_t>(c) * stride;
    float* o = dst + c * hd;
    size_t i = 0;
    for (; i + N <= hd; i += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, s + i)), d, o + i);
    for (; i < hd; ++i) {
      uint16_t bits;  // hwy::float16_t is a struct of bits on x86, the native __fp16 on Arm
      std::memcpy(&bits, s + i, sizeof bits);
      o[i] = f16_bits_to_f32(bits);
    }
  }
  return dst;
}

// Rows of Q8_0 blocks (hd / 32 a row, `stride` blocks apart; a q8_0 cache) as f32 rows of hd: d * q, exact.
HWY_INLINE const float* AttnRowsF32(const block_q8_0* src, ptrdiff_t stride, size_t n, size_t hd, float* dst) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  for (size_t c = 0; c < n; ++c) {
    const block_q8_0* s = src + static_cast<ptrdiff_t>(c) * stride;
    float* o = dst + c * hd;
    for (size_t b = 0; b < hd / QK8_0; ++b) {
      const auto vd = hn::Set(d, q8rows::Scale(s[b]));
      for (size_t i = 0; i < QK8_0; i += N) hn::StoreU(q8rows::Widen(d, s[b], i, vd), d, o + b * QK8_0 + i);
    }
  }
  return dst;
}

// Scores of KB positions (rows ks apart, f32) for RV vectors of rows from vector vi on: each element
// sum_d q[r, d] k[c, d] in order of d, whichever rows share the vector.
template <size_t KB, size_t RV, class D>
HWY_INLINE void AttnScoreBlock(D d, const float* HWY_RESTRICT qt, size_t nrp, size_t vi, const float* HWY_RESTRICT kp,
                               ptrdiff_t ks, size_t hd, float* HWY_RESTRICT st) {
  using V = hn::Vec<D>;
  const size_t N = hn::Lanes(d);
  V a[KB][RV];
  for (size_t i = 0; i < KB; ++i)
    for (size_t j = 0; j < RV; ++j) a[i][j] = hn::Zero(d);
  const float* kr[KB];
  for (size_t i = 0; i < KB; ++i) kr[i] = kp + static_cast<ptrdiff_t>(i) * ks;
  const float* q = qt + vi * N;
  for (size_t e = 0; e < hd; ++e, q += nrp) {
    V qv[RV];
    for (size_t j = 0; j < RV; ++j) qv[j] = hn::LoadU(d, q + j * N);
    for (size_t i = 0; i < KB; ++i) {
      const V k = hn::Set(d, kr[i][e]);
      for (size_t j = 0; j < RV; ++j) a[i][j] = hn::MulAdd(k, qv[j], a[i][j]);
    }
  }
  for (size_t i = 0; i < KB; ++i)
    for (size_t j = 0; j < RV; ++j) hn::StoreU(a[i][j], d, st + i * nrp + (vi + j) * N);
}

// acc[r0 + i, d0 + j N ...] = acc * alpha[r] + sum_c p[c, r] v[c, :], for RB rows and DV vectors of D
// (positions c in order: the same sums whichever rows share the call).
template <size_t RB, size_t DV, class D>
HWY_INLINE void AttnValuesBlock(D d, const float* HWY_RESTRICT st, size_t nrp, size_t r0, const float* HWY_RESTRICT vp,
                                ptrdiff_t vs, size_t tn, float* HWY_RESTRICT acc, size_t hd, size_t d0,
                                const float* HWY_RESTRICT alpha) {
  using V = hn::Vec<D>;
  const size_t N = hn::Lanes(d);
  V a[RB][DV];
  for (size_t i = 0; i < RB; ++i) {
    const V al = hn::Set(d, alpha[r0 + i]);
    for (size_t j = 0; j < DV; ++j) a[i][j] = hn::Mul(hn::LoadU(d, acc + (r0 + i) * hd + d0 + j * N), al);
  }
  for (size_t c = 0; c < tn; ++c) {
    const float* vr = vp + static_cast<ptrdiff_t>(c) * vs + d0;
    V vv[DV];
    for (size_t j = 0; j < DV; ++j) vv[j] = hn::LoadU(d, vr + j * N);
    const float* p = st + c * nrp + r0;
    for (size_t i = 0; i < RB; ++i) {
      const V pv = hn::Set(d, p[i]);
      for (size_t j = 0; j < DV; ++j) a[i][j] = hn::MulAdd(pv, vv[j], a[i][j]);
    }
  }
  for (size_t i = 0; i < RB; ++i)
    for (size_t j = 0; j < DV; ++j) hn::StoreU(a[i][j], d, acc + (r0 + i) * hd + d0 + j * N);
}

template <size_t DV, class D>
HWY_INLINE void AttnValuesRows(D d, const float* st, size_t nrp, size_t nr, const float* vp, ptrdiff_t vs, size_t tn,
                               float* acc, size_t hd, size_t d0, const float* alpha) {
  size_t r = 0;
  for (; r + 4 <= nr; r += 4) AttnValuesBlock<4, DV>(d, st, nrp, r, vp, vs, tn, acc, hd, d0, alpha);
  switch (nr - r) {
    case 3:
      AttnValuesBlock<3, DV>(d, st, nrp, r, vp, vs, tn, acc, hd, d0, alpha);
      break;
    case 2:
      AttnValuesBlock<2, DV>(d, st, nrp, r, vp, vs, tn, acc, hd, d0, alpha);
      break;
    case 1:
      AttnValuesBlock<1, DV>(d, st, nrp, r, vp, vs, tn, acc, hd, d0, alpha);
      break;
    default:
      break;
  }
}

// Up to kAttnRows query rows (row r at position pos0 + r * step) over positions [0, kv_len).
template <class T>
void AttnBlock(const float* q, ptrdiff_t qs, const T* k, const T* v, ptrdiff_t kvs, size_t kv_len, float* out,
               ptrdiff_t os, size_t nr, size_t hd, size_t pos0, size_t step, size_t window, float scale, float softcap,
               float sink, const AttnScratch& sc) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  constexpr size_t T_ = detail::kAttnTile;
  // Values: DV vectors of hd per block (4 x DV accumulators and DV values in registers).
  constexpr size_t kDV = HWY_MAX_BYTES >= 64 ? 4 : 2;
  // Scores: kKB positions x 2 vectors of rows per block (16 accumulators on AVX-512: enough independent
  // FMA chains to cover their latency on two FMA ports; 8 with 16 registers).
  constexpr size_t kKB = HWY_MAX_BYTES >= 64 ? 8 : 4;
  const size_t nrp = (nr + N - 1) / N * N, nv = nrp / N;
  const float kInf = std::numeric_limits<float>::infinity();

  // Row r sees [lo(p), min(kv_len, p + 1)), p = pos0 + r * step; lo and hi grow with r.
  auto lo_of = [&](size_t p) { return window > 0 && p + 1 > window ? p + 1 - window : 0; };
  const size_t p_first = pos0, p_last = pos0 + (nr - 1) * step;
  const size_t hi_max = std::min(kv_len, p_last + 1), hi_min = std::min(kv_len, p_first + 1);
  const size_t lo_min = lo_of(p_first), lo_max = lo_of(p_last);
  constexpr size_t kR = detail::kAttnRows;
  HWY_ALIGN int32_t pv[kR], lov[kR];
  for (size_t r = 0; r < nrp; ++r) {
    pv[r] = r < nr ? static_cast<int32_t>(std::min(kv_len - 1, pos0 + r * step)) : -1;  // padding: nothing
    lov[r] = r < nr ? static_cast<int32_t>(lo_of(pos0 + r * step)) : 0;
  }
  for (size_t e = 0; e < hd; ++e)
    for (size_t r = 0; r < nrp; ++r) sc.qt[e * nrp + r] = r < nr ? q[static_cast<ptrdiff_t>(r) * qs + e] : 0.0f;
  std::fill_n(sc.acc, nr * hd, 0.0f);
  for (size_t r = 0; r < nrp; ++r) {
    sc.m[r] = -kInf;
    sc.l[r] = 0.0f;
    sc.bad[r] = 0.0f;
  }

  const V vscale = hn::Set(d, scale), vninf = hn::Set(d, -kInf);
  const V vcap_in = hn::Set(d, softcap > 0 ? scale / softcap : 0.0f), vcap = hn::Set(d, softcap);
  // Tiles at multiples of kAttnTile (fixed positions: a row's sums do not depend on the block).
  for (size_t t0 = lo_min / T_ * T_; t0 < hi_max; t0 += T_) {
    const size_t tn = std::min(T_, hi_max - t0);
    const bool full = t0 >= lo_max && t0 + tn <= hi_min;  // no row masks anything in this tile
    const ptrdiff_t ks = std::is_same_v<T, float> ? kvs : static_cast<ptrdiff_t>(hd);  // f32 rows
    {
      const float* kp = AttnRowsF32(k + static_cast<ptrdiff_t>(t0) * kvs, kvs, tn, hd, sc.kf);

      // Scores: s[c, r] = q_r . k_c.
      for (size_t vi = 0; vi < nv;) {
        const size_t rv = nv - vi >= 2 ? 2 : 1;
        size_t c = 0;
        for (; c + kKB <= tn; c += kKB) {
          const float* kc = kp + static_cast<ptrdiff_t>(c) * ks;
          if (rv == 2) AttnScoreBlock<kKB, 2>(d, sc.qt, nrp, vi, kc, ks, hd, sc.s + c * nrp);
          else AttnScoreBlock<kKB, 1>(d, sc.qt, nrp, vi, kc, ks, hd, sc.s + c * nrp);
        }
        for (; c < tn; ++c) {
          const float* kc = kp + static_cast<ptrdiff_t>(c) * ks;
          if (rv == 2) AttnScoreBlock<1, 2>(d, sc.qt, nrp, vi, kc, ks, hd, sc.s + c * nrp);
          else AttnScoreBlock<1, 1>(d, sc.qt, nrp, vi, kc, ks, hd, sc.s + c * nrp);
        }
        vi += rv;
      }
    }

    // Online softmax, a vector of rows at a time: y = scale * s (soft-capped), masked to -inf; the new
    // maximum; alpha = exp(m_old - m_new); p = exp(y - m_new) in place of s; l = l alpha + sum p.
    for (size_t vi = 0; vi < nv; ++vi) {
      const size_t r = vi * N;
      const auto p_row = hn::LoadU(di, pv + r), lo_row = hn::LoadU(di, lov + r);
      auto bad = hn::Lt(vninf, vninf);  // all false
      V tmax = vninf;
      AttnScoreCase(softcap > 0, full, window > 0, [&](auto cap, auto mask) {
        constexpr bool kCap = decltype(cap)::value;
        constexpr AttnMask kMask = decltype(mask)::value;
        for (size_t c = 0; c < tn; ++c) {
          float* sp = sc.s + c * nrp + r;
          const V y = AttnScoreY<kCap, kMask, true>(d, di, hn::LoadU(d, sp), vcap_in, vcap,
                                                    static_cast<int32_t>(t0 + c), p_row, lo_row, bad);
          if (kCap || kMask != AttnMask::kNone) hn::StoreU(y, d, sp);
          tmax = hn::Max(tmax, y);
        }
      });
      const V mo = hn::LoadU(d, sc.m + r);
      const V mt = softcap > 0 ? tmax : hn::Mul(tmax, vscale);  // max(scale s) = scale max(s), scale > 0
      const V mn = hn::Max(mo, mt);
      const V mu = hn::IfThenZeroElse(hn::Eq(mn, vninf), mn);  // nothing yet: exp(-inf - 0) = 0
      const V alpha = ExpNonPos(d, hn::Sub(mo, mu));           // exactly 1 when the maximum stays
      V lsum = hn::Zero(d);
      for (size_t c = 0; c < tn; ++c) {
        float* sp = sc.s + c * nrp + r;
        const V y = hn::LoadU(d, sp);
        const V p = ExpNonPos(d, softcap > 0 ? hn::Sub(y, mu) : hn::MulSub(y, vscale, mu));
        hn::StoreU(p, d, sp);
        lsum = hn::Add(lsum, p);
      }
      hn::StoreU(mn, d, sc.m + r);
      hn::StoreU(alpha, d, sc.alpha + r);
      hn::StoreU(hn::MulAdd(hn::LoadU(d, sc.l + r), alpha, lsum), d, sc.l + r);
      hn::StoreU(hn::IfThenElse(bad, hn::Set(d, 1.0f), hn::LoadU(d, sc.bad + r)), d, sc.bad + r);
    }

    // Values: acc = acc alpha + p V.
    {
      const float* vp = AttnRowsF32(v + static_cast<ptrdiff_t>(t0) * kvs, kvs, tn, hd, sc.vf);
      size_t d0 = 0;
      for (; d0 + kDV * N <= hd; d0 += kDV * N)
        AttnValuesRows<kDV>(d, sc.s, nrp, nr, vp, ks, tn, sc.acc, hd, d0, sc.alpha);
      for (; d0 + N <= hd; d0 += N) AttnValuesRows<1>(d, sc.s, nrp, nr, vp, ks, tn, sc.acc, hd, d0, sc.alpha);
      const hn::CappedTag<float, 1> d1;
      for (; d0 < hd; ++d0) AttnValuesRows<1>(d1, sc.s, nrp, nr, vp, ks, tn, sc.acc, hd, d0, sc.alpha);
    }
  }

  for (size_t r = 0; r < nr; ++r) {
    float* o = out + static_cast<ptrdiff_t>(r) * os;
    const float* a = sc.acc + r * hd;
    if (sc.bad[r] != 0.0f) std::fill_n(o, hd, std::numeric_limits<float>::quiet_NaN());
    else if (!(sc.l[r] > 0.0f)) std::fill_n(o, hd, 0.0f);  // nothing to attend to
    else {  // a sink adds e^(sink - m) to the denominator (m: the row's final maximum)
      const float l = sink > -kInf ? sc.l[r] + std::exp(sink - sc.m[r]) : sc.l[r];
      const float inv = 1.0f / l;
      for (size_t e = 0; e < hd; ++e) o[e] = a[e] * inv;
    }
  }
}

void AttentionF32(const float* q, ptrdiff_t qs, const void* k, const void* v, unsigned kv_type, ptrdiff_t kvs,
                  size_t kv_len, float* out, ptrdiff_t os, size_t rows, size_t hd, size_t heads, size_t pos0,
                  size_t step, size_t window, float scale, float softcap, float sink, const float* sinks, bool amx_bf16,
                  float* scratch) {
  constexpr size_t R = detail::kAttnRows, T_ = detail::kAttnTile;
  float* p = scratch;
#if KILN_ATTN_HAVE_AMX
  // The caller checked that AMX-BF16 is usable; f16 K/V and whole steps of 32 head elements only.
  if (amx_bf16 && kv_type == detail::kAttnKvF16 && hd % attn_amx::kS == 0) {
    const size_t RA = detail::attn_amx_rows(hd);
    attn_amx::Scratch w;
    w.qb = reinterpret_cast<uint8_t*>(AttnCarve(p, RA * hd));
    constexpr size_t TA = attn_amx::kPos;
    w.kt = reinterpret_cast<uint8_t*>(AttnCarve(p, TA * hd));
    w.vt = reinterpret_cast<uint8_t*>(AttnCarve(p, TA * hd));
    w.sm = AttnCarve(p, 2 * TA * 2 * attn_amx::kT);
    w.sc = AttnCarve(p, 2 * TA * 2 * attn_amx::kT);
    w.pt = reinterpret_cast<uint8_t*>(AttnCarve(p, 4 * attn_amx::kVSteps * 2 * attn_amx::kTileF));
    w.acc = AttnCarve(p, 2 * RA * hd);
    w.m = AttnCarve(p, RA);
    w.l = AttnCarve(p, RA);
    w.alpha = AttnCarve(p, RA);
    w.bad = AttnCarve(p, RA);
    w.pv = reinterpret_cast<int32_t*>(AttnCarve(p, RA));
    w.lov = reinterpret_cast<int32_t*>(AttnCarve(p, RA));
    attn_amx::Configure();
    ::kiln::detail::amx_attention_calls().fetch_add(1, std::memory_order_relaxed);
    const auto* kb = static_cast<const uint16_t*>(k);
    const auto* vb = static_cast<const uint16_t*>(v);
    // Passes of np positions of hg heads (hg * np <= RA rows): heads first, so that K and V are split once
    // per tile for as many of them as fit.
    const size_t hg = std::min(heads, RA), np = RA / hg;
    for (size_t h0 = 0; h0 < heads; h0 += hg) {
      const size_t nh = std::min(hg, heads - h0);
      for (size_t r0 = 0; r0 < rows; r0 += np) {
        const size_t nr = std::min(np, rows - r0);
        attn_amx::Block(q + static_cast<ptrdiff_t>(r0) * qs + h0 * hd, qs, kb, vb, kvs, kv_len,
                        out + static_cast<ptrdiff_t>(r0) * os + h0 * hd, os, nr, nh, hd, pos0 + r0 * step, step, window,
                        scale, softcap, sink, sinks ? sinks + h0 : nullptr, w);
      }
    }
    attn_amx::Release();
    return;
  }
#else
  (void)amx_bf16;
#endif
  AttnScratch sc;
  sc.qt = AttnCarve(p, hd * R);
  sc.s = AttnCarve(p, T_ * R);
  sc.kf = AttnCarve(p, T_ * hd);
  sc.vf = AttnCarve(p, T_ * hd);
  sc.acc = AttnCarve(p, R * hd);
  sc.m = AttnCarve(p, R);
  sc.l = AttnCarve(p, R);
  sc.alpha = AttnCarve(p, R);
  sc.bad = AttnCarve(p, R);
  for (size_t h = 0; h < heads; ++h) {
    const float sk = sinks ? sinks[h] : sink;
    for (size_t r0 = 0; r0 < rows; r0 += R) {
      const size_t nr = std::min(R, rows - r0);
      const float* qb = q + static_cast<ptrdiff_t>(r0) * qs + h * hd;
      float* ob = out + static_cast<ptrdiff_t>(r0) * os + h * hd;
      const size_t pb = pos0 + r0 * step;
      if (kv_type == detail::kAttnKvF16)
        AttnBlock<hwy::float16_t>(qb, qs, static_cast<const hwy::float16_t*>(k), static_cast<const hwy::float16_t*>(v),
                                  kvs, kv_len, ob, os, nr, hd, pb, step, window, scale, softcap, sk, sc);
      else if (kv_type == detail::kAttnKvQ8_0)
        AttnBlock<block_q8_0>(qb, qs, static_cast<const block_q8_0*>(k), static_cast<const block_q8_0*>(v), kvs, kv_len,
                              ob, os, nr, hd, pb, step, window, scale, softcap, sk, sc);
      else
        AttnBlock<float>(qb, qs, static_cast<const float*>(k), static_cast<const float*>(v), kvs, kv_len, ob, os, nr,
                         hd, pb, step, window, scale, softcap, sk, sc);
    }
  }
}

// Rows of scores (a decode step's part of the positions): y = scale * s (soft-capped), m = max y, s
// replaced by exp(y - m), l = sum of those (f32 per block of vectors, added in double, as
// kernels/dense/softmax-inl.h). A row with a NaN or +inf score gets m = NaN.
void AttentionExpRows(float* s, ptrdiff_t ss, size_t rows, size_t n, float scale, float softcap, float* m, float* l,
                      ptrdiff_t ms) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const size_t N = hn::Lanes(d);
  const float kInf = std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < rows; ++r) {
    float* x = s + static_cast<ptrdiff_t>(r) * ss;
    auto transform = [&](auto dd, auto v) {
      if (softcap > 0) {
        const auto pre = hn::Mul(v, hn::Set(dd, scale / softcap));
        const auto e = ExpNonPos(dd, hn::Mul(hn::Abs(pre), hn::Set(dd, -2.0f)));
        const auto th = hn::Mul(hn::Sub(hn::Set(dd, 1.0f), e), Reciprocal(dd, hn::Add(hn::Set(dd, 1.0f), e)));
        return hn::IfThenElse(hn::IsNaN(pre), pre, hn::Mul(hn::CopySignToAbs(th, pre), hn::Set(dd, softcap)));
      } else {
        return hn::Mul(v, hn::Set(dd, scale));
      }
    };
    // Pass 1: y (kept in place), its maximum, and whether a NaN or +inf came up.
    auto vmax = hn::Set(d, -kInf);
    auto bad = hn::Lt(vmax, vmax);
    size_t i = 0;
    for (; i + N <= n; i += N) {
      const auto y = transform(d, hn::LoadU(d, x + i));
      hn::StoreU(y, d, x + i);
      vmax = hn::Max(vmax, y);
      bad = hn::Or(bad, hn::Not(hn::Lt(y, hn::Set(d, kInf))));
    }
    HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
    hn::Store(vmax, d, lanes);
    float mx = lanes[0];
    for (size_t j = 1; j < N; ++j) mx = std::max(mx, lanes[j]);
    bool any_bad = !hn::AllFalse(d, bad);
    for (; i < n; ++i) {
      const float y = hn::GetLane(transform(d1, hn::Set(d1, x[i])));
      x[i] = y;
      mx = std::max(mx, y);
      any_bad |= !(y < kInf);
    }
    if (!any_bad && mx == -kInf) {  // every score -inf: nothing to attend to in this part
      m[static_cast<ptrdiff_t>(r) * ms] = -kInf;
      l[static_cast<ptrdiff_t>(r) * ms] = 0.0f;
      std::fill_n(x, n, 0.0f);
      continue;
    }
    if (any_bad) {
      m[static_cast<ptrdiff_t>(r) * ms] = std::numeric_limits<float>::quiet_NaN();
      l[static_cast<ptrdiff_t>(r) * ms] = 0.0f;
      std::fill_n(x, n, 0.0f);
      continue;
    }
    // Pass 2: exp(y - m) and its sum.
    const auto vm = hn::Set(d, mx);
    double sum = 0.0;
    i = 0;
    while (i + N <= n) {
      const size_t end = std::min(n, i + 32 * N);
      auto s0 = hn::Zero(d);
      for (; i + N <= end; i += N) {
        const auto e = ExpNonPos(d, hn::Sub(hn::LoadU(d, x + i), vm));
        hn::StoreU(e, d, x + i);
        s0 = hn::Add(s0, e);
      }
      sum += static_cast<double>(hn::GetLane(hn::SumOfLanes(d, s0)));
    }
    for (; i < n; ++i) {
      const float e = hn::GetLane(ExpNonPos(d1, hn::Set(d1, x[i] - mx)));
      x[i] = e;
      sum += static_cast<double>(e);
    }
    m[static_cast<ptrdiff_t>(r) * ms] = mx;
    l[static_cast<ptrdiff_t>(r) * ms] = static_cast<float>(sum);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
HWY_EXPORT(AttentionF32);
HWY_EXPORT(AttentionExpRows);
}  // namespace kiln

KILN_DISPATCH_BEGIN
void attention_f32(const float* q, std::ptrdiff_t qs, const void* k, const void* v, unsigned kv_type,
                   std::ptrdiff_t kvs, std::size_t kv_len, float* out, std::ptrdiff_t os, std::size_t rows,
                   std::size_t hd, std::size_t heads, std::size_t pos0, std::size_t step, std::size_t window,
                   float scale, float softcap, float sink, const float* sinks, bool amx_bf16, float* scratch) {
  HWY_DYNAMIC_DISPATCH(AttentionF32)
  (q, qs, k, v, kv_type, kvs, kv_len, out, os, rows, hd, heads, pos0, step, window, scale, softcap, sink, sinks,
   amx_bf16, scratch);
}
void attention_exp_rows(float* s, std::ptrdiff_t ss, std::size_t rows, std::size_t n, float scale, float softcap,
                        float* m, float* l, std::ptrdiff_t ms) {
  HWY_DYNAMIC_DISPATCH(AttentionExpRows)(s, ss, rows, n, scale, softcap, m, l, ms);
}
KILN_DISPATCH_END
#endif  // HWY_ONCE

#endif  // per-target include guard
