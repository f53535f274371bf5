// GGUF tensors: infos, kiln-order shapes, zero-copy typed views (F32/F16/BF16/I8/I32), raw views of
// quantized types, view_blocks, and the ggml type table.
#include "io_test_util.hpp"
#include "kiln/io/gguf_writer.hpp"

using namespace kiln;
using namespace kiln::test;
using io::GGMLType;

namespace {
// A stand-in for a quantization block: Q8_0's geometry (32 weights in 34 bytes).
struct TestBlockQ8 {
  uint16_t d;
  int8_t qs[32];
};
}  // namespace

template <>
struct kiln::dtype_traits<TestBlockQ8> {
  static constexpr bool is_dtype = true;
  static constexpr bool is_block = true;
  static constexpr std::size_t block_size = 32;
  static constexpr std::size_t block_bytes = sizeof(TestBlockQ8);
  static constexpr std::string_view name = "test_q8";
};
static_assert(sizeof(TestBlockQ8) == 34, "test block must be packed like ggml's block_q8_0");

TEST_CASE("GGUF tensors: shapes are ne reversed, views are zero-copy and hold the written values") {
  const auto v = random_floats(6 * 5, 1);
  std::vector<f16> h(4 * 3);
  std::vector<bf16> b(2 * 8);
  std::vector<int8_t> i8{-128, -1, 0, 1, 127};
  std::vector<int32_t> i32(2 * 3 * 4);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = f16(float(i) * 0.5f - 2.f);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = bf16(float(i) * -1.25f);
  for (std::size_t i = 0; i < i32.size(); ++i) i32[i] = int32_t(i * 1000003 % 2001) - 1000;

  io::GGUFWriter w;
  w.add("general.architecture", "t");
  w.add_tensor("m.f32", make_tensor(v.data(), 6, 5));  // (6, 5): ne = [5, 6]
  w.add_tensor("m.f16", make_tensor(static_cast<const f16*>(h.data()), 4, 3));
  w.add_tensor("m.bf16", make_tensor(static_cast<const bf16*>(b.data()), 2, 8));
  w.add_tensor("v.i8", make_tensor(static_cast<const int8_t*>(i8.data()), 5));
  w.add_tensor("t.i32", make_tensor(static_cast<const int32_t*>(i32.data()), 2, 3, 4));
  const auto path = temp_path("tensors.gguf");
  w.write(path);

  for (auto mode : {io::LoadMode::map, io::LoadMode::read}) {
    io::GGUFFile f(path, mode);
    REQUIRE(f.tensors().size() == 5);
    const auto& t = f.tensor("m.f32");
    CHECK(t.type == GGMLType::F32);
    CHECK(t.n_dims == 2);
    CHECK(t.ne == std::array<uint64_t, 4>{5, 6, 1, 1});
    CHECK(t.rank() == 2);
    CHECK(t.extent(0) == 6);
    CHECK(t.extent(1) == 5);
    CHECK(t.shape().str() == "(6, 5)");
    CHECK(t.n_elements == 30);
    CHECK(t.n_bytes == 120);
    CHECK(t.rows() == 6);
    CHECK(t.row_length() == 5);
    CHECK(t.row_bytes() == 20);
    // Zero-copy: the data pointer is the file's bytes at data_offset + offset.
    CHECK(t.data.data() == f.bytes().data() + f.data_offset() + t.offset);
    auto m = f.view<float, 2>("m.f32");
    CHECK(m.data() == reinterpret_cast<const float*>(t.data.data()));
    REQUIRE(m.extent(0) == 6);
    REQUIRE(m.extent(1) == 5);
    for (std::size_t r = 0; r < 6; ++r)
      for (std::size_t c = 0; c < 5; ++c) CHECK(m(r, c) == v[r * 5 + c]);
    // Other ranks: leading 1s added, or dropped when they are 1.
    auto m3 = f.view<float, 3>("m.f32");
    CHECK((m3.extent(0) == 1 && m3.extent(1) == 6 && m3.extent(2) == 5));
    CHECK_THROWS_WITH_AS((f.view<float, 1>("m.f32")),
                         doctest::Contains("tensor 'm.f32' has shape (6, 5) which cannot be viewed with rank 1"),
                         ShapeError);
    auto hv = f.view<f16, 2>("m.f16");
    CHECK((hv.extent(0) == 4 && hv.extent(1) == 3));
    for (std::size_t i = 0; i < h.size(); ++i) CHECK(hv(i / 3, i % 3) == h[i]);
    auto bv = f.view<bf16, 2>("m.bf16");
    for (std::size_t i = 0; i < b.size(); ++i) CHECK(bv(i / 8, i % 8) == b[i]);
    auto iv = f.view<int8_t, 1>("v.i8");
    for (std::size_t i = 0; i < i8.size(); ++i) CHECK(iv(i) == i8[i]);
    auto tv = f.view<int32_t, 3>("t.i32");
    CHECK(f.tensor("t.i32").ne == std::array<uint64_t, 4>{4, 3, 2, 1});
    for (std::size_t i = 0; i < i32.size(); ++i) CHECK(tv(i / 12, i / 4 % 3, i % 4) == i32[i]);
    CHECK(reinterpret_cast<std::uintptr_t>(tv.data()) % 32 == 0);  // offsets are aligned to 32
    // Wrong dtype, missing tensor.
    CHECK_THROWS_WITH_AS((f.view<f16, 2>("m.f32")), doctest::Contains("tensor 'm.f32' has type f32, expected f16"),
                         FormatError);
    CHECK_THROWS_WITH_AS(f.tensor("nope"), doctest::Contains("tensor 'nope' not found"), FormatError);
    CHECK(f.find_tensor("nope") == nullptr);
  }
}

TEST_CASE("GGUF tensors: quantized tensors expose raw blocks and block views") {
  // Q8_0 (N = 3 rows of K = 64): 2 blocks of 34 bytes per row. Q4_K: one row of 512, 2 x 144 bytes.
  Bytes q8(3 * 2 * 34), q4k(2 * 144);
  for (std::size_t i = 0; i < q8.size(); ++i) q8[i] = std::byte(i * 13 & 0xff);
  for (std::size_t i = 0; i < q4k.size(); ++i) q4k[i] = std::byte(i * 29 & 0xff);
  io::GGUFWriter w;
  w.add_tensor("q8", GGMLType::Q8_0, {64, 3}, q8);
  w.add_tensor("q4k", GGMLType::Q4_K, {512}, q4k);
  const Bytes file = w.to_bytes();
  const auto f = parse_gguf(file);
  const auto& t = f.tensor("q8");
  CHECK(t.type == GGMLType::Q8_0);
  CHECK(t.type_info().block_size == 32);
  CHECK(t.type_info().type_size == 34);
  CHECK(t.n_elements == 192);
  CHECK(t.n_bytes == q8.size());
  CHECK(t.rows() == 3);
  CHECK(t.row_bytes() == 68);
  CHECK(t.shape().str() == "(3, 64)");
  CHECK(std::memcmp(t.data.data(), q8.data(), q8.size()) == 0);
  auto blocks = t.view_blocks<TestBlockQ8>();
  CHECK((blocks.extent(0) == 3 && blocks.extent(1) == 2));
  CHECK(reinterpret_cast<const std::byte*>(&blocks(2, 1)) == t.data.data() + 2 * 68 + 34);
  CHECK(blocks(1, 0).qs[0] == static_cast<int8_t>(std::to_integer<uint8_t>(q8[68 + 2])));
  CHECK_THROWS_WITH_AS(
      f.tensor("q4k").view_blocks<TestBlockQ8>(),
      doctest::Contains("has type q4_K (256 elements in 144 bytes), which is not the block type test_q8"), FormatError);
  CHECK_THROWS_WITH_AS((t.view<float, 2>()), doctest::Contains("tensor 'q8' has type q8_0, expected f32"), FormatError);
  CHECK(f.tensor("q4k").n_bytes == 288);
}

TEST_CASE("GGUF tensors: a view of misaligned caller-owned bytes is refused, raw bytes still work") {
  std::vector<float> x{1, 2, 3, 4};
  io::GGUFWriter w;
  w.add_tensor("x", make_tensor(static_cast<const float*>(x.data()), 4));
  const Bytes file = w.to_bytes();
  Bytes shifted(file.size() + 1);
  std::memcpy(shifted.data() + 1, file.data(), file.size());
  const auto f = io::GGUFFile(std::span<const std::byte>(shifted).subspan(1), "shifted.gguf");
  CHECK(f.tensor("x").n_bytes == 16);
  CHECK_THROWS_WITH_AS((f.view<float, 1>("x")), doctest::Contains("is not aligned to 4 bytes for f32"), FormatError);
}

TEST_CASE("ggml type table: ids, names and block geometry") {
  using io::ggml_type_info;
  CHECK(static_cast<uint32_t>(GGMLType::Q4_0) == 2);
  CHECK(static_cast<uint32_t>(GGMLType::Q8_0) == 8);
  CHECK(static_cast<uint32_t>(GGMLType::Q2_K) == 10);
  CHECK(static_cast<uint32_t>(GGMLType::Q8_K) == 15);
  CHECK(static_cast<uint32_t>(GGMLType::BF16) == 30);
  CHECK(io::ggml_type_name(GGMLType::Q6_K) == "q6_K");
  CHECK(io::ggml_type_name(GGMLType(5)) == "unknown");
  CHECK_FALSE(io::is_known_ggml_type(9999));
  CHECK(ggml_type_info(GGMLType::F32).quantized == false);
  CHECK(ggml_type_info(GGMLType::IQ4_XS).quantized == true);
  // The full table against gguf-py's GGML_QUANT_SIZES is checked in test_gguf_reference.cpp.
}
