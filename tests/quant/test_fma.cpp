// The scalar (de)quantizers stay bit-exact when compiled where FMA contraction is on: GCC fuses a*b + c
// into one FMA by default (-ffp-contract=fast) whenever the target has FMA, e.g. after inlining into an
// AVX2/FMA function. Here the row functions are forced inline (flatten) into functions compiled for
// AVX2+FMA and checked against the same gguf-py fixtures. Without detail::rounded in the quantizers,
// contraction changes Q4_0/Q5_0 levels (it did on this test's data); dequantization needs no barrier
// because its products are exact (dequant.hpp).
#include <cstring>
#include <vector>

#include "quant_fixture.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_TEST_FMA 1
#endif

#if KILN_TEST_FMA
using namespace kiln;

namespace {

template <class B, class X>
__attribute__((target("avx2,fma"), flatten)) void quantize_fma(const X* x, B* q, std::size_t n) {
  quantize_row(x, q, n);
}
template <class B>
__attribute__((target("avx2,fma"), flatten)) void dequantize_fma(const B* q, float* y, std::size_t n) {
  dequantize_row(q, y, n);
}

template <class B, class X>
void check_quantize_fma(const char* in_tag) {
  constexpr std::size_t bs = dtype_traits<B>::block_size;
  const std::string stem = "quantize_" + std::string(dtype_name<B>) + "_" + in_tag;
  INFO("fixture ", stem);
  const auto rec = test::read_records(stem, bs * sizeof(X), sizeof(B));
  std::vector<X> x(rec.n * bs);
  std::memcpy(x.data(), rec.in.data(), rec.in.size());
  std::vector<B> got(rec.n);
  quantize_fma(x.data(), got.data(), x.size());
  for (std::size_t i = 0; i < rec.n; ++i) {
    INFO("block ", rec.note(i));
    CHECK(std::memcmp(reinterpret_cast<const uint8_t*>(got.data()) + i * sizeof(B), rec.out.data() + i * sizeof(B),
                      sizeof(B)) == 0);
  }
}

template <class B>
void check_quantize_fma() {
  check_quantize_fma<B, float>("f32");
  check_quantize_fma<B, f16>("f16");
  check_quantize_fma<B, bf16>("bf16");
}

template <class B>
void check_dequantize_fma() {
  constexpr std::size_t bs = dtype_traits<B>::block_size;
  const std::string stem = "dequant_" + std::string(dtype_name<B>);
  INFO("fixture ", stem);
  const auto rec = test::read_records(stem, sizeof(B), bs * 4);
  std::vector<B> blocks(rec.n);
  std::memcpy(blocks.data(), rec.in.data(), rec.in.size());
  const auto want = test::as_floats(rec.out.data(), rec.n * bs);
  std::vector<float> got(want.size());
  dequantize_fma(blocks.data(), got.data(), got.size());
  const std::size_t j = test::first_bit_difference(got.data(), want.data(), want.size());
  INFO("first difference at element ", j, " (block ", rec.note(j / bs), ")");
  CHECK(j == want.size());
}

}  // namespace

TEST_CASE("quantizers and dequantizers inlined into AVX2+FMA code still match gguf-py bit for bit") {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    FAIL("this x86-64 CPU lacks AVX2/FMA; kiln's test machines have them");
  }
  check_quantize_fma<block_q4_0>();
  check_quantize_fma<block_q4_1>();
  check_quantize_fma<block_q5_0>();
  check_quantize_fma<block_q5_1>();
  check_quantize_fma<block_q8_0>();
  check_quantize_fma<block_mxfp4>();
  check_dequantize_fma<block_q4_0>();
  check_dequantize_fma<block_q4_1>();
  check_dequantize_fma<block_q5_0>();
  check_dequantize_fma<block_q5_1>();
  check_dequantize_fma<block_q8_0>();
  check_dequantize_fma<block_q2_K>();
  check_dequantize_fma<block_q3_K>();
  check_dequantize_fma<block_q4_K>();
  check_dequantize_fma<block_q5_K>();
  check_dequantize_fma<block_q6_K>();
}
#endif
