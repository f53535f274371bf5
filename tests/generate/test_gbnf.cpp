// generate/gbnf.hpp: kiln's GBNF parser and the byte-level matcher against llama.cpp's own grammar parser and
// matcher (tests/fixtures/generate/gbnf.json, made by scripts/fixtures/make_gbnf_fixture.py: llama.cpp's shipped
// grammars with texts and their mutations, test-grammar-integration.cpp's cases, the grammars its tests refuse),
// character classes over code points against a direct membership test of every code point's UTF-8 bytes, and
// the errors' line, column and reason; token references (<[id]>, !<[id]>, <text>) against the verdicts of
// llama.cpp's tests/test-grammar-integration.cpp for its grammars with tokens.
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/generate/constraint.hpp"
#include "kiln/generate/gbnf.hpp"
#include "kiln/io/gguf.hpp"
#include "test_util.hpp"

namespace kiln::test::gbnf_test {

using ojson = nlohmann::ordered_json;

const ojson& fixture() {
  static const ojson f = [] {
    const std::string p = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/generate/gbnf.json";
    std::ifstream in(p, std::ios::binary);
    REQUIRE_MESSAGE(in, "missing fixture ", p, " (scripts/fixtures/make_gbnf_fixture.py makes it)");
    std::stringstream ss;
    ss << in.rdbuf();
    return ojson::parse(ss.str());
  }();
  return f;
}

// llama.cpp's verdict for a text: "1" complete, "p" every character taken but not complete, "0" refused.
std::string verdict(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  for (std::size_t i = 0; i < text.size(); ++i)
    if (!m.accept(text.substr(i, 1))) return "0";
  return m.complete() ? "1" : "p";
}

TEST_CASE("gbnf: accept / reject as llama.cpp's matcher on its grammars and test cases") {
  const ojson& f = fixture();
  REQUIRE(f["grammars"].size() >= 8);
  std::size_t n = 0, complete = 0, prefix = 0, refused = 0;
  for (const auto& gj : f["grammars"]) {
    const std::string name = gj["name"].get<std::string>();
    INFO(name);
    std::shared_ptr<const Grammar> g;
    REQUIRE_NOTHROW(g = gbnf_grammar(gj["grammar"].get<std::string>()));
    for (const auto& c : gj["cases"]) {
      const std::string text = c["text"].get<std::string>(), want = c["verdict"].get<std::string>();
      const std::string got = verdict(g, text);
      if (got != want) FAIL_CHECK(name, ": ", ojson(text).dump(), " kiln ", got, ", llama.cpp ", want);
      ++n;
      complete += want == "1", prefix += want == "p", refused += want == "0";
    }
  }
  MESSAGE(n, " texts: ", complete, " complete, ", prefix, " prefixes, ", refused, " refused");
  CHECK(complete > 100);
  CHECK(prefix > 100);
  CHECK(refused > 100);
}

TEST_CASE("gbnf: the grammars llama.cpp refuses are refused with a kiln::Error") {
  const ojson& f = fixture();
  REQUIRE(f["refused"].size() >= 4);
  for (const auto& gj : f["refused"]) {
    const std::string text = gj.get<std::string>();
    INFO(text);
    CHECK_THROWS_AS((void)gbnf_grammar(text), Error);
  }
}

// A class over code points against a direct membership test of each code point (ranges, negation, surrogates
// never: they have no UTF-8 form).
TEST_CASE("gbnf: character classes are the UTF-8 encodings of their code points") {
  struct Case {
    const char* grammar;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    bool negate;
  };
  const std::vector<Case> cases = {
      {R"(root ::= [a-zé\u0100-\u07FF\u0800-\uFFFF])", {{'a', 'z'}, {0xE9, 0xE9}, {0x100, 0xFFFF}}, false},
      {R"(root ::= [^"\\\x7F\x00-\x1F])", {{'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}, {0, 0x1F}}, true},
      {R"(root ::= [\x80-\U0010FFFF])", {{0x80, 0x10FFFF}}, false},
      {R"(root ::= [\u07FF-\u0801\uD7FF-\uE000\U0000FFFF-\U00010000\U0010FFFF])",
       {{0x7FF, 0x801}, {0xD7FF, 0xE000}, {0xFFFF, 0x10000}, {0x10FFFF, 0x10FFFF}},
       false},
      {R"(root ::= [^\u2028\u2029\x85\r\n])", {{0x2028, 0x2029}, {0x85, 0x85}, {'\r', '\r'}, {'\n', '\n'}}, true},
      {R"(root ::= .)", {}, true},
  };
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    INFO(c.grammar);
    const auto g = gbnf_grammar(c.grammar);
    auto member = [&](uint32_t cp) {
      bool in = false;
      for (auto [lo, hi] : c.ranges) in |= cp >= lo && cp <= hi;
      return in != c.negate;
    };
    std::vector<uint32_t> cps;
    for (uint32_t cp = 0; cp < 0x3000; ++cp) cps.push_back(cp);
    for (uint32_t b : {0xD7FFu, 0xE000u, 0xFFFFu, 0x10000u, 0x10FFFFu, 0xFEFFu, 0x1F535u})
      for (uint32_t d = 0; d < 3; ++d) cps.push_back(b - d), cps.push_back(b + d);
    for (int i = 0; i < 4000; ++i) cps.push_back(rng() % 0x110000);
    for (uint32_t cp : cps) {
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) continue;
      const std::string s = detail::gbnf::utf8(cp);
      const bool want = member(cp);
      if ((verdict(g, s) == "1") != want) FAIL_CHECK("U+", std::hex, cp, " kiln ", !want, ", direct ", want);
    }
    // Not UTF-8: surrogates, overlong forms, bytes past U+10FFFF, a lone continuation byte.
    for (std::string bad : {"\xED\xA0\x80", "\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xF4\x90\x80\x80",
                            "\xF5\x80\x80\x80", "\x80", "\xFF"})
      CHECK(verdict(g, bad) == "0");
  }
}

TEST_CASE("gbnf: syntax (repetitions, groups, comments, escapes, CRLF)") {
  auto ok = [](const char* grammar, std::vector<std::string> yes, std::vector<std::string> no) {
    INFO(grammar);
    const auto g = gbnf_grammar(grammar);
    for (const auto& s : yes) CHECK_MESSAGE(verdict(g, s) == "1", s);
    for (const auto& s : no) CHECK_MESSAGE(verdict(g, s) != "1", s);
  };
  ok("root ::= \"a\"{3}", {"aaa"}, {"aa", "aaaa"});
  ok("root ::= \"ab\"{2,}", {"abab", "ababab"}, {"ab", "aba"});
  ok("root ::= \"a\"{1,3} \"b\"{0,1}", {"a", "aaab", "ab"}, {"aaaa", "b", "abb"});
  ok("root ::= ( \"x\"\n  | \"y\" )+ # a comment\n", {"x", "xyyx"}, {"", "z"});
  ok("root ::= \"\\x41\\u00e9\\U0001F535\\t\\\"\\\\\\[\\]\\-\"", {"A\xC3\xA9\xF0\x9F\x94\xB5\t\"\\[]-"}, {"A"});
  ok("root ::= a b\r\na ::= \"1\"\r\nb ::= \"2\"\r\n", {"12"}, {"1", "21"});
  ok("root ::= \"x\" |\n  \"y\"", {"x", "y"}, {"xy"});
  ok("root ::= [a-c]{0,5000}", {"", "abcabc"}, {"d"});  // a maximum past 2000: none (llama.cpp's rule)
  // Repetitions of items that can be empty: the outer rule is reached again through the inner one without a
  // byte (left recursion through last elements only, which llama.cpp takes too), and nested ones reach the
  // same stacks along exponentially many paths (each is stepped once per byte).
  ok("root ::= ( [x]* )*", {"", "x", "xx"}, {"y", "xy"});
  ok("root ::= ((\"a\"? \"b\"?)* \"c\"?)* \"d\"", {"d", "abd", "bacbd", "ccd"}, {"", "da", "e"});
  ok("root ::= ([^x]*){0,99} \"!\"", {"!", "abc!", std::string(200, 'z') + "!"}, {"x!", "abc"});
  // A custom start rule.
  const auto g = gbnf_grammar("foo ::= \"foobar\"\n", {.root = "foo"});
  CHECK(verdict(g, "foobar") == "1");
}

TEST_CASE("gbnf: errors name the line, the column and what was wrong") {
  auto err = [](const std::string& grammar, const std::string& want) {
    INFO(grammar);
    CHECK_THROWS_WITH_AS((void)gbnf_grammar(grammar), doctest::Contains(want.c_str()), Error);
  };
  err("root ::= \"a\" b\n", "line 1, column 14: rule 'b' is used but never defined");
  err("x ::= \"a\"\n", "there is no 'root' rule");
  err("root ::= \"a\"\nx ::= \"abc\n", "line 2, column 7: unterminated literal");
  err("root ::= [a-z\n", "line 1, column 10: unterminated character class");
  err("root ::= \"\\q\"", "line 1, column 11: unknown escape '\\q'");
  err("root ::= \"\\x4\"", "line 1, column 11: expected 2 hex digits after '\\x'");
  err("root ::= x\nx ::= x \"a\" | \"b\"\n", "rule 'x' is left-recursive (written at line 2, column 1)");
  err("root ::= (\"a\" | root \"b\")\n", "left-recursive");
  err("root ::= a\na ::= a\n", "the root rule 'root' matches no text");
  err("root ::= <[10 \"a\"", "line 1, column 14: expected ']>'");
  err("root ::= <[]>", "line 1, column 12: expected a token id");
  err("root ::= <[99999999999]>", "the token id is too big");
  err("root ::= !\"a\"", "line 1, column 11: expected '<' after '!'");
  err("root ::= <think>", "line 1, column 10: the token reference <think> needs the model's vocabulary");
  err("root ::= <think", "line 1, column 10: unterminated token reference");
  err("root ::= * \"a\"", "line 1, column 10: '*' has nothing before it to repeat");
  err("root ::= \"a\"{3001}", "more than 2000 times");
  err("root ::= \"a\"{3,2}", "maximum below its minimum");
  err("root ::= \"a\"{2", "line 1, column 15: expected '}'");
  err("root ::= (\"a\"\n", "line 1, column 10: unclosed '('");
  err("root ::= \"a\" )", "line 1, column 14: expected a newline or the end after rule 'root'");
  err("root = \"a\"", "line 1, column 6: expected '::=' after the rule name 'root'");
  err("root ::= \"a\"\nroot ::= \"b\"\n", "line 2, column 1: rule 'root' is defined twice (first at line 1, column 1)");
  err("root ::= []", "line 1, column 10: empty character class");
  err("root ::= [z-a]", "line 1, column 11: the range's end is below its start");
  err("root ::= \"\\uD800\"", "is not a character UTF-8 can encode");
  err(std::string("root ::= \"\xFF\""), "not valid UTF-8");
}

// llama.cpp's test-grammar-integration.cpp spells a token as token(id) and every other character as a token of
// its own; here: ids 10..21 control tokens without text, ids 22 + (c - 0x20) the printable ASCII characters.
struct Tok {
  int32_t id;
};
std::vector<int32_t> tokens_of(std::initializer_list<std::variant<Tok, const char*>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) {
    if (std::holds_alternative<Tok>(p)) out.push_back(std::get<Tok>(p).id);
    else
      for (const char* c = std::get<const char*>(p); *c; ++c) out.push_back(22 + (*c - 0x20));
  }
  return out;
}
std::shared_ptr<const TokenTrie> ascii_vocab() {
  std::vector<std::string> pieces(22);
  for (int c = 0x20; c < 0x7F; ++c) pieces.push_back(std::string(1, char(c)));
  pieces.push_back("");  // EOS
  return std::make_shared<const TokenTrie>(pieces, std::vector<int32_t>{int32_t(pieces.size() - 1)});
}
bool matches(const std::shared_ptr<const Grammar>& g, const std::vector<int32_t>& toks) {
  Constraint c(g, ascii_vocab());
  for (int32_t t : toks)
    if (!c.accept(t)) return false;
  return c.complete();
}

TEST_CASE("gbnf: token references take whole tokens, as llama.cpp's grammar integration tests say") {
  using T = Tok;
  {
    const auto g = gbnf_grammar("root ::= <[10]> content <[11]>\ncontent ::= (!<[11]>)*");
    for (const auto& s : {tokens_of({T{10}, "hello world", T{11}}),
                          tokens_of({T{10}, "text with ", T{12}, " other tokens ", T{13}, " mixed in", T{11}}),
                          tokens_of({T{10}, T{11}}), tokens_of({T{10}, T{12}, T{13}, T{14}, T{15}, T{11}}),
                          tokens_of({T{10}, "a", T{11}})})
      CHECK(matches(g, s));
    for (const auto& s :
         {tokens_of({T{10}, "missing end token"}), tokens_of({T{10}}), tokens_of({"missing start token", T{11}}),
          tokens_of({T{10}, T{11}, T{11}}), tokens_of({T{11}, "wrong order", T{10}})})
      CHECK_FALSE(matches(g, s));
  }
  {
    const auto g = gbnf_grammar(R"(
            root ::= reasoning+ content tool-call*
            reasoning ::= <[10]> (!<[11]>)* <[11]>
            content ::= <[20]> (!<[21]>)* <[21]>
            tool-call ::= <[12]> name <[13]> args <[14]>
            name ::= (!<[13]>)+
            args ::= (!<[14]>)*)");
    for (const auto& s :
         {tokens_of({T{10}, "I am thinking", T{11}, T{20}, "hello world!", T{21}, T{12}, "search", T{13}, "query=test",
                     T{14}}),
          tokens_of(
              {T{10}, "reasoning 1", T{11}, T{10}, "reasoning 2", T{11}, T{20}, T{21}, T{12}, "tool", T{13}, T{14}}),
          tokens_of({T{10}, T{11}, T{20}, "content", T{21}}),
          tokens_of({T{10}, "think", T{12}, " nested", T{11}, T{20}, T{10}, "more content", T{21}, T{12}, "fn", T{13},
                     "x=1,y=2", T{14}, T{12}, "fn2", T{13}, T{14}}),
          tokens_of({T{10}, "reasoning", T{11}, T{10}, "more", T{11}, T{10}, "even more", T{11}, T{20}, "text",
                     T{21}, T{12},       "a",   T{13}, "b",    T{14}, T{12}, "c",         T{13}, "d",   T{14}})})
      CHECK(matches(g, s));
    for (const auto& s : {tokens_of({T{20}, "content only", T{21}}), tokens_of({T{10}, "no closing reasoning"}),
                          tokens_of({T{10}, T{11}, T{20}, "no closing content"}),
                          tokens_of({T{10}, T{11}, T{20}, T{21}, T{12}, "incomplete tool"}),
                          tokens_of({T{10}, T{11}, T{11}, T{20}, T{21}})})
      CHECK_FALSE(matches(g, s));
  }
  // ids beyond the vocabulary: refused when the constraint is made (no vocabulary given to the parser)
  const auto far = gbnf_grammar("root ::= <[5000]>");
  CHECK_THROWS_WITH_AS(Constraint(far, ascii_vocab()), doctest::Contains("token 5000, beyond the vocabulary's"), Error);
}

TEST_CASE("gbnf: <text> token references and ids checked against a vocabulary") {
  const Tokenizer tok =
      Tokenizer::from_gguf(io::GGUFFile(std::string(KILN_SOURCE_DIR) + "/tests/fixtures/text/gpt_oss_tiny_vocab.gguf"));
  const int32_t channel = tok.find("<|channel|>"), end = tok.find("<|end|>");
  REQUIRE(channel >= 0);
  REQUIRE(end >= 0);
  const auto g = gbnf_grammar("root ::= <|channel|> \"a\"* !<|end|>", {.vocabulary = &tok});
  const auto h = gbnf_grammar(detail::concat("root ::= <[", channel, "]> \"a\"* !<[", end, "]>"));
  // the same grammar: the same token elements
  REQUIRE(g->token_elems().size() == 2);
  CHECK(g->token_elems()[0].id == channel);
  CHECK_FALSE(g->token_elems()[0].negated);
  CHECK(g->token_elems()[1].id == end);
  CHECK(g->token_elems()[1].negated);
  CHECK(h->token_elems()[0].id == channel);
  CHECK(h->token_elems()[1].id == end);
  const auto err = [&](const std::string& grammar, const std::string& want) {
    INFO(grammar);
    CHECK_THROWS_WITH_AS((void)gbnf_grammar(grammar, {.vocabulary = &tok}), doctest::Contains(want.c_str()), Error);
  };
  err("root ::= <|nope|>", "line 1, column 10: '<|nope|>' is not one token of the vocabulary");
  err(detail::concat("root ::= \"x\" <[", tok.size(), "]>"),
      detail::concat("line 1, column 14: token id ", tok.size(), " is beyond the vocabulary's ", tok.size(),
                     " tokens"));
}

}  // namespace kiln::test::gbnf_test
