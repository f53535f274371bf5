// Llama (and Llama 3.x / YaRN RoPE scaling), Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3 (and LongRoPE) and
// Granite against Hugging Face transformers: tiny random checkpoints
// (tests/fixtures/models/<name>/, made by scripts/fixtures/make_tiny_models.py) loaded from safetensors +
// config.json and from their GGUF conversion (llama.cpp's conventions), logits compared with HF's at
// every position; and the loader's errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/model/model.hpp"
#include "model_test_util.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

// Tolerance: max |kiln - HF| over a position's logits, relative to that position's logit range. Both
// run f32 (kiln with an f32 KV cache, as HF keeps it); the sums differ in order (and kiln's cos/sin are
// rounded once from double), ~1e-6 measured.
constexpr double kTol = 1e-4;
constexpr KVType kKV = KVType::f32;

std::string fixture_dir(const std::string& name) {
  const std::string d = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/models/" + name;
  if (!fs::exists(d + "/reference.json"))
    FAIL("missing fixture '", d, "' (scripts/fixtures/make_tiny_models.py makes it)");
  return d;
}

struct Reference {
  std::vector<int32_t> tokens;
  std::size_t vocab = 0;
  std::vector<float> logits;  // (tokens, vocab)
  std::span<const float> row(std::size_t p) const { return {logits.data() + p * vocab, vocab}; }
};

Reference read_reference(const std::string& dir) {
  const auto meta = nlohmann::json::parse(read_text(dir + "/reference.json"));
  Reference r;
  r.tokens = meta.at("tokens").get<std::vector<int32_t>>();
  const auto shape = meta.at("shape").get<std::vector<std::size_t>>();
  REQUIRE(shape.size() == 2);
  REQUIRE(shape[0] == r.tokens.size());
  r.vocab = shape[1];
  r.logits = read_logits(dir + "/" + meta.at("logits").get<std::string>(), shape);
  return r;
}

/// Every position through decode steps (n = 1), then through prompt batches of 7 on 2 threads (chunk
/// ends checked, the KV cache carrying earlier chunks), then the whole sequence as one batch.
/// Returns the worst relative error seen.
double check_model(const Model& m, const Reference& ref, const std::string& what) {
  INFO(what);
  REQUIRE(m.hparams().vocab == ref.vocab);
  double worst = 0;
  auto check = [&](std::span<const float> got, std::size_t p, const std::string& how) {
    const double e = rel_error(got, ref.row(p));
    INFO(how, " position ", p, ": max |delta| / range = ", e);
    CHECK(e <= kTol);
    if (!(e <= worst)) worst = e;
    // Greedy decoding picks HF's token wherever HF's top two are further apart than the two tolerances.
    const auto want = ref.row(p);
    const std::size_t top = std::size_t(std::max_element(want.begin(), want.end()) - want.begin());
    float second = -INFINITY;
    for (std::size_t i = 0; i < want.size(); ++i)
      if (i != top) second = std::max(second, want[i]);
    const auto [lo, hi] = std::minmax_element(want.begin(), want.end());
    if (double(want[top]) - double(second) > 2 * kTol * (double(*hi) - double(*lo)))
      CHECK(std::size_t(std::max_element(got.begin(), got.end()) - got.begin()) == top);
  };
  const std::size_t n = ref.tokens.size();
  Session s(m, {.ctx = 64, .threads = 1, .kv_type = kKV});
  for (std::size_t p = 0; p < n; ++p) check(s.eval(ref.tokens[p]), p, "decode");
  Session b(m, {.ctx = 48, .threads = 2, .batch = 7, .kv_type = kKV});
  const std::span<const int32_t> t(ref.tokens);
  for (std::size_t p = 0; p < n;) {
    const std::size_t k = std::min<std::size_t>(p == 0 ? 10 : 7, n - p);
    check(b.eval(t.subspan(p, k)), p + k - 1, "batched");
    p += k;
  }
  Session w(m, {.ctx = n, .threads = 2, .kv_type = kKV});
  check(w.eval(t), n - 1, "one batch");
  MESSAGE(what, ": worst max |delta| / range = ", worst);
  return worst;
}

/// A copy of a fixture directory in a temporary folder, removed afterwards.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& from) {
    static int counter = 0;
    path = fs::temp_directory_path() / ("kiln-test-hf-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(path);
    for (const auto& e : fs::directory_iterator(from))
      if (e.path().filename() != "model.gguf") fs::copy_file(e.path(), path / e.path().filename());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  nlohmann::json config() const { return nlohmann::json::parse(read_text((path / "config.json").string())); }
  void write_config(const nlohmann::json& j) const { std::ofstream(path / "config.json") << j.dump(1); }
};

std::string load_error(const fs::path& p) {
  try {
    (void)load(p);
  } catch (const FormatError& e) {
    return e.what();
  }
  FAIL("loading '", p.string(), "' did not throw a kiln::FormatError");
  return {};
}

void check_both(const std::string& name, bool gguf) {
  const std::string dir = fixture_dir(name);
  const Reference ref = read_reference(dir);
  const Model hf = load(dir);
  CHECK(hf.hparams().rope_style == RopeStyle::neox);
  check_model(hf, ref, name + " (safetensors)");
  if (gguf) check_model(load(dir + "/model.gguf"), ref, name + " (GGUF)");
}

TEST_CASE("hf models: Llama from safetensors and GGUF matches transformers at every position") {
  check_both("llama", true);
  const Model g = load(fixture_dir("llama") + "/model.gguf");
  CHECK(!g.hparams().rope_style.has_value());  // the Config's gptj: llama.cpp permuted q/k
  CHECK(g.architecture() == "llama");
}

TEST_CASE("hf models: Llama 3.x RoPE scaling (rope_type llama3; GGUF rope_freqs.weight) matches transformers") {
  check_both("llama3", true);
  const std::string dir = fixture_dir("llama3");
  const Model hf = load(dir), g = load(dir + "/model.gguf");
  // The tiny config's original context of 64 puts its 8 frequencies in all three bands.
  const auto& fh = hf.hparams().rope_freq_factors;
  const auto& fg = g.hparams().rope_freq_factors;
  REQUIRE(fh.size() == 8);
  REQUIRE(fg.size() == 8);
  CHECK(fh[0] == 1.0f);
  CHECK(fh[7] == 8.0f);
  for (std::size_t i = 0; i < 8; ++i) CHECK(fh[i] == doctest::Approx(fg[i]).epsilon(1e-6));
  CHECK(fh[1] > 1.0f);
  CHECK(fh[1] < 8.0f);
  // Without the scaling, the same weights are another model at these positions.
  TempDir d(dir);
  auto j = d.config();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  d.write_config(j);
  const Model plain = load(d.path);
  CHECK(plain.hparams().rope_freq_factors.empty());
  const Reference ref = read_reference(dir);
  Session s(plain, {.ctx = 64, .kv_type = kKV});
  CHECK(rel_error(s.eval(ref.tokens), ref.row(ref.tokens.size() - 1)) > 100 * kTol);
  // Missing llama3 parameters are an error naming them.
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"rope_theta", 10000.0}};
  d.write_config(j);
  CHECK(load_error(d.path).find("rope scaling type 'llama3' needs low_freq_factor") != std::string::npos);
}

TEST_CASE("hf models: YaRN RoPE scaling (rope_type yarn; GGUF rope.scaling.type yarn) matches transformers") {
  check_both("llama-yarn", true);
  const std::string dir = fixture_dir("llama-yarn");
  const Model hf = load(dir), g = load(dir + "/model.gguf");
  // factor 2 from an original context of 64: frequency 0 kept, 1 and 2 blended, 3.. interpolated (/ 2).
  const auto& fh = hf.hparams().rope_freq_factors;
  const auto& fg = g.hparams().rope_freq_factors;
  REQUIRE(fh.size() == 8);
  REQUIRE(fg.size() == 8);
  CHECK(fh[0] == 1.0f);
  CHECK(fh[1] > 1.0f);
  CHECK(fh[2] < 2.0f);
  for (std::size_t i = 3; i < 8; ++i) CHECK(fh[i] == 2.0f);
  for (std::size_t i = 0; i < 8; ++i) CHECK(fh[i] == fg[i]);
  CHECK(hf.hparams().rope_mscale == doctest::Approx(0.1 * std::log(2.0) + 1).epsilon(1e-6));
  CHECK(g.hparams().rope_mscale == doctest::Approx(0.1 * std::log(2.0) + 1).epsilon(1e-6));
  // The frequencies and the attention factor each change these logits.
  const Reference ref = read_reference(dir);
  TempDir d(dir);
  const auto base = d.config();
  for (const auto& rp : {nlohmann::json{{"rope_type", "default"}, {"rope_theta", 10000.0}},
                         nlohmann::json{{"rope_type", "yarn"},
                                        {"rope_theta", 10000.0},
                                        {"factor", 2.0},
                                        {"original_max_position_embeddings", 64},
                                        {"attention_factor", 1.0}}}) {
    INFO(rp.dump());
    auto j = base;
    j["rope_parameters"] = rp;
    d.write_config(j);
    Session s(load(d.path), {.ctx = 64, .kv_type = kKV});
    CHECK(rel_error(s.eval(ref.tokens), ref.row(ref.tokens.size() - 1)) > 100 * kTol);
  }
}

TEST_CASE("hf models: Mistral (head_dim 16 != 32 / 4, GGUF 'llama') and its sliding window match transformers") {
  check_both("mistral", true);
  const Model g = load(fixture_dir("mistral") + "/model.gguf");
  CHECK(g.architecture() == "llama");
  CHECK(g.hparams().head_dim == 16);
  CHECK(g.hparams().sliding_layers.empty());
  // mistral-swa: sliding_window 8 on both layers (safetensors only: llama.cpp applies none to a GGUF).
  const std::string dir = fixture_dir("mistral-swa");
  const Model swa = load(dir);
  CHECK(swa.hparams().sliding_window == 8);
  CHECK(swa.hparams().sliding_layers == std::vector<bool>{true, true});
  const Reference ref = read_reference(dir);
  check_model(swa, ref, "mistral-swa");
  // The window matters at these positions: without it the same weights give other logits.
  TempDir d(dir);
  auto j = d.config();
  j["sliding_window"] = nullptr;
  d.write_config(j);
  const Model full = load(d.path);
  CHECK(full.hparams().sliding_layers.empty());
  Session s(full, {.ctx = 64, .kv_type = kKV});
  CHECK(rel_error(s.eval(ref.tokens), ref.row(ref.tokens.size() - 1)) > 100 * kTol);
}

TEST_CASE("hf models: Qwen's use_sliding_window slides the layers from max_window_layers on; other Configs refuse it") {
  // transformers' Qwen2/Qwen3(-MoE)Config: layer i is "sliding_attention" when use_sliding_window and
  // i >= max_window_layers, with window sliding_window.
  for (const std::string name : {"qwen2", "qwen3", "qwen2moe", "qwen3moe"}) {
    INFO(name);
    TempDir d(fixture_dir(name));
    auto j = d.config();
    const std::size_t layers = j["num_hidden_layers"].get<std::size_t>();
    // transformers derives layer_types from use_sliding_window only when the file lists none (the fixtures
    // written by transformers 5 list them, all full_attention, which would then decide).
    j.erase("layer_types");
    j["use_sliding_window"] = true;
    j["sliding_window"] = 8;
    j["max_window_layers"] = 1;
    d.write_config(j);
    const Model m = load(d.path);
    std::vector<bool> want(layers, true);
    want[0] = false;
    CHECK(m.hparams().sliding_window == 8);
    CHECK(m.hparams().sliding_layers == want);
  }
  TempDir d(fixture_dir("llama"));
  auto j = d.config();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 8;
  d.write_config(j);
  CHECK(load_error(d.path).find("use_sliding_window = true is not supported for llama") != std::string::npos);
}

TEST_CASE("hf models: Granite (embedding, attention, residual and logit multipliers) matches transformers") {
  check_both("granite", true);
  for (const std::string f : {"", "/model.gguf"}) {
    const Model m = load(fixture_dir("granite") + f);
    const HParams& hp = m.hparams();
    INFO("file '", f, "'");
    CHECK(m.architecture() == "granite");
    CHECK(hp.embed_scale == 4.0f);
    CHECK(hp.residual_scale == 0.5f);
    CHECK(hp.logit_scale == 3.0f);
    CHECK(hp.attn_scale == 0.2f);
    CHECK(m.impl().weights().output.data == m.impl().weights().tok_embd.data);  // tied
  }
  CHECK(!load(fixture_dir("granite") + "/model.gguf").hparams().rope_style.has_value());  // gptj: permuted q/k
}

TEST_CASE("hf models: Gemma 2 (attention and final soft-caps, sliding window on even layers) matches transformers") {
  check_both("gemma2", true);
  for (const std::string f : {"", "/model.gguf"}) {
    const Model m = load(fixture_dir("gemma2") + f);
    const HParams& hp = m.hparams();
    INFO("file '", f, "'");
    CHECK(m.architecture() == "gemma2");
    CHECK(hp.attn_softcap == 2.0f);
    CHECK(hp.final_softcap == 8.0f);
    CHECK(hp.sliding_window == 4);
    CHECK(hp.rope_theta == 10000.0f);
    CHECK(hp.attn_scale == doctest::Approx(0.25).epsilon(1e-7));
  }
  // safetensors: layer_types; GGUF: llama.cpp's pattern of 2 (the Config's), the same layers.
  CHECK(load(fixture_dir("gemma2")).hparams().sliding_layers == std::vector<bool>{true, false, true, false});
  // Each soft-cap bends these logits: without one the same weights give others.
  const Reference ref = read_reference(fixture_dir("gemma2"));
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    INFO(key);
    TempDir d(fixture_dir("gemma2"));
    auto j = d.config();
    j[key] = nullptr;
    d.write_config(j);
    Session s(load(d.path), {.ctx = 64, .kv_type = kKV});
    CHECK(rel_error(s.eval(ref.tokens), ref.row(ref.tokens.size() - 1)) > 100 * kTol);
  }
}

TEST_CASE("hf models: Phi-3 (fused qkv and gate_up, partial rotary) from safetensors and GGUF matches transformers") {
  check_both("phi3", true);
  for (const std::string f : {"", "/model.gguf"}) {
    const Model m = load(fixture_dir("phi3") + f);
    INFO("file '", f, "'");
    CHECK(m.architecture() == "phi3");
    CHECK(m.hparams().head_dim == 16);
    CHECK(m.hparams().rope_dim == 8);  // partial_rotary_factor 0.5
    // q, k, v (and gate, up) are row ranges of one matrix of the file.
    const LayerWeights& L = m.impl().weights().layers[1];
    CHECK(L.wq.rows == 64);
    CHECK(L.wk.rows == 32);
    CHECK(L.wk.data == L.wq.data + 64 * L.wq.row_bytes);
    CHECK(L.wv.data == L.wk.data + 32 * L.wk.row_bytes);
    CHECK(L.w_up.data == L.w_gate.data + 64 * L.w_gate.row_bytes);
    CHECK(m.impl().weights().output.data != m.impl().weights().tok_embd.data);  // untied
  }
  // phi3-swa: sliding_window 8 on every layer (safetensors only: llama.cpp disables it for a GGUF).
  const std::string swa_dir = fixture_dir("phi3-swa");
  const Model swa = load(swa_dir);
  CHECK(swa.hparams().sliding_window == 8);
  CHECK(swa.hparams().sliding_layers == std::vector<bool>{true, true});
  CHECK(swa.hparams().rope_dim == 8);  // no partial_rotary_factor: the whole head
  const Reference ref = read_reference(swa_dir);
  check_model(swa, ref, "phi3-swa");
  TempDir full(swa_dir);  // without the window, other logits at these positions
  auto jf = full.config();
  jf["sliding_window"] = nullptr;
  full.write_config(jf);
  Session s(load(full.path), {.ctx = 64, .kv_type = kKV});
  CHECK(rel_error(s.eval(ref.tokens), ref.row(ref.tokens.size() - 1)) > 100 * kTol);
}

// phi3-longrope's GGUF in dir without tensor `drop`, or with rope_factors_long.weight replaced by `long_factors`.
fs::path longrope_gguf(const fs::path& dir, const std::string& drop, const std::vector<float>& long_factors = {}) {
  static int counter = 0;
  const io::GGUFFile f(fixture_dir("phi3-longrope") + "/model.gguf");
  io::GGUFWriter w;
  for (const auto& v : f.metadata())
    if (v.key() != "general.alignment") w.add(v.key(), v);
  for (const auto& t : f.tensors()) {
    const std::string name(t.name);
    if (name == drop) continue;
    if (name == "rope_factors_long.weight" && !long_factors.empty()) {
      const uint64_t ne[1] = {long_factors.size()};
      w.add_tensor(name, io::GGMLType::F32, std::span<const uint64_t>(ne, 1), std::as_bytes(std::span(long_factors)));
    } else {
      w.add_tensor(name, t.type, std::span<const uint64_t>(t.ne.data(), t.n_dims), t.data);
    }
  }
  const fs::path out = dir / ("longrope-" + std::to_string(counter++) + ".gguf");
  w.write(out);
  return out;
}

TEST_CASE("hf models: Phi-3 LongRoPE from safetensors and GGUF matches transformers with the short and the long set") {
  // kiln (as llama.cpp) picks the set by the context size: long for more than original_max_position_embeddings
  // = 16 positions. HF picks it by the forward's length: its 32-token forward (hf_logits.f32) used the long
  // set at every position, its forward of the first 16 tokens (hf_logits_short.f32) the short set.
  const std::string dir = fixture_dir("phi3-longrope");
  check_both("phi3-longrope", true);  // contexts of 32 to 64 positions: the long set
  const Reference ref = read_reference(dir);
  const auto meta = nlohmann::json::parse(read_text(dir + "/reference.json"));
  const auto short_shape = meta.at("short").at("shape").get<std::vector<std::size_t>>();
  REQUIRE(short_shape == std::vector<std::size_t>{16, ref.vocab});
  const std::vector<float> short_logits =
      read_logits(dir + "/" + meta.at("short").at("logits").get<std::string>(), short_shape);
  const auto short_row = [&](std::size_t p) {
    return std::span<const float>(short_logits).subspan(p * ref.vocab, ref.vocab);
  };
  const std::span<const int32_t> first16 = std::span<const int32_t>(ref.tokens).first(16);
  for (const std::string f : {"", "/model.gguf"}) {
    INFO("file '", f, "'");
    const Model m = load(dir + f);
    const HParams& hp = m.hparams();
    CHECK(hp.rope_dim == 8);
    CHECK(hp.rope_freq_factors == std::vector<float>{1.0f, 1.25f, 2.5f, 3.5f});  // short_factor
    CHECK(hp.rope_long_factors == std::vector<float>{1.5f, 4.0f, 12.0f, 30.0f});
    CHECK(hp.rope_orig_ctx == 16);
    CHECK(hp.rope_mscale == doctest::Approx(std::sqrt(1.0 + std::log(128.0 / 16) / std::log(16.0))).epsilon(1e-6));
    // A context of 16: the short set, HF's logits of the 16-token forward at every position.
    Session s(m, {.ctx = 16, .threads = 1, .kv_type = kKV});
    for (std::size_t p = 0; p < 16; ++p) {
      INFO("short set, position ", p);
      CHECK(rel_error(s.eval(ref.tokens[p]), short_row(p)) <= kTol);
    }
    Session sb(m, {.ctx = 16, .threads = 2, .kv_type = kKV});
    CHECK(rel_error(sb.eval(first16), short_row(15)) <= kTol);
    // One position more: the long set at the same positions (HF's rows of the 32-token forward).
    Session l(m, {.ctx = 17, .threads = 1, .kv_type = kKV});
    for (std::size_t p = 0; p < 16; ++p) {
      INFO("long set, position ", p);
      const auto got = l.eval(ref.tokens[p]);
      CHECK(rel_error(got, ref.row(p)) <= kTol);
      if (p > 0) CHECK(rel_error(got, short_row(p)) > 100 * kTol);  // the sets differ at these positions
    }
  }
  // Errors name what is wrong: config.json.
  TempDir d(dir);
  const auto base = d.config();
  auto with_factor = [&](const char* key, const nlohmann::json& v) {
    auto j = base;
    j["rope_parameters"][key] = v;
    d.write_config(j);
    return load_error(d.path);
  };
  CHECK(with_factor("short_factor", {1.0, 2.0, 3.0})
            .find("rope_scaling.short_factor has 3 values for a rotary dimension of 8 (need 4)") != std::string::npos);
  CHECK(with_factor("long_factor", {1.0, 2.0, 0.0, 3.0}).find("rope_scaling.long_factor[2] = 0 must be positive") !=
        std::string::npos);
  CHECK(with_factor("long_factor", nullptr).find("rope scaling type 'longrope' needs long_factor") !=
        std::string::npos);
  // GGUF: a set missing, a set of the wrong length or with a zero.
  CHECK(load_error(longrope_gguf(d.path, "rope_factors_short.weight"))
            .find("tensor 'rope_factors_long.weight' without 'rope_factors_short.weight'") != std::string::npos);
  CHECK(
      load_error(longrope_gguf(d.path, "", {1, 2, 3}))
          .find(
              "tensor 'rope_factors_long.weight' has 3 RoPE frequency factors for a rotary dimension of 8 (need 4)") !=
      std::string::npos);
  CHECK(load_error(longrope_gguf(d.path, "", {1, 2, 0, 3}))
            .find("tensor 'rope_factors_long.weight' holds the RoPE frequency factor 0") != std::string::npos);
}

// The phi3 fixture's GGUF with every matrix in Q8_0 (kiln's quantizer), in dir: q/k/v fused as the converter
// writes them (attn_qkv), or split into attn_q, attn_k and attn_v (llama.cpp reads either).
fs::path phi3_q8_0(const fs::path& dir, bool split) {
  const io::GGUFFile f(fixture_dir("phi3") + "/model.gguf");
  io::GGUFWriter w;
  for (const auto& v : f.metadata())
    if (v.key() != "general.alignment") w.add(v.key(), v);
  for (const auto& t : f.tensors()) {
    const std::string name(t.name);
    if (t.n_dims == 1) {
      w.add_tensor(name, t.type, std::span<const uint64_t>(t.ne.data(), 1), t.data);
      continue;
    }
    REQUIRE(t.type == io::GGMLType::F32);
    const std::size_t cols = std::size_t(t.row_length());
    const float* x = t.view<float, 2>().data();
    auto put = [&](const std::string& n, std::size_t r0, std::size_t rows) {
      std::vector<block_q8_0> q(rows * cols / 32);
      for (std::size_t r = 0; r < rows; ++r) quantize_row(x + (r0 + r) * cols, q.data() + r * cols / 32, cols);
      const uint64_t ne[2] = {cols, rows};
      w.add_tensor(n, io::GGMLType::Q8_0, std::span<const uint64_t>(ne, 2), std::as_bytes(std::span(q)));
    };
    const std::string qkv = "attn_qkv.weight";
    if (split && name.ends_with(qkv)) {
      const std::string p = name.substr(0, name.size() - qkv.size());  // q_dim 64, kv_dim 32
      put(p + "attn_q.weight", 0, 64);
      put(p + "attn_k.weight", 64, 32);
      put(p + "attn_v.weight", 96, 32);
    } else {
      put(name, 0, std::size_t(t.rows()));
    }
  }
  const fs::path out = dir / (split ? "q8_0-split.gguf" : "q8_0-fused.gguf");
  w.write(out);
  return out;
}

TEST_CASE("hf models: Phi-3 in Q8_0: the fused q/k/v's row views give the logits of separate tensors") {
  TempDir d(fixture_dir("phi3"));
  const fs::path fused = phi3_q8_0(d.path, false), split = phi3_q8_0(d.path, true);
  const Reference ref = read_reference(fixture_dir("phi3"));
  auto logits = [&](const fs::path& p, io::LoadMode mode) {
    const Model m = load(p, {.mode = mode});  // repacked at load (into owned memory when mapped, else in place)
    Session s(m, {.ctx = 64});
    const auto l = s.eval(ref.tokens);
    return std::vector<float>(l.begin(), l.end());
  };
  const auto want = logits(split, io::LoadMode::map);
  CHECK(logits(fused, io::LoadMode::map) == want);  // the same bytes, read through row views: the same bits
  CHECK(logits(fused, io::LoadMode::read) == want);
  const Model f = load(fused), s = load(split);
  CHECK(f.impl().weights().layers[1].wk.packed == s.impl().weights().layers[1].wk.packed);
  CHECK(f.impl().weights().layers[1].w_up.type == io::GGMLType::Q8_0);
  // Q8_0 weights and kiln's fast products: within a few percent of the f32 model's logit range.
  CHECK(rel_error(want, ref.row(ref.tokens.size() - 1)) < 0.05);
}

TEST_CASE("hf models: Qwen2 (q/k/v biases, tied embeddings) from safetensors and GGUF matches transformers") {
  check_both("qwen2", true);
  const Model m = load(fixture_dir("qwen2"));
  // tokenizer.json beside config.json: kiln's encoding of the text is what the logits were made from.
  const auto meta = nlohmann::json::parse(read_text(fixture_dir("qwen2") + "/reference.json"));
  CHECK(m.tokenizer().size() == 861);
  CHECK(m.tokenizer().encode(meta.at("text").get<std::string>()) == meta.at("tokens").get<std::vector<int32_t>>());
  CHECK(m.architecture() == "qwen2");
  CHECK(m.impl().weights().layers[0].bq);
  CHECK(m.impl().weights().output.data == m.impl().weights().tok_embd.data);  // tied
}

TEST_CASE("hf models: Qwen3 (qk-norm, head_dim 16 != 32 / 4) from safetensors and GGUF matches transformers") {
  check_both("qwen3", true);
  const Model m = load(fixture_dir("qwen3"));
  CHECK(m.tokenizer().size() == 0);  // no tokenizer.json: token ids only
  CHECK(m.hparams().head_dim == 16);
  CHECK(m.hparams().q_dim() == 64);
}

TEST_CASE(
    "hf models: Gemma 3 (sliding window, two RoPE bases, 1 + w norms) from safetensors and GGUF matches transformers") {
  check_both("gemma3", true);
  for (const std::string f : {"", "/model.gguf"}) {
    const Model m = load(fixture_dir("gemma3") + f);
    const HParams& hp = m.hparams();
    INFO("file '", f, "'");
    CHECK(hp.sliding_window == 4);
    CHECK(hp.rope_theta == 1e6f);
    CHECK(hp.rope_theta_swa == 1e4f);
    CHECK(hp.rope_linear_factor == 8.0f);
    CHECK(hp.attn_scale == doctest::Approx(0.25).epsilon(1e-7));
  }
  // safetensors: an explicit layer_types list; GGUF: llama.cpp's fixed pattern of 6.
  const Model m = load(fixture_dir("gemma3"));
  CHECK(m.hparams().sliding_layers == std::vector<bool>{true, true, true, true, true, false});
}

TEST_CASE(
    "hf models: a Gemma 3 config in the older layout (no layer_types, rope_theta, rope_local_base_freq) gives the same "
    "logits") {
  TempDir d(fixture_dir("gemma3"));
  auto j = d.config();
  j.erase("layer_types");
  j.erase("_sliding_window_pattern");
  j.erase("rope_parameters");
  j["sliding_window_pattern"] = 6;
  j["rope_theta"] = 1000000.0;
  j["rope_local_base_freq"] = 10000.0;
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  d.write_config(j);
  const Reference ref = read_reference(fixture_dir("gemma3"));
  check_model(load(d.path), ref, "gemma3 (older config)");
  CHECK(load(d.path).hparams().sliding_layers == load(fixture_dir("gemma3")).hparams().sliding_layers);
}

TEST_CASE(
    "hf models: Gemma 3's GGUF key rope.freq_base_swa sets the sliding layers' RoPE base as the config's "
    "rope_parameters.sliding_attention does") {
  // llama.cpp reads gemma3.rope.freq_base_swa (absent: 10000) and its converter writes it from
  // rope_parameters.sliding_attention.rope_theta. The HF path is checked against transformers above, so the GGUF
  // with the key at 100 must give what the checkpoint with a sliding base of 100 gives (to f32 rounding, as the
  // safetensors / GGUF test below), and differ from the fixture's 10000 (the key is not ignored).
  TempDir d(fixture_dir("gemma3"));
  auto j = d.config();
  REQUIRE(j.at("rope_parameters").at("sliding_attention").at("rope_theta") == 10000.0);
  j["rope_parameters"]["sliding_attention"]["rope_theta"] = 100.0;
  d.write_config(j);
  TempFile tmp("kiln-gemma3-swa100");
  rewrite_gguf(io::GGUFFile(fixture_dir("gemma3") + "/model.gguf"), tmp.path, "gemma3", io::GGMLType::F32, {}, false,
               {{"gemma3.rope.freq_base_swa", 100.0f}});
  const Model hf = load(d.path), gguf = load(tmp.path);
  CHECK(hf.hparams().rope_theta_swa == 100.0f);
  CHECK(gguf.hparams().rope_theta_swa == 100.0f);
  CHECK(gguf.hparams().rope_theta == 1e6f);
  const Reference ref = read_reference(fixture_dir("gemma3"));
  Session a(hf, {.ctx = 64}), b(gguf, {.ctx = 64}), base(load(fixture_dir("gemma3") + "/model.gguf"), {.ctx = 64});
  const auto la = a.eval(ref.tokens);
  CHECK(rel_error(b.eval(ref.tokens), la) <= 1e-5);
  CHECK(rel_error(base.eval(ref.tokens), la) > 1e-3);
}

TEST_CASE("hf models: Gemma 3 in bf16 (layer_types, query_pre_attn_scalar, final soft-cap) matches transformers") {
  const std::string dir = fixture_dir("gemma3-bf16");
  const Model m = load(dir + "/model.safetensors");                   // the file beside config.json
  CHECK(m.impl().weights().layers[0].wq.type == io::GGMLType::BF16);  // a view of the file
  CHECK(m.hparams().embed_scale == float(bf16(std::sqrt(24.0f))));    // transformers' bf16 scale
  CHECK(m.hparams().sliding_layers == std::vector<bool>{true, false, true});
  CHECK(m.hparams().final_softcap == 5.0f);
  check_model(m, read_reference(dir), "gemma3-bf16");
  // Read into memory, the bf16 matrices are packed at load (LoadOptions::pack): the same results.
  const Model r = load(dir, {.mode = io::LoadMode::read});
  CHECK(r.impl().weights().layers[0].wq.packed);
  CHECK(r.impl().weights().layers[2].w_down.packed);
  check_model(r, read_reference(dir), "gemma3-bf16 read + packed");
}

TEST_CASE("hf models: the safetensors and the GGUF of a model give the same logits to f32 rounding") {
  for (const char* name : {"llama", "qwen2", "qwen3", "gemma3", "llama3", "llama-yarn", "mistral", "granite", "gemma2",
                           "phi3", "phi3-longrope"}) {
    INFO(name);
    const std::string dir = fixture_dir(name);
    Session a(load(dir), {.ctx = 64}), b(load(dir + "/model.gguf"), {.ctx = 64});
    const Reference ref = read_reference(dir);
    const auto la = a.eval(ref.tokens);
    CHECK(rel_error(b.eval(ref.tokens), la) <= 1e-5);
  }
}

// A parallel block (GPT-J, Phi-2) over Llama's tensors: h = norm(x); x += attention(h) + mlp(h). It reads
// no ffn_norm.
struct ParallelLlama : Llama {
  static constexpr std::string_view name = "parallel-llama";
  static void block(const BlockArgs& b) {
    b.norm(b.x, b.w.attn_norm, b.w.attn_norm_b, b.h);
    b.attention(b.h, b.o);
    b.residual(b.o);
    b.mlp(b.h, b.o);
    b.residual(b.o);
  }
};

TEST_CASE("hf models: a Config with a block hook loads a checkpoint without ffn_norm tensors, as from GGUF") {
  const std::string dir = fixture_dir("llama");
  const Reference ref = read_reference(dir);
  const Model with = load<ParallelLlama>(dir);
  CHECK(with.architecture() == "parallel-llama");
  CHECK(with.impl().weights().layers[1].ffn_norm.data != nullptr);  // read where the checkpoint has them
  // The ffn_norm tensors (post_attention_layernorm) renamed in the safetensors header (same length).
  TempDir d(dir);
  const fs::path p = d.path / "model.safetensors";
  std::string bytes = read_text(p.string());
  const std::string from = "post_attention_layernorm.", to = "post_attention_layernorX.";
  std::size_t renamed = 0;
  for (auto at = bytes.find(from); at != std::string::npos; at = bytes.find(from, at + 1), ++renamed)
    bytes.replace(at, from.size(), to);
  REQUIRE(renamed == 2);
  std::ofstream(p, std::ios::binary) << bytes;
  const Model without = load<ParallelLlama>(d.path);
  for (const LayerWeights& L : without.impl().weights().layers) CHECK(L.ffn_norm.data == nullptr);
  // The block never reads them: the same logits, bit for bit.
  Session a(with, {.ctx = 64, .threads = 1}), b(without, {.ctx = 64, .threads = 1});
  const auto la = a.eval(ref.tokens);
  const std::vector<float> want(la.begin(), la.end());
  const auto lb = b.eval(ref.tokens);
  CHECK(std::equal(lb.begin(), lb.end(), want.begin(), want.end()));
  // The built-in Llama block needs them.
  CHECK(load_error(d.path).find("tensor 'model.layers.0.post_attention_layernorm.weight' not found") !=
        std::string::npos);
}

TEST_CASE("hf models: unknown model_type is an error listing the supported ones") {
  TempDir d(fixture_dir("llama"));
  auto j = d.config();
  j["model_type"] = "mamba";
  d.write_config(j);
  const std::string e = load_error(d.path);
  INFO(e);
  CHECK(e.find("model_type 'mamba'") != std::string::npos);
  for (const std::string_view t : supported_hf_model_types()) CHECK(e.find(std::string(t)) != std::string::npos);
  CHECK(e.find("supported: llama, ") != std::string::npos);
}

TEST_CASE("hf models: a missing tensor is an error naming it") {
  TempDir d(fixture_dir("qwen3"));
  // Rename model.norm.weight in the safetensors header (same length: the file stays valid).
  const fs::path p = d.path / "model.safetensors";
  std::string bytes = read_text(p.string());
  const std::string from = "\"model.norm.weight\"", to = "\"model.norX.weight\"";
  const auto at = bytes.find(from);
  REQUIRE(at != std::string::npos);
  bytes.replace(at, from.size(), to);
  std::ofstream(p, std::ios::binary) << bytes;
  const std::string e = load_error(d.path);
  INFO(e);
  CHECK(e.find("tensor 'model.norm.weight' not found") != std::string::npos);
}

TEST_CASE("hf models: a config.json whose sizes do not match the tensors is an error naming the tensor") {
  TempDir d(fixture_dir("llama"));
  auto j = d.config();
  j["intermediate_size"] = 65;
  d.write_config(j);
  std::string e = load_error(d.path);
  INFO(e);
  CHECK(e.find("tensor 'model.layers.0.mlp.gate_proj.weight' has shape (64, 32) but config.json needs (65, 32)") !=
        std::string::npos);
  j["intermediate_size"] = 64;
  j["vocab_size"] = 300;
  d.write_config(j);
  e = load_error(d.path);
  CHECK(e.find("tensor 'model.embed_tokens.weight' has shape (256, 32) but config.json needs (300, 32)") !=
        std::string::npos);
}

TEST_CASE("hf models: unsupported config features are errors") {
  TempDir d(fixture_dir("qwen2"));
  const auto base = d.config();
  auto with = [&](const char* key, const nlohmann::json& v) {
    auto j = base;
    j[key] = v;
    d.write_config(j);
    return load_error(d.path);
  };
  CHECK(with("rope_parameters", {{"rope_type", "dynamic"}, {"factor", 4.0}, {"rope_theta", 1000.0}})
            .find("rope scaling type 'dynamic' is not supported") != std::string::npos);
  CHECK(with("rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 1000.0}})
            .find("rope scaling type 'yarn' needs a positive original_max_position_embeddings") != std::string::npos);
  CHECK(with("hidden_act", "relu").find("hidden_act 'relu' is not the qwen2 activation 'silu'") != std::string::npos);
  CHECK(with("tie_word_embeddings", false).find("tensor 'lm_head.weight' not found") != std::string::npos);
  CHECK(with("layer_types", {"full_attention"}).find("layer_types has 1 entries for 2 layers") != std::string::npos);
  // A directory without config.json.
  fs::remove(d.path / "config.json");
  CHECK(load_error(d.path).find("config.json' does not exist") != std::string::npos);
}

}  // namespace
}  // namespace kiln::test
