// kiln/text/unicode.hpp - code points of UTF-8 text and the character classes of the pre-tokenizer
// regexes: \p{L}, \p{N}, \s and the case classes of o200k exactly as Oniguruma (inside Hugging Face
// tokenizers) defines them for Unicode 16 (text/unicode_data.hpp; scripts/fixtures/make_tokenizer_fixtures.py
// checks all 1,112,064 scalar values against Oniguruma).
//
// Invalid UTF-8 is not an error here: each byte of an ill-formed sequence becomes its own "code point"
// invalid_byte(b) = 0x110000 + b, of no class (like U+FFFD: not a letter, number or space), so pre-tokenizing
// never fails and the raw bytes survive into byte-level BPE (decode(encode(bytes)) gives the bytes back).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>
#include <vector>

#include "kiln/text/unicode_data.hpp"
#include "kiln/text/utf8.hpp"

namespace kiln::text {

using unicode_data::Category;

/// The pseudo code point of an invalid byte (outside Unicode's range).
constexpr char32_t invalid_byte(unsigned char b) { return char32_t(0x110000u + b); }

/// General category of a code point (Cn for unassigned code points and for invalid_byte values).
inline Category category(char32_t cp) {
  if (cp > 0x10FFFF) return Category::Cn;
  const auto& t = unicode_data::category_ranges;
  // The last range starting at or before cp.
  const auto it =
      std::upper_bound(std::begin(t), std::end(t), uint32_t(cp), [](uint32_t c, uint32_t e) { return c < (e >> 5); });
  return Category(*(it - 1) & 31u);
}

/// Character-class bits of the pre-tokenizer regexes. cc_letter, cc_number and cc_space exclude each other
/// (\p{L}, \p{N}, \s); cc_upper and cc_lower are the two letter classes of o200k and Tekken,
/// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}], which overlap (Lm, Lo and the marks are
/// in both) and take in the marks, which are not \p{L}.
enum CharClass : uint8_t { cc_letter = 1, cc_number = 2, cc_space = 4, cc_upper = 8, cc_lower = 16 };

/// \s of Oniguruma: White_Space = Zs, Zl, Zp, U+0009..U+000D and U+0085 (not U+001C..U+001F, which
/// Python's str.isspace counts).
inline uint8_t char_class(char32_t cp) {
  if (cp < 0x80) {  // fast path
    if (cp >= 'a' && cp <= 'z') return cc_letter | cc_lower;
    if (cp >= 'A' && cp <= 'Z') return cc_letter | cc_upper;
    if (cp >= '0' && cp <= '9') return cc_number;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return cc_space;
    return 0;
  }
  if (cp == 0x85) return cc_space;
  switch (category(cp)) {
    case Category::Lu:
    case Category::Lt:
      return cc_letter | cc_upper;
    case Category::Ll:
      return cc_letter | cc_lower;
    case Category::Lm:
    case Category::Lo:
      return cc_letter | cc_upper | cc_lower;
    case Category::Mn:
    case Category::Mc:
    case Category::Me:
      return cc_upper | cc_lower;
    case Category::Nd:
    case Category::Nl:
    case Category::No:
      return cc_number;
    case Category::Zs:
    case Category::Zl:
    case Category::Zp:
      return cc_space;
    default:
      return 0;
  }
}

/// Text as code points: cps[i] starts at byte offsets[i]; offsets.back() == text.size().
struct CodePoints {
  std::vector<char32_t> cps;
  std::vector<uint32_t> offsets;
  std::vector<uint8_t> classes;  ///< char_class of each code point

  void assign(std::string_view s) {
    cps.clear();
    offsets.clear();
    classes.clear();
    auto at = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
    for (std::size_t i = 0; i < s.size();) {
      const auto r = scan_utf8([&](std::size_t j) { return at(i + j); }, s.size() - i);
      offsets.push_back(uint32_t(i));
      if (r.kind == Utf8Scan::valid) {
        char32_t cp = r.len == 1 ? at(i) : at(i) & (0xFF >> (r.len + 1));
        for (std::size_t j = 1; j < r.len; ++j) cp = (cp << 6) | (at(i + j) & 0x3F);
        cps.push_back(cp);
        i += r.len;
      } else {
        cps.push_back(invalid_byte(at(i)));  // one pseudo code point per byte of an ill-formed sequence
        i += 1;
      }
      classes.push_back(char_class(cps.back()));
    }
    offsets.push_back(uint32_t(s.size()));
  }
  std::size_t size() const { return cps.size(); }
};

}  // namespace kiln::text
