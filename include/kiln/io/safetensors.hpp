// kiln/io/safetensors.hpp - safetensors reader (single files and sharded checkpoints), zero-copy views.
//
//   kiln::io::SafetensorsFile f("model.safetensors");             // mmap'd (LoadMode::read to copy)
//   auto w = f.view<bf16, 2>("model.layers.0.self_attn.q_proj.weight");  // DenseTensor<const bf16, 2>
//   kiln::io::SafetensorsCheckpoint ck("path/to/model_dir");      // model.safetensors.index.json or
//   ck.view<float, 1>("model.norm.weight");                       // model.safetensors, or a file path
//
// Format: an 8-byte little-endian header length N, N bytes of JSON, then the byte buffer. The JSON maps
// each tensor name to {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]} (offsets relative to
// the buffer), plus an optional "__metadata__" object of strings. Shapes are outermost first, as kiln's.
// Typed views exist for F32, F16, BF16, I8 and I32; every dtype is reachable as raw bytes.
//
// Hostile files: the header length is checked against the file and a 100 MB cap, the JSON must parse
// (no duplicate keys, bounded nesting), dtypes must be known, shapes non-negative integers whose
// product does not overflow, and each tensor's [begin, end) must lie inside the buffer, match
// dtype size x elements and not overlap another tensor; each failure is a kiln::FormatError naming the
// file, the field and the values. Gaps between tensors are allowed.
//
// Needs nlohmann-json (see kiln/io/json.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/dtype.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/common.hpp"
#include "kiln/io/json.hpp"
#include "kiln/io/mmap.hpp"

namespace kiln::io {

enum class SafetensorsDType { BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

struct SafetensorsDTypeInfo {
  SafetensorsDType dtype;
  std::string_view name;
  uint32_t size;  // bytes per element
};
inline constexpr SafetensorsDTypeInfo safetensors_dtypes[] = {
    {SafetensorsDType::BOOL, "BOOL", 1},       {SafetensorsDType::U8, "U8", 1},
    {SafetensorsDType::I8, "I8", 1},           {SafetensorsDType::F8_E5M2, "F8_E5M2", 1},
    {SafetensorsDType::F8_E4M3, "F8_E4M3", 1}, {SafetensorsDType::I16, "I16", 2},
    {SafetensorsDType::U16, "U16", 2},         {SafetensorsDType::F16, "F16", 2},
    {SafetensorsDType::BF16, "BF16", 2},       {SafetensorsDType::I32, "I32", 4},
    {SafetensorsDType::U32, "U32", 4},         {SafetensorsDType::F32, "F32", 4},
    {SafetensorsDType::F64, "F64", 8},         {SafetensorsDType::I64, "I64", 8},
    {SafetensorsDType::U64, "U64", 8},
};
constexpr const SafetensorsDTypeInfo& safetensors_dtype_info(SafetensorsDType d) {
  return safetensors_dtypes[static_cast<std::size_t>(d)];
}
constexpr std::optional<SafetensorsDType> parse_safetensors_dtype(std::string_view s) {
  for (const auto& i : safetensors_dtypes)
    if (i.name == s) return i.dtype;
  return std::nullopt;
}
/// The safetensors dtype of kiln dtype T (float F32, f16 F16, bf16 BF16, int8_t I8, int32_t I32).
template <class T>
constexpr SafetensorsDType safetensors_dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return SafetensorsDType::F32;
  else if constexpr (std::is_same_v<U, f16>) return SafetensorsDType::F16;
  else if constexpr (std::is_same_v<U, bf16>) return SafetensorsDType::BF16;
  else if constexpr (std::is_same_v<U, int8_t>) return SafetensorsDType::I8;
  else if constexpr (std::is_same_v<U, int32_t>) return SafetensorsDType::I32;
  else
    static_assert(sizeof(U) == 0,
                  "kiln::io: no safetensors dtype for this type (use float, f16, bf16, int8_t, int32_t)");
}

inline constexpr uint64_t safetensors_max_header = 100'000'000;  // the reference implementation's cap

/// One tensor: its dtype, shape (outermost first), offsets and a zero-copy view of its bytes.
struct SafetensorsTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::F32;
  detail::FileShape shape;
  uint64_t begin = 0, end = 0;  ///< data_offsets, relative to the byte buffer
  uint64_t n_elements = 0;
  std::span<const std::byte> data;
  std::string_view file;

  std::size_t rank() const { return shape.rank; }
  uint64_t extent(std::size_t r) const { return shape[r]; }

  template <class T, std::size_t R>
  DenseTensor<const T, R> view() const {
    if (dtype != safetensors_dtype_of<T>())
      fail<FormatError>("kiln: safetensors file '", file, "': tensor ", detail::quote_name(name), " has dtype ",
                        safetensors_dtype_info(dtype).name, ", expected ",
                        safetensors_dtype_info(safetensors_dtype_of<T>()).name);
    return detail::typed_view<T, R>(data.data(), shape, "safetensors", file, name);
  }
};

class SafetensorsFile {
 public:
  /// The file's bytes (mapped or read into memory; see MappedFile::writable_data).
  MappedFile& mapped_file() { return *file_; }
  explicit SafetensorsFile(const std::filesystem::path& path, LoadMode mode = LoadMode::map)
      : SafetensorsFile(MappedFile(path, mode)) {}
  explicit SafetensorsFile(MappedFile file)
      : file_(std::make_unique<MappedFile>(std::move(file))),
        name_(std::make_unique<const std::string>(file_->path())),
        bytes_(file_->bytes()) {
    parse();
  }
  /// Parses bytes owned by the caller (they must outlive this object); `name` is used in messages.
  SafetensorsFile(std::span<const std::byte> bytes, std::string name)
      : name_(std::make_unique<const std::string>(std::move(name))), bytes_(bytes) {
    parse();
  }

  const std::string& name() const { return *name_; }
  std::span<const std::byte> bytes() const { return bytes_; }
  /// Header length N; the byte buffer starts at 8 + N.
  uint64_t header_size() const { return header_size_; }
  uint64_t data_offset() const { return 8 + header_size_; }
  /// "__metadata__" (string to string); empty when absent.
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }
  /// All tensors, sorted by name.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }

  const SafetensorsTensor* find_tensor(std::string_view tname) const {
    const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), tname,
                                     [](const SafetensorsTensor& t, std::string_view n) { return t.name < n; });
    return it != tensors_.end() && it->name == tname ? &*it : nullptr;
  }
  const SafetensorsTensor& tensor(std::string_view tname) const {
    if (const auto* t = find_tensor(tname)) return *t;
    fail<FormatError>("kiln: safetensors file '", name(), "': tensor ", detail::quote_name(tname), " not found");
  }
  template <class T, std::size_t R>
  DenseTensor<const T, R> view(std::string_view tname) const {
    return tensor(tname).template view<T, R>();
  }

 private:
  template <class... Args>
  [[noreturn]] void error(const Args&... args) const {
    fail<FormatError>("kiln: safetensors file '", name(), "': ", args...);
  }

  void parse() {
    detail::Cursor c(bytes_, "safetensors", name());
    header_size_ = c.read<uint64_t>("the header length");
    if (header_size_ > c.remaining())
      error("header length ", header_size_, " exceeds the ", c.remaining(), " bytes after it (file size ",
            bytes_.size(), ")");
    if (header_size_ > safetensors_max_header)
      error("header length ", header_size_, " exceeds the limit of ", safetensors_max_header, " bytes");
    const auto text = detail::as_string_view(c.take(header_size_, "the header"));
    const json header = detail::parse_json(text, "safetensors", name());
    if (!header.is_object()) error("the header is a JSON ", detail::json_type_name(header), ", expected an object");
    const uint64_t buffer_size = c.remaining();
    const auto buffer = bytes_.subspan(c.pos());

    tensors_.reserve(header.size());
    for (const auto& [key, entry] : header.items()) {
      if (key == "__metadata__") {
        if (!entry.is_object()) error("__metadata__ is a JSON ", detail::json_type_name(entry), ", expected an object");
        for (const auto& [mk, mv] : entry.items()) {
          if (!mv.is_string())
            error("__metadata__ key ", detail::quote_name(mk), " is a JSON ", detail::json_type_name(mv),
                  ", expected a string");
          metadata_.emplace(mk, mv.get<std::string>());
        }
        continue;
      }
      tensors_.push_back(read_entry(key, entry, buffer_size));
      auto& t = tensors_.back();
      t.data = buffer.subspan(static_cast<std::size_t>(t.begin), static_cast<std::size_t>(t.end - t.begin));
    }
    // nlohmann's object is a std::map: items() come sorted by name already, so find_tensor can bisect.
    std::vector<const SafetensorsTensor*> by_offset;
    by_offset.reserve(tensors_.size());
    for (const auto& t : tensors_)
      if (t.end > t.begin) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
      return a->begin < b->begin || (a->begin == b->begin && a < b);  // ties: name order
    });
    for (std::size_t k = 1; k < by_offset.size(); ++k) {
      const auto* a = by_offset[k - 1];
      const auto* b = by_offset[k];
      if (a->end > b->begin)
        error("tensors ", detail::quote_name(a->name), " data_offsets [", a->begin, ", ", a->end, ") and ",
              detail::quote_name(b->name), " [", b->begin, ", ", b->end, ") overlap");
    }
  }

  SafetensorsTensor read_entry(const std::string& key, const json& entry, uint64_t buffer_size) const {
    const auto q = detail::quote_name(key);
    if (!entry.is_object()) error("tensor ", q, " is a JSON ", detail::json_type_name(entry), ", expected an object");
    SafetensorsTensor t;
    t.name = key;
    t.file = name();
    // dtype
    const auto dt = entry.find("dtype");
    if (dt == entry.end()) error("tensor ", q, " has no dtype");
    if (!dt->is_string()) error("tensor ", q, " dtype is a JSON ", detail::json_type_name(*dt), ", expected a string");
    const auto d = parse_safetensors_dtype(dt->get_ref<const std::string&>());
    if (!d) error("tensor ", q, " has unknown dtype ", detail::quote_name(dt->get_ref<const std::string&>()));
    t.dtype = *d;
    // shape
    const auto sh = entry.find("shape");
    if (sh == entry.end()) error("tensor ", q, " has no shape");
    if (!sh->is_array()) error("tensor ", q, " shape is a JSON ", detail::json_type_name(*sh), ", expected an array");
    if (sh->size() > detail::FileShape::max_rank)
      error("tensor ", q, " shape has ", sh->size(), " dimensions (at most ", detail::FileShape::max_rank,
            " supported)");
    uint64_t n = 1;
    for (const auto& dim : *sh) {
      const auto v = detail::json_u64(dim);
      if (!v) error("tensor ", q, " shape ", sh->dump(), " has an entry that is not a non-negative integer");
      const auto p = detail::mul(n, *v);
      if (!p) error("tensor ", q, " shape ", sh->dump(), " overflows: the element count exceeds 2^64 - 1");
      n = *p;
      t.shape.dims[t.shape.rank++] = *v;
    }
    t.n_elements = n;
    // data_offsets
    const auto off = entry.find("data_offsets");
    if (off == entry.end()) error("tensor ", q, " has no data_offsets");
    if (!off->is_array() || off->size() != 2)
      error("tensor ", q, " data_offsets ", off->dump(), " is not an array of two offsets");
    const auto b = detail::json_u64((*off)[0]), e = detail::json_u64((*off)[1]);
    if (!b || !e) error("tensor ", q, " data_offsets ", off->dump(), " are not non-negative integers");
    if (*b > *e) error("tensor ", q, " data_offsets [", *b, ", ", *e, ") has begin after end");
    if (*e > buffer_size)
      error("tensor ", q, " data_offsets [", *b, ", ", *e, ") is out of range: the data buffer has ", buffer_size,
            " bytes");
    const auto bytes = detail::mul(n, safetensors_dtype_info(t.dtype).size);
    if (!bytes || *bytes != *e - *b)
      error("tensor ", q, " data_offsets [", *b, ", ", *e, ") span ", *e - *b, " bytes but dtype ",
            safetensors_dtype_info(t.dtype).name, " x shape ", t.shape.str(), " needs ",
            bytes ? std::to_string(*bytes) : std::string("more than 2^64"));
    t.begin = *b;
    t.end = *e;
    return t;
  }

  std::unique_ptr<MappedFile> file_;
  std::unique_ptr<const std::string> name_;  // heap-allocated: tensors hold its address across moves
  std::span<const std::byte> bytes_;
  uint64_t header_size_ = 0;
  std::map<std::string, std::string, std::less<>> metadata_;
  std::vector<SafetensorsTensor> tensors_;
};

/// A checkpoint of one or more safetensors files. Opens `path` when it is a .safetensors file; a
/// model.safetensors.index.json (sharded: its "weight_map" names each tensor's shard, a plain file
/// name in the same directory); or a directory holding model.safetensors.index.json or
/// model.safetensors. The index's weight_map is authoritative: every listed tensor must be in its
/// shard, and only listed tensors are visible.
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::filesystem::path& path, LoadMode mode = LoadMode::map) {
    namespace fs = std::filesystem;
    fs::path p = path;
    if (fs::is_directory(p)) {
      if (fs::exists(p / "model.safetensors.index.json")) p /= "model.safetensors.index.json";
      else if (fs::exists(p / "model.safetensors")) p /= "model.safetensors";
      else
        fail<FormatError>("kiln: '", path.string(), "' has neither model.safetensors.index.json nor model.safetensors");
    }
    const std::string ps = p.string();
    source_ = ps;
    if (ps.size() >= 5 && ps.compare(ps.size() - 5, 5, ".json") == 0) {
      open_index(p, mode);
    } else {
      files_.emplace_back(p, mode);
      for (std::size_t i = 0; i < files_[0].tensors().size(); ++i)
        index_.emplace(files_[0].tensors()[i].name, std::pair<std::size_t, std::size_t>{0, i});
    }
  }

  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<SafetensorsFile>& files() { return files_; }
  /// The index file's "metadata" object (null for a single file).
  const json& index_metadata() const { return index_metadata_; }
  std::size_t size() const { return index_.size(); }
  /// Tensor names, sorted.
  std::vector<std::string_view> tensor_names() const {
    std::vector<std::string_view> out;
    out.reserve(index_.size());
    for (const auto& [k, v] : index_) out.push_back(k);
    return out;
  }
  const SafetensorsTensor* find_tensor(std::string_view tname) const {
    const auto it = index_.find(tname);
    return it == index_.end() ? nullptr : &files_[it->second.first].tensors()[it->second.second];
  }
  const SafetensorsTensor& tensor(std::string_view tname) const {
    if (const auto* t = find_tensor(tname)) return *t;
    fail<FormatError>("kiln: safetensors checkpoint '", source_, "': tensor ", detail::quote_name(tname), " not found");
  }
  template <class T, std::size_t R>
  DenseTensor<const T, R> view(std::string_view tname) const {
    return tensor(tname).template view<T, R>();
  }

 private:
  void open_index(const std::filesystem::path& p, LoadMode mode) {
    const MappedFile f(p, LoadMode::read);
    const json j = detail::parse_json(detail::as_string_view(f.bytes()), "safetensors index", source_);
    auto error = [&](const auto&... args) {
      fail<FormatError>("kiln: safetensors index file '", source_, "': ", args...);
    };
    if (!j.is_object()) error("the index is a JSON ", detail::json_type_name(j), ", expected an object");
    if (const auto m = j.find("metadata"); m != j.end()) index_metadata_ = *m;
    const auto wm = j.find("weight_map");
    if (wm == j.end()) error("no weight_map");
    if (!wm->is_object()) error("weight_map is a JSON ", detail::json_type_name(*wm), ", expected an object");
    std::map<std::string, std::size_t, std::less<>> shard_index;
    for (const auto& [tname, shard] : wm->items()) {
      if (!shard.is_string())
        error("weight_map entry ", detail::quote_name(tname), " is a JSON ", detail::json_type_name(shard),
              ", expected a string");
      const auto& s = shard.get_ref<const std::string&>();
      if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos || s.find('\\') != std::string::npos ||
          s.find('\0') != std::string::npos)
        error("weight_map entry ", detail::quote_name(tname), " names shard ", detail::quote_name(s),
              ", which is not a plain file name in the index's directory");
      auto it = shard_index.find(s);
      if (it == shard_index.end()) {
        files_.emplace_back(p.parent_path() / s, mode);
        it = shard_index.emplace(s, files_.size() - 1).first;
      }
      const auto& file = files_[it->second];
      const auto* t = file.find_tensor(tname);
      if (!t)
        error("tensor ", detail::quote_name(tname), " is listed for shard ", detail::quote_name(s),
              " but that file does not contain it");
      index_.emplace(
          tname, std::pair<std::size_t, std::size_t>{it->second, static_cast<std::size_t>(t - file.tensors().data())});
    }
  }

  std::string source_;
  std::vector<SafetensorsFile> files_;
  json index_metadata_;
  std::map<std::string, std::pair<std::size_t, std::size_t>, std::less<>> index_;
};

}  // namespace kiln::io
