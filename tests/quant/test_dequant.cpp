// Dequantization of every GGUF block type, bit for bit against gguf-py's numpy dequantizer
// (tests/fixtures/quant/dequant_*.bin: real model blocks, random bytes, extreme f16 scales), through the
// per-block traits, the typed row function, the run-time type-id dispatch, the Tensor-level API and the
// exact path's SIMD row dequantizer (dispatch::dequant_rows, every target, row-major and interleaved).
// Equality is exact: kiln performs the same f32 operations in the same order as gguf-py (dequant.hpp).
#include <cstring>
#include <vector>

#include "kiln/ops/dequant_matmul.hpp"
#include "quant_fixture.hpp"

using namespace kiln;

namespace {

// dispatch::dequant_rows (the exact path's SIMD dequantizer, kernels/matmul/dequant-inl.h) on every target, against
// gguf-py's values: a matrix of 37 rows of 2 blocks taken from the fixture in turn; contiguous and
// ldw = 2 blocks + 6 bytes apart (blocks not aligned to their size), all rows and sub-ranges; and the
// 16-row interleaved layout for the types that have one (two whole groups and a row-major tail; ranges
// starting and ending inside a group).
template <class B>
void check_dequant_rows_simd(const test::Records& rec, const std::vector<B>& blocks, const std::vector<float>& want) {
  constexpr std::size_t bs = dtype_traits<B>::block_size;
  constexpr uint32_t type = dtype_traits<B>::ggml_type;
  constexpr std::size_t rows = 37, k = 2 * bs, ldw = 2 * sizeof(B) + 6;
  std::vector<B> mat(rows * 2);
  std::vector<float> expect(rows * k);
  for (std::size_t i = 0; i < rows * 2; ++i) {
    mat[i] = blocks[i % rec.n];
    std::memcpy(expect.data() + i * bs, want.data() + (i % rec.n) * bs, bs * sizeof(float));
  }
  std::vector<std::byte> strided(rows * ldw);
  for (std::size_t r = 0; r < rows; ++r) std::memcpy(strided.data() + r * ldw, mat.data() + 2 * r, 2 * sizeof(B));
  std::vector<B> inter;
  if constexpr (kernels::qmm_interleavable_v<B>) {
    inter.resize(rows * 2);
    kernels::qmm_interleave_rows(mat.data(), rows, 2, inter.data());
  }
  test::for_each_target([&](const std::string&) {
    auto check = [&](const void* w, std::size_t ld, bool interleaved, std::size_t r0, std::size_t cnt) {
      INFO("ldw ", ld, interleaved ? " interleaved" : "", ", rows ", r0, "..", r0 + cnt, " of ", rows);
      std::vector<float> got(cnt * k, -1.f);
      dispatch::dequant_rows(type, w, rows, ld, interleaved, r0, cnt, k, got.data());
      const std::size_t j = test::first_bit_difference(got.data(), expect.data() + r0 * k, got.size());
      if (j < got.size())
        CHECK_MESSAGE(false, "row ", r0 + j / k, " value ", j % k, ": got ", got[j], " want ", expect[r0 * k + j]);
    };
    check(mat.data(), 2 * sizeof(B), false, 0, rows);
    check(strided.data(), ldw, false, 0, rows);
    check(strided.data(), ldw, false, 1, rows - 2);
    if (!inter.empty())
      for (const auto& [r0, cnt] :
           {std::pair<std::size_t, std::size_t>{0, rows}, {3, 15}, {5, 30}, {16, 21}, {20, 8}, {13, 3}, {33, 4}})
        check(inter.data(), 2 * sizeof(B), true, r0, cnt);
  });
}

template <class B>
void check_dequant_fixture() {
  constexpr std::size_t bs = dtype_traits<B>::block_size;
  const std::string name(dtype_name<B>);
  INFO("type ", name);
  const auto rec = test::read_records("dequant_" + name, sizeof(B), bs * 4);
  std::vector<B> blocks(rec.n);
  std::memcpy(blocks.data(), rec.in.data(), rec.in.size());
  const auto want = test::as_floats(rec.out.data(), rec.n * bs);

  // One block at a time through quant_traits.
  std::vector<float> got(rec.n * bs);
  for (std::size_t i = 0; i < rec.n; ++i) quant_traits<B>::dequantize(blocks[i], got.data() + i * bs);
  for (std::size_t i = 0; i < rec.n; ++i) {
    const std::size_t j = test::first_bit_difference(got.data() + i * bs, want.data() + i * bs, bs);
    INFO("block ", rec.note(i), ", element ", j);
    if (j < bs) CHECK_MESSAGE(false, "got ", got[i * bs + j], " want ", want[i * bs + j]);
  }

  // The whole row, typed and by GGUF type id (from unaligned-to-the-row but block-aligned bytes).
  std::vector<float> row(rec.n * bs, -1.f), byid(rec.n * bs, -1.f);
  dequantize_row(blocks.data(), row.data(), row.size());
  dequantize_row(dtype_traits<B>::ggml_type, blocks.data(), byid.data(), byid.size());
  CHECK(ggml_row_bytes(dtype_traits<B>::ggml_type, rec.n * bs) == rec.n * sizeof(B));
  CHECK(test::first_bit_difference(row.data(), want.data(), want.size()) == want.size());
  CHECK(test::first_bit_difference(byid.data(), want.data(), want.size()) == want.size());

  // Tensor API: (rows, blocks per row) -> (rows, values per row), threaded.
  if (rec.n % 2 == 0) {
    ThreadPool pool(2);
    std::vector<float> t(rec.n * bs, -1.f);
    dequantize(make_tensor<const B>(blocks.data(), 2, rec.n / 2), make_tensor(t.data(), 2, rec.n / 2 * bs), &pool);
    CHECK(test::first_bit_difference(t.data(), want.data(), want.size()) == want.size());
  }
  check_dequant_rows_simd<B>(rec, blocks, want);
}

template <class S>
void check_scalar_fixture(io::GGMLType type) {
  const std::string name(dtype_name<S>);
  INFO("type ", name);
  const auto rec = test::read_records("dequant_" + name, 2, 4);
  std::vector<S> src(rec.n);
  std::memcpy(src.data(), rec.in.data(), rec.in.size());
  const auto want = test::as_floats(rec.out.data(), rec.n);
  std::vector<float> got(rec.n), byid(rec.n);
  dequantize_row(src.data(), got.data(), rec.n);
  dequantize_row(type, src.data(), byid.data(), rec.n);
  const std::size_t j = test::first_bit_difference(got.data(), want.data(), rec.n);
  INFO("bits ", j < rec.n ? src[j].bits : 0);
  CHECK(j == rec.n);
  CHECK(test::first_bit_difference(byid.data(), want.data(), rec.n) == rec.n);
}

}  // namespace

TEST_CASE("legacy blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) dequantize bit-exactly like gguf-py") {
  check_dequant_fixture<block_q4_0>();
  check_dequant_fixture<block_q4_1>();
  check_dequant_fixture<block_q5_0>();
  check_dequant_fixture<block_q5_1>();
  check_dequant_fixture<block_q8_0>();
}

TEST_CASE("K-quant blocks (Q2_K .. Q6_K) dequantize bit-exactly like gguf-py") {
  check_dequant_fixture<block_q2_K>();
  check_dequant_fixture<block_q3_K>();
  check_dequant_fixture<block_q4_K>();
  check_dequant_fixture<block_q5_K>();
  check_dequant_fixture<block_q6_K>();
}

TEST_CASE("MXFP4 blocks (gpt-oss's experts) dequantize bit-exactly like gguf-py") {
  check_dequant_fixture<block_mxfp4>();
}

TEST_CASE("F16 and BF16 rows widen to f32 bit-exactly like gguf-py; F32 rows copy") {
  check_scalar_fixture<f16>(io::GGMLType::F16);
  check_scalar_fixture<bf16>(io::GGMLType::BF16);
  // Tensor level: f32 -> f16/bf16 -> f32 is the identity on values the narrow type holds exactly.
  std::vector<float> v{0.5f, -2.f, 256.f, 0.f, -0.f, 1.f / 1024, 3.f, -7.5f};
  std::vector<f16> h(8);
  std::vector<bf16> bh(8);
  std::vector<float> back(8), backb(8);
  quantize(make_tensor<const float>(v.data(), 2, 4), make_tensor(h.data(), 2, 4));
  quantize(make_tensor<const float>(v.data(), 2, 4), make_tensor(bh.data(), 2, 4));
  dequantize(make_tensor<const f16>(h.data(), 2, 4), make_tensor(back.data(), 2, 4));
  dequantize(make_tensor<const bf16>(bh.data(), 2, 4), make_tensor(backb.data(), 2, 4));
  CHECK(std::memcmp(v.data(), back.data(), 32) == 0);
  CHECK(std::memcmp(v.data(), backb.data(), 32) == 0);
  const std::vector<float> x{1.f, -0.f, 3.5e-42f, std::numeric_limits<float>::infinity()};
  std::vector<float> y(4);
  dequantize_row(io::GGMLType::F32, x.data(), y.data(), 4);
  CHECK(std::memcmp(x.data(), y.data(), 16) == 0);
}

TEST_CASE("Q8_K dequantizes to d * q (gguf-py has no Q8_K; checked against the definition)") {
  block_q8_K b{};
  b.d = 0.0123f;
  for (std::size_t j = 0; j < QK_K; ++j) b.qs[j] = int8_t(int(j * 37 % 255) - 127);
  std::vector<float> y(QK_K);
  quant_traits<block_q8_K>::dequantize(b, y.data());
  for (std::size_t j = 0; j < QK_K; ++j) CHECK(y[j] == b.d * float(b.qs[j]));  // one rounding, exact
}

TEST_CASE("dequantize rejects shape mismatches, partial blocks and unknown types") {
  std::vector<block_q8_0> blocks(4);
  std::vector<float> out(128);
  CHECK_THROWS_WITH_AS(dequantize(make_tensor<const block_q8_0>(blocks.data(), 2, 2), make_tensor(out.data(), 2, 63)),
                       doctest::Contains("kiln::dequantize: out f32(2, 63) must have src's shape q8_0(2, 2)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(dequantize_row(blocks.data(), out.data(), 33), doctest::Contains("not a whole number of q8_0"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(dequantize_row(io::GGMLType::IQ2_XXS, blocks.data(), out.data(), 256),
                       doctest::Contains("unsupported GGUF tensor type iq2_xxs (16)"), FormatError);
  CHECK_THROWS_AS(dequantize_row(io::GGMLType::Q4_K, blocks.data(), out.data(), 255), ShapeError);
}

TEST_CASE("scales_mins_k4 unpacks what get_scale_min_k4 does, for every value of every packed byte") {
  // Each of the 12 bytes takes every value 0..255 while the others hold a fixed random pattern.
  uint8_t q[12] = {0x9d, 0x31, 0xe4, 0x07, 0x5a, 0xc8, 0x72, 0xff, 0x13, 0xab, 0x40, 0x6e};
  std::size_t cases = 0;
  for (std::size_t pos = 0; pos < 12; ++pos) {
    const uint8_t keep = q[pos];
    for (int v = 0; v < 256; ++v) {
      q[pos] = static_cast<uint8_t>(v);
      uint8_t sc[8], mn[8];
      kiln::detail::scales_mins_k4(q, sc, mn);
      for (std::size_t j = 0; j < 8; ++j) {
        uint8_t rs, rm;
        kiln::detail::get_scale_min_k4(j, q, rs, rm);
        if (sc[j] != rs || mn[j] != rm) FAIL("byte ", pos, " = ", v, ", sub-block ", j);
        ++cases;
      }
    }
    q[pos] = keep;
  }
  CHECK(cases == 12 * 256 * 8);
}
