// libFuzzer target: the safetensors reader (8-byte length, JSON header, tensor table) on arbitrary
// bytes. Any exception other than kiln::FormatError, any crash and any sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <span>

#include "kiln/io/safetensors.hpp"

namespace {
volatile uint64_t g_sink = 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kiln::io::SafetensorsFile f(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size),
                                      "fuzz.safetensors");
    for (const auto& [k, v] : f.metadata()) g_sink = g_sink + k.size() + v.size();
    for (const auto& t : f.tensors()) {
      if (!t.data.empty())
        g_sink = g_sink + std::to_integer<uint8_t>(t.data.front()) + std::to_integer<uint8_t>(t.data.back());
      if (f.find_tensor(t.name) != &t) __builtin_trap();
      try {
        if (t.dtype == kiln::io::SafetensorsDType::F32 && t.n_elements > 0 && t.rank() <= 4)
          g_sink = g_sink + (t.view<float, 4>().data()[0] != 0);
        if (t.dtype == kiln::io::SafetensorsDType::BF16 && t.n_elements > 0 && t.rank() <= 4)
          g_sink = g_sink + t.view<kiln::bf16, 4>().data()[0].bits;
      } catch (const kiln::FormatError&) {  // misaligned data
      }
    }
  } catch (const kiln::FormatError&) {
  }
  return 0;
}
