// generate/sampler.hpp: each filter keeps the right set on hand-made distributions; penalties; seeds.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "kiln/generate/sampler.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

/// Candidates with the given probabilities (logits = log p), in a scrambled order.
std::vector<TokenProb> cands(const std::vector<float>& probs) {
  std::vector<TokenProb> c;
  for (std::size_t i = 0; i < probs.size(); ++i) c.push_back({int32_t(i), std::log(probs[i]), 0.0f});
  std::reverse(c.begin(), c.end());
  return c;
}
std::set<int32_t> ids(std::span<const TokenProb> c) {
  std::set<int32_t> s;
  for (const auto& t : c) s.insert(t.id);
  return s;
}

TEST_CASE("sampler: top_k keeps the k largest, sorted") {
  auto c = cands({0.1f, 0.4f, 0.05f, 0.3f, 0.15f});
  const auto n = sampling::top_k(c, 3);
  CHECK(n == 3);
  CHECK(c[0].id == 1);
  CHECK(c[1].id == 3);
  CHECK(c[2].id == 4);
  auto all = cands({0.1f, 0.4f, 0.05f});
  CHECK(sampling::top_k(all, 0) == 3);  // off
  CHECK(all[0].id == 1);
  CHECK(all[2].id == 2);
}

TEST_CASE("sampler: top_p keeps the smallest prefix reaching p") {
  // sorted probabilities 0.5, 0.25, 0.125, 0.125; thresholds kept away from the partial sums
  auto c = cands({0.125f, 0.5f, 0.125f, 0.25f});
  sampling::top_k(c, 0);
  sampling::softmax(c);
  CHECK(c[0].p == doctest::Approx(0.5));
  CHECK(sampling::top_p(c, 0.45f) == 1);  // 0.5 reaches 0.45
  CHECK(sampling::top_p(c, 0.6f) == 2);   // needs 0.5 + 0.25
  CHECK(sampling::top_p(c, 0.8f) == 3);
  CHECK(sampling::top_p(c, 0.95f) == 4);
  CHECK(sampling::top_p(c, 1.0f) == 4);     // off
  CHECK(sampling::top_p(c, 0.1f, 2) == 2);  // min_keep
  CHECK(ids(std::span(c).first(2)) == std::set<int32_t>{1, 3});
}

TEST_CASE("sampler: min_p keeps p >= min_p * p_max") {
  auto c = cands({0.4f, 0.22f, 0.1f, 0.19f, 0.09f});  // no value near a threshold below
  sampling::top_k(c, 0);
  CHECK(sampling::min_p(c, 0.5f) == 2);   // p >= 0.2: {0.4, 0.22}
  CHECK(sampling::min_p(c, 0.45f) == 3);  // p >= 0.18: {0.4, 0.2, 0.19}
  CHECK(ids(std::span(c).first(3)) == std::set<int32_t>{0, 1, 3});
  CHECK(sampling::min_p(c, 0.2f) == 5);   // p >= 0.08: all
  CHECK(sampling::min_p(c, 0.0f) == 5);   // off
  CHECK(sampling::min_p(c, 0.99f) == 1);  // always keeps the best
}

TEST_CASE("sampler: repetition, frequency and presence penalties") {
  std::vector<float> logits{2.0f, -1.0f, 0.5f, 3.0f};
  std::vector<int32_t> counts(4, 0);
  const std::vector<int32_t> last{0, 1, 0, 0};  // token 0 three times, token 1 once
  sampling::penalties(logits, last, 2.0f, 0.25f, 0.5f, counts);
  CHECK(logits[0] == doctest::Approx(2.0 / 2 - 3 * 0.25 - 0.5));   // positive: divided
  CHECK(logits[1] == doctest::Approx(-1.0 * 2 - 1 * 0.25 - 0.5));  // negative: multiplied
  CHECK(logits[2] == 0.5f);
  CHECK(logits[3] == 3.0f);
  CHECK(std::count(counts.begin(), counts.end(), 0) == 4);  // scratch left clean
}

TEST_CASE("sampler: greedy picks the largest logit after penalties") {
  std::vector<float> logits{1.0f, 3.0f, 2.9f, 3.0f};
  Sampler g(4, {.temperature = 0.0f});
  CHECK(g.sample(logits, {}) == 1);  // ties: the lowest id
  Sampler p(4, {.temperature = 0.0f, .repeat_penalty = 2.0f});
  const std::vector<int32_t> hist{1, 3};
  CHECK(p.sample(logits, hist) == 2);  // 3.0 / 2 < 2.9
}

TEST_CASE("sampler: the same seed gives the same tokens, different seeds differ") {
  std::vector<float> logits(50);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(float(i)) * 0.5f;  // a fairly flat distribution
  auto run = [&](uint64_t seed) {
    Sampler s(logits.size(), {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits, {}));
    return out;
  };
  CHECK(run(7) == run(7));
  CHECK(run(7) != run(8));
}

TEST_CASE("sampler: draws follow softmax(logits / T) among the kept tokens") {
  const std::vector<float> logits{std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  const int n = 40000;
  auto freq = [&](const SamplerOptions& o) {
    Sampler s(4, o);
    std::vector<double> f(4, 0);
    for (int i = 0; i < n; ++i) f[std::size_t(s.sample(logits, {}))] += 1.0 / n;
    return f;
  };
  // Tolerance: 5 standard deviations of a frequency, sqrt(p (1 - p) / n) <= 0.0025.
  const double tol = 5 * 0.0025;
  auto f1 = freq({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 1});
  CHECK(std::fabs(f1[0] - 0.5) < tol);
  CHECK(std::fabs(f1[1] - 0.3) < tol);
  CHECK(std::fabs(f1[2] - 0.15) < tol);
  CHECK(std::fabs(f1[3] - 0.05) < tol);
  // top_k 2 renormalises over {0.5, 0.3}: 0.625 / 0.375.
  auto f2 = freq({.temperature = 1.0f, .top_k = 2, .top_p = 1.0f, .min_p = 0.0f, .seed = 2});
  CHECK(std::fabs(f2[0] - 0.625) < tol);
  CHECK(f2[2] == 0.0);
  CHECK(f2[3] == 0.0);
  // Temperature 0.5 squares the probabilities: 0.25, 0.09, 0.0225, 0.0025 over their sum 0.365.
  auto f3 = freq({.temperature = 0.5f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 3});
  CHECK(std::fabs(f3[0] - 0.25 / 0.365) < tol);
  CHECK(std::fabs(f3[1] - 0.09 / 0.365) < tol);
  // min_p 0.2 drops 0.05 (< 0.1) only.
  auto f4 = freq({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.2f, .seed = 4});
  CHECK(f4[3] == 0.0);
  CHECK(std::fabs(f4[2] - 0.15 / 0.95) < tol);
}

// The chain as it was on a candidate per token (every token's candidate, sampling::top_k, then top-p, min-p,
// temperature and the draw): the reference for SamplerScratch's heap of k candidates.
int32_t reference_draw(std::vector<float> logits, std::span<const int32_t> history, const SamplerOptions& o,
                       std::mt19937_64& rng) {
  std::vector<int32_t> counts(logits.size(), 0);
  const std::size_t last_n = std::min(std::size_t(o.repeat_last_n), history.size());
  sampling::penalties(logits, history.subspan(history.size() - last_n), o.repeat_penalty, o.frequency_penalty,
                      o.presence_penalty, counts);
  std::vector<TokenProb> all;
  for (std::size_t i = 0; i < logits.size(); ++i) all.push_back({int32_t(i), logits[i], 0.0f});
  std::span<TokenProb> c(all);
  c = c.first(sampling::top_k(c, o.top_k));
  if (o.top_p < 1.0f) {
    sampling::softmax(c);
    c = c.first(sampling::top_p(c, o.top_p));
  }
  c = c.first(sampling::min_p(c, o.min_p));
  for (auto& t : c) t.logit /= o.temperature;
  sampling::softmax(c);
  const double u = double(rng() >> 11) * 0x1.0p-53;
  double cum = 0;
  for (const auto& t : c)
    if (u < (cum += t.p)) return t.id;
  return c.back().id;
}

TEST_CASE("sampler: top-k through k candidates draws what every token's candidate does, in k candidates' memory") {
  // A 5,000-token vocabulary of logits on a grid of 1/8 (many ties: the lower id first must hold), flat
  // enough that k, top-p and min-p all cut; 300 draws per option set, the history growing with them.
  const std::size_t vocab = 5000;
  std::vector<float> logits(vocab);
  for (std::size_t i = 0; i < vocab; ++i) logits[i] = std::round(std::sin(float(i) * 0.37f) * 24.0f) / 8.0f;
  for (const SamplerOptions& o :
       {SamplerOptions{.temperature = 0.8f, .seed = 1},  // the defaults: k 40
        SamplerOptions{.temperature = 1.5f, .top_k = 7, .top_p = 1.0f, .min_p = 0.0f, .seed = 2},
        SamplerOptions{.temperature = 1.0f,
        .top_k = 300,
        .top_p = 0.9f,
        .repeat_penalty = 1.3f,
        .frequency_penalty = 0.2f,
        .seed = 3},
        SamplerOptions{.temperature = 1.0f, .top_k = 0, .top_p = 0.5f, .seed = 4}}) {
    CAPTURE(o.top_k);
    Sampler s(vocab, o);
    std::mt19937_64 rng(o.seed);
    std::vector<int32_t> history;
    std::size_t differ = 0, distinct = 0;
    std::set<int32_t> seen;
    for (int i = 0; i < 300; ++i) {
      const int32_t want = reference_draw(logits, history, o, rng);
      const int32_t got = s.sample(logits, history);
      differ += got != want;
      if (seen.insert(got).second) ++distinct;
      history.push_back(got);
    }
    CHECK(differ == 0);
    CHECK(distinct > 3);  // the draws vary: the comparison can fail
  }
  // Memory: k candidates for top-k without penalties (the logits used in place), a vocabulary's worth with them.
  SamplerScratch scratch(vocab);
  CHECK(scratch.bytes() == 0);
  std::mt19937_64 rng(5);
  scratch.sample(logits, {}, {.temperature = 1.0f, .top_k = 40}, rng);
  CHECK(scratch.bytes() <= 40 * sizeof(TokenProb));
  scratch.sample(logits, {}, {.temperature = 0.0f}, rng);
  CHECK(scratch.bytes() <= 40 * sizeof(TokenProb));
  const std::vector<int32_t> hist{3, 4};
  scratch.sample(logits, hist, {.temperature = 1.0f, .top_k = 40, .repeat_penalty = 1.1f}, rng);
  CHECK(scratch.bytes() >= vocab * (sizeof(float) + sizeof(int32_t)));
}

TEST_CASE("sampler: bad options are errors") {
  CHECK_THROWS_AS(Sampler(0), Error);
  CHECK_THROWS_AS(Sampler(4, {.top_p = 0.0f}), Error);
  Sampler s(4);
  const std::vector<float> three(3, 0.0f);
  CHECK_THROWS_AS(s.sample(three, {}), Error);
}

}  // namespace
}  // namespace kiln::test
