// kiln/ops/qmatmul_ref.hpp - the scalar references of ops/qmatmul.hpp (included at its end; include
// that header, not this one): kiln::ref::qmatmul_dequant (W dequantized, double dot: the 'true' product),
// kiln::ref::qmatmul_int (the same activation quantization and integer block dots, double scaling) and
// kiln::ref::qmm_split_residual and qmm_split_residual_act (the fast path's second activation part).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/ops/qmatmul.hpp"

namespace kiln {

namespace ref {

/// (a) The 'true' product: W dequantized with quant_traits (f32), dotted with x in double.
/// w: n rows of k / block_size blocks, ldw blocks apart.
template <Dequantizable B>
void qmatmul_dequant(const float* x, std::ptrdiff_t ldx, const B* w, std::ptrdiff_t ldw, float* y, std::ptrdiff_t ldy,
                     std::size_t m, std::size_t n, std::size_t k) {
  constexpr std::size_t bs = block_size_v<B>;
  Buffer<float> wf(k);
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t b = 0; b < k / bs; ++b)
      quant_traits<std::remove_const_t<B>>::dequantize(w[std::ptrdiff_t(j) * ldw + std::ptrdiff_t(b)],
                                                       wf.data() + b * bs);
    for (std::size_t i = 0; i < m; ++i) {
      double s = 0;
      for (std::size_t p = 0; p < k; ++p) s += double(x[std::ptrdiff_t(i) * ldx + std::ptrdiff_t(p)]) * wf[p];
      y[std::ptrdiff_t(i) * ldy + std::ptrdiff_t(j)] = float(s);
    }
  }
}

/// qmatmul's activation quantization, in natural order: per group of g values (32, or 256 for K-quant
/// weights), dx = amax / 127 and q = nearest_even(x * (127 / amax)) (all f32; amax = 0 gives q = 0, dx = 0).
/// One group's scale: dx = amax / 127 and the inverse used for rounding, id = 127 / amax (0 when amax = 0).
inline void qmm_group_scale(const float* x, std::size_t g, float& id, float& dx) {
  float amax = 0;
  for (std::size_t i = 0; i < g; ++i) amax = std::max(amax, std::fabs(x[i]));
  id = amax > 0 ? 127.0f / amax : 0.0f;
  dx = amax / 127.0f;
}

inline void qmm_quantize_act(const float* x, std::size_t k, std::size_t g, int8_t* q, float* dx) {
  for (std::size_t b = 0; b < k / g; ++b) {
    float id = 0;
    qmm_group_scale(x + b * g, g, id, dx[b]);
    for (std::size_t i = 0; i < g; ++i) q[b * g + i] = int8_t(std::nearbyint(x[b * g + i] * id));
  }
}

/// qmatmul_split_act's second part before rounding: per group of g values, r = x - dx * nearbyint(x * id)
/// with dx, id from qmm_group_scale, in f32: one product, then one subtraction (never fused into an FMA).
inline void qmm_split_residual(const float* x, std::size_t k, std::size_t g, float* r) {
  for (std::size_t b = 0; b < k; b += g) {
    float id = 0, dx = 0;
    qmm_group_scale(x + b, g, id, dx);
    for (std::size_t j = b; j < b + g; ++j) {
      const volatile float p = dx * std::nearbyint(x[j] * id);  // volatile: a separate f32 product
      r[j] = x[j] - p;
    }
  }
}

/// The exponent s of the residual part's scale dx / 2^s for a group whose x has max |x| = amax and whose
/// residuals max |r| = ramax: the largest s in [8, 12] with rho * 2^s <= 127, rho = ramax * (127 / amax) in
/// f32 (so no residual is clamped once s > 8); 8 when amax < 2^-96 (keeps the scales normal) or every s
/// clamps. 12 is the most for which 2^s X + R, the GEMM's integer pair sum, fits in int32 for every
/// weight type (|X| <= 32 * 128 * 127).
inline int qmm_residual_shift(float amax, float ramax) {
  if (!(amax >= 0x1p-96f)) return 8;
  const float rho = ramax * (127.0f / amax);
  int s = 8;
  while (s < 12 && std::ldexp(rho, s + 1) <= 127.0f) ++s;
  return s;
}

/// qmatmul_split_act's second part, rounded: per group, the residual r of qmm_split_residual quantized with
/// the scale dx_r = dx / 2^s, s = qmm_residual_shift(amax, max |r|) (exactly: dx = amax / 127, dx_r =
/// (amax / 2^s) / 127 in f32, both normal), i.e. q = nearest_even(clamp(r * id_r, -127, 127)) with
/// id_r = 127 / (amax / 2^s) (0 when amax = 0). The power-of-two ratio lets a kernel add the parts' integer
/// sums (2^s X + R) before scaling. |r| is at most dx / 2 (1 + 2^-13), so with s = 8 r * id_r reaches 128
/// only within 2^-8 of that (~0.4% of the values): the clamp costs at most dx_r (1 + 2^-6) = dx / 252
/// there, dx_r / 2 <= dx / 512 elsewhere. q: k values, dx: k / g scales (dx_r). qmm_quantize_residual is its
/// second step, given the residuals r of x.
inline void qmm_quantize_residual(const float* x, const float* r, std::size_t k, std::size_t g, int8_t* q, float* dx) {
  for (std::size_t b = 0; b < k / g; ++b) {
    float amax = 0, ramax = 0;
    for (std::size_t i = 0; i < g; ++i) {
      amax = std::max(amax, std::fabs(x[b * g + i]));
      ramax = std::max(ramax, std::fabs(r[b * g + i]));
    }
    const float a = std::ldexp(amax, -qmm_residual_shift(amax, ramax)), id = a > 0 ? 127.0f / a : 0.0f;
    dx[b] = a / 127.0f;
    for (std::size_t i = 0; i < g; ++i)
      q[b * g + i] = int8_t(std::nearbyint(std::clamp(r[b * g + i] * id, -127.0f, 127.0f)));
  }
}
inline void qmm_split_residual_act(const float* x, std::size_t k, std::size_t g, int8_t* q, float* dx) {
  std::vector<float> r(k);
  qmm_split_residual(x, k, g, r.data());
  qmm_quantize_residual(x, r.data(), k, g, q, dx);
}

namespace detail {
/// One weight block as integers: value i = scale[i / sub] * (v[i]) - min[i / sub], with v = u - off (u the
/// stored unsigned value), scale/min per sub-block of `sub` values (the whole block for 32-value types:
/// scale d, min -m). For K-quants scale = d * sc and min = dmin * mn are kept apart as d, sc[] (and
/// dmin, mn[]) so the reference can form the exact integer sums.
struct IntBlock {
  int u[256];
  int off = 0;
  std::size_t sub = 32;
  float d = 0, dmin = 0;  // 32-value blocks: d and m (added, not subtracted) with sc = 1, mn = 1
  int sc[16] = {}, mn[16] = {};
  bool has_min = false, min_added = false;
};

inline int q5_high(const uint8_t* qh, std::size_t j) { return int((::kiln::detail::load_u32_le(qh) >> j) & 1u) << 4; }

inline void int_block(const block_q4_0& b, IntBlock& o) {
  for (std::size_t j = 0; j < 16; ++j) {
    o.u[j] = b.qs[j] & 0xF;
    o.u[j + 16] = b.qs[j] >> 4;
  }
  o.off = 8;
  o.d = float(b.d);
  o.sc[0] = 1;
}
inline void int_block(const block_q4_1& b, IntBlock& o) {
  for (std::size_t j = 0; j < 16; ++j) {
    o.u[j] = b.qs[j] & 0xF;
    o.u[j + 16] = b.qs[j] >> 4;
  }
  o.d = float(b.d);
  o.sc[0] = 1;
  o.dmin = float(b.m);
  o.mn[0] = 1;
  o.has_min = o.min_added = true;
}
inline void int_block(const block_q5_0& b, IntBlock& o) {
  for (std::size_t j = 0; j < 16; ++j) {
    o.u[j] = (b.qs[j] & 0xF) | q5_high(b.qh, j);
    o.u[j + 16] = (b.qs[j] >> 4) | q5_high(b.qh, j + 16);
  }
  o.off = 16;
  o.d = float(b.d);
  o.sc[0] = 1;
}
inline void int_block(const block_q5_1& b, IntBlock& o) {
  for (std::size_t j = 0; j < 16; ++j) {
    o.u[j] = (b.qs[j] & 0xF) | q5_high(b.qh, j);
    o.u[j + 16] = (b.qs[j] >> 4) | q5_high(b.qh, j + 16);
  }
  o.d = float(b.d);
  o.sc[0] = 1;
  o.dmin = float(b.m);
  o.mn[0] = 1;
  o.has_min = o.min_added = true;
}
inline void int_block(const block_q8_0& b, IntBlock& o) {
  for (std::size_t j = 0; j < 32; ++j) o.u[j] = b.qs[j] + 128;
  o.off = 128;
  o.d = float(b.d);
  o.sc[0] = 1;
}
inline void int_block(const block_q4_K& b, IntBlock& o) {
  for (std::size_t e = 0; e < 256; ++e) o.u[e] = (b.qs[(e / 64) * 32 + e % 32] >> (4 * ((e / 32) % 2))) & 0xF;
  for (std::size_t s = 0; s < 8; ++s) {
    uint8_t sc, mn;
    ::kiln::detail::get_scale_min_k4(s, b.scales, sc, mn);
    o.sc[s] = sc;
    o.mn[s] = mn;
  }
  o.d = float(b.d);
  o.dmin = float(b.dmin);
  o.has_min = true;
}
inline void int_block(const block_q5_K& b, IntBlock& o) {
  for (std::size_t e = 0; e < 256; ++e)
    o.u[e] = ((b.qs[(e / 64) * 32 + e % 32] >> (4 * ((e / 32) % 2))) & 0xF) | (((b.qh[e % 32] >> (e / 32)) & 1) << 4);
  for (std::size_t s = 0; s < 8; ++s) {
    uint8_t sc, mn;
    ::kiln::detail::get_scale_min_k4(s, b.scales, sc, mn);
    o.sc[s] = sc;
    o.mn[s] = mn;
  }
  o.d = float(b.d);
  o.dmin = float(b.dmin);
  o.has_min = true;
}
inline void int_block(const block_q6_K& b, IntBlock& o) {
  for (std::size_t e = 0; e < 256; ++e) {
    const std::size_t h = e / 128, r = e % 128;
    const int lo = (b.ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0xF;
    const int hi = (b.qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
    o.u[e] = lo | (hi << 4);
  }
  for (std::size_t s = 0; s < 16; ++s) o.sc[s] = b.scales[s];
  o.off = 32;
  o.sub = 16;
  o.d = float(b.d);
}
/// MXFP4: u = kvalues_mxfp4[code] + 12 (the e2m1 value doubled, made unsigned), off = 12, d = 2^(e - 128).
inline void int_block(const block_mxfp4& b, IntBlock& o) {
  for (std::size_t j = 0; j < 16; ++j) {
    o.u[j] = ::kiln::detail::kvalues_mxfp4[b.qs[j] & 0xF] + 12;
    o.u[j + 16] = ::kiln::detail::kvalues_mxfp4[b.qs[j] >> 4] + 12;
  }
  o.off = 12;
  o.d = ::kiln::detail::e8m0_to_fp32_half(b.e);
  o.sc[0] = 1;
}
}  // namespace detail

/// (b) The exact integer-dot reference: x quantized as qmatmul does (qmm_quantize_act), integer sums per
/// sub-block of sum((u - off) * q) and sum(q), scaled in double: per block
///   32-value types: d * dx * I [+ m * dx * S];  K-quants: d * dx * sum_s sc_s I_s - dmin * dx * sum_s mn_s S_s.
/// abs_terms (m x n, row-major, optional) receives, per output, a bound on the magnitude of every partial
/// sum a kernel may round: sum over sub-blocks of |d sc dx| * sum_i (u_i + off) |q_i| (+ |m dx S| or
/// |dmin mn dx S|), so |kernel - reference| <= (roundings per lane) * 2^-24 * abs_terms.
template <Dequantizable B>
void qmatmul_int(const float* x, std::ptrdiff_t ldx, const B* w, std::ptrdiff_t ldw, float* y, std::ptrdiff_t ldy,
                 std::size_t m, std::size_t n, std::size_t k, double* abs_terms = nullptr) {
  using BB = std::remove_const_t<B>;
  constexpr std::size_t bs = block_size_v<B>;
  const std::size_t g = bs == 256 ? 256 : 32;
  Buffer<int8_t> q(m * k);
  Buffer<float> dx(m * (k / g));
  for (std::size_t i = 0; i < m; ++i)
    qmm_quantize_act(x + std::ptrdiff_t(i) * ldx, k, g, q.data() + i * k, dx.data() + i * (k / g));
  std::vector<detail::IntBlock> ib(k / bs);
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t b = 0; b < k / bs; ++b) {
      ib[b] = detail::IntBlock{};
      detail::int_block(static_cast<const BB&>(w[std::ptrdiff_t(j) * ldw + std::ptrdiff_t(b)]), ib[b]);
    }
    for (std::size_t i = 0; i < m; ++i) {
      double s = 0, a = 0;
      for (std::size_t b = 0; b < k / bs; ++b) {
        const detail::IntBlock& blk = ib[b];
        const int8_t* qb = q.data() + i * k + b * bs;
        const double dxb = dx[i * (k / g) + b * bs / g];
        for (std::size_t s0 = 0; s0 < bs; s0 += blk.sub) {
          long long I = 0, S = 0, A = 0;
          for (std::size_t t = s0; t < s0 + blk.sub; ++t) {
            I += (long long)(blk.u[t] - blk.off) * qb[t];
            S += qb[t];
            A += (long long)(blk.u[t] + blk.off) * std::abs(int(qb[t]));
          }
          const std::size_t sidx = s0 / blk.sub;
          const double scale = double(blk.d) * blk.sc[sidx] * dxb;
          s += scale * double(I);
          a += std::fabs(scale) * double(A);
          if (blk.has_min) {
            const double mt = double(blk.dmin) * blk.mn[sidx] * dxb * double(S);
            s += blk.min_added ? mt : -mt;
            a += std::fabs(mt);
          }
        }
      }
      y[std::ptrdiff_t(i) * ldy + std::ptrdiff_t(j)] = float(s);
      if (abs_terms) abs_terms[i * n + j] = a;
    }
  }
}

}  // namespace ref

}  // namespace kiln
