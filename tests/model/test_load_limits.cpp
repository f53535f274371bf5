// Loading a model whose file states absurd values (issue 37): each fails at load, naming the key or the
// tensor and the limit, or is warned about; a Session whose KV cache exceeds the machine's memory fails
// before allocating it; model/check_tensors.hpp finds NaN and Inf weights.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/model/check_tensors.hpp"
#include "model/model_test_util.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

fs::path limits_temp(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kiln_load_limits_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d / name;
}

struct Edits {
  std::map<std::string, uint64_t> u64 = {};                      ///< metadata keys replaced by a UINT64 value
  std::map<std::string, int64_t> i64 = {};                       ///< metadata keys replaced by an INT64 value
  std::string tensor = {};                                       ///< a tensor whose type is replaced...
  io::GGMLType type = io::GGMLType::F32;                         ///< ...by this one of the same element size
  std::function<void(std::vector<std::byte>&)> patch_data = {};  ///< edits that tensor's bytes
  std::map<std::string, std::string> add_str = {};               ///< string metadata added
  std::vector<float> rope_freqs = {};                            ///< added as a rope_freqs.weight tensor (f32)
};

// stories260K.gguf copied with `e` applied.
fs::path limits_copy(const std::string& name, const Edits& e) {
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  io::GGUFWriter w;
  for (const auto& v : f.metadata()) {
    const std::string key(v.key());
    if (key == "general.alignment") continue;
    if (const auto it = e.u64.find(key); it != e.u64.end()) w.add(key, it->second);
    else if (const auto jt = e.i64.find(key); jt != e.i64.end()) w.add(key, jt->second);
    else w.add(key, v);
  }
  for (const auto& [key, value] : e.add_str) w.add(key, value);
  for (const auto& t : f.tensors()) {
    std::vector<std::byte> bytes(t.data.begin(), t.data.end());
    io::GGMLType type = t.type;
    if (t.name == e.tensor) {
      type = e.type;
      if (e.patch_data) e.patch_data(bytes);
    }
    w.add_tensor(std::string(t.name), type, std::span<const uint64_t>(t.ne.data(), t.n_dims), bytes);
  }
  if (!e.rope_freqs.empty()) {
    const uint64_t ne[1] = {e.rope_freqs.size()};
    std::vector<std::byte> bytes(e.rope_freqs.size() * sizeof(float));
    std::memcpy(bytes.data(), e.rope_freqs.data(), bytes.size());
    w.add_tensor("rope_freqs.weight", io::GGMLType::F32, std::span<const uint64_t>(ne, 1), bytes);
  }
  const fs::path out = limits_temp(name);
  w.write(out);
  return out;
}

std::vector<std::string>& limits_warnings() {
  static std::vector<std::string> w;
  return w;
}

}  // namespace

TEST_CASE("load limits: block_count beyond the file's tensors fails naming the key") {
  const fs::path p = limits_copy("layers.gguf", {.u64 = {{"llama.block_count", 0xFFFFFFFFull}}});
  CHECK_THROWS_WITH_AS(load(p), doctest::Contains("llama.block_count = 4294967295 but the file has only"), FormatError);
}

TEST_CASE("load limits: RoPE scaling other than linear and YaRN, and bad rope_freqs factors, are refused naming them") {
  const fs::path longrope = limits_copy("longrope.gguf", {.add_str = {{"llama.rope.scaling.type", "longrope"}}});
  CHECK_THROWS_WITH_AS(load(longrope), doctest::Contains("llama.rope.scaling.type = 'longrope' is not supported"),
                       FormatError);
  // YaRN with no factor: 1, nothing scaled; DeepSeek's own attention factor key is refused.
  const fs::path yarn = limits_copy("yarn.gguf", {.add_str = {{"llama.rope.scaling.type", "yarn"}}});
  const auto factors = load(yarn).hparams().rope_freq_factors;
  CHECK(factors.size() == 4);
  for (const float f : factors) CHECK(f == doctest::Approx(1.0f).epsilon(1e-6));
  CHECK(load(yarn).hparams().rope_mscale == 1.0f);
  const fs::path log_mul = limits_copy(
      "yarn_log.gguf",
      {.add_str = {{"llama.rope.scaling.type", "yarn"}, {"llama.rope.scaling.yarn_log_multiplier", "0.1"}}});
  CHECK_THROWS_WITH_AS(load(log_mul), doctest::Contains("llama.rope.scaling.yarn_log_multiplier"), FormatError);
  const fs::path linear = limits_copy("linear.gguf", {.add_str = {{"llama.rope.scaling.type", "linear"}}});
  CHECK(load(linear).hparams().rope_linear_factor == 1.0f);  // no factor given: 1
  // stories260K: head_dim 8, so 4 factors (Llama 3.x's; tests/model/test_hf_models.cpp runs a real one).
  const fs::path zero = limits_copy("freqs0.gguf", {.rope_freqs = {1, 2, 0, 8}});
  CHECK_THROWS_WITH_AS(load(zero), doctest::Contains("tensor 'rope_freqs.weight' holds the RoPE frequency factor 0"),
                       FormatError);
  const fs::path three = limits_copy("freqs3.gguf", {.rope_freqs = {1, 2, 8}});
  CHECK_THROWS_WITH_AS(load(three), doctest::Contains("tensor 'rope_freqs.weight' has 3 RoPE frequency factors"),
                       FormatError);
  const fs::path good = limits_copy("freqs.gguf", {.rope_freqs = {1, 2, 4, 8}});
  CHECK(load(good).hparams().rope_freq_factors == std::vector<float>{1, 2, 4, 8});
}

TEST_CASE("load limits: num_hidden_layers beyond a checkpoint's tensors fails naming the key") {
  const fs::path dir = limits_temp("hf_layers");
  fs::create_directories(dir);
  const fs::path src = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/models/llama";
  fs::copy_file(src / "model.safetensors", dir / "model.safetensors", fs::copy_options::overwrite_existing);
  std::string cfg = read_text((src / "config.json").string());
  const auto at = cfg.find("\"num_hidden_layers\"");
  REQUIRE(at != std::string::npos);
  const auto colon = cfg.find(':', at), end = cfg.find_first_of(",}", colon);
  cfg.replace(colon + 1, end - colon - 1, " 2147483647");
  std::ofstream(dir / "config.json") << cfg;
  CHECK_THROWS_WITH_AS(load(dir), doctest::Contains("num_hidden_layers = 2147483647 but the checkpoint has only"),
                       FormatError);
}

TEST_CASE("load limits: a huge context_length fails naming the key and the limit") {
  const fs::path p = limits_copy("ctx.gguf", {.u64 = {{"llama.context_length", uint64_t(1) << 40}}});
  CHECK_THROWS_WITH_AS(load(p),
                       doctest::Contains("llama.context_length = 1099511627776 exceeds kiln's limit of 4294967296"),
                       FormatError);
}

TEST_CASE("load limits: a weight of a type kiln cannot multiply by fails at load naming the tensor") {
  const fs::path p = limits_copy("i32.gguf", {.tensor = "blk.1.attn_k.weight", .type = io::GGMLType::I32});
  CHECK_THROWS_WITH_AS(load(p), doctest::Contains("weight 'blk.1.attn_k.weight' has type i32 (26)"), FormatError);
}

TEST_CASE("load limits: BOS/UNK ids outside the vocabulary are warned about") {
  limits_warnings().clear();
  const WarningHandler old = set_warning_handler([](std::string_view m) { limits_warnings().emplace_back(m); });
  const fs::path p = limits_copy(
      "bos.gguf", {.i64 = {{"tokenizer.ggml.bos_token_id", 100000}, {"tokenizer.ggml.unknown_token_id", 512}}});
  const Model m = load(p);
  set_warning_handler(old);
  CHECK(m.tokenizer().bos() == -1);
  CHECK(m.tokenizer().unk() == -1);
  REQUIRE(limits_warnings().size() == 2);
  CHECK(limits_warnings()[0].find("tokenizer.ggml.bos_token_id = 100000 is outside the vocabulary of 512 tokens") !=
        std::string::npos);
  CHECK(limits_warnings()[1].find("tokenizer.ggml.unknown_token_id = 512") != std::string::npos);
  // llama.cpp's "none" (-1, or 0xFFFFFFFF written as uint32) is not warned about.
  limits_warnings().clear();
  set_warning_handler([](std::string_view m) { limits_warnings().emplace_back(m); });
  const Model none = load(limits_copy("bos_none.gguf", {.u64 = {{"tokenizer.ggml.bos_token_id", 0xFFFFFFFFull}}}));
  set_warning_handler(old);
  CHECK(none.tokenizer().bos() == -1);
  CHECK(limits_warnings().empty());
}

TEST_CASE("load limits: a KV cache beyond the available memory fails before allocating, naming the size") {
  const Model m = load(shared_model("stories260K.gguf"));
  const auto avail = available_memory_bytes();
  REQUIRE(avail.has_value());  // Linux: /proc/meminfo
  // 5 layers x 4 KV heads x 8 dims x K and V x 2 bytes = 640 bytes a position: 2^40 positions, 640 TiB.
  CHECK(kv_cache_bytes(5, 4, 8, 1, KVType::f16) == 640.0);
  const WarningHandler old = set_warning_handler([](std::string_view) {});  // beyond the trained context
  CHECK_THROWS_WITH(Session(m, {.ctx = std::size_t(1) << 40}),
                    doctest::Contains("the KV cache for a context of 1099511627776 positions (SessionOptions::ctx) "
                                      "needs 655360.00 GiB, "));
  set_warning_handler(old);
}

TEST_CASE("load limits: check_tensors_finite names the first NaN or infinite element") {
  CHECK_NOTHROW(check_tensors_finite(io::GGUFFile(shared_model("stories260K.gguf"))));
  auto put = [](std::size_t i, float x) {
    return [=](std::vector<std::byte>& b) { std::memcpy(b.data() + i * sizeof(float), &x, sizeof x); };
  };
  const fs::path nan =
      limits_copy("nan.gguf", {.tensor = "blk.3.ffn_down.weight", .patch_data = put(5, std::nanf(""))});
  CHECK_THROWS_WITH_AS(check_tensors_finite(io::GGUFFile(nan)),
                       doctest::Contains("tensor 'blk.3.ffn_down.weight' (f32) has NaN at element 5"), FormatError);
  const fs::path inf = limits_copy("inf.gguf", {.tensor = "output_norm.weight", .patch_data = put(0, INFINITY)});
  CHECK_THROWS_WITH_AS(check_tensors_finite(io::GGUFFile(inf)),
                       doctest::Contains("tensor 'output_norm.weight' (f32) has an infinite value at element 0"),
                       FormatError);
  // A quantized block with an infinite scale.
  const fs::path q = limits_temp("q8.gguf");
  {
    io::GGUFWriter w;
    std::vector<block_q8_0> blocks(2);
    std::vector<float> row(64, 0.5f);
    quantize_row(row.data(), blocks.data(), row.size());
    blocks[1].d = f16::from_bits(0x7C00);  // +inf
    w.add_tensor("x", io::GGMLType::Q8_0, {64}, std::as_bytes(std::span(blocks)));
    w.write(q);
  }
  CHECK_THROWS_WITH(check_tensors_finite(io::GGUFFile(q)), doctest::Contains("tensor 'x' (q8_0)"));
}

}  // namespace kiln::test
