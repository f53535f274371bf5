// bench/bench_constraint.cpp - constrained decoding's cost per token (generate/constraint.hpp) on a real
// vocabulary: the whole mask (a walk of the vocabulary's byte trie) where most tokens are allowed (inside a
// JSON string) and where few are (after an object's key), one token's check (what the sampler does first, in
// logit order), the sampler's constrained greedy and top-k 40 draws, and building the trie. The model is
// $KILN_MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf (49152 tokens; KILN_CONSTRAINT_MODEL names another GGUF);
// without it these benchmarks report an error. Compare with a decode step of the same model (~4 ms at 2 threads).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "kiln/generate/json_schema.hpp"
#include "kiln/kiln.hpp"

namespace {

const kiln::Tokenizer* constraint_tokenizer() {
  static const std::unique_ptr<kiln::Tokenizer> tok = []() -> std::unique_ptr<kiln::Tokenizer> {
    std::string p;
    if (const char* m = std::getenv("KILN_CONSTRAINT_MODEL")) {
      p = m;
    } else {
      const char* dir = std::getenv("KILN_MODEL_DIR");
      const char* home = std::getenv("HOME");
      p = (dir && *dir ? std::string(dir) : std::string(home ? home : "") + "/.cache/kiln/models") +
          "/SmolLM2-135M-Instruct.Q4_1.gguf";
    }
    try {
      const kiln::io::GGUFFile f(p);
      return std::make_unique<kiln::Tokenizer>(kiln::Tokenizer::from_gguf(f));
    } catch (const std::exception&) {
      return nullptr;
    }
  }();
  return tok.get();
}

constexpr const char* kSchema =
    R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age", "tags"],
        "additionalProperties": false})";

// range(0): 0 = inside the name's string (most tokens allowed), 1 = after the name (a comma or whitespace);
// range(1): 0 = the trie walk (a fresh Constraint each time), 1 = the state's mask again (kept by state).
void BM_constraint_mask(benchmark::State& state) {
  const kiln::Tokenizer* tok = constraint_tokenizer();
  if (!tok) return state.SkipWithError("no model: set KILN_MODEL_DIR or KILN_CONSTRAINT_MODEL");
  const auto g = kiln::json_schema_grammar(kSchema);
  const auto trie = kiln::TokenTrie::of(*tok);
  const char* text = state.range(0) == 0 ? R"({"name": "Ada Lo)" : R"({"name": "Ada")";
  std::vector<int32_t> mask;
  std::optional<kiln::Constraint> c;
  c.emplace(g, trie);
  c->accept_text(text);
  for (auto _ : state) {
    if (state.range(1) == 0) {
      state.PauseTiming();
      c.emplace(g, trie);
      c->accept_text(text);
      state.ResumeTiming();
    }
    c->mask(mask);
    benchmark::DoNotOptimize(mask.data());
  }
  state.counters["allowed"] = double(mask.size());
}
BENCHMARK(BM_constraint_mask)
    ->ArgNames({"state", "kept"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

void BM_constraint_allows(benchmark::State& state) {
  const kiln::Tokenizer* tok = constraint_tokenizer();
  if (!tok) return state.SkipWithError("no model: set KILN_MODEL_DIR or KILN_CONSTRAINT_MODEL");
  kiln::Constraint c(kiln::json_schema_grammar(kSchema), kiln::TokenTrie::of(*tok));
  c.accept_text(R"({"name": "Ada Lo)");
  std::mt19937 rng(1);
  std::vector<int32_t> ids(4096);
  for (auto& id : ids) id = int32_t(rng() % tok->size());
  std::size_t i = 0, ok = 0;
  for (auto _ : state) ok += c.allows(ids[i++ % ids.size()]);
  benchmark::DoNotOptimize(ok);
}
BENCHMARK(BM_constraint_allows)->Unit(benchmark::kNanosecond);

// The sampler with the constraint on random logits: range(0) 0 = greedy, 1 = top-k 40 (temperature 0.8).
void BM_constraint_sample(benchmark::State& state) {
  const kiln::Tokenizer* tok = constraint_tokenizer();
  if (!tok) return state.SkipWithError("no model: set KILN_MODEL_DIR or KILN_CONSTRAINT_MODEL");
  kiln::Constraint c(kiln::json_schema_grammar(kSchema), kiln::TokenTrie::of(*tok));
  c.accept_text(R"({"name": "Ada")");  // few tokens allowed: the most likely ones are mostly refused
  std::vector<float> logits(tok->size());
  std::mt19937 rng(2);
  for (auto& l : logits) l = std::normal_distribution<float>(0.0f, 2.0f)(rng);
  kiln::SamplerScratch scratch(tok->size());
  std::mt19937_64 draw(3);
  const kiln::SamplerOptions opt =
      state.range(0) == 0 ? kiln::SamplerOptions{.temperature = 0} : kiln::SamplerOptions{.temperature = 0.8f};
  for (auto _ : state) benchmark::DoNotOptimize(scratch.sample(logits, {}, opt, draw, &c));
}
BENCHMARK(BM_constraint_sample)->ArgName("topk40")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_constraint_trie_build(benchmark::State& state) {
  const kiln::Tokenizer* tok = constraint_tokenizer();
  if (!tok) return state.SkipWithError("no model: set KILN_MODEL_DIR or KILN_CONSTRAINT_MODEL");
  std::size_t nodes = 0;
  for (auto _ : state) nodes = kiln::TokenTrie::of(*tok)->nodes();
  state.counters["nodes"] = double(nodes);
}
BENCHMARK(BM_constraint_trie_build)->Unit(benchmark::kMillisecond);

}  // namespace
