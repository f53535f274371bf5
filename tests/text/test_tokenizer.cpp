// text/tokenizer.hpp: SentencePiece BPE as llama.cpp runs it. Hand-worked cases on a tiny vocabulary,
// then stories260K's vocabulary (from the GGUF and from tok512.bin) against an independent reference:
// llama2.c's run.c encoder (rescan for the best-scoring pair, merge, repeat), written out below.
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kiln/io/gguf.hpp"
#include "kiln/io/llama2c.hpp"
#include "kiln/text/tokenizer.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

const std::string kSpace = "\xE2\x96\x81";  // ▁

std::string shared_model(const std::string& name) {
  const std::string p = std::string(KILN_SHARED_DIR) + "/models/" + name;
  if (!std::filesystem::exists(p)) FAIL("missing test fixture '", p, "' (see ../shared/README.md)");
  return p;
}

// ids: 0 <unk>, 1 <s>, 2 </s>, 3 + b = <0xbb>, then the normal pieces below from 259 on.
const std::vector<std::pair<std::string, float>> kNormal{
    {kSpace, -1.0f}, {"a", -1.0f},          {"b", -1.0f}, {"c", -1.0f},  {"ab", -2.0f}, {"bc", -1.5f},
    {"aa", -2.0f},   {kSpace + "a", -3.0f}, {"x", -1.0f}, {"xx", -5.0f}, {"xxx", -4.0f}};
int32_t id_of(const std::string& piece) {
  for (std::size_t i = 0; i < kNormal.size(); ++i)
    if (kNormal[i].first == piece) return int32_t(259 + i);
  FAIL("no piece ", piece);
  return -1;
}
int32_t byte_id(unsigned char b) { return 3 + b; }

Tokenizer tiny(bool space_prefix) {
  Vocabulary v;
  v.pieces = {"<unk>", "<s>", "</s>"};
  v.types = {TokenType::unknown, TokenType::control, TokenType::control};
  v.scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    v.pieces.push_back(buf);
    v.types.push_back(TokenType::byte);
    v.scores.push_back(0);
  }
  for (const auto& [p, s] : kNormal) {
    v.pieces.push_back(p);
    v.types.push_back(TokenType::normal);
    v.scores.push_back(s);
  }
  v.unk = 0;
  v.bos = 1;
  v.eos = 2;
  v.add_space_prefix = space_prefix;
  return Tokenizer(std::move(v));
}

using Ids = std::vector<int32_t>;

TEST_CASE("tokenizer: the highest-scoring pair merges first") {
  const Tokenizer t = tiny(false);
  // "ab" (-2) and "bc" (-1.5) compete for the b: bc wins, leaving a alone.
  CHECK(t.encode("abc", {.add_special = false}) == Ids{id_of("a"), id_of("bc")});
  // "xxx": xx (-5) is the only first merge, then xx + x = xxx (-4).
  CHECK(t.encode("xxx", {.add_special = false}) == Ids{id_of("xxx")});
  // "xxxx": the leftmost xx first, then xxx, then nothing (no xxxx): [xxx, x].
  CHECK(t.encode("xxxx", {.add_special = false}) == Ids{id_of("xxx"), id_of("x")});
}

TEST_CASE("tokenizer: equal scores merge the leftmost pair first") {
  const Tokenizer t = tiny(false);
  CHECK(t.encode("aaa", {.add_special = false}) == Ids{id_of("aa"), id_of("a")});
  CHECK(t.encode("aaaaa", {.add_special = false}) == Ids{id_of("aa"), id_of("aa"), id_of("a")});
}

TEST_CASE("tokenizer: characters outside the vocabulary fall back to byte tokens") {
  const Tokenizer t = tiny(false);
  CHECK(t.encode("a\xC3\xA9"
                 "b",
                 {.add_special = false}) == Ids{id_of("a"), byte_id(0xC3), byte_id(0xA9), id_of("b")});
  CHECK(t.encode("\xF0\x9F\x98\x80", {.add_special = false}) ==
        Ids{byte_id(0xF0), byte_id(0x9F), byte_id(0x98), byte_id(0x80)});
  // Decoding reassembles the bytes.
  CHECK(t.decode(Ids{id_of("a"), byte_id(0xC3), byte_id(0xA9)}) == "a\xC3\xA9");
  CHECK(t.token_bytes(byte_id(0xC3)) == "\xC3");
  CHECK(t.decode(Ids{byte_id(0xC3)}) == "\xEF\xBF\xBD");  // a lone lead byte: U+FFFD
}

TEST_CASE("tokenizer: BOS, the dummy prefix space and \xE2\x96\x81") {
  const Tokenizer t = tiny(true);
  CHECK(t.encode("a") == Ids{1, id_of(kSpace + "a")});
  CHECK(t.encode("a", {.add_special = false}) == Ids{id_of(kSpace + "a")});
  CHECK(t.encode("") == Ids{1});
  CHECK(t.encode("a b") == Ids{1, id_of(kSpace + "a"), id_of(kSpace), id_of("b")});
  CHECK(t.decode(t.encode("a b")) == " a b");
  CHECK(t.token_bytes(1).empty());  // control tokens render as nothing
  CHECK(t.token_bytes(1, {.render_special = true}) == "<s>");
  CHECK(t.token_bytes(0) == "\xE2\x96\x85");  // <unk> as llama.cpp shows it
}

TEST_CASE("tokenizer: parse_special cuts special token texts out of the prompt") {
  const Tokenizer t = tiny(true);
  CHECK(t.encode("a</s>b", {.add_special = true, .parse_special = true}) ==
        Ids{1, id_of(kSpace + "a"), 2, id_of(kSpace), id_of("b")});
  const Ids plain = t.encode("a</s>b", {.add_special = true, .parse_special = false});
  CHECK(std::find(plain.begin(), plain.end(), 2) == plain.end());
  CHECK(plain[2] == byte_id('<'));
}

// ---- stories260K against run.c's algorithm ----

/// llama2.c run.c encode(): dummy prefix, split into characters (the same lead-nibble lengths as
/// llama.cpp), then repeatedly merge the best-scoring adjacent pair (first best wins), then byte fallback.
Ids runc_encode(const Tokenizer& t, const std::string& text) {
  Ids out{t.bos()};
  if (text.empty()) return out;
  const std::string s = Tokenizer::escape_whitespace(" " + text);
  static const int len_of[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  std::vector<std::string> sym;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = std::min<std::size_t>(len_of[static_cast<unsigned char>(s[i]) >> 4], s.size() - i);
    sym.push_back(s.substr(i, n));
    i += n;
  }
  const auto& scores = t.vocabulary().scores;
  for (;;) {
    float best = -1e30f;
    int at = -1;
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
      const int32_t id = t.find(sym[i] + sym[i + 1]);
      if (id >= 0 && scores[std::size_t(id)] > best) {
        best = scores[std::size_t(id)];
        at = int(i);
      }
    }
    if (at < 0) break;
    sym[std::size_t(at)] += sym[std::size_t(at) + 1];
    sym.erase(sym.begin() + at + 1);
  }
  for (const auto& x : sym) {
    const int32_t id = t.find(x);
    if (id >= 0) {
      out.push_back(id);
    } else {
      for (unsigned char c : x) out.push_back(int32_t(c) + 3);  // run.c: byte tokens start at 3
    }
  }
  return out;
}

std::vector<std::string> sample_texts() {
  std::vector<std::string> v{"Once upon a time",
                             "Lily's mom said, \"Lily, let's go to the park.\"",
                             "  two  spaces\tand a tab\n\nnew lines",
                             "caf\xC3\xA9 \xE2\x82\xAC 100 \xF0\x9F\x98\x80!",
                             "\xE4\xB8\xAD\xE6\x96\x87",
                             "x",
                             " ",
                             "ab\xFF\xFE"
                             "cd"};
  const std::vector<std::string> alphabet{"a",
                                          "e",
                                          "t",
                                          "h",
                                          "o",
                                          " ",
                                          " ",
                                          ".",
                                          ",",
                                          "\n",
                                          "'",
                                          "\"",
                                          "Th",
                                          "the",
                                          "\xC3\xA9",
                                          "\xE2\x82\xAC",
                                          "\xF0\x9F\x98\x80",
                                          "ing",
                                          "ed",
                                          "1",
                                          "Q"};
  std::mt19937 rng(1);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    const int n = 1 + int(rng() % 30);
    for (int k = 0; k < n; ++k) s += alphabet[rng() % alphabet.size()];
    v.push_back(s);
  }
  return v;
}

TEST_CASE("tokenizer: stories260K (GGUF and tok512.bin) encodes as run.c does and decodes back") {
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  const Tokenizer g = Tokenizer::from_gguf(f);
  const Tokenizer b = Tokenizer::from_llama2c(io::read_llama2c_vocab(shared_model("tok512.bin"), 512));
  REQUIRE(g.size() == 512);
  REQUIRE(b.size() == 512);
  CHECK(g.bos() == 1);
  CHECK(g.eos() == 2);
  CHECK(g.add_bos());
  for (const auto& s : sample_texts()) {
    INFO("text: ", s);
    const Ids want = runc_encode(g, s);
    CHECK(g.encode(s) == want);
    CHECK(b.encode(s) == want);
    CHECK(g.decode(want) == text::sanitize_utf8(" " + s));  // the dummy prefix space comes back
  }
}

TEST_CASE("tokenizer: GGUF and llama2.c vocabularies agree piece by piece") {
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  const Tokenizer g = Tokenizer::from_gguf(f);
  const Tokenizer b = Tokenizer::from_llama2c(io::read_llama2c_vocab(shared_model("tok512.bin"), 512));
  for (int32_t i = 0; i < 512; ++i) {
    INFO("token ", i);
    CHECK(g.token_bytes(i) == b.token_bytes(i));
    CHECK(g.type(i) == b.type(i));
    CHECK(g.vocabulary().scores[std::size_t(i)] == b.vocabulary().scores[std::size_t(i)]);
  }
}

}  // namespace
}  // namespace kiln::test
