// End to end: greedy generation from stories260K reproduces the reference engines' text exactly.
//
// The fixtures (../shared/models, see its README):
//   stories260K.greedy100.llamacpp.txt: llama.cpp, prompt "Once upon a time" with BOS, 100 tokens at
//     temperature 0. The file is the prompt as llama.cpp echoes it (its tokens detokenized: " Once upon a
//     time", the SentencePiece dummy-prefix space included), then the 100 generated tokens, then "\n\n"
//     (the program's trailing newlines).
//   stories260K.greedy256.txt: llama2.c's run.c, 256 steps from the same prompt: the 4 prompt tokens
//     (run.c drops the leading space of the piece after BOS) and 252 generated tokens, then "\n\n".
#include <string>

#include "kiln/generate/generate.hpp"
#include "kiln/model/model.hpp"
#include "model_test_util.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

const std::string kPrompt = "Once upon a time";

/// The prompt as echoed (its tokens without BOS, detokenized) followed by n greedy tokens.
std::string greedy_text(const Model& m, std::size_t ctx, std::size_t threads, int n, std::size_t batch = 512) {
  Session s(m, {.ctx = ctx, .threads = threads, .batch = batch});
  const auto ids = m.tokenizer().encode(kPrompt);
  std::string text = m.tokenizer().decode(std::span(ids).subspan(1));
  std::size_t pieces = 0;
  const auto r = generate(s, kPrompt, {.max_tokens = n, .sampling = {.temperature = 0}}, [&](std::string_view p) {
    text += p;
    ++pieces;
  });
  CHECK(r.n_generated == std::size_t(n));
  CHECK(r.stop == StopReason::max_tokens);
  CHECK(pieces > 0);
  return text;
}

std::string strip_suffix(const std::string& s, const std::string& suffix) {
  REQUIRE_MESSAGE(s.size() >= suffix.size(), "reference text shorter than its expected suffix");
  REQUIRE_MESSAGE(s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0,
                  "reference text does not end with the printing program's newlines");
  return s.substr(0, s.size() - suffix.size());
}

void check_both_references(const Model& m, std::size_t threads) {
  const std::string llamacpp = strip_suffix(read_text(shared_model("stories260K.greedy100.llamacpp.txt")), "\n\n");
  const std::string runc = strip_suffix(read_text(shared_model("stories260K.greedy256.txt")), "\n\n");
  CHECK(greedy_text(m, 256, threads, 100) == llamacpp);
  // run.c's 256 steps: BOS + 4 prompt tokens + 252 generated = 256 positions run (the last sampled
  // token is not run), so ctx 256 is enough; stories260K.gguf records 128, which kiln allows (warning).
  const std::string ours = greedy_text(m, 256, threads, 252);
  REQUIRE(ours.size() > 1);
  CHECK(ours.substr(1) == runc);  // run.c strips the space of the first piece after BOS
}

TEST_CASE("reference text: stories260K.gguf greedy == llama.cpp (100 tokens) and run.c (256 steps)") {
  const Model m = load(shared_model("stories260K.gguf"));
  CHECK(m.architecture() == "llama");
  CHECK(m.hparams().ctx_train == 128);
  check_both_references(m, 1);
}

TEST_CASE("reference text: stories260K.bin + tok512.bin greedy == llama.cpp and run.c") {
  const Model m = load_llama2c(shared_model("stories260K.bin"), shared_model("tok512.bin"));
  CHECK(m.hparams().ctx_train == 512);
  check_both_references(m, 1);
}

TEST_CASE("reference text: 2 threads and a prompt split into batches give the same text") {
  const Model m = load(shared_model("stories260K.gguf"));
  const std::string llamacpp = strip_suffix(read_text(shared_model("stories260K.greedy100.llamacpp.txt")), "\n\n");
  CHECK(greedy_text(m, 256, 2, 100) == llamacpp);
  CHECK(greedy_text(m, 256, 1, 100, /*batch=*/2) == llamacpp);
}

}  // namespace
}  // namespace kiln::test
