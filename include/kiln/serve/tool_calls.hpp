// kiln/serve/tool_calls.hpp - a model's tool calls in its reply text, found in the format its chat
// template teaches, as OpenAI's tool_calls (name, arguments as a JSON string, id).
//
//   auto fmt = kiln::serve::tool_format_of(template_source);       // nullopt: no format kiln reads
//   kiln::serve::ToolCallParser p(*fmt);
//   for (each piece of generated text) p.push(piece, events);         // streaming: events as they are known
//   p.finish(events);                                                 // the end of the reply
//
// Formats (chosen from the template's text, by the same markers llama.cpp's common/chat.cpp looks for):
//   hermes   <tool_call>{"name": N, "arguments": {...}}</tool_call>, one block per call (Hermes 2 Pro / 3,
//            Qwen2.5, Qwen3, QwQ, Granite 4); a block may hold a list of calls (SmolLM2-Instruct's
//            <tool_call>[{...}, {...}]</tool_call>). A last block that the reply ends inside without its
//            closing tag still counts when its JSON is complete.
//   llama3   Llama 3.1 / 3.2 / 3.3 JSON calls: {"name": N, "parameters": {...}} at the start of the reply or
//            after <|python_tag|> (several: separated by whitespace or ';').
//   mistral  [TOOL_CALLS][{"name": N, "arguments": {...}}, ...] (Mistral Nemo) or
//            [TOOL_CALLS]N[ARGS]{...} per call (Mistral Small 3.2, Devstral, Ministral 3).
// Each call's arguments may also be spelled "parameters" / "arguments" (the other format's key), a JSON
// object or a string holding one. Text outside the calls is content; whitespace next to a call is dropped.
// A block whose JSON does not parse as calls is content, verbatim (never dropped). Streaming: text is
// passed on as it comes, except what may still become a call: a partial start marker at the end of the
// text so far, trailing whitespace, and a call block until it is complete. The events of a reply fed in any
// pieces are the events of the whole reply fed at once, up to how the content is split.
#pragma once

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::serve {

enum class ToolFormat { hermes, llama3, mistral };

inline const char* tool_format_name(ToolFormat f) {
  return f == ToolFormat::hermes ? "hermes" : f == ToolFormat::llama3 ? "llama3" : "mistral";
}

/// The call format a Jinja chat template teaches, from its text; nullopt for a template that shows no call
/// syntax kiln reads (XML calls such as Qwen3-Coder's <function=...>, functionary's, or no tools at all).
inline std::optional<ToolFormat> tool_format_of(std::string_view source) {
  const auto has = [&](std::string_view x) { return source.find(x) != std::string_view::npos; };
  if (has("[TOOL_CALLS]")) return ToolFormat::mistral;
  if (has("<function=") || has("<invoke")) return std::nullopt;
  if (has("<tool_call>")) return ToolFormat::hermes;
  if (has("<|start_header_id|>") && has("ipython")) return ToolFormat::llama3;
  return std::nullopt;
}

/// The texts that mark calls in a format: kiln-server keeps them in the reply text even where the
/// vocabulary has them as control tokens (<|python_tag|>, [TOOL_CALLS], [ARGS]), so the parser sees them.
inline std::vector<std::string_view> tool_markers(ToolFormat f) {
  switch (f) {
    case ToolFormat::hermes:
      return {"<tool_call>", "</tool_call>"};
    case ToolFormat::llama3:
      return {"<|python_tag|>"};
    case ToolFormat::mistral:
      return {"[TOOL_CALLS]", "[ARGS]"};
  }
  return {};
}

/// One call: OpenAI's tool_calls[i] (type "function").
struct ToolCall {
  std::string id, name, arguments;  ///< arguments: JSON text of an object
};

/// What the parser found: a piece of content, or one complete call.
struct ToolEvent {
  std::string content;
  std::optional<ToolCall> call;
};

}  // namespace kiln::serve

namespace kiln::detail::tools {

inline bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/// The end (one past) of the JSON object or array starting at s[i] ('{' or '['), counting brackets outside
/// strings; npos while it is incomplete. (Mismatched brackets are left to the JSON parser.)
inline std::size_t json_end(std::string_view s, std::size_t i) {
  int depth = 0;
  bool str = false, esc = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') str = false;
    } else if (c == '"') {
      str = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

/// How many bytes at the end of s are an incomplete UTF-8 character (held back so that a piece of
/// content is always whole characters).
inline std::size_t incomplete_utf8_tail(std::string_view s) {
  for (std::size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const auto c = static_cast<unsigned char>(s[s.size() - k]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const std::size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > k ? k : 0;
  }
  return 0;
}

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

/// A call object {"name": string, "arguments" or "parameters": object or a string holding an object} (an
/// optional "type": "function" and "id" aside) as a ToolCall without id; nullopt if it is not one.
inline std::optional<serve::ToolCall> call_of(const nlohmann::ordered_json& j) {
  if (!j.is_object()) return std::nullopt;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  serve::ToolCall c{.id = {}, .name = name->get<std::string>(), .arguments = "{}"};
  if (args != j.end()) {
    if (args->is_object()) {
      c.arguments = args->dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    } else if (args->is_string()) {
      const auto inner = nlohmann::ordered_json::parse(args->get<std::string>(), nullptr, false);
      if (!inner.is_object()) return std::nullopt;
      c.arguments = inner.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    } else {
      return std::nullopt;
    }
  }
  return c;
}

/// A JSON text holding one call object or a non-empty list of them; empty if it does not.
inline std::vector<serve::ToolCall> calls_of(std::string_view text) {
  const auto j = nlohmann::ordered_json::parse(text, nullptr, false);
  std::vector<serve::ToolCall> out;
  if (j.is_array()) {
    for (const auto& e : j) {
      auto c = call_of(e);
      if (!c) return {};
      out.push_back(std::move(*c));
    }
  } else if (auto c = call_of(j)) {
    out.push_back(std::move(*c));
  }
  return out;
}

}  // namespace kiln::detail::tools

namespace kiln::serve {

/// A fresh call id: "call_" and 24 letters or digits; Mistral's templates require exactly 9 letters or digits.
inline std::string make_call_id(ToolFormat f, std::mt19937_64& rng) {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = f == ToolFormat::mistral ? "" : "call_";
  for (int i = 0, n = f == ToolFormat::mistral ? 9 : 24; i < n; ++i) id += kAlnum[rng() % (sizeof(kAlnum) - 1)];
  return id;
}

/// How ToolCallParser reports calls.
struct ToolParseOptions {
  bool parallel = true;  ///< false: only the first call (OpenAI's parallel_tool_calls: false); later ones dropped
  std::optional<uint64_t> seed = std::nullopt;  ///< of the call ids (default: random)
};

/// Finds the calls in a reply fed piece by piece (see the top of this file).
class ToolCallParser {
 public:
  explicit ToolCallParser(ToolFormat f, ToolParseOptions o = {})
      : f_(f), parallel_(o.parallel), rng_(o.seed ? *o.seed : std::random_device{}()) {}

  /// Adds generated text; appends the content pieces and calls now known to `out`.
  void push(std::string_view text, std::vector<ToolEvent>& out) {
    buf_.append(text);
    scan(out, false);
  }
  /// The reply ended: what was held back is resolved (an unfinished call block is content).
  void finish(std::vector<ToolEvent>& out) {
    scan(out, true);
    if (!buf_.empty() && (calls_ == 0 || !detail::tools::trim(buf_).empty())) emit(out, buf_);
    buf_.clear();
  }
  /// The calls reported so far.
  std::size_t calls() const { return calls_; }

 private:
  // Position of the earliest start marker in buf_ from `from` and its length; npos if none.
  std::pair<std::size_t, std::size_t> find_start(std::size_t from) const {
    const std::string_view m = f_ == ToolFormat::hermes   ? "<tool_call>"
                               : f_ == ToolFormat::llama3 ? "<|python_tag|>"
                                                          : "[TOOL_CALLS]";
    return {buf_.find(m, from), m.size()};
  }
  // The longest suffix of buf_ that is a proper prefix of the start marker (held back: it may become one).
  std::size_t partial_marker_len() const {
    const std::string_view m = f_ == ToolFormat::hermes   ? "<tool_call>"
                               : f_ == ToolFormat::llama3 ? "<|python_tag|>"
                                                          : "[TOOL_CALLS]";
    for (std::size_t n = std::min(m.size() - 1, buf_.size()); n > 0; --n)
      if (std::string_view(buf_).substr(buf_.size() - n) == m.substr(0, n)) return n;
    return 0;
  }

  void emit(std::vector<ToolEvent>& out, std::string_view text) {
    if (text.empty()) return;
    for (char c : text) bare_ &= detail::tools::is_space(c);
    if (!out.empty() && !out.back().call) out.back().content.append(text);
    else out.push_back({std::string(text), std::nullopt});
  }
  void emit_calls(std::vector<ToolEvent>& out, std::vector<ToolCall> calls) {
    for (auto& c : calls) {
      if (!parallel_ && calls_ > 0) return;
      c.id = make_call_id(f_, rng_);
      out.push_back({{}, std::move(c)});
      ++calls_;
    }
  }

  // The call block starting at buf_[0] (its start marker, or for llama3 a bare '{'): {its length, the
  // calls}; length 0 while it is incomplete (at the end: the block is content), calls empty if malformed.
  std::pair<std::size_t, std::vector<ToolCall>> block(std::size_t marker, bool end) const {
    using namespace detail::tools;
    const std::string_view b(buf_);
    std::size_t i = marker;
    while (i < b.size() && is_space(b[i])) ++i;
    if (f_ == ToolFormat::hermes) {
      const std::size_t close = b.find("</tool_call>", marker);
      if (close != std::string_view::npos) return {close + 12, calls_of(b.substr(marker, close - marker))};
      if (!end) return {0, {}};
      // the reply ended inside the block: a complete JSON value there still counts
      const std::size_t e = i < b.size() && (b[i] == '{' || b[i] == '[') ? json_end(b, i) : std::string_view::npos;
      if (e == std::string_view::npos || !trim(b.substr(e)).empty()) return {b.size(), {}};
      return {b.size(), calls_of(b.substr(i, e - i))};
    }
    if (i == b.size()) return {end ? b.size() : 0, {}};
    if (f_ == ToolFormat::mistral && b[i] != '[' && b[i] != '{') {  // [TOOL_CALLS]name[ARGS]{...}
      const std::size_t args = b.find("[ARGS]", i);
      if (args == std::string_view::npos) {
        const std::string_view rest = b.substr(i);  // a name, perhaps followed by the start of "[ARGS]"
        const std::size_t br = rest.find('[');
        const bool may_be_name =
            rest.find_first_of("{\n") == std::string_view::npos &&
            (br == std::string_view::npos || std::string_view("[ARGS]").starts_with(rest.substr(br)));
        if (!may_be_name) return {i, {}};  // not a call: the marker is text
        return {end ? b.size() : 0, {}};
      }
      std::size_t a = args + 6;
      while (a < b.size() && is_space(b[a])) ++a;
      if (a == b.size()) return {end ? b.size() : 0, {}};
      if (b[a] != '{') return {i, {}};
      const std::size_t e = json_end(b, a);
      if (e == std::string_view::npos) return {end ? b.size() : 0, {}};
      const std::string_view name = trim(b.substr(i, args - i));
      for (char c : name)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return {i, {}};
      nlohmann::ordered_json j = {{"name", std::string(name)}};
      j["arguments"] = nlohmann::ordered_json::parse(b.substr(a, e - a), nullptr, false);
      auto c = call_of(j);
      return {e, c ? std::vector<ToolCall>{*c} : std::vector<ToolCall>{}};
    }
    if (b[i] != '{' && b[i] != '[') return {i, {}};  // not a call: the marker is text
    const std::size_t e = json_end(b, i);
    if (e == std::string_view::npos) return {end ? b.size() : 0, {}};
    return {e, calls_of(b.substr(i, e - i))};
  }

  void scan(std::vector<ToolEvent>& out, bool end) {
    using detail::tools::is_space;
    for (;;) {
      // llama3: a reply (or what follows a call) that starts with '{' may be a bare JSON call
      // (after a call, the whitespace that follows it is dropped)
      std::size_t lead = 0;
      if (after_call_ || (f_ == ToolFormat::llama3 && bare_)) {
        const bool semi = after_call_ && f_ == ToolFormat::llama3;
        while (lead < buf_.size() && (is_space(buf_[lead]) || (semi && buf_[lead] == ';'))) ++lead;
        if (lead == buf_.size() && !end) return;  // only whitespace so far: wait
        if (after_call_ && !semi) {
          buf_.erase(0, lead);
          lead = 0;
        }
      }
      std::size_t at = std::string::npos, mlen = 0;
      if (f_ == ToolFormat::llama3 && (bare_ || after_call_) && lead < buf_.size() && buf_[lead] == '{') {
        buf_.erase(0, lead);  // whitespace (and after a call, ';') before a bare call: dropped
        at = 0;
      } else {
        std::tie(at, mlen) = find_start(0);
      }
      after_call_ = false;
      if (at == std::string::npos) {  // plain text: pass it on, holding back what may start a call
        if (end) return;
        std::size_t e = buf_.size() - partial_marker_len();  // and the whitespace before it
        while (e > 0 && is_space(buf_[e - 1])) --e;
        std::size_t keep = buf_.size() - e;
        keep += detail::tools::incomplete_utf8_tail(std::string_view(buf_).substr(0, buf_.size() - keep));
        emit(out, std::string_view(buf_).substr(0, buf_.size() - keep));
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      // text before the marker (whitespace next to a call dropped), then the block
      std::size_t t = at;
      while (t > 0 && is_space(buf_[t - 1])) --t;
      emit(out, std::string_view(buf_).substr(0, t));
      buf_.erase(0, at);
      auto [len, calls] = block(mlen, end);
      if (len == 0) return;  // incomplete: wait for more
      if (calls.empty()) {   // not calls: the block is content, verbatim
        emit(out, std::string_view(buf_).substr(0, len));
      } else {
        emit_calls(out, std::move(calls));
        after_call_ = true;
      }
      buf_.erase(0, len);
      if (buf_.empty()) return;
    }
  }

  ToolFormat f_;
  bool parallel_;
  std::mt19937_64 rng_;
  std::string buf_;          // text not yet reported
  std::size_t calls_ = 0;    // calls reported
  bool bare_ = true;         // nothing but whitespace reported so far
  bool after_call_ = false;  // buf_ starts right after a call
};

/// The calls in a whole reply and the content around them (empty when there is none but whitespace).
struct ParsedReply {
  std::string content;
  std::vector<ToolCall> calls;
};
inline ParsedReply parse_tool_calls(std::string_view text, ToolFormat f, ToolParseOptions o = {}) {
  ToolCallParser p(f, o);
  std::vector<ToolEvent> ev;
  p.push(text, ev);
  p.finish(ev);
  ParsedReply r;
  for (auto& e : ev) {
    if (e.call) r.calls.push_back(std::move(*e.call));
    else r.content += e.content;
  }
  return r;
}

}  // namespace kiln::serve
