// kiln/serve/scheduler.hpp - continuous batching: many requests, one model, one engine thread.
//
//   kiln::serve::Scheduler sched(model, {.slots = 4, .ctx = 2048, .threads = 2});
//   auto stream = sched.submit(prompt_ids, {.max_tokens = 64, .sampling = {.temperature = 0}});
//   std::string text;
//   while (!stream->next(text, std::chrono::milliseconds(100))) { ... text holds what arrived ... }
//   stream->usage();   // prompt, cached and generated tokens
//
// The scheduler owns a SessionGroup of `slots` sequences (one KV cache each), a queue of waiting
// requests and one engine thread. Every step is ONE forward pass (SessionGroup::batch) that carries the
// next token of every running request plus chunks of the prompts still being read, up to `batch` rows in
// all (chunked prefill): a long new prompt delays the running streams by one chunk per step, never by its
// whole length. Requests join and leave between steps (continuous batching). Each request samples with
// its own options and seeded generator (the slots share one vocabulary-sized sampler scratch), ends at
// EOS, a stop token, a stop string, max_tokens or the end of its slot's context, and streams text in
// whole UTF-8 characters (stop strings held back as generate() does: kiln/generate/generate.hpp).
// Stream::cancel() frees the slot at the next step.
//
// Prompt caching: a slot keeps the tokens it ran after its request ends. A new request goes to the idle
// slot whose tokens share the longest prefix with its prompt and runs only the rest (usage().cached
// counts the reused tokens, usage().evaluated the ones computed): a conversation's next turn, or a shared
// system prompt.
//
// Constrained decoding (RequestOptions::grammar): each slot follows its request's grammar with a Constraint
// over a vocabulary trie shared by the requests (built once per set of rendered control tokens).
//
// Each request's tokens are what kiln::generate on a Session alone gives (tests/serve/test_scheduler.cpp),
// up to the f32 rounding of batched products (see SessionGroup).
#pragma once

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/generate/constraint.hpp"
#include "kiln/generate/generate.hpp"
#include "kiln/generate/sampler.hpp"
#include "kiln/model/session_group.hpp"
#include "kiln/serve/metrics.hpp"
#include "kiln/text/utf8.hpp"

namespace kiln::serve {

struct SchedulerOptions {
  std::size_t slots = 4;       ///< requests decoded together (one KV cache of ctx positions each)
  std::size_t ctx = 2048;      ///< positions per slot (prompt + generated tokens of one request)
  std::size_t threads = 1;     ///< threads of the forward pass, the engine thread included
  std::size_t batch = 256;     ///< rows per step: decode tokens + prompt chunks (bounds one step's time)
  std::size_t max_queue = 64;  ///< waiting requests beyond which submit() refuses (QueueFull)
  Precision precision = Precision::fast;
  KVType kv_type = KVType::automatic;
  /// The slots' KV caches take memory as their positions are stored (4 KiB pages): a slot holds what its
  /// request used, not its whole context (KVPages::upfront: all of it, in huge pages, from the start).
  KVPages kv_pages = KVPages::on_use;
};

struct RequestOptions {
  int max_tokens = 128;  ///< tokens to generate (stops, EOS and the context end earlier)
  SamplerOptions sampling = {};
  std::vector<std::string> stop = {};     ///< the reply ends before any of these texts
  std::vector<int32_t> stop_tokens = {};  ///< token ids that end the reply, besides the tokenizer's EOS/EOT
  /// Control tokens whose text the reply keeps (others add no text): tool-call markers such as <|python_tag|>.
  std::vector<int32_t> render_tokens = {};
  bool ignore_eos = false;
  /// Record each generated token's log-probability under the model: the log-softmax of its logits as the
  /// model gives them (before penalties, temperature and filters), and the top_logprobs most likely tokens'.
  bool logprobs = false;
  int top_logprobs = 0;  ///< in [0, kMaxTopLogprobs]
  /// Constrained decoding (generate/grammar.hpp, generate/json_schema.hpp): only tokens that keep the reply a
  /// prefix of the grammar's language, end-of-generation only once it is complete, and the reply ends (finish
  /// stop) as soon as nothing can follow. Null: off.
  std::shared_ptr<const Grammar> grammar = {};
  /// The vocabulary's trie for `grammar`, with render_tokens as text (null: the scheduler's, built once per
  /// set of render_tokens).
  std::shared_ptr<const TokenTrie> grammar_vocab = {};
};

inline constexpr int kMaxTopLogprobs = 20;

/// A generated token's log-probability and the most likely tokens' at its position (most likely first;
/// equal ones: lower id first).
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top = {};
};

/// log-softmax of `logits` at `token`, and the k most likely tokens' (in double, the maximum subtracted).
inline TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int k) {
  float m = -std::numeric_limits<float>::infinity();
  for (float x : logits) m = std::max(m, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - double(m));
  const double lse = double(m) + std::log(sum);
  TokenLogprob r{.token = token, .logprob = float(double(logits[std::size_t(token)]) - lse)};
  const std::size_t kk = std::min<std::size_t>(std::size_t(std::max(k, 0)), logits.size());
  auto before = [&](int32_t a, int32_t b) {  // more likely first, then the lower id
    return logits[std::size_t(a)] > logits[std::size_t(b)] ||
           (logits[std::size_t(a)] == logits[std::size_t(b)] && a < b);
  };
  std::vector<int32_t> best;  // the kk most likely so far, in order (kk <= kMaxTopLogprobs: insertion)
  best.reserve(kk + 1);
  for (std::size_t i = 0; i < logits.size() && kk > 0; ++i) {
    const auto id = int32_t(i);
    if (best.size() == kk && !before(id, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), id, before), id);
    if (best.size() > kk) best.pop_back();
  }
  for (int32_t id : best) r.top.emplace_back(id, float(double(logits[std::size_t(id)]) - lse));
  return r;
}

enum class Finish { running, stop, length, cancelled, error };

inline const char* finish_name(Finish f) {
  switch (f) {
    case Finish::running:
      return "running";
    case Finish::stop:
      return "stop";
    case Finish::length:
      return "length";
    case Finish::cancelled:
      return "cancelled";
    case Finish::error:
      return "error";
  }
  return "?";
}

struct Usage {
  std::size_t prompt = 0;      ///< prompt tokens
  std::size_t cached = 0;      ///< of them, reused from the slot's cache (not computed)
  std::size_t evaluated = 0;   ///< of them, run through the model so far (prompt - cached once read)
  std::size_t completion = 0;  ///< tokens generated (an end token not counted)
};

/// What a Scheduler allocates besides the model's weights, in bytes (Scheduler::memory()). Peak memory with N
/// slots is at most about the weights + kv + work + sampler, plus the tokenizer and the program's own; the KV
/// caches (SchedulerOptions::kv_pages) and the activations take their pages as they are first written.
struct MemoryUse {
  std::size_t kv = 0;       ///< the slots' KV caches: slots x 2 (K, V) x layers x KV heads x head_dim x ctx x element
  std::size_t work = 0;     ///< activations of one pass of `batch` rows, RoPE tables, logits of `slots` rows
  std::size_t sampler = 0;  ///< the sampling chain's scratch: one, shared by the slots (vocab x 20 bytes)
  std::size_t total() const { return kv + work + sampler; }
};

/// The queue is full: retry later (HTTP 503).
class QueueFull : public Error {
 public:
  using Error::Error;
};

class Scheduler;

/// One submitted request, shared by the engine (which appends text and finishes it) and the consumer.
class Stream {
 public:
  /// Waits up to `timeout` for new text or the end; appends the text that arrived to `out`. Returns
  /// true once the request has finished and all its text was delivered.
  template <class Rep, class Period>
  bool next(std::string& out, std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, timeout, [&] { return !text_.empty() || finish_ != Finish::running; });
    out += text_;
    text_.clear();
    return finish_ != Finish::running;
  }
  /// Waits up to `timeout` for new text or the end, taking nothing.
  template <class Rep, class Period>
  void wait_for_more(std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, timeout, [&] { return !text_.empty() || finish_ != Finish::running; });
  }
  /// Blocks until the request finishes; returns all its text not yet taken by next().
  std::string wait() {
    std::string out;
    while (!next(out, std::chrono::seconds(1))) {
    }
    return out;
  }
  /// Ends the request at the next step (its slot is freed); the finish reason becomes cancelled. (The
  /// engine only waits when nothing is queued or running, so it sees the flag without a wake-up.)
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  Finish finish() const {
    std::lock_guard lk(mu_);
    return finish_;
  }
  Usage usage() const {
    std::lock_guard lk(mu_);
    return usage_;
  }
  std::string error() const {
    std::lock_guard lk(mu_);
    return error_;
  }
  /// The generated token ids (an end token not included), complete once finished.
  std::vector<int32_t> tokens() const {
    std::lock_guard lk(mu_);
    return tokens_;
  }
  /// The slot that ran the request (tests), or -1 before it started.
  int slot() const { return slot_.load(); }
  /// The generated tokens' log-probabilities from the `from`-th on (RequestOptions::logprobs), as far as
  /// generated; one per token of tokens().
  std::vector<TokenLogprob> logprobs(std::size_t from = 0) const {
    std::lock_guard lk(mu_);
    if (from >= logprobs_.size()) return {};
    return {logprobs_.begin() + std::ptrdiff_t(from), logprobs_.end()};
  }

 private:
  friend class Scheduler;
  void push(std::string_view text, int32_t token, std::optional<TokenLogprob> lp) {
    std::lock_guard lk(mu_);
    text_.append(text);
    if (token >= 0) tokens_.push_back(token);
    if (lp) logprobs_.push_back(std::move(*lp));
    ++usage_.completion;
    cv_.notify_all();
  }
  void emit(std::string_view text) {
    if (text.empty()) return;
    std::lock_guard lk(mu_);
    text_.append(text);
    cv_.notify_all();
  }
  void end(Finish f, std::string error = {}) {
    std::lock_guard lk(mu_);
    if (finish_ != Finish::running) return;
    finish_ = f;
    error_ = std::move(error);
    cv_.notify_all();
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string text_, error_;
  std::vector<int32_t> tokens_;
  std::vector<TokenLogprob> logprobs_;
  Usage usage_;
  Finish finish_ = Finish::running;
  std::atomic<bool> cancelled_{false};
  std::atomic<int> slot_{-1};
  // Engine side (read only by the engine thread once submitted).
  std::vector<int32_t> prompt_;
  RequestOptions opt_;
  std::chrono::steady_clock::time_point t_submit_;
  std::shared_ptr<Stream> leader_;  // submit_choices: the first choice, whose prompt this one copies
};

class Scheduler {
 public:
  Scheduler(const Model& model, const SchedulerOptions& opt = {})
      : model_(model),
        opt_(opt),
        group_(model, opt.slots,
               {.ctx = opt.ctx,
                .threads = opt.threads,
                .batch = std::max<std::size_t>(opt.batch, opt.slots),
                .precision = opt.precision,
                .kv_type = opt.kv_type,
                .kv_pages = opt.kv_pages}),
        scratch_(model.hparams().vocab),
        metrics_(opt.slots) {
    if (opt.slots == 0) fail("kiln::serve::Scheduler: no slots");
    slots_.resize(opt.slots);
    rows_.reserve(group_.max_batch());
    owners_.reserve(opt.slots);
    order_.reserve(opt.slots);
    chunks_.reserve(opt.slots);
    engine_ = std::thread([this] { loop(); });
  }
  ~Scheduler() { stop(std::chrono::milliseconds(0)); }
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const Model& model() const { return model_; }
  std::size_t ctx() const { return group_.ctx(); }
  std::size_t slots() const { return slots_.size(); }
  /// What the scheduler allocated at construction (KV pages are committed as positions are stored; at
  /// their full size once every slot's context has been used).
  MemoryUse memory() const {
    return {.kv = group_.kv_bytes(), .work = group_.work_bytes(), .sampler = scratch_.bytes()};
  }
  /// Counters and histograms so far (a copy).
  Metrics metrics() const {
    std::lock_guard lk(mu_);
    Metrics m = metrics_;
    m.queue = queue_.size();
    return m;
  }

  /// Queues a request. Throws kiln::Error (nothing queued) for an empty prompt, one that does not fit in a
  /// slot's context, or a token outside the vocabulary; QueueFull when max_queue requests wait already,
  /// or after stop().
  std::shared_ptr<Stream> submit(std::vector<int32_t> prompt, RequestOptions opt) {
    return submit_choices(std::move(prompt), std::move(opt), 1).front();
  }

  /// Queues n requests with one prompt (OpenAI's `n`: several choices), choice i sampling with seed
  /// opt.sampling.seed + i. The prompt is computed once: the first choice reads it, and each other waits
  /// in the queue until it has, then copies its keys and values into its own slot (computing only the
  /// prompt's last token, for its logits). Throws as submit() does (nothing queued), QueueFull when the n
  /// requests do not fit in the queue.
  std::vector<std::shared_ptr<Stream>> submit_choices(std::vector<int32_t> prompt, RequestOptions opt, std::size_t n) {
    if (n == 0) fail("kiln::serve::Scheduler::submit_choices: n is 0");
    if (prompt.empty()) fail("kiln::serve::Scheduler::submit: empty prompt");
    if (prompt.size() > ctx())
      fail("kiln::serve::Scheduler::submit: the prompt has ", prompt.size(), " tokens; a slot's context holds ", ctx());
    const std::size_t vocab = model_.hparams().vocab;
    for (int32_t t : prompt)
      if (t < 0 || std::size_t(t) >= vocab)
        fail("kiln::serve::Scheduler::submit: token id ", t, " is outside the vocabulary of ", vocab);
    check_sampler_options(opt.sampling);  // throws on bad options, before anything is queued
    if (opt.grammar && !opt.grammar_vocab) opt.grammar_vocab = vocab_trie(opt.render_tokens);
    if (opt.grammar_vocab && opt.grammar_vocab->vocab() != vocab)
      fail("kiln::serve::Scheduler::submit: the grammar's vocabulary has ", opt.grammar_vocab->vocab(),
           " tokens, the model ", vocab);
    if (opt.top_logprobs < 0 || opt.top_logprobs > kMaxTopLogprobs)
      fail("kiln::serve::Scheduler::submit: top_logprobs ", opt.top_logprobs, " is outside [0, ", kMaxTopLogprobs, "]");
    std::vector<std::shared_ptr<Stream>> out;
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < n; ++i) {
      auto s = std::make_shared<Stream>();
      s->prompt_ = prompt;
      s->opt_ = opt;
      s->opt_.sampling.seed = opt.sampling.seed + i;
      s->t_submit_ = now;
      if (i > 0) s->leader_ = out.front();
      out.push_back(std::move(s));
    }
    {
      std::lock_guard lk(mu_);
      if (stopping_) throw QueueFull("kiln::serve::Scheduler: shutting down");
      if (queue_.size() + n > opt_.max_queue)
        throw QueueFull(detail::concat("kiln::serve::Scheduler: ", queue_.size(), " requests wait already (max_queue ",
                                       opt_.max_queue, ")"));
      for (auto& s : out) queue_.push_back(s);
      metrics_.requests += n;
    }
    cv_.notify_all();
    return out;
  }

  /// Stops accepting requests, lets the queued and running ones finish for up to `grace`, cancels the
  /// rest and joins the engine thread. Idempotent.
  void stop(std::chrono::milliseconds grace) {
    {
      std::lock_guard lk(mu_);
      if (!stopping_) deadline_ = std::chrono::steady_clock::now() + grace;
      stopping_ = true;
    }
    cv_.notify_all();
    if (engine_.joinable()) engine_.join();
  }

 private:
  using clock = std::chrono::steady_clock;

  struct Slot {
    std::vector<int32_t> cached;  // the tokens the sequence holds (group_.n_past(seq) == cached.size())
    std::shared_ptr<Stream> req;  // null: idle
    std::size_t fed = 0;          // prompt tokens in the cache
    int32_t next = -1;            // sampled, to run in the next step (decoding)
    std::size_t order = 0;        // admission order: earlier prompts get the step's rows first
    std::mt19937_64 rng;          // the request's random state (options: req->opt_.sampling; scratch: shared)
    std::optional<StopMatcher> stops;
    std::optional<Constraint> constraint;  // the request's grammar (RequestOptions::grammar)
    text::Utf8Stream utf8{256};
    clock::time_point t_last;
  };

  void loop() {
    for (;;) {
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !queue_.empty() || busy() > 0; });
        if (stopping_ && clock::now() >= deadline_) cancel_all_locked();
        drop_cancelled_locked();
        if (stopping_ && queue_.empty() && busy() == 0) return;
        admit_locked();
      }
      try {
        step();
      } catch (const std::exception& e) {  // not expected: inputs are checked at submit
        for (auto& s : slots_)
          if (s.req) finish(s, Finish::error, e.what());
      }
    }
  }

  std::size_t busy() const {
    std::size_t n = 0;
    for (const auto& s : slots_) n += s.req != nullptr;
    return n;
  }

  void cancel_all_locked() {
    for (auto& r : queue_) r->cancelled_.store(true);
    for (auto& s : slots_)
      if (s.req) s.req->cancelled_.store(true);
  }

  void drop_cancelled_locked() {
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->cancelled()) {
        (*it)->end(Finish::cancelled);
        ++metrics_.finished[std::size_t(Finish::cancelled)];
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& s : slots_)
      if (s.req && s.req->cancelled()) finish_locked(s, Finish::cancelled, {});
  }

  // Queued requests to idle slots, first come first served; each to the idle slot whose cached tokens
  // share the longest prefix with its prompt (at most prompt - 1 tokens: the last one runs for logits),
  // if that prefix is at least half of what the slot holds; otherwise to the least recently used idle
  // slot, so a short common start (a BOS) does not throw away another conversation's cache (llama-server's
  // slot similarity rule, at 0.5). The chosen slot's common prefix is reused either way.
  void admit_locked() {
    while (!queue_.empty()) {
      auto req = queue_.front();
      const auto& p = req->prompt_;
      if (const Stream* lead = req->leader_.get()) {  // a later choice: waits while the first reads the prompt
        const int ls = lead->slot_.load();
        const bool queued = ls < 0 && !lead->cancelled();
        if (queued ||
            (ls >= 0 && slots_[std::size_t(ls)].req.get() == lead && slots_[std::size_t(ls)].fed + 1 < p.size()))
          return;
      }
      std::size_t best = slots_.size(), best_k = 0, lru = slots_.size();
      auto common = [&](std::size_t i) {
        const auto& c = slots_[i].cached;
        const std::size_t limit = std::min(c.size(), p.size() - 1);
        std::size_t k = 0;
        while (k < limit && c[k] == p[k]) ++k;
        return k;
      };
      for (std::size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i].req) continue;
        if (lru == slots_.size() || slots_[i].order < slots_[lru].order) lru = i;
        const std::size_t k = common(i);
        if (k > 0 && 2 * k >= slots_[i].cached.size() && k > best_k) best = i, best_k = k;
      }
      if (lru == slots_.size()) return;  // no idle slot
      if (best == slots_.size()) best = lru, best_k = common(lru);
      queue_.pop_front();
      Slot& s = slots_[best];
      group_.rewind(best, best_k);
      s.cached.resize(best_k);
      if (req->leader_) {  // the prompt from any slot that holds more of it (the first choice's)
        std::size_t from = slots_.size(), from_k = best_k;
        for (std::size_t i = 0; i < slots_.size(); ++i)
          if (i != best && common(i) > from_k) from = i, from_k = common(i);
        if (from < slots_.size()) {
          group_.copy_prefix(from, best, from_k);
          s.cached.assign(p.begin(), p.begin() + std::ptrdiff_t(from_k));
          best_k = from_k;
        }
        req->leader_.reset();
      }
      s.req = req;
      s.fed = best_k;
      s.next = -1;
      s.order = ++admitted_;
      s.rng.seed(req->opt_.sampling.seed);
      s.stops.emplace(req->opt_.stop);
      s.constraint.reset();
      if (req->opt_.grammar) s.constraint.emplace(req->opt_.grammar, req->opt_.grammar_vocab);
      s.utf8 = text::Utf8Stream(256);
      req->slot_.store(int(best));
      {
        std::lock_guard lk(req->mu_);
        req->usage_.prompt = p.size();
        req->usage_.cached = best_k;
      }
      metrics_.prompt_tokens += p.size();
      metrics_.cached_tokens += best_k;
      ++metrics_.busy;
    }
  }

  // One forward pass: every decoding slot's next token, then prompt chunks (oldest request first) up to
  // the row budget; then sampling for the rows that asked for logits.
  void step() {
    rows_.clear();
    owners_.clear();
    const std::size_t budget = group_.max_batch();
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (!s.req || s.next < 0) continue;
      rows_.push_back({.seq = i, .token = s.next, .logits = true});
      owners_.push_back(i);
    }
    order_.clear();
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].req && slots_[i].next < 0 && slots_[i].fed < slots_[i].req->prompt_.size()) order_.push_back(i);
    std::sort(order_.begin(), order_.end(),
              [&](std::size_t a, std::size_t b) { return slots_[a].order < slots_[b].order; });
    chunks_.clear();
    for (std::size_t i : order_) {
      if (rows_.size() >= budget) break;
      Slot& s = slots_[i];
      const auto& p = s.req->prompt_;
      const std::size_t take = std::min(p.size() - s.fed, budget - rows_.size());
      for (std::size_t j = 0; j < take; ++j)
        rows_.push_back({.seq = i, .token = p[s.fed + j], .logits = s.fed + j + 1 == p.size()});
      chunks_.push_back({i, take});
      if (s.fed + take == p.size()) owners_.push_back(i);
    }
    if (rows_.empty()) return;
    // Logits rows come back in row order: decode rows first (owners_ order), then completed prompts in
    // admission order (owners_ order too).
    const auto logits = group_.batch(rows_);
    for (const BatchRow& r : rows_) {
      Slot& s = slots_[r.seq];
      s.cached.push_back(r.token);
      if (s.next < 0) ++s.fed;
    }
    // The prompt tokens this pass computed (usage().evaluated; the tests show a cached prefix never runs again).
    std::size_t evaluated = 0;
    for (const auto& [i, take] : chunks_) {
      std::lock_guard lk(slots_[i].req->mu_);
      slots_[i].req->usage_.evaluated += take;
      evaluated += take;
    }
    if (evaluated > 0) {
      std::lock_guard lk(mu_);
      metrics_.prompt_tokens_evaluated += evaluated;
    }
    const std::size_t vocab = model_.hparams().vocab;
    for (std::size_t r = 0; r < owners_.size(); ++r) {
      Slot& s = slots_[owners_[r]];
      s.next = -1;
      sample(s, std::span<const float>(&logits(r, 0), vocab));
    }
  }

  void sample(Slot& s, std::span<const float> logits) {
    const Tokenizer& tok = model_.tokenizer();
    Stream& req = *s.req;
    const RequestOptions& o = req.opt_;
    const auto now = clock::now();
    if (req.usage_.completion >= std::size_t(std::max(0, o.max_tokens))) return finish(s, Finish::length);
    int32_t t = -1;
    try {
      t = scratch_.sample(logits, s.cached, o.sampling, s.rng, s.constraint ? &*s.constraint : nullptr);
    } catch (const std::exception& e) {  // a grammar no token can continue: this request only
      return finish(s, Finish::error, e.what());
    }
    if (s.constraint) s.constraint->accept(t);
    const bool first = req.usage_.completion == 0;
    {
      std::lock_guard lk(mu_);
      if (first) metrics_.ttft.add(std::chrono::duration<double>(now - req.t_submit_).count());
      else metrics_.itl.add(std::chrono::duration<double>(now - s.t_last).count());
    }
    s.t_last = now;
    const bool end = !o.ignore_eos &&
                     (tok.is_eog(t) || std::find(o.stop_tokens.begin(), o.stop_tokens.end(), t) != o.stop_tokens.end());
    if (end) return finish(s, Finish::stop);
    const bool render = std::find(o.render_tokens.begin(), o.render_tokens.end(), t) != o.render_tokens.end();
    const std::string_view text = s.stops->push(s.utf8.push(tok.token_bytes(t, {.render_special = render})));
    req.push(text, t, o.logprobs ? std::optional(token_logprob(logits, t, o.top_logprobs)) : std::nullopt);
    {
      std::lock_guard lk(mu_);
      ++metrics_.generated_tokens;
    }
    if (s.stops->stopped() || (s.constraint && s.constraint->finished())) return finish(s, Finish::stop);
    if (req.usage_.completion >= std::size_t(std::max(0, o.max_tokens)) || s.cached.size() >= group_.ctx())
      return finish(s, Finish::length);
    s.next = t;
  }

  // The vocabulary trie with these control tokens as text, built once per set (on the caller's thread).
  std::shared_ptr<const TokenTrie> vocab_trie(std::vector<int32_t> render) {
    std::sort(render.begin(), render.end());
    std::lock_guard lk(trie_mu_);
    for (const auto& [r, t] : tries_)
      if (r == render) return t;
    auto t = TokenTrie::of(model_.tokenizer(), render);
    tries_.emplace_back(std::move(render), t);
    return t;
  }

  void finish(Slot& s, Finish f, std::string error = {}) {
    std::lock_guard lk(mu_);
    finish_locked(s, f, std::move(error));
  }
  void finish_locked(Slot& s, Finish f, std::string error) {
    if (f == Finish::stop || f == Finish::length) {  // the text held back (a partial character or stop string)
      if (!s.stops->stopped()) {
        s.req->emit(s.stops->push(s.utf8.flush()));
        s.req->emit(s.stops->flush());
      }
    }
    // A token sampled and not run is not in the cache: the slot keeps what it ran (for prefix reuse).
    s.req->end(f, std::move(error));
    ++metrics_.finished[std::size_t(f)];
    --metrics_.busy;
    s.req.reset();
    s.next = -1;
  }

  Model model_;
  SchedulerOptions opt_;
  SessionGroup group_;
  std::vector<Slot> slots_;
  SamplerScratch scratch_;  // every slot samples with it in turn (the engine thread): one, not one per slot
  std::vector<BatchRow> rows_;
  std::vector<std::size_t> owners_, order_;
  std::vector<std::pair<std::size_t, std::size_t>> chunks_;  // this step's prompt chunks: (slot, tokens)
  std::size_t admitted_ = 0;

  std::mutex trie_mu_;
  std::vector<std::pair<std::vector<int32_t>, std::shared_ptr<const TokenTrie>>> tries_;

  mutable std::mutex mu_;  // queue_, stopping_, metrics_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Stream>> queue_;
  bool stopping_ = false;
  clock::time_point deadline_;
  Metrics metrics_;
  std::thread engine_;  // last: starts after everything above exists
};

}  // namespace kiln::serve
