// kiln/ops/qmatmul_avx2-inl.h - qmatmul kernels with AVX2 vpmaddubsw (unsigned x signed bytes to pairs of
// 16-bit sums), for the AVX2 and AVX3 targets. One weight row at a time is decoded into 256-bit registers
// and dotted with up to 4 quantized rows of x; the GEMM path runs the same kernel over blocks of 32 weight
// rows (kept in L2) and 4 rows of x. Included from qmatmul-inl.h only.
//
// 16-bit safety: a vpmaddubsw pair is at most 2 * 31 * 127 = 7874 for 5-bit weights (two such pairs may be
// added before widening) and 2 * 63 * 127 = 16002 for Q6_K; Q8_0 keeps its signed bytes and uses the
// |w| x sign(x, w) form, 2 * 128 * 127 = 32512 per pair, widened at once.

// Per-target include guard (Highway's toggle idiom).
#if defined(KILN_OPS_QMATMUL_AVX2_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_OPS_QMATMUL_AVX2_INL_H_
#undef KILN_OPS_QMATMUL_AVX2_INL_H_
#else
#define KILN_OPS_QMATMUL_AVX2_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace HWY_NAMESPACE {
namespace qmm {

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3

namespace avx2 {

HWY_INLINE float F16(f16 h) { return _cvtsh_ss(h.bits); }

// An empty asm that claims to change v: the compiler must keep a running sum in a register, step by step.
// Without it GCC reassociates the integer adds of a block, computes all of its products first and spills
// them to the stack (the interleaved Q4_0 GEMM ran 30% slower so).
HWY_INLINE void KeepChain(__m256i& v) {
#if defined(__GNUC__) || defined(__clang__)
  asm("" : "+x"(v));
#else
  (void)v;
#endif
}

// 4 bytes at p in every 32-bit lane.
HWY_INLINE __m256i Bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

HWY_INLINE __m128i Load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
HWY_INLINE __m256i Load32(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Byte i = 0xFF where bit i of x is set.
HWY_INLINE __m256i BytesFromBits(uint32_t x) {
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i r = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
  const __m256i bit = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  return _mm256_cmpeq_epi8(_mm256_or_si256(r, bit), _mm256_set1_epi64x(-1));
}

HWY_INLINE float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Two 32-value blocks (b1 may be null: zeros): lo = [b0 values 0..15 | b1 0..15], hi = [.. 16..31 ..],
// unsigned (signed for Q8_0); dw, dm = the scales and mins, 4 lanes per block.
struct Pair {
  __m256i lo, hi;
  __m256 dw, dm;
};
HWY_INLINE __m256 Scales2(float a, float b) { return _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a)); }
HWY_INLINE void Nibbles(__m128i q0, __m128i q1, Pair& p) {
  const __m256i qs = _mm256_set_m128i(q1, q0), m = _mm256_set1_epi8(0x0F);
  p.lo = _mm256_and_si256(qs, m);
  p.hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m);
}
template <class B>
HWY_INLINE void Fifth(const B* b0, const B* b1, Pair& p) {  // bit 4 of Q5 values from qh
  const uint32_t h0 = ::kiln::detail::load_u32_le(b0->qh), h1 = b1 ? ::kiln::detail::load_u32_le(b1->qh) : 0u;
  const __m256i m = _mm256_set1_epi8(0x10);
  p.lo = _mm256_or_si256(p.lo, _mm256_and_si256(BytesFromBits((h0 & 0xFFFFu) | (h1 << 16)), m));
  p.hi = _mm256_or_si256(p.hi, _mm256_and_si256(BytesFromBits((h0 >> 16) | (h1 & 0xFFFF0000u)), m));
}
HWY_INLINE void DecodePair(const block_q4_0* b0, const block_q4_0* b1, Pair& p) {
  Nibbles(Load16(b0->qs), b1 ? Load16(b1->qs) : _mm_setzero_si128(), p);
  p.dw = Scales2(F16(b0->d), b1 ? F16(b1->d) : 0.f);
}
HWY_INLINE void DecodePair(const block_q4_1* b0, const block_q4_1* b1, Pair& p) {
  Nibbles(Load16(b0->qs), b1 ? Load16(b1->qs) : _mm_setzero_si128(), p);
  p.dw = Scales2(F16(b0->d), b1 ? F16(b1->d) : 0.f);
  p.dm = Scales2(F16(b0->m), b1 ? F16(b1->m) : 0.f);
}
HWY_INLINE void DecodePair(const block_q5_0* b0, const block_q5_0* b1, Pair& p) {
  Nibbles(Load16(b0->qs), b1 ? Load16(b1->qs) : _mm_setzero_si128(), p);
  Fifth(b0, b1, p);
  p.dw = Scales2(F16(b0->d), b1 ? F16(b1->d) : 0.f);
}
HWY_INLINE void DecodePair(const block_q5_1* b0, const block_q5_1* b1, Pair& p) {
  Nibbles(Load16(b0->qs), b1 ? Load16(b1->qs) : _mm_setzero_si128(), p);
  Fifth(b0, b1, p);
  p.dw = Scales2(F16(b0->d), b1 ? F16(b1->d) : 0.f);
  p.dm = Scales2(F16(b0->m), b1 ? F16(b1->m) : 0.f);
}
HWY_INLINE void DecodePair(const block_q8_0* b0, const block_q8_0* b1, Pair& p) {
  const auto* q0 = reinterpret_cast<const uint8_t*>(b0->qs);
  const auto* q1 = b1 ? reinterpret_cast<const uint8_t*>(b1->qs) : nullptr;
  p.lo = _mm256_set_m128i(q1 ? Load16(q1) : _mm_setzero_si128(), Load16(q0));
  p.hi = _mm256_set_m128i(q1 ? Load16(q1 + 16) : _mm_setzero_si128(), Load16(q0 + 16));
  p.dw = Scales2(F16(b0->d), b1 ? F16(b1->d) : 0.f);
}

// C outputs of each of n rows of 32-value blocks.
template <class B, size_t C>
HWY_NOINLINE void Gemv32(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n, float* y,
                         ptrdiff_t ldy) {
  constexpr bool kSigned = std::is_same_v<B, block_q8_0>;
  constexpr bool kMin = std::is_same_v<B, block_q4_1> || std::is_same_v<B, block_q5_1>;
  const size_t nb = L.k / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t j = 0; j < n; ++j) {
    const B* row = reinterpret_cast<const B*>(w + static_cast<ptrdiff_t>(j) * ldw);
    __m256 f[C];
    for (size_t i = 0; i < C; ++i) f[i] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b += 2) {
      Pair p;
      DecodePair(row + b, b + 1 < nb ? row + b + 1 : nullptr, p);
      const size_t o = 128 * (b / 4) + 16 * (b % 4);
      for (size_t i = 0; i < C; ++i) {
        const __m256i xl = Load32(a[i].q + o), xh = Load32(a[i].q + o + 64);
        __m256i acc;
        if constexpr (kSigned) {
          const __m256i sl = _mm256_maddubs_epi16(_mm256_abs_epi8(p.lo), _mm256_sign_epi8(xl, p.lo));
          const __m256i sh = _mm256_maddubs_epi16(_mm256_abs_epi8(p.hi), _mm256_sign_epi8(xh, p.hi));
          acc = _mm256_add_epi32(_mm256_madd_epi16(sl, ones), _mm256_madd_epi16(sh, ones));
        } else {
          const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(p.lo, xl), _mm256_maddubs_epi16(p.hi, xh));
          acc = _mm256_add_epi32(_mm256_madd_epi16(s, ones), Load32(a[i].corr + 4 * b));  // - off * S / 4
        }
        const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_loadu_ps(a[i].dxr + 4 * b));
        f[i] = _mm256_fmadd_ps(t, p.dw, f[i]);
        if constexpr (kMin) f[i] = _mm256_fmadd_ps(p.dm, _mm256_loadu_ps(a[i].dxsr + 4 * b), f[i]);
      }
    }
    for (size_t i = 0; i < C; ++i) y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = HSum(f[i]);
  }
}

// Q4_K / Q5_K: 8 sub-blocks of 32, 6-bit scales sc and mins mn. Per super-block the integer sum
// sum_s sc_s * sum(u q) is exact (vpmaddwd by sc); the mins term dmin * dx * sum_s mn_s S_s is scalar.
template <bool kQ5, size_t C>
HWY_NOINLINE void GemvQ45K(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n, float* y,
                           ptrdiff_t ldy) {
  using B = std::conditional_t<kQ5, block_q5_K, block_q4_K>;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m16 = _mm256_set1_epi8(0x10);
  for (size_t j = 0; j < n; ++j) {
    const B* row = reinterpret_cast<const B*>(w + static_cast<ptrdiff_t>(j) * ldw);
    __m256 f[C];
    float fmin[C];
    for (size_t i = 0; i < C; ++i) {
      f[i] = _mm256_setzero_ps();
      fmin[i] = 0;
    }
    for (size_t sb = 0; sb < L.nd; ++sb) {
      const B& b = row[sb];
      uint8_t sc[8], mn[8];
      for (size_t s = 0; s < 8; ++s) ::kiln::detail::get_scale_min_k4(s, b.scales, sc[s], mn[s]);
      __m256i u[8];  // logical sub-block order
      __m256i hb = _mm256_setzero_si256();
      if constexpr (kQ5) hb = Load32(b.qh);
      for (size_t c = 0; c < 4; ++c) {
        const __m256i qs = Load32(b.qs + 32 * c);
        u[2 * c] = _mm256_and_si256(qs, m4);
        u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
        if constexpr (kQ5) {  // bit s of qh -> bit 4 (16-bit shifts by <= 4 do not cross into bit 4 of a byte)
          for (size_t h = 0; h < 2; ++h) {
            const int s = static_cast<int>(2 * c + h);
            const __m256i v = s <= 4 ? _mm256_slli_epi16(hb, 4 - s) : _mm256_srli_epi16(hb, s - 4);
            u[2 * c + h] = _mm256_or_si256(u[2 * c + h], _mm256_and_si256(v, m16));
          }
        }
      }
      const float d = F16(b.d), dmin = F16(b.dmin);
      for (size_t i = 0; i < C; ++i) {
        const int8_t* q = a[i].q + 256 * sb;
        __m256i acc = _mm256_setzero_si256();
        for (size_t s = 0; s < 8; ++s) {
          const __m256i p = _mm256_maddubs_epi16(u[s], Load32(q + 32 * kKPerm[s]));
          acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(sc[s])));
          KeepChain(acc);
        }
        int32_t imn = 0;
        for (size_t s = 0; s < 8; ++s) imn += mn[s] * a[i].lsum16[8 * sb + s];
        f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(d * a[i].dx[sb]), f[i]);
        fmin[i] += (dmin * a[i].dx[sb]) * static_cast<float>(imn);
      }
    }
    for (size_t i = 0; i < C; ++i)
      y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = HSum(f[i]) - fmin[i];
  }
}

// Q6_K: 16 sub-blocks of 16, int8 scales; the -32 offset is -32 * sum_s sc_s S_s, per super-block.
template <size_t C>
HWY_NOINLINE void GemvQ6K(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n, float* y,
                          ptrdiff_t ldy) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  for (size_t j = 0; j < n; ++j) {
    const block_q6_K* row = reinterpret_cast<const block_q6_K*>(w + static_cast<ptrdiff_t>(j) * ldw);
    __m256 f[C];
    for (size_t i = 0; i < C; ++i) f[i] = _mm256_setzero_ps();
    for (size_t sb = 0; sb < L.nd; ++sb) {
      const block_q6_K& b = row[sb];
      __m256i u[8], scv[8];  // u[v]: values 32v..32v+31 (sub-blocks 2v, 2v + 1)
      for (size_t h = 0; h < 2; ++h) {
        const __m256i l0 = Load32(b.ql + 64 * h), l1 = Load32(b.ql + 64 * h + 32), qh = Load32(b.qh + 32 * h);
        u[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
        u[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
        u[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
        u[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
      }
      for (size_t v = 0; v < 8; ++v)
        scv[v] = _mm256_set_m128i(_mm_set1_epi16(b.scales[2 * v + 1]), _mm_set1_epi16(b.scales[2 * v]));
      const float d = F16(b.d);
      for (size_t i = 0; i < C; ++i) {
        const int8_t* q = a[i].q + 256 * sb;
        __m256i acc = _mm256_setzero_si256();
        for (size_t v = 0; v < 8; ++v) {
          acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u[v], Load32(q + 32 * v)), scv[v]));
          KeepChain(acc);
        }
        int32_t ioff = 0;
        for (size_t s = 0; s < 16; ++s) ioff += b.scales[s] * a[i].lsum16[16 * sb + s];
        acc = _mm256_add_epi32(acc, _mm256_setr_epi32(-32 * ioff, 0, 0, 0, 0, 0, 0, 0));
        f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(d * a[i].dx[sb]), f[i]);
      }
    }
    for (size_t i = 0; i < C; ++i) y[static_cast<ptrdiff_t>(i) * ldy + static_cast<ptrdiff_t>(j)] = HSum(f[i]);
  }
}

// ---- Q6_K GEMM: panels of 8 decoded rows ----
// The row-major GemvQ6K decodes every weight row again for each 4 rows of x. The GEMM decodes 8 rows once
// into a panel (per thread scratch, ~11 bytes per value column: L1/L2) and runs every row of x past it:
//   u:    step t (4 values) of the 8 rows, row r's 4 unsigned 6-bit values at 4r: one register;
//   scw:  per 16-value group, each row's int8 scale in both 16-bit words of its lane;
//   offw: per super-block and pair of groups (2i, 2i + 1), each row's (-32 sc_2i, -32 sc_2i+1) words;
//   d:    per super-block, the 8 rows' d.
// Per group and row of x: 4 vpmaddubsw (pairs <= 2 * 63 * 128, two steps' sum < 2^15), 2 16-bit adds and 2
// vpmaddwd by scw into the row's exact int32 super-block sum I = sum_g sc_g sum(u q); then I - 32 sum_g sc_g
// S_g (vpmaddwd of offw by the activation's (S_2i, S_2i+1)), and f += I * (d dx), lane r = weight row r.
inline constexpr size_t kQ6Rows = 8;
struct Q6KPanel {
  uint8_t* u;
  __m256i* scw;
  __m256i* offw;
  float* d;
  static size_t bytes(size_t k) { return k * kQ6Rows + (k / 16 + k / 32) * 32 + k / 256 * 32 + 64; }
  Q6KPanel(void* mem, size_t k) {  // mem: 64-byte aligned, bytes(k)
    u = static_cast<uint8_t*>(mem);
    scw = reinterpret_cast<__m256i*>(u + k * kQ6Rows);
    offw = scw + k / 16;
    d = reinterpret_cast<float*>(offw + k / 32);
  }
};
// Values 32v .. 32v + 31 of a Q6_K super-block, unsigned (0..63).
HWY_INLINE __m256i Q6KValues(const block_q6_K& b, size_t v) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  const size_t h = v / 4, kind = v % 4;
  const __m256i l = Load32(b.ql + 64 * h + 32 * (kind % 2)), qh = Load32(b.qh + 32 * h);
  const __m256i lo = kind < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
  __m256i hi;
  switch (kind) {  // bits 2 kind, 2 kind + 1 of qh -> bits 4, 5
    case 0: hi = _mm256_slli_epi16(qh, 4); break;
    case 1: hi = _mm256_slli_epi16(qh, 2); break;
    case 2: hi = qh; break;
    default: hi = _mm256_srli_epi16(qh, 2); break;
  }
  return _mm256_or_si256(lo, _mm256_and_si256(hi, m30));
}
// Dword c of r[i] to bytes 32 c + 4 i of dst (an 8 x 8 dword transpose).
HWY_INLINE void Transpose8x8Store(const __m256i* r, uint8_t* dst) {
  __m256i t[8], s[8];
  for (size_t i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);      // r_i c0, r_i+1 c0, r_i c1, r_i+1 c1 | same for c4, c5
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);  // c2, c3 | c6, c7
  }
  for (size_t i = 0; i < 8; i += 4) {
    s[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);          // rows i..i+3 of c0 | c4
    s[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);      // c1 | c5
    s[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);  // c2 | c6
    s[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);  // c3 | c7
  }
  for (size_t c = 0; c < 4; ++c) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * c), _mm256_permute2x128_si256(s[c], s[4 + c], 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * (c + 4)), _mm256_permute2x128_si256(s[c], s[4 + c], 0x31));
  }
}
// Rows j0 .. j0 + 7 of W (row-major Q6_K) into the panel P.
inline void PackQ6KPanel(const QActLayout& L, const uint8_t* w, ptrdiff_t ldw, const Q6KPanel& P) {
  const block_q6_K* rows[kQ6Rows];
  for (size_t r = 0; r < kQ6Rows; ++r)
    rows[r] = reinterpret_cast<const block_q6_K*>(w + static_cast<ptrdiff_t>(r) * ldw);
  for (size_t sb = 0; sb < L.nd; ++sb) {
    for (size_t v = 0; v < 8; ++v) {
      __m256i r[kQ6Rows];
      for (size_t i = 0; i < kQ6Rows; ++i) r[i] = Q6KValues(rows[i][sb], v);
      Transpose8x8Store(r, P.u + 32 * (64 * sb + 8 * v));
    }
    alignas(32) int32_t sw[16][kQ6Rows], ow[8][kQ6Rows];
    for (size_t i = 0; i < kQ6Rows; ++i) {
      const block_q6_K& b = rows[i][sb];
      for (size_t g = 0; g < 16; ++g) sw[g][i] = static_cast<int32_t>(static_cast<uint16_t>(b.scales[g]) * 0x10001u);
      for (size_t g = 0; g < 8; ++g)
        ow[g][i] = static_cast<int32_t>(static_cast<uint16_t>(-32 * b.scales[2 * g]) |
                                        static_cast<uint32_t>(static_cast<uint16_t>(-32 * b.scales[2 * g + 1])) << 16);
      P.d[kQ6Rows * sb + i] = F16(b.d);
    }
    for (size_t g = 0; g < 16; ++g) P.scw[16 * sb + g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(sw[g]));
    for (size_t g = 0; g < 8; ++g) P.offw[8 * sb + g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(ow[g]));
  }
}
// y[c * ldy + r] (r < 8) for rows c < C of x against the panel.
template <size_t C>
HWY_NOINLINE void GemmQ6KPanel(const QActLayout& L, const ActRow* a, const Q6KPanel& P, float* y, ptrdiff_t ldy) {
  __m256 f[C];
  for (size_t c = 0; c < C; ++c) f[c] = _mm256_setzero_ps();
  for (size_t sb = 0; sb < L.nd; ++sb) {
    __m256i acc[C];
    for (size_t c = 0; c < C; ++c) acc[c] = _mm256_setzero_si256();
    for (size_t g = 0; g < 16; ++g) {
      const uint8_t* st = P.u + 32 * (64 * sb + 4 * g);
      const __m256i z0 = Load32(st), z1 = Load32(st + 32), z2 = Load32(st + 64), z3 = Load32(st + 96);
      const __m256i sc = P.scw[16 * sb + g];
      for (size_t c = 0; c < C; ++c) {
        const int8_t* q = a[c].q + 256 * sb + 16 * g;
        const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(z0, Bcast4(q)), _mm256_maddubs_epi16(z1, Bcast4(q + 4)));
        const __m256i p1 =
            _mm256_add_epi16(_mm256_maddubs_epi16(z2, Bcast4(q + 8)), _mm256_maddubs_epi16(z3, Bcast4(q + 12)));
        acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p0, sc));
        acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p1, sc));
        KeepChain(acc[c]);
      }
    }
    const __m256 d = _mm256_load_ps(P.d + kQ6Rows * sb);
    for (size_t c = 0; c < C; ++c) {
      const int8_t* ls = reinterpret_cast<const int8_t*>(a[c].lsum16 + 16 * sb);
      for (size_t i = 0; i < 8; ++i)
        acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(P.offw[8 * sb + i], Bcast4(ls + 4 * i)));
      f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[c]), _mm256_mul_ps(d, _mm256_set1_ps(a[c].dx[sb])), f[c]);
    }
  }
  for (size_t c = 0; c < C; ++c) _mm256_storeu_ps(y + static_cast<ptrdiff_t>(c) * ldy, f[c]);
}

template <class B, size_t C>
HWY_INLINE void GemvTyped(const QActLayout& L, const ActRow* a, const uint8_t* w, ptrdiff_t ldw, size_t n, float* y,
                          ptrdiff_t ldy) {
  if constexpr (std::is_same_v<B, block_q4_K>) GemvQ45K<false, C>(L, a, w, ldw, n, y, ldy);
  else if constexpr (std::is_same_v<B, block_q5_K>) GemvQ45K<true, C>(L, a, w, ldw, n, y, ldy);
  else if constexpr (std::is_same_v<B, block_q6_K>) GemvQ6K<C>(L, a, w, ldw, n, y, ldy);
  else Gemv32<B, C>(L, a, w, ldw, n, y, ldy);
}

}  // namespace avx2

// GEMV: one pass over W with all (<= 4) rows of x. GEMM: blocks of 32 weight rows (L2-resident) against 4
// rows of x at a time. Each output is computed the same way in both.
inline void RowsAvx2(const QActLayout& L, const uint8_t* act, size_t m, const uint8_t* w, ptrdiff_t ldw, size_t n,
                     float* y, ptrdiff_t ldy, bool gemm) {
  constexpr size_t kRowBlock = 32, kC = 4;
  if (gemm && L.type == ggml_type_id::Q6_K && n >= avx2::kQ6Rows) {
    // Panels of 8 rows (rows past the last whole panel: below). Callers' row ranges start at multiples of
    // 16, so a row of W is in a panel or not whatever range a call covers.
    const size_t panels = n / avx2::kQ6Rows;
    const avx2::Q6KPanel P(::kiln::detail::qmm_scratch(1, avx2::Q6KPanel::bytes(L.k)), L.k);
    for (size_t p = 0; p < panels; ++p) {
      const size_t j0 = p * avx2::kQ6Rows;
      avx2::PackQ6KPanel(L, w + static_cast<ptrdiff_t>(j0) * ldw, ldw, P);
      for (size_t i0 = 0; i0 < m; i0 += kC) {
        ActRow a[kC];
        const size_t c = HWY_MIN(kC, m - i0);
        for (size_t i = 0; i < c; ++i) a[i] = GetActRow(act + (i0 + i) * L.row_bytes, L);
        float* yi = y + static_cast<ptrdiff_t>(i0) * ldy + static_cast<ptrdiff_t>(j0);
        switch (c) {
          case 4: avx2::GemmQ6KPanel<4>(L, a, P, yi, ldy); break;
          case 3: avx2::GemmQ6KPanel<3>(L, a, P, yi, ldy); break;
          case 2: avx2::GemmQ6KPanel<2>(L, a, P, yi, ldy); break;
          default: avx2::GemmQ6KPanel<1>(L, a, P, yi, ldy); break;
        }
      }
    }
    const size_t done = panels * avx2::kQ6Rows;
    if (done < n) RowsAvx2(L, act, m, w + static_cast<ptrdiff_t>(done) * ldw, ldw, n - done, y + done, ldy, false);
    return;
  }
  const size_t nblock = gemm ? kRowBlock : n;
  VisitType(L.type, [&](auto* tag) {
    using B = std::remove_pointer_t<decltype(tag)>;
    for (size_t j0 = 0; j0 < n; j0 += nblock) {
      const size_t nn = HWY_MIN(nblock, n - j0);
      const uint8_t* wj = w + static_cast<ptrdiff_t>(j0) * ldw;
      for (size_t i0 = 0; i0 < m; i0 += kC) {
        ActRow a[kC];
        const size_t c = HWY_MIN(kC, m - i0);
        for (size_t i = 0; i < c; ++i) a[i] = GetActRow(act + (i0 + i) * L.row_bytes, L);
        float* yi = y + static_cast<ptrdiff_t>(i0) * ldy + static_cast<ptrdiff_t>(j0);
        switch (c) {
          case 4: avx2::GemvTyped<B, 4>(L, a, wj, ldw, nn, yi, ldy); break;
          case 3: avx2::GemvTyped<B, 3>(L, a, wj, ldw, nn, yi, ldy); break;
          case 2: avx2::GemvTyped<B, 2>(L, a, wj, ldw, nn, yi, ldy); break;
          default: avx2::GemvTyped<B, 1>(L, a, wj, ldw, nn, yi, ldy); break;
        }
      }
    }
  });
}

#endif  // HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3

}  // namespace qmm
}  // namespace HWY_NAMESPACE
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
