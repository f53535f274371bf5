// Writes the generated part of the fuzzers' seed corpus: small valid GGUF files (every metadata type,
// nested arrays, quantized and float tensors, a non-default alignment) and safetensors files (several
// dtypes, metadata, a scalar, an empty tensor, gaps). Usage: kiln_fuzz_seeds <dir>  (writes
// <dir>/gguf/* and <dir>/safetensors/*). scripts/fuzz.sh adds the committed fixtures and
// ../shared/models/stories260K.gguf next to these.
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/io/gguf_writer.hpp"

namespace fs = std::filesystem;
using kiln::io::GGMLType;
using kiln::io::GGUFWriter;

namespace {

void put(const fs::path& p, const std::vector<std::byte>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = std::byte((i * 131 + seed * 17 + 3) & 0xff);
  return b;
}

std::vector<std::byte> safetensors(const nlohmann::json& header, std::size_t data_bytes) {
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');
  std::vector<std::byte> out(8);
  const uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  for (char c : h) out.push_back(std::byte(c));
  const auto d = pattern(data_bytes, 5);
  out.insert(out.end(), d.begin(), d.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <seed dir>\n", argv[0]);
    return 2;
  }
  const fs::path dir = argv[1];
  fs::create_directories(dir / "gguf");
  fs::create_directories(dir / "safetensors");

  {  // every metadata type, a few tensors
    GGUFWriter w;
    w.add("general.architecture", "llama");
    w.add("llama.block_count", uint32_t(2));
    w.add("u8", uint8_t(1));
    w.add("i8", int8_t(-1));
    w.add("u16", uint16_t(2));
    w.add("i16", int16_t(-2));
    w.add("i32", int32_t(-3));
    w.add("f32", 0.5f);
    w.add("b", true);
    w.add("u64", uint64_t(4));
    w.add("i64", int64_t(-4));
    w.add("f64", 0.25);
    w.add("tokenizer.ggml.tokens", std::vector<std::string>{"<unk>", "<s>", "</s>", "a", "b"});
    w.add("tokenizer.ggml.scores", std::vector<float>{0, 0, 0, -1, -2});
    w.add("nested", std::vector<std::vector<int32_t>>{{1, 2}, {}, {3}});
    w.add("bools", std::vector<bool>{true, false});
    const auto f32 = pattern(4 * 8 * 2, 1);
    w.add_tensor("w.f32", GGMLType::F32, {8, 2}, f32);
    const auto f16 = pattern(2 * 16, 2);
    w.add_tensor("w.f16", GGMLType::F16, {16}, f16);
    put(dir / "gguf" / "all_types.gguf", w.to_bytes());
  }
  {  // quantized tensors, alignment 64
    GGUFWriter w(64);
    w.add("general.architecture", "qwen2");
    const GGMLType types[] = {GGMLType::Q4_0, GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q8_0,
                              GGMLType::Q4_K, GGMLType::Q6_K, GGMLType::BF16, GGMLType::I32};
    unsigned seed = 10;
    for (GGMLType t : types) {
      const auto info = kiln::io::ggml_type_info(t);
      const uint64_t ne0 = info.block_size * 2;
      const auto data = pattern(2 * info.type_size * 3, seed++);
      w.add_tensor(std::string("t.") + std::string(info.name), t, {ne0, 3}, data);
    }
    put(dir / "gguf" / "quant_align64.gguf", w.to_bytes());
  }
  {  // metadata only, and an empty file
    GGUFWriter w;
    w.add("general.architecture", "gemma3");
    w.add("s", std::vector<std::vector<std::string>>{{"x", "y"}, {"z"}});
    put(dir / "gguf" / "metadata_only.gguf", w.to_bytes());
    put(dir / "gguf" / "no_kv.gguf", GGUFWriter().to_bytes());
  }

  using nlohmann::json;
  auto entry = [](const char* dtype, std::vector<uint64_t> shape, uint64_t b, uint64_t e) {
    return json{{"dtype", dtype}, {"shape", shape}, {"data_offsets", {b, e}}};
  };
  put(dir / "safetensors" / "simple.safetensors",
      safetensors(json{{"a", entry("F32", {2, 3}, 0, 24)}, {"b", entry("BF16", {4}, 24, 32)}}, 32));
  put(dir / "safetensors" / "metadata.safetensors", safetensors(json{{"__metadata__", {{"format", "pt"}}},
                                                                     {"x", entry("F16", {2, 2}, 0, 8)},
                                                                     {"y", entry("I8", {3}, 8, 11)},
                                                                     {"z", entry("I32", {}, 12, 16)},
                                                                     {"e", entry("F64", {0, 5}, 16, 16)}},
                                                                16));
  put(dir / "safetensors" / "dtypes.safetensors", safetensors(json{{"u8", entry("U8", {1}, 0, 1)},
                                                                   {"bool", entry("BOOL", {1}, 1, 2)},
                                                                   {"f8", entry("F8_E4M3", {2}, 2, 4)},
                                                                   {"i64", entry("I64", {1}, 8, 16)},
                                                                   {"u16", entry("U16", {1, 1, 1, 1, 1}, 16, 18)}},
                                                              24));
  std::printf("kiln_fuzz_seeds: wrote seeds to %s\n", dir.string().c_str());
  return 0;
}
