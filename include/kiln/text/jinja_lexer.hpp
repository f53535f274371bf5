// kiln/text/jinja_lexer.hpp - the lexer of kiln's Jinja interpreter (kiln/text/jinja.hpp).
//
// split_source() cuts the source into text, {{ }} and {% %} pieces (comments dropped) the way Jinja2's
// lexer does with the settings Hugging Face renders chat templates with (trim_blocks=True,
// lstrip_blocks=True, keep_trailing_newline=False): "-" on a tag strips the whitespace on that side, "+"
// turns lstrip/trim off, a block or comment tag alone on its line loses the indentation before it and
// the newline after it; newlines are normalized to "\n" and one trailing newline is dropped; {% raw %}
// bodies stay text. tokenize() turns a tag's inside into tokens (names, numbers, Python-escaped strings,
// operators). Errors are kiln::FormatError naming the construct and the line.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"

namespace kiln::jinja {
namespace detail {

struct Tok {
  enum class T : uint8_t { name, str, integer, floating, op, end };
  T t;
  std::string s;
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

inline bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

inline void append_utf8(std::string& o, char32_t cp) {
  if (cp < 0x80) o += char(cp);
  else if (cp < 0x800) o += char(0xC0 | (cp >> 6)), o += char(0x80 | (cp & 0x3F));
  else if (cp < 0x10000)
    o += char(0xE0 | (cp >> 12)), o += char(0x80 | ((cp >> 6) & 0x3F)), o += char(0x80 | (cp & 0x3F));
  else
    o += char(0xF0 | (cp >> 18)), o += char(0x80 | ((cp >> 12) & 0x3F)), o += char(0x80 | ((cp >> 6) & 0x3F)),
        o += char(0x80 | (cp & 0x3F));
}

/// Tokens of one tag's inside (Jinja names, numbers, Python-escaped strings, operators).
inline std::vector<Tok> tokenize(std::string_view s, int line) {
  std::vector<Tok> out;
  std::size_t p = 0;
  while (p < s.size()) {
    const char c = s[p];
    if (is_ws(c)) {
      if (c == '\n') ++line;
      ++p;
      continue;
    }
    Tok t{Tok::T::op, {}, 0, 0, line};
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t e = p;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      t.t = Tok::T::name;
      t.s = s.substr(p, e - p);
      p = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t e = p;
      bool fl = false;
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
        fl = true;
        for (++e; e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_');) ++e;
      }
      if (e < s.size() && (s[e] == 'e' || s[e] == 'E')) {
        std::size_t q = e + 1;
        if (q < s.size() && (s[q] == '+' || s[q] == '-')) ++q;
        if (q < s.size() && std::isdigit(static_cast<unsigned char>(s[q]))) {
          fl = true;
          for (e = q; e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]));) ++e;
        }
      }
      std::string num;
      for (std::size_t k = p; k < e; ++k)
        if (s[k] != '_') num += s[k];
      if (fl) t.t = Tok::T::floating, t.f = std::stod(num);
      else t.t = Tok::T::integer, t.i = std::stoll(num);
      p = e;
    } else if (c == '\'' || c == '"') {
      std::string v;
      std::size_t e = p + 1;
      for (;; ++e) {
        if (e >= s.size()) fail<FormatError>("jinja: unterminated string literal at line ", line);
        if (s[e] == c) break;
        if (s[e] != '\\' || e + 1 >= s.size()) {
          if (s[e] == '\n') ++line;
          v += s[e];
          continue;
        }
        const char x = s[++e];
        const auto hex = [&](int n) {
          if (e + n >= s.size() + 0 && e + n > s.size() - 1 + 1) fail<FormatError>("jinja: bad escape at line ", line);
          const char32_t cp =
              static_cast<char32_t>(std::stoul(std::string(s.substr(e + 1, std::size_t(n))), nullptr, 16));
          e += std::size_t(n);
          append_utf8(v, cp);
        };
        switch (x) {
          case 'n':
            v += '\n';
            break;
          case 't':
            v += '\t';
            break;
          case 'r':
            v += '\r';
            break;
          case 'a':
            v += '\a';
            break;
          case 'b':
            v += '\b';
            break;
          case 'f':
            v += '\f';
            break;
          case 'v':
            v += '\v';
            break;
          case '0':
            v += '\0';
            break;
          case '\\':
          case '\'':
          case '"':
            v += x;
            break;
          case '\n':
            ++line;
            break;  // line continuation
          case 'x':
            hex(2);
            break;
          case 'u':
            hex(4);
            break;
          case 'U':
            hex(8);
            break;
          default:
            v += '\\';
            v += x;
            break;  // Python keeps unknown escapes
        }
      }
      t.t = Tok::T::str;
      t.s = std::move(v);
      p = e + 1;
    } else {
      static constexpr std::string_view ops2[] = {"**", "//", "==", "!=", "<=", ">="};
      t.s = std::string(1, c);
      for (auto o : ops2)
        if (s.substr(p, 2) == o) t.s = std::string(o);
      if (std::string_view("+-*/%~()[]{}.,:|<>=!").find(c) == std::string_view::npos)
        fail<FormatError>("jinja: unexpected character '", std::string(1, c), "' at line ", line);
      p += t.s.size();
    }
    out.push_back(std::move(t));
  }
  out.push_back(Tok{Tok::T::end, {}, 0, 0, line});
  return out;
}

/// One piece of the source: text, an expression tag or a statement tag (its tokens).
struct Piece {
  enum class T : uint8_t { text, expr, stmt } t;
  std::string text;
  std::vector<Tok> toks;
  int line;
};

inline std::vector<Piece> split_source(std::string_view src0) {
  // Jinja normalizes newlines and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  for (std::size_t k = 0; k < src0.size(); ++k) {
    if (src0[k] == '\r') {
      src += '\n';
      if (k + 1 < src0.size() && src0[k + 1] == '\n') ++k;
    } else {
      src += src0[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  std::vector<Piece> out;
  std::size_t pos = 0;
  int line = 1;
  bool line_starting = true;
  const auto count_lines = [](std::string_view t) { return int(std::count(t.begin(), t.end(), '\n')); };
  while (true) {
    std::size_t open = pos;
    while (true) {
      open = src.find('{', open);
      if (open == std::string::npos ||
          (open + 1 < src.size() && (src[open + 1] == '{' || src[open + 1] == '%' || src[open + 1] == '#')))
        break;
      ++open;
    }
    std::string text = src.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Piece::T::text, text, {}, line});
      break;
    }
    const char kind = src[open + 1];
    const char mod = open + 2 < src.size() ? src[open + 2] : 0;
    const int text_line = line;
    line += count_lines(text);
    if (mod == '-') {
      while (!text.empty() && is_ws(text.back())) text.pop_back();
    } else if (mod != '+' && kind != '{') {  // lstrip_blocks
      const std::size_t l = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if ((l > 0 || line_starting) && text.find_first_not_of(" \t", l) == std::string::npos) text.resize(l);
    }
    if (!text.empty()) out.push_back({Piece::T::text, text, {}, text_line});
    std::size_t b = open + 2 + (mod == '-' || mod == '+' ? 1 : 0);
    // Find the closing delimiter outside string literals.
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    std::size_t e = b;
    if (kind == '#') {
      e = src.find(close, b);
      if (e == std::string::npos) fail<FormatError>("jinja: unclosed comment {# at line ", line);
    } else {
      char q = 0;
      for (; e < src.size(); ++e) {
        if (q) {
          if (src[e] == '\\') ++e;
          else if (src[e] == q) q = 0;
        } else if (src[e] == '\'' || src[e] == '"') {
          q = src[e];
        } else if (src.compare(e, 2, close) == 0) {
          break;
        }
      }
      if (e >= src.size()) fail<FormatError>("jinja: unclosed tag '{", std::string(1, kind), "' at line ", line);
    }
    std::size_t inner_end = e;
    const bool strip_after = inner_end > b && src[inner_end - 1] == '-';
    const bool keep_after = inner_end > b && src[inner_end - 1] == '+' && kind != '{';
    if (strip_after || keep_after) --inner_end;
    const std::string_view inner = std::string_view(src).substr(b, inner_end - b);
    if (kind != '#') out.push_back({kind == '{' ? Piece::T::expr : Piece::T::stmt, {}, tokenize(inner, line), line});
    line += count_lines(src.substr(open, e + 2 - open));
    pos = e + 2;
    line_starting = false;
    if (strip_after) {
      while (pos < src.size() && is_ws(src[pos])) {
        line_starting = src[pos] == '\n';
        if (src[pos] == '\n') ++line;
        ++pos;
      }
    } else if (kind != '{' && !keep_after && pos < src.size() && src[pos] == '\n') {  // trim_blocks
      ++pos, ++line;
      line_starting = true;
    }
    // {% raw %}: everything up to {% endraw %} is text.
    if (kind == '%' && out.back().toks.size() == 2 && out.back().toks[0].s == "raw" &&
        out.back().toks[0].t == Tok::T::name) {
      out.pop_back();
      std::size_t r = pos;
      while (true) {
        r = src.find("{%", r);
        if (r == std::string::npos) fail<FormatError>("jinja: {% raw %} without {% endraw %} at line ", line);
        std::size_t q = r + 2;
        if (q < src.size() && (src[q] == '-' || src[q] == '+')) ++q;
        while (q < src.size() && is_ws(src[q])) ++q;
        if (src.compare(q, 6, "endraw") == 0) break;
        r += 2;
      }
      std::string body = src.substr(pos, r - pos);
      if (src[r + 2] == '-')
        while (!body.empty() && is_ws(body.back())) body.pop_back();
      out.push_back({Piece::T::text, body, {}, line});
      const std::size_t ce = src.find("%}", r);
      line += count_lines(src.substr(pos, ce + 2 - pos));
      pos = ce + 2;
      if (src[ce - 1] == '-')
        while (pos < src.size() && is_ws(src[pos])) ++pos;
      else if (pos < src.size() && src[pos] == '\n') ++pos;
    }
  }
  return out;
}

}  // namespace detail
}  // namespace kiln::jinja
