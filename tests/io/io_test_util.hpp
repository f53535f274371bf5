// tests/io/io_test_util.hpp - helpers for the model-file reader tests: temp files, a raw GGUF byte
// builder that can write invalid files on purpose, CRC32, fixture and shared-model paths.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/io/gguf.hpp"
#include "test_util.hpp"

namespace kiln::test {

using Bytes = std::vector<std::byte>;

/// A fresh empty directory under the system temp dir, removed when the test binary exits.
inline const std::filesystem::path& io_temp_dir() {
  struct Dir {
    std::filesystem::path p;
    Dir() {
      p = std::filesystem::temp_directory_path() / ("kiln_io_test_" + std::to_string(::getpid()));
      std::filesystem::remove_all(p);
      std::filesystem::create_directories(p);
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  };
  static Dir d;
  return d.p;
}

/// A unique path in io_temp_dir() (the name helps reading failures).
inline std::filesystem::path temp_path(std::string_view name) {
  static std::atomic<int> counter{0};
  return io_temp_dir() / (std::to_string(counter++) + "_" + std::string(name));
}

inline void write_file(const std::filesystem::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  REQUIRE_MESSAGE(f.good(), "cannot create ", p.string());
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(f.good());
}
inline void write_file(const std::filesystem::path& p, std::string_view s) {
  write_file(
      p, Bytes(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size()));
}

inline Bytes read_file_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "missing file ", p.string());
  std::vector<char> c{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  Bytes b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}

/// tests/fixtures/io/<name> (written by tests/fixtures/make_io_fixtures.py).
inline std::filesystem::path io_fixture(std::string_view name) {
  auto p = std::filesystem::path(KILN_SOURCE_DIR) / "tests" / "fixtures" / "io" / name;
  REQUIRE_MESSAGE(std::filesystem::exists(p), "missing fixture ", p.string(),
                  " (regenerate with .venv/bin/python tests/fixtures/make_io_fixtures.py)");
  return p;
}

/// ../shared/models/<name>; fails the test with a clear message when the shared directory lacks it.
inline std::filesystem::path shared_model(std::string_view name) {
  auto p = std::filesystem::path(KILN_SHARED_DIR) / "models" / name;
  REQUIRE_MESSAGE(std::filesystem::exists(p), "missing shared model file ", p.string(),
                  ": the tests need kiln's shared data directory at ../shared (see ../shared/README.md)");
  return p;
}

/// CRC-32 (IEEE 802.3, reflected, as zlib.crc32), bitwise: an implementation independent of the code
/// under test.
inline uint32_t crc32(std::span<const std::byte> b) {
  uint32_t c = 0xffffffffu;
  for (std::byte x : b) {
    c ^= std::to_integer<uint32_t>(x);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

/// Appends little-endian fields: the raw material of hand-made (possibly invalid) GGUF files.
struct ByteWriter {
  Bytes b;
  template <class T>
  ByteWriter& put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  ByteWriter& u8(uint8_t v) { return put(v); }
  ByteWriter& u32(uint32_t v) { return put(v); }
  ByteWriter& u64(uint64_t v) { return put(v); }
  ByteWriter& raw(std::string_view s) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    b.insert(b.end(), p, p + s.size());
    return *this;
  }
  ByteWriter& str(std::string_view s) { return u64(s.size()).raw(s); }
  ByteWriter& bytes(const Bytes& x) {
    b.insert(b.end(), x.begin(), x.end());
    return *this;
  }
  ByteWriter& zeros(std::size_t n) {
    b.resize(b.size() + n);
    return *this;
  }
  ByteWriter& pad_to(std::size_t align) {
    b.resize((b.size() + align - 1) / align * align);
    return *this;
  }
};

/// One key/value pair encoded by hand: key, value type, then the raw value bytes.
inline Bytes raw_kv(std::string_view key, uint32_t type, const Bytes& value) {
  return ByteWriter{}.str(key).u32(type).bytes(value).b;
}
inline Bytes kv_u32(std::string_view key, uint32_t v) { return raw_kv(key, 4, ByteWriter{}.u32(v).b); }
inline Bytes kv_str(std::string_view key, std::string_view s) { return raw_kv(key, 8, ByteWriter{}.str(s).b); }

/// A GGUF file assembled field by field, so tests can make any one field wrong.
struct RawGGUF {
  struct Info {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type = 0;  // F32
    uint64_t offset = 0;
    std::optional<uint32_t> n_dims;  // default: ne.size()
  };
  std::string magic = "GGUF";
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count, kv_count;  // default: the real counts
  std::vector<Bytes> kvs;
  std::vector<Info> tensors;
  std::size_t alignment = 32;  // padding before the data section (does not add general.alignment)
  std::size_t data_bytes = 0;  // size of the (zero-filled, 0x3f-patterned) data section

  Bytes build() const {
    ByteWriter w;
    w.raw(magic).u32(version).u64(tensor_count.value_or(tensors.size())).u64(kv_count.value_or(kvs.size()));
    for (const auto& kv : kvs) w.bytes(kv);
    for (const auto& t : tensors) {
      w.str(t.name).u32(t.n_dims.value_or(static_cast<uint32_t>(t.ne.size())));
      for (uint64_t d : t.ne) w.u64(d);
      w.u32(t.type).u64(t.offset);
    }
    w.pad_to(alignment);
    for (std::size_t i = 0; i < data_bytes; ++i) w.u8(static_cast<uint8_t>(i * 7 + 3));
    return w.b;
  }
};

/// A small valid file: two F32 tensors "a" (ne [4, 2]: 32 bytes at 0) and "b" (ne [8]: 32 bytes at 32).
inline RawGGUF valid_raw_gguf() {
  RawGGUF g;
  g.kvs.push_back(kv_str("general.architecture", "test"));
  g.kvs.push_back(kv_u32("test.block_count", 3));
  g.tensors.push_back({"a", {4, 2}, 0, 0, {}});
  g.tensors.push_back({"b", {8}, 0, 32, {}});
  g.data_bytes = 64;
  return g;
}

inline io::GGUFFile parse_gguf(const Bytes& b, std::string name = "test.gguf") {
  return io::GGUFFile(std::span<const std::byte>(b), std::move(name));
}

}  // namespace kiln::test
