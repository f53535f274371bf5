// kiln/generate/kl_divergence.hpp - kl_divergence() against a KldBase, and the KldBase file (included by
// kiln/generate/perplexity.hpp, which declares the API and explains the method).
//
// The file (little-endian; the extension is the caller's choice, kiln-perplexity's docs use .kld):
//   offset 0   8 bytes   magic "KILNKLD1"
//          8   u32       vocab        the model's vocabulary size (checked against the compared model's)
//         12   u32       ctx          tokens per chunk
//         16   u32       chunks
//         20   u32       top_k        tokens recorded per position, 1..vocab
//         24   i32       bos          the token each chunk started with, or -1 (chunks kept their own)
//         28   u32       reserved (0)
//         32   i32[chunks * ctx]      the tokens (before the BOS replacement)
//   then per position (chunk-major, ctx - 1 - ctx/2 per chunk):
//              f64       nll          the base's negative log-likelihood of the next token
//              f64       rest_logp    log of the probability outside the top_k (-inf: none)
//              u32[top_k]             the top_k token ids, most likely first
//              f64[top_k]             their log-probabilities
//   and last   u64       FNV-1a 64 of every byte before it.
// load_kld_base checks the magic, the sizes against the file's length, the checksum, and every id and value
// (ids inside the vocabulary, log-probabilities finite and <= 0 in order), and names what is wrong.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "kiln/generate/perplexity.hpp"

namespace kiln {

namespace detail {

static_assert(std::endian::native == std::endian::little, "kiln: the KL divergence base file is little-endian");

inline constexpr char kKldMagic[8] = {'K', 'I', 'L', 'N', 'K', 'L', 'D', '1'};
inline constexpr std::size_t kKldHeader = 32;

inline uint64_t fnv1a64(const unsigned char* p, std::size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/// Percentile of sorted values, linear between neighbours (llama-perplexity's).
inline double percentile(const std::vector<float>& v, double fraction) {
  if (fraction <= 0) return v.front();
  if (fraction >= 1) return v.back();
  const double p = fraction * double(v.size() - 1);
  const auto ip = std::size_t(p);
  const double f = p - double(ip);
  return (1 - f) * v[ip] + f * v[std::min(ip + 1, v.size() - 1)];
}

}  // namespace detail

/// KL(base || model) and the perplexities of both over the base's tokens (see perplexity.hpp): runs the
/// model on base.tokens with base.ctx (opt.ctx is not used), the chunks starting with base.bos; opt.max_chunks
/// limits the chunks. Throws kiln::FormatError when the base's vocabulary is not the model's.
inline KldResult kl_divergence(const Model& model, const KldBase& base, const PerplexityOptions& opt) {
  const std::size_t vocab = model.hparams().vocab, k = base.top_k;
  if (base.vocab != vocab)
    fail<FormatError>("kiln::kl_divergence: the base was made with a vocabulary of ", base.vocab,
                      " tokens, the model has ", vocab, " (a KL divergence needs the same vocabulary)");
  if (base.chunks == 0 || base.tokens.size() != base.chunks * base.ctx || base.nll.size() != base.positions() ||
      base.top_ids.size() != base.positions() * k)
    fail("kiln::kl_divergence: the base's arrays do not match its sizes");
  if (base.bos >= 0 && std::size_t(base.bos) >= vocab)
    fail<FormatError>("kiln::kl_divergence: the base's BOS token ", base.bos, " is outside the vocabulary");
  const std::size_t train = model.hparams().ctx_train;
  if (train > 0 && base.ctx > train)
    fail("kiln::kl_divergence: the base's ctx ", base.ctx, " exceeds the ", train,
         " positions the model was trained with");
  PerplexityOptions o = opt;
  o.ctx = base.ctx;
  // The base's chunks and input (its BOS, whatever this model's vocabulary says).
  const std::size_t chunks = opt.max_chunks > 0 ? std::min(base.chunks, opt.max_chunks) : base.chunks;
  const detail::ChunkPlan p{
      .ctx = base.ctx, .chunks = chunks, .first = base.ctx / 2, .scored = base.scored_per_chunk(), .bos = base.bos};
  struct Row {
    double nll = 0, kld = 0, p_diff = 0;
    bool same_top = false;
  };
  std::vector<Row> rows(p.scored);
  std::vector<std::vector<uint8_t>> masks;
  struct Sums {
    double nll = 0, nll2 = 0, nll_base = 0, nll_base2 = 0, nll_nll_base = 0, kld = 0, kld2 = 0, p_diff = 0, p_diff2 = 0,
           p_diff4 = 0, rest = 0;
    double p_diff_max = 0;
    std::size_t same_top = 0, count = 0;
  } s;
  KldResult r;
  r.kld_values.reserve(p.chunks * p.scored);
  detail::run_chunks(
      model, base.tokens, p, o,
      [&](std::size_t c, std::size_t j0, const float* logits, std::size_t n, ThreadPool& pool) {
        if (masks.empty()) masks.assign(pool.size(), std::vector<uint8_t>(vocab, 0));
        pool.parallel_for(n, [&](std::size_t i, std::size_t thread) {
          const float* x = logits + i * vocab;
          const std::size_t j = j0 + i, at = c * p.scored + j;
          const int32_t next = base.tokens[c * p.ctx + p.first + j + 1];
          const double lse = detail::log_sum_exp(x, vocab);
          const std::span<const uint32_t> ids(base.top_ids.data() + at * k, k);
          const double* lp = base.top_logp.data() + at * k;
          double kld = 0;
          for (std::size_t t = 0; t < k; ++t) kld += std::exp(lp[t]) * (lp[t] - (double(x[ids[t]]) - lse));
          const double rest_p = base.rest_logp[at];
          if (rest_p > -std::numeric_limits<double>::infinity()) {
            const double rest_q = detail::rest_log_prob(x, vocab, lse, ids, masks[thread]);
            kld += std::exp(rest_p) * (rest_p - rest_q);
          }
          std::size_t top = 0;  // the first maximum: the lower id of equal logits, as the base's order
          for (std::size_t t = 1; t < vocab; ++t)
            if (x[t] > x[top]) top = t;
          Row& row = rows[j];
          row.nll = lse - double(x[next]);
          row.kld = kld;
          row.p_diff = std::exp(-row.nll) - std::exp(-base.nll[at]);
          row.same_top = top == ids[0];
        });
      },
      [&](std::size_t c) {
        for (std::size_t j = 0; j < p.scored; ++j) {  // in position order: sums independent of the threads
          const Row& row = rows[j];
          const std::size_t at = c * p.scored + j;
          const double nb = base.nll[at];
          s.nll += row.nll;
          s.nll2 += row.nll * row.nll;
          s.nll_base += nb;
          s.nll_base2 += nb * nb;
          s.nll_nll_base += row.nll * nb;
          s.kld += row.kld;
          s.kld2 += row.kld * row.kld;
          s.p_diff += row.p_diff;
          s.p_diff2 += row.p_diff * row.p_diff;
          s.p_diff4 += row.p_diff * row.p_diff * row.p_diff * row.p_diff;
          s.p_diff_max = std::max(s.p_diff_max, std::fabs(row.p_diff));
          s.rest += std::exp(base.rest_logp[at]);
          s.same_top += row.same_top;
          ++s.count;
          r.kld_values.push_back(float(row.kld));
        }
        if (opt.on_chunk) {
          const Estimate lp = detail::mean_and_uncertainty(s.nll, s.nll2, s.count);
          opt.on_chunk({.chunk = c + 1,
                        .chunks = p.chunks,
                        .ppl = {std::exp(lp.value), std::exp(lp.value) * lp.uncertainty},
                        .kld = s.kld / double(s.count),
                        .same_top = double(s.same_top) / double(s.count)});
        }
      });
  // The statistics as llama-perplexity --kl-divergence computes them.
  const std::size_t n = s.count;
  r.ctx = p.ctx;
  r.chunks = p.chunks;
  r.count = n;
  r.top_k = k;
  const Estimate lp = detail::mean_and_uncertainty(s.nll, s.nll2, n);
  const Estimate lb = detail::mean_and_uncertainty(s.nll_base, s.nll_base2, n);
  r.ppl = {std::exp(lp.value), std::exp(lp.value) * lp.uncertainty};
  r.ppl_base = {std::exp(lb.value), std::exp(lb.value) * lb.uncertainty};
  const double cov = n < 10 ? 0.0 : (s.nll_nll_base / double(n) - lp.value * lb.value) / double(n - 1);
  r.ppl_correlation = lp.uncertainty > 0 && lb.uncertainty > 0 ? cov / (lp.uncertainty * lb.uncertainty) : 0.0;
  const double ratio_unc =
      std::sqrt(std::max(0.0, lp.uncertainty * lp.uncertainty + lb.uncertainty * lb.uncertainty - 2.0 * cov));
  r.log_ppl_ratio = {lp.value - lb.value, ratio_unc};
  r.ppl_ratio = {std::exp(r.log_ppl_ratio.value), std::exp(r.log_ppl_ratio.value) * ratio_unc};
  const double ppl_cov = r.ppl.value * r.ppl_base.value * cov;
  r.ppl_diff = {r.ppl.value - r.ppl_base.value,
                std::sqrt(std::max(0.0, r.ppl.uncertainty * r.ppl.uncertainty +
                                            r.ppl_base.uncertainty * r.ppl_base.uncertainty - 2.0 * ppl_cov))};
  r.kld = detail::mean_and_uncertainty(s.kld, s.kld2, n);
  std::sort(r.kld_values.begin(), r.kld_values.end());
  const auto& v = r.kld_values;
  r.kld_max = v.back();
  r.kld_min = v.front();
  r.kld_median = v.size() % 2 == 0 ? 0.5 * (double(v[v.size() / 2]) + double(v[v.size() / 2 - 1])) : v[v.size() / 2];
  r.kld_p999 = detail::percentile(v, 0.999);
  r.kld_p99 = detail::percentile(v, 0.99);
  r.kld_p95 = detail::percentile(v, 0.95);
  r.kld_p90 = detail::percentile(v, 0.90);
  r.p_diff = detail::mean_and_uncertainty(s.p_diff, s.p_diff2, n);
  const Estimate mse = detail::mean_and_uncertainty(s.p_diff2, s.p_diff4, n);
  r.p_diff_rms = {std::sqrt(mse.value), mse.value > 0 ? 0.5 / std::sqrt(mse.value) * mse.uncertainty : 0.0};
  r.p_diff_max = s.p_diff_max;
  const double top = double(s.same_top) / double(n);
  r.same_top = {top, n > 1 ? std::sqrt(top * (1 - top) / double(n - 1)) : 0.0};
  r.rest_mass = s.rest / double(n);
  return r;
}

/// Writes the base in the format at the top of this file. Throws kiln::Error naming the path when it
/// cannot be written.
inline void save_kld_base(const KldBase& base, const std::filesystem::path& path) {
  const std::size_t k = base.top_k, n = base.positions();
  if (base.tokens.size() != base.chunks * base.ctx || base.nll.size() != n || base.rest_logp.size() != n ||
      base.top_ids.size() != n * k || base.top_logp.size() != n * k)
    fail("kiln::save_kld_base: the base's arrays do not match its sizes");
  constexpr auto u32max = std::numeric_limits<uint32_t>::max();
  if (base.vocab > u32max || base.ctx > u32max || base.chunks > u32max || k > u32max)
    fail("kiln::save_kld_base: sizes beyond 32 bits");
  std::vector<unsigned char> buf;
  auto put = [&](const void* p, std::size_t bytes) {
    const auto* c = static_cast<const unsigned char*>(p);
    buf.insert(buf.end(), c, c + bytes);
  };
  auto put32 = [&](uint32_t v) { put(&v, 4); };
  put(detail::kKldMagic, 8);
  put32(uint32_t(base.vocab));
  put32(uint32_t(base.ctx));
  put32(uint32_t(base.chunks));
  put32(uint32_t(k));
  put32(uint32_t(base.bos));
  put32(0);
  put(base.tokens.data(), base.tokens.size() * 4);
  for (std::size_t i = 0; i < n; ++i) {
    put(&base.nll[i], 8);
    put(&base.rest_logp[i], 8);
    put(base.top_ids.data() + i * k, k * 4);
    put(base.top_logp.data() + i * k, k * 8);
  }
  const uint64_t h = detail::fnv1a64(buf.data(), buf.size());
  put(&h, 8);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("kiln::save_kld_base: cannot open '", path.string(), "' for writing");
  out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
  out.close();
  if (!out) fail("kiln::save_kld_base: writing '", path.string(), "' failed");
}

/// Reads a base written by save_kld_base; throws kiln::FormatError naming the file and what is wrong (not
/// such a file, truncated or too long, checksum mismatch, a size or value out of range).
inline KldBase load_kld_base(const std::filesystem::path& path) {
  const std::string name = path.string();
  auto bad = [&](const auto&... why) {
    fail<FormatError>("kiln::load_kld_base: '", name, "' is not a valid KL divergence base: ", why...);
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("kiln::load_kld_base: cannot open '", name, "'");
  const std::vector<unsigned char> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (buf.size() < detail::kKldHeader + 8 || std::memcmp(buf.data(), detail::kKldMagic, 8) != 0)
    bad("it does not start with \"KILNKLD1\" (made by kiln-perplexity --kl-divergence-base?)");
  auto get32 = [&](std::size_t off) {
    uint32_t v;
    std::memcpy(&v, buf.data() + off, 4);
    return v;
  };
  KldBase b;
  b.vocab = get32(8);
  b.ctx = get32(12);
  b.chunks = get32(16);
  b.top_k = get32(20);
  b.bos = int32_t(get32(24));
  if (b.vocab == 0 || b.ctx < 4 || b.chunks == 0 || b.top_k == 0 || b.top_k > b.vocab)
    bad("header sizes vocab ", b.vocab, ", ctx ", b.ctx, ", chunks ", b.chunks, ", top_k ", b.top_k,
        " (need vocab >= 1, ctx >= 4, chunks >= 1, 1 <= top_k <= vocab)");
  if (b.bos < -1 || (b.bos >= 0 && std::size_t(b.bos) >= b.vocab)) bad("BOS token ", b.bos, " outside the vocabulary");
  // Sizes in double first: a corrupt header must not wrap the products.
  const std::size_t k = b.top_k, n = b.positions();
  const double want =
      double(detail::kKldHeader) + 4.0 * double(b.chunks) * double(b.ctx) + double(n) * (16.0 + 12.0 * double(k)) + 8.0;
  if (want != double(buf.size()))
    bad(buf.size(), " bytes, the header's sizes need ", want, " (truncated, or not this header's data)");
  uint64_t h;
  std::memcpy(&h, buf.data() + buf.size() - 8, 8);
  if (h != detail::fnv1a64(buf.data(), buf.size() - 8)) bad("checksum mismatch (the file is damaged)");
  std::size_t off = detail::kKldHeader;
  auto take = [&](void* dst, std::size_t bytes) {
    std::memcpy(dst, buf.data() + off, bytes);
    off += bytes;
  };
  b.tokens.resize(b.chunks * b.ctx);
  take(b.tokens.data(), b.tokens.size() * 4);
  for (std::size_t i = 0; i < b.tokens.size(); ++i)
    if (b.tokens[i] < 0 || std::size_t(b.tokens[i]) >= b.vocab)
      bad("token ", i, " (", b.tokens[i], ") outside the vocabulary");
  b.nll.resize(n);
  b.rest_logp.resize(n);
  b.top_ids.resize(n * k);
  b.top_logp.resize(n * k);
  for (std::size_t i = 0; i < n; ++i) {
    take(&b.nll[i], 8);
    take(&b.rest_logp[i], 8);
    take(b.top_ids.data() + i * k, k * 4);
    take(b.top_logp.data() + i * k, k * 8);
    if (!(std::isfinite(b.nll[i]) && b.nll[i] >= -1e-9)) bad("position ", i, ": NLL ", b.nll[i]);
    if (!(b.rest_logp[i] <= 1e-9)) bad("position ", i, ": rest log-probability ", b.rest_logp[i]);
    for (std::size_t t = 0; t < k; ++t) {
      const double lp = b.top_logp[i * k + t];
      if (b.top_ids[i * k + t] >= b.vocab)
        bad("position ", i, ": token id ", b.top_ids[i * k + t], " outside the vocabulary");
      if (!(std::isfinite(lp) && lp <= 1e-9 && (t == 0 || lp <= b.top_logp[i * k + t - 1])))
        bad("position ", i, ": log-probability ", lp, " of its top token ", t, " (need finite, <= 0, descending)");
    }
  }
  // The base's perplexity, from its NLLs.
  double sum = 0, sum2 = 0;
  for (double v : b.nll) {
    sum += v;
    sum2 += v * v;
  }
  detail::ChunkPlan p{
      .ctx = b.ctx, .chunks = b.chunks, .first = b.ctx / 2, .scored = b.scored_per_chunk(), .bos = b.bos};
  b.perplexity = detail::finish_perplexity(p, sum, sum2, n, {});
  return b;
}

}  // namespace kiln
