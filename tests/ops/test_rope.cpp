// RoPE: HF's inverse frequencies, both pairings, partial rotary, strided q/k views, large positions;
// SIMD on every target against the double-precision scalar reference.
#include <cmath>
#include <map>

#include "kiln/ops/rope.hpp"
#include "test_util.hpp"

using namespace kiln;

TEST_CASE("rope_inv_freq reproduces HF's float32 inv_freq, correctly rounded") {
  // 1 / float32(theta ** (float32(2i) / dim)) with the power evaluated to 60 digits (Python decimal) and
  // rounded to float32, then a float32 division: HF's formula with an exact pow. (numpy's and torch's
  // float pow are within 1 ulp of these.)
  const auto a = rope_inv_freq(10000.0f, 128);
  REQUIRE(a.size() == 64);
  CHECK(a[0] == 1.0f);
  CHECK(a[1] == 0x1.bb5faep-1f);
  CHECK(a[32] == 0x1.47ae14p-7f);
  CHECK(a[63] == 0x1.e459c4p-14f);
  const auto b = rope_inv_freq(500000.0f, 64);
  CHECK(b[1] == 0x1.53c38cp-1f);
  CHECK(b[16] == 0x1.72ba42p-10f);
  CHECK(b[31] == 0x1.94836p-19f);
  // Linear scaling divides the frequencies (HF: inv_freq /= factor).
  CHECK(rope_inv_freq(10000.0f, 128, 4.0f)[1] == 0x1.bb5faep-3f);
}

TEST_CASE("rope on a hand-computed head: neox pairs (i, i + d/2), gptj pairs (2i, 2i + 1)") {
  // head_dim 4, theta 10000: inv_freq = {1, 0.01}; position 1.
  const double c1 = 0.5403023058681398, s1 = 0.8414709848078965;    // cos(1), sin(1)
  const double c2 = 0.9999500004166653, s2 = 0.009999833334166664;  // cos(0.01), sin(0.01)
  const float x[4] = {1, 2, 3, 4};
  const std::int32_t pos[1] = {1};
  float o[4];
  RopeConfig cfg;
  rope(make_tensor<const float>(x, 1, 1, 4), make_tensor<const std::int32_t>(pos, 1), make_tensor(o, 1, 1, 4), cfg);
  CHECK(o[0] == doctest::Approx(1 * c1 - 3 * s1).epsilon(1e-6));
  CHECK(o[2] == doctest::Approx(3 * c1 + 1 * s1).epsilon(1e-6));
  CHECK(o[1] == doctest::Approx(2 * c2 - 4 * s2).epsilon(1e-6));
  CHECK(o[3] == doctest::Approx(4 * c2 + 2 * s2).epsilon(1e-6));
  cfg.style = RopeStyle::gptj;
  rope(make_tensor<const float>(x, 1, 1, 4), make_tensor<const std::int32_t>(pos, 1), make_tensor(o, 1, 1, 4), cfg);
  CHECK(o[0] == doctest::Approx(1 * c1 - 2 * s1).epsilon(1e-6));
  CHECK(o[1] == doctest::Approx(2 * c1 + 1 * s1).epsilon(1e-6));
  CHECK(o[2] == doctest::Approx(3 * c2 - 4 * s2).epsilon(1e-6));
  CHECK(o[3] == doctest::Approx(4 * c2 + 3 * s2).epsilon(1e-6));
}

TEST_CASE("rope matches the scalar reference on every target, head size, pairing, stride and position") {
  // Positions include long-context ones (the angle reduction must hold) and a negative one.
  const std::vector<std::int32_t> positions{0, 17, 1 << 20, 100000007, -3};
  const std::size_t n_tokens = positions.size(), n_heads = 2;
  test::for_each_target([&](const std::string&) {
    for (std::size_t n : test::kernel_sizes()) {
      const std::size_t head_dim = n + n % 2;  // even
      for (std::size_t rot_dim : {head_dim, (head_dim / 4) * 2}) {
        if (rot_dim == 0) continue;
        for (RopeStyle style : {RopeStyle::neox, RopeStyle::gptj}) {
          CAPTURE(head_dim);
          CAPTURE(rot_dim);
          CAPTURE(int(style));
          // q as a view into a wider buffer: heads hd + 3 apart, tokens n_heads * (hd + 3) + 7 apart.
          const std::ptrdiff_t hs = std::ptrdiff_t(head_dim) + 3, ts = std::ptrdiff_t(n_heads) * hs + 7;
          const std::size_t total = std::size_t(ts) * n_tokens;
          test::Misaligned xs(total, 1), os(total, 2);
          auto xv = test::random_floats(total, 41 + n);
          std::copy(xv.begin(), xv.end(), xs.ptr);
          RopeConfig cfg;
          cfg.style = style;
          cfg.theta = 500000.0f;
          cfg.rot_dim = rot_dim;
          cfg.linear_factor = rot_dim == head_dim ? 1.0f : 8.0f;
          rope(make_strided<const float, 3>(xs.ptr, {n_tokens, n_heads, head_dim}, {ts, hs, 1}),
               make_tensor<const std::int32_t>(positions.data(), n_tokens),
               make_strided<float, 3>(os.ptr, {n_tokens, n_heads, head_dim}, {ts, hs, 1}), cfg);
          const auto inv_freq = rope_inv_freq(cfg.theta, rot_dim, cfg.linear_factor);
          std::vector<float> want(head_dim);
          for (std::size_t t = 0; t < n_tokens; ++t)
            for (std::size_t h = 0; h < n_heads; ++h) {
              CAPTURE(positions[t]);
              const std::ptrdiff_t off = std::ptrdiff_t(t) * ts + std::ptrdiff_t(h) * hs;
              ref::rope(xs.ptr + off, want.data(), head_dim, rot_dim, positions[t], inv_freq.data(), style);
              // |x| < 1. cos/sin are rounded to float (0.5 ulp = 3e-8 absolute each), then two products
              // and a sum in float: at most ~2.5e-7 absolute; results can cancel to ~0, so the bound is
              // absolute. Measured worst: 1.2e-7 on every target. A wrong angle, pairing or sign errs
              // by >= 1e-3.
              test::check_close(os.ptr + off, want.data(), head_dim, 0.0f, 2.5e-7f, "rope");
            }
        }
      }
    }
  });
}

TEST_CASE("rope in place and threaded equals out of place; partial rotary leaves the tail alone") {
  const std::size_t n_tokens = 40, n_heads = 8, head_dim = 96;
  auto xv = test::random_floats(n_tokens * n_heads * head_dim, 7);
  std::vector<std::int32_t> pos(n_tokens);
  for (std::size_t t = 0; t < n_tokens; ++t) pos[t] = std::int32_t(1000 + 3 * t);
  RopeConfig cfg;
  cfg.rot_dim = 32;
  cfg.theta = 10000.0f;
  std::vector<float> a(xv.size()), b = xv;
  auto p = make_tensor<const std::int32_t>(pos.data(), n_tokens);
  rope(make_tensor<const float>(xv.data(), n_tokens, n_heads, head_dim), p,
       make_tensor(a.data(), n_tokens, n_heads, head_dim), cfg);
  ThreadPool pool(2);
  rope(make_tensor(b.data(), n_tokens, n_heads, head_dim), p, cfg, &pool);
  CHECK(a == b);
  for (std::size_t r = 0; r < n_tokens * n_heads; ++r)
    for (std::size_t j = 32; j < head_dim; ++j) REQUIRE(a[r * head_dim + j] == xv[r * head_dim + j]);
}

TEST_CASE("rope errors name the op, the shapes and the settings") {
  std::vector<float> x(2 * 3 * 8), o(x.size());
  std::vector<std::int32_t> pos{0, 1, 2};
  auto xv = make_tensor<const float>(x.data(), 2, 3, 8);
  auto ov = make_tensor(o.data(), 2, 3, 8);
  RopeConfig cfg;
  CHECK_THROWS_WITH_AS(
      rope(xv, make_tensor<const std::int32_t>(pos.data(), 3), ov, cfg),
      doctest::Contains("kiln::rope: positions i32(3) must be contiguous of length 2 (x is f32(2, 3, 8))"), ShapeError);
  auto p2 = make_tensor<const std::int32_t>(pos.data(), 2);
  CHECK_THROWS_WITH_AS(rope(xv, p2, make_tensor(o.data(), 2, 4, 6), cfg),
                       doctest::Contains("kiln::rope: x f32(2, 3, 8) and out f32(2, 4, 6) must have the same shape"),
                       ShapeError);
  cfg.rot_dim = 10;
  CHECK_THROWS_WITH_AS(
      rope(xv, p2, ov, cfg),
      doctest::Contains("kiln::rope: rot_dim 10 must be even, positive and <= head_dim (x is f32(2, 3, 8))"),
      ShapeError);
  cfg.rot_dim = 5;
  CHECK_THROWS_AS(rope(xv, p2, ov, cfg), ShapeError);
  cfg.rot_dim = 0;
  cfg.theta = 0.0f;
  CHECK_THROWS_WITH_AS(rope(xv, p2, ov, cfg),
                       doctest::Contains("kiln::rope: theta 0 and linear_factor 1 must be positive and finite"), Error);
}

namespace {
// fl(fl(a c) - fl(b s)), each product rounded on its own (no FMA contraction): what rope() with a table
// computes on every target.
float product(float a, float b) {
  volatile float p = a * b;
  return p;
}
}  // namespace

TEST_CASE("rope with a RopeTable: the scalar rotation's bits on every target, each pairing, partial rotary") {
  // Long-context positions, YaRN-like factors and an attention factor: the table's values are whatever the
  // table holds; the rotation must be the plain float formula over them, bit for bit.
  const std::size_t ctx = 5000, n_heads = 3;
  const std::vector<std::int32_t> positions{0, 1, 17, 4096, 4999, 5};
  const std::size_t n_tokens = positions.size();
  std::map<std::size_t, RopeTable> tables;  // by rot_dim, built once for all targets
  auto table_for = [&](std::size_t rot_dim) -> const RopeTable& {
    auto it = tables.find(rot_dim);
    if (it != tables.end()) return it->second;
    std::vector<float> factors(rot_dim / 2);
    for (std::size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + float(i % 5);
    return tables
        .emplace(rot_dim, RopeTable(ctx, 1e6f, rot_dim,
                                    {.linear_factor = 2.0f, .freq_factors = factors, .attention_factor = 1.25f}))
        .first->second;
  };
  test::for_each_target([&](const std::string&) {
    for (std::size_t n : test::kernel_sizes()) {
      if (n > 1000) continue;  // the tables (ctx * rot_dim floats) stay small
      const std::size_t head_dim = n + n % 2;
      for (std::size_t rot_dim : {head_dim, (head_dim / 4) * 2}) {
        if (rot_dim == 0) continue;
        const RopeTable& table = table_for(rot_dim);
        for (RopeStyle style : {RopeStyle::neox, RopeStyle::gptj}) {
          CAPTURE(head_dim);
          CAPTURE(rot_dim);
          CAPTURE(int(style));
          const std::ptrdiff_t hs = std::ptrdiff_t(head_dim) + 3, ts = std::ptrdiff_t(n_heads) * hs + 7;
          const std::size_t total = std::size_t(ts) * n_tokens;
          test::Misaligned xs(total, 1), os(total, 2);
          auto xv = test::random_floats(total, 43 + n);
          std::copy(xv.begin(), xv.end(), xs.ptr);
          rope(make_strided<const float, 3>(xs.ptr, {n_tokens, n_heads, head_dim}, {ts, hs, 1}),
               make_tensor<const std::int32_t>(positions.data(), n_tokens),
               make_strided<float, 3>(os.ptr, {n_tokens, n_heads, head_dim}, {ts, hs, 1}), table, style);
          const std::size_t h = rot_dim / 2;
          for (std::size_t t = 0; t < n_tokens; ++t) {
            const float *c = table.cos(std::size_t(positions[t])), *s = table.sin(std::size_t(positions[t]));
            for (std::size_t hd = 0; hd < n_heads; ++hd) {
              const float* x = xs.ptr + std::ptrdiff_t(t) * ts + std::ptrdiff_t(hd) * hs;
              const float* o = os.ptr + std::ptrdiff_t(t) * ts + std::ptrdiff_t(hd) * hs;
              for (std::size_t i = 0; i < h; ++i) {
                const std::size_t j0 = style == RopeStyle::neox ? i : 2 * i;
                const std::size_t j1 = style == RopeStyle::neox ? i + h : 2 * i + 1;
                REQUIRE(o[j0] == product(x[j0], c[i]) - product(x[j1], s[i]));
                REQUIRE(o[j1] == product(x[j1], c[i]) + product(x[j0], s[i]));
              }
              for (std::size_t j = rot_dim; j < head_dim; ++j) REQUIRE(o[j] == x[j]);
            }
          }
        }
      }
    }
  });
}

TEST_CASE("RopeTable holds cos/sin of the scaled HF frequencies; rope over it agrees with the angle op") {
  // The table against its definition in double: inv = rope_inv_freq(theta, rot_dim, linear_factor) / factor
  // (float32), cos/sin of p * inv in double rounded once, times the attention factor in float.
  const std::size_t rot_dim = 64, ctx = 5000;
  const auto yarn = rope_yarn_factors(1e4f, rot_dim, {.factor = 4, .original_ctx = 2048});
  const RopeTable t(ctx, 1e4f, rot_dim, {.linear_factor = 1.0f, .freq_factors = yarn, .attention_factor = 1.1386f});
  REQUIRE(t.ctx() == ctx);
  REQUIRE(t.rot_dim() == rot_dim);
  CHECK(t.bytes() == 2 * ctx * 32 * sizeof(float));
  const auto inv = rope_inv_freq(1e4f, rot_dim);
  for (std::size_t p : {std::size_t(0), std::size_t(1), std::size_t(4999)})
    for (std::size_t i = 0; i < rot_dim / 2; ++i) {
      const double a = double(p) * double(inv[i] / yarn[i]);
      CHECK(t.cos(p)[i] == float(std::cos(a)) * 1.1386f);
      CHECK(t.sin(p)[i] == float(std::sin(a)) * 1.1386f);
    }
  // Unscaled, the table path and the angle path round the same cos/sin; only the rotation's FMA differs
  // (the angle op's own bound, above, covers both).
  const std::size_t n_tokens = 4, n_heads = 2, head_dim = 64;
  const RopeTable plain(ctx, 1e4f, rot_dim);
  std::vector<std::int32_t> pos{0, 3, 1000, 4999};
  auto xv = test::random_floats(n_tokens * n_heads * head_dim, 9);
  std::vector<float> a(xv.size()), b(xv.size());
  auto x = make_tensor<const float>(xv.data(), n_tokens, n_heads, head_dim);
  auto p = make_tensor<const std::int32_t>(pos.data(), n_tokens);
  for (RopeStyle style : {RopeStyle::neox, RopeStyle::gptj}) {
    rope(x, p, make_tensor(a.data(), n_tokens, n_heads, head_dim), plain, style);
    rope(x, p, make_tensor(b.data(), n_tokens, n_heads, head_dim), RopeConfig{.style = style, .theta = 1e4f});
    test::check_close(a.data(), b.data(), a.size(), 0.0f, 2.5e-7f, "rope table vs angles");
  }
}

TEST_CASE("rope with a table: in place and threaded equal out of place; errors name what is wrong") {
  const std::size_t n_tokens = 40, n_heads = 8, head_dim = 96;
  const RopeTable table(200, 1e4f, 32);
  auto xv = test::random_floats(n_tokens * n_heads * head_dim, 7);
  std::vector<std::int32_t> pos(n_tokens);
  for (std::size_t t = 0; t < n_tokens; ++t) pos[t] = std::int32_t(150 - 3 * t);
  std::vector<float> a(xv.size()), b = xv;
  auto p = make_tensor<const std::int32_t>(pos.data(), n_tokens);
  rope(make_tensor<const float>(xv.data(), n_tokens, n_heads, head_dim), p,
       make_tensor(a.data(), n_tokens, n_heads, head_dim), table, RopeStyle::gptj);
  ThreadPool pool(2);
  auto bv = make_tensor(b.data(), n_tokens, n_heads, head_dim);
  rope(bv, p, bv, table, RopeStyle::gptj, &pool);
  CHECK(a == b);
  for (std::size_t r = 0; r < n_tokens * n_heads; ++r)
    for (std::size_t j = 32; j < head_dim; ++j) REQUIRE(a[r * head_dim + j] == xv[r * head_dim + j]);

  pos[3] = 200;
  CHECK_THROWS_WITH_AS(rope(bv, p, bv, table, RopeStyle::neox),
                       doctest::Contains("kiln::rope: position 200 (token 3) outside the table's [0, 200)"), Error);
  pos[3] = -1;
  CHECK_THROWS_WITH_AS(rope(bv, p, bv, table, RopeStyle::neox), doctest::Contains("position -1 (token 3)"), Error);
  pos[3] = 0;
  const RopeTable wide(10, 1e4f, 128);
  CHECK_THROWS_WITH_AS(rope(bv, p, bv, wide, RopeStyle::neox),
                       doctest::Contains("kiln::rope: a table of rot_dim 128 for x f32(40, 8, 96)"), ShapeError);
  CHECK_THROWS_WITH_AS(rope(bv, p, bv, RopeTable{}, RopeStyle::neox), doctest::Contains("a table of rot_dim 0"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(RopeTable(10, 1e4f, 7), doctest::Contains("kiln::RopeTable: rot_dim 7 must be even"), Error);
  CHECK_THROWS_WITH_AS(RopeTable(10, -1.0f, 8), doctest::Contains("kiln::RopeTable: theta -1"), Error);
  const std::vector<float> three{1, 2, 3}, bad{1, 0, 2, 3};
  CHECK_THROWS_WITH_AS(RopeTable(10, 1e4f, 8, {.freq_factors = three}),
                       doctest::Contains("kiln::RopeTable: 3 frequency factors for a rotary dimension of 8 (need 4)"),
                       Error);
  CHECK_THROWS_WITH_AS(RopeTable(10, 1e4f, 8, {.freq_factors = bad}),
                       doctest::Contains("kiln::RopeTable: frequency factor 0 must be positive"), Error);
  CHECK_THROWS_WITH_AS(RopeTable(10, 1e4f, 8, {.attention_factor = 0.0f}),
                       doctest::Contains("kiln::RopeTable: attention_factor 0"), Error);
}

TEST_CASE("RopeTable with LongRoPE factors: the short set up to original_ctx positions, the long set beyond") {
  // llama.cpp's rule (llama_model::get_rope_factors): a context longer than the original one uses the long
  // factors, for every position. Each table must be the plain table of the chosen set, bit for bit.
  const std::size_t rot_dim = 8, orig = 16;
  const std::vector<float> short_f{1.0f, 1.25f, 2.5f, 3.5f}, long_f{1.5f, 4.0f, 12.0f, 30.0f};
  const float attn = rope_longrope_attention_factor(8.0, double(orig));
  CHECK(attn == doctest::Approx(std::sqrt(1.75)).epsilon(1e-7));  // ln 8 / ln 16 = 3 / 4
  CHECK(rope_longrope_attention_factor(1.0, 16.0) == 1.0f);       // no extension: 1
  const RopeTableOptions longrope{
      .freq_factors = short_f, .attention_factor = attn, .long_freq_factors = long_f, .original_ctx = orig};
  for (const std::size_t ctx : {std::size_t(1), orig, orig + 1, std::size_t(100)}) {
    CAPTURE(ctx);
    const RopeTable t(ctx, 1e4f, rot_dim, longrope);
    const bool is_long = ctx > orig;
    CHECK(t.long_factors() == is_long);
    const RopeTable want(ctx, 1e4f, rot_dim, {.freq_factors = is_long ? long_f : short_f, .attention_factor = attn});
    CHECK(!want.long_factors());
    for (std::size_t p = 0; p < ctx; ++p)
      for (std::size_t i = 0; i < rot_dim / 2; ++i) {
        REQUIRE(t.cos(p)[i] == want.cos(p)[i]);
        REQUIRE(t.sin(p)[i] == want.sin(p)[i]);
      }
  }
  // The two sets give different angles past position 0 (the test above would hold for equal sets too).
  const RopeTable s(orig, 1e4f, rot_dim, longrope), l(orig + 1, 1e4f, rot_dim, longrope);
  CHECK(s.cos(5)[0] != l.cos(5)[0]);
  const std::vector<float> three{1, 2, 3}, zero{1, 0, 2, 3};
  CHECK_THROWS_WITH_AS(
      RopeTable(10, 1e4f, 8, {.freq_factors = short_f, .long_freq_factors = three, .original_ctx = 4}),
      doctest::Contains("kiln::RopeTable: 3 long-context frequency factors for a rotary dimension of 8 (need 4)"),
      Error);
  CHECK_THROWS_WITH_AS(RopeTable(10, 1e4f, 8, {.freq_factors = short_f, .long_freq_factors = zero, .original_ctx = 4}),
                       doctest::Contains("kiln::RopeTable: long-context frequency factor 0 must be positive"), Error);
  CHECK_THROWS_WITH_AS(RopeTable(10, 1e4f, 8, {.long_freq_factors = long_f, .original_ctx = 4}),
                       doctest::Contains("long-context frequency factors need the short ones"), Error);
  CHECK_THROWS_WITH_AS(RopeTable(10, 1e4f, 8, {.freq_factors = short_f, .long_freq_factors = long_f}),
                       doctest::Contains("and original_ctx > 0"), Error);
}
