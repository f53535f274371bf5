// Packed rows (ops/matmul.hpp): the layout against its description, written out independently here; and
// matmul over packed f16 / bf16 weights bit-identical to matmul over the same row-major weights, on every
// target, GEMV and GEMM, 1 and 2 threads, N and K tails around the 8-row groups and 32-element chunks
// (every result is also checked against the scalar reference by test_matmul.cpp's row-major runs, so
// bit-identity carries that check over).
#include <cstring>
#include <vector>

#include "kiln/ops/matmul.hpp"
#include "test_util.hpp"

using namespace kiln;

namespace {

// The layout as the header describes it: groups of 8 whole rows, each group its 32-element chunks (row 0's
// 32, row 1's 32, ...) then each row's last K % 32 elements row after row; rows past the last group as they were.
template <class T>
std::vector<T> pack_by_description(const std::vector<T>& b, std::size_t n, std::size_t k) {
  std::vector<T> out;
  const std::size_t groups = n / 8, chunks = k / 32;
  for (std::size_t g = 0; g < groups; ++g) {
    for (std::size_t c = 0; c < chunks; ++c)
      for (std::size_t r = 0; r < 8; ++r)
        for (std::size_t e = 0; e < 32; ++e) out.push_back(b[(8 * g + r) * k + 32 * c + e]);
    for (std::size_t r = 0; r < 8; ++r)
      for (std::size_t p = 32 * chunks; p < k; ++p) out.push_back(b[(8 * g + r) * k + p]);
  }
  for (std::size_t j = 8 * groups; j < n; ++j)
    for (std::size_t p = 0; p < k; ++p) out.push_back(b[j * k + p]);
  return out;
}

template <class T>
std::vector<T> random_weights(std::size_t n, std::size_t k, std::uint32_t seed) {
  const auto v = test::random_floats(n * k, seed);
  std::vector<T> b(n * k);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = T(v[i]);
  return b;
}

template <class T>
bool same_bits(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

template <class T>
void check_layout(std::size_t n, std::size_t k) {
  CAPTURE(n);
  CAPTURE(k);
  INFO("dtype ", dtype_name<T>);
  const auto b = random_weights<T>(n, k, std::uint32_t(n * 1000 + k));
  const auto want = pack_by_description(b, n, k);
  REQUIRE(want.size() == n * k);
  std::vector<T> got(n * k);
  const auto pv = pack_rows(make_tensor<const T>(b.data(), n, k), got.data());
  CHECK(pv.data == got.data());
  CHECK(pv.rows == n);
  CHECK(pv.cols == k);
  CHECK(same_bits(got, want));
  auto in_place = b;
  pack_rows_in_place(in_place.data(), n, k);
  CHECK(same_bits(in_place, want));
  for (std::size_t j = 0; j < n; ++j)  // the offset helper the kernels' addressing follows
    for (std::size_t p = 0; p < k; ++p)
      if (std::memcmp(&got[detail::packed_offset(n, k, j, p)], &b[j * k + p], sizeof(T)) != 0) {
        FAIL("packed_offset(", j, ", ", p, ") is wrong");
        return;
      }
}

// matmul over B packed vs B row-major: bit-identical (every target; the given pool).
template <class T>
void check_product(std::size_t m, std::size_t n, std::size_t k, bool accumulate, ThreadPool* pool) {
  CAPTURE(m);
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(accumulate);
  INFO("dtype ", dtype_name<T>, ", threads ", pool ? pool->size() : 1);
  const std::uint32_t seed = std::uint32_t(m * 7919 + n * 31 + k);
  const auto b = random_weights<T>(n, k, seed);
  const auto a = test::random_floats(m * k + 1, seed + 1);  // + 1: A starts misaligned below
  const auto c0 = test::random_floats(m * n, seed + 2);
  std::vector<T> packed(n * k);
  const auto pv = pack_rows(make_tensor<const T>(b.data(), n, k), packed.data());
  const auto av = make_tensor<const float>(a.data() + 1, m, k);
  test::for_each_target([&](const std::string&) {
    std::vector<float> want = c0, got = c0;
    matmul(av, make_tensor<const T>(b.data(), n, k), make_tensor(want.data(), m, n), {.accumulate = accumulate}, pool);
    matmul(av, PackedRows<const T>{pv.data, n, k}, make_tensor(got.data(), m, n), {.accumulate = accumulate}, pool);
    CHECK(same_bits(got, want));
  });
}

template <class T>
void check_products() {
  ThreadPool pool(2);
  // M 1-4: the GEMV (R = 8 rows for M <= 2, 4 for 3-4 on AVX-512); larger M: the GEMM's B panels.
  for (std::size_t m : {1, 2, 3, 4, 5, 13})
    for (std::size_t n : {1, 7, 8, 9, 64, 67, 136})
      for (std::size_t k : {1, 15, 16, 31, 32, 33, 64, 100, 128, 256, 545})
        check_product<T>(m, n, k, (m + n + k) % 2 == 1, nullptr);
  // Thread splits (64-row units) and K past one GEMM K block.
  for (std::size_t m : {1, 2, 4, 40})
    for (std::size_t n : {200, 300}) check_product<T>(m, n, 1100, m % 2 == 0, &pool);
}

}  // namespace

TEST_CASE("pack_rows and pack_rows_in_place write the documented layout") {
  for (std::size_t n : {1, 7, 8, 9, 16, 23})
    for (std::size_t k : {1, 31, 32, 33, 64, 70}) {
      check_layout<f16>(n, k);
      check_layout<bf16>(n, k);
    }
}

TEST_CASE("matmul over packed f16 rows is bit-identical to row-major") { check_products<f16>(); }
TEST_CASE("matmul over packed bf16 rows is bit-identical to row-major") { check_products<bf16>(); }

TEST_CASE("matmul over packed rows: errors") {
  std::vector<bf16> b(64 * 8);
  std::vector<float> a(64 * 2), c(64);
  const auto pv = pack_rows(make_tensor<const bf16>(std::vector<bf16>(64 * 8).data(), 8, 64), b.data());
  CHECK_THROWS_WITH_AS(matmul(make_tensor<const float>(a.data(), 2, 32), pv, make_tensor(c.data(), 2, 8)),
                       doctest::Contains("b (8, 64) packed and c f32(2, 8) do not fit"), ShapeError);
  CHECK_THROWS_WITH_AS(
      matmul(make_tensor<const float>(a.data(), 1, 64), pv, make_tensor(c.data(), 1, 8), {.bf16 = Bf16Mode::fast}),
      doctest::Contains("Bf16Mode::fast is not implemented for packed rows"), ShapeError);
  auto* cb = reinterpret_cast<float*>(b.data());  // an output inside the packed weights
  CHECK_THROWS_WITH_AS(matmul(make_tensor<const float>(a.data(), 1, 64), pv, make_tensor(cb, 1, 8)),
                       doctest::Contains("overlaps"), ShapeError);
}
