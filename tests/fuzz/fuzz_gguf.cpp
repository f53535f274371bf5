// libFuzzer target: the GGUF reader on arbitrary bytes. Any exception other than kiln::FormatError, any
// crash and any sanitizer report is a finding. Every parsed value and tensor is touched so that ASan
// checks the views the parser hands out, not only the parse itself.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/io/gguf.hpp"

namespace {

volatile uint64_t g_sink = 0;

template <class T>
void try_as(const kiln::io::GGUFValue& v) {
  try {
    const auto x = v.as<T>();
    if constexpr (kiln::io::detail::is_std_vector<T>::value) g_sink = g_sink + x.size();
    else if constexpr (std::is_same_v<T, std::string>) g_sink = g_sink + x.size();
    else if constexpr (std::is_floating_point_v<T>) g_sink = g_sink + (x != 0);
    else g_sink = g_sink + static_cast<uint64_t>(x);
  } catch (const kiln::FormatError&) {
  }
}

void touch(std::span<const std::byte> s) {
  if (!s.empty()) g_sink = g_sink + std::to_integer<uint8_t>(s.front()) + std::to_integer<uint8_t>(s.back());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kiln::io::GGUFFile f(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size), "fuzz.gguf");
    for (const auto& v : f.metadata()) {
      g_sink = g_sink + v.to_string(4).size();
      touch(v.raw());
      try_as<int64_t>(v);
      try_as<uint64_t>(v);
      try_as<double>(v);
      try_as<bool>(v);
      try_as<std::string>(v);
      try_as<std::vector<std::string>>(v);
      try_as<std::vector<int32_t>>(v);
      try_as<std::vector<float>>(v);
      try_as<std::vector<std::vector<int64_t>>>(v);
      if (v.type() == kiln::io::GGUFValueType::ARRAY && v.size() > 0) g_sink = g_sink + v.at(v.size() - 1).raw().size();
    }
    try {
      g_sink = g_sink + f.architecture().size();
    } catch (const kiln::FormatError&) {
    }
    for (const auto& t : f.tensors()) {
      touch(t.data);
      g_sink = g_sink + t.rows() + t.row_bytes();
      if (f.find_tensor(t.name) != &t) __builtin_trap();
      try {
        if (t.type == kiln::io::GGMLType::F32 && t.n_elements > 0)
          g_sink = g_sink + (t.view<float, 4>().data()[0] != 0);
        if (t.type == kiln::io::GGMLType::F16 && t.n_elements > 0)
          g_sink = g_sink + t.view<kiln::f16, 4>().data()[0].bits;
      } catch (const kiln::FormatError&) {  // misaligned caller bytes
      }
    }
  } catch (const kiln::FormatError&) {
  }
  return 0;
}
