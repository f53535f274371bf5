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
//   o200k   gpt-oss, GPT-4o, Phi-4-mini, Llama 4 (GGUF "gpt-4o"), with U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}],
//           L = [\p{Ll}\p{Lm}\p{Lo}\p{M}], P = [^\r\n\p{L}\p{N}], C = (?i:'s|'t|'re|'ve|'m|'ll|'d):
//             P?U*L+C?|P?U+L*C?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   tekken  Mistral Nemo / Small 3 (GGUF "tekken"): o200k without the contractions C? and with \p{N} alone
//
// o200k's two letter alternatives backtrack: P? is tried with and then without the prefix (a mark is both P
// and in U and L), U* gives back characters until L+ can start, and the first alternative can fail after
// consuming ("ABC": no L) so the second is tried from the same start.
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
enum class PreTokenizer : uint8_t { gpt2, smollm, qwen2, llama3, o200k, tekken };

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
    case PreTokenizer::o200k:
      return "o200k";
    case PreTokenizer::tekken:
      return "tekken";
  }
  return "?";
}

namespace text {

/// A GGUF tokenizer.ggml.pre value kiln reads: the pre-tokenizer it names and llama.cpp's settings for it
/// (ignore_merges; add_bos when the file has no tokenizer.ggml.add_bos_token).
struct GgufPreTokenizer {
  std::string_view name;
  PreTokenizer pre;
  bool ignore_merges = false;
  bool add_bos = false;
};

/// The tokenizer.ggml.pre values of llama.cpp (src/llama-vocab.cpp) whose regex is exactly one of kiln's,
/// plus kiln's own "gpt2". llama.cpp's "default" is read as gpt2 (llama.cpp's differs: it splits
/// punctuation and digit triples first; files without a pre-tokenizer are old GPT-2-style conversions).
inline constexpr GgufPreTokenizer gguf_pre_tokenizers[] = {
    {"default", PreTokenizer::gpt2},
    {"gpt2", PreTokenizer::gpt2},
    {"gpt-2", PreTokenizer::gpt2},
    {"phi-2", PreTokenizer::gpt2},
    {"mpt", PreTokenizer::gpt2},
    {"olmo", PreTokenizer::gpt2},
    {"jais", PreTokenizer::gpt2},
    {"gigachat", PreTokenizer::gpt2},
    {"a.x-4.0", PreTokenizer::gpt2},
    {"mellum", PreTokenizer::gpt2},
    {"trillion", PreTokenizer::gpt2},
    {"granite-docling", PreTokenizer::gpt2},
    {"exaone4", PreTokenizer::gpt2},
    {"smollm", PreTokenizer::smollm},
    {"starcoder", PreTokenizer::smollm},
    {"refact", PreTokenizer::smollm},
    {"command-r", PreTokenizer::smollm},
    {"codeshell", PreTokenizer::smollm},
    {"exaone", PreTokenizer::smollm},
    {"minerva-7b", PreTokenizer::smollm},
    {"mellum2", PreTokenizer::smollm},
    {"qwen2", PreTokenizer::qwen2},
    {"deepseek-r1-qwen", PreTokenizer::qwen2},
    {"stablelm2", PreTokenizer::qwen2},
    {"megrez", PreTokenizer::qwen2},
    {"hunyuan", PreTokenizer::qwen2},
    {"solar-open", PreTokenizer::qwen2},
    {"grok-2", PreTokenizer::qwen2},
    {"kormo", PreTokenizer::qwen2},
    {"f2llmv2", PreTokenizer::qwen2},
    {"llama-bpe", PreTokenizer::llama3, true, true},
    {"llama3", PreTokenizer::llama3, true, true},
    {"llama-v3", PreTokenizer::llama3, true, true},
    {"falcon3", PreTokenizer::llama3, true, true},
    {"falcon-h1", PreTokenizer::llama3, true, true},
    {"pixtral", PreTokenizer::llama3, true, true},
    {"midm-2.0", PreTokenizer::llama3, true, true},
    {"lfm2", PreTokenizer::llama3, true, true},
    {"dbrx", PreTokenizer::llama3},
    {"smaug-bpe", PreTokenizer::llama3},
    {"gpt-4o", PreTokenizer::o200k},
    {"llama4", PreTokenizer::o200k},
    {"minimax-m2", PreTokenizer::o200k},
    {"kanana2", PreTokenizer::o200k},
    {"talkie", PreTokenizer::o200k},
    {"tekken", PreTokenizer::tekken, true, true},
};

/// The entry of a tokenizer.ggml.pre value, or nullptr.
inline const GgufPreTokenizer* find_gguf_pre_tokenizer(std::string_view name) {
  for (const auto& e : gguf_pre_tokenizers)
    if (e.name == name) return &e;
  return nullptr;
}

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
    return newline_or_whitespace(i);  // cp_[i] is whitespace
  }

  // The end of o200k's (max_digits 3, contractions) or Tekken's (max_digits 1, none) match at i.
  std::size_t o200k(std::size_t i, std::size_t max_digits, bool contractions) const {
    const bool prefix = i + 1 < e_ && prefix_char(i);      // P? greedy: with the prefix first, then without
    for (const std::size_t s : {prefix ? i + 1 : i, i}) {  // P?U*L+C?
      const std::size_t u = run(s, cc_upper);
      for (std::size_t k = u + 1; k-- > s;)  // U* backtracks until L+ can start
        if (k < e_ && (cl_[k] & cc_lower)) return suffix(run(k, cc_lower), contractions);
      if (!prefix) break;
    }
    for (const std::size_t s : {prefix ? i + 1 : i, i}) {  // P?U+L*C?
      if (const std::size_t u = run(s, cc_upper); u > s) return suffix(run(u, cc_lower), contractions);
      if (!prefix) break;
    }
    if (number(i)) {
      std::size_t j = i;
      while (j < e_ && j - i < max_digits && number(j)) ++j;
      return j;
    }
    const std::size_t k = i + (cp_[i] == ' ' && i + 1 < e_ ? 1 : 0);
    if (other(k)) {  //  ?[^\s\p{L}\p{N}]+[\r\n/]*
      std::size_t j = run_other(k);
      while (j < e_ && (cp_[j] == '\r' || cp_[j] == '\n' || cp_[j] == '/')) ++j;
      return j;
    }
    return newline_or_whitespace(i);
  }

 private:
  bool letter(std::size_t i) const { return i < e_ && (cl_[i] & cc_letter); }
  bool number(std::size_t i) const { return i < e_ && (cl_[i] & cc_number); }
  bool other(std::size_t i) const {  // [^\s\p{L}\p{N}]
    return i < e_ && !(cl_[i] & (cc_letter | cc_number | cc_space));
  }
  bool prefix_char(std::size_t i) const {  // [^\r\n\p{L}\p{N}]
    return cp_[i] != '\r' && cp_[i] != '\n' && !(cl_[i] & (cc_letter | cc_number));
  }
  std::size_t suffix(std::size_t j, bool contractions) const {  // C? after a letter run ending at j
    return j + (contractions && j < e_ ? contraction(j, true) : 0);
  }
  // \s*[\r\n]+|\s+(?!\S)|\s+ at whitespace i: up to the last CR/LF of the whitespace run, else the tail.
  std::size_t newline_or_whitespace(std::size_t i) const {
    const std::size_t j = run(i, cc_space);
    for (std::size_t k = j; k > i; --k)
      if (cp_[k - 1] == '\r' || cp_[k - 1] == '\n') return k;
    return whitespace_tail(i);
  }
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
      switch (p) {
        case PreTokenizer::gpt2:
        case PreTokenizer::smollm:
          i = m.gpt2(i);
          break;
        case PreTokenizer::qwen2:
        case PreTokenizer::llama3:
          i = m.qwen2(i, p == PreTokenizer::llama3 ? 3 : 1);
          break;
        case PreTokenizer::o200k:
        case PreTokenizer::tekken:
          i = m.o200k(i, p == PreTokenizer::o200k ? 3 : 1, p == PreTokenizer::o200k);
          break;
      }
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
