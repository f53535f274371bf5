// Mixture-of-experts models (Qwen3-MoE, Mixtral, Qwen2-MoE, OLMoE, MiniMax-M2, gpt-oss) against Hugging Face
// transformers: tiny random checkpoints (tests/fixtures/models/{qwen3moe,mixtral,qwen2moe,olmoe,minimax-m2,gpt-oss}/, made by scripts/fixtures/make_moe_models.py with llama.cpp's
// own convert_hf_to_gguf.py for the GGUF files) loaded from safetensors and from GGUF: logits at every
// position, the router's chosen experts at every layer and token, and a greedy continuation, all HF's; a
// Q8_0 conversion against HF run on its dequantized weights; a Q4_0 file (kiln's quantizer) through the
// integer kernels against the f32 products of the same weights; gpt-oss's MXFP4 experts against the same
// weights dequantized to f32; and the loaders' errors for bad files.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "kiln/io/gguf_writer.hpp"
#include "kiln/model/model.hpp"
#include "model_test_util.hpp"
#include "test_util.hpp"

namespace kiln::test::moe_test {

namespace fs = std::filesystem;

// As test_hf_models.cpp: max |kiln - HF| over a position's logits, relative to that position's logit
// range, both in f32 (kiln with an f32 KV cache) summing in other orders (~1e-6 measured). The routers'
// choices are far from ties (the fixture script requires a gap of 0.05 between the k-th and (k+1)-th
// expert's logit), so those rounding differences cannot change an expert: the choices must be identical.
constexpr double kTol = 1e-4;
// Precision::fast over quantized weights: activations as two 8-bit parts (kiln::Precision), logits within
// ~1e-4 of their range of the f32 products; test_hf_logits.cpp's bound for real models.
constexpr double kFastTol = 1e-3;

std::string fixture(const std::string& name) {
  const std::string d = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/models/" + name;
  if (!fs::exists(d + "/reference.json"))
    FAIL("missing fixture '", d, "' (scripts/fixtures/make_moe_models.py makes it)");
  return d;
}

struct MoEReference {
  std::vector<int32_t> tokens;
  std::size_t vocab = 0, k = 0;
  std::vector<float> logits;                               // (tokens, vocab)
  std::vector<std::vector<std::vector<int32_t>>> experts;  // [layer][token][k]
  std::vector<int32_t> prompt, greedy;
  std::span<const float> row(std::size_t p) const { return {logits.data() + p * vocab, vocab}; }
};

/// reference.json, or its "q8_0" part (logits and experts of the Q8_0 file's weights) when q8.
MoEReference read_moe_reference(const std::string& dir, bool q8 = false) {
  const auto meta = nlohmann::json::parse(read_text(dir + "/reference.json"));
  const auto& part = q8 ? meta.at("q8_0") : meta;
  MoEReference r;
  r.tokens = meta.at("tokens").get<std::vector<int32_t>>();
  r.k = meta.at("experts_per_token").get<std::size_t>();
  const auto shape = meta.at("shape").get<std::vector<std::size_t>>();
  REQUIRE(shape.size() == 2);
  REQUIRE(shape[0] == r.tokens.size());
  r.vocab = shape[1];
  r.logits = read_logits(dir + "/" + part.at("logits").get<std::string>(), shape);
  r.experts = part.at("experts").get<std::vector<std::vector<std::vector<int32_t>>>>();
  r.prompt = meta.at("greedy").at("prompt").get<std::vector<int32_t>>();
  r.greedy = meta.at("greedy").at("tokens").get<std::vector<int32_t>>();
  return r;
}

/// Logits at every position (decode steps, then prompt batches of 7 on 2 threads, then one batch of all),
/// and the experts each pass chose, against the reference.
void check_moe_model(const Model& m, const MoEReference& ref, const std::string& what, Precision precision,
                     double tol) {
  INFO(what);
  const HParams& hp = m.hparams();
  REQUIRE(hp.vocab == ref.vocab);
  REQUIRE(hp.n_expert_used == ref.k);
  REQUIRE(ref.experts.size() == hp.n_layers);
  const std::size_t n = ref.tokens.size(), L = hp.n_layers, k = hp.n_expert_used;
  double worst = 0;
  auto check = [&](const float* got, std::size_t p, const std::string& how) {
    const double e = rel_error({got, ref.vocab}, ref.row(p));
    INFO(how, " position ", p, ": max |delta| / range = ", e);
    CHECK(e <= tol);
    if (!(e <= worst)) worst = e;
  };
  // trace of passes of `rows` tokens starting at p0: layer-major within a pass
  auto check_experts = [&](const std::vector<int32_t>& trace, std::size_t p0, std::size_t rows,
                           const std::string& how) {
    REQUIRE(trace.size() == L * rows * k);
    for (std::size_t l = 0; l < L; ++l)
      for (std::size_t t = 0; t < rows; ++t) {
        const std::vector<int32_t> got(trace.begin() + std::ptrdiff_t((l * rows + t) * k),
                                       trace.begin() + std::ptrdiff_t((l * rows + t + 1) * k));
        INFO(how, ": layer ", l, " position ", p0 + t);
        CHECK(got == ref.experts[l][p0 + t]);
      }
  };
  std::vector<float> logits(ref.vocab);
  const auto& impl = m.impl();
  {
    auto st = impl.make_state(64, 1, 1, KVType::f32);
    st->precision = precision;
    std::vector<int32_t> trace;
    st->expert_trace = &trace;
    for (std::size_t p = 0; p < n; ++p) {
      trace.clear();
      impl.forward(*st, std::span<const int32_t>(&ref.tokens[p], 1), p, logits.data());
      check(logits.data(), p, "decode");
      check_experts(trace, p, 1, "decode");
    }
  }
  {
    auto st = impl.make_state(48, 10, 2, KVType::f32);
    st->precision = precision;
    std::vector<int32_t> trace;
    st->expert_trace = &trace;
    for (std::size_t p = 0; p < n;) {
      const std::size_t c = std::min<std::size_t>(p == 0 ? 10 : 7, n - p);
      trace.clear();
      impl.forward(*st, std::span<const int32_t>(ref.tokens).subspan(p, c), p, logits.data());
      check(logits.data(), p + c - 1, "batched");
      check_experts(trace, p, c, "batched");
      p += c;
    }
  }
  {
    auto st = impl.make_state(n, n, 2, KVType::f32);
    st->precision = precision;
    std::vector<int32_t> trace;
    st->expert_trace = &trace;
    impl.forward(*st, std::span<const int32_t>(ref.tokens), 0, logits.data());
    check(logits.data(), n - 1, "one batch");
    check_experts(trace, 0, n, "one batch");
  }
  MESSAGE(what, ": worst max |delta| / range = ", worst);
}

/// HF's greedy continuation of the prompt, token by token through a Session.
void check_greedy(const Model& m, const MoEReference& ref, const std::string& what) {
  INFO(what, ": greedy continuation");
  Session s(m, {.ctx = 64, .threads = 2, .kv_type = KVType::f32});
  std::span<const float> z = s.eval(ref.prompt);
  std::vector<int32_t> got;
  for (std::size_t i = 0; i < ref.greedy.size(); ++i) {
    got.push_back(int32_t(std::max_element(z.begin(), z.end()) - z.begin()));
    z = s.eval(got.back());
  }
  CHECK(got == ref.greedy);
}

/// The safetensors checkpoint and its GGUF conversion against HF: n_expert experts, renormalised or not.
void check_both(const std::string& name, std::size_t n_expert = 8, bool renormalised = true) {
  const std::string dir = fixture(name);
  const MoEReference ref = read_moe_reference(dir);
  for (const std::string file : {"", "/model.gguf"}) {
    const Model m = load(dir + file);
    const std::string what = name + (file.empty() ? " (safetensors)" : " (GGUF)");
    CHECK(m.architecture() == name);
    CHECK(m.hparams().n_expert == n_expert);
    CHECK(m.hparams().expert_weights_norm == renormalised);
    check_moe_model(m, ref, what, Precision::fast, kTol);
    check_greedy(m, ref, what);
  }
}

TEST_CASE("moe: Qwen3-MoE from safetensors and GGUF matches transformers: logits, experts, greedy text") {
  check_both("qwen3moe");
  const Model g = load(fixture("qwen3moe") + "/model.gguf");
  CHECK(g.architecture() == "qwen3moe");
  CHECK(g.hparams().ffn_dim == 32);  // expert_feed_forward_length, not feed_forward_length (64)
  CHECK(g.hparams().n_expert_used == 2);
  CHECK(load(fixture("qwen3moe")).architecture() == "qwen3moe");
}

TEST_CASE("moe: Mixtral from safetensors and GGUF (architecture llama with experts) matches transformers") {
  const std::string dir = fixture("mixtral");
  const MoEReference ref = read_moe_reference(dir);
  for (const std::string file : {"", "/model.gguf"}) {
    const Model m = load(dir + file);
    const std::string what = std::string("mixtral") + (file.empty() ? " (safetensors)" : " (GGUF)");
    CHECK(m.hparams().expert_weights_norm);
    check_moe_model(m, ref, what, Precision::fast, kTol);
    check_greedy(m, ref, what);
  }
  const Model g = load(fixture("mixtral") + "/model.gguf");
  CHECK(g.architecture() == "llama");
  CHECK(!g.hparams().rope_style.has_value());  // llama.cpp permuted q/k: the Config's gptj pairs
  CHECK(load(fixture("mixtral")).hparams().rope_style == RopeStyle::neox);
}

TEST_CASE("moe: Qwen2-MoE (shared expert with its sigmoid gate, q/k/v biases, not renormalised) matches transformers") {
  check_both("qwen2moe", 8, /*renormalised=*/false);
  for (const std::string file : {"", "/model.gguf"}) {
    const Model m = load(fixture("qwen2moe") + file);
    CHECK(m.hparams().shexp_ffn_dim == 64);
    CHECK(m.hparams().ffn_dim == 32);  // expert_feed_forward_length / moe_intermediate_size
    CHECK(m.hparams().n_expert_used == 4);
  }
}

TEST_CASE("moe: OLMoE (q/k norms over the whole projections, top-8 of 16, not renormalised) matches transformers") {
  check_both("olmoe", 16, /*renormalised=*/false);
  const Model m = load(fixture("olmoe") + "/model.gguf");
  CHECK(m.hparams().n_expert_used == 8);
  CHECK(m.impl().weights().layers[0].q_norm.n == m.hparams().q_dim());
  CHECK(m.impl().weights().layers[0].k_norm.n == m.hparams().kv_dim());
}

TEST_CASE(
    "moe: MiniMax-M2 (sigmoid router with a correction bias, whole-projection q/k norms, partial rotary) matches "
    "transformers") {
  check_both("minimax-m2", 8, /*renormalised=*/true);
  for (const std::string file : {"", "/model.gguf"}) {
    const Model m = load(fixture("minimax-m2") + file);
    CHECK(m.hparams().expert_gating == ExpertGating::sigmoid);
    CHECK(m.hparams().rope_dim == 8);  // rotary_dim / rope.dimension_count of head_dim 16
    CHECK(m.impl().weights().layers[1].exp_probs_b.n == 8);
  }
}

TEST_CASE(
    "moe: gpt-oss (attention sinks, alternating sliding window, YaRN, q/k/v/o biases, router and expert biases, "
    "clamped SwiGLU) matches transformers") {
  check_both("gpt-oss", 8, /*renormalised=*/true);
  for (const std::string file : {"", "/model.gguf"}) {
    const Model m = load(fixture("gpt-oss") + file);
    CHECK(m.hparams().swiglu_limit == 7.0f);
    CHECK(m.hparams().swiglu_alpha == 1.702f);
    CHECK(m.hparams().sliding_window == 8);
    CHECK(m.hparams().n_expert_used == 4);
    CHECK(!m.hparams().rope_freq_factors.empty());  // YaRN
    const auto& L = m.impl().weights().layers[1];
    CHECK(L.attn_sinks.n == 4);
    CHECK(L.ffn_gate_inp_b.n == 8);
    REQUIRE(L.exp_down_b.size() == 8);
    CHECK(L.exp_down_b[7].n == 32);
  }
}

TEST_CASE("moe: gpt-oss with MXFP4 experts (gguf-py's quantizer) matches its twin of the same weights in f32") {
  const std::string dir = fixture("gpt-oss");
  const Model q = load(dir + "/model-mxfp4.gguf"), f = load(dir + "/model-mxfp4-f32.gguf");
  REQUIRE(q.impl().weights().layers[0].exp_gate[0].type == io::GGMLType::MXFP4);
  REQUIRE(q.impl().weights().layers[1].exp_down[3].type == io::GGMLType::MXFP4);
  REQUIRE(f.impl().weights().layers[0].exp_gate[0].type == io::GGMLType::F32);
  // the twin's logits and experts at every position (decode steps), as the reference
  MoEReference ref = read_moe_reference(dir);
  const std::size_t n = ref.tokens.size(), L = f.hparams().n_layers, k = ref.k;
  ref.logits.assign(n * ref.vocab, 0.0f);
  for (auto& layer : ref.experts)
    for (auto& t : layer) t.assign(k, -1);
  auto st = f.impl().make_state(64, 1, 1, KVType::f32);
  std::vector<int32_t> trace;
  st->expert_trace = &trace;
  for (std::size_t p = 0; p < n; ++p) {
    trace.clear();
    f.impl().forward(*st, std::span<const int32_t>(&ref.tokens[p], 1), p, ref.logits.data() + p * ref.vocab);
    REQUIRE(trace.size() == L * k);
    for (std::size_t l = 0; l < L; ++l)
      ref.experts[l][p].assign(trace.begin() + std::ptrdiff_t(l * k), trace.begin() + std::ptrdiff_t((l + 1) * k));
  }
  // the quantization is not a no-op: the twin's logits differ from transformers' on the unquantized weights
  const MoEReference hf = read_moe_reference(dir);
  double moved = 0;
  for (std::size_t p = 0; p < n; ++p) moved = std::max(moved, rel_error(ref.row(p), hf.row(p)));
  CHECK(moved > 100 * kTol);
  check_moe_model(q, ref, "gpt-oss MXFP4 exact", Precision::exact, kTol);
  // fast: the experts through the integer kernels (x as two 8-bit parts), the bound of the other quantized
  // types' fast products
  check_moe_model(q, ref, "gpt-oss MXFP4 fast", Precision::fast, kFastTol);
}

TEST_CASE("moe: a Q8_0 Qwen3-MoE (llama.cpp's converter) matches transformers on its dequantized weights") {
  const std::string dir = fixture("qwen3moe");
  const MoEReference ref = read_moe_reference(dir, /*q8=*/true);
  const Model m = load(dir + "/model-q8_0.gguf");
  REQUIRE(m.impl().weights().layers[0].exp_gate[0].type == io::GGMLType::Q8_0);
  CHECK(m.impl().weights().layers[0].ffn_gate_inp.type == io::GGMLType::F32);  // llama.cpp keeps the router
  check_moe_model(m, ref, "qwen3moe Q8_0 exact", Precision::exact, kTol);
  check_moe_model(m, ref, "qwen3moe Q8_0 fast", Precision::fast, kFastTol);
}

/// A copy of a GGUF file: metadata with `set` applied (u32 values), tensors raw; a tensor in `rename` gets
/// the new name, one in `drop` is left out, and `shrink` keeps that 3-D tensor's first n_expert - 1 experts.
struct GGUFEdit {
  std::vector<std::pair<std::string, uint32_t>> set;  // keys the file lacks are added
  std::vector<std::pair<std::string, std::string>> rename;
  std::vector<std::string> drop;
  std::string shrink;
  io::GGMLType q4 = io::GGMLType::F32;  // Q4_0: every 3-D expert tensor quantized with kiln's quantizer
};
GGUFEdit set_key(const std::string& key, uint32_t v) {
  GGUFEdit e;
  e.set = {{key, v}};
  return e;
}
GGUFEdit drop_tensor(const std::string& name) {
  GGUFEdit e;
  e.drop = {name};
  return e;
}
GGUFEdit shrink_tensor(const std::string& name) {
  GGUFEdit e;
  e.shrink = name;
  return e;
}
GGUFEdit rename_tensor(const std::string& from, const std::string& to) {
  GGUFEdit e;
  e.rename = {{from, to}};
  return e;
}
GGUFEdit quantize_experts_q4_0() {
  GGUFEdit e;
  e.q4 = io::GGMLType::Q4_0;
  return e;
}

void edit_gguf(const std::string& in, const fs::path& out, const GGUFEdit& e) {
  const io::GGUFFile f(in);
  io::GGUFWriter w;
  for (const auto& v : f.metadata()) {
    const std::string key(v.key());
    auto it = std::find_if(e.set.begin(), e.set.end(), [&](const auto& kv) { return kv.first == key; });
    if (it != e.set.end()) w.add(key, it->second);
    else w.add(key, v);
  }
  for (const auto& [key, value] : e.set)
    if (!f.contains(key)) w.add(key, value);
  std::vector<std::vector<block_q4_0>> keep;
  for (const auto& t : f.tensors()) {
    std::string name(t.name);
    if (std::find(e.drop.begin(), e.drop.end(), name) != e.drop.end()) continue;
    for (const auto& [from, to] : e.rename)
      if (name == from) name = to;
    std::vector<uint64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    std::span<const std::byte> data = t.data;
    if (name == e.shrink) {
      data = data.first(data.size() / ne[2] * (ne[2] - 1));
      ne[2] -= 1;
    }
    if (e.q4 == io::GGMLType::Q4_0 && t.n_dims == 3) {
      REQUIRE(t.type == io::GGMLType::F32);
      const auto v = t.view<float, 3>();
      keep.emplace_back(v.size() / QK4_0);
      quantize_row(v.data(), keep.back().data(), v.size());
      w.add_tensor(name, io::GGMLType::Q4_0, ne, std::as_bytes(std::span(keep.back())));
      continue;
    }
    w.add_tensor(name, t.type, ne, data);
  }
  w.write(out);
}

// CHECK that `text` contains `part`, showing both when it does not.
#define MOE_CHECK_CONTAINS(text, part)                 \
  do {                                                 \
    const std::string kiln_text_ = (text);             \
    INFO("message: ", kiln_text_);                     \
    CHECK(kiln_text_.find(part) != std::string::npos); \
  } while (0)

std::string gguf_error(const std::string& from, const GGUFEdit& e) {
  TempFile tmp("kiln-test-moe");
  edit_gguf(from, tmp.path, e);
  try {
    (void)load(tmp.path);
  } catch (const FormatError& err) {
    return err.what();
  }
  FAIL("loading the edited copy of '", from, "' did not throw a kiln::FormatError");
  return {};
}

TEST_CASE("moe: Q4_0 experts (kiln's quantizer) through the integer kernels match the f32 products") {
  // The experts' own rows quantized (stacked 3-D tensors: each expert a slice of whole Q4_0 rows): fast
  // (integer dot products) against exact (the same Q4_0 weights dequantized, f32 products), every
  // position and layer, the experts chosen identical.
  TempFile tmp("kiln-test-moe-q4");
  edit_gguf(fixture("qwen3moe") + "/model.gguf", tmp.path, quantize_experts_q4_0());
  const Model m = load(tmp.path);
  REQUIRE(m.impl().weights().layers[1].exp_down[7].type == io::GGMLType::Q4_0);
  const MoEReference ref = read_moe_reference(fixture("qwen3moe"));
  const std::size_t n = 24;
  const std::vector<int32_t> tokens(ref.tokens.begin(), ref.tokens.begin() + n);
  auto run = [&](Precision p, std::size_t batch, std::vector<int32_t>& trace) {
    auto st = m.impl().make_state(n, batch, 2, KVType::f32);
    st->precision = p;
    st->expert_trace = &trace;
    std::vector<float> out;
    std::vector<float> z(m.hparams().vocab);
    for (std::size_t p0 = 0; p0 < n; p0 += batch) {
      m.impl().forward(*st, std::span<const int32_t>(tokens).subspan(p0, batch), p0, z.data());
      out.insert(out.end(), z.begin(), z.end());
    }
    return out;
  };
  for (const std::size_t batch : {std::size_t(1), std::size_t(8)}) {
    INFO("batch ", batch);
    std::vector<int32_t> te, tf;
    const auto exact = run(Precision::exact, batch, te), fast = run(Precision::fast, batch, tf);
    const std::size_t V = m.hparams().vocab;
    for (std::size_t i = 0; i < n / batch; ++i) {
      INFO("pass ", i);
      CHECK(rel_error({fast.data() + i * V, V}, {exact.data() + i * V, V}) <= kFastTol);
    }
    CHECK(te == tf);
  }
}

TEST_CASE("moe: MiniMax-M2 without its correction bias chooses other experts (the bias is applied)") {
  // The fixture's bias (N(0, 0.3^2) against sigmoid weights in (0, 1)) changes some tokens' choices.
  const std::string dir = fixture("minimax-m2");
  const MoEReference ref = read_moe_reference(dir);
  TempFile tmp("kiln-test-moe-nobias");
  GGUFEdit e;
  e.drop = {"blk.0.exp_probs_b.bias", "blk.1.exp_probs_b.bias"};
  edit_gguf(dir + "/model.gguf", tmp.path, e);
  const Model nb = load(tmp.path);
  auto st = nb.impl().make_state(ref.tokens.size(), ref.tokens.size(), 1, KVType::f32);
  std::vector<int32_t> trace;
  st->expert_trace = &trace;
  std::vector<float> z(ref.vocab);
  nb.impl().forward(*st, std::span<const int32_t>(ref.tokens), 0, z.data());
  std::vector<int32_t> want;
  for (const auto& layer : ref.experts)
    for (const auto& tok : layer) want.insert(want.end(), tok.begin(), tok.end());
  CHECK(trace != want);
}

TEST_CASE("moe: bad GGUF files give errors naming the key or tensor") {
  const std::string q = fixture("qwen3moe") + "/model.gguf", mx = fixture("mixtral") + "/model.gguf";
  MOE_CHECK_CONTAINS(gguf_error(q, set_key("qwen3moe.expert_used_count", 9)),
                     "qwen3moe.expert_used_count = 9 must be within 1 and qwen3moe.expert_count = 8");
  MOE_CHECK_CONTAINS(gguf_error(q, set_key("qwen3moe.expert_used_count", 0)), "qwen3moe.expert_used_count = 0");
  MOE_CHECK_CONTAINS(gguf_error(q, drop_tensor("blk.1.ffn_up_exps.weight")),
                     "weight 'blk.1.ffn_up_exps.weight' not found");
  MOE_CHECK_CONTAINS(gguf_error(q, drop_tensor("blk.2.ffn_gate_inp.weight")),
                     "weight 'blk.2.ffn_gate_inp.weight' not found");
  MOE_CHECK_CONTAINS(gguf_error(q, shrink_tensor("blk.0.ffn_down_exps.weight")),
                     "weight 'blk.0.ffn_down_exps.weight' has shape (7, 32, 32) but the model's "
                     "hyper-parameters need (8, 32, 32)");
  MOE_CHECK_CONTAINS(gguf_error(mx, rename_tensor("blk.0.ffn_gate_exps.weight", "blk.0.ffn_gate.0.weight")),
                     "'blk.0.ffn_gate.0.weight': experts stored one tensor each");
  // expert_count 0 in a Mixtral file: a dense Llama, whose MLP tensors are not there
  MOE_CHECK_CONTAINS(gguf_error(mx, set_key("llama.expert_count", 0)), "'blk.0.ffn_gate.weight' not found");
  const std::string q2 = fixture("qwen2moe") + "/model.gguf";
  MOE_CHECK_CONTAINS(gguf_error(q2, drop_tensor("blk.1.ffn_gate_inp_shexp.weight")),
                     "weight 'blk.1.ffn_gate_inp_shexp.weight' not found");
  MOE_CHECK_CONTAINS(gguf_error(q2, shrink_tensor("blk.1.ffn_down_exps.weight")), "'blk.1.ffn_down_exps.weight'");
  MOE_CHECK_CONTAINS(gguf_error(q2, drop_tensor("blk.0.ffn_up_shexp.weight")),
                     "a qwen2moe model needs experts (qwen2moe.expert_count) and a shared expert");
  MOE_CHECK_CONTAINS(gguf_error(fixture("olmoe") + "/model.gguf", drop_tensor("blk.1.attn_k_norm.weight")),
                     "weight 'blk.1.attn_k_norm.weight' not found");
  const std::string mm = fixture("minimax-m2") + "/model.gguf";
  MOE_CHECK_CONTAINS(gguf_error(mm, set_key("minimax-m2.expert_gating_func", 3)),
                     "minimax-m2.expert_gating_func = 3 is not supported");
  MOE_CHECK_CONTAINS(gguf_error(mm, shrink_tensor("blk.0.ffn_up_exps.weight")), "'blk.0.ffn_up_exps.weight'");
  // llama.cpp would choose experts within groups: refused (a key the file lacks, added)
  MOE_CHECK_CONTAINS(gguf_error(mm, set_key("minimax-m2.expert_group_count", 4)),
                     "minimax-m2.expert_group_count = 4 (experts chosen within groups) is not supported");
  CHECK(load(mm).hparams().n_expert == 8);  // the file itself has no groups
  const std::string go = fixture("gpt-oss") + "/model.gguf";
  MOE_CHECK_CONTAINS(gguf_error(go, drop_tensor("blk.1.attn_sinks.weight")),
                     "weight 'blk.1.attn_sinks.weight' not found");
  MOE_CHECK_CONTAINS(gguf_error(go, drop_tensor("blk.0.ffn_up_exps.bias")),
                     "weight 'blk.0.ffn_up_exps.bias' not found");
  MOE_CHECK_CONTAINS(gguf_error(go, drop_tensor("blk.0.post_attention_norm.weight")),
                     "weight 'blk.0.post_attention_norm.weight' not found");
  MOE_CHECK_CONTAINS(gguf_error(go, set_key("gpt-oss.expert_count", 0)), "a gpt-oss model needs experts");
}

/// A copy of a checkpoint directory with config.json edited.
struct ConfigEdit {
  fs::path path;
  ConfigEdit(const std::string& from, const std::function<void(nlohmann::json&)>& edit) {
    static int counter = 0;
    path =
        fs::temp_directory_path() / ("kiln-test-moe-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(path);
    for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(fs::path(from) / f, path / f);
    auto j = nlohmann::json::parse(read_text((path / "config.json").string()));
    edit(j);
    std::ofstream(path / "config.json") << j.dump(1);
  }
  ~ConfigEdit() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string error() const {
    try {
      (void)load(path);
    } catch (const FormatError& e) {
      return e.what();
    }
    FAIL("loading '", path.string(), "' did not throw a kiln::FormatError");
    return {};
  }
};

TEST_CASE("moe: a gpt-oss checkpoint with MXFP4 expert blocks (as the released safetensors) is refused, naming them") {
  ConfigEdit c(fixture("gpt-oss"), [](nlohmann::json&) {});
  // a second shard with layer 0's experts as MXFP4 blocks (the released checkpoint's layout), and an index
  // naming both shards
  const std::string blocks = "model.layers.0.mlp.experts.gate_up_proj_blocks", shard = "model-blocks.safetensors";
  const std::size_t bytes = 8 * 64 * 1 * 16;
  nlohmann::ordered_json h;
  h[blocks] = {{"dtype", "U8"}, {"shape", {8, 64, 1, 16}}, {"data_offsets", {0, bytes}}};
  std::string hs = h.dump();
  while (hs.size() % 8) hs += ' ';
  {
    std::ofstream f(c.path / shard, std::ios::binary);
    const uint64_t n = hs.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << hs << std::string(bytes, '\0');
  }
  const std::string st = read_text((c.path / "model.safetensors").string());
  uint64_t hn = 0;
  std::memcpy(&hn, st.data(), 8);
  nlohmann::json idx = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  const nlohmann::json header = nlohmann::json::parse(st.substr(8, hn));
  for (auto it = header.begin(); it != header.end(); ++it)
    if (it.key() != "__metadata__") idx["weight_map"][it.key()] = "model.safetensors";
  idx["weight_map"][blocks] = shard;
  std::ofstream(c.path / "model.safetensors.index.json") << idx.dump();
  MOE_CHECK_CONTAINS(c.error(), "tensor '" + blocks + "': MXFP4 expert blocks in safetensors are not supported");
}

TEST_CASE("moe: a gpt-oss checkpoint with a NaN attention sink is refused at load, naming the tensor") {
  ConfigEdit c(fixture("gpt-oss"), [](nlohmann::json&) {});
  const fs::path st = c.path / "model.safetensors";
  std::string bytes = read_text(st.string());
  uint64_t hn = 0;
  std::memcpy(&hn, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, hn));
  const std::size_t begin = header.at("model.layers.1.self_attn.sinks").at("data_offsets").at(0).get<std::size_t>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + 8 + hn + begin + 2 * sizeof(float), &nan, sizeof nan);  // head 2
  std::ofstream(st, std::ios::binary) << bytes;
  MOE_CHECK_CONTAINS(c.error(), "tensor 'model.layers.1.self_attn.sinks' holds nan for head 2");
}

TEST_CASE("moe: bad Hugging Face configs give errors naming the key or tensor") {
  const std::string q = fixture("qwen3moe"), mx = fixture("mixtral");
  MOE_CHECK_CONTAINS(ConfigEdit(q, [](auto& j) { j["num_experts_per_tok"] = 9; }).error(),
                     "num_experts_per_tok = 9 must be within 1 and num_local_experts = 8");
  MOE_CHECK_CONTAINS(ConfigEdit(q, [](auto& j) { j["decoder_sparse_step"] = 2; }).error(), "decoder_sparse_step = 2");
  MOE_CHECK_CONTAINS(ConfigEdit(q, [](auto& j) { j["mlp_only_layers"] = {1}; }).error(), "mlp_only_layers");
  MOE_CHECK_CONTAINS(ConfigEdit(q, [](auto& j) { j["num_local_experts"] = 9; }).error(),
                     "tensor 'model.layers.0.mlp.gate.weight' has shape (8, 32) but config.json needs (9, 32)");
  // the released Qwen3-MoE configs' key
  MOE_CHECK_CONTAINS(ConfigEdit(q, [](auto& j) { j["num_experts"] = 4; }).error(),
                     "num_local_experts = 8 and num_experts = 4 disagree");
  const ConfigEdit released(q, [](auto& j) {
    j.erase("num_local_experts");
    j["num_experts"] = 8;
  });
  CHECK(load(released.path).hparams().n_expert == 8);
  MOE_CHECK_CONTAINS(ConfigEdit(mx, [](auto& j) { j["num_local_experts"] = 0; }).error(),
                     "num_local_experts is missing or 0");
  const std::string q2 = fixture("qwen2moe"), ol = fixture("olmoe");
  MOE_CHECK_CONTAINS(ConfigEdit(q2, [](auto& j) { j["qkv_bias"] = false; }).error(), "qkv_bias = false");
  MOE_CHECK_CONTAINS(ConfigEdit(q2, [](auto& j) { j.erase("shared_expert_intermediate_size"); }).error(),
                     "needs num_experts and shared_expert_intermediate_size");
  MOE_CHECK_CONTAINS(ConfigEdit(q2, [](auto& j) { j["shared_expert_intermediate_size"] = 96; }).error(),
                     "tensor 'model.layers.0.mlp.shared_expert.gate_proj.weight' has shape (64, 32) but config.json "
                     "needs (96, 32)");
  MOE_CHECK_CONTAINS(ConfigEdit(q2, [](auto& j) { j["n_shared_experts"] = 1; }).error(),
                     "n_shared_experts = 1: ungated shared experts are not supported");
  MOE_CHECK_CONTAINS(ConfigEdit(ol, [](auto& j) { j["clip_qkv"] = 8.0; }).error(), "clip_qkv");
  MOE_CHECK_CONTAINS(ConfigEdit(fixture("minimax-m2"), [](auto& j) { j["n_group"] = 4; }).error(),
                     "n_group = 4 (experts chosen within groups) is not supported");
  // norm_topk_prob = false: the chosen experts' softmax weights as they are (other logits than HF's
  // renormalised reference, the same experts)
  const ConfigEdit raw(q, [](auto& j) { j["norm_topk_prob"] = false; });
  const Model m = load(raw.path);
  CHECK_FALSE(m.hparams().expert_weights_norm);
  const MoEReference ref = read_moe_reference(q);
  Session s(m, {.ctx = 8, .threads = 1, .kv_type = KVType::f32});
  CHECK(rel_error(s.eval(std::span<const int32_t>(ref.tokens).first(4)), ref.row(3)) > 10 * kTol);
}

}  // namespace kiln::test::moe_test
