// GGUF hostile input: every malformed field gets a kiln::FormatError naming the file, the field and
// the values; truncation at every byte of a valid file is an error, never a crash (run under ASan).
#include "io_test_util.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {
void parse(const RawGGUF& g) { (void)parse_gguf(g.build(), "evil.gguf"); }
}  // namespace

#define CHECK_GGUF_ERROR(g, text) CHECK_THROWS_WITH_AS(parse(g), doctest::Contains(text), FormatError)

TEST_CASE("GGUF hostile: the valid baseline parses") {
  const Bytes b = valid_raw_gguf().build();
  const auto f = parse_gguf(b);
  CHECK(f.tensors().size() == 2);
  CHECK(f.get<uint32_t>("test.block_count") == 3);
  CHECK(f.tensor("b").data.data() == b.data() + f.data_offset() + 32);
}

TEST_CASE("GGUF hostile: header") {
  auto g = valid_raw_gguf();
  g.magic = "GGML";
  CHECK_THROWS_WITH_AS(parse(g), "kiln: GGUF file 'evil.gguf': bad magic 'GGML' (expected 'GGUF')", FormatError);
  g = valid_raw_gguf();
  g.version = 1;
  CHECK_GGUF_ERROR(g, "GGUF version 1 is not supported (only versions 2 and 3)");
  g.version = 4;
  CHECK_GGUF_ERROR(g, "unsupported GGUF version 4 (supported: 2 and 3)");
  g.version = 0x03000000;
  CHECK_GGUF_ERROR(g, "version field 0x3000000 looks byte-swapped: big-endian GGUF files are not supported");
  g.version = 2;  // v2 has the same little-endian layout as v3
  CHECK_NOTHROW(parse(g));
  CHECK_THROWS_WITH_AS(parse_gguf(Bytes{}, "empty.gguf"),
                       "kiln: GGUF file 'empty.gguf': truncated: the magic needs 4 bytes at offset 0 but only 0 remain "
                       "(file size 0)",
                       FormatError);
  const Bytes short_header = ByteWriter{}.raw("GGUF").u32(3).u64(0).b;
  CHECK_THROWS_WITH_AS(parse_gguf(short_header),
                       doctest::Contains("truncated: metadata_kv_count needs 8 bytes at offset 16"), FormatError);
}

TEST_CASE("GGUF hostile: absurd counts fail before anything is allocated for them") {
  auto g = valid_raw_gguf();
  g.kv_count = uint64_t(1) << 60;
  CHECK_GGUF_ERROR(g, "metadata_kv_count 1152921504606846976 is impossible");
  g = valid_raw_gguf();
  g.tensor_count = ~uint64_t(0);
  CHECK_GGUF_ERROR(g, "tensor_count 18446744073709551615 is impossible");
  g = valid_raw_gguf();
  g.tensor_count = 3;  // one more info than present: the third read runs into the data section / end
  CHECK_THROWS_AS(parse(g), FormatError);
}

TEST_CASE("GGUF hostile: metadata keys and values") {
  auto g = valid_raw_gguf();
  g.kvs.push_back(ByteWriter{}.u64(1000).raw("k").b);
  CHECK_GGUF_ERROR(g, "metadata key #2 length 1000 exceeds the");
  g = valid_raw_gguf();
  g.kvs.push_back(raw_kv("bad.type", 13, ByteWriter{}.u32(0).b));
  CHECK_GGUF_ERROR(g, "metadata key 'bad.type' has invalid value type 13 (valid: 0..12)");
  g = valid_raw_gguf();
  g.kvs.push_back(raw_kv("s", 8, ByteWriter{}.u64(uint64_t(1) << 40).raw("abc").b));
  CHECK_GGUF_ERROR(g, "metadata key 's': string length 1099511627776 exceeds the");
  g = valid_raw_gguf();
  g.kvs.push_back(kv_u32("test.block_count", 4));
  CHECK_GGUF_ERROR(g, "duplicate metadata key 'test.block_count' (pairs #1 and #2)");
  g = valid_raw_gguf();  // key bytes that are not printable are escaped in the message
  g.kvs.push_back(kv_str(std::string("a\nb\0", 4), "x"));
  g.kvs.push_back(kv_str(std::string("a\nb\0", 4), "y"));
  CHECK_GGUF_ERROR(g, "duplicate metadata key 'a\\x0ab\\x00'");
}

TEST_CASE("GGUF hostile: arrays") {
  auto g = valid_raw_gguf();
  g.kvs.push_back(raw_kv("arr", 9, ByteWriter{}.u32(6).u64(uint64_t(1) << 61).b));
  CHECK_GGUF_ERROR(g, "metadata key 'arr': array count 2305843009213693952 of FLOAT32 needs at least");
  g = valid_raw_gguf();
  g.kvs.push_back(raw_kv("arr", 9, ByteWriter{}.u32(8).u64(1000).str("one").b));
  CHECK_GGUF_ERROR(g, "metadata key 'arr': array count 1000 of STRING needs at least 8000 bytes");
  g = valid_raw_gguf();
  g.kvs.push_back(raw_kv("arr", 9, ByteWriter{}.u32(8).u64(2).str("one").u64(999).b));
  CHECK_GGUF_ERROR(g, "metadata key 'arr' element 1: string length 999 exceeds the");
  g = valid_raw_gguf();
  g.kvs.push_back(raw_kv("arr", 9, ByteWriter{}.u32(42).u64(0).b));
  CHECK_GGUF_ERROR(g, "metadata key 'arr': invalid array element type 42");
  // Nesting: 17 levels of ARRAY headers is one too many (a hostile file could nest thousands).
  ByteWriter deep;
  for (int i = 0; i < 17; ++i) deep.u32(9).u64(1);
  deep.u32(0).u64(0);
  g = valid_raw_gguf();
  g.kvs.push_back(raw_kv("deep", 9, deep.b));
  CHECK_GGUF_ERROR(g, "metadata key 'deep' element 0: arrays nested deeper than 16");
  ByteWriter ok;
  for (int i = 0; i < 15; ++i) ok.u32(9).u64(1);
  ok.u32(0).u64(0);
  g = valid_raw_gguf();
  g.kvs.push_back(raw_kv("deep", 9, ok.b));
  CHECK_NOTHROW(parse(g));
}

TEST_CASE("GGUF hostile: general.alignment") {
  auto g = valid_raw_gguf();
  g.kvs.push_back(kv_u32("general.alignment", 48));
  CHECK_GGUF_ERROR(g, "general.alignment 48 is not a power of two");
  g = valid_raw_gguf();
  g.kvs.push_back(kv_u32("general.alignment", 0));
  CHECK_GGUF_ERROR(g, "general.alignment 0 is not a power of two");
  g = valid_raw_gguf();
  g.kvs.push_back(kv_str("general.alignment", "32"));
  CHECK_GGUF_ERROR(g, "metadata key 'general.alignment' has type STRING, expected UINT32");
  g = valid_raw_gguf();
  g.kvs.push_back(kv_u32("general.alignment", 64));
  CHECK_GGUF_ERROR(g, "tensor 'b' offset 32 is not a multiple of the alignment 64");
}

TEST_CASE("GGUF hostile: tensor infos") {
  auto g = valid_raw_gguf();
  g.tensors[1].n_dims = 5;
  CHECK_GGUF_ERROR(g, "tensor 'b' has n_dims 5 (must be 1..4)");
  g.tensors[1].n_dims = 0;
  CHECK_GGUF_ERROR(g, "tensor 'b' has n_dims 0 (must be 1..4)");
  g = valid_raw_gguf();
  g.tensors[0].ne = {uint64_t(1) << 32, uint64_t(1) << 32};
  CHECK_GGUF_ERROR(g, "tensor 'a' dims ne [4294967296, 4294967296] overflow: their product exceeds 2^63 - 1");
  g.tensors[0].ne = {uint64_t(1) << 63, 1};
  CHECK_GGUF_ERROR(g, "tensor 'a' ne[0] = 9223372036854775808 is negative as int64");
  g = valid_raw_gguf();
  g.tensors[0].type = 4;
  CHECK_GGUF_ERROR(g, "tensor 'a' has unknown ggml type 4");
  g.tensors[0].type = 1000;
  CHECK_GGUF_ERROR(g, "tensor 'a' has unknown ggml type 1000");
  g = valid_raw_gguf();
  g.tensors[0].type = 2;  // Q4_0 with rows of 4
  CHECK_GGUF_ERROR(g, "tensor 'a' row length ne[0] = 4 is not a multiple of the block size 32 of q4_0");
  g = valid_raw_gguf();
  g.tensors[1].name = "a";
  CHECK_GGUF_ERROR(g, "duplicate tensor name 'a' (tensors #0 and #1)");
  g = valid_raw_gguf();
  g.tensors[1].offset = 33;
  CHECK_GGUF_ERROR(g, "tensor 'b' offset 33 is not a multiple of the alignment 32");
  g = valid_raw_gguf();
  g.tensors[0].name = std::string(200, 'x');
  g.tensors[1].name = std::string(200, 'x');
  CHECK_GGUF_ERROR(g, ("duplicate tensor name '" + std::string(80, 'x') + "...'").c_str());
  // A name length pointing past the end (the info area is otherwise big enough for one info).
  g = valid_raw_gguf();
  g.tensors.clear();
  g.data_bytes = 0;
  g.alignment = 1;
  g.tensor_count = 1;
  auto bytes = g.build();
  const std::size_t end_of_kvs = bytes.size();
  const Bytes info = ByteWriter{}.u64(1u << 20).raw("abc").b;
  bytes.insert(bytes.end(), info.begin(), info.end());
  bytes.resize(end_of_kvs + 40);
  CHECK_THROWS_WITH_AS(parse_gguf(bytes, "evil.gguf"), doctest::Contains("tensor #0 name length 1048576 exceeds the"),
                       FormatError);
}

TEST_CASE("GGUF hostile: tensor data out of range or overlapping") {
  auto g = valid_raw_gguf();
  g.tensors[1].offset = 64;  // 32 bytes at 64 in a 64-byte data section
  CHECK_GGUF_ERROR(g, "tensor 'b' data [64, 64 + 32) is out of range: the data section has 64 bytes");
  g.tensors[1].offset = ~uint64_t(0) - 31;  // offset + size overflows
  CHECK_GGUF_ERROR(g, "tensor 'b' data [18446744073709551584, 18446744073709551584 + 32) is out of range");
  g = valid_raw_gguf();
  g.tensors[1].offset = 0;
  CHECK_GGUF_ERROR(g, "tensors 'a' [0, 32) and 'b' [0, 32) overlap");
  g = valid_raw_gguf();
  g.tensors[0].ne = {8, 2};  // 64 bytes at 0 now covers b at 32
  g.data_bytes = 96;
  CHECK_GGUF_ERROR(g, "tensors 'a' [0, 64) and 'b' [32, 64) overlap");
  g = valid_raw_gguf();
  g.tensors.push_back({"empty", {0, 3}, 0, 32, {}});  // zero bytes: may sit anywhere in range
  CHECK_NOTHROW(parse(g));
  g = valid_raw_gguf();
  g.data_bytes = 0;
  g.alignment = 1;  // no padding: the data section would start past the end
  if (g.build().size() % 32 == 0) g.kvs[0] = kv_str("general.architecture", "test2");
  REQUIRE(g.build().size() % 32 != 0);
  CHECK_GGUF_ERROR(g, "truncated: the tensor data section starts at offset");
}

TEST_CASE("GGUF hostile: every truncation of a valid file is an error, never a crash") {
  RawGGUF g = valid_raw_gguf();
  g.kvs.push_back(raw_kv("arr", 9, ByteWriter{}.u32(8).u64(2).str("x").str("yz").b));
  g.kvs.push_back(raw_kv("nested", 9, ByteWriter{}.u32(9).u64(1).u32(5).u64(2).u32(1).u32(2).b));
  const Bytes full = g.build();
  CHECK_NOTHROW(parse_gguf(full));
  for (std::size_t n = 0; n < full.size(); ++n) {
    CAPTURE(n);
    // A copy of exactly n bytes, so ASan catches any read past the end.
    const Bytes cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK_THROWS_AS(parse_gguf(cut), FormatError);
  }
}

TEST_CASE("GGUF hostile: every single-byte corruption of the header area is an error or parses") {
  const Bytes full = valid_raw_gguf().build();
  const std::size_t header_end = full.size() - 64;  // everything before the data section
  for (std::size_t i = 0; i < header_end; ++i) {
    for (uint8_t x : {uint8_t(0x00), uint8_t(0xff), uint8_t(0x80), uint8_t(0x01)}) {
      Bytes b = full;
      b[i] = std::byte(x);
      try {
        const auto f = parse_gguf(b);
        for (const auto& t : f.tensors()) CHECK(t.data.data() + t.data.size() <= b.data() + b.size());
      } catch (const FormatError&) {
      }
    }
  }
}
