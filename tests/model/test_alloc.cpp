// No heap allocation per generated token: global operator new/delete are replaced (for this test
// executable) by versions that count, and decode steps after warm-up must not call them.
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "kiln/generate/generate.hpp"
#include "kiln/model/model.hpp"
#include "model_test_util.hpp"
#include "ref_model.hpp"
#include "counting_new.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

/// 5 warm-up decode steps, then 20 counted ones: eval, sample, detokenize.
long allocations_in_decode(const Model& m, std::size_t threads, Precision precision = Precision::fast,
                           KVType kv = KVType::automatic) {
  Session s(m, {.ctx = 128, .threads = threads, .precision = precision, .kv_type = kv});
  Sampler sampler(m.hparams().vocab, {.temperature = 0.9f,
                                      .top_k = 0,
                                      .top_p = 0.9f,
                                      .min_p = 0.01f,
                                      .repeat_penalty = 1.1f,
                                      .frequency_penalty = 0.1f,
                                      .seed = 1});
  text::Utf8Stream utf8;
  const std::vector<int32_t> prompt{1, 403, 407, 261, 378};
  auto logits = s.eval(prompt);
  int32_t tok = sampler.sample(logits, s.tokens());
  std::size_t bytes = 0;
  long before = 0;
  for (int step = 0; step < 25; ++step) {
    if (step == 5) before = kiln::test::heap_allocs.load();
    logits = s.eval(tok % int32_t(m.hparams().vocab));
    tok = sampler.sample(logits, s.tokens());
    bytes += utf8.push(m.tokenizer().token_bytes(tok % int32_t(m.tokenizer().size()))).size();
  }
  const long n = kiln::test::heap_allocs.load() - before;
  CHECK(s.n_past() == 30);
  CHECK(bytes < 1000000);  // uses the result
  return n;
}

TEST_CASE("alloc: the counting operator new sees allocations (the test can fail)") {
  const long before = kiln::test::heap_allocs.load();
  auto p = std::make_unique<std::vector<int>>(10);
  CHECK(kiln::test::heap_allocs.load() - before >= 2);
}

TEST_CASE("alloc: decode steps of stories260K allocate nothing (1 and 2 threads, f16 and f32 KV cache)") {
  const Model m = load(shared_model("stories260K.gguf"));
  for (auto kv : {KVType::f16, KVType::f32}) {
    INFO("KV cache ", std::string(kv_type_name(kv)));
    CHECK(allocations_in_decode(m, 1, Precision::fast, kv) == 0);
    CHECK(allocations_in_decode(m, 2, Precision::fast, kv) == 0);
  }
}

// (automatic KV cache: f16 on the fast and fast8 paths, f32 on the exact one)
TEST_CASE("alloc: decode steps with quantized weights allocate nothing (fast, fast8 and exact paths)") {
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  TempFile tmp("kiln-test-alloc-q4");
  rewrite_gguf(f, tmp.path, "llama", io::GGMLType::Q4_0, {"output.weight"});
  const Model m = load(tmp.path);
  REQUIRE(m.impl().weights().layers[0].wq.type == io::GGMLType::Q4_0);
  for (auto p : {Precision::fast, Precision::fast8, Precision::exact}) {
    INFO("precision ", int(p));
    CHECK(allocations_in_decode(m, 1, p) == 0);
    CHECK(allocations_in_decode(m, 2, p) == 0);
  }
}

TEST_CASE("alloc: decode steps of a wider model that uses the thread pool allocate nothing") {
  HParams hp;
  hp.arch = "llama";
  hp.dim = 256;
  hp.n_layers = 2;
  hp.n_heads = 8;
  hp.n_kv_heads = 4;
  hp.head_dim = 32;
  hp.ffn_dim = 512;
  hp.vocab = 1024;
  hp.ctx_train = 128;
  hp.rope_dim = 32;
  hp.attn_scale = float(1.0 / std::sqrt(32.0));
  const RefModel ref = random_model(RefTraits{}, hp, 7);
  const Model m(std::make_shared<Transformer<Llama>>(hp, weights_of(ref), dummy_tokenizer(hp.vocab)));
  CHECK(allocations_in_decode(m, 2, Precision::fast, KVType::f16) == 0);
  CHECK(allocations_in_decode(m, 2, Precision::fast, KVType::f32) == 0);
}

TEST_CASE("alloc: generate() allocates nothing per token after the first few") {
  const Model m = load(shared_model("stories260K.gguf"));
  Session s(m, {.ctx = 128, .threads = 1});
  int pieces = 0;
  long at5 = -1, at25 = -1;
  const auto r =
      generate(s, "Once upon a time",
               {.max_tokens = 40, .sampling = {.temperature = 0.8f, .seed = 3}, .stop = {"zebra!"}, .ignore_eos = true},
               [&](std::string_view) {
                 ++pieces;
                 if (pieces == 5) at5 = kiln::test::heap_allocs.load();
                 if (pieces == 25) at25 = kiln::test::heap_allocs.load();
               });
  REQUIRE(pieces >= 25);
  CHECK(r.n_generated == 40);
  CHECK(at25 - at5 == 0);
}

}  // namespace
}  // namespace kiln::test
