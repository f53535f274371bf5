// Block structs: sizes and traits agree with ggml's (and gguf-py's GGML_QUANT_SIZES), checked at compile
// time; the field offsets are the ones the GGUF layout fixes; block views work as Tensors.
#include <cstddef>
#include <type_traits>

#include "kiln/quant/convert.hpp"
#include "test_util.hpp"

using namespace kiln;

namespace {

// (block type, elements per block, bytes per block, ggml type id): the values from ggml-common.h / gguf-py
// constants.py (Q8_K: 4 + 256 + 32), and io/ggml_types.hpp's table agrees.
template <class B, std::size_t N, std::size_t Bytes, uint32_t Id>
constexpr bool traits_agree() {
  using T = dtype_traits<B>;
  return T::is_dtype && T::is_block && T::block_size == N && T::block_bytes == Bytes && sizeof(B) == Bytes &&
         static_cast<uint32_t>(T::ggml_type) == Id && io::ggml_type_info(T::ggml_type).type_size == Bytes &&
         std::is_trivially_copyable_v<B> && std::is_standard_layout_v<B> && quant_traits<B>::is_quant && DType<B> &&
         BlockDType<B> && Dequantizable<B>;
}
static_assert(traits_agree<block_q4_0, 32, 18, 2>(), "q4_0");
static_assert(traits_agree<block_q4_1, 32, 20, 3>(), "q4_1");
static_assert(traits_agree<block_q5_0, 32, 22, 6>(), "q5_0");
static_assert(traits_agree<block_q5_1, 32, 24, 7>(), "q5_1");
static_assert(traits_agree<block_q8_0, 32, 34, 8>(), "q8_0");
static_assert(traits_agree<block_q2_K, 256, 84, 10>(), "q2_K");
static_assert(traits_agree<block_q3_K, 256, 110, 11>(), "q3_K");
static_assert(traits_agree<block_q4_K, 256, 144, 12>(), "q4_K");
static_assert(traits_agree<block_q5_K, 256, 176, 13>(), "q5_K");
static_assert(traits_agree<block_q6_K, 256, 210, 14>(), "q6_K");
static_assert(traits_agree<block_q8_K, 256, 292, 15>(), "q8_K");

static_assert(Quantizable<block_q4_0> && Quantizable<block_q4_1> && Quantizable<block_q5_0> &&
                  Quantizable<block_q5_1> && Quantizable<block_q8_0> && Quantizable<block_q4_K> &&
                  Quantizable<block_q8_K> && Quantizable<block_mxfp4>,
              "kiln quantizes into these");
static_assert(!Quantizable<block_q2_K> && !Quantizable<block_q6_K> && !BlockDType<float> && !Dequantizable<f16>,
              "and not into these");

// Field offsets fixed by the file format (ggml-common.h).
static_assert(offsetof(block_q4_1, m) == 2 && offsetof(block_q4_1, qs) == 4, "q4_1 layout");
static_assert(offsetof(block_q5_0, qh) == 2 && offsetof(block_q5_0, qs) == 6, "q5_0 layout");
static_assert(offsetof(block_q5_1, qh) == 4 && offsetof(block_q5_1, qs) == 8, "q5_1 layout");
static_assert(offsetof(block_q2_K, qs) == 16 && offsetof(block_q2_K, d) == 80 && offsetof(block_q2_K, dmin) == 82,
              "q2_K layout");
static_assert(offsetof(block_q3_K, qs) == 32 && offsetof(block_q3_K, scales) == 96 && offsetof(block_q3_K, d) == 108,
              "q3_K layout");
static_assert(offsetof(block_q4_K, scales) == 4 && offsetof(block_q4_K, qs) == 16, "q4_K layout");
static_assert(offsetof(block_q5_K, qh) == 16 && offsetof(block_q5_K, qs) == 48, "q5_K layout");
static_assert(offsetof(block_q6_K, qh) == 128 && offsetof(block_q6_K, scales) == 192 && offsetof(block_q6_K, d) == 208,
              "q6_K layout");
static_assert(offsetof(block_q8_K, qs) == 4 && offsetof(block_q8_K, bsums) == 260, "q8_K layout");

}  // namespace

TEST_CASE("block views are Tensors: extents count blocks, names in shape errors") {
  std::vector<block_q4_K> w(6);
  auto t = make_tensor<const block_q4_K>(w.data(), 2, 3);  // (rows, blocks per row): 2 x 768 weights
  CHECK(t.size() == 6);
  CHECK(&t(1, 2) == &w[5]);
  CHECK(detail::shape_str(t) == "q4_K(2, 3)");
  CHECK(dtype_name<const block_q6_K> == "q6_K");
  CHECK(block_size_v<block_q8_0> == 32);
}

TEST_CASE("ggml_row_bytes matches block sizes for every supported type") {
  CHECK(ggml_row_bytes(ggml_type_id::F32, 10) == 40);
  CHECK(ggml_row_bytes(ggml_type_id::F16, 10) == 20);
  CHECK(ggml_row_bytes(io::GGMLType::BF16, 10) == 20);
  CHECK(ggml_row_bytes(ggml_type_id::Q4_0, 64) == 36);
  CHECK(ggml_row_bytes(ggml_type_id::Q4_1, 576) == 360);  // SmolLM2's ffn_gate row
  CHECK(ggml_row_bytes(ggml_type_id::Q5_0, 640) == 440);  // Gemma 3's attn_q row
  CHECK(ggml_row_bytes(ggml_type_id::Q8_0, 576) == 612);  // SmolLM2's token_embd row
  CHECK(ggml_row_bytes(ggml_type_id::Q4_K, 1024) == 576);
  CHECK(ggml_row_bytes(ggml_type_id::Q6_K, 2048) == 1680);
  CHECK(ggml_row_bytes(ggml_type_id::Q8_K, 256) == 292);
  CHECK_THROWS_WITH_AS(ggml_row_bytes(io::GGMLType::Q8_1, 32),
                       doctest::Contains("unsupported GGUF tensor type q8_1 (9)"),
                       FormatError);  // an activation format, not a storage type kiln reads
  CHECK_THROWS_AS(ggml_row_bytes(ggml_type_id::Q4_K, 255), FormatError);
}
