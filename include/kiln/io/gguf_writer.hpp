// kiln/io/gguf_writer.hpp - writes GGUF v3 files (metadata of every type, tensors of any ggml type).
//
//   kiln::io::GGUFWriter w;                                     // alignment 32 (general.alignment if not)
//   w.add("general.architecture", "llama");
//   w.add("llama.block_count", uint32_t(5));
//   w.add("tokenizer.ggml.tokens", std::vector<std::string>{...});
//   w.add_tensor("output_norm.weight", make_tensor(ptr, 64));  // a kiln view: shape reversed into ne
//   w.add_tensor("blk.0.attn_q.weight", GGMLType::Q4_0, {K, N}, bytes);  // raw: ne in ggml order
//   w.write("out.gguf");
//
// Streaming (kiln-quantize: the tensor data never has to be in memory all at once): declare tensors with
// add_tensor_info(name, type, ne), then begin(path) writes the header, write_tensor_data(bytes) writes the
// next declared tensor's data (declaration order, exactly its size, padding added), finish() closes.
// add(key, GGUFValue) copies a value read from another GGUF file as it is (type and encoding).
//
// The C++ type picks the GGUF type: bool BOOL, (u)int8..64_t (U)INT8..64, float FLOAT32, double FLOAT64,
// anything convertible to std::string_view STRING, std::vector<E> ARRAY of E (nesting allowed). The
// layout is llama.cpp's and gguf-py's: header, key/value pairs in insertion order, tensor infos, padding
// to the alignment, then each tensor's data padded to the alignment, tensors in insertion order.
// add_tensor copies the tensor data into the writer. Used by kiln's tests and the kiln-quantize tool.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/common.hpp"
#include "kiln/io/ggml_types.hpp"
#include "kiln/io/gguf_types.hpp"

namespace kiln::io {

class GGUFWriter {
 public:
  explicit GGUFWriter(uint32_t alignment = 32) : alignment_(alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
      fail("kiln::io::GGUFWriter: alignment ", alignment, " is not a power of two");
    if (alignment != 32) add_kv("general.alignment", alignment);
  }

  /// Adds a metadata pair; keys must be unique ("general.alignment" comes from the constructor).
  template <class T>
  void add(std::string_view key, const T& value) {
    if (key == "general.alignment")
      fail("kiln::io::GGUFWriter: set the alignment with the constructor, not as metadata");
    add_kv(key, value);
  }

  /// Copies a metadata value read from a GGUF file (kiln::io::GGUFFile::metadata()) with its type.
  void add(std::string_view key, const GGUFValue& v) {
    if (key == "general.alignment")
      fail("kiln::io::GGUFWriter: set the alignment with the constructor, not as metadata");
    if (!keys_.emplace(key).second) fail("kiln::io::GGUFWriter: duplicate metadata key '", key, "'");
    put_string(kv_, key);
    put<uint32_t>(kv_, static_cast<uint32_t>(v.type()));
    if (v.type() == GGUFValueType::STRING) {
      put<uint64_t>(kv_, v.raw().size());
    } else if (v.type() == GGUFValueType::ARRAY) {
      put<uint32_t>(kv_, static_cast<uint32_t>(v.array_type()));
      put<uint64_t>(kv_, v.size());
    }
    kv_.insert(kv_.end(), v.raw().begin(), v.raw().end());  // scalar bytes, characters or encoded elements
    ++n_kv_;
  }

  /// Adds a tensor from raw bytes: ne in ggml order (ne[0] = row length), data exactly the size that
  /// ne and the type imply.
  void add_tensor(std::string name, GGMLType type, std::span<const uint64_t> ne, std::span<const std::byte> data) {
    Pending t = make_pending(std::move(name), type, ne);
    if (t.size != data.size())
      fail("kiln::io::GGUFWriter: tensor '", t.name, "': data has ", data.size(), " bytes but its dims and type ",
           ggml_type_name(type), " need ", t.size);
    t.data.assign(data.begin(), data.end());
    t.deferred = false;
    register_tensor(std::move(t));
  }
  void add_tensor(std::string name, GGMLType type, std::initializer_list<uint64_t> ne,
                  std::span<const std::byte> data) {
    add_tensor(std::move(name), type, std::span<const uint64_t>(ne.begin(), ne.size()), data);
  }

  /// Declares a tensor whose data write_tensor_data() streams later (see the top of this file); returns
  /// its size in bytes.
  uint64_t add_tensor_info(std::string name, GGMLType type, std::span<const uint64_t> ne) {
    Pending t = make_pending(std::move(name), type, ne);
    const uint64_t size = t.size;
    register_tensor(std::move(t));
    return size;
  }
  uint64_t add_tensor_info(std::string name, GGMLType type, std::initializer_list<uint64_t> ne) {
    return add_tensor_info(std::move(name), type, std::span<const uint64_t>(ne.begin(), ne.size()));
  }

  /// Adds a contiguous kiln view of float, f16, bf16, int8_t or int32_t; its shape (outermost first) is
  /// written reversed, as ggml's ne.
  template <class T, class L>
  void add_tensor(std::string name, const Tensor<T, L>& t) {
    using V = std::remove_const_t<T>;
    if (!t.is_contiguous()) fail("kiln::io::GGUFWriter: tensor '", name, "' view is not contiguous");
    std::vector<uint64_t> ne;
    for (std::size_t r = t.rank(); r-- > 0;) ne.push_back(t.extent(r));
    const auto* p = reinterpret_cast<const std::byte*>(t.data());
    add_tensor(std::move(name), ggml_type_of<V>(), ne, std::span<const std::byte>(p, t.size() * sizeof(V)));
  }

  /// The whole file (every tensor must have its data: added with add_tensor).
  std::vector<std::byte> to_bytes() const {
    std::vector<std::byte> out = header();
    for (const auto& t : tensors_) {
      if (t.deferred) fail("kiln::io::GGUFWriter: tensor '", t.name, "' was declared without data (stream it)");
      out.insert(out.end(), t.data.begin(), t.data.end());
      out.resize(pad(out.size()));
    }
    return out;
  }

  /// Writes the whole file (every tensor must have its data: added with add_tensor).
  void write(const std::filesystem::path& path) const {
    for (const auto& t : tensors_)
      if (t.deferred) fail("kiln::io::GGUFWriter: tensor '", t.name, "' was declared without data (stream it)");
    const std::string p = path.string();
    std::unique_ptr<std::FILE, FileCloser> f(std::fopen(p.c_str(), "wb"));
    if (!f) fail("kiln: cannot create '", p, "': ", std::generic_category().message(errno));
    const auto h = header();
    put_file(f.get(), p, h.data(), h.size());
    for (const auto& t : tensors_) put_padded(f.get(), p, t.data.data(), t.data.size());
    if (std::fclose(f.release()) != 0) fail("kiln: cannot write '", p, "': ", std::generic_category().message(errno));
  }

  /// Streaming: creates the file and writes the header (metadata and tensor infos).
  void begin(const std::filesystem::path& path) {
    if (file_) fail("kiln::io::GGUFWriter: begin() called twice");
    path_ = path.string();
    file_.reset(std::fopen(path_.c_str(), "wb"));
    if (!file_) fail("kiln: cannot create '", path_, "': ", std::generic_category().message(errno));
    const auto h = header();
    put_file(file_.get(), path_, h.data(), h.size());
    next_ = 0;
    flush_stored();
  }

  /// Streaming: writes the data of the next declared tensor (exactly its size; padding is added).
  void write_tensor_data(std::span<const std::byte> data) {
    if (!file_) fail("kiln::io::GGUFWriter: write_tensor_data() before begin()");
    if (next_ >= tensors_.size()) fail("kiln::io::GGUFWriter: write_tensor_data(): every tensor is written already");
    const Pending& t = tensors_[next_];
    if (data.size() != t.size)
      fail("kiln::io::GGUFWriter: tensor '", t.name, "': data has ", data.size(), " bytes, its dims and type need ",
           t.size);
    put_padded(file_.get(), path_, data.data(), data.size());
    ++next_;
    flush_stored();
  }

  /// Streaming: checks that every tensor was written and closes the file.
  void finish() {
    if (!file_) fail("kiln::io::GGUFWriter: finish() before begin()");
    if (next_ < tensors_.size())
      fail("kiln::io::GGUFWriter: finish(): tensor '", tensors_[next_].name, "' (", next_ + 1, " of ", tensors_.size(),
           ") has not been written");
    std::FILE* f = file_.release();
    if (std::fclose(f) != 0) fail("kiln: cannot write '", path_, "': ", std::generic_category().message(errno));
  }

 private:
  template <class T>
  void add_kv(std::string_view key, const T& value) {
    if (!keys_.emplace(key).second) fail("kiln::io::GGUFWriter: duplicate metadata key '", key, "'");
    put_string(kv_, key);
    put<uint32_t>(kv_, static_cast<uint32_t>(value_type<T>()));
    encode(kv_, value);
    ++n_kv_;
  }

  struct Pending {
    std::string name;
    GGMLType type = GGMLType::F32;
    std::vector<uint64_t> ne;
    uint64_t size = 0;     // bytes of data
    bool deferred = true;  // data streamed by write_tensor_data, not held in `data`
    std::vector<std::byte> data;
  };
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };

  Pending make_pending(std::string name, GGMLType type, std::span<const uint64_t> ne) const {
    if (file_) fail("kiln::io::GGUFWriter: tensor '", name, "' added after begin()");
    const auto info = ggml_type_info(type);
    const auto where = [&] { return "kiln::io::GGUFWriter: tensor '" + name + "'"; };
    if (!info.known()) fail(where(), ": unknown ggml type ", static_cast<uint32_t>(type));
    if (ne.empty() || ne.size() > 4) fail(where(), ": needs 1..4 dims, got ", ne.size());
    if (ne[0] % info.block_size != 0)
      fail(where(), ": row length ", ne[0], " is not a multiple of the block size ", info.block_size);
    uint64_t rows = 1;
    for (std::size_t d = 1; d < ne.size(); ++d) {
      const auto r = detail::mul(rows, ne[d]);
      if (!r) fail(where(), ": dims overflow");
      rows = *r;
    }
    const auto row_bytes = detail::mul(ne[0] / info.block_size, info.type_size);
    const auto bytes = row_bytes ? detail::mul(*row_bytes, rows) : std::nullopt;
    if (!bytes) fail(where(), ": size overflows");
    if (names_.count(name)) fail(where(), ": duplicate tensor name");
    Pending t;
    t.name = std::move(name);
    t.type = type;
    t.ne.assign(ne.begin(), ne.end());
    t.size = *bytes;
    return t;
  }
  void register_tensor(Pending t) {
    names_.emplace(t.name);
    tensors_.push_back(std::move(t));
  }

  static void put_file(std::FILE* f, const std::string& path, const std::byte* d, std::size_t n) {
    if (n && std::fwrite(d, 1, n, f) != n)
      fail("kiln: cannot write '", path, "': ", std::generic_category().message(errno));
  }
  // One tensor's data and its padding (every tensor starts aligned, so padding its size pads the offset).
  void put_padded(std::FILE* f, const std::string& path, const std::byte* d, std::size_t n) const {
    static const std::byte zeros[4096] = {};
    put_file(f, path, d, n);
    for (std::size_t left = pad(n) - n; left > 0;) {
      const std::size_t k = left < sizeof(zeros) ? left : sizeof(zeros);
      put_file(f, path, zeros, k);
      left -= k;
    }
  }
  // Streaming: writes tensors added with their data until the next one whose data is streamed.
  void flush_stored() {
    for (; next_ < tensors_.size() && !tensors_[next_].deferred; ++next_)
      put_padded(file_.get(), path_, tensors_[next_].data.data(), tensors_[next_].data.size());
  }

  template <class T>
  static constexpr GGUFValueType value_type() {
    using U = std::remove_cvref_t<T>;
    if constexpr (detail::is_std_vector<U>::value) return GGUFValueType::ARRAY;
    else if constexpr (std::is_convertible_v<const U&, std::string_view>) return GGUFValueType::STRING;
    else {
      static_assert(std::is_arithmetic_v<U>,
                    "kiln::io::GGUFWriter::add: unsupported value type (use bool, an "
                    "integer, float, double, a string or a std::vector of those)");
      return gguf_type_of<U>();
    }
  }

  template <class S>
  static void put(std::vector<std::byte>& out, S v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), p, p + sizeof(S));
  }
  static void put_string(std::vector<std::byte>& out, std::string_view s) {
    put<uint64_t>(out, s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out.insert(out.end(), p, p + s.size());
  }

  template <class T>
  static void encode(std::vector<std::byte>& out, const T& v) {
    using U = std::remove_cvref_t<T>;
    if constexpr (detail::is_std_vector<U>::value) {
      put<uint32_t>(out, static_cast<uint32_t>(value_type<typename U::value_type>()));
      put<uint64_t>(out, v.size());
      for (const auto& e : v) encode(out, static_cast<const typename U::value_type&>(e));
    } else if constexpr (std::is_convertible_v<const U&, std::string_view>) {
      put_string(out, std::string_view(v));
    } else if constexpr (std::is_same_v<U, bool>) {
      put<uint8_t>(out, v ? 1 : 0);
    } else {
      put<U>(out, v);
    }
  }

  std::size_t pad(std::size_t n) const { return (n + alignment_ - 1) / alignment_ * alignment_; }

  std::vector<std::byte> header() const {
    std::vector<std::byte> out;
    for (char ch : std::string_view("GGUF")) out.push_back(static_cast<std::byte>(ch));
    put<uint32_t>(out, 3);
    put<uint64_t>(out, tensors_.size());
    put<uint64_t>(out, n_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      put_string(out, t.name);
      put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) put<uint64_t>(out, d);
      put<uint32_t>(out, static_cast<uint32_t>(t.type));
      put<uint64_t>(out, offset);
      offset += pad(t.size);
    }
    out.resize(pad(out.size()));
    return out;
  }

  uint32_t alignment_;
  std::vector<std::byte> kv_;
  uint64_t n_kv_ = 0;
  std::set<std::string, std::less<>> keys_;
  std::set<std::string, std::less<>> names_;
  std::vector<Pending> tensors_;
  std::unique_ptr<std::FILE, FileCloser> file_;  // while streaming
  std::string path_;
  std::size_t next_ = 0;  // the next tensor whose data is written
};

}  // namespace kiln::io
