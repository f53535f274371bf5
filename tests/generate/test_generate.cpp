// generate/generate.hpp: stop strings (StopMatcher and end to end), seeds, EOS, cancellation, stats.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kiln/generate/generate.hpp"
#include "model/model_test_util.hpp"
#include "model/ref_model.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

std::string feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) {
    out += m.push(p);
    if (m.stopped()) return out;
  }
  return out + std::string(m.flush());
}

TEST_CASE("stop strings: text before the stop string is emitted, the rest is not") {
  StopMatcher a({"END"});
  CHECK(feed(a, {"hello E", "N", "D world"}) == "hello ");
  CHECK(a.stopped());
  StopMatcher b({"END"});
  CHECK(b.push("hello E") == "hello ");  // "E" may begin "END": held back
  CHECK(b.push("N") == "");
  CHECK(b.push("Z") == "ENZ");  // it did not
  CHECK(!b.stopped());
  StopMatcher c({"\n\n", "Lily"});
  CHECK(feed(c, {"Li", "nda and Li", "ly"}) == "Linda and ");  // the earliest complete match wins
  StopMatcher d({"xyz"});
  CHECK(feed(d, {"abc", "xy"}) == "abcxy");  // held text comes out at the end
  StopMatcher none({});
  CHECK(none.push("anything") == "anything");
}

TEST_CASE("generate: a stop string ends greedy text exactly where the reference text has it") {
  const Model m = load(shared_model("stories260K.gguf"));
  const std::string ref = read_text(shared_model("stories260K.greedy100.llamacpp.txt"));  // " Once upon a time..."
  const std::string prompt_echo = " Once upon a time";
  REQUIRE(ref.rfind(prompt_echo, 0) == 0);
  const std::string gen_ref = ref.substr(prompt_echo.size());
  for (const std::string stop : {"Lily", "park.", "\n", "ball"}) {
    INFO("stop ", stop);
    Session s(m, {.ctx = 128});
    std::string out;
    const auto r = generate(s, "Once upon a time", {.max_tokens = 100, .sampling = {.temperature = 0}, .stop = {stop}},
                            [&](std::string_view p) { out += p; });
    const auto at = gen_ref.find(stop);
    REQUIRE(at != std::string::npos);
    CHECK(out == gen_ref.substr(0, at));
    CHECK(r.stop == StopReason::stop_string);
  }
}

TEST_CASE("generate: same seed, same text; another seed, another text") {
  const Model m = load(shared_model("stories260K.gguf"));
  auto run = [&](uint64_t seed, std::size_t threads) {
    Session s(m, {.ctx = 128, .threads = threads});
    std::string out;
    generate(s, "Once upon a time", {.max_tokens = 60, .sampling = {.temperature = 1.0f, .seed = seed}},
             [&](std::string_view p) { out += p; });
    return out;
  };
  const std::string a = run(1234, 1);
  CHECK(a == run(1234, 1));
  CHECK(a == run(1234, 2));
  CHECK(a != run(4321, 1));
}

TEST_CASE("generate: a callback returning false stops; stats are filled in") {
  const Model m = load(shared_model("stories260K.gguf"));
  Session s(m, {.ctx = 128});
  int calls = 0;
  std::string text;
  const auto r =
      generate(s, "Once upon a time", {.max_tokens = 50, .sampling = {.temperature = 0}}, [&](std::string_view p) {
        text += p;
        return ++calls < 7;
      });
  CHECK(r.stop == StopReason::callback);
  CHECK(calls == 7);
  CHECK(r.n_generated == 7);
  // The generated ids: what the session holds after the prompt (the last one pending), and what was streamed.
  REQUIRE(r.tokens.size() == 7);
  CHECK(std::equal(r.tokens.begin(), r.tokens.end() - 1, s.tokens().end() - 6));
  CHECK(s.pending() == r.tokens.back());
  std::string bytes;
  for (const int32_t t : r.tokens) bytes += m.tokenizer().token_bytes(t);
  CHECK(bytes == text);
  CHECK(r.n_prompt == 5);
  CHECK(r.prompt_ms > 0);
  CHECK(r.ttft_ms >= r.prompt_ms);
  CHECK(r.total_ms >= r.ttft_ms);
  CHECK(r.prompt_tok_s() > 0);
  CHECK(r.gen_tok_s() > 0);
}

TEST_CASE("generate: an end-of-generation token stops (unless ignore_eos), and is not emitted") {
  HParams hp;
  hp.arch = "llama";
  hp.dim = 32;
  hp.n_layers = 1;
  hp.n_heads = 4;
  hp.n_kv_heads = 4;
  hp.head_dim = 8;
  hp.ffn_dim = 48;
  hp.vocab = 30;
  hp.ctx_train = 64;
  hp.rope_dim = 8;
  hp.attn_scale = float(1.0 / std::sqrt(8.0));
  // Find a random model whose greedy continuation of [BOS, 5] has a token at some step k >= 1 that did
  // not occur before; with that token as EOS, generation must stop after exactly k tokens.
  RefModel ref;
  std::vector<int32_t> toks;
  std::size_t k = 0;
  auto model_with_eos = [&](int32_t eos) {
    Vocabulary v;
    for (int i = 0; i < 30; ++i) v.pieces.push_back(std::string(1, char('a' + (i % 26))) + std::to_string(i));
    v.bos = 0;
    v.eos = eos;
    v.add_space_prefix = false;  // the prompt "f5" is then exactly token 5
    return Model(std::make_shared<Transformer<Llama>>(hp, weights_of(ref), Tokenizer(std::move(v))));
  };
  for (uint32_t seed = 100; seed < 120 && k == 0; ++seed) {
    ref = random_model(RefTraits{}, hp, seed);
    const Model m = model_with_eos(-1);
    Session s(m, {.ctx = 64});
    auto logits = s.eval(std::vector<int32_t>{0, 5});
    toks.clear();
    for (int i = 0; i < 8; ++i) {
      toks.push_back(sampling::argmax(logits));
      logits = s.eval(toks.back());
    }
    for (std::size_t i = 1; i < toks.size() && k == 0; ++i)
      if (std::find(toks.begin(), toks.begin() + std::ptrdiff_t(i), toks[i]) == toks.begin() + std::ptrdiff_t(i)) k = i;
  }
  REQUIRE(k > 0);
  const Model m = model_with_eos(toks[k]);
  std::string expect;
  for (std::size_t i = 0; i < k; ++i) expect += m.tokenizer().token_bytes(toks[i]);
  Session s(m, {.ctx = 64});
  std::string out;
  auto r = generate(s, m.tokenizer().piece(5), {.max_tokens = 10, .sampling = {.temperature = 0}},
                    [&](std::string_view p) { out += p; });
  CHECK(r.stop == StopReason::eos);
  CHECK(r.n_generated == k);
  CHECK(r.tokens == std::vector<int32_t>(toks.begin(), toks.begin() + std::ptrdiff_t(k)));  // the EOS not included
  CHECK(out == expect);
  s.reset();
  r = generate(s, m.tokenizer().piece(5), {.max_tokens = 10, .sampling = {.temperature = 0}, .ignore_eos = true},
               [](std::string_view) {});
  CHECK(r.stop == StopReason::max_tokens);
  CHECK(r.n_generated == 10);
  REQUIRE(r.tokens.size() == 10);
  CHECK(std::equal(toks.begin(), toks.end(), r.tokens.begin()));  // the greedy steps above, EOS included now
}

}  // namespace
}  // namespace kiln::test
