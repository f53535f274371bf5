// kiln/text/reasoning.hpp - a reasoning model's reply split into its reasoning and its content, in the
// syntax its chat template teaches, as text arrives (llama-server's and vLLM's reasoning_content).
//
//   auto fmt = kiln::reasoning_format_of(tmpl);                       // nullopt: no reasoning syntax
//   kiln::ReasoningParser p(*fmt, {.in_reasoning = kiln::prompt_opens_reasoning(*fmt, prompt.text)});
//   for (each piece of generated text) p.push(piece, events);          // streaming: events as they are known
//   p.finish(events);                                                  // the end of the reply
//
// Syntaxes (chosen from the template's text):
//   think_tags  <think>reasoning</think>content (Qwen3, QwQ, DeepSeek-R1 and V3.1+, SmolLM3, GLM 4.5+,
//               MiniMax-M2, Kimi-K2-Thinking, Nemotron, granite 3.3, ...), also spelled [THINK]...[/THINK]
//               (Magistral, Ministral reasoning), <|START_THINKING|>...<|END_THINKING|> (Command R7B) and
//               <seed:think>...</seed:think> (Seed-OSS). As llama.cpp's deepseek format: the reply's reasoning
//               is the block that opens it (after whitespace), or, when the generation prompt already opened
//               one (DeepSeek-R1, Qwen3 thinking templates that write "<think>\n"), everything up to the close
//               tag; whitespace around the reasoning and before the content is dropped. A reply that does not
//               start with the open tag is all content (a tag later on is text). A block the reply never
//               closes (max_tokens) is all reasoning, as llama-server reports it.
//   harmony     gpt-oss: messages "<|channel|>C<|message|>BODY<|end|>", each after the first opened by
//               "<|start|>assistant" (the generation prompt opens the first). Channel analysis -> reasoning,
//               final -> content, commentary without a recipient (a preamble) -> content; a message addressed
//               " to=functions.NAME" (in the channel header or the role header, "<|constrain|>json" allowed)
//               -> a call event whose text is the body (the arguments; the reply ends at <|call|>, a stop
//               token); a message addressed to any other recipient (a built-in tool) is dropped. Bodies keep
//               their bytes. Text before any header is content.
// Streaming: text is passed on as soon as it cannot belong to a marker or to whitespace that is dropped;
// the events of a reply fed in any pieces are those of the whole reply fed at once, up to how the text of
// one kind is split between events. Pieces must be whole UTF-8 characters (the markers are ASCII, so the
// events are too).
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/text/chat.hpp"

namespace kiln {

enum class ReasoningSyntax { think_tags, harmony };

/// How a template's replies spell their reasoning.
struct ReasoningFormat {
  ReasoningSyntax syntax = ReasoningSyntax::think_tags;
  std::string open = "<think>", close = "</think>";  ///< think_tags: the block's tags
};

namespace detail::reasoning {

inline constexpr std::pair<std::string_view, std::string_view> kThinkTags[] = {
    {"<seed:think>", "</seed:think>"},
    {"[THINK]", "[/THINK]"},
    {"<|START_THINKING|>", "<|END_THINKING|>"},
    {"<think>", "</think>"},
};

inline bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/// The longest suffix of s that is a proper prefix of one of the markers (it may become one).
inline std::size_t partial_len(std::string_view s, std::initializer_list<std::string_view> markers) {
  std::size_t best = 0;
  for (std::string_view m : markers)
    for (std::size_t n = std::min(m.size() - 1, s.size()); n > best; --n)
      if (s.substr(s.size() - n) == m.substr(0, n)) {
        best = n;
        break;
      }
  return best;
}

}  // namespace detail::reasoning

/// The reasoning syntax a Jinja chat template's text teaches; nullopt when it shows none.
inline std::optional<ReasoningFormat> reasoning_format_of(std::string_view source) {
  const auto has = [&](std::string_view x) { return source.find(x) != std::string_view::npos; };
  if (has("<|channel|>") && has("<|message|>") && has("<|start|>"))
    return ReasoningFormat{.syntax = ReasoningSyntax::harmony, .open = {}, .close = {}};
  for (const auto& [open, close] : detail::reasoning::kThinkTags)
    if (has(close))
      return ReasoningFormat{
          .syntax = ReasoningSyntax::think_tags, .open = std::string(open), .close = std::string(close)};
  return std::nullopt;
}

/// The reasoning syntax of a chat template: the qwen3 family's <think> tags, or what a Jinja template's text
/// (or the text a recognised family was made from) teaches; nullopt for the other families and templates.
inline std::optional<ReasoningFormat> reasoning_format_of(const ChatTemplate& t) {
  if (t.format() == ChatFormat::qwen3) return ReasoningFormat{};
  if (t.format() == ChatFormat::jinja) return reasoning_format_of(t.source());
  if (const auto j = t.interpreted()) return reasoning_format_of(j->source());
  return std::nullopt;
}

/// The texts a reply must keep for the parser to see them (kiln-server and kiln-chat render these tokens
/// as text where a vocabulary has them as control tokens).
inline std::vector<std::string_view> reasoning_markers(const ReasoningFormat& f) {
  if (f.syntax == ReasoningSyntax::harmony)
    return {"<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>"};
  return {f.open, f.close};
}

/// Whether a rendered prompt leaves its reply inside a reasoning block: think_tags, the prompt ends with the
/// open tag (and whitespace); harmony, it ends with an analysis channel's "<|message|>".
inline bool prompt_opens_reasoning(const ReasoningFormat& f, std::string_view prompt) {
  while (!prompt.empty() && detail::reasoning::is_space(prompt.back())) prompt.remove_suffix(1);
  if (f.syntax == ReasoningSyntax::harmony) return prompt.ends_with("<|channel|>analysis<|message|>");
  return !f.open.empty() && prompt.ends_with(f.open);
}

/// What the parser found: reasoning text, content text, or (harmony) a call to a function.
struct ReasoningEvent {
  enum class Kind { reasoning, content, call };
  Kind kind = Kind::content;
  std::string text;  ///< call: the arguments as the model wrote them
  std::string name;  ///< call: the function's name
};

struct ReasoningOptions {
  bool in_reasoning = false;  ///< the prompt opened a reasoning block (prompt_opens_reasoning)
};

/// Splits a reply fed piece by piece (see the top of this file).
class ReasoningParser {
 public:
  explicit ReasoningParser(ReasoningFormat f, ReasoningOptions o = {}) : f_(std::move(f)) {
    if (f_.syntax == ReasoningSyntax::harmony) state_ = o.in_reasoning ? State::reasoning : State::header;
    else state_ = o.in_reasoning ? State::reasoning : State::start;
  }

  /// Adds generated text; appends the events now known to `out`.
  void push(std::string_view text, std::vector<ReasoningEvent>& out) {
    buf_.append(text);
    if (f_.syntax == ReasoningSyntax::harmony) harmony(out, false);
    else think(out, false);
  }
  /// The reply ended: what was held back is resolved.
  void finish(std::vector<ReasoningEvent>& out) {
    if (f_.syntax == ReasoningSyntax::harmony) harmony(out, true);
    else think(out, true);
    buf_.clear();
  }

 private:
  enum class State { start, reasoning, after_close, content, header, call, drop };
  using Kind = ReasoningEvent::Kind;

  static void emit(std::vector<ReasoningEvent>& out, Kind k, std::string_view text, std::string_view name = {}) {
    if (text.empty() && k != Kind::call) return;
    if (k != Kind::call && !out.empty() && out.back().kind == k) out.back().text.append(text);
    else out.push_back({k, std::string(text), std::string(name)});
  }

  // <think> tags. buf_ holds what is not reported yet.
  void think(std::vector<ReasoningEvent>& out, bool end) {
    using detail::reasoning::is_space;
    for (;;) {
      switch (state_) {
        case State::start: {  // the reply so far is whitespace and perhaps the start of the open tag
          std::size_t i = 0;
          while (i < buf_.size() && is_space(buf_[i])) ++i;
          const std::string_view rest = std::string_view(buf_).substr(i);
          if (rest.starts_with(f_.open)) {
            buf_.erase(0, i + f_.open.size());
            state_ = State::reasoning;
            continue;
          }
          if (!end && std::string_view(f_.open).starts_with(rest)) return;  // (rest may be empty)
          state_ = State::content;
          continue;
        }
        case State::reasoning: {  // leading whitespace dropped; trailing whitespace held until text follows
          if (!started_) {
            std::size_t i = 0;
            while (i < buf_.size() && is_space(buf_[i])) ++i;
            buf_.erase(0, i);
            if (buf_.empty()) return;
          }
          const std::size_t close = buf_.find(f_.close);
          std::size_t e = close != std::string::npos ? close
                          : end                      ? buf_.size()
                                                     : buf_.size() - detail::reasoning::partial_len(buf_, {f_.close});
          const std::size_t until = e;
          while (e > 0 && is_space(buf_[e - 1])) --e;
          if (e > 0) {
            emit(out, Kind::reasoning, std::string_view(buf_).substr(0, e));
            started_ = true;
            buf_.erase(0, e);
          }
          if (close == std::string::npos) {
            if (end) buf_.clear();  // unclosed: all reasoning (trailing whitespace dropped)
            return;
          }
          buf_.erase(0, until - e + f_.close.size());
          state_ = State::after_close;
          continue;
        }
        case State::after_close: {
          std::size_t i = 0;
          while (i < buf_.size() && is_space(buf_[i])) ++i;
          buf_.erase(0, i);
          if (buf_.empty()) return;
          state_ = State::content;
          continue;
        }
        default:  // content: everything, as it comes
          emit(out, Kind::content, buf_);
          buf_.clear();
          return;
      }
    }
  }

  // Harmony. State header: buf_ holds a message header being read; reasoning / content / call / drop: a body.
  void harmony(std::vector<ReasoningEvent>& out, bool end) {
    static constexpr std::string_view kMessage = "<|message|>";
    static constexpr std::size_t kMaxHeader = 512;  // longer without <|message|>: not a header
    for (;;) {
      if (state_ == State::header) {
        const std::size_t m = buf_.find(kMessage);
        if (m == std::string::npos || m > kMaxHeader) {
          if (!header_like(buf_) || std::min(m, buf_.size()) > kMaxHeader) {  // text before any header: content
            state_ = State::content;
            continue;
          }
          if (end) buf_.clear();  // a header the reply ends inside: markup, dropped
          return;                 // else: wait for the rest of it
        }
        read_header(std::string_view(buf_).substr(0, m));
        buf_.erase(0, m + kMessage.size());
        continue;
      }
      // a body ends at <|end|> (or a stop token kept as text, or a new message's <|start|>)
      std::size_t stop = std::string::npos, mlen = 0;
      for (std::string_view mk : {"<|end|>", "<|return|>", "<|call|>", "<|start|>"})
        if (const std::size_t p = buf_.find(mk); p < stop) {
          stop = p;
          mlen = mk.size();
        }
      const std::size_t e = stop != std::string::npos ? stop
                            : end                     ? buf_.size()
                                                      : buf_.size() - detail::reasoning::partial_len(
                                                                          buf_, {"<|end|>", "<|return|>", "<|call|>", "<|start|>"});
      const std::string_view body = std::string_view(buf_).substr(0, e);
      if (state_ == State::reasoning) emit(out, Kind::reasoning, body);
      else if (state_ == State::content) emit(out, Kind::content, body);
      else if (state_ == State::call) args_.append(body);
      if (stop == std::string::npos) {
        buf_.erase(0, e);
        if (end) end_body(out);
        return;
      }
      // a <|start|> ends the body but opens the next header (kept)
      const bool start = std::string_view(buf_).substr(stop, mlen) == "<|start|>";
      buf_.erase(0, stop + (start ? 0 : mlen));
      end_body(out);
      state_ = State::header;
      if (buf_.empty()) return;
    }
  }
  void end_body(std::vector<ReasoningEvent>& out) {
    if (state_ == State::call) {
      std::string_view a = args_;
      while (!a.empty() && detail::reasoning::is_space(a.front())) a.remove_prefix(1);
      while (!a.empty() && detail::reasoning::is_space(a.back())) a.remove_suffix(1);
      emit(out, Kind::call, a, name_);
    }
    args_.clear();
    name_.clear();
  }
  // Whether s may be (the start of) a message header: "<|start|>", "<|channel|>", " to=" or "<|constrain|>"
  // first, or a prefix of one of them.
  static bool header_like(std::string_view s) {
    if (s.empty()) return true;
    for (std::string_view h : {"<|start|>", "<|channel|>", " to=", "to=", "<|constrain|>"})
      if (s.starts_with(h) || h.starts_with(s)) return true;
    return false;
  }
  // "<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json": the body's kind.
  void read_header(std::string_view h) {
    std::string channel, to;
    const auto word = [&](std::size_t at) {
      std::size_t e = at;
      while (e < h.size() && !detail::reasoning::is_space(h[e]) && h[e] != '<') ++e;
      return std::string(h.substr(at, e - at));
    };
    if (const std::size_t c = h.find("<|channel|>"); c != std::string_view::npos) channel = word(c + 11);
    if (const std::size_t t = h.find("to="); t != std::string_view::npos) to = word(t + 3);
    if (to.starts_with("functions.")) {
      state_ = State::call;
      name_ = to.substr(10);
    } else if (!to.empty()) {
      state_ = State::drop;
    } else {
      state_ = channel == "analysis" ? State::reasoning : State::content;
    }
  }

  ReasoningFormat f_;
  State state_ = State::start;
  std::string buf_;
  bool started_ = false;     // think_tags: some reasoning was reported
  std::string args_, name_;  // harmony: the call being read
};

/// A whole reply's reasoning, content and (harmony) calls {name, arguments}.
struct ReasoningSplit {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;
};
inline ReasoningSplit split_reasoning(std::string_view text, const ReasoningFormat& f, ReasoningOptions o = {}) {
  ReasoningParser p(f, o);
  std::vector<ReasoningEvent> ev;
  p.push(text, ev);
  p.finish(ev);
  ReasoningSplit r;
  for (auto& e : ev) {
    if (e.kind == ReasoningEvent::Kind::reasoning) r.reasoning += e.text;
    else if (e.kind == ReasoningEvent::Kind::content) r.content += e.text;
    else r.calls.emplace_back(std::move(e.name), std::move(e.text));
  }
  return r;
}

}  // namespace kiln
