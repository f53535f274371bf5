// The fused parts of qmatmul: the two-part activation quantization in one pass
// (dispatch::qmatmul_quantize_split) and multi-output products (qmatmul_multi, linear_multi), each checked
// BIT-IDENTICAL against what it replaces:
//   - the split quantization against the scalar code it replaced (residuals r = x - dx * nearbyint(x * id)
//     into an f32 (2M, K) copy, ref::qmm_split_residual, then qmatmul_quantize of all 2M rows), byte for
//     byte of the activation scratch, on every Highway target; the data is checked to tell a fused
//     multiply-subtract (one rounding) from the two roundings, so a contracted residual fails;
//   - qmatmul_split_act against that old implementation (f32 copy, qmatmul of 2M rows, halves added);
//   - qmatmul_multi / linear_multi against one qmatmul / qmatmul_split_act / linear() per weight, for mixed
//     weight types (layouts shared and not), f32/f16 fallbacks, 1 and 2 threads, GEMV and GEMM row counts.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kiln/ops/linear.hpp"
#include "kiln/ops/qmatmul.hpp"
#include "kiln/ops/qmatmul_i16.hpp"
#include "test_util.hpp"
#include "weights_util.hpp"

using namespace kiln;

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSmall = true;
#else
constexpr bool kSmall = false;
#endif

ThreadPool& pool2() {
  static ThreadPool p(2);
  return p;
}

constexpr uint32_t kTypes[] = {ggml_type_id::Q4_0, ggml_type_id::Q4_1, ggml_type_id::Q5_0, ggml_type_id::Q5_1,
                               ggml_type_id::Q8_0, ggml_type_id::Q4_K, ggml_type_id::Q5_K, ggml_type_id::Q6_K};

std::string type_name(uint32_t t) { return std::string(io::ggml_type_name(io::GGMLType(t))); }

// x rows (row stride ldx): uniform with a magnitude per 32 values, one all-zero group, -0.0 entries, and
// one group (of 32 or 256) with amax = 127 (id = dx = 1) whose other values are halves (k + 0.5: ties that
// round to even) so any rounding other than nearest-even shows.
std::vector<float> make_x(std::size_t m, std::size_t ldx, std::size_t k, std::size_t g, uint32_t seed) {
  auto x = test::random_floats(m * ldx, seed, -1.f, 1.f);
  const float mags[5] = {1.f, 1e-3f, 30.f, 0.2f, 3e-6f};
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = 0; p < k; ++p) x[i * ldx + p] *= mags[(p / 32 + i) % 5];
  for (std::size_t i = 0; i < m; ++i) {
    float* r = x.data() + i * ldx;
    r[(7 * i + 3) % k] = -0.0f;
    if (k >= 2 * g && i % 2 == 0) {  // group 1: exact zeros, with a -0.0
      std::fill(r + g, r + 2 * g, 0.0f);
      r[g + 5] = -0.0f;
    }
    if (k >= 3 * g && i % 3 == 1) {  // group 2: ties
      for (std::size_t p = 0; p < g; ++p) r[2 * g + p] = float(int(p % 64) - 32) + 0.5f;
      r[2 * g + 7] = -127.0f;
    }
    if (k >= 4 * g) {  // group 3: an outlier (100) and values below dx / 2 (residuals = themselves, max 0.04 2^(i
      // % 4)); every 5th row integers to 127 (no residual, and the largest integer sums).
      float* grp = r + 3 * g;
      const float small = 0.04f * float(1 << (i % 4));
      for (std::size_t p = 0; p < g; ++p)
        grp[p] = i % 5 == 4 ? float(int((p * 37) % 255) - 127) : small * float(int(p % 17) - 8) / 8.0f;
      grp[0] = i % 5 == 4 ? 127.0f : 100.0f;
    }
  }
  return x;
}

std::size_t group_of(uint32_t type) { return detail::qmm_is_kquant(type) ? 256 : 32; }

// The activation scratch of m rows (their two parts: 2m layout rows), pre-filled with a pattern so that
// bytes no one writes compare equal.
std::vector<uint8_t> act_buffer(uint32_t type, std::size_t k, std::size_t m) {
  return std::vector<uint8_t>(2 * m * detail::qact_layout(type, k).row_bytes + 64, 0xA5);
}
uint8_t* aligned64(std::vector<uint8_t>& v) {
  auto p = reinterpret_cast<std::uintptr_t>(v.data());
  return v.data() + (64 - p % 64) % 64;
}

// A quantized activation row (layout L) back to natural order: q (L.k values) and the scales dx (L.k / L.dg).
// The layout: 32-value blocks b in runs of 16 at 128 (b / 4) + 16 (b % 4) and 64 bytes on; K-quant
// super-blocks of 256 bytes, Q4_K/Q5_K's 32-value sub-blocks s at physical position p with kPerm[p] = s.
void decode_act_row(const detail::QActLayout& L, const uint8_t* row, int8_t* q, float* dx) {
  static constexpr std::size_t kPerm[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  const auto* qs = reinterpret_cast<const int8_t*>(row);
  std::memcpy(dx, row + L.o_dx, L.k / L.dg * sizeof(float));
  if (!detail::qmm_is_kquant(L.type)) {
    for (std::size_t b = 0; b < L.k / 32; ++b)
      for (std::size_t j = 0; j < 32; ++j)
        q[32 * b + j] = qs[128 * (b / 4) + 16 * (b % 4) + (j < 16 ? j : 64 + j - 16)];
  } else if (L.type == ggml_type_id::Q6_K) {
    std::memcpy(q, qs, L.k);
  } else {
    for (std::size_t sb = 0; sb < L.k / 256; ++sb)
      for (std::size_t p = 0; p < 8; ++p) std::memcpy(q + 256 * sb + 32 * kPerm[p], qs + 256 * sb + 32 * p, 32);
  }
}

// The residual part as ref::qmm_split_residual_act, but with the residual x - dx * q rounded once (an FMA).
void fused_residual_act(const float* x, std::size_t k, std::size_t g, int8_t* q, float* dx) {
  std::vector<float> r(k);
  for (std::size_t b = 0; b < k; b += g) {
    float id = 0, d = 0;
    ref::qmm_group_scale(x + b, g, id, d);
    for (std::size_t j = b; j < b + g; ++j) r[j] = std::fma(-d, std::nearbyint(x[j] * id), x[j]);
  }
  ref::qmm_quantize_residual(x, r.data(), k, g, q, dx);
}

// Overwrites the last scale group (g values) of a row of x with values on which the residual's rounding tells
// one rounding (an FMA) from two: amax 0.7 at its first value, then 8 values, of random candidates, whose
// quantized residual differs between the two (~1 candidate in 300: the residual's step, dx / 256 in a group
// of such spread values, whose residuals reach ~dx / 2 (s = 8), is far coarser than the difference), the
// rest random.
void add_fma_witnesses(float* x, std::size_t k, std::size_t g, uint32_t seed) {
  float* grp = x + k - g;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.69f, 0.69f);
  const float amax = 0.7f, id = 127.0f / amax, dx = amax / 127.0f, idr = 127.0f / (amax * (1.0f / 256));
  auto residual_q = [&](float v, bool fused) {
    const float q = std::nearbyint(v * id);
    volatile float p = dx * q;  // volatile: a separate f32 product
    const float r = fused ? std::fma(-dx, q, v) : v - p;
    return std::nearbyint(std::clamp(r * idr, -127.0f, 127.0f));
  };
  grp[0] = amax;
  for (std::size_t i = 1; i < g; ++i) {
    float v = u(rng);
    if (i <= 8)
      while (residual_q(v, true) == residual_q(v, false)) v = u(rng);
    grp[i] = v;
  }
}

// The products of qmatmul_split_act unfused: both parts quantized (m rows each, not interleaved), the 2m
// rows through qmatmul_rows without kQmmPairs (GEMV or GEMM as qmatmul_split_act picks), y = (x part) +
// (residual part) in f32. What every target's pairs path computes, except AVX3_DL's GEMM, which adds the
// two parts' integer sums per group (2^s X + R) before converting: the same value up to f32 rounding.
void unfused_split_act(const float* x, std::size_t ldx, std::size_t m, std::size_t k, uint32_t type, const void* w,
                       std::size_t n, float* y, std::size_t ldy) {
  const std::size_t rb = detail::qact_layout(type, k).row_bytes;
  auto buf = act_buffer(type, k, m);
  uint8_t* act = aligned64(buf);
  dispatch::qmatmul_quantize_split(type, x, std::ptrdiff_t(ldx), m, k, act, act + m * rb, rb);
  std::vector<float> y2(2 * m * n);
  dispatch::qmatmul_rows(type, act, 2 * m, k, w, std::ptrdiff_t(ggml_row_bytes(type, k)), n, y2.data(),
                         std::ptrdiff_t(n), 2 * m > detail::kQmmGemvMaxRows ? detail::kQmmGemm : 0u);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) y[i * ldy + j] = y2[i * n + j] + y2[(m + i) * n + j];
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE(
    "qmatmul_quantize_split: the x part is qmatmul_quantize's bytes, the residual ref::qmm_split_residual_act's, on "
    "every target") {
  std::size_t fused_differs = 0, cases = 0;
  std::size_t clamped = 0, shifts[5] = {};
  for (uint32_t type : kTypes) {
    const std::size_t g = group_of(type);
    const std::vector<std::size_t> ks =
        g == 256 ? std::vector<std::size_t>{256, 768, 2304} : std::vector<std::size_t>{32, 96, 160, 544, 2304};
    for (std::size_t k : ks) {
      for (std::size_t m : {1, 2, 3, 7}) {
        CAPTURE(type_name(type));
        CAPTURE(k);
        CAPTURE(m);
        const auto L = detail::qact_layout(type, k);
        const std::size_t ldx = k + 3, rb = L.row_bytes;
        auto x = make_x(m, ldx, k, g, uint32_t(k * 7 + m));
        add_fma_witnesses(x.data() + (m - 1) * ldx, k, g, uint32_t(k + m));  // the last row
        // The residual's reference values, and whether a fused residual (one rounding) would differ.
        std::vector<int8_t> want_q(m * k), fused_q(m * k), got_q(k);
        std::vector<float> want_d(m * (k / g)), fused_d(m * (k / g)), got_d(k / g);
        for (std::size_t i = 0; i < m; ++i) {
          ref::qmm_split_residual_act(x.data() + i * ldx, k, g, want_q.data() + i * k, want_d.data() + i * (k / g));
          fused_residual_act(x.data() + i * ldx, k, g, fused_q.data() + i * k, fused_d.data() + i * (k / g));
        }
        ++cases;
        fused_differs += fused_q != want_q;
        std::vector<uint8_t> best;
        std::vector<float> r(k);
        for (std::size_t i = 0; i < m; ++i) {  // residuals the reference clamps (r * 256 / dx rounds to 128)
          ref::qmm_split_residual(x.data() + i * ldx, k, g, r.data());
          for (std::size_t b = 0; b < k / g; ++b) {  // which exponents s (dx_r = dx / 2^s) the data reaches
            float id = 0, dx = 0;
            ref::qmm_group_scale(x.data() + i * ldx + b * g, g, id, dx);
            const float dr = want_d[i * (k / g) + b];
            int s = 0;
            for (int e = 8; e <= 12; ++e)
              if (dx > 0 && dr == std::ldexp(dx, -e)) s = e;
            if (s == 0) continue;
            ++shifts[s - 8];
            // The finest step that holds the group's residuals: none clamped once s > 8, some would at s + 1.
            double rmax = 0;
            for (std::size_t t = b * g; t < (b + 1) * g; ++t) rmax = std::max(rmax, std::fabs(double(r[t])));
            if (s > 8) CHECK(rmax / dr <= 127 * (1 + 1e-5));
            if (s < 12) CHECK(2 * rmax / dr > 127 * (1 - 1e-5));
          }
          for (std::size_t t = 0; t < k; ++t) {
            const double dr = want_d[i * (k / g) + t / g];
            clamped += dr > 0 && std::fabs(double(r[t]) / dr) > 127.5;
          }
        }
        test::for_each_target([&](const std::string&) {
          auto want_buf = act_buffer(type, k, m), got_buf = act_buffer(type, k, m);
          uint8_t* want = aligned64(want_buf);
          uint8_t* got = aligned64(got_buf);
          dispatch::qmatmul_quantize(type, x.data(), std::ptrdiff_t(ldx), m, k, want);  // the x part
          dispatch::qmatmul_quantize_split(type, x.data(), std::ptrdiff_t(ldx), m, k, got, got + m * rb, rb);
          std::size_t first = 0;
          while (first < m * rb && got[first] == want[first]) ++first;
          INFO("first differing byte of the x part ", first, " of ", m * rb, " (layout row ", first / rb, ", offset ",
               first % rb, ")");
          CHECK(first == m * rb);
          for (std::size_t i = 0; i < m; ++i) {
            decode_act_row(L, got + (m + i) * rb, got_q.data(), got_d.data());
            CHECK(std::equal(got_q.begin(), got_q.end(), want_q.begin() + std::ptrdiff_t(i * k)));
            CHECK(std::memcmp(got_d.data(), want_d.data() + i * (k / g), got_d.size() * sizeof(float)) == 0);
          }
          // Interleaved (qmatmul_multi's layout: ld_act = 2 row_bytes): the same rows.
          auto pair_buf = act_buffer(type, k, m);
          uint8_t* pairs = aligned64(pair_buf);
          dispatch::qmatmul_quantize_split(type, x.data(), std::ptrdiff_t(ldx), m, k, pairs, pairs + rb, 2 * rb);
          for (std::size_t i = 0; i < m; ++i) {
            CHECK(std::memcmp(pairs + 2 * i * rb, got + i * rb, rb) == 0);
            CHECK(std::memcmp(pairs + (2 * i + 1) * rb, got + (m + i) * rb, rb) == 0);
          }
          // Every target writes the same bytes (the residual rows' sums and coefficients included).
          if (best.empty()) best.assign(got, got + 2 * m * rb);
          CHECK(std::memcmp(best.data(), got, 2 * m * rb) == 0);
        });
      }
    }
  }
  // The data tells the two-rounding residual from a fused one (x - dx * q rounded once): had a kernel
  // contracted it into an FMA, the residual comparison above would fail somewhere.
  INFO(fused_differs, " of ", cases, " cases distinguish a fused residual");
  CHECK(fused_differs * 10 >= cases * 9);
  CHECK(clamped > 0);              // the residual's clamp at 127 was exercised
  for (int e = 8; e <= 12; ++e) {  // and every residual scale dx / 2^s (an outlier block, integer rows)
    INFO("groups with dx_r = dx / 2^", e, ": ", shifts[e - 8]);
    CHECK(shifts[e - 8] > 0);
  }
}

TEST_CASE("qmatmul_multi groups exactly the weight types whose activation layouts are identical") {
  const std::size_t k = 512, m = 3;
  const auto x = make_x(m, k, k, 32, 11);
  for (uint32_t a : kTypes)
    for (uint32_t b : kTypes) {
      CAPTURE(type_name(a));
      CAPTURE(type_name(b));
      const auto la = detail::qact_layout(a, k), lb = detail::qact_layout(b, k);
      auto ba = act_buffer(a, k, m), bb = act_buffer(b, k, m);
      dispatch::qmatmul_quantize(a, x.data(), std::ptrdiff_t(k), m, k, aligned64(ba));
      dispatch::qmatmul_quantize(b, x.data(), std::ptrdiff_t(k), m, k, aligned64(bb));
      const bool same_bytes =
          la.row_bytes == lb.row_bytes && std::memcmp(aligned64(ba), aligned64(bb), m * la.row_bytes) == 0;
      CHECK(detail::qmm_same_layout(a, b) == same_bytes);
    }
}

TEST_CASE("qmatmul_split_act equals its unfused two-part product on every target and thread count") {
  struct Case {
    uint32_t type;
    std::size_t k, n;
  };
  const Case cases[] = {
      {ggml_type_id::Q4_1, 576, 200}, {ggml_type_id::Q6_K, 512, 40},
      {ggml_type_id::Q5_0, 640, 16},  {ggml_type_id::Q4_K, 256, 130},
      {ggml_type_id::Q8_0, 160, 33},  {ggml_type_id::Q4_0, 128, 600}};  // 600 rows: the split GEMM's 256-column chunks
  const std::vector<std::size_t> ms =
      kSmall ? std::vector<std::size_t>{1, 3, 33} : std::vector<std::size_t>{1, 2, 3, 33, 64, 130};
  uint32_t seed = 40;
  for (const Case& c : cases) {
    const auto w = test::random_weights(c.type, c.n, c.k, ++seed);
    for (std::size_t m : ms) {
      CAPTURE(type_name(c.type));
      CAPTURE(c.k);
      CAPTURE(c.n);
      CAPTURE(m);
      const std::size_t ldx = c.k + 5, ldy = c.n + 3;
      const auto x = make_x(m, ldx, c.k, group_of(c.type), ++seed);
      test::for_each_target([&](const std::string& target) {
        // The scalar targets only at the smaller sizes (their kernels are slow).
        if ((target == "EMU128" || target == "SCALAR" || target == "SSSE3") && m > 33) return;
        std::vector<float> want(m * ldy, -1.f);
        unfused_split_act(x.data(), ldx, m, c.k, c.type, w.data(), c.n, want.data(), ldy);
        // AVX3_DL's GEMM converts 2^s X + R once per group: within a few f32 roundings of the group terms,
        // bounded here by 2^-20 of sum |y halves| + |w| |x| (the unfused path's own terms).
        const bool combined = target == "AVX3_DL" && 2 * m > detail::kQmmGemvMaxRows;
        std::vector<float> got1;
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2()}) {
          INFO((pool ? "2 threads" : "1 thread"));
          std::vector<float> got(m * ldy, -1.f);
          kernels::qmatmul_split_act(make_strided<const float, 2>(x.data(), {m, c.k}, {std::ptrdiff_t(ldx), 1}), c.type,
                                     w.data(), c.n, 0,
                                     make_strided<float, 2>(got.data(), {m, c.n}, {std::ptrdiff_t(ldy), 1}), pool);
          if (!combined) {
            CHECK(same_floats(got, want));
          } else {
            std::vector<float> wf(c.k);
            double worst = 0;
            for (std::size_t j = 0; j < c.n; ++j) {
              dequantize_row(c.type, w.data() + j * ggml_row_bytes(c.type, c.k), wf.data(), c.k);
              for (std::size_t i = 0; i < m; ++i) {
                double wx = 0;
                for (std::size_t t = 0; t < c.k; ++t) wx += std::fabs(double(wf[t]) * double(x[i * ldx + t]));
                const double e = std::fabs(double(got[i * ldy + j]) - double(want[i * ldy + j]));
                worst = std::max(worst, e / (std::ldexp(wx, -20) + 1e-30));
              }
            }
            INFO("worst |combined - unfused| / (2^-20 sum |w x|): ", worst);
            CHECK(worst <= 1.0);
          }
          if (!pool) got1 = got;
          else CHECK(same_floats(got, got1));  // thread count changes nothing
        }
      });
    }
  }
}

namespace {

// Weights of one multi-output test: types and row counts (K shared).
struct MultiCase {
  const char* what;
  std::size_t k;
  std::vector<uint32_t> types;
  std::vector<std::size_t> rows;
};

std::vector<MultiCase> multi_cases() {
  using namespace ggml_type_id;
  return {
      // Gemma 3's Q4_K_M file: Q and K Q5_0, V Q8_0 (two layouts); row counts whose 16-row units put a
      // task boundary inside a weight on 2 threads.
      {"q5_0 q5_0 q8_0", 640, {Q5_0, Q5_0, Q8_0}, {56, 72, 104}},
      {"q4_K q6_K q4_K (Q4_K_M)", 512, {Q4_K, Q6_K, Q4_K}, {40, 24, 200}},
      {"q4_1 q5_1 (one layout)", 576, {Q4_1, Q5_1}, {150, 150}},
      {"q4_K q5_K (one layout)", 256, {Q4_K, Q5_K}, {33, 17}},
      {"q4_1 q8_0 f32 f16 (fallbacks)", 256, {Q4_1, Q8_0, F32, F16}, {40, 24, 16, 8}},
      {"q4_0 alone, 16 rows (M split)", 256, {Q4_0}, {16}},
      {"q8_0 with an empty weight", 96, {Q8_0, Q4_0, Q8_0}, {20, 0, 5}},
      {"q4_0 q8_0, wide (the split GEMM's column chunks)", 128, {Q4_0, Q8_0}, {300, 520}},
  };
}

}  // namespace

TEST_CASE("qmatmul_multi and linear_multi are bit-identical to one product per weight") {
  const std::vector<std::size_t> ms =
      kSmall ? std::vector<std::size_t>{1, 3, 64} : std::vector<std::size_t>{1, 2, 3, 64, 130};
  uint32_t seed = 70;
  for (const MultiCase& c : multi_cases()) {
    const std::size_t nw = c.types.size(), k = c.k;
    std::vector<std::vector<uint8_t>> w(nw);
    std::vector<WeightRef> refs(nw);
    std::vector<kernels::QmmWeight> qw(nw);
    for (std::size_t i = 0; i < nw; ++i) {
      w[i] = test::random_weights(c.types[i], c.rows[i], k, ++seed);
      qw[i] = kernels::QmmWeight{c.types[i], w[i].data(), c.rows[i], 0};
      refs[i] = WeightRef{reinterpret_cast<const std::byte*>(w[i].data()), io::GGMLType(c.types[i]),     c.rows[i], k,
                          c.rows[i] ? w[i].size() / c.rows[i] : 0,         std::string(1, char('a' + i))};
    }
    std::vector<const WeightRef*> wp(nw);
    for (std::size_t i = 0; i < nw; ++i) wp[i] = &refs[i];
    for (std::size_t m : ms) {
      CAPTURE(c.what);
      CAPTURE(m);
      const std::size_t ldx = k + 7;
      const auto x = make_x(m, ldx, k, 32, ++seed);
      const auto xt = make_strided<const float, 2>(x.data(), {m, k}, {std::ptrdiff_t(ldx), 1});
      // Separate outputs, rows padded (ldy = n + 2), filled with NaN.
      auto outputs = [&](std::vector<std::vector<float>>& buf) {
        buf.assign(nw, {});
        std::vector<StridedTensor<float, 2>> v;
        for (std::size_t i = 0; i < nw; ++i) {
          buf[i].assign(m * (c.rows[i] + 2), std::nanf(""));
          v.push_back(make_strided<float, 2>(buf[i].data(), {m, c.rows[i]}, {std::ptrdiff_t(c.rows[i] + 2), 1}));
        }
        return v;
      };
      auto same = [&](const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
        bool ok = true;
        for (std::size_t i = 0; i < nw; ++i)
          ok = ok && a[i].size() == b[i].size() &&
               std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) == 0;  // gaps: same NaN bits
        return ok;
      };
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2()}) {
        INFO((pool ? "2 threads" : "1 thread"));
        for (const kernels::ActParts parts : {kernels::ActParts::one, kernels::ActParts::two}) {
          INFO((parts == kernels::ActParts::two ? "two parts" : "one part"));
          std::vector<std::vector<float>> want, got;
          auto yw = outputs(want);
          for (std::size_t i = 0; i < nw; ++i) {
            if (parts == kernels::ActParts::two)
              kernels::qmatmul_split_act(xt, c.types[i], w[i].data(), c.rows[i], 0, yw[i], pool);
            else qmatmul(xt, c.types[i], w[i].data(), c.rows[i], 0, yw[i], pool);
          }
          auto yg = outputs(got);
          kernels::qmatmul_multi(xt, std::span<const kernels::QmmWeight>(qw),
                                 std::span<const StridedTensor<float, 2>>(yg), pool, parts);
          CHECK(same(got, want));
          // 1 thread and 2 give the same bits.
          if (pool) {
            std::vector<std::vector<float>> one;
            auto y1 = outputs(one);
            kernels::qmatmul_multi(xt, std::span<const kernels::QmmWeight>(qw),
                                   std::span<const StridedTensor<float, 2>>(y1), nullptr, parts);
            CHECK(same(one, got));
          }
        }
        for (const Precision p : {Precision::fast, Precision::fast8, Precision::exact}) {
          INFO("precision ", int(p));
          std::vector<std::vector<float>> want, got;
          auto yw = outputs(want);
          for (std::size_t i = 0; i < nw; ++i) linear(xt, refs[i], yw[i], pool, p);
          auto yg = outputs(got);
          linear_multi(xt, std::span<const WeightRef* const>(wp), std::span<const StridedTensor<float, 2>>(yg), pool,
                       p);
          CHECK(same(got, want));
        }
      }
    }
  }
}

TEST_CASE(
    "linear: Precision::fast multiplies by the int16 or f32 GEMM exactly where the target says (AVX2: its prompts)") {
  // On AVX2 (no int8 dot product) the two-part integer GEMM is the slowest product for prompts: from 32 rows
  // of x (Q8_0: from 1), fast takes qmatmul_i16 (dispatch::qmatmul_i16_min_rows: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K), else
  // the f32 GEMM over dequantized panels, exact's bits, where dispatch::qmatmul_split_f32_min_rows says
  // (Q6_K); below 32 rows, and on every other target, qmatmul_split_act's.
  const std::size_t n = 40;
  std::size_t f32_cases = 0, i16_cases = 0;
  for (const uint32_t type : kTypes) {
    for (const std::size_t k : {256u, 2048u}) {
      const auto w = test::random_weights(type, n, k, uint32_t(type * 31 + k));
      const WeightRef ref{reinterpret_cast<const std::byte*>(w.data()), io::GGMLType(type), n, k, w.size() / n, "w"};
      test::for_each_target([&](const std::string& target) {
        const std::size_t min_rows = dispatch::qmatmul_split_f32_min_rows(type, k);
        const std::size_t i16_rows = dispatch::qmatmul_i16_min_rows(type, k);
        const bool q8 = type == ggml_type_id::Q8_0 || type == ggml_type_id::Q6_K;
        const bool q4 = type == ggml_type_id::Q4_0 || type == ggml_type_id::Q4_1 || type == ggml_type_id::Q5_0 ||
                        type == ggml_type_id::Q5_1 || type == ggml_type_id::Q4_K;
        const bool i16 = detail::qmm_i16_supported(type);
        INFO(type_name(type), " k ", k);
        CHECK(min_rows == (target == "AVX2" && (q8 || (q4 && k < 2048)) ? 32 : SIZE_MAX));
        CHECK(i16_rows == (target == "AVX2" && i16 ? (type == ggml_type_id::Q8_0 ? 1 : 32) : SIZE_MAX));
        for (const std::size_t m : {4u, 31u, 32u, 33u}) {
          CAPTURE(m);
          const auto x = test::random_floats(m * k, uint32_t(m + k + type), -2.f, 2.f);
          const auto xt = make_tensor(x.data(), m, k);
          std::vector<float> fast(m * n), exact(m * n), split(m * n), x16(m * n);
          linear(xt, ref, make_tensor(fast.data(), m, n), &pool2(), Precision::fast);
          linear(xt, ref, make_tensor(exact.data(), m, n), &pool2(), Precision::exact);
          kernels::qmatmul_split_act(xt, type, w.data(), n, 0, make_tensor(split.data(), m, n), &pool2());
          if (i16) kernels::qmatmul_i16(xt, type, w.data(), n, 0, make_tensor(x16.data(), m, n), &pool2());
          const bool by_i16 = m >= i16_rows, by_f32 = !by_i16 && m >= min_rows;
          f32_cases += by_f32;
          i16_cases += by_i16;
          const auto& want = by_i16 ? x16 : by_f32 ? exact : split;
          CHECK(std::memcmp(fast.data(), want.data(), fast.size() * sizeof(float)) == 0);
          // The three differ (else this test could not tell them apart).
          CHECK(std::memcmp(exact.data(), split.data(), exact.size() * sizeof(float)) != 0);
          if (i16) CHECK(std::memcmp(x16.data(), split.data(), x16.size() * sizeof(float)) != 0);
          if (i16) CHECK(std::memcmp(x16.data(), exact.data(), x16.size() * sizeof(float)) != 0);
        }
      });
    }
  }
  const auto t = test::targets();
  // f32: Q6_K at both k x (m 32, 33); int16: its six types at both k x (m 32, 33), and Q8_0's m 4, 31.
  if (std::find(t.begin(), t.end(), "AVX2") != t.end()) {
    CHECK(f32_cases == 2 * 2);
    CHECK(i16_cases == 6 * 2 * 2 + 2 * 2);
  }
}

TEST_CASE("linear, linear_multi: decode steps over Q8_0 take the int16 GEMV where the target says") {
  // AVX2: Q8_0 takes qmatmul_i16 from one row of x (its GEMV for one row, dispatch::qmatmul_i16_gemv_rows;
  // the GEMM for 2), packed (16-row interleaved) or row-major; Q4_0 and other targets qmatmul_split_act's.
  // linear_multi gives each output linear()'s bits, its int16 GEMVs in one parallel_for beside the others.
  const std::size_t k = 512;
  const std::size_t rows[] = {40, 16, 100, 24};
  const uint32_t types[] = {ggml_type_id::Q8_0, ggml_type_id::Q8_0, ggml_type_id::Q8_0, ggml_type_id::Q4_0};
  std::vector<std::vector<uint8_t>> wc(4), wi(4);
  std::vector<WeightRef> plain(4), packed(4);
  for (std::size_t i = 0; i < 4; ++i) {
    wc[i] = test::random_weights(types[i], rows[i], k, uint32_t(41 + i));
    wi[i].resize(wc[i].size());
    visit_ggml_type(types[i], [&]<class B>(B*) {
      if constexpr (kernels::qmm_interleavable_v<B>)
        kernels::qmm_interleave_rows(reinterpret_cast<const B*>(wc[i].data()), rows[i], k / block_size_v<B>,
                                     reinterpret_cast<B*>(wi[i].data()));
    });
    plain[i] = WeightRef{reinterpret_cast<const std::byte*>(wc[i].data()),
                         io::GGMLType(types[i]),
                         rows[i],
                         k,
                         wc[i].size() / rows[i],
                         std::string(1, char('a' + i))};
    packed[i] = plain[i];
    packed[i].data = reinterpret_cast<const std::byte*>(wi[i].data());
    packed[i].packed = true;
  }
  std::size_t i16_cases = 0;
  test::for_each_target([&](const std::string& target) {
    const bool avx2 = target == "AVX2";
    for (const std::size_t m : {1u, 2u}) {
      const auto x = make_x(m, k, k, 32, uint32_t(7 + m));
      const auto xt = make_tensor(x.data(), m, k);
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2()}) {
        std::vector<std::vector<float>> single(4);
        for (std::size_t i = 0; i < 4; ++i) {
          for (const bool is_packed : {false, true}) {
            CAPTURE(target);
            CAPTURE(m);
            CAPTURE(i);
            CAPTURE(is_packed);
            const WeightRef& ref = is_packed ? packed[i] : plain[i];
            const auto* w = is_packed ? wi[i].data() : wc[i].data();
            const std::size_t n = rows[i];
            std::vector<float> fast(m * n), split(m * n), x16(m * n);
            linear(xt, ref, make_tensor(fast.data(), m, n), pool, Precision::fast);
            kernels::qmatmul_multi(xt, {kernels::QmmWeight{types[i], w, n, 0, is_packed}},
                                   {make_tensor(split.data(), m, n)}, pool,
                                   kernels::ActParts::two);  // qmatmul_split_act's product, W interleaved or not
            kernels::qmatmul_i16(xt, types[i], w, n, 0, make_tensor(x16.data(), m, n), pool,
                                 {.interleaved = is_packed});
            const bool by_i16 = avx2 && types[i] == ggml_type_id::Q8_0;
            i16_cases += by_i16;
            CHECK(std::memcmp(fast.data(), (by_i16 ? x16 : split).data(), fast.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(x16.data(), split.data(), x16.size() * sizeof(float)) != 0);  // they differ
            if (is_packed) single[i] = fast;
          }
        }
        // linear_multi over the packed weights: each output linear()'s bits.
        std::vector<std::vector<float>> multi(4);
        std::vector<StridedTensor<float, 2>> ys;
        std::vector<const WeightRef*> wp;
        for (std::size_t i = 0; i < 4; ++i) {
          multi[i].assign(m * rows[i], std::nanf(""));
          ys.push_back(make_strided<float, 2>(multi[i].data(), {m, rows[i]}, {std::ptrdiff_t(rows[i]), 1}));
          wp.push_back(&packed[i]);
        }
        linear_multi(xt, std::span<const WeightRef* const>(wp), std::span<const StridedTensor<float, 2>>(ys), pool,
                     Precision::fast);
        for (std::size_t i = 0; i < 4; ++i) {
          CAPTURE(i);
          CHECK(std::memcmp(multi[i].data(), single[i].data(), multi[i].size() * sizeof(float)) == 0);
        }
      }
    }
  });
  const auto t = test::targets();
  // 3 Q8_0 weights x (row-major, packed) x (1, 2 rows of x) x (1, 2 threads).
  if (std::find(t.begin(), t.end(), "AVX2") != t.end()) CHECK(i16_cases == 3 * 2 * 2 * 2);
}

TEST_CASE("qmatmul_multi and linear_multi take initializer lists and column slices of one output") {
  const std::size_t k = 256, m = 3;
  const auto wa = test::random_weights(ggml_type_id::Q4_1, 24, k, 1),
             wb = test::random_weights(ggml_type_id::Q8_0, 40, k, 2);
  const auto x = make_x(m, k, k, 32, 3);
  const auto xt = make_tensor(x.data(), m, k);
  std::vector<float> ya(m * 24), yb(m * 40), fused(m * 64);
  kernels::qmatmul_split_act(xt, ggml_type_id::Q4_1, wa.data(), 24, 0, make_tensor(ya.data(), m, 24));
  kernels::qmatmul_split_act(xt, ggml_type_id::Q8_0, wb.data(), 40, 0, make_tensor(yb.data(), m, 40));
  // Q and K written into column ranges of one (m, 64) buffer (as a fused QKV output would be).
  const auto ca = make_strided<float, 2>(fused.data(), {m, 24}, {64, 1});
  const auto cb = make_strided<float, 2>(fused.data() + 24, {m, 40}, {64, 1});
  kernels::qmatmul_multi(xt,
                         {kernels::QmmWeight{ggml_type_id::Q4_1, wa.data(), 24, 0},
                          kernels::QmmWeight{ggml_type_id::Q8_0, wb.data(), 40, 0}},
                         {ca, cb}, &pool2(), kernels::ActParts::two);
  bool ok = true;
  for (std::size_t i = 0; i < m; ++i)
    ok = ok && std::memcmp(&fused[i * 64], &ya[i * 24], 24 * sizeof(float)) == 0 &&
         std::memcmp(&fused[i * 64 + 24], &yb[i * 40], 40 * sizeof(float)) == 0;
  CHECK(ok);
  const WeightRef ra{reinterpret_cast<const std::byte*>(wa.data()), io::GGMLType::Q4_1, 24, k, wa.size() / 24, "a"};
  const WeightRef rb{reinterpret_cast<const std::byte*>(wb.data()), io::GGMLType::Q8_0, 40, k, wb.size() / 40, "b"};
  std::vector<float> la(m * 24), lb(m * 40);
  linear_multi(xt, {&ra, &rb}, {make_tensor(la.data(), m, 24), make_tensor(lb.data(), m, 40)}, &pool2());
  CHECK(la == ya);
  std::vector<float> lb1(m * 40);  // linear's Q8_0 product (qmatmul_i16 on AVX2, else qmatmul_split_act's)
  linear(xt, rb, make_tensor(lb1.data(), m, 40), &pool2());
  CHECK(lb == lb1);
}

TEST_CASE("qmatmul_multi and linear_multi shape errors name the op and what is wrong") {
  const std::size_t k = 96, m = 2;
  const auto w = test::random_weights(ggml_type_id::Q4_0, 4, k, 5);
  std::vector<float> x(m * 100), y(m * 8);
  const kernels::QmmWeight q{ggml_type_id::Q4_0, w.data(), 4, 0};
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const ShapeError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto xt = make_tensor(x.data(), m, k);
  const auto yt = make_tensor(y.data(), m, 4);
  using Y = DenseTensor<float, 2>;
  auto has = [](const std::string& s, const char* what) {
    INFO(s);
    CHECK(s.find(what) != std::string::npos);
  };
  const std::string count =
      msg([&] { kernels::qmatmul_multi(xt, std::span<const kernels::QmmWeight>(&q, 1), std::span<const Y>()); });
  has(count, "kiln::qmatmul_multi");
  has(count, "1 weights and 0 outputs");
  const std::string n_bad = msg([&] { kernels::qmatmul_multi(xt, {q}, {make_tensor(y.data(), m, 5)}); });
  has(n_bad, "do not fit a weight of 4 rows");
  const std::string rows_bad = msg([&] { kernels::qmatmul_multi(xt, {q}, {make_tensor(y.data(), m + 1, 4)}); });
  has(rows_bad, "do not fit");
  const std::string k_bad = msg([&] { kernels::qmatmul_multi(make_tensor(x.data(), m, std::size_t(100)), {q}, {yt}); });
  has(k_bad, "K = 100");
  has(k_bad, "block size 32");
  const std::string overlap = msg([&] { kernels::qmatmul_multi(xt, {q, q}, {yt, make_tensor(y.data() + 2, m, 4)}); });
  has(overlap, "outputs 0 and 1 overlap");
  const std::string over_x = msg([&] { kernels::qmatmul_multi(xt, {q}, {make_tensor(x.data() + 8, m, 4)}); });
  has(over_x, "overlaps x");
  const std::vector<kernels::QmmWeight> nine(9, q);
  const std::vector<Y> nine_y(9, yt);
  const std::string too_many =
      msg([&] { kernels::qmatmul_multi(xt, std::span<const kernels::QmmWeight>(nine), std::span<const Y>(nine_y)); });
  has(too_many, "at most 8");
  const kernels::QmmWeight q2k{ggml_type_id::Q2_K, w.data(), 1, 0};
  const std::string unsupported = msg([&] {
    kernels::qmatmul_multi(make_tensor(x.data(), std::size_t(1), std::size_t(256)), {q2k},
                           {make_tensor(y.data(), 1, 1)});
  });
  has(unsupported, "not supported");
  const std::string split = msg([&] {
    kernels::qmatmul_split_act(make_tensor(x.data(), m, std::size_t(100)), ggml_type_id::Q4_0, w.data(), 4, 0, yt);
  });
  has(split, "kiln::qmatmul_split_act");
  has(split, "K = 100");
  const WeightRef r{
      reinterpret_cast<const std::byte*>(w.data()), io::GGMLType::Q4_0, 4, 64, w.size() / 4, "blk.0.attn_q"};
  const std::string lin = msg([&] { linear_multi(xt, {&r}, {yt}, nullptr); });
  has(lin, "does not fit weight 'blk.0.attn_q'");
  const std::string lin_count =
      msg([&] { linear_multi(xt, std::span<const WeightRef* const>(), std::span<const Y>(&yt, 1), nullptr); });
  has(lin_count, "kiln::linear_multi");
}
