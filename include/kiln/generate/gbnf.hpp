// kiln/generate/gbnf.hpp - llama.cpp's GBNF grammar text as a Grammar (generate/grammar.hpp), for
// constrained decoding with a grammar the user writes (kiln-server's `grammar` field, kiln-generate --grammar).
//
//   auto g = kiln::gbnf_grammar(R"(root ::= "yes" | "no" | [0-9]{1,3})");
//
// The language is llama.cpp's (its grammars/README.md): rules `name ::= alternatives` (names of letters,
// digits and '-'; a rule ends at a newline outside parentheses), alternatives `|`, grouping `( )`, literals
// "..." and character classes [...] / [^...] with ranges, the escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH
// \UHHHHHHHH, `.` (any character), repetition `*` `+` `?` `{m}` `{m,}` `{m,n}`, comments from '#' to the end
// of the line, and `root` as the start. Characters are Unicode code points: a literal is its UTF-8 bytes, a
// class (and `.`) is the UTF-8 encodings of its code points (surrogates excluded: only valid UTF-8 matches),
// so the byte-level matcher takes exactly the UTF-8 text of the strings llama.cpp's matcher takes.
// Tokens (llama.cpp's grammars/README.md): <[id]> is the token id taken whole, !<[id]> any one token but it,
// and <text> / !<text> the same for the token whose text is exactly <text> (brackets included: <think>,
// <|channel|>), which needs the vocabulary (GbnfOptions::vocabulary). A token is never matched by its text,
// nor its text by the token (generate/constraint.hpp), so a grammar can ask for a control token that no
// client's text can forge. An id beyond the vocabulary is an error here when the vocabulary is given, else
// when the grammar meets one (kiln::Constraint).
//
// Errors name the line and column and what was wrong: an unknown escape, an unterminated literal or class,
// a rule used but never defined, a rule defined twice (llama.cpp silently keeps the last definition), no
// `root` rule (or one that matches no text), an empty class, a repetition with nothing before it or more
// than 2000 times (llama.cpp's limits; a maximum beyond it means no maximum, as there), left recursion
// (Grammar::finish's refusal, with where the rule is written; a cycle through repetitions of items that can
// be empty, such as `( [x]* )*`, is not left recursion there and is taken, as llama.cpp does).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/generate/grammar.hpp"
#include "kiln/text/tokenizer.hpp"

namespace kiln {

struct GbnfOptions {
  std::string root = "root";  ///< the start rule
  /// The vocabulary of <text> token references, and the bound of <[id]> ones (null: <text> is an error,
  /// ids are checked by kiln::Constraint).
  const Tokenizer* vocabulary = nullptr;
};

namespace detail::gbnf {

using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;  // one UTF-8 sequence: a byte range per position

inline std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12)), s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18)), s += char(0x80 | ((cp >> 12) & 0x3F)), s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// The code points lo..hi (no surrogates inside) as UTF-8 byte-range sequences: split where the encoded
// length changes, then where a continuation byte would not run over its full 80-BF range, until each piece
// is a product of per-byte ranges (the construction of RE2 and Rust's regex-syntax).
inline void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRanges>& out) {
  if (lo > hi) return;
  for (uint32_t b : {0x7Fu, 0x7FFu, 0xFFFFu})
    if (lo <= b && hi > b) {
      utf8_sequences(lo, b, out);
      utf8_sequences(b + 1, hi, out);
      return;
    }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = utf8(lo), b = utf8(hi);
  ByteRanges seq;
  for (std::size_t i = 0; i < a.size(); ++i) seq.emplace_back(uint8_t(a[i]), uint8_t(b[i]));
  out.push_back(std::move(seq));
}

class Parser {
 public:
  using Sym = Grammar::Sym;
  Parser(std::string_view src, Grammar& g, const Tokenizer* vocab = nullptr) : src_(src), g_(g), vocab_(vocab) {}

  void parse() {
    space(true);
    while (pos_ < src_.size()) rule();
  }
  // Every used rule defined; the root's id.
  uint32_t check(const std::string& root) {
    for (const auto& [name, r] : rules_)
      if (!r.defined) error_at(r.used_at, "rule '", name, "' is used but never defined");
    const auto it = rules_.find(root);
    if (it == rules_.end()) fail("GBNF grammar: there is no '", root, "' rule (the start of the grammar)");
    return it->second.id;
  }
  // Where a rule (named as Grammar names it) is written, for finish()'s refusals.
  std::string where(const std::string& message) const {
    for (const auto& [name, at] : written_)
      if (message.find("'" + name + "'") != std::string::npos) return location(at);
    return {};
  }

 private:
  struct Rule {
    uint32_t id = 0;
    bool defined = false;
    std::size_t used_at = 0, defined_at = 0;
  };

  std::string location(std::size_t at) const {
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < at && i < src_.size(); ++i) {
      if (src_[i] == '\n') ++line, col = 1;
      else ++col;
    }
    return concat("line ", line, ", column ", col);
  }
  template <class... Args>
  [[noreturn]] void error_at(std::size_t at, const Args&... args) const {
    std::string near(src_.substr(std::min(at, src_.size()), 24));
    if (const auto nl = near.find_first_of("\r\n"); nl != std::string::npos) near.resize(nl);
    fail("GBNF grammar, ", location(at), ": ", args...,
         at >= src_.size() ? std::string(" (at the end)") : concat(" (at \"", near, "\")"));
  }
  template <class... Args>
  static std::string concat(const Args&... args) {
    return detail::concat(args...);
  }

  char peek(std::size_t k = 0) const { return pos_ + k < src_.size() ? src_[pos_ + k] : '\0'; }
  bool at_end() const { return pos_ >= src_.size(); }
  static bool word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
  }

  // Spaces, tabs and comments; newlines too where newline_ok (inside parentheses, after '|' and '::=').
  void space(bool newline_ok) {
    while (!at_end()) {
      const char c = peek();
      if (c == '#') {
        while (!at_end() && peek() != '\r' && peek() != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string name() {
    const std::size_t start = pos_;
    while (word(peek())) ++pos_;
    if (pos_ == start) error_at(start, "expected a rule name (letters, digits and '-')");
    return std::string(src_.substr(start, pos_ - start));
  }

  Rule& named(const std::string& n, std::size_t at) {
    auto [it, fresh] = rules_.try_emplace(n);
    if (fresh) {
      it->second.id = g_.rule(n);
      it->second.used_at = at;
    }
    return it->second;
  }

  void rule() {
    const std::size_t start = pos_;
    const std::string n = name();
    space(false);
    if (src_.substr(pos_, 3) != "::=") error_at(pos_, "expected '::=' after the rule name '", n, "'");
    Rule& r = named(n, start);
    if (r.defined) error_at(start, "rule '", n, "' is defined twice (first at ", location(r.defined_at), ")");
    r.defined = true;
    r.defined_at = start;
    written_.emplace_back(n, start);
    pos_ += 3;
    space(true);
    alternatives(r.id, n, false);
    if (peek() == '\r') pos_ += peek(1) == '\n' ? 2 : 1;
    else if (peek() == '\n') ++pos_;
    else if (!at_end()) error_at(pos_, "expected a newline or the end after rule '", n, "'");
    space(true);
  }

  void alternatives(uint32_t id, const std::string& n, bool nested) {
    g_.alt(id, sequence(n, nested));
    while (peek() == '|') {
      ++pos_;
      space(true);
      g_.alt(id, sequence(n, nested));
    }
  }

  // One code point of a literal or class: an escape or a UTF-8 character.
  uint32_t character() {
    const std::size_t at = pos_;
    if (peek() == '\\') {
      const char e = peek(1);
      pos_ += 2;
      switch (e) {
        case 'x':
          return hex(2, at);
        case 'u':
          return hex(4, at);
        case 'U':
          return hex(8, at);
        case 't':
          return '\t';
        case 'r':
          return '\r';
        case 'n':
          return '\n';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
          return uint8_t(e);
        default:
          error_at(at, "unknown escape '\\", e == '\0' ? std::string() : std::string(1, e),
                   "' (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\- \\xHH \\uHHHH \\UHHHHHHHH)");
      }
    }
    const uint8_t b = uint8_t(peek());
    const int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + std::size_t(len) > src_.size()) error_at(at, "the grammar is not valid UTF-8");
    uint32_t cp = len == 1 ? b : b & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const uint8_t c = uint8_t(src_[pos_ + std::size_t(i)]);
      if ((c & 0xC0) != 0x80) error_at(at, "the grammar is not valid UTF-8");
      cp = (cp << 6) | (c & 0x3F);
    }
    pos_ += std::size_t(len);
    return cp;
  }
  uint32_t hex(int digits, std::size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) error_at(at, "expected ", digits, " hex digits after '\\", src_[at + 1], "'");
      v = v << 4 | uint32_t(d);
      ++pos_;
    }
    return v;
  }

  // A literal's code point as bytes (a surrogate or beyond U+10FFFF has no UTF-8 form).
  void literal_char(std::vector<Sym>& seq, uint32_t cp, std::size_t at) {
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      error_at(at, "U+", std::hex, cp, " is not a character UTF-8 can encode");
    for (char c : utf8(cp)) seq.push_back(g_.bytes(ByteSet{}.add(uint8_t(c))));
  }

  // A set of code points (sorted, merged ranges) as one symbol: a byte set when all are ASCII, else a rule
  // with one alternative per UTF-8 byte-range sequence (the one-byte ones merged into one set).
  Sym code_points(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negate, const std::string& n) {
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (auto [lo, hi] : ranges) {
      hi = std::min(hi, 0x10FFFFu);
      if (lo > hi) continue;
      if (!merged.empty() && lo <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, hi);
      else merged.emplace_back(lo, hi);
    }
    if (negate) {
      std::vector<std::pair<uint32_t, uint32_t>> inv;
      uint32_t next = 0;
      for (auto [lo, hi] : merged) {
        if (lo > next) inv.emplace_back(next, lo - 1);
        next = hi + 1;
      }
      if (next <= 0x10FFFF) inv.emplace_back(next, 0x10FFFF);
      merged.swap(inv);
    }
    std::vector<std::pair<uint32_t, uint32_t>> valid;  // without the surrogates
    for (auto [lo, hi] : merged) {
      if (lo < 0xD800) valid.emplace_back(lo, std::min(hi, 0xD7FFu));
      if (hi > 0xDFFF) valid.emplace_back(std::max(lo, 0xE000u), hi);
    }
    const auto cached = classes_.find(valid);
    if (cached != classes_.end()) return cached->second;
    std::vector<ByteRanges> seqs;
    for (auto [lo, hi] : valid) utf8_sequences(lo, hi, seqs);
    ByteSet ascii;
    bool wide = false;
    for (const ByteRanges& s : seqs) {
      if (s.size() == 1) ascii.add(s[0].first, s[0].second);
      else wide = true;
    }
    Sym out = g_.bytes(ascii);
    if (wide) {
      const uint32_t r = g_.rule(concat(n, "_chars_", classes_.size()));
      if (!ascii.empty()) g_.alt(r, {g_.bytes(ascii)});
      for (const ByteRanges& s : seqs) {
        if (s.size() == 1) continue;
        std::vector<Sym> alt;
        for (auto [lo, hi] : s) alt.push_back(g_.bytes(ByteSet::range(lo, hi)));
        g_.alt(r, alt);
      }
      out = g_.ref(r);
    }
    classes_.emplace(std::move(valid), out);
    return out;
  }

  uint32_t fresh_rule(const std::string& n, std::size_t at) {
    const std::string name = concat(n, "_", ++generated_);
    written_.emplace_back(name, at);
    return g_.rule(name);
  }

  // seq[from..] repeated lo to hi times (hi < 0: unbounded), llama.cpp's rewrite: S{m,n} -> S..S (m times)
  // then n-m nested optional rules; S{m,} -> S..S then R ::= S R | (empty).
  // n_rules: how many rules the item made (its groups' and repetitions'), times its repetitions so far: llama.cpp
  // refuses a product above 2000 (nested bounded repetitions multiply), and so does kiln, to take the same
  // grammars.
  void repeat(std::vector<Sym>& seq, std::size_t from, int64_t lo, int64_t hi, const std::string& n, std::size_t at,
              uint64_t& n_rules) {
    if (from >= seq.size()) error_at(at, "'", src_[at], "' has nothing before it to repeat");
    if (lo > 2000) error_at(at, "a repetition of more than 2000 times (llama.cpp's limit)");
    if (hi > 2000) hi = -1;  // (llama.cpp: a maximum beyond its limit is no maximum)
    if (hi >= 0 && hi < lo) error_at(at, "the repetition {", lo, ",", hi, "} has its maximum below its minimum");
    const uint64_t times = hi > 0 ? uint64_t(hi) : lo > 0 ? uint64_t(lo) : 1;
    if (n_rules * times > 2000)
      error_at(at, "nested repetitions make more than 2000 rules (", n_rules, " rules repeated ", times,
               " times; llama.cpp's limit)");
    n_rules *= times;
    const std::vector<Sym> item(seq.begin() + std::ptrdiff_t(from), seq.end());
    seq.resize(from);
    for (int64_t i = 0; i < lo; ++i) seq.insert(seq.end(), item.begin(), item.end());
    if (hi < 0) {
      const uint32_t r = fresh_rule(n, at);
      std::vector<Sym> alt = item;
      alt.push_back(g_.ref(r));
      g_.alt(r, alt);
      g_.alt(r, {});
      seq.push_back(g_.ref(r));
      return;
    }
    uint32_t last = 0;
    for (int64_t i = 0; i < hi - lo; ++i) {
      const uint32_t r = fresh_rule(n, at);
      std::vector<Sym> alt = item;
      if (i > 0) alt.push_back(g_.ref(last));
      g_.alt(r, alt);
      g_.alt(r, {});
      last = r;
    }
    if (hi > lo) seq.push_back(g_.ref(last));
  }

  int64_t integer() {
    const std::size_t start = pos_;
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = std::min<int64_t>(v * 10 + (peek() - '0'), int64_t(1) << 40);
      ++pos_;
    }
    if (pos_ == start) error_at(start, "expected a number");
    return v;
  }

  std::vector<Sym> sequence(const std::string& n, bool nested) {
    std::vector<Sym> seq;
    std::size_t last = 0;  // where the last item starts (repetitions apply to it)
    bool have_last = false;
    uint64_t n_rules = 1;  // the rules the last item made (repeat())
    while (!at_end()) {
      const char c = peek();
      const std::size_t at = pos_;
      if (c == '"') {
        ++pos_;
        last = seq.size(), have_last = true, n_rules = 1;
        while (peek() != '"') {
          if (at_end()) error_at(at, "unterminated literal (no closing '\"')");
          const std::size_t cat = pos_;
          literal_char(seq, character(), cat);
        }
        ++pos_;
        space(nested);
      } else if (c == '[') {
        ++pos_;
        const bool negate = peek() == '^';
        if (negate) ++pos_;
        std::vector<std::pair<uint32_t, uint32_t>> ranges;
        while (peek() != ']') {
          if (at_end()) error_at(at, "unterminated character class (no closing ']')");
          const std::size_t cat = pos_;
          const uint32_t lo = character();
          uint32_t hi = lo;
          if (peek() == '-' && peek(1) != ']') {
            ++pos_;
            if (at_end()) error_at(at, "unterminated character class (no closing ']')");
            hi = character();
            if (hi < lo) error_at(cat, "the range's end is below its start");
          }
          ranges.emplace_back(lo, hi);
        }
        if (ranges.empty()) error_at(at, "empty character class");
        ++pos_;
        last = seq.size(), have_last = true, n_rules = 1;
        seq.push_back(code_points(std::move(ranges), negate, n));
        space(nested);
      } else if (c == '.') {
        ++pos_;
        last = seq.size(), have_last = true, n_rules = 1;
        seq.push_back(code_points({}, true, n));
        space(nested);
      } else if (c == '<' || c == '!') {
        last = seq.size(), have_last = true, n_rules = 1;
        seq.push_back(token_ref());
        space(nested);
      } else if (word(c)) {
        const std::string ref = name();
        last = seq.size(), have_last = true, n_rules = 1;
        seq.push_back(g_.ref(named(ref, at).id));
        space(nested);
      } else if (c == '(') {
        ++pos_;
        space(true);
        const std::size_t before = rules_.size() + std::size_t(generated_);
        const uint32_t r = fresh_rule(n, at);
        alternatives(r, n, true);
        if (peek() != ')') error_at(at, "unclosed '(' (expected ')' at ", location(pos_), ")");
        ++pos_;
        last = seq.size(), have_last = true;
        n_rules = rules_.size() + std::size_t(generated_) - before;
        seq.push_back(g_.ref(r));
        space(nested);
      } else if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        space(nested);
        repeat(seq, have_last ? last : seq.size(), c == '+' ? 1 : 0, c == '?' ? 1 : -1, n, at, n_rules);
      } else if (c == '{') {
        ++pos_;
        space(nested);
        const int64_t lo = integer();
        int64_t hi = lo;
        space(nested);
        if (peek() == ',') {
          ++pos_;
          space(nested);
          hi = peek() >= '0' && peek() <= '9' ? integer() : -1;
          space(nested);
        }
        if (peek() != '}') error_at(pos_, "expected '}' to close the repetition {m}, {m,} or {m,n}");
        ++pos_;
        space(nested);
        repeat(seq, have_last ? last : seq.size(), lo, hi, n, at, n_rules);
      } else {
        break;
      }
    }
    return seq;
  }

  // <[id]>, !<[id]>, <text>, !<text>
  Sym token_ref() {
    const std::size_t at = pos_;
    const bool negated = peek() == '!';
    if (negated) ++pos_;
    if (peek() != '<') error_at(pos_, "expected '<' after '!' (a token reference: !<[id]> or !<text>)");
    int64_t id = -1;
    if (peek(1) == '[') {
      pos_ += 2;
      const std::size_t num = pos_;
      while (peek() >= '0' && peek() <= '9') ++pos_;
      if (pos_ == num) error_at(num, "expected a token id (digits) in <[id]>");
      if (pos_ - num > 10) error_at(num, "the token id is too big");
      id = std::stoll(std::string(src_.substr(num, pos_ - num)));
      if (id > INT32_MAX) error_at(num, "the token id is too big");
      if (peek() != ']' || peek(1) != '>') error_at(pos_, "expected ']>' to close the token reference <[id]>");
      pos_ += 2;
      if (vocab_ && std::size_t(id) >= vocab_->size())
        error_at(at, "token id ", id, " is beyond the vocabulary's ", vocab_->size(), " tokens");
    } else {
      const std::size_t close = src_.find_first_of(">\n", pos_ + 1);
      if (close == std::string_view::npos || src_[close] != '>')
        error_at(at, "unterminated token reference (no closing '>' on the line)");
      const std::string_view text = src_.substr(pos_, close + 1 - pos_);
      if (!vocab_) error_at(at, "the token reference ", text, " needs the model's vocabulary (or write <[id]>)");
      id = vocab_->find(text);
      if (id < 0) error_at(at, "'", text, "' is not one token of the vocabulary");
      pos_ = close + 1;
    }
    return negated ? g_.token_not(int32_t(id)) : g_.token(int32_t(id));
  }

  std::string_view src_;
  Grammar& g_;
  const Tokenizer* vocab_ = nullptr;
  std::size_t pos_ = 0;
  std::map<std::string, Rule, std::less<>> rules_;
  std::vector<std::pair<std::string, std::size_t>> written_;  // every rule's name and where it is written
  std::map<std::vector<std::pair<uint32_t, uint32_t>>, Sym> classes_;
  int generated_ = 0;
};

}  // namespace detail::gbnf

/// The grammar of a GBNF text (see the top of this file); kiln::Error naming the line and column if malformed.
inline std::shared_ptr<const Grammar> gbnf_grammar(std::string_view source, const GbnfOptions& options = {}) {
  auto g = std::make_shared<Grammar>();
  detail::gbnf::Parser p(source, *g, options.vocabulary);
  p.parse();
  const uint32_t root = p.check(options.root);
  try {
    g->finish(root);
  } catch (const Error& e) {
    const std::string at = p.where(e.what());
    fail("GBNF grammar: ", e.what(), at.empty() ? std::string() : " (written at " + at + ")");
  }
  return g;
}

}  // namespace kiln
