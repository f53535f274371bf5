// The real models (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M) against Hugging Face transformers
// loading the same GGUF files: tests/fixtures/hf/*.json, made by scripts/fixtures/make_hf_logits.py
// (transformers dequantizes the GGUF to f32 and runs its own modeling code in f32, eager attention).
//
// Exact path (Precision::exact: f32 products with the same dequantized weights):
//   * top-1 token identical at every prompt position (where HF's top two logits are closer than 1e-4 of
//     the logit range, either of them is accepted: summation order alone can swap them);
//   * max |kiln - HF| over the recorded logits (HF's top 8 and 128 fixed vocabulary ids) <= 1e-3 of the
//     position's logit range (max - min). Measured worst: ~2e-5 (SmolLM2) and ~1e-4 (Gemma 3): f32
//     summation order through 30 / 18 layers; a wrong norm, RoPE pair, scale or mask is > 1e-2;
//   * the 32-token greedy continuation identical to HF's.
// The default KV cache (SessionOptions::kv_type automatic) is f32 on the exact path, f16 on fast and fast8,
// so those compare HF with kiln's default f16 cache (keys and values rounded to f16: ~4e-4 of the range
// on its own, tests/model/test_kv_cache.cpp).
// Fast path (Precision::fast: integer dots, activations in two 8-bit parts): top-1 agreement >= 99% of
// positions and the same greedy continuation (the targets).
// Precision::fast8 (one 8-bit part, llama.cpp's scheme): the looser bounds kFast8* below, with why.
//
// Every position's logits come from feeding the prompt one token at a time (the decode path, GEMV);
// a second session runs the whole prompt as one batch (the prefill path, GEMM), checked at its last
// position and by the greedy continuation that follows it. Under AddressSanitizer (a -O0 build, ~50x
// slower) the test is reduced, and says so: the first prompt's first kMaxStepPositions positions only,
// one token at a time (memory errors show there as anywhere); the release run checks everything.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/model/model.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kReduced = true;
constexpr std::size_t kMaxStepPositions = 6;
#else
constexpr bool kReduced = false;
constexpr std::size_t kMaxStepPositions = 1 << 20;
#endif

constexpr double kExactRelTol = 1e-3;  // of the logit range, per position
constexpr double kTieRel = 1e-4;       // HF top-2 closer than this (of the range): either is top-1
// fast8. Rounding activations to 8 bits per 32 values moves logits by up to 2.6% (SmolLM2) and 3.4%
// (Gemma 3) of their range here, while HF's top two logits are closer than 0.3% of the range at 10 of
// SmolLM2's 189 positions: those flip. Measured with an f32 KV cache: top-1 agreement 183/191 (95.8%,
// SmolLM2) and 191/195 (98.0%, Gemma 3); greedy continuations identical for their first 7-9 tokens, then
// a near-tie goes the other way. With the default f16 cache: 190/191 (99.5%) and 186/195 (95.4%: one
// position above the bound), greedy 29 and 6 tokens. llama.cpp's scheme (Q8_0/Q8_1 activations) has the
// same limit; fast (two parts) removes it.
constexpr double kFast8MaxRel = 0.05;  // per position, of the range (measured worst 0.034; f16 KV 0.036)
// fast, per position. Measured worst 1.3e-4 (SmolLM2) / 1.4e-4 (Gemma 3) with an f32 KV cache (mean over the
// positions 5.0e-5 / 6.5e-5), 4.6e-4 / 4.8e-4 with the default f16 one (mean 1.5e-4 / 1.2e-4). Session 11's
// fixed residual scale dx / 256 had moved them to 1.8e-4 / 1.3e-4 (mean 6.8e-5 / 6.4e-5) and 5.3e-4 / 5.0e-4
// (mean 1.7e-4 / 1.2e-4); session 12's dx / 2^s, s = 8..12 per block, won that back (before session 11, with
// the residual's own amax / 127: 1.2e-4 / 1.6e-4, mean 4.7e-5 / 6.1e-5, and 3.3e-4 / 2.9e-4); the f16
// cache's roundings make the worst position move with any change in the activations' last bits.
constexpr double kFastMaxRel = 1e-3;
// Top-1 and greedy text under those bounds. Where every logit is within B of HF's, the top token can
// differ only where the top two are closer than 2B: outside that band the top token must be HF's, at every
// position (a fraction measured on one CPU would not carry to another, whose last bits differ). Greedy
// text: identical up to the first step whose top two are within 2B (after a legitimate flip the texts
// part ways). Exact: B = kTieRel; fast and fast8: their per-position bounds.
double tie_band(Precision p) {
  return p == Precision::exact ? kTieRel : 2 * (p == Precision::fast8 ? kFast8MaxRel : kFastMaxRel);
}

nlohmann::json load_fixture(const std::string& name) {
  const std::string p = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/" + name + ".json";
  std::ifstream in(p);
  if (!in) FAIL("missing fixture '", p, "' (scripts/fixtures/make_hf_logits.py makes it)");
  return nlohmann::json::parse(in);
}

int32_t argmax(std::span<const float> v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

struct PositionResult {
  bool top1 = false;
  double rel_err = 0;  // max |delta| over recorded ids / range
};

PositionResult compare_position(std::span<const float> got, const nlohmann::json& want,
                                const std::vector<int32_t>& sample, double tie = kTieRel) {
  PositionResult r;
  const double lo = want["min"], hi = want["max"], range = hi - lo;
  const auto& top_ids = want["top_ids"];
  const auto& top_logits = want["top_logits"];
  const int32_t a = argmax(got);
  // Within the tie band kiln's top token may be any of HF's whose logit is that close to the first.
  r.top1 = false;
  for (std::size_t i = 0; i < top_ids.size() && !r.top1; ++i)
    r.top1 = a == top_ids[i].get<int32_t>() &&
             (i == 0 || top_logits[0].get<double>() - top_logits[i].get<double>() < tie * range);
  double worst = 0;
  for (std::size_t i = 0; i < top_ids.size(); ++i)
    worst = std::max(worst, std::fabs(double(got[top_ids[i].get<int32_t>()]) - top_logits[i].get<double>()));
  const auto& s = want["sample"];
  for (std::size_t i = 0; i < sample.size(); ++i)
    worst = std::max(worst, std::fabs(double(got[sample[i]]) - s[i].get<double>()));
  r.rel_err = worst / range;
  return r;
}

// (top two - second) / range of one row of logits.
double top2_margin(std::span<const float> v) {
  std::vector<float> c(v.begin(), v.end());
  std::partial_sort(c.begin(), c.begin() + 2, c.end(), std::greater<float>());
  return double(c[0] - c[1]) / (double(c[0]) - double(*std::min_element(c.begin(), c.end())));
}

struct Greedy {
  std::vector<int32_t> ids;
  std::size_t first_tie = SIZE_MAX;  // the first step whose top two were within the tie band
};

Greedy greedy(Session& s, std::span<const float> logits, std::size_t n, int32_t eos, double tie) {
  Greedy g;
  std::vector<float> l(logits.begin(), logits.end());
  while (g.ids.size() < n) {
    if (g.first_tie == SIZE_MAX && top2_margin(l) < tie) g.first_tie = g.ids.size();
    const int32_t t = argmax(l);
    g.ids.push_back(t);
    if (t == eos || g.ids.size() == n) break;
    const auto next = s.eval(t);
    l.assign(next.begin(), next.end());
  }
  return g;
}

void check_model(const std::string& fixture, const std::string& file, Precision precision) {
  const auto fx = load_fixture(fixture);
  const Model model = load(real_model(file));
  const auto sample = fx["sample_ids"].get<std::vector<int32_t>>();
  const bool exact = precision == Precision::exact, fast8 = precision == Precision::fast8;
  const std::string tag = fixture + (exact ? " exact" : fast8 ? " fast8" : " fast");
  const double tie = tie_band(precision);
  std::size_t positions = 0, top1_ok = 0;
  double worst = 0;
  for (const auto& pr : fx["prompts"]) {
    const auto ids = pr["ids"].get<std::vector<int32_t>>();
    const auto want_greedy = pr["greedy_ids"].get<std::vector<int32_t>>();
    INFO(tag, " prompt of ", ids.size(), " tokens");
    // The tokenizer converts the prompt text to HF's ids (HF adds special tokens as the model says).
    CHECK(model.tokenizer().encode(pr["text"].get<std::string>(), {.add_special = true}) == ids);
    const std::size_t ctx = ids.size() + want_greedy.size() + 1;
    // Decode path: one token at a time, every position compared.
    {
      Session s(model, {.ctx = ctx, .threads = 2, .precision = precision});
      const std::size_t steps = std::min(ids.size(), kMaxStepPositions);
      for (std::size_t p = 0; p < steps; ++p) {
        const auto r = compare_position(s.eval(ids[p]), pr["positions"][p], sample, tie);
        ++positions;
        top1_ok += r.top1;
        worst = std::max(worst, r.rel_err);
        INFO("position ", p, ": max |delta logit| / range ", r.rel_err);
        CHECK(r.top1);
        CHECK(r.rel_err <= (exact ? kExactRelTol : fast8 ? kFast8MaxRel : kFastMaxRel));
      }
    }
    if (kReduced) {
      MESSAGE(tag, ": sanitizer build: reduced to the first ", kMaxStepPositions,
              " positions of the first prompt (the release build runs the whole test)");
      break;
    }
    // Prefill path: the prompt as one batch, then the greedy continuation.
    Session s(model, {.ctx = ctx, .threads = 2, .precision = precision});
    const auto last = s.eval(ids);
    const auto r = compare_position(last, pr["positions"][ids.size() - 1], sample, tie);
    ++positions;
    top1_ok += r.top1;
    worst = std::max(worst, r.rel_err);
    CHECK(r.top1);
    if (exact) CHECK(r.rel_err <= kExactRelTol);
    const int32_t eos = model.tokenizer().vocabulary().eos;
    const Greedy g = greedy(s, last, want_greedy.size(), eos, exact ? 0.0 : tie);
    const std::vector<int32_t>& got = g.ids;  // (not a structured binding: INFO captures it, clang 14 cannot)
    const std::size_t first_tie = g.first_tie;
    INFO("HF greedy: ", pr["greedy_text"].get<std::string>());
    INFO("kiln greedy: ", model.tokenizer().decode(got));
    std::size_t same = 0;
    while (same < std::min(got.size(), want_greedy.size()) && got[same] == want_greedy[same]) ++same;
    MESSAGE(
        tag, ": greedy continuation identical for ", same, " of ", want_greedy.size(), " tokens",
        first_tie == SIZE_MAX ? std::string() : detail::concat(" (first step within the tie band: ", first_tie, ")"));
    if (exact) CHECK(got == want_greedy);
    else CHECK(same >= std::min(first_tie, want_greedy.size()));
  }
  MESSAGE(tag, ": top-1 agreement ", top1_ok, "/", positions, ", worst max|delta logit|/range ", worst);
}

TEST_CASE("hf: SmolLM2-135M-Instruct Q4_1, exact path, matches transformers' logits and greedy text") {
  check_model("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", Precision::exact);
}
TEST_CASE("hf: SmolLM2-135M-Instruct Q4_1, fast path, agrees with transformers' top-1 and greedy text") {
  check_model("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", Precision::fast);
}
TEST_CASE("hf: SmolLM2-135M-Instruct Q4_1, fast8 path (llama.cpp's 8-bit activations) stays within its bounds") {
  check_model("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", Precision::fast8);
}
TEST_CASE("hf: Gemma 3 270M Q4_K_M, exact path, matches transformers' logits and greedy text") {
  check_model("gemma3", "gemma-3-270m-q4_k_m.gguf", Precision::exact);
}
TEST_CASE("hf: Gemma 3 270M Q4_K_M, fast path, agrees with transformers' top-1 and greedy text") {
  check_model("gemma3", "gemma-3-270m-q4_k_m.gguf", Precision::fast);
}
TEST_CASE("hf: Gemma 3 270M Q4_K_M, fast8 path (llama.cpp's 8-bit activations) stays within its bounds") {
  check_model("gemma3", "gemma-3-270m-q4_k_m.gguf", Precision::fast8);
}

}  // namespace
}  // namespace kiln::test
