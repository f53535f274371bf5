// kiln/generate/generate.hpp - the generation loop: prompt -> tokens -> model -> sampler -> text pieces.
//
//   kiln::Session s(model, {.ctx = 2048, .threads = 2});
//   auto r = kiln::generate(s, "Once upon a time", {.max_tokens = 64, .sampling = {.temperature = 0}},
//                           [](std::string_view piece) { std::cout << piece << std::flush; });
//   r.gen_tok_s();
//
// generate() continues the session's sequence: the prompt gets BOS (when the vocabulary adds one) only
// if the sequence is empty. The prompt runs as one batch, then each sampled token is run to get the
// next logits; the last sampled token is left pending in the session (the next generate() runs it
// first), so max_tokens tokens need n_past + n_prompt + max_tokens - 1 positions. Text reaches the
// callback in pieces of whole UTF-8 characters (text::Utf8Stream); text that could be the start of a
// stop string is held back until it is known not to be one, and a stop string itself is never emitted.
// The callback may return void, or bool (false stops generation). After warm-up the loop does not
// allocate per token (tests/model/test_alloc.cpp).
//
// Generation that reaches the end of the context ends normally with StopReason::context_full (llama.cpp's
// finish reason "length"): every sampled token was streamed, the last one pending as usual. An empty
// prompt in an empty sequence starts from the vocabulary's BOS token alone (with add_bos, even when the
// vocabulary does not prepend BOS to prompts: SmolLM2).
//
// Errors: a prompt that does not fit in the context throws kiln::Error, and so does an empty prompt in
// an empty sequence with no BOS to start from.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/generate/constraint.hpp"
#include "kiln/generate/sampler.hpp"
#include "kiln/model/model.hpp"
#include "kiln/text/utf8.hpp"

namespace kiln {

struct GenerateOptions {
  int max_tokens = 128;  ///< tokens to generate (EOS and stop strings end earlier)
  /// How each token is chosen (generate/sampler.hpp): temperature (<= 0: greedy), top-k, top-p, min-p,
  /// penalties, seed.
  SamplerOptions sampling = {};
  std::vector<std::string> stop = {};  ///< generation ends before any of these texts
  bool ignore_eos = false;             ///< keep going past end-of-generation tokens
  bool add_bos = true;                 ///< BOS before the prompt of an empty sequence (if the vocabulary adds one)
  bool parse_special = false;          ///< recognise special token texts (e.g. "<s>") in the prompt
  /// Called after each batch of the prompt (Session::batch() tokens) with the tokens run so far and the
  /// prompt's length, when the prompt takes more than one batch: progress of a long prompt. The logits are
  /// those of one eval of the whole prompt (Session::eval runs the same batches).
  std::function<void(std::size_t done, std::size_t total)> on_prompt_progress = {};
  /// Constrained decoding (generate/grammar.hpp; JSON and JSON schemas: generate/json_schema.hpp): only tokens
  /// that keep the output a prefix of the grammar's language are sampled (the mask goes before the sampler's
  /// filters), end-of-generation only once it is complete, and generation ends (StopReason::complete) when
  /// nothing can follow. Null: off.
  std::shared_ptr<const Grammar> grammar = {};
  /// The vocabulary's byte trie for `grammar` (TokenTrie::of(tokenizer)); null: built for this call.
  std::shared_ptr<const TokenTrie> grammar_vocab = {};
};

/// Why generate() returned. context_full: the session's context has no position left for the next token
/// (llama.cpp's "length", as max_tokens).
/// complete: the grammar's output is complete and nothing can follow (GenerateOptions::grammar).
enum class StopReason { max_tokens, eos, stop_string, callback, context_full, complete };

inline const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::max_tokens:
      return "max_tokens";
    case StopReason::eos:
      return "eos";
    case StopReason::stop_string:
      return "stop_string";
    case StopReason::callback:
      return "callback";
    case StopReason::context_full:
      return "context_full";
    case StopReason::complete:
      return "complete";
  }
  return "unknown";
}

struct GenerateResult {
  StopReason stop = StopReason::max_tokens;
  std::size_t n_prompt = 0;     ///< tokens run as the prompt (BOS and a pending token included)
  std::size_t n_generated = 0;  ///< tokens sampled (an end-of-generation token not counted)
  std::vector<int32_t> tokens;  ///< those tokens, in order (the text streamed is their decoding, up to a stop string)
  double prompt_ms = 0;         ///< running the prompt through the model (tokenizing not included)
  double ttft_ms = 0;           ///< from the call to the first sampled token
  double gen_ms = 0;            ///< from the first sampled token to the last: n_generated - 1 decode steps
  double total_ms = 0;
  double prompt_tok_s() const { return prompt_ms > 0 ? 1000.0 * double(n_prompt) / prompt_ms : 0.0; }
  double gen_tok_s() const { return gen_ms > 0 && n_generated > 1 ? 1000.0 * double(n_generated - 1) / gen_ms : 0.0; }
};

/// Holds back text that may be the beginning of a stop string; finds the first stop string.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
    std::size_t longest = 0;
    for (const auto& s : stops_) longest = std::max(longest, s.size());
    pending_.reserve(longest + 1024);
    out_.reserve(longest + 1024);
  }

  /// Appends text; returns what can be emitted now. stopped() tells whether a stop string was found
  /// (the returned text is then everything before it).
  std::string_view push(std::string_view text) {
    out_.clear();
    if (stopped_) return out_;
    if (stops_.empty()) {
      out_.append(text);
      return out_;
    }
    pending_.append(text);
    std::size_t first = std::string::npos;
    for (const auto& s : stops_) first = std::min(first, pending_.find(s));
    if (first != std::string::npos) {
      stopped_ = true;
      out_.append(pending_, 0, first);
      pending_.clear();
      return out_;
    }
    std::size_t hold = 0;  // the longest tail of pending_ that begins a stop string
    for (const auto& s : stops_)
      for (std::size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
        if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
    out_.append(pending_, 0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return out_;
  }
  /// End of text: whatever was held back.
  std::string_view flush() {
    out_.clear();
    if (!stopped_) out_.swap(pending_);
    pending_.clear();
    return out_;
  }
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_, out_;
  bool stopped_ = false;
};

template <class F>
GenerateResult generate(Session& s, std::string_view prompt, const GenerateOptions& opt, F&& on_piece) {
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  const auto t0 = clock::now();
  const Tokenizer& tok = s.model().tokenizer();
  GenerateResult r;

  std::vector<int32_t> ids;
  if (s.pending() >= 0) ids.push_back(s.pending());
  const bool bos = opt.add_bos && s.n_past() == 0 && s.pending() < 0;
  const auto p = tok.encode(prompt, {.add_special = bos, .parse_special = opt.parse_special});
  ids.insert(ids.end(), p.begin(), p.end());
  if (ids.empty() && s.n_past() == 0 && opt.add_bos && tok.bos() >= 0) ids.push_back(tok.bos());
  if (ids.empty() && s.n_past() == 0)
    fail("kiln::generate: empty prompt in an empty sequence (nothing to condition on: ",
         tok.bos() >= 0 ? "add_bos is off" : "the vocabulary has no BOS token", "); give a prompt");
  if (ids.size() > s.ctx() - s.n_past())
    fail("kiln::generate: the prompt (", ids.size(), " tokens) does not fit in the context: ", s.n_past(), " of ",
         s.ctx(), " positions are used");

  Sampler sampler(s.model().hparams().vocab, opt.sampling);
  std::optional<Constraint> constraint;
  if (opt.grammar) constraint.emplace(opt.grammar, opt.grammar_vocab ? opt.grammar_vocab : TokenTrie::of(tok));
  text::Utf8Stream utf8(1024);
  StopMatcher stops(opt.stop);
  bool cancelled = false;
  auto emit = [&](std::string_view text) {
    const std::string_view out = stops.push(text);
    if (out.empty()) return;
    if constexpr (std::is_convertible_v<std::invoke_result_t<F&, std::string_view>, bool>) {
      if (!on_piece(out)) cancelled = true;
    } else {
      on_piece(out);
    }
  };

  s.set_pending(-1);
  // An empty continuation of a sequence samples from the logits its last eval left.
  const auto t_eval = clock::now();
  std::span<const float> logits = s.logits();
  if (!ids.empty() && opt.on_prompt_progress && ids.size() > s.batch()) {
    for (std::size_t i = 0; i < ids.size(); i += s.batch()) {
      const std::size_t n = std::min(s.batch(), ids.size() - i);
      logits = s.eval(std::span<const int32_t>(ids).subspan(i, n));
      opt.on_prompt_progress(i + n, ids.size());
    }
  } else if (!ids.empty()) {
    logits = s.eval(ids);
  }
  r.n_prompt = ids.size();
  const auto t_prompt = clock::now();
  r.prompt_ms = ms(t_eval, t_prompt);
  clock::time_point t_first = t_prompt;
  int32_t last = -1;
  // At most one token per free position: reserved once, so the loop does not allocate.
  r.tokens.reserve(std::min<std::size_t>(std::size_t(std::max(0, opt.max_tokens)), s.ctx() - s.n_past() + 1));
  while (r.n_generated < std::size_t(std::max(0, opt.max_tokens))) {
    if (r.n_generated > 0) {
      if (s.n_past() >= s.ctx()) {  // no position left for `last`: it stays pending
        r.stop = StopReason::context_full;
        break;
      }
      s.set_pending(-1);
      logits = s.eval(last);
    }
    if (constraint && constraint->finished()) {
      r.stop = StopReason::complete;
      break;
    }
    const int32_t next = sampler.sample(logits, s.tokens(), constraint ? &*constraint : nullptr);
    if (constraint) constraint->accept(next);
    if (r.n_generated == 0) {
      t_first = clock::now();
      r.ttft_ms = ms(t0, t_first);
    }
    if (!opt.ignore_eos && tok.is_eog(next)) {
      r.stop = StopReason::eos;
      s.set_pending(next);
      break;
    }
    ++r.n_generated;
    r.tokens.push_back(next);
    s.set_pending(next);
    last = next;
    emit(utf8.push(tok.token_bytes(next)));
    if (stops.stopped()) {
      r.stop = StopReason::stop_string;
      break;
    }
    if (cancelled) {
      r.stop = StopReason::callback;
      break;
    }
    if (constraint && constraint->finished()) {  // (before another forward pass)
      r.stop = StopReason::complete;
      break;
    }
  }
  const auto t_end = clock::now();
  if (!stops.stopped()) {
    emit(utf8.flush());
    const std::string_view rest = stops.flush();
    if (!rest.empty()) on_piece(rest);
  }
  r.gen_ms = r.n_generated > 1 ? ms(t_first, t_end) : 0.0;
  r.total_ms = ms(t0, t_end);
  return r;
}

}  // namespace kiln
