// GGUF metadata: every value type round-trips through GGUFWriter and GGUFFile (from memory and from a
// file, mapped and loaded), typed accessors convert or refuse as documented, and misuse errors name the
// file, the key, the expected and the actual type.
#include <cmath>
#include <limits>

#include "io_test_util.hpp"
#include "kiln/io/gguf_writer.hpp"

using namespace kiln;
using namespace kiln::test;
using io::GGUFValueType;

namespace {

io::GGUFWriter all_types_writer(uint32_t alignment = 32) {
  io::GGUFWriter w(alignment);
  w.add("general.architecture", "llama");
  w.add("u8", uint8_t(250));
  w.add("i8", int8_t(-7));
  w.add("u16", uint16_t(65535));
  w.add("i16", int16_t(-32768));
  w.add("u32", uint32_t(4294967295u));
  w.add("i32", int32_t(-123456789));
  w.add("f32", 0.1f);
  w.add("bool_t", true);
  w.add("bool_f", false);
  w.add("str", std::string("tab\there \xe2\x96\x81 utf-8"));
  w.add("str_empty", "");
  w.add("u64", uint64_t(18446744073709551615ull));
  w.add("i64", int64_t(std::numeric_limits<int64_t>::min()));
  w.add("f64", 2.718281828459045);
  w.add("arr_u8", std::vector<uint8_t>{0, 1, 255});
  w.add("arr_i8", std::vector<int8_t>{-128, 127});
  w.add("arr_u16", std::vector<uint16_t>{1, 65535});
  w.add("arr_i16", std::vector<int16_t>{-1, 2});
  w.add("arr_u32", std::vector<uint32_t>{7, 8, 9});
  w.add("arr_i32", std::vector<int32_t>{-1, 0, 1});
  w.add("arr_f32", std::vector<float>{1.5f, -0.25f, 1e30f});
  w.add("arr_bool", std::vector<bool>{true, false, false, true});
  w.add("arr_str", std::vector<std::string>{"<s>", "", "\xe2\x96\x81the"});
  w.add("arr_u64", std::vector<uint64_t>{1ull << 63});
  w.add("arr_i64", std::vector<int64_t>{-(1ll << 62), 5});
  w.add("arr_f64", std::vector<double>{1e-300, -0.5});
  w.add("arr_empty", std::vector<float>{});
  w.add("arr_nested", std::vector<std::vector<int32_t>>{{1, 2}, {}, {3}});
  w.add("arr_nested_str", std::vector<std::vector<std::string>>{{"a", "b"}, {"c"}});
  w.add("arr_deep", std::vector<std::vector<std::vector<uint8_t>>>{{{1}, {2, 3}}, {{4}}});
  return w;
}

void check_all_types(const io::GGUFFile& f) {
  CHECK(f.version() == 3);
  CHECK(f.architecture() == "llama");
  CHECK(f.metadata().size() == (f.alignment() == 32 ? 31u : 32u));
  CHECK(f.get<uint8_t>("u8") == 250);
  CHECK(f.get<int8_t>("i8") == -7);
  CHECK(f.get<uint16_t>("u16") == 65535);
  CHECK(f.get<int16_t>("i16") == -32768);
  CHECK(f.get<uint32_t>("u32") == 4294967295u);
  CHECK(f.get<int32_t>("i32") == -123456789);
  CHECK(f.get<float>("f32") == 0.1f);
  CHECK(f.get<bool>("bool_t") == true);
  CHECK(f.get<bool>("bool_f") == false);
  CHECK(f.get<std::string>("str") == "tab\there \xe2\x96\x81 utf-8");
  CHECK(f.get<std::string_view>("str_empty").empty());
  CHECK(f.get<uint64_t>("u64") == 18446744073709551615ull);
  CHECK(f.get<int64_t>("i64") == std::numeric_limits<int64_t>::min());
  CHECK(f.get<double>("f64") == 2.718281828459045);
  CHECK(f.get<std::vector<uint8_t>>("arr_u8") == std::vector<uint8_t>{0, 1, 255});
  CHECK(f.get<std::vector<int8_t>>("arr_i8") == std::vector<int8_t>{-128, 127});
  CHECK(f.get<std::vector<uint16_t>>("arr_u16") == std::vector<uint16_t>{1, 65535});
  CHECK(f.get<std::vector<int16_t>>("arr_i16") == std::vector<int16_t>{-1, 2});
  CHECK(f.get<std::vector<uint32_t>>("arr_u32") == std::vector<uint32_t>{7, 8, 9});
  CHECK(f.get<std::vector<int32_t>>("arr_i32") == std::vector<int32_t>{-1, 0, 1});
  CHECK(f.get<std::vector<float>>("arr_f32") == std::vector<float>{1.5f, -0.25f, 1e30f});
  CHECK(f.get<std::vector<bool>>("arr_bool") == std::vector<bool>{true, false, false, true});
  CHECK(f.get<std::vector<std::string>>("arr_str") == std::vector<std::string>{"<s>", "", "\xe2\x96\x81the"});
  CHECK(f.get<std::vector<uint64_t>>("arr_u64") == std::vector<uint64_t>{1ull << 63});
  CHECK(f.get<std::vector<int64_t>>("arr_i64") == std::vector<int64_t>{-(1ll << 62), 5});
  CHECK(f.get<std::vector<double>>("arr_f64") == std::vector<double>{1e-300, -0.5});
  CHECK(f.get<std::vector<float>>("arr_empty").empty());
  CHECK(f.get<std::vector<std::vector<int32_t>>>("arr_nested") == std::vector<std::vector<int32_t>>{{1, 2}, {}, {3}});
  CHECK(f.get<std::vector<std::vector<std::string>>>("arr_nested_str") ==
        std::vector<std::vector<std::string>>{{"a", "b"}, {"c"}});
  CHECK(f.get<std::vector<std::vector<std::vector<uint8_t>>>>("arr_deep") ==
        std::vector<std::vector<std::vector<uint8_t>>>{{{1}, {2, 3}}, {{4}}});

  // Types as stored, element access and rendering.
  CHECK(f.value("u16").type() == GGUFValueType::UINT16);
  CHECK(f.value("arr_str").type_name() == "ARRAY[STRING]");
  CHECK(f.value("arr_nested").array_type() == GGUFValueType::ARRAY);
  CHECK(f.value("arr_nested").size() == 3);
  CHECK(f.value("arr_nested").at(2).as<std::vector<int>>() == std::vector<int>{3});
  CHECK(f.value("arr_str").at(2).as<std::string>() == "\xe2\x96\x81the");
  CHECK(f.value("arr_nested_str").to_string() == "[['a', 'b'], ['c']]");
  CHECK(f.value("arr_f32").to_string(2) == "[1.5, -0.25, ... (3 total)]");
  // Keys come back in insertion order.
  CHECK(f.metadata().front().key() == (f.alignment() == 32 ? "general.architecture" : "general.alignment"));
  CHECK(f.metadata().back().key() == "arr_deep");
}

}  // namespace

TEST_CASE("GGUF metadata: every value type round-trips (memory, mapped file, loaded file)") {
  const Bytes bytes = all_types_writer().to_bytes();
  check_all_types(parse_gguf(bytes));
  const auto path = temp_path("all_types.gguf");
  all_types_writer().write(path);
  CHECK(read_file_bytes(path) == bytes);  // write() streams the same bytes to_bytes() builds
  for (auto mode : {io::LoadMode::map, io::LoadMode::read}) {
    io::GGUFFile f(path, mode);
    CHECK(f.name() == path.string());
    check_all_types(f);
  }
}

TEST_CASE("GGUF metadata: a non-default alignment is written as general.alignment and honoured") {
  auto w = all_types_writer(64);
  std::vector<float> x(3 * 32, 0.5f);
  w.add_tensor("x", make_tensor(static_cast<const float*>(x.data()), 3, 32));
  w.add_tensor("y", make_tensor(static_cast<const float*>(x.data()), 5));  // 20 bytes: next one needs padding
  w.add_tensor("z", make_tensor(static_cast<const float*>(x.data()), 2, 2));
  const Bytes b = w.to_bytes();
  const auto f = parse_gguf(b);
  CHECK(f.alignment() == 64);
  CHECK(f.get<uint32_t>("general.alignment") == 64);
  CHECK(f.data_offset() % 64 == 0);
  CHECK(f.tensor("y").offset == 384);
  CHECK(f.tensor("z").offset == 448);
  check_all_types(f);
}

TEST_CASE("GGUF metadata: integer accessors convert between integer types only when the value fits") {
  const Bytes b = all_types_writer().to_bytes();
  const auto f = parse_gguf(b, "conv.gguf");
  CHECK(f.get<int64_t>("u32") == 4294967295ll);
  CHECK(f.get<uint64_t>("u8") == 250);
  CHECK(f.get<int>("i8") == -7);
  CHECK(f.get<std::vector<int64_t>>("arr_u32") == std::vector<int64_t>{7, 8, 9});
  CHECK(f.get<double>("f32") == double(0.1f));
  CHECK(f.get<float>("f64") == 2.718281828459045f);
  CHECK_THROWS_WITH_AS(f.get<uint8_t>("u16"),
                       doctest::Contains("metadata key 'u16': value 65535 (UINT16) is out of range for UINT8"),
                       FormatError);
  CHECK_THROWS_WITH_AS(f.get<uint32_t>("i8"), doctest::Contains("value -7 (INT8) is out of range for UINT32"),
                       FormatError);
  CHECK_THROWS_WITH_AS(f.get<int64_t>("u64"), doctest::Contains("out of range for INT64"), FormatError);
  CHECK_THROWS_WITH_AS(f.get<std::vector<uint32_t>>("arr_i32"), doctest::Contains("value -1 (INT32) is out of range"),
                       FormatError);
  CHECK(f.get<int64_t>("i64") == std::numeric_limits<int64_t>::min());
  CHECK_THROWS_WITH_AS(f.get<int32_t>("i64"),
                       doctest::Contains("-9223372036854775808 (INT64) is out of range for INT32"), FormatError);
}

TEST_CASE("GGUF metadata: a missing key or a wrong type names the file, the key and both types") {
  const Bytes b = all_types_writer().to_bytes();
  const auto f = parse_gguf(b, "models/m.gguf");
  CHECK_THROWS_WITH_AS(f.get<uint32_t>("llama.block_count"),
                       "kiln: GGUF file 'models/m.gguf': metadata key 'llama.block_count' not found (expected UINT32)",
                       FormatError);
  CHECK_THROWS_WITH_AS(f.get<uint32_t>("str"),
                       "kiln: GGUF file 'models/m.gguf': metadata key 'str' has type STRING, expected UINT32",
                       FormatError);
  CHECK_THROWS_WITH_AS(f.get<std::string>("u32"),
                       doctest::Contains("metadata key 'u32' has type UINT32, expected STRING"), FormatError);
  CHECK_THROWS_WITH_AS(f.get<float>("i32"), doctest::Contains("has type INT32, expected FLOAT32"), FormatError);
  CHECK_THROWS_WITH_AS(f.get<bool>("u8"), doctest::Contains("has type UINT8, expected BOOL"), FormatError);
  CHECK_THROWS_WITH_AS(f.get<std::vector<std::string>>("arr_f32"),
                       doctest::Contains("metadata key 'arr_f32' has type ARRAY[FLOAT32], expected ARRAY[STRING]"),
                       FormatError);
  CHECK_THROWS_WITH_AS(f.get<std::vector<float>>("f32"), doctest::Contains("has type FLOAT32, expected ARRAY[FLOAT32]"),
                       FormatError);
  CHECK_THROWS_WITH_AS(f.get<std::vector<int>>("arr_nested"),
                       doctest::Contains("has type ARRAY[ARRAY], expected ARRAY[INT32]"), FormatError);
  CHECK_THROWS_WITH_AS(f.value("arr_u8").at(3), doctest::Contains("index 3 out of range for an array of 3"),
                       FormatError);
  CHECK_THROWS_WITH_AS(f.value("u8").array_type(), doctest::Contains("has type UINT8, expected ARRAY"), FormatError);
  // find: absent -> nullopt; present with another type -> still an error.
  CHECK_FALSE(f.find("nope").has_value());
  CHECK_FALSE(f.find<uint32_t>("nope").has_value());
  CHECK(f.find<uint32_t>("u32") == 4294967295u);
  CHECK_THROWS_AS(f.find<uint32_t>("str"), FormatError);
  CHECK(f.get_or<uint32_t>("nope", 42) == 42);
  CHECK(f.get_or<uint32_t>("u16", 42) == 65535);
  CHECK(f.contains("arr_deep"));
  CHECK_FALSE(f.contains("arr_dee"));
}

TEST_CASE("GGUF metadata: BOOL bytes other than 0 and 1 are rejected when read") {
  RawGGUF g;
  g.kvs.push_back(raw_kv("flag", 7, ByteWriter{}.u8(2).b));
  const Bytes b = g.build();
  const auto f = parse_gguf(b);
  CHECK_THROWS_WITH_AS(f.get<bool>("flag"), doctest::Contains("metadata key 'flag': BOOL value 2 is neither 0 nor 1"),
                       FormatError);
}

TEST_CASE("GGUFWriter: misuse is reported") {
  io::GGUFWriter w;
  w.add("k", 1);
  CHECK_THROWS_WITH_AS(w.add("k", 2), doctest::Contains("duplicate metadata key 'k'"), kiln::Error);
  CHECK_THROWS_WITH_AS(w.add("general.alignment", 64u), doctest::Contains("set the alignment with the constructor"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(io::GGUFWriter(48), doctest::Contains("alignment 48 is not a power of two"), kiln::Error);
  std::vector<std::byte> data(18 * 2);
  w.add_tensor("q", io::GGMLType::Q4_0, {32, 2}, data);
  CHECK_THROWS_WITH_AS(w.add_tensor("q", io::GGMLType::Q4_0, {32, 2}, data), doctest::Contains("duplicate tensor name"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(w.add_tensor("r", io::GGMLType::Q4_0, {16, 2}, data),
                       doctest::Contains("row length 16 is not a multiple of the block size 32"), kiln::Error);
  CHECK_THROWS_WITH_AS(w.add_tensor("s", io::GGMLType::Q4_0, {32, 3}, data),
                       doctest::Contains("data has 36 bytes but its dims and type q4_0 need 54"), kiln::Error);
  CHECK_THROWS_WITH_AS(w.add_tensor("t", io::GGMLType(4), {32}, data), doctest::Contains("unknown ggml type 4"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(w.write(io_temp_dir() / "no_such_dir" / "x.gguf"),
                       doctest::Contains("No such file or directory"), kiln::Error);
}
