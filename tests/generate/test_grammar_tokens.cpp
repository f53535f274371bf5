// generate/grammar.hpp, constraint.hpp: whole-token elements (Grammar::token / token_not, GBNF's <[id]> and
// !<[id]>) against a reference written here from their definition over token sequences: every sequence of up
// to five tokens of a small vocabulary is accepted or not as the reference says, the tokens allowed after
// each viable prefix are exactly those that keep it a prefix of an accepted sequence, and the trie mask is the
// set of tokens allowed one by one. A named token is never matched by the text it renders to (no forgery).
#include <algorithm>
#include <functional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "kiln/generate/constraint.hpp"
#include "test_util.hpp"

namespace kiln::test::grammar_tokens_test {

// 0 "a", 1 "b", 2 "ab", 3 "<", 4 "c>", 5 "!", 6 X (a control token rendered as "<c>"), 7 C, 8 D (control
// tokens without text), 9 EOS.
const std::vector<std::string> kPieces = {"a", "b", "ab", "<", "c>", "!", "<c>", "", "", ""};
constexpr int32_t X = 6, C = 7, D = 8, EOS = 9, N = 9;  // N: the tokens other than EOS

using Seq = std::vector<int32_t>;

// The text of seq[from, to), or false when one of them is a token taken whole there (named ones, C, D).
bool text_of(const Seq& s, std::size_t from, std::size_t to, const std::set<int32_t>& named, std::string& out) {
  out.clear();
  for (std::size_t i = from; i < to; ++i) {
    if (named.count(s[i]) || kPieces[std::size_t(s[i])].empty()) return false;
    out += kPieces[std::size_t(s[i])];
  }
  return true;
}

// Checks a grammar against `accepts` (the reference) after every viable prefix of up to `len` tokens (the
// grammars here complete any viable prefix within two more tokens).
void check_language(const std::shared_ptr<const Grammar>& g, const std::function<bool(const Seq&)>& accepts,
                    std::size_t len) {
  const auto trie = std::make_shared<const TokenTrie>(kPieces, std::vector<int32_t>{EOS});
  std::set<Seq> accepted, viable;  // viable: the prefixes of accepted sequences (within len + 2 tokens)
  std::function<void(Seq&)> all = [&](Seq& s) {
    if (accepts(s)) {
      accepted.insert(s);
      for (std::size_t k = 0; k <= s.size(); ++k) viable.insert(Seq(s.begin(), s.begin() + std::ptrdiff_t(k)));
    }
    if (s.size() == len + 2) return;
    for (int32_t t = 0; t < N; ++t) {
      s.push_back(t);
      all(s);
      s.pop_back();
    }
  };
  Seq s;
  all(s);
  REQUIRE(!accepted.empty());
  std::size_t checked = 0;
  std::vector<int32_t> mask;
  for (const Seq& p : viable) {
    if (p.size() > len) continue;
    Constraint c(g, trie);
    for (int32_t t : p) REQUIRE(c.accept(t));
    INFO("prefix of ", p.size(), " tokens, first ", p.empty() ? -1 : p[0]);
    CHECK(c.complete() == (accepted.count(p) > 0));
    CHECK(c.allows(EOS) == (accepted.count(p) > 0));
    std::vector<int32_t> brute;
    for (int32_t t = 0; t <= N; ++t) {
      Seq q = p;
      q.push_back(t);
      const bool want = t == EOS ? accepted.count(p) > 0 : viable.count(q) > 0;
      CHECK_MESSAGE(c.allows(t) == want, "token ", t);
      if (c.allows(t)) brute.push_back(t);
    }
    c.mask(mask);
    CHECK(mask == brute);
    CHECK(c.finished() == (accepted.count(p) && brute == std::vector<int32_t>{EOS}));
    ++checked;
  }
  CHECK(checked >= 5);
}

TEST_CASE("grammar tokens: token and token_not elements take whole tokens, as the reference says") {
  // root ::= <[C]> [ab]+ <[D]> | !<[C]> "b"
  auto g = std::make_shared<Grammar>();
  const uint32_t ab = g->rule("ab"), root = g->rule("root");
  g->alt(ab, {g->bytes(ByteSet::of("ab")), g->ref(ab)});
  g->alt(ab, {g->bytes(ByteSet::of("ab"))});
  g->alt(root, {g->token(C), g->ref(ab), g->token(D)});
  g->alt(root, {g->token_not(C), g->bytes(ByteSet::of("b"))});
  g->finish(root);
  const std::set<int32_t> named = {C, D};
  check_language(
      g,
      [&](const Seq& s) {
        std::string t;
        if (s.size() >= 2 && s[0] == C && s.back() == D && text_of(s, 1, s.size() - 1, named, t) &&
            std::regex_match(t, std::regex("[ab]+")))
          return true;
        return !s.empty() && s[0] != C && text_of(s, 1, s.size(), named, t) && t == "b";
      },
      3);
}

TEST_CASE("grammar tokens: a named token is never its text, and its text never the token") {
  // root ::= "<c>" | <[X]> "!"   (X renders as "<c>": the text "<c>" is spelled by "<" "c>", never by X)
  auto g = std::make_shared<Grammar>();
  const uint32_t root = g->rule("root");
  g->alt(root, g->literal("<c>"));
  g->alt(root, {g->token(X), g->bytes(ByteSet::of("!"))});
  g->finish(root);
  const std::set<int32_t> named = {X};
  check_language(
      g,
      [&](const Seq& s) {
        std::string t;
        if (text_of(s, 0, s.size(), named, t) && t == "<c>") return true;
        return !s.empty() && s[0] == X && text_of(s, 1, s.size(), named, t) && t == "!";
      },
      3);
}

TEST_CASE("grammar tokens: token elements inside nullable rules and repetitions") {
  // root ::= pre* <[D]> ; pre ::= !<[D]> | "a" <[C]>?
  auto g = std::make_shared<Grammar>();
  const uint32_t pre = g->rule("pre"), opt = g->rule("opt"), rep = g->rule("rep"), root = g->rule("root");
  g->alt(opt, {g->token(C)});
  g->alt(opt, std::vector<Grammar::Sym>{});
  g->alt(pre, {g->token_not(D)});
  g->alt(pre, {g->bytes(ByteSet::of("a")), g->ref(opt)});
  g->alt(rep, {g->ref(pre), g->ref(rep)});
  g->alt(rep, std::vector<Grammar::Sym>{});
  g->alt(root, {g->ref(rep), g->token(D)});
  g->finish(root);
  const std::set<int32_t> named = {C, D};
  // the reference: the last token D; before it, items: any whole token but D, or the text "a" then maybe C
  std::function<bool(const Seq&, std::size_t)> items = [&](const Seq& s, std::size_t i) -> bool {
    if (i == s.size()) return true;
    if (s[i] != D && items(s, i + 1)) return true;  // !<[D]>
    // "a" spelled by text tokens (only the token "a" spells exactly "a"), then C or not
    if (s[i] == 0) return items(s, i + 1) || (i + 1 < s.size() && s[i + 1] == C && items(s, i + 2));
    return false;
  };
  check_language(
      g, [&](const Seq& s) { return !s.empty() && s.back() == D && items(Seq(s.begin(), s.end() - 1), 0); }, 3);
}

TEST_CASE("grammar tokens: ids beyond the vocabulary are refused when the constraint is made") {
  auto g = std::make_shared<Grammar>();
  const uint32_t root = g->rule("root");
  g->alt(root, {g->token(1000)});
  g->finish(root);
  const auto trie = std::make_shared<const TokenTrie>(kPieces, std::vector<int32_t>{EOS});
  CHECK_THROWS_WITH_AS(Constraint(g, trie), doctest::Contains("token 1000, beyond the vocabulary's 10 tokens"), Error);
  Grammar h;
  CHECK_THROWS_WITH_AS(h.token(-1), doctest::Contains("negative"), Error);
}

}  // namespace kiln::test::grammar_tokens_test
