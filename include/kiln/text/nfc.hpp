// kiln/text/nfc.hpp - Unicode Normalization Form C (UAX #15), the normalizer of Qwen2/Qwen3 tokenizer.json
// files: canonical decomposition (recursive; Hangul syllables algorithmically), canonical ordering of
// combining marks (stable by combining class), then canonical composition of primary composites.
// Tables: text/unicode_nfc_data.hpp (Unicode 16, as HF tokenizers' unicode-normalization crate).
//
// Invalid UTF-8 bytes pass through unchanged (each a starter that composes with nothing).
// Text whose code points are all below U+0300 is already NFC and is returned as it is.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/text/unicode.hpp"
#include "kiln/text/unicode_nfc_data.hpp"

namespace kiln::text {
namespace detail {

inline constexpr char32_t hangul_s = 0xAC00, hangul_l = 0x1100, hangul_v = 0x1161, hangul_t = 0x11A7;
inline constexpr char32_t hangul_l_count = 19, hangul_v_count = 21, hangul_t_count = 28;
inline constexpr char32_t hangul_n = hangul_v_count * hangul_t_count, hangul_count = hangul_l_count * hangul_n;

inline uint8_t combining_class(char32_t cp) {
  if (cp < 0x300 || cp > 0x10FFFF) return 0;
  const auto& t = unicode_data::ccc_ranges;
  const auto it =
      std::upper_bound(std::begin(t), std::end(t), uint32_t(cp), [](uint32_t c, uint32_t e) { return c < (e >> 8); });
  return uint8_t(*(it - 1) & 0xFF);
}

inline void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= hangul_s && cp < hangul_s + hangul_count) {
    const char32_t s = cp - hangul_s;
    out.push_back(hangul_l + s / hangul_n);
    out.push_back(hangul_v + (s % hangul_n) / hangul_t_count);
    if (s % hangul_t_count) out.push_back(hangul_t + s % hangul_t_count);
    return;
  }
  const auto& t = unicode_data::decompositions;
  const auto it = std::lower_bound(std::begin(t), std::end(t), uint32_t(cp),
                                   [](const unicode_data::Decomposition& d, uint32_t c) { return d.cp < c; });
  if (cp < 0xC0 || it == std::end(t) || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);
  if (it->second) decompose(it->second, out);
}

/// The primary composite of a + b, or 0.
inline char32_t compose(char32_t a, char32_t b) {
  if (a >= hangul_l && a < hangul_l + hangul_l_count && b >= hangul_v && b < hangul_v + hangul_v_count)
    return hangul_s + ((a - hangul_l) * hangul_v_count + (b - hangul_v)) * hangul_t_count;
  if (a >= hangul_s && a < hangul_s + hangul_count && (a - hangul_s) % hangul_t_count == 0 && b > hangul_t &&
      b < hangul_t + hangul_t_count)
    return a + (b - hangul_t);
  if (a > 0x10FFFF || b > 0x10FFFF) return 0;
  const uint64_t key = (uint64_t(a) << 21) | b;
  const auto& t = unicode_data::compositions;
  const auto it = std::lower_bound(std::begin(t), std::end(t), key,
                                   [](const unicode_data::Composition& c, uint64_t k) { return c.pair < k; });
  return it != std::end(t) && it->pair == key ? char32_t(it->composite) : 0;
}

inline void append_utf8(char32_t cp, std::string& out) {
  if (cp > 0x10FFFF) {
    out += char(cp - 0x110000);  // an invalid byte (text/unicode.hpp's invalid_byte)
  } else if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace detail

/// NFC of UTF-8 text (invalid bytes kept as they are).
inline std::string nfc(std::string_view s) {
  CodePoints t;
  t.assign(s);
  if (std::all_of(t.cps.begin(), t.cps.end(), [](char32_t c) { return c < 0x300; })) return std::string(s);
  std::vector<char32_t> d;  // decomposed
  d.reserve(t.size() + 8);
  for (char32_t c : t.cps) detail::decompose(c, d);
  std::vector<uint8_t> cls(d.size());
  for (std::size_t i = 0; i < d.size(); ++i) cls[i] = detail::combining_class(d[i]);
  for (std::size_t i = 0; i < d.size();) {  // canonical ordering: each run of non-starters, stably by class
    if (cls[i] == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < d.size() && cls[j] != 0) ++j;
    for (std::size_t a = i + 1; a < j; ++a)  // insertion sort (runs are short)
      for (std::size_t b = a; b > i && cls[b - 1] > cls[b]; --b) {
        std::swap(d[b - 1], d[b]);
        std::swap(cls[b - 1], cls[b]);
      }
    i = j;
  }
  // Canonical composition (UAX #15's reference algorithm).
  std::vector<char32_t> out;
  out.reserve(d.size());
  std::size_t starter = 0;
  int last = 0;
  for (std::size_t i = 0; i < d.size(); ++i) {
    const int c = cls[i];
    if (out.empty()) {
      out.push_back(d[i]);
      last = c == 0 ? 0 : 256;  // a leading combining mark blocks composition
      starter = 0;
      continue;
    }
    const char32_t comp = detail::compose(out[starter], d[i]);
    if (comp && (last < c || last == 0) && last != 256) {
      out[starter] = comp;
      continue;
    }
    if (c == 0) starter = out.size();
    last = c;
    out.push_back(d[i]);
  }
  std::string r;
  r.reserve(s.size() + 8);
  for (char32_t c : out) detail::append_utf8(c, r);
  return r;
}

}  // namespace kiln::text
