// kiln/kernels/qmatmul/generic/scalar-inl.h - plain integer qmatmul kernels (the SSE4, SSSE3 and EMU128/SCALAR
// targets), and the row decoder they use: a row of weight blocks to unsigned bytes u in the activation's
// physical order plus per-sum-group f32 coefficients, so that
//   row . x = sum over groups g of dw[g] * dx * (sum_g u * q - off * S_g) + dm[g] * (dx * S_g).
// Included from entry-inl.h only.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_KERNELS_QMATMUL_GENERIC_SCALAR_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_KERNELS_QMATMUL_GENERIC_SCALAR_INL_H_
#undef KILN_KERNELS_QMATMUL_GENERIC_SCALAR_INL_H_
#else
#define KILN_KERNELS_QMATMUL_GENERIC_SCALAR_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {

// ---- Block scales as f32: dw (of sum((u - off) q)) and dm (of dx * sum(q)). ----

HWY_INLINE void BlockScales(const block_q4_0& b, float& dw, float& dm) {
  dw = f16_bits_to_f32(b.d.bits);
  dm = 0;
}
HWY_INLINE void BlockScales(const block_q5_0& b, float& dw, float& dm) {
  dw = f16_bits_to_f32(b.d.bits);
  dm = 0;
}
HWY_INLINE void BlockScales(const block_q8_0& b, float& dw, float& dm) {
  dw = f16_bits_to_f32(b.d.bits);
  dm = 0;
}
HWY_INLINE void BlockScales(const block_mxfp4& b, float& dw, float& dm) {
  dw = ::kiln::detail::e8m0_to_fp32_half(b.e);
  dm = 0;
}
HWY_INLINE void BlockScales(const block_q4_1& b, float& dw, float& dm) {
  dw = f16_bits_to_f32(b.d.bits);
  dm = f16_bits_to_f32(b.m.bits);
}
HWY_INLINE void BlockScales(const block_q5_1& b, float& dw, float& dm) {
  dw = f16_bits_to_f32(b.d.bits);
  dm = f16_bits_to_f32(b.m.bits);
}

// ---- One block to unsigned bytes (lo: values 0..15 of a 32-block, hi: 16..31). ----

HWY_INLINE void DecodeBlock32(const block_q4_0& b, uint8_t* lo, uint8_t* hi, float& dw, float& dm) {
  for (size_t j = 0; j < 16; ++j) {
    lo[j] = b.qs[j] & 0xF;
    hi[j] = b.qs[j] >> 4;
  }
  dw = f16_bits_to_f32(b.d.bits);
  dm = 0;
}
HWY_INLINE void DecodeBlock32(const block_q4_1& b, uint8_t* lo, uint8_t* hi, float& dw, float& dm) {
  for (size_t j = 0; j < 16; ++j) {
    lo[j] = b.qs[j] & 0xF;
    hi[j] = b.qs[j] >> 4;
  }
  dw = f16_bits_to_f32(b.d.bits);
  dm = f16_bits_to_f32(b.m.bits);
}
HWY_INLINE void DecodeBlock32(const block_q5_0& b, uint8_t* lo, uint8_t* hi, float& dw, float& dm) {
  const uint32_t qh = ::kiln::detail::load_u32_le(b.qh);
  for (size_t j = 0; j < 16; ++j) {
    lo[j] = static_cast<uint8_t>((b.qs[j] & 0xF) | (((qh >> j) & 1u) << 4));
    hi[j] = static_cast<uint8_t>((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
  }
  dw = f16_bits_to_f32(b.d.bits);
  dm = 0;
}
HWY_INLINE void DecodeBlock32(const block_q5_1& b, uint8_t* lo, uint8_t* hi, float& dw, float& dm) {
  const uint32_t qh = ::kiln::detail::load_u32_le(b.qh);
  for (size_t j = 0; j < 16; ++j) {
    lo[j] = static_cast<uint8_t>((b.qs[j] & 0xF) | (((qh >> j) & 1u) << 4));
    hi[j] = static_cast<uint8_t>((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
  }
  dw = f16_bits_to_f32(b.d.bits);
  dm = f16_bits_to_f32(b.m.bits);
}
HWY_INLINE void DecodeBlock32(const block_q8_0& b, uint8_t* lo, uint8_t* hi, float& dw, float& dm) {
  for (size_t j = 0; j < 16; ++j) {
    lo[j] = static_cast<uint8_t>(b.qs[j] ^ 0x80);  // q + 128
    hi[j] = static_cast<uint8_t>(b.qs[j + 16] ^ 0x80);
  }
  dw = f16_bits_to_f32(b.d.bits);
  dm = 0;
}

// MXFP4: u = kvalues_mxfp4[code] + 12 (offset 12), dw = 2^(e - 128).
HWY_INLINE void DecodeBlock32(const block_mxfp4& b, uint8_t* lo, uint8_t* hi, float& dw, float& dm) {
  for (size_t j = 0; j < 16; ++j) {
    lo[j] = static_cast<uint8_t>(::kiln::detail::kvalues_mxfp4[b.qs[j] & 0xF] + 12);
    hi[j] = static_cast<uint8_t>(::kiln::detail::kvalues_mxfp4[b.qs[j] >> 4] + 12);
  }
  BlockScales(b, dw, dm);
}

// Q4_K/Q5_K scales and mins of sub-block s as the f32 coefficients dw = d * sc, dm = -(dmin * mn) (both
// products exact: 11-bit by 6-bit mantissas).
template <class B>
HWY_INLINE void KScales(const B& b, float* dw, float* dm) {
  const float d = f16_bits_to_f32(b.d.bits), dmin = f16_bits_to_f32(b.dmin.bits);
  for (size_t s = 0; s < 8; ++s) {
    uint8_t sc, mn;
    ::kiln::detail::get_scale_min_k4(s, b.scales, sc, mn);
    dw[kKPerm[s]] = d * static_cast<float>(sc);
    dm[kKPerm[s]] = -(dmin * static_cast<float>(mn));
  }
}

HWY_INLINE void KScales(const block_q6_K& b, float* dw, float* dm) {
  const float d = f16_bits_to_f32(b.d.bits);
  for (size_t s = 0; s < 16; ++s) {
    dw[s] = d * static_cast<float>(b.scales[s]);  // exact: 11-bit by 8-bit
    dm[s] = 0;
  }
}

// A super-block to 256 bytes in physical order, 8 (or 16) coefficient pairs.
HWY_INLINE void DecodeBlockK(const block_q4_K& b, uint8_t* u, float* dw, float* dm) {
  for (size_t s = 0; s < 8; ++s) {
    uint8_t* dst = u + 32 * kKPerm[s];
    for (size_t l = 0; l < 32; ++l) dst[l] = (b.qs[(s / 2) * 32 + l] >> (4 * (s % 2))) & 0xF;
  }
  KScales(b, dw, dm);
}
HWY_INLINE void DecodeBlockK(const block_q5_K& b, uint8_t* u, float* dw, float* dm) {
  for (size_t s = 0; s < 8; ++s) {
    uint8_t* dst = u + 32 * kKPerm[s];
    for (size_t l = 0; l < 32; ++l)
      dst[l] = static_cast<uint8_t>(((b.qs[(s / 2) * 32 + l] >> (4 * (s % 2))) & 0xF) | (((b.qh[l] >> s) & 1) << 4));
  }
  KScales(b, dw, dm);
}
HWY_INLINE void DecodeBlockK(const block_q6_K& b, uint8_t* u, float* dw, float* dm) {
  for (size_t h = 0; h < 2; ++h)
    for (size_t r = 0; r < 128; ++r) {
      const int lo = (b.ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0xF;
      const int hi = (b.qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
      u[h * 128 + r] = static_cast<uint8_t>(lo | (hi << 4));
    }
  KScales(b, dw, dm);
}

// Blocks [b0, b1) of a row into u (kp bytes for the whole row) and dw/dm (per sum group); blocks of a
// 32-value type at or past nb (the padding of the last group) become zeros.
template <class B>
void DecodeRowRange(const B* HWY_RESTRICT w, const QActLayout& L, size_t b0, size_t b1, uint8_t* HWY_RESTRICT u,
                    float* HWY_RESTRICT dw, float* HWY_RESTRICT dm) {
  if constexpr (dtype_traits<B>::block_size == 32) {
    const size_t nb = L.k / 32;
    for (size_t b = b0; b < b1; ++b) {
      uint8_t* lo = u + 128 * (b / 4) + 16 * (b % 4);
      if (b < nb) {
        DecodeBlock32(w[b], lo, lo + 64, dw[b], dm[b]);
      } else {
        std::memset(lo, 0, 16);
        std::memset(lo + 64, 0, 16);
        dw[b] = dm[b] = 0;
      }
    }
  } else {
    const size_t per = 256 / L.sg;
    for (size_t b = b0; b < b1; ++b) DecodeBlockK(w[b], u + 256 * b, dw + per * b, dm + per * b);
  }
}

// Calls f(B*) with a null pointer of the block type of a supported type id.
template <class F>
HWY_INLINE void VisitType(uint32_t type, F&& f) {
  switch (type) {
    case ggml_type_id::Q4_0:
      f(static_cast<block_q4_0*>(nullptr));
      break;
    case ggml_type_id::Q4_1:
      f(static_cast<block_q4_1*>(nullptr));
      break;
    case ggml_type_id::Q5_0:
      f(static_cast<block_q5_0*>(nullptr));
      break;
    case ggml_type_id::Q5_1:
      f(static_cast<block_q5_1*>(nullptr));
      break;
    case ggml_type_id::Q8_0:
      f(static_cast<block_q8_0*>(nullptr));
      break;
    case ggml_type_id::Q4_K:
      f(static_cast<block_q4_K*>(nullptr));
      break;
    case ggml_type_id::Q5_K:
      f(static_cast<block_q5_K*>(nullptr));
      break;
    case ggml_type_id::Q6_K:
      f(static_cast<block_q6_K*>(nullptr));
      break;
    case ggml_type_id::MXFP4:
      f(static_cast<block_mxfp4*>(nullptr));
      break;
    default:
      break;
  }
}

// Sum group g as (up to) two runs of bytes of q: [o1, o1 + len) and [o1 + 64, o1 + 64 + len) for
// 32-value blocks, one run otherwise; dxi: its dx.
struct GroupRuns {
  size_t o1, len, dxi;
  bool two;
};
HWY_INLINE GroupRuns Runs(const QActLayout& L, size_t g) {
  if (L.dg == 32) return {128 * (g / 4) + 16 * (g % 4), 16, g, true};
  return {L.sg * g, L.sg, g / (256 / L.sg), false};
}

// One output from a decoded row: the integer sums are exact; f32 per group.
inline float DotDecoded(const QActLayout& L, const uint8_t* HWY_RESTRICT u, const float* HWY_RESTRICT dw,
                        const float* HWY_RESTRICT dm, const ActRow& a, size_t groups) {
  float s = 0;
  for (size_t g = 0; g < groups; ++g) {
    const GroupRuns r = Runs(L, g);
    int32_t I = 0;
    for (size_t t = 0; t < r.len; ++t) I += u[r.o1 + t] * a.q[r.o1 + t];
    if (r.two)
      for (size_t t = 0; t < r.len; ++t) I += u[r.o1 + 64 + t] * a.q[r.o1 + 64 + t];
    I -= L.offset * a.sum[g];
    s += (dw[g] * a.dx[r.dxi]) * static_cast<float>(I) + dm[g] * a.gdxs[g];
  }
  return s;
}

// Decodes each weight row once into per-thread scratch, then dots it with every row of act.
inline void RowsScalar(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, ptrdiff_t ldw, size_t n,
                       float* y, ptrdiff_t ldy) {
  auto* u = static_cast<uint8_t*>(::kiln::detail::qmm_scratch(1, L.kp));
  auto* dw = static_cast<float*>(::kiln::detail::qmm_scratch(2, 2 * L.ns * sizeof(float)));
  float* dm = dw + L.ns;
  const size_t groups = L.dg == 32 ? L.k / 32 : L.ns;
  VisitType(L.type, [&](auto* tag) {
    using B = std::remove_pointer_t<decltype(tag)>;
    const size_t nblk = L.kp / dtype_traits<B>::block_size;
    for (size_t j = 0; j < n; ++j) {
      DecodeRowRange(reinterpret_cast<const B*>(w + static_cast<ptrdiff_t>(j) * ldw), L, 0, nblk, u, dw, dm);
      for (size_t i = 0; i < m; ++i)
        y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] =
            DotDecoded(L, u, dw, dm, GetActRow(act + i * L.row_bytes, L), groups);
    }
  });
}

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
