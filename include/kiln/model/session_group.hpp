// kiln/model/session_group.hpp - several independent sequences of one model, decoded together.
//
//   kiln::SessionGroup g(model, 4, {.ctx = 1024, .threads = 2});   // 4 sequences, one KV cache each
//   for (std::size_t s = 0; s < 4; ++s) g.eval(s, prompt_ids[s]);   // prompts, one sequence at a time
//   auto logits = g.step(seqs, next_ids);                          // (seqs.size(), vocab): one pass
//   auto mixed = g.batch(rows);   // decode tokens and prompt chunks of several sequences in one pass
//
// step() runs one new token of each listed sequence through the model in ONE forward pass
// (Transformer::forward_multi): the weight products are (k, K) x (K, N) products, so every weight matrix
// is read once for all k sequences (decoding is memory-bound: k sequences cost little more than one),
// while attention runs per sequence against its own cache. Each sequence's logits are what a Session
// fed the same tokens gives (tests/model/test_session_group.cpp). Memory is allocated once: the group's
// arena, pool and RoPE tables are shared; each sequence has its KV cache.
//
// batch() generalises step() for a server's continuous batching: rows {seq, token, logits}, where the
// rows of one sequence are consecutive and take its next positions (a prompt chunk), and only the rows
// that ask for logits get them (the classifier is the largest product: a prompt chunk needs the logits
// of its last token at most). One pass then carries every running stream's next token and a chunk of a
// waiting prompt.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/model/model.hpp"

namespace kiln {

/// One row of SessionGroup::batch(): the next token of sequence `seq`; logits: return this row's logits.
struct BatchRow {
  std::size_t seq = 0;
  int32_t token = 0;
  bool logits = false;
};

class SessionGroup {
 public:
  /// n_seqs sequences with opt's context, threads, prompt batch, precision and KV cache type each (a step
  /// takes up to n_seqs tokens, so the shared arena is sized for max(opt.batch, n_seqs) rows).
  SessionGroup(const Model& model, std::size_t n_seqs, const SessionOptions& opt = {}) : model_(model) {
    if (n_seqs == 0) fail("kiln::SessionGroup: no sequences");
    const HParams& hp = model_.hparams();
    const std::size_t ctx = opt.ctx ? opt.ctx : hp.ctx_train;
    if (ctx == 0) fail("kiln::SessionGroup: the context size is 0");
    const std::size_t batch = std::max<std::size_t>({1, std::min(opt.batch ? opt.batch : 512, ctx), n_seqs});
    const KVType kv_type = resolve_kv_type(opt);
    st_ = model_.impl().make_state(ctx, batch, opt.threads, kv_type, opt.kv_pages);
    st_->precision = opt.precision;
    kv_.push_back(&st_->kv);
    for (std::size_t s = 1; s < n_seqs; ++s) {
      extra_.push_back(std::make_unique<KVCache>(hp.n_layers, hp.n_kv_heads, hp.head_dim, ctx, kv_type, opt.kv_pages));
      kv_.push_back(extra_.back().get());
    }
    n_past_.assign(n_seqs, 0);
    logits_ = Buffer<float>(n_seqs * hp.vocab);
    step_kv_.resize(n_seqs);
    step_pos_.resize(n_seqs);
    batch_kv_.reserve(batch);
    batch_pos_.reserve(batch);
    batch_tok_.reserve(batch);
    batch_logit_rows_.reserve(batch);
  }

  std::size_t size() const { return kv_.size(); }
  std::size_t ctx() const { return st_->ctx; }
  std::size_t n_past(std::size_t seq) const { return n_past_.at(check(seq)); }
  void reset(std::size_t seq) { n_past_[check(seq)] = 0; }
  /// Keeps the first n positions of sequence `seq` (the cache is indexed by position: later evals
  /// overwrite the rest). Throws, changing nothing, when n > n_past(seq).
  void rewind(std::size_t seq, std::size_t n) {
    if (n > n_past_[check(seq)])
      fail("kiln::SessionGroup::rewind: cannot keep ", n, " positions of sequence ", seq, ", it holds ", n_past_[seq]);
    n_past_[seq] = n;
  }
  /// Makes sequence `dst` hold the first n positions of sequence `src` (their keys and values copied): a
  /// prompt prefix computed once, continued by several sequences. Throws, changing nothing, when n >
  /// n_past(src).
  void copy_prefix(std::size_t src, std::size_t dst, std::size_t n) {
    if (n > n_past_[check(src)])
      fail("kiln::SessionGroup::copy_prefix: cannot copy ", n, " positions of sequence ", src, ", it holds ",
           n_past_[src]);
    kv_[check(dst)]->copy_prefix(*kv_[src], n);
    n_past_[dst] = n;
  }
  /// The most rows one batch() or step() takes.
  std::size_t max_batch() const { return st_->max_batch; }
  /// The KV caches' element type (f32 or f16) and their bytes, all sequences together.
  KVType kv_type() const { return st_->kv.type(); }
  std::size_t kv_bytes() const { return st_->kv.bytes() * kv_.size(); }
  /// Bytes of the group's working memory besides the KV caches: the activation arena (one pass of
  /// max_batch() rows), the RoPE tables (ctx positions) and the logits of up to size() rows.
  std::size_t work_bytes() const {
    return st_->arena.capacity() + st_->rope.bytes() + st_->rope_swa.bytes() + logits_.size() * sizeof(float);
  }

  /// Appends tokens to sequence `seq` (its prompt: batches of up to the session batch) and returns the
  /// last one's logits (valid until the next call).
  std::span<const float> eval(std::size_t seq, std::span<const int32_t> tokens) {
    check(seq);
    if (tokens.empty()) fail("kiln::SessionGroup::eval: no tokens");
    check_room(seq, tokens.size());
    check_ids(tokens);
    const std::size_t vocab = model_.hparams().vocab;
    float* out = logits_.data();  // row 0 of the step buffer
    for (std::size_t i = 0; i < tokens.size(); i += st_->max_batch) {
      const auto chunk = tokens.subspan(i, std::min(st_->max_batch, tokens.size() - i));
      const bool last = i + chunk.size() == tokens.size();
      model_.impl().forward(*st_, *kv_[seq], chunk, n_past_[seq], last ? out : nullptr);
      n_past_[seq] += chunk.size();
    }
    return {out, vocab};
  }

  /// One token for each sequence in `seqs` (distinct), in one forward pass. Returns their logits, row i for
  /// seqs[i] (valid until the next call). Throws, changing nothing, if a sequence is full.
  DenseTensor<const float, 2> step(std::span<const std::size_t> seqs, std::span<const int32_t> tokens) {
    const std::size_t k = seqs.size();
    if (k == 0 || tokens.size() != k)
      fail("kiln::SessionGroup::step: ", k, " sequences and ", tokens.size(), " tokens: need one token per sequence");
    check_ids(tokens);
    for (std::size_t i = 0; i < k; ++i) {
      check(seqs[i]);
      check_room(seqs[i], 1);
      for (std::size_t j = 0; j < i; ++j)
        if (seqs[j] == seqs[i]) fail("kiln::SessionGroup::step: sequence ", seqs[i], " is listed twice");
      step_kv_[i] = kv_[seqs[i]];
      step_pos_[i] = n_past_[seqs[i]];
    }
    model_.impl().forward_multi(*st_, std::span<KVCache* const>(step_kv_.data(), k), tokens,
                                std::span<const std::size_t>(step_pos_.data(), k), logits_.data());
    for (std::size_t i = 0; i < k; ++i) ++n_past_[seqs[i]];
    return make_tensor(static_cast<const float*>(logits_.data()), k, model_.hparams().vocab);
  }

  /// Runs `rows` (at most max_batch()) in one forward pass: the rows of one sequence must be consecutive and
  /// take its next positions n_past, n_past + 1, ... (at most size() rows ask for logits). Returns the
  /// logits of the rows with .logits set, in row order (valid until the next call). Throws, changing
  /// nothing, on an unknown sequence, one listed in two runs of rows, a full sequence or a bad token id.
  DenseTensor<const float, 2> batch(std::span<const BatchRow> rows) {
    const std::size_t n = rows.size();
    if (n == 0) fail("kiln::SessionGroup::batch: no rows");
    if (n > st_->max_batch) fail("kiln::SessionGroup::batch: ", n, " rows exceed the batch size ", st_->max_batch);
    batch_kv_.resize(n);  // reserved to max_batch at the first call: no allocation after it
    batch_pos_.resize(n);
    batch_tok_.resize(n);
    batch_logit_rows_.clear();
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t s = check(rows[i].seq);
      const bool starts_run = i == 0 || rows[i - 1].seq != s;
      if (starts_run)
        for (std::size_t j = 0; j < i; ++j)
          if (rows[j].seq == s)
            fail("kiln::SessionGroup::batch: sequence ", s, " has rows ", j, " and ", i,
                 " that are not consecutive (a sequence's rows must be one run)");
      std::size_t run = 1;  // rows of this run so far, this one included
      while (run <= i && rows[i - run].seq == s) ++run;
      if (starts_run) {
        std::size_t len = 1;
        while (i + len < n && rows[i + len].seq == s) ++len;
        check_room(s, len);
      }
      batch_kv_[i] = kv_[s];
      batch_pos_[i] = n_past_[s] + run - 1;
      batch_tok_[i] = rows[i].token;
      if (rows[i].logits) batch_logit_rows_.push_back(i);
    }
    check_ids(batch_tok_);
    if (batch_logit_rows_.size() > kv_.size())
      fail("kiln::SessionGroup::batch: ", batch_logit_rows_.size(), " rows ask for logits; at most ", kv_.size(),
           " (the group's sequences) may");
    const bool one_seq = rows.front().seq == rows.back().seq;  // (rows of a sequence are one run)
    const bool last_only =
        batch_logit_rows_.empty() || (batch_logit_rows_.size() == 1 && batch_logit_rows_[0] == n - 1);
    if (one_seq && n > 1 && last_only) {
      // One sequence's chunk (a prompt with nothing else running): the prompt path, whose attention is one
      // causal product per head and chunk instead of one per row; what Session::eval computes.
      const std::size_t s = rows.front().seq;
      model_.impl().forward(*st_, *kv_[s], batch_tok_, n_past_[s],
                            batch_logit_rows_.empty() ? nullptr : logits_.data());
    } else if (!batch_logit_rows_.empty())
      model_.impl().forward_multi(*st_, batch_kv_, batch_tok_, batch_pos_, logits_.data(), batch_logit_rows_);
    else  // no logits wanted: a pass that stops before the classifier
      model_.impl().forward_multi(*st_, batch_kv_, batch_tok_, batch_pos_, nullptr);
    for (const BatchRow& r : rows) ++n_past_[r.seq];
    return make_tensor(static_cast<const float*>(logits_.data()), batch_logit_rows_.size(), model_.hparams().vocab);
  }

 private:
  std::size_t check(std::size_t seq) const {
    if (seq >= kv_.size()) fail("kiln::SessionGroup: sequence ", seq, " of a group of ", kv_.size());
    return seq;
  }
  void check_room(std::size_t seq, std::size_t n) const {
    if (n > st_->ctx - n_past_[seq])
      fail("kiln::SessionGroup: sequence ", seq, " is full: ", n_past_[seq], " positions used + ", n,
           " new tokens > ctx ", st_->ctx, " (reset() it, or use a larger .ctx)");
  }
  void check_ids(std::span<const int32_t> tokens) const {
    const std::size_t vocab = model_.hparams().vocab;
    for (int32_t t : tokens)
      if (t < 0 || std::size_t(t) >= vocab)
        fail("kiln::SessionGroup: token id ", t, " is outside the vocabulary of ", vocab);
  }

  Model model_;
  std::unique_ptr<ForwardState> st_;             // arena, pool, RoPE tables; st_->kv is sequence 0's cache
  std::vector<std::unique_ptr<KVCache>> extra_;  // sequences 1..n-1
  std::vector<KVCache*> kv_;
  std::vector<std::size_t> n_past_;
  Buffer<float> logits_;  // (n_seqs, vocab)
  std::vector<KVCache*> step_kv_;
  std::vector<std::size_t> step_pos_;
  std::vector<KVCache*> batch_kv_;
  std::vector<std::size_t> batch_pos_, batch_logit_rows_;
  std::vector<int32_t> batch_tok_;
};

}  // namespace kiln
