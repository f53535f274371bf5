// kiln/core/dtype.hpp: bf16 and f16 conversions, checked bit-exactly against independent references
// (exact double arithmetic choosing the nearer neighbour, ties to even) and, for f16, against the
// CPU's own F16C instructions. Conversions are exact or correctly rounded, so every check is equality.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KILN_TEST_HAVE_F16C 1
#endif

#include "test_util.hpp"

using namespace kiln;

namespace {

float f32_of(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

bool bf16_is_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }
bool f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

/// Rounds the finite magnitude a to the grid {k * 2^q} of a format, ties to even k. `top` is the first
/// magnitude that no longer fits (it and everything rounding to it become infinity). Returns k, or
/// kInf. Exact: a is an f32 and the grid points are doubles with few bits.
constexpr uint64_t kInf = ~uint64_t(0);
uint64_t round_to_grid(double a, int q, double top) {
  const double unit = std::ldexp(1.0, q);
  const double k_lo = std::floor(a / unit);  // a / unit is exact (power of two)
  const double lo = k_lo * unit, hi = lo + unit;
  double k;
  if (a - lo < hi - a) k = k_lo;
  else if (a - lo > hi - a) k = k_lo + 1;
  else k = std::fmod(k_lo, 2.0) == 0 ? k_lo : k_lo + 1;  // tie: the even neighbour
  return k * unit >= top ? kInf : uint64_t(k);
}

/// Reference f32 -> bf16 for non-NaN input. A bf16 has 8 significant bits: in the binade [2^e, 2^(e+1))
/// the grid step is 2^(e-7); below the smallest normal (2^-126) it is 2^-133.
uint16_t ref_f32_to_bf16(float f) {
  const uint16_t sign = (bits_of(f) >> 16) & 0x8000u;
  if (std::isinf(f)) return sign | 0x7f80u;
  const double a = std::fabs(double(f));
  if (a == 0) return sign;
  const int e = std::max(std::ilogb(a), -126);
  const uint64_t k = round_to_grid(a, e - 7, std::ldexp(1.0, 128));
  if (k == kInf) return sign | 0x7f80u;
  // value = k * 2^(e-7); encode: k in [128, 256] for normals (256 = next binade), k < 128 subnormal.
  const double v = double(k) * std::ldexp(1.0, e - 7);
  return sign | uint16_t(bits_of(float(v)) >> 16);  // v is exactly a bf16, so its f32 low half is 0
}

/// Reference f32 -> f16 for non-NaN input: 11 significant bits, normals from 2^-14, subnormal step 2^-24,
/// values rounding to 65536 or more become infinity.
uint16_t ref_f32_to_f16(float f) {
  const uint16_t sign = (bits_of(f) >> 16) & 0x8000u;
  if (std::isinf(f)) return sign | 0x7c00u;
  const double a = std::fabs(double(f));
  if (a == 0) return sign;
  const int e = std::max(std::ilogb(a), -14);
  const uint64_t k = round_to_grid(a, e - 10, 65536.0);
  if (k == kInf) return sign | 0x7c00u;
  const double v = double(k) * std::ldexp(1.0, e - 10);
  // Encode v (exactly representable as f16): subnormal if below 2^-14.
  if (v < std::ldexp(1.0, -14)) return sign | uint16_t(v / std::ldexp(1.0, -24));
  const int ve = std::ilogb(v);
  const uint16_t man = uint16_t(v / std::ldexp(1.0, ve - 10)) - 1024;
  return sign | uint16_t((ve + 15) << 10) | man;
}

/// Reference f16 -> f32 from the definition: (-1)^s 2^(e-15) (1 + m/1024), subnormals 2^-14 (m/1024).
float ref_f16_to_f32(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0) v = std::ldexp(double(m), -24);
  else if (e == 31) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return float(s ? -v : v);
}

#if KILN_TEST_HAVE_F16C
// F16C (CPUID.1:ECX bit 29) is VEX-encoded, so the OS must also save AVX state (OSXSAVE, XCR0 bits 1-2).
// Not __builtin_cpu_supports("f16c"): clang 14 does not know that name.
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  if (!(c & bit_F16C) || !(c & bit_OSXSAVE)) return false;
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 6u) == 6u;
}
__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float f) {
  return uint16_t(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0));
}
__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
#endif

/// Edge inputs for f32 -> f16 rounding: every f16 value, the exact midpoint to its upper neighbour (a
/// tie), and the floats one ulp either side of both; both signs. Plus the special values.
std::vector<float> f16_edge_inputs() {
  std::vector<float> v;
  for (uint32_t h = 0; h <= 0x7bffu; ++h) {
    const double lo = ref_f16_to_f32(uint16_t(h));
    const double hi = h == 0x7bffu ? 65536.0 : double(ref_f16_to_f32(uint16_t(h + 1)));
    const float mid = float((lo + hi) / 2);  // exact: needs 12 significant bits
    for (float x : {float(lo), mid}) {
      for (float y : {x, std::nextafter(x, 0.f), std::nextafter(x, INFINITY)}) {
        v.push_back(y);
        v.push_back(-y);
      }
    }
  }
  for (float x : {0.f, 65504.f, 65519.996f, 65520.f, 65536.f, 1e10f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(), 0x1p-25f, 0x1p-26f,
                  0x1.000002p-25f, 0x1.8p-24f, INFINITY}) {
    v.push_back(x);
    v.push_back(-x);
  }
  return v;
}

}  // namespace

TEST_CASE("dtype traits name and size every scalar dtype") {
  CHECK(dtype_name<float> == "f32");
  CHECK(dtype_name<const float> == "f32");
  CHECK(dtype_name<f16> == "f16");
  CHECK(dtype_name<bf16> == "bf16");
  CHECK(dtype_name<int8_t> == "i8");
  CHECK(dtype_name<int32_t> == "i32");
  static_assert(DType<float> && DType<const bf16> && DType<int8_t>, "scalar dtypes are dtypes");
  static_assert(!DType<double> && !DType<int64_t>, "only kiln's dtypes are dtypes");
  static_assert(dtype_traits<bf16>::block_size == 1 && dtype_traits<bf16>::block_bytes == 2, "bf16 is one 2-byte unit");
  static_assert(!dtype_traits<f16>::is_block, "f16 is not a block type");
  CHECK(to_f32(bf16::from_bits(0x3fc0)) == 1.5f);
  CHECK(to_f32(f16::from_bits(0x3e00)) == 1.5f);
  CHECK(to_f32(2.5f) == 2.5f);
}

TEST_CASE("bf16: hand-checked rounding (nearest, ties to even), overflow, infinities, NaN") {
  CHECK(f32_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(f32_to_bf16_bits(f32_of(0x3f808000u)) == 0x3f80);  // 1 + 2^-8: halfway 1 / 1+2^-7 -> even (1)
  CHECK(f32_to_bf16_bits(f32_of(0x3f818000u)) == 0x3f82);  // halfway 0x3f81 / 0x3f82 -> even (0x3f82)
  CHECK(f32_to_bf16_bits(f32_of(0x3f808001u)) == 0x3f81);  // just above halfway: up
  CHECK(f32_to_bf16_bits(f32_of(0x3f817fffu)) == 0x3f81);  // just below halfway: down
  CHECK(f32_to_bf16_bits(-1.0f) == 0xbf80);
  CHECK(f32_to_bf16_bits(f32_of(0xbf818000u)) == 0xbf82);  // ties to even for negatives too
  CHECK(f32_to_bf16_bits(0.0f) == 0x0000);
  CHECK(f32_to_bf16_bits(-0.0f) == 0x8000);
  CHECK(f32_to_bf16_bits(INFINITY) == 0x7f80);
  CHECK(f32_to_bf16_bits(-INFINITY) == 0xff80);
  // Largest finite bf16 is 0x7f7f (3.3895e38); floats from its midpoint to 2^128 up round to infinity.
  CHECK(f32_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(f32_to_bf16_bits(f32_of(0x7f7f7fffu)) == 0x7f7f);
  CHECK(f32_to_bf16_bits(f32_of(0x7f7f8000u)) == 0x7f80);  // tie between 0x7f7f (odd) and inf (even)
  CHECK(f32_to_bf16_bits(-std::numeric_limits<float>::max()) == 0xff80);
  CHECK(f32_to_bf16_bits(f32_of(0x00008000u)) == 0x0000);  // subnormal tie -> even (0)
  CHECK(f32_to_bf16_bits(f32_of(0x00018000u)) == 0x0002);  // subnormal tie -> even (2)
  // NaN stays NaN even when its payload is only in the low 16 bits (truncation would make it inf).
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7fa00000u, 0xffc12345u}) {
    CAPTURE(u);
    const uint16_t b = f32_to_bf16_bits(f32_of(u));
    CHECK(bf16_is_nan(b));
    CHECK((b & 0x8000u) == ((u >> 16) & 0x8000u));  // sign kept
    CHECK(std::isnan(bf16_bits_to_f32(b)));
  }
  CHECK(bf16(3.0f).bits == 0x4040);
  CHECK(float(bf16::from_bits(0x4040)) == 3.0f);
}

TEST_CASE("bf16: f32 -> bf16 equals the exact-arithmetic reference for every high half and tricky low halves") {
  std::mt19937 rng(123);
  std::size_t checked = 0, mismatches = 0;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xfffeu, 0xffffu, uint32_t(rng() & 0xffffu)}) {
      const uint32_t u = (hi << 16) | lo;
      const float f = f32_of(u);
      if (std::isnan(f)) {
        const uint16_t b = f32_to_bf16_bits(f);
        if (!bf16_is_nan(b) || (b & 0x8000u) != (hi & 0x8000u)) ++mismatches;
      } else if (f32_to_bf16_bits(f) != ref_f32_to_bf16(f) && ++mismatches < 10) {
        INFO("input bits ", u);
        CHECK(f32_to_bf16_bits(f) == ref_f32_to_bf16(f));  // report the first few
      }
      ++checked;
    }
  }
  CHECK(checked == 0x10000u * 8);
  CHECK(mismatches == 0);
}

TEST_CASE("bf16 -> f32 is exact for every bit pattern, and f32 -> bf16 gives it back") {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = bf16_bits_to_f32(uint16_t(b));
    REQUIRE(bits_of(f) == b << 16);
    if (!bf16_is_nan(uint16_t(b))) REQUIRE(f32_to_bf16_bits(f) == b);
  }
}

TEST_CASE("f16: hand-checked rounding, subnormals, overflow, infinities, NaN") {
  CHECK(f32_to_f16_bits(1.0f) == 0x3c00);
  CHECK(f32_to_f16_bits(-2.0f) == 0xc000);
  CHECK(f32_to_f16_bits(65504.0f) == 0x7bff);    // largest finite f16
  CHECK(f32_to_f16_bits(65519.996f) == 0x7bff);  // below the midpoint 65520
  CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);    // midpoint: ties to even (inf, 0x7c00)
  CHECK(f32_to_f16_bits(1e10f) == 0x7c00);
  CHECK(f32_to_f16_bits(-1e10f) == 0xfc00);
  CHECK(f32_to_f16_bits(0x1p-24f) == 0x0001);  // smallest subnormal
  CHECK(f32_to_f16_bits(0x1p-25f) == 0x0000);  // half of it: tie -> even (0)
  CHECK(f32_to_f16_bits(0x1.000002p-25f) == 0x0001);
  CHECK(f32_to_f16_bits(0x1.8p-24f) == 0x0002);       // 1.5 units: tie -> even (2)
  CHECK(f32_to_f16_bits(0x1p-14f) == 0x0400);         // smallest normal
  CHECK(f32_to_f16_bits(0x1.ff8p-15f) == 0x03ff);     // largest subnormal (1023 * 2^-24)
  CHECK(f32_to_f16_bits(0x1.ffcp-15f) == 0x0400);     // tie between it (odd) and 2^-14 (even)
  CHECK(f32_to_f16_bits(1.0f + 0x1p-11f) == 0x3c00);  // tie -> even
  CHECK(f32_to_f16_bits(1.0f + 0x3p-11f) == 0x3c02);  // tie -> even
  CHECK(f32_to_f16_bits(-0.0f) == 0x8000);
  CHECK(f32_to_f16_bits(INFINITY) == 0x7c00);
  CHECK(f32_to_f16_bits(-INFINITY) == 0xfc00);
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffa00000u}) {
    CAPTURE(u);
    const uint16_t h = f32_to_f16_bits(f32_of(u));
    CHECK(f16_is_nan(h));
    CHECK((h & 0x8000u) == ((u >> 16) & 0x8000u));
  }
  CHECK(f16(0.5f).bits == 0x3800);
  CHECK(float(f16::from_bits(0x3800)) == 0.5f);
}

TEST_CASE("f16: all 65536 bit patterns convert exactly to f32 and round-trip back") {
  std::size_t bad = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = f16_bits_to_f32(uint16_t(h));
    const float want = ref_f16_to_f32(uint16_t(h));
    if (f16_is_nan(uint16_t(h))) {
      // NaN: stays NaN with the same sign, and comes back quiet with its payload.
      const uint16_t back = f32_to_f16_bits(f);
      if (!std::isnan(f) || std::signbit(f) != bool(h & 0x8000u) || back != (h | 0x200u)) ++bad;
      continue;
    }
    if (bits_of(f) != bits_of(want) || f32_to_f16_bits(f) != h) {
      if (++bad < 10) {
        INFO("f16 bits ", h);
        CHECK(bits_of(f) == bits_of(want));
        CHECK(f32_to_f16_bits(f) == h);
      }
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("f16: f32 -> f16 equals the exact-arithmetic reference on every tie and neighbour, and random inputs") {
  std::vector<float> in = f16_edge_inputs();
  std::mt19937 rng(7);
  for (int i = 0; i < 1 << 20; ++i) in.push_back(f32_of(uint32_t(rng())));  // every class of float
  std::uniform_real_distribution<float> man(1.f, 2.f);
  std::uniform_int_distribution<int> ex(-27, 17);  // from below the subnormals to past the overflow
  for (int i = 0; i < 1 << 20; ++i) in.push_back(std::ldexp(man(rng), ex(rng)) * (i & 1 ? -1.f : 1.f));
  std::size_t bad = 0;
  for (float f : in) {
    if (std::isnan(f)) continue;  // NaN: covered by the hardware comparison and the hand checks
    if (f32_to_f16_bits(f) != ref_f32_to_f16(f) && ++bad < 10) {
      INFO("input ", f, " bits ", bits_of(f));
      CHECK(f32_to_f16_bits(f) == ref_f32_to_f16(f));
    }
  }
  CHECK(bad == 0);
}

#if KILN_TEST_HAVE_F16C
TEST_CASE("f16: conversions match the CPU's F16C instructions bit for bit (round to nearest even)") {
  REQUIRE_MESSAGE(cpu_has_f16c(), "this x86 CPU lacks F16C; kiln targets CPUs that have it");
  std::vector<float> in = f16_edge_inputs();
  std::mt19937 rng(99);
  for (int i = 0; i < 1 << 21; ++i) in.push_back(f32_of(uint32_t(rng())));  // includes NaNs of all payloads
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffa00000u, 0x7f802000u, 0x7fbfe000u})
    in.push_back(f32_of(u));
  std::size_t bad = 0;
  for (float f : in) {
    if (f32_to_f16_bits(f) != hw_f32_to_f16(f) && ++bad < 10) {
      INFO("input ", f, " bits ", bits_of(f));
      CHECK(f32_to_f16_bits(f) == hw_f32_to_f16(f));
    }
  }
  CHECK(bad == 0);
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float hw = hw_f16_to_f32(uint16_t(h));
    const float got = f16_bits_to_f32(uint16_t(h));
    if (f16_is_nan(uint16_t(h))) REQUIRE(std::isnan(got));
    else REQUIRE(bits_of(got) == bits_of(hw));
  }
}
#endif
