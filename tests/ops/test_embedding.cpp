// Embedding lookup: f32, f16 and bf16 tables against per-element conversion; strided rows; bounds errors.
#include <cstring>

#include "kiln/ops/embedding.hpp"
#include "test_util.hpp"

using namespace kiln;

namespace {

// `vocab` rows `stride` elements apart, filled from random floats (rounded to T).
template <class T>
std::vector<T> make_table(std::size_t vocab, std::size_t stride, std::uint32_t seed) {
  const auto f = test::random_floats(vocab * stride, seed, -4.f, 4.f);
  std::vector<T> t(vocab * stride);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = T(f[i]);
  return t;
}

template <class T>
void check_table_type() {
  const std::size_t vocab = 37;
  const std::vector<std::int32_t> ids{0, 36, 5, 5, 17};
  for (std::size_t dim : test::kernel_sizes()) {
    CAPTURE(dim);
    const std::size_t ts = dim + 3, os = dim + 5;  // strided rows on both sides
    const auto table = make_table<T>(vocab, ts, std::uint32_t(dim));
    std::vector<float> out(ids.size() * os, -7.f);
    embedding(make_strided<const T, 2>(table.data(), {vocab, dim}, {std::ptrdiff_t(ts), 1}),
              make_tensor<const std::int32_t>(ids.data(), ids.size()),
              make_strided<float, 2>(out.data(), {ids.size(), dim}, {std::ptrdiff_t(os), 1}));
    for (std::size_t i = 0; i < ids.size(); ++i) {
      for (std::size_t j = 0; j < dim; ++j)
        REQUIRE(out[i * os + j] == to_f32(table[std::size_t(ids[i]) * ts + j]));  // conversions are exact
      for (std::size_t j = dim; j < os; ++j) REQUIRE(out[i * os + j] == -7.f);    // padding untouched
    }
  }
}

}  // namespace

TEST_CASE("embedding gathers f32, f16 and bf16 rows exactly for every row size and stride") {
  check_table_type<float>();
  check_table_type<f16>();
  check_table_type<bf16>();
}

TEST_CASE("embedding: known f16/bf16 bit patterns, threaded equals single-threaded") {
  const f16 h[2] = {f16::from_bits(0x3c00), f16::from_bits(0xc500)};     // 1.0, -5.0
  const bf16 b[2] = {bf16::from_bits(0x3f80), bf16::from_bits(0x4049)};  // 1.0, 3.140625
  const std::int32_t id[2] = {1, 0};
  float o[2];
  embedding(make_tensor<const f16>(h, 2, 1), make_tensor<const std::int32_t>(id, 2), make_tensor(o, 2, 1));
  CHECK(o[0] == -5.0f);
  CHECK(o[1] == 1.0f);
  embedding(make_tensor<const bf16>(b, 2, 1), make_tensor<const std::int32_t>(id, 2), make_tensor(o, 2, 1));
  CHECK(o[0] == 3.140625f);
  CHECK(o[1] == 1.0f);

  const std::size_t vocab = 1000, dim = 256, n = 300;
  const auto table = make_table<bf16>(vocab, dim, 9);
  std::vector<std::int32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = std::int32_t((i * 7919) % vocab);
  std::vector<float> a(n * dim), c(n * dim);
  ThreadPool pool(2);
  auto tv = make_tensor<const bf16>(table.data(), vocab, dim);
  auto iv = make_tensor<const std::int32_t>(ids.data(), n);
  embedding(tv, iv, make_tensor(a.data(), n, dim));
  embedding(tv, iv, make_tensor(c.data(), n, dim), &pool);
  CHECK(a == c);
}

TEST_CASE("embedding errors: out-of-range ids name the id and the vocabulary; shapes name the op") {
  std::vector<float> table(10 * 4), out(3 * 4, 5.f);
  auto tv = make_tensor<const float>(table.data(), 10, 4);
  const std::int32_t bad[3] = {1, 10, 2};
  CHECK_THROWS_WITH_AS(
      embedding(tv, make_tensor<const std::int32_t>(bad, 3), make_tensor(out.data(), 3, 4)),
      doctest::Contains("kiln::embedding: token id 10 (ids[1]) is out of range for a vocabulary of 10"), Error);
  for (float v : out) CHECK(v == 5.f);  // nothing written on failure
  const std::int32_t neg[1] = {-1};
  CHECK_THROWS_WITH_AS(embedding(tv, make_tensor<const std::int32_t>(neg, 1), make_tensor(out.data(), 1, 4)),
                       doctest::Contains("token id -1 (ids[0]) is out of range for a vocabulary of 10"), Error);
  const std::int32_t ok[3] = {0, 1, 2};
  CHECK_THROWS_WITH_AS(
      embedding(tv, make_tensor<const std::int32_t>(ok, 3), make_tensor(out.data(), 4, 3)),
      doctest::Contains("kiln::embedding: out f32(4, 3) must be (3, 4) for ids i32(3) and table f32(10, 4)"),
      ShapeError);
}
