// kiln/text/chat_recognize.hpp - what kiln::ChatTemplate (chat.hpp) uses to recognise the template families
// it renders by hand: the texts' normalisation up to what Jinja ignores, Python's str.strip, the hashes of the
// official templates, the ChatML shapes and the end-of-turn markers. Internal (kiln::detail::chat).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kiln {
namespace detail::chat {

/// End-of-turn texts a Jinja template's reply stops at, when the template's text contains them.
inline constexpr std::string_view kStopMarkers[] = {"<|im_end|>",
                                                    "<end_of_turn>",
                                                    "<|eot_id|>",
                                                    "<|eom_id|>",
                                                    "<|end|>",
                                                    "<|END_OF_TURN_TOKEN|>",
                                                    "<turn|>",
                                                    "<|end_of_text|>",
                                                    "<|return|>",
                                                    "<|call|>",
                                                    "<｜end▁of▁sentence｜>",
                                                    "<|end_of_msg|>",
                                                    "<|role_end|>"};

inline constexpr std::string_view kSmolLM2System =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
inline constexpr std::string_view kQwen25System =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// The canonical ChatML templates (HF's former default_chat_template; SmolLM2's and Qwen2's with a
// default system turn, PROMPT standing for its text).
inline constexpr std::string_view kChatMLLoop =
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
inline constexpr std::string_view kChatMLDefaultHead =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n";
inline constexpr std::string_view kChatMLDefaultTail = "<|im_end|>\\n' }}{% endif %}";

/// Python's str.isspace() for one code point (what Jinja's trim filter strips).
inline bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/// Decodes the well-formed UTF-8 character at s[i]; {code point, length}, length 0 if ill-formed.
inline std::pair<char32_t, std::size_t> decode_at(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned c0 = b(0);
  if (c0 < 0x80) return {c0, 1};
  const std::size_t n = c0 >= 0xF0 ? 4 : c0 >= 0xE0 ? 3 : c0 >= 0xC2 ? 2 : 0;
  if (n == 0 || c0 > 0xF4 || i + n > s.size()) return {0, 0};
  char32_t cp = c0 & (0x7F >> n);
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return {0, 0};
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  const char32_t min = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0, 0};
  return {cp, n};
}

/// Python str.strip() with no argument (Jinja's `trim`): Unicode whitespace off both ends. Ill-formed
/// UTF-8 counts as non-space.
inline std::string_view py_strip(std::string_view s) {
  std::size_t a = 0;
  while (a < s.size()) {
    const auto [cp, n] = decode_at(s, a);
    if (n == 0 || !is_py_space(cp)) break;
    a += n;
  }
  std::size_t e = s.size();
  while (e > a) {
    std::size_t st = e - 1;  // start of the last character: back over continuation bytes (at most 3)
    while (st > a && e - st < 4 && (static_cast<unsigned char>(s[st]) & 0xC0) == 0x80) --st;
    const auto [cp, n] = decode_at(s, st);
    if (n != e - st || !is_py_space(cp)) break;
    e = st;
  }
  return s.substr(a, e - a);
}

/// Python str.strip / lstrip / rstrip with the character set "\n".
inline std::string_view lstrip_nl(std::string_view s) {
  const auto a = s.find_first_not_of('\n');
  return a == std::string_view::npos ? std::string_view() : s.substr(a);
}
inline std::string_view rstrip_nl(std::string_view s) {
  const auto e = s.find_last_not_of('\n');
  return e == std::string_view::npos ? std::string_view() : s.substr(0, e + 1);
}
inline std::string_view strip_nl(std::string_view s) { return rstrip_nl(lstrip_nl(s)); }

/// Jinja source with the whitespace inside {{ }} and {% %} tags removed (outside string literals), every
/// string literal rewritten as its value in single quotes with \n \t \r \\ \' escaped, and one trailing
/// newline dropped (Jinja's keep_trailing_newline = False): two templates with equal normal forms render
/// alike. Text outside tags and comments ({# #}) are kept verbatim.
inline std::string normalize(std::string_view t) {
  std::string o;
  o.reserve(t.size());
  std::size_t i = 0;
  while (i < t.size()) {
    const bool expr = t.compare(i, 2, "{{") == 0, stmt = t.compare(i, 2, "{%") == 0;
    if (!expr && !stmt) {
      o += t[i++];
      continue;
    }
    const std::string_view close = expr ? "}}" : "%}";
    o.append(t.substr(i, 2));
    i += 2;
    while (i < t.size() && t.compare(i, 2, close) != 0) {
      const char c = t[i];
      if (c == '\'' || c == '"') {  // a string literal: its value, re-quoted canonically
        o += '\'';
        for (++i; i < t.size() && t[i] != c; ++i) {
          char v = t[i];
          if (v == '\\' && i + 1 < t.size()) {
            const char e = t[++i];
            if (e == 'n') v = '\n';
            else if (e == 't') v = '\t';
            else if (e == 'r') v = '\r';
            else if (e == '\\' || e == '\'' || e == '"') v = e;
            else {  // other escapes (\x, \u, ...) stay as written: such templates just do not match
              o += '\\';
              v = e;
            }
          }
          if (v == '\n') o += "\\n";
          else if (v == '\t') o += "\\t";
          else if (v == '\r') o += "\\r";
          else if (v == '\\' || v == '\'') o.append(1, '\\').append(1, v);
          else o += v;
        }
        if (i < t.size()) {
          o += '\'';
          ++i;
        }
      } else {
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') o += c;
        ++i;
      }
    }
    if (i < t.size()) {
      o.append(close);
      i += 2;
    }
  }
  if (!o.empty() && o.back() == '\n') o.pop_back();
  return o;
}

/// The value of a Jinja single-quoted string literal's body; nullopt if it holds an unescaped quote or
/// an escape other than \n \t \r \\ \' \".
inline std::optional<std::string> unescape_literal(std::string_view body) {
  std::string o;
  for (std::size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == '\'') return std::nullopt;
    if (c != '\\') {
      o += c;
      continue;
    }
    if (++i == body.size()) return std::nullopt;
    switch (body[i]) {
      case 'n':
        o += '\n';
        break;
      case 't':
        o += '\t';
        break;
      case 'r':
        o += '\r';
        break;
      case '\\':
      case '\'':
      case '"':
        o += body[i];
        break;
      default:
        return std::nullopt;
    }
  }
  return o;
}

inline bool contains(std::string_view s, std::string_view x) { return s.find(x) != std::string_view::npos; }

/// 64-bit FNV-1a, for recognising a normalized template text.
constexpr uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

/// The official template texts kiln recognises, by fnv1a(normalize(text)) (tests/text/test_chat.cpp checks
/// them against the texts in tests/fixtures/text/chat_*.json, whose sources
/// scripts/fixtures/make_chat_fixtures.py cites).
struct KnownTemplate {
  uint64_t hash;
  std::string_view family, source;
};
inline constexpr KnownTemplate kKnownTemplates[] = {
    {0xb78c410970b98d39ull, "qwen2.5", "Qwen/Qwen2.5-*-Instruct tokenizer_config.json"},
    {0xf2096fdff98685e8ull, "qwen3", "Qwen/Qwen3-* (hybrid thinking) tokenizer_config.json"},
    {0x816794faa50831b5ull, "gemma3", "google/gemma-3-*-it tokenizer_config.json"},
};

}  // namespace detail::chat

}  // namespace kiln
