// text/utf8.hpp: validation, U+FFFD replacement like Python's bytes.decode("utf-8", "replace"), and
// streaming decode of characters split across pieces.
#include <random>
#include <string>
#include <vector>

#include "kiln/text/utf8.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

const std::string R(text::replacement_character);

// Expected values: Python 3.11, bytes.decode("utf-8", errors="replace") on the same bytes.
struct Case {
  std::string in, want;
};
const std::vector<Case>& python_cases() {
  static const std::vector<Case> c{
      {"\xE2\x82"
       "A",
       R + "A"},                            // truncated 3-byte sequence, then ASCII
      {"\xFF\xFE", R + R},                  // bytes that never start a character
      {"\xF0\x9F\x98", R},                  // truncated 4-byte sequence at the end: one U+FFFD
      {"\xED\xA0\x80", R + R + R},          // a surrogate: ED is valid but A0 is not after it
      {"\xC0\xAF", R + R},                  // overlong lead
      {"\xF4\x90\x80\x80", R + R + R + R},  // above U+10FFFF
      {"a\xE0\x80"
       "b",
       "a" + R + R + "b"},                               // E0 needs A0..BF next
      {"\xE0\xA0", R},                                   // truncated, valid so far
      {"\xF0\x9F\x98\x80\x80", "\xF0\x9F\x98\x80" + R},  // U+1F600 then a stray continuation byte
      {"plain \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", "plain \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"},
  };
  return c;
}

TEST_CASE("utf8: sanitize_utf8 replaces maximal ill-formed subparts like Python") {
  for (const auto& c : python_cases()) {
    INFO("input of ", c.in.size(), " bytes");
    CHECK(text::sanitize_utf8(c.in) == c.want);
    CHECK(text::is_valid_utf8(c.want));
    CHECK(text::is_valid_utf8(c.in) == (c.in == c.want));
  }
}

TEST_CASE("utf8: a stream fed byte by byte gives the same text, holding back partial characters") {
  for (const auto& c : python_cases()) {
    text::Utf8Stream s;
    std::string out;
    for (char ch : c.in) out += s.push(std::string_view(&ch, 1));
    out += s.flush();
    CHECK(out == c.want);
  }
  text::Utf8Stream s;
  CHECK(s.push("\xE2\x82").empty());  // the euro sign's first two bytes: nothing yet
  CHECK(s.pending() == 2);
  CHECK(s.push("\xAC!") == "\xE2\x82\xAC!");
  CHECK(s.pending() == 0);
  CHECK(s.push("\xF0\x9F").empty());
  CHECK(s.push("\x98").empty());
  CHECK(s.push("\x80") == "\xF0\x9F\x98\x80");  // an emoji over four byte-fallback tokens
  CHECK(s.push("\xC3").empty());
  CHECK(s.flush() == R);  // the stream ended inside a character
}

TEST_CASE("utf8: random splits of random text round-trip exactly, every piece valid") {
  const std::vector<std::string> alphabet{
      "a", "Z", " ", "\n", "\xC3\xA9", "\xE2\x82\xAC", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xD0\xAF"};
  std::mt19937 rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    for (int i = 0; i < 40; ++i) text += alphabet[rng() % alphabet.size()];
    text::Utf8Stream s(8);
    std::string out;
    for (std::size_t i = 0; i < text.size();) {
      const std::size_t n = std::min<std::size_t>(rng() % 5, text.size() - i);
      const auto piece = s.push(std::string_view(text).substr(i, n));
      CHECK(text::is_valid_utf8(piece));
      out += piece;
      i += n;
    }
    out += s.flush();
    CHECK(out == text);
  }
}

TEST_CASE("utf8: random bytes through the stream equal sanitize_utf8 of the whole") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::string bytes;
    const int n = int(rng() % 24);
    for (int i = 0; i < n; ++i) {
      const unsigned r = rng() % 4;  // bias towards bytes that start or continue sequences
      bytes += char(r == 0 ? rng() % 128 : r == 1 ? 0x80 + rng() % 64 : r == 2 ? 0xC0 + rng() % 64 : rng() % 256);
    }
    text::Utf8Stream s;
    std::string out;
    for (std::size_t i = 0; i < bytes.size();) {
      const std::size_t k = std::min<std::size_t>(1 + rng() % 3, bytes.size() - i);
      out += s.push(std::string_view(bytes).substr(i, k));
      i += k;
    }
    out += s.flush();
    CHECK(out == text::sanitize_utf8(bytes));
    CHECK(text::is_valid_utf8(out));
  }
}

}  // namespace
}  // namespace kiln::test
