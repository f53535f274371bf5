// kiln/serve/reply.hpp - a chat reply read as it arrives: its reasoning split off (text/reasoning.hpp), then
// its content read for tool calls (tool_calls.hpp); gpt-oss's calls come from its harmony channels.
//
//   kiln::serve::ReplyReader rd({.reasoning = fmt, .in_reasoning = opens, .tools = ToolFormat::hermes});
//   for (each piece of generated text) rd.push(piece, events);   // streamed: events as they are known
//   rd.finish(events);                                           // the end of the reply
//
// A non-streamed reply is the same reader fed the whole text, so the deltas of a stream concatenate to the
// message of the same reply unstreamed. A harmony call whose arguments are not a JSON object (a reply cut
// inside them by max_tokens) is no call: its text is content.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/serve/tool_calls.hpp"
#include "kiln/text/reasoning.hpp"

namespace kiln::serve {

/// How a reply is read.
struct ReplyOptions {
  std::optional<ReasoningFormat> reasoning = std::nullopt;  ///< split reasoning off in this syntax (nullopt: no)
  bool in_reasoning = false;                                ///< the prompt opened a reasoning block
  std::optional<ToolFormat> tools = std::nullopt;           ///< read the content for calls in this format
  bool harmony_calls = false;                   ///< report harmony's calls to functions (else they are dropped)
  bool parallel = true;                         ///< false: only the first call
  std::optional<uint64_t> seed = std::nullopt;  ///< of the call ids (default: random)
};

/// A piece of a reply: reasoning or content text, or one complete call.
struct ReplyEvent {
  enum class Kind { reasoning, content, call };
  Kind kind = Kind::content;
  std::string text = {};
  std::optional<ToolCall> call = std::nullopt;
};

class ReplyReader {
 public:
  explicit ReplyReader(const ReplyOptions& o)
      : harmony_calls_(o.harmony_calls), parallel_(o.parallel), rng_(o.seed ? *o.seed : std::random_device{}()) {
    if (o.reasoning) reasoning_.emplace(*o.reasoning, ReasoningOptions{.in_reasoning = o.in_reasoning});
    if (o.tools) tools_.emplace(*o.tools, ToolParseOptions{.parallel = o.parallel, .seed = rng_()});
  }

  void push(std::string_view text, std::vector<ReplyEvent>& out) {
    if (!reasoning_) return content(text, out, false);
    std::vector<ReasoningEvent> ev;
    reasoning_->push(text, ev);
    take(ev, out);
  }
  void finish(std::vector<ReplyEvent>& out) {
    if (reasoning_) {
      std::vector<ReasoningEvent> ev;
      reasoning_->finish(ev);
      take(ev, out);
    }
    content({}, out, true);
  }
  /// The calls reported so far.
  std::size_t calls() const { return calls_; }

 private:
  static void add(std::vector<ReplyEvent>& out, ReplyEvent::Kind k, std::string_view text) {
    if (text.empty()) return;
    if (!out.empty() && out.back().kind == k) out.back().text.append(text);
    else out.push_back({k, std::string(text), std::nullopt});
  }
  void add_call(std::vector<ReplyEvent>& out, ToolCall c) {
    if (!parallel_ && calls_ > 0) return;
    ++calls_;
    out.push_back({ReplyEvent::Kind::call, {}, std::move(c)});
  }
  void take(std::vector<ReasoningEvent>& ev, std::vector<ReplyEvent>& out) {
    for (auto& e : ev) {
      if (e.kind == ReasoningEvent::Kind::reasoning) add(out, ReplyEvent::Kind::reasoning, e.text);
      else if (e.kind == ReasoningEvent::Kind::content) content(e.text, out, false);
      else if (harmony_calls_ && nlohmann::ordered_json::parse(e.text, nullptr, false).is_object())
        add_call(out, {.id = make_call_id(ToolFormat::hermes, rng_), .name = e.name, .arguments = e.text});
      else if (harmony_calls_)  // arguments that are no JSON object (a reply cut inside them): content, verbatim
        content(e.text, out, false);
    }
  }
  void content(std::string_view text, std::vector<ReplyEvent>& out, bool end) {
    if (!tools_) return add(out, ReplyEvent::Kind::content, text);
    std::vector<ToolEvent> ev;
    tools_->push(text, ev);
    if (end) tools_->finish(ev);
    for (auto& e : ev) {
      if (e.call) add_call(out, std::move(*e.call));
      else add(out, ReplyEvent::Kind::content, e.content);
    }
  }

  bool harmony_calls_, parallel_;
  std::mt19937_64 rng_;
  std::optional<ReasoningParser> reasoning_;
  std::optional<ToolCallParser> tools_;
  std::size_t calls_ = 0;
};

}  // namespace kiln::serve
