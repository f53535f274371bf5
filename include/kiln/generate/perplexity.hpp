// kiln/generate/perplexity.hpp - what a quantization or a precision costs: perplexity over a token sequence,
// and the KL divergence of a model's next-token distributions from a base model's.
//
//   auto model = kiln::load("model.Q4_0.gguf");
//   auto ids = model.tokenizer().encode(text);                      // BOS first when the vocabulary adds one
//   auto r = kiln::perplexity(model, ids, {.ctx = 512, .threads = 2});
//   r.ppl.value, r.ppl.uncertainty;                                 // "PPL = 12.34 +/- 0.56"
//
//   auto base = kiln::make_kld_base(kiln::load("model.F16.gguf"), ids, {.ctx = 512});
//   kiln::save_kld_base(base, "base.kld");                          // compare later, or on another machine
//   auto k = kiln::kl_divergence(model, kiln::load_kld_base("base.kld"), {.threads = 2});
//   k.kld.value, k.same_top.value, k.ppl_ratio.value;
//
// llama.cpp's method (llama-perplexity): the tokens are split into chunks of ctx tokens (the rest dropped);
// each chunk runs from an empty KV cache with its first token replaced by BOS when the vocabulary adds one;
// only the second half of each chunk is scored: the logits at positions j = ctx/2 .. ctx-2 against the
// token at j + 1 (ctx - 1 - ctx/2 tokens per chunk), so every scored token has at least ctx/2 tokens of
// context. Negative log-likelihoods come from a log-softmax in double (max subtracted, exp summed in
// double). PPL = exp(mean NLL); its uncertainty is llama.cpp's: the standard error of the mean NLL
// (sqrt(var / (count - 1))) times PPL. Chunks run one after another, each in passes of up to `batch`
// tokens; passes that contain scored positions compute the logits of those rows only.
//
// KL divergence. A base (make_kld_base) records, for every scored position, the base model's NLL of the
// actual next token and its top_k most likely tokens with their log-probabilities (in double), plus the
// log of the probability mass left outside them. kl_divergence() runs another model (or precision) over
// the same tokens and computes, per position, KL(base || model) over those top_k tokens and one bucket for
// all the others: sum_i p_i (log p_i - log q_i) + R_p (log R_p - log R_q). That is the KL divergence of the
// two distributions coarse-grained to top_k + 1 outcomes: never more than the full one, equal when the
// rest bucket is empty, exactly 0 for identical logits; KldResult::rest_mass says how much the bucket held.
// llama.cpp instead stores every log-probability as 16 bits over [max - 16, max]: ~2e-4 nats of
// resolution, coarser than the KL divergence between kiln's precisions, at 2 bytes x vocab per position;
// a top_k of 256 takes 12 x 256 bytes per position (the format: kl_divergence.hpp).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/model/model.hpp"

namespace kiln {

/// A value with its uncertainty (one standard error), as llama-perplexity prints them: "value +/- uncertainty".
struct Estimate {
  double value = 0;
  double uncertainty = 0;
};

/// After each chunk: the running estimates over the chunks so far.
struct PerplexityProgress {
  std::size_t chunk = 0;   ///< chunks done (1-based count)
  std::size_t chunks = 0;  ///< chunks in all
  Estimate ppl;            ///< perplexity of the model being run so far
  double kld = 0;          ///< kl_divergence(): mean KL divergence so far (0 for perplexity())
  double same_top = 0;     ///< kl_divergence(): share of positions whose most likely token is the base's
};

struct PerplexityOptions {
  std::size_t ctx = 512;       ///< tokens per chunk (llama.cpp's -c); kl_divergence() takes the base's
  std::size_t max_chunks = 0;  ///< at most this many chunks (llama.cpp's --chunks); 0: all that fit
  std::size_t threads = 1;     ///< threads, the caller included; 0: all cores
  std::size_t batch = 512;     ///< tokens per forward pass (at most ctx)
  Precision precision = Precision::fast;
  KVType kv_type = KVType::automatic;  ///< as SessionOptions::kv_type
  std::size_t kld_top_k = 256;         ///< make_kld_base(): tokens recorded per position (at most the vocabulary)
  std::function<void(const PerplexityProgress&)> on_chunk = {};  ///< called after each chunk
};

struct PerplexityResult {
  std::size_t ctx = 0, chunks = 0;
  std::size_t count = 0;            ///< tokens scored: chunks * (ctx - 1 - ctx / 2)
  int32_t bos = -1;                 ///< the token each chunk started with, or -1 (chunks kept their first token)
  Estimate nll;                     ///< mean negative log-likelihood (nats) and its standard error
  Estimate ppl;                     ///< exp(mean NLL), uncertainty = standard error of the mean NLL x PPL
  std::vector<double> running_ppl;  ///< the estimate after each chunk (llama.cpp's "[1]12.3,[2]11.8,...")
  /// Mean over the scored positions of max - min of the logits: logits that differ from another engine's
  /// by at most e x range move each NLL by at most 2e x range, and the mean NLL by 2e x this (a tolerance).
  double logit_range = 0;
};

/// What make_kld_base records and save_kld_base writes: the tokens, and per scored position (chunk-major,
/// ctx - 1 - ctx/2 of them per chunk) the base model's NLL of the next token, log of the mass outside its
/// top_k tokens, and those tokens (most likely first; equal logits: lower id first) with log-probabilities.
struct KldBase {
  std::size_t vocab = 0, ctx = 0, chunks = 0, top_k = 0;
  int32_t bos = -1;               ///< as PerplexityResult::bos
  std::vector<int32_t> tokens;    ///< chunks * ctx, as given (before the BOS replacement)
  std::vector<double> nll;        ///< (positions)
  std::vector<double> rest_logp;  ///< (positions): log of the probability outside the top_k (-inf: none)
  std::vector<uint32_t> top_ids;  ///< (positions, top_k)
  std::vector<double> top_logp;   ///< (positions, top_k)
  PerplexityResult perplexity;    ///< the base's own perplexity (not saved: recomputed from nll on load)
  std::size_t scored_per_chunk() const { return ctx - 1 - ctx / 2; }
  std::size_t positions() const { return chunks * scored_per_chunk(); }
};

struct KldResult {
  std::size_t ctx = 0, chunks = 0, count = 0, top_k = 0;
  Estimate ppl;                ///< the model's perplexity over the base's tokens
  Estimate ppl_base;           ///< the base's
  double ppl_correlation = 0;  ///< correlation of the two models' NLLs (llama.cpp's Cor(ln PPL(Q), ln PPL(base)))
  Estimate log_ppl_ratio;      ///< mean ln(PPL / PPL(base)), its uncertainty with the covariance of the two
  Estimate ppl_ratio;          ///< PPL / PPL(base)
  Estimate ppl_diff;           ///< PPL - PPL(base)
  Estimate kld;                ///< mean KL(base || model) per token (nats)
  double kld_max = 0, kld_p999 = 0, kld_p99 = 0, kld_p95 = 0, kld_p90 = 0, kld_median = 0, kld_min = 0;
  Estimate p_diff;                ///< mean of p - p_base of the actual next token
  Estimate p_diff_rms;            ///< root mean square of p - p_base
  double p_diff_max = 0;          ///< largest |p - p_base|
  Estimate same_top;              ///< share of positions whose most likely token is the base's, its standard error
  double rest_mass = 0;           ///< mean probability (base) outside the recorded top_k tokens
  std::vector<float> kld_values;  ///< each position's KL divergence, sorted ascending
};

inline PerplexityResult perplexity(const Model& model, std::span<const int32_t> tokens,
                                   const PerplexityOptions& opt = {});
inline KldBase make_kld_base(const Model& model, std::span<const int32_t> tokens, const PerplexityOptions& opt = {});
inline KldResult kl_divergence(const Model& model, const KldBase& base, const PerplexityOptions& opt = {});
inline void save_kld_base(const KldBase& base, const std::filesystem::path& path);
inline KldBase load_kld_base(const std::filesystem::path& path);

namespace detail {

/// log(sum_i exp(x_i)) of a logit row: the maximum subtracted, exp summed in double.
inline double log_sum_exp(const float* x, std::size_t n) {
  float m = x[0];
  for (std::size_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  if (std::isinf(m) || std::isnan(m)) fail("kiln::perplexity: a logit is ", m, " (the model's output is not finite)");
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - double(m));
  return double(m) + std::log(s);
}

/// log of the probability outside `ids` (each marked in `mask`, a vocab-sized scratch row of zeros): summed in
/// token order, so the same logits always give the same bits.
inline double rest_log_prob(const float* x, std::size_t n, double lse, std::span<const uint32_t> ids,
                            std::vector<uint8_t>& mask) {
  for (uint32_t id : ids) mask[id] = 1;
  double s = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (!mask[i]) s += std::exp(double(x[i]) - lse);
  for (uint32_t id : ids) mask[id] = 0;
  return s > 0 ? std::log(s) : -std::numeric_limits<double>::infinity();
}

/// How tokens split into chunks (and the checks shared by perplexity() and make_kld_base()).
struct ChunkPlan {
  std::size_t ctx = 0, chunks = 0, first = 0, scored = 0;
  int32_t bos = -1;
};

inline ChunkPlan plan_chunks(const Model& model, std::size_t n_tokens, const PerplexityOptions& opt) {
  const HParams& hp = model.hparams();
  ChunkPlan p;
  p.ctx = opt.ctx;
  if (p.ctx < 4) fail("kiln::perplexity: ctx ", p.ctx, " is too small: a chunk needs at least 4 tokens");
  if (hp.ctx_train > 0 && p.ctx > hp.ctx_train)
    fail("kiln::perplexity: ctx ", p.ctx, " exceeds the ", hp.ctx_train, " positions the model was trained with");
  if (n_tokens < 2 * p.ctx)
    fail("kiln::perplexity: ", n_tokens, " tokens; a context of ", p.ctx, " needs at least ", 2 * p.ctx,
         " (two chunks): give a longer text or a smaller ctx");
  p.chunks = n_tokens / p.ctx;
  if (opt.max_chunks > 0) p.chunks = std::min(p.chunks, opt.max_chunks);
  p.first = p.ctx / 2;
  p.scored = p.ctx - 1 - p.first;
  const Tokenizer& tok = model.tokenizer();
  p.bos = tok.add_bos() ? tok.bos() : -1;
  return p;
}

/// Mean of count values from their sum and sum of squares, and its standard error (llama.cpp's
/// mean_and_uncertainty: 0 for 10 values or fewer).
inline Estimate mean_and_uncertainty(double sum, double sum2, std::size_t count) {
  if (count < 1) return {};
  const double f = sum / double(count);
  const double var = sum2 / double(count) - f * f;
  return {f, var > 0 && count > 10 ? std::sqrt(var / double(count - 1)) : 0.0};
}

/// Runs the chunks of `tokens` (plan p) through the model and hands each pass's scored rows to
/// on_rows(chunk, j0, logits, rows, pool): the logits (rows, vocab) of scored positions j0 .. j0 + rows - 1
/// of that chunk (position first + j predicts token first + j + 1). on_chunk(chunk) after each chunk.
template <class OnRows, class OnChunk>
void run_chunks(const Model& model, std::span<const int32_t> tokens, const ChunkPlan& p, const PerplexityOptions& opt,
                OnRows&& on_rows, OnChunk&& on_chunk) {
  const HParams& hp = model.hparams();
  const std::size_t vocab = hp.vocab;
  for (std::size_t i = 0; i < p.chunks * p.ctx; ++i)
    if (tokens[i] < 0 || std::size_t(tokens[i]) >= vocab)
      fail("kiln::perplexity: token ", i, " (id ", tokens[i], ") is outside the vocabulary of ", vocab);
  const KVType kv_type = resolve_kv_type({.ctx = p.ctx, .precision = opt.precision, .kv_type = opt.kv_type});
  const double kv_need = kv_cache_bytes(hp.n_layers, hp.n_kv_heads, hp.head_dim, p.ctx, kv_type);
  if (const auto avail = available_memory_bytes(); avail && kv_need > *avail)
    fail("kiln::perplexity: the KV cache for a context of ", p.ctx, " needs ", gib(kv_need), " GiB, ", gib(*avail),
         " GiB available");
  const std::size_t batch = std::clamp<std::size_t>(opt.batch, 1, p.ctx);
  auto st = model.impl().make_state(p.ctx, batch, opt.threads, kv_type);
  st->precision = opt.precision;
  std::vector<float> logits(std::min(batch, p.scored) * vocab);
  std::vector<int32_t> chunk(p.ctx);
  std::vector<KVCache*> kv(batch, &st->kv);
  std::vector<std::size_t> pos(batch), rows;
  rows.reserve(batch);
  const ModelImpl& impl = model.impl();
  for (std::size_t c = 0; c < p.chunks; ++c) {
    std::copy_n(tokens.begin() + std::ptrdiff_t(c * p.ctx), p.ctx, chunk.begin());
    if (p.bos >= 0) chunk[0] = p.bos;
    for (std::size_t b0 = 0; b0 < p.ctx; b0 += batch) {
      const std::size_t n = std::min(batch, p.ctx - b0);
      const auto ids = std::span<const int32_t>(chunk).subspan(b0, n);
      // Scored rows of this pass: positions [first, ctx - 1) (the last position predicts nothing here).
      const std::size_t r0 = std::max(b0, p.first), r1 = std::min(b0 + n, p.ctx - 1);
      if (r0 >= r1) {
        impl.forward(*st, ids, b0, nullptr);  // the prompt path, no classifier
        continue;
      }
      // One sequence's consecutive rows through forward_multi: the same causal attention as forward(), with
      // the logits of the listed rows.
      rows.clear();
      for (std::size_t i = 0; i < n; ++i) pos[i] = b0 + i;
      for (std::size_t r = r0; r < r1; ++r) rows.push_back(r - b0);
      impl.forward_multi(*st, std::span<KVCache* const>(kv.data(), n), ids, std::span<const std::size_t>(pos.data(), n),
                         logits.data(), rows);
      on_rows(c, r0 - p.first, static_cast<const float*>(logits.data()), r1 - r0, *st->pool);
    }
    on_chunk(c);
  }
}

/// The top_k (most likely first; equal logits: lower id first) of a logit row.
inline void top_tokens(const float* x, std::size_t n, std::span<uint32_t> out, std::vector<uint32_t>& idx) {
  idx.resize(n);
  for (std::size_t i = 0; i < n; ++i) idx[i] = uint32_t(i);
  auto before = [x](uint32_t a, uint32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  const auto k = std::ptrdiff_t(out.size());
  std::nth_element(idx.begin(), idx.begin() + k - 1, idx.end(), before);
  std::sort(idx.begin(), idx.begin() + k, before);
  std::copy_n(idx.begin(), out.size(), out.begin());
}

inline PerplexityResult finish_perplexity(const ChunkPlan& p, double sum, double sum2, std::size_t count,
                                          std::vector<double> running, double range_sum = 0) {
  PerplexityResult r;
  r.logit_range = range_sum / double(count);
  r.ctx = p.ctx;
  r.chunks = p.chunks;
  r.count = count;
  r.bos = p.bos;
  const double mean = sum / double(count);
  const double var = sum2 / double(count) - mean * mean;
  r.nll = {mean, var > 0 && count > 1 ? std::sqrt(var / double(count - 1)) : 0.0};
  r.ppl = {std::exp(mean), r.nll.uncertainty * std::exp(mean)};
  r.running_ppl = std::move(running);
  return r;
}

/// perplexity() and make_kld_base() in one: base (not null) gets the top_k records.
inline PerplexityResult perplexity_pass(const Model& model, std::span<const int32_t> tokens,
                                        const PerplexityOptions& opt, KldBase* base) {
  const ChunkPlan p = plan_chunks(model, tokens.size(), opt);
  const std::size_t vocab = model.hparams().vocab;
  const std::size_t k = base ? std::min(opt.kld_top_k, vocab) : 0;
  if (base) {
    if (k == 0) fail("kiln::make_kld_base: kld_top_k is 0");
    *base = KldBase{};
    base->vocab = vocab;
    base->ctx = p.ctx;
    base->chunks = p.chunks;
    base->top_k = k;
    base->bos = p.bos;
    base->tokens.assign(tokens.begin(), tokens.begin() + std::ptrdiff_t(p.chunks * p.ctx));
    const std::size_t n = base->positions();
    base->nll.resize(n);
    base->rest_logp.resize(n);
    base->top_ids.resize(n * k);
    base->top_logp.resize(n * k);
  }
  std::vector<double> nll(p.scored), range(p.scored);
  double sum = 0, sum2 = 0, range_sum = 0;
  std::size_t count = 0;
  std::vector<double> running;
  std::vector<std::vector<uint8_t>> masks;
  std::vector<std::vector<uint32_t>> idx;
  run_chunks(
      model, tokens, p, opt,
      [&](std::size_t c, std::size_t j0, const float* logits, std::size_t rows, ThreadPool& pool) {
        if (base && masks.empty()) {
          masks.assign(pool.size(), std::vector<uint8_t>(vocab, 0));
          idx.resize(pool.size());
        }
        pool.parallel_for(rows, [&](std::size_t r, std::size_t thread) {
          const float* x = logits + r * vocab;
          const std::size_t j = j0 + r;
          const int32_t next = tokens[c * p.ctx + p.first + j + 1];
          const double lse = log_sum_exp(x, vocab);
          nll[j] = lse - double(x[next]);
          const auto [lo, hi] = std::minmax_element(x, x + vocab);
          range[j] = double(*hi) - double(*lo);
          if (!base) return;
          const std::size_t at = c * p.scored + j;
          const std::span<uint32_t> ids(base->top_ids.data() + at * k, k);
          top_tokens(x, vocab, ids, idx[thread]);
          for (std::size_t i = 0; i < k; ++i) base->top_logp[at * k + i] = double(x[ids[i]]) - lse;
          base->nll[at] = nll[j];
          base->rest_logp[at] = rest_log_prob(x, vocab, lse, ids, masks[thread]);
        });
      },
      [&](std::size_t c) {
        for (std::size_t j = 0; j < p.scored; ++j) {  // in position order: sums independent of the threads
          sum += nll[j];
          sum2 += nll[j] * nll[j];
          range_sum += range[j];
        }
        count += p.scored;
        running.push_back(std::exp(sum / double(count)));
        if (opt.on_chunk) {
          const PerplexityResult now = finish_perplexity(p, sum, sum2, count, {});
          opt.on_chunk({.chunk = c + 1, .chunks = p.chunks, .ppl = now.ppl});
        }
      });
  return finish_perplexity(p, sum, sum2, count, std::move(running), range_sum);
}

}  // namespace detail

/// Perplexity of `model` over `tokens` (llama.cpp's method, see the top of this file). Throws kiln::Error
/// when the tokens do not make two chunks of opt.ctx, when opt.ctx is under 4 or over the model's trained
/// context, or a token is outside the vocabulary.
inline PerplexityResult perplexity(const Model& model, std::span<const int32_t> tokens, const PerplexityOptions& opt) {
  return detail::perplexity_pass(model, tokens, opt, nullptr);
}

/// perplexity() that also records the base distributions kl_divergence() compares against (opt.kld_top_k
/// tokens per position).
inline KldBase make_kld_base(const Model& model, std::span<const int32_t> tokens, const PerplexityOptions& opt) {
  KldBase base;
  base.perplexity = detail::perplexity_pass(model, tokens, opt, &base);
  return base;
}

}  // namespace kiln

#include "kiln/generate/kl_divergence.hpp"
