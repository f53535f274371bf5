// generate/perplexity.hpp: kiln::perplexity against Hugging Face transformers with llama.cpp's chunking
// (tests/fixtures/models/llama/perplexity.json, made by scripts/fixtures/make_perplexity_fixture.py), its
// errors, and the KL divergence: a model against itself, fast against exact on SmolLM2, the base file's
// round trip and its corrupt and mismatched variants.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/generate/perplexity.hpp"
#include "model/model_test_util.hpp"
#include "test_util.hpp"

namespace kiln::test::ppl_test {
namespace {

namespace fs = std::filesystem;

// kiln's f32 path against HF's logits: max |kiln - HF| <= 1e-4 of the position's logit range
// (tests/model/test_hf_models.cpp's tolerance, both in f32 with an f32 KV cache). An NLL is lse(x) - x[t],
// and lse moves by at most the largest logit change, so each NLL is within 2e-4 x range of HF's, and a mean
// of NLLs within the mean of those bounds.
constexpr double kLogitTol = 1e-4;

// SmolLM2's chunk length: under AddressSanitizer (a -O0 build, ~50x slower) shorter chunks, the same checks.
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kSmolCtx = 16;
#else
constexpr std::size_t kSmolCtx = 64;
#endif

std::string ppl_fixture_dir(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

nlohmann::json ppl_reference() {
  const std::string p = ppl_fixture_dir("llama") + "/perplexity.json";
  if (!fs::exists(p)) FAIL("missing fixture '", p, "' (scripts/fixtures/make_perplexity_fixture.py makes it)");
  return nlohmann::json::parse(read_text(p));
}

fs::path ppl_temp(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kiln_test_ppl_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d / name;
}

std::string ppl_slurp(const fs::path& p) { return read_text(p.string()); }

void ppl_write(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

TEST_CASE("perplexity: the tiny Llama matches HF transformers with llama.cpp's chunking") {
  const auto ref = ppl_reference();
  const Model m = load(ppl_fixture_dir("llama") + "/model.gguf");
  REQUIRE(m.tokenizer().add_bos());
  REQUIRE(m.tokenizer().bos() == ref.at("bos").get<int32_t>());
  const auto tokens = ref.at("tokens").get<std::vector<int32_t>>();
  const auto want_nll = ref.at("nll").get<std::vector<double>>();
  const auto range = ref.at("logit_range").get<std::vector<double>>();
  const auto want_running = ref.at("running_ppl").get<std::vector<double>>();
  const std::size_t ctx = ref.at("ctx").get<std::size_t>(), scored = ctx - 1 - ctx / 2;
  REQUIRE(want_nll.size() == want_running.size() * scored);
  // Passes of the whole chunk, of 7 tokens (the scored half starting inside one) and of 1 (decode steps).
  for (const std::size_t batch : {ctx, std::size_t(7), std::size_t(1)})
    for (const std::size_t threads : {std::size_t(1), std::size_t(2)}) {
      INFO("batch ", batch, ", threads ", threads);
      std::vector<double> seen;
      const PerplexityResult r =
          perplexity(m, tokens,
                     {.ctx = ctx,
                      .threads = threads,
                      .batch = batch,
                      .precision = Precision::exact,
                      .kv_type = KVType::f32,
                      .on_chunk = [&](const PerplexityProgress& p) { seen.push_back(p.ppl.value); }});
      CHECK(r.chunks == want_running.size());  // the remainder (11 tokens) dropped
      CHECK(r.count == want_nll.size());
      CHECK(r.bos == m.tokenizer().bos());
      REQUIRE(r.running_ppl.size() == want_running.size());
      CHECK(seen == r.running_ppl);
      double bound = 0;
      for (std::size_t c = 0; c < want_running.size(); ++c) {
        for (std::size_t j = 0; j < scored; ++j) bound += 2 * kLogitTol * range[c * scored + j];
        const double mean_bound = bound / double((c + 1) * scored);
        CHECK(std::fabs(std::log(r.running_ppl[c] / want_running[c])) <= mean_bound);
      }
      const double mean_bound = bound / double(want_nll.size());
      double mean_range = 0;
      for (double v : range) mean_range += v / double(range.size());
      CHECK(std::fabs(r.logit_range - mean_range) <= 2 * kLogitTol * mean_range);
      CHECK(std::fabs(r.nll.value - ref.at("mean_nll").get<double>()) <= mean_bound);
      CHECK(std::fabs(std::log(r.ppl.value / ref.at("ppl").get<double>())) <= mean_bound);
      // The standard deviation is a seminorm of the NLL vector: it moves by at most the largest NLL change,
      // and the standard error by that over sqrt(n - 1).
      const double max_e = 2 * kLogitTol * *std::max_element(range.begin(), range.end());
      CHECK(std::fabs(r.nll.uncertainty - ref.at("nll_stderr").get<double>()) <=
            max_e / std::sqrt(double(want_nll.size() - 1)));
      CHECK(r.ppl.uncertainty == doctest::Approx(r.nll.uncertainty * r.ppl.value).epsilon(1e-12));
    }
}

TEST_CASE("perplexity: too few tokens, a context out of range and bad token ids are errors") {
  const Model m = load(ppl_fixture_dir("llama") + "/model.gguf");  // trained context 128, vocabulary 256
  std::vector<int32_t> tokens(300, 5);
  CHECK_THROWS_WITH_AS(perplexity(m, std::span(tokens).first(63), {.ctx = 32}),
                       doctest::Contains("63 tokens; a context of 32 needs at least 64"), Error);
  CHECK_THROWS_WITH_AS(perplexity(m, tokens, {.ctx = 3}), doctest::Contains("ctx 3 is too small"), Error);
  CHECK_THROWS_WITH_AS(perplexity(m, tokens, {.ctx = 129}),
                       doctest::Contains("ctx 129 exceeds the 128 positions the model was trained with"), Error);
  tokens[40] = 256;
  CHECK_THROWS_WITH_AS(perplexity(m, tokens, {.ctx = 32}),
                       doctest::Contains("token 40 (id 256) is outside the vocabulary of 256"), Error);
  CHECK_THROWS_WITH_AS(make_kld_base(m, std::span(tokens).first(64), {.ctx = 32, .kld_top_k = 0}),
                       doctest::Contains("kld_top_k is 0"), Error);
}

TEST_CASE("kl divergence: a model against itself is 0 with the same top token everywhere; the file round-trips") {
  const auto ref = ppl_reference();
  const Model m = load(ppl_fixture_dir("llama") + "/model.gguf");
  const auto tokens = ref.at("tokens").get<std::vector<int32_t>>();
  for (const std::size_t top_k : {std::size_t(1), std::size_t(16), std::size_t(256), std::size_t(1000)}) {
    INFO("top_k ", top_k);
    const PerplexityOptions opt{.ctx = 32, .threads = 2, .batch = 7, .kld_top_k = top_k};
    const KldBase base = make_kld_base(m, tokens, opt);
    CHECK(base.top_k == std::min<std::size_t>(top_k, 256));
    CHECK(base.perplexity.ppl.value == perplexity(m, tokens, opt).ppl.value);
    for (std::size_t i = 0; i < base.positions(); ++i) {  // the recorded probabilities: a distribution's top
      double mass = std::exp(base.rest_logp[i]);
      for (std::size_t t = 0; t < base.top_k; ++t) mass += std::exp(base.top_logp[i * base.top_k + t]);
      CHECK(mass == doctest::Approx(1.0).epsilon(1e-12));
    }
    const fs::path file = ppl_temp("self.kld");
    save_kld_base(base, file);
    const KldBase back = load_kld_base(file);
    CHECK(back.tokens == base.tokens);
    CHECK(back.nll == base.nll);
    CHECK(back.top_ids == base.top_ids);
    CHECK(back.top_logp == base.top_logp);
    CHECK(back.perplexity.ppl.value == doctest::Approx(base.perplexity.ppl.value).epsilon(1e-14));
    // The same options: the same logits, bit for bit, so every difference is exactly 0.
    const KldResult r = kl_divergence(m, back, opt);
    CHECK(r.count == base.positions());
    CHECK(r.kld.value == 0.0);
    CHECK(r.kld_max == 0.0);
    CHECK(r.same_top.value == 1.0);
    CHECK(r.log_ppl_ratio.value == 0.0);
    CHECK(r.ppl_ratio.value == 1.0);
    CHECK(r.p_diff_max == 0.0);
    if (top_k >= 256) CHECK(r.rest_mass == 0.0);  // the whole vocabulary recorded: no rest bucket
    else CHECK(r.rest_mass > 0.0);
    // Other passes (one batch per chunk, one thread): f32 sums in another order, logits within 1e-5 of the
    // range (test_hf_models.cpp measures ~1e-6 against HF). Hoeffding's lemma bounds the KL divergence of
    // logit vectors that differ by at most d per entry by (2d)^2 / 8.
    const auto ranges = ref.at("logit_range").get<std::vector<double>>();
    const double d = 1e-5 * *std::max_element(ranges.begin(), ranges.end());
    const KldResult other = kl_divergence(m, back, {.threads = 1, .batch = 32});
    CHECK(other.kld_max <= d * d / 2);
    CHECK(std::fabs(other.log_ppl_ratio.value) <= 2 * d);
    // --chunks on the comparison: the base's first chunks.
    CHECK(kl_divergence(m, back, {.max_chunks = 1}).count == base.scored_per_chunk());
  }
}

TEST_CASE("kl divergence: fast against exact on SmolLM2 is small and positive") {
  const Model m = load(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"));
  const auto tokens = m.tokenizer().encode(read_text(std::string(KILN_SOURCE_DIR) + "/README.md"));
  const std::size_t ctx = kSmolCtx, first = ctx / 2;
  const PerplexityOptions exact{.ctx = ctx, .max_chunks = 2, .threads = 2, .precision = Precision::exact};
  const KldBase base = make_kld_base(m, tokens, exact);
  const KldResult self = kl_divergence(m, base, exact);
  CHECK(self.kld.value == 0.0);  // the same pass again: the same bits
  CHECK(self.same_top.value == 1.0);
  const KldResult fast = kl_divergence(m, base, {.threads = 2, .precision = Precision::fast});
  CHECK(fast.count == 2 * (ctx - 1 - first));
  CHECK(fast.kld.value > 0);
  // fast's logits are within kFastMaxRel = 1e-3 of the range of HF's at each position and exact's within
  // 1e-4 (tests/model/test_hf_logits.cpp), so fast's are within d = 1.1e-3 x range of exact's. Hoeffding's
  // lemma bounds the KL divergence of logit vectors that differ by at most d per entry by (2d)^2 / 8;
  // coarse-graining to top_k + 1 outcomes only lowers it. The ranges: exact's logits at the scored
  // positions, one token at a time (SmolLM2 adds no BOS: the chunks are the tokens as they are).
  REQUIRE(!m.tokenizer().add_bos());
  double range = 0;
  Session s(m, {.ctx = ctx, .threads = 2, .precision = Precision::exact});
  for (std::size_t c = 0; c < 2; ++c) {
    s.reset();
    for (std::size_t j = 0; j + 1 < ctx; ++j) {
      const auto x = s.eval(tokens[c * ctx + j]);
      if (j < first) continue;
      const auto [lo, hi] = std::minmax_element(x.begin(), x.end());
      range = std::max(range, double(*hi) - double(*lo));
    }
  }
  const double d = 1.1e-3 * range;
  CHECK(fast.kld_max <= d * d / 2);
  CHECK(fast.same_top.value >= 0.9);
  const KldResult fast8 = kl_divergence(m, base, {.threads = 2, .precision = Precision::fast8});
  CHECK(fast8.kld.value > fast.kld.value);  // one 8-bit part moves the distributions more than two
}

TEST_CASE("kl divergence: corrupt, truncated and mismatched base files are errors naming the cause") {
  const auto ref = ppl_reference();
  const Model m = load(ppl_fixture_dir("llama") + "/model.gguf");
  const KldBase base = make_kld_base(m, ref.at("tokens").get<std::vector<int32_t>>(), {.ctx = 32, .kld_top_k = 8});
  const fs::path good = ppl_temp("good.kld"), bad = ppl_temp("bad.kld");
  save_kld_base(base, good);
  const std::string bytes = ppl_slurp(good);
  REQUIRE(bytes.size() == 32 + 4 * 3 * 32 + 3 * 15 * (16 + 12 * 8) + 8);
  auto load_bad = [&](const std::string& b) {
    ppl_write(bad, b);
    return load_kld_base(bad);
  };
  CHECK_THROWS_WITH_AS(load_kld_base(ppl_temp("missing.kld")), doctest::Contains("cannot open"), Error);
  CHECK_THROWS_WITH_AS(load_bad(""), doctest::Contains("does not start with \"KILNKLD1\""), FormatError);
  CHECK_THROWS_WITH_AS(load_bad("GGUF" + bytes.substr(4)), doctest::Contains("does not start with"), FormatError);
  CHECK_THROWS_WITH_AS(load_bad(bytes.substr(0, bytes.size() - 100)), doctest::Contains("truncated"), FormatError);
  CHECK_THROWS_WITH_AS(load_bad(bytes + "x"), doctest::Contains("the header's sizes need"), FormatError);
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x10;
  CHECK_THROWS_WITH_AS(load_bad(flipped), doctest::Contains("checksum mismatch"), FormatError);
  std::string huge = bytes;  // chunks = 2^32 - 1: sizes that would wrap 64 bits are caught
  huge[16] = huge[17] = huge[18] = huge[19] = char(0xff);
  CHECK_THROWS_WITH_AS(load_bad(huge), doctest::Contains("the header's sizes need"), FormatError);
  std::string zero_k = bytes;
  zero_k[20] = zero_k[21] = zero_k[22] = zero_k[23] = 0;
  CHECK_THROWS_WITH_AS(load_bad(zero_k), doctest::Contains("top_k 0"), FormatError);
  // A model of another vocabulary (the tiny Qwen2: 864 tokens).
  const Model other = load(ppl_fixture_dir("qwen2") + "/model.gguf");
  CHECK_THROWS_WITH_AS(kl_divergence(other, load_kld_base(good)),
                       doctest::Contains("vocabulary of 256 tokens, the model has 864"), FormatError);
}

}  // namespace
}  // namespace kiln::test::ppl_test
