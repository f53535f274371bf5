// kiln/io/gguf.hpp - GGUF (v2 and v3, little-endian) reader: metadata and zero-copy tensor views.
//
//   kiln::io::GGUFFile f("model.gguf");                   // mmap'd read-only (LoadMode::read to copy)
//   f.architecture();                                      // "llama"
//   f.get<uint32_t>("llama.block_count");                 // typed metadata (see gguf_types.hpp)
//   f.get<std::vector<std::string>>("tokenizer.ggml.tokens");
//   f.find<float>("llama.rope.freq_base");                // std::optional: nullopt when absent
//   auto w = f.view<float, 2>("blk.0.attn_q.weight");      // DenseTensor<const float, 2>, zero-copy
//   const auto& t = f.tensor("blk.0.ffn_down.weight");     // any type: t.type, t.data (raw bytes), t.ne
//
// Shapes. GGUF stores dims innermost first: ne[0] is the row length (contiguous). kiln is outermost
// first, so a GGUFTensor's shape()/extent(r) are ne reversed: a weight with ne = [K, N] (ggml's
// mul_mat(W, x) with x of length K) is the (N, K) row-major matrix, N rows of K elements. GGUFTensor::ne
// keeps ggml's order for code that thinks in ggml terms.
//
// Layout. After the header (magic "GGUF", version u32, tensor_count u64, metadata_kv_count u64) come the
// key/value pairs, then one info per tensor (name, n_dims u32, ne u64[n_dims], ggml type u32, offset
// u64), then padding up to general.alignment (default 32), then the tensor data section; each tensor's
// offset is relative to that section and a multiple of the alignment.
//
// Hostile files. Every count, size and offset is checked against the file's size with overflow-safe
// arithmetic before use; nothing is allocated in proportion to a count before that count is checked
// against the bytes present. Bad magic, an unsupported version, truncation anywhere, absurd counts or
// lengths, duplicate keys or tensor names, n_dims outside 1..4, dims whose product overflows, unknown
// tensor types, rows that are not a whole number of blocks, misaligned, out-of-range or overlapping
// tensor data: each throws kiln::FormatError naming the file, the field and the values.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/core/dtype.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/common.hpp"
#include "kiln/io/ggml_types.hpp"
#include "kiln/io/gguf_types.hpp"
#include "kiln/io/mmap.hpp"

namespace kiln::io {

inline constexpr uint32_t gguf_default_alignment = 32;
inline constexpr uint32_t gguf_max_dims = 4;

/// One tensor of a GGUF file: its info and a zero-copy view of its bytes (valid while the file lives).
struct GGUFTensor {
  std::string_view name;
  GGMLType type = GGMLType::F32;
  uint32_t n_dims = 0;
  std::array<uint64_t, gguf_max_dims> ne{1, 1, 1, 1};  ///< ggml order: ne[0] = row length (innermost)
  uint64_t offset = 0;                                 ///< relative to the data section
  uint64_t n_elements = 0;                             ///< product of ne
  uint64_t n_bytes = 0;                                ///< n_elements / block_size * type_size
  std::span<const std::byte> data;                     ///< n_bytes bytes inside the file's bytes
  std::string_view file;

  GGMLTypeInfo type_info() const { return ggml_type_info(type); }
  /// kiln order (outermost first): rank() == n_dims, extent(r) == ne[n_dims - 1 - r].
  std::size_t rank() const { return n_dims; }
  uint64_t extent(std::size_t r) const { return ne[n_dims - 1 - r]; }
  detail::FileShape shape() const {
    detail::FileShape s;
    s.rank = n_dims;
    for (std::size_t r = 0; r < n_dims; ++r) s.dims[r] = extent(r);
    return s;
  }
  uint64_t row_length() const { return ne[0]; }
  uint64_t rows() const { return ne[0] ? n_elements / ne[0] : 0; }
  uint64_t row_bytes() const { return ne[0] / type_info().block_size * type_info().type_size; }

  /// The data as a row-major view of T with rank R (leading 1s added or dropped as needed). The tensor's
  /// type must be T's (F32 for float, F16, BF16, I8, I32), else FormatError.
  template <class T, std::size_t R>
  DenseTensor<const T, R> view() const {
    if (type != ggml_type_of<T>())
      fail<FormatError>("kiln: GGUF file '", file, "': tensor ", detail::quote_name(name), " has type ",
                        ggml_type_name(type), ", expected ", ggml_type_name(ggml_type_of<T>()));
    return detail::typed_view<T, R>(data.data(), shape(), "GGUF", file, name);
  }

  /// The data as (rows, row_length / block_size) blocks of a block dtype (kiln/quant), whose
  /// dtype_traits block_size and block_bytes must match this tensor's ggml type.
  template <class Block>
  DenseTensor<const Block, 2> view_blocks() const {
    using Tr = dtype_traits<Block>;
    static_assert(Tr::is_dtype, "kiln::io::GGUFTensor::view_blocks: Block must be a kiln dtype");
    const auto info = type_info();
    if (Tr::block_size != info.block_size || Tr::block_bytes != info.type_size)
      fail<FormatError>("kiln: GGUF file '", file, "': tensor ", detail::quote_name(name), " has type ",
                        ggml_type_name(type), " (", info.block_size, " elements in ", info.type_size,
                        " bytes), which is not the block type ", Tr::name, " (", Tr::block_size, " in ",
                        Tr::block_bytes, ")");
    detail::FileShape s;
    s.rank = 2;
    s.dims = {rows(), ne[0] / info.block_size};
    return detail::typed_view<Block, 2>(data.data(), s, "GGUF", file, name);
  }
};

class GGUFFile {
 public:
  /// Opens and parses a file (memory-mapped by default).
  explicit GGUFFile(const std::filesystem::path& path, LoadMode mode = LoadMode::map)
      : GGUFFile(MappedFile(path, mode)) {}
  /// Parses a file already mapped or loaded; the GGUFFile owns it.
  explicit GGUFFile(MappedFile file)
      : file_(std::make_unique<MappedFile>(std::move(file))),
        name_(std::make_unique<const std::string>(file_->path())),
        bytes_(file_->bytes()) {
    parse();
  }
  /// Parses bytes owned by the caller (they must outlive this object); `name` is used in messages.
  GGUFFile(std::span<const std::byte> bytes, std::string name)
      : name_(std::make_unique<const std::string>(std::move(name))), bytes_(bytes) {
    parse();
  }

  const std::string& name() const { return *name_; }
  std::span<const std::byte> bytes() const { return bytes_; }
  /// The mapping or buffer this file owns (null for the caller-owned-bytes constructor).
  const MappedFile* mapped_file() const { return file_.get(); }
  MappedFile* mapped_file() { return file_.get(); }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  /// Byte offset of the tensor data section in the file.
  uint64_t data_offset() const { return data_offset_; }
  /// general.architecture ("llama", "qwen2", "gemma3", ...).
  std::string_view architecture() const { return get<std::string_view>("general.architecture"); }

  // ---- metadata ----
  /// All key/value pairs in file order.
  const std::vector<GGUFValue>& metadata() const { return kvs_; }
  bool contains(std::string_view key) const { return kv_index_.count(key) != 0; }
  std::optional<GGUFValue> find(std::string_view key) const {
    const auto it = kv_index_.find(key);
    if (it == kv_index_.end()) return std::nullopt;
    return kvs_[it->second];
  }
  /// The value converted to T, or nullopt when the key is absent (FormatError when it has another type).
  template <class T>
  std::optional<T> find(std::string_view key) const {
    const auto v = find(key);
    if (!v) return std::nullopt;
    return v->template as<T>();
  }
  GGUFValue value(std::string_view key, std::string_view expected = "a value") const {
    const auto v = find(key);
    if (!v)
      fail<FormatError>("kiln: GGUF file '", name(), "': metadata key ", detail::quote_name(key),
                        " not found (expected ", expected, ")");
    return *v;
  }
  /// The value converted to T; FormatError naming the file, key, expected and actual type when the key
  /// is missing or has another type.
  template <class T>
  T get(std::string_view key) const {
    return value(key, detail::gguf_expected_name<T>()).template as<T>();
  }
  template <class T>
  T get_or(std::string_view key, T fallback) const {
    auto v = find<T>(key);
    return v ? std::move(*v) : std::move(fallback);
  }

  // ---- tensors ----
  /// All tensors in file order.
  const std::vector<GGUFTensor>& tensors() const { return tensors_; }
  const GGUFTensor* find_tensor(std::string_view tname) const {
    const auto it = tensor_index_.find(tname);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  const GGUFTensor& tensor(std::string_view tname) const {
    if (const auto* t = find_tensor(tname)) return *t;
    fail<FormatError>("kiln: GGUF file '", name(), "': tensor ", detail::quote_name(tname), " not found");
  }
  template <class T, std::size_t R>
  DenseTensor<const T, R> view(std::string_view tname) const {
    return tensor(tname).template view<T, R>();
  }

 private:
  template <class... Args>
  [[noreturn]] void error(const Args&... args) const {
    fail<FormatError>("kiln: GGUF file '", name(), "': ", args...);
  }

  void parse() {
    detail::Cursor c(bytes_, "GGUF", name());
    // --- header ---
    const auto magic = c.take(4, "the magic");
    if (detail::as_string_view(magic) != "GGUF")
      error("bad magic ", detail::quote_name(detail::as_string_view(magic)), " (expected 'GGUF')");
    version_ = c.read<uint32_t>("the version");
    if (version_ == 1) error("GGUF version 1 is not supported (only versions 2 and 3)");
    if (version_ != 2 && version_ != 3) {
      if ((version_ & 0xffffu) == 0 && version_ != 0)
        error("version field 0x", std::hex, version_, std::dec,
              " looks byte-swapped: big-endian GGUF files are not supported");
      error("unsupported GGUF version ", version_, " (supported: 2 and 3)");
    }
    const auto tensor_count = c.read<uint64_t>("tensor_count");
    const auto kv_count = c.read<uint64_t>("metadata_kv_count");

    // --- metadata ---
    constexpr uint64_t min_kv_bytes = 8 + 4 + 1;  // key length, value type, smallest value
    if (kv_count > c.remaining() / min_kv_bytes)
      error("metadata_kv_count ", kv_count, " is impossible: ", kv_count, " pairs need at least ",
            static_cast<long double>(kv_count) * min_kv_bytes, " bytes but only ", c.remaining(), " follow the header");
    kvs_.reserve(static_cast<std::size_t>(kv_count));
    kv_index_.reserve(static_cast<std::size_t>(kv_count));
    for (uint64_t i = 0; i < kv_count; ++i) {
      const auto klen = c.read<uint64_t>("metadata key #", i, " length");
      if (klen > c.remaining())
        error("metadata key #", i, " length ", klen, " exceeds the ", c.remaining(), " bytes left at offset ", c.pos());
      const auto key = detail::as_string_view(c.take(klen, "metadata key #", i));
      const auto type = c.read<uint32_t>("metadata key ", detail::quote_name(key), " value type");
      if (!is_valid_gguf_type(type))
        error("metadata key ", detail::quote_name(key), " has invalid value type ", type, " (valid: 0..12)");
      // decode_at walks the whole value, checking every length and count against the bytes left.
      auto v = GGUFValue::decode_at(c, static_cast<GGUFValueType>(type), key, name());
      const auto [it, inserted] = kv_index_.emplace(key, kvs_.size());
      if (!inserted)
        error("duplicate metadata key ", detail::quote_name(key), " (pairs #", it->second, " and #", i, ")");
      kvs_.push_back(v);
    }

    // --- alignment ---
    alignment_ = gguf_default_alignment;
    if (const auto a = find("general.alignment")) {
      if (a->type() != GGUFValueType::UINT32)
        error("metadata key 'general.alignment' has type ", a->type_name(), ", expected UINT32");
      alignment_ = a->as<uint32_t>();
      if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0)
        error("general.alignment ", alignment_, " is not a power of two");
    }

    // --- tensor infos ---
    constexpr uint64_t min_info_bytes = 8 + 4 + 8 + 4 + 8;  // name length, n_dims, one dim, type, offset
    if (tensor_count > c.remaining() / min_info_bytes)
      error("tensor_count ", tensor_count, " is impossible: ", tensor_count, " tensor infos need at least ",
            static_cast<long double>(tensor_count) * min_info_bytes, " bytes but only ", c.remaining(),
            " follow the metadata");
    tensors_.reserve(static_cast<std::size_t>(tensor_count));
    tensor_index_.reserve(static_cast<std::size_t>(tensor_count));
    for (uint64_t i = 0; i < tensor_count; ++i) tensors_.push_back(read_tensor_info(c, i));

    // --- data section ---
    const auto data_start = detail::align_up(c.pos(), alignment_);
    if (!data_start) error("data section offset overflows");
    data_offset_ = *data_start;
    if (tensor_count == 0) return;
    if (data_offset_ > bytes_.size())
      error("truncated: the tensor data section starts at offset ", data_offset_, " (tensor infos end at ", c.pos(),
            ", alignment ", alignment_, ") but the file has only ", bytes_.size(), " bytes");
    const uint64_t data_size = bytes_.size() - data_offset_;
    for (auto& t : tensors_) {
      const auto end = detail::add(t.offset, t.n_bytes);
      if (!end || *end > data_size)
        error("tensor ", detail::quote_name(t.name), " data [", t.offset, ", ", t.offset, " + ", t.n_bytes,
              ") is out of range: the data section has ", data_size, " bytes (file size ", bytes_.size(), ")");
      t.data = bytes_.subspan(static_cast<std::size_t>(data_offset_ + t.offset), static_cast<std::size_t>(t.n_bytes));
    }
    std::vector<const GGUFTensor*> by_offset;
    by_offset.reserve(tensors_.size());
    for (const auto& t : tensors_)
      if (t.n_bytes) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](const GGUFTensor* a, const GGUFTensor* b) {
      return a->offset < b->offset || (a->offset == b->offset && a < b);  // ties: file order
    });
    for (std::size_t k = 1; k < by_offset.size(); ++k) {
      const auto* a = by_offset[k - 1];
      const auto* b = by_offset[k];
      if (a->offset + a->n_bytes > b->offset)
        error("tensors ", detail::quote_name(a->name), " [", a->offset, ", ", a->offset + a->n_bytes, ") and ",
              detail::quote_name(b->name), " [", b->offset, ", ", b->offset + b->n_bytes, ") overlap");
    }
  }

  GGUFTensor read_tensor_info(detail::Cursor& c, uint64_t i) {
    GGUFTensor t;
    t.file = name();
    const auto nlen = c.read<uint64_t>("tensor #", i, " name length");
    if (nlen > c.remaining())
      error("tensor #", i, " name length ", nlen, " exceeds the ", c.remaining(), " bytes left at offset ", c.pos());
    t.name = detail::as_string_view(c.take(nlen, "tensor #", i, " name"));
    const auto q = detail::quote_name(t.name);
    t.n_dims = c.read<uint32_t>("tensor ", q, " n_dims");
    if (t.n_dims < 1 || t.n_dims > gguf_max_dims)
      error("tensor ", q, " has n_dims ", t.n_dims, " (must be 1..", gguf_max_dims, ")");
    uint64_t n = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      t.ne[d] = c.read<uint64_t>("tensor ", q, " ne[", d, "]");
      if (t.ne[d] > static_cast<uint64_t>(INT64_MAX))
        error("tensor ", q, " ne[", d, "] = ", t.ne[d], " is negative as int64");
    }
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      const auto p = detail::mul(n, t.ne[d]);
      if (!p || *p > static_cast<uint64_t>(INT64_MAX))
        error("tensor ", q, " dims ", dims_str(t), " overflow: their product exceeds 2^63 - 1");
      n = *p;
    }
    t.n_elements = n;
    const auto type = c.read<uint32_t>("tensor ", q, " type");
    const auto info = ggml_type_info(type);
    if (!info.known()) error("tensor ", q, " has unknown ggml type ", type);
    t.type = static_cast<GGMLType>(type);
    if (t.ne[0] % info.block_size != 0)
      error("tensor ", q, " row length ne[0] = ", t.ne[0], " is not a multiple of the block size ", info.block_size,
            " of ", info.name);
    // n_bytes = rows * (ne[0] / block_size) * type_size, all checked.
    const auto row_bytes = detail::mul(t.ne[0] / info.block_size, info.type_size);
    const auto bytes = row_bytes ? detail::mul(*row_bytes, t.ne[0] ? n / t.ne[0] : 0) : std::nullopt;
    if (!bytes) error("tensor ", q, " byte size of ", dims_str(t), " ", info.name, " overflows");
    t.n_bytes = *bytes;
    t.offset = c.read<uint64_t>("tensor ", q, " offset");
    if (t.offset % alignment_ != 0)
      error("tensor ", q, " offset ", t.offset, " is not a multiple of the alignment ", alignment_);
    const auto [it, inserted] = tensor_index_.emplace(t.name, tensors_.size());
    if (!inserted) error("duplicate tensor name ", q, " (tensors #", it->second, " and #", i, ")");
    return t;
  }

  static std::string dims_str(const GGUFTensor& t) {
    std::string s = "ne [";
    for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
    return s + "]";
  }

  std::unique_ptr<MappedFile> file_;
  std::unique_ptr<const std::string> name_;  // heap-allocated: views hold its address across moves
  std::span<const std::byte> bytes_;
  uint32_t version_ = 0;
  uint32_t alignment_ = gguf_default_alignment;
  uint64_t data_offset_ = 0;
  std::vector<GGUFValue> kvs_;
  std::unordered_map<std::string_view, std::size_t> kv_index_;
  std::vector<GGUFTensor> tensors_;
  std::unordered_map<std::string_view, std::size_t> tensor_index_;
};

}  // namespace kiln::io
