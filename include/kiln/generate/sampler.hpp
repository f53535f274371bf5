// kiln/generate/sampler.hpp - choosing the next token from logits.
//
// The chain (llama.cpp's default order and semantics):
//   0. with a Constraint (generate/constraint.hpp): only the tokens it allows take part in what follows;
//   1. penalties over the last repeat_last_n tokens of the sequence, once per distinct token t seen
//      c_t times: logit /= repeat_penalty if positive else *= repeat_penalty; then
//      logit -= c_t * frequency_penalty + presence_penalty.
//   2. temperature <= 0: greedy, the largest logit (the lowest id among equals). Otherwise:
//   3. top_k (k > 0): keep the k largest logits;
//   4. top_p (< 1): softmax, keep the smallest prefix (by probability, descending) whose sum reaches p;
//   5. min_p (> 0): keep the tokens with p >= min_p * p_max (logit >= max + log(min_p));
//   6. divide the logits by the temperature, softmax, and draw with a uniform number from a
//      std::mt19937_64 seeded with `seed` (the standard fixes its output: same seed, same tokens).
// Each filter keeps at least one token. The Sampler owns scratch sized to the vocabulary at
// construction (a SamplerScratch, which several sequences sampled on one thread may share instead), so
// sample() never allocates.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/generate/constraint.hpp"

namespace kiln {

struct SamplerOptions {
  float temperature = 0.8f;  ///< <= 0: greedy
  int top_k = 40;            ///< <= 0: off
  float top_p = 0.95f;       ///< >= 1: off
  float min_p = 0.05f;       ///< <= 0: off
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;  ///< tokens of history the penalties see; -1: all of it, 0: none
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  uint64_t seed = 0;
};

/// One candidate token: id, logit and (after softmax) probability.
struct TokenProb {
  int32_t id;
  float logit;
  float p;
};

/// The steps of the chain on a candidate list, usable on their own. Each returns how many candidates
/// it keeps (a prefix of c).
namespace sampling {

inline bool by_logit_desc(const TokenProb& a, const TokenProb& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

/// Sorts by logit, descending (ties: lower id first).
inline void sort_desc(std::span<TokenProb> c) { std::sort(c.begin(), c.end(), by_logit_desc); }

/// Keeps the k largest, sorted descending. k <= 0 or >= size: all of them, sorted.
inline std::size_t top_k(std::span<TokenProb> c, int k) {
  if (k <= 0 || std::size_t(k) >= c.size()) {
    sort_desc(c);
    return c.size();
  }
  std::partial_sort(c.begin(), c.begin() + k, c.end(), by_logit_desc);
  return std::size_t(k);
}

/// p = softmax(logit) over c (max subtracted first).
inline void softmax(std::span<TokenProb> c) {
  if (c.empty()) return;
  float m = -std::numeric_limits<float>::infinity();
  for (const auto& t : c) m = std::max(m, t.logit);
  double sum = 0;
  for (auto& t : c) sum += (t.p = std::exp(t.logit - m));
  for (auto& t : c) t.p = float(t.p / sum);
}

/// c sorted descending with p set: the smallest prefix whose probabilities sum to >= p (>= min_keep).
inline std::size_t top_p(std::span<const TokenProb> c, float p, std::size_t min_keep = 1) {
  if (p >= 1.0f) return c.size();
  double cum = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    cum += c[i].p;
    if (cum >= p && i + 1 >= min_keep) return i + 1;
  }
  return c.size();
}

/// c sorted descending: the prefix with logit >= max + log(min_p), i.e. p >= min_p * p_max (>= min_keep).
inline std::size_t min_p(std::span<const TokenProb> c, float min_p, std::size_t min_keep = 1) {
  if (min_p <= 0.0f || c.empty()) return c.size();
  const float thresh = c[0].logit + std::log(min_p);
  std::size_t n = 1;
  while (n < c.size() && c[n].logit >= thresh) ++n;
  return std::min(c.size(), std::max(n, min_keep));
}

/// Applies the repetition / frequency / presence penalties of the tokens `last` to logits.
/// counts: vocab zeros of scratch, left zero on return.
inline void penalties(std::span<float> logits, std::span<const int32_t> last, float repeat, float frequency,
                      float presence, std::span<int32_t> counts) {
  if (last.empty() || (repeat == 1.0f && frequency == 0.0f && presence == 0.0f)) return;
  for (int32_t t : last)
    if (t >= 0 && std::size_t(t) < logits.size()) ++counts[std::size_t(t)];
  for (int32_t t : last) {
    if (t < 0 || std::size_t(t) >= logits.size() || counts[std::size_t(t)] == 0) continue;
    float& l = logits[std::size_t(t)];
    l = l <= 0 ? l * repeat : l / repeat;
    l -= float(counts[std::size_t(t)]) * frequency + presence;
    counts[std::size_t(t)] = 0;
  }
}

/// Index of the largest value (the first among equals).
inline int32_t argmax(std::span<const float> v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

}  // namespace sampling

/// Throws kiln::Error naming the option when `opt` is not a valid sampler configuration (what Sampler's
/// constructor checks), without allocating anything.
inline void check_sampler_options(const SamplerOptions& opt) {
  if (!(opt.top_p > 0.0f) || std::isnan(opt.min_p) || std::isnan(opt.temperature) || !(opt.repeat_penalty > 0.0f))
    fail("kiln::Sampler: top_p ", opt.top_p, " must be > 0, repeat_penalty ", opt.repeat_penalty,
         " > 0, and temperature ", opt.temperature, " and min_p ", opt.min_p, " numbers");
}

/// The working memory of the sampling chain, and the chain itself for any options and random generator. A
/// Sampler owns one; sequences sampled one after another on one thread (a server's slots) can share one,
/// each keeping only its options and generator. The memory is taken when first needed and kept (sample()
/// allocates only then): greedy or top-k sampling without penalties needs none that grows with the vocabulary
/// (k candidates); the penalties take a copy of the logits and a count per token, top_k <= 0 and constraints
/// a candidate per token, a constraint's mask a token id per allowed token (max_bytes() in all).
class SamplerScratch {
 public:
  explicit SamplerScratch(std::size_t vocab) : vocab_(vocab) {
    if (vocab == 0) fail("kiln::Sampler: empty vocabulary");
  }
  std::size_t vocab() const { return vocab_; }
  /// The most memory a scratch for `vocab` tokens takes (penalties, every token's candidate, a constraint's
  /// mask), in bytes.
  static constexpr std::size_t max_bytes(std::size_t vocab) {
    return vocab * (sizeof(float) + 2 * sizeof(int32_t) + sizeof(TokenProb));
  }
  /// The memory taken so far, in bytes.
  std::size_t bytes() const {
    return logits_.capacity() * sizeof(float) + counts_.capacity() * sizeof(int32_t) +
           cand_.capacity() * sizeof(TokenProb) + allowed_.capacity() * sizeof(int32_t);
  }

  /// The next token given the last token's logits and the sequence so far (for the penalties), with `opt`
  /// (checked: check_sampler_options) and `rng` (advanced when it draws).
  /// With a constraint: only the tokens it allows (the mask goes before the chain's filters); the constraint
  /// is not advanced (Constraint::accept the token chosen).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history, const SamplerOptions& opt,
                 std::mt19937_64& rng, Constraint* constraint = nullptr) {
    if (logits.size() != vocab_) fail("kiln::Sampler::sample: ", logits.size(), " logits for a vocabulary of ", vocab_);
    std::size_t last_n = opt.repeat_last_n < 0 ? history.size() : std::size_t(opt.repeat_last_n);
    last_n = std::min(last_n, history.size());
    std::span<const float> l = logits;
    if (last_n > 0 && (opt.repeat_penalty != 1.0f || opt.frequency_penalty != 0.0f || opt.presence_penalty != 0.0f)) {
      if (counts_.empty()) counts_.assign(vocab_, 0);
      logits_.assign(logits.begin(), logits.end());
      sampling::penalties(logits_, history.subspan(history.size() - last_n), opt.repeat_penalty, opt.frequency_penalty,
                          opt.presence_penalty, counts_);
      l = logits_;
    }
    if (constraint) return sample_constrained(l, opt, rng, *constraint);
    if (opt.temperature <= 0.0f) return sampling::argmax(l);
    return draw(top_k(l, opt.top_k), opt, rng);
  }

 private:
  // cand_ holding at least n candidates.
  std::span<TokenProb> candidates(std::size_t n) {
    if (cand_.size() < n) cand_.resize(n);
    return std::span<TokenProb>(cand_).first(n);
  }

  // The k most likely tokens of l (every token for k <= 0 or >= vocab), sorted as sampling::top_k sorts:
  // k < vocab selects them through a heap of k candidates (what std::partial_sort does on the whole
  // vocabulary) without a candidate per token.
  std::span<TokenProb> top_k(std::span<const float> l, int k) {
    if (k <= 0 || std::size_t(k) >= l.size()) {
      std::span<TokenProb> c = candidates(l.size());
      for (std::size_t i = 0; i < l.size(); ++i) c[i] = {int32_t(i), l[i], 0.0f};
      sampling::sort_desc(c);
      return c;
    }
    std::span<TokenProb> c = candidates(std::size_t(k));
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = {int32_t(i), l[i], 0.0f};
    std::make_heap(c.begin(), c.end(), sampling::by_logit_desc);  // the least likely of them on top
    for (std::size_t i = c.size(); i < l.size(); ++i) {
      const TokenProb t{int32_t(i), l[i], 0.0f};
      if (!sampling::by_logit_desc(t, c.front())) continue;
      std::pop_heap(c.begin(), c.end(), sampling::by_logit_desc);
      c.back() = t;
      std::push_heap(c.begin(), c.end(), sampling::by_logit_desc);
    }
    std::sort_heap(c.begin(), c.end(), sampling::by_logit_desc);
    return c;
  }

  // The chain after top-k: top-p, min-p, temperature, the draw.
  static int32_t draw(std::span<TokenProb> c, const SamplerOptions& opt, std::mt19937_64& rng) {
    if (opt.top_p < 1.0f) {
      sampling::softmax(c);
      c = c.first(sampling::top_p(c, opt.top_p));
    }
    c = c.first(sampling::min_p(c, opt.min_p));
    for (auto& t : c) t.logit /= opt.temperature;
    sampling::softmax(c);
    const double u = double(rng() >> 11) * 0x1.0p-53;  // uniform in [0, 1)
    double cum = 0;
    for (const auto& t : c) {
      cum += t.p;
      if (u < cum) return t.id;
    }
    return c.back().id;  // rounding left the sum just under u
  }

  // The chain on the tokens the constraint allows (penalties applied already). Checked one token at a time
  // first: greedy takes the most likely token if allowed, top-k the first k allowed among the 4k (at least
  // 64) most likely, which is what the chain gives on the masked logits; otherwise (or without top-k: top-p
  // and min-p need every allowed token) the constraint's whole mask.
  int32_t sample_constrained(std::span<const float> l, const SamplerOptions& opt, std::mt19937_64& rng,
                             Constraint& con) {
    if (con.vocab() != vocab_)
      fail("kiln::Sampler::sample: a constraint over ", con.vocab(), " tokens for a vocabulary of ", vocab_);
    const bool greedy = opt.temperature <= 0.0f;
    if (greedy) {
      const int32_t best = sampling::argmax(l);
      if (con.allows(best)) return best;
    }
    std::size_t n = 0;
    std::span<TokenProb> c;
    if (!greedy && opt.top_k > 0) {
      const std::size_t want = std::size_t(opt.top_k);
      const std::size_t look = std::min(l.size(), std::max<std::size_t>(64, 4 * want));
      c = top_k(l, int(look));
      for (std::size_t i = 0; i < look && n < want; ++i)
        if (con.allows(c[i].id)) c[n++] = c[i];
      if (n < want && look < l.size()) n = 0;  // too few among the most likely: the whole mask
    }
    if (n > 0) {
      c = c.first(n);
    } else {
      con.mask(allowed_);
      if (allowed_.empty())
        fail(
            "kiln::Sampler::sample: the constraint allows no token of this vocabulary (the grammar needs bytes no "
            "token spells)");
      c = candidates(allowed_.size());
      for (std::size_t i = 0; i < allowed_.size(); ++i) c[i] = {allowed_[i], l[std::size_t(allowed_[i])], 0.0f};
      c = c.first(sampling::top_k(c, greedy ? 1 : opt.top_k));
    }
    if (greedy) return c[0].id;
    return draw(c, opt, rng);
  }

  std::size_t vocab_;
  std::vector<float> logits_;     // the logits with the penalties applied (allocated on first use)
  std::vector<int32_t> counts_;   // the penalties' counts: zeros between calls (allocated on first use)
  std::vector<TokenProb> cand_;   // candidates: k, or every token (grown on first use)
  std::vector<int32_t> allowed_;  // a constraint's mask (allocated on first use)
};

class Sampler {
 public:
  Sampler(std::size_t vocab, const SamplerOptions& opt = {}) : opt_(opt), scratch_(vocab), rng_(opt.seed) {
    check_sampler_options(opt);
  }

  const SamplerOptions& options() const { return opt_; }
  void reseed(uint64_t seed) { rng_.seed(seed); }

  /// The next token given the last token's logits and the sequence so far (for the penalties).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history, Constraint* constraint = nullptr) {
    return scratch_.sample(logits, history, opt_, rng_, constraint);
  }

 private:
  SamplerOptions opt_;
  SamplerScratch scratch_;
  std::mt19937_64 rng_;
};

}  // namespace kiln
