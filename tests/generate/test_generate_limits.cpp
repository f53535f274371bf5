// generate/generate.hpp at the edges (issue 37): a full context ends generation with
// StopReason::context_full instead of an exception, an empty prompt starts from BOS, a long prompt reports
// its progress batch by batch with the logits of one eval.
#include <string>
#include <utility>
#include <vector>

#include "kiln/generate/generate.hpp"
#include "model/model_test_util.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

TEST_CASE("generate: a generation that fills the context ends with StopReason::context_full") {
  const Model m = load(shared_model("stories260K.gguf"));
  Session s(m, {.ctx = 16});
  std::string streamed;
  const auto r = generate(s, "Once upon a time", {.max_tokens = 100, .sampling = {.temperature = 0}},
                          [&](std::string_view x) { streamed += x; });
  CHECK(r.stop == StopReason::context_full);
  CHECK(std::string(stop_reason_name(r.stop)) == "context_full");
  // 5 prompt positions + 11 sampled tokens run = 16; the 12th sampled token is pending, and streamed.
  CHECK(r.n_generated == 12);
  CHECK(s.n_past() == 16);
  CHECK(s.pending() >= 0);
  CHECK(!streamed.empty());
  CHECK(r.gen_ms > 0);
  // The same text as a run that asks for exactly those 12 tokens.
  Session s2(m, {.ctx = 16});
  std::string exact;
  const auto r2 = generate(s2, "Once upon a time", {.max_tokens = 12, .sampling = {.temperature = 0}},
                           [&](std::string_view x) { exact += x; });
  CHECK(r2.stop == StopReason::max_tokens);
  CHECK(exact == streamed);
  // A prompt that does not fit is still an error.
  Session small(m, {.ctx = 4});
  CHECK_THROWS_WITH(generate(small, "Once upon a time", {.max_tokens = 1}, [](std::string_view) {}),
                    doctest::Contains("does not fit in the context"));
}

TEST_CASE("generate: an empty prompt in an empty sequence starts from the BOS token") {
  const Model m = load(shared_model("stories260K.gguf"));
  Session s(m, {.ctx = 32});
  const auto r = generate(s, "", {.max_tokens = 4, .sampling = {.temperature = 0}}, [](std::string_view) {});
  CHECK(r.n_prompt == 1);
  CHECK(s.tokens()[0] == m.tokenizer().bos());
  // A vocabulary that does not prepend BOS to prompts (SmolLM2) but has one.
  const Model smol = load(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"));
  REQUIRE(!smol.tokenizer().add_bos());
  REQUIRE(smol.tokenizer().bos() >= 0);
  Session t(smol, {.ctx = 32});
  const auto q = generate(t, "", {.max_tokens = 2, .sampling = {.temperature = 0}}, [](std::string_view) {});
  CHECK(q.n_prompt == 1);
  CHECK(t.tokens()[0] == smol.tokenizer().bos());
  // add_bos off: nothing to start from.
  Session u(m, {.ctx = 32});
  CHECK_THROWS_WITH(generate(u, "", {.max_tokens = 2, .add_bos = false}, [](std::string_view) {}),
                    doctest::Contains("empty prompt in an empty sequence"));
}

TEST_CASE("generate: on_prompt_progress reports each batch, and the logits are one eval's") {
  const Model m = load(shared_model("stories260K.gguf"));
  const std::string prompt = "Once upon a time, there was a little girl named Lily. She liked to play outside.";
  std::vector<std::pair<std::size_t, std::size_t>> calls;
  Session a(m, {.ctx = 128, .batch = 8});
  CHECK(a.batch() == 8);
  GenerateOptions opt{.max_tokens = 1, .sampling = {.temperature = 0}};
  opt.on_prompt_progress = [&](std::size_t done, std::size_t total) { calls.emplace_back(done, total); };
  generate(a, prompt, opt, [](std::string_view) {});
  const std::size_t n = a.n_past();
  REQUIRE(n > 16);
  REQUIRE(calls.size() == (n + 7) / 8);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    CHECK(calls[i].first == std::min(n, (i + 1) * 8));
    CHECK(calls[i].second == n);
  }
  Session b(m, {.ctx = 128, .batch = 8});
  const auto ids = m.tokenizer().encode(prompt);
  const auto want = b.eval(ids);
  const auto got = a.logits();
  CHECK(std::equal(got.begin(), got.end(), want.begin(), want.end()));
}

}  // namespace
}  // namespace kiln::test
