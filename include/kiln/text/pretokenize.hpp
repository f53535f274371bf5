// kiln/text/pretokenize.hpp - the pre-tokenizers of byte-level BPE: text -> pieces that BPE encodes one by
// one. Each regex is a small hand-written matcher over code points (no std::regex), as llama.cpp's
// unicode.cpp does for GPT-2's; matches are taken left to right with the regex's alternation order and
// backtracking spelled out, exactly as Oniguruma (HF tokenizers) finds them.
//
//   gpt2    HF ByteLevel(use_regex=true):
//             's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   smollm  SmolLM2 / StarCoder: Digits(individual_digits=true) (every \p{N} its own piece), then gpt2 on
//           each stretch between digits
//   qwen2   Qwen2 / Qwen3:
//             (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+
//             |\s+(?!\S)|\s+
//   llama3  Llama 3: qwen2 with \p{N}{1,3} for \p{N}
//
// (?i:...) is Oniguruma's case folding: besides A-Z, U+017F LATIN SMALL LETTER LONG S folds to 's'
// (U+212A KELVIN SIGN folds to 'k', which no contraction has).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kiln/text/unicode.hpp"

namespace kiln {

/// The pre-tokenizer of a byte-level BPE vocabulary (GGUF tokenizer.ggml.pre, or a tokenizer.json's).
enum class PreTokenizer : uint8_t { gpt2, smollm, qwen2, llama3 };

inline const char* pre_tokenizer_name(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::gpt2:
      return "gpt2";
    case PreTokenizer::smollm:
      return "smollm";
    case PreTokenizer::qwen2:
      return "qwen2";
    case PreTokenizer::llama3:
      return "llama3";
  }
  return "?";
}

namespace text {
namespace detail {

class PieceMatcher {
 public:
  PieceMatcher(const CodePoints& t, std::size_t end) : cp_(t.cps.data()), cl_(t.classes.data()), e_(end) {}

  // The end of GPT-2's match at i (i < end).
  std::size_t gpt2(std::size_t i) const {
    if (std::size_t n = contraction(i, false)) return i + n;
    const std::size_t k = i + (cp_[i] == ' ' && i + 1 < e_ ? 1 : 0);
    if (letter(k)) return run(k, cc_letter);
    if (number(k)) return run(k, cc_number);
    if (other(k)) return run_other(k);
    return whitespace_tail(i);  // cp_[i] is whitespace
  }

  // The end of Qwen2's (max_digits 1) or Llama 3's (max_digits 3) match at i.
  std::size_t qwen2(std::size_t i, std::size_t max_digits) const {
    if (std::size_t n = contraction(i, true)) return i + n;
    if (letter(i)) return run(i, cc_letter);
    if (i + 1 < e_ && cp_[i] != '\r' && cp_[i] != '\n' && !number(i) && letter(i + 1)) return run(i + 1, cc_letter);
    if (number(i)) {
      std::size_t j = i;
      while (j < e_ && j - i < max_digits && number(j)) ++j;
      return j;
    }
    const std::size_t k = i + (cp_[i] == ' ' && i + 1 < e_ ? 1 : 0);
    if (other(k)) {
      std::size_t j = run_other(k);
      while (j < e_ && (cp_[j] == '\r' || cp_[j] == '\n')) ++j;
      return j;
    }
    // cp_[i] is whitespace. \s*[\r\n]+: up to the last CR/LF of the whitespace run.
    const std::size_t j = run(i, cc_space);
    for (std::size_t k2 = j; k2 > i; --k2)
      if (cp_[k2 - 1] == '\r' || cp_[k2 - 1] == '\n') return k2;
    return whitespace_tail(i);
  }

 private:
  bool letter(std::size_t i) const { return i < e_ && (cl_[i] & cc_letter); }
  bool number(std::size_t i) const { return i < e_ && (cl_[i] & cc_number); }
  bool other(std::size_t i) const { return i < e_ && cl_[i] == 0; }  // [^\s\p{L}\p{N}]
  std::size_t run(std::size_t i, uint8_t cls) const {
    while (i < e_ && (cl_[i] & cls)) ++i;
    return i;
  }
  std::size_t run_other(std::size_t i) const {
    while (other(i)) ++i;
    return i;
  }
  // \s+(?!\S)|\s+ at whitespace i: a run that reaches the end is taken whole; before a non-space, the run
  // less its last character (which then prefixes the next piece), or the single character.
  std::size_t whitespace_tail(std::size_t i) const {
    const std::size_t j = run(i, cc_space);
    if (j == e_) return j;
    return j - i >= 2 ? j - 1 : j;
  }
  char32_t fold(std::size_t i) const {  // case folding of the contraction letters
    const char32_t c = cp_[i];
    if (c >= 'A' && c <= 'Z') return c + 32;
    return c == 0x017F ? char32_t('s') : c;
  }
  // Length of 's|'t|'re|'ve|'m|'ll|'d at i (case-insensitive if ci), or 0.
  std::size_t contraction(std::size_t i, bool ci) const {
    if (cp_[i] != '\'' || i + 1 >= e_) return 0;
    auto at = [&](std::size_t j) { return ci ? fold(j) : cp_[j]; };
    const char32_t a = at(i + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= e_) return 0;
    const char32_t b = at(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }

  const char32_t* cp_;
  const uint8_t* cl_;
  std::size_t e_;
};

}  // namespace detail

/// Splits code points [0, t.size()) into pieces; appends each piece's end (a code point index) to ends.
inline void pre_tokenize(PreTokenizer p, const CodePoints& t, std::vector<std::size_t>& ends) {
  const std::size_t n = t.size();
  auto split = [&](std::size_t b, std::size_t e) {  // one regex over [b, e)
    const detail::PieceMatcher m(t, e);
    for (std::size_t i = b; i < e;) {
      i = p == PreTokenizer::gpt2 || p == PreTokenizer::smollm ? m.gpt2(i)
                                                               : m.qwen2(i, p == PreTokenizer::llama3 ? 3 : 1);
      ends.push_back(i);
    }
  };
  if (p != PreTokenizer::smollm) {
    split(0, n);
    return;
  }
  std::size_t start = 0;  // Digits(individual_digits): each \p{N} alone, gpt2 between them
  for (std::size_t i = 0; i < n; ++i) {
    if (!(t.classes[i] & cc_number)) continue;
    split(start, i);
    ends.push_back(i + 1);
    start = i + 1;
  }
  split(start, n);
}

}  // namespace text
}  // namespace kiln
