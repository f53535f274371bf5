// The prompt attention on AMX bf16 tiles (AttentionOptions::amx_bf16, kernels/dense/attention_amx-inl.h) against
// the double-precision reference kiln::ref::attention, within the bound docs/kernels.md derives from the
// arithmetic (q, K, the weights p and V split into two bf16 parts, bf16 products exact in f32, main and
// correction sums in f32 tiles of their own): causal and decode rows, sliding windows, soft-cap, sinks, head
// sizes 32 to 256, row counts and lengths off the 16 / 32 / 64 tile sizes, values over a wide dynamic range.
// A row's bits do not depend on the rows beside it, the call it is in, the query heads that share its pass or the
// thread that runs it. With AMX
// switched off (or absent) the option changes nothing: the f32 kernel's bits. On a CPU without usable
// AMX-BF16 the tile cases say "skipped: no AMX" and the fallback is checked.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/amx.hpp"
#include "kiln/ops/attention.hpp"
#include "amx_test_util.hpp"
#include "test_util.hpp"

using namespace kiln;

namespace attn_amx_test {

constexpr double kU = 0x1p-24;  // f32 unit roundoff

// The shared guard, with AMX switched on for the case.
struct SwitchGuard : amx_test::SwitchGuard {
  SwitchGuard() { set_amx_enabled({.enabled = true}); }
};

bool usable_or_skip() { return amx_test::bf16_usable_or_skip("the f32 kernel"); }
using amx_test::wide;
std::vector<f16> as_f16(const std::vector<float>& x) {
  std::vector<f16> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = f16::from_bits(f32_to_f16_bits(x[i]));
  return out;
}
double val(f16 x) { return double(f16_bits_to_f32(x.bits)); }

// gamma_n = n u / (1 - n u): the bound on n f32 additions in a row.
double gamma(double n) { return n * kU / (1 - n * kU); }

// A product of two-part operands relative to the sum of its terms' magnitudes (docs/kernels.md): the parts'
// representation (3 * 2^-16: the f32 operand's lo part 2^-16, the dropped lo * lo 2^-8 2^-7), the main sum
// (n terms <= (1 + 2^-8) |a b|), the corrections' sum (2n terms <= 0.012 |a b|) and main + corr (u).
double split_product(double n) {
  return 3 * 0x1p-16 + gamma(n) * (1 + 0x1p-8) + gamma(2 * n) * (0x1p-7 * (1 + 0x1p-8) + 0x1p-8) + kU;
}

// The bound for row r (tests/ops/test_attention.cpp's row_bound, with the tiles' products): v* = max |v| over
// the row's positions, n its positions, R its score range, t its tiles of kAttnAmxTile positions,
//   |out - ref| <= v* (2 dy + (R + 2 t + 8) u + 6 u + (n + 2) u + split_product(n) + sink) + 4 n 2^-126
//   dy = scale (split_product(hd) + u) max_c sum_d |q_d k_cd| + u max |y| (+ 8 u cap with a soft-cap)
//        + scale hd 2^-126 (3 + max |k|): a score's error (products and parts below 2^-126 are flushed);
//   6 u: the weights' exponential (attn_amx::ExpWeight) is within 4 u, 3 u more than the f32 kernel's 1 u, and
//        a weight's relative error moves the row's weighted mean by up to twice as much;
//   the weights' tiles: p's parts (p >= 2^-126 or 0) times V's, split_product(n) of sum p |v| <= l v*;
//   flushed products of the values, at most 2^-126 each over l >= 1.
double row_bound(const float* q, const f16* k, const f16* v, std::size_t hd, std::size_t kv_len, std::size_t r,
                 const AttentionOptions& opt) {
  const std::size_t p = opt.causal ? opt.pos0 + r : kv_len - 1;
  const std::size_t hi = std::min(kv_len, p + 1), lo = opt.window > 0 && p + 1 > opt.window ? p + 1 - opt.window : 0;
  double qk = 0, ymax = -1e300, ymin = 1e300, vmax = 0, kmax = 0;
  for (std::size_t j = lo; j < hi; ++j) {
    double a = 0, s = 0;
    for (std::size_t d = 0; d < hd; ++d) {
      a += std::fabs(double(q[r * hd + d]) * val(k[j * hd + d]));
      s += double(q[r * hd + d]) * val(k[j * hd + d]);
      vmax = std::max(vmax, std::fabs(val(v[j * hd + d])));
      kmax = std::max(kmax, std::fabs(val(k[j * hd + d])));
    }
    s *= opt.scale;
    if (opt.softcap > 0) s = opt.softcap * std::tanh(s / opt.softcap);
    qk = std::max(qk, a);
    ymax = std::max(ymax, s);
    ymin = std::min(ymin, s);
  }
  constexpr std::size_t T = detail::kAttnAmxTile;
  const double n = double(hi - lo), tiles = double((hi + T - 1) / T - lo / T);
  const double dy = double(opt.scale) * (split_product(double(hd)) + kU) * qk +
                    kU * std::max(std::fabs(ymax), std::fabs(ymin)) + (opt.softcap > 0 ? 8 * kU * opt.softcap : 0.0) +
                    double(opt.scale) * double(hd) * 0x1p-126 * (3 + kmax);
  const double sink = opt.sink > -std::numeric_limits<float>::infinity() ? (std::fabs(opt.sink - ymax) + 3) * kU : 0.0;
  return vmax * (2 * dy + (ymax - ymin + 2 * tiles + 8) * kU + 6 * kU + (n + 2) * kU + split_product(n) + sink) +
         4 * n * 0x1p-126;
}

struct Case {
  const char* name;
  std::size_t rows, kv_len, hd;
  AttentionOptions opt;
  int qlo, qhi;  // q elements m 2^e, e in [qlo, qhi]
  int klo, khi;  // K's
  int vlo, vhi;  // V's (f16: >= -24, its subnormals)
};

std::vector<Case> cases() {
  return {
      {"prompt", 37, 37, 64, {.scale = 0.125f, .causal = true}, -3, 1, -3, 1, -24, 4},
      {"prompt after a cache", 33, 183, 64, {.scale = 0.125f, .causal = true, .pos0 = 150}, -6, 2, -8, 1, -20, 8},
      {"wide scores", 70, 300, 64, {.scale = 0.125f, .causal = true, .pos0 = 230}, -2, 3, -2, 2, -10, 10},
      {"one tile row, ragged", 9, 41, 32, {.scale = 0.17f, .causal = true, .pos0 = 32}, -4, 1, -4, 1, -8, 2},
      {"sliding window", 40, 140, 32, {.scale = 0.17f, .causal = true, .pos0 = 100, .window = 50}, -4, 1, -4, 1, -8, 2},
      {"window larger than the past", 20, 20, 128, {.scale = 0.09f, .causal = true, .window = 64}, -3, 1, -3, 1, -8, 2},
      {"softcap", 35, 200, 64, {.scale = 0.5f, .softcap = 5.f, .causal = true, .pos0 = 165}, -3, 2, -3, 1, -8, 4},
      {"softcap and window",
       9,
       160,
       256,
       {.scale = 0.0625f, .softcap = 50.f, .causal = true, .pos0 = 151, .window = 70},
       -3,
       2,
       -3,
       1,
       -12,
       6},
      {"decode group (GQA)", 3, 300, 64, {.scale = 0.125f}, -3, 2, -3, 1, -8, 4},
      {"decode one row, window", 1, 500, 64, {.scale = 0.125f, .window = 100}, -3, 2, -3, 1, -8, 4},
      {"sink", 37, 37, 64, {.scale = 0.125f, .causal = true, .sink = 0.7f}, -3, 1, -3, 1, -8, 2},
      {"sink above every score, window",
       40,
       140,
       32,
       {.scale = 0.17f, .causal = true, .pos0 = 100, .window = 50, .sink = 6.f},
       -3,
       1,
       -3,
       1,
       -8,
       2},
      {"long, 2 tiles of rows", 48, 1100, 64, {.scale = 0.125f, .causal = true, .pos0 = 1052}, -3, 1, -3, 1, -8, 2},
  };
}

std::vector<float> run(const Case& c, const std::vector<float>& q, const std::vector<f16>& k, const std::vector<f16>& v,
                       bool amx) {
  std::vector<float> out(c.rows * c.hd, std::nanf(""));
  AttentionOptions o = c.opt;
  o.amx_bf16 = amx;
  attention(make_tensor(q.data(), c.rows, c.hd), make_tensor(k.data(), c.kv_len, c.hd),
            make_tensor(v.data(), c.kv_len, c.hd), make_tensor(out.data(), c.rows, c.hd), o);
  return out;
}

}  // namespace attn_amx_test

TEST_CASE("attention on AMX bf16 tiles: within the derived bound of the double-precision reference") {
  attn_amx_test::SwitchGuard guard;
  const bool usable = attn_amx_test::usable_or_skip();
  uint32_t seed = 500;
  for (const auto& c : attn_amx_test::cases()) {
    const std::string name = c.name;
    CAPTURE(name);
    const auto q = attn_amx_test::wide(c.rows * c.hd, ++seed, c.qlo, c.qhi);
    const auto k = attn_amx_test::as_f16(attn_amx_test::wide(c.kv_len * c.hd, ++seed, c.klo, c.khi));
    const auto v = attn_amx_test::as_f16(attn_amx_test::wide(c.kv_len * c.hd, ++seed, c.vlo, c.vhi));
    // Switched off, the option gives the f32 kernel's bits and no tile call.
    const auto f32 = attn_amx_test::run(c, q, k, v, false);
    set_amx_enabled({.enabled = false});
    unsigned long before = detail::amx_attention_calls().load();
    const auto off = attn_amx_test::run(c, q, k, v, true);
    set_amx_enabled({.enabled = true});
    CHECK(detail::amx_attention_calls().load() == before);
    CHECK(std::memcmp(off.data(), f32.data(), f32.size() * sizeof(float)) == 0);
    if (!usable) continue;
    before = detail::amx_attention_calls().load();
    const auto y = attn_amx_test::run(c, q, k, v, true);
    CHECK(detail::amx_attention_calls().load() == before + 1);
    std::vector<float> want(c.rows * c.hd);
    ref::attention(q.data(), k.data(), v.data(), want.data(), c.rows, c.hd, c.kv_len, c.opt);
    double worst = 0;  // error / bound over the rows
    for (std::size_t r = 0; r < c.rows; ++r) {
      const double bound = attn_amx_test::row_bound(q.data(), k.data(), v.data(), c.hd, c.kv_len, r, c.opt);
      for (std::size_t d = 0; d < c.hd; ++d) {
        const double e = std::fabs(double(y[r * c.hd + d]) - double(want[r * c.hd + d])) / bound;
        worst = std::isnan(e) ? 1e9 : std::max(worst, e);
      }
    }
    INFO("worst |AMX - reference| / bound: ", worst);
    CHECK(worst <= 1.0);
  }
}

TEST_CASE("attention on AMX bf16 tiles: a row's bits do not depend on its call, the rows beside it or the thread") {
  attn_amx_test::SwitchGuard guard;
  if (!attn_amx_test::usable_or_skip()) return;
  for (const std::size_t hd : {std::size_t(64), std::size_t(128)})
    for (const std::size_t window : {std::size_t(0), std::size_t(70)}) {
      CAPTURE(hd);
      CAPTURE(window);
      const std::size_t kv_len = 600, rows = 75, pos0 = kv_len - rows;  // rows across a tile of positions
      const auto q = attn_amx_test::wide(rows * hd, 5, -3, 1);
      const auto k = attn_amx_test::as_f16(attn_amx_test::wide(kv_len * hd, 6, -3, 1));
      const auto v = attn_amx_test::as_f16(attn_amx_test::wide(kv_len * hd, 7, -8, 2));
      const auto K = make_tensor(k.data(), kv_len, hd), V = make_tensor(v.data(), kv_len, hd);
      const AttentionOptions opt{.scale = 0.125f, .causal = true, .pos0 = pos0, .window = window, .amx_bf16 = true};
      std::vector<float> all(rows * hd);
      attention(make_tensor(q.data(), rows, hd), K, V, make_tensor(all.data(), rows, hd), opt);
      // Rows [r0, r1) as a call of their own, over the positions they see (kv_len = the last row's + 1), as the
      // transformer's chunks: chunks of 1, 7, 16 and 32 rows.
      auto part = [&](std::size_t r0, std::size_t r1, float* out) {
        AttentionOptions o = opt;
        o.pos0 = pos0 + r0;
        const std::size_t n = pos0 + r1;
        attention(make_tensor(q.data() + r0 * hd, r1 - r0, hd), make_tensor(k.data(), n, hd),
                  make_tensor(v.data(), n, hd), make_tensor(out + r0 * hd, r1 - r0, hd), o);
      };
      for (const std::size_t chunk : {std::size_t(1), std::size_t(7), std::size_t(16), std::size_t(32)}) {
        CAPTURE(chunk);
        std::vector<float> split(rows * hd, std::nanf(""));
        for (std::size_t r0 = 0; r0 < rows; r0 += chunk) part(r0, std::min(rows, r0 + chunk), split.data());
        CHECK(std::memcmp(split.data(), all.data(), all.size() * sizeof(float)) == 0);
      }
      // Two threads, each with its half of the rows (and its own scratch): the same bits.
      std::vector<float> two(rows * hd, std::nanf(""));
      std::thread t1([&] { part(0, 40, two.data()); });
      std::thread t2([&] { part(40, rows, two.data()); });
      t1.join();
      t2.join();
      CHECK(std::memcmp(two.data(), all.data(), all.size() * sizeof(float)) == 0);
      // The last row as a decode step (non-causal, at kv_len - 1): the same bits.
      std::vector<float> one(hd);
      AttentionOptions dec{.scale = 0.125f, .window = window, .amx_bf16 = true};
      attention(make_tensor(q.data() + (rows - 1) * hd, 1, hd), K, V, make_tensor(one.data(), 1, hd), dec);
      CHECK(std::memcmp(one.data(), all.data() + (rows - 1) * hd, hd * sizeof(float)) == 0);
    }
}

TEST_CASE("attention on AMX bf16 tiles: query heads sharing K and V in one pass give each head's bits alone") {
  attn_amx_test::SwitchGuard guard;
  if (!attn_amx_test::usable_or_skip()) return;
  // 3 heads (SmolLM2's group), 8 (gpt-oss's: passes of fewer positions than rows), head sizes with 384 and 192
  // rows per pass, sinks per head, a sliding window, rows split across passes.
  for (const std::size_t heads : {std::size_t(3), std::size_t(8)})
    for (const std::size_t hd : {std::size_t(64), std::size_t(128)}) {
      CAPTURE(heads);
      CAPTURE(hd);
      const std::size_t kv_len = 260, rows = 150, pos0 = kv_len - rows;
      const auto q = attn_amx_test::wide(rows * heads * hd, 21, -3, 1);
      const auto k = attn_amx_test::as_f16(attn_amx_test::wide(kv_len * hd, 22, -3, 1));
      const auto v = attn_amx_test::as_f16(attn_amx_test::wide(kv_len * hd, 23, -8, 2));
      std::vector<float> sinks(heads);
      for (std::size_t h = 0; h < heads; ++h)
        sinks[h] = h % 3 == 1 ? -std::numeric_limits<float>::infinity() : 0.5f * h;
      const auto K = make_tensor(k.data(), kv_len, hd), V = make_tensor(v.data(), kv_len, hd);
      const AttentionOptions opt{.scale = 0.125f,
                                 .causal = true,
                                 .pos0 = pos0,
                                 .window = 90,
                                 .amx_bf16 = true,
                                 .heads = heads,
                                 .sinks = sinks};
      std::vector<float> all(rows * heads * hd, std::nanf(""));
      attention(make_tensor(q.data(), rows, heads * hd), K, V, make_tensor(all.data(), rows, heads * hd), opt);
      std::vector<float> one(rows * heads * hd, std::nanf(""));
      for (std::size_t h = 0; h < heads; ++h) {
        AttentionOptions o = opt;
        o.heads = 1;
        o.sinks = {};
        o.sink = sinks[h];
        const std::ptrdiff_t st = std::ptrdiff_t(heads * hd);
        attention(make_strided<const float, 2>(q.data() + h * hd, {rows, hd}, {st, 1}), K, V,
                  make_strided<float, 2>(one.data() + h * hd, {rows, hd}, {st, 1}), o);
      }
      CHECK(std::memcmp(one.data(), all.data(), all.size() * sizeof(float)) == 0);
      // The group in chunks of 7 rows, each over the positions it sees: the same bits.
      std::vector<float> split(rows * heads * hd, std::nanf(""));
      for (std::size_t r0 = 0; r0 < rows; r0 += 7) {
        const std::size_t r1 = std::min(rows, r0 + 7), n = pos0 + r1;
        AttentionOptions o = opt;
        o.pos0 = pos0 + r0;
        attention(make_tensor(q.data() + r0 * heads * hd, r1 - r0, heads * hd), make_tensor(k.data(), n, hd),
                  make_tensor(v.data(), n, hd), make_tensor(split.data() + r0 * heads * hd, r1 - r0, heads * hd), o);
      }
      CHECK(std::memcmp(split.data(), all.data(), all.size() * sizeof(float)) == 0);
      // And within the derived bound of the reference, head by head.
      double worst = 0;
      for (std::size_t h = 0; h < heads; ++h) {
        std::vector<float> qh(rows * hd), want(rows * hd);
        for (std::size_t r = 0; r < rows; ++r)
          std::memcpy(qh.data() + r * hd, q.data() + (r * heads + h) * hd, hd * sizeof(float));
        AttentionOptions o = opt;
        o.sink = sinks[h];
        ref::attention(qh.data(), k.data(), v.data(), want.data(), rows, hd, kv_len, o);
        for (std::size_t r = 0; r < rows; ++r) {
          const double bound = attn_amx_test::row_bound(qh.data(), k.data(), v.data(), hd, kv_len, r, o);
          for (std::size_t d = 0; d < hd; ++d) {
            const double e = std::fabs(double(all[(r * heads + h) * hd + d]) - double(want[r * hd + d])) / bound;
            worst = std::isnan(e) ? 1e9 : std::max(worst, e);
          }
        }
      }
      INFO("worst |AMX - reference| / bound: ", worst);
      CHECK(worst <= 1.0);
    }
}

TEST_CASE("attention on AMX bf16 tiles: NaN and infinite keys make their rows NaN; no positions gives zeros") {
  attn_amx_test::SwitchGuard guard;
  if (!attn_amx_test::usable_or_skip()) return;
  const std::size_t hd = 32, kv_len = 100;
  const auto q = attn_amx_test::wide(kv_len * hd, 8, -2, 1);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    auto k = attn_amx_test::as_f16(attn_amx_test::wide(kv_len * hd, 9, -2, 1));
    const auto v = attn_amx_test::as_f16(attn_amx_test::wide(kv_len * hd, 10, -2, 1));
    k[80 * hd + 3] = f16::from_bits(f32_to_f16_bits(bad));  // position 80's key
    std::vector<float> out(kv_len * hd);
    for (const float cap : {0.f, 10.f}) {
      attention(make_tensor(q.data(), kv_len, hd), make_tensor(k.data(), kv_len, hd), make_tensor(v.data(), kv_len, hd),
                make_tensor(out.data(), kv_len, hd),
                {.scale = 0.25f, .softcap = cap, .causal = true, .window = 10, .amx_bf16 = true});
      for (std::size_t r = 0; r < kv_len; ++r) {
        CAPTURE(r);
        const bool sees = r >= 80 && r < 90;
        CHECK(std::isnan(out[r * hd]) == sees);
        if (!sees) CHECK(std::isfinite(out[r * hd + hd - 1]));
      }
    }
  }
  std::vector<float> out(2 * hd, 5.f);
  std::vector<f16> none(hd);
  attention(make_tensor(q.data(), 2, hd), make_tensor(none.data(), 0, hd), make_tensor(none.data(), 0, hd),
            make_tensor(out.data(), 2, hd), {.amx_bf16 = true});
  CHECK(out[0] == 0.f);
  CHECK(out[2 * hd - 1] == 0.f);
}

TEST_CASE("attention on AMX bf16 tiles: f32 caches and head sizes off 32 keep the f32 kernel") {
  attn_amx_test::SwitchGuard guard;
  const std::size_t rows = 20, kv_len = 50;
  for (const std::size_t hd : {std::size_t(16), std::size_t(48)}) {
    CAPTURE(hd);
    const auto q = attn_amx_test::wide(rows * hd, 11, -2, 1);
    const auto k = attn_amx_test::as_f16(attn_amx_test::wide(kv_len * hd, 12, -2, 1));
    const auto v = attn_amx_test::as_f16(attn_amx_test::wide(kv_len * hd, 13, -2, 1));
    std::vector<float> a(rows * hd), b(rows * hd);
    const unsigned long before = detail::amx_attention_calls().load();
    const AttentionOptions opt{.scale = 0.2f, .causal = true, .pos0 = kv_len - rows};
    AttentionOptions amx = opt;
    amx.amx_bf16 = true;
    attention(make_tensor(q.data(), rows, hd), make_tensor(k.data(), kv_len, hd), make_tensor(v.data(), kv_len, hd),
              make_tensor(a.data(), rows, hd), opt);
    attention(make_tensor(q.data(), rows, hd), make_tensor(k.data(), kv_len, hd), make_tensor(v.data(), kv_len, hd),
              make_tensor(b.data(), rows, hd), amx);
    CHECK(detail::amx_attention_calls().load() == before);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  }
  const std::size_t hd = 64;
  const auto q = attn_amx_test::wide(rows * hd, 14, -2, 1), kf = attn_amx_test::wide(kv_len * hd, 15, -2, 1),
             vf = attn_amx_test::wide(kv_len * hd, 16, -2, 1);
  std::vector<float> a(rows * hd), b(rows * hd);
  const unsigned long before = detail::amx_attention_calls().load();
  attention(make_tensor(q.data(), rows, hd), make_tensor(kf.data(), kv_len, hd), make_tensor(vf.data(), kv_len, hd),
            make_tensor(a.data(), rows, hd), {.scale = 0.2f});
  attention(make_tensor(q.data(), rows, hd), make_tensor(kf.data(), kv_len, hd), make_tensor(vf.data(), kv_len, hd),
            make_tensor(b.data(), rows, hd), {.scale = 0.2f, .amx_bf16 = true});
  CHECK(detail::amx_attention_calls().load() == before);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}
