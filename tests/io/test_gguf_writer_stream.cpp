// GGUFWriter's streaming path (add_tensor_info, begin, write_tensor_data, finish: what kiln-quantize uses)
// writes the same bytes as the in-memory path, and add(key, GGUFValue) copies metadata read from a file
// exactly, nested arrays included.
#include "io_test_util.hpp"
#include "kiln/io/gguf_writer.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

io::GGUFWriter sample_writer() {
  io::GGUFWriter w(64);
  w.add("general.architecture", "llama");
  w.add("u32", uint32_t(7));
  w.add("f64", -0.5);
  w.add("flag", true);
  w.add("s", "text \xe2\x96\x81");
  w.add("arr_str", std::vector<std::string>{"a", "", "ccc"});
  w.add("arr_f32", std::vector<float>{1.5f, -2.0f});
  w.add("nested", std::vector<std::vector<int16_t>>{{1, -2}, {}, {3}});
  return w;
}

Bytes iota_bytes(std::size_t n, int start) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = std::byte(uint8_t(start + int(i) * 7));
  return b;
}

}  // namespace

TEST_CASE("GGUFWriter streaming: same bytes as to_bytes, metadata copied with add(key, GGUFValue)") {
  const Bytes t0 = iota_bytes(18 * 3, 1), t1 = iota_bytes(4 * 5, 2), t2 = iota_bytes(34 * 2, 3);
  io::GGUFWriter a = sample_writer();
  a.add_tensor("q", io::GGMLType::Q4_0, {32, 3}, t0);
  a.add_tensor("v", io::GGMLType::F32, {5}, t1);
  a.add_tensor("w", io::GGMLType::Q8_0, {32, 2}, t2);
  const Bytes want = a.to_bytes();

  const io::GGUFFile src(want, "in-memory");
  io::GGUFWriter b(src.alignment());
  for (const auto& v : src.metadata())
    if (v.key() != "general.alignment") b.add(v.key(), v);
  CHECK(b.add_tensor_info("q", io::GGMLType::Q4_0, {32, 3}) == t0.size());
  b.add_tensor("v", io::GGMLType::F32, {5}, t1);  // held data is written when its turn comes
  CHECK(b.add_tensor_info("w", io::GGMLType::Q8_0, {32, 2}) == t2.size());
  CHECK_THROWS_WITH_AS(b.to_bytes(), doctest::Contains("tensor 'q' was declared without data"), kiln::Error);
  const auto path = temp_path("stream.gguf");
  b.begin(path);
  CHECK_THROWS_WITH_AS(b.add_tensor_info("x", io::GGMLType::F32, {1}), doctest::Contains("added after begin()"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(b.write_tensor_data(t2),
                       doctest::Contains("tensor 'q': data has 68 bytes, its dims and type need 54"), kiln::Error);
  b.write_tensor_data(t0);
  CHECK_THROWS_WITH_AS(b.finish(), doctest::Contains("tensor 'w' (3 of 3) has not been written"), kiln::Error);
  b.write_tensor_data(t2);
  CHECK_THROWS_WITH_AS(b.write_tensor_data(t2), doctest::Contains("every tensor is written already"), kiln::Error);
  b.finish();
  CHECK(read_file_bytes(path) == want);

  const io::GGUFFile f(path);
  CHECK(f.get<std::vector<std::vector<int16_t>>>("nested") == std::vector<std::vector<int16_t>>{{1, -2}, {}, {3}});
  CHECK(f.get<std::string>("s") == "text \xe2\x96\x81");
  CHECK(f.alignment() == 64);

  io::GGUFWriter c;
  CHECK_THROWS_WITH_AS(c.write_tensor_data(t0), doctest::Contains("before begin()"), kiln::Error);
  CHECK_THROWS_WITH_AS(c.add("general.alignment", src.metadata().front()), doctest::Contains("set the alignment"),
                       kiln::Error);
  c.add("u32", *src.find("u32"));
  CHECK_THROWS_WITH_AS(c.add("u32", *src.find("u32")), doctest::Contains("duplicate metadata key 'u32'"), kiln::Error);
}
