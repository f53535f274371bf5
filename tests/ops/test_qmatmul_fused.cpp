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

#include "kiln/model/weights.hpp"
#include "kiln/ops/qmatmul.hpp"
#include "test_util.hpp"

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
  }
  return x;
}

// Random weights of a runtime type: random bytes with finite random f16 scales (every bit pattern of the
// quants and packed sub-block scales is valid).
std::vector<uint8_t> make_weights(uint32_t type, std::size_t rows, std::size_t k, uint32_t seed) {
  std::vector<uint8_t> w;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> sc(-0.05f, 0.05f);
  visit_ggml_type(type, [&]<class T>(T*) {
    const std::size_t nb = rows * (k / dtype_traits<T>::block_size);
    w.resize(nb * sizeof(T));
    if constexpr (std::is_same_v<T, float>) {
      for (std::size_t i = 0; i < nb; ++i) reinterpret_cast<float*>(w.data())[i] = sc(rng) * 20;
    } else if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>) {
      for (std::size_t i = 0; i < nb; ++i) reinterpret_cast<T*>(w.data())[i] = T(sc(rng) * 20);
    } else if constexpr (qmatmul_supported_v<T>) {
      for (auto& b : w) b = uint8_t(rng());
      auto* blocks = reinterpret_cast<T*>(w.data());
      for (std::size_t i = 0; i < nb; ++i) {
        auto& b = blocks[i];
        b.d = f16(sc(rng));
        if constexpr (requires { b.m; }) b.m = f16(sc(rng));
        if constexpr (requires { b.dmin; }) b.dmin = f16(sc(rng) * 0.2f);
      }
    }
  });
  return w;
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

// The split quantization as qmatmul_split_act did it before it was fused: residuals computed by `residual`
// into an f32 (2M, K) copy (rows of x, then theirs), then qmatmul_quantize of all 2M rows.
template <class Residual>
void old_split_quantize(uint32_t type, const float* x, std::size_t ldx, std::size_t m, std::size_t k, void* act,
                        Residual&& residual) {
  std::vector<float> x2(2 * m * k);
  for (std::size_t i = 0; i < m; ++i) {
    std::copy(x + i * ldx, x + i * ldx + k, x2.begin() + std::ptrdiff_t(i * k));
    residual(x + i * ldx, x2.data() + (m + i) * k);
  }
  dispatch::qmatmul_quantize(type, x2.data(), std::ptrdiff_t(k), 2 * m, k, act);
}

// The previous qmatmul_split_act, verbatim in substance: f32 (2M, K) copy with the residuals, qmatmul of
// the 2M rows, y = (x part) + (residual part).
void old_split_act(const float* x, std::size_t ldx, std::size_t m, std::size_t k, uint32_t type, const void* w,
                   std::size_t n, float* y, std::size_t ldy, ThreadPool* pool) {
  const std::size_t g = group_of(type);
  std::vector<float> x2(2 * m * k), y2(2 * m * n);
  for (std::size_t i = 0; i < m; ++i) {
    std::copy(x + i * ldx, x + i * ldx + k, x2.begin() + std::ptrdiff_t(i * k));
    ref::qmm_split_residual(x + i * ldx, k, g, x2.data() + (m + i) * k);
  }
  qmatmul(make_tensor(static_cast<const float*>(x2.data()), 2 * m, k), type, w, n, 0, make_tensor(y2.data(), 2 * m, n),
          pool);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) y[i * ldy + j] = y2[i * n + j] + y2[(m + i) * n + j];
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("qmatmul_quantize_split writes the bytes of the old residual copy + qmatmul_quantize on every target") {
  std::size_t fused_differs = 0, cases = 0;
  for (uint32_t type : kTypes) {
    const std::size_t g = group_of(type);
    const std::vector<std::size_t> ks = g == 256 ? std::vector<std::size_t>{256, 768, 2304}
                                                 : std::vector<std::size_t>{32, 96, 160, 544, 2304};
    for (std::size_t k : ks) {
      for (std::size_t m : {1, 2, 3, 7}) {
        CAPTURE(type_name(type));
        CAPTURE(k);
        CAPTURE(m);
        const std::size_t ldx = k + 3, rb = detail::qact_layout(type, k).row_bytes;
        const auto x = make_x(m, ldx, k, g, uint32_t(k * 7 + m));
        std::vector<uint8_t> best;
        test::for_each_target([&](const std::string&) {
          auto want_buf = act_buffer(type, k, m), got_buf = act_buffer(type, k, m);
          uint8_t* want = aligned64(want_buf);
          uint8_t* got = aligned64(got_buf);
          old_split_quantize(type, x.data(), ldx, m, k, want,
                             [&](const float* xi, float* r) { ref::qmm_split_residual(xi, k, g, r); });
          dispatch::qmatmul_quantize_split(type, x.data(), std::ptrdiff_t(ldx), m, k, got, got + m * rb, rb);
          std::size_t first = 0;
          while (first < 2 * m * rb && got[first] == want[first]) ++first;
          INFO("first differing byte ", first, " of ", 2 * m * rb, " (layout row ", first / rb, ", offset ",
               first % rb, ")");
          CHECK(first == 2 * m * rb);
          // Interleaved (qmatmul_multi's layout: ld_act = 2 row_bytes): the same rows.
          auto pair_buf = act_buffer(type, k, m);
          uint8_t* pairs = aligned64(pair_buf);
          dispatch::qmatmul_quantize_split(type, x.data(), std::ptrdiff_t(ldx), m, k, pairs, pairs + rb, 2 * rb);
          for (std::size_t i = 0; i < m; ++i) {
            CHECK(std::memcmp(pairs + 2 * i * rb, got + i * rb, rb) == 0);
            CHECK(std::memcmp(pairs + (2 * i + 1) * rb, got + (m + i) * rb, rb) == 0);
          }
          // Every target writes the same bytes.
          if (best.empty()) best.assign(got, got + 2 * m * rb);
          CHECK(std::memcmp(best.data(), got, 2 * m * rb) == 0);
          // The data tells the two-rounding residual from a fused one (x - dx * q rounded once): had the
          // kernel contracted it into an FMA, the comparison above would fail somewhere.
          auto fma_buf = act_buffer(type, k, m);
          uint8_t* fused = aligned64(fma_buf);
          old_split_quantize(type, x.data(), ldx, m, k, fused, [&](const float* xi, float* r) {
            for (std::size_t b = 0; b < k; b += g) {
              float id = 0, dx = 0;
              ref::qmm_group_scale(xi + b, g, id, dx);
              for (std::size_t j = b; j < b + g; ++j) r[j] = std::fma(-dx, std::nearbyint(xi[j] * id), xi[j]);
            }
          });
          ++cases;
          fused_differs += std::memcmp(fused, want, 2 * m * rb) != 0;
        });
      }
    }
  }
  INFO(fused_differs, " of ", cases, " cases distinguish a fused residual");
  CHECK(fused_differs * 10 >= cases * 9);
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
      const bool same_bytes = la.row_bytes == lb.row_bytes && std::memcmp(aligned64(ba), aligned64(bb), m * la.row_bytes) == 0;
      CHECK(detail::qmm_same_layout(a, b) == same_bytes);
    }
}

TEST_CASE("qmatmul_split_act is bit-identical to its unfused predecessor on every target and thread count") {
  struct Case {
    uint32_t type;
    std::size_t k, n;
  };
  const Case cases[] = {{ggml_type_id::Q4_1, 576, 200}, {ggml_type_id::Q6_K, 512, 40}, {ggml_type_id::Q5_0, 640, 16},
                        {ggml_type_id::Q4_K, 256, 130}, {ggml_type_id::Q8_0, 96, 33},
                        {ggml_type_id::Q4_0, 128, 600}};  // 600 rows: the split GEMM's 256-column chunks
  const std::vector<std::size_t> ms = kSmall ? std::vector<std::size_t>{1, 3, 33} : std::vector<std::size_t>{1, 2, 3, 33, 64, 130};
  uint32_t seed = 40;
  for (const Case& c : cases) {
    const auto w = make_weights(c.type, c.n, c.k, ++seed);
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
        old_split_act(x.data(), ldx, m, c.k, c.type, w.data(), c.n, want.data(), ldy, nullptr);
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2()}) {
          INFO((pool ? "2 threads" : "1 thread"));
          std::vector<float> got(m * ldy, -1.f);
          qmatmul_split_act(make_strided<const float, 2>(x.data(), {m, c.k}, {std::ptrdiff_t(ldx), 1}), c.type,
                            w.data(), c.n, 0, make_strided<float, 2>(got.data(), {m, c.n}, {std::ptrdiff_t(ldy), 1}),
                            pool);
          CHECK(same_floats(got, want));
          if (pool) {  // the old code on 2 threads too
            std::vector<float> want2(m * ldy, -1.f);
            old_split_act(x.data(), ldx, m, c.k, c.type, w.data(), c.n, want2.data(), ldy, pool);
            CHECK(same_floats(want2, want));
          }
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
  const std::vector<std::size_t> ms = kSmall ? std::vector<std::size_t>{1, 3, 64} : std::vector<std::size_t>{1, 2, 3, 64, 130};
  uint32_t seed = 70;
  for (const MultiCase& c : multi_cases()) {
    const std::size_t nw = c.types.size(), k = c.k;
    std::vector<std::vector<uint8_t>> w(nw);
    std::vector<WeightRef> refs(nw);
    std::vector<QmmWeight> qw(nw);
    for (std::size_t i = 0; i < nw; ++i) {
      w[i] = make_weights(c.types[i], c.rows[i], k, ++seed);
      qw[i] = QmmWeight{c.types[i], w[i].data(), c.rows[i], 0};
      refs[i] = WeightRef{reinterpret_cast<const std::byte*>(w[i].data()), io::GGMLType(c.types[i]), c.rows[i], k,
                          c.rows[i] ? w[i].size() / c.rows[i] : 0, std::string(1, char('a' + i))};
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
        for (const ActParts parts : {ActParts::one, ActParts::two}) {
          INFO((parts == ActParts::two ? "two parts" : "one part"));
          std::vector<std::vector<float>> want, got;
          auto yw = outputs(want);
          for (std::size_t i = 0; i < nw; ++i) {
            if (parts == ActParts::two) qmatmul_split_act(xt, c.types[i], w[i].data(), c.rows[i], 0, yw[i], pool);
            else qmatmul(xt, c.types[i], w[i].data(), c.rows[i], 0, yw[i], pool);
          }
          auto yg = outputs(got);
          qmatmul_multi(xt, std::span<const QmmWeight>(qw), std::span<const StridedTensor<float, 2>>(yg), pool, parts);
          CHECK(same(got, want));
          // 1 thread and 2 give the same bits.
          if (pool) {
            std::vector<std::vector<float>> one;
            auto y1 = outputs(one);
            qmatmul_multi(xt, std::span<const QmmWeight>(qw), std::span<const StridedTensor<float, 2>>(y1), nullptr, parts);
            CHECK(same(one, got));
          }
        }
        for (const Precision p : {Precision::fast, Precision::fast8, Precision::exact}) {
          INFO("precision ", int(p));
          std::vector<std::vector<float>> want, got;
          auto yw = outputs(want);
          for (std::size_t i = 0; i < nw; ++i) linear(xt, refs[i], yw[i], pool, p);
          auto yg = outputs(got);
          linear_multi(xt, std::span<const WeightRef* const>(wp), std::span<const StridedTensor<float, 2>>(yg), pool, p);
          CHECK(same(got, want));
        }
      }
    }
  }
}

TEST_CASE("qmatmul_multi and linear_multi take initializer lists and column slices of one output") {
  const std::size_t k = 256, m = 3;
  const auto wa = make_weights(ggml_type_id::Q4_1, 24, k, 1), wb = make_weights(ggml_type_id::Q8_0, 40, k, 2);
  const auto x = make_x(m, k, k, 32, 3);
  const auto xt = make_tensor(x.data(), m, k);
  std::vector<float> ya(m * 24), yb(m * 40), fused(m * 64);
  qmatmul_split_act(xt, ggml_type_id::Q4_1, wa.data(), 24, 0, make_tensor(ya.data(), m, 24));
  qmatmul_split_act(xt, ggml_type_id::Q8_0, wb.data(), 40, 0, make_tensor(yb.data(), m, 40));
  // Q and K written into column ranges of one (m, 64) buffer (as a fused QKV output would be).
  const auto ca = make_strided<float, 2>(fused.data(), {m, 24}, {64, 1});
  const auto cb = make_strided<float, 2>(fused.data() + 24, {m, 40}, {64, 1});
  qmatmul_multi(xt, {QmmWeight{ggml_type_id::Q4_1, wa.data(), 24, 0}, QmmWeight{ggml_type_id::Q8_0, wb.data(), 40, 0}},
                {ca, cb}, &pool2(), ActParts::two);
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
  CHECK(lb == yb);
}

TEST_CASE("qmatmul_multi and linear_multi shape errors name the op and what is wrong") {
  const std::size_t k = 96, m = 2;
  const auto w = make_weights(ggml_type_id::Q4_0, 4, k, 5);
  std::vector<float> x(m * 100), y(m * 8);
  const QmmWeight q{ggml_type_id::Q4_0, w.data(), 4, 0};
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
  const std::string count = msg([&] { qmatmul_multi(xt, std::span<const QmmWeight>(&q, 1), std::span<const Y>()); });
  has(count, "kiln::qmatmul_multi");
  has(count, "1 weights and 0 outputs");
  const std::string n_bad = msg([&] { qmatmul_multi(xt, {q}, {make_tensor(y.data(), m, 5)}); });
  has(n_bad, "do not fit a weight of 4 rows");
  const std::string rows_bad = msg([&] { qmatmul_multi(xt, {q}, {make_tensor(y.data(), m + 1, 4)}); });
  has(rows_bad, "do not fit");
  const std::string k_bad = msg([&] { qmatmul_multi(make_tensor(x.data(), m, std::size_t(100)), {q}, {yt}); });
  has(k_bad, "K = 100");
  has(k_bad, "block size 32");
  const std::string overlap = msg([&] {
    qmatmul_multi(xt, {q, q}, {yt, make_tensor(y.data() + 2, m, 4)});
  });
  has(overlap, "outputs 0 and 1 overlap");
  const std::string over_x = msg([&] { qmatmul_multi(xt, {q}, {make_tensor(x.data() + 8, m, 4)}); });
  has(over_x, "overlaps x");
  const std::vector<QmmWeight> nine(9, q);
  const std::vector<Y> nine_y(9, yt);
  const std::string too_many = msg([&] { qmatmul_multi(xt, std::span<const QmmWeight>(nine), std::span<const Y>(nine_y)); });
  has(too_many, "at most 8");
  const QmmWeight q2k{ggml_type_id::Q2_K, w.data(), 1, 0};
  const std::string unsupported = msg([&] {
    qmatmul_multi(make_tensor(x.data(), std::size_t(1), std::size_t(256)), {q2k}, {make_tensor(y.data(), 1, 1)});
  });
  has(unsupported, "not supported");
  const std::string split = msg([&] {
    qmatmul_split_act(make_tensor(x.data(), m, std::size_t(100)), ggml_type_id::Q4_0, w.data(), 4, 0, yt);
  });
  has(split, "kiln::qmatmul_split_act");
  has(split, "K = 100");
  const WeightRef r{reinterpret_cast<const std::byte*>(w.data()), io::GGMLType::Q4_0, 4, 64, w.size() / 4, "blk.0.attn_q"};
  const std::string lin = msg([&] { linear_multi(xt, {&r}, {yt}, nullptr); });
  has(lin, "does not fit weight 'blk.0.attn_q'");
  const std::string lin_count =
      msg([&] { linear_multi(xt, std::span<const WeightRef* const>(), std::span<const Y>(&yt, 1), nullptr); });
  has(lin_count, "kiln::linear_multi");
}
