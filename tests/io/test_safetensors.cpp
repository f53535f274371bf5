// safetensors: the `safetensors` package's file read back exactly, zero-copy typed views, hostile
// headers (each with its message), and sharded checkpoints via model.safetensors.index.json.
#include <cmath>
#include <fstream>

#include "io_test_util.hpp"
#include "kiln/io/safetensors.hpp"

using namespace kiln;
using namespace kiln::test;
using io::json;

namespace {

/// A safetensors file: header length, the header text as given (possibly invalid), `data` bytes.
Bytes make_st_raw(std::string_view header, std::size_t data_bytes) {
  ByteWriter w;
  w.u64(header.size()).raw(header);
  for (std::size_t i = 0; i < data_bytes; ++i) w.u8(static_cast<uint8_t>(i * 11 + 1));
  return w.b;
}
/// The header padded with spaces to a multiple of 8 bytes, as the reference writer does, so the buffer
/// (and F32 data in it) is aligned.
Bytes make_st(const json& header, std::size_t data_bytes) {
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');
  return make_st_raw(h, data_bytes);
}

json entry(std::string dtype, std::vector<uint64_t> shape, uint64_t b, uint64_t e) {
  return json{{"dtype", dtype}, {"shape", shape}, {"data_offsets", {b, e}}};
}

/// Two F32 tensors: "a" (2, 3) at [0, 24) and "b" (4) at [24, 40).
json valid_header() {
  return json{{"a", entry("F32", {2, 3}, 0, 24)}, {"b", entry("F32", {4}, 24, 40)}, {"__metadata__", {{"k", "v"}}}};
}

io::SafetensorsFile parse_st(const Bytes& b, std::string name = "evil.safetensors") {
  return io::SafetensorsFile(std::span<const std::byte>(b), std::move(name));
}

#define CHECK_ST_ERROR(bytes, text) CHECK_THROWS_WITH_AS((void)parse_st(bytes), doctest::Contains(text), FormatError)

}  // namespace

TEST_CASE("safetensors: the safetensors package's file reads back exactly") {
  std::ifstream jf(io_fixture("small_safetensors.json"));
  const json ref = json::parse(jf);
  for (auto mode : {io::LoadMode::map, io::LoadMode::read}) {
    const io::SafetensorsFile f(io_fixture("small.safetensors"), mode);
    CHECK(f.header_size() == ref["header_size"].get<uint64_t>());
    REQUIRE(f.metadata().size() == ref["metadata"].size());
    for (const auto& [k, v] : ref["metadata"].items()) CHECK(f.metadata().at(k) == v.get<std::string>());
    REQUIRE(f.tensors().size() == ref["tensors"].size());
    for (std::size_t i = 0; i < f.tensors().size(); ++i) {
      const auto& t = f.tensors()[i];
      const auto& want = ref["tensors"][i];
      CAPTURE(want["name"].get<std::string>());
      CHECK(t.name == want["name"].get<std::string>());  // sorted by name, like the fixture
      CHECK(io::safetensors_dtype_info(t.dtype).name == want["dtype"].get<std::string>());
      const auto shape = want["shape"].get<std::vector<uint64_t>>();
      REQUIRE(t.rank() == shape.size());
      for (std::size_t r = 0; r < shape.size(); ++r) CHECK(t.extent(r) == shape[r]);
      CHECK(t.begin == want["data_offsets"][0].get<uint64_t>());
      CHECK(t.end == want["data_offsets"][1].get<uint64_t>());
      CHECK(t.data.data() == f.bytes().data() + f.data_offset() + t.begin);  // zero-copy
      CHECK(crc32(t.data) == want["crc32"].get<uint32_t>());
    }
    // Typed views with the values the package wrote (checked through their float64 sums: exact for
    // these few small values, which sum in double without rounding error far below 1e-12).
    const auto a = f.view<float, 2>("a.f32");
    CHECK((a.extent(0) == 3 && a.extent(1) == 5));
    double s = 0;
    for (std::size_t r = 0; r < 3; ++r)
      for (std::size_t c = 0; c < 5; ++c) s += a(r, c);
    CHECK(std::fabs(s - ref["tensors"][0]["fsum"].get<double>()) < 1e-12);
    const auto b = f.view<f16, 3>("b.f16");
    double sb = 0;
    for (std::size_t i = 0; i < 12; ++i) sb += float(b(i / 6, i / 3 % 2, i % 3));
    CHECK(std::fabs(sb - ref["tensors"][1]["fsum"].get<double>()) < 1e-12);
    CHECK(f.view<float, 1>("g.scalar")(0) == 2.5f);  // rank-0 tensors view as (1)
    CHECK(f.tensor("h.empty").data.empty());
    CHECK(f.view<int8_t, 2>("d.i8").extent(1) == 9);
    CHECK(f.view<int32_t, 2>("e.i32").extent(0) == 5);
    CHECK_THROWS_WITH_AS((f.view<float, 1>("c.f64")), doctest::Contains("tensor 'c.f64' has dtype F64, expected F32"),
                         FormatError);
    CHECK_THROWS_WITH_AS(f.tensor("zz"), doctest::Contains("tensor 'zz' not found"), FormatError);
  }
}

TEST_CASE("safetensors: a hand-made valid file and its metadata") {
  const Bytes b = make_st(valid_header(), 40);
  const auto f = parse_st(b, "ok.safetensors");
  CHECK(f.metadata().at("k") == "v");
  const auto a = f.view<float, 2>("a");
  float want[6];
  std::memcpy(want, b.data() + f.data_offset(), 24);
  for (int i = 0; i < 6; ++i) CHECK(a(i / 3, i % 3) == want[i]);
  CHECK(f.tensor("b").data.data() == b.data() + f.data_offset() + 24);
  // Gaps between tensors are allowed; trailing padding in the header (spaces) too.
  const auto g = make_st_raw(json{{"x", entry("I8", {2}, 10, 12)}}.dump() + "    ", 20);
  CHECK(parse_st(g).tensor("x").data.size() == 2);
}

TEST_CASE("safetensors hostile: header length and JSON") {
  CHECK_THROWS_WITH_AS((void)parse_st(Bytes{}, "e.safetensors"),
                       "kiln: safetensors file 'e.safetensors': truncated: the header length needs 8 bytes at offset 0 "
                       "but only 0 remain (file size 0)",
                       FormatError);
  Bytes b = make_st(valid_header(), 40);
  Bytes big = b;
  const uint64_t huge = 1ull << 62;
  std::memcpy(big.data(), &huge, 8);
  CHECK_ST_ERROR(big, "header length 4611686018427387904 exceeds the");
  CHECK_ST_ERROR(make_st_raw("{\"a\": ", 0), "invalid JSON");
  CHECK_ST_ERROR(make_st_raw("", 0), "invalid JSON");
  CHECK_ST_ERROR(make_st_raw("[1, 2]", 0), "the header is a JSON array, expected an object");
  CHECK_ST_ERROR(make_st_raw("{\"a\": 1, \"a\": 2}", 0), "duplicate JSON key 'a'");
  CHECK_ST_ERROR(make_st_raw(std::string(100, '[') + std::string(100, ']'), 0), "JSON nested deeper than 64 levels");
  CHECK_ST_ERROR(make_st_raw("{\"a\": \"\xff\"}", 0), "invalid JSON");  // not UTF-8
  CHECK_ST_ERROR(make_st(json{{"__metadata__", {{"k", 1}}}}, 0),
                 "__metadata__ key 'k' is a JSON number (integer), expected a string");
  CHECK_ST_ERROR(make_st(json{{"__metadata__", "x"}}, 0), "__metadata__ is a JSON string, expected an object");
}

TEST_CASE("safetensors hostile: tensor entries") {
  auto with = [](const json& e, std::size_t data = 40) {
    json h = valid_header();
    h["t"] = e;
    return make_st(h, data);
  };
  CHECK_ST_ERROR(with(json(3)), "tensor 't' is a JSON number (integer), expected an object");
  CHECK_ST_ERROR(with(json{{"shape", {1}}, {"data_offsets", {0, 4}}}), "tensor 't' has no dtype");
  CHECK_ST_ERROR(with(entry("F33", {1}, 0, 4)), "tensor 't' has unknown dtype 'F33'");
  CHECK_ST_ERROR(with(json{{"dtype", 5}, {"shape", {1}}, {"data_offsets", {0, 4}}}),
                 "tensor 't' dtype is a JSON number");
  CHECK_ST_ERROR(with(json{{"dtype", "F32"}, {"data_offsets", {0, 4}}}), "tensor 't' has no shape");
  CHECK_ST_ERROR(with(json{{"dtype", "F32"}, {"shape", {-1}}, {"data_offsets", {0, 4}}}),
                 "tensor 't' shape [-1] has an entry that is not a non-negative integer");
  CHECK_ST_ERROR(with(json{{"dtype", "F32"}, {"shape", {1.5}}, {"data_offsets", {0, 4}}}),
                 "has an entry that is not a non-negative integer");
  CHECK_ST_ERROR(with(entry("F32", {1ull << 32, 1ull << 32}, 0, 4)),
                 "tensor 't' shape [4294967296,4294967296] overflows");
  CHECK_ST_ERROR(with(entry("F32", {1ull << 62}, 0, 4)), "needs more than 2^64");
  CHECK_ST_ERROR(with(entry("F32", {1, 1, 1, 1, 1, 1, 1, 1, 1}, 0, 4)), "shape has 9 dimensions (at most 8 supported)");
  CHECK_ST_ERROR(with(json{{"dtype", "F32"}, {"shape", {1}}}), "tensor 't' has no data_offsets");
  CHECK_ST_ERROR(with(json{{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0}}}),
                 "tensor 't' data_offsets [0] is not an array of two offsets");
  CHECK_ST_ERROR(with(json{{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, -4}}}),
                 "data_offsets [0,-4] are not non-negative integers");
  CHECK_ST_ERROR(with(entry("F32", {1}, 8, 4)), "tensor 't' data_offsets [8, 4) has begin after end");
  CHECK_ST_ERROR(with(entry("F32", {1}, 40, 44)),
                 "tensor 't' data_offsets [40, 44) is out of range: the data buffer has 40 bytes");
  CHECK_ST_ERROR(with(entry("F32", {1}, ~0ull - 3, ~0ull)), "is out of range");
  CHECK_ST_ERROR(with(entry("F32", {3}, 0, 8)),
                 "tensor 't' data_offsets [0, 8) span 8 bytes but dtype F32 x shape (3) needs 12");
  CHECK_ST_ERROR(with(entry("BF16", {2}, 20, 24)), "tensors 'a' data_offsets [0, 24) and 't' [20, 24) overlap");
  CHECK_ST_ERROR(with(entry("I8", {1}, 24, 25)), "tensors 'b' data_offsets [24, 40) and 't' [24, 25) overlap");
  CHECK_NOTHROW((void)parse_st(with(entry("I8", {0}, 24, 24))));  // empty: no bytes to overlap
}

TEST_CASE("safetensors hostile: every truncation of a valid file is an error") {
  const Bytes full = make_st(valid_header(), 40);
  CHECK_NOTHROW((void)parse_st(full));
  for (std::size_t n = 0; n < full.size(); ++n) {
    CAPTURE(n);
    const Bytes cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK_THROWS_AS((void)parse_st(cut), FormatError);
  }
}

TEST_CASE("safetensors: sharded checkpoints through model.safetensors.index.json") {
  const auto dir = temp_path("sharded");
  std::filesystem::create_directories(dir);
  const Bytes s1 = make_st(json{{"x", entry("F32", {2}, 0, 8)}, {"y", entry("I32", {1}, 8, 12)}}, 12);
  const Bytes s2 = make_st(json{{"z", entry("F32", {2, 2}, 0, 16)}, {"unlisted", entry("I8", {1}, 16, 17)}}, 17);
  write_file(dir / "model-00001-of-00002.safetensors", s1);
  write_file(dir / "model-00002-of-00002.safetensors", s2);
  const json index{{"metadata", {{"total_size", 28}}},
                   {"weight_map",
                    {{"x", "model-00001-of-00002.safetensors"},
                     {"y", "model-00001-of-00002.safetensors"},
                     {"z", "model-00002-of-00002.safetensors"}}}};
  write_file(dir / "model.safetensors.index.json", index.dump());
  for (const auto& p : {dir, dir / "model.safetensors.index.json"}) {
    const io::SafetensorsCheckpoint ck(p);
    CHECK(ck.files().size() == 2);
    CHECK(ck.size() == 3);
    CHECK(ck.tensor_names() == std::vector<std::string_view>{"x", "y", "z"});
    CHECK(ck.index_metadata()["total_size"] == 28);
    float want[4];
    std::memcpy(want, s2.data() + 8 + (s2.size() - 8 - 17), 16);
    const auto z = ck.view<float, 2>("z");
    for (int i = 0; i < 4; ++i) CHECK(z(i / 2, i % 2) == want[i]);
    CHECK(ck.tensor("y").dtype == io::SafetensorsDType::I32);
    CHECK(ck.find_tensor("unlisted") == nullptr);  // the index is authoritative
    CHECK_THROWS_WITH_AS(ck.tensor("w"), doctest::Contains("tensor 'w' not found"), FormatError);
  }
  // A single file and a directory holding model.safetensors.
  const auto single = temp_path("single");
  std::filesystem::create_directories(single);
  write_file(single / "model.safetensors", s1);
  CHECK(io::SafetensorsCheckpoint(single).size() == 2);
  CHECK(io::SafetensorsCheckpoint(single / "model.safetensors").tensor("x").data.size() == 8);
  CHECK_THROWS_WITH_AS(io::SafetensorsCheckpoint(temp_path("nothing_here")), doctest::Contains("No such file"),
                       kiln::Error);
}

TEST_CASE("safetensors hostile: sharded index") {
  const auto dir = temp_path("bad_index");
  std::filesystem::create_directories(dir);
  write_file(dir / "s.safetensors", make_st(json{{"x", entry("F32", {2}, 0, 8)}}, 8));
  auto check_index = [&](const json& j, const char* text) {
    write_file(dir / "model.safetensors.index.json", j.dump());
    CHECK_THROWS_WITH_AS(io::SafetensorsCheckpoint{dir}, doctest::Contains(text), FormatError);
  };
  check_index(json{{"metadata", {}}}, "no weight_map");
  check_index(json{{"weight_map", {1, 2}}}, "weight_map is a JSON array, expected an object");
  check_index(json{{"weight_map", {{"x", 3}}}}, "weight_map entry 'x' is a JSON number (integer), expected a string");
  check_index(json{{"weight_map", {{"x", "../s.safetensors"}}}},
              "weight_map entry 'x' names shard '../s.safetensors', which is not a plain file name");
  check_index(json{{"weight_map", {{"x", "/etc/passwd"}}}}, "which is not a plain file name");
  check_index(json{{"weight_map", {{"q", "s.safetensors"}}}},
              "tensor 'q' is listed for shard 's.safetensors' but that file does not contain it");
  write_file(dir / "model.safetensors.index.json",
             std::string_view("{\"weight_map\": {\"x\": \"missing.safetensors\"}}"));
  CHECK_THROWS_WITH_AS(io::SafetensorsCheckpoint{dir},
                       doctest::Contains("missing.safetensors': No such file or directory"), kiln::Error);
}
