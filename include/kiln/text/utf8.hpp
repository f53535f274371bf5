// kiln/text/utf8.hpp - UTF-8 validation and streaming decode of text that arrives in pieces.
//
// A token's bytes need not end on a character boundary (SentencePiece byte fallback emits one byte per
// token, so an emoji takes four tokens). Utf8Stream holds back an incomplete trailing sequence until
// the bytes that complete it arrive, and replaces invalid bytes with U+FFFD the way Python's
// bytes.decode("utf-8", errors="replace") does (what HF's decode gives for byte-level text): each
// maximal subpart of an ill-formed sequence (Unicode 15, section 3.9, "U+FFFD substitution of maximal
// subparts") becomes one U+FFFD. Example: "\xE2\x82" followed by "A" is one U+FFFD then "A";
// "\xFF\xFE" is two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::text {

inline constexpr std::string_view replacement_character = "\xEF\xBF\xBD";  // U+FFFD

/// What starts at a position of a byte string.
struct Utf8Scan {
  enum Kind { valid, incomplete, invalid } kind;
  std::size_t len;  ///< valid: bytes of the character; incomplete: bytes present; invalid: bytes to replace
};

/// Scans the sequence starting at byte 0 of s[0, n) (Table 3-7 of the Unicode standard). `at(i)` returns
/// byte i as unsigned char, so the bytes may live in two buffers.
template <class At>
Utf8Scan scan_utf8(At&& at, std::size_t n) {
  const unsigned b0 = at(0);
  if (b0 < 0x80) return {Utf8Scan::valid, 1};
  std::size_t need;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) need = 2;
  else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;       // no overlong forms
    else if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;       // no overlong forms
    else if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {Utf8Scan::invalid, 1};  // 80..C1, F5..FF never start a character
  }
  for (std::size_t i = 1; i < need; ++i) {
    if (i >= n) return {Utf8Scan::incomplete, i};
    const unsigned b = at(i);
    const unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return {Utf8Scan::invalid, i};  // bytes [0, i) are the maximal subpart
  }
  return {Utf8Scan::valid, need};
}

/// True when s is well-formed UTF-8.
inline bool is_valid_utf8(std::string_view s) {
  auto at = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  for (std::size_t i = 0; i < s.size();) {
    const auto r = scan_utf8([&](std::size_t j) { return at(i + j); }, s.size() - i);
    if (r.kind != Utf8Scan::valid) return false;
    i += r.len;
  }
  return true;
}

/// s with every maximal ill-formed subpart (including a truncated tail) replaced by U+FFFD.
inline std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto r = scan_utf8([&](std::size_t j) { return static_cast<unsigned char>(s[i + j]); }, s.size() - i);
    if (r.kind == Utf8Scan::valid) out.append(s.substr(i, r.len));
    else out.append(replacement_character);
    i += r.len;
  }
  return out;
}

/// Streaming decoder: push() bytes as they come, get back the text that is complete so far.
/// The returned view stays valid until the next push/flush/reset. After construction, push() does not
/// allocate unless one call produces more than `reserve` bytes of text.
class Utf8Stream {
 public:
  explicit Utf8Stream(std::size_t reserve = 256) { out_.reserve(reserve); }

  /// Appends bytes; returns the complete characters now available (invalid subparts as U+FFFD). An
  /// incomplete sequence at the end is kept until the next push.
  std::string_view push(std::string_view bytes) {
    out_.clear();
    const std::size_t np = n_pending_, total = np + bytes.size();
    auto at = [&](std::size_t i) { return static_cast<unsigned char>(i < np ? pending_[i] : bytes[i - np]); };
    std::size_t i = 0;
    while (i < total) {
      const auto r = scan_utf8([&](std::size_t j) { return at(i + j); }, total - i);
      if (r.kind == Utf8Scan::incomplete) break;  // only possible at the end
      if (r.kind == Utf8Scan::valid)
        for (std::size_t j = 0; j < r.len; ++j) out_.push_back(static_cast<char>(at(i + j)));
      else out_.append(replacement_character);
      i += r.len;
    }
    char keep[4];
    const std::size_t n_keep = total - i;  // < 4: an incomplete sequence
    for (std::size_t j = 0; j < n_keep; ++j) keep[j] = static_cast<char>(at(i + j));
    for (std::size_t j = 0; j < n_keep; ++j) pending_[j] = keep[j];
    n_pending_ = n_keep;
    return out_;
  }

  /// End of the stream: a held-back incomplete sequence becomes U+FFFD.
  std::string_view flush() {
    out_.clear();
    if (n_pending_) out_.append(replacement_character);
    n_pending_ = 0;
    return out_;
  }

  /// Bytes held back waiting for the rest of a character.
  std::size_t pending() const { return n_pending_; }
  void reset() {
    n_pending_ = 0;
    out_.clear();
  }

 private:
  std::string out_;
  char pending_[4] = {};
  std::size_t n_pending_ = 0;
};

}  // namespace kiln::text
