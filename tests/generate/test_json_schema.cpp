// generate/grammar.hpp, constraint.hpp, json_schema.hpp: the JSON-schema matcher against Python's json module
// and jsonschema (tests/fixtures/generate/json_schema.json, made by scripts/fixtures/make_json_schema_fixture.py),
// the token mask against token-by-token checks, random constrained walks that always end in JSON that parses,
// and the sampler's mask against brute force.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/generate/constraint.hpp"
#include "kiln/generate/json_schema.hpp"
#include "kiln/generate/sampler.hpp"
#include "test_util.hpp"

namespace kiln::test::json_schema_test {

using ojson = nlohmann::ordered_json;

const ojson& fixture() {
  static const ojson f = [] {
    const std::string p = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/generate/json_schema.json";
    std::ifstream in(p, std::ios::binary);
    REQUIRE_MESSAGE(in, "missing fixture ", p, " (scripts/fixtures/make_json_schema_fixture.py makes it)");
    std::stringstream ss;
    ss << in.rdbuf();
    return ojson::parse(ss.str());
  }();
  return f;
}

std::string case_bytes(const ojson& c) {
  if (c.contains("text")) return c["text"].get<std::string>();
  const std::string hex = c["hex"].get<std::string>();
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) out += char(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// How many bytes of s the matcher takes, one at a time (it stops at the first refused one).
std::size_t feed(GrammarMatcher& m, std::string_view s) {
  std::size_t n = 0;
  while (n < s.size() && m.accept(s.substr(n, 1))) ++n;
  return n;
}

TEST_CASE("json_schema: the matcher agrees with json.loads and jsonschema on the fixture") {
  const ojson& f = fixture();
  std::vector<std::shared_ptr<const Grammar>> grammars;
  for (const auto& s : f["schemas"]) grammars.push_back(json_schema_grammar(s));
  std::size_t complete = 0, invalid = 0, outside = 0;
  for (const auto& c : f["cases"]) {
    const std::string text = case_bytes(c);
    GrammarMatcher m(grammars[c["schema"].get<std::size_t>()]);
    const std::size_t taken = feed(m, text);
    INFO("schema ", c["schema"].get<int>(), " text ", text);
    CHECK(taken >= c["prefix"].get<std::size_t>());
    if (c["complete"].get<bool>()) {
      CHECK(taken == text.size());
      CHECK(m.complete());
      ++complete;
    }
    if (c.value("outside", false)) {  // valid JSON past the documented whitespace bounds: refused
      CHECK_FALSE((taken == text.size() && m.complete()));
      ++outside;
    }
    if (c["invalid"].get<bool>()) {
      CHECK_FALSE((taken == text.size() && m.complete()));
      ++invalid;
    }
  }
  CHECK(complete > 100);
  CHECK(invalid > 100);
  CHECK(outside > 100);
  // Taking a whole text at once is taking it byte by byte.
  GrammarMatcher m(grammars[1]);
  CHECK(m.accept(R"({"name": "Ann", "age": 3, "tags": []})"));
  CHECK(m.complete());
  CHECK(m.next_bytes().empty());
  GrammarMatcher m2(grammars[1]);
  CHECK_FALSE(m2.accept(R"({"age": 3})"));  // name comes first
  CHECK(m2.accept("{"));
}

TEST_CASE("json_schema: unsupported keywords and bad schemas are refused, naming the keyword") {
  for (const auto& r : fixture()["refused"]) {
    const std::string kw = r["keyword"].get<std::string>();
    INFO("schema ", r["schema"].dump(), " keyword ", kw);
    try {
      (void)json_schema_grammar(r["schema"]);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find(kw) != std::string::npos);
    }
  }
  CHECK_THROWS_WITH_AS((void)json_schema_grammar("{not json"), doctest::Contains("not valid JSON"), Error);
  // A $ref cycle that never reads a byte matches nothing: refused at build time.
  CHECK_THROWS_WITH_AS((void)json_schema_grammar(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"),
                       doctest::Contains("matches no text"), Error);
}

TEST_CASE("json_schema: whitespace is bounded, right recursion keeps the stack flat") {
  auto g = json_object_grammar();
  GrammarMatcher m(g);
  CHECK(m.accept("{\n" + std::string(kJsonMaxIndent, ' ')));
  CHECK_FALSE(m.allows(" "));
  CHECK_FALSE(m.allows("\n"));
  CHECK(m.accept("}"));
  CHECK(m.complete());
  GrammarMatcher m2(g);
  CHECK(m2.accept("{ "));
  CHECK_FALSE(m2.allows(" "));  // one space, or a newline and an indent
  CHECK_FALSE(m2.allows("\n"));
  // a long array: the matcher's pool stays small (compacted; no growth per item beyond the live stack)
  GrammarMatcher a(json_schema_grammar(R"({"type": "array", "items": {"type": "integer"}})"));
  CHECK(a.accept("["));
  for (int i = 0; i < 5000; ++i) REQUIRE(a.accept(i ? ",1" : "1"));
  CHECK(a.accept("]"));
  CHECK(a.complete());
}

// A vocabulary of every single byte, pieces cut from the fixture's texts, and two control tokens (one of them
// an end-of-generation token).
std::shared_ptr<const TokenTrie> test_vocab(std::vector<std::string>& pieces) {
  std::mt19937 rng(7);
  for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, char(b)));
  std::set<std::string> seen(pieces.begin(), pieces.end());
  for (const auto& c : fixture()["cases"]) {
    if (!c["complete"].get<bool>()) continue;
    const std::string t = case_bytes(c);
    for (int k = 0; k < 4 && t.size() > 2; ++k) {
      const std::size_t at = rng() % (t.size() - 1), len = 2 + rng() % 6;
      const std::string p = t.substr(at, len);
      if (seen.insert(p).second) pieces.push_back(p);
    }
  }
  pieces.push_back("");  // a control token: no bytes
  pieces.push_back("");  // EOS
  return std::make_shared<const TokenTrie>(pieces, std::vector<int32_t>{int32_t(pieces.size() - 1)});
}

TEST_CASE("json_schema: the trie mask is the set of tokens allowed one by one, along random walks") {
  std::vector<std::string> pieces;
  const auto trie = test_vocab(pieces);
  const auto eos = int32_t(pieces.size() - 1);
  std::mt19937 rng(11);
  std::vector<int32_t> mask;
  std::size_t finished = 0;
  for (const auto& s : fixture()["schemas"]) {
    const auto g = json_schema_grammar(s);
    for (int walk = 0; walk < 6; ++walk) {
      Constraint c(g, trie);
      std::string out;
      for (int step = 0; step < 200 && !c.finished(); ++step) {
        c.mask(mask);
        std::vector<int32_t> brute;
        for (int32_t id = 0; id < int32_t(pieces.size()); ++id)
          if (c.allows(id)) brute.push_back(id);
        REQUIRE(mask == brute);
        REQUIRE(!mask.empty());
        CHECK(std::binary_search(mask.begin(), mask.end(), eos) == c.complete());
        CHECK_FALSE(std::binary_search(mask.begin(), mask.end(), eos - 1));  // the control token: never
        // bias towards closing: prefer structural bytes half of the time so that walks finish
        int32_t t = mask[rng() % mask.size()];
        if (rng() % 2)
          for (int32_t id : mask)
            if (pieces[std::size_t(id)].find_first_of("]}\"") != std::string::npos) t = id;
        if (t == eos) break;
        REQUIRE(c.accept(t));
        out += pieces[std::size_t(t)];
      }
      if (c.complete()) {
        ++finished;
        INFO(s.dump(), " -> ", out);
        CHECK(ojson::accept(out));
      }
    }
  }
  CHECK(finished > 10);
}

TEST_CASE("json_schema: constrained sampling takes the best allowed token, and only allowed ones") {
  std::vector<std::string> pieces;
  const auto trie = test_vocab(pieces);
  const auto g = json_schema_grammar(fixture()["schemas"][1]);
  std::mt19937 rng(3);
  SamplerScratch scratch(pieces.size());
  std::mt19937_64 draw(5);
  std::vector<int32_t> mask;
  for (int trial = 0; trial < 40; ++trial) {
    Constraint c(g, trie);
    for (int step = 0; step < 30 && !c.finished(); ++step) {
      std::vector<float> logits(pieces.size());
      for (auto& l : logits) l = std::normal_distribution<float>(0, 3)(rng);
      c.mask(mask);
      int32_t best = mask[0];
      for (int32_t id : mask)
        if (logits[std::size_t(id)] > logits[std::size_t(best)]) best = id;
      const int32_t greedy = scratch.sample(logits, {}, {.temperature = 0}, draw, &c);
      CHECK(greedy == best);
      const SamplerOptions opts[] = {{.temperature = 1.0f, .top_k = 5, .top_p = 1.0f, .min_p = 0.0f},
                                     {.temperature = 0.8f, .top_k = 0, .top_p = 0.9f, .min_p = 0.05f}};
      const int32_t t = scratch.sample(logits, {}, opts[trial % 2], draw, &c);
      CHECK(std::binary_search(mask.begin(), mask.end(), t));
      if (trial % 2 == 0) {  // top-k 5 among the allowed: t is one of the 5 largest allowed logits
        std::size_t above = 0;
        for (int32_t id : mask) above += logits[std::size_t(id)] > logits[std::size_t(t)];
        CHECK(above < 5);
      }
      if (pieces[std::size_t(t)].empty()) break;
      REQUIRE(c.accept(t));
    }
  }
}

}  // namespace kiln::test::json_schema_test

namespace kiln::test::json_schema_test {

TEST_CASE("json_schema: generate() under a schema gives JSON of the schema, and stops when it is complete") {
  const Model m = load(std::string(KILN_SHARED_DIR) + "/models/stories260K.gguf");
  // a model that knows no JSON: whatever it prefers, the constraint decides what is possible
  const auto g = json_schema_grammar(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
      "required": ["name", "n", "tags"], "additionalProperties": false})");
  const auto trie = TokenTrie::of(m.tokenizer());
  for (float temperature : {0.0f, 1.0f}) {
    Session s(m, {.ctx = 1024, .threads = 1});
    std::string text;
    const auto r =
        generate(s, "Once upon a time",
                 {.max_tokens = 900,
                  .sampling = {.temperature = temperature, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 9},
                  .grammar = g,
                  .grammar_vocab = trie},
                 [&](std::string_view piece) { text += piece; });
    INFO("temperature ", temperature, ": ", text);
    CHECK(r.stop == StopReason::complete);
    const auto j = ojson::parse(text, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK(j["name"].is_string());
    CHECK(j["name"].get<std::string>().size() <= 12 * 4);
    CHECK(j["n"].is_number_integer());
    CHECK(j["tags"].is_array());
    CHECK(j.size() == 3);
  }
}

}  // namespace kiln::test::json_schema_test
