// Session and loading behaviour: context limits, reset and reuse, errors on unsupported or broken files.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include "kiln/generate/generate.hpp"
#include "kiln/model/model.hpp"
#include "model_test_util.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "(no kiln::Error thrown)";
}

TEST_CASE("session: eval beyond the context is a clear kiln::Error and changes nothing") {
  const Model m = load(shared_model("stories260K.gguf"));
  Session s(m, {.ctx = 8});
  const std::vector<int32_t> six{1, 403, 407, 261, 378, 30};
  s.eval(six);
  CHECK(s.n_past() == 6);
  const std::string msg = error_of([&] { s.eval(std::vector<int32_t>{5, 6, 7}); });
  CHECK(msg.find("context full") != std::string::npos);
  CHECK(msg.find("ctx 8") != std::string::npos);
  CHECK(s.n_past() == 6);
  s.eval(std::vector<int32_t>{5, 6});  // exactly fills it
  CHECK(s.n_past() == 8);
  CHECK(error_of([&] { s.eval(7); }).find("context full") != std::string::npos);
  CHECK(error_of([&] { s.eval(-1); }).find("outside the vocabulary") == std::string::npos);  // context checked first
  s.reset();
  CHECK(error_of([&] { s.eval(512); }).find("outside the vocabulary") != std::string::npos);
}

TEST_CASE("session: a prompt that outgrows the context throws kiln::Error, a generation that fills it stops") {
  const Model m = load(shared_model("stories260K.gguf"));
  Session s(m, {.ctx = 4});
  const std::string p = error_of([&] { generate(s, "Once upon a time", {.max_tokens = 1}, [](std::string_view) {}); });
  CHECK(p.find("does not fit in the context") != std::string::npos);  // BOS + 4 tokens > 4
  Session s2(m, {.ctx = 16});
  std::string streamed;
  const auto full = generate(s2, "Once upon a time", {.max_tokens = 100, .sampling = {.temperature = 0}},
                             [&](std::string_view x) { streamed += x; });
  CHECK(full.stop == StopReason::context_full);  // tests/generate/test_generate_limits.cpp has the details
  CHECK(!streamed.empty());                      // what was generated before the end of the context was delivered
  // Exactly fitting works: 5 prompt positions + 11 more evaluated = 16, 12 tokens sampled.
  s2.reset();
  const auto r =
      generate(s2, "Once upon a time", {.max_tokens = 12, .sampling = {.temperature = 0}}, [](std::string_view) {});
  CHECK(r.n_generated == 12);
  CHECK(s2.n_past() == 16);
}

TEST_CASE("session: reset() reuses the memory and reproduces the same sequence") {
  const Model m = load(shared_model("stories260K.gguf"));
  Session s(m, {.ctx = 128});
  auto run = [&] {
    std::string t;
    generate(s, "Once upon a time", {.max_tokens = 40, .sampling = {.temperature = 0}},
             [&](std::string_view x) { t += x; });
    return t;
  };
  const std::string a = run();
  s.reset();
  CHECK(s.n_past() == 0);
  CHECK(run() == a);
}

TEST_CASE("session: generate() continues the sequence, feeding the pending token first") {
  const Model m = load(shared_model("stories260K.gguf"));
  Session whole(m, {.ctx = 128}), parts(m, {.ctx = 128});
  std::string a, b;
  generate(whole, "Once upon a time", {.max_tokens = 30, .sampling = {.temperature = 0}},
           [&](std::string_view x) { a += x; });
  generate(parts, "Once upon a time", {.max_tokens = 10, .sampling = {.temperature = 0}},
           [&](std::string_view x) { b += x; });
  CHECK(parts.pending() >= 0);
  // An empty continuation prompt: 20 more tokens continue the same greedy sequence.
  generate(parts, "", {.max_tokens = 20, .sampling = {.temperature = 0}}, [&](std::string_view x) { b += x; });
  CHECK(a == b);
  CHECK(whole.n_past() == parts.n_past());
}

std::size_t top_token(std::span<const float> v) {
  return std::size_t(std::max_element(v.begin(), v.end()) - v.begin());
}

// The gap between the two largest logits, relative to their range.
double top2_margin(std::span<const float> v) {
  std::vector<float> c(v.begin(), v.end());
  std::partial_sort(c.begin(), c.begin() + 2, c.end(), std::greater<float>());
  return double(c[0] - c[1]) / double(c[0] - *std::min_element(c.begin(), c.end()));
}

// Largest |a - b| over the logits, relative to their range.
float logit_gap(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  float gap = 0.f, lo = a[0], hi = a[0];
  for (std::size_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, std::abs(a[i] - b[i]));
    lo = std::min(lo, a[i]);
    hi = std::max(hi, a[i]);
  }
  return gap / (hi - lo);
}

TEST_CASE("session: rewind() and reuse_prefix() continue from the kept tokens as a fresh sequence would") {
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  TempFile q4("kiln-test-reuse-q4_0"), h16("kiln-test-reuse-f16");
  rewrite_gguf(f, q4.path, "llama", io::GGMLType::Q4_0);  // integer-dot kernels with Precision::fast
  rewrite_gguf(f, h16.path, "llama", io::GGMLType::F16);
  const std::vector<int32_t> first{1, 403, 407, 261, 378, 30, 299, 410, 263, 372, 285, 344};  // BOS + 11
  std::vector<int32_t> second(first.begin(), first.begin() + 7);                              // shares 7
  second.insert(second.end(), {306, 263, 400, 275, 282});
  for (const auto& name_path : {std::pair<const char*, std::filesystem::path>{"f32", shared_model("stories260K.gguf")},
                                {"q4_0", q4.path},
                                {"f16", h16.path}})
    for (const Precision p : {Precision::fast, Precision::exact}) {
      const char* name = name_path.first;  // (no structured binding: clang 14 cannot capture one, and INFO does)
      const std::filesystem::path& path = name_path.second;
      INFO("weights " << std::string(name) << ", precision " << std::string(p == Precision::fast ? "fast" : "exact"));
      const Model m = load(path);
      Session s(m, {.ctx = 64, .precision = p}), fresh(m, {.ctx = 64, .precision = p});
      s.eval(first);
      s.eval(std::vector<int32_t>{290, 291});  // more tokens past the shared ones, run one batch later
      s.set_pending(77);
      CHECK(s.common_prefix(second) == 7);
      CHECK(s.n_past() == first.size() + 2);  // common_prefix() changes nothing
      CHECK(s.reuse_prefix(second) == 7);
      CHECK(s.n_past() == 7);
      CHECK(s.pending() == -1);  // the pending token belonged to the dropped end
      const auto r = s.eval(std::span<const int32_t>(second).subspan(7));
      const std::vector<float> reused(r.begin(), r.end());
      const auto scratch = fresh.eval(second);
      CHECK(std::equal(s.tokens().begin(), s.tokens().end(), second.begin(), second.end()));
      // The kept K/V entries and the new rows run through the same prompt kernels as a fresh sequence's:
      // the same logits, to the bit.
      CHECK(std::equal(reused.begin(), reused.end(), scratch.begin(), scratch.end()));

      // The same tokens again: all but the last are kept, and the last runs again for its logits, now as a
      // one-token step. A session that ran the same computations without rewinding (the first 11 tokens as
      // a prompt, the last as a step) is the reference: the same bits.
      CHECK(s.reuse_prefix(second) == second.size() - 1);
      const auto again_span = s.eval(second.back());
      const std::vector<float> again(again_span.begin(), again_span.end());
      Session stepped(m, {.ctx = 64, .precision = p});
      stepped.eval(std::span<const int32_t>(second).first(second.size() - 1));
      const auto want_again = stepped.eval(second.back());
      CHECK(std::equal(again.begin(), again.end(), want_again.begin(), want_again.end()));

      // Tokens run one at a time (a generated reply), kept and continued with a prompt. The reference ran
      // the same kept tokens one at a time and the same continuation as a prompt: the same bits again (the
      // rewind leaves nothing of the dropped positions behind).
      Session steps(m, {.ctx = 64, .precision = p}), ref(m, {.ctx = 64, .precision = p});
      for (const int32_t t : first) steps.eval(t);
      CHECK(steps.reuse_prefix(second) == 7);
      const auto cont_span = steps.eval(std::span<const int32_t>(second).subspan(7));
      const std::vector<float> cont(cont_span.begin(), cont_span.end());
      for (std::size_t i = 0; i < 7; ++i) ref.eval(second[i]);
      const auto want_cont = ref.eval(std::span<const int32_t>(second).subspan(7));
      CHECK(std::equal(cont.begin(), cont.end(), want_cont.begin(), want_cont.end()));

      // Against the sequence run from scratch as one prompt, the step and prompt kernels' roundings differ
      // (their sums run in other orders), so only a bound holds: one derived from the arithmetic, since
      // measured gaps depend on the CPU (an Intel Sapphire Rapids VM met 2.6e-5 of the range where this Zen 4
      // meets 3e-6). It adds, per layer, to first order (tests/model/test_kv_cache.cpp's argument):
      //  - f32 sums of at most K terms in another order: 2 K u32 of the terms' magnitudes (u32 = 2^-24);
      //  - an f16 KV cache: a key or value that lands on the other side of an f16 rounding boundary moves by
      //    one f16 step, 2 u16 relative (u16 = 2^-11);
      //  - 8-bit activations (fast, quantized weights): a value that crosses a rounding boundary of the
      //    residual part moves by one of its steps, at most 2^-8 / 127 of its block's largest value, twice;
      //  - the prompt's attention on AMX bf16 tiles (fast where usable): scores and value sums of two-part
      //    bf16 operands, 3 * 2^-16 of their terms' magnitudes each (docs/kernels.md), twice.
      const HParams& hp = m.hparams();
      const double k_max = double(std::max({hp.dim, hp.ffn_dim, hp.q_dim()}));
      const bool f16_kv = p != Precision::exact;
      const bool int8 = p == Precision::fast && std::string(name) == "q4_0";
      const bool amx_attn = p != Precision::exact && amx_bf16_active();
      const double bound = double(hp.n_layers) * (2 * k_max * 0x1p-24 + (f16_kv ? 2 * 0x1p-11 : 0.0) +
                                                  (int8 ? 2 * 0x1p-8 / 127 : 0.0) + (amx_attn ? 4 * 3 * 0x1p-16 : 0.0));
      INFO("bound " << bound);
      CHECK(logit_gap(cont, scratch) < bound);
      CHECK(logit_gap(again, reused) < bound);
      // The same top token unless the reference's top two are closer than the bound allows to tell apart.
      CHECK((top_token(cont) == top_token(scratch) || top2_margin(scratch) < 2 * bound));
    }
}

TEST_CASE("session: rewind() beyond the sequence, and reuse_prefix() of nothing or of other tokens") {
  const Model m = load(shared_model("stories260K.gguf"));
  Session s(m, {.ctx = 16});
  s.eval(std::vector<int32_t>{1, 403, 407});
  const std::string msg = error_of([&] { s.rewind(4); });
  CHECK(msg.find("cannot keep 4 tokens, the sequence holds 3") != std::string::npos);
  CHECK(s.n_past() == 3);
  CHECK(s.reuse_prefix(std::vector<int32_t>{}) == 0);  // nothing asked for: nothing kept
  CHECK(s.n_past() == 0);
  s.eval(std::vector<int32_t>{1, 403, 407});
  CHECK(s.reuse_prefix(std::vector<int32_t>{2, 403, 407}) == 0);  // differs at the first token
  CHECK(s.reuse_prefix(std::vector<int32_t>{1}) == 0);            // the last token always runs again
  s.rewind(0);
  CHECK(s.n_past() == 0);
}

TEST_CASE("load: the model's chat template is read with it; a model without one says so when asked") {
  const Model smol = load(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"));
  // HF's rendering of its template (tests/fixtures/text/chat_smollm2.json, case "user_only").
  CHECK(smol.chat_template().render({{"user", "Hello!"}}, {.add_generation_prompt = false}) ==
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHello!<|im_end|>\n");
  const Model gemma = load(real_model("gemma-3-270m-q4_k_m.gguf"));
  CHECK(gemma.chat_template().render({{"user", "Hi"}}, {.add_generation_prompt = true}) ==
        ChatTemplate::from_gguf(io::GGUFFile(real_model("gemma-3-270m-q4_k_m.gguf")))
            .render({{"user", "Hi"}}, {.add_generation_prompt = true}));
  const Model tiny = load(shared_model("stories260K.gguf"));  // llama, no tokenizer.chat_template: loads
  const std::string msg = error_of([&] { (void)tiny.chat_template(); });
  CHECK(msg.find("no tokenizer.chat_template") != std::string::npos);
}

TEST_CASE("load: an unsupported architecture names the supported ones") {
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  TempFile tmp("kiln-test-arch");
  rewrite_gguf(f, tmp.path, "mamba", io::GGMLType::F32);
  const std::string msg = error_of([&] { load(tmp.path); });
  CHECK(msg.find("'mamba'") != std::string::npos);
  CHECK(msg.find("supported: llama") != std::string::npos);
}

TEST_CASE("load: a missing weight or a wrong shape names the tensor") {
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  TempFile tmp("kiln-test-missing");
  rewrite_gguf(f, tmp.path, "llama", io::GGMLType::F32, {"blk.3.ffn_up.weight"});
  CHECK(error_of([&] { load(tmp.path); }).find("'blk.3.ffn_up.weight' not found") != std::string::npos);
  // Tied embeddings: without output.weight, the token embedding is the classifier (llama allows it).
  TempFile tied("kiln-test-tied");
  rewrite_gguf(f, tied.path, "llama", io::GGMLType::F32, {"output.weight"});
  const Model t = load(tied.path), full = load(shared_model("stories260K.gguf"));
  CHECK(t.impl().weights().output.data == t.impl().weights().tok_embd.data);
  Session st(t, {.ctx = 16}), sf(full, {.ctx = 16});
  const std::vector<int32_t> ids{1, 403, 407};
  const auto a = st.eval(ids);
  const auto b = sf.eval(ids);
  CHECK(std::equal(a.begin(), a.end(), b.begin()));  // stories260K's output.weight is a copy of the embedding
}

#if defined(__linux__)
// The flags (/proc/self/smaps "VmFlags:", two letters each) of the mapping that holds address p.
std::vector<std::string> vm_flags_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) inside = lo <= a && a < hi;
    if (inside && line.rfind("VmFlags:", 0) == 0) {
      std::istringstream in(line.substr(8));
      return {std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
    }
  }
  return {};
}
bool has(const std::vector<std::string>& flags, const char* f) {
  return std::find(flags.begin(), flags.end(), f) != flags.end();
}

TEST_CASE("load: a mapped file's embedding and vectors are marked as read sparsely, its matrices are not") {
  const Model m = load(shared_model("stories260K.gguf"), {.mode = io::LoadMode::map});
  const ModelWeights& w = m.impl().weights();
  REQUIRE(w.output.data != w.tok_embd.data);  // stories260K's classifier is a matrix of its own
  const auto* wq = w.layers[2].wq.data;       // a page inside it (the first may hold a vector's end)
  const auto embd = vm_flags_at(w.tok_embd.data), norm = vm_flags_at(w.layers[2].attn_norm.data),
             matrix = vm_flags_at(wq + w.layers[2].wq.rows * w.layers[2].wq.row_bytes / 2);
  REQUIRE(!embd.empty());
  REQUIRE(!matrix.empty());
  CHECK(has(embd, "rr"));  // MADV_RANDOM: no read-ahead
  CHECK(has(norm, "rr"));
  CHECK(!has(matrix, "rr"));
  if (std::filesystem::exists("/sys/kernel/mm/transparent_hugepage")) {  // MADV_NOHUGEPAGE needs THP
    CHECK(has(embd, "nh"));
    CHECK(has(norm, "nh"));
    CHECK(!has(matrix, "nh"));
  }
  // Read into memory, the bytes are the process's own: not marked.
  const Model r = load(shared_model("stories260K.gguf"), {.mode = io::LoadMode::read});
  CHECK(!has(vm_flags_at(r.impl().weights().tok_embd.data), "rr"));
}
#endif

TEST_CASE("load: llama2.c files that do not fit are FormatErrors") {
  CHECK_THROWS_AS(load_llama2c(shared_model("tok512.bin"), shared_model("tok512.bin")), FormatError);
  CHECK_THROWS_AS(load_llama2c(shared_model("stories260K.bin"), shared_model("stories260K.gguf")), FormatError);
}

}  // namespace
}  // namespace kiln::test
